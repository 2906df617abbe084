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
density; with the polish every group then starts from the ``N`` largest weights of the last fit
(:func:`nm_start`) and is polished by swaps inside groups, without it every group is brought to
exactly ``N`` nonzeros by exact greedy moves.

**At width** (``solver="auto"`` on layers with at least ``admm.WIDE`` outputs and live inputs,
or ``solver="split"``): the path's per-row fits cost too much there (a 384 x 1,536 layer at 50%:
26 CPU minutes), and the same problem is split over every row at once instead
(``_split.split_support``): ADMM's iteration (``admm``: one eigendecomposition of the Gram, one
or two ``(R x q) (q x q)`` float32 products per iteration, stopped when the support settles);
from ADMM's better support a run with the penalty's prox on the kept entries as the D-step, its
level continued along the iterations down to ADMM's projection; the rows it changed are kept
where their least-squares error is lower, and returned refit (in float64). Its objective is
never above ``admm``'s, at about 1.3x its time for every catalog penalty, ``vardrop`` and
``hardconcrete`` included (their prox read off a table of the penalty's stationarity map,
``_split.prox_table``; benchmarks/RESULTS.md, "One-shot at width").

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

import math
import time

import numpy as np
import torch

import penalties
from dualdrop.linear.solvers import gram_cd
from dualdrop.linear.solvers.gram_cd import solve_gram
from penalties._numba_cache import announce_first_use
from penalties.checks import check_choice, check_float, check_int

from .admm import NARROW, at_width, check_sized
from .base import Budget, LayerProblem, OneShotMethod
from ._layer import ScaledLayer
from ._split import _kept_range, _table_prox, alpha_max, split_support
from . import polish as _polish
from .polish import SupportSearch, check_effort

SPLIT_KERNELS = (_table_prox, _kept_range)  # the splitting's kernels (wide layers only)

__all__ = ["DEFAULT_PARAMS", "HardConcrete", "LogSum", "MCP", "Penalty", "VarDrop",
           "allocate_penalty", "alpha_max", "penalty_support", "split_support"]

MAX_ITER, MAX_EPOCHS = 20, 200  # outer iterations and passes per working set of a path fit
# The path gives up once alpha has fallen by this factor without a new nonzero: on a Gram of low
# rank (fewer calibration samples than the budget keeps per row) coordinate descent cannot
# spread the weights over more inputs than the rank, whatever alpha; the exact moves
# (SupportSearch.fix_budget) meet the budget from there.
STALL = 1e-3

# solver="auto": the splitting (``_split``) on layers at least admm.WIDE wide in both outputs
# and live inputs (admm.at_width; the small benchmark networks' layers keep the path, at or
# below ADMM there)

# Parameters of the penalties, in the scale-free units of the weights (RMS 1); what a user
# passes overrides them.
DEFAULT_PARAMS = {
    "logsum": {"eps": 1.0},
    "mcp": {"a": 1.0, "lam": 1.0},
}


def resolve(penalty, params=None):
    """The penalty object of a catalog name (``params`` over :data:`DEFAULT_PARAMS`) or an
    object; ``ValueError`` naming ``penalty`` for one without a compiled kernel."""
    if isinstance(penalty, str):
        P = penalties.get(penalty, **{**DEFAULT_PARAMS.get(penalty, {}), **(params or {})})
    else:
        if params:
            raise ValueError("penalty parameters go with a penalty name, not a penalty object")
        P = penalty
    spec = getattr(P, "kernel_spec", lambda: None)()
    if spec is None:
        raise ValueError(f"penalty={penalty!r} has no compiled kernel; use a separable catalog "
                         "penalty (every name of penalties.available() but 'hard_threshold')")
    return P


