"""The splitting solver of the duality's one-shot methods on wide layers (``penalty.py``'s
``solver="split"``): ADMM's iteration over every row at once (``admm``) with a penalty's
compiled prox as the D-step, and that prox tabulated from the penalty's own kernels.

The layer problem is ``penalty``'s (the module docstring there: one ``alpha`` for every row,
scale-free weights ``u`` of RMS 1, unit-diagonal Gram ``Gs``). ADMM's two runs find a support
that meets the budget; from the better one a third run whose D-step shrinks the kept entries by
the penalty's prox, its level continued down along the iterations to ADMM's projection, looks
for a support of lower least-squares error; the rows it changed are refit and kept where they
are better. Its prox is read, every iteration, off a table of the penalty's stationarity map
(:func:`prox_table`), so penalties without a closed-form prox (``vardrop``, ``hardconcrete``)
cost what ``logsum`` costs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dualdrop.linear.solvers.gram_cd import kernels_for
from penalties.kernels import _map

from .admm import RUNS, admm_support, pick_better, sized
from .base import Budget
from ._layer import ScaledLayer

__all__ = ["LEVEL", "PENALTY_RUN", "TABLE", "alpha_max", "prox_table", "split_support"]

# The splitting's penalty run: its first prox step is LEVEL times the one at which the prox
# alone keeps the budget, and the prox is skipped once its step has decayed below NEGLIGIBLE
# times the first (the kept entries are then Z itself: ADMM's projection)
LEVEL, NEGLIGIBLE = 0.3, 1e-3
# the penalty's run, started from ADMM's better support (refit): its first rho, rho's growth
# per iteration and its share of ADMM's two runs' row iterations (a cap; its prox costs about
# a sixth more per iteration than ADMM's projection). On MiniLM's layers (benchmarks/RESULTS.md,
# "One-shot at width") this start improved on ADMM more often and by more (attention output,
# 50%: -0.3% against 0 from the layer's largest weights; value, 2:4: -0.3% against -0.2%) at
# 1.3x ADMM's time instead of 1.4-1.5x; a higher first rho or faster growth improved less
PENALTY_RUN = {"rho0": 0.1, "growth": 1.05, "share": 0.4}
TABLE = 2048  # points of the prox's table per iteration (linear interpolation between them)


def alpha_max(P, b_max):
    """The smallest ``alpha`` at which coordinate descent from 0 leaves every weight at 0 when
    the largest ``|Gs u0|`` is ``b_max``: the prox's zero threshold at step ``alpha`` (unit
    curvature) reaches ``b_max``. Doubling, then bisection in ``log alpha``."""
    code, params = P.kernel_spec()
    params = np.ascontiguousarray(params, dtype=np.float64)
    if b_max <= 0:
        return 1.0
    zero_threshold = kernels_for(code).zero_threshold  # compiled for this penalty alone
    lo, hi = 0.0, 1.0
    while zero_threshold(code, params, hi) < b_max:
        lo, hi = hi, hi * 4.0
        if hi > 1e300:
            raise ValueError(f"penalty {P!r} never sets a weight to 0 (its prox has no zero "
                             "interval): it cannot prune")
    if lo == 0.0:
        lo = hi
        while zero_threshold(code, params, lo) >= b_max and lo > 1e-300:
            hi, lo = lo, lo / 4.0
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if zero_threshold(code, params, mid) >= b_max:
            hi = mid
        else:
            lo = mid
        if hi <= lo * (1 + 1e-10):
            break
    return hi

@njit(cache=True, fastmath={"contract"})
def _table_prox(Z, mask, lo, scale, vals, out):
    """``out = sign(z) table(|z|)`` on ``mask``, 0 elsewhere: linear interpolation in the prox's
    table ``vals`` at the evenly spaced points ``lo + i / scale`` (one pass, no temporaries)."""
    n = vals.size
    for r in range(Z.shape[0]):
        for j in range(Z.shape[1]):
            if not mask[r, j]:
                out[r, j] = 0.0
                continue
            z = Z[r, j]
            x = (abs(z) - lo) * scale
            if x < 0.0:
                x = 0.0
            elif x > n - 1:
                x = n - 1
            i = min(int(x), n - 2)
            v = vals[i] + (x - i) * (vals[i + 1] - vals[i])
            out[r, j] = v if z >= 0 else -v


@njit(cache=True)
def _kept_range(Z, mask):
    """``(min |z| on mask, max |z|)`` in one pass (the prox table's range)."""
    lo = np.inf
    hi = 0.0
    for r in range(Z.shape[0]):
        for j in range(Z.shape[1]):
            a = abs(Z[r, j])
            if a > hi:
                hi = a
            if mask[r, j] and a < lo:
                lo = a
    return lo, hi


def prox_table(code, params, grid, t):
    """The prox ``argmin_x 1/2 (x - z)^2 + t Omega(x)`` at the increasing points ``grid > 0``
    (float64), read off the stationarity ``z = x + t Omega'(x)`` instead of solved per point.

    A 1-D prox is nondecreasing in ``z``, so on ``[z_0, z_n]`` (the grid's ends) it takes
    values in ``{0} U [x_0, x_n]``, ``x_i`` the prox of ``z_i`` (two solves). A nonzero prox is
    a stationary point at which ``h(x) = 1/2 (x - z)^2 + t Omega(x)`` curves up, i.e. a point
    where ``x + t Omega'(x)`` is increasing. That map is sampled at ``2 TABLE`` points of
    ``[x_0, x_n]`` (evenly and geometrically spaced: a prox that leaves 0 steeply, vardrop's,
    needs the points near ``x_0``), one derivative per point; each increasing run of samples
    gives, by linear interpolation, a candidate ``x`` for every ``z`` in its range. With one
    run covering the whole range and ``x_0 > 0`` that candidate is the prox (the only stationary
    point of the interval that curves up); otherwise (several runs: hardconcrete's penalty, MCP
    at a step above its concave width; or ``x_0 = 0``) the candidate of least ``h``, ``x = 0``
    among them when ``x_0 = 0``. A ``z`` no run covers, or within two samples' rise of a turn
    of the map (its extreme lies between samples), is solved. Penalties without a closed-form prox (``vardrop``, ``hardconcrete``, whose
    effective penalties are tabulated) solve each prox by a grid search and root finding,
    about 20x the cost of their derivative."""
    t = np.float64(t)
    x0, x1 = _map("prox", code, params, grid[[0, -1]], t)
    out = np.zeros_like(grid)
    if not x1 > 0:
        return out
    low = x0 if x0 > 0 else x1 * 1e-12
    x = np.unique(np.concatenate([np.linspace(low, x1, TABLE), np.geomspace(low, x1, TABLE)]))
    z = x + t * _map("derivative", code, params, x)
    # increasing by more than rounding (SCAD's and MCP's maps have flat pieces at some steps)
    up = np.diff(z) > 1e-9 * np.diff(x)
    if x0 > 0 and up.all():
        return np.interp(grid, z, x)  # ends clamped: the prox at the grid's ends is x0, x1
    edges = np.flatnonzero(np.diff(np.concatenate([[0], up.astype(np.int8), [0]])))
    h = np.full(grid.shape, np.inf)
    covered = np.zeros(grid.shape, dtype=bool)
    if x0 == 0:  # 0 is a candidate, and the prox below every run's range
        h = 0.5 * grid * grid + t * _map("omega", code, params, np.zeros(1))[0]
        covered = grid <= z[edges[0]] if edges.size else np.ones(grid.shape, dtype=bool)
    n = x.size - 1
    for s, e in zip(edges[::2], edges[1::2]):  # samples s..e increase
        # the runs at the ends reach the grid's ends (x0, x1 are their prox)
        inside = ((grid >= z[s]) | (s == 0 and x0 > 0)) & ((grid <= z[e]) | (e == n))
        if not inside.any():
            continue
        at = np.flatnonzero(inside)
        xc = np.interp(grid[at], z[s:e + 1], x[s:e + 1])
        hc = 0.5 * (xc - grid[at]) ** 2 + t * _map("omega", code, params, xc)
        better = hc < h[at]
        out[at[better]], h[at[better]] = xc[better], hc[better]
        covered[at] = True
        # where the map turns, its extreme lies between samples: the z within two samples' rise
        # of a turn are solved
        for i in ((s,) if s > 0 else ()) + ((e,) if e < n else ()):
            d = abs(z[i + 1] - z[i]) + abs(z[i] - z[i - 1])
            covered[np.abs(grid - z[i]) <= d] = False
    if not covered.all():
        out[~covered] = _map("prox", code, params, grid[~covered], t)
    return out


def _prox_step(P, level):
    """The D-step values of the splitting's penalty run (``admm_support``'s ``shrink``): the
    kept entries' prox at the step ``alpha / rho``, ``alpha`` fixed at the first iteration to
    ``level`` times the step whose zero threshold is the largest ``|z|`` left out (the step at
    which the prox alone would keep the budget), so the shrinkage decays as ``rho`` grows and
    the run ends as ADMM's projection."""
    code, params = P.kernel_spec()
    params = np.ascontiguousarray(params, dtype=np.float64)
    state = {}

    def shrink(Z, mask, rho):
        if "alpha" not in state:
            T = float(np.abs(Z[~mask]).max(initial=0.0))
            state["t0"] = level * alpha_max(P, T) if T > 0 else 0.0
            state["alpha"] = state["t0"] * rho
        t = state["alpha"] / rho
        if not t > NEGLIGIBLE * state["t0"] or not mask.any():
            return np.where(mask, Z, 0.0)
        # the prox is odd and, above its zero threshold (every kept |z| is: the first step is
        # below the one whose threshold is the budget's), smooth and increasing in |z|:
        # tabulated at TABLE evenly spaced points per iteration and interpolated linearly,
        # not evaluated per weight
        lo, hi = _kept_range(Z, mask)
        if not hi > lo > 0:
            return np.where(mask, Z, 0.0)
        grid = np.linspace(lo, hi, TABLE)
        vals = prox_table(code, params, grid, t).astype(Z.dtype)
        out = np.empty_like(Z)
        _table_prox(Z, mask, Z.dtype.type(lo), Z.dtype.type((TABLE - 1) / (hi - lo)), vals, out)
        return out
    return shrink


def split_support(sl: ScaledLayer, budget: Budget, P, *, level=LEVEL, precision="float32",
                  penalty_run=None, **size):
    """Prune ``sl`` to ``budget`` by the splitting of every row at once (``admm``'s module
    docstring: one eigendecomposition of the Gram, one or two ``(R x q) (q x q)`` products per
    iteration, a support that settles). ADMM's two runs (``admm.RUNS``) first, the better
    support kept (row by row for a pattern); from it, refit, a run whose D-step is the
    penalty's compiled prox on the kept entries (:func:`_prox_step`, the penalty level
    continued along the iterations down to ADMM's projection; ``penalty_run``: its ``rho0``,
    ``growth`` and ``share`` of ADMM's rows' iterations, default :data:`PENALTY_RUN`). The rows
    whose support that run changed are refit and their new support kept where its
    least-squares error is lower (all of them together under a layer count, which they share;
    row by row for a pattern): never above ``admm``'s. ``size``: ``patience``, ``freeze``,
    ``cg_steps``, ``fold`` (``admm.sized``: by the layer's width unless given). Returns
    ``(mask, U, D, info)``: the live support, its least-squares weights (scaled), the runs'
    own values there and ``{"runs", "kept", "changed", "improved"}`` (the rows the penalty's
    run changed, and those of them kept; ``kept``: the run that gave the most rows)."""
    size = sized(size, sl)
    own = {**PENALTY_RUN, **(penalty_run or {})}
    runs = [admm_support(sl, budget, rho0=0.1, growth=r["growth"], max_iter=r["max_iter"],
                         coordinates=c, start=r["start"], precision=precision,
                         patience=size["patience"], freeze=size["freeze"], fold=size["fold"])
            for c, r in RUNS.items()]
    mask, U, D, won, err = pick_better(sl, budget, runs, size["cg_steps"], errors=True)
    mask, U, D = mask.copy(), U.copy(), D.copy()
    names = [*RUNS, "penalty"]
    # the penalty's run: at most the iterations ADMM's runs took and ``share`` of their rows'
    # iterations (a support that has not settled by then still meets the budget and competes)
    pm, pD, pinfo = admm_support(
        sl, budget, rho0=own["rho0"], growth=own["growth"],
        max_iter=max(r[2]["iterations"] for r in runs), coordinates="scaled", start=(mask, U),
        precision=precision, shrink=_prox_step(P, level), patience=size["patience"],
        freeze=size["freeze"], fold=size["fold"],
        max_row_iterations=own["share"] * sum(r[2]["row_iterations"] for r in runs))
    changed = np.flatnonzero((pm != mask).any(axis=1))
    info = {"runs": {c: r[2] for c, r in zip(names, runs)}, "kept": names[won],
            "changed": int(changed.size), "improved": 0}
    info["runs"]["penalty"] = pinfo
    if changed.size:
        if size["cg_steps"]:
            Uc, ec = sl.refit_cg(pm[changed], pD[changed], size["cg_steps"], rows=changed)
        else:
            Uc, ec = sl.refit_rows(pm[changed], rows=changed)
        better = ec < err[changed]
        if budget.pattern is None:  # the changed rows together: they share the count
            better[:] = ec.sum() < err[changed].sum()
        take = changed[better]
        mask[take], U[take], D[take] = pm[take], Uc[better], pD[take]
        if 2 * take.size > (changed.size if budget.pattern is None else sl.R):
            info["kept"] = "penalty"
        info["improved"] = int(take.size)
    return mask, U, D, info
