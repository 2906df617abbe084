"""How many units each consumer keeps under a structured budget.

A budget is a ceiling on a *cost* of the kept units, monotone in each consumer's count (a
:class:`CostModel`): the prunable parameters kept (``target_density``: a fraction of them;
``target_params``: the whole model's parameter count), or the model's latency predicted by the
measured per-layer table (``target_speedup``: ``latency.LatencyTable``). Every allocation keeps
at least one unit per consumer and returns the largest counts it finds under the ceiling:

- ``"uniform"``: every consumer keeps the same fraction of its units (bisected);
- ``"flap"``: FLAP's global ranking (An et al., AAAI 2024): each unit's fluctuation score
  (``methods.structured.flap``) standardized within its layer (minus the layer's mean, over its
  standard deviation), so that layers and unit kinds compete on one scale; units are taken in
  decreasing standardized score while the budget has room for them;
- ``"penalty"``: the duality's own: one penalty level for every layer, head and neuron, each
  unit priced by its cost (parameters, or measured latency). Each layer solves
  ``min error_l(S) / energy_l + level * price_l * |S|``; the level is bisected so that the kept
  units' cost meets the budget, and what is left of the budget goes to the units that lower
  the error most per unit of cost. With ``penalty="l0"`` (the default: the count itself, the
  limit of the catalog's concave penalties) the error curve ``error_l(k)`` is that of the exact
  backward greedy (``methods.structured._kept.greedy_path``: one pass per layer from all its
  units down to one, each removal's rise of the refit error), and a level gives each layer the
  ``k`` minimizing the sum. With a catalog penalty (``"logsum"``, ``"l1"``, ...) the group
  penalty ``alpha_l = level * energy_l`` (weights the unit prices) runs on every layer's Gram
  (``methods.structured.penalty``): the level runs down a geometric path, every layer's fit
  warm-started, until the kept units' cost reaches the budget, and the last bracket is
  bisected. ``normalize="none"`` (default) compares the layers' errors as they are (what
  adds up when consumers write into one residual stream), ``"energy"`` relative to each
  layer's output energy (on all-MiniLM-L6-v2 this kept every head and emptied an FFN, and lost
  to ``"none"`` by 2.7 points of cosine on held-apart text: benchmarks/RESULTS.md).

``"penalty"`` is the default (:data:`DEFAULT_ALLOCATION`): the best measured setting on
all-MiniLM-L6-v2, GPT-2 and LeNet-5 (benchmarks/RESULTS.md, "Structured one-shot").
"""

from __future__ import annotations

import math

import numpy as np

from dualdrop.nn.oneshot.methods.structured._kept import greedy_path
from dualdrop.nn.oneshot.methods.structured.base import UnitProblem
from dualdrop.nn.oneshot.methods.structured.flap import FLAP
from dualdrop.nn.oneshot.methods.structured.penalty import Scaled, UnitPath, resolve
from penalties.checks import check_float, check_int

ALLOCATIONS = ("uniform", "flap", "penalty")
#: the allocation ``prune_structured`` uses when none is given: the best of the measured
#: tables (benchmarks/RESULTS.md, "Structured one-shot")
DEFAULT_ALLOCATION = "penalty"

#: options of each allocation and their defaults
ALLOCATION_DEFAULTS = {
    "uniform": {},
    "flap": {},
    "penalty": {"penalty": "l0", "penalty_params": None, "ratio": 0.7, "tol": 3e-3,
                "max_epochs": 50, "refine": 8, "damp": 1e-3, "normalize": "none"},
}


def check_allocation(kind, opts: dict | None) -> dict:
    """``kind`` known and ``opts`` its options (defaults filled in); ``ValueError`` else."""
    if kind not in ALLOCATIONS:
        raise ValueError(f"allocation={kind!r}; expected one of {list(ALLOCATIONS)} for "
                         "structured pruning")
    if opts is not None and not isinstance(opts, dict):
        raise TypeError("allocation_options must be a dict")
    known = ALLOCATION_DEFAULTS[kind]
    unknown = sorted(set(opts or {}) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for allocation={kind!r}; its options: "
                         f"{sorted(known) or 'none'}")
    out = {**known, **(opts or {})}
    if kind == "penalty":
        if out["penalty"] != "l0":
            resolve(out["penalty"], out["penalty_params"])
        out["damp"] = check_float("damp", out["damp"], low=0.0)
        if out["normalize"] not in ("energy", "none"):
            raise ValueError(f"normalize={out['normalize']!r}; expected 'energy' or 'none'")
        out["ratio"] = check_float("ratio", out["ratio"], low=0.0, high=1.0, low_open=True,
                                   high_open=True)
        out["tol"] = check_float("tol", out["tol"], low=0.0, low_open=True)
        out["max_epochs"] = check_int("max_epochs", out["max_epochs"], low=1)
        out["refine"] = check_int("refine", out["refine"], low=0)
    return out