class _Path:
    """Warm-started fits of one layer along decreasing ``alpha``."""

    def __init__(self, sl: ScaledLayer, P, tol, n_threads):
        self.sl, self.P, self.tol, self.n_threads = sl, P, tol, n_threads
        self.fits = 0
        self.alpha_max = alpha_max(P, float(np.max(np.abs(sl.B), initial=0.0)))

    def fit(self, alpha, start):
        # a path fit only needs its support: bounded work per fit (the criterion reaches tol
        # in a few outer iterations on the layers measured; a nonconvex penalty's fit is a
        # stationary point anyway)
        res = solve_gram(self.sl.Gs, self.sl.B, self.sl.c0, alpha, self.P, start=start,
                         tol=self.tol, max_iter=MAX_ITER, max_epochs=MAX_EPOCHS,
                         n_threads=self.n_threads)
        self.fits += 1
        return res.coef

    def to_budget(self, target, *, ratio, slack, max_refine):
        """Run the path (``alpha`` times ``ratio`` per fit) until at least ``target`` nonzeros,
        then refine the last bracket until a fit lands in ``[target, target (1 + slack)]``:
        regula falsi on ``log nnz`` against ``log alpha`` (aiming inside the interval), each
        fit warm-started from the sparser end. Near the target the path's step is shortened to
        land inside the interval (the count extrapolated as a power of ``alpha`` through the
        last two fits) rather than overshoot it: the densest fits cost the most. Returns ``(U,
        alpha)`` of the fit with at least ``target`` nonzeros closest to it (or the densest fit
        if none reaches it: after 400 fits, or once ``alpha`` has fallen by :data:`STALL`
        without a new nonzero)."""
        aim = target * (1.0 + 0.5 * slack)
        a_hi = self.alpha_max
        U_hi = np.zeros_like(self.sl.U0)  # the sparser end of the bracket
        n_hi = 0
        a_prev = n_prev = 0
        a_grew = a_hi  # the alpha at which the count last grew
        for _ in range(400):
            step = ratio
            if 0 < n_prev < n_hi < aim:  # nnz ~ alpha^-k through the last two fits
                k = math.log(n_hi / n_prev) / math.log(a_prev / a_hi)
                step = min(max((n_hi / aim) ** (1.0 / k), ratio), 0.95)
            a_lo = a_hi * step
            U_lo = self.fit(a_lo, U_hi)
            n_lo = int(np.count_nonzero(U_lo))
            if n_lo >= target:
                break
            if n_lo > n_hi:
                a_grew = a_lo
            elif a_lo < a_grew * STALL:
                return U_lo, a_lo
            a_prev, n_prev = a_hi, n_hi
            U_hi, a_hi, n_hi = U_lo, a_lo, n_lo
        else:
            return U_hi, a_hi
        aim = math.log(aim)
        for _ in range(max_refine):
            if n_lo <= target * (1.0 + slack) or a_hi <= a_lo * (1 + 1e-9):
                break
            lh, ll = math.log(a_hi), math.log(a_lo)
            t = 0.5
            if 0 < n_hi < n_lo:
                t = (aim - math.log(n_hi)) / (math.log(n_lo) - math.log(n_hi))
                t = min(max(t, 0.05), 0.95)
            mid = math.exp(lh + t * (ll - lh))
            Um = self.fit(mid, U_hi)
            n = int(np.count_nonzero(Um))
            if n >= target:
                a_lo, U_lo, n_lo = mid, Um, n
            else:
                a_hi, U_hi, n_hi = mid, Um, n
        return U_lo, a_lo


def nm_start(sl: ScaledLayer, U, budget: Budget):
    """The N:M support the polish starts from: in every group, the ``N`` largest ``|u|`` of the
    path's last fit ``U``, then (groups the fit left short) the largest ``|u0|``. Cheaper for
    the swaps to start from than exact greedy moves from ``U != 0``, which move about a third of
    a row's support, one ``O(p |S|)`` update each; on LeNet-300-100 at 2:4 they also ended in
    a worse local optimum (polished error 8% above this start's on 100 rows of the first layer,
    0.7% on the second, in 1.4x and 2.4x this start's time), though not on every layer (small
    digit-like layers with a constant border: lower in 3 of 4 seeds)."""
    a0 = np.abs(sl.U0)
    return sl.top_mask(np.where(U != 0, np.abs(U) + a0.max(initial=0.0) + 1.0, a0), budget)


