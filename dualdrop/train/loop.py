"""The training loop for network sparsification: one method, one network, exact resume.

:func:`train` trains LeNet-300-100 (input size from the data) with one sparsification method of
:mod:`dualdrop.nn` (or ``"none"``: the dense baseline), following the protocol of the paper
(LeJeune, Javadi, Baraniuk, NeurIPS 2021): Adam, batch 128, learning rate decayed linearly to 0
over all steps, 80/20 train/validation split.

Outputs in ``TrainConfig.out``:

- ``history.json`` / ``history.csv``: one row per epoch: training cross-entropy (mean over the
  epoch's samples), the regularizer of the weights at the end of the epoch (the steps use its
  gradient only: ``Sparsifier.regularizer(n, value=False)``), validation error, fraction of
  nonzero *weights* (biases are not counted) per layer and in total, seconds of training and of
  evaluation;
- with ``diagnose_every=K``, the ``diag_*`` columns of every K-th and the last row: noise
  diagnostics on a fixed validation subset (:mod:`dualdrop.train.diagnose_hook`);
- ``checkpoint.pt``: ``dualdrop.train.engine.fit``'s checkpoint (one format,
  :mod:`dualdrop.train.checkpoint`), written atomically after every epoch, with the run's
  configuration and data-order state beside it; ``resume=True`` continues from it *exactly*
  (same weights, bit for bit, as an uninterrupted run on the same device and world size);
  a run folder of an older dualdrop (checkpoint formats 1 and 2) resumes as well;
- ``model.pt`` (and ``model_csr.pt`` when sparse enough, ``model_compact.pt`` with dead
  units removed when torch-pruning is installed), :mod:`dualdrop.train.export`: the
  trained test-time network as a plain ``state_dict``; ``load_run(out)`` returns it ready to use;
- ``final.json``: end-of-training test error (never the best seen during training: the test set
  is read only here), validation error, density, per-layer report; written last.

Data parallel over ``torchrun``: see :mod:`dualdrop.train.distributed`; the per-process noise
streams differ (seed + rank), the data order does not.

The steps of :func:`train`: resolve the configuration, open the run folder (lock, existing
checkpoint, compared with the configuration), build model + method identically on fresh and
resumed runs, then train them with ``dualdrop.train.engine.fit``: this protocol is one
configuration of it (the batches of ``epoch_order`` as the loader, Adam at one rate, the linear
decay, a checkpoint every epoch, torchrun's all-reduce through ``fit``'s ``dist``, and
:class:`~dualdrop.train.engine.EpochHooks` for the ``lam`` warm-up, the per-epoch history row
and diagnostics, and the run's entries in the checkpoint); finally write the report.
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dualdrop.data import Dataset, load_dataset
from dualdrop.train.checkpoint import (
    CHECKPOINT,
    acquire_lock,
    atomic_write_json,
    jsonable,
    load_checkpoint,
    read_json,
    write_history,
)
from dualdrop.train.config import (
    DENSE,
    TrainConfig,
    _nn,
    check_hparams,
    check_lam_schedule,
    check_method,
    dataset_of,
    default_threads,
    device_of,
    resolve_hparams,
    run_config,
)
from dualdrop.train import diagnose_hook
from dualdrop.train.distributed import Dist
from dualdrop.train.engine import EpochHooks, fit
from dualdrop.train.evaluate import (
    SWEEP_TOLS,
    dense_density,
    error_rate,
    select_tol,
    tol_sweep,
    unpruned_error,
)
from dualdrop.train.export import architecture, init_weights, save_model, set_lams
from dualdrop.train.models import build_model


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Sample order of ``epoch`` (0-based): a permutation determined by (seed, epoch) alone.

    Independent of everything else in the run, so that the data order of a resumed run is the
    one of an uninterrupted run; this pair is the data-order state stored in checkpoints.
    """
    g = torch.Generator()
    g.manual_seed(int(seed) * 1_000_003 + int(epoch) + 1)
    return torch.randperm(n, generator=g)


