"""Heal a pruned model by distillation from the dense one: ``heal(student, teacher, data)``.

One-shot pruning fits each layer to its dense output on a few calibration batches and stops;
the errors of the layers compound, and nothing re-fits the network as a whole. Healing trains
the pruned *student* to reproduce the dense *teacher*'s outputs on unlabeled data (the
calibration text is enough): Hinton et al.'s knowledge distillation, as production pruning
recipes do it (NVIDIA's Minitron: width and depth pruning, then logit distillation on a few
percent of the pretraining tokens; sentence-transformers' model distillation: an MSE on the
teacher's embeddings). The losses and their choice by model kind: ``dualdrop.train.heal_losses``;
the data forms: ``dualdrop.train.heal_data``; docs/oneshot.md "Heal".

What stays fixed: a structured result trains as its compact model (its widths are its shapes);
an unstructured one keeps its support exactly: every held weight's gradient is multiplied by its
mask before the optimizer step and the weight by its mask after it, so a pruned weight is 0
after every step (an N:M pattern is such a mask). By default (``masks="zeros"``) every weight
entry that is exactly 0 when healing starts is held at 0.

The optimization: AdamW (no weight decay on biases and norms), a linear warm-up then a cosine
decay of the learning rate to 0, the gradient's norm clipped. The teacher runs in eval mode
under ``no_grad`` once per batch; its outputs are cached (only what the losses read) when the
data is held in memory and the cache fits ``cache_mb``, or on disk (``cache_teacher=FOLDER``,
read back memory-mapped); ``teacher_dtype=torch.bfloat16`` runs a bfloat16 copy of it
(``dualdrop.train.heal_run``: the teacher's memory). The steps go through the training engine's step (``engine.Stepper``,
``engine.run_epoch``): zero_grad, backward, then the gradient all-reduce of a ``torchrun``
run, the masks and the clipping, the optimizer step, the schedule. Checkpoints (``checkpoint_dir``)
hold the student, optimizer, schedule, step and random state, written atomically every
``checkpoint_every`` steps, at least once a minute and at the end; a resumed run is the
uninterrupted one, bit for bit.
"""

from __future__ import annotations

import fnmatch
import math
import os
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from dualdrop.nn._undo import undo_on_error
from dualdrop.nn.oneshot.report import OneShotResult, StructuredResult
from dualdrop.nn.oneshot.depth import DepthResult
from dualdrop.nn.oneshot.calibration import default_forward
from dualdrop.train import heal_losses as L
from dualdrop.train.checkpoint import atomic_save, plain_settings, read_checkpoint, settings_diff
from dualdrop.train.distributed import Dist
from dualdrop.train.engine import (Stepper, _check_checkpoint_dir, _check_loss, _epoch_batches,
                                   _rng_state, _set_rng_state, run_epoch)
from dualdrop.train.heal_data import heal_source
from dualdrop.train.heal_run import HealRun
from penalties.checks import check_float, check_int

CHECKPOINT = "heal.pt"
_KEYS = ("student", "projections", "optimizer", "scheduler", "step", "epoch", "done_in_epoch",
         "total_steps", "epoch_rng", "rng", "history", "settings")


@dataclass
class HealResult:
    """What ``heal`` returns: the healed ``model`` (the student; a structured result's compact
    model), the steps done of ``total_steps``, the logged ``history`` (``{"step", "loss",
    "lr"}`` rows), the ``losses`` used and the ``masks`` held."""

    model: nn.Module
    step: int
    total_steps: int
    history: list = field(default_factory=list)
    losses: object = None
    masks: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps


def warmup_cosine(total: int, warmup: int):
    """The learning-rate factor at step ``s``: ``(s + 1) / warmup`` during the warm-up, then
    ``(1 + cos(pi (s - warmup) / (total - warmup))) / 2``: from 1 to 0 by the last step."""
    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))
    return factor