def penalty_support(sl: ScaledLayer, budget: Budget, P, *, refit=True, polish=True,
                    ratio=0.5, slack=0.05, max_refine=12, tol=1e-2, n_threads=1):
    """Prune ``sl`` to ``budget`` with the penalty ``P`` (module docstring). Returns ``(U, mask,
    info)``: the penalized scaled weights of the path's last fit ``(R, q)``, the live support
    and ``{"alpha", "fits", "swaps", "transfers", "seconds"}``. Without ``refit`` the support
    keeps the largest ``|u|`` of that fit (no exact moves, no polish)."""
    t0 = time.perf_counter()
    info = {"alpha": 0.0, "fits": 0, "swaps": 0, "transfers": 0}
    target = sl.live_target(budget)
    if target == 0 or target >= sl.U0.size:
        mask = np.full(sl.U0.shape, target > 0)
        return sl.U0.copy(), mask, {**info, "seconds": time.perf_counter() - t0}
    path = _Path(sl, P, tol, n_threads)
    U, alpha = path.to_budget(target, ratio=ratio, slack=slack, max_refine=max_refine)
    info["alpha"], info["fits"] = float(alpha), path.fits
    if not refit:
        mask = sl.top_mask(np.abs(U), budget)
        return U, mask, {**info, "seconds": time.perf_counter() - t0}
    start = U != 0
    if budget.pattern is not None and polish:
        start = nm_start(sl, U, budget)
    search = SupportSearch(sl, start, pattern=budget.pattern)
    info["swaps"], info["transfers"] = search.meet_budget(budget, polish)
    info["seconds"] = time.perf_counter() - t0
    return U, search.mask(), info


