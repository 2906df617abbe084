"""Structured units for one-shot pruning: hidden neurons, attention heads and conv channels, each
as the producer rows and consumer columns that leave the network together.

A *unit* is a set of features that one layer (the *consumer*) reads and nothing else reads:

- a **neuron** of an MLP: row ``i`` of the first Linear (and its bias entry), column ``i`` of the
  second (transformers' ``intermediate.dense`` / ``output.dense``, GPT-2's ``mlp.c_fc`` /
  ``mlp.c_proj``, a gated MLP's gate and up projections together);
- a **channel** of a CNN: filter ``c`` of a convolution, its BatchNorm entry, and the kernel
  slice ``W[:, c]`` of the next convolution (``kh * kw`` columns of its im2col weight), or the
  ``h * w`` columns of a Linear after a flatten;
- a **head** of an attention: the head's ``d`` rows of the query, key and value projections (the
  head's columns of GPT-2's fused ``c_attn``; the head's rows of ``nn.MultiheadAttention``'s
  ``in_proj_weight``), and the ``d`` columns of the output projection that read its context.

``granularity="neuron"`` and ``"channel"`` are one word (as in training, ``dualdrop.nn._groups``):
either takes the output units of Linear and convolution layers alike; a group, and its report
row, is labelled by its producer (``neuron`` for a Linear, ``channel`` for a convolution).

Pruning a unit is a problem of the consumer alone: its input Gram over the calibration data
decides which input groups to keep, and the producer's rows of a removed unit are then dead
(nothing reads them) and are zeroed with it. Which features form units comes from the model's
graph: Torch-Pruning's dependency graph (Fang et al., DepGraph, CVPR 2023; ``dualdrop.nn._graph``)
traced on one calibration batch gives, for every layer's output features, the layers, norms and
consumers coupled to them; a set of features is a unit set when exactly one layer reads it and
no LayerNorm, residual stream, attention score or model output does. Attention heads are found
from the attention module (``nn.MultiheadAttention``, or a module with ``num_heads`` /
``num_attention_heads`` and a head width, and query/key/value projections or a fused
``c_attn``: ``dualdrop.nn._heads``, the one home of head discovery and geometry), their consumer
from the same graph.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from dualdrop.nn._graph import FEATURE_MAPS, layer_kind, positions_mean, trace
from dualdrop.nn._groups import check_unit_granularity
from dualdrop.nn._heads import head_index, hf_attention, kv_heads_differ
from dualdrop.nn._layers import BN, is_conv1d, n_in
from dualdrop.nn.oneshot.layers import Step, discover

@dataclass
class Part:
    """A tensor-holding module a unit spans besides its consumer: ``role`` ``"rows"`` (a dense
    layer's or convolution's output units: rows of the ``(out, in)`` weight, bias entries),
    ``"bn"`` (BatchNorm entries) or ``"mha_in"`` (rows of ``nn.MultiheadAttention``'s packed
    or separate q/k/v projections, ``index`` counting over q, k, v stacked); ``index[u]`` the
    entries of unit ``u``."""

    name: str
    module: nn.Module
    role: str
    index: list = field(default_factory=list)


@dataclass
class UnitGroup:
    """The units one consumer reads: ``kind`` (neuron, head, channel), ``step`` (the
    consumer's walk step, ``layers.Step``), ``columns[u]`` (unit ``u``'s columns of the
    consumer's ``(out, in)`` weight; a convolution's in the im2col order of
    ``weight.reshape(out, -1)``), ``parts`` (producers and norms), ``attention`` (the
    attention module of heads, whose head count follows a compaction)."""

    name: str
    kind: str
    step: Step
    columns: list
    parts: list
    attention: nn.Module | None = None
    head_dim: int = 0

    @property
    def n_units(self) -> int:
        return len(self.columns)

    @property
    def consumer(self) -> nn.Module:
        return self.step.module.out_proj if self.step.kind == "mha_out" else self.step.module

    def unit_params(self) -> np.ndarray:
        """Parameters each unit holds: its producer rows (with bias entries), norm entries
        and consumer columns."""
        out = np.zeros(self.n_units)
        W = self.step.weights()[0]
        for u, cols in enumerate(self.columns):
            out[u] += len(cols) * W.shape[0]
        for part in self.parts:
            per = _entry_params(part)
            for u, idx in enumerate(part.index):
                out[u] += len(idx) * per
        return out

    def names(self) -> list[str]:
        return [self.name] + [p.name for p in self.parts]

    @torch.no_grad()
    def zero_parts(self, removed) -> None:
        """Zero every producer row, bias entry and norm entry of the ``removed`` units (the
        consumer's columns are the method's)."""
        for part in self.parts:
            idx = [i for u in removed for i in part.index[u]]
            if not idx:
                continue
            t = torch.as_tensor(idx, dtype=torch.long)
            m = part.module
            if part.role == "bn":
                for p in (m.weight, m.bias):
                    if p is not None:
                        p[t.to(p.device)] = 0
            elif part.role == "mha_in":
                E = m.embed_dim
                if m._qkv_same_embed_dim:
                    m.in_proj_weight[t.to(m.in_proj_weight.device)] = 0
                else:
                    for k, w in enumerate((m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)):
                        sel = t[(t >= k * E) & (t < (k + 1) * E)] - k * E
                        w[sel.to(w.device)] = 0
                if m.in_proj_bias is not None:
                    m.in_proj_bias[t.to(m.in_proj_bias.device)] = 0
            else:
                w = m.weight
                if is_conv1d(m):
                    w[:, t.to(w.device)] = 0
                else:
                    w[t.to(w.device)] = 0
                if m.bias is not None:
                    m.bias[t.to(m.bias.device)] = 0

    def parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(qualified name, Parameter)`` of every tensor pruning these units writes."""
        out = []
        for name, mod in [(self.step.module_name, self.step.module)] + [
                (p.name, p.module) for p in self.parts]:
            for pname, p in mod.named_parameters():
                out.append((f"{name}.{pname}" if name else pname, p))
        seen, uniq = set(), []
        for n, p in out:
            if id(p) not in seen:
                seen.add(id(p))
                uniq.append((n, p))
        return uniq


