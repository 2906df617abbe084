"""The training loop: outputs, determinism, exact resume, bad inputs, CLI, comparison."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dualdrop.cli import main as cli_main
from dualdrop.train import (
    LeNet300100,
    TrainConfig,
    epoch_order,
    lenet_300_100,
    resolve_hparams,
    train,
)


def _cfg(tmp_path, name="run", **kw):
    base = dict(method="none", epochs=2, out=str(tmp_path / name), seed=0, progress=False,
                threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _weights(out):
    ck = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)
    return ck["model"], ck["optimizer"], ck


def test_lenet_shapes_and_input_check():
    net = lenet_300_100(784)
    assert [tuple(m.weight.shape) for m in (net.fc1, net.fc2, net.fc3)] == [
        (300, 784), (100, 300), (10, 100)]
    assert net(torch.zeros(5, 1, 28, 28)).shape == (5, 10)
    assert lenet_300_100(64)(torch.zeros(3, 64)).shape == (3, 10)
    with pytest.raises(ValueError, match="64 features per sample but the network was built for 784"):
        net(torch.zeros(2, 64))
    with pytest.raises(ValueError, match="n_features"):
        LeNet300100(0)


def test_epoch_order_is_a_seeded_permutation():
    a = epoch_order(50, 1, 0)
    assert sorted(a.tolist()) == list(range(50))
    assert torch.equal(a, epoch_order(50, 1, 0))
    assert not torch.equal(a, epoch_order(50, 1, 1))
    assert not torch.equal(a, epoch_order(50, 2, 0))


def test_dense_run_writes_outputs_and_learns(tmp_path, tiny_data):
    rep = train(_cfg(tmp_path, epochs=3), data=tiny_data)
    out = tmp_path / "run"
    assert rep["status"] == "finished" and 0 <= rep["test_error"] <= 1
    hist = json.loads((out / "history.json").read_text())
    assert [r["epoch"] for r in hist] == [1, 2, 3]
    assert hist[-1]["train_loss"] < hist[0]["train_loss"]
    assert hist[-1]["lr"] == 0.0  # linear decay reaches 0 at the last step
    for key in ("val_error", "nonzero_total", "nonzero_fc1", "nonzero_fc2", "nonzero_fc3",
                "seconds", "train_loss"):
        assert key in hist[0]
    csv_lines = (out / "history.csv").read_text().strip().splitlines()
    assert len(csv_lines) == 4 and "val_error" in csv_lines[0]
    final = json.loads((out / "final.json").read_text())
    assert final["test_error"] == rep["test_error"]
    assert final["nonzero_total"] == 1.0
    # the tiny problem is learnable: far better than chance (0.9) after 3 epochs
    assert final["test_error"] < 0.5
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # atomic writes cleaned up
    # test error is the one of the final model (recomputed from the checkpoint)
    sd, _, _ = _weights(out)
    net = lenet_300_100(784)
    net.load_state_dict(sd)
    net.eval()
    with torch.no_grad():
        pred = net(torch.from_numpy(tiny_data.X_test)).argmax(1).numpy()
    assert final["test_error"] == pytest.approx(float(np.mean(pred != tiny_data.y_test)))


def test_seed_determinism(tmp_path, tiny_data):
    train(_cfg(tmp_path, "a", epochs=1), data=tiny_data)
    train(_cfg(tmp_path, "b", epochs=1), data=tiny_data)
    train(_cfg(tmp_path, "c", epochs=1, seed=1), data=tiny_data)
    a, b, c = (_weights(tmp_path / n)[0] for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc1.weight"], c["fc1.weight"])


def test_resume_is_bit_exact_dense(tmp_path, tiny_data, assert_resume_exact):
    assert_resume_exact(tmp_path, tiny_data)


def test_resume_refusals(tmp_path, tiny_data):
    train(_cfg(tmp_path, epochs=2, stop_after=1), data=tiny_data)
    with pytest.raises(FileExistsError, match="--resume"):
        train(_cfg(tmp_path, epochs=2), data=tiny_data)
    with pytest.raises(ValueError, match="epochs: checkpoint 2 vs now 3"):
        train(_cfg(tmp_path, epochs=3, resume=True), data=tiny_data)
    with pytest.raises(ValueError, match="lr"):
        train(_cfg(tmp_path, epochs=2, resume=True, lr=0.5), data=tiny_data)
    # a finished run resumed again returns its report without training
    rep = train(_cfg(tmp_path, epochs=2, resume=True), data=tiny_data)
    again = train(_cfg(tmp_path, epochs=2, resume=True), data=tiny_data)
    assert again == json.loads((tmp_path / "run" / "final.json").read_text())
    assert again["test_error"] == rep["test_error"]


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(method="bogus"), ValueError, "method='bogus' is unknown"),
        (dict(method=3), TypeError, "method"),
        (dict(epochs=0), ValueError, "epochs"),
        (dict(batch_size=-1), ValueError, "batch_size"),
        (dict(lr=-1.0), ValueError, "lr"),
        (dict(lr=float("nan")), ValueError, "lr"),
        (dict(device="tpu"), ValueError, "device"),
        (dict(stop_after=5, epochs=2), ValueError, "stop_after"),
        (dict(hparams={"lam": 1.0}), ValueError, "unknown hyperparameter 'lam'"),
    ],
)
def test_bad_inputs(tmp_path, tiny_data, kw, exc, match):
    with pytest.raises(exc, match=match):
        train(_cfg(tmp_path, **kw), data=tiny_data)


def test_cuda_refused_without_cuda(tmp_path, tiny_data):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        train(_cfg(tmp_path, device="cuda"), data=tiny_data)


def test_resolve_hparams_dense():
    assert resolve_hparams("dense") == (1e-3, {})
    assert resolve_hparams("none", lr=3e-4) == (3e-4, {})


def test_cli_sparsify_on_idx_files(tmp_path, tiny_mnist, capsys):
    folder, _ = tiny_mnist
    out = tmp_path / "cli"
    argv = ["sparsify", "--method", "none", "--epochs", "1", "--data-dir", str(folder),
            "--out", str(out), "--no-verify", "--no-progress", "--threads", "1"]
    assert cli_main(argv) == 0
    assert "test error" in capsys.readouterr().out
    assert (out / "final.json").exists()
    # MD5 verification is on by default: the tiny files are refused with a clear message
    assert cli_main(argv[:-4] + ["--out", str(tmp_path / "cli2")]) == 2
    assert "MD5" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--method", "bogus"], "unknown"),
        (["--method", "none", "--hp", "oops"], "NAME=VALUE"),
        (["--method", "none", "--hp", "lam=1"], "unknown hyperparameter"),
        (["--method", "none", "--data-dir", "/nonexistent/mnist"], "not a directory"),
    ],
)
def test_cli_errors(tmp_path, capsys, extra, match):
    rc = cli_main(["sparsify", "--epochs", "1", "--out", str(tmp_path / "x"), "--no-progress"]
                  + extra)
    assert rc == 2
    assert match in capsys.readouterr().err


def test_cli_embedded_digits_default(tmp_path, capsys):
    out = tmp_path / "digits"
    assert cli_main(["sparsify", "--method", "none", "--epochs", "1", "--out", str(out),
                     "--no-progress", "--threads", "1"]) == 0
    final = json.loads((out / "final.json").read_text())
    assert final["data"].startswith("digits") and "64 features" in final["data"]


def test_compare_dense_only(tmp_path, tiny_data):
    from dualdrop.train.experiments.compare import run_comparison

    out = tmp_path / "cmp"
    run_comparison(["dense"], epochs=1, out=out, progress=False, threads=1, data=tiny_data)
    for f in ("figure2.png", "figure2.pdf", "table.md", "table.csv"):
        assert (out / f).stat().st_size > 0
    assert "| dense | 1 |" in (out / "table.md").read_text()
    with pytest.raises(ValueError, match="twice"):
        run_comparison(["none", "dense"], epochs=1, out=out, data=tiny_data)


def test_compare_report_only_on_unfinished_run(tmp_path, tiny_data, capsys):
    from dualdrop.train.experiments.compare import run_dir

    out = tmp_path / "cmp"
    train(_cfg(tmp_path, epochs=3, stop_after=1, out=str(run_dir(out, "none"))), data=tiny_data)
    assert cli_main(["compare", "--report-only", "--methods", "none", "--out", str(out)]) == 0
    md = (out / "table.md").read_text()
    assert "1 (unfinished)" in md and "| — |" in md  # no test error before the end
    assert (out / "figure2.png").exists()
    assert cli_main(["compare", "--report-only", "--out", str(tmp_path / "empty")]) == 2
    assert "no runs" in capsys.readouterr().err


def test_run_lock(tmp_path, tiny_data):
    import os
    import socket
    import subprocess
    import sys

    from dualdrop.train.experiments.compare import run_comparison, run_dir
    from dualdrop.train.checkpoint import RunLockedError

    out = tmp_path / "run"
    out.mkdir()
    host = socket.gethostname()
    # a live process (this one) holds the lock: refused, nothing written
    (out / ".lock").write_text(f"{os.getpid()} {host}")
    with pytest.raises(RunLockedError, match=str(os.getpid())):
        train(_cfg(tmp_path, epochs=1), data=tiny_data)
    assert not (out / "checkpoint.pt").exists()
    # a comparison skips the locked method and trains the others
    cmp_out = tmp_path / "cmp"
    run_dir(cmp_out, "none").mkdir(parents=True)
    (run_dir(cmp_out, "none") / ".lock").write_text(f"{os.getpid()} {host}")
    reps = run_comparison(["none"], epochs=1, out=cmp_out, progress=False, data=tiny_data)
    assert reps["none"]["status"] == "locked"
    # a stale lock (its process has exited) is taken over and released at the end
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".lock").write_text(f"{dead.pid} {host}")
    assert train(_cfg(tmp_path, epochs=1), data=tiny_data)["status"] == "finished"
    assert not (out / ".lock").exists()


def test_flush_denormal_is_restored(tmp_path, tiny_data):
    sub = torch.tensor([1e-39], dtype=torch.float32)  # a subnormal float32
    assert float(sub * 1.0) != 0.0
    train(_cfg(tmp_path, epochs=1), data=tiny_data)  # flushes while training (default)
    assert float(sub * 1.0) != 0.0  # the process's setting is back


def _fake_runs(data):
    hist = [{"epoch": e, "nonzero_total": 0.5 / e, "val_error": 0.1 / e, "seconds": 1.0}
            for e in (1, 2)]
    final = {"epochs": 2, "test_error": 0.03, "nonzero_total": 0.25,
             "test_error_unpruned": 0.029, "data": data}
    return {"logsum": {"history": hist, "final": final, "data": data},
            "penalty:a|b": {"history": hist, "final": None, "data": data}}


def test_paper_numbers_only_beside_full_mnist(tmp_path):
    from dualdrop.train.report import comparison_table

    mnist = "mnist: 48000 train / 12000 validation / 10000 test, 784 features, 10 classes"
    md = comparison_table(_fake_runs(mnist), tmp_path)
    assert "paper: test error" in md and "2.93%" in md and "not shown" not in md
    assert "unpruned: test error" in md and "2.90%" in md
    assert "penalty:a\\|b" in md  # a '|' in a cell is escaped
    assert all(line.count("|") - line.count("\\|") == md.splitlines()[0].count("|")
               for line in md.splitlines() if line.startswith("|"))
    digits = "digits: 1150 train / 288 validation / 359 test, 64 features, 10 classes"
    md = comparison_table(_fake_runs(digits), tmp_path)
    assert "paper" not in md.splitlines()[0] and "2.93%" not in md
    assert "not shown beside runs on other data" in md


def test_dataset_defaults():
    from dualdrop.train.config import DATASET_DEFAULTS

    assert resolve_hparams("logsum", dataset="mnist") == resolve_hparams("logsum")
    lr, hp = resolve_hparams("logsum", dataset="digits")
    assert lr == DATASET_DEFAULTS["digits"]["lr"] and hp["lam"] == 3e-3
    assert resolve_hparams("hardconcrete", dataset="digits")[0] == 3e-2  # its own lr
    # the user's values win over the dataset's
    assert resolve_hparams("logsum", 1e-4, {"lam": "1e-3"}, "digits") == (1e-4, {**hp, "lam": 1e-3})
    assert TrainConfig().with_defaults("digits").epochs == 30
    cfg = TrainConfig(batch_size=7).with_defaults("mnist")
    assert (cfg.epochs, cfg.batch_size) == (200, 7)


def test_cli_bad_values_before_data_or_folder(tmp_path, capsys):
    out = tmp_path / "never"
    for extra, match in ((["--hp", "tol=2"], "tol"), (["--lr", "-1e-3"], "lr=-0.001"),
                         (["--hp", "lam=x"], "lam"), (["--epochs", "0"], "epochs")):
        rc = cli_main(["sparsify", "--method", "logsum", "--out", str(out),
                       "--data-dir", str(tmp_path / "no-data-here")] + extra)
        err = capsys.readouterr().err
        assert rc == 2 and match in err and "not a directory" not in err, err
        assert not out.exists()
    assert cli_main(["sparsify", "--method", "logsum", "--lr"]) == 2
    assert "--lr=-1e-3" in capsys.readouterr().err
    assert cli_main(["sparsify", "--epochs", "1"]) == 2  # no --method
    assert "--method" in capsys.readouterr().err


def test_cli_list_hparams_every_method(capsys):
    from dualdrop.train import available_methods

    assert cli_main(["sparsify", "--list-hparams"]) == 0
    text = capsys.readouterr().out
    assert all(f"\n{m} (digits):" in "\n" + text for m in available_methods())
    assert "initial learning rate" in text


def test_every_cli_option_has_help():
    import argparse

    from dualdrop.cli import build_parser

    for name in ("sparsify", "compare"):
        sub = next(a for a in build_parser(name)._actions
                   if isinstance(a, argparse._SubParsersAction)).choices[name]
        missing = [a.option_strings for a in sub._actions if a.option_strings and not a.help]
        assert not missing, (name, missing)


def test_default_threads(monkeypatch):
    from dualdrop.train.config import default_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(2)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_threads() == 1  # 2 cores: never 2 threads per process
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert default_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_threads() == 2
    with pytest.raises(ValueError, match="threads"):
        TrainConfig(threads=-1).validate()


def test_cli_compare_resume_flag(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--methods", "none", "--epochs", "1", "--out", str(out), "--no-progress",
            "--threads", "1"]
    assert cli_main(argv) == 0
    ck = out / "runs" / "none" / "checkpoint.pt"
    stamp = ck.stat().st_mtime_ns
    assert cli_main(argv + ["--resume"]) == 0  # finished: skipped, not retrained
    assert ck.stat().st_mtime_ns == stamp
    assert "| dense | 1 |" in capsys.readouterr().out


def test_balance_warning_only_for_a_strength_the_user_chose(tmp_path):
    """The digits defaults of hard-concrete were chosen on validation: no alarm for them; the
    same method with a user's large lam is warned about at its first step, unless a target
    density sets the strength (the controller moves it: the first step's ratio is no alarm)."""
    import warnings

    from dualdrop.train import TrainConfig, train

    def warned(name, target_density=None, **hp):
        cfg = TrainConfig(method="hardconcrete", out=str(tmp_path / name), epochs=1, seed=0,
                          progress=False, threads=1, hparams=hp, target_density=target_density)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(cfg)
        return any("dominate training" in str(w.message) for w in caught)

    assert not warned("default")
    assert warned("strong", lam=0.05)
    assert not warned("target", target_density=0.3, lam=0.05)