class Penalty(OneShotMethod):
    """The duality's penalized regression per output row (module docstring).

    Options: ``penalty`` (a catalog name with a compiled kernel, default ``"logsum"``; its
    parameters as further options, e.g. ``eps=0.5``, in the units of RMS-1 weights, defaults
    :data:`DEFAULT_PARAMS`), ``solver`` (``"path"``: the coordinate-descent path of the module
    docstring; ``"split"``: :func:`split_support`, every row at once at ADMM's cost per
    iteration; ``"auto"``, default: the splitting on layers with at least ``admm.WIDE`` outputs
    and live inputs, the path on smaller ones), ``refit`` (default True: least squares on the
    support, exact greedy moves to the budget; False keeps the penalized weights of the path's
    last fit, or the splitting's last D-step), ``polish`` (the support polish, ``polish.py``;
    default ``None``: with the path only, where it was measured to pay, ``"full"`` on layers of
    up to ``polish.FULL_WEIGHTS`` live weights and ``"swaps"`` on larger ones
    (``polish.default_effort``); at width it cost 13x the splitting's time on a 384 x 384 layer
    for 0.7% of objective; ``False``: none), ``tol`` (the coordinate descent's
    criterion along the path, 1e-2), ``ratio`` (``alpha`` factor between path fits, 0.5),
    ``slack`` (how far above the budget the path may stop before the exact moves, 0.05) and
    ``n_threads`` (rows solved in parallel by numba, 1); with the splitting, ``patience``,
    ``freeze``, ``cg_steps`` and ``fold`` as for ``admm`` (``None``: by the layer's width)."""

    name = "penalty"
    penalty_name = "logsum"
    refits_itself = True
    defaults = {"penalty": None, "penalty_params": None, "solver": "auto", "refit": True,
                "polish": None,
                "tol": 1e-2, "ratio": 0.5, "slack": 0.05, "max_refine": 12, "n_threads": 1,
                "patience": None, "freeze": None, "cg_steps": None, "fold": None}

    def __init__(self, **options):
        # options the method does not know are the penalty's parameters (penalty:scad, a=3.7)
        own = set(self.defaults) | {"refit"}
        params = {k: options.pop(k) for k in list(options) if k not in own}
        if params:
            if options.get("penalty_params"):
                raise ValueError(f"give the penalty's parameters either as options {sorted(params)} "
                                 "or in penalty_params, not both")
            options["penalty_params"] = params
        super().__init__(**options)

    def _validate(self, opts):
        if opts["penalty"] is None:
            opts["penalty"] = self.penalty_name
        elif type(self) is not Penalty and opts["penalty"] != self.penalty_name:
            raise ValueError(f"method {self.name!r} is the penalty method on "
                             f"{self.penalty_name!r}; penalty={opts['penalty']!r} would silently "
                             f"replace it: use method='penalty:{opts['penalty']}' (or "
                             f"get_method('penalty', penalty={opts['penalty']!r})) instead")
        if not isinstance(opts["penalty"], str):
            raise TypeError(f"penalty must be a catalog name, got {type(opts['penalty']).__name__}")
        if opts["penalty_params"] is not None and not isinstance(opts["penalty_params"], dict):
            raise TypeError("penalty_params must be a dict of the penalty's parameters")
        self.P = resolve(opts["penalty"], opts["penalty_params"])  # ValueError names a bad one
        if not isinstance(opts["refit"], bool):
            raise TypeError(f"refit must be True or False, got {opts['refit']!r}")
        opts["solver"] = check_choice("solver", opts["solver"], {"auto", "path", "split"})
        if opts["polish"] is not None:  # False stays False (no polish), not None (the default)
            opts["polish"] = check_effort("polish", opts["polish"]) or False
        if opts["polish"] and not opts["refit"]:
            raise ValueError("polish=True scores supports by their least-squares refit; it "
                             "needs refit=True")
        opts["tol"] = check_float("tol", opts["tol"], low=0.0, low_open=True)
        opts["ratio"] = check_float("ratio", opts["ratio"], low=0.0, high=1.0, low_open=True,
                                    high_open=True)
        opts["slack"] = check_float("slack", opts["slack"], low=0.0)
        opts["max_refine"] = check_int("max_refine", opts["max_refine"], low=0)
        opts["n_threads"] = check_int("n_threads", opts["n_threads"], low=1)
        check_sized(opts)
        return opts

    def kernels(self) -> tuple:
        """The path's kernels (and the polish's when it refits): what a small layer compiles.
        The splitting's two kernels are announced by the first wide layer itself, so that a
        network without one is never told of a compile it does not do."""
        if self.options["solver"] == "split":
            return SPLIT_KERNELS
        return (*gram_cd.kernels(self.P), *(_polish.KERNELS if self.options["refit"] else ()))

    def solver_for(self, sl: ScaledLayer) -> str:
        """The solver ``solver="auto"`` picks for the layer ``sl`` (class docstring)."""
        if self.options["solver"] != "auto":
            return self.options["solver"]
        return "split" if at_width(sl) else "path"

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        sl = ScaledLayer(W0, G)
        o = self.options
        solver = self.solver_for(sl)
        polish = o["polish"] if o["polish"] is not None else (
            _polish.default_effort(sl) if solver == "path" and o["refit"] else None)
        if solver == "split":
            announce_first_use(SPLIT_KERNELS, f"one-shot {self.name} at width")
            t0 = time.perf_counter()
            mask, U, D, self.info = split_support(sl, budget, self.P,
                                                  **{k: o[k] for k in NARROW})
            self.info["solver"] = "split"
            if not o["refit"]:
                return sl.finish(mask, budget, values=D, refit=False)
            if polish:
                mask = _polish.polish_support(sl, mask, budget, polish)
                return sl.finish(mask, budget)
            self.info["seconds"] = time.perf_counter() - t0
            # the least squares that scored the support (dead weights the budget needs keep
            # their trained values: they do not reach the output)
            return sl.finish(mask, budget, values=U, refit=False)
        U, mask, self.info = penalty_support(
            sl, budget, self.P, refit=o["refit"], polish=polish, ratio=o["ratio"],
            slack=o["slack"], max_refine=o["max_refine"], tol=o["tol"],
            n_threads=o["n_threads"])
        self.info["solver"] = "path"
        if not o["refit"]:
            return sl.finish(mask, budget, values=U, refit=False)
        return sl.finish(mask, budget)


class LogSum(Penalty):
    """``penalty:logsum``: the effective penalty of the eta-trick's LogSum dual (``eps``)."""

    name = "logsum"
    penalty_name = "logsum"


class MCP(Penalty):
    """``penalty:mcp``: MCP (``a``, ``lam``; ``a lam`` the width of its concave part)."""

    name = "mcp"
    penalty_name = "mcp"


class VarDrop(Penalty):
    """``penalty:vardrop``: the effective penalty of variational dropout (Molchanov et al.'s KL
    approximation)."""

    name = "vardrop"
    penalty_name = "vardrop"


class HardConcrete(Penalty):
    """``penalty:hardconcrete``: the effective penalty of hard-concrete L0 gates."""

    name = "hardconcrete"
    penalty_name = "hardconcrete"


# ----------------------------------------------------------------------------------------------
# allocation="penalty": one level for every layer


