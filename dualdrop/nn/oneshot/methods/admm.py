"""ADMM on the L0-constrained (or N:M-constrained) layer problem.

The layer problem (``_layer``: unit-diagonal Gram ``Gs``, scaled weights ``u``) is

    min_U  1/2 sum_r (u_r - u0_r)^T Gs (u_r - u0_r)   subject to  U in C,

``C`` the weights with ``n_keep`` nonzeros in the whole layer (or at most ``N`` in every ``M``
consecutive inputs of each row). ALPS (Meng, Behdin, Wang & Mazumder, "ALPS: Improved
Optimization for Highly Sparse One-Shot Pruning for Large Language Models", NeurIPS 2024) splits
it as ``U = D`` with ``D in C`` and runs scaled ADMM with a growing penalty parameter ``rho``:

    U <- (Gs + rho I)^-1 (Gs u0 + rho (D - V))      (each row; one eigendecomposition of Gs
                                                     serves every rho)
    D <- P_C(U + V)                                  (keep the largest |u + v|: the projection)
    V <- V + U - D

(``V`` the scaled dual; when ``rho`` grows, ``V`` is divided by the same factor so the dual
``rho V`` is unchanged). As ``rho`` grows, ``U`` is pulled onto ``D`` and the support of ``D``
freezes; the support found is then refit by least squares (ALPS uses preconditioned conjugate
gradients for this step; here each row's system is solved exactly, ``base.refit_on_support``).
Boža ("Fast and Effective Weight Update for Pruned Large Language Models", 2024) uses the same
ADMM weight update, with the inverse ``(Gs + rho I)^-1`` precomputed.

The result depends on how ``rho`` grows. Two schedules:

- ``"alps"``: ALPS's adaptive rule with early stop: every ``rho_every`` iterations ``rho`` is
  multiplied by 1.3, 1.2 or 1.1 when the support changed in at least 10%, 0.5% or one of the
  ``k`` kept places over that window, and the iteration stops once the support has not changed
  over a whole window;
- ``"slow"``: ``rho`` multiplied by ``growth`` (default 1.02) every iteration, run until the
  support has not changed for ``patience`` iterations (a stable support): more iterations, and
  (on LeNet-300-100 in our prototype) objectives 1.1-1.45x lower.

Projections are by ``|u + v|`` in the scale-free coordinates, i.e. by ``|w| sqrt(G_jj)`` in
the original ones (the scale of an input does not change what is kept).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from penalties.checks import check_choice, check_float, check_int

from .base import Budget, OneShotMethod
from ._layer import ScaledLayer
from .polish import KERNELS as POLISH_KERNELS, check_effort, polish_support

__all__ = ["ADMM", "SCHEDULES", "admm_support"]

SCHEDULES = ("alps", "slow")

# ALPS's rho rule: (fraction of the kept places that changed over a window, factor), in order
ALPS_STEPS = ((0.1, 1.3), (0.005, 1.2), (0.0, 1.1))


def _project(Z, sl, k, budget):
    """The live support of ``P_C(Z)``: the ``k`` largest ``|Z|`` of the layer (a partial
    selection: this runs every iteration), or the ``N`` largest of each group."""
    if budget.pattern is not None:
        return sl.top_mask(np.abs(Z), budget)
    mask = np.zeros(Z.shape, dtype=bool)
    if k >= Z.size:
        mask[:] = True
    elif k > 0:
        a = np.abs(Z).ravel()
        mask.ravel()[np.argpartition(-a, k - 1)[:k]] = True
    return mask


def admm_support(sl: ScaledLayer, budget: Budget, *, schedule="alps", rho0=0.1, growth=1.02,
                 rho_every=3, patience=20, max_iter=None, callback=None):
    """Run ADMM (module docstring) on ``sl``; returns ``(mask, D, info)``: the live support
    ``(R, q)``, ADMM's last projected point ``D`` (scaled, on that support) and ``{"iterations",
    "rho", "seconds", "stopped"}``. ``callback(t, mask, U)`` runs after each iteration."""
    if max_iter is None:
        max_iter = 300 if schedule == "alps" else 3000
    t0 = time.perf_counter()
    k = sl.live_target(budget)
    U0 = sl.U0
    lam, Q = np.linalg.eigh(sl.Gs)
    lam = np.clip(lam, 0.0, None)
    A = (U0 @ Q) * lam  # Gs u0_r in the eigenbasis, every row
    mask = _project(U0, sl, k, budget)
    D = np.where(mask, U0, 0.0)
    V = np.zeros_like(U0)
    rho = float(rho0)
    window_changes = 0
    stable = 0
    stopped = "max_iter"
    t = 0
    for t in range(1, max_iter + 1):
        T = (D - V) @ Q
        T *= rho
        T += A
        T /= lam + rho
        U = T @ Q.T
        Z = U + V
        new = _project(Z, sl, k, budget)
        changes = int(np.count_nonzero(new != mask)) // 2
        mask = new
        D = np.where(mask, Z, 0.0)
        V = Z - D
        if callback is not None:
            callback(t, mask, U)
        if schedule == "alps":
            window_changes += changes
            if t % rho_every == 0:
                if window_changes == 0:
                    stopped = "stable"
                    break
                for frac, factor in ALPS_STEPS:
                    if window_changes > frac * k:
                        break
                rho *= factor
                V /= factor
                window_changes = 0
        else:
            stable = stable + 1 if changes == 0 else 0
            if stable >= patience:
                stopped = "stable"
                break
            rho *= growth
            V /= growth
    info = {"iterations": t, "rho": rho, "seconds": time.perf_counter() - t0,
            "stopped": stopped}
    return mask, D, info


class ADMM(OneShotMethod):
    """ADMM on the L0- or N:M-constrained layer problem (module docstring).

    Options: ``schedule`` (``"slow"``, default: rho times ``growth`` every iteration until the
    support is stable for ``patience`` iterations; ``"alps"``: ALPS's adaptive rule with early
    stop, checked every ``rho_every`` iterations), ``rho0`` (the first rho, in units of the
    unit-diagonal Gram), ``max_iter`` (``None``: 300 for alps, 3000 for slow), ``refit``
    (default True: the support's least squares, ALPS's last step; False returns ADMM's projected
    point ``D``) and ``polish`` (default False; True or ``"full"``, ``"swaps"``: the support
    polish of ``polish.py`` after it)."""

    name = "admm"
    defaults = {"schedule": "slow", "rho0": 0.1, "growth": 1.02, "rho_every": 3,
                "patience": 20, "max_iter": None, "refit": True, "polish": False}

    def _validate(self, opts):
        opts["schedule"] = check_choice("schedule", opts["schedule"], set(SCHEDULES))
        opts["rho0"] = check_float("rho0", opts["rho0"], low=0.0, low_open=True)
        opts["growth"] = check_float("growth", opts["growth"], low=1.0, low_open=True)
        opts["rho_every"] = check_int("rho_every", opts["rho_every"], low=1)
        opts["patience"] = check_int("patience", opts["patience"], low=1)
        if opts["max_iter"] is not None:
            opts["max_iter"] = check_int("max_iter", opts["max_iter"], low=1)
        opts["polish"] = check_effort("polish", opts["polish"])
        if opts["polish"] and not opts["refit"]:
            raise ValueError("polish=True scores supports by their least-squares refit; it "
                             "needs refit=True")
        return opts

    def kernels(self) -> tuple:
        return POLISH_KERNELS if self.options["polish"] else ()

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        sl = ScaledLayer(W0, G)
        o = self.options
        mask, D, self.info = admm_support(
            sl, budget, schedule=o["schedule"], rho0=o["rho0"], growth=o["growth"],
            rho_every=o["rho_every"], patience=o["patience"], max_iter=o["max_iter"])
        if o["polish"]:
            mask = polish_support(sl, mask, budget, o["polish"])
        if not o["refit"]:
            return sl.finish(mask, budget, values=D, refit=False)
        # prune() refits (refit=True): the support and the dead weights the budget needs
        return sl.finish(mask, budget, refit=False)
