"""Export a sparsified model to a plain module, and per-layer sparsity reports.

``export_sparse(model, layout)`` deep-copies ``model`` and replaces every sparsified weight by a
plain Parameter holding its deterministic test-time value (masks and gates folded in), removing
the method's state and hooks (:func:`fold`; ``Sparsifier.remove`` does the same in place). A
weight tied to several modules or names stays one Parameter, so the tie survives:

- ``"dense"``: the plain layers; the result's ``state_dict`` has exactly the keys of the plain
  architecture, so it loads with ``strict=True`` into it.
- ``"csr"``: every Linear layer (and Hugging Face's ``Conv1D``, GPT-2's Linear layer with a
  transposed weight) becomes ``CSRLinear`` (weight stored as a torch sparse CSR tensor,
  out_features x in_features, multiplied as ``W_csr @ H`` with ``H`` the activations in
  feature-major layout, in_features x batch). Other layers stay dense. torch has no CPU kernel
  for sparse products in float16/bfloat16: there ``CSRLinear`` multiplies in float32 and
  returns the input's dtype.
- ``"auto"``: per Linear layer, the faster of dense and CSR, *measured* at export: each layer
  whose weight density is at most ``csr_max_density`` (default 0.3, to one weight: a layer
  pruned to 0.3 and rounded to whole weights qualifies; denser layers stay dense untimed) is
  timed both ways on this machine (interleaved rounds, the fastest of each, with
  the threads torch uses now) and becomes CSR only when that is at least ``AUTO_MARGIN`` (10%)
  faster. The inputs: with ``example_inputs`` (a batch as the model will receive it) each
  layer's own input on that forward run, and then the whole network is timed too, the
  per-layer choice against all candidate layers CSR and against dense, keeping dense unless
  another is faster by the margin; without, random inputs of ``auto_batch_size`` rows (default
  1; the rows one call of the layer multiplies: the batch size of an MLP, batch x tokens in a
  Transformer), laid out as the layer will receive them (feature-major after a CSR layer of
  matching width, see below). CSR wins only at low density and enough rows
  (benchmarks/RESULTS.md, "Inference"), so at batch 1 "auto" is usually dense. The choice per
  layer is in the returned module's ``dualdrop_auto_layout`` (``{layer: {"layout", "density",
  "dense_s", "csr_s"}}``, seconds per call).
- ``"compact"`` (with ``example_inputs=``): the dense layers with dead neurons and channels
  removed physically, outputs unchanged (``dualdrop.nn.compact``; needs torch-pruning, the
  ``structured`` extra; Hugging Face BERT-, GPT-2- and Llama-shaped transformers are narrowed
  block by block without it). Its ``state_dict`` fits the narrower shapes only: save it with
  ``save_compact``, reload with ``load_compact``; a Hugging Face model with
  ``dualdrop.nn.save_pretrained`` / ``load_pretrained`` (or its own ``save_pretrained`` where
  its config can say the widths).

``CSRLinear`` takes and returns the usual ``(batch, features)`` tensors, but its output is a
transposed view of a contiguous ``(features, batch)`` result: elementwise layers in between
(ReLU, ...) keep that layout, so the next ``CSRLinear`` receives its feature-major operand without
a copy. Only the first layer pays for one transpose copy of the input; at 1-2% density that copy
costs as much as the sparse products. Inputs already stored feature-major avoid it: keep the
batch as ``H`` (features x batch, contiguous) and call ``model(H.t())`` (a view, no copy); on the
reference machine that measured 4-5x faster than the dense net at 1% density, against ~2.5x
for batch-major input (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from dualdrop.nn._autolayout import choose_csr, layer_inputs, whole_network
from dualdrop.nn._base import check_choice, check_float, check_int, remove_state_hooks, state_of
from dualdrop.nn._graph import check_inputs, first_line
from dualdrop.nn._layers import dense_type, out_in
from dualdrop.nn._save_route import route_save_pretrained
from dualdrop.nn.quantize import check_quantize, quantize_dynamic_int8
from dualdrop.nn.targets import all_targets, default_weight_names

CSR_MAX_DENSITY = 0.3   # layout="auto": denser Linear layers stay dense without being timed
#: dtypes without a CPU kernel for sparse CSR products in torch (CSRLinear computes in float32)
_NO_CPU_SPARSE = (torch.float16, torch.bfloat16)
# layouts built on top of this module: "compact" -> dualdrop.nn.compact.compact, registered by
# that module (imported with dualdrop.nn), which itself starts from export_sparse(..., "dense")
LAYOUT_HOOKS: dict = {}

def _module_path_only(module, args):
    """A no-op forward pre-hook (see ``CSRLinear``)."""
    return None


class CSRLinear(nn.Module):
    """Inference-only linear layer with a sparse CSR weight, computed as ``W_csr @ x^T``.

    torch's Transformer layers have fused inference kernels (``nn.TransformerEncoderLayer``'s
    no-grad fast path) that read ``linear1.weight`` / ``linear2.weight`` directly and have no
    sparse CSR kernels. They are skipped when a submodule carries a forward hook, so a
    ``CSRLinear`` carries a no-op pre-hook: the layer then calls its submodules' forwards, the
    sparse products included. (``export_sparse`` also turns off ``nn.TransformerEncoder``'s
    nested-tensor conversion around CSR layers, which would hand them nested inputs.)
    """

    sparsify_weights = ("weight",)   # counted as a weight by sparsity_report

    def __init__(self, weight_csr: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        if weight_csr.layout != torch.sparse_csr:
            raise TypeError("CSRLinear needs a torch.sparse_csr weight; use "
                            "CSRLinear.from_dense(weight, bias)")
        self.out_features, self.in_features = weight_csr.shape
        self.weight = nn.Parameter(weight_csr, requires_grad=False)
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.register_forward_pre_hook(_module_path_only)

    @classmethod
    def from_dense(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "CSRLinear":
        with warnings.catch_warnings():  # torch flags its (stable enough) CSR support as beta
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            csr = weight.detach().to_sparse_csr()
        return cls(csr, bias)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"CSRLinear expected inputs with {self.in_features} features in the "
                             f"last dimension, got shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        h = x.reshape(-1, self.in_features).t()      # (in, batch): a view, no copy if possible
        weight = self.weight
        if weight.dtype in _NO_CPU_SPARSE and weight.device.type == "cpu":
            # no CPU kernel for these dtypes: multiply in float32, return x's dtype
            out = torch.sparse.mm(weight.float(), h.float()).to(x.dtype)
        else:
            out = torch.sparse.mm(weight, h)           # (out, batch), contiguous
        if self.bias is not None:
            out = out + self.bias[:, None]
        return out.t().reshape(*lead, self.out_features)

    def extra_repr(self):
        nnz = self.weight._nnz()
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"nnz={nnz}, bias={self.bias is not None}")


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


@torch.no_grad()
def fold(model: nn.Module, leave_sparse: bool = True) -> nn.Module:
    """Remove every dualdrop parametrization and hook of ``model`` in place.

    Each original tensor gets its test-time value (``leave_sparse``) or keeps its trained value;
    it stays the same Parameter object, so tied weights stay tied and optimizers still hold
    them. Other parametrizations of the user are left alone."""
    sites, values = [], {}
    for mod in {id(m): m for m in model.modules()}.values():
        if not parametrize.is_parametrized(mod):
            continue
        for name in list(mod.parametrizations.keys()):
            st = state_of(mod, name)
            if st is None:
                continue
            if len(mod.parametrizations[name]) > 1:
                raise ValueError(f"{type(mod).__name__}.{name} has other parametrizations "
                                 "besides dualdrop's; remove them first")
            orig = mod.parametrizations[name].original
            if leave_sparse and id(orig) not in values:
                values[id(orig)] = (orig, st.eval_weight(orig).detach().clone())
            sites.append((mod, name))
    for mod in {id(m): m for m, _ in sites}.values():
        _own_class(mod)
    for mod, name in sites:
        parametrize.remove_parametrizations(mod, name, leave_parametrized=False)
    for orig, value in values.values():
        orig.copy_(value)
    for mod in model.modules():
        remove_state_hooks(mod)
    return route_save_pretrained(model)  # a Hugging Face model's save_pretrained: dualdrop.nn.hf


def _own_class(mod):
    """Give a parametrized module a class of its own before removing a parametrization: a deep
    copy shares the generated class with its source, and removal deletes the property from it."""
    cls = type(mod)
    body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    mod.__class__ = type(cls.__name__, cls.__bases__, body)


def export_sparse(model: nn.Module, layout: str = "auto", *,
                  csr_max_density: float = CSR_MAX_DENSITY, example_inputs=None,
                  auto_batch_size: int | None = None, quantize: str | None = None) -> nn.Module:
    """A plain copy of ``model`` with masks folded in (see module docstring for ``layout``).

    The result is in ``eval()`` mode, has no parametrizations, hooks or extra parameters from
    ``sparsify`` and computes what the sparsified model computes in ``eval()`` mode. ``model``
    is unchanged. ``layout="compact"`` also removes dead units physically (a narrower network,
    not loadable into the original architecture): ``dualdrop.nn.compact.compact(model,
    example_inputs)``, which needs ``example_inputs`` for one traced forward run and the
    optional torch-pruning package. ``layout="auto"`` times dense against CSR per layer, on
    ``example_inputs`` or on ``auto_batch_size`` random rows (default 1), never both.
    ``quantize="dynamic-int8"`` (layouts ``"dense"`` and ``"compact"``): the Linear layers of
    the result become ``Int8DynamicLinear`` (``dualdrop.nn.quantize``), pruned weights still 0.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_choice("layout", layout, {"auto", "dense", "csr", "compact"})
    check_quantize(quantize, layout)
    if layout != "auto" and auto_batch_size is not None:
        raise ValueError(f"auto_batch_size is only used by layout='auto', got layout={layout!r}; "
                         "drop auto_batch_size")
    if layout == "compact":
        small = LAYOUT_HOOKS["compact"](model, example_inputs)
        return quantize_dynamic_int8(small) if quantize else small
    if example_inputs is not None and layout != "auto":
        raise ValueError(f"example_inputs is only used by layout='compact' or 'auto', got "
                         f"layout={layout!r}; drop example_inputs or pass layout='compact'")
    if layout == "auto":
        if example_inputs is not None and auto_batch_size is not None:
            raise ValueError("layout='auto' times the layers on example_inputs or on "
                             "auto_batch_size random rows, not both; drop one of them")
        if example_inputs is not None:
            check_inputs(example_inputs)
        rows = 1 if auto_batch_size is None else check_int("auto_batch_size", auto_batch_size,
                                                            low=1)
    csr_max_density = check_float("csr_max_density", csr_max_density, low=0.0, high=1.0)
    out = fold(copy.deepcopy(model), leave_sparse=True).eval()
    if quantize:
        return quantize_dynamic_int8(out)
    if layout == "dense":
        return out
    layers = [(name, m) for name, m in out.named_modules()
              if dense_type(m) and not _is_tied(out, m.weight)]
    if layout == "csr":
        return _with_csr(out, {name for name, _ in layers})
    # layout == "auto": measured (dualdrop.nn._autolayout)
    inputs = None
    if example_inputs is not None:
        try:
            inputs = layer_inputs(out, [n for n, _ in layers], example_inputs)
        except Exception as exc:
            raise ValueError(f"model(example_inputs) failed ({type(exc).__name__}: "
                             f"{first_line(exc)}); example_inputs must be valid inputs of the "
                             "model (a tuple/list is unpacked as positional arguments)") from None
    chosen, record = choose_csr(layers, lambda m: CSRLinear.from_dense(out_in(m), m.bias),
                                max_density=csr_max_density, batch_rows=rows, inputs=inputs)
    if example_inputs is not None and chosen:
        every = {n for n, r in record.items() if r["csr_s"] is not None}
        candidates = {"dense": out, "per layer": _with_csr(copy.deepcopy(out), chosen)}
        if every != chosen:
            candidates["all CSR"] = _with_csr(copy.deepcopy(out), every)
        best, _ = whole_network(candidates, example_inputs)
        chosen = {"dense": set(), "per layer": chosen, "all CSR": every}[best]
        for n, r in record.items():
            r["layout"] = "csr" if n in chosen else "dense"
    result = _with_csr(out, chosen)
    result.dualdrop_auto_layout = record
    return result