def _level_counts(layers, paths, level, starts):
    """Each layer's live nonzeros at ``level`` (``alpha = level * energy``), warm-started from
    ``starts`` (updated in place)."""
    counts = []
    for i, (sl, path) in enumerate(zip(layers, paths)):
        a = level * sl.energy
        if a >= path.alpha_max or sl.energy == 0:
            counts.append(0)
            continue
        starts[i] = path.fit(a, starts[i])
        counts.append(int(np.count_nonzero(starts[i])))
    return counts


def allocate_penalty(problems: list[LayerProblem], density: float, *, floors=None,
                     penalty="logsum", tol=1e-2, ratio=0.5, rtol=0.005, **penalty_params):
    """``{name: n_keep}`` with one penalty level for every layer (module docstring), summing to
    ``round(density * total)`` exactly.

    The level runs down a geometric path (``ratio``) until the layers' nonzeros reach the total,
    then the last bracket is bisected in ``log level`` until within ``rtol`` of it; the counts
    are then scaled to the total exactly (largest remainders), at least ``floors[l]`` per layer
    (the floors of the other allocations) and at most the layer's size. ``penalty`` and its
    parameters as for the penalty methods."""
    density = check_float("density", density, low=0.0, high=1.0, low_open=True)
    tol = check_float("tol", tol, low=0.0, low_open=True)
    ratio = check_float("ratio", ratio, low=0.0, high=1.0, low_open=True, high_open=True)
    rtol = check_float("rtol", rtol, low=0.0, low_open=True)
    if not isinstance(penalty, str):
        raise TypeError(f"penalty must be a catalog name, got {type(penalty).__name__}")
    P = resolve(penalty, penalty_params)
    sizes = [int(p.W0.numel()) for p in problems]
    total = round(density * sum(sizes))
    floors = [0] * len(problems) if floors is None else [int(f) for f in floors]
    if any(p.G is None for p in problems):
        raise ValueError("allocation='penalty' needs every layer's Gram (LayerProblem.G)")
    announce_first_use(gram_cd.kernels(P), "one-shot allocation='penalty'")
    layers = [ScaledLayer(p.W0, p.G) for p in problems]
    paths = [_Path(sl, P, tol, 1) for sl in layers]
    starts = [np.zeros_like(sl.U0) for sl in layers]
    live = sum(sl.R * sl.q for sl in layers)
    want = min(total, live)
    level = max((pa.alpha_max / sl.energy for sl, pa in zip(layers, paths) if sl.energy > 0),
                default=1.0)
    hi, counts_hi, starts_hi = level, [0] * len(layers), [s.copy() for s in starts]
    counts = counts_hi
    grew = level  # the level at which the count last grew
    for _ in range(400):
        level *= ratio
        counts = _level_counts(layers, paths, level, starts)
        if sum(counts) >= want:
            break
        if sum(counts) > sum(counts_hi):
            grew = level
        elif level < grew * STALL:  # the layers' paths cannot reach the total (low rank)
            break
        hi, counts_hi, starts_hi = level, counts, [s.copy() for s in starts]
    lo, counts_lo = level, counts
    for _ in range(60):
        if sum(counts_lo) <= want * (1 + rtol) or hi <= lo * (1 + 1e-9):
            break
        mid = math.sqrt(lo * hi)
        trial = [s.copy() for s in starts_hi]
        c = _level_counts(layers, paths, mid, trial)
        if sum(c) >= want:
            lo, counts_lo = mid, c
        else:
            hi, counts_hi, starts_hi = mid, c, trial
    counts = _exact_counts(counts_lo, total, sizes, floors)
    return {p.name: c for p, c in zip(problems, counts)}


def _exact_counts(counts, total, sizes, floors):
    """``counts`` scaled to sum to ``total`` exactly: proportional shares (largest remainders),
    then every layer brought into ``[floor, size]`` with the difference taken from (or given
    to) the layers with room, in proportion to their counts."""
    got = sum(counts)
    exact = [c * total / got if got else total * s / sum(sizes) for c, s in zip(counts, sizes)]
    out = [min(s, max(f, math.floor(e))) for e, s, f in zip(exact, sizes, floors)]
    order = sorted(range(len(out)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
    while sum(out) != total:
        step = 1 if sum(out) < total else -1
        moved = False
        for i in order:
            if sum(out) == total:
                break
            new = out[i] + step
            if floors[i] <= new <= sizes[i]:
                out[i] = new
                moved = True
        if not moved:
            raise ValueError(f"cannot keep {total} weights within the layers' floors and sizes")
    return out
