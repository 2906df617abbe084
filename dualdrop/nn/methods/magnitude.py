"""Gradual magnitude pruning (Zhu & Gupta 2017) with per-tensor floors.

Each weight tensor holds a 0/1 buffer ``weight_mask`` (in the weight's dtype, like
``torch.nn.utils.prune``) and the forward, in training and at test time, uses
``weight * weight_mask``: a pruned weight stays pruned whatever the optimizer does. Any weight
tensor can be pruned (the mask is its parametrization). ``Sparsifier.after_step`` drives the
schedule: at step ``t`` (the number of optimizer steps taken so far) the target sparsity is the
cubic ramp

    s_t = sparsity * (1 - (1 - (t - t0) / (t1 - t0))^3),   t0 = begin * T,  t1 = end * T,

(0 before ``t0``, ``sparsity`` after ``t1``), applied every ``prune_every`` steps (at most every
``T // 50`` steps, so short runs still prune gradually) and at ``t1``.
Pruning keeps the weights of largest magnitude among those still alive (masks only shrink, so
pruned weights never regrow), either over all layers at once (``scope="global"``) or layer by
layer (``scope="layer"``). Global pruning of a freshly initialized net can delete a whole layer
(init scales differ per layer), so every weight tensor keeps at least
``max(1, ceil(min_layer_density * n_layer), (fan_out + fan_in) / 2)`` weights (one per two of
its units: ``dualdrop.nn._base.layer_floor``), its own largest ones. Under
``sparsify(..., target_density=D)`` ``min_layer_density`` defaults to the target-density
schedule's 0.1% (``dualdrop.nn.density.MIN_LAYER_DENSITY``): the default 1% would bind every
layer at ``D <= 1%`` and leave a classifier 1% of its weights.

Whenever the masks change they are also applied to the stored weights (``w *= mask``) and the
optimizer's first-moment buffers (``exp_avg``, ``momentum_buffer``) are zeroed at pruned entries,
so the stored weights are sparse too and Adam's momentum carries nothing for pruned entries.
Between updates the masked forward gives a pruned weight a zero gradient, and Adam, AdamW and
SGD then move a zero weight with a zero first moment by exactly 0, so applying the masks again
would change no bit; with other optimizers (or with ``dualdrop.nn._numba.ENABLED`` off) they are
applied after every step.
Biases are never pruned.

Groups (``granularity="neuron"`` / ``"head"``): the groups of largest norm ``||w_g||_2`` are kept
(:func:`update_group_masks`; Li et al. 2017 prune filters so, by their L1 norm), whole groups
leave the mask, and the sparsity still counts weights.
"""

from __future__ import annotations

import torch

from dualdrop.nn._base import (Method, WeightState, check_choice, check_float, check_int,
                               layer_floor, mask_first_moments)
from dualdrop.nn import _numba
from dualdrop.nn._coupling import tie_keeps


class MagnitudeState(WeightState):
    """The 0/1 mask of one weight tensor, applied in every forward."""

    def __init__(self, method, weight, groups=None):
        super().__init__(method)
        self.groups = groups
        # 0/1 in the weight's dtype (as torch.nn.utils.prune): w * mask is ~4x faster than with
        # a bool mask
        self.register_buffer("weight_mask", torch.ones_like(weight.detach()))

    def train_weight(self, w):
        return w * self.weight_mask

    def eval_weight(self, w):
        return w * self.weight_mask

    def keep_mask(self, w):
        return self.weight_mask > 0

    def kept_units(self):
        kept = self.weight_mask > 0
        return (kept if self.groups is None else self.groups.any(kept)).flatten()


