"""Training loop for network sparsification: checkpoints, exact resume, data parallel.

:func:`train` trains LeNet-300-100 (input size from the data) with one sparsification method of
:mod:`dualdrop.nn` (or ``"none"``: the dense baseline), following the seed's protocol: Adam,
batch 128, learning rate decayed linearly to 0 over all steps, 80/20 train/validation split.

Outputs in ``TrainConfig.out``:

- ``history.json`` / ``history.csv``: one row per epoch: training cross-entropy (mean over the
  epoch's samples), the regularizer of the weights at the end of the epoch (the steps use its
  gradient only: ``Sparsifier.regularizer(n, value=False)``), validation error, fraction of nonzero *weights* (biases are
  not counted) per layer and in total, seconds of training and of evaluation;
- ``checkpoint.pt``: written atomically (temporary file + ``os.replace``) after every epoch, with
  model, optimizer and scheduler states, the RNG states of torch / numpy / python of every rank,
  and the data-order state; ``resume=True`` continues from it *exactly* (same weights, bit for
  bit, as an uninterrupted run on the same device and world size);
- ``final.json``: end-of-training test error (never the best seen during training: the test set
  is read only here), validation error, density, per-layer report.

Data parallel: launched by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment), each process
takes an interleaved share of every global batch of ``batch_size`` samples, the gradients are
summed with ``all_reduce`` (gloo on CPU, nccl on CUDA) so that every process makes the same step
as one process would on the whole batch; the per-process noise streams differ (seed + rank).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dualdrop.data import Dataset, load_dataset
from dualdrop.train.models import lenet_300_100

DENSE = "none"
DENSE_ALIASES = ("none", "dense")
DENSE_DEFAULTS = {"lr": 1e-3}
# keys of default_hparams(method) that belong to the training loop, not to sparsify()
TRAIN_KEYS = ("lr",)
CHECKPOINT = "checkpoint.pt"
FORMAT_VERSION = 1


# ----------------------------------------------------------------------------- methods


def _nn():
    """Import :mod:`dualdrop.nn` with a clear error when it is not available."""
    try:
        import dualdrop.nn as dnn
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"sparsification methods need dualdrop.nn, which failed to import ({exc}); "
            f"method={DENSE!r} trains the dense baseline without it"
        ) from exc
    return dnn


def available_methods() -> tuple[str, ...]:
    """Method names accepted by :func:`train` (``"none"`` plus :data:`dualdrop.nn.METHODS`)."""
    try:
        methods = tuple(_nn().METHODS)
    except ImportError:
        methods = ()
    return (DENSE,) + methods


def check_method(method: Any) -> str:
    """Validate a method name; return it canonical (``"dense"`` -> ``"none"``)."""
    if not isinstance(method, str):
        raise TypeError(f"method={method!r} must be a str such as 'vardrop-lr' or 'none'")
    if method in DENSE_ALIASES:
        return DENSE
    dnn = _nn()
    if method in dnn.METHODS or (method.startswith("penalty:") and len(method) > len("penalty:")):
        return method
    raise ValueError(
        f"method={method!r} is unknown; choose one of {', '.join(available_methods())} or "
        "'penalty:<name>' with a penalties catalog name"
    )


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Convert an override to the type of its default, refusing lossy or odd conversions."""
    if isinstance(value, str) and isinstance(default, (dict, list, tuple)):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"hyperparameter {key}={value!r}: expected JSON like its default {default!r} "
                f"({exc.msg})"
            ) from None
        if not isinstance(parsed, dict if isinstance(default, dict) else list):
            raise ValueError(f"hyperparameter {key}={value!r}: expected JSON of the type of "
                             f"its default {default!r}")
        return parsed
    if isinstance(value, str) and not isinstance(default, str):
        text = value.strip()
        if isinstance(default, bool):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"hyperparameter {key}={value!r}: expected true/false")
        if isinstance(default, int) and not isinstance(default, bool):
            try:
                return int(text)
            except ValueError:
                pass
        if isinstance(default, (int, float)) or default is None:
            try:
                return float(text)
            except ValueError:
                if default is None:
                    return value
                raise ValueError(
                    f"hyperparameter {key}={value!r}: expected a number like its default "
                    f"{default!r}"
                ) from None
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def resolve_hparams(
    method: str, lr: float | None = None, overrides: dict | None = None
) -> tuple[float, dict]:
    """Learning rate and sparsify() keyword arguments of ``method`` after the overrides.

    The defaults are the seed's (``dualdrop.nn.default_hparams``); ``overrides`` may only name
    keys present there (anything else raises ``ValueError`` listing the valid keys). The learning
    rate is popped from the defaults: it belongs to the training loop.
    """
    method = check_method(method)
    defaults = dict(DENSE_DEFAULTS) if method == DENSE else dict(_nn().default_hparams(method))
    base_lr = defaults.get("lr", DENSE_DEFAULTS["lr"])
    hp = {k: v for k, v in defaults.items() if k not in TRAIN_KEYS}
    for key, value in (overrides or {}).items():
        if key == "lr":
            raise ValueError("give the learning rate as lr=..., not as a method hyperparameter")
        if key not in hp:
            valid = ", ".join(sorted(hp)) or "(none)"
            raise ValueError(
                f"unknown hyperparameter {key!r} for method {method!r}; valid keys: {valid}"
            )
        hp[key] = _coerce(key, value, hp[key])
    if lr is None:
        lr = base_lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr={lr!r}; expected a positive finite number (seed default {base_lr})")
    return float(lr), hp