def _with_csr(out: nn.Module, names: set) -> nn.Module:
    """``out`` with its Linear layers ``names`` as ``CSRLinear`` (in place; ``""``: ``out``
    itself, returned as a new module)."""
    if "" in names:
        return CSRLinear.from_dense(out_in(out), out.bias).eval()
    for name in sorted(names):
        m = out.get_submodule(name)
        _set_submodule(out, name, CSRLinear.from_dense(out_in(m), m.bias))
    if names:
        for module in out.modules():
            if isinstance(module, nn.TransformerEncoder) and any(
                    isinstance(m, CSRLinear) for m in module.modules()):
                module.use_nested_tensor = False
    return out.eval()


def _is_tied(model, param):
    return sum(p is param for _, p in model.named_parameters(remove_duplicate=False)) > 1


def linear_density(model: nn.Module) -> float:
    """Fraction of nonzero weights over the dense layers (``nn.Linear``, Hugging Face's
    ``Conv1D``) of ``model`` (1.0 if none); a ``ValueError`` naming the layers whose weights hold
    NaN or infinite values (a NaN is not a zero, and would count as a kept weight)."""
    nnz = tot = 0
    bad = []
    for name, m in model.named_modules():
        if dense_type(m):
            if not bool(torch.isfinite(m.weight).all()):
                bad.append(name)
            nnz += int(torch.count_nonzero(m.weight))
            tot += m.weight.numel()
    if bad:
        raise ValueError(f"the weights of {bad[:5]} hold NaN or infinite values: their density "
                         "is not defined (the model diverged or was loaded wrong)")
    return nnz / tot if tot else 1.0