def classifier_name(model: nn.Module, n_classes: int) -> str:
    """Name of the model's classifier: its last Linear layer with ``n_classes`` outputs (the
    layer ``granularity="neuron"`` leaves alone: its output units are the classes)."""
    names = [n for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and m.out_features == n_classes]
    if not names:
        raise ValueError(f"no Linear layer with {n_classes} outputs (the classifier) in the "
                         "model; granularity='neuron' needs it to keep the classes")
    return names[-1]


def make_adam(params: list, lr: float) -> torch.optim.Adam:
    """Adam with torch's fused kernel where this torch build has one for ``device`` (one pass
    over each tensor instead of ~10; measured 0.54 -> 0.17 ms per LeNet-300-100 step on the CPU),
    else the default implementation. Same update rule and state keys either way."""
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


class EpochBatches:
    """The CLI protocol's training batches as a loader for ``engine.fit``: whole-split tensors
    ``X``, ``y`` taken in ``epoch_order(n, seed, epoch)`` (``fit`` calls :meth:`set_epoch`
    before each epoch), ``batch_size`` samples a global batch, each split over the ``world``
    processes by rank. A batch is ``(X, y, global batch size)``."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, seed: int, batch_size: int,
                 rank: int = 0, world: int = 1):
        self.X, self.y, self.seed, self.batch_size = X, y, seed, batch_size
        self.rank, self.world, self.epoch = rank, world, 0

    def __len__(self) -> int:
        return math.ceil(len(self.y) / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = epoch_order(len(self.y), self.seed, self.epoch).to(self.X.device)
        bs = self.batch_size
        for b in range(len(self)):
            idx = order[b * bs:(b + 1) * bs]
            n_b = len(idx)
            idx = idx[self.rank::self.world]
            yield self.X[idx], self.y[idx], n_b


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`train`: ``epoch`` is the last epoch whose checkpoint is complete in
    ``out`` (0: none yet); ``resume=True`` continues from it."""

    def __init__(self, out: str, epoch: int):
        super().__init__(f"interrupted; epoch {epoch} is checkpointed in {out}")
        self.out, self.epoch = out, epoch


@dataclass
class _Run:
    """The state of one run while it trains."""

    cfg: TrainConfig
    lr: float
    hp: dict
    data: Dataset
    dist: Dist
    run_cfg: dict
    model: nn.Module
    sp: Any  # the Sparsifier, None for the dense baseline
    steps_per_epoch: int
    total_steps: int
    init_info: dict | None
    history: list
    start_epoch: int = 0
    saved_epoch: int = 0  # the epoch of the complete checkpoint on disk
    optimizer: Any = None  # made by engine.fit (through make_adam)

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)

    @property
    def device(self) -> torch.device:
        return self.dist.device

    @property
    def n_train(self) -> int:
        return len(self.data.y_train)

    def density(self) -> dict:
        return self.sp.density() if self.sp is not None else dense_density(self.model)

    def tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        X, y = getattr(self.data, f"X_{split}"), getattr(self.data, f"y_{split}")
        return torch.from_numpy(X).to(self.device), torch.from_numpy(y).to(self.device)


def _open_checkpoint(cfg: TrainConfig, run_cfg: dict) -> dict | None:
    """The run folder's checkpoint when resuming; ``FileExistsError`` if one exists otherwise."""
    path = Path(cfg.out) / CHECKPOINT
    if not path.exists():
        return None
    if not cfg.resume:
        if (Path(cfg.out) / "final.json").is_file():
            raise FileExistsError(
                f"{cfg.out} holds a finished run; choose another out directory (to train on "
                f"from its weights: init_from={str(cfg.out)!r}, --init-from {cfg.out}), or "
                "pass resume=True (--resume) with its settings to print its results"
            )
        raise FileExistsError(
            f"{path} exists; pass resume=True (--resume) to continue that run, or "
            "choose another out directory"
        )
    return load_checkpoint(path, run_cfg)


