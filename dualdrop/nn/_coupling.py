"""Coupled units: output units of different layers that only leave the network together.

A channel of a residual stream is written by every layer whose output is added into it (the stem
and each block's last convolution, or a block's 1x1 shortcut and its last convolution), and the
compact export (``dualdrop.nn.compact``) can remove it only when it is dead in *all* of them.
Pruned layer by layer, each layer kills its own weakest channels, the dead sets rarely agree,
and the compact network keeps almost every channel of the stream (a small ResNet at 30% of its
channels per layer: 31,986 of 77,754 parameters left, 7,448 when ranked together). Ranking
such channels *together* is
what group-level structured pruning does (Torch-Pruning, Fang et al., DepGraph, CVPR 2023): the
layers of a coupled set keep the same units.

:func:`coupled_units` finds the sets from Torch-Pruning's dependency graph (one traced forward
run on ``example_inputs``, the model in eval mode and left as it was). :func:`tie_keeps` turns
per-layer keep decisions into joint ones: the score of a coupled unit is the mean over its layers
of its rank within each layer (0 = weakest, 1 = strongest; a unit already pruned ranks lowest),
and the set keeps as many units as its most generous layer would, the same units in every
layer. Both the target-density controller (``dualdrop.nn.density``) and magnitude pruning's
group masks use it, when ``sparsify(..., example_inputs=x)`` gave the sets. An attention's
heads are tied the same way without any trace: head ``h``'s q/k/v rows and its ``out_proj``
columns are one unit (``Sparsifier.ties``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dualdrop.nn._base import mask_first_moments
from dualdrop.nn._graph import call, check_inputs, first_line, torch_pruning, trace
from dualdrop.nn._layers import BN, n_out

def coupled_units(model: nn.Module, example_inputs) -> list[dict]:
    """The coupled sets of output units of ``model``'s Linear and (ungrouped) convolution
    layers, one per dependency group: ``{"layers": [(module, unit indices, root indices)],
    "norms": [(BatchNorm, entry indices, root indices)]}``, the layers whose output units are
    tied to the same root units and the BatchNorm entries on their way. ``model`` must be plain
    (not yet sparsified)."""
    check_inputs(example_inputs)
    torch_pruning("sparsify(example_inputs=...)")
    try:
        graph = trace(model, example_inputs, lambda m, x: call(m, x),
                      "sparsify(example_inputs=...)")
        sets = []
        for us in graph.unit_sets():
            layers, norms = {}, {}
            for x in us.members:
                entry = (x.module, x.idxs, x.roots)
                if x.role == "rows":
                    layers.setdefault(id(x.module), entry)
                elif type(x.module) in BN and x.module.affine:
                    norms.setdefault(id(x.module), entry)
            sets.append({"layers": list(layers.values()), "norms": list(norms.values())})
    except Exception as exc:
        raise ValueError("example_inputs: torch-pruning cannot trace this model's dependency "
                         f"graph ({type(exc).__name__}: {first_line(exc)}); leave "
                         "example_inputs out (units are then pruned layer by layer)") from None
    return sets


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """Each entry's rank within ``scores`` scaled to [0, 1] (0 = lowest)."""
    n = scores.numel()
    out = torch.empty(n, dtype=torch.float64)
    out[torch.sort(scores, stable=True).indices] = torch.arange(n, dtype=torch.float64)
    return out / max(1, n - 1)


def tie_keeps(keeps: list, scores: list, ties: list) -> None:
    """Make the keep decisions of coupled layers joint (module docstring), in place.

    ``keeps[i]`` / ``scores[i]``: layer ``i``'s flat bool keep mask over its units and their
    scores (higher = kept); ``ties``: ``[[(i, idxs, roots), ...], ...]``, for each coupled set
    the layers in it, the unit indices of each and the root indices they match."""
    for members in ties:
        n_root = 1 + max(max(roots, default=-1) for _, _, roots in members)
        if n_root < 1:
            continue
        joint = torch.zeros(n_root, dtype=torch.float64)
        count = torch.zeros(n_root, dtype=torch.float64)
        share = 0.0
        for i, idxs, roots in members:
            r = torch.tensor(roots, dtype=torch.long)
            joint.index_add_(0, r, _ranks(scores[i].double())[idxs])
            count.index_add_(0, r, torch.ones(len(roots), dtype=torch.float64))
            share = max(share, float(keeps[i].sum()) / keeps[i].numel())
        joint /= count.clamp(min=1)
        kept = torch.zeros(n_root, dtype=torch.bool)
        kept[torch.topk(joint, max(1, round(share * n_root)), sorted=False).indices] = True
        for i, idxs, roots in members:
            keeps[i][idxs] = kept[roots]


