"""Tracing a model with Torch-Pruning (Fang et al., DepGraph, CVPR 2023): what the compact export
(``dualdrop.nn.compact``) and the coupled units of structured pruning (``dualdrop.nn._coupling``)
share. torch-pruning is an optional extra, imported only when a trace is asked for."""

from __future__ import annotations

import torch
import torch.nn as nn

INSTALL_HINT = 'pip install "dualdrop[structured]"'

LINEAR = (nn.Linear,)
CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def torch_pruning(purpose: str):
    """The ``torch_pruning`` module; ImportError naming the extra if it is not installed."""
    try:
        import torch_pruning as tp
    except ImportError as exc:
        raise ImportError(f"{purpose} needs torch-pruning (Torch-Pruning, Fang et al., "
                          f"DepGraph, CVPR 2023), which is not installed: {INSTALL_HINT}") \
            from exc
    return tp


def call(model, inputs):
    """``model(inputs)``: a tuple/list unpacked as positional arguments, a dict as keywords."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def tensors(out) -> list:
    """The tensors in ``out`` (a tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in tensors(o)]
    return []


def batch_of(inputs, n: int):
    """``inputs`` (a tensor, or a tuple/list/dict of them) with ``n`` rows: the rows of every
    tensor's dim 0 cycled (0-d tensors and other values kept)."""
    def one(t):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        return t[torch.arange(n, device=t.device) % t.shape[0]]
    if isinstance(inputs, dict):
        return {k: one(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(one(t) for t in inputs)
    return one(inputs)


def output_diff(ref, got) -> float:
    """The largest difference between the tensors of two outputs, relative to the scale of the
    reference (``|a - b| / (1 + max |a|)``, worst over tensors); inf if their shapes differ."""
    a, b = tensors(ref), tensors(got)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if x.numel():
            scale = 1.0 + float(x.abs().max())
            worst = max(worst, float((x.float() - y.float()).abs().max()) / scale)
    return worst


def check_inputs(example_inputs) -> None:
    """TypeError unless ``example_inputs`` holds the tensors of one forward run."""
    if example_inputs is None:
        raise TypeError("example_inputs is required for the compact layout: the dependency graph "
                        "that couples layers (next layer's inputs, BatchNorm, residual adds) is "
                        "traced by one forward run, model(example_inputs); pass e.g. a batch "
                        "torch.randn(2, n_features) (a tuple/list is unpacked as positional "
                        "arguments, a dict as keyword arguments)")
    if not tensors(example_inputs):
        raise TypeError("example_inputs must be a tensor, or a tuple/list/dict of tensors, got "
                        f"{type(example_inputs).__name__}")


def layer_kind(m) -> str | None:
    """``"linear"``, ``"conv"``, ``"depthwise"``, ``"grouped"`` or None (not a layer whose
    output units the export handles)."""
    if type(m) in LINEAR:
        return "linear"
    if type(m) in CONV:
        if m.groups == 1:
            return "conv"
        if m.groups == m.in_channels == m.out_channels:
            return "depthwise"
        return "grouped"
    return None


def unit_groups(dg, tp):
    """``(root, prune_fn, width, group)`` for every dependency group of output units of the
    Linear and (ungrouped) convolution layers of Torch-Pruning's graph ``dg``, each group once
    (from the first of its layers met): ``group`` is ``dg.get_pruning_group`` of all the root's
    units, the coupled layers, BatchNorm entries and consumers with their index maps."""
    visited = set()
    for m in list(dg.module2node):
        kind = layer_kind(m)
        if kind not in ("linear", "conv") or m in visited:
            continue
        fn = tp.prune_linear_out_channels if kind == "linear" else tp.prune_conv_out_channels
        width = m.out_features if kind == "linear" else m.out_channels
        group = dg.get_pruning_group(m, fn, list(range(width)))
        for item in group:
            if dg.is_out_channel_pruning_fn(item.dep.handler):
                visited.add(item.dep.target.module)
        yield m, fn, width, group


def first_line(exc) -> str:
    """The first line of an exception's message (at most 160 characters)."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]