def _build(cfg: TrainConfig, lr: float, hp: dict, data: Dataset, dist_: Dist, run_cfg: dict,
           ckpt: dict | None) -> _Run:
    """Model and method: the same construction on fresh and resumed runs (the RNG calls in the
    same order); ``engine.fit`` then makes the optimizer and schedule and loads the checkpoint."""
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    random.seed(cfg.seed)
    model = build_model(cfg.model, data.n_features, data.n_classes)
    init_info = None
    if cfg.init_from and ckpt is None:  # a resumed run has its own weights
        init_sd, init_info = init_weights(cfg.init_from, data.n_features, data.n_classes,
                                          cfg.model)
        model.load_state_dict(init_sd)
    if cfg.target_density is not None:  # the target replaces these defaults (not given values)
        given = cfg.hparams or {}
        hp = {k: v for k, v in hp.items() if k not in _nn().density.SET_BY_TARGET or k in given}
    kw = {"exclude": list(cfg.exclude)} if cfg.exclude else {}
    if hp.get("granularity", "weight") != "weight":
        # whole output units of the classifier are classes: it stays (its single weights too)
        head = classifier_name(model, data.n_classes)
        kw["exclude"] = kw.get("exclude", []) + [head]
        warnings.warn(f"granularity={hp['granularity']!r}: the classifier {head} is "
                      "not sparsified (its output units are the classes)", UserWarning,
                      stacklevel=2)
        kw["example_inputs"] = _coupling_inputs(data.n_features)
    sp = (_nn().sparsify(model, cfg.method, target_density=cfg.target_density, **hp, **kw)
          if cfg.method != DENSE else None)
    model.to(dist_.device)
    steps_per_epoch = math.ceil(len(data.y_train) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    # per-process noise streams
    torch.manual_seed(cfg.seed + 7919 * (dist_.rank + 1))
    if dist_.device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed + 7919 * (dist_.rank + 1))
    run = _Run(cfg=cfg, lr=lr, hp=hp, data=data, dist=dist_, run_cfg=run_cfg, model=model,
               sp=sp, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
               init_info=init_info, history=[])
    if ckpt is not None:
        run.history = list(ckpt["history"])
        run.start_epoch = run.saved_epoch = int(ckpt["epoch"])
        run.init_info = ckpt.get("init")
        if ckpt["data_order"] != {"seed": cfg.seed, "next_epoch": run.start_epoch}:
            raise ValueError(f"{Path(cfg.out) / CHECKPOINT}: inconsistent data-order state")
    return run


def _coupling_inputs(n_features: int):
    """Inputs of one traced forward run from which ``sparsify`` finds the units that only leave
    the network together (a residual stream's channels: ``dualdrop.nn._coupling``); None, with
    a warning, without torch-pruning (units are then pruned layer by layer). Zeros: the trace
    needs the shape only, and the global RNG stays untouched."""
    import importlib.util

    if importlib.util.find_spec("torch_pruning") is None:
        warnings.warn("torch-pruning is not installed: units coupled across layers (residual "
                      "streams) are pruned layer by layer, and the compact export cannot run; "
                      'pip install "dualdrop[structured]"', UserWarning, stacklevel=3)
        return None
    return torch.zeros(2, n_features)


