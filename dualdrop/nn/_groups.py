"""Granularity: which weights a method prunes together (``sparsify(..., granularity=...)``), and the
one vocabulary of the word for training and one-shot pruning alike (``prune_oneshot(...,
granularity=...)`` checks it with :func:`check_unit_granularity`).

``"weight"`` (the default) prunes single weights. ``"neuron"`` (alias ``"channel"``: one word
for one thing, a unit is an output feature of the layer producing it, a Linear layer's neuron or
a convolution's channel) prunes the output units of a layer: the rows of a Linear weight ``(out, in)``, the output channels of a
convolution kernel ``(out, in/groups, k...)`` (a ConvTranspose kernel ``(in, out/groups, k...)``
holds its output channels in its second dimension, within each of its ``groups`` blocks; the
weight ``(in, out)`` of Hugging Face's ``Conv1D``, GPT-2's Linear layer, its columns).
``"head"`` prunes the heads of ``nn.MultiheadAttention``: in ``in_proj_weight`` ``(3E, E)`` group
``h`` is the rows ``[i E + h d, i E + (h + 1) d)`` of q, k and v together (``d = E / heads``),
in ``q_proj_weight`` / ``k_proj_weight`` / ``v_proj_weight`` (separate tensors when ``kdim`` or
``vdim`` differ from ``E``) the rows of head ``h`` of each tensor, and in ``out_proj.weight``
``(E, E)`` the *columns* of head ``h``; the other Linear and convolution weights of the model
get ``"neuron"`` groups.

A :class:`Groups` describes the groups of one weight tensor as a reshape of the tensor
(``view_shape``) and the shape of one value per group (``shape``: ``view_shape`` with 1 in every
dimension a group runs over), so that a per-group tensor broadcasts against the reshaped weight.
For ``"neuron"`` on Linear and convolution weights the reshape is the identity and ``shape`` is
``(out, 1, ..., 1)``.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn as nn

from dualdrop.nn._layers import CONV, CONV_T, LINEAR, is_conv1d

#: the accepted values of ``granularity`` (``"channel"`` is ``"neuron"``), in training and
#: one-shot pruning alike
GRANULARITIES = ("weight", "neuron", "channel", "head")
ALIASES = {"channel": "neuron"}
#: what each word means, in every message that lists them
MEANINGS = ("'weight': single weights; 'neuron' or 'channel' (the same): the output units of "
            "Linear/Conv layers (a neuron, a convolution channel); 'head': attention heads")


def check_granularity(value) -> str:
    """``value`` as its canonical granularity (``"channel"`` -> ``"neuron"``)."""
    choices = list(GRANULARITIES)
    if not isinstance(value, str):
        raise TypeError(f"granularity must be a string, one of {choices}, got "
                        f"{type(value).__name__} {value!r}")
    if value not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {choices} ({MEANINGS}), got {value!r}")
    return ALIASES.get(value, value)


def check_unit_granularity(value) -> tuple[str, ...]:
    """The unit kinds of a structured (one-shot) ``granularity``: one word of
    :data:`GRANULARITIES` other than ``"weight"``, or several (a tuple/list, or one string
    joined by ``+`` or ``,``), as canonical words, each once (``"channel"`` -> ``"neuron"``:
    ``("channel", "neuron")`` is ``("neuron",)``)."""
    units = [g for g in GRANULARITIES if g != "weight"]
    example = "e.g. ('head', 'neuron') or 'head+neuron'"
    if isinstance(value, str):
        items = [g.strip() for g in re.split(r"[+,]", value)]
    elif isinstance(value, (tuple, list)):
        items = list(value)
    else:
        raise TypeError(f"granularity must be one of {units} or several of them ({example}), "
                        f"got {type(value).__name__}")
    bad = [g for g in items if not isinstance(g, str) or g not in units]
    if bad or not items:
        raise ValueError(f"granularity={value!r}; expected one of {units} or several of them, "
                         f"{example} ({MEANINGS}; 'weight' alone for single weights)")
    return tuple(dict.fromkeys(ALIASES.get(g, g) for g in items))


class _GroupNorm(torch.autograd.Function):
    """``sqrt(sum x^2)`` over ``dims`` (kept), with the gradient ``x / ||x||`` and 0 for a zero
    group (the subgradient of smallest norm; autograd's sqrt would give NaN there). Written in
    the functorch-compatible form (``setup_context``, a vmap rule generated) so that the noise
    diagnostics' ``torch.func`` Hessian products run through it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, dims):
        return x.square().sum(dims, keepdim=True).sqrt()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output)
        ctx.save_for_forward(inputs[0], output)
        ctx.dims = inputs[1]

    @staticmethod
    def jvp(ctx, x_t, _dims_t):
        x, n = ctx.saved_tensors
        dot = (x * x_t).sum(ctx.dims, keepdim=True)
        return torch.where(n > 0, dot / n.clamp_min(torch.finfo(n.dtype).tiny), n.new_zeros(()))

    @staticmethod
    def backward(ctx, g):
        x, n = ctx.saved_tensors
        scale = torch.where(n > 0, g / n.clamp_min(torch.finfo(n.dtype).tiny), g.new_zeros(()))
        return x * scale, None