# ----------------------------------------------------------------------------- config


@dataclass
class TrainConfig:
    """Everything a run depends on. See :func:`train`."""

    method: str = DENSE
    epochs: int = 10
    out: str = "runs/sparsify"
    data_dir: str | None = None
    seed: int = 0
    device: str = "cpu"
    lr: float | None = None
    hparams: dict = field(default_factory=dict)
    batch_size: int = 128
    val_fraction: float = 0.2
    resume: bool = False
    stop_after: int | None = None  # stop (checkpointed) after this epoch; resume later
    progress: bool = True
    threads: int | None = None
    verify_data: bool = True
    eval_batch_size: int = 4096
    # Flush subnormal floats to zero during training (CPU). Penalty methods shrink weights
    # geometrically towards 0: without this, subnormal weights and Adam moments slow every
    # matmul and elementwise op on x86 by orders of magnitude (eta-trick on MNIST went from 51 to
    # 290 s/epoch within 10 epochs). Values below 1.2e-38 become 0; restored when train() ends.
    flush_denormal: bool = True
    # After training, also report the sparsest test-time tolerance whose *validation* error is
    # at most this much (absolute, e.g. 0.001 = 0.1 points) above the trained tol's; None: off.
    # Only the validation split takes part in the choice; the test error of the chosen tol is
    # reported beside the trained one in final.json["selected_tol"].
    select_tol_margin: float | None = None
    # Warm start: a run folder (or its checkpoint.pt) whose test-time network (masks and gates
    # folded in, as export_sparse gives it) initializes the weights before sparsify; e.g. a dense
    # run, as sparse variational dropout starts from a pretrained network. None: random init.
    init_from: str | None = None

    def validate(self) -> None:
        def pos_int(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}; expected a positive int")

        for name in ("epochs", "batch_size", "eval_batch_size"):
            pos_int(name)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}; expected a non-negative int")
        if self.stop_after is not None:
            if isinstance(self.stop_after, bool) or not isinstance(self.stop_after, int) \
                    or not 1 <= self.stop_after <= self.epochs:
                raise ValueError(
                    f"stop_after={self.stop_after!r}; expected an epoch in 1..epochs={self.epochs}"
                )
        if self.threads is not None:
            pos_int("threads")
        m = self.select_tol_margin
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float))
                              or not math.isfinite(m) or not 0 <= m < 1):
            raise ValueError(f"select_tol_margin={m!r}; expected a validation-error margin in "
                             "[0, 1), e.g. 0.001 for 0.1 points, or None")
        if not isinstance(self.hparams, dict):
            raise TypeError(f"hparams={self.hparams!r}; expected a dict of overrides")
        _device(self.device)


def _device(spec: str) -> torch.device:
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={spec!r}; expected 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={spec!r}; expected 'cpu', 'cuda' or 'cuda:N'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={spec!r} but CUDA is not available here; use --device cpu")
    return dev


# ----------------------------------------------------------------------------- distributed