class Magnitude(Method):
    """Gradual magnitude pruning with a cubic sparsity schedule (any weight tensor)."""

    name = "magnitude"
    label = "Magnitude (GMP)"
    loss_term = False
    compare_rank = 8
    dataset_defaults = {"digits": {"sparsity": 0.95}}
    #: the frontier sweeps the target sparsity (log-spaced in 1 - s), not a strength
    knob = ("sparsity", 0.8, 0.995, {"log": True, "complement": True})
    floor = {"pass": 2}  # mask forward, mask the gradient backward
    floor_target = 1.05
    family = "magnitude"
    defaults = {"lr": 1e-3, "sparsity": 0.98, "begin": 0.0, "end": 0.75, "prune_every": 100,
                "scope": "global", "min_layer_density": 0.01}
    help = {
        "lr": "Adam learning rate (the dense network's)",
        "sparsity": "final fraction of zero weights (over the sparsified tensors)",
        "begin": "schedule start, fraction of total_steps",
        "end": "schedule end, fraction of total_steps",
        "prune_every": "steps between mask updates (at most total_steps // 50)",
        "scope": "'global' (one threshold, with floors) or 'layer' (per tensor); groups "
                 "(granularity) are always pruned per tensor",
        "min_layer_density": "per-tensor floor on the fraction of kept weights",
    }

    def validate(self, hp):
        out = dict(hp)
        out["sparsity"] = check_float("sparsity", hp["sparsity"], low=0.0, high=1.0,
                                      high_open=True)
        out["begin"] = check_float("begin", hp["begin"], low=0.0, high=1.0)
        out["end"] = check_float("end", hp["end"], low=0.0, high=1.0)
        if out["end"] <= out["begin"]:
            raise ValueError(f"end ({out['end']}) must be greater than begin ({out['begin']}): "
                             "they are fractions of total_steps")
        out["prune_every"] = check_int("prune_every", hp["prune_every"], low=1)
        out["scope"] = check_choice("scope", hp["scope"], {"global", "layer"})
        out["min_layer_density"] = check_float("min_layer_density", hp["min_layer_density"],
                                               low=0.0, high=1.0)
        return out

    def make_state(self, target):
        return MagnitudeState(self.name, target.param, groups=self.groups_of(target))

    def after_step(self, sp, optimizer, step, total_steps):
        pairs = [(t.param, st) for t, st in sp.states()]
        hp = self.hparams
        t1 = max(1, round(hp["end"] * total_steps))
        # short runs (e.g. the embedded digits: 9 steps per epoch) still get >= ~50 pruning events
        every = min(hp["prune_every"], max(1, total_steps // 50))
        changed = False
        if (step >= hp["begin"] * total_steps and (step % every == 0 or step == t1)
                and pairs and pairs[0][1].groups is not None):
            update_group_masks(pairs, hp, target_sparsity(hp, step, total_steps), sp.ties)
            changed = True
        elif step >= hp["begin"] * total_steps and (step % every == 0 or step == t1):
            if getattr(self, "_alive", None) is None:  # host counts: one read per handle
                self._alive = [int(torch.count_nonzero(st.weight_mask)) for _, st in pairs]
            self._alive = update_masks(pairs, hp, target_sparsity(hp, step, total_steps),
                                       self._alive)
            changed = True
        # Between mask updates the masked forward gives pruned weights a zero gradient, and
        # these optimizers move a weight whose gradient and first moment are 0 and whose value
        # is 0 by exactly 0: applying the masks again would change no bit (one pass over the
        # weights and one over Adam's first moments saved per step).

        last = getattr(self, "_applied_for", (None, None))
        keeps = (_numba.ENABLED and type(optimizer) in _KEEP_ZEROS and last[0] is sp
                 and last[1] is optimizer)
        if changed or not keeps:
            apply_masks(pairs, optimizer)
            self._applied_for = (sp, optimizer)


#: optimizers whose update of a zero weight with zero gradient and zero first moment is 0
_KEEP_ZEROS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def target_sparsity(hp: dict, step: int, total_steps: int) -> float:
    """Cubic schedule of Zhu & Gupta (2017) at ``step`` of ``total_steps``."""
    t0, t1 = hp["begin"] * total_steps, hp["end"] * total_steps
    if step <= t0:
        return 0.0
    frac = min(1.0, (step - t0) / max(t1 - t0, 1e-12))
    return hp["sparsity"] * (1.0 - (1.0 - frac) ** 3)


@torch.no_grad()
def update_masks(pairs, hp: dict, sparsity: float, alive=None) -> list:
    """Prune ``(weight, MagnitudeState)`` pairs to ``sparsity`` by magnitude; masks only shrink.
    ``alive``: the number of kept weights per tensor (counted here if None); returns the new
    counts (host integers, so that a step on a GPU reads nothing back from the device). Counts
    that are too high (masks loaded behind the caller's back) can only keep more weights than
    asked, never revive pruned ones."""
    if alive is None:
        alive = [int(torch.count_nonzero(st.weight_mask)) for _, st in pairs]
    # score: |w| where alive, -1 where already pruned (never chosen while alive ones remain)
    scores = [torch.where(st.weight_mask > 0, w.abs(), torch.full_like(w, -1.0)).flatten()
              for w, st in pairs]
    layers = [st for _, st in pairs]
    sizes = [s.numel() for s in scores]
    floors = [layer_floor(w, n, hp["min_layer_density"]) for (w, _), n in zip(pairs, sizes)]
    if hp["scope"] == "layer":
        new = []
        for layer, sc, n, fl, a in zip(layers, scores, sizes, floors, alive):
            k = min(a, max(fl, n - round(sparsity * n)))
            mask = torch.zeros(n, dtype=torch.bool, device=sc.device)
            mask[torch.topk(sc, k, sorted=False).indices] = True
            mask &= layer.weight_mask.flatten() > 0  # stale counts never revive a weight
            layer.weight_mask.copy_(mask.view_as(layer.weight_mask))
            new.append(k)
        return new
    total = sum(sizes)
    k = min(sum(alive), max(total - round(sparsity * total), sum(floors)))
    # each layer's own top-`floor` weights are kept unconditionally
    forced = []
    for sc, fl in zip(scores, floors):
        sc = sc.clone()
        sc[torch.topk(sc, fl, sorted=False).indices] = float("inf")
        forced.append(sc)
    allsc = torch.cat([s.to(torch.float64) for s in forced])
    keep = torch.zeros(total, dtype=torch.bool, device=allsc.device)
    keep[torch.topk(allsc, k, sorted=False).indices] = True
    for layer, part in zip(layers, torch.split(keep, sizes)):
        part = part.view_as(layer.weight_mask) & (layer.weight_mask > 0)  # never revive
        layer.weight_mask.copy_(part)
    # the global count is what the next update needs: spread it as one total
    return [k] + [0] * (len(layers) - 1)


@torch.no_grad()
def update_group_masks(pairs, hp: dict, sparsity: float, ties=()) -> None:
    """``update_masks`` for groups (``granularity``, ``dualdrop.nn._groups``): in every tensor
    the groups of largest norm ``||w_g||_2`` among those still alive are kept, ``1 - sparsity``
    of them (per tensor, whatever ``scope``), at least ``max(1, ceil(min_layer_density *
    n_groups))``; units coupled across layers (``ties``, ``dualdrop.nn._coupling``) together.
    Masks only shrink."""
    scores, alive, sizes, floors = [], [], [], []
    for w, st in pairs:
        live = st.kept_units()
        sc = torch.where(live, st.groups.norm(w).flatten(), -1.0).double().cpu()
        scores.append(sc)
        alive.append(live.cpu())
        sizes.append(st.groups.size)
        floors.append(layer_floor(w, sc.numel(), hp["min_layer_density"]))
    # layer by layer whatever ``scope`` says: one ranking across layers of groups of different
    # sizes starves the narrow layers (LeNet-300-100 at 10%: 33 of 300 and 2 of 100 units kept,
    # 11% test error)
    keeps = []
    for sc, live, fl in zip(scores, alive, floors):
        n = sc.numel()
        k = min(int(live.sum()), max(fl, n - round(sparsity * n)))
        keep = torch.zeros(n, dtype=torch.bool)
        keep[torch.topk(sc, k, sorted=False).indices] = True
        keeps.append(keep)
    tie_keeps(keeps, scores, ties)
    for (w, st), keep, live in zip(pairs, keeps, alive):
        keep = (keep & live).to(w.device).view(st.groups.shape)  # never revive
        st.weight_mask.copy_(st.groups.expand(keep, w))


@torch.no_grad()
def apply_masks(pairs, optimizer) -> None:
    """Zero pruned weights and the optimizer's first moments at pruned entries."""
    for w, st in pairs:
        w.mul_(st.weight_mask)
        mask_first_moments(optimizer, w, st.weight_mask)
