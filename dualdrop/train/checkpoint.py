"""Run files: checkpoints, RNG states, atomic writes, the run lock, warm-start weights.

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
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dualdrop.train.config import DENSE, _nn
from dualdrop.train.models import lenet_300_100

CHECKPOINT = "checkpoint.pt"
FORMAT_VERSION = 1


def rng_state(device: torch.device) -> dict:
    """The RNG states of torch, numpy and python (and CUDA on a CUDA device) of this process."""
    st = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: dict, device: torch.device) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file in the same folder, then ``os.replace`` it in place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunLockedError(FileExistsError):
    """Another live process is training into the same output folder."""


def _pid_alive(pid: int) -> bool:
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
            if owner.strip() == host and not _pid_alive(pid):
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
    tmp = out / f".history.csv.{os.getpid()}.tmp"
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(history)
    os.replace(tmp, out / "history.csv")


def load_checkpoint(path: Path, run_cfg: dict) -> dict:
    """The checkpoint at ``path`` of a run whose configuration must equal ``run_cfg``."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if ckpt.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: unknown checkpoint format {ckpt.get('format')!r}")
    diff = {k: (ckpt["config"].get(k), v) for k, v in run_cfg.items()
            if ckpt["config"].get(k) != v}
    if diff:
        detail = "; ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"cannot resume {path}: the run configuration differs ({detail}); use "
            "the original settings or another out directory"
        )
    return ckpt


def init_weights(source: str | os.PathLike, n_features: int, n_classes: int):
    """Plain LeNet-300-100 weights from a run folder or checkpoint, and a record of them.

    A sparsified run's checkpoint is rebuilt with its own method and hyperparameters and folded
    with ``export_sparse(layout="dense")`` (its test-time network); a dense run's is used as is.
    """
    path = Path(source)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"init_from={str(source)!r}: no checkpoint at {path}; pass a run "
                                "folder written by dualdrop sparsify, or its checkpoint.pt")
    ck = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ck, dict) or ck.get("format") != FORMAT_VERSION or "model" not in ck:
        raise ValueError(f"init_from={str(source)!r}: {path} is not a dualdrop training checkpoint")
    conf = ck["config"]
    if conf.get("n_features") != n_features:
        raise ValueError(f"init_from={str(source)!r}: that run had {conf.get('n_features')} input "
                         f"features, this data has {n_features}")
    src = lenet_300_100(n_features, n_classes)
    if conf["method"] != DENSE:
        dnn = _nn()
        dnn.sparsify(src, conf["method"], **conf["hparams"])
        src.load_state_dict(ck["model"])
        src = dnn.export_sparse(src, layout="dense")
    else:
        src.load_state_dict(ck["model"])
    sd = {k: v.detach().clone() for k, v in src.state_dict().items()}
    nnz = sum(int(torch.count_nonzero(v)) for k, v in sd.items() if k.endswith("weight"))
    tot = sum(v.numel() for k, v in sd.items() if k.endswith("weight"))
    info = {"path": str(path.resolve()), "method": conf["method"], "epoch": int(ck["epoch"]),
            "nonzero_total": nnz / tot}
    return sd, info


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
