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
gradients for this step; here each row's system is solved exactly, ``_layer.LayerProblem.refit``).
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

import numbers
import time

import numpy as np

from ._layer import LayerProblem

__all__ = ["SCHEDULES", "admm_layer"]

SCHEDULES = ("alps", "slow")

# ALPS's rho rule: (fraction of the kept places that changed, factor), checked in order
ALPS_STEPS = ((0.1, 1.3), (0.005, 1.2), (0.0, 1.1))


def _project(Z, lp, k, pattern):
    """The mask of ``P_C(Z)``: the ``k`` largest ``|Z|`` of the layer, or ``N`` per group."""
    if pattern is not None:
        return lp.keep_top(np.abs(Z), pattern=pattern)
    mask = np.zeros(Z.shape, dtype=bool)
    if k >= Z.size:
        mask[:] = True
    elif k > 0:
        a = np.abs(Z).ravel()
        mask.ravel()[np.argpartition(-a, k - 1)[:k]] = True
    return mask


def admm_layer(lp: LayerProblem, n_keep=None, pattern=None, *, schedule="alps", rho0=0.1,
               growth=1.02, rho_every=3, patience=20, max_iter=None, callback=None):
    """Run ADMM (module docstring) on ``lp``; returns ``(mask, info)``: the support over the live
    inputs ``(R, q)`` and ``{"iterations", "rho", "seconds", "stopped"}``. ``callback(t, mask,
    U)`` runs after each iteration (tests, traces)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if max_iter is None:
        max_iter = 300 if schedule == "alps" else 3000
    t0 = time.perf_counter()
    k = lp.live_budget(n_keep) if pattern is None else None
    U0 = lp.U0
    lam, Q = np.linalg.eigh(lp.Gs)
    lam = np.clip(lam, 0.0, None)
    A = (U0 @ Q) * lam  # (Gs u0_r) in the eigenbasis, every row
    mask = _project(U0, lp, k, pattern)
    D = np.where(mask, U0, 0.0)
    V = np.zeros_like(U0)
    rho = float(rho0)
    kept = int(mask.sum())
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
        new = _project(Z, lp, k, pattern)
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
                    if window_changes > frac * kept:
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
    return mask, info


def _check_options(schedule, rho0, growth, rho_every, patience, max_iter):
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    for name, v, low in (("rho0", rho0, 0.0), ("growth", growth, 1.0)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v) \
                or not v > low:
            raise ValueError(f"{name} must be a finite number > {low:g}, got {v!r}")
    for name, v in (("rho_every", rho_every), ("patience", patience)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if max_iter is not None and (isinstance(max_iter, bool)
                                 or not isinstance(max_iter, numbers.Integral) or max_iter < 1):
        raise ValueError(f"max_iter must be an integer >= 1 or None, got {max_iter!r}")
