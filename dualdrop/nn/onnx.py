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
dimension (dim 0 of every input tensor) is dynamic unless ``dynamic_batch=False``, and so is the
sequence dimension (dim 1 of token ids, of ``(batch, length, features)`` inputs) wherever the
model runs at another length (``dynamic_sequence``): one file serves every batch size and
length. The file is written under a temporary name and checked before it replaces ``path``: a
refused input or a failed check leaves an existing file as it was. With ``check=True``
(default) onnxruntime runs the file on ``example_inputs``, on a batch of another size and at
another sequence length, and the outputs must match torch's to ``atol`` relative to the output
scale (1e-5; int8 files are compared and reported, not refused). Needs the ``onnx`` extra
(``pip install "dualdrop[onnx]"``: onnx, onnxscript, onnxruntime).

``OnnxModel(path, threads=1)`` runs a file with onnxruntime like a module: torch tensors in
(every input of the file, by position or name; a missing, extra or unknown one is refused),
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

from dualdrop.nn._base import check_int
from dualdrop.nn._files import writable_file
from dualdrop.nn._graph import batch_of, check_inputs, first_line, output_diff, tensors
from dualdrop.nn.export import export_sparse
from dualdrop.nn.quantize import check_finite_weights, check_quantize

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


def _export(net, args, kwargs, path, dynamic_batch, seq, opset_version) -> str:
    """Write ``net`` to ``path``; the exporter used (``"dynamo"`` or ``"torchscript"``).
    ``seq``: the inputs (positions, or keyword names) whose dim 1 is the dynamic sequence."""
    n_inputs = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    big = sum(p.numel() * p.element_size() for p in net.state_dict().values()) > 1_800_000_000
    common = dict(opset_version=opset_version, external_data=big)
    try:
        dyn = None
        if dynamic_batch or seq:  # example_inputs: positional arguments or keywords, not both
            batch = torch.export.Dim("batch")

            def axes(key, t):
                if not isinstance(t, torch.Tensor) or not t.dim():
                    return None
                out = {0: batch} if dynamic_batch else {}
                if key in seq:
                    out[1] = torch.export.Dim.AUTO
                return out or None
            dyn = ({k: axes(k, v) for k, v in kwargs.items()} if kwargs else
                   tuple(axes(i, t) for i, t in enumerate(args)))
        with _quiet():
            torch.onnx.export(net, args, str(path), kwargs=kwargs or None, dynamo=True,
                              dynamic_shapes=dyn, **common)
        if seq:
            _name_sequence(path, seq, keyword=bool(kwargs))
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
    axes = {n: {**({0: "batch"} if dynamic_batch else {}), **({1: "sequence"} if i in seq
                                                                else {})}
            for i, n in enumerate(names)}
    with _quiet():
        torch.onnx.export(net, args, str(path), dynamo=False, input_names=names,
                          dynamic_axes={n: a for n, a in axes.items() if a} or None,
                          opset_version=opset_version or 17)
    return "torchscript"


def _name_sequence(path, seq, keyword: bool) -> None:
    """Call the sequence axis ``"sequence"`` in the file (torch.export names it ``s<k>``):
    dim 1 of the inputs ``seq`` (keyword names, or positions)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inputs = list(m.graph.input)
    chosen = ([i for i in inputs if i.name in seq] if keyword else
              [inputs[k] for k in sorted(seq) if k < len(inputs)])
    old = {i.type.tensor_type.shape.dim[1].dim_param for i in chosen
           if len(i.type.tensor_type.shape.dim) > 1} - {""}
    if len(old) != 1:
        return
    old = old.pop()
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param == old:
                d.dim_param = "sequence"
    onnx.save(m, str(path))


def _file_axes(path: Path) -> tuple[int, dict]:
    """``(opset, {input name: {dim: name}})``: the file's default-domain opset and the dynamic
    (named) dimensions of its inputs."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    axes = {}
    for i in m.graph.input:
        dims = {k: d.dim_param for k, d in enumerate(i.type.tensor_type.shape.dim)
                if d.dim_param}
        if dims:
            axes[i.name] = dims
    return opset, axes


def _with_length(args, kwargs, seq, length: int):
    """The inputs ``seq`` (positions or names) with ``length`` entries along dim 1 (the first
    ones, or cycled when longer)."""
    def one(t):
        return t[:, torch.arange(length, device=t.device) % t.shape[1]]
    return (tuple(one(t) if i in seq else t for i, t in enumerate(args)),
            {k: one(v) if k in seq else v for k, v in kwargs.items()})