class Groups:
    """The groups of one weight tensor (module docstring): ``kind`` (``"neuron"`` or
    ``"head"``), ``view_shape`` (a reshape of the weight) and ``shape`` (one value per group,
    broadcasting against the reshaped weight)."""

    def __init__(self, kind: str, weight_shape, view_shape, shape):
        self.kind = kind
        self.weight_shape = tuple(weight_shape)
        self.view_shape = tuple(view_shape)
        self.shape = tuple(shape)
        self.dims = tuple(i for i, (v, s) in enumerate(zip(self.view_shape, self.shape))
                          if s == 1 and v != 1)
        self.n_groups = math.prod(self.shape)
        self.size = math.prod(self.weight_shape) // self.n_groups

    def view(self, w: torch.Tensor) -> torch.Tensor:
        return w.reshape(self.view_shape)

    def sq_norm(self, w: torch.Tensor) -> torch.Tensor:
        """``||w_g||^2`` per group (differentiable)."""
        return self.view(w).square().sum(self.dims, keepdim=True)

    def norm(self, w: torch.Tensor) -> torch.Tensor:
        """``||w_g||_2`` per group (differentiable; gradient 0 at a zero group)."""
        return _GroupNorm.apply(self.view(w), self.dims)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of a weight-shaped tensor over each group."""
        return self.view(t).mean(self.dims, keepdim=True)

    def any(self, mask: torch.Tensor) -> torch.Tensor:
        """Per group: whether any entry of the weight-shaped bool ``mask`` is set."""
        return self.view(mask).amax(self.dims, keepdim=True)

    def expand(self, g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """A per-group tensor as a tensor of ``like``'s shape."""
        return g.expand(self.view_shape).reshape(like.shape)

    def scale(self, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``w_g * g_g`` for every group (differentiable in both)."""
        return (self.view(w) * g).reshape(w.shape)

    def __repr__(self):
        return f"Groups({self.kind}, view={self.view_shape}, groups={self.shape})"


def _neuron(module: nn.Module, tensor_name: str, shape) -> Groups | str:
    name = type(module).__name__
    if isinstance(module, nn.MultiheadAttention):
        return (f"MultiheadAttention's {tensor_name} holds the heads' projections, not output "
                "units (granularity='head' groups its heads; or exclude it)")
    if tensor_name != "weight":
        return (f"{tensor_name} is not the weight of a Linear or convolution layer (exclude it, "
                "or use granularity='weight')")
    if len(shape) < 2:
        return f"{name}.weight has {len(shape)} dimension(s): no output units to group"
    if isinstance(module, CONV_T):
        g = module.groups
        view = (g, shape[0] // g) + tuple(shape[1:])
        return Groups("neuron", shape, view, (g, 1, shape[1]) + (1,) * (len(shape) - 2))
    if is_conv1d(module):  # transformers' Conv1D: W (in, out), an output unit is a column
        return Groups("neuron", shape, shape, (1, shape[1]))
    if isinstance(module, LINEAR + CONV):
        return Groups("neuron", shape, shape, (shape[0],) + (1,) * (len(shape) - 1))
    return (f"{name} is not a Linear or convolution layer, whose output units the groups are "
            "(exclude it, or use granularity='weight')")


def _head(module: nn.Module, parent, tensor_name: str, shape) -> Groups | str | None:
    """Head groups of a MultiheadAttention tensor; None if the tensor is not one."""
    if isinstance(module, nn.MultiheadAttention):
        H, E = module.num_heads, module.embed_dim
        d = E // H
        if tensor_name == "in_proj_weight":
            return Groups("head", shape, (3, H, d, shape[1]), (1, H, 1, 1))
        if tensor_name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
            return Groups("head", shape, (H, d, shape[1]), (H, 1, 1))
        return None
    if isinstance(parent, nn.MultiheadAttention) and module is parent.out_proj \
            and tensor_name == "weight":
        H = parent.num_heads
        return Groups("head", shape, (shape[0], H, shape[1] // H), (1, H, 1))
    return None


def groups_of(target, granularity: str) -> Groups | str | None:
    """The :class:`Groups` of ``target`` (a ``dualdrop.nn.targets.Target``) for
    ``granularity``; None for ``"weight"``; a string saying why the tensor cannot be grouped
    so (``sparsify`` skips it with a warning naming it)."""
    if granularity == "weight":
        return None
    shape = tuple(target.param.shape)
    found = []
    for site in target.sites:
        g = None
        if granularity == "head":
            g = _head(site.module, site.parent, site.tensor_name, shape)
        if g is None:
            g = _neuron(site.module, site.tensor_name, shape)
        if isinstance(g, str):
            return f"granularity={granularity!r}: {g}"
        found.append(g)
    first = found[0]
    if any((g.view_shape, g.shape) != (first.view_shape, first.shape) for g in found[1:]):
        return (f"granularity={granularity!r}: the weight is tied to layers that group it "
                "differently")
    return first
