"""ONNX export of a sparsified network, checked with onnxruntime: ``export_onnx``, ``OnnxModel``.

The deployment runtimes people use read ONNX. ``export_onnx(model, example_inputs, path)``
writes the test-time network, as ``export_sparse`` gives it, through ``torch.onnx.export``:

- ``layout="dense"``: the plain layers, pruned weights stored as zeros (an ONNX file has no
  sparse products; the file compresses well, it does not run faster);
- ``layout="compact"``: the narrower network with dead units and heads removed
  (``dualdrop.nn.compact``; ``HeadPrunedAttention`` exports as its q/k/v/out products and a
  scaled dot-product attention, the constants of removed units are in the next layers' biases),
  the layout that runs faster in any runtime;
- ``quantize="dynamic-int8"``: the file's weight products (MatMul/Gemm with a constant weight)
  quantized by ``onnxruntime.quantization.quantize_dynamic``, int8 weights per output channel
  and symmetric (pruned zeros stay zero), inputs quantized at run time; convolutions and the
  attention's data products stay float, as in ``dualdrop.nn.quantize``.

The exporter is torch's dynamo-based one (``torch.export``, then ONNX through onnxscript); if it
cannot capture the model the TorchScript exporter is tried, with a warning naming why. The batch
dimension (dim 0 of every input tensor) is dynamic unless ``dynamic_batch=False``. With
``check=True`` (default) onnxruntime runs the file on ``example_inputs`` and on a batch of
another size, and the outputs must match torch's to ``atol`` relative to the output scale
(1e-5; int8 files are compared and reported, not refused). Needs the ``onnx`` extra
(``pip install "dualdrop[onnx]"``: onnx, onnxscript, onnxruntime).

``OnnxModel(path, threads=1)`` runs a file with onnxruntime like a module: torch tensors in,
torch tensors out (what ``dualdrop.nn.latency`` times as its ``onnxruntime`` rows).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from dualdrop.nn._graph import batch_of, check_inputs, first_line, output_diff
from dualdrop.nn.export import export_sparse
from dualdrop.nn.quantize import check_quantize

INSTALL_HINT = 'pip install "dualdrop[onnx]"'
ATOL = 1e-5


def _require(module: str, purpose: str):
    try:
        return __import__(module)
    except ImportError as exc:
        raise ImportError(f"{purpose} needs {module}, which is not installed: {INSTALL_HINT}") \
            from exc


def onnxruntime_available() -> bool:
    """Whether onnxruntime can be imported (the latency report's onnxruntime rows)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _as_args(example_inputs) -> tuple[tuple, dict]:
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def _batch_of(args, kwargs) -> int | None:
    sizes = {t.shape[0] for t in list(args) + list(kwargs.values())
             if isinstance(t, torch.Tensor) and t.dim() >= 1}
    return sizes.pop() if len(sizes) == 1 else None


def _resize_batch(args, kwargs, n: int):
    """Every tensor input with ``n`` rows along dim 0 (its rows cycled)."""
    return batch_of(tuple(args), n), batch_of(dict(kwargs), n)


@contextlib.contextmanager
def _quiet():
    """The exporter's progress lines and warnings (torchvision absent, its own deprecations)
    kept out of the user's output; the export's result says what happened."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo",
                                              "onnxscript")] + [logging.getLogger()]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _export(net, args, kwargs, path, dynamic_batch, opset_version) -> str:
    """Write ``net`` to ``path``; the exporter used (``"dynamo"`` or ``"torchscript"``)."""
    n_inputs = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    big = sum(p.numel() * p.element_size() for p in net.state_dict().values()) > 1_800_000_000
    common = dict(opset_version=opset_version, external_data=big)
    try:
        dyn = None
        if dynamic_batch:  # example_inputs: positional arguments or keywords, not both
            batch = torch.export.Dim("batch")
            one = lambda t: {0: batch} if isinstance(t, torch.Tensor) and t.dim() else None
            dyn = {k: one(v) for k, v in kwargs.items()} if kwargs else tuple(map(one, args))
        with _quiet():
            torch.onnx.export(net, args, str(path), kwargs=kwargs or None, dynamo=True,
                              dynamic_shapes=dyn, **common)
        return "dynamo"
    except Exception as exc:  # the dynamo exporter cannot capture every model
        reason = f"{type(exc).__name__}: {first_line(exc)}"
    if kwargs:
        raise ValueError(f"export_onnx: the dynamo exporter failed ({reason}) and the "
                         "TorchScript exporter takes positional inputs only; pass example_inputs "
                         "as a tensor or a tuple") from None
    warnings.warn(f"export_onnx: the dynamo exporter could not capture the model ({reason}); "
                  "used the TorchScript exporter", RuntimeWarning, stacklevel=3)
    names = [f"input_{i}" for i in range(len(n_inputs))]
    axes = {n: {0: "batch"} for n in names} if dynamic_batch else None
    with _quiet():
        torch.onnx.export(net, args, str(path), dynamo=False, input_names=names,
                          dynamic_axes=axes, opset_version=opset_version or 17)
    return "torchscript"


class OnnxModel:
    """An ONNX file run by onnxruntime, called like the torch module it came from.

    ``threads``: onnxruntime's intra-op threads (1 by default, the latency report's setting;
    None: its own choice). Inputs are torch tensors (positional, in the file's input order, or
    keywords by the file's input names); returns a tensor, or a tuple for several outputs."""

    def __init__(self, path: str | os.PathLike, threads: int | None = 1):
        ort = _require("onnxruntime", "running an ONNX file")
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such ONNX file")
        opts = ort.SessionOptions()
        if threads is not None:
            opts.intra_op_num_threads = int(threads)
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), opts,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ValueError(f"{path} cannot be read by onnxruntime ({first_line(exc)}); "
                             "export it again with dualdrop.nn.export_onnx") from None
        self.path = Path(path)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def __call__(self, *args, **kwargs):
        feed = {n: a.detach().cpu().numpy() for n, a in zip(self.input_names, args)}
        feed.update({k: v.detach().cpu().numpy() for k, v in kwargs.items()})
        outs = [torch.from_numpy(o) for o in self.session.run(None, feed)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self):
        return f"OnnxModel({str(self.path)!r})"


