"""Run configuration: the method, its hyperparameters and everything else a run depends on.

A run is named by a method of :mod:`dualdrop.nn` (or ``"none"``, the dense baseline) and its
hyperparameters. Their defaults are the paper's (LeJeune, Javadi, Baraniuk, NeurIPS 2021, and its
released code), read from ``dualdrop.nn.default_hparams``; the learning rate among them belongs to
the training loop and is split off here. Overrides arrive as text from the command line, so they
are converted to the type of their default, refusing lossy or odd conversions: a typo must fail
before any data is loaded, never train with a silently different value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dualdrop.nn.registry import dataset_hparams

#: Per-dataset defaults, below the user's overrides. MNIST: the paper's protocol (200 epochs,
#: batch 128, each method's own learning rate and hyperparameters). The embedded 8x8 digits have
#: 1,150 training samples, 42x fewer than MNIST's 48,000: at batch 128 an epoch is 9 steps, and
#: 5 epochs at the paper's learning rates end near chance with every weight still nonzero. Its
#: defaults were chosen on the validation split alone (benchmarks/RESULTS.md, "Digits
#: defaults"): more, smaller steps at a larger rate, and strengths per method. A key is applied only where the method has it.
DATASET_DEFAULTS: dict[str, dict] = {
    "mnist": {"epochs": 200, "batch_size": 128},
    "digits": {
        "epochs": 30, "batch_size": 32, "lr": 1e-2,
        # per method: hyperparameters (and "lr") replacing the paper's, from each method's
        # record (Method.dataset_defaults)
        "hparams": dataset_hparams("digits"),
    },
}


def dataset_of(data_dir: str | None) -> str:
    """The dataset name ``load_dataset(data_dir)`` will give, without loading it."""
    return "digits" if data_dir is None else "mnist"


def dataset_defaults(dataset: str | None) -> dict:
    """:data:`DATASET_DEFAULTS` of ``dataset`` (MNIST's, the paper's, for unknown names)."""
    return DATASET_DEFAULTS.get(dataset or "mnist", DATASET_DEFAULTS["mnist"])


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
    try:
        return _nn().method_class(method).name  # the Method record parses penalty:<name>
    except ValueError as exc:
        raise ValueError(f"method={method!r} is unknown: {exc} (or {DENSE!r}: the dense "
                         "baseline)") from None


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
    method: str, lr: float | None = None, overrides: dict | None = None,
    dataset: str | None = None,
) -> tuple[float, dict]:
    """Learning rate and sparsify() keyword arguments of ``method`` after the overrides.

    The defaults are the paper's (``dualdrop.nn.default_hparams``), then ``dataset``'s
    (:data:`DATASET_DEFAULTS`; ``None``: the paper's MNIST protocol); ``overrides`` may only name
    keys present there (anything else raises ``ValueError`` listing the valid keys). The learning
    rate is popped from the defaults: it belongs to the training loop.
    """
    method = check_method(method)
    defaults = dict(DENSE_DEFAULTS) if method == DENSE else dict(_nn().default_hparams(method))
    ds = dataset_defaults(dataset)
    own = ds.get("hparams", {}).get(method, {})
    base_lr = own.get("lr", ds.get("lr", defaults.get("lr", DENSE_DEFAULTS["lr"])))
    hp = {k: v for k, v in defaults.items() if k not in TRAIN_KEYS}
    hp.update({k: v for k, v in own.items() if k in hp})
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
        raise ValueError(f"lr={lr!r}; expected a positive finite number (default {base_lr})")
    return float(lr), hp


def check_hparams(method: str, hp: dict, model: str = "lenet300", exclude=None) -> None:
    """Raise ``ValueError`` now if ``sparsify`` would refuse ``hp`` (e.g. ``tol=2``).

    The method's own validation decides (one home for it): ``hp`` is applied to a throwaway
    copy of the network ``model`` at its constructor's default sizes
    (:func:`~dualdrop.train.models.example_model`), before any data is loaded or any folder
    created.
    """
    if method == DENSE:
        return
    from dualdrop.train.models import example_model

    try:
        _nn().sparsify(example_model(model), method, exclude=exclude, **hp)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"method {method!r}: {exc}") from None


@dataclass
class TrainConfig:
    """Everything a run depends on. See :func:`~dualdrop.train.train`."""

    method: str = DENSE
    epochs: int | None = None  # None: the dataset's default (DATASET_DEFAULTS)
    out: str = "runs/sparsify"
    data_dir: str | None = None
    seed: int = 0
    device: str = "cpu"
    lr: float | None = None
    hparams: dict = field(default_factory=dict)
    batch_size: int | None = None  # None: the dataset's default
    val_fraction: float = 0.2
    resume: bool = False
    stop_after: int | None = None  # stop (checkpointed) after this epoch; resume later
    progress: bool = True
    threads: int | None = None  # None: default_threads(); 0: torch's own choice
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
    # the network: "lenet300" (LeNet-300-100) or "lenet5" (LeNet-5-Caffe); see train.models
    model: str = "lenet300"
    # noise diagnostics every K epochs and at the end (dualdrop.train.diagnose_hook) on a fixed
    # validation subset of diagnose_samples points; None: off. Not part of the run's identity.
    diagnose_every: int | None = None
    diagnose_samples: int = 512
    # Warm-up of the regularizer strength: in epoch e (1-based) every layer's lam is
    # lam * min(1, e / lam_warmup), lam itself from epoch lam_warmup on (the per-epoch lam
    # schedule of the paper's released code, LamdaScheduler). Methods whose strength is lam:
    # the penalty methods and the eta-trick, and hardconcrete / vardrop with an explicit lam.
    # None: off. Part of the run's identity.
    lam_warmup: int | None = None
    # Per-layer strength: {layer: factor}, that layer's lam is lam * factor (others: lam), e.g.
    # {"fc1": 2.0, "fc3": 0.25}; layers by the names of the density report. Same methods as
    # lam_warmup (a numeric lam). None: one lam for every layer. Part of the run's identity.
    lam_layers: dict | None = None
    # Fraction of nonzero weights the finished network must have, for any method: its strength
    # becomes a multiplier driven by the measured density (dualdrop.nn.density). None: the
    # method's own strength. Part of the run's identity.
    target_density: float | None = None
    # Name patterns (fnmatch on parameter names, e.g. "embed.*" or "encoder.*.linear2.weight")
    # of weights the method leaves alone, as sparsify(exclude=...) takes them; under
    # granularity neuron/head the classifier is left alone as well. Part of the run's identity.
    exclude: list | None = None

    def with_defaults(self, dataset: str | None) -> "TrainConfig":
        """A copy with ``epochs`` / ``batch_size`` left at None set to ``dataset``'s defaults."""
        ds = dataset_defaults(dataset)
        return dataclasses.replace(
            self, epochs=ds["epochs"] if self.epochs is None else self.epochs,
            batch_size=ds["batch_size"] if self.batch_size is None else self.batch_size)

    def validate(self) -> None:
        """Raise ``ValueError`` / ``TypeError`` naming the first bad field (``epochs`` and
        ``batch_size`` may be None: the dataset's default)."""
        def pos_int(name, optional=False):
            v = getattr(self, name)
            if optional and v is None:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}; expected a positive int")

        for name in ("epochs", "batch_size"):
            pos_int(name, optional=True)
        pos_int("eval_batch_size")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}; expected a non-negative int")
        if self.stop_after is not None:
            if isinstance(self.stop_after, bool) or not isinstance(self.stop_after, int) \
                    or not 1 <= self.stop_after <= (self.epochs or self.stop_after):
                raise ValueError(
                    f"stop_after={self.stop_after!r}; expected an epoch in 1..epochs={self.epochs}"
                )
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"threads={t!r}; expected a positive int, 0 for torch's own choice "
                             "(one per core) or None for the default")
        m = self.select_tol_margin
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float))
                              or not math.isfinite(m) or not 0 <= m < 1):
            raise ValueError(f"select_tol_margin={m!r}; expected a validation-error margin in "
                             "[0, 1), e.g. 0.001 for 0.1 points, or None")
        if not isinstance(self.hparams, dict):
            raise TypeError(f"hparams={self.hparams!r}; expected a dict of overrides")
        device_of(self.device)
        from dualdrop.train.models import MODELS

        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r}; expected one of {sorted(MODELS)}")
        w = self.lam_warmup
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1
                              or (self.epochs is not None and w > self.epochs)):
            raise ValueError(f"lam_warmup={w!r}; expected a number of epochs in 1..epochs="
                             f"{self.epochs} (or None: no warm-up)")
        ll = self.lam_layers
        if ll is not None:
            if not isinstance(ll, dict) or not ll:
                raise TypeError(f"lam_layers={ll!r}; expected a non-empty dict layer -> factor, "
                                "e.g. {'fc1': 2.0}")
            for k, v in ll.items():
                if not isinstance(k, str) or isinstance(v, bool) \
                        or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                    raise ValueError(f"lam_layers[{k!r}]={v!r}; expected a layer name and a "
                                     "positive finite factor")
        ex = self.exclude
        if ex is not None and (not isinstance(ex, (list, tuple)) or not ex or not all(
                isinstance(e, str) and e for e in ex)):
            raise TypeError(f"exclude={ex!r}; expected a non-empty list of parameter name "
                            "patterns, e.g. ['embed.*'] (or None: exclude nothing)")
        from dualdrop.train.diagnose_hook import check_options

        check_options(self.diagnose_every, self.diagnose_samples)


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


