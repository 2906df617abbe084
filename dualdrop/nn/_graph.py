"""The one reader of a model's dependency graph: Torch-Pruning's (Fang et al., DepGraph, CVPR 2023)
traced by one forward run, read group by group. The compact export (``dualdrop.nn.compact``), the
coupled units of training (``dualdrop.nn._coupling``) and the units of structured one-shot
pruning (``dualdrop.nn.oneshot.units``) all read it through :func:`trace` and
:meth:`Graph.unit_sets`: each set is the output units of one Linear or convolution layer with
every entry of the graph coupled to them, each entry given one :class:`Member` role (a layer's
own rows, a reading layer's columns, a BatchNorm, an autograd operation, a reshape, ...). The
callers differ only in what they let a unit pass (:data:`PER_ENTRY` for the compact export, whose
removed units must emit a constant; :data:`FEATURE_MAPS` for one-shot units, which must reach
their one consumer as themselves). torch-pruning is an optional extra, imported only when a trace
is asked for.

Torch-Pruning knows ``nn.Linear`` but not Hugging Face's ``Conv1D`` (GPT-2's Linear layer, weight
``(in, out)``); :func:`dependency_graph` registers a pruner for it (output units are the weight's
columns and the bias, input units its rows), so a GPT-2 is traced like a network of Linear
layers."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

import torch

from dualdrop.nn._layers import CONV, conv1d_class, dense_type, is_conv1d, n_out
from dualdrop.nn._undo import undo_on_error

INSTALL_HINT = 'pip install "dualdrop[structured]"'

#: autograd nodes (names without the trailing version digit) that map each feature on its own:
#: a unit passing through them stays one unit (elementwise maps, hand-written activations such
#: as GPT-2's tanh GELU, pooling over positions). What the compact export (``compact``) and the
#: one-shot unit groups (``oneshot.units``) both let a unit pass.
PER_ENTRY = frozenset({
    "ReluBackward", "GeluBackward", "TanhBackward", "SigmoidBackward", "SiluBackward",
    "LeakyReluBackward", "EluBackward", "HardtanhBackward", "HardswishBackward",
    "HardsigmoidBackward", "SoftplusBackward", "MishBackward", "ClampBackward",
    "ClampMinBackward", "ClampMaxBackward", "NegBackward", "CloneBackward", "AliasBackward",
    "AddBackward", "SubBackward", "MulBackward", "DivBackward", "PowBackward",
    "ExpBackward", "LogBackward", "SqrtBackward", "RsqrtBackward", "ErfBackward",
    "AbsBackward", "ReciprocalBackward",
    "MaxPool1DWithIndicesBackward", "MaxPool2DWithIndicesBackward",
    "MaxPool3DWithIndicesBackward", "AvgPool2DBackward", "AvgPool3DBackward",
    "AdaptiveAvgPool2DBackward", "AdaptiveAvgPool3DBackward",
    "AdaptiveMaxPool2DBackward", "AdaptiveMaxPool3DBackward",
})

#: autograd nodes a one-shot unit may pass on its way to its one consumer: the per-entry maps,
#: the layers' own products and reshapes, dropout, and a mean over positions only (checked by
#: :func:`positions_mean`)
FEATURE_MAPS = PER_ENTRY | {
    "AddmmBackward", "MmBackward", "TBackward", "ViewBackward", "UnsafeViewBackward",
    "ReshapeAliasBackward", "TransposeBackward", "PermuteBackward", "NativeDropoutBackward",
    "MeanBackward",
}

#: the two-operand autograd nodes among :data:`PER_ENTRY` (per entry only when the other operand
#: is a coupled tensor or a number)
BINARY = frozenset({"AddBackward", "SubBackward", "MulBackward", "DivBackward", "PowBackward"})


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


def dependency_graph(tp, model, example_inputs, forward_fn):
    """Torch-Pruning's ``DependencyGraph`` of ``model`` traced by ``forward_fn(model,
    example_inputs)`` (the tensors of its output), with the pruner of Hugging Face's ``Conv1D``
    registered. Torch-Pruning hooks every layer for the traced run and unhooks them only when
    the run succeeds: a failed run leaves the model as it was (hooks, modes, gradients flags)."""
    cls = conv1d_class()
    custom = {cls: _conv1d_pruner(tp)} if cls is not None and any(
        type(m) is cls for m in model.modules()) else None

    def forward(m, x):  # the output's tensors: Torch-Pruning flattens lists, not HF's outputs
        return _traced(forward_fn, m, x)

    with undo_on_error(model) as snap, _no_cache(model):
        dg = tp.DependencyGraph().build_dependency(
            model, example_inputs=example_inputs, forward_fn=forward,
            customized_pruners=custom, verbose=False)
        snap.commit()
    return dg


def _traced(forward_fn, model, inputs) -> list:
    out = tensors(forward_fn(model, inputs))
    if not any(t.grad_fn is not None for t in out):
        raise ValueError("the model's output holds no tensor computed from its weights")
    return out


@contextlib.contextmanager
def _no_cache(model):
    """A Hugging Face model traced without its key/value cache (``config.use_cache`` off for
    the run, then back): the cache is no part of the network's function, and its
    concatenation along the sequence is read by Torch-Pruning as one along the features."""
    config = getattr(model, "config", None)
    cached = getattr(config, "use_cache", None)
    if cached is True:
        config.use_cache = False
    try:
        yield
    finally:
        if cached is True:
            config.use_cache = True


_PRUNERS: dict = {}


def _conv1d_pruner(tp):
    """A Torch-Pruning pruner for ``Conv1D`` (``y = x W + b``, ``W`` of shape ``(in, out)``),
    made once (its methods are the graph's handlers, compared by identity)."""
    if "conv1d" in _PRUNERS:
        return _PRUNERS["conv1d"]

    class Conv1DPruner(tp.pruner.BasePruningFunc):
        def prune_out_channels(self, layer, idxs):
            keep = sorted(set(range(layer.weight.shape[1])) - set(idxs))
            layer.weight = self._prune_parameter_and_grad(layer.weight, keep, 1)
            if layer.bias is not None:
                layer.bias = self._prune_parameter_and_grad(layer.bias, keep, 0)
            layer.nf = len(keep)
            return layer

        def prune_in_channels(self, layer, idxs):
            keep = sorted(set(range(layer.weight.shape[0])) - set(idxs))
            layer.weight = self._prune_parameter_and_grad(layer.weight, keep, 0)
            if hasattr(layer, "nx"):
                layer.nx = len(keep)
            return layer

        def get_out_channels(self, layer):
            return layer.weight.shape[1]

        def get_in_channels(self, layer):
            return layer.weight.shape[0]

    _PRUNERS["conv1d"] = Conv1DPruner()
    return _PRUNERS["conv1d"]


def layer_kind(m) -> str | None:
    """``"linear"`` (``nn.Linear`` or Hugging Face's ``Conv1D``), ``"conv"``, ``"depthwise"``,
    ``"grouped"`` or None (not a layer whose output units the export handles)."""
    if dense_type(m):
        return "linear"
    if type(m) in CONV:
        if m.groups == 1:
            return "conv"
        if m.groups == m.in_channels == m.out_channels:
            return "depthwise"
        return "grouped"
    return None


@dataclass
class Member:
    """One entry of a dependency group, read once. ``role``:

    - ``"rows"``: a Linear (or Conv1D) or ungrouped convolution whose output units these are
      (the root and every layer coupled to it: both sides of a residual add);
    - ``"cols"``: such a layer reading the units (its input columns);
    - ``"depthwise"``: a depthwise convolution (one filter per channel: output and input at
      once); ``"layer"``: any other layer node (a grouped convolution, a subclass of Linear);
    - ``"norm"``: a BatchNorm; ``"layernorm"``; ``"output"``: the model's output;
    - ``"op"``: an autograd operation on the data (``op`` its node's name without the version
      digit); ``"weight"``: one on a weight's own path (the transpose inside ``F.linear``);
    - ``"shape"``: a reshape, concatenation, split or slice; ``"other"``: anything else
      (embedding, attention, parameter, ...).

    ``idxs``: the member's indices of the units, ``roots``: the root units they are;
    ``out``: whether the member is pruned by its output units; ``node``: Torch-Pruning's."""

    role: str
    module: object
    idxs: list
    roots: list
    out: bool
    node: object
    op: str = ""


@dataclass
class UnitSet:
    """The output units of one layer (``root``, ``width`` units, pruned by ``prune_fn``) and
    every member of the graph coupled to them."""

    root: object
    prune_fn: object
    width: int
    members: list = field(default_factory=list)

    def of(self, *roles) -> list:
        return [m for m in self.members if m.role in roles]


class Graph:
    """A traced dependency graph (:func:`trace`), read as :class:`UnitSet` s."""

    def __init__(self, dg, tp):
        self.dg, self.tp = dg, tp

    def unit_sets(self):
        """One :class:`UnitSet` for every dependency group of output units of the Linear (and
        Conv1D) and ungrouped convolution layers, each group once (from the first of its
        layers met): ``dg.get_pruning_group`` of all the root's units."""
        dg = self.dg
        visited = set()
        for m in list(dg.module2node):
            if layer_kind(m) not in ("linear", "conv") or m in visited:
                continue
            fn = dg.get_pruner_of_module(m).prune_out_channels
            width = n_out(m)
            members = [self._member(item) for item in dg.get_pruning_group(
                m, fn, list(range(width)))]
            for x in members:
                if x.out:
                    visited.add(x.module)
            yield UnitSet(m, fn, width, members)

    def prune(self, root, prune_fn, idxs) -> None:
        """Remove the units ``idxs`` of ``root`` and everything coupled to them (Torch-Pruning's
        ``group.prune()``)."""
        self.dg.get_pruning_group(root, prune_fn, idxs).prune()

    def _member(self, item) -> Member:
        node, ops = item.dep.target, self.tp.ops.OPTYPE
        m, t = node.module, node.type
        out = self.dg.is_out_channel_pruning_fn(item.dep.handler)
        kind, op = layer_kind(m), ""
        if kind in ("linear", "conv"):
            role = "rows" if out else "cols"
        elif t in (ops.LINEAR, ops.CONV, ops.DEPTHWISE_CONV) or (
                t == ops.CUSTOMIZED and is_conv1d(m)):
            role = "depthwise" if kind == "depthwise" else "layer"
        elif t == ops.BN:
            role = "norm"
        elif t == ops.ELEMENTWISE:
            role = "op" if node.inputs else "weight"
            op = re.sub(r"\d+$", "", str(getattr(m, "_grad_fn", "")))
        elif t in (ops.RESHAPE, ops.CONCAT, ops.SPLIT, ops.SLICE):
            role = "shape"
        else:
            role = {ops.LN: "layernorm", ops.OUTPUT: "output"}.get(t, "other")
        return Member(role, m, list(item.idxs), list(item.root_idxs), out, node, op)


def trace(model, example_inputs, forward_fn, purpose: str) -> Graph:
    """The :class:`Graph` of ``model`` traced by ``forward_fn(model, example_inputs)``: in eval
    mode, every parameter requiring gradients and autograd on for the run, all three restored
    after (``purpose`` names the caller in the missing-extra error)."""
    tp = torch_pruning(purpose)
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was = model.training
    model.eval()
    try:
        for p, _ in flags:
            p.requires_grad_(True)
        with torch.enable_grad():
            return Graph(dependency_graph(tp, model, example_inputs, forward_fn), tp)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was)


def positions_mean(grad_fn) -> bool:
    """Whether a ``MeanBackward`` node is a mean over positions only (dims 2, 3, ... of a
    ``(batch, channel, ...)`` tensor), as ``nn.AdaptiveAvgPool2d(1)`` or ``x.mean((2, 3))``
    computes: a unit (and a constant one) stays itself."""
    try:
        dims = list(grad_fn._saved_dim)
        ndim = len(grad_fn._saved_self_sym_sizes)
    except (AttributeError, RuntimeError):
        return False
    return ndim >= 3 and bool(dims) and all(2 <= (d % ndim) for d in dims)


def first_line(exc) -> str:
    """The first line of an exception's message (at most 160 characters)."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]
