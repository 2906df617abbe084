"""A training engine for any model and any DataLoader: ``fit``.

``fit(model, method, train_loader, loss_fn, steps=... or epochs=..., target_density=D)`` sparsifies
``model`` with ``method`` and trains it on ``loss_fn(model, batch) + sp.regularizer(n_train)``
(``loss_fn`` receives the model and one batch, so any batch structure works), calling
``sp.after_step(optimizer, step, total_steps)`` after every step, so the target-density controller
and the method's own schedule (``dualdrop.nn.density``) see the whole budget. The optimizer is
built from ``sp.method_param_groups(lr, total_steps)`` (the budget-aware rate of the method's own
parameters) by ``optimizer`` (a factory, default ``torch.optim.Adam``); the default schedule is
the paper's linear decay of the learning rate to 0.

Checkpoints (``checkpoint_dir``): every ``checkpoint_every`` steps and at the end, one file
``checkpoint.pt`` written to a temporary name and moved into place with ``os.replace`` (a crash
leaves the previous checkpoint whole); read back with ``torch.load(weights_only=True)``. A
checkpoint holds the model, optimizer, scheduler and controller state, the step counter, and the
random state needed to continue *exactly*: torch's global generator (dropout, and the seed a
DataLoader draws for its shuffle when it has no generator of its own), the loader's own generator
if it has one, Python's and NumPy's; plus the same generators as they were when the current epoch's
iterator was made. Resuming restores the epoch-start state, rebuilds the iterator (the same
order, the same worker seeds), skips the batches already done, then restores the current state:
the resumed run is bit for bit the uninterrupted one. The method's noise is counter-based and
lives in the model's state dict (``dualdrop.nn._base.NoiseState``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from dualdrop.nn import Sparsifier, sparsify
from dualdrop.nn.density import DensityController
from dualdrop.nn.sparsifier import is_sparsified
from dualdrop.train.checkpoint import atomic_save, rng_state, set_rng_state
from penalties.checks import check_int

CHECKPOINT = "checkpoint.pt"


@dataclass
class FitResult:
    """What ``fit`` returns: the sparsifier handle, the steps done and the logged history."""

    sparsifier: object
    step: int
    total_steps: int
    history: list = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps


def _rng_state(loader) -> dict:
    """This process's RNG states (``dualdrop.train.checkpoint.rng_state``) and the loader's own
    generator, if it has one."""
    state = rng_state(_rng_device())
    gen = _loader_generator(loader)
    if gen is not None:
        state["loader"] = gen.get_state()
    return state


def _set_rng_state(loader, state: dict) -> None:
    set_rng_state(state, _rng_device())
    gen = _loader_generator(loader)
    if gen is not None and "loader" in state:
        gen.set_state(state["loader"])


def _rng_device() -> torch.device:
    """The device whose generator is saved beside the CPU ones (CUDA where present)."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _loader_generator(loader):
    gen = getattr(loader, "generator", None)
    if gen is None:
        gen = getattr(getattr(loader, "sampler", None), "generator", None)
    return gen


def _n_train(loader, n_train):
    if n_train is not None:
        return check_int("n_train", n_train, low=1)
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        raise ValueError("the loader's dataset has no len(); pass n_train=(number of training "
                         "examples)") from None


def _linear_decay(opt, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total_steps))