class CostModel:
    """The cost ``fn(counts)`` of keeping ``counts[name]`` units of each consumer (increasing
    in every count): parameters (``units.ParamCount``) or predicted seconds
    (``allocation.latency.LatencyTable.predicted``)."""

    def __init__(self, names, sizes, fn, what="parameters"):
        self.names, self.sizes = list(names), dict(zip(names, sizes))
        self.fn, self.what = fn, what

    def __call__(self, counts: dict) -> float:
        return float(self.fn(counts))

    def full(self) -> float:
        return self(self.sizes)

    def least(self) -> float:
        return self({n: 1 for n in self.names})


def allocate_units(kind: str, cost: CostModel, budget: float, problems=None, prices=None,
                   **opts) -> dict:
    """``{name: kept units}`` under ``cost(counts) <= budget`` (module docstring);
    ``problems`` (``{name: UnitProblem}`` on the dense model) for ``"flap"`` and
    ``"penalty"``, ``prices`` (``{name: per-unit cost}``) for ``"penalty"``."""
    opts = check_allocation(kind, opts)
    if cost.least() > budget * (1 + 1e-12):
        raise ValueError(f"the budget ({budget:.4g} {cost.what}) is below what one unit per "
                         f"layer costs ({cost.least():.4g}); ask for less pruning")
    if kind == "uniform":
        return _uniform(cost, budget)
    if kind == "flap":
        return _flap(cost, budget, problems)
    return _penalty(cost, budget, problems, prices, **opts)


#: a layer keeping at most this fraction of its units is "nearly emptied" (:func:`lopsided`)
EMPTIED = 0.15


def lopsided(counts: dict, sizes: dict, kinds: dict) -> str | None:
    """A warning when the budget was spent badly: every unit of one kind kept (every head)
    while a layer of another kind keeps at most :data:`EMPTIED` of its units (an FFN nearly
    emptied); the model then pays the whole budget on one kind of unit, which the measured
    tables of docs/oneshot.md found the worst use of it. None when the counts are even."""
    by_kind: dict = {}
    for n, k in kinds.items():
        by_kind.setdefault(k, []).append(n)
    full = [k for k, ns in by_kind.items() if all(counts[n] >= sizes[n] for n in ns)]
    for k in full:
        starved = [n for kk, ns in by_kind.items() if kk != k for n in ns
                   if counts[n] <= EMPTIED * sizes[n]]
        if starved:
            shown = ", ".join(f"{n} keeps {counts[n]}/{sizes[n]}" for n in starved[:3])
            return (f"the allocation kept every {k} while {len(starved)} layer(s) of other "
                    f"units are nearly emptied ({shown}{', ...' if len(starved) > 3 else ''})"
                    "; such a model is usually much worse than an even one: try "
                    "allocation='uniform', or allocation='penalty' with allocation_options="
                    "{'normalize': 'none'}")
    return None


