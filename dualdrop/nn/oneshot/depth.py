"""Depth as a granularity: remove whole blocks (transformer layers) of a trained model.

A residual block computes ``x_{i+1} = x_i + F_i(x_i)``; when ``F_i`` barely turns the hidden
state, the block can go and the next one reads ``x_i`` instead. Two importances of block ``i``
over the calibration tokens:

- ``"cosine"`` (ShortGPT's *Block Influence*, Men et al., 2024): ``BI_i = 1 - E[cos(x_i,
  x_{i+1})]``, one forward pass for every block at once; small ``BI``: the block leaves its
  input's direction as it was;
- ``"reconstruction"``: the relative change of the model's output when block ``i`` alone is
  skipped, ``E||f_{-i}(x) - f(x)||^2 / E||f(x)||^2``: one forward pass per block, and it
  measures what the removal does to what the model outputs rather than to one layer's state.

The blocks with the smallest importance are removed at once (ShortGPT's one-shot removal),
keeping ``round(target_density * n)`` of the ``n`` blocks (at least one). The model becomes
physically shallower: its container of blocks (``encoder.layer``, ``transformer.h``,
``model.layers``; found as the model's largest ``ModuleList`` when ``blocks`` is None) holds the
kept blocks in their order, a Hugging Face config's layer count (``num_hidden_layers``,
``n_layer``, ``num_layers``) and per-layer lists (``layer_types``) follow, and the kept blocks'
``layer_idx`` (the key-value cache slot of a decoder) are renumbered, so the model saves and
loads back with ``save_pretrained`` / ``from_pretrained`` (or ``dualdrop.nn.load_pretrained``).
Widths combine: prune the depth first, then the widths of the shallower model
(``prune_oneshot(..., granularity="neuron")``), and heal (``dualdrop.train.heal``, whose
``block_map`` is ``result.kept``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from dualdrop.nn.oneshot.blocks import hidden_of, hidden_slot, shaped_like, slot_get
from dualdrop.nn.oneshot.calibration import default_forward, token_mask

METRICS = ("cosine", "reconstruction")
_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers")
#: the arguments of ``prune_oneshot`` that depth pruning does not take (refused when given)
DEPTH_REFUSES = {"pattern": None, "allocation": None, "options": None, "refit": None,
                 "allocation_options": None, "include": None, "exclude": None,
                 "token_mask_fn": None, "offload_dir": None, "cache_memory_mb": None,
                 "checkpoint_dir": None, "distributed": None, "target_params": None,
                 "target_speedup": None, "bias_compensation": None, "latency_inputs": None,
                 "latency_options": None}


@dataclass
class DepthResult:
    """The shallower ``model`` (the same object), the ``kept`` and ``removed`` block indices
    (of the original chain), every block's importance (``scores``), the ``metric`` and the
    ``container`` of the blocks."""

    model: nn.Module
    kept: list
    removed: list
    scores: list
    metric: str
    container: str
    params_before: int = 0
    params_after: int = 0
    extra: dict = field(default_factory=dict)

    def compact(self, *args, **kwargs) -> nn.Module:
        """The model itself: removing blocks already made it smaller."""
        return self.model

    def format(self) -> str:
        lines = [f"depth pruning by {self.metric}: {len(self.kept)} of "
                 f"{len(self.kept) + len(self.removed)} blocks of {self.container} kept, "
                 f"parameters {self.params_before:,} -> {self.params_after:,}"]
        for i, s in enumerate(self.scores):
            lines.append(f"  block {i:>3}  importance {s:.4g}  "
                         f"{'kept' if i in self.kept else 'removed'}")
        return "\n".join(lines)

    def __str__(self):
        return self.format()


def block_chain(model: nn.Module, blocks=None) -> tuple[str, nn.Module]:
    """``(name, container)`` of the model's blocks: the ``ModuleList`` / ``Sequential`` that
    ``blocks`` names, or the largest ``ModuleList`` of the model."""
    named = dict(model.named_modules())
    if blocks is not None:
        box = named.get(blocks) if isinstance(blocks, str) else None
        if not isinstance(box, (nn.ModuleList, nn.Sequential)) or len(box) < 1:
            raise ValueError(f"blocks={blocks!r} names no ModuleList or Sequential of the "
                             "model; give the container of its blocks, e.g. 'encoder.layer' or "
                             "'transformer.h'")
        return blocks, box
    lists = [(n, m) for n, m in named.items() if isinstance(m, nn.ModuleList) and len(m) >= 2]
    if not lists:
        raise ValueError("the model has no ModuleList of two or more blocks; pass blocks='...' "
                         "(the name of the container of its blocks)")
    return max(lists, key=lambda nm: len(nm[1]))


def _main_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        v = out.get(key) if isinstance(out, dict) else getattr(out, key, None)
        if isinstance(v, torch.Tensor):
            return v
    return hidden_of(out)


@torch.no_grad()
def block_importance(model: nn.Module, calib, *, metric: str = "cosine", blocks=None,
                     forward_fn=None) -> list[float]:
    """Each block's importance (module docstring) over the calibration batches ``calib``."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    fwd = forward_fn or default_forward
    _, box = block_chain(model, blocks)
    chain = list(box)
    was = model.training
    model.eval()
    try:
        if metric == "cosine":
            return _cosine(model, chain, calib, fwd)
        return _reconstruction(model, chain, calib, fwd)
    finally:
        model.train(was)


