"""``dualdrop prune --heal-steps`` and ``dualdrop heal RUN_DIR``: both phases in the run folder,
the masks held, resumable."""

import json

import pytest
import torch

from dualdrop.cli import main as cli_main
from dualdrop.train import load_run


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "dense"
    assert cli_main(["sparsify", "--method", "none", "--epochs", "1", "--out", str(out),
                     "--no-progress", "--threads", "1"]) == 0
    return out


def _support(net):
    return {n: (p.detach() != 0) for n, p in net.named_parameters() if p.dim() == 2}


def test_prune_then_heal_in_one_command(dense_run, tmp_path):
    out = tmp_path / "healed"
    assert cli_main(["prune", "--from", str(dense_run), "--method", "magnitude", "--density",
                     "0.1", "--heal-steps", "30", "--heal-lr", "3e-3", "--calib", "256",
                     "--heal-batch-size", "64", "--out", str(out), "--no-progress"]) == 0
    final = json.loads((out / "final.json").read_text())
    assert final["heal"]["status"] == "finished" and final["heal"]["steps"] == 30
    assert final["heal"]["loss_last"] < final["heal"]["loss_first"]
    assert final["test_error"] < final["test_error_oneshot"]  # magnitude at 10%: far off
    net = load_run(out)
    kept = sum(int(s.sum()) for s in _support(net).values())
    total = sum(s.numel() for s in _support(net).values())
    assert kept == round(0.1 * total)  # the budget held through the healing


def test_heal_command_heals_a_prune_run_in_place(dense_run, tmp_path, capsys):
    out = tmp_path / "sgpt"
    assert cli_main(["prune", "--from", str(dense_run), "--method", "magnitude", "--density",
                     "0.1", "--calib", "256", "--out", str(out), "--no-progress"]) == 0
    before = load_run(out)
    support = _support(before)
    capsys.readouterr()
    assert cli_main(["heal", str(out), "--steps", "20", "--lr", "3e-3", "--batch-size", "64",
                     "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "healed" in text and "model_oneshot.pt" in text
    final = json.loads((out / "final.json").read_text())
    assert final["heal"]["steps"] == 20 and final["heal"]["teacher"] == str(dense_run)
    assert final["test_error"] <= final["test_error_before_heal"]
    healed = load_run(out)
    assert all(torch.equal(support[n], s) for n, s in _support(healed).items())
    oneshot = torch.load(out / "model_oneshot.pt", weights_only=True)
    assert torch.equal(oneshot["fc1.weight"], before.fc1.weight)
    capsys.readouterr()
    assert cli_main(["heal", str(out), "--steps", "20"]) == 2
    assert "healed already" in capsys.readouterr().err


def test_heal_command_resumes_from_its_checkpoint(dense_run, tmp_path):
    out = tmp_path / "mag"
    assert cli_main(["prune", "--from", str(dense_run), "--method", "magnitude", "--density",
                     "0.2", "--calib", "256", "--out", str(out), "--no-progress"]) == 0
    twin = tmp_path / "twin"
    import shutil
    shutil.copytree(out, twin)
    from dualdrop.train.heal import heal
    # a planned interruption in the same checkpoint folder the command uses
    from dualdrop.cli.heal_cmd import HEAL_DIR, _calibration
    import argparse
    cfg = json.loads((out / "config.json").read_text())
    calib, _ = _calibration(argparse.Namespace(data_dir=None, no_verify=False), cfg)
    heal(load_run(out), load_run(dense_run), calib, steps=16, lr=3e-3, batch_size=64,
         masks="zeros", checkpoint_dir=out / HEAL_DIR, checkpoint_every=1, stop_after=7,
         progress=False)
    for folder in (out, twin):
        assert cli_main(["heal", str(folder), "--steps", "16", "--lr", "3e-3", "--batch-size",
                         "64", "--no-progress"]) == 0
    a, b = load_run(out).state_dict(), load_run(twin).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_prune_structured_then_heal(dense_run, tmp_path):
    out = tmp_path / "neurons"
    assert cli_main(["prune", "--from", str(dense_run), "--granularity", "neuron", "--density",
                     "0.5", "--heal-steps", "10", "--calib", "256", "--out", str(out),
                     "--no-progress"]) == 0
    final = json.loads((out / "final.json").read_text())
    assert final["heal"]["steps"] == 10 and final["model_files"]["compact"]
    zeroed, small = load_run(out), load_run(out, layout="compact")
    x = torch.randn(8, zeroed.fc1.in_features)
    with torch.no_grad():  # the compact file is the healed network
        assert torch.allclose(zeroed(x), small(x), atol=1e-4)
    assert small.fc1.out_features < zeroed.fc1.out_features


@pytest.mark.parametrize("argv, match", [
    (["--heal-data", "x.npy"], "--heal-data"),
    (["--heal-steps", "5", "--finetune-epochs", "1"], "choose one"),
])
def test_prune_heal_refusals(dense_run, tmp_path, argv, match):
    out = tmp_path / "r"
    rc = cli_main(["prune", "--from", str(dense_run), "--density", "0.3", "--out", str(out),
                   "--no-progress", *argv])
    assert rc == 2 and not out.exists()


def test_heal_refuses_a_folder_that_is_not_a_prune_run(dense_run, capsys):
    assert cli_main(["heal", str(dense_run), "--steps", "5"]) == 2
    assert "not a dualdrop prune run" in capsys.readouterr().err
