"""``dualdrop prune``: a user's own network (--model FILE --model-class --calib FILE),
--list-methods, option names in messages, and a run folder that is one run (its settings
recorded first; an interrupted run continued, a rerun with other settings refused)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from dualdrop.cli import main
from dualdrop.train import load_run

USER_MODULE = '''
import torch
import torch.nn as nn


class TinyNet(nn.Module):
    """A user's network: flattens its input, two hidden layers."""

    def __init__(self, n_in=12, width=16):
        super().__init__()
        self.fc1 = nn.Linear(n_in, width)
        self.fc2 = nn.Linear(width, width)
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        h = torch.relu(self.fc1(x.flatten(1)))
        return self.head(torch.relu(self.fc2(h)))


def build(width=16):
    return TinyNet(width=width)
'''


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A module ``ddprune_user_nets`` importable from here, a trained-looking TinyNet saved
    three ways, and calibration data in four formats."""
    d = tmp_path_factory.mktemp("user")
    (d / "ddprune_user_nets.py").write_text(USER_MODULE)
    sys.path.insert(0, str(d))
    import ddprune_user_nets

    torch.manual_seed(0)
    net = ddprune_user_nets.TinyNet().eval()
    torch.save(net.state_dict(), d / "state.pt")
    torch.save(net, d / "whole.pt")
    x = torch.randn(96, 12)
    np.save(d / "calib.npy", x.numpy())
    torch.save(x, d / "calib.pt")
    header = ",".join(f"f{i}" for i in range(12))
    np.savetxt(d / "calib.csv", x.numpy(), delimiter=",", header=header, comments="")
    np.savetxt(d / "calib_4x3.csv", x.numpy(), delimiter=",")
    yield {"dir": d, "net": net, "x": x}
    sys.path.remove(str(d))
    sys.modules.pop("ddprune_user_nets", None)


def run(argv, capsys):
    """``(exit status, stdout, stderr)`` of ``dualdrop ARGV`` in this process."""
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def model_args(user, model="state.pt", calib="calib.npy", cls="ddprune_user_nets:TinyNet"):
    d = user["dir"]
    return ["prune", "--model", d / model, "--model-class", cls, "--calib", d / calib,
            "--no-progress"]


def test_list_methods(capsys):
    rc, out, _ = run(["prune", "--list-methods"], capsys)
    assert rc == 0
    for name in ("magnitude", "wanda", "sparsegpt", "admm", "logsum", "penalty:<name>"):
        assert f"  {name} " in out
    assert "blocksize=128" in out and "allocations (--allocation): uniform" in out
    # whole sentences, wrapped between words: no description cut off
    summaries = [ln for ln in out.splitlines() if ln.startswith("  ") and "--hp" not in ln]
    assert not [ln for ln in summaries if ln.rstrip().endswith("...")], out
    assert "Pruning Filters for Efficient ConvNets" in " ".join(out.split())
    rc, out, _ = run(["sparsify", "--list-methods"], capsys)
    assert rc == 0
    for name in ("vardrop-lr", "hardconcrete", "logsum", "penalty:<name>", "none"):
        assert f"  {name} " in out
    with pytest.raises(SystemExit):
        main(["prune", "--help"])
    assert "--list-methods" in capsys.readouterr().out


@pytest.mark.parametrize("model, calib", [("state.pt", "calib.npy"), ("whole.pt", "calib.csv"),
                                          ("state.pt", "calib.pt")])
def test_a_users_own_network(user, tmp_path, capsys, model, calib):
    out = tmp_path / "run"
    rc, text, err = run(model_args(user, model, calib) + ["--method", "sparsegpt", "--density",
                                                           "0.4", "--out", out], capsys)
    assert rc == 0, err
    assert "outputs on the calibration data changed by" in text
    final = json.loads((out / "final.json").read_text())
    assert final["architecture"]["model_class"] == "ddprune_user_nets:TinyNet"
    assert 0 < final["output_change"] < 1
    net = load_run(out)                                    # rebuilt on the user's class
    weights = [net.fc1.weight, net.fc2.weight, net.head.weight]
    kept = sum(int((w != 0).sum()) for w in weights)
    assert kept == round(0.4 * sum(w.numel() for w in weights))
    sd = torch.load(out / "model.pt", weights_only=True)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in sd.items())
    assert not (out / "oneshot.pt").exists()
    # the same pruning from Python, on the same calibration samples
    from dualdrop.nn import prune_oneshot

    ref = type(user["net"])()
    ref.load_state_dict(user["net"].state_dict())
    prune_oneshot(ref, user["x"], "sparsegpt", target_density=0.4, progress=False)
    torch.testing.assert_close(net.fc2.weight, ref.fc2.weight, rtol=1e-5, atol=1e-6)


def test_a_factory_and_model_args_and_input_shape(user, tmp_path, capsys):
    d = user["dir"]
    torch.save(torch.load(d / "state.pt"), d / "state_w16.pt")
    out = tmp_path / "fac"
    rc, _, err = run(model_args(user, "state_w16.pt", "calib_4x3.csv", "ddprune_user_nets:build")
                     + ["--model-args", '{"width": 16}', "--input-shape", "4,3", "--method",
                        "magnitude", "--pattern", "2:4", "--out", out], capsys)
    assert rc == 0, err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["input_shape"] == [4, 3] and cfg["model_args"] == {"width": 16}
    net = load_run(out)
    assert bool(((net.fc1.weight != 0).reshape(16, -1, 4).sum(-1) == 2).all())


@pytest.mark.parametrize("extra, match", [
    (["--model-class", "os:getcwd"], "returned a str, not a torch.nn.Module"),
    (["--model-class", "ddprune_user_nets:Nope"], "cannot be imported"),
    (["--model-args", '{"width": 7}'], "does not fit"),
    (["--model-args", "[1]"], "--model-args must be a JSON object"),
])
def test_bad_user_models(user, tmp_path, capsys, extra, match):
    out = tmp_path / "never"
    argv = model_args(user) + ["--density", "0.5", "--out", out]
    if extra[0] == "--model-class":
        argv[argv.index("--model-class") + 1] = extra[1]
    else:
        argv += extra
    rc, _, err = run(argv, capsys)
    assert rc == 2 and match in err and err.count("\n") == 1, err
    assert not out.exists()


def test_bad_routes_and_calibration_files(user, tmp_path, capsys):
    d, out = user["dir"], tmp_path / "never"
    (d / "empty.pt").write_bytes(b"")
    (d / "bad.csv").write_text("1,2\n3,x\n")
    np.save(d / "nan.npy", np.full((4, 12), np.nan))
    cases = [
        (model_args(user)[:3] + ["--calib", d / "calib.npy"], "--model-class"),
        (model_args(user)[:5], "--calib FILE"),
        (model_args(user, model="empty.pt"), "empty (0 bytes)"),
        (model_args(user, calib="bad.csv"), "line 2"),
        (model_args(user, calib="nan.npy"), "non-finite"),
        (model_args(user, calib="calib_4x3.csv") + ["--input-shape", "5,5"], "--input-shape"),
        (model_args(user) + ["--finetune-epochs", "1"], "--finetune-epochs"),
        (["prune", "--density", "0.5"], "--from RUN"),
    ]
    for argv, match in cases:
        argv = list(argv) + (["--density", "0.5"] if "--density" not in argv else []) + [
            "--out", out]
        rc, _, err = run(argv, capsys)
        assert rc == 2 and match in err, (argv, err)
        assert not out.exists(), argv


def test_options_are_named_as_options(user, tmp_path, capsys):
    out = tmp_path / "never"
    rc, _, err = run(model_args(user) + ["--density", "150", "--out", out], capsys)
    assert rc == 2 and "--density must be a fraction in (0, 1]" in err, err
    # a refusal of prune_oneshot itself (after the files are read) names the options, and the
    # folder it had claimed is left as it was (absent)
    rc, _, err = run(model_args(user) + ["--pattern", "2:4", "--allocation", "owl", "--out",
                                         out], capsys)
    assert rc == 2 and "--pattern='2:4'" in err and "--allocation must be 'uniform'" in err, err
    assert "pattern=" not in err.replace("--pattern=", "")
    assert not out.exists()


def test_a_run_folder_is_one_run(user, tmp_path, capsys, monkeypatch):
    """Interrupted while fine-tuning: the message says what is saved; a rerun with other
    settings is refused with the folder untouched; the same command continues."""
    import dualdrop.train as train_pkg

    dense = tmp_path / "dense"
    assert main(["sparsify", "--method", "none", "--epochs", "1", "--out", str(dense),
                 "--no-progress", "--threads", "1"]) == 0
    out = tmp_path / "pruned"
    argv = ["prune", "--from", dense, "--method", "magnitude", "--density", "0.3",
            "--finetune-epochs", "2", "--calib", "64", "--out", out, "--no-progress"]
    real_fit, calls = train_pkg.fit, []

    def fit_then_interrupt(*a, **k):          # one epoch done and checkpointed, then Ctrl-C
        calls.append(k)
        real_fit(*a, **{**k, "stop_after": k["checkpoint_every"]})
        raise KeyboardInterrupt

    monkeypatch.setattr(train_pkg, "fit", fit_then_interrupt)
    rc, _, err = run(argv, capsys)
    assert rc == 130 and "nothing" not in err and "oneshot.pt" in err, err
    assert "run the same command again" in err
    assert (out / "oneshot.pt").is_file() and (out / "finetune" / "checkpoint.pt").is_file()
    assert not (out / "final.json").exists()
    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    other = [a if a != "0.3" else "0.5" for a in argv]
    other[other.index("magnitude")] = "wanda"
    rc, _, err = run(other, capsys)
    assert rc == 2 and "other settings" in err and "density: 0.3 there, 0.5 now" in err, err
    assert "another --out" in err
    assert before == {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    # the same command: the one-shot result is read back (not recomputed), fine-tuning resumes
    monkeypatch.setattr(train_pkg, "fit", real_fit)
    import dualdrop.nn.oneshot as oneshot_pkg

    monkeypatch.setattr(oneshot_pkg, "prune_oneshot", lambda *a, **k: pytest.fail("pruned twice"))
    rc, _, err = run(argv, capsys)
    assert rc == 0, err
    final = json.loads((out / "final.json").read_text())
    assert final["method"] == "oneshot:magnitude" and final["finetune_epochs"] == 2
    net = load_run(out)
    weights = [net.fc1.weight, net.fc2.weight, net.fc3.weight]
    assert sum(int((w != 0).sum()) for w in weights) <= round(
        0.3 * sum(w.numel() for w in weights))
    assert not (out / "oneshot.pt").exists()


def test_a_corrupt_final_json_is_one_line(tmp_path, capsys):
    run_dir = tmp_path / "dense"
    assert main(["sparsify", "--method", "none", "--epochs", "1", "--out", str(run_dir),
                 "--no-progress", "--threads", "1"]) == 0
    capsys.readouterr()
    (run_dir / "final.json").write_text('{"status": "fini')
    rc, _, err = run(["prune", "--from", run_dir, "--density", "0.5", "--out",
                      tmp_path / "p", "--no-progress"], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert "final.json is corrupt or truncated" in err and "line 1 column" in err
    rc, _, err = run(["latency", run_dir, "--no-progress"], capsys)
    assert rc == 2 and "final.json is corrupt or truncated" in err, err