def fit(model: nn.Module, method: str, train_loader, loss_fn, *, steps: int | None = None,
        epochs: int | None = None, lr: float = 1e-3, optimizer=None, scheduler="linear",
        target_density: float | None = None, hparams: dict | None = None, n_train=None,
        val_loader=None, val_fn=None, checkpoint_dir=None, checkpoint_every: int | None = None,
        resume: bool = True, stop_after: int | None = None, log_every: int = 50,
        progress: bool = True, sparsify_kwargs: dict | None = None) -> FitResult:
    """Sparsify ``model`` with ``method`` and train it (module docstring).

    ``loss_fn(model, batch) -> scalar`` (the mean data loss of one batch); ``steps`` or
    ``epochs`` (one of them): the budget; ``optimizer``: ``callable(param_groups) -> Optimizer``
    (default Adam); ``scheduler``: ``"linear"`` (decay to 0), None, or
    ``callable(optimizer, total_steps) -> LRScheduler`` stepped every step; ``hparams``: the
    method's; ``val_fn(model, val_loader) -> dict`` logged at the end of every epoch and at the
    end (default: the mean of ``loss_fn`` over ``val_loader``); ``checkpoint_dir``: atomic
    checkpoints, resumed from when present and ``resume``; ``stop_after``: stop after this many
    steps of this call (a planned interruption; the checkpoint lets a later call continue).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, batch) -> scalar loss")
    if (steps is None) == (epochs is None):
        raise ValueError("give the budget as exactly one of steps=... or epochs=...")
    try:
        per_epoch = len(train_loader)
    except TypeError:
        per_epoch = None
    if steps is None:
        if per_epoch is None:
            raise ValueError("train_loader has no len(); give the budget as steps=...")
        total = check_int("epochs", epochs, low=1) * per_epoch
    else:
        total = check_int("steps", steps, low=1)
    n = _n_train(train_loader, n_train)
    if is_sparsified(model):
        if sparsify_kwargs:
            raise ValueError(f"model is already sparsified, so sparsify_kwargs "
                             f"{sorted(sparsify_kwargs)} would be ignored; pass a plain model "
                             "or leave sparsify_kwargs out")
        sp = Sparsifier.attach(model, method, **(hparams or {}))
        if target_density is not None:
            sp.controller = DensityController(sp, target_density)
    else:
        sp = sparsify(model, method, target_density=target_density, **(sparsify_kwargs or {}),
                      **(hparams or {}))
    groups = sp.method_param_groups(lr, total)
    opt = optimizer(groups) if optimizer is not None else torch.optim.Adam(groups)
    if scheduler == "linear":
        sched = _linear_decay(opt, total)
    elif scheduler is None:
        sched = None
    elif callable(scheduler):
        sched = scheduler(opt, total)
    else:
        raise ValueError(f"scheduler must be 'linear', None or a callable, got {scheduler!r}")

    step, history = 0, []
    epoch, done_in_epoch, epoch_rng = 0, 0, None
    path = os.path.join(checkpoint_dir, CHECKPOINT) if checkpoint_dir else None
    if path and resume and os.path.exists(path):
        ck = torch.load(path, weights_only=True)  # tensors and plain values only
        if ck["total_steps"] != total:
            raise ValueError(f"the checkpoint in {checkpoint_dir} is for a budget of "
                             f"{ck['total_steps']} steps, not {total}; use another "
                             "checkpoint_dir or resume=False")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        if sched is not None and ck.get("scheduler") is not None:
            sched.load_state_dict(ck["scheduler"])
        sp.load_state_dict(ck["sparsifier"])
        step, epoch, done_in_epoch = ck["step"], ck["epoch"], ck["done_in_epoch"]
        epoch_rng, history = ck["epoch_rng"], list(ck["history"])
        current_rng = ck["rng"]
    else:
        current_rng = None

    def checkpoint():
        if path is None:
            return
        os.makedirs(checkpoint_dir, exist_ok=True)
        atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "scheduler": sched.state_dict() if sched is not None else None,
                      "sparsifier": sp.state_dict(), "step": step, "epoch": epoch,
                      "done_in_epoch": done_in_epoch, "total_steps": total,
                      "epoch_rng": epoch_rng, "rng": _rng_state(train_loader),
                      "history": history}, path)

    def validate():
        if val_loader is None:
            return {}
        was = model.training
        model.eval()
        with torch.no_grad():
            if val_fn is not None:
                out = dict(val_fn(model, val_loader))
            else:
                losses = [float(loss_fn(model, b)) for b in val_loader]
                out = {"val_loss": sum(losses) / max(1, len(losses))}
        model.train(was)
        return out

    bar = None
    if progress:
        bar = tqdm(total=total, initial=step, desc=f"fit {sp.method}", leave=False)
    model.train()
    ran = 0
    try:
        while step < total:
            if epoch_rng is None:     # a fresh epoch: remember the state its order comes from
                epoch_rng, done_in_epoch = _rng_state(train_loader), 0
            else:                     # resuming inside an epoch: same order, skip what was done
                _set_rng_state(train_loader, epoch_rng)
            it = iter(train_loader)
            if done_in_epoch:
                for _ in range(done_in_epoch):
                    next(it)
                _set_rng_state(train_loader, current_rng)
            current_rng = None
            for batch in it:
                loss = loss_fn(model, batch)
                total_loss = loss + sp.regularizer(n, value=False)
                opt.zero_grad(set_to_none=True)
                total_loss.backward()
                opt.step()
                if sched is not None:
                    sched.step()
                step += 1
                done_in_epoch += 1
                ran += 1
                sp.after_step(opt, step, total)
                lv = float(loss.detach())
                if not math.isfinite(lv):
                    raise FloatingPointError(f"the data loss is {lv} at step {step}; "
                                             "lower lr")
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{lv:.4g}")
                if log_every and step % log_every == 0:
                    history.append({"step": step, "loss": lv,
                                    "density": sp.density()["total"]})
                if step >= total:
                    break
                if checkpoint_every and step % checkpoint_every == 0:
                    checkpoint()
                if stop_after is not None and ran >= stop_after:
                    checkpoint()
                    return FitResult(sp, step, total, history)
            else:  # the epoch ended
                epoch, epoch_rng, done_in_epoch = epoch + 1, None, 0
                if step < total:
                    history.append({"step": step, "epoch": epoch, **validate()})
                continue
            break
    finally:
        if bar is not None:
            bar.close()
    history.append({"step": step, "final": True, "density": sp.density()["total"], **validate()})
    checkpoint()
    return FitResult(sp, step, total, history)
