"""How fast is the pruned network? ``latency(model, example_inputs)``: every export, timed fairly.

A pruned network is only faster if some layout turns its zeros into skipped work. This report
builds each layout of the same test-time network, checks that they compute the same outputs on
the same inputs, and times them at several batch sizes on a fixed number of threads, beside
what each layout *could* give:

=========================  ==================================================================
layout                     what runs
=========================  ==================================================================
``dense``                  the plain layers, pruned weights stored as zeros (the reference)
``csr``                    every Linear layer as ``CSRLinear`` (sparse CSR products)
``auto``                   per Linear layer the faster of dense and CSR, timed at export on
                           this batch (``export_sparse(..., "auto", example_inputs=batch)``)
``compact``                dead units and heads removed (``dualdrop.nn.compact``; needs
                           torch-pruning, the ``structured`` extra)
``dense-int8``,            the Linear layers in dynamic int8 (``dualdrop.nn.quantize``); outputs
``compact-int8``           differ by the quantization, reported as ``max_abs_diff``
``onnxruntime``,           the ONNX export (``dualdrop.nn.export_onnx``) run by onnxruntime with
``onnxruntime-compact``,   the same number of threads (the ``onnx`` extra)
``onnxruntime-compact-int8``
=========================  ==================================================================

**Fair timing** (``dualdrop.nn._timing``): warm-up calls, then rounds in which every layout is
timed once (order rotating), each figure the median over rounds with its quartiles; a layout's
repeat count per round is calibrated so that a measurement lasts at least ``min_time`` (1 ms:
short measurements are seldom interrupted by a neighbour's time slice on a loaded machine). Every
layout gets the same inputs: the rows of ``example_inputs`` cycled to each batch size. Before
any timing each float layout's outputs must equal the dense ones (to ``1e-5`` of the output
scale; ``RuntimeError`` otherwise), so a faster layout is never a wrong one.

**Costs beside the times**, per layout and batch size: ``params`` (weights and biases stored,
zeros included; the int8 weights counted too), ``nonzero``, ``bytes`` (the serialized size on
disk: ``torch.save`` of the state_dict, or the ONNX file), ``flops`` (2 x the multiply-adds the
layout's products execute: matrix products, convolutions, attention; elementwise work is not
counted; a CSR product counts its stored nonzeros), ``flops_nonzero`` (the same products
counting only nonzero weights: what any layout of this sparsity must at least do), and
``flop_ratio`` = dense ``flops`` / the layout's ``flops``, the ideal speed-up its products allow.
``speedup`` = dense median / the layout's median; a layout far below its ``flop_ratio`` is bound
by something else (memory, per-call overhead, kernel quality). With ``eval_data=(X, y)`` each
layout's classification error on it is reported too (``error``), so int8 is judged beside float.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import os
import platform
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm.auto import tqdm

from dualdrop.nn._base import check_choice, check_int
from dualdrop.nn._inputs import check_forward, check_model, check_rows
from dualdrop.nn._graph import (batch_of, call, check_inputs, first_line, output_diff,
                                tensors, torch_pruning)
from dualdrop.nn._timing import CLOCKS, interleaved, summary, torch_threads
from dualdrop.nn.export import export_sparse
from dualdrop.nn.onnx import OnnxModel, export_onnx, onnxruntime_available
from dualdrop.nn.quantize import quantize_dynamic_int8

LAYOUTS = ("dense", "csr", "auto", "compact", "dense-int8", "compact-int8", "onnxruntime",
           "onnxruntime-compact", "onnxruntime-compact-int8")
#: ``layouts=None``: every layout (those whose packages are missing are left out with a note)
DEFAULT_LAYOUTS = LAYOUTS
CHECK_ATOL = 1e-5
_ORT = {"onnxruntime": ("dense", None), "onnxruntime-compact": ("compact", None),
        "onnxruntime-compact-int8": ("compact", "dynamic-int8")}


def _needs_compact(layout: str) -> bool:
    return "compact" in layout


def _torch_pruning_available() -> bool:
    return importlib.util.find_spec("torch_pruning") is not None


# ---------------------------------------------------------------------------------- FLOPs

_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "_int_mm", "_sparse_addmm", "_sparse_mm"}


def _op_flops(name: str, args, out) -> int:
    """2 x the multiply-adds of one aten op (0 for ops that are not products)."""
    if name in _MATMUL:
        a, b = (args[1], args[2]) if "addmm" in name or name == "baddbmm" else args[:2]
        if a.layout == torch.sparse_csr:
            return 2 * a._nnz() * b.shape[-1]
        if b.layout == torch.sparse_csr:
            return 2 * b._nnz() * a.shape[0]
        batch = a.shape[0] if a.dim() == 3 else 1
        return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
    if name in ("convolution", "_convolution"):  # a weight (C_out, C_in / groups, *kernel)
        w = args[1]
        return 2 * out.numel() * math.prod(w.shape[1:])
    if name.startswith("_scaled_dot_product") and not name.endswith("backward"):
        q, k, v = args[:3]
        return 2 * q.shape[:-1].numel() * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return 0


class _CountFlops(TorchDispatchMode):
    """Sums :func:`_op_flops` over a forward run, and the same weighted by the density of the
    weight operand (a tensor sharing storage with a parameter or buffer of the model)."""

    def __init__(self, densities: dict):
        super().__init__()
        self.densities, self.flops, self.nonzero = densities, 0, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        n = _op_flops(name, args, out)
        if n:
            dens = [self.densities.get(_storage(a)) for a in args
                    if isinstance(a, torch.Tensor) and a.dim() >= 2]
            known = [d for d in dens if d is not None]
            self.flops += n
            self.nonzero += n * (min(known) if known else 1.0)
        return out


def _storage(t: torch.Tensor):
    if t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _densities(net) -> dict:
    out = {}
    for t in list(net.parameters()) + list(net.buffers()):
        if t.layout == torch.strided and t.dim() >= 2 and t.numel():
            out[_storage(t)] = int(torch.count_nonzero(t)) / t.numel()
    return out


@torch.no_grad()
def count_flops(net: nn.Module, inputs) -> tuple[int, float]:
    """``(flops, flops_nonzero)`` of one forward run of ``net`` on ``inputs`` (module
    docstring: products only; a CSR product counts its nonzeros)."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # its fused kernels hide their products
    hooks = [m.register_forward_pre_hook(lambda *a: None) for m in net.modules()]
    try:
        mode = _CountFlops(_densities(net))
        with mode:
            call(net, inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(before)
        for h in hooks:
            h.remove()
    return mode.flops, mode.nonzero


# ---------------------------------------------------------------------------------- sizes

def _weights(net) -> list[torch.Tensor]:
    """Parameters and the int8 weight buffers of a network (running statistics left out)."""
    return list(net.parameters()) + [b for b in net.buffers() if b.dtype == torch.int8]


def _counts(net) -> tuple[int, int]:
    params = nnz = 0
    for t in _weights(net):
        if t.layout == torch.sparse_csr:
            params += t.shape[0] * t.shape[1]
            nnz += int(torch.count_nonzero(t.values()))
        else:
            params += t.numel()
            nnz += int(torch.count_nonzero(t))
    return params, nnz


def _disk_bytes(net) -> int:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        torch.save(net.state_dict(), buf)
    return buf.getbuffer().nbytes


@torch.no_grad()
def _error(fn, X, y, chunk: int = 1000) -> float:
    wrong = 0
    for i in range(0, len(y), chunk):
        out = tensors(fn(X[i:i + chunk]))[0]
        wrong += int((out.argmax(-1) != y[i:i + chunk]).sum())
    return wrong / len(y)


# ---------------------------------------------------------------------------------- the report

@dataclass
class LatencyReport:
    """The rows of :func:`latency` (one per layout and batch size) and how they were taken.

    ``rows[i]``: ``layout, batch, median_s, q1_s, q3_s, min_s, rounds, speedup`` (dense median /
    this median), ``speedup_min`` (the same of the fastest rounds), ``flops, flops_nonzero,
    flop_ratio, params, nonzero, bytes, max_abs_diff, error, note``.
    ``table()`` prints them; ``to_json``, ``to_csv``, ``figure`` write them."""

    rows: list[dict]
    meta: dict = field(default_factory=dict)

    def row(self, layout: str, batch: int) -> dict:
        for r in self.rows:
            if r["layout"] == layout and r["batch"] == batch:
                return r
        raise KeyError(f"no row for layout={layout!r}, batch={batch}")

    def table(self) -> str:
        """A plain-text table (times in microseconds, spread: the quartiles)."""
        has_err = any(r["error"] is not None for r in self.rows)
        head = (f"{'layout':<25} {'batch':>5} {'median us':>10} {'q1-q3 us':>15} {'min us':>8} "
                f"{'speed-up':>8} {'ideal':>6} {'MFLOPs':>8} {'params':>9} {'nonzero':>9} "
                f"{'KB':>7}" + (f" {'error':>7}" if has_err else ""))
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lines.append(
                f"{r['layout']:<25} {r['batch']:>5} {1e6 * r['median_s']:>10.1f} "
                f"{1e6 * r['q1_s']:>7.1f}-{1e6 * r['q3_s']:<7.1f} {1e6 * r['min_s']:>8.1f} "
                f"{r['speedup']:>7.2f}x "
                f"{r['flop_ratio']:>5.2f}x {r['flops'] / 1e6:>8.3f} {r['params']:>9,d} "
                f"{r['nonzero']:>9,d} {r['bytes'] / 1024:>7.1f}"
                + (f" {100 * r['error']:>6.2f}%" if has_err else ""))
        m = self.meta
        lines.append(f"{m.get('threads')} thread(s), {m.get('rounds')} interleaved rounds, "
                     f"medians of {m.get('clock', 'wall')} time; load average "
                     f"{m.get('load_before')} -> {m.get('load_after')} on {m.get('cpus')} CPUs")
        for n in m.get("notes", []):
            lines.append(f"note: {n}")
        return "\n".join(lines)

    def __str__(self):
        return self.table()

    def to_json(self, path) -> None:
        Path(path).write_text(json.dumps({"meta": self.meta, "rows": self.rows}, indent=1))

    def to_csv(self, path) -> None:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            w.writeheader()
            w.writerows(self.rows)

    def figure(self, path) -> None:
        """Bars: speed-up over dense per layout, one group per batch size (whiskers: the
        quartiles), and each layout's ideal speed-up (FLOP ratio) as a black tick."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        layouts = list(dict.fromkeys(r["layout"] for r in self.rows))
        batches = list(dict.fromkeys(r["batch"] for r in self.rows))
        fig, ax = plt.subplots(figsize=(min(12.0, 3.0 + 0.3 * len(batches) * len(layouts)), 4))
        width = 0.8 / len(layouts)
        for i, lay in enumerate(layouts):
            xs, ys, lo, hi, ideal = [], [], [], [], []
            for j, b in enumerate(batches):
                r = self.row(lay, b)
                d = self.row("dense", b)["median_s"]
                xs.append(j + (i - (len(layouts) - 1) / 2) * width)
                ys.append(r["speedup"])
                lo.append(r["speedup"] - d / r["q3_s"])
                hi.append(d / r["q1_s"] - r["speedup"])
                ideal.append(r["flop_ratio"])
            ax.bar(xs, ys, width, label=lay, yerr=[lo, hi], capsize=2)
            ax.scatter(xs, ideal, marker="_", s=120, color="k", zorder=3,
                       label="ideal (FLOP ratio)" if i == 0 else None)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(batches)))
        ax.set_xticklabels([f"batch {b}" for b in batches])
        ax.set_ylabel("speed-up over dense (median)")
        ax.set_yscale("log")
        ax.set_title(f"{self.meta.get('threads')} thread(s), {self.meta.get('rounds')} "
                     f"interleaved rounds, medians of {self.meta.get('clock', 'wall')} time",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(path, dpi=150)
        plt.close(fig)

    def save(self, out_dir) -> dict:
        """``latency.json``, ``latency.csv``, ``latency.png`` in ``out_dir``; their paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "latency.json", "csv": out / "latency.csv",
                 "figure": out / "latency.png"}
        self.to_json(paths["json"])
        self.to_csv(paths["csv"])
        self.figure(paths["figure"])
        return paths


