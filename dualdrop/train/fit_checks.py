"""The checks of ``dualdrop.train.engine.fit``: every argument before anything acts (TypeError /
ValueError naming the argument and the fix), how the method's handle is got, a checkpoint to
resume from against the run, the optimizer a factory made, and each batch's loss before its
update. Nothing here trains; ``fit``'s docstring says the rules these checks enforce."""

from __future__ import annotations

import math
import os

import torch
import torch.nn as nn

from dualdrop.nn import Sparsifier
from dualdrop.nn import registry as _methods
from dualdrop.nn._graph import first_line
from dualdrop.nn.density import check_density
from dualdrop.nn.sparsifier import check_materialized, is_sparsified, sparsified_with
from penalties.checks import check_float, check_int


def _n_train(loader, n_train):
    if n_train is not None:
        return check_int("n_train", n_train, low=1)
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        raise ValueError("the loader's dataset has no len(); pass n_train=(number of training "
                         "examples)") from None



def _check_fit_args(model, method, loss_fn, train_loader, steps, epochs, lr, optimizer,
                    scheduler, target_density, hparams, n_train, val_loader, val_fn,
                    checkpoint_dir, checkpoint_every, resume, stop_after, log_every, progress,
                    sparsify_kwargs) -> dict:
    """Every argument of :func:`fit` checked before anything acts: TypeError/ValueError naming
    the argument and the fix. Returns ``{"total": steps of the budget, "n_train": ...,
    "plan": how the handle is got (:func:`_plan_method`)}``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not (method is None or isinstance(method, (str, Sparsifier))):
        raise TypeError(f"method must be a method name (e.g. 'logsum') or the Sparsifier that "
                        f"sparsify(model, ...) returned (None: no method), got "
                        f"{type(method).__name__}")
    if method is None:
        given = [k for k, v in (("hparams", hparams), ("target_density", target_density),
                                ("sparsify_kwargs", sparsify_kwargs)) if v]
        if given:
            raise ValueError(f"method=None trains the model as it is, so {', '.join(given)} "
                             "would be ignored; name a method, or leave them out")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(model, batch) -> scalar loss")
    if (steps is None) == (epochs is None):
        raise ValueError("give the budget as exactly one of steps=... or epochs=...")
    try:
        per_epoch = len(train_loader)
    except TypeError:
        per_epoch = None
    if per_epoch == 0:
        raise ValueError("train_loader is empty (len 0): it yields no batch; give it data (a "
                         "DataLoader with drop_last=True needs at least batch_size examples)")
    if steps is None:
        if per_epoch is None:
            raise ValueError("train_loader has no len(); give the budget as steps=...")
        total = check_int("epochs", epochs, low=1) * per_epoch
    else:
        total = check_int("steps", steps, low=1)
    check_float("lr", lr, low=0.0, low_open=True)
    if optimizer is not None and not callable(optimizer):
        raise TypeError(f"optimizer must be None (Adam) or a callable(param_groups) -> "
                        f"torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not (scheduler is None or scheduler == "linear" or callable(scheduler)):
        raise ValueError(f"scheduler must be 'linear', None or a callable, got {scheduler!r}")
    if target_density is not None:
        check_density(target_density)
    for name, value in (("hparams", hparams), ("sparsify_kwargs", sparsify_kwargs)):
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"{name} must be a dict or None, got {type(value).__name__}")
    # (no method: no regularizer to scale)
    n = _n_train(train_loader, n_train) if method is not None or n_train is not None else None
    if val_loader is not None:
        if not hasattr(val_loader, "__iter__"):
            raise TypeError(f"val_loader must be an iterable of batches (a DataLoader) or None, "
                            f"got {type(val_loader).__name__}")
        if hasattr(val_loader, "__len__") and len(val_loader) == 0:
            raise ValueError("val_loader is empty (len 0): give it data or leave it out (None)")
    if val_fn is not None and not callable(val_fn):
        raise TypeError("val_fn must be None or callable as val_fn(model, val_loader) -> dict")
    _check_checkpoint_dir(checkpoint_dir)
    if checkpoint_every is not None:
        check_int("checkpoint_every", checkpoint_every, low=1)
    if stop_after is not None:
        check_int("stop_after", stop_after, low=1)
    check_int("log_every", log_every, low=0)
    for name, value in (("resume", resume), ("progress", progress)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    check_materialized(model)
    if is_sparsified(model) and sparsify_kwargs:
        raise ValueError(f"model is already sparsified, so sparsify_kwargs "
                         f"{sorted(sparsify_kwargs)} would be ignored; pass a plain model "
                         "or leave sparsify_kwargs out")
    plan = _plan_method(model, method, dict(hparams or {}), target_density)
    return {"total": total, "n_train": n, "plan": plan}


def _plan_method(model, method, hparams: dict, target_density) -> dict:
    """How :func:`fit` gets its handle, checked before anything acts: ``{"handle": the
    Sparsifier given (None: made here), "attach": whether an already sparsified model given by
    name gets its handle rebuilt (``Sparsifier.attach``), "controller": the target density of a
    new controller on the handle, or None}`` (``fit``'s docstring says the rules)."""
    if method is None:
        return {"handle": None, "attach": False, "controller": None, "dense": True}
    if isinstance(method, Sparsifier):
        try:
            method.check_model(model)
        except ValueError as exc:
            raise ValueError(f"method: {exc}") from None
        keys = _methods.default_hparams(method.method)
        made = {"method": method.method, "coupled": False,
                "hparams": {k: v for k, v in method.hparams.items() if k in keys},
                "target_density": getattr(method.controller, "target", None)}
        plan = {"handle": method, "attach": False, "dense": False}
        new_controller = method.controller is None
    else:
        _methods.method_class(method)  # an unknown name: ValueError naming the choices
        if not is_sparsified(model):
            return {"handle": None, "attach": False, "controller": None, "dense": False}
        try:
            Sparsifier.check_attach(model, method)
        except ValueError as exc:
            raise ValueError(f"model is already sparsified: {exc}; pass the Sparsifier "
                             "sparsify returned, or a plain model") from None
        made = sparsified_with(model)
        plan = {"handle": None, "attach": True, "dense": False}
        new_controller = True
        if made is None:  # states made without sparsify's record: what the call gives
            return {**plan, "controller": target_density}
        if made["coupled"]:
            raise ValueError(f"model was sparsified with example_inputs, which coupled units "
                             f"across layers, and only the Sparsifier sparsify returned holds "
                             f"them: pass it as method (fit(model, sp, ...)) instead of "
                             f"{method!r}")
    _check_same_hparams(made, hparams)
    target = _planned_target(made, target_density)
    return {**plan, "controller": target if new_controller else None}


def _check_same_hparams(made: dict, hparams: dict) -> None:
    """``hparams`` given for an already sparsified model must be those it has: TypeError for
    an unknown name, ValueError naming the ones that differ."""
    if not hparams:
        return
    have = made["hparams"]
    asked = _methods.get(made["method"], **{**have, **hparams}).hparams
    differ = {k: asked[k] for k in hparams if asked[k] != have.get(k)}
    if differ:
        had = {k: have.get(k) for k in differ}
        raise ValueError(f"hparams {differ} differ from those the model was sparsified with "
                         f"({had}): an already sparsified model keeps its method's "
                         "hyperparameters; leave hparams out, or sparsify a plain model with "
                         "them")


def _planned_target(made: dict, target_density):
    """The target density of the new controller, or None (the rules in ``fit``'s docstring)."""
    had = made["target_density"]
    if target_density is None:
        return had
    target_density = check_density(target_density)
    if had is not None:
        if target_density != had:
            raise ValueError(f"the model was sparsified with target_density={had:g}, not "
                             f"{target_density:g}; leave target_density out, or sparsify a "
                             "plain model with the new one")
        return had
    if "lam" not in _methods.default_hparams(made["method"]):
        raise ValueError(f"{made['method']} has no strength for a target density to drive: its "
                         f"final sparsity is its hyperparameter sparsity="
                         f"{made['hparams'].get('sparsity')}, fixed by sparsify; sparsify a "
                         "plain model with target_density=... (or sparsity=...)")
    return target_density


def _check_checkpoint_dir(checkpoint_dir) -> None:
    """``checkpoint_dir`` is None or a folder that exists or can be made, and is writable: a
    bad one is refused now, not after the whole budget has run."""
    if checkpoint_dir is None:
        return
    if not isinstance(checkpoint_dir, (str, os.PathLike)):
        raise TypeError(f"checkpoint_dir must be a path (str or os.PathLike) or None, got "
                        f"{type(checkpoint_dir).__name__}")
    d = os.fspath(checkpoint_dir)
    if not d:
        raise ValueError("checkpoint_dir is an empty path; give a folder, or None for no "
                         "checkpoints")
    if os.path.exists(d) and not os.path.isdir(d):
        raise ValueError(f"checkpoint_dir {d!r} is a file, not a folder; give a folder (it is "
                         "made if missing)")
    probe = os.path.abspath(d)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"checkpoint_dir {d!r} cannot be made: {probe!r} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(f"checkpoint_dir {d!r}: {probe!r} is not writable; choose a folder "
                              "you can write to")


