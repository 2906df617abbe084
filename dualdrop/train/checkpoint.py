"""Run files: checkpoints, RNG states, atomic writes, the run lock.

No work is lost on a kill: every file is written to a temporary name in its folder and moved in
place with ``os.replace`` (atomic on POSIX), so a reader sees the old file or the new one, never a
half-written one. ``checkpoint.pt`` holds everything an exact resume needs: model, optimizer and
scheduler states, the RNG states of torch / numpy / python of every process, and the data-order
state (seed, next epoch). A lock file (pid, host) keeps two processes from training into the same
folder.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import random
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dualdrop.nn._files import atomic_target


CHECKPOINT = "checkpoint.pt"
# 3: the one format of ``dualdrop.train.engine.fit`` (the CLI's runs included): step counters,
#    the RNG states of every process as a list by rank, the epoch-start states of a checkpoint
#    taken inside an epoch; 2: the CLI's per-epoch checkpoint (RNG states as tensors and plain
#    values, loads with weights_only=True); 1: numpy's tuple. ``fit``'s own checkpoints before
#    format 3 had no "format" entry. Older ones are read and upgraded (:func:`upgrade`).
FORMAT_VERSION = 3


def _plain_rng(numpy_state: tuple, python_state: tuple) -> dict:
    """numpy's and python's RNG state tuples as tensors and plain values."""
    kind, key, pos, has_gauss, cached = numpy_state
    version, internal, gauss_next = python_state
    return {
        "numpy": {"kind": str(kind), "key": torch.from_numpy(np.asarray(key).astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }


def rng_state(device: torch.device) -> dict:
    """The RNG states of torch, numpy and python (and CUDA on a CUDA device) of this process,
    as tensors and plain Python values only (so that checkpoints load with weights_only=True)."""
    st = {"torch": torch.get_rng_state(), **_plain_rng(np.random.get_state(), random.getstate())}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: dict, device: torch.device) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(st["torch"])
    npst = st["numpy"]
    np.random.set_state((npst["kind"], npst["key"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached_gaussian"]))
    py = st["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()),
                     py["gauss_next"]))
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


def _rng_from_format1(st: dict) -> dict:
    """A format-1 RNG record (numpy's state tuple, python's tuple) in the current form."""
    return {**st, **_plain_rng(st["numpy"], st["python"])}


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file in the same folder, then ``os.replace`` it in place
    (``dualdrop.nn._files.atomic_target``: the previous file stays whole on any failure)."""
    with atomic_target(path) as tmp:
        torch.save(obj, tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_target(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, default=None) -> None:
    """``obj`` as indented JSON (one trailing newline), written by :func:`atomic_write_text`:
    the one writer of the JSON files of runs, comparisons and frontiers."""
    atomic_write_text(path, json.dumps(obj, indent=1, default=default) + "\n")


def read_json(path: str | os.PathLike, fix: str, *, kind: type = dict) -> Any:
    """The JSON file of a run (``config.json``, ``final.json``, ...): one-line errors naming
    ``path`` and ending with ``fix`` for a missing, empty, corrupt or truncated file, or one
    whose top level is not a ``kind``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; {fix}")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file (corrupt); {fix}") from None
    if not text.strip():
        raise ValueError(f"{path} is empty; {fix}")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is corrupt or truncated (invalid JSON at line {exc.lineno} "
                         f"column {exc.colno}: {exc.msg}); {fix}") from None
    if not isinstance(obj, kind):
        raise ValueError(f"{path} holds a JSON {type(obj).__name__}, not a "
                         f"{'JSON object' if kind is dict else kind.__name__}; {fix}")
    return obj


#: the settings a run folder was started with (written before any work, compared on a rerun)
RUN_CONFIG = "config.json"


def plain_settings(obj: Any) -> Any:
    """``obj`` as plain JSON values (others by their ``repr``): a record of settings that
    compares equal across processes and loads with ``weights_only=True``."""
    return json.loads(json.dumps(obj, default=repr))


def claim_run_folder(out: str | os.PathLike, settings: dict, *, option: str = "--out",
                     run_files: tuple = ("final.json", "model.pt", CHECKPOINT)) -> bool:
    """Record ``settings`` as the run of folder ``out``, or check that the run recorded there
    has them. Returns True when ``out`` already holds this run (a rerun: continue it),
    False for a new run (``out/config.json`` written now, before any work).

    A rerun with other settings is refused (ValueError naming each setting that differs, and
    the fix: the same settings, or another ``option``), as is a folder holding run files
    (``run_files``) without a record: resuming either would mix two runs, e.g. one method's
    checkpoint under another method's results. Call it after every argument is checked.
    """
    out = Path(out)
    record, now = out / RUN_CONFIG, plain_settings(settings)
    if record.is_file():
        fix = f"remove {out} or choose another {option}"
        was = read_json(record, fix)
        detail = settings_diff(was, now, "there")
        if detail:
            raise ValueError(f"{option} {out} holds a run started with other settings "
                             f"({detail}); rerun with its settings to continue it, or choose "
                             f"another {option} (or remove {out})")
        return True
    found = [f for f in run_files if (out / f).exists()]
    if found:
        raise ValueError(f"{option} {out} holds run files ({', '.join(found)}) but no record "
                         f"of their settings ({RUN_CONFIG}); choose another {option} (or "
                         f"remove {out})")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(record, now)
    return False


def settings_diff(was: dict, now: dict, where: str) -> str:
    """``"density: 0.3 there, 0.5 now; ..."``: the settings that differ (at most six), or ``""``."""
    keys = sorted({**was, **now}, key=str)
    diff = [(k, was.get(k), now.get(k)) for k in keys if was.get(k) != now.get(k)]
    return "; ".join(f"{k}: {a!r} {where}, {b!r} now" for k, a, b in diff[:6]) + (
        " ..." if len(diff) > 6 else "")


def release_run_folder(out: str | os.PathLike, remove_folder: bool = False) -> None:
    """Undo :func:`claim_run_folder` for a run refused or interrupted before it saved any work:
    its record removed, and the folder too when ``remove_folder`` and empty."""
    out = Path(out)
    (out / RUN_CONFIG).unlink(missing_ok=True)
    if remove_folder:
        try:
            out.rmdir()
        except OSError:  # not empty: something else lives there
            pass


class RunLockedError(FileExistsError):
    """Another live process is training into the same output folder."""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(out: Path) -> Path:
    """Create ``out/.lock`` (pid, host) exclusively; take over a lock whose process is gone.

    Two processes resuming the same run would write over each other's checkpoints; the second
    one gets :class:`RunLockedError` instead.
    """
    import socket

    path = out / ".lock"
    host = socket.gethostname()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid_s, _, owner = path.read_text().partition(" ")
                pid = int(pid_s)
            except (OSError, ValueError):
                continue  # being written or removed right now: retry
            if owner.strip() == host and not pid_alive(pid):
                path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            raise RunLockedError(
                f"{out} is being trained by process {pid} on {owner.strip()}; wait for it to "
                f"finish, or delete {path} if that process no longer exists"
            ) from None
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()} {host}")
        return path
    raise RunLockedError(f"could not acquire {path}; another process keeps creating it")


def write_history(out: Path, history: list[dict]) -> None:
    """``history.json`` and ``history.csv`` (atomically)."""
    atomic_write_text(out / "history.json", json.dumps(history, indent=1) + "\n")
    keys: list[str] = []
    for row in history:
        keys += [k for k in row if k not in keys]
    with atomic_target(out / "history.csv") as tmp, open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(history)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line naming the file and the fix."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def _numpy_globals() -> list:
    """The numpy globals a format-1 checkpoint's RNG state needs (arrays of plain dtypes)."""
    import importlib

    out = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            out.append(importlib.import_module(mod)._reconstruct)
        except (ImportError, AttributeError):
            pass
    return out


def _load(path: Path) -> Any:
    with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": foreign files are ours
        warnings.simplefilter("ignore")  # to explain, in one line
        return torch.load(path, map_location="cpu", weights_only=True)


#: the keys of a run's checkpoint (``dualdrop sparsify``); ``fit`` names its own
RUN_KEYS = ("format", "model", "config", "epoch")


def read_checkpoint(path: str | os.PathLike, fix: str, *, keys=RUN_KEYS) -> dict:
    """Load a dualdrop training checkpoint with ``weights_only=True``.

    Anything unusable (empty, truncated, corrupt, a foreign file, an unknown format, a dict
    without ``keys``) raises :class:`CheckpointError` with one line naming ``path`` and ending
    with ``fix`` (what to do). A format-1 checkpoint (older dualdrop: numpy's RNG state as an
    array) is read with only numpy's array reconstruction allowed besides tensors, and
    converted. ``keys``: the entries the checkpoint must have (a run's, or ``fit``'s).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; {fix}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes); {fix}")
    try:
        ck = _load(path)
    except pickle.UnpicklingError as exc:
        try:
            with torch.serialization.safe_globals(_numpy_globals()):
                ck = _load(path)
        except Exception:
            found = re.search(r"GLOBAL (\S+)", str(exc))
            what = f"a {found.group(1)}" if found else "objects other than tensors and plain values"
            raise CheckpointError(f"{path} is not a dualdrop checkpoint (it holds {what}, which a "
                                  f"weights-only load refuses); {fix}") from None
        if not (isinstance(ck, dict) and ck.get("format") == 1):
            raise CheckpointError(f"{path} is not a dualdrop checkpoint (it holds numpy arrays); "
                                  f"{fix}") from None
        ck = dict(ck, format=2, rng=[_rng_from_format1(r) for r in ck["rng"]])
        print(f"note: {path} is an older dualdrop checkpoint (format 1); read with numpy arrays "
              f"allowed, it is rewritten as format {FORMAT_VERSION} at the next checkpoint",
              file=sys.stderr)
    except Exception as exc:  # zip reader errors (RuntimeError), EOFError, OSError, ...
        msg = f"{path} is truncated or corrupt ({_first_line(exc)}); {fix}"
        raise CheckpointError(msg) from None
    if isinstance(ck, dict):
        ck = upgrade(ck, path, fix)
    if not isinstance(ck, dict) or not set(keys) <= set(ck):
        what = (f"a dict with keys {sorted(map(str, ck))[:6]}" if isinstance(ck, dict)
                else f"a {type(ck).__name__}")
        raise CheckpointError(f"{path} is not a dualdrop training checkpoint (it holds {what}); "
                              f"{fix}")
    if "format" in keys and ck["format"] != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {ck['format']!r}, this dualdrop "
                              f"reads format {FORMAT_VERSION}; {fix}")
    return ck


#: the entries every format-3 checkpoint has (``dualdrop.train.engine.fit`` writes them; the
#: CLI's runs add ``config``, ``data_order``, ``init`` and ``arch``)
STATE_KEYS = ("format", "model", "optimizer", "scheduler", "sparsifier", "step", "epoch",
              "done_in_epoch", "total_steps", "epoch_rng", "rng", "history")


def upgrade(ck: dict, path, fix: str) -> dict:
    """A checkpoint dict of an older format in the current one (format 3); a dict of a newer or
    unknown format is refused naming its version (:class:`CheckpointError`).

    Format 2 (the CLI's per-epoch checkpoint): taken at an epoch's end, so ``done_in_epoch`` is
    0 and there is no epoch-start state; its budget in steps is not recorded (``None``: the
    run's configuration, compared on resume, fixes it). ``fit``'s checkpoints without a format
    entry: the RNG states of its one process become a list of one."""
    version = ck.get("format")
    if version is None and {"model", "sparsifier", "total_steps", "done_in_epoch"} <= set(ck):
        # fit's, before format 3 (other files, e.g. heal's, are left as they are)
        rng, erng = ck.get("rng"), ck.get("epoch_rng")
        return {**ck, "format": FORMAT_VERSION, "rng": [rng] if rng is not None else None,
                "epoch_rng": [erng] if erng is not None else None}
    if version == 2:
        return {"optimizer": None, "scheduler": None, "sparsifier": None, **ck,
                "format": FORMAT_VERSION, "done_in_epoch": 0, "epoch_rng": None,
                "total_steps": ck.get("total_steps")}
    if version is not None and version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format {version!r}, this dualdrop reads "
                              f"formats 1 to {FORMAT_VERSION} (a newer dualdrop wrote it?); "
                              f"{fix}")
    return ck


def load_checkpoint(path: Path, run_cfg: dict) -> dict:
    """The checkpoint at ``path`` of a run whose configuration must equal ``run_cfg``."""
    ckpt = read_checkpoint(path, fix="delete it to start the run again (or restore it from a "
                           "copy), or choose another output folder")
    saved = dict(ckpt["config"])
    saved["hparams"] = with_new_defaults(saved.get("hparams"), run_cfg.get("hparams"),
                                          run_cfg.get("method"))
    # both ways: an option the checkpoint has and the command now lacks (--model, --init-from,
    # --lam-warmup) differs as much as a changed value
    diff = {k: (saved.get(k), run_cfg.get(k)) for k in {**saved, **run_cfg}
            if saved.get(k) != run_cfg.get(k)}
    if diff:
        detail = "; ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        epochs = saved.get("epochs")
        if isinstance(epochs, int) and int(ckpt["epoch"]) >= epochs:
            folder = Path(path).parent
            raise ValueError(
                f"{folder} holds a finished run ({epochs} of {epochs} epochs; its results are "
                f"in {folder / 'final.json'}), and the settings now differ ({detail}). A "
                "finished run is not extended: its learning rate decayed to 0 over its "
                f"{epochs} epochs. To train on from its weights, start a new run: "
                f"--init-from {folder} --out NEW_FOLDER (with the --epochs you want); to see "
                "its results, repeat its original command with --resume or call "
                f"dualdrop.train.load_run({str(folder)!r})"
            )
        raise ValueError(
            f"cannot resume {path}: the run configuration differs ({detail}); use "
            "the original settings or another out directory"
        )
    return ckpt


def with_new_defaults(saved, now, method):
    """``saved`` hyperparameters plus every one a later dualdrop added (absent from ``saved``)
    whose value now is the method's default: such a run was trained with that default's
    behaviour, so it stays resumable (and a finished run stays finished) across the upgrade."""
    if not isinstance(saved, dict) or not isinstance(now, dict) or not method:
        return saved
    try:
        from dualdrop.nn import default_hparams

        defaults = default_hparams(method)
    except (ValueError, KeyError, TypeError):
        return saved
    added = {k: v for k, v in now.items()
             if k not in saved and k in defaults and defaults[k] == v}
    return {**saved, **added}


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars and tensors as plain Python values (``repr`` of anything else)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)
