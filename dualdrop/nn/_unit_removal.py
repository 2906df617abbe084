"""Removing units a structured pruning has already grouped: ``compact(model, example_inputs,
groups=...)``, and the pieces of the exact removal the compact export shares with it.

A one-shot prune of whole units (``dualdrop.nn.oneshot.units``) finds every unit once, as a
group read by one *consumer*: unit ``u`` is the consumer's input columns ``columns[u]`` (the
kernel taps of an input channel for a convolution), and the *parts* that write it (the rows of
the producing layers, ``"rows"``; the entries of a BatchNorm on the way, ``"bn"``). Handed those
groups, the compact export needs no dependency graph (the groups are the coupled sets that
Torch-Pruning's graph would give): unit ``u`` goes when

- its consumer columns are all zero (nothing reads it: removing it is exact whatever its
  producer computes; what a one-shot prune leaves), or
- its producer rows are all zero, so it emits a constant ``c_u`` (its bias through the
  per-entry maps on the way, read at the consumer's input on ``example_inputs`` and checked to
  be the same for every sample and position), which moves into the consumer's bias,
  ``b' = b + W[:, u] c_u`` (summed over the kernel taps of a convolution); only when the
  consumer has a bias and, for a convolution, does not zero-pad;

and a group keeps at least one unit. Heads of an ``nn.MultiheadAttention`` go as in the compact
export (``dualdrop.nn._heads``), for the attentions the groups name; the heads of another kind
of attention stay (as without groups: a Hugging Face transformer's are removed by its blocks,
``dualdrop.nn.hf.compact``). The result is the network
the graph-based export gives for the same zeros.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dualdrop.nn._graph import call, first_line, layer_kind
from dualdrop.nn._heads import remove_dead_heads
from dualdrop.nn._layers import BN, CONV, LINEAR, is_conv1d, n_in, out_in


def zero_rows(m) -> list:
    """Per output unit: whether its weights (a row of W, a column of a Conv1D's, a filter) are
    all zero."""
    w = out_in(m)
    return (w.reshape(w.shape[0], -1) == 0).all(1).tolist()


def pad_free(conv) -> bool:
    """Whether a constant input channel gives a constant output everywhere (no zero padding)."""
    if conv.padding_mode != "zeros":
        return True
    if isinstance(conv.padding, str):
        return conv.padding == "valid" or all(k == 1 for k in conv.kernel_size)
    return all(p == 0 for p in conv.padding)


def folds_exactly(m, kind: str) -> bool:
    """Whether a constant input of ``m`` can move into its bias (it has one; a convolution does
    not zero-pad)."""
    return (m.bias is not None) and (kind == "linear" or pad_free(m))


@torch.no_grad()
def constants(x, m, kind, idxs):
    """``(c, const)``: the values of ``m``'s input ``x`` at the input units ``idxs`` in its
    first sample/position, and whether each is the same at every sample and position."""
    if kind == "linear":
        flat = x.reshape(-1, n_in(m))
    else:
        if x.dim() == len(m.kernel_size) + 1:  # an unbatched input
            x = x.unsqueeze(0)
        flat = x.transpose(0, 1).reshape(m.in_channels, -1).t()
    cols = flat[:, idxs].double()
    c = cols[0]
    return c, ((cols - c).abs() <= 1e-6 * (1 + c.abs())).all(0)


@torch.no_grad()
def fold_delta(m, kind, idxs, vals) -> torch.Tensor:
    """What constant inputs ``vals`` at the input units ``idxs`` add to ``m``'s output:
    ``W[:, idxs] vals`` (a convolution's kernel taps summed)."""
    w = out_in(m).double()[:, idxs]
    if kind == "conv":
        w = w.flatten(2).sum(2)
    return w @ vals


def layer_inputs(net, example_inputs, layers) -> tuple[dict, dict]:
    """``(seen, calls)``: each of ``layers``' first input tensor and how often it ran, on one
    forward run of ``net`` on ``example_inputs``."""
    seen, calls = {}, {}

    def grab(m, args):
        calls[m] = calls.get(m, 0) + 1
        if args and isinstance(args[0], torch.Tensor):
            seen[m] = args[0].detach()

    hooks = [m.register_forward_pre_hook(grab) for m in layers]
    try:
        call(net, example_inputs)
    except Exception as exc:
        raise ValueError(f"model(example_inputs) failed ({type(exc).__name__}: "
                         f"{first_line(exc)}); example_inputs must be valid inputs of the "
                         "model (a tuple/list is unpacked as positional arguments)") from None
    finally:
        for h in hooks:
            h.remove()
    return seen, calls


def check_groups(groups, model: nn.Module) -> dict:
    """``{id(module): name}`` of ``model``; TypeError/ValueError unless ``groups`` is a list of
    unit groups (``prune_structured(...).groups``) whose layers are ``model``'s."""
    if not isinstance(groups, (list, tuple)) or not all(
            hasattr(g, "columns") and hasattr(g, "parts") and hasattr(g, "consumer")
            for g in groups):
        raise TypeError("groups must be the list of unit groups a structured prune found "
                        "(prune_structured(...).groups, or a StructuredResult's .compact()), "
                        f"got {type(groups).__name__}")
    names = {id(m): n for n, m in model.named_modules()}
    for g in groups:
        for m in [g.consumer] + [p.module for p in g.parts]:
            if id(m) not in names:
                raise ValueError(f"groups: {g.name}'s layer {type(m).__name__} is not a module "
                                 "of model (groups are found on the model they are given with)")
    return names


@torch.no_grad()
def remove_groups(net: nn.Module, groups, names: dict, example_inputs) -> None:
    """Remove the removable units of ``groups`` (module docstring) from ``net``, a copy of the
    model the groups were found on (its modules named as ``names`` says), in place."""
    modules = dict(net.named_modules())

    def here(m):
        return modules[names[id(m)]]

    plain = [g for g in groups if g.kind != "head"]
    seen, calls = layer_inputs(net, example_inputs, {here(g.consumer) for g in plain})
    plans = [p for p in (_plan(g, here, seen, calls) for g in plain) if p is not None]
    for consumer, _, _, _, delta in plans:
        if delta is not None:
            consumer.bias.add_(delta.to(consumer.bias.dtype))
    for consumer, kind, gone_cols, parts, _ in plans:
        for part, rows in parts:
            _keep(part, rows)
        _keep_inputs(consumer, kind, gone_cols)
    heads = {id(here(g.attention)) for g in groups if g.kind == "head"
             and isinstance(getattr(g, "attention", None), nn.MultiheadAttention)}
    remove_dead_heads(net, only=heads)


def _plan(g, here, seen, calls):
    """``(consumer, kind, removed input units, [(part, (role, removed rows))], bias delta)`` of
    one neuron/channel group, or None when none of its units goes."""
    cm = here(g.consumer)
    kind = layer_kind(cm)
    if kind not in ("linear", "conv") or cm not in seen or calls.get(cm, 0) > 1:
        return None
    K = math.prod(cm.kernel_size) if kind == "conv" else 1
    W = out_in(cm)
    Wf = W.reshape(W.shape[0], -1)
    rows = [(here(p.module), p) for p in g.parts if p.role == "rows"]
    zero = {id(m): zero_rows(m) for m, _ in rows}
    removable, reads = [], []
    for u, cols in enumerate(g.columns):
        units = sorted({int(c) // K for c in cols})
        unread = bool((Wf[:, torch.as_tensor(cols)] == 0).all())
        dead = bool(rows) and all(zero[id(m)][int(i)] for m, p in rows for i in p.index[u])
        removable.append(unread or dead)
        if dead and not unread:
            reads.append((u, units))
    if reads:
        idxs = [i for _, units in reads for i in units]
        c, const = constants(seen[cm], cm, kind, idxs)
        ok = folds_exactly(cm, kind)
        at = 0
        for u, units in reads:
            vals = c[at:at + len(units)]
            if not bool(const[at:at + len(units)].all()) or (bool((vals != 0).any()) and not ok):
                removable[u] = False
            at += len(units)
    gone = [u for u, r in enumerate(removable) if r]
    if len(gone) == len(removable):
        gone = gone[1:]  # a layer keeps at least one unit (an empty layer is not a module)
    if not gone:
        return None
    folded = {u for u, _ in reads} & set(gone)
    delta = None
    if folded:
        at, sel, vals = 0, [], []
        for u, units in reads:
            if u in folded:
                sel += units
                vals.append(c[at:at + len(units)])
            at += len(units)
        v = torch.cat(vals)
        if bool((v != 0).any()):
            delta = fold_delta(cm, kind, sel, v)
    gone_cols = sorted({int(i) // K for u in gone for i in g.columns[u]})
    parts = [(here(p.module), (p.role, sorted({int(i) for u in gone for i in p.index[u]})))
             for p in g.parts if p.role in ("rows", "bn")]
    return cm, kind, gone_cols, parts, delta


def _take(t: torch.Tensor, dim: int, drop: list) -> torch.Tensor:
    gone = set(drop)
    keep = torch.tensor([i for i in range(t.shape[dim]) if i not in gone],
                        dtype=torch.long, device=t.device)
    return torch.index_select(t.detach(), dim, keep)


def _keep(m, spec) -> None:
    """Drop the output units ``rows`` of a producing layer, or the entries of a BatchNorm."""
    role, drop = spec
    if not drop:
        return
    if role == "bn":
        for name in ("weight", "bias"):
            p = getattr(m, name)
            if p is not None:
                setattr(m, name, nn.Parameter(_take(p, 0, drop)))
        for name in ("running_mean", "running_var"):
            b = getattr(m, name)
            if b is not None:
                setattr(m, name, _take(b, 0, drop))
    else:
        m.weight = nn.Parameter(_take(m.weight, 1 if is_conv1d(m) else 0, drop))
        if m.bias is not None:
            m.bias = nn.Parameter(_take(m.bias, 0, drop))
    sync_sizes(m)


def _keep_inputs(m, kind, drop) -> None:
    """Drop the input units ``drop`` of a consumer (columns; a convolution's input channels)."""
    if drop:
        m.weight = nn.Parameter(_take(m.weight, 0 if is_conv1d(m) else 1, drop))
        sync_sizes(m)


def sync_sizes(m) -> None:
    """The size attributes of a resized layer follow its weight (what ``extra_repr`` shows)."""
    if isinstance(m, LINEAR):
        m.out_features, m.in_features = m.weight.shape
    elif is_conv1d(m):
        m.nx, m.nf = m.weight.shape
    elif isinstance(m, CONV):
        m.out_channels = m.weight.shape[0]
        m.in_channels = m.weight.shape[1] * m.groups
    elif isinstance(m, BN):
        ref = m.weight if m.weight is not None else m.running_mean
        if ref is not None:
            m.num_features = ref.shape[0]