def _sequence_inputs(net, args, kwargs, dynamic_sequence) -> tuple[set, int | None]:
    """``(inputs whose dim 1 is a sequence, its length)``. Candidates: every input tensor with
    at least 2 dimensions, all of one length along dim 1. ``dynamic_sequence=None`` keeps them
    when the torch model also runs with another length there (a Linear layer's features or a
    convolution's channels do not); True requires it; False: none."""
    if dynamic_sequence is False:
        return set(), None
    cand = {k: t for k, t in list(enumerate(args)) + list(kwargs.items())
            if isinstance(t, torch.Tensor) and t.dim() >= 2}
    lengths = {t.shape[1] for t in cand.values()}
    why = None
    if not cand:
        why = "no input has a second dimension"
    elif len(lengths) > 1:
        why = f"the inputs' dim 1 sizes differ ({sorted(lengths)})"
    else:
        length = lengths.pop()
        probe = length - 1 if length > 2 else length + 1
        a, k = _with_length(args, kwargs, set(cand), probe)
        try:
            with torch.no_grad():
                net(*a, **k)
        except Exception as exc:
            why = (f"the model does not run with {probe} instead of {length} along dim 1 "
                   f"({type(exc).__name__}: {first_line(exc)[:100]})")
    if why is None:
        return set(cand), length
    if dynamic_sequence:
        raise ValueError(f"dynamic_sequence=True: no sequence axis to make dynamic: {why}; pass "
                         "dynamic_sequence=None (found when there is one) or False")
    return set(), None


