"""Common machinery of the sparsified layers: the layer mixin, the class swap, argument checks.

How a layer is sparsified (the ``torch.nn.utils.parametrize`` idea, with importable classes):
``sparsify`` changes the class of every selected ``nn.Linear`` / ``nn.Conv2d`` *in place* to a
subclass defined in this package (for example ``VarDropLinear(VarDropMixin, nn.Linear)``) and
registers the method's extra tensors on it. The module object, its ``weight`` and ``bias``
parameters and every reference the user holds stay the same; new learnable tensors are
parameters of the layer (so ``model.parameters()`` sees them), all other state are buffers, and
hyperparameters are plain attributes. Because the classes are defined at module level,
``copy.deepcopy``, ``pickle`` and ``state_dict`` round trips work as for any module.

Every sparsified layer answers the same questions (the mixin's interface):

- ``forward``: stochastic / regularized behaviour in ``train()`` mode, the pruned deterministic
  network in ``eval()`` mode (``eval_weight_bias``);
- ``eval_weight_bias()``: the deterministic test-time weight (masks and gates folded in) and bias;
- ``regularizer_term(n_train, value=True)``: the layer's contribution to
  ``Sparsifier.regularizer`` (``value=False``: only its gradient has to be right);
- ``weight_nonzero()`` / ``weight.numel()``: counts for the density (weights only; biases are
  never pruned or counted).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

# Layer types the package knows how to sparsify, by exact type (subclasses of nn.Linear may carry
# their own forward, which a class swap would silently discard).
SUPPORTED_TYPES = (nn.Linear, nn.Conv2d)

_EXTRA_STATE_VERSION = 1


class SparseLayerMixin:
    """Interface shared by every sparsified layer (mixed in before ``nn.Linear``/``nn.Conv2d``)."""

    #: method name as accepted by ``sparsify`` (set on the instance by ``_setup``)
    sparse_method: str = ""
    #: the plain class this layer was before ``sparsify`` (``nn.Linear`` or ``nn.Conv2d``)
    plain_class: type = nn.Module

    # ---- the operation: F.linear or the conv of the underlying module -------------------------
    def _op(self, x, weight, bias):
        if isinstance(self, nn.Conv2d):
            return self._conv_forward(x, weight, bias)
        return F.linear(x, weight, bias)

    # ---- to be provided by each family -------------------------------------------------------
    def _setup(self, **hp):  # pragma: no cover - abstract
        raise NotImplementedError

    def train_forward(self, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def eval_weight_bias(self):  # pragma: no cover - abstract
        """Deterministic test-time ``(weight, bias)`` with masks/gates folded in."""
        raise NotImplementedError

    def regularizer_term(self, n_train: int, value: bool = True):
        """This layer's term of ``Sparsifier.regularizer``; with ``value=False`` a layer may
        skip work that only the value needs (its gradient must stay exact)."""
        return self.weight.new_zeros(())

    # ---- shared behaviour ---------------------------------------------------------------------
    def forward(self, x):
        if self.training:
            return self.train_forward(x)
        weight, bias = self.eval_weight_bias()
        return self._op(x, weight, bias)

    @torch.no_grad()
    def weight_nonzero(self) -> int:
        """Number of nonzero weights of the deterministic test-time layer (bias excluded)."""
        weight, _ = self.eval_weight_bias()
        return int(torch.count_nonzero(weight))

    def plain_module(self) -> nn.Module:
        """A fresh plain ``nn.Linear``/``nn.Conv2d`` holding the folded test-time weights."""
        with torch.no_grad():
            weight, bias = self.eval_weight_bias()
            if isinstance(self, nn.Conv2d):
                plain = nn.Conv2d(
                    self.in_channels, self.out_channels, self.kernel_size, stride=self.stride,
                    padding=self.padding, dilation=self.dilation, groups=self.groups,
                    bias=self.bias is not None, padding_mode=self.padding_mode,
                    device=weight.device, dtype=weight.dtype)
            else:
                plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                  device=weight.device, dtype=weight.dtype)
            plain.weight.copy_(weight)
            if bias is not None:
                plain.bias.copy_(bias)
        plain.train(self.training)
        return plain

    # state_dict carries the method name so that a checkpoint of one method cannot be loaded
    # silently into a model sparsified with another one (several share parameter names).
    def get_extra_state(self):
        return {"version": _EXTRA_STATE_VERSION, "method": self.sparse_method}

    def set_extra_state(self, state):
        method = state.get("method") if isinstance(state, dict) else None
        if method != self.sparse_method:
            raise ValueError(
                f"state_dict was saved from a layer sparsified with method {method!r} but this "
                f"layer uses {self.sparse_method!r}; call sparsify(model, {method!r}, ...) on the "
                "fresh model before load_state_dict")

    def extra_repr(self):
        base = super().extra_repr()
        return f"{base}, method={self.sparse_method}"


# ---- argument checks: clear errors naming the argument and the fix ----------------------------

def check_float(name, value, *, low=None, high=None, low_open=False, high_open=False):
    """Return ``value`` as float after checking its type and range (no silent coercion)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (value < low or (low_open and value == low)):
        op = ">" if low_open else ">="
        raise ValueError(f"{name} must be {op} {low}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        op = "<" if high_open else "<="
        raise ValueError(f"{name} must be {op} {high}, got {value!r}")
    return value


def check_int(name, value, *, low=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    return value


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)!r}, got {value!r}")
    return value


