"""The layers that are linear maps of their input, and where their weights hold the output units.

Every part of ``dualdrop.nn`` that needs to know a layer's shape conventions asks here: the
default selection of weights (``targets``), the output-unit groups of ``granularity="neuron"``
(``_groups``), the forward hooks of the methods that change a layer's forward (local
reparameterization, neuron gates), the CSR export and the traced graph of the compact export.

- ``nn.Linear``: ``y = x W^T + b``, ``W`` of shape ``(out, in)``; output units are rows.
- Hugging Face's ``transformers.pytorch_utils.Conv1D`` (every projection of GPT-2, GPT, ImageGPT):
  despite its name a Linear layer with the transposed weight, ``y = x W + b``, ``W`` of shape
  ``(in, out)``; output units are *columns*. It is recognized without importing transformers
  (:func:`conv1d_class` looks for the loaded module: a model holding one has imported it).
- ``nn.Conv1d/2d/3d``: kernel ``(out, in/groups, k...)``; output channels are the first dimension.
- ``nn.ConvTranspose1d/2d/3d``: kernel ``(in, out/groups, k...)``; output channels are the second
  dimension within each of the ``groups`` blocks of the first.

"Dense layer" below means ``nn.Linear`` or ``Conv1D``: one matrix, read as ``(out, in)`` by
:func:`out_in`.
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

LINEAR = (nn.Linear,)
CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)

_HF_MODULE = "transformers.pytorch_utils"


def conv1d_class() -> type | None:
    """``transformers.pytorch_utils.Conv1D`` if transformers is loaded, else None (never imports
    it: a model holding such a layer has imported it already)."""
    mod = sys.modules.get(_HF_MODULE)
    cls = getattr(mod, "Conv1D", None) if mod is not None else None
    return cls if isinstance(cls, type) else None


def is_pretrained(model) -> bool:
    """Whether ``model`` is a ``transformers.PreTrainedModel`` (never imports transformers: a
    model that is one has imported it already)."""
    tf = sys.modules.get("transformers")
    cls = getattr(tf, "PreTrainedModel", None) if tf is not None else None
    return isinstance(cls, type) and isinstance(model, cls)


def is_conv1d(module) -> bool:
    """Whether ``module`` is (a subclass of) Hugging Face's ``Conv1D``."""
    cls = conv1d_class()
    return cls is not None and isinstance(module, cls)


def is_dense(module) -> bool:
    """Whether ``module`` is a dense layer: ``nn.Linear`` or ``Conv1D`` (subclasses included)."""
    return isinstance(module, LINEAR) or is_conv1d(module)


def dense_type(module) -> bool:
    """Whether ``module``'s type *is* ``nn.Linear`` or ``Conv1D`` (not a subclass, whose
    forward may differ): the layers the CSR and compact exports rebuild."""
    return type(module) in LINEAR or (conv1d_class() is not None
                                      and type(module) is conv1d_class())


def stored_weight(module) -> torch.Tensor:
    """The module's stored ``weight`` tensor: under a parametrization its original (reading
    ``module.weight`` would run the parametrization, e.g. draw a method's noise)."""
    plist = module.__dict__.get("_modules", {}).get("parametrizations")
    if plist is not None and "weight" in plist:
        return plist["weight"].original
    return module.weight


def out_in(module, weight: torch.Tensor | None = None) -> torch.Tensor:
    """A dense layer's weight (or ``weight``, a tensor of its shape) as ``(out, in)``: a
    transposed view for ``Conv1D``; any other layer's weight as it is (output units first)."""
    w = stored_weight(module) if weight is None else weight
    return w.t() if is_conv1d(module) else w


def n_out(module) -> int:
    """Output units of a dense layer or a convolution."""
    if is_dense(module):
        return out_in(module).shape[0]
    return module.out_channels


def n_in(module) -> int:
    """Input units of a dense layer or a convolution."""
    if is_dense(module):
        return out_in(module).shape[1]
    return module.in_channels


def linear_map_reason(module: nn.Module, parent: nn.Module | None, *, transposed_ok=True):
    """None if the forward of ``module`` is the plain linear map of its weight (so hooks on it see
    every use of the weight); else why not."""
    if isinstance(parent, nn.MultiheadAttention):
        return ("its parent MultiheadAttention reads this weight directly and never calls the "
                "module's forward")
    kinds = LINEAR + CONV + (CONV_T if transposed_ok else ())
    if conv1d_class() is not None:
        kinds += (conv1d_class(),)
    for k in kinds:
        if isinstance(module, k):
            if type(module).forward is not k.forward:
                return (f"{type(module).__name__} overrides {k.__name__}.forward, so the plain "
                        "linear map cannot be assumed")
            return None
    what = ("Linear, transformers Conv1D, Conv1d/2d/3d"
            + (" or ConvTranspose1d/2d/3d" if transposed_ok else ""))
    return f"{type(module).__name__} is not a {what} layer (a linear map of its input is needed)"


def linear_op(module: nn.Module, x, weight, args=(), kwargs=None):
    """The module's linear map of ``x`` with ``weight`` and no bias (``args``/``kwargs``: the
    forward's own arguments, for ConvTranspose's ``output_size``)."""
    if isinstance(module, nn.Linear):
        return F.linear(x, weight)
    if is_conv1d(module):
        return torch.matmul(x, weight)
    if isinstance(module, CONV_T):
        kwargs = kwargs or {}
        output_size = kwargs.get("output_size", args[1] if len(args) > 1 else None)
        nd = len(module.kernel_size)
        out_pad = module._output_padding(x, output_size, module.stride, module.padding,
                                         module.kernel_size, nd, module.dilation)
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
        return fn(x, weight, None, module.stride, module.padding, out_pad, module.groups,
                  module.dilation)
    return module._conv_forward(x, weight, None)
