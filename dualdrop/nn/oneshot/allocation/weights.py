"""How many weights each layer keeps when the network as a whole keeps a fraction ``density``.

Every allocation returns ``{layer name: n_keep}`` whose sum is exactly ``round(density * total)``
(``total``: the weights of all the pruned layers), measured on the dense model (one calibration
pass gives every layer's ``LayerProblem``):

- ``"uniform"``: every layer keeps ``density`` of its weights (the budget of SparseGPT and Wanda);
- ``"global"``: one magnitude threshold over all layers (the ``n`` largest ``|w|`` of the
  network); layers whose weights are small (a wide first layer) give more;
- ``"owl"``: outlier-weighted layerwise sparsity (Yin et al., "Outlier Weighed Layerwise
  Sparsity (OWL)", ICML 2024): a layer's *outlier ratio* ``LOD_l`` is the fraction of its Wanda
  scores ``|W_ij| ||X_j||`` above ``owl_m`` times their mean; densities are ``LOD`` rescaled to
  a spread of ``2 owl_lambda`` and shifted so that the network keeps ``density`` (layers with
  more outliers keep more). The paper's defaults, M = 5 and lambda = 0.08, are ours. The paper
  weighs every Transformer block equally; here layers differ in size, so the shift is the one
  that meets the weighted total;
- ``"penalty"``: the duality's own: one penalty level shared by every layer, set by bisection so
  that the network meets its density (its scale and solver: ``methods/penalty.py``).

Non-uniform allocations keep at least ``dualdrop.nn._base.layer_floor`` weights per layer (one
per two of its units, the rule gradual magnitude pruning uses), so no layer is emptied; a
budget below the sum of the floors shrinks them in proportion.
"""

from __future__ import annotations

import math
import warnings

import torch

from dualdrop.nn._base import layer_floor
from dualdrop.nn.oneshot.methods.base import Budget, LayerProblem, split_count
from penalties.checks import check_float

from dualdrop.nn.oneshot.methods.penalty import allocate_penalty

ALLOCATIONS = ("uniform", "global", "owl", "penalty")

#: the per-layer floor of non-uniform allocations, as a fraction of the layer (plus layer_floor)
MIN_LAYER_DENSITY = 0.001

#: options of each allocation and their defaults
ALLOCATION_DEFAULTS = {"uniform": {}, "global": {}, "owl": {"owl_m": 5.0, "owl_lambda": 0.08},
                       "penalty": {}}


def check_allocation(kind, opts: dict) -> dict:
    """``kind`` known and ``opts`` its options (defaults filled in); ``ValueError`` otherwise."""
    if kind not in ALLOCATIONS:
        raise ValueError(f"allocation={kind!r}; expected one of {list(ALLOCATIONS)}")
    if kind == "penalty":   # the penalty allocation checks its own options
        return dict(opts)
    known = ALLOCATION_DEFAULTS[kind]
    unknown = sorted(set(opts) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for allocation={kind!r}; its options: "
                         f"{sorted(known) or 'none'}")
    out = {**known, **opts}
    if kind == "owl":
        out["owl_m"] = check_float("owl_m", out["owl_m"], low=0.0, low_open=True)
        out["owl_lambda"] = check_float("owl_lambda", out["owl_lambda"], low=0.0)
    return out


def allocate(problems: list[LayerProblem], density: float, kind: str = "uniform",
             **opts) -> dict[str, int]:
    """``{name: n_keep}`` for the layers of ``problems`` (module docstring)."""
    density = check_float("density", density, low=0.0, high=1.0, low_open=True)
    opts = check_allocation(kind, opts)
    sizes = [p.W0.numel() for p in problems]
    total = kept_total(density, sum(sizes))
    if kind == "uniform":
        return {p.name: c for p, c in zip(problems, split_count(total, sizes))}
    floors = [min(n, max(layer_floor(p.W0, n, MIN_LAYER_DENSITY), 1))
              for p, n in zip(problems, sizes)]
    if sum(floors) > total:  # a budget below the floors: they shrink in proportion
        floors = split_count(total, floors)
    if kind == "penalty":
        # one penalty level for every layer (methods/penalty.py: its scale, solver, options)
        return allocate_penalty(problems, density, floors=floors, **opts)
    if kind == "global":
        return _global_magnitude(problems, floors, total)
    lod = [outlier_ratio(p.W0, p.G, opts["owl_m"]) for p in problems]
    lo, hi = min(lod), max(lod)
    spread = [2 * opts["owl_lambda"] * (v - lo) / (hi - lo) if hi > lo else 0.0 for v in lod]
    counts = densities_to_counts(spread, sizes, floors, total)
    return {p.name: c for p, c in zip(problems, counts)}


