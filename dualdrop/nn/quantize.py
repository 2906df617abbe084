"""Dynamic int8 on top of sparsity: ``quantize_dynamic_int8`` and ``Int8DynamicLinear``.

Dynamic quantization (Jacob et al., "Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference", CVPR 2018, in its dynamic form) stores a Linear layer's weight
in int8 and quantizes its input at run time, so that the product runs in 8-bit integers with
32-bit accumulation. Here both are *symmetric*, which keeps pruning exact:

- weight, per output unit ``o``: ``s_o = max_i |W_oi| / 127``, ``Q_oi = round(W_oi / s_o)``. A
  pruned weight ``W_oi = 0`` stays ``Q_oi = 0`` (no zero point to shift it), and a dead unit
  (a zero row) stays a zero row. A nonzero weight below ``s_o / 2`` also rounds to 0: the
  export reports how many (``int8_report``);
- input, per row ``r`` (a sample, or a token): ``t_r = max_i |x_ri| / 127``, ``q_ri =
  round(x_ri / t_r)``;
- output: ``y_ro = t_r s_o sum_i q_ri Q_oi + b_o``, the integer sum exact in int32
  (``torch._int_mm``, the int8 matrix product torchao's int8 paths call), the rescale and bias
  in float.

The relative error of one product is about ``1/254`` of the row's and the unit's largest
magnitudes; a classifier's accuracy moves by a few hundredths of a point (benchmarks/RESULTS.md,
"Inference"). Only Linear layers are quantized (as in ``torch.ao``'s dynamic quantization):
convolutions, attention products, normalizations and the packed input projection of
``nn.MultiheadAttention`` stay in float and are named in a warning. The compact export's
``HeadPrunedAttention`` has separate q/k/v Linear layers, which are quantized.

Why our own module: in torch 2.13 ``torch.ao.quantization.quantize_dynamic`` warns that it is
deprecated (with the quantized tensors it builds on); torchao's ``quantize_`` with
``Int8DynamicActivationInt8WeightConfig`` is the maintained path but ran slower than float on the
CPU in eager mode (reference machine, LeNet-300-100 at batch 128: 1.3x slower). This module is
plain tensors (an int8 ``weight`` buffer, a float ``weight_scale``, a float ``bias``), so its
``state_dict`` loads with ``torch.load(weights_only=True)``, and ``torch._int_mm`` (int8 x int8
-> int32, any shape on the CPU) does the product.
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from dualdrop.nn._layers import dense_type, out_in
from dualdrop.nn._save_route import route_save_pretrained

QUANTIZE = ("dynamic-int8",)
_QMAX = 127.0


def check_quantize(quantize, layout: str | None = None) -> str | None:
    """``quantize`` if it is None or a known scheme for ``layout`` (dense or compact exports)."""
    if quantize is None:
        return None
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be None or one of {list(QUANTIZE)}, got {quantize!r}")
    if layout is not None and layout not in ("dense", "compact"):
        raise ValueError(f"quantize={quantize!r} applies to the dense or compact export, got "
                         f"layout={layout!r}; pass layout='dense' or layout='compact'")
    return quantize


def _plain_path(module, args):
    """No-op forward pre-hook: with it ``nn.TransformerEncoderLayer`` takes its plain path,
    which calls this layer's forward (its fused kernel reads float ``linear1.weight`` directly)."""
    return None


