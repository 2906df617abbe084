"""Compact export: physically remove the dead units of a sparsified network.

After the dense fold (``export_sparse(model, "dense")``) a pruned neuron is still there, as a
zero row of its layer. ``compact(model, example_inputs)`` removes such units, so the network
really gets narrower (fewer parameters, smaller products), while computing exactly what the
masked network computes in eval mode.

**Which units.** A unit ``i`` of a Linear layer ``y = W x + b`` (a row of ``W``), or an output
channel of a convolution (a filter ``W[i]``), is *dead* when ``W[i] = 0``: its output is the
constant ``b_i`` whatever the input. Removing it also removes column ``i`` of every layer that
reads it, the BatchNorm entries on its way, and the matching unit of every tensor added to or
concatenated with it. Finding these coupled sets by hand is error-prone (residual adds,
concatenations, flattening), so they come from the dependency graph of Torch-Pruning
(Fang et al., DepGraph, CVPR 2023), traced by one forward run on ``example_inputs``:
``DependencyGraph().build_dependency`` and ``get_pruning_group(layer, prune_*_out_channels,
idxs)``. An index of a coupled group is removed only when every layer producing it is dead
there (both sides of a residual add, every input of a concatenation), or when every layer
reading it ignores it (``W_next[:, i] = 0``, what input-unit gates such as
``hardconcrete-neuron`` leave): then ``W_next[:, i] h_i = 0`` whatever ``h_i`` is.

**Exactness.** A dead unit still emits a constant: ``b_i`` through the elementwise path to the
next layer, e.g. ``relu(b_i)``, or ``beta_i + gamma_i (b_i - mu_i) / sqrt(var_i + eps)`` after
an eval-mode BatchNorm. The next layer's contribution of it is input independent and moves
into that layer's bias before the unit goes::

    Linear:  b'_o = b_o + sum_i W_next[o, i] c_i
    Conv:    b'_o = b_o + sum_i c_i sum_k W_next[o, i, k]   (no zero padding: see below)

The constant ``c`` is read at the next layer's input on the ``example_inputs`` forward run
(and checked to be the same for every sample and position). That it is a constant at all is
guaranteed by the graph, not by the samples: every operation on the way must be one that maps a
constant unit to a constant. A unit is kept instead whenever the fold would not be exact:

- the path holds anything but per-entry operations (ReLU, GELU, Tanh, Sigmoid, SiLU, ...,
  eval-mode Dropout and BatchNorm, residual adds of coupled tensors, pooling, flatten,
  concatenation): a LayerNorm, an attention block, a permute, a sum with a tensor from outside
  the graph (the raw input), a reused or tied layer or the model output in the group keep the
  whole group;
- the next convolution zero-pads (a constant input becomes non-constant at the borders) and
  ``c != 0``; or the next layer has no bias and ``c != 0``; or it is a grouped convolution;
- ``c`` measured on ``example_inputs`` is not constant across samples or positions.

**Attention heads.** Torch-Pruning's ``nn.MultiheadAttention`` pruner narrows the embedding
width (coupled to the residual stream and its LayerNorms) rather than dropping heads, so heads
are removed by ``dualdrop.nn._heads`` after the graph pass: a head whose output columns in
``out_proj`` are zero, or whose value rows are zero (its output is then its value bias, folded
into ``out_proj.bias``), goes, and the attention becomes a ``HeadPrunedAttention`` of the kept
heads. The hidden units of a Transformer's feed-forward block (``linear1``) are removed by the
graph pass.

**Saving.** The compact network no longer fits the original architecture's ``state_dict``.
``save_compact(model, path)`` stores ``{"format", "state_dict", "shapes", "groups"}``
plus ``"attention"`` (the kept heads' sizes; tensors, ints and strings only, so
``torch.load(weights_only=True)`` reads it) and ``load_compact(path, fresh)`` resizes the Linear,
convolution and BatchNorm layers of a fresh instance of the original architecture to the saved
shapes (and puts a ``HeadPrunedAttention`` where heads were removed), then loads the weights
with ``strict=True``. (Torch-Pruning's ``tp.state_dict`` pickles every module's
``__dict__``, hook tables and attributes included, which ``weights_only=True`` refuses even for
a plain ``nn.Sequential``; hence this format.)
"""

from __future__ import annotations

import copy
import os

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from dualdrop.nn import export as _export
from dualdrop.nn._graph import (BINARY, PER_ENTRY, call, check_inputs, first_line, layer_kind,
                                positions_mean, tensors, torch_pruning, trace)
