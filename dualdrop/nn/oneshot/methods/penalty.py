"""The duality's one-shot pruners: each output row a penalized regression on the Gram form.

By Theorem 1 of LeJeune, Javadi & Baraniuk ("The Flip Side of the Reweighted Coin: Duality of
Adaptive Dropout and Regularization", NeurIPS 2021), adaptive dropout on a linear layer's
weights while it reconstructs its trained output ``X W0^T`` is least squares plus the effective
penalty ``Omega`` of the dropout method. Row by row, in the scale-free coordinates of ``_layer``
(unit-diagonal Gram ``Gs``, weights ``u`` of RMS 1; the penalty adaptive dropout puts on
unstandardized inputs):

    min_u  1/2 (u - u0_r)^T Gs (u - u0_r) + alpha sum_j Omega(u_j),

one ``alpha`` for every row of the layer (a shared Lagrange multiplier: the layer's budget is for
the whole layer, not per row), solved by coordinate descent on the Gram form
(``dualdrop.linear.solvers.gram_cd``), any separable catalog penalty through its compiled kernel.

**Meeting the budget exactly.** ``alpha`` runs down a geometric path from ``alpha_max`` (every
weight 0), each fit warm-started at the previous one (the continuation that makes nonconvex
penalties find good supports), until the layer holds at least ``n_keep`` nonzeros; the bracket
of the last two ``alpha`` is then bisected (warm starts from the sparser end) to a support within
``slack`` of ``n_keep``. From there greedy exact moves (each removal or addition scored with the
rest refit by least squares, ``polish.SupportSearch.fix_budget``) land on exactly ``n_keep``, the
kept weights are refit by least squares on their support, and (``polish=True``) the support is
polished by swaps and transfers between rows. N:M patterns: the path runs to the pattern's
density, then every group is brought to exactly ``N`` nonzeros by exact greedy moves and polished
by swaps inside groups.

**Penalty level across layers** (:func:`level_curve`, ``allocation="penalty"``). Written with
the layer's relative error ``e = E(W) / E(0)``, the layer problem is ``min e / 2 + level sum
Omega(u)`` with ``alpha = level * sum_r u0_r^T Gs u0_r`` (the layer's output energy in these
units). One ``level`` for every layer is then the Lagrangian of "the smallest sum of relative
layer errors for a total penalty", the penalty on RMS-1 weights standing in for their count: at a
shared level, every layer trades the same fraction of its output energy for one more kept weight.
Each layer's kept count at a level comes from its path; the level is bisected so that the network
meets its total density.
"""

from __future__ import annotations

import numbers
import time

import numpy as np

import penalties
from dualdrop.linear._jit import zero_threshold
from dualdrop.linear.solvers.gram_cd import solve_gram

from ._layer import LayerProblem
from .polish import SupportSearch

__all__ = ["DEFAULT_PARAMS", "alpha_max", "level_curve", "penalty_layer", "resolve"]

# Parameters of the named methods, in the scale-free units of the weights (RMS 1)
DEFAULT_PARAMS = {
    "logsum": {"eps": 0.1},
    "mcp": {"a": 1.0, "lam": 0.1},
    "vardrop": {},
    "hardconcrete": {},
}


def resolve(penalty, params=None):
    """A penalty object from a catalog name (with ``params``, defaults of
    :data:`DEFAULT_PARAMS`) or an object; ``ValueError`` naming ``penalty`` for one without a
    compiled kernel."""
    if isinstance(penalty, str):
        merged = {**DEFAULT_PARAMS.get(penalty, {}), **(params or {})}
        P = penalties.get(penalty, **merged)
    else:
        if params:
            raise ValueError("penalty_params go with a penalty name, not a penalty object")
        P = penalty
    spec = getattr(P, "kernel_spec", lambda: None)()
    if spec is None:
        raise ValueError(f"penalty={penalty!r} has no compiled kernel; use a separable catalog "
                         "penalty (every name of penalties.available() but 'hard_threshold')")
    return P


def alpha_max(P, b_max):
    """The smallest ``alpha`` at which coordinate descent from 0 keeps every weight at 0 when
    the largest ``|Gs u0|`` is ``b_max``: the prox's zero threshold at step ``alpha`` (unit
    curvature) reaches ``b_max``. Found by doubling and bisection in ``log alpha``."""
    code, params = P.kernel_spec()
    params = np.ascontiguousarray(params, dtype=np.float64)
    if b_max <= 0:
        return 1.0
    lo, hi = 0.0, 1.0
    while zero_threshold(code, params, hi) < b_max:
        lo, hi = hi, hi * 4.0
        if hi > 1e300:
            raise ValueError(f"penalty {P!r} never sets the weights to 0 (its prox has no zero "
                             "interval): it cannot prune")
    if lo == 0.0:
        lo = hi
        while zero_threshold(code, params, lo) >= b_max and lo > 1e-300:
            hi, lo = lo, lo / 4.0
    for _ in range(80):
        mid = np.sqrt(lo * hi)
        if zero_threshold(code, params, mid) >= b_max:
            hi = mid
        else:
            lo = mid
        if hi <= lo * (1 + 1e-10):
            break
    return hi