def kept_total(density: float, total: int) -> int:
    """The one density-to-count rule: ``round(density * total)`` weights kept of ``total``
    (the prunable weights of the pruned layers), from memory or from disk. Single weights keep
    exactly that many (a layer it leaves with no weight is raised to one weight per output
    row, with a warning: :func:`raise_empty_layers`); whole units keep at most that many
    (``structured.unit_budget_counts``: units come whole)."""
    return round(density * total)


def uniform_counts(density: float, sizes: dict[str, int]) -> dict[str, int]:
    """``allocate(..., "uniform")`` from the layers' sizes alone (``{name: weights}``): one
    rounded total (:func:`kept_total`) split over the layers in proportion, exactly."""
    total = kept_total(density, sum(sizes.values()))
    return dict(zip(sizes, split_count(total, list(sizes.values()))))


def raise_empty_layers(budgets: dict, shapes: dict, stacklevel: int = 3) -> dict:
    """A density budget that rounds a layer down to no weight at all is raised to one weight
    per output row of it (an emptied layer cuts the network), with a warning naming it;
    ``shapes``: ``{name: (out, in)}``; ``stacklevel``: the warning's, at the user's call.
    Every density budget of single weights goes through
    here (from memory or from disk)."""
    emptied = [n for n, b in budgets.items() if b.n_keep == 0 and shapes[n][0] * shapes[n][1]]
    if emptied:
        for n in emptied:
            budgets[n] = Budget(n_keep=min(shapes[n][0], shapes[n][0] * shapes[n][1]))
        warnings.warn(f"the budget rounds {len(emptied)} layer(s) to no weight at all, which "
                      f"would cut the network: {emptied[:5]}{' ...' if len(emptied) > 5 else ''}"
                      " keep one weight per output row instead (raise target_density to keep "
                      "more)", UserWarning, stacklevel=stacklevel)
    return budgets


def outlier_ratio(W0: torch.Tensor, G: torch.Tensor, m: float) -> float:
    """OWL's layerwise outlier distribution: the fraction of Wanda scores ``|W_ij| ||X_j||``
    above ``m`` times the layer's mean score."""
    score = W0.abs() * G.diagonal().clamp_min(0).sqrt()
    mean = float(score.mean())
    return float((score > m * mean).double().mean()) if mean > 0 else 0.0


def _global_magnitude(problems, floors, total) -> dict[str, int]:
    """The ``total`` largest ``|w|`` over all layers, each layer's own top ``floor`` forced."""
    scores = []
    for p, fl in zip(problems, floors):
        s = p.W0.abs().reshape(-1).to(torch.float64).clone()
        s[torch.sort(s, descending=True, stable=True).indices[:fl]] = math.inf
        scores.append(s)
    allsc = torch.cat(scores)
    keep = torch.zeros(allsc.numel(), dtype=torch.bool)
    keep[torch.sort(allsc, descending=True, stable=True).indices[:total]] = True
    counts = [int(k.sum()) for k in torch.split(keep, [s.numel() for s in scores])]
    return {p.name: c for p, c in zip(problems, counts)}


def densities_to_counts(offsets, sizes, floors, total) -> list[int]:
    """Integer counts ``n_l = clip((c + offsets_l) size_l, floor_l, size_l)`` summing to
    ``total`` exactly: the shift ``c`` by bisection, then the last weights by largest
    remainder."""
    def counts_at(c):
        return [min(n, max(fl, (c + o) * n)) for o, n, fl in zip(offsets, sizes, floors)]

    lo, hi = -max(offsets) - 1.0, 2.0 - min(offsets)
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(counts_at(mid)) < total:
            lo = mid
        else:
            hi = mid
    real = counts_at(hi)
    base = [max(fl, min(n, math.floor(r))) for r, n, fl in zip(real, sizes, floors)]
    left = total - sum(base)
    order = sorted(range(len(sizes)), key=lambda i: (-(real[i] - math.floor(real[i])), i))
    step = 1 if left > 0 else -1
    while left:
        moved = False
        for i in order:
            if left == 0:
                break
            new = base[i] + step
            if floors[i] <= new <= sizes[i]:
                base[i] = new
                left -= step
                moved = True
        if not moved:
            break
    return base
