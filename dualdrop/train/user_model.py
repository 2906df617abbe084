"""A user's own network from files: ``--model-class MODULE:CLASS`` (``--model-args JSON``), a saved
model file, calibration inputs from a file.

The one home of what ``dualdrop prune --model`` and ``dualdrop latency MODEL_FILE`` read, and of
what :func:`dualdrop.train.load_run` rebuilds a ``prune --model`` run from. Every file is read
with ``torch.load(weights_only=True)`` (or numpy without pickles); each refusal is a one-line
``ValueError`` / ``FileNotFoundError`` naming the option and the fix.

- the class: any importable callable that returns a ``torch.nn.Module`` (a class, or a factory
  function such as ``torchvision.models:resnet18``), called with ``--model-args``; the
  ``dualdrop`` command also searches the current folder, as ``python -m`` does
  (``dualdrop.cli.cwd_on_path``);
- the model file: a ``state_dict`` (``torch.save(model.state_dict(), path)``), a module saved
  whole (``torch.save(model, path)``: read with only the classes of a fresh ``--model-class``
  instance allowed, then its weights loaded into that instance), or a
  ``dualdrop.nn.save_compact`` file;
- the calibration inputs: a ``.pt`` file of one tensor (or a dict of tensors with the same first
  dimension: keyword inputs, e.g. ``input_ids`` and ``attention_mask``), a ``.npy`` array, an
  ``.npz`` of named arrays (keyword inputs), or a ``.csv`` table of numbers (one sample per row,
  an optional header), samples along dim 0. Floating-point data takes the model's dtype;
  integers stay int64 (token ids).
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import pickle
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dualdrop.nn._graph import first_line

CALIB_SUFFIXES = (".pt", ".pth", ".npy", ".npz", ".csv")


def import_model_class(spec: str, option: str = "--model-class"):
    """The callable named by ``MODULE:NAME`` (a class or a factory function)."""
    if not isinstance(spec, str):
        raise TypeError(f"{option} must be a string MODULE:CLASS, got {type(spec).__name__}")
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"{option} {spec!r}: expected MODULE:CLASS, e.g. "
                         "dualdrop.train.models:LeNet5")
    try:
        obj = importlib.import_module(mod)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{option} {spec!r} cannot be imported ({first_line(exc)}); "
                         f"{_why_not_imported(mod, exc)}") from None
    if not callable(obj):
        raise ValueError(f"{option} {spec!r} is a {type(obj).__name__}, not a class or a "
                         "function that builds a torch.nn.Module")
    return obj


def _why_not_imported(mod: str, exc: Exception) -> str:
    """What went wrong, as true in this process: the module not found (where Python looked; the
    current folder named only when it is on ``sys.path``: the ``dualdrop`` command and ``python
    -m`` put it there, a script run from elsewhere does not), the name missing from the module,
    or an import error raised by the module's own code."""
    missing = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and missing and (
            mod == missing or mod.startswith(missing + ".")):
        top = missing.replace(".", "/")
        cwd = os.getcwd()
        if any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
            return (f"no {top}.py (nor a package {top}/) in the current folder {cwd}, the "
                    "PYTHONPATH folders or the installed packages")
        return (f"no {top}.py (nor a package {top}/) on sys.path (the PYTHONPATH folders and the "
                f"installed packages), which does not hold the current folder {cwd}: add the "
                "module's folder to PYTHONPATH, or run the dualdrop command from that folder")
    found = sys.modules.get(mod)
    where = getattr(found, "__file__", None) or mod
    if isinstance(exc, AttributeError) and found is not None:
        return f"check the name after the ':' against {where}"
    return f"the error is raised by the code of {mod} or a module it imports; fix it there"


def parse_model_args(text, option: str = "--model-args") -> dict:
    """The keyword arguments of ``--model-class``: a JSON object (or a dict already)."""
    if isinstance(text, dict):
        return dict(text)
    try:
        kwargs = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{option} is not JSON ({getattr(exc, 'msg', exc)}); e.g. "
                         "'{\"n_features\": 784}'") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"{option} must be a JSON object of keyword arguments, e.g. "
                         "'{\"n_features\": 784}'")
    return kwargs


