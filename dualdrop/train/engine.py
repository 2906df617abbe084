"""The training engine, the one training loop of dualdrop: ``fit`` for any model and any
DataLoader, and its step, ``train_step`` (and ``run_epoch``, which drives the steps of an epoch).

``fit(model, method, train_loader, loss_fn, steps=... or epochs=..., target_density=D)`` sparsifies
``model`` with ``method`` (or takes the ``Sparsifier`` handle that ``sparsify`` returned; or
``None``: no method) and trains it on ``loss_fn(model, batch) + sp.regularizer(n_train)``
(``loss_fn`` receives the model and one batch, so any batch structure works), calling
``sp.after_step(optimizer, step, total_steps)`` after every step, so the target-density controller
and the method's own schedule (``dualdrop.nn.density``) see the whole budget. The optimizer is
built from ``sp.method_param_groups(lr, total_steps)`` (the budget-aware rate of the method's own
parameters) by ``optimizer`` (a factory, default ``torch.optim.Adam``); the default schedule is
the paper's linear decay of the learning rate to 0.

Checkpoints (``checkpoint_dir``): every ``checkpoint_every`` steps and at the end, one file
``checkpoint.pt`` (format 3 of ``dualdrop.train.checkpoint``) written to a temporary name and
moved into place with ``os.replace`` (a crash leaves the previous checkpoint whole); read back
with ``torch.load(weights_only=True)``. A checkpoint holds the model, optimizer, scheduler and
controller state, the step counter, and the random state needed to continue *exactly*, of every
process: torch's global generator (dropout, and the seed a DataLoader draws for its shuffle when
it has no generator of its own), the loader's own generator if it has one, Python's and NumPy's;
plus the same generators as they were when the current epoch's iterator was made. Resuming
restores the epoch-start state, rebuilds the iterator (the same order, the same worker seeds),
skips the batches already done, then restores the current state: the resumed run is bit for bit
the uninterrupted one. The method's noise is counter-based and lives in the model's state dict
(``dualdrop.nn._base.NoiseState``).

One step, one order (:func:`train_step`): regularizer gradient (:func:`regularizer_term`),
``zero_grad``, ``backward``, the gradient all-reduce of a data-parallel run, ``optimizer.step()``,
then (:func:`finish_step`) ``sp.after_step`` and only then ``scheduler.step()``: a method whose
``after_step`` reads the learning rate (AdaProx's prox, ``w <- prox_{lr lam}(w)``) must see the
rate of the gradient step it completes; the other order hands it the *next* step's rate, which
is 0 after the last step of a linear decay, so the last prox would be skipped. The Lightning and
``transformers.Trainer`` callbacks (``dualdrop.train.callbacks``) call the two halves around
their framework's backward and optimizer step.

The CLI's protocol (``dualdrop.train.loop``, ``dualdrop sparsify``) is one configuration of
``fit``: its whole-split batches as the loader (``set_epoch`` picks the epoch's order), one Adam
rate, a checkpoint every epoch, ``dist`` for torchrun, and :class:`EpochHooks` for what it adds at
the epochs' boundaries (the ``lam`` warm-up, its per-epoch history row and diagnostics, its
configuration in the checkpoint).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from dualdrop.nn import Sparsifier, sparsify
from dualdrop.nn._undo import undo_on_error
from dualdrop.nn.density import DensityController
from dualdrop.train.checkpoint import (CHECKPOINT, FORMAT_VERSION, STATE_KEYS, atomic_save, plain_settings,
                                       read_checkpoint, rng_state, set_rng_state, settings_diff)
from dualdrop.train.evaluate import dense_density
from dualdrop.train.fit_checks import (_check_checkpoint_dir, _check_fit_args, _check_loss,  # noqa: F401
                                       _load_fit_checkpoint, _make_optimizer)


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


def _linear_decay(opt, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total_steps))


def train_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, *, step: int,
               total_steps: int, sp=None, scheduler=None, n_train: int | None = None,
               allreduce: Callable[[], None] | None = None, world: int = 1) -> int:
    """One training step on the mean data loss ``loss`` of a batch; returns ``step + 1``.

    In this order: the regularizer's gradient is added (``sp.regularizer(n_train, value=False)
    / world``: exactly 0 in value; each of ``world`` processes adds its share, so the summed
    gradients hold it once), ``zero_grad``, ``backward``, ``allreduce()`` (a data-parallel run
    sums the gradients here), ``optimizer.step()``, ``sp.after_step(optimizer, step + 1,
    total_steps)`` (1-based: the steps finished), then ``scheduler.step()``. The scheduler moves
    last because a prox step (AdaProx) must use the learning rate of the gradient step it
    completes, not the next one (0 after the last step of a linear decay). ``sp=None`` trains
    without a method (the dense baseline).
    """
    if sp is not None:
        if n_train is None:
            raise ValueError("train_step with a sparsifier needs n_train=(number of training "
                             "examples), the regularizer's scale")
        loss = loss + regularizer_term(sp, n_train, world)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if allreduce is not None:
        allreduce()
    optimizer.step()
    step += 1
    finish_step(sp, optimizer, step, total_steps, scheduler)
    return step


def regularizer_term(sp, n_train: int, world: int = 1) -> torch.Tensor:
    """The first half of a step's method work: ``sp.regularizer(n_train, value=False) / world``,
    a term of value 0 whose gradient is this process's share of the regularizer's (added to the
    data loss before ``backward``; the callbacks of ``dualdrop.train.callbacks``, whose frameworks
    own the loss, back-propagate it alone)."""
    reg = sp.regularizer(n_train, value=False)
    return reg / world if world != 1 else reg  # (one autograd node less for one process)


def finish_step(sp, optimizer, step: int, total_steps: int, scheduler=None) -> None:
    """The second half, after ``optimizer.step()``: ``sp.after_step(optimizer, step,
    total_steps)`` (``step``: the steps finished), then ``scheduler.step()`` (the order of
    :func:`train_step`'s docstring; the callbacks call it without a scheduler, their framework
    steps it)."""
    if sp is not None:
        sp.after_step(optimizer, step, total_steps)
    if scheduler is not None:
        scheduler.step()


@dataclass
class Stepper:
    """The arguments of :func:`train_step` that stay the same over a run."""

    optimizer: torch.optim.Optimizer
    total_steps: int
    sp: object = None
    scheduler: object = None
    n_train: int | None = None
    allreduce: Callable[[], None] | None = None
    world: int = 1

    def step(self, loss: torch.Tensor, step: int) -> int:
        return train_step(loss, self.optimizer, step=step, total_steps=self.total_steps,
                          sp=self.sp, scheduler=self.scheduler, n_train=self.n_train,
                          allreduce=self.allreduce, world=self.world)


def run_epoch(stepper: Stepper, batches: Iterable, data_loss, step: int, *, bar=None,
              after=None) -> tuple[int, bool]:
    """One :func:`train_step` per batch of ``batches``; returns ``(step, whether the batches ran
    out)``.

    ``data_loss(batch) -> scalar``: the mean data loss of the batch (nothing is read back to the
    host here, so a GPU step does not wait for it); ``bar``: a progress bar advanced once a step;
    ``after(step, loss) -> bool``: called after each step (``step`` counts the finished ones),
    True ends the epoch early (a budget, a planned interruption).
    """
    for batch in batches:
        loss = data_loss(batch)
        step = stepper.step(loss, step)
        if bar is not None:
            bar.update(1)
        if after is not None and after(step, loss):
            return step, False
    return step, True


def _epoch_batches(loader, epoch_rng, done_in_epoch: int, current_rng):
    """The iterator of the current epoch and the RNG state its order comes from.

    A fresh epoch (``epoch_rng`` None) remembers the state it starts from (restoring
    ``current_rng`` first when a run resumes at an epoch's start); a resumed one
    restores it, rebuilds the same order (the same worker seeds), skips the ``done_in_epoch``
    batches already trained on and restores ``current_rng``, the state at the interruption."""
    if epoch_rng is None:
        if current_rng is not None:  # resumed at an epoch's start: the state at its checkpoint
            _set_rng_state(loader, current_rng)
        epoch_rng = _rng_state(loader)  # before iter(): making the iterator draws from it
        return iter(loader), epoch_rng
    _set_rng_state(loader, epoch_rng)
    it = iter(loader)
    if done_in_epoch:
        for _ in range(done_in_epoch):
            next(it)
        _set_rng_state(loader, current_rng)
    return it, epoch_rng


@dataclass
class EpochHooks:
    """What a configuration of :func:`fit` adds at the epochs' boundaries (the CLI's protocol,
    ``dualdrop.train.loop``, uses every one). All optional:

    ``start(epoch)``: before the batches of ``epoch`` (0-based; also when a resumed run
    continues inside it), e.g. a warm-up of the method's strength that is a function of the
    epoch alone; ``row(epoch, step) -> dict | None``: after the last batch of epoch ``epoch``
    (1-based: the epochs finished), the epoch's history row, replacing ``fit``'s validation row
    (given for every epoch, the last included, and no ``"final"`` row is added); it runs before
    the epoch's checkpoint, so a row that raises leaves the run at the previous checkpoint;
    ``extra(epoch, step) -> dict``: entries written into every checkpoint beside ``fit``'s own
    (the run's configuration, say; ``epoch``: the epochs finished); ``saved(epoch, step)``: after
    each checkpoint is in place (on rank 0)."""

    start: Callable[[int], None] | None = None
    row: Callable[[int, int], dict | None] | None = None
    extra: Callable[[int, int], dict] | None = None
    saved: Callable[[int, int], None] | None = None


def _set_epoch(loader, epoch: int) -> None:
    """``set_epoch(epoch)`` of the loader and of its sampler where they have one (a
    ``DistributedSampler`` shuffles by it; the CLI's whole-split batches order by it)."""
    for obj in (loader, getattr(loader, "sampler", None)):
        if obj is not None and callable(getattr(obj, "set_epoch", None)):
            obj.set_epoch(epoch)


def fit(model: nn.Module, method: str | Sparsifier | None, train_loader, loss_fn, *,
        steps: int | None = None, epochs: int | None = None, lr: float = 1e-3, optimizer=None,
        scheduler="linear", target_density: float | None = None, hparams: dict | None = None,
        n_train=None,
        val_loader=None, val_fn=None, checkpoint_dir=None, checkpoint_every: int | None = None,
        resume: bool = True, stop_after: int | None = None, log_every: int = 50,
        progress: bool = True, sparsify_kwargs: dict | None = None,
        hooks: EpochHooks | None = None, dist=None) -> FitResult:
    """Sparsify ``model`` with ``method`` and train it (module docstring).

    ``method``: a method name (``dualdrop.nn.METHODS`` or ``"penalty:<name>"``) for a plain
    model, sparsified here with ``hparams``, ``target_density`` and ``sparsify_kwargs``; or the
    ``Sparsifier`` that ``sparsify(model, ...)`` returned, used as it is: its method,
    hyperparameters, units coupled through ``example_inputs`` and target-density controller as
    it stands (a second ``fit(model, out.sparsifier, ...)`` fine-tunes with the masks the first
    one made, its regularizer released); or None: the model trained as it is, without a method
    (the dense baseline; no ``hparams``, ``target_density`` or ``sparsify_kwargs``). A model that
    is already sparsified keeps what
    ``sparsify`` gave it: ``hparams`` entries that differ from its hyperparameters, and a
    ``target_density`` other than the one it was sparsified with, are refused (a target density
    may be added to a handle or model without one, except for magnitude pruning, whose final
    sparsity is its hyperparameter ``sparsity``). Given by name, an already sparsified model gets
    its handle rebuilt from what ``sparsify`` recorded on its states
    (``dualdrop.nn.sparsifier.sparsified_with``: hyperparameters and target density; a new
    controller, its ramp over this call's budget); one whose units were coupled through
    ``example_inputs`` is refused by name (only the handle holds the coupling): pass the handle.

    ``loss_fn(model, batch) -> scalar`` (the mean data loss of one batch: a floating-point
    tensor with one element and a gradient); ``steps`` or ``epochs`` (one of them): the budget;
    ``optimizer``: ``callable(param_groups) -> Optimizer`` (default Adam); ``scheduler``:
    ``"linear"`` (decay to 0), None, or ``callable(optimizer, total_steps) -> LRScheduler``
    stepped every step; ``hparams``: the method's; ``val_fn(model, val_loader) -> dict`` logged
    at the end of every epoch and at the end (default: the mean of ``loss_fn`` over
    ``val_loader``); ``checkpoint_dir``: atomic checkpoints every ``checkpoint_every`` steps
    and at the end, resumed from when present and ``resume`` (a checkpoint records the run's
    settings, method, hyperparameters, ``lr``, target density and budget: one of a run with
    others is refused, not resumed; a checkpoint due on an epoch's last batch is written after
    the epoch's end, its history row included); ``stop_after``: stop after this
    many steps of this call (a planned interruption; the checkpoint lets a later call
    continue; one that falls on an epoch's last batch also waits for the epoch's end);
    ``log_every``: steps between history rows (0: none). The loader's (and its sampler's)
    ``set_epoch(epoch)`` is called before each epoch where it has one.

    ``hooks``: an :class:`EpochHooks` (what a protocol adds at the epochs' boundaries).
    ``dist``: a ``dualdrop.train.distributed.Dist`` for a data-parallel run under ``torchrun``
    (None: one process): the model is broadcast from rank 0, each process's ``loss_fn`` gives
    its share of the global batch's mean loss (the gradients are summed over the processes, the
    regularizer added once), the weights are checked in sync after every epoch, and rank 0
    writes the checkpoints, which hold every process's random state.

    Refusals leave the model as given. Every argument, and a checkpoint to resume from (read
    whole, one-line error when corrupt or truncated), is checked before the model is touched;
    what can only fail while acting (a checkpoint of another model or method, the first
    batch's loss) is undone: the model, its hooks and parametrizations, BatchNorm statistics and
    the random generators are put back exactly. From the first optimizer update on, a failure
    keeps the work done: each batch's loss is checked before its update, so no weight becomes
    non-finite, and the last checkpoint stays in ``checkpoint_dir``.
    """
    args = _check_fit_args(model, method, loss_fn, train_loader, steps, epochs, lr, optimizer,
                           scheduler, target_density, hparams, n_train, val_loader, val_fn,
                           checkpoint_dir, checkpoint_every, resume, stop_after, log_every,
                           progress, sparsify_kwargs)
    if hooks is not None and not isinstance(hooks, EpochHooks):
        raise TypeError(f"hooks must be an EpochHooks or None, got {type(hooks).__name__}")
    total, n, plan = args["total"], args["n_train"], args["plan"]
    handle = plan["handle"]
    hooks = hooks or EpochHooks()
    world, rank = (dist.world, dist.rank) if dist is not None else (1, 0)
    main = rank == 0
    hparams, sparsify_kwargs = dict(hparams or {}), dict(sparsify_kwargs or {})
    path = os.path.join(checkpoint_dir, CHECKPOINT) if checkpoint_dir is not None else None
    ck = None
    if path and resume and os.path.exists(path):
        ck = read_checkpoint(path, keys=_FIT_KEYS, fix="delete it (or pass resume=False, or "
                             "another checkpoint_dir) to train from the start")
        if ck["total_steps"] is not None and ck["total_steps"] != total:
            raise ValueError(f"the checkpoint in {checkpoint_dir} is for a budget of "
                             f"{ck['total_steps']} steps, not {total}; use another "
                             "checkpoint_dir or resume=False")
        if not isinstance(ck["rng"], list) or len(ck["rng"]) != world:
            raise ValueError(f"the checkpoint in {checkpoint_dir} holds the random states of "
                             f"{len(ck['rng']) if isinstance(ck['rng'], list) else '?'} "
                             f"process(es), this run has {world}; resume it with as many "
                             "processes, or use another checkpoint_dir")
    gen = _loader_generator(train_loader)
    per_epoch = _len(train_loader)
    # act; until the first optimizer update a failure puts everything back (undo.commit)
    # (a handle given, and its controller, are put back as well)
    with undo_on_error(model, values="all" if ck is not None else "buffers", rng=True,
                       generators=[gen] if gen is not None else [],
                       objects=[handle, getattr(handle, "controller", None)]) as undo:
        if plan["dense"]:
            sp = None
        elif handle is not None:
            sp = handle
        elif plan["attach"]:
            sp = Sparsifier.attach(model, method, **hparams)
        else:
            sp = sparsify(model, method, target_density=target_density, **sparsify_kwargs,
                          **hparams)
        if sp is not None and plan["controller"] is not None:
            sp.controller = DensityController(sp, plan["controller"])
        if dist is not None:
            dist.broadcast_module(model)
        groups = (sp.method_param_groups(lr, total) if sp is not None else
                  [{"params": [p for p in model.parameters() if p.requires_grad], "lr": lr}])
        opt = _make_optimizer(optimizer, groups, sp.method if sp is not None else "none")
        if sp is not None:
            sp.check_optimizer(opt)
        if scheduler == "linear":
            sched = _linear_decay(opt, total)
        else:
            sched = scheduler(opt, total) if scheduler is not None else None
        step, history = 0, []
        epoch, done_in_epoch, epoch_rng, current_rng = 0, 0, None, None
        settings = plain_settings({"method": sp.method if sp is not None else None,
                                   "hparams": sp.hparams if sp is not None else {}, "lr": lr,
                                   "target_density": getattr(getattr(sp, "controller", None),
                                                             "target", None),
                                   "total_steps": total})
        if ck is not None:
            _load_fit_checkpoint(ck, checkpoint_dir, model, opt, sched, sp)  # method, shapes
            detail = settings_diff(ck.get("settings", settings), settings, "in the checkpoint")
            if detail:  # (undone like any refusal before the first update)
                raise ValueError(f"the checkpoint in {checkpoint_dir} is of a run with other "
                                 f"settings ({detail}); use another checkpoint_dir, its "
                                 "settings, or resume=False")
            step, epoch, done_in_epoch = ck["step"], ck["epoch"], ck["done_in_epoch"]
            epoch_rng = ck["epoch_rng"][rank] if ck["epoch_rng"] is not None else None
            history, current_rng = list(ck["history"]), ck["rng"][rank]
        first_update = opt.register_step_pre_hook(lambda *a: undo.commit())
        saved_at = [None]

        def checkpoint():
            if path is None or saved_at[0] == (step, len(history)):
                return
            rngs = dist.gather(_rng_state(train_loader)) if dist is not None else [
                _rng_state(train_loader)]
            erngs = dist.gather(epoch_rng) if dist is not None else [epoch_rng]
            if main:
                os.makedirs(checkpoint_dir, exist_ok=True)
                extra = hooks.extra(epoch, step) if hooks.extra is not None else {}
                atomic_save({"format": FORMAT_VERSION, **extra,
                             "model": model.state_dict(), "optimizer": opt.state_dict(),
                             "scheduler": sched.state_dict() if sched is not None else None,
                             "sparsifier": sp.state_dict() if sp is not None else None,
                             "step": step, "epoch": epoch, "done_in_epoch": done_in_epoch,
                             "total_steps": total,
                             "epoch_rng": erngs if epoch_rng is not None else None,
                             "rng": rngs, "history": history, "settings": settings}, path)
                if hooks.saved is not None:
                    hooks.saved(epoch, step)
            saved_at[0] = (step, len(history))

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
                    if not losses:
                        warnings.warn("fit: val_loader yielded no batch; val_loss is nan",
                                      RuntimeWarning, stacklevel=3)
                    out = {"val_loss": sum(losses) / len(losses) if losses else math.nan}
            model.train(was)
            return out

        bar = None
        if progress and main:
            bar = tqdm(total=total, initial=step, mininterval=1.0, dynamic_ncols=True,
                       desc=f"fit {sp.method if sp is not None else 'dense'}", leave=False)
        allreduce = None
        if dist is not None and world > 1:
            params = [p for g in opt.param_groups for p in g["params"]]
            allreduce = lambda: dist.allreduce_grads(params)  # noqa: E731
        stepper = Stepper(opt, total, sp=sp, scheduler=sched, n_train=n, allreduce=allreduce,
                          world=world)
        ran, last, stop = 0, [math.nan], [False]

        def data_loss(batch):
            """The batch's loss, refused before its update when it is not a finite scalar."""
            loss = loss_fn(model, batch)
            last[0] = _check_loss(loss, step + 1, undo.committed)
            return loss

        def after(done: int, loss) -> bool:
            """Per-step bookkeeping; True ends the steps of this call inside an epoch (on an
            epoch's last batch what is due waits for the epoch's end)."""
            nonlocal step, done_in_epoch, ran
            step, done_in_epoch, ran = done, done_in_epoch + 1, ran + 1
            if bar is not None:
                bar.set_postfix(loss=f"{last[0]:.4g}", refresh=False)
            if log_every and step % log_every == 0:
                history.append({"step": step, "loss": last[0],
                                "density": _density(model, sp)})
            stop[0] = step >= total or (stop_after is not None and ran >= stop_after)
            if per_epoch is not None and done_in_epoch == per_epoch:
                return False  # the epoch ends with this batch: its end comes first
            if step >= total:
                return True
            if checkpoint_every and step % checkpoint_every == 0:
                checkpoint()
            if stop[0]:
                checkpoint()
                return True
            return False

        model.train()
        try:
            while step < total:
                if epoch_rng is None:
                    done_in_epoch = 0
                if hooks.start is not None:
                    hooks.start(epoch)
                _set_epoch(train_loader, epoch)
                batches, epoch_rng = _epoch_batches(train_loader, epoch_rng, done_in_epoch,
                                                    current_rng)
                current_rng = None
                before, resumed_done = step, done_in_epoch
                step, ran_out = run_epoch(stepper, batches, data_loss, step, bar=bar,
                                          after=after)
                if not ran_out:
                    break
                # (an epoch resumed after all its batches: stopped or checkpointed at its end)
                if step == before and not resumed_done:
                    raise ValueError("train_loader yielded no batch in an epoch; give it data "
                                     "(a DataLoader with drop_last=True needs at least "
                                     "batch_size examples)")
                epoch, epoch_rng, done_in_epoch = epoch + 1, None, 0
                if hooks.row is not None:
                    row = hooks.row(epoch, step)
                    if row is not None:
                        history.append(row)
                elif step < total:
                    history.append({"step": step, "epoch": epoch, **validate()})
                if dist is not None:
                    dist.check_in_sync(model)
                if (checkpoint_every and step % checkpoint_every == 0) or (
                        stop[0] and step < total):
                    checkpoint()
                if dist is not None:
                    dist.barrier()
                if stop[0]:
                    break
        finally:
            if bar is not None:
                bar.close()
            first_update.remove()
    if step < total:  # stopped by stop_after: the checkpoint is written
        return FitResult(sp, step, total, history)
    if hooks.row is None:
        history.append({"step": step, "final": True, "density": _density(model, sp),
                        **validate()})
    checkpoint()
    return FitResult(sp, step, total, history)


def _len(loader):
    try:
        return len(loader)
    except TypeError:
        return None


def _density(model, sp) -> float:
    """The fraction of nonzero weights (the method's test-time rule; all of them when dense)."""
    return sp.density()["total"] if sp is not None else dense_density(model)["total"]


#: the entries of a checkpoint of ``fit``
_FIT_KEYS = STATE_KEYS
