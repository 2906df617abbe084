"""Lightning and transformers.Trainer callbacks, each on a tiny model."""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from dualdrop.nn import sparsify

torch.set_num_threads(1)


def _data(n=64):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 10, generator=g)
    return X, (X[:, 0] > 0).long()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))


class _HFNet(nn.Module):
    """The tiny MLP as a transformers.Trainer model: a dict with the loss."""

    def __init__(self):
        super().__init__()
        self.body = _mlp()

    def forward(self, x, labels=None):
        logits = self.body(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class _HFData(torch.utils.data.Dataset):
    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.X[i], "labels": self.y[i]}


def _lightning_module(L, net, optimizers):
    """A LightningModule training ``net`` on cross-entropy; ``optimizers(module)`` is its
    ``configure_optimizers``."""

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, _):
            x, t = batch
            return F.cross_entropy(self.net(x), t)

        def configure_optimizers(self):
            return optimizers(self)

    return Module()


def test_lightning_callback(tmp_path):
    L = pytest.importorskip("lightning")
    from dualdrop.train.callbacks import LightningSparsify

    X, y = _data()
    net = _mlp()
    sp = sparsify(net, "logsum", target_density=0.3)
    steps = 24

    module = _lightning_module(L, net, lambda m: torch.optim.Adam(
        sp.method_param_groups(1e-2, steps)))
    cb = LightningSparsify(sp, len(y))
    trainer = L.Trainer(max_epochs=3, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(TensorDataset(X, y), batch_size=8))
    assert trainer.global_step == steps
    assert sp.controller.reached is not None  # the final step ran the calibration
    assert abs(sp.density()["total"] / 0.3 - 1) <= 0.1
    assert sp.controller.log_m != 0.0  # the multiplier moved


def test_regularizer_gradient_is_added_once_per_step():
    from dualdrop.train.callbacks import _add_regularizer_grad

    net = _mlp()
    sp = sparsify(net, "logsum")
    w = sp.states()[0][0].param
    _add_regularizer_grad(sp, 100)
    g1 = w.grad.clone()
    net.zero_grad()
    (sp.regularizer(100)).backward()
    torch.testing.assert_close(g1, w.grad)


def test_transformers_trainer_callback(tmp_path):
    tr = pytest.importorskip("transformers")
    from dualdrop.train.callbacks import TrainerSparsify

    X, y = _data()

    model = _HFNet()
    sp = sparsify(model, "hardconcrete", target_density=0.3)
    steps = 20
    opt = torch.optim.Adam(sp.method_param_groups(1e-2, steps))
    args = tr.TrainingArguments(output_dir=str(tmp_path), max_steps=steps,
                                per_device_train_batch_size=8, report_to=[], save_strategy="no",
                                logging_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = tr.Trainer(model=model, args=args, train_dataset=_HFData(X, y),
                         optimizers=(opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)),
                         callbacks=[TrainerSparsify(sp, len(y))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert trainer.state.global_step == steps
    assert sp.controller.reached is not None
    assert abs(sp.density()["total"] / 0.3 - 1) <= 0.1


def _record_lr(sp):
    """Wrap ``sp.after_step`` to record ``(step, learning rate)`` at each call."""
    seen, real = [], sp.after_step

    def spy(optimizer, step, total):
        seen.append((step, optimizer.param_groups[0]["lr"]))
        return real(optimizer, step, total)

    sp.after_step = spy
    return seen


def test_callbacks_run_after_step_at_the_rate_of_its_step(tmp_path):
    """The prox of AdaProx is applied in after_step with the learning rate of the step it
    completes; with the linear decay to 0 the last one would otherwise be skipped (rate 0)."""
    tr = pytest.importorskip("transformers")
    L = pytest.importorskip("lightning")
    from dualdrop.train.callbacks import LightningSparsify, TrainerSparsify

    X, y = _data()
    steps, lr = 12, 1e-2
    want = [(s, lr * (1 - (s - 1) / steps)) for s in range(1, steps + 1)]

    model = _HFNet()
    sp = sparsify(model, "adaprox")
    seen = _record_lr(sp)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    args = tr.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=steps,
                                per_device_train_batch_size=8, report_to=[], save_strategy="no",
                                logging_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = tr.Trainer(model=model, args=args, train_dataset=_HFData(X, y),
                         optimizers=(opt, sched), callbacks=[TrainerSparsify(sp, len(y))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert [s for s, _ in seen] == [s for s, _ in want]
    assert [r for _, r in seen] == pytest.approx([r for _, r in want])

    net = _mlp()
    sp = sparsify(net, "adaprox")
    seen = _record_lr(sp)

    def decaying(module):
        o = torch.optim.Adam(module.parameters(), lr=lr)
        s = torch.optim.lr_scheduler.LambdaLR(o, lambda k: max(0.0, 1 - k / steps))
        return {"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "step"}}

    lt = L.Trainer(max_steps=steps, callbacks=[LightningSparsify(sp, len(y))], logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=str(tmp_path / "pl"),
                   accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lt.fit(_lightning_module(L, net, decaying), DataLoader(TensorDataset(X, y), batch_size=8))
    assert [s for s, _ in seen] == [s for s, _ in want]
    assert [r for _, r in seen] == pytest.approx([r for _, r in want])