def _count(t: torch.Tensor) -> tuple[int, int]:
    if t.layout == torch.sparse_csr:
        return int(torch.count_nonzero(t.values())), t.shape[0] * t.shape[1]
    return int(torch.count_nonzero(t)), t.numel()


@torch.no_grad()
def sparsity_report(model: nn.Module) -> list[dict]:
    """One row per model Parameter (a tied one once, with all its names), then two totals.

    Row fields: ``layer`` (the parameter's name; a layer's ``weight`` by the layer's name),
    ``aliases``, ``type`` (owning module types), ``method`` (the sparsifying method, or
    ``"dense"``), ``role`` (``"sparsified"``, ``"weight"``: a weight of a weight-bearing layer
    left dense, ``"other"``: biases, normalization and other parameters), ``shape``, ``nonzero``
    (of the deterministic test-time tensor), ``total``, ``fraction``. Then the row
    ``"all parameters"`` (every parameter of the model, method state excluded) and the last row
    ``"total"``: the sparsified weights, or, in a model with none, the weights of its
    weight-bearing layers (what ``sparsify`` would act on by default). Tied parameters count once.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rows = []
    for t in all_targets(model):
        site = t.sites[0]
        st = state_of(site.module, site.tensor_name)
        value = st.eval_weight(t.param) if st is not None else t.param
        nnz, total = _count(value)
        if st is not None and _gated_extra(site.module, site.tensor_name, st):
            role = "other"
        elif st is not None:
            role = "sparsified"
        elif any(s.default for s in t.sites):
            role = "weight"
        else:
            role = "other"
        rows.append({
            "layer": t.key, "aliases": list(t.aliases), "type": t.kinds,
            "method": st.method if st is not None else "dense", "role": role,
            "shape": tuple(t.param.shape), "nonzero": nnz, "total": total,
            "fraction": nnz / total if total else 0.0,
        })

    def total_row(name, rs, counts):
        nnz = sum(r["nonzero"] for r in rs)
        total = sum(r["total"] for r in rs)
        return {"layer": name, "aliases": [], "type": "", "method": "", "role": counts,
                "shape": (), "nonzero": nnz, "total": total,
                "fraction": nnz / total if total else 0.0}

    all_row = total_row("all parameters", rows, "every parameter (biases, norms included)")
    sparse = [r for r in rows if r["role"] == "sparsified"]
    if sparse:
        tot = total_row("total", sparse, "sparsified weights")
    else:
        tot = total_row("total", [r for r in rows if r["role"] == "weight"],
                        "weights of weight-bearing layers")
    return rows + [all_row, tot]


def _gated_extra(module, name, st) -> bool:
    """Whether ``module.<name>`` only follows the state of the module's weight (a convolution's
    bias gated with its output channel): the same state parametrizes a default weight of it."""
    return name not in default_weight_names(module) and any(
        other != name and state_of(module, other) is st
        for other in module.parametrizations.keys())


def format_report(rows: list[dict]) -> str:
    """Plain-text table of ``sparsity_report`` rows."""
    lines = [f"{'parameter':<28} {'type':<22} {'role':<11} {'shape':<18} {'nonzero':>10} "
             f"{'total':>10} {'fraction':>9}"]
    for r in rows:
        role = r["role"] if r["layer"] not in ("total", "all parameters") else ""
        tied = f"  (tied: {', '.join(r['aliases'])})" if len(r["aliases"]) > 1 else ""
        lines.append(f"{r['layer']:<28} {r['type'][:22]:<22} {role:<11} {str(r['shape']):<18} "
                     f"{r['nonzero']:>10d} {r['total']:>10d} {r['fraction']:>9.4f}{tied}")
    for r in rows[-2:]:
        lines.append(f"  {r['layer']}: {r['role']}")
    return "\n".join(lines)
