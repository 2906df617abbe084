"""Torch forms of the closed-form catalog penalties, LogSum's dual and the pruning threshold.

The reference (plain torch) path of the penalty methods and the fused path's fallback on other
devices. The formulas are the catalog's (the ``penalties`` package) and each one is checked
against the penalties object (``P.omega``, ``P.derivative``, ``P.eta_hat``) in the tests.
Measured reason for torch forms (benchmarks/RESULTS.md): the generic numba loop over
``penalties.kernels`` costs ~40 ns per weight (a 266k-weight LeNet step grows from ~3 ms to
~14 ms), the vectorized torch form ~2 ns; it also runs on CUDA without copying weights to the host.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# ---- pruning threshold -------------------------------------------------------------------------

def abs_threshold(P, c: float):
    """``t*`` with ``eta_hat(t) < c  <=>  t < t*`` for ``t >= 0``, or None if eta_hat is not
    monotone on a wide grid (then the rule must be evaluated pointwise)."""
    grid = np.concatenate([[0.0], np.logspace(-12, 4, 1601)])
    with np.errstate(all="ignore"):
        e = np.asarray(P.eta_hat(grid), dtype=np.float64)
    if np.any(np.isnan(e)):
        return None
    finite = np.where(np.isinf(e), np.finfo(np.float64).max, e)
    if np.any(np.diff(finite) < -1e-12 * np.abs(finite[:-1])):
        return None
    if e[0] >= c:
        return 0.0
    above = np.nonzero(e >= c)[0]
    if above.size == 0:
        return math.inf
    lo, hi = grid[above[0] - 1], grid[above[0]]
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if float(P.eta_hat(mid)) < c:
            lo = mid
        else:
            hi = mid
    return float(hi)


def logsum_dual(eta: torch.Tensor, eps: float) -> torch.Tensor:
    """LogSum dual ``f(eta)`` (normalized f(0+) = 0), differentiable in torch."""
    sp = torch.sqrt(eps * eps + 4.0 * eta) + eps
    return 2.0 * torch.log(sp / (2.0 * eps)) - 4.0 * eta / (sp * sp)


# ---- torch forms of the closed-form catalog penalties ------------------------------------------
# Speed path. The formulas are the catalog's (the penalties package) and each one is checked
# against the penalties object (P.omega, P.derivative, P.eta_hat) in tests/nn/test_nn_states.py.
# Measured reason (benchmarks/RESULTS.md): the generic numba loop over penalties.kernels costs
# ~40 ns per weight (a 266k-weight LeNet step grows from ~3 ms to ~14 ms), the vectorized torch
# form ~2 ns; it also runs on CUDA without copying weights to the host.

class _Form:
    """Elementwise torch closed form: ``omega``, ``deriv`` (Omega') and ``eta`` (eta_hat), each
    ``f(w, a, params)`` with ``a = |w|``; each is computed only when asked for."""

    def __init__(self, omega, deriv, eta, infinite_eta=False):
        self.omega, self.deriv, self.eta, self.infinite_eta = omega, deriv, eta, infinite_eta

    def __call__(self, w, a, prm):
        return self.omega(w, a, prm), self.deriv(w, a, prm), self.eta(w, a, prm)


_TINY = {torch.float32: torch.finfo(torch.float32).tiny, torch.float64: 2.2250738585072014e-308}


def _tiny(a):
    return _TINY.get(a.dtype, torch.finfo(a.dtype).tiny)


def _lp_deriv(w, a, prm):
    p = prm["p"]
    d = torch.where(a > 0, a.clamp_min(_tiny(a)) ** (p - 1.0), a.new_zeros(()))
    return torch.sign(w) * d


def _mcp_omega(w, a, prm):
    A = prm["a"] * prm["lam"]
    return torch.where(a <= A, a - a * a / (2.0 * A), a.new_tensor(0.5 * A))


def _mcp_eta(w, a, prm):
    A = prm["a"] * prm["lam"]
    if math.isinf(A):  # a = inf: the l1 penalty, eta_hat = |w|
        return a.clone()
    return torch.where(a < A, A * a / (A - a).clamp_min(_tiny(a)), a.new_tensor(math.inf))


def _scad_omega(w, a, prm):
    A, lam = prm["a"], prm["lam"]
    mid = (2.0 * A * lam * a - a * a - lam * lam) / (2.0 * (A - 1.0) * lam)
    return torch.where(a <= lam, a, torch.where(a <= A * lam, mid,
                                                a.new_tensor(0.5 * (A + 1) * lam)))


def _scad_deriv(w, a, prm):
    A, lam = prm["a"], prm["lam"]
    dm = ((A * lam - a) / ((A - 1.0) * lam)).clamp_min(0.0)
    return torch.sign(w) * torch.where(a <= lam, torch.ones_like(a), dm)


def _scad_eta(w, a, prm):
    A, lam = prm["a"], prm["lam"]
    em = (A - 1.0) * lam * a / (A * lam - a).clamp_min(_tiny(a))
    return torch.where(a <= lam, a, torch.where(a < A * lam, em, a.new_tensor(math.inf)))


TORCH_FORMS = {
    "l1": _Form(lambda w, a, p: a, lambda w, a, p: torch.sign(w), lambda w, a, p: a),
    "lp": _Form(lambda w, a, p: a ** p["p"] / p["p"], _lp_deriv,
                lambda w, a, p: a ** (2.0 - p["p"])),
    "logsum": _Form(lambda w, a, p: torch.log1p(a / p["eps"]),
                    lambda w, a, p: torch.sign(w).div_(a + p["eps"]),
                    lambda w, a, p: a * (a + p["eps"])),
    "log2sum": _Form(lambda w, a, p: torch.log1p(a * a / p["eps"]),
                     lambda w, a, p: 2.0 * w / (a * a + p["eps"]),
                     lambda w, a, p: 0.5 * (a * a + p["eps"])),
    "mcp": _Form(_mcp_omega,
                 lambda w, a, p: torch.sign(w) * (1.0 - a / (p["a"] * p["lam"])).clamp_min(0.0),
                 _mcp_eta, infinite_eta=True),
    "scad": _Form(_scad_omega, _scad_deriv, _scad_eta, infinite_eta=True),
}


def torch_form(P):
    """The torch closed form of ``P`` (omega, derivative, eta_hat), or None."""
    name = getattr(P, "name", None)
    if name in TORCH_FORMS and type(P).__module__.startswith("penalties"):
        return name
    return None
