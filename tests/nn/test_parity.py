"""Registry-generated parity: every registered method's fused path (numba loops, CPU) against its
reference path (the plain torch expressions of the same formulas, drawing the same counter-based
noise: the path other devices take, run here on the CPU by pretending), in float64.

For each method: the training forward, the regularizer (its value and, separately, the
gradient-only form the training loop uses), every parameter's gradient, one optimizer step with
the method's post-step hook, and the state dict afterwards must agree to float64 round-off.
A method added to ``dualdrop.nn.registry`` is covered without touching this file; a change to
one path alone fails here.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import _numba, sparsify
from dualdrop.nn.registry import REGISTRY

#: every registered method, plus the catalog form (one closed form, one tabulated penalty)
METHODS = sorted(REGISTRY) + ["penalty:mcp", "penalty:scad", "penalty:l1"]
RTOL, ATOL = 1e-10, 1e-12


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 4)).double()


def _run(method: str, reference: bool, monkeypatch) -> dict:
    """Two training steps on a fixed batch; everything a path produces."""
    with monkeypatch.context() as m:
        if reference:
            m.setattr(_numba, "is_cpu", lambda *ts: False)
        model = _model()
        torch.manual_seed(1)
        sp = sparsify(model, method)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(2)
        x = torch.randn(9, 7, generator=g, dtype=torch.float64)
        y = torch.randint(0, 4, (9,), generator=g)
        out = {}
        model.train()
        for step in range(2):
            opt.zero_grad()
            logits = model(x)
            value = sp.regularizer(50)                  # the value (a fresh, exact term)
            logits2 = model(x)
            reg = sp.regularizer(50, value=False)       # the training loop's gradient-only form
            loss = nn.functional.cross_entropy(logits2, y) + reg
            loss.backward()
            out[f"logits{step}"] = logits.detach().clone()
            out[f"value{step}"] = value.detach().clone()
            for name, p in model.named_parameters():
                out[f"grad{step}.{name}"] = (p.grad.clone() if p.grad is not None else None)
            opt.step()
            sp.after_step(opt, step, 4)
        model.eval()
        out["eval"] = model(x).detach().clone()
        out["state"] = copy.deepcopy(model.state_dict())
        out["density"] = sp.density()
    return out


def _same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape, where
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{where}: {m}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, where


@pytest.mark.parametrize("method", METHODS)
def test_fused_path_matches_the_reference_path(method, monkeypatch):
    fused = _run(method, False, monkeypatch)
    ref = _run(method, True, monkeypatch)
    _same(fused, ref, method)


def test_every_registered_method_is_covered():
    assert set(REGISTRY) <= set(METHODS)