def _check_layouts(layouts) -> tuple[list[str], list[str]]:
    """``(layouts to build, notes on the default ones left out)``."""
    notes = []
    if layouts is None:
        chosen = list(DEFAULT_LAYOUTS)
        if not _torch_pruning_available():
            notes.append('compact layouts left out: torch-pruning is not installed '
                         '(pip install "dualdrop[structured]")')
            chosen = [x for x in chosen if not _needs_compact(x)]
        if not onnxruntime_available():
            notes.append('onnxruntime rows left out: onnxruntime is not installed '
                         '(pip install "dualdrop[onnx]")')
            chosen = [x for x in chosen if x not in _ORT]
        return chosen, notes
    if isinstance(layouts, str) or not isinstance(layouts, (tuple, list)):
        raise TypeError(f"layouts must be a tuple/list of layout names, got {layouts!r}")
    bad = [x for x in layouts if x not in LAYOUTS]
    if bad or not layouts or len(set(layouts)) != len(layouts):
        raise ValueError(f"layouts must be distinct names among {list(LAYOUTS)}, got "
                         f"{list(layouts)!r}")
    chosen = ["dense"] + [x for x in layouts if x != "dense"]  # dense: the reference
    return chosen, notes


def _check_batches(batch_sizes) -> list[int]:
    if isinstance(batch_sizes, int) and not isinstance(batch_sizes, bool):
        batch_sizes = (batch_sizes,)
    if not isinstance(batch_sizes, (tuple, list)) or not batch_sizes:
        raise TypeError(f"batch_sizes must be a tuple/list of integers >= 1, got "
                        f"{batch_sizes!r}")
    out = [check_int("batch_sizes", b, low=1) for b in batch_sizes]
    if len(set(out)) != len(out):
        raise ValueError(f"batch_sizes must be distinct, got {list(batch_sizes)!r}")
    return out


