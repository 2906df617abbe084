"""Run files: weights-only checkpoints, clear one-line errors for bad ones, Ctrl-C and resume."""

from __future__ import annotations

import json
import pickle
import shlex
from fractions import Fraction

import numpy as np
import pytest
import torch

from dualdrop.cli import main as cli_main
from dualdrop.train import TrainConfig, train
from dualdrop.train.checkpoint import FORMAT_VERSION


def _cfg(tmp_path, name="run", **kw):
    base = dict(method="none", epochs=2, out=str(tmp_path / name), seed=0, progress=False,
                threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _cli(folder, out, *extra):
    return ["sparsify", "--method", "none", "--epochs", "2", "--data-dir", str(folder),
            "--out", str(out), "--no-verify", "--no-progress", "--threads", "1", *extra]


def test_checkpoint_is_weights_only(tmp_path, tiny_data):
    train(_cfg(tmp_path, epochs=1), data=tiny_data)
    ck = torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ck["format"] == FORMAT_VERSION == 3
    # one format: engine.fit's entries, and the run's beside them
    assert {"step", "done_in_epoch", "total_steps", "epoch_rng", "settings", "config",
            "data_order", "arch"} <= set(ck)
    assert ck["done_in_epoch"] == 0 and ck["epoch_rng"] is None and len(ck["rng"]) == 1
    assert isinstance(ck["rng"][0]["numpy"]["key"], torch.Tensor)


def _bad_files(good: bytes):
    class Foreign:  # a class a weights-only load refuses
        pass

    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "foreign-pickle": pickle.dumps({"model": Fraction(1, 3)}),
        "foreign-tensor": None,  # torch.save(tensor), written below
        "foreign-dict": None,  # torch.save({"a": tensor}): loads, but is not a checkpoint
    }


@pytest.mark.parametrize("kind", ["empty", "truncated", "foreign-pickle", "foreign-tensor",
                                  "foreign-dict"])