def build_user_model(spec: str, kwargs=None, option: str = "--model-class") -> nn.Module:
    """A fresh ``spec(**kwargs)``, checked to be a ``torch.nn.Module``."""
    factory = import_model_class(spec, option)
    kwargs = parse_model_args(kwargs if kwargs is not None else {})
    try:
        model = factory(**kwargs)
    except Exception as exc:  # the user's constructor: any error is theirs to fix
        raise ValueError(f"{option} {spec}(**{kwargs}) failed: {type(exc).__name__}: "
                         f"{first_line(exc)}; check --model-args") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"{option} {spec!r} returned a {type(model).__name__}, not a "
                         "torch.nn.Module; name the network's class (or a function that "
                         "builds it)")
    return model


def parse_shape(text: str, option: str = "--input-shape") -> tuple[int, ...]:
    """``"1,28,28"`` -> ``(1, 28, 28)``: the shape of one input sample."""
    try:
        dims = tuple(int(d) for d in str(text).split(","))
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise ValueError(f"{option} {text!r}: expected positive integers separated by commas, "
                         "e.g. 784 or 1,28,28")
    return dims


def _check_file(path, option: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{option} {path}: no such file")
    if p.is_dir():
        raise ValueError(f"{option} {path} is a folder; pass a file")
    if p.stat().st_size == 0:
        raise ValueError(f"{option} {path} is empty (0 bytes); save it again")
    return p


def _allowed_globals(fresh: nn.Module) -> list:
    """What a module saved whole needs besides tensors: the classes of ``fresh``'s modules (the
    architecture the user named) and torch's parameter rebuild functions."""
    import torch._utils

    extra = [getattr(torch._utils, n) for n in ("_rebuild_parameter",
                                                "_rebuild_parameter_with_state")
             if hasattr(torch._utils, n)]
    return sorted({type(m) for m in fresh.modules()}, key=str) + extra + [
        collections.OrderedDict, set]


def load_model_file(path, fresh: nn.Module, *, option: str = "--model",
                    spec: str = "--model-class") -> nn.Module:
    """The network saved at ``path`` on the fresh instance ``fresh`` (module docstring), in eval
    mode. ``option`` / ``spec``: the options named in messages."""
    from dualdrop.nn import load_compact
    from dualdrop.nn.compact import FORMAT

    p = _check_file(path, option)
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(_allowed_globals(fresh)):
            warnings.simplefilter("ignore")
            blob = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        if not found:
            raise ValueError(f"{option} {path} cannot be read as a saved model (corrupt or not "
                             f"a torch file: {first_line(exc)[:100]})") from None
        raise ValueError(f"{option} {path} holds {found.group(1)}, which a weights-only load "
                         f"refuses (it is not part of {spec}'s network); save "
                         "model.state_dict() instead") from None
    except Exception as exc:
        raise ValueError(f"{option} {path} cannot be read as a saved model "
                         f"({first_line(exc)[:120]})") from None
    if isinstance(blob, nn.Module):
        if type(blob) is not type(fresh):
            raise ValueError(f"{option} {path} holds a {type(blob).__name__}, not the "
                             f"{type(fresh).__name__} of {spec}")
        blob = blob.state_dict()
    if isinstance(blob, dict) and blob.get("format") == FORMAT:
        return load_compact(p, fresh)
    if not (isinstance(blob, dict) and blob
            and all(isinstance(v, torch.Tensor) for v in blob.values())):
        what = (f"a dict with keys {sorted(map(str, blob))[:5]}" if isinstance(blob, dict)
                else f"a {type(blob).__name__}")
        raise ValueError(f"{option} {path} holds {what}: neither a state_dict, a saved module "
                         "nor a save_compact file")
    try:
        fresh.load_state_dict(blob, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{option} {path} does not fit {spec}: {first_line(exc)}; check "
                         "--model-args") from None
    return fresh.eval()


# ---------------------------------------------------------------------------- calibration data
def _csv_table(p: Path, option: str) -> np.ndarray:
    """A numeric CSV table (optional header line), every row the same length."""
    lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
    rows = []
    for i, line in enumerate(lines, start=1):
        cells = [c.strip() for c in line.split(",")]
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            if i == 1:   # a header
                continue
            raise ValueError(f"{option} {p}: line {i} holds a value that is not a number "
                             f"({line[:60]!r})") from None
        if len(rows[-1]) != len(rows[0]):
            raise ValueError(f"{option} {p}: line {i} has {len(rows[-1])} values, the first "
                             f"row {len(rows[0])}")
    if not rows:
        raise ValueError(f"{option} {p} holds no row of numbers")
    return np.asarray(rows, dtype=np.float64)


def _as_tensor(a, what: str, option: str, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{option} {what} holds a {type(t).__name__}, not a tensor of samples")
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{option} {what} holds {t.dtype} values; give real numbers (or "
                         "integer token ids)")
    if t.dim() == 0 or t.shape[0] == 0:
        raise ValueError(f"{option} {what} holds no sample (shape {tuple(t.shape)}); samples "
                         "go along dim 0")
    if t.is_floating_point():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise ValueError(f"{option} {what} holds {bad} non-finite value(s) (NaN or inf); "
                             "clean the data")
        return t.to(dtype)
    return t.long()


def read_calibration(path, *, shape: tuple[int, ...] | None = None,
                     dtype: torch.dtype = torch.float32, option: str = "--calib"):
    """Calibration inputs from a file (module docstring): a tensor of samples, or a dict of
    tensors (keyword inputs). ``shape``: one sample's shape; rows of ``prod(shape)`` numbers
    (a CSV's) are reshaped to it."""
    p = _check_file(path, option)
    suffix = p.suffix.lower()
    if suffix not in CALIB_SUFFIXES:
        raise ValueError(f"{option} {path}: expected a {', '.join(CALIB_SUFFIXES)} file")
    try:
        if suffix in (".pt", ".pth"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                blob = torch.load(p, map_location="cpu", weights_only=True)
        elif suffix == ".npy":
            blob = np.load(p, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                blob = {k: z[k] for k in z.files}
        else:
            blob = _csv_table(p, option)
    except ValueError as exc:
        if str(exc).startswith(option):
            raise
        raise ValueError(f"{option} {path} cannot be read ({first_line(exc)[:120]})") from None
    except Exception as exc:
        raise ValueError(f"{option} {path} cannot be read ({first_line(exc)[:120]})") from None
    if isinstance(blob, dict):
        if not blob:
            raise ValueError(f"{option} {path} holds an empty dict")
        out = {str(k): _as_tensor(v, f"{path}[{k!r}]", option, dtype) for k, v in blob.items()}
        sizes = {k: v.shape[0] for k, v in out.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"{option} {path}: its tensors have different numbers of samples "
                             f"{sizes}")
        return out
    x = _as_tensor(blob, str(path), option, dtype)
    if shape is not None and tuple(x.shape[1:]) != tuple(shape):
        if x[0].numel() != int(np.prod(shape)):
            raise ValueError(f"{option} {path}: a sample has shape {tuple(x.shape[1:])}, which "
                             f"does not fit --input-shape {','.join(map(str, shape))}")
        x = x.reshape(len(x), *shape)
    return x


def calibration_batches(calib, batch: int = 128) -> list:
    """``calib`` (a tensor, or a dict of tensors) as batches of ``batch`` samples."""
    if isinstance(calib, dict):
        n = next(iter(calib.values())).shape[0]
        return [{k: v[i:i + batch] for k, v in calib.items()} for i in range(0, n, batch)]
    return list(calib.split(batch))


def n_samples(calib) -> int:
    return next(iter(calib.values())).shape[0] if isinstance(calib, dict) else calib.shape[0]


__all__ = ["import_model_class", "parse_model_args", "build_user_model", "parse_shape",
           "load_model_file", "read_calibration", "calibration_batches", "n_samples"]