def _check_finite(run: _Run, epoch: int, ce_sum_epoch: float) -> None:
    """FloatingPointError after ``epoch`` (0-based) when its loss or a weight is not finite:
    raised before the epoch's checkpoint, which stays the last finite one."""
    if not math.isfinite(ce_sum_epoch):
        raise FloatingPointError(
            f"training diverged (non-finite loss) in epoch {epoch + 1}; "
            f"lower lr (now {run.lr}) or check the hyperparameters {run.hp}"
        )
    bad = [n for n, p in run.model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise FloatingPointError(
            f"non-finite weights after epoch {epoch + 1} in {', '.join(bad)} (method "
            f"{run.cfg.method}, hyperparameters {run.hp}, lr {run.lr}); the run is not "
            "checkpointed past the last finite epoch: resume from it after fixing the cause"
        )


def _epoch_row(run: _Run, epoch: int, ce_total: float, t_train: float, Xva, yva) -> dict:
    """The history row of a finished epoch (evaluates the validation split)."""
    t1 = time.perf_counter()
    reg_end = 0.0
    if run.sp is not None:
        with torch.no_grad():
            reg_end = float(run.sp.regularizer(run.n_train))
    val_err = error_rate(run.model, Xva, yva, run.cfg.eval_batch_size)
    dens = run.density()
    t_eval = time.perf_counter() - t1
    row = {
        "epoch": epoch + 1,
        "step": (epoch + 1) * run.steps_per_epoch,
        "lr": run.optimizer.param_groups[0]["lr"],
        "train_loss": ce_total / run.n_train,
        "train_reg": reg_end,
        "val_error": val_err,
        "nonzero_total": float(dens["total"]),
    }
    for k, v in dens.items():
        if k != "total":
            row[f"nonzero_{k}"] = float(v)
    row["seconds"] = t_train
    row["eval_seconds"] = t_eval
    return row


def _fit(run: _Run, last: int) -> None:
    """Epochs ``run.start_epoch + 1 .. last`` through ``engine.fit`` (module docstring), each
    followed by its history row and checkpoint."""
    cfg, model, sp, dist_ = run.cfg, run.model, run.sp, run.dist
    Xtr, ytr = run.tensors("train")
    Xva, yva = run.tensors("val")
    loader = EpochBatches(Xtr, ytr, cfg.seed, cfg.batch_size, dist_.rank, dist_.world)
    # the epoch's summed cross-entropy, on the device: a step reads nothing back to the host
    ce_sum = torch.zeros((), dtype=torch.float64, device=run.device)
    epoch_state = {"t0": 0.0, "check": False}

    def loss_fn(model, batch) -> torch.Tensor:
        X, y, n_b = batch
        ce = F.cross_entropy(model(X), y, reduction="sum")
        ce_sum.add_(ce.detach())
        loss = ce / n_b
        if epoch_state["check"]:  # a fresh run's first step: a regularizer that dominates
            sp.check_balance(float(loss.detach()), run.n_train)
            epoch_state["check"] = False
        return loss

    def start(epoch: int) -> None:
        _ramp_lam(run, epoch)
        ce_sum.zero_()
        epoch_state["check"] = (sp is not None and epoch == 0 and dist_.main
                                and _balance_check_due(cfg))
        epoch_state["t0"] = time.perf_counter()

    def row(epoch: int, step: int) -> dict:
        seconds = time.perf_counter() - epoch_state["t0"]
        total = float(ce_sum)
        _check_finite(run, epoch - 1, total)
        total = dist_.sum_floats([total])[0]
        r = _epoch_row(run, epoch - 1, total, seconds, Xva, yva)
        if diagnose_hook.due(epoch, cfg.diagnose_every, cfg.epochs) and dist_.main:
            r.update(diagnose_hook.diagnose_row(
                model, sp, Xva, yva, samples=cfg.diagnose_samples, seed=cfg.seed,
                batch_size=cfg.batch_size, n_train=run.n_train, device=run.device))
        run.history.append(r)
        return r

    def extra(epoch: int, step: int) -> dict:
        return {"config": run.run_cfg, "data_order": {"seed": cfg.seed, "next_epoch": epoch},
                "init": run.init_info,
                "arch": architecture(run.data.n_features, run.data.n_classes, cfg.model)}

    def saved(epoch: int, step: int) -> None:
        run.saved_epoch = epoch
        write_history(run.out, run.history)

    def adam(groups):
        # the paper's protocol: one rate for every parameter (the method's own included), in
        # the model's order (the order of the optimizer state in older checkpoints)
        run.optimizer = make_adam([p for p in model.parameters() if p.requires_grad], run.lr)
        return run.optimizer

    stop = (last - run.start_epoch) * run.steps_per_epoch if last < cfg.epochs else None
    fit(model, sp, loader, loss_fn, epochs=cfg.epochs, lr=run.lr, optimizer=adam,
        scheduler="linear", n_train=run.n_train, checkpoint_dir=str(run.out),
        checkpoint_every=run.steps_per_epoch, resume=True, stop_after=stop, log_every=0,
        progress=bool(cfg.progress), hooks=EpochHooks(start=start, row=row, extra=extra,
                                                      saved=saved), dist=dist_)


def _ramp_lam(run: _Run, epoch: int) -> None:
    """Every layer's ``lam`` for epoch ``epoch`` (0-based): ``lam * lam_layers[layer]``, times
    ``min(1, (epoch + 1) / lam_warmup)`` during a warm-up. A function of the epoch alone, so a
    resumed run ramps exactly as an uninterrupted one."""
    cfg = run.cfg
    if run.sp is None or not (cfg.lam_warmup or cfg.lam_layers):
        return
    ramp = min(1.0, (epoch + 1) / cfg.lam_warmup) if cfg.lam_warmup else 1.0
    set_lams(run.sp, run.hp["lam"], cfg.lam_layers, ramp)


def _final_report(run: _Run) -> dict:
    """End-of-training numbers; the test set is read here only."""
    cfg, model, sp, history = run.cfg, run.model, run.sp, run.history
    Xte, yte = run.tensors("test")
    test_err = error_rate(model, Xte, yte, cfg.eval_batch_size)
    dens = run.density()
    report = {
        "status": "finished",
        "method": cfg.method,
        "epochs": cfg.epochs,
        "lr": run.lr,
        "hparams": run.hp,
        "seed": cfg.seed,
        "data": run.data.summary(),
        "world_size": run.dist.world,
        "device": str(run.device),
        "threads": torch.get_num_threads(),
        "test_error": test_err,
        "test_error_unpruned": unpruned_error(sp, model, Xte, yte, cfg.eval_batch_size),
        "test_error_unpruned_is": "the test error with no test-time pruning (keep ratio below "
                                  "tol kept), the paper's released-code protocol for its "
                                  "penalty methods; null where the method cannot express it",
        "val_error": history[-1]["val_error"],
        "nonzero_total": float(dens["total"]),
        "nonzero": {k: float(v) for k, v in dens.items() if k != "total"},
        "nonzero_counts": "weights of the Linear and Conv2d layers; biases are not counted",
        "init_from": run.init_info,
        "architecture": architecture(run.data.n_features, run.data.n_classes, run.cfg.model),
        "seconds_per_epoch": float(np.mean([r["seconds"] for r in history])),
        "total_seconds": float(sum(r["seconds"] + r["eval_seconds"] for r in history)),
    }
    if sp is not None:
        dnn = _nn()
        Xva, yva = run.tensors("val")
        report["val_tol_sweep"] = tol_sweep(sp, model, Xva, yva, SWEEP_TOLS, cfg.eval_batch_size)
        if cfg.select_tol_margin is not None and report["val_tol_sweep"]:
            report["selected_tol"] = select_tol(
                sp, model, report["val_tol_sweep"], history[-1]["val_error"],
                cfg.select_tol_margin, Xte, yte, cfg.eval_batch_size)
        report["layers"] = jsonable(dnn.sparsity_report(model))
        try:
            exported = dnn.export_sparse(model).to(run.device)
            report["exported_test_error"] = error_rate(exported, Xte, yte, cfg.eval_batch_size)
        except Exception as exc:  # recorded, never hidden: the trained run stays usable
            report["export_error"] = f"{type(exc).__name__}: {exc}"
            print(f"warning: export_sparse failed: {report['export_error']}", file=sys.stderr)
    return jsonable(report)


def _balance_check_due(cfg) -> bool:
    """Whether a regularizer that dominates the data loss at the first step is worth a warning:
    the user set its strength (``lam``) or warm-starts (a trained network's data loss is near
    0), and no target density sets the strength (then the density controller moves it during
    training and the first step's ratio predicts nothing: the warning would be a false alarm).
    The defaults were chosen on validation: no alarm for them."""
    if cfg.target_density is not None:
        return False
    return "lam" in (cfg.hparams or {}) or cfg.init_from is not None


def train(cfg: TrainConfig, data: Dataset | None = None) -> dict:
    """Train one method; return the final report (also written to ``out/final.json``).

    ``data`` defaults to ``load_dataset(cfg.data_dir, seed=cfg.seed)`` (embedded digits when
    ``data_dir`` is None); ``epochs``, ``batch_size``, ``lr`` and hyperparameters left unset
    take that dataset's defaults (:data:`~dualdrop.train.config.DATASET_DEFAULTS`). If
    ``cfg.stop_after`` ends the run early, the returned dict has ``"status": "stopped"`` and no
    test error; ``resume=True`` continues it later. Ctrl-C raises :class:`TrainingInterrupted`
    (a ``KeyboardInterrupt``) naming the last checkpointed epoch.
    """
    dataset = data.name if data is not None else dataset_of(cfg.data_dir)
    cfg = cfg.with_defaults(dataset)
    cfg.validate()
    cfg.method = check_method(cfg.method)
    lr, hp = resolve_hparams(cfg.method, cfg.lr, cfg.hparams, dataset)
    check_hparams(cfg.method, hp, cfg.model, cfg.exclude)
    check_lam_schedule(cfg, hp)
    if cfg.threads != 0:
        torch.set_num_threads(cfg.threads or default_threads())
    _nn().tune_allocator()  # also for the dense baseline: same allocator as the methods
    out = Path(cfg.out)
    lock = None
    flushed = bool(cfg.flush_denormal) and torch.set_flush_denormal(True)
    try:
        dist_ = Dist(device_of(cfg.device))
    except BaseException:
        if flushed:
            torch.set_flush_denormal(False)
        raise
    try:
        if data is None:
            data = load_dataset(cfg.data_dir, seed=cfg.seed, val_fraction=cfg.val_fraction,
                                verify=cfg.verify_data)
        run_cfg = run_config(cfg, lr, hp, data, dist_.world)
        final_path = out / "final.json"
        if dist_.main:
            out.mkdir(parents=True, exist_ok=True)
            lock = acquire_lock(out)
        dist_.barrier()
        ckpt = _open_checkpoint(cfg, run_cfg)
        if ckpt is not None and ckpt["epoch"] >= cfg.epochs and final_path.exists():
            return read_json(final_path, "remove it to write it again (run the same command "
                             "with --resume), or choose another out directory")
        if dist_.main:  # what this folder's run is, readable before it finishes
            atomic_write_json(out / "config.json", {**run_cfg, "data_summary": data.summary()},
                              default=repr)
        run = None
        try:
            run = _build(cfg, lr, hp, data, dist_, run_cfg, ckpt)
            last = cfg.epochs if cfg.stop_after is None else cfg.stop_after
            if last > run.start_epoch or last >= cfg.epochs:
                _fit(run, last)
            if last < cfg.epochs:
                return {"status": "stopped", "epoch": max(last, run.start_epoch),
                        "out": str(out), "history": run.history}
            report = _final_report(run)
            if dist_.main:
                report["model_files"] = save_model(run.model, run.sp is not None, out,
                                                    n_features=run.data.n_features)
        except KeyboardInterrupt:
            saved = run.saved_epoch if run is not None else int(ckpt["epoch"] if ckpt else 0)
            raise TrainingInterrupted(str(out), saved) from None
        if dist_.main:
            atomic_write_json(final_path, report)
        dist_.barrier()
        return report
    finally:
        if lock is not None:
            lock.unlink(missing_ok=True)
        if flushed:
            torch.set_flush_denormal(False)
        dist_.close()