def _entry_params(part: Part) -> int:
    m = part.module
    if part.role == "bn":
        return 2 if m.affine else 0
    if part.role == "mha_in":
        return m.embed_dim + (m.in_proj_bias is not None)
    w = m.weight
    per = w.shape[0] if is_conv1d(m) else int(np.prod(w.shape[1:]))
    return per + (m.bias is not None)


# ---- discovery -----------------------------------------------------------------------------------

def _selected(names, include, exclude) -> bool:
    def hit(items):
        return any(fnmatch.fnmatchcase(n, it) if isinstance(it, str) else False
                   for n in names for it in items)
    if include is not None and not hit(include):
        return False
    return not (exclude is not None and hit(exclude))


def find_units(model: nn.Module, example, forward_fn, granularity, include=None,
               exclude=None) -> tuple[list[UnitGroup], list[tuple[str, str]]]:
    """``(groups, skipped)``: the unit groups of ``model`` of the kinds ``granularity`` (module
    docstring), one per consumer, in module order, and ``(layer, reason)`` for the layers of
    those kinds whose units cannot be pruned. ``example`` is one calibration batch, fed as
    ``forward_fn(model, example)``; ``include`` / ``exclude``: fnmatch patterns on the names of
    a group's layers (consumer or producers)."""
    kinds = check_unit_granularity(granularity)
    steps, _ = discover(model)
    by_module = {(id(s.module), s.kind): s for s in steps}
    names = {id(m): n for n, m in model.named_modules()}
    groups, skipped = [], []
    taken: set[int] = set()   # producer modules already in a group
    attentions = {}
    for n, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            attentions[id(m)] = (n, m)
        elif hf_attention(m) is not None:
            attentions[id(m)] = (n, m)
    if "head" in kinds:
        for mid, (n, m) in attentions.items():
            if not isinstance(m, nn.MultiheadAttention):
                continue
            g = _mha_group(n, m, by_module)
            if isinstance(g, str):
                skipped.append((n, g))
            elif _selected(g.names(), include, exclude):
                groups.append(g)
    needs_graph = "neuron" in kinds or (
        "head" in kinds and any(not isinstance(m, nn.MultiheadAttention)
                                for _, m in attentions.values()))
    if needs_graph:
        for g, why in _graph_groups(model, example, forward_fn, kinds, by_module, names,
                                    attentions):
            if g is None:
                skipped.append(why)
            elif _selected(g.names(), include, exclude):
                if any(id(p.module) in taken for p in g.parts if p.role != "bn"):
                    continue
                taken.update(id(p.module) for p in g.parts)
                groups.append(g)
    order = {id(m): i for i, m in enumerate(model.modules())}
    groups.sort(key=lambda g: order.get(id(g.step.module), 0))
    return groups, skipped