def heal(student, teacher: nn.Module, data, *, steps: int | None = None,
         epochs: int | None = None, tokenizer=None, batch_size: int = 32, max_length: int = 128,
         masks="zeros", loss="auto", temperature: float = 2.0, label_weight: float = 0.0,
         block_weight: float = 0.0, freeze=None,
         blocks=None, block_map=None, lr: float = 1e-4, weight_decay: float = 0.01,
         warmup: float = 0.05, clip: float | None = 1.0, forward_fn=None, teacher_dtype=None,
         cache_teacher="auto", cache_mb: float = 1024.0, train_mode: bool = False,
         shuffle: bool = True, seed: int = 0, checkpoint_dir=None,
         checkpoint_every: int | None = None, resume: bool = True, stop_after: int | None = None,
         until=None,
         log_every: int = 10, progress: bool = True) -> HealResult:
    """Train ``student`` to reproduce ``teacher`` on ``data`` (module docstring).

    - ``student``: the pruned model (an ``nn.Module``, trained in place), or what
      ``prune_oneshot`` returned: a ``OneShotResult`` (its model, its masks held), a
      ``StructuredResult`` (its compact model, ``res.compact()``, trained and returned) or a
      ``DepthResult`` (its model; with block matching, each kept block matched to itself in
      the teacher).
    - ``teacher``: the dense model (left as given: eval mode under ``no_grad``;
      ``teacher_dtype``, e.g. ``torch.bfloat16``, runs a copy in that dtype).
    - ``data``: unlabeled inputs (``dualdrop.train.heal_data``): the calibration batches, a
      tensor of samples, texts with ``tokenizer`` (``batch_size``, ``max_length``), a
      DataLoader, or a ``.txt`` / ``.jsonl`` / ``.npy`` / ``.pt`` file; ``shuffle`` the batch
      order every epoch (``seed``).
    - ``steps`` or ``epochs``: the budget (one of them).
    - ``masks``: ``"zeros"`` (hold every exact zero of a weight with 2 or more dimensions),
      ``{parameter name: bool tensor}``, or ``None`` (hold nothing).
    - ``loss``: ``"auto"``, ``"kl"`` (``temperature``), ``"mse"``, ``"cosine"``, a tuple of them
      (summed) or ``callable(student_out, teacher_out, batch) -> scalar`` on the outputs' main
      tensors (``heal_losses``); ``label_weight`` ``a`` in [0, 1]: ``(1 - a)`` times that
      plus ``a`` times the student's loss on the labels the batches carry (``(inputs,
      labels)`` pairs, or dict batches with ``"labels"``: a Hugging Face model's own loss;
      0: unlabeled data, distillation alone); ``block_weight``: the weight of per-block hidden-state matching
      (0: off), ``blocks`` the container of the blocks (found when None, e.g.
      ``"encoder.layer"``) or a list of module names (e.g. an MLP's ``["fc1", "fc2"]``: their
      outputs matched, listed in forward order), ``block_map`` the teacher block of each
      student block.
    - ``freeze``: parameter names or ``fnmatch`` patterns (``"embeddings.word_embeddings.*"``)
      of the student's parameters not to train: no gradient is computed for them and the
      optimizer does not hold them (``requires_grad`` is set back as given afterwards). A
      transformer's word-embedding matrix is most of a small encoder's parameters (11.7M of
      all-MiniLM-L6-v2's 22.7M) but only the rows of a batch's tokens get a gradient, so
      freezing it makes each step cheaper (its dense gradient and AdamW update skipped) for
      little loss. Each pattern must match a parameter.
    - ``lr``, ``weight_decay``, ``warmup`` (steps, or a fraction of the budget when < 1),
      ``clip`` (max gradient norm; None: no clipping); ``train_mode``: dropout and BatchNorm
      updates on (default off: the student fits the teacher's eval-mode function).
    - ``forward_fn(model, batch)``: how a batch is fed (default: a tensor as ``model(x)``, a
      tuple's first element, a dict as keywords).
    - ``cache_teacher``: ``"auto"`` (in memory, when the data is in memory and the cache fits
      ``cache_mb``), True, False, or a folder: the outputs on disk, memory-mapped when read,
      reused by a resumed run (``dualdrop.train.heal_run``: teacher memory). A teacher on
      another device than the student runs there (its inputs moved to it).
    - ``checkpoint_dir``, ``checkpoint_every``, ``resume``, ``stop_after`` (stop after this
      many steps of this call, checkpointed), ``log_every``, ``progress``: as ``fit``'s;
      ``until(step) -> bool``, asked after every step: True stops the call there, checkpointed
      (a budget of CPU or wall time rather than steps: the schedule keeps ``steps`` as its
      horizon, so set ``steps`` for the budget and let ``until`` cut the rest).

    Every argument is checked before anything acts (TypeError/ValueError naming it); a failure
    before the first update (the first batch's outputs, a checkpoint of another run) puts the
    student back exactly. Returns a :class:`HealResult`.
    """
    given_masks = None
    if isinstance(student, DepthResult):
        if block_map is None and block_weight > 0:
            block_map = list(student.kept)
        student = student.model
    if isinstance(student, OneShotResult):
        given_masks = student.masks if isinstance(masks, str) and masks == "zeros" else None
        student = student.model
    elif isinstance(student, StructuredResult):
        pass
    elif not isinstance(student, nn.Module):
        raise TypeError(f"student must be the pruned nn.Module or the result prune_oneshot "
                        f"returned, got {type(student).__name__}")
    if not isinstance(teacher, nn.Module):
        raise TypeError(f"teacher must be the dense nn.Module, got {type(teacher).__name__}")
    if teacher is student:
        raise ValueError("teacher is the student itself; pass the dense model (keep a copy "
                         "before pruning: copy.deepcopy(model))")
    opts = _check_options(locals())
    source = heal_source(data, tokenizer=tokenizer, batch_size=batch_size,
                         max_length=max_length, shuffle=shuffle, seed=seed)
    if not source.cacheable and cache_teacher not in ("auto", True, False):
        raise ValueError("cache_teacher: a folder caches the outputs of fixed batches, and a "
                         "DataLoader's batches may change from epoch to epoch; give the data "
                         "as a tensor, a list of batches or a file, or cache_teacher=False")
    total = opts["steps"]
    if total is None:
        try:
            total = epochs * len(source)
        except TypeError:
            raise ValueError("data has no len(); give the budget as steps=...") from None
    opts["warmup"] = _warmup_steps(warmup, total)
    ck = None
    path = os.path.join(checkpoint_dir, CHECKPOINT) if checkpoint_dir is not None else None
    if path and resume and os.path.exists(path):
        ck = read_checkpoint(path, keys=_KEYS, fix="delete it (or pass resume=False, or "
                             "another checkpoint_dir) to heal from the start")
    if isinstance(student, StructuredResult):
        student = student.compact()
    frozen = _frozen(student, freeze)
    held = _held_masks(student, masks if given_masks is None else given_masks)
    if not any(p.requires_grad for p in student.parameters() if id(p) not in frozen):
        raise ValueError("the student has no trainable parameter (requires_grad=False "
                         "everywhere, or every one named by freeze=); unfreeze some to heal")
    losses = L.check_loss(loss)
    fwd = forward_fn or default_forward
    dist = Dist(next(student.parameters()).device)
    settings = plain_settings({"lr": lr, "weight_decay": weight_decay, "warmup": opts["warmup"],
                               "clip": clip, "loss": loss if not callable(loss) else repr(loss),
                               "temperature": temperature, "block_weight": block_weight,
                               **({"label_weight": label_weight} if label_weight else {}),
                               **({"freeze": sorted(frozen.values())} if frozen else {}),
                               "total_steps": total, "seed": seed, "shuffle": shuffle,
                               "held": sum(int((m == 0).sum()) for _, m in held)})
    t_mode, s_mode = teacher.training, student.training
    was = {id(p): p.requires_grad for p in student.parameters()}
    with undo_on_error(student, values="all" if ck is not None else "buffers", rng=True,
                       generators=[source.generator] if source.generator is not None else []
                       ) as undo:
        run = HealRun(student, teacher, source, fwd, losses, temperature, block_weight, blocks,
                   block_map, teacher_dtype, cache_teacher, cache_mb, dist, label_weight)
        try:
            for p in student.parameters():
                if id(p) in frozen:
                    p.requires_grad_(False)
            result = _train(run, held, total, opts, settings, ck, undo, path, checkpoint_dir,
                            stop_after, until, log_every, progress, lr, weight_decay, clip,
                            train_mode)
        finally:
            for p in student.parameters():
                p.requires_grad_(was[id(p)])
            run.close()
            teacher.train(t_mode)
            student.train(s_mode)
    return result