def _cosine(model, chain, calib, fwd) -> list[float]:
    sums, counts = [0.0] * len(chain), [0] * len(chain)
    state = {}

    def pre(i):
        def hook(mod, args, kwargs):
            slot = hidden_slot(args, kwargs)
            state[i] = None if slot is None else slot_get(args, kwargs, slot)
        return hook

    def post(i):
        def hook(mod, args, kwargs, out):
            x, y = state.pop(i, None), hidden_of(out)
            if x is None or not isinstance(y, torch.Tensor) or x.shape != y.shape:
                raise ValueError(f"block {i}'s input and output hidden states differ in shape "
                                 "(or none was found): not a residual block; use "
                                 "metric='reconstruction' or another blocks=")
            cos = torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=-1)
            mask = state.get("mask")
            if mask is not None and tuple(mask.shape) == tuple(cos.shape):
                cos = cos[mask.to(cos.device)]
            sums[i] += float(cos.sum())
            counts[i] += cos.numel()
        return hook

    hooks = []
    for i, b in enumerate(chain):
        hooks.append(b.register_forward_pre_hook(pre(i), with_kwargs=True))
        hooks.append(b.register_forward_hook(post(i), with_kwargs=True))
    try:
        for batch in calib:
            state["mask"] = token_mask(batch)
            fwd(model, batch)
    finally:
        for h in hooks:
            h.remove()
    return [1.0 - s / max(c, 1) for s, c in zip(sums, counts)]


def _reconstruction(model, chain, calib, fwd) -> list[float]:
    base = [_main_tensor(fwd(model, b)).double() for b in calib]
    energy = sum(float((y ** 2).sum()) for y in base)
    scores = []
    for b in chain:
        def skip(mod, args, kwargs, out):
            slot = hidden_slot(args, kwargs)
            return shaped_like(out, slot_get(args, kwargs, slot))
        h = b.register_forward_hook(skip, with_kwargs=True)
        try:
            err = sum(float(((_main_tensor(fwd(model, batch)).double() - y) ** 2).sum())
                      for batch, y in zip(calib, base))
        finally:
            h.remove()
        scores.append(err / energy if energy > 0 else err)
    return scores


def prune_depth(model: nn.Module, calib, *, target_density: float, metric: str = "cosine",
                blocks=None, forward_fn=None, refused: dict | None = None) -> DepthResult:
    """Remove the least important blocks of ``model`` in place (module docstring), keeping
    ``round(target_density * n)`` of its ``n`` blocks (at least one). ``calib``: a list of
    batches (or a tensor of samples, batches of 128) fed by ``forward_fn(model, batch)``.
    ``prune_oneshot(model, calib, metric, target_density=D, granularity="block")`` calls it
    (``refused``: its other arguments, a ``ValueError`` naming any given)."""
    given = sorted(k for k, v in (refused or {}).items()
                   if v is not None and v != DEPTH_REFUSES.get(k))
    if given:
        raise ValueError(f"granularity='block' removes whole blocks by target_density (the "
                         f"fraction of blocks kept) and the metric ({METRICS}, the method "
                         f"argument); {given} do not apply to it: leave them out")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if (isinstance(target_density, bool) or not isinstance(target_density, (int, float))
            or not math.isfinite(target_density) or not 0 < target_density <= 1):
        raise ValueError(f"target_density (the fraction of blocks kept) must be in (0, 1], got "
                         f"{target_density!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError("forward_fn must be callable as forward_fn(model, batch)")
    if isinstance(calib, torch.Tensor):
        calib = list(calib.split(128))
    elif not isinstance(calib, (list, tuple)) or not calib:
        raise TypeError("calib must be a tensor of samples or a non-empty list of batches")
    name, box = block_chain(model, blocks)
    n = len(box)
    n_keep = max(1, min(n, round(target_density * n)))
    scores = block_importance(model, calib, metric=metric, blocks=name, forward_fn=forward_fn)
    order = sorted(range(n), key=lambda i: (scores[i], i))
    removed = sorted(order[:n - n_keep])
    kept = [i for i in range(n) if i not in removed]
    before = sum(p.numel() for p in model.parameters())
    _keep_blocks(model, name, box, kept)
    return DepthResult(model, kept, removed, scores, metric, name, before,
                       sum(p.numel() for p in model.parameters()))


def _keep_blocks(model, name, box, kept) -> None:
    """The container ``name`` narrowed to the blocks ``kept``; the config and ``layer_idx``
    follow."""
    n = len(box)
    new = type(box)(*[box[i] for i in kept]) if isinstance(box, nn.Sequential) else \
        nn.ModuleList([box[i] for i in kept])
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)
    for j, block in enumerate(new):
        for sub in block.modules():
            if isinstance(getattr(sub, "layer_idx", None), int):
                sub.layer_idx = j
    cfg = getattr(model, "config", None)
    if cfg is not None:
        for key in _LAYER_COUNTS:
            if getattr(cfg, key, None) == n:
                setattr(cfg, key, len(kept))
        types = getattr(cfg, "layer_types", None)
        if isinstance(types, list) and len(types) == n:
            cfg.layer_types = [types[i] for i in kept]