def _mha_group(name, m: nn.MultiheadAttention, by_module):
    step = by_module.get((id(m), "mha_out"))
    if step is None:
        return "its output projection is not a prunable layer (tied or parametrized)"
    if m.bias_k is not None or m.add_zero_attn:
        return "add_bias_kv / add_zero_attn: a head's output depends on more than its rows"
    H, E = m.num_heads, m.embed_dim
    d = E // H
    cols = [head_index([h], d) for h in range(H)]
    rows = [head_index([h], d, (0, E, 2 * E)) for h in range(H)]
    return UnitGroup(f"{name}.out_proj", "head", step, cols,
                     [Part(f"{name}.in_proj", m, "mha_in", rows)], attention=m, head_dim=d)


def _graph_groups(model, example, forward_fn, kinds, by_module, names, attentions):
    """Yield ``(UnitGroup, None)`` or ``(None, (layer, reason))`` from the dependency graph of
    ``model`` on ``example`` (``dualdrop.nn._graph``)."""
    graph = trace(model, example, forward_fn, "structured one-shot pruning")
    proj_of = {}   # projection module -> attention it belongs to
    for mid, (n, m) in attentions.items():
        info = hf_attention(m)
        if info is not None:
            for _, x, _ in info[2]:
                proj_of[id(x)] = (n, m, info)
    for us in graph.unit_sets():
        att = next((proj_of[id(x.module)] for x in us.of("rows") if id(x.module) in proj_of),
                   None)
        if att is not None:
            if "head" in kinds:
                yield _hf_head_group(att, us, by_module, names)
            continue
        res = _plain_group(us, by_module, names, kinds)
        if res is not None:
            yield res


def _hf_head_group(att, us, by_module, names):
    aname, m, (H, d, projs) = att
    if kv_heads_differ(m):
        return None, (aname, "grouped-query attention (fewer key/value heads): heads are not "
                             "pruned")
    mods = {id(x.module): x.module for x in us.of("cols")
            if x.module not in {p for _, p, _ in projs}}
    if len(mods) != 1:
        return None, (aname, f"its heads are read by {len(mods)} layers, not one output "
                             "projection")
    cm = next(iter(mods.values()))
    kind = "hf_conv1d" if is_conv1d(cm) else "linear"
    step = by_module.get((id(cm), kind))
    if step is None or n_in(cm) != H * d:
        return None, (aname, "its output projection is not a prunable layer of H * d inputs")
    cols = [head_index([h], d) for h in range(H)]
    parts = {}
    for pname, x, off in projs:
        key = id(x)
        if key not in parts:
            parts[key] = Part(f"{aname}.{pname}", x, "rows", [np.zeros(0, np.int64)] * H)
        part = parts[key]
        part.index = [np.concatenate([part.index[h], head_index([h], d, (off,))])
                      for h in range(H)]
    return UnitGroup(names[id(cm)], "head", step, cols, list(parts.values()), attention=m,
                     head_dim=d), None


#: why a unit set stops at a member of these roles (what it reaches instead of one consumer)
_STOPS = {"layernorm": "its outputs reach a LayerNorm (the residual stream)",
          "output": "its outputs are the model's outputs"}