@torch.no_grad()
def latency(model: nn.Module, example_inputs, layouts=None, batch_sizes=(1, 32, 128),
            threads: int | None = 1, *, rounds: int = 15, warmup: int = 3,
            min_time: float = 1e-3, clock: str = "wall", eval_data=None,
            progress: bool = True) -> LatencyReport:
    """Time the test-time network of ``model`` in every layout (module docstring).

    ``model``: a sparsified or plain ``nn.Module`` (unchanged). ``example_inputs``: one batch
    of real inputs (tensor, tuple/list: positional, dict: keywords; dim 0 the batch), cycled to
    each of ``batch_sizes``; also the compact export's trace. ``layouts``: names from
    ``LAYOUTS`` (default: all whose packages are installed; ``"dense"`` is always timed, as the
    reference). ``threads``: torch's (and onnxruntime's) intra-op threads while timing (None:
    leave torch's setting). ``rounds``, ``warmup``, ``min_time``: the timing (module
    docstring). ``clock``: ``"wall"`` (default) or ``"cpu"``, the process's CPU time, which a
    machine loaded beyond its cores does not inflate (``dualdrop.nn._timing``). ``eval_data``: ``(X, y)`` tensors, classification error per layout.
    ``progress``: a progress bar. Returns a :class:`LatencyReport`.
    """
    check_model(model)
    check_inputs(example_inputs)
    check_rows(example_inputs, "example_inputs")
    chosen, notes = _check_layouts(layouts)
    batches = _check_batches(batch_sizes)
    if threads is not None:
        threads = check_int("threads", threads, low=1)
    rounds = check_int("rounds", rounds, low=1)
    warmup = check_int("warmup", warmup, low=0)
    if not (isinstance(min_time, (int, float)) and 0 < min_time <= 10):
        raise ValueError(f"min_time must be seconds in (0, 10], got {min_time!r}")
    check_choice("clock", clock, set(CLOCKS))
    if eval_data is not None:
        if not (isinstance(eval_data, (tuple, list)) and len(eval_data) == 2
                and all(isinstance(t, torch.Tensor) for t in eval_data)
                and len(eval_data[0]) == len(eval_data[1]) > 0):
            raise TypeError("eval_data must be (X, y): two tensors with the same number of rows")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    check_forward(model, example_inputs, call, "example_inputs")
    if any(_needs_compact(x) for x in chosen):
        torch_pruning("the compact layouts of the latency report")
    if any(x in _ORT for x in chosen) and not onnxruntime_available():
        raise ImportError('the onnxruntime layouts need onnxruntime: pip install "dualdrop[onnx]"')

    static = [x for x in chosen if x != "auto"]
    steps = len(static) + len(batches) * (1 + ("auto" in chosen) + rounds)
    bar = tqdm(total=steps, desc="latency", disable=not progress, leave=False)
    load_before = _load()
    with torch_threads(threads), tempfile.TemporaryDirectory() as tmp:
        nets, twins, base = _build(model, example_inputs, static, threads, Path(tmp), notes,
                                   bar)
        rows, errors = [], {}
        for b in batches:
            xb = batch_of(example_inputs, b)
            here, csr = dict(nets), []
            if "auto" in chosen:
                here["auto"] = export_sparse(nets["dense"], "auto", example_inputs=xb)
                base["auto"] = _static_costs(here["auto"])  # changes with the batch
                csr = [n for n, r in here["auto"].dualdrop_auto_layout.items()
                       if r["layout"] == "csr"]
                base["auto"]["note"] = ("CSR: " + ", ".join(csr)) if csr else \
                    "every layer dense: the dense row"
                bar.update(1)
            ref = call(here["dense"], xb)
            diffs = {}
            for name, net in here.items():
                diffs[name] = output_diff(ref, call(net, xb))
                if "int8" not in name and not diffs[name] <= CHECK_ATOL:
                    raise RuntimeError(f"layout {name!r} computes other outputs than the dense "
                                       f"network at batch {b} (max difference {diffs[name]:.3g} "
                                       "of the output scale); please report it")
            flops = {n: count_flops(twins.get(n, net), xb) for n, net in here.items()}
            bar.update(1)
            # an "auto" export that kept every layer dense is the dense network: its row is
            # the dense row (timing the same computation twice would only measure the noise)
            same = {"auto": "dense"} if "auto" in here and not csr else {}
            times = interleaved({n: (lambda net=net: call(net, xb)) for n, net in here.items()
                                 if n not in same},
                                rounds=rounds, warmup=warmup, min_time=min_time,
                                on_round=lambda: bar.update(1), clock=clock)
            times.update({n: times[m] for n, m in same.items()})
            dense_s = summary(times["dense"])
            dense_t = dense_s["median"]
            for n in chosen:
                s = summary(times[n])
                f, fnz = flops[n]
                err = None
                if eval_data is not None:  # one evaluation per network
                    key = id(here[n])              # (the network is held: ids stay unique)
                    if key not in errors:
                        errors[key] = (here[n], _error(lambda x, net=here[n]: net(x),
                                                       *eval_data))
                    err = errors[key][1]
                rows.append({
                    "layout": n, "batch": b, "median_s": s["median"], "q1_s": s["q1"],
                    "q3_s": s["q3"], "min_s": s["min"], "rounds": s["rounds"],
                    "speedup": dense_t / s["median"],
                    "speedup_min": dense_s["min"] / s["min"], "flops": int(f),
                    "flops_nonzero": int(round(fnz)),
                    "flop_ratio": flops["dense"][0] / f if f else float("nan"),
                    "params": base[n]["params"], "nonzero": base[n]["nonzero"],
                    "bytes": base[n]["bytes"], "max_abs_diff": diffs[n], "error": err,
                    "note": base[n].get("note", "")})
    bar.close()
    meta = {"threads": threads if threads is not None else torch.get_num_threads(),
            "rounds": rounds, "warmup": warmup, "min_time_s": min_time, "clock": clock,
            "batch_sizes": batches, "layouts": chosen, "torch": torch.__version__,
            "cpus": os.cpu_count(), "machine": platform.machine(),
            "load_before": load_before, "load_after": _load(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "notes": notes}
    return LatencyReport(rows, meta)


def _load():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _static_costs(net) -> dict:
    params, nnz = _counts(net)
    return {"params": params, "nonzero": nnz, "bytes": _disk_bytes(net)}


def _onnx_costs(path: Path) -> dict:
    """Numbers stored in an ONNX file's initializers (weights, biases, int8 scales), their
    nonzeros, and the file's size."""
    import onnx
    from onnx import numpy_helper

    params = nnz = 0
    for init in onnx.load(str(path)).graph.initializer:
        a = numpy_helper.to_array(init)
        params += a.size
        nnz += int((a != 0).sum())
    return {"params": params, "nonzero": nnz, "bytes": path.stat().st_size}


def _build(model, example_inputs, names, threads, tmp: Path, notes, bar):
    """``(nets, twins, costs)`` of the static layouts: ``nets[layout]`` a callable,
    ``twins[layout]`` the torch network whose products an onnxruntime layout runs (its FLOPs),
    ``costs[layout]`` params, nonzeros, bytes and a note."""
    nets, twins, costs = {}, {}, {}
    dense = export_sparse(model, "dense")
    compact = {}

    def small():
        if "net" not in compact:
            compact["net"] = export_sparse(dense, "compact", example_inputs=example_inputs)
        return compact["net"]

    for name in names:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if name == "dense":
                nets[name] = dense
            elif name == "csr":
                nets[name] = export_sparse(dense, "csr")
            elif name == "compact":
                nets[name] = small()
            elif name == "dense-int8":
                nets[name] = quantize_dynamic_int8(dense)
            elif name == "compact-int8":
                nets[name] = quantize_dynamic_int8(small())
            else:
                layout, quantize = _ORT[name]
                path = tmp / f"{name}.onnx"
                rec = export_onnx(dense, example_inputs, path, layout=layout, quantize=quantize)
                nets[name] = OnnxModel(path, threads=threads)
                twins[name] = small() if layout == "compact" else dense
                costs[name] = {**_onnx_costs(path), "note": f"{rec['exporter']} exporter"}
            if name not in costs:
                costs[name] = _static_costs(nets[name])
        for w in caught:
            text = first_line(w.message)
            if all(text not in n for n in notes):
                notes.append(f"{name}: {text}")
        bar.update(1)
    return nets, twins, costs
