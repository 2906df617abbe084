"""Export a sparsified model to a plain module, and per-layer sparsity reports.

``export_sparse(model, layout)`` deep-copies ``model`` and replaces every sparsified layer with a
plain layer holding its deterministic test-time weights (masks and gates folded in):

- ``"dense"``: ``nn.Linear`` / ``nn.Conv2d``; the result's ``state_dict`` has exactly the keys of
  the plain architecture, so it loads with ``strict=True`` into it.
- ``"csr"``: every Linear layer becomes ``CSRLinear`` (weight stored as a torch sparse CSR
  tensor, out_features x in_features, multiplied as ``W_csr @ H`` with ``H`` the activations in
  feature-major layout, in_features x batch). Conv2d layers stay dense.
- ``"auto"``: ``"csr"`` when the Linear layers' total density is at most ``csr_max_density``
  (default 0.1; on the 2-core reference machine the CSR export beat dense up to about 10%
  density and lost at 30%, see benchmarks/RESULTS.md), else ``"dense"``. One layout for all
  Linear layers: mixing them makes a dense layer receive the feature-major view of a CSR layer's
  output, which measured slower than either pure layout.

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

from dualdrop.nn._base import SUPPORTED_TYPES, SparseLayerMixin, check_choice, check_float

CSR_MAX_DENSITY = 0.1


class CSRLinear(nn.Module):
    """Inference-only linear layer with a sparse CSR weight, computed as ``W_csr @ x^T``."""

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
        out = torch.sparse.mm(self.weight, h)          # (out, batch), contiguous
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


def export_sparse(model: nn.Module, layout: str = "auto", *,
                  csr_max_density: float = CSR_MAX_DENSITY) -> nn.Module:
    """A plain copy of ``model`` with masks folded in (see module docstring for ``layout``).

    The result is in ``eval()`` mode, has no hooks or extra parameters from ``sparsify`` and
    computes what the sparsified model computes in ``eval()`` mode. ``model`` is unchanged.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_choice("layout", layout, {"auto", "dense", "csr"})
    csr_max_density = check_float("csr_max_density", csr_max_density, low=0.0, high=1.0)
    sparse_layers = [n for n, m in model.named_modules() if isinstance(m, SparseLayerMixin)]
    if "" in sparse_layers:  # the model itself is a single sparsified layer
        out = model.plain_module()
        return _maybe_csr(out, layout, csr_max_density).eval()
    out = copy.deepcopy(model)
    for name in sparse_layers:
        layer = out.get_submodule(name)
        _set_submodule(out, name, layer.plain_module())
    if layout == "auto":
        layout = "csr" if _linear_density(out) <= csr_max_density else "dense"
    if layout == "csr":
        for name, module in list(out.named_modules()):
            if type(module) is nn.Linear and name:
                _set_submodule(out, name, CSRLinear.from_dense(module.weight, module.bias))
    return out.eval()


def _linear_density(model):
    nnz = tot = 0
    for m in model.modules():
        if type(m) is nn.Linear:
            nnz += int(torch.count_nonzero(m.weight))
            tot += m.weight.numel()
    return nnz / tot if tot else 1.0


def _maybe_csr(module, layout, csr_max_density):
    if type(module) is not nn.Linear or layout == "dense":
        return module
    if layout == "csr" or _linear_density(module) <= csr_max_density:
        return CSRLinear.from_dense(module.weight, module.bias)
    return module


@torch.no_grad()
def _weight_counts(module):
    if isinstance(module, SparseLayerMixin):
        return module.weight_nonzero(), module.weight.numel()
    w = module.weight
    if w.layout == torch.sparse_csr:
        vals = w.values()
        return int(torch.count_nonzero(vals)), w.shape[0] * w.shape[1]
    return int(torch.count_nonzero(w)), w.numel()


def sparsity_report(model: nn.Module) -> list[dict]:
    """Per-layer rows ``{layer, type, method, shape, nonzero, total, fraction}`` plus a "total" row.

    Covers sparsified layers (counting the deterministic test-time weights), plain ``nn.Linear`` /
    ``nn.Conv2d`` layers and ``CSRLinear``; weights only, biases are not counted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rows = []
    for name, module in model.named_modules():
        known = isinstance(module, (SparseLayerMixin, CSRLinear))
        if not (known or type(module) in SUPPORTED_TYPES):
            continue
        nnz, total = _weight_counts(module)
        rows.append({
            "layer": name or "(model)",
            "type": type(module).__name__,
            "method": getattr(module, "sparse_method", None) or "dense",
            "shape": tuple(module.weight.shape),
            "nonzero": nnz,
            "total": total,
            "fraction": nnz / total if total else 0.0,
        })
    nnz = sum(r["nonzero"] for r in rows)
    total = sum(r["total"] for r in rows)
    rows.append({"layer": "total", "type": "", "method": "", "shape": (), "nonzero": nnz,
                 "total": total, "fraction": nnz / total if total else 0.0})
    return rows


def format_report(rows: list[dict]) -> str:
    """Plain-text table of ``sparsity_report`` rows."""
    lines = [f"{'layer':<20} {'type':<26} {'shape':<18} {'nonzero':>10} {'total':>10} "
             f"{'fraction':>9}"]
    for r in rows:
        lines.append(f"{r['layer']:<20} {r['type']:<26} {str(r['shape']):<18} "
                     f"{r['nonzero']:>10d} {r['total']:>10d} {r['fraction']:>9.4f}")
    return "\n".join(lines)