from dualdrop.nn._heads import (HeadPrunedAttention, attention_spec, remove_dead_heads,
                                restore_attention)
from dualdrop.nn._layers import BN, CONV, LINEAR, is_conv1d, n_in, n_out, out_in
from dualdrop.nn._unit_removal import (check_groups, constants, fold_delta, folds_exactly,
                                       layer_inputs, remove_groups, sync_sizes, zero_rows)
from dualdrop.nn.export import export_sparse
from dualdrop.nn._files import atomic_target, writable_file
from dualdrop.nn.hf.compact import compact_pretrained
from dualdrop.nn.hf.families import blocks as hf_blocks
from dualdrop.nn.hf.families import check_widths as check_hf_widths
from dualdrop.nn.hf.families import family as hf_family
from dualdrop.nn.hf.families import resize as resize_hf
from dualdrop.nn.hf.families import widths as hf_widths

FORMAT = "dualdrop-compact"

def compact(model: nn.Module, example_inputs, *, groups=None, verify: bool = True) -> nn.Module:
    """A new plain module computing what ``model`` computes in eval mode, dead units removed.

    ``model``: a sparsified model (its masks are folded first, as by
    ``export_sparse(model, "dense")``) or a plain one; it is not changed. ``example_inputs``:
    the inputs of one forward run, ``model(example_inputs)`` (tuple/list: positional arguments,
    dict: keyword arguments), used to trace the layer dependencies and read the constants that
    removed units emit; random inputs of the real shape are best. ``verify``: compare both
    networks on ``example_inputs`` and raise if they differ (they should not). See the module
    docstring for which units go and why the result is exact. Returns the module in eval mode;
    :func:`compact_report` lists the units kept per layer. A Hugging Face transformer with
    BERT-, GPT-2- or Llama-shaped blocks is compacted block by block instead (its FFN neurons
    and attention heads, each block at its own widths: ``dualdrop.nn.hf.compact``; no
    torch-pruning needed); save it with ``dualdrop.nn.save_pretrained``.

    ``groups``: the unit groups a structured one-shot prune found (``prune_structured(...)
    .groups``; ``StructuredResult.compact()`` passes them): the units are then taken from
    them, not re-derived from a traced dependency graph (``dualdrop.nn._unit_removal``; no
    torch-pruning needed), and only their units and heads go (a Hugging Face transformer: the
    FFNs and attentions of the blocks they name). The same zeros give the same network as
    without. None (default): every dead unit the graph finds.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_inputs(example_inputs)
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be True or False, got {verify!r}")
    names = None if groups is None else check_groups(groups, model)
    if hf_family(model) is not None:   # a Hugging Face transformer: by its blocks
        return compact_pretrained(model, example_inputs, verify=verify, groups=groups)
    if groups is None:
        torch_pruning("compact export")   # the missing extra named before any work
    dense = export_sparse(model, layout="dense")
    ref = copy.deepcopy(dense) if verify else None
    trainable = {n: p.requires_grad for n, p in dense.named_parameters()}
    if groups is None:
        out = _compact_plain(dense, example_inputs)
        remove_dead_heads(out)
    else:
        out = dense.eval()
        remove_groups(out, groups, names, example_inputs)
    for n, p in out.named_parameters():
        p.requires_grad_(trainable.get(n, True))
    if verify:
        _verify(ref, out, example_inputs)
    return out.eval()


@torch.no_grad()
def _compact_plain(net: nn.Module, example_inputs) -> nn.Module:
    """Remove dead units of the plain module ``net`` in place (see :func:`compact`)."""
    net.eval()
    shared = _shared_params(net)

    # 1. every layer's input on one forward run: the constants dead units feed the next layer
    seen, calls = layer_inputs(net, example_inputs,
                               [m for m in net.modules() if layer_kind(m)])

    # 2. the dependency graph (Torch-Pruning traces autograd on a forward run)
    outputs = set()  # a layer whose output is the model's output has no output node after it
    numbers = _NumberOps()  # binary ops with a Python number (``1.0 + tanh(u)``): per entry

    def forward(model, inputs):
        with numbers:
            out = call(model, inputs)
        outputs.update(t.grad_fn for t in tensors(out) if t.grad_fn is not None)
        return out

    try:
        graph = trace(net, example_inputs, forward, "compact export")
    except Exception as exc:
        raise ValueError("compact export: torch-pruning cannot trace this model's dependency "
                         f"graph ({type(exc).__name__}: {first_line(exc)}); export it with "
                         'layout="dense" instead') from None
    for p in net.parameters():
        p.requires_grad_(False)

    # 3. per group: which indices may go, and the bias folds that make removing them exact
    plans = []
    for us in graph.unit_sets():
        if any(x.node.grad_fn in outputs and x.out for x in us.members):
            continue  # the model's output keeps its width
        plan = _plan(us, seen, calls, shared, numbers.nodes)
        if plan is not None:
            plans.append(plan)

    # 4. fold the constants, then remove (each group re-derived from its root layer)
    for root, fn, idxs, folds in plans:
        for layer, delta in folds:
            layer.bias.add_(delta.to(layer.bias.dtype))
    for root, fn, idxs, folds in plans:
        graph.prune(root, fn, idxs)
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def _plan(us, seen, calls, shared, number_ops=frozenset()):
    """``(root, prune_fn, idxs, [(layer, bias_delta)])`` for one unit set (``_graph.UnitSet``),
    or None if none go."""
    width = us.width
    dead = [True] * width
    consumers, inner = [], []
    for x in us.members:
        m = x.module
        if isinstance(m, nn.Module) and calls.get(m, 0) > 1:
            return None  # a layer used twice: one node, two roles
        if x.role in ("rows", "cols", "depthwise", "layer"):
            kind = layer_kind(m)
            if kind not in ("linear", "conv", "depthwise") or any(
                    id(p) in shared for p in m.parameters(recurse=False)):
                return None
            if x.role != "cols":
                if max(x.idxs, default=0) >= n_out(m):
                    return None  # a broadcast partner (one unit against many): not a unit map
                zero = zero_rows(m)
                for idx, r in zip(x.idxs, x.roots):
                    dead[r] = dead[r] and zero[idx]
            else:
                if m not in seen or max(x.idxs, default=0) >= n_in(m):
                    return None
                consumers.append((m, kind, x.idxs, x.roots))
        elif x.role == "norm":
            if type(m) not in BN or not m.track_running_stats:
                return None
        elif x.role == "op":
            if x.op in ("AddmmBackward", "MmBackward"):
                inner.append(x.node.grad_fn)  # checked below: a consumer's own product?
                continue
            if x.op not in PER_ENTRY and not (x.op == "MeanBackward"
                                              and positions_mean(x.node.grad_fn)):
                return None
            if x.op in BINARY and x.node.grad_fn not in number_ops and any(
                    f is None for f, _ in x.node.grad_fn.next_functions):
                return None  # combined with a tensor outside the graph (e.g. the raw input)
        elif x.role not in ("weight", "shape"):  # output, LayerNorm, attention, embedding, ...
            return None
    # unread: every layer reading the unit ignores it (zero column), e.g. input-unit gates
    unread = [bool(consumers)] * width
    for m, kind, idxs, roots in consumers:
        cols = out_in(m).transpose(0, 1)[idxs]
        zero = (cols.reshape(len(idxs), -1) == 0).all(1).tolist()
        for z, r in zip(zero, roots):
            unread[r] = unread[r] and z
    if not any(dead) and not any(unread):
        return None
    weights = {id(m.weight) for m, kind, _, _ in consumers if kind == "linear"}
    if not all(_product_of(g, weights) for g in inner):
        return None

    # the constant each consumer reads at the dead indices, and whether it folds exactly
    removable = [d or u for d, u in zip(dead, unread)]
    reads = []
    for m, kind, idxs, roots in consumers:
        sel = [k for k, r in enumerate(roots) if dead[r] and not unread[r]]
        if not sel:
            continue
        c, const = constants(seen[m], m, kind, [idxs[k] for k in sel])
        exact_ok = folds_exactly(m, kind)
        for j, k in enumerate(sel):
            if not const[j] or (c[j] != 0 and not exact_ok):
                removable[roots[k]] = False
        reads.append((m, kind, idxs, roots, sel, c))
    gone = [r for r in range(width) if removable[r]]
    if len(gone) == width:
        gone = gone[1:]  # a layer keeps at least one unit (an empty layer is not a module)
    if not gone:
        return None
    gone_set = set(gone)
    folds = []
    for m, kind, idxs, roots, sel, c in reads:
        cols = [idxs[k] for k in sel if roots[k] in gone_set]
        vals = torch.stack([c[j] for j, k in enumerate(sel) if roots[k] in gone_set]) \
            if cols else None
        if vals is None or not torch.any(vals != 0):
            continue
        folds.append((m, fold_delta(m, kind, cols, vals)))
    return us.root, us.prune_fn, gone, folds


class _NumberOps(TorchFunctionMode):
    """Records the autograd nodes of binary operations with a Python number operand (``0.5 *
    x``, ``1.0 + t``): per entry, while autograd alone cannot tell such a node from one that
    adds a tensor from outside the graph (its other input has no node either)."""

    def __init__(self):
        super().__init__()
        self.nodes = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (isinstance(out, torch.Tensor) and out.grad_fn is not None and len(args) == 2
                and any(isinstance(a, (int, float)) for a in args)):
            self.nodes.add(out.grad_fn)
        return out


def _product_of(grad_fn, weights) -> bool:
    """Whether a matrix product node is a dense layer's own ``x W^T`` (``x W`` for a Conv1D; its
    weight among ``weights``): on inputs with more than two dimensions ``F.linear`` (and
    Conv1D's forward) is reshape, addmm, view, and Torch-Pruning sees the module at the view
    and the addmm as a separate node."""
    for fn, _ in grad_fn.next_functions:
        if fn is None:
            continue
        leaves = fn.next_functions if type(fn).__name__.startswith("TBackward") else [(fn, 0)]
        for leaf, _ in leaves:
            if leaf is not None and id(getattr(leaf, "variable", None)) in weights:
                return True
    return False


def _shared_params(net):
    count = {}
    for _, p in net.named_parameters(remove_duplicate=False):
        count[id(p)] = count.get(id(p), 0) + 1
    return {k for k, v in count.items() if v > 1}


@torch.no_grad()
def _verify(dense, small, example_inputs):
    dense.eval()
    small.eval()
    a, b = tensors(call(dense, example_inputs)), tensors(call(small, example_inputs))
    for x, y in zip(a, b):
        scale = 1.0 + float(x.abs().max()) if x.numel() else 1.0
        if x.shape != y.shape or not torch.allclose(x, y, rtol=1e-4, atol=1e-5 * scale):
            raise RuntimeError("compact export changed the model's outputs on example_inputs; "
                               'this is a bug, please report it; use layout="dense" meanwhile')


def compact_report(dense: nn.Module, small: nn.Module) -> dict:
    """``{layer_name: (kept, total)}``: output units (Linear) or channels (convolutions) of each
    layer of the compact network ``small`` against the same layer of ``dense`` (the dense
    export or the original model), and the heads of each attention whose heads were removed
    (every block's self-attention in a Hugging Face transformer)."""
    ref = dict(dense.named_modules())
    rows = {}
    if hf_family(small) is not None and hf_family(dense) is not None:
        for b, r in zip(hf_blocks(small), hf_blocks(dense)):   # heads per block
            rows[b.names["attention"]] = (hf_widths(b)["num_attention_heads"],
                                          hf_widths(r)["num_attention_heads"])
    for name, m in small.named_modules():
        if isinstance(m, HeadPrunedAttention) and name in ref:
            r = ref[name]
            rows[name] = (m.num_heads, r.orig_heads if isinstance(r, HeadPrunedAttention)
                          else r.num_heads)
            continue
        kind = layer_kind(m)
        if kind is None or name not in ref:
            continue
        rows[name] = (n_out(m), n_out(ref[name]))
    return rows


# ---------------------------------------------------------------------------- saving / loading

def save_compact(model: nn.Module, path: str | os.PathLike) -> None:
    """Write a compact network to the file ``path``: ``{"format", "state_dict", "shapes",
    "groups", "attention", "hf"}`` (tensors, ints and strings: readable with
    ``torch.load(weights_only=True)``; ``groups``: each convolution's group count, which a
    narrowed depthwise convolution changes; ``hf``: a Hugging Face transformer's widths per
    block); reload it with :func:`load_compact`. Written to a temporary name beside ``path``,
    read back, then moved into place. (A Hugging Face model is better saved with
    ``dualdrop.nn.save_pretrained``: config + safetensors, loaded in one call.)"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    target = writable_file(path, "path")
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    groups = {n: int(m.groups) for n, m in model.named_modules() if isinstance(m, CONV)}
    blob = {"format": FORMAT, "version": 1, "state_dict": sd,
            "shapes": {k: list(v.shape) for k, v in sd.items()}, "groups": groups,
            "attention": attention_spec(model)}
    if hf_family(model) is not None:
        blob["hf"] = [hf_widths(b) for b in hf_blocks(model)]
    with atomic_target(target) as tmp:
        torch.save(blob, tmp)
        torch.load(tmp, map_location="cpu", weights_only=True)  # reads back before it replaces


def load_compact(path: str | os.PathLike, model: nn.Module) -> nn.Module:
    """The compact network saved at ``path``, rebuilt on ``model``: a fresh (uncompacted)
    instance of the original architecture, whose Linear, convolution and BatchNorm layers are
    resized to the saved shapes (a Hugging Face transformer's blocks to their saved widths)
    before the weights load with ``strict=True``. Returns ``model`` in eval mode. A file that is
    not such a save, or does not fit ``model``, raises ValueError and leaves ``model`` as it was
    (every step is first run on a copy of ``model`` on the meta device)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a fresh instance of the original architecture "
                        f"(a torch.nn.Module), got {type(model).__name__}")
    fix = "save it with dualdrop.nn.save_compact and pass a fresh instance of its architecture"
    if os.path.isdir(path) if isinstance(path, (str, os.PathLike)) else False:
        raise ValueError(f"{path} is a folder; pass the file save_compact wrote (a folder "
                         "from save_pretrained loads with dualdrop.nn.load_pretrained)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} cannot be read as a compact model "
                         f"({first_line(exc)[:120]}); {fix}") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT or not isinstance(
            blob.get("state_dict"), dict) or not all(
            isinstance(v, torch.Tensor) for v in blob["state_dict"].values()) or not \
            isinstance(blob.get("attention") or {}, dict) or not \
            isinstance(blob.get("groups") or {}, dict):
        raise ValueError(f"{path} is not a compact model file; {fix}")
    where = f"{path} does not fit {type(model).__name__}"
    meta_sd = {k: torch.empty(v.shape, dtype=v.dtype, device="meta")
               for k, v in blob["state_dict"].items()}
    with torch.device("meta"):   # a dry run: every check, nothing of model changed
        _rebuild(_meta_clone(model), blob, meta_sd, where, fix)
    _rebuild(model, blob, blob["state_dict"], where, fix)
    return model.eval()


def _meta_clone(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are empty meta tensors."""
    memo = {}
    for t in list(model.parameters()) + list(model.buffers()):
        empty = torch.empty(t.shape, dtype=t.dtype, device="meta")
        memo[id(t)] = (nn.Parameter(empty, requires_grad=t.requires_grad)
                       if isinstance(t, nn.Parameter) else empty)
    return copy.deepcopy(model, memo)


def _rebuild(model, blob, sd, where, fix) -> None:
    """Resize ``model`` to the shapes of the compact save ``blob`` and load ``sd`` into it."""
    hf = blob.get("hf")
    if hf is not None:
        if hf_family(model) is None:
            raise ValueError(f"{where}: the file holds a Hugging Face transformer's block "
                             f"widths; {fix}")
        check_hf_widths(model, hf, where)
        resize_hf(model, hf)
    restore_attention(model, blob.get("attention") or {}, where)
    own = model.state_dict()
    missing, extra = set(own) - set(sd), set(sd) - set(own)
    if missing or extra:
        what = f"missing {sorted(missing)[:3]}" if missing else f"unexpected {sorted(extra)[:3]}"
        raise ValueError(f"{where}: {what}; {fix}")
    modules = dict(model.named_modules())
    resizes = []
    for key, value in sd.items():
        if tuple(own[key].shape) == tuple(value.shape):
            continue
        mod_name, _, attr = key.rpartition(".")
        m = modules.get(mod_name)
        if not (isinstance(m, LINEAR + CONV + BN) or is_conv1d(m)) or \
                own[key].dim() != value.dim():
            raise ValueError(f"{where}: {key} has shape {tuple(value.shape)}, the model "
                             f"{tuple(own[key].shape)}; {fix}")
        resizes.append((m, attr, value))
    groups = blob.get("groups") or {}
    for name, g in groups.items():
        if not isinstance(modules.get(name), CONV) or not isinstance(g, int) or g < 1:
            raise ValueError(f"{where}: no convolution {name!r}; {fix}")
    for m, attr, value in resizes:
        _resize(m, attr, value)
    for name, g in groups.items():
        modules[name].groups = g
    for m in modules.values():
        sync_sizes(m)
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{where}: {first_line(exc)}; {fix}") from None


def _resize(m, attr, value):
    blank = torch.empty(value.shape, dtype=value.dtype, device=value.device)
    if attr in m._parameters:
        m._parameters[attr] = nn.Parameter(blank, requires_grad=m._parameters[attr].requires_grad)
    else:
        m._buffers[attr] = blank


_export.LAYOUT_HOOKS["compact"] = compact  # export_sparse(model, "compact", example_inputs=x)