def _make_optimizer(factory, groups, method: str = ""):
    groups = [{**g, "params": list(g["params"])} for g in groups]
    if not any(g["params"] for g in groups):
        raise ValueError(f"the model has no parameter to train: every parameter has "
                         f"requires_grad=False and method {method!r} adds none of its own; "
                         "unfreeze the layers to fine-tune (p.requires_grad_(True) for p in "
                         "model.parameters()), or pass a model with trainable parameters")
    opt = factory(groups) if factory is not None else torch.optim.Adam(groups)
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optimizer must return a torch.optim.Optimizer, got "
                        f"{type(opt).__name__}")
    return opt


def _check_loss(loss, step: int, training: bool) -> float:
    """The value of ``loss_fn``'s loss at ``step``; TypeError/ValueError/FloatingPointError
    before its update when it is not a finite floating-point scalar with a gradient."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"loss_fn must return a torch.Tensor (the mean data loss of the batch), "
                        f"got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"loss_fn must return a scalar tensor (the mean data loss of the "
                         f"batch), got shape {tuple(loss.shape)}; reduce it, e.g. "
                         "F.cross_entropy(..., reduction='mean') or loss.mean()")
    if not loss.is_floating_point():
        raise TypeError(f"loss_fn returned a {loss.dtype} loss: a loss of integers has no "
                        "gradient, training would follow the regularizer alone; compute it in "
                        "floating point")
    if not loss.requires_grad:
        raise ValueError("loss_fn's loss has no gradient (computed under torch.no_grad(), "
                         "detached, or from frozen parameters only): training would follow "
                         "the regularizer alone")
    value = float(loss.detach())
    if not math.isfinite(value):
        where = ("no update was made: the weights are those of the step before"
                 if training else "the model is left as it was given")
        raise FloatingPointError(f"the data loss is {value} at step {step}; {where}; lower lr, "
                                 "or check loss_fn and the data")
    return value


def _load_fit_checkpoint(ck, checkpoint_dir, model, opt, sched, sp) -> None:
    """Load ``fit``'s checkpoint ``ck`` into the run: checked against the model first (method,
    keys, shapes), then loaded; ValueError naming what does not fit (the caller undoes)."""
    fix = "use another checkpoint_dir or resume=False"
    sd = ck["model"]
    if not isinstance(sd, dict):
        raise ValueError(f"the checkpoint in {checkpoint_dir} holds no model state; {fix}")
    methods = {v.get("method") for k, v in sd.items()
               if k.endswith("_extra_state") and isinstance(v, dict) and "method" in v}
    if methods and methods != {getattr(sp, "method", None)}:
        raise ValueError(f"the checkpoint in {checkpoint_dir} was written by method(s) "
                         f"{sorted(map(str, methods))}, this run uses "
                         f"{getattr(sp, 'method', 'none')!r}; {fix}, or the checkpoint's method")
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    shapes = [k for k in set(own) & set(sd) if isinstance(own[k], torch.Tensor) and (
        not isinstance(sd[k], torch.Tensor) or sd[k].shape != own[k].shape)]
    if missing or unexpected or shapes:
        what = "; ".join(f"{name} {keys[:3]}{' ...' if len(keys) > 3 else ''}"
                         for name, keys in (("missing", missing), ("unexpected", unexpected),
                                            ("other shapes", sorted(shapes))) if keys)
        raise ValueError(f"the checkpoint in {checkpoint_dir} is of another model ({what}); "
                         f"{fix}")
    try:
        model.load_state_dict(sd)
        opt.load_state_dict(ck["optimizer"])
        if sched is not None and ck.get("scheduler") is not None:
            sched.load_state_dict(ck["scheduler"])
        if sp is not None and ck["sparsifier"] is not None:
            sp.load_state_dict(ck["sparsifier"])
    except (ValueError, TypeError, KeyError, RuntimeError, IndexError) as exc:
        raise ValueError(f"the checkpoint in {checkpoint_dir} does not fit this run "
                         f"({first_line(exc)}); {fix}") from None