@torch.no_grad()
def hold_norms(holds: list, alive: list, optimizer=None) -> None:
    """Zero the BatchNorm scale and shift of units pruned in every layer that writes them.

    A pruned channel's convolution output is 0, but an eval-mode BatchNorm maps it to the
    constant ``beta - gamma mu / sqrt(var + eps)``, which a zero-padded next convolution turns
    into a position-dependent map: the compact export must then keep the channel. Holding
    ``gamma`` and ``beta`` at 0 makes the channel exactly 0. ``holds``: ``[(norm, entry
    indices, [(pair index, unit indices)...], root indices)]``; ``alive[i]``: pair ``i``'s flat
    bool mask over its units (None: nothing is pruned there)."""
    for norm, idxs, writers, _ in holds:
        dead = torch.ones(len(idxs), dtype=torch.bool)
        for i, units in writers:
            if alive[i] is None:
                dead[:] = False
                break
            dead &= ~alive[i].cpu()[units]
        if not bool(dead.any()):
            continue
        entries = torch.tensor(idxs)[dead].to(norm.weight.device)
        for p in (norm.weight, norm.bias):
            p[entries] = 0
            if optimizer is not None:
                keep = torch.ones_like(p, dtype=torch.bool)
                keep[entries] = False
                mask_first_moments(optimizer, p, keep)


def unit_ties(pairs, coupled) -> tuple[list, list]:
    """The coupled sets (``dualdrop.nn._coupling.coupled_units``) as indices of ``pairs``
    (``dualdrop.nn.sparsifier.Sparsifier.ties``; only weights pruned by output units, ``granularity`` neuron groups,
    take part; plus each attention's heads, :func:`head_ties`) and the BatchNorm entries to
    hold with them (``Sparsifier.norm_holds``: a set's norms, when every layer writing the set
    is pruned by output units)."""
    index = {}
    for i, (t, st) in enumerate(pairs):
        groups = getattr(st, "groups", None)
        if groups is None or groups.kind != "neuron":
            continue
        for site in t.sites:
            if site.tensor_name == "weight" and groups.n_groups == n_out(site.module):
                index[id(site.module)] = i
    ties, holds = head_ties(pairs), []
    for group in coupled:
        layers = group["layers"]
        tied = [(index[id(m)], idxs, roots) for m, idxs, roots in layers if id(m) in index]
        if len(tied) > 1:
            ties.append(tied)
        if not tied or len(tied) < len(layers):
            continue  # a writer that is not pruned by units keeps the set alive
        for norm, idxs, roots in group["norms"]:
            writers = []
            for i, units, unit_roots in tied:
                at = dict(zip(unit_roots, units))
                writers.append((i, [at[r] for r in roots]) if all(r in at for r in roots)
                               else None)
            if all(w is not None for w in writers):
                holds.append((norm, idxs, writers, roots))
    return ties, holds


def head_ties(pairs) -> list:
    """One tie per ``nn.MultiheadAttention`` pruned by heads: head ``h``'s q/k/v rows and its
    ``out_proj`` columns are one unit (the compact export removes a head when either is dead,
    so pruning them apart would spend the density on halves of heads that are gone anyway)."""
    heads = {}
    for i, (t, st) in enumerate(pairs):
        groups = getattr(st, "groups", None)
        if groups is None or groups.kind != "head":
            continue
        for site in t.sites:
            owner = site.module if isinstance(site.module, nn.MultiheadAttention) else site.parent
            if isinstance(owner, nn.MultiheadAttention):
                heads.setdefault(id(owner), {})[i] = groups.n_groups
    ties = []
    for members in heads.values():
        if len(members) > 1 and len(set(members.values())) == 1:
            n = next(iter(members.values()))
            ties.append([(i, list(range(n)), list(range(n))) for i in members])
    return ties
