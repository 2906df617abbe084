"""Run configuration: the method, its hyperparameters and everything else a run depends on.

A run is named by a method of :mod:`dualdrop.nn` (or ``"none"``, the dense baseline) and its
hyperparameters. Their defaults are the paper's (LeJeune, Javadi, Baraniuk, NeurIPS 2021, and its
released code), read from ``dualdrop.nn.default_hparams``; the learning rate among them belongs to
the training loop and is split off here. Overrides arrive as text from the command line, so they
are converted to the type of their default, refusing lossy or odd conversions: a typo must fail
before any data is loaded, never train with a silently different value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DENSE = "none"
DENSE_ALIASES = ("none", "dense")
DENSE_DEFAULTS = {"lr": 1e-3}
# keys of default_hparams(method) that belong to the training loop, not to sparsify()
TRAIN_KEYS = ("lr",)


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
    """Method names accepted by :func:`~dualdrop.train.train` (``"none"`` plus
    :data:`dualdrop.nn.METHODS`)."""
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

    The defaults are the paper's (``dualdrop.nn.default_hparams``); ``overrides`` may only name
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
        raise ValueError(f"lr={lr!r}; expected a positive finite number (the paper's default "
                         f"{base_lr})")
    return float(lr), hp


@dataclass
class TrainConfig:
    """Everything a run depends on. See :func:`~dualdrop.train.train`."""

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
        device_of(self.device)


def device_of(spec: str) -> torch.device:
    """``torch.device`` of a ``--device`` string; ``ValueError`` naming the fix otherwise."""
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={spec!r}; expected 'cpu', 'cuda' or 'cuda:N'") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={spec!r}; expected 'cpu', 'cuda' or 'cuda:N'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={spec!r} but CUDA is not available here; use --device cpu")
    return dev


def run_config(cfg: TrainConfig, lr: float, hp: dict, data, world: int) -> dict:
    """The part of the configuration that a resumed run must share with the checkpoint."""
    return {
        "method": cfg.method, "epochs": cfg.epochs, "lr": lr, "hparams": hp,
        "batch_size": cfg.batch_size, "seed": cfg.seed, "val_fraction": cfg.val_fraction,
        "data": data.name, "data_fingerprint": data.fingerprint(),
        "n_features": data.n_features, "world_size": world,
        **({"init_from": str(Path(cfg.init_from).resolve())} if cfg.init_from else {}),
    }
