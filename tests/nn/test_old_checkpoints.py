"""Checkpoints and state dicts written by an earlier layout of ``dualdrop.nn`` still load and
resume to the same numbers (fixtures: ``tests/fixtures/make_nn_fixtures.py``, run with that
code). The fixtures were written on another CPU: matrix products round differently with
another instruction set (AVX2 / AVX-512 kernels of MKL), by one unit in the last place, so
the numbers are compared to rounding (1e-9 relative in float64, 1e-5 in float32: a few units
in the last place after the steps of a run); a resume on the same machine is bit for bit
(``tests/train``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

FIX = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIX))
import make_nn_fixtures as mk  # noqa: E402

OLD = FIX / "nn_old"


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, or (floats) equal to rounding (see the module docstring)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    rtol = 1e-9 if a.dtype == torch.float64 else 1e-5
    return torch.allclose(a, b, rtol=rtol, atol=rtol * float(b.abs().max().clamp_min(1e-30)))


@pytest.mark.parametrize("method", mk.RUN_METHODS)
def test_old_checkpoint_resumes_bit_for_bit(method, tmp_path, monkeypatch):
    import dualdrop.train.loop as loop
    monkeypatch.setattr(loop, "build_model", lambda name, nf, nc: mk.tiny_model(nf, nc))
    name = method.replace(":", "_")
    run = tmp_path / name
    shutil.copytree(OLD / "runs" / name, run)
    loop.train(mk.run_cfg(method, run, resume=True), mk.small_data())
    got = torch.load(run / "model.pt", weights_only=True)
    want = torch.load(OLD / f"final_{name}.pt", weights_only=True)
    assert got.keys() == want.keys()
    for k in want:
        if isinstance(want[k], torch.Tensor):
            assert same(got[k], want[k]), k


@pytest.mark.parametrize("method", mk.STATE_METHODS)
def test_old_state_dict_loads_and_continues_bit_for_bit(method):
    import dualdrop.nn as dnn
    saved = torch.load(OLD / "state_dicts.pt", weights_only=True)[method]
    torch.manual_seed(0)
    model = mk.state_model()
    sp = dnn.sparsify(model, method)
    model.load_state_dict(saved["state_dict"])
    torch.manual_seed(5)
    losses = torch.stack(mk.state_steps(model, sp, mk.STEPS))
    assert same(losses, saved["losses_after"])
    after = model.state_dict()
    for k, v in saved["state_dict_after"].items():
        if isinstance(v, torch.Tensor):
            assert same(after[k], v), k
        else:
            assert after[k] == v, k