class _Path:
    """Warm-started fits of one layer along decreasing ``alpha``."""

    def __init__(self, lp, P, tol, n_threads):
        self.lp, self.P, self.tol, self.n_threads = lp, P, tol, n_threads
        self.fits = 0

    def fit(self, alpha, start):
        res = solve_gram(self.lp.Gs, self.lp.B, self.lp.c0, alpha, self.P, start=start,
                         tol=self.tol, n_threads=self.n_threads)
        self.fits += 1
        return res.coef

    def to_budget(self, target, *, ratio, slack, max_bisect):
        """Run the path (``alpha`` times ``ratio`` per fit) until at least ``target`` nonzeros,
        then refine the last bracket until a fit lands in ``[target, target (1 + slack)]``:
        regula falsi on ``log nnz`` against ``log alpha`` (aiming inside the interval), each
        fit warm-started from the sparser end. Returns ``(U, alpha)`` of the fit with at least
        ``target`` nonzeros closest to it (or the densest fit if none reaches it)."""
        lp = self.lp
        a_hi = alpha_max(self.P, float(np.max(np.abs(lp.B), initial=0.0)))
        U_hi = np.zeros_like(lp.U0)  # sparser end of the bracket
        n_hi = 0
        for _ in range(400):
            a_lo = a_hi * ratio
            U_lo = self.fit(a_lo, U_hi)
            n_lo = int(np.count_nonzero(U_lo))
            if n_lo >= target:
                break
            U_hi, a_hi, n_hi = U_lo, a_lo, n_lo
        else:
            return U_hi, a_hi
        aim = np.log(target * (1.0 + 0.5 * slack))
        for _ in range(max_bisect):
            if n_lo <= target * (1.0 + slack) or a_hi <= a_lo * (1 + 1e-9):
                break
            lh, ll = np.log(a_hi), np.log(a_lo)
            if n_hi > 0 and n_lo > n_hi:
                t = (aim - np.log(n_hi)) / (np.log(n_lo) - np.log(n_hi))
                t = min(max(t, 0.05), 0.95)
            else:
                t = 0.5
            mid = float(np.exp(lh + t * (ll - lh)))
            Um = self.fit(mid, U_hi)
            n = int(np.count_nonzero(Um))
            if n >= target:
                a_lo, U_lo, n_lo = mid, Um, n
            else:
                a_hi, U_hi, n_hi = mid, Um, n
        return U_lo, a_lo


def penalty_layer(lp: LayerProblem, n_keep=None, pattern=None, *, penalty="logsum",
                  penalty_params=None, refit=True, polish=True, ratio=0.5, slack=0.05,
                  max_bisect=12, tol=1e-2, n_threads=1):
    """Prune ``lp`` to the budget with the penalty (module docstring). Returns ``(U, mask,
    info)``: the scaled live weights ``(R, q)``, their support and ``{"alpha", "fits",
    "swaps", "transfers", "seconds"}``."""
    t0 = time.perf_counter()
    P = resolve(penalty, penalty_params)
    path = _Path(lp, P, tol, n_threads)
    if pattern is None:
        target = lp.live_budget(n_keep)
    else:
        N, M = pattern
        _, pad = lp.groups(M)
        target = lp.R * int(np.minimum(N, (pad >= 0).sum(axis=1)).sum())
    info = {"alpha": 0.0, "fits": 0, "swaps": 0, "transfers": 0}
    if target == 0:
        mask = np.zeros(lp.U0.shape, dtype=bool)
        return np.zeros_like(lp.U0), mask, {**info, "seconds": time.perf_counter() - t0}
    if target >= lp.U0.size:
        mask = np.ones(lp.U0.shape, dtype=bool)
        return lp.U0.copy(), mask, {**info, "seconds": time.perf_counter() - t0}
    U, alpha = path.to_budget(target, ratio=ratio, slack=slack, max_bisect=max_bisect)
    info["alpha"], info["fits"] = float(alpha), path.fits
    if not refit:
        # no least squares: the penalized weights themselves, the largest |u| kept
        mask = lp.keep_top(np.abs(U), n_keep=target if pattern is None else None,
                           pattern=pattern)
        return np.where(mask, U, 0.0), mask, {**info, "seconds": time.perf_counter() - t0}
    search = SupportSearch(lp, U != 0, pattern=pattern)
    if pattern is None:
        search.fix_budget(target)
    else:
        search.fix_pattern()
    if polish:
        _, info["swaps"], info["transfers"] = search.polish()
    mask = search.mask()
    U = lp.refit(mask)
    info["seconds"] = time.perf_counter() - t0
    return U, mask, info


def level_curve(lp: LayerProblem, levels, *, penalty="logsum", penalty_params=None, tol=1e-4,
                n_threads=1):
    """The layer's kept count at each penalty ``level`` of ``levels`` (decreasing), ``alpha =
    level * energy`` (module docstring), warm-started along the levels. Returns an int array."""
    P = resolve(penalty, penalty_params)
    path = _Path(lp, P, tol, n_threads)
    levels = np.asarray(levels, dtype=np.float64)
    out = np.zeros(levels.size, dtype=np.int64)
    U = np.zeros_like(lp.U0)
    amax = alpha_max(P, float(np.max(np.abs(lp.B), initial=0.0)))
    for i, lev in enumerate(levels):
        a = lev * lp.energy
        if a >= amax:
            continue
        U = path.fit(a, U)
        out[i] = np.count_nonzero(U)
    return out


def _check_positive(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)
