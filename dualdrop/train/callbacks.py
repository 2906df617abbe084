"""Thin callbacks that put a ``Sparsifier`` into PyTorch Lightning and ``transformers.Trainer``.

Both frameworks own the loss, the backward and the optimizer step, so the callback does the two
halves of ``dualdrop.train.engine.train_step``'s method work around them (the engine's own
``regularizer_term`` and ``finish_step``), once per *optimizer* step (gradient accumulation
included):

- before the step, the gradient of ``sp.regularizer(n_train)`` is added to the parameters'
  gradients (a separate backward of the regularizer: the same gradient as adding it to the loss,
  since gradients add; the user's loss stays as it is);
- after the step, ``sp.after_step(optimizer, step, total_steps)`` with the framework's step
  counter and budget (Lightning: ``trainer.estimated_stepping_batches``; Trainer:
  ``state.max_steps``), which drives the method's schedule and ``target_density``
  (``dualdrop.nn.density``), at the learning rate of that step (as in
  ``dualdrop.train.engine.train_step``: AdaProx's prox uses the rate of the step it completes).
  The Trainer steps its schedule after ``on_optimizer_step``, where this callback runs;
  Lightning steps a per-step schedule before ``on_train_batch_end``, so there the callback puts
  the step's rates back around ``after_step``.

Sparsify the model before the framework builds the optimizer; for the budget-aware rate of the
method's own parameters build it from ``sp.method_param_groups(lr, total_steps)`` (Lightning:
in ``configure_optimizers``; Trainer: ``optimizers=(Adam(groups), None)``). Install with
``pip install dualdrop[lightning]`` / ``dualdrop[hf]``.
"""

from __future__ import annotations

import torch

from dualdrop.train.engine import finish_step, regularizer_term
from penalties.checks import check_int


def _add_regularizer_grad(sp, n_train: int) -> None:
    """``backward()`` of the regularizer alone (terms kept by the last forward are dropped: the
    data loss's backward has freed their graph, and the regularizer is recomputed afresh)."""
    for _, st in sp.states():
        if hasattr(st, "take_term"):
            st.take_term()
    with torch.enable_grad():
        reg = regularizer_term(sp, n_train)
        if reg.requires_grad:  # AdaProx has none: its penalty acts by the prox in after_step
            reg.backward()


def _after(sp, optimizer, step: int, total: int) -> None:
    finish_step(sp, optimizer, min(step, total), total)  # the framework steps the schedule


try:  # PyTorch Lightning (the ``lightning`` package)
    from lightning.pytorch.callbacks import Callback as _LightningCallback
except ImportError:  # pragma: no cover - optional extra
    _LightningCallback = object


class LightningSparsify(_LightningCallback):
    """``Trainer(callbacks=[LightningSparsify(sp, n_train)])`` (module docstring)."""

    def __init__(self, sp, n_train: int):
        if _LightningCallback is object:
            raise ImportError("LightningSparsify needs PyTorch Lightning: pip install "
                              "dualdrop[lightning]")
        super().__init__()
        self.sp, self.n_train = sp, check_int("n_train", n_train, low=1)
        self._seen = None
        self._step_lrs = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        _add_regularizer_grad(self.sp, self.n_train)
        opt = getattr(optimizer, "optimizer", optimizer)
        self._step_lrs = [g.get("lr") for g in opt.param_groups]  # the rates of this step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step != self._seen and step > 0:
            self._seen = step
            opt = trainer.optimizers[0]
            opt = getattr(opt, "optimizer", opt)
            # Lightning has already stepped a per-step schedule: after_step sees the rates the
            # step used (AdaProx's prox), then the schedule's are put back
            now = [g.get("lr") for g in opt.param_groups]
            lrs = self._step_lrs or now
            for g, lr in zip(opt.param_groups, lrs):
                g["lr"] = lr
            try:
                _after(self.sp, opt, step, int(trainer.estimated_stepping_batches))
            finally:
                for g, lr in zip(opt.param_groups, now):
                    g["lr"] = lr

    def state_dict(self):
        return {"sparsifier": self.sp.state_dict(), "seen": self._seen}

    def load_state_dict(self, state):
        self.sp.load_state_dict(state["sparsifier"])
        self._seen = state["seen"]


try:  # Hugging Face transformers
    from transformers import TrainerCallback as _HFCallback
except ImportError:  # pragma: no cover - optional extra
    _HFCallback = object


class TrainerSparsify(_HFCallback):
    """``transformers.Trainer(..., callbacks=[TrainerSparsify(sp, n_train)])`` (module
    docstring). The controller's state travels in ``sp.state_dict()``; save it next to the
    Trainer's checkpoints to resume a target-density run."""

    def __init__(self, sp, n_train: int):
        if _HFCallback is object:
            raise ImportError("TrainerSparsify needs transformers: pip install dualdrop[hf]")
        self.sp, self.n_train = sp, check_int("n_train", n_train, low=1)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        _add_regularizer_grad(self.sp, self.n_train)

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        # after optimizer.step() and before the scheduler's step (on_step_end comes after it):
        # a prox step (AdaProx) must use the learning rate of the step it completes
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
        _after(self.sp, opt, state.global_step + 1, int(state.max_steps))
