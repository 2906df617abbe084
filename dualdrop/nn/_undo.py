"""A refused call leaves every object as it was given: a snapshot of what a call may change, put
back when the call fails.

``sparsify`` and ``dualdrop.train.fit`` check their arguments before they act, but some failures
can only show while acting: a forward run of ``example_inputs`` that torch-pruning traces (it
hooks every layer first), a checkpoint that does not fit the model, the first batch's loss. The
rule is then "undo on failure", in one place: :func:`undo_on_error`.

What the snapshot holds, for every module of the model: its class (``torch.nn.utils.parametrize``
swaps it), its instance attributes (``training``, the noise counters of a method's state, the
weight cache of a recurrent layer) and the *contents* of its parameter, buffer, submodule and
hook tables (objects and order: removing a parametrization would otherwise append the weight
after the bias and change ``state_dict``'s order); for every parameter its ``requires_grad``,
its ``.grad`` (the object) and its tensor hooks (a method's gradient hook,
``dualdrop.nn._gradhook``). Optionally, ``values``: copies of the buffers (``"buffers"``: what a
training-mode forward changes, BatchNorm's running statistics) or of every parameter and buffer
(``"all"``: before loading a checkpoint), and the global random generators (``rng``: torch's,
CUDA's when initialized, NumPy's, Python's, and any ``generators`` given). Parameters are copied
only when asked, so the usual guard of a call costs no weight-sized memory.

On an exception (or Ctrl-C) inside the block everything is put back and the exception goes on;
:meth:`Snapshot.commit` ends the guarantee early: ``fit`` commits right before its first
optimizer update, after which a failure keeps the work done (weights stay finite: the loss is
checked before each update).
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch
import torch.nn as nn

from dualdrop.nn import _gradhook

# the tables of nn.Module whose contents a call may change (hook tables, parameters, ...)
_TABLES = ("_parameters", "_buffers", "_modules", "_forward_hooks",
           "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
           "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks",
           "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
           "_load_state_dict_post_hooks")
_VALUES = (None, "buffers", "all")


class Snapshot:
    """What :func:`undo_on_error` puts back (module docstring); :meth:`restore` does it."""

    def __init__(self, model: nn.Module, *, values=None, rng: bool = False, generators=()):
        if values not in _VALUES:
            raise ValueError(f"values must be one of {list(_VALUES)}, got {values!r}")
        self.committed = False
        mods = list({id(m): m for m in model.modules()}.values())
        self._modules = []
        for m in mods:
            attrs = dict(m.__dict__)
            tables = {k: type(attrs[k])(attrs[k]) for k in _TABLES if isinstance(
                attrs.get(k), dict)}
            sets = {k: set(v) for k, v in attrs.items() if isinstance(v, set)}
            self._modules.append((m, type(m), attrs, tables, sets))
        params = list({id(p): p for m in mods for p in m._parameters.values()
                       if p is not None}.values())
        self._params = [(p, p.requires_grad, p.grad, _tensor_hooks(p),
                         _gradhook.HOOKS.get(id(p))) for p in params]
        tensors = []
        if values == "all":
            tensors = params
        if values is not None:
            tensors = tensors + [b for m in mods for b in m._buffers.values() if b is not None]
        tensors = list({id(t): t for t in tensors}.values())
        with torch.no_grad():
            self._values = [(t, t.detach().clone()) for t in tensors]
        self._rng = _rng_state(generators) if rng else None
        self._generators = list(generators)

    def commit(self) -> None:
        """End the guarantee: a later failure keeps what was done (and the memory is freed)."""
        self.committed = True
        self._modules = self._params = self._values = []
        self._rng = None

    @torch.no_grad()
    def restore(self) -> None:
        """Put every recorded object back as it was."""
        for m, cls, attrs, tables, sets in self._modules:
            if type(m) is not cls:
                m.__class__ = cls
            for k in [k for k in m.__dict__ if k not in attrs]:
                del m.__dict__[k]
            m.__dict__.update(attrs)
            for k, saved in tables.items():
                table = attrs[k]
                table.clear()
                table.update(saved)
            for k, saved in sets.items():
                attrs[k].clear()
                attrs[k].update(saved)
        for p, req, grad, hooks, gradhook in self._params:
            p.requires_grad_(req)
            p.grad = grad
            for name, (table, saved) in hooks.items():
                now = getattr(p, name, None)
                if now is not None and now is not table:
                    now.clear()  # made during the call: emptied (autograd holds a reference)
                if table is not None:
                    table.clear()
                    table.update(saved)
                    if now is not table:
                        setattr(p, name, table)
            made = _gradhook.HOOKS.get(id(p))
            if made is not gradhook:  # a method's gradient hook made during the call
                if made is not None:
                    made.remove()
                if gradhook is None:
                    _gradhook.HOOKS.pop(id(p), None)
                else:
                    _gradhook.HOOKS[id(p)] = gradhook
        for t, saved in self._values:
            t.copy_(saved)
        if self._rng is not None:
            _set_rng_state(self._rng, self._generators)


def _tensor_hooks(p) -> dict:
    """The hook tables of a tensor: ``{name: (table or None, a copy of its contents)}``."""
    out = {}
    for name in ("_post_accumulate_grad_hooks", "_backward_hooks"):
        table = getattr(p, name, None)
        out[name] = (table, dict(table) if table is not None else None)
    return out


def _rng_state(generators) -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate(), "own": [g.get_state() for g in generators]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, generators) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    for g, s in zip(generators, state["own"]):
        g.set_state(s)
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def undo_on_error(model: nn.Module, *, values=None, rng: bool = False, generators=()):
    """Run a block that acts on ``model``; if it raises (Ctrl-C included) before
    ``snapshot.commit()``, put ``model`` (and the random generators, with ``rng``) back exactly
    as they were, then let the exception go on. Yields the :class:`Snapshot`."""
    snap = Snapshot(model, values=values, rng=rng, generators=generators)
    try:
        yield snap
    except BaseException:
        if not snap.committed:
            snap.restore()
        raise
