"""The frontier takes the data's defaults as ``dualdrop sparsify`` does (epochs, batch size, each
method's learning rate and strengths on the embedded digits), ``--lr`` / ``--batch-size`` set
them, and a device this machine lacks is refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("optuna")

from dualdrop.train.config import DATASET_DEFAULTS, resolve_hparams  # noqa: E402
from dualdrop.train.experiments.frontier import runner  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def _plans(monkeypatch, tmp_path, **kw):
    """The plans run_frontier hands its workers (no training)."""
    seen = {}
    monkeypatch.setattr(runner, "_worker", lambda spec, rank: seen.update(spec))
    monkeypatch.setattr(runner, "frontier_report", lambda *a, **k: {})
    runner.run_frontier(["logsum", "magnitude"], out=tmp_path / "f", progress=False, **kw)
    return {p["method"]: p for p in seen["plans"]}


def test_digits_defaults_are_sparsify_s(monkeypatch, tmp_path):
    plans = _plans(monkeypatch, tmp_path)
    digits = DATASET_DEFAULTS["digits"]
    for p in plans.values():
        assert p["epochs"] == digits["epochs"] == 30
        assert p["batch_size"] == digits["batch_size"] == 32
        assert p["lr"] is None  # resolved per method by train(), on the digits
    # the knob's range is centred on the digits' strength, not MNIST's
    lam = resolve_hparams("logsum", None, None, "digits")[1]["lam"]
    assert lam != resolve_hparams("logsum", None, None, "mnist")[1]["lam"]
    knob = plans["logsum"]["knob"]
    assert knob["low"] < lam < knob["high"]


def test_lr_and_batch_size_set_every_method(monkeypatch, tmp_path):
    plans = _plans(monkeypatch, tmp_path, lr=5e-3, batch_size=64, epochs=3,
                   fixed={"magnitude": {"lr": 1e-3}})
    assert plans["logsum"]["lr"] == 5e-3 and plans["magnitude"]["lr"] == 1e-3
    assert {p["batch_size"] for p in plans.values()} == {64}
    assert {p["epochs"] for p in plans.values()} == {3}
    with pytest.raises(ValueError, match="lr=-1"):
        _plans(monkeypatch, tmp_path, lr=-1.0)
    with pytest.raises(ValueError, match="batch_size=0"):
        _plans(monkeypatch, tmp_path, batch_size=0)


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dualdrop", "frontier", *args], cwd=cwd,
                          capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})


def test_cli_trial_uses_lr_and_batch_size(tmp_path):
    r = _cli("--methods", "logsum", "--n-trials", "1", "--epochs", "1", "--lr", "0.005",
             "--batch-size", "64", "--out", "f", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (conf,) = (tmp_path / "f" / "trials" / "logsum").glob("*/config.json")
    conf = json.loads(conf.read_text())
    assert conf["lr"] == 0.005 and conf["batch_size"] == 64 and conf["data"] == "digits"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cli_refuses_cuda_without_cuda_before_writing(tmp_path):
    r = _cli("--methods", "logsum", "--n-trials", "1", "--epochs", "1", "--device", "cuda",
             "--out", "f", "--no-progress", cwd=tmp_path)
    assert r.returncode == 2
    assert "CUDA is not available" in r.stderr and "--device cpu" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "f").exists()
