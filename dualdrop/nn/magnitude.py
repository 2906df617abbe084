"""Gradual magnitude pruning (Zhu & Gupta 2017) with per-layer floors.

Each layer holds a 0/1 buffer ``weight_mask`` (in the weight's dtype, like
``torch.nn.utils.prune``). The test-time (eval) forward uses ``weight * weight_mask``; the
training forward uses ``weight`` itself, which ``after_step`` keeps at exactly zero at pruned
entries (so the masks must be enforced by calling ``after_step`` after every optimizer step, as
the contract says). ``Sparsifier.after_step`` drives the schedule: at step ``t`` (the number of
optimizer steps taken so far) the target sparsity is the cubic ramp

    s_t = sparsity * (1 - (1 - (t - t0) / (t1 - t0))^3),   t0 = begin * T,  t1 = end * T,

(0 before ``t0``, ``sparsity`` after ``t1``), applied every ``prune_every`` steps (at most every
``T // 50`` steps, so short runs still prune gradually) and at ``t1``.
Pruning keeps the weights of largest magnitude among those still alive (masks only shrink, so
pruned weights never regrow), either over all layers at once (``scope="global"``) or layer by
layer (``scope="layer"``). Global pruning of a freshly initialized net can delete a whole layer
(init scales differ per layer), so every layer keeps at least
``max(1, ceil(min_layer_density * n_layer))`` weights: its own largest ones.

After *every* step the masks are re-applied to the weights (``w *= mask``) and the optimizer's
first-moment buffers (``exp_avg``, ``momentum_buffer``) are zeroed at pruned entries, so Adam's
momentum cannot regrow a pruned weight. Biases are never pruned.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dualdrop.nn._base import SparseLayerMixin, check_choice, check_float, check_int

HPARAMS = {
    "sparsity": 0.98,          # final fraction of zero weights (over the sparsified layers)
    "begin": 0.0,              # schedule start, fraction of total_steps
    "end": 0.75,               # schedule end, fraction of total_steps
    "prune_every": 100,        # steps between mask updates
    "scope": "global",         # "global" (one threshold, with floors) or "layer"
    "min_layer_density": 0.01,  # per-layer floor on the fraction of kept weights
}


def validate(hp: dict) -> dict:
    out = dict(hp)
    out["sparsity"] = check_float("sparsity", hp["sparsity"], low=0.0, high=1.0, high_open=True)
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


class MagnitudeMixin(SparseLayerMixin):
    def _setup(self, **hp):
        # 0/1 in the weight's dtype (as torch.nn.utils.prune): w.mul_(mask) is ~4x faster than
        # with a bool mask
        self.register_buffer("weight_mask", torch.ones_like(self.weight.detach()))

    def train_forward(self, x):
        # after_step keeps pruned weights at exactly 0 after every optimizer step, so training
        # uses the weight as is (the dense cost); masking here as well would only add work.
        return self._op(x, self.weight, self.bias)

    def eval_weight_bias(self):
        return self.weight * self.weight_mask, self.bias


class MagnitudeLinear(MagnitudeMixin, nn.Linear):
    pass


class MagnitudeConv2d(MagnitudeMixin, nn.Conv2d):
    pass


LAYER_CLASSES = {"magnitude": (MagnitudeLinear, MagnitudeConv2d)}


def target_sparsity(hp: dict, step: int, total_steps: int) -> float:
    """Cubic schedule of Zhu & Gupta (2017) at ``step`` of ``total_steps``."""
    t0, t1 = hp["begin"] * total_steps, hp["end"] * total_steps
    if step <= t0:
        return 0.0
    frac = min(1.0, (step - t0) / max(t1 - t0, 1e-12))
    return hp["sparsity"] * (1.0 - (1.0 - frac) ** 3)


def _floor(n: int, min_density: float) -> int:
    return min(n, max(1, math.ceil(min_density * n)))


@torch.no_grad()
def update_masks(layers, hp: dict, sparsity: float) -> None:
    """Prune ``layers`` (list of MagnitudeMixin) to ``sparsity`` by magnitude, masks only shrink."""
    # score: |w| where alive, -1 where already pruned (never chosen while alive ones remain)
    scores = [torch.where(l.weight_mask > 0, l.weight.abs(), torch.full_like(l.weight, -1.0))
              .flatten() for l in layers]
    sizes = [s.numel() for s in scores]
    floors = [_floor(n, hp["min_layer_density"]) for n in sizes]
    if hp["scope"] == "layer":
        for layer, sc, n, fl in zip(layers, scores, sizes, floors):
            alive = int(torch.count_nonzero(layer.weight_mask))
            k = min(alive, max(fl, n - round(sparsity * n)))
            mask = torch.zeros(n, dtype=torch.bool, device=sc.device)
            mask[torch.topk(sc, k, sorted=False).indices] = True
            layer.weight_mask.copy_(mask.view_as(layer.weight_mask))
        return
    total = sum(sizes)
    alive = sum(int(torch.count_nonzero(l.weight_mask)) for l in layers)
    k = min(alive, max(total - round(sparsity * total), sum(floors)))
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
        layer.weight_mask.copy_(part.view_as(layer.weight_mask))


@torch.no_grad()
def apply_masks(layers, optimizer) -> None:
    """Zero pruned weights and the optimizer's first moments at pruned entries."""
    for layer in layers:
        layer.weight.mul_(layer.weight_mask)
        if optimizer is None:
            continue
        state = optimizer.state.get(layer.weight, {})
        for key in ("exp_avg", "momentum_buffer"):
            buf = state.get(key)
            if isinstance(buf, torch.Tensor) and buf.shape == layer.weight.shape:
                buf.mul_(layer.weight_mask)


def after_step(sp, optimizer, step: int, total_steps: int) -> None:
    layers = [layer for _, layer in sp.layers]
    hp = sp.hparams
    t1 = max(1, round(hp["end"] * total_steps))
    # short runs (e.g. the embedded digits: 9 steps per epoch) still get >= ~50 pruning events
    every = min(hp["prune_every"], max(1, total_steps // 50))
    if step >= hp["begin"] * total_steps and (step % every == 0 or step == t1):
        update_masks(layers, hp, target_sparsity(hp, step, total_steps))
    apply_masks(layers, optimizer)