def _train(run, held, total, opts, settings, ck, undo, path, checkpoint_dir, stop_after, until,
           log_every, progress, lr, weight_decay, clip, train_mode) -> HealResult:
    student, source = run.student, run.source
    first = _first_batch(source)
    run.make_projections(0 if hasattr(source, "batches") else None, first)
    params = [p for p in student.parameters() if p.requires_grad]
    extra = [p for p in run.projections.parameters()]
    decay = [p for p in params + extra if p.dim() >= 2]
    no_decay = [p for p in params + extra if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total, opts["warmup"]))
    with torch.no_grad():
        for p, m in held:
            p.mul_(m)
    step, epoch, done_in_epoch, epoch_rng, current_rng, history = 0, 0, 0, None, None, []
    if ck is not None:
        _load(ck, checkpoint_dir, student, run.projections, opt, sched, settings, total)
        step, epoch, done_in_epoch = ck["step"], ck["epoch"], ck["done_in_epoch"]
        epoch_rng, current_rng, history = ck["epoch_rng"], ck["rng"], list(ck["history"])
    first_update = opt.register_step_pre_hook(lambda *a: undo.commit())
    hold = opt.register_step_post_hook(lambda *a: _apply(held))
    all_params = params + extra

    def between():
        """After backward, before the step: the all-reduce, the masks, the clipping."""
        if run.dist.world > 1:
            run.dist.allreduce_grads(all_params)
            for p in all_params:
                if p.grad is not None:
                    p.grad.div_(run.dist.world)
        for p, m in held:
            if p.grad is not None:
                p.grad.mul_(m)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(all_params, clip)

    stepper = Stepper(opt, total, scheduler=sched, allreduce=between)
    saved = [time.monotonic()]

    def checkpoint():
        if path is None or not run.dist.main:
            return
        os.makedirs(checkpoint_dir, exist_ok=True)
        atomic_save({"student": student.state_dict(),
                     "projections": run.projections.state_dict(), "optimizer": opt.state_dict(),
                     "scheduler": sched.state_dict(), "step": step, "epoch": epoch,
                     "done_in_epoch": done_in_epoch, "total_steps": total,
                     "epoch_rng": epoch_rng, "rng": _rng_state(source), "history": history,
                     "settings": settings}, path)
        saved[0] = time.monotonic()

    last = [math.nan]

    def data_loss(item):
        key, batch = item
        value = run.loss(key, batch)
        last[0] = _check_loss(value, step + 1, undo.committed)
        return value

    ran = 0

    def after(done, value) -> bool:
        nonlocal step, done_in_epoch, ran
        step, done_in_epoch, ran = done, done_in_epoch + 1, ran + 1
        if bar is not None:
            bar.set_postfix(loss=f"{last[0]:.4g}")
        if log_every and step % log_every == 0:
            history.append({"step": step, "loss": last[0], "lr": sched.get_last_lr()[0]})
        if step >= total:
            return True
        every = opts["checkpoint_every"]
        if (every and step % every == 0) or time.monotonic() - saved[0] > 60:
            checkpoint()
        if (stop_after is not None and ran >= stop_after) or (until is not None and until(step)):
            checkpoint()
            return True
        return False

    student.train(train_mode)
    bar = tqdm(total=total, initial=step, desc="heal", leave=False) if progress else None
    try:
        while step < total:
            if epoch_rng is None:
                done_in_epoch = 0
            batches, epoch_rng = _epoch_batches(source, epoch_rng, done_in_epoch, current_rng)
            current_rng = None
            before, resumed_done = step, done_in_epoch
            step, ran_out = run_epoch(stepper, batches, data_loss, step, bar=bar, after=after)
            if not ran_out:
                break
            if step == before and not resumed_done:
                raise ValueError("data yielded no batch in an epoch; give it data")
            epoch, epoch_rng, done_in_epoch = epoch + 1, None, 0
    finally:
        if bar is not None:
            bar.close()
        first_update.remove()
        hold.remove()
    if step >= total:
        checkpoint()
    return HealResult(student, step, total, history, run.losses,
                      {n: m for n, m in _held_names(student, held)})