def test_bad_checkpoint_one_line(tmp_path, tiny_mnist, capsys, kind):
    folder, _ = tiny_mnist
    good_run = tmp_path / "good"
    assert cli_main(_cli(folder, good_run, "--stop-after", "1")) == 0
    good = (good_run / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    run = tmp_path / "bad"
    run.mkdir()
    path = run / "checkpoint.pt"
    raw = _bad_files(good)[kind]
    if kind == "foreign-tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "foreign-dict":
        torch.save({"weight": torch.zeros(3)}, path)
    else:
        path.write_bytes(raw)
    # resuming from it
    assert cli_main(_cli(folder, run, "--resume")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(path) in err and "delete it" in err and "Traceback" not in err
    # warm-starting from it
    assert cli_main(_cli(folder, tmp_path / "warm", "--init-from", str(run))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(path) in err and "run folder written by dualdrop sparsify" in err
    assert not (tmp_path / "warm" / "checkpoint.pt").exists()


def test_format1_checkpoint_resumes_exactly(tmp_path, tiny_data, capsys):
    full = train(_cfg(tmp_path, "full"), data=tiny_data)
    train(_cfg(tmp_path, "old", stop_after=1), data=tiny_data)
    path = tmp_path / "old" / "checkpoint.pt"
    ck = torch.load(path, weights_only=True)
    for st in ck["rng"]:  # the former layout: numpy's and python's state tuples
        n, p = st["numpy"], st["python"]
        st["numpy"] = (n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                       n["cached_gaussian"])
        st["python"] = (p["version"], tuple(p["state"].tolist()), p["gauss_next"])
    ck["format"] = 1
    torch.save(ck, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    res = train(_cfg(tmp_path, "old", resume=True), data=tiny_data)
    assert "format 1" in capsys.readouterr().err
    assert res["test_error"] == full["test_error"]
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(path, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_prints_resume_command(tmp_path, tiny_mnist, capsys, monkeypatch):
    import dualdrop.train.loop as loop

    folder, _ = tiny_mnist
    real = loop._ramp_lam  # called as each epoch starts

    def interrupted(run, epoch, *a, **k):
        if epoch == 1:
            raise KeyboardInterrupt
        return real(run, epoch, *a, **k)

    monkeypatch.setattr(loop, "_ramp_lam", interrupted)
    out = tmp_path / "run"
    assert cli_main(_cli(folder, out, "--lr=3e-3")) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "epoch 1 is checkpointed" in err[0], err
    cmd = err[0].split("continue with: ", 1)[1]
    assert cmd.startswith("dualdrop sparsify ") and cmd.endswith(" --resume")
    assert not (out / ".lock").exists() and not list(out.glob(".*.tmp"))
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
    monkeypatch.setattr(loop, "_ramp_lam", real)
    assert cli_main(shlex.split(cmd)[1:]) == 0
    assert cli_main(_cli(folder, tmp_path / "whole", "--lr=3e-3")) == 0
    done = json.loads((out / "final.json").read_text())
    whole = json.loads((tmp_path / "whole" / "final.json").read_text())
    assert done["test_error"] == whole["test_error"] and done["lr"] == 3e-3


def test_stop_after_prints_a_command_that_finishes(tmp_path, tiny_mnist, capsys):
    folder, _ = tiny_mnist
    out = tmp_path / "run"
    assert cli_main(_cli(folder, out, "--stop-after", "1")) == 0
    cmd = capsys.readouterr().out.strip().split("continue with: ", 1)[1]
    assert "--stop-after" not in cmd and cmd.endswith("--resume")
    assert cli_main(shlex.split(cmd)[1:]) == 0
    assert json.loads((out / "final.json").read_text())["epochs"] == 2


def test_a_hyperparameter_added_later_keeps_old_runs_resumable(tmp_path, tiny_data):
    """A checkpoint written before a hyperparameter existed resumes when the new one is at the
    method's default (the behaviour it was trained with), and is refused otherwise."""
    out = tmp_path / "eta"
    cfg = TrainConfig(method="eta-trick", out=str(out), epochs=2, stop_after=1, seed=0,
                      progress=False, threads=1)
    train(cfg, data=tiny_data)
    ck = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ck["config"]["hparams"].pop("dual") == "logsum"  # as written before `dual` existed
    torch.save(ck, out / "checkpoint.pt")
    rep = train(TrainConfig(method="eta-trick", out=str(out), epochs=2, seed=0, progress=False,
                            threads=1, resume=True), data=tiny_data)
    assert rep["epochs"] == 2
    with pytest.raises(ValueError, match="dual"):
        train(TrainConfig(method="eta-trick", out=str(out), epochs=2, seed=0, progress=False,
                          threads=1, resume=True, hparams={"dual": "released"}), data=tiny_data)


def test_one_format_older_ones_upgraded_and_a_newer_one_refused_naming_it(tmp_path):
    from dualdrop.train.checkpoint import CheckpointError, read_checkpoint, upgrade

    # engine.fit's checkpoints before the one format: no "format", one process's RNG states
    old_fit = {"model": {}, "optimizer": {}, "scheduler": None, "sparsifier": {}, "step": 3,
               "epoch": 0, "done_in_epoch": 3, "total_steps": 9, "epoch_rng": {"torch": 1},
               "rng": {"torch": 2}, "history": []}
    up = upgrade(old_fit, "x", "fix")
    assert up["format"] == FORMAT_VERSION and up["rng"] == [{"torch": 2}]
    assert up["epoch_rng"] == [{"torch": 1}] and up["step"] == 3
    # the CLI's per-epoch format 2: at an epoch's end, its budget fixed by its configuration
    up = upgrade({"format": 2, "model": {}, "optimizer": {}, "scheduler": {}, "epoch": 2,
                  "step": 8, "rng": [{}], "history": [], "config": {}}, "x", "fix")
    assert up["done_in_epoch"] == 0 and up["epoch_rng"] is None and up["total_steps"] is None
    assert up["sparsifier"] is None and up["format"] == FORMAT_VERSION
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": 7, "model": {}, "config": {}, "epoch": 1}, path)
    with pytest.raises(CheckpointError, match="checkpoint format 7.* reads formats 1 to 3"):
        read_checkpoint(path, fix="delete it")
