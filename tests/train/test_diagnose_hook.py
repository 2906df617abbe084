"""The --diagnose-every hook: diag_* history columns, no effect on the run, exact resume."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from dualdrop.train import TrainConfig, train
from dualdrop.train.config import run_config
from dualdrop.train.diagnose_hook import due, subset

HOOK = dict(diagnose_every=1, diagnose_samples=16)


def _cfg(tmp_path, name, **kw):
    base = dict(method="hardconcrete", epochs=2, out=str(tmp_path / name), seed=0,
                progress=False, threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _model(out):
    return torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def test_hook_leaves_the_weights_bit_identical(tmp_path, tiny_data):
    """Hard-concrete draws its gates from torch's global generator, which measure() reseeds:
    without the save/restore the second epoch's gates, hence the weights, would differ."""
    train(_cfg(tmp_path, "plain"), data=tiny_data)
    train(_cfg(tmp_path, "hook", **HOOK), data=tiny_data)
    a, b = _model(tmp_path / "plain"), _model(tmp_path / "hook")
    assert a.keys() == b.keys()
    tensors = [k for k in a if isinstance(a[k], torch.Tensor)]
    assert len(tensors) >= 6
    for k in tensors:
        assert torch.equal(a[k], b[k]), k
    hist = json.loads((tmp_path / "hook" / "history.json").read_text())
    plain = json.loads((tmp_path / "plain" / "history.json").read_text())
    assert [r["val_error"] for r in hist] == [r["val_error"] for r in plain]
    for r in hist:
        assert r["diag_n"] == 16 and r["diag_dropout_noise"] == 1.0
        assert r["diag_lambda_1"] >= r["diag_lambda_5"]
        for p in ("sgd", "drop"):
            assert -1.0 <= r[f"diag_{p}_cosine"] <= 1.0
            assert 0.0 < r[f"diag_{p}_p_value"] <= 1.0
            assert math.isfinite(r[f"diag_{p}_ratio"])  # H need not be PSD early on
            assert 0 <= r[f"diag_{p}_overlap_topk"] <= 1 + 1e-9
    assert not any(k.startswith("diag_") for r in plain for k in r)
    with open(tmp_path / "hook" / "history.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert math.isclose(float(rows[1]["diag_sgd_ratio"]), hist[1]["diag_sgd_ratio"],
                        rel_tol=1e-12)


def test_resume_with_the_hook_is_exact(tmp_path, tiny_data, assert_resume_exact):
    """Killed with stop_after=1 then resumed == uninterrupted, diag_* columns included."""
    assert_resume_exact(tmp_path, tiny_data, method="vardrop", diagnose_every=1,
                        diagnose_samples=12)
    hist = json.loads((tmp_path / "part" / "history.json").read_text())
    assert all("diag_sgd_cosine" in r for r in hist)


def test_schedule_subset_and_identity(tmp_path, tiny_data):
    assert [e for e in range(1, 8) if due(e, 3, 7)] == [3, 6, 7]
    assert not any(due(e, None, 7) for e in range(1, 8))
    idx = subset(100, 10, seed=3)
    assert (idx == subset(100, 10, seed=3)).all() and len(set(idx.tolist())) == 10
    assert not (idx == subset(100, 10, seed=4)).all()
    assert len(subset(5, 10, seed=0)) == 5
    # the hook is not part of the run's identity: a run may be resumed with or without it
    cfg = _cfg(tmp_path, "x", **HOOK)
    assert not any("diagnose" in k for k in run_config(cfg, 1e-3, {}, tiny_data, 1))
    train(_cfg(tmp_path, "r", stop_after=1), data=tiny_data)
    train(_cfg(tmp_path, "r", resume=True, diagnose_every=2, diagnose_samples=8),
          data=tiny_data)
    hist = json.loads((tmp_path / "r" / "history.json").read_text())
    assert "diag_lambda_1" not in hist[0] and hist[1]["diag_n"] == 8


@pytest.mark.parametrize("kw", [dict(diagnose_every=0), dict(diagnose_every=1.5),
                                dict(diagnose_every=True), dict(diagnose_every="2"),
                                dict(diagnose_every=2, diagnose_samples=1)])
def test_options_are_validated(tmp_path, kw):
    with pytest.raises(ValueError, match="diagnose_"):
        _cfg(tmp_path, "v", **kw).validate()


def test_cli_option(tmp_path, tiny_mnist):
    from dualdrop.cli import main

    folder, _ = tiny_mnist
    out = tmp_path / "cli"
    assert main(["sparsify", "--method", "logsum", "--epochs", "1", "--data-dir", str(folder),
                 "--no-verify", "--no-progress", "--threads", "1", "--out", str(out),
                 "--diagnose-every", "1", "--diagnose-samples", "10"]) == 0
    row = json.loads((out / "history.json").read_text())[0]
    assert row["diag_dropout_noise"] == 0.0 and math.isnan(row["diag_drop_cosine"])
    assert -1 <= row["diag_sgd_cosine"] <= 1
    assert main(["sparsify", "--method", "logsum", "--out", str(tmp_path / "bad"),
                 "--diagnose-every", "0"]) == 2