class OnnxModel:
    """An ONNX file run by onnxruntime, called like the torch module it came from.

    ``threads``: onnxruntime's intra-op threads (1 by default, the latency report's setting;
    None: its own choice). Inputs are torch tensors (positional, in the file's input order, or
    keywords by the file's input names); returns a tensor, or a tuple for several outputs."""

    def __init__(self, path: str | os.PathLike, threads: int | None = 1):
        if threads is not None:
            threads = check_int("threads", threads, low=1)
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
        names = self.input_names
        if len(args) > len(names):
            raise TypeError(f"{self.path.name} takes {len(names)} input(s) {names}, got "
                            f"{len(args)} positional")
        given = dict(zip(names, args))
        unknown = sorted(set(kwargs) - set(names))
        twice = sorted(set(kwargs) & set(given))
        if unknown or twice:
            raise TypeError(f"{self.path.name}: " + (f"unknown input(s) {unknown}" if unknown
                            else f"input(s) {twice} given twice (by position and name)") +
                            f"; its inputs: {names}")
        given.update(kwargs)
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"{self.path.name}: missing input(s) {missing}; its inputs: {names}")
        bad = [n for n, v in given.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise TypeError(f"{self.path.name}: inputs {bad} must be torch tensors")
        feed = {n: v.detach().cpu().numpy() for n, v in given.items()}
        try:
            outs = [torch.from_numpy(o) for o in self.session.run(None, feed)]
        except Exception as exc:  # onnxruntime's own refusal (a shape, a dtype)
            raise ValueError(f"{self.path.name} refused its inputs ({first_line(exc)[:200]})") \
                from None
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
                dynamic_sequence: bool | None = None, opset_version: int | None = None,
                check: bool = True, atol: float = ATOL) -> dict:
    """Write the test-time network of ``model`` to the ONNX file ``path`` (module docstring).

    ``model``: a sparsified or plain ``nn.Module`` (unchanged). ``example_inputs``: one batch
    of real shape (tensor, tuple/list: positional arguments, dict: keywords); dim 0 of each
    tensor is the batch. ``layout``: ``"dense"`` or ``"compact"``. ``quantize``: None or
    ``"dynamic-int8"``. ``dynamic_batch``: dim 0 of every input dynamic. ``dynamic_sequence``:
    dim 1 of the inputs with two dimensions or more dynamic (token ids, ``(batch, length,
    features)`` sequences): None (default) when the model runs at another length there (not a
    Linear layer's features or a convolution's channels), True to require it, False for a
    fixed length. ``opset_version``: None (the exporter's own, 18 or more) or the opset the
    file must have (refused when the exporter cannot write it).

    Nothing is written until the file is checked: it is exported (and quantized) under a
    temporary name beside ``path``, its opset checked, and with ``check=True`` run by
    onnxruntime on ``example_inputs``, on a batch of another size and, with a dynamic
    sequence, at another length; the outputs must match torch's to ``atol`` relative to the
    output scale (int8 files are compared and reported, not refused). Only then does it
    replace ``path``. Returns ``{"path", "layout", "quantize", "exporter", "opset",
    "dynamic_axes", "bytes", "max_abs_diff"}`` (``dynamic_axes``: ``{input: {dim: name}}``;
    ``max_abs_diff``: the largest difference between onnxruntime's and torch's outputs
    relative to the output scale, None without ``check``).
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
    if dynamic_sequence is not None and not isinstance(dynamic_sequence, bool):
        raise TypeError(f"dynamic_sequence must be None, True or False, got "
                        f"{dynamic_sequence!r}")
    if not (isinstance(atol, (int, float)) and not isinstance(atol, bool) and atol > 0):
        raise ValueError(f"atol must be a number > 0, got {atol!r}")
    path = writable_file(path, "path")
    if path.suffix != ".onnx":
        raise ValueError(f"path must end in .onnx, got {str(path)!r}")
    _require("onnxscript", "the ONNX export")
    onnx = _require("onnx", "the ONNX export")
    newest = onnx.defs.onnx_opset_version()
    if opset_version is not None and not (
            isinstance(opset_version, int) and not isinstance(opset_version, bool)
            and 7 <= opset_version <= newest):
        raise ValueError(f"opset_version must be None or an integer in [7, {newest}] (the "
                         f"installed onnx's newest), got {opset_version!r}")
    if check or quantize:
        _require("onnxruntime", "checking the ONNX file" if check else "quantizing it")
    args, kwargs = _as_args(example_inputs)
    empty = [k for k, t in list(enumerate(args)) + list(kwargs.items())
             if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == 0]
    if empty:
        raise ValueError(f"example_inputs {empty} have no rows (an empty batch); pass at least "
                         "one real sample")
    n = _batch_of(args, kwargs)
    if dynamic_batch and n is None:
        raise ValueError("dynamic_batch=True needs example_inputs whose tensors share their "
                         "first (batch) dimension; pass dynamic_batch=False for a fixed shape")
    if layout == "compact":
        net = export_sparse(model, "compact", example_inputs=example_inputs)
    else:
        net = export_sparse(model, "dense")
    if quantize:
        check_finite_weights(net)
    with _no_kv_cache(net):
        return _export_checked(net, args, kwargs, n, path, layout, quantize, dynamic_batch,
                               dynamic_sequence, opset_version, check, atol)


@contextlib.contextmanager
def _no_kv_cache(net):
    """A Hugging Face decoder (GPT-2, Llama) returns its key/value cache by default, which is
    not a tensor an ONNX file can give; the export runs with ``config.use_cache`` off (put back
    afterwards)."""
    config = getattr(net, "config", None)
    old = getattr(config, "use_cache", None)
    if old:
        config.use_cache = False
    try:
        yield
    finally:
        if old:
            config.use_cache = old


def _export_checked(net, args, kwargs, n, path, layout, quantize, dynamic_batch,
                    dynamic_sequence, opset_version, check, atol):
    try:
        ref = net(*args, **kwargs)
    except Exception as exc:  # refused here, not by a half-written file
        raise ValueError(f"example_inputs: the model does not run on them ({type(exc).__name__}:"
                         f" {first_line(exc)[:160]}); pass a batch the model takes (its dtype "
                         "and shape)") from None
    if not tensors(ref):
        raise ValueError("example_inputs: the model's output holds no tensor to export")
    seq, length = _sequence_inputs(net, args, kwargs, dynamic_sequence)
    if dynamic_batch and n == 1:  # torch.export takes a dimension of size 1 for a constant
        args, kwargs = _resize_batch(args, kwargs, 2)
    if length == 1:
        args, kwargs = _with_length(args, kwargs, seq, 2)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        (Path(tmp) / "float").mkdir()
        raw = Path(tmp) / "float" / path.name
        exporter = _export(net, args, kwargs, raw, dynamic_batch, seq, opset_version)
        if quantize:
            (Path(tmp) / "int8").mkdir()
            _quantize_file(raw, Path(tmp) / "int8" / path.name)
            raw = Path(tmp) / "int8" / path.name
        opset, axes = _file_axes(raw)
        if seq and not any(1 in dims for dims in axes.values()):  # the exporter fixed it
            if dynamic_sequence:
                raise ValueError(f"dynamic_sequence=True: the {exporter} exporter fixed the "
                                 f"sequence length at {length}; pass dynamic_sequence=None or "
                                 "False")
            seq = set()
        if opset_version is not None and opset != opset_version:
            raise ValueError(f"opset_version={opset_version}: the {exporter} exporter wrote "
                             f"opset {opset} (it cannot convert this model to {opset_version});"
                             f" pass opset_version=None or {opset}")
        record = {"path": str(path), "layout": layout, "quantize": quantize,
                  "exporter": exporter, "opset": opset, "dynamic_axes": axes,
                  "bytes": raw.stat().st_size, "max_abs_diff": None}
        if check:
            record["max_abs_diff"] = _check_file(net, raw, args, kwargs, n, dynamic_batch,
                                                 seq, length)
            if not quantize and not record["max_abs_diff"] <= atol:
                raise RuntimeError(f"export_onnx: onnxruntime's outputs differ from torch's by "
                                   f"{record['max_abs_diff']:.3g} (relative to the output "
                                   f"scale; atol={atol}); nothing was written to {path}. "
                                   "Please report it")
        for f in raw.parent.iterdir():  # the file and its external data, if any
            os.replace(f, path.parent / f.name)
    return record


def _check_file(net, file: Path, args, kwargs, n, dynamic_batch, seq, length) -> float:
    """The largest difference between onnxruntime's outputs on ``file`` and torch's (relative
    to the output scale) at the example's batch size and another, and at another sequence
    length when ``seq`` is dynamic."""
    runner = OnnxModel(file, threads=None)
    worst = 0.0
    cases = [(n or 1, None)] + ([((n or 1) + 3, None)] if dynamic_batch else [])
    if seq:
        cases.append((n or 1, length + 3 if length < 4 else length // 2))
    for size, new_len in cases:
        a, k = _resize_batch(args, kwargs, size)
        if new_len is not None:
            a, k = _with_length(a, k, seq, new_len)
        worst = max(worst, output_diff(net(*a, **k), runner(*a, **k)))
    return worst
