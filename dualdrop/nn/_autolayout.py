"""``export_sparse(..., layout="auto")``: dense or CSR per layer, by timing both at export.

Whether a sparse product beats a dense one depends on the density, the layer's shape, the
number of rows multiplied at once and the machine (its BLAS, its sparse kernels, its load): on
the reference machine CSR won at 2-5% density from 32 rows on and lost at one row
(benchmarks/RESULTS.md, "Inference"). No fixed density rule is right everywhere, so the choice is
measured where the model will run:

1. every candidate layer (weight density at most ``max_density``, to one weight: a budget
   rounded to whole weights is not above it) is timed dense and CSR on the
   input it will get (``dualdrop.nn._timing``: interleaved rounds; each candidate's fastest
   round, since a neighbour's load only ever adds time, and on a loaded machine more than half
   the rounds can carry some), and becomes CSR only when that is faster by the ``margin`` (a
   fraction of the dense time), so that a tie does not turn into a slower layer;
2. with ``example_inputs`` the whole network is timed as well: the per-layer choice against
   every candidate CSR and against all dense. A CSR layer hands the next one a feature-major
   view (``CSRLinear``), which a following CSR layer reads without a copy, so a chain of CSR
   layers can win where each alone ties; the network keeps dense unless another choice is
   faster by the margin.

Without ``example_inputs`` a layer's input is random, ``batch_rows`` rows, feature-major when the
previous candidate in module order was chosen CSR and produces its width (the order a sequential
network calls them in), else batch-major.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from dualdrop.nn._graph import call
from dualdrop.nn._timing import interleaved

AUTO_MARGIN = 0.1
_ROUNDS, _MIN_TIME = 9, 5e-4


def _density(w: torch.Tensor) -> float:
    return int(torch.count_nonzero(w)) / w.numel() if w.numel() else 1.0


def above(w: torch.Tensor, max_density: float) -> bool:
    """Whether ``w`` keeps more than ``max_density`` of its weights by more than one weight: a
    budget of ``max_density`` rounded to whole weights (a 384 x 384 layer at 0.3 keeps 44,237
    of 147,456, 0.3000014) is not above it."""
    return int(torch.count_nonzero(w)) > max_density * w.numel() + 1


def _fastest(fns: dict) -> dict:
    """Seconds per call of each candidate: its fastest of the interleaved rounds."""
    return {k: min(v) for k, v in interleaved(
        fns, rounds=_ROUNDS, warmup=2, min_time=_MIN_TIME).items()}


@torch.no_grad()
def choose_csr(layers: list[tuple[str, nn.Module]], make_csr: Callable[[nn.Module], nn.Module],
               *, max_density: float, batch_rows: int, inputs: dict | None = None,
               margin: float = AUTO_MARGIN) -> tuple[set, dict]:
    """``(csr_names, record)``: the layers of ``layers`` (``(name, module)`` in module order)
    that are faster as ``make_csr(module)``, timed on ``inputs[name]`` (a layer's input tensor)
    or on random ``batch_rows``-row inputs; ``record[name] = {"layout", "density", "dense_s",
    "csr_s"}`` (seconds per call; none for a layer above ``max_density``, left dense untimed)."""
    chosen, record = set(), {}
    prev_out = None  # output width of the previous layer when it went CSR
    for name, m in layers:
        w = m.weight
        dens = _density(w)
        if above(w, max_density):
            record[name] = {"layout": "dense", "density": dens, "dense_s": None, "csr_s": None}
            prev_out = None
            continue
        csr = make_csr(m)
        if inputs is not None and name in inputs:
            x = inputs[name]
        else:
            x = torch.randn(batch_rows, csr.in_features, dtype=w.dtype, device=w.device)
            if prev_out == csr.in_features:  # the feature-major view a CSR layer hands on
                x = x.t().contiguous().t()
        t = _fastest({"dense": lambda: m(x), "csr": lambda: csr(x)})
        layout = "csr" if t["csr"] < (1.0 - margin) * t["dense"] else "dense"
        record[name] = {"layout": layout, "density": dens, "dense_s": t["dense"],
                        "csr_s": t["csr"]}
        if layout == "csr":
            chosen.add(name)
        prev_out = csr.out_features if layout == "csr" else None
    return chosen, record


@torch.no_grad()
def layer_inputs(model: nn.Module, names: list[str], example_inputs) -> dict:
    """``{name: tensor}``: the input of each named submodule on one forward run (its first call)."""
    seen, hooks = {}, []
    for name in names:
        def grab(mod, args, name=name):
            if name not in seen and args and isinstance(args[0], torch.Tensor):
                seen[name] = args[0].detach()
        hooks.append(model.get_submodule(name).register_forward_pre_hook(grab))
    try:
        call(model, example_inputs)
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def whole_network(candidates: dict[str, nn.Module], example_inputs,
                  margin: float = AUTO_MARGIN) -> tuple[str, dict]:
    """``(name, seconds)``: the fastest of ``candidates`` (``"dense"`` among them) on
    ``example_inputs``; dense unless another is faster by ``margin``."""
    t = _fastest({k: (lambda net=net: call(net, example_inputs)) for k, net in candidates.items()})
    best = min(t, key=t.get)
    if best != "dense" and t[best] >= (1.0 - margin) * t["dense"]:
        best = "dense"
    return best, t