def heal_in_folder(net, teacher, data, folder, *, steps: int, lr: float, batch_size: int,
                   masks, progress: bool, tokenizer=None) -> dict:
    """``heal`` checkpointed in ``folder`` (resumed when a checkpoint is there), for the command
    line's run folders (``dualdrop prune --heal-steps``, ``dualdrop heal``); the record of the
    phase for the run's ``final.json``."""
    t0 = time.perf_counter()
    out = heal(net, teacher, data, steps=steps, lr=lr, batch_size=batch_size, masks=masks,
               tokenizer=tokenizer, checkpoint_dir=folder,
               checkpoint_every=max(1, min(100, steps // 10)), progress=progress)
    losses = [r["loss"] for r in out.history]
    net.eval()
    return {"status": "finished", "steps": out.step, "lr": lr, "batch_size": batch_size,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "held_masks": len(out.masks), "seconds": time.perf_counter() - t0,
            "tokenizer": None if tokenizer is None else str(getattr(tokenizer, "name_or_path",
                                                                    type(tokenizer).__name__))}


def _first_batch(source):
    """The first batch of ``source`` without moving its random state."""
    if hasattr(source, "batches"):
        return source.batches[0]
    state = _rng_state(source)
    try:
        return next(iter(source))[1]
    except StopIteration:
        raise ValueError("data yielded no batch; give it data") from None
    finally:
        _set_rng_state(source, state)


def _apply(held):
    with torch.no_grad():
        for p, m in held:
            p.mul_(m)


def _held_masks(model, masks) -> list:
    """``[(parameter, mask in its dtype)]`` of the masks to hold (``heal``'s ``masks``)."""
    named = dict(model.named_parameters())
    if masks is None:
        return []
    if isinstance(masks, str):
        if masks != "zeros":
            raise ValueError(f"masks must be 'zeros', a dict of bool tensors or None, got "
                             f"{masks!r}")
        return [(p, (p.detach() != 0).to(p.dtype)) for p in named.values()
                if p.dim() >= 2 and p.requires_grad and bool((p.detach() == 0).any())]
    if not isinstance(masks, dict):
        raise TypeError(f"masks must be 'zeros', a dict {{parameter name: bool tensor}} or None, "
                        f"got {type(masks).__name__}")
    out = []
    for name, m in masks.items():
        if name not in named:
            raise ValueError(f"masks: {name!r} is no parameter of the student")
        p = named[name]
        if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(p.shape):
            raise ValueError(f"masks[{name!r}] must be a tensor of the parameter's shape "
                             f"{tuple(p.shape)}")
        out.append((p, (m != 0).to(p.device, p.dtype)))
    return out


def _frozen(model, freeze) -> dict:
    """``{id(parameter): name}`` of the parameters ``freeze`` names (``heal``'s ``freeze``:
    names or ``fnmatch`` patterns, each matching at least one parameter)."""
    if freeze is None:
        return {}
    pats = [freeze] if isinstance(freeze, str) else freeze
    if not isinstance(pats, (list, tuple)) or not all(isinstance(q, str) for q in pats):
        raise TypeError(f"freeze must be a parameter name or pattern, or a list of them, got "
                        f"{freeze!r}")
    names = [n for n, _ in model.named_parameters()]
    out = {}
    for q in pats:
        hit = [n for n in names if fnmatch.fnmatchcase(n, q)]
        if not hit:
            raise ValueError(f"freeze: {q!r} matches no parameter of the student (its names "
                             f"look like {names[0]!r}: model.named_parameters())")
        out.update((id(p), n) for n, p in model.named_parameters() if n in hit)
    return out


def _held_names(model, held):
    ids = {id(p): n for n, p in model.named_parameters()}
    return [(ids[id(p)], m.bool()) for p, m in held]


def _load(ck, checkpoint_dir, student, projections, opt, sched, settings, total):
    fix = "use another checkpoint_dir or resume=False"
    if ck["total_steps"] != total:
        raise ValueError(f"the checkpoint in {checkpoint_dir} is for a budget of "
                         f"{ck['total_steps']} steps, not {total}; {fix}")
    detail = settings_diff(ck["settings"], settings, "in the checkpoint")
    if detail:
        raise ValueError(f"the checkpoint in {checkpoint_dir} is of a healing run with other "
                         f"settings ({detail}); {fix}")
    try:
        student.load_state_dict(ck["student"])
        projections.load_state_dict(ck["projections"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise ValueError(f"the checkpoint in {checkpoint_dir} does not fit this student "
                         f"({str(exc).splitlines()[0]}); {fix}") from None


def _check_options(a: dict) -> dict:
    """``heal``'s arguments checked before anything acts."""
    if (a["steps"] is None) == (a["epochs"] is None):
        raise ValueError("give the budget as exactly one of steps=... or epochs=...")
    steps = check_int("steps", a["steps"], low=1) if a["steps"] is not None else None
    if a["epochs"] is not None:
        check_int("epochs", a["epochs"], low=1)
    check_float("lr", a["lr"], low=0.0, low_open=True)
    check_float("weight_decay", a["weight_decay"], low=0.0)
    check_float("temperature", a["temperature"], low=0.0, low_open=True)
    check_float("block_weight", a["block_weight"], low=0.0)
    check_float("label_weight", a["label_weight"], low=0.0, high=1.0)
    check_float("cache_mb", a["cache_mb"], low=0.0)
    if a["clip"] is not None:
        check_float("clip", a["clip"], low=0.0, low_open=True)
    check_float("warmup", a["warmup"], low=0.0)
    L.check_loss(a["loss"])
    if a["forward_fn"] is not None and not callable(a["forward_fn"]):
        raise TypeError("forward_fn must be callable as forward_fn(model, batch)")
    if a["teacher_dtype"] is not None and not (isinstance(a["teacher_dtype"], torch.dtype)
                                               and a["teacher_dtype"].is_floating_point):
        raise TypeError(f"teacher_dtype must be None or a floating torch.dtype (e.g. "
                        f"torch.bfloat16), got {a['teacher_dtype']!r}")
    c = a["cache_teacher"]
    if isinstance(c, (str, os.PathLike)) and not (isinstance(c, str) and c == "auto"):
        if os.path.exists(c) and not os.path.isdir(c):
            raise ValueError(f"cache_teacher {str(c)!r} is a file; give a folder for the "
                             "teacher's outputs (created if missing)")
    elif c not in ("auto", True, False):
        raise ValueError(f"cache_teacher must be 'auto', True, False or a folder, got {c!r}")
    for name in ("train_mode", "shuffle", "resume", "progress"):
        if not isinstance(a[name], bool):
            raise TypeError(f"{name} must be True or False, got {a[name]!r}")
    if a["block_weight"] == 0 and (a["blocks"] is not None or a["block_map"] is not None):
        raise ValueError("blocks= and block_map= are for block matching: give block_weight > 0 "
                         "too")
    check_int("seed", a["seed"], low=0)
    check_int("log_every", a["log_every"], low=0)
    if a["until"] is not None and not callable(a["until"]):
        raise TypeError(f"until must be None or callable(step) -> bool, got {a['until']!r}")
    for name in ("checkpoint_every", "stop_after"):
        if a[name] is not None:
            check_int(name, a[name], low=1)
    if a["block_map"] is not None and not isinstance(a["block_map"], (list, tuple)):
        raise TypeError("block_map must be a list of teacher block indices, one per student "
                        "block")
    if a["warmup"] >= 1 and a["warmup"] != int(a["warmup"]):
        raise ValueError(f"warmup must be a number of steps (an integer) or a fraction of the "
                         f"budget below 1, got {a['warmup']!r}")
    _check_checkpoint_dir(a["checkpoint_dir"])
    return {"steps": steps, "checkpoint_every": a["checkpoint_every"]}


def _warmup_steps(warmup: float, total: int) -> int:
    """``warmup`` in steps: a fraction of ``total`` when below 1."""
    warm = int(round(warmup * total)) if warmup < 1 else int(warmup)
    return min(warm, total)