def _plain_group(us, by_module, names, kinds):
    """A neuron or channel group, or ``(None, reason)`` if its features are not units, or
    None if it is not of a wanted kind."""
    root = us.root
    rname = names.get(id(root), type(root).__name__)
    if "neuron" not in kinds:   # "channel" is "neuron": both a Linear's and a conv's units
        return None
    kind = "channel" if layer_kind(root) == "conv" else "neuron"   # the row's label
    for x in us.members:
        if x.role == "norm" and (type(x.module) not in BN or not x.module.track_running_stats):
            return None, (rname, "a BatchNorm without running statistics on its outputs")
        if x.role == "op":
            if x.op not in FEATURE_MAPS:
                return None, (rname, f"its outputs go through {x.op or 'an operation'} "
                                     "(mixes features)")
            if x.op == "MeanBackward" and not positions_mean(x.node.grad_fn):
                return None, (rname, "its outputs are averaged over features")
        elif x.role in _STOPS:
            return None, (rname, _STOPS[x.role])
        elif x.role not in ("rows", "cols", "norm", "weight", "shape"):
            return None, (rname, f"its outputs reach a {x.node.type.name.lower()} node")
    outs, ins, norms = us.of("rows"), us.of("cols"), us.of("norm")
    cmods = {id(x.module): x for x in ins}
    if not cmods:
        return None, (rname, "no layer reads its outputs (the model's output)")
    if len(cmods) != 1:
        return None, (rname, f"its outputs are read by {len(cmods)} layers, not one")
    (cit,) = cmods.values()
    cm = cit.module
    ck = "conv" if layer_kind(cm) == "conv" else ("hf_conv1d" if is_conv1d(cm) else "linear")
    step = by_module.get((id(cm), ck))
    if step is None:
        return None, (rname, f"its consumer {names.get(id(cm))} is not a prunable layer")
    width = 1 + max(max(x.roots, default=-1) for x in outs)
    K = int(np.prod(cm.kernel_size)) if ck == "conv" else 1
    cols = [[] for _ in range(width)]
    for i, r in zip(cit.idxs, cit.roots):
        cols[r].extend(range(i * K, (i + 1) * K))
    live = [u for u in range(width) if cols[u]]
    parts = []
    for role, members in (("rows", outs), ("bn", norms)):
        for x in members:
            idx = [[] for _ in range(width)]
            for i, r in zip(x.idxs, x.roots):
                idx[r].append(i)
            parts.append(Part(names.get(id(x.module), ""), x.module, role,
                              [np.asarray(idx[u], np.int64) for u in live]))
    if not live:
        return None, (rname, "no unit reaches its consumer")
    return UnitGroup(names[id(cm)], kind, step, [np.asarray(cols[u], np.int64) for u in live],
                     parts), None


class ParamCount:
    """The parameters removed when each group keeps ``counts[name]`` units, exactly: every
    tensor the groups write is a matrix of ``rows x cols`` entries (a weight in the ``(out,
    in)`` view, a convolution's kernel taps folded into ``in``; a bias or BatchNorm vector has
    one column), its rows owned by the groups it produces for and its columns by the group
    that reads through it; it keeps ``(rows left) x (cols left)`` entries. A layer in a chain
    (the middle Linear of an MLP) loses rows and columns, counted once."""

    def __init__(self, groups):
        self.tensors: dict[int, list] = {}   # id -> [numel, rows, cols, row owners, col owners]
        for g in groups:
            W = g.step.weights()[0]
            m = len(g.columns[0])
            for p in self._consumer_tensors(g):
                self._entry(p, W.shape[0], W.shape[1])[4].append((g.name, m))
            for part in g.parts:
                r = len(part.index[0]) if part.index else 0
                for p, rows, cols, per in self._part_tensors(part, r):
                    self._entry(p, rows, cols)[3].append((g.name, per))
        self.sizes = {g.name: g.n_units for g in groups}

    def _entry(self, p, rows, cols):
        if id(p) not in self.tensors:
            self.tensors[id(p)] = [p.numel(), rows, cols, [], []]
        return self.tensors[id(p)]

    @staticmethod
    def _consumer_tensors(g):
        m = g.step.module
        return [m.out_proj.weight] if g.step.kind == "mha_out" else [m.weight]

    @staticmethod
    def _part_tensors(part, r):
        m = part.module
        if part.role == "bn":
            return [(p, p.numel(), 1, r) for p in (m.weight, m.bias) if p is not None]
        if part.role == "mha_in":
            E = m.embed_dim
            if m._qkv_same_embed_dim:
                out = [(m.in_proj_weight, 3 * E, E, r)]
            else:
                out = [(w, E, w.shape[1], r // 3) for w in (m.q_proj_weight, m.k_proj_weight,
                                                            m.v_proj_weight)]
            if m.in_proj_bias is not None:
                out.append((m.in_proj_bias, 3 * E, 1, r))
            return out
        w = m.weight
        rows = w.shape[1] if is_conv1d(m) else w.shape[0]
        out = [(w, rows, w.numel() // rows, r)]
        if m.bias is not None:
            out.append((m.bias, rows, 1, r))
        return out

    def prunable(self) -> int:
        """Entries some unit owns (the rest are in rows and columns no unit holds)."""
        total = 0
        for numel, rows, cols, ro, co in self.tensors.values():
            free_r = rows - sum(self.sizes[n] * k for n, k in ro)
            free_c = cols - sum(self.sizes[n] * k for n, k in co)
            total += numel - free_r * free_c
        return total

    def removed(self, counts: dict) -> int:
        out = 0
        for numel, rows, cols, ro, co in self.tensors.values():
            r = rows - sum((self.sizes[n] - counts[n]) * k for n, k in ro)
            c = cols - sum((self.sizes[n] - counts[n]) * k for n, k in co)
            out += numel - r * c
        return out