class _Dist:
    """World description; a no-op for a single process."""

    def __init__(self, device: torch.device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.owned = False
        self.device = device
        if self.world > 1:
            import torch.distributed as dist

            if device.type == "cuda":
                self.device = torch.device("cuda", self.local_rank)
                torch.cuda.set_device(self.device)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
                self.owned = True
            self.world = dist.get_world_size()
            self.rank = dist.get_rank()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def broadcast_module(self, module: nn.Module) -> None:
        if self.world > 1:
            import torch.distributed as dist

            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, 0)

    def allreduce_grads(self, params: list[torch.Tensor]) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def sum_floats(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    @torch.no_grad()
    def check_in_sync(self, module: nn.Module) -> None:
        """Raise if the processes' parameters or buffers have drifted apart (they must not)."""
        if self.world == 1:
            return
        tensors = list(module.parameters()) + [b for b in module.buffers()
                                                if b.is_floating_point()]
        digest = [float(t.double().sum()) for t in tensors]
        digests = self.gather(digest)
        if any(d != digests[0] for d in digests[1:]):
            raise RuntimeError(
                "data-parallel processes hold different weights; a method's state is updated "
                "from per-process randomness or data outside the gradient all-reduce"
            )

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.owned:
            import torch.distributed as dist

            # every rank reaches this point before any tears gloo down: a rank destroying its
            # process group while a peer still uses the connection aborts the peer at exit
            dist.barrier()
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- helpers


def _rng_state(device: torch.device) -> dict:
    st = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def _set_rng_state(st: dict, device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Sample order of ``epoch`` (0-based): a permutation determined by (seed, epoch) alone.

    Independent of everything else in the run, so that the data order of a resumed run is the
    one of an uninterrupted run; this pair is the data-order state stored in checkpoints.
    """
    g = torch.Generator()
    g.manual_seed(int(seed) * 1_000_003 + int(epoch) + 1)
    return torch.randperm(n, generator=g)


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


def dense_density(model: nn.Module) -> dict:
    """Fraction of nonzero weights of every ``nn.Linear`` (biases excluded) and in total."""
    out, nz, tot = {}, 0, 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            w = mod.weight.detach()
            k = int(torch.count_nonzero(w))
            out[name] = k / w.numel()
            nz += k
            tot += w.numel()
    out["total"] = nz / max(tot, 1)
    return out


@torch.no_grad()
def error_rate(model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> float:
    """Misclassification rate of ``model`` in eval mode (the deterministic test-time network)."""
    was = model.training
    model.eval()
    wrong = 0
    for i in range(0, len(y), batch):
        wrong += int((model(X[i:i + batch]).argmax(1) != y[i:i + batch]).sum())
    model.train(was)
    return wrong / max(len(y), 1)


#: keep-ratio tolerances of the validation sweep in ``final.json`` (the trained default is 0.05)
SWEEP_TOLS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7)


@torch.no_grad()
def tol_sweep(sp, model: nn.Module, X: torch.Tensor, y: torch.Tensor,
              tols=SWEEP_TOLS, batch: int = 4096) -> list[dict]:
    """Density and error of the trained network at other test-time tolerances ``tol``.

    The trade-off curve of one trained network, free of retraining: for each ``tol`` the fraction
    of nonzero weights and the error on ``(X, y)``, which must be *validation* data (select on
    it; report the test error of the chosen ``tol`` once, e.g. ``dualdrop evaluate``). Values
    the method cannot express are skipped. The Sparsifier's own ``tol`` is restored afterwards.
    """
    if not sp.has_tol:
        return []
    was_training = model.training
    own = sp.hparams["tol"]
    rows = []
    try:
        for tol in tols:
            try:
                sp.set_tol(tol)
            except ValueError:  # e.g. below what vardrop's log-alpha clip can express
                continue
            rows.append({"tol": float(tol), "nonzero_total": float(sp.density()["total"]),
                         "error": error_rate(model, X, y, batch)})
    finally:
        sp.set_tol(own)
        model.train(was_training)
    return rows


@torch.no_grad()
def select_tol(sp, model: nn.Module, sweep: list[dict], val_error: float, margin: float,
               X_test: torch.Tensor, y_test: torch.Tensor, batch: int = 4096) -> dict:
    """The sparsest ``tol`` of a validation ``sweep`` (see :func:`tol_sweep`) whose validation
    error is at most ``val_error + margin``, with its test error and densities. The choice sees
    validation numbers only; the test set is evaluated once, at the chosen ``tol``."""
    ok = [r for r in sweep if r["error"] <= val_error + margin + 1e-12]
    if not ok:  # the trained tol itself is always admissible; keep it
        return {"tol": sp.hparams["tol"], "margin": margin, "note": "no sweep point qualified"}
    own = sp.hparams["tol"]
    # ties in density (the same network): the tolerance closest to the trained one
    best = min(ok, key=lambda r: (r["nonzero_total"], abs(math.log(r["tol"] / own))))
    try:
        sp.set_tol(best["tol"])
        dens = sp.density()
        test = error_rate(model, X_test, y_test, batch)
    finally:
        sp.set_tol(own)
    return {"tol": best["tol"], "margin": margin, "val_error": best["error"],
            "test_error": test, "nonzero_total": float(dens["total"]),
            "nonzero": {k: float(v) for k, v in dens.items() if k != "total"}}


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


def make_adam(params: list, lr: float) -> torch.optim.Adam:
    """Adam with torch's fused kernel where this torch build has one for ``device`` (one pass
    over each tensor instead of ~10; measured 0.54 -> 0.17 ms per LeNet-300-100 step on the CPU),
    else the default implementation. Same update rule and state keys either way."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def _run_config(cfg: TrainConfig, lr: float, hp: dict, data: Dataset, world: int) -> dict:
    """The part of the configuration that a resumed run must share with the checkpoint."""
    return {
        "method": cfg.method, "epochs": cfg.epochs, "lr": lr, "hparams": hp,
        "batch_size": cfg.batch_size, "seed": cfg.seed, "val_fraction": cfg.val_fraction,
        "data": data.name, "data_fingerprint": data.fingerprint(),
        "n_features": data.n_features, "world_size": world,
        **({"init_from": str(Path(cfg.init_from).resolve())} if cfg.init_from else {}),
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)


# ----------------------------------------------------------------------------- train


def train(cfg: TrainConfig, data: Dataset | None = None) -> dict:
    """Train one method; return the final report (also written to ``out/final.json``).

    ``data`` defaults to ``load_dataset(cfg.data_dir, seed=cfg.seed)`` (embedded digits when
    ``data_dir`` is None). If ``cfg.stop_after`` ends the run early, the returned dict has
    ``"status": "stopped"`` and no test error; ``resume=True`` continues it later.
    """
    cfg = dataclasses.replace(cfg)
    cfg.validate()
    cfg.method = check_method(cfg.method)
    lr, hp = resolve_hparams(cfg.method, cfg.lr, cfg.hparams)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    _nn().tune_allocator()  # also for the dense baseline: same allocator as the methods
    out = Path(cfg.out)
    lock = None
    flushed = bool(cfg.flush_denormal) and torch.set_flush_denormal(True)
    try:
        dist_ = _Dist(_device(cfg.device))
    except BaseException:
        if flushed:
            torch.set_flush_denormal(False)
        raise
    try:
        dev = dist_.device
        if data is None:
            data = load_dataset(cfg.data_dir, seed=cfg.seed, val_fraction=cfg.val_fraction,
                                verify=cfg.verify_data)
        run_cfg = _run_config(cfg, lr, hp, data, dist_.world)
        ckpt_path = out / CHECKPOINT
        final_path = out / "final.json"
        if dist_.main:
            out.mkdir(parents=True, exist_ok=True)
            lock = acquire_lock(out)
        dist_.barrier()
        ckpt = None
        if ckpt_path.exists():
            if not cfg.resume:
                raise FileExistsError(
                    f"{ckpt_path} exists; pass resume=True (--resume) to continue that run, or "
                    "choose another out directory"
                )
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
            if ckpt.get("format") != FORMAT_VERSION:
                raise ValueError(f"{ckpt_path}: unknown checkpoint format {ckpt.get('format')!r}")
            diff = {k: (ckpt["config"].get(k), v) for k, v in run_cfg.items()
                    if ckpt["config"].get(k) != v}
            if diff:
                detail = "; ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
                raise ValueError(
                    f"cannot resume {ckpt_path}: the run configuration differs ({detail}); use "
                    "the original settings or another out directory"
                )
            if ckpt["epoch"] >= cfg.epochs and final_path.exists():
                with open(final_path) as fh:
                    return json.load(fh)

        # ---- model, method, optimizer, schedule (same construction on fresh and resumed runs)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        random.seed(cfg.seed)
        model = lenet_300_100(data.n_features, data.n_classes)
        init_info = None
        if cfg.init_from and ckpt is None:  # a resumed run has its own weights
            init_sd, init_info = init_weights(cfg.init_from, data.n_features, data.n_classes)
            model.load_state_dict(init_sd)
        sp = None
        if cfg.method != DENSE:
            sp = _nn().sparsify(model, cfg.method, **hp)
        model.to(dev)
        dist_.broadcast_module(model)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_adam(params, lr)
        n_train = len(data.y_train)
        steps_per_epoch = math.ceil(n_train / cfg.batch_size)
        total_steps = steps_per_epoch * cfg.epochs
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: max(0.0, 1.0 - s / total_steps)
        )
        # per-process noise streams
        torch.manual_seed(cfg.seed + 7919 * (dist_.rank + 1))
        if dev.type == "cuda":
            torch.cuda.manual_seed(cfg.seed + 7919 * (dist_.rank + 1))

        history: list[dict] = []
        start_epoch = 0
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            history = list(ckpt["history"])
            start_epoch = int(ckpt["epoch"])
            rngs = ckpt["rng"]
            _set_rng_state(rngs[dist_.rank], dev)
            if ckpt["data_order"] != {"seed": cfg.seed, "next_epoch": start_epoch}:
                raise ValueError(f"{ckpt_path}: inconsistent data-order state")

        Xtr = torch.from_numpy(data.X_train).to(dev)
        ytr = torch.from_numpy(data.y_train).to(dev)
        Xva = torch.from_numpy(data.X_val).to(dev)
        yva = torch.from_numpy(data.y_val).to(dev)
        density = (lambda: sp.density()) if sp is not None else (lambda: dense_density(model))

        last = cfg.epochs if cfg.stop_after is None else cfg.stop_after
        bar = None
        if cfg.progress and dist_.main:
            from tqdm.auto import tqdm

            bar = tqdm(total=(last - start_epoch) * steps_per_epoch, mininterval=1.0,
                       desc=f"{cfg.method}", unit="step", file=sys.stderr, dynamic_ncols=True)
        model.train()
        step = start_epoch * steps_per_epoch
        for epoch in range(start_epoch, last):
            t0 = time.perf_counter()
            order = epoch_order(n_train, cfg.seed, epoch).to(dev)
            ce_sum_epoch = 0.0
            for b in range(steps_per_epoch):
                idx = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
                n_b = len(idx)
                idx = idx[dist_.rank::dist_.world]
                logits = model(Xtr[idx])
                ce_sum = F.cross_entropy(logits, ytr[idx], reduction="sum")
                loss = ce_sum / n_b
                if sp is not None:
                    # gradient only: the value is logged once per epoch below
                    loss = loss + sp.regularizer(n_train, value=False) / dist_.world
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                dist_.allreduce_grads(params)
                optimizer.step()
                step += 1
                if sp is not None:
                    # before the scheduler moves on: a prox step (AdaProx) must use the learning
                    # rate of the gradient step it completes, not the next one (which is 0 after
                    # the last step)
                    sp.after_step(optimizer, step, total_steps)
                scheduler.step()
                ce_sum_epoch += float(ce_sum.detach())
                if not math.isfinite(ce_sum_epoch):
                    raise FloatingPointError(
                        f"training diverged (non-finite loss) at epoch {epoch + 1}, step {step}; "
                        f"lower lr (now {lr}) or check the hyperparameters {hp}"
                    )
                if bar is not None:
                    bar.update(1)
            bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
            if bad:
                raise FloatingPointError(
                    f"non-finite weights after epoch {epoch + 1} in {', '.join(bad)} (method "
                    f"{cfg.method}, hyperparameters {hp}, lr {lr}); the run is not checkpointed "
                    "past the last finite epoch: resume from it after fixing the cause"
                )
            ce_total = dist_.sum_floats([ce_sum_epoch])[0]
            t_train = time.perf_counter() - t0
            t1 = time.perf_counter()
            reg_end = 0.0
            if sp is not None:
                with torch.no_grad():
                    reg_end = float(sp.regularizer(n_train))
            val_err = error_rate(model, Xva, yva, cfg.eval_batch_size)
            dens = density()
            t_eval = time.perf_counter() - t1
            row = {
                "epoch": epoch + 1,
                "step": step,
                "lr": optimizer.param_groups[0]["lr"],
                "train_loss": ce_total / n_train,
                "train_reg": reg_end,
                "val_error": val_err,
                "nonzero_total": float(dens["total"]),
            }
            for k, v in dens.items():
                if k != "total":
                    row[f"nonzero_{k}"] = float(v)
            row["seconds"] = t_train
            row["eval_seconds"] = t_eval
            history.append(row)
            dist_.check_in_sync(model)
            rngs = dist_.gather(_rng_state(dev))
            if dist_.main:
                state = {
                    "format": FORMAT_VERSION,
                    "config": run_cfg,
                    "epoch": epoch + 1,
                    "step": step,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "rng": rngs,
                    "data_order": {"seed": cfg.seed, "next_epoch": epoch + 1},
                    "history": history,
                    "init": init_info if ckpt is None else ckpt.get("init"),
                }
                atomic_save(state, ckpt_path)
                write_history(out, history)
            if bar is not None:
                bar.set_postfix(epoch=epoch + 1, val_err=f"{val_err:.4f}",
                                nonzero=f"{dens['total']:.4f}", refresh=False)
            dist_.barrier()
        if bar is not None:
            bar.close()

        if last < cfg.epochs:
            return {"status": "stopped", "epoch": max(last, start_epoch), "out": str(out),
                    "history": history}

        # ---- final report: end-of-training numbers; the test set is read here only
        Xte = torch.from_numpy(data.X_test).to(dev)
        yte = torch.from_numpy(data.y_test).to(dev)
        test_err = error_rate(model, Xte, yte, cfg.eval_batch_size)
        dens = density()
        report = {
            "status": "finished",
            "method": cfg.method,
            "epochs": cfg.epochs,
            "lr": lr,
            "hparams": hp,
            "seed": cfg.seed,
            "data": data.summary(),
            "world_size": dist_.world,
            "device": str(dev),
            "test_error": test_err,
            "val_error": history[-1]["val_error"],
            "nonzero_total": float(dens["total"]),
            "nonzero": {k: float(v) for k, v in dens.items() if k != "total"},
            "nonzero_counts": "weights of the nn.Linear layers only; biases are not counted",
            "init_from": (init_info if ckpt is None else ckpt.get("init")),
            "seconds_per_epoch": float(np.mean([r["seconds"] for r in history])),
            "total_seconds": float(sum(r["seconds"] + r["eval_seconds"] for r in history)),
        }
        if sp is not None:
            dnn = _nn()
            report["val_tol_sweep"] = tol_sweep(sp, model, Xva, yva, SWEEP_TOLS,
                                                cfg.eval_batch_size)
            if cfg.select_tol_margin is not None and report["val_tol_sweep"]:
                report["selected_tol"] = select_tol(
                    sp, model, report["val_tol_sweep"], history[-1]["val_error"],
                    cfg.select_tol_margin, Xte, yte, cfg.eval_batch_size)
            report["layers"] = _jsonable(dnn.sparsity_report(model))
            try:
                exported = dnn.export_sparse(model).to(dev)
                report["exported_test_error"] = error_rate(exported, Xte, yte,
                                                           cfg.eval_batch_size)
            except Exception as exc:  # recorded, never hidden: the trained run stays usable
                report["export_error"] = f"{type(exc).__name__}: {exc}"
                print(f"warning: export_sparse failed: {report['export_error']}", file=sys.stderr)
        report = _jsonable(report)
        if dist_.main:
            atomic_write_text(final_path, json.dumps(report, indent=1) + "\n")
        dist_.barrier()
        return report
    finally:
        if lock is not None:
            lock.unlink(missing_ok=True)
        if flushed:
            torch.set_flush_denormal(False)
        dist_.close()