def default_threads() -> int:
    """torch intra-op threads per training process when none are asked for: half the cores
    available to this process, shared among the ``torchrun`` processes on this machine, at
    least 1 and at most 4.

    torch's own default is one thread per core. On a 2-core machine that also ran other work, a
    LeNet-300-100 step took 10-19x longer with 2 threads than with 1 (medians; single runs up to
    46x; benchmarks/RESULTS.md, "Threads"): a descheduled thread stalls every parallel op. Half
    the cores leaves room for the rest of the machine; beyond 4 threads these small matrices
    gain little.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(4, cores // (2 * max(local, 1))))


def run_config(cfg: TrainConfig, lr: float, hp: dict, data, world: int) -> dict:
    """The part of the configuration that a resumed run must share with the checkpoint."""
    return {
        "method": cfg.method, "epochs": cfg.epochs, "lr": lr, "hparams": hp,
        "batch_size": cfg.batch_size, "seed": cfg.seed, "val_fraction": cfg.val_fraction,
        "data": data.name, "data_fingerprint": data.fingerprint(),
        "n_features": data.n_features, "world_size": world,
        **({"init_from": str(Path(cfg.init_from).resolve())} if cfg.init_from else {}),
        **({"model": cfg.model} if cfg.model != "lenet300" else {}),
        **({"lam_warmup": cfg.lam_warmup} if cfg.lam_warmup else {}),
        **({"target_density": float(cfg.target_density)} if cfg.target_density else {}),
        **({"exclude": list(cfg.exclude)} if cfg.exclude else {}),
        **({"lam_layers": {k: float(v) for k, v in sorted(cfg.lam_layers.items())}}
           if cfg.lam_layers else {}),
    }


def check_lam_schedule(cfg: TrainConfig, hp: dict) -> None:
    """``ValueError`` before any data is loaded if ``lam_warmup`` / ``lam_layers`` have no
    ``lam`` to act on, or name a layer the network lacks."""
    for name, flag, value in (("lam_warmup", "--lam-warmup", cfg.lam_warmup),
                              ("lam_layers", "--lam-layer", cfg.lam_layers)):
        if value is None:
            continue
        lam = hp.get("lam")
        if cfg.method == DENSE:
            raise ValueError(f"{name}: the dense baseline has no regularizer; drop {flag}")
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam > 0:
            raise ValueError(f"{name}: method {cfg.method!r} has lam={lam!r}; {flag} acts on a "
                             f"numeric lam: set one (--hp lam=...) or drop {flag}")
    if cfg.lam_layers:
        from dualdrop.train.models import example_model

        # the layer names do not depend on the data's sizes: a throwaway copy at the
        # constructor's defaults names them before any data is loaded
        sp = _nn().sparsify(example_model(cfg.model), cfg.method, **hp)
        known = [t.key for t, _ in sp.states()]
        bad = sorted(set(cfg.lam_layers) - set(known))
        if bad:
            raise ValueError(f"lam_layers: no sparsified layer {', '.join(map(repr, bad))} in "
                             f"{cfg.model}; its layers: {', '.join(known)}")