def _quantize_file(src: Path, dst: Path) -> None:
    _require("onnxruntime", 'quantize="dynamic-int8" on an ONNX export')
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet():
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul", "Gemm"],
                         per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"WeightSymmetric": True, "MatMulConstBOnly": True})


@torch.no_grad()
def export_onnx(model: nn.Module, example_inputs, path: str | os.PathLike, *,
                layout: str = "dense", quantize: str | None = None, dynamic_batch: bool = True,
                opset_version: int | None = None, check: bool = True,
                atol: float = ATOL) -> dict:
    """Write the test-time network of ``model`` to the ONNX file ``path`` (module docstring).

    ``model``: a sparsified or plain ``nn.Module`` (unchanged). ``example_inputs``: one batch
    of real shape (tensor, tuple/list: positional arguments, dict: keywords); dim 0 of each
    tensor is the batch. ``layout``: ``"dense"`` or ``"compact"``. ``quantize``: None or
    ``"dynamic-int8"``. Returns ``{"path", "layout", "quantize", "exporter", "bytes",
    "max_abs_diff"}`` (``max_abs_diff``: the largest difference between onnxruntime's and
    torch's outputs relative to the output scale, None without ``check``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_inputs(example_inputs)
    if layout not in ("dense", "compact"):
        raise ValueError(f"layout must be 'dense' or 'compact' for an ONNX export, got "
                         f"{layout!r} (an ONNX file has no CSR products)")
    check_quantize(quantize, layout)
    for name, flag in (("dynamic_batch", dynamic_batch), ("check", check)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if not (isinstance(atol, (int, float)) and atol > 0):
        raise ValueError(f"atol must be a number > 0, got {atol!r}")
    path = Path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"path must end in .onnx, got {str(path)!r}")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path.parent}: no such folder for the ONNX file")
    _require("onnxscript", "the ONNX export")
    _require("onnx", "the ONNX export")
    if check or quantize:
        _require("onnxruntime", "checking the ONNX file" if check else "quantizing it")
    args, kwargs = _as_args(example_inputs)
    if layout == "compact":
        net = export_sparse(model, "compact", example_inputs=example_inputs)
    else:
        net = export_sparse(model, "dense")
    n = _batch_of(args, kwargs)
    if dynamic_batch and n is None:
        raise ValueError("dynamic_batch=True needs example_inputs whose tensors share their "
                         "first (batch) dimension; pass dynamic_batch=False for a fixed shape")
    if dynamic_batch and n == 1:  # torch.export takes a dimension of size 1 for a constant
        args, kwargs = _resize_batch(args, kwargs, 2)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        raw = Path(tmp) / "float.onnx"
        exporter = _export(net, args, kwargs, raw, dynamic_batch, opset_version)
        if quantize:
            _quantize_file(raw, Path(tmp) / "int8.onnx")
            raw = Path(tmp) / "int8.onnx"
        os.replace(raw, path)
    record = {"path": str(path), "layout": layout, "quantize": quantize, "exporter": exporter,
              "bytes": path.stat().st_size, "max_abs_diff": None}
    if check:
        runner = OnnxModel(path, threads=None)
        worst = 0.0
        sizes = [n or 1] + ([(n or 1) + 3] if dynamic_batch else [])
        for size in sizes:
            a, k = _resize_batch(args, kwargs, size)
            worst = max(worst, output_diff(net(*a, **k), runner(*a, **k)))
        record["max_abs_diff"] = worst
        if not quantize and not worst <= atol:
            raise RuntimeError(f"export_onnx: onnxruntime's outputs differ from torch's by "
                               f"{worst:.3g} (relative to the output scale; atol={atol}); the "
                               f"file is at {path}. Please report it")
    return record