def _uniform(cost, budget):
    def at(f):
        return {n: max(1, min(s, int(round(f * s)))) for n, s in cost.sizes.items()}

    lo, hi = 0.0, 1.0
    if cost(at(1.0)) <= budget:
        return at(1.0)
    for _ in range(60):
        mid = (lo + hi) / 2
        if cost(at(mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return at(lo)


def standardized(scores: np.ndarray) -> np.ndarray:
    """``(s - mean) / std`` within one layer (0 where the scores do not vary)."""
    s = np.asarray(scores, np.float64)
    sd = float(s.std())
    return (s - s.mean()) / sd if sd > 0 else np.zeros_like(s)


def _flap(cost, budget, problems):
    flap = FLAP()
    entries = []
    counts = {n: 1 for n in cost.names}
    for n in cost.names:
        z = standardized(flap.scores(problems[n]))
        order = np.argsort(-z, kind="stable")
        entries += [(float(z[u]), n) for u in order[1:]]   # the best unit of each is kept
    entries.sort(key=lambda e: -e[0])
    spent = cost(counts)
    for _, n in entries:
        counts[n] += 1
        new = cost(counts)
        if new > budget:
            counts[n] -= 1
        else:
            spent = new
    return counts


def _penalty(cost, budget, problems, prices, *, penalty, penalty_params, ratio, tol,
             max_epochs, refine, damp, normalize):
    if penalty == "l0":
        return _penalty_l0(cost, budget, problems, prices, damp, normalize)
    P = resolve(penalty, penalty_params)
    names = cost.names
    mean_price = float(np.mean(np.concatenate([np.asarray(prices[n], np.float64)
                                               for n in names])))
    layers, paths = {}, {}
    for n in names:
        w = np.asarray(prices[n], np.float64) / mean_price
        layers[n] = Scaled(problems[n], weights=w)
        paths[n] = UnitPath(layers[n], P, tol, max_epochs)
    starts = {n: np.zeros_like(layers[n].U0) for n in names}

    def counts_at(level, base):
        out, fits = {}, {}
        for n in names:
            sc, pa = layers[n], paths[n]
            a = level * sc.energy
            if sc.energy <= 0 or a >= pa.alpha_max:
                U = np.zeros_like(sc.U0)
            else:
                U = pa.fit(a, base[n])
            fits[n] = U
            out[n] = max(1, int(sc.kept(U).size))
        return out, fits

    level = max(paths[n].alpha_max / layers[n].energy for n in names if layers[n].energy > 0)
    hi, fits_hi = level, starts
    counts_hi = {n: 1 for n in names}
    lo = counts_lo = None
    for _ in range(300):
        level *= ratio
        c, fits = counts_at(level, fits_hi)
        if cost(c) > budget:
            lo, counts_lo = level, c
            break
        hi, counts_hi, fits_hi = level, c, fits
        if all(c[n] == cost.sizes[n] for n in names):
            return c
    if lo is None:
        return counts_hi
    for _ in range(refine):
        mid = math.sqrt(lo * hi)
        c, fits = counts_at(mid, fits_hi)
        if cost(c) > budget:
            lo, counts_lo = mid, c
        else:
            hi, counts_hi, fits_hi = mid, c, fits
    return _fill(cost, budget, counts_hi, counts_lo)


def _penalty_l0(cost, budget, problems, prices, damp, normalize):
    names = cost.names
    mean_price = float(np.mean(np.concatenate([np.asarray(prices[n], np.float64)
                                               for n in names])))
    curves, price = {}, {}
    for n in names:
        pr = problems[n]
        _, _, costs = greedy_path(pr, 1, damp)
        # err[k]: the error with k units kept (err[n] = 0)
        err = np.zeros(pr.n_units + 1)
        err[1:pr.n_units] = np.cumsum(costs)[::-1]
        err[0] = np.inf
        scale = pr.energy() if normalize == "energy" else 1.0
        curves[n] = err / max(scale, 1e-300)
        price[n] = float(np.mean(prices[n])) / mean_price
    ks = {n: np.arange(len(curves[n])) for n in names}

    def at(level):
        return {n: int(np.argmin(curves[n] + level * price[n] * ks[n])) for n in names}

    lo, hi = 1e-12, 1e12   # counts at lo: all units (within budget?); at hi: one each
    if cost(at(lo)) <= budget:
        return at(lo)
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if cost(at(mid)) <= budget:
            hi = mid
        else:
            lo = mid
        if hi <= lo * (1 + 1e-6):
            break
    counts = at(hi)
    # what is left of the budget: the units that lower the error most per unit of price
    while True:
        gains = [((curves[n][counts[n]] - curves[n][counts[n] + 1]) / price[n], n)
                 for n in names if counts[n] < cost.sizes[n]]
        added = False
        for _, n in sorted(gains, reverse=True):
            counts[n] += 1
            if cost(counts) <= budget:
                added = True
                break
            counts[n] -= 1
        if not added:
            return counts


def _fill(cost, budget, under, over):
    """From ``under`` (within the budget) toward ``over`` (beyond it): units added where
    ``over`` keeps more, in proportion to the gap, while the budget has room."""
    counts = dict(under)
    gaps = {n: over[n] - under[n] for n in counts if over[n] > under[n]}
    if not gaps:
        return counts
    total = sum(gaps.values())
    order = sorted(((n, k) for n, g in gaps.items() for k in range(g)),
                   key=lambda e: (e[1] + 0.5) / gaps[e[0]] if total else 0)
    for n, _ in order:
        counts[n] += 1
        if cost(counts) > budget:
            counts[n] -= 1
    return counts