class Int8DynamicLinear(nn.Module):
    """Inference-only Linear layer with an int8 weight and inputs quantized per row at run time
    (module docstring): ``y = t s^T * (q(x) Q^T) + b``. Built by :meth:`from_linear`; takes and
    returns the usual ``(..., features)`` float tensors."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None):
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise TypeError("Int8DynamicLinear needs a 2-D int8 weight; build it with "
                            "Int8DynamicLinear.from_linear(linear)")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("weight_scale", weight_scale.reshape(-1).contiguous())
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.register_forward_pre_hook(_plain_path)
        self._prepare()

    def _prepare(self):
        """Per-call constants: the transposed int8 view, a zero bias."""
        self._weight_t = self.weight.t()
        self._bias0 = torch.zeros(self.out_features, dtype=torch.float32,
                                  device=self.weight.device)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._prepare()

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._prepare()
        return out

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Module) -> "Int8DynamicLinear":
        """From an ``nn.Linear`` (or Hugging Face's ``Conv1D``, its weight transposed)."""
        w = out_in(linear).detach().float()
        bad = _non_finite(linear)
        if bad:
            raise ValueError(f"Int8DynamicLinear.from_linear: the layer's {bad} (NaN or inf): "
                             "int8 has no such value, its outputs would look finite; fix the "
                             "weights first")
        scale = w.abs().amax(1) / _QMAX
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a dead unit: Q = 0
        q = torch.round(w / scale[:, None]).clamp_(-_QMAX, _QMAX).to(torch.int8)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        new = cls(q, scale, bias)
        new.rounded_to_zero = int(torch.count_nonzero(w)) - int(torch.count_nonzero(q))
        return new

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Int8DynamicLinear expected inputs with {self.in_features} features "
                             f"in the last dimension, got shape {tuple(x.shape)}")
        lead, dtype = x.shape[:-1], x.dtype
        rows = x.reshape(-1, self.in_features)
        if dtype != torch.float32:
            rows = rows.float()
        # as few tensor operations as the formula allows: at small sizes each costs more than
        # its arithmetic (an all-zero row: any t > 0, its q is 0)
        t = rows.abs().amax(1, keepdim=True).clamp_min_(1e-30).mul_(1.0 / _QMAX)
        q = rows.div(t).round_().to(torch.int8)
        acc = torch._int_mm(q, self._weight_t)            # exact int32 sums
        y = torch.addcmul(self._bias0 if self.bias is None else self.bias, acc,
                          t * self.weight_scale)
        return y.reshape(*lead, self.out_features) if dtype == torch.float32 else \
            y.reshape(*lead, self.out_features).to(dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight this layer multiplies by (``Q s``)."""
        return self.weight.float() * self.weight_scale[:, None]

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"nnz={int(torch.count_nonzero(self.weight))}, bias={self.bias is not None}")


def _non_finite(layer: nn.Module) -> str:
    """``"weight has 3 non-finite values"`` (and the bias's), or ``""``."""
    parts = []
    for pname in ("weight", "bias"):
        t = getattr(layer, pname, None)
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            k = int((~torch.isfinite(t)).sum())
            if k:
                parts.append(f"{pname} has {k} non-finite value{'s' if k > 1 else ''}")
    return " and ".join(parts)


def check_finite_weights(model: nn.Module) -> None:
    """ValueError naming the Linear layers whose weight or bias holds NaN or inf: int8 has no
    such value, so a quantized layer would return finite outputs for a broken one."""
    bad = {name: why for name, m in model.named_modules() if dense_type(m)
           and (why := _non_finite(m))}
    if bad:
        shown = "; ".join(f"{name or 'model'}: {why}" for name, why in list(bad.items())[:4])
        raise ValueError(f"model has non-finite weights (NaN or inf), which int8 cannot hold (its "
                         f"outputs would look finite): {shown}{' ...' if len(bad) > 4 else ''}; "
                         "fix or retrain those layers first")


def _set(root, name, new):
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, new)


@torch.no_grad()
def quantize_dynamic_int8(model: nn.Module, *, inplace: bool = False) -> nn.Module:
    """``model`` with every (untied) ``nn.Linear`` (and Hugging Face ``Conv1D``) as
    :class:`Int8DynamicLinear`, in eval mode.

    ``model``: a plain network (e.g. ``export_sparse(model, "dense")`` or the compact export;
    ``export_sparse(..., quantize="dynamic-int8")`` calls this). A copy unless ``inplace``.
    Layers left in float (convolutions, ``nn.MultiheadAttention``'s packed projections, tied or
    CSR layers) are named in one ``UserWarning``; ``int8_report(model)`` lists what changed.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not hasattr(torch, "_int_mm"):
        raise RuntimeError("quantize='dynamic-int8' needs torch._int_mm (torch >= 2.3); "
                           "upgrade torch")
    if any(parametrize.is_parametrized(m) for m in model.modules()):
        raise ValueError("model is still sparsified (it has parametrizations); quantize its "
                         'export: export_sparse(model, "dense", quantize="dynamic-int8")')
    check_finite_weights(model)
    out = model if inplace else copy.deepcopy(model)
    counts = {}
    for _, p in out.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    convert, left = [], []
    for name, m in out.named_modules():
        if dense_type(m) and counts.get(id(m.weight), 0) == 1:
            convert.append((name, m))
        elif not isinstance(m, Int8DynamicLinear):
            big = [p for p, t in m.named_parameters(recurse=False) if t.dim() >= 2]
            if big:
                left.append(name or ", ".join(big))
    for name, m in convert:
        new = Int8DynamicLinear.from_linear(m)
        if name == "":
            return new.eval()
        _set(out, name, new)
    for module in out.modules():
        if isinstance(module, nn.TransformerEncoder):
            module.use_nested_tensor = False  # an int8 layer does not take nested inputs
    if left:
        warnings.warn(f"dynamic int8 quantizes Linear layers only; left in float: "
                      f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''}", UserWarning,
                      stacklevel=2)
    return route_save_pretrained(out.eval())  # transformers cannot load int8: dualdrop.nn.hf


@torch.no_grad()
def int8_report(model: nn.Module) -> dict:
    """``{layer: {"nonzero", "total", "rounded_to_zero"}}`` for every ``Int8DynamicLinear`` of a
    quantized model: nonzero int8 weights, all weights, and the nonzero float weights that fell
    below half their unit's step at quantization (None for a layer rebuilt from a state_dict).
    Pruned weights are 0 in both."""
    return {name: {"nonzero": int(torch.count_nonzero(m.weight)), "total": m.weight.numel(),
                   "rounded_to_zero": getattr(m, "rounded_to_zero", None)}
            for name, m in model.named_modules() if isinstance(m, Int8DynamicLinear)}