def iter_sparse_layers(model: nn.Module):
    """Yield ``(qualified_name, layer)`` for every sparsified layer of ``model``."""
    for name, module in model.named_modules():
        if isinstance(module, SparseLayerMixin):
            yield name, module


def select_layers(model: nn.Module, layers=None):
    """Pick the ``nn.Linear``/``nn.Conv2d`` modules to sparsify.

    ``layers=None`` takes every module whose type is exactly ``nn.Linear`` or ``nn.Conv2d``;
    otherwise ``layers`` is an iterable of qualified module names (as in ``named_modules``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if any(True for _ in iter_sparse_layers(model)):
        raise ValueError("model is already sparsified; call sparsify once per model (or export_"
                         "sparse(model) first to get a plain model)")
    named = dict(model.named_modules())
    if layers is None:
        chosen = [(n, m) for n, m in named.items() if type(m) in SUPPORTED_TYPES]
        if not chosen:
            raise ValueError("model has no nn.Linear or nn.Conv2d layer to sparsify")
        return chosen
    if isinstance(layers, str):
        raise TypeError("layers must be an iterable of module names, e.g. ['fc1', 'fc2'], "
                        "not a single string")
    chosen = []
    for n in layers:
        if n not in named:
            raise ValueError(f"layers: no module named {n!r} in the model; names are "
                             f"{[k for k in named if k]!r}")
        if type(named[n]) not in SUPPORTED_TYPES:
            raise TypeError(f"layers: module {n!r} is a {type(named[n]).__name__}; only exact "
                            "nn.Linear and nn.Conv2d modules can be sparsified")
        chosen.append((n, named[n]))
    if not chosen:
        raise ValueError("layers is empty; pass None to sparsify every Linear/Conv2d layer")
    return chosen


def swap_class(layer: nn.Module, linear_cls: type, conv_cls: type | None, method: str, hp: dict):
    """Turn ``layer`` into its sparsified class in place and set it up with ``hp``."""
    plain = type(layer)
    if plain is nn.Conv2d:
        if conv_cls is None:
            raise TypeError(f"method {method!r} does not support nn.Conv2d layers; restrict "
                            "sparsify(..., layers=[...]) to Linear layers")
        new_cls = conv_cls
    else:
        new_cls = linear_cls
    layer.__class__ = new_cls
    layer.sparse_method = method
    layer.plain_class = plain
    try:
        layer._setup(**hp)
    except Exception:
        layer.__class__ = plain
        raise
    return layer
