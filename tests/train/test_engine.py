"""dualdrop.train.engine.fit: any model, any DataLoader, atomic checkpoints, exact resume."""

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from dualdrop.train.engine import CHECKPOINT, fit, train_step

torch.set_num_threads(1)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(6 * 4 * 4, 3)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(h.flatten(1)))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 16)
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def _cnn_data():
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(48, 1, 8, 8, generator=g), torch.randint(0, 3, (48,), generator=g))


def _seq_data():
    g = torch.Generator().manual_seed(2)
    return TensorDataset(torch.randint(0, 11, (40, 6), generator=g), torch.randint(0, 2, (40,), generator=g))


def _ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


CASES = [
    (SmallCNN, _cnn_data, "vardrop-lr", {}),
    (SmallCNN, _cnn_data, "hardconcrete", {}),
    (TinyTransformer, _seq_data, "logsum", {"exclude": ["enc.self_attn"]}),
    (TinyTransformer, _seq_data, "magnitude", {}),
]


def _run(make, data, method, kw, ckdir, stop_after=None, loader_gen=False):
    torch.manual_seed(0)
    model = make()
    gen = torch.Generator().manual_seed(5) if loader_gen else None
    loader = DataLoader(data(), batch_size=8, shuffle=True, generator=gen)
    out = fit(model, method, loader, _ce, epochs=3, lr=1e-2, target_density=0.3,
              val_loader=DataLoader(data(), batch_size=16), checkpoint_dir=ckdir,
              checkpoint_every=4, stop_after=stop_after, progress=False, log_every=2,
              sparsify_kwargs=kw)
    return model, out


@pytest.mark.parametrize("make,data,method,kw", CASES)
def test_killed_and_resumed_equals_uninterrupted(tmp_path, make, data, method, kw):
    ref, ref_out = _run(make, data, method, kw, str(tmp_path / "a"))
    assert ref_out.finished
    # "killed" after 7 steps (mid-epoch, after a checkpoint at 4): the last checkpoint is at 7
    _, part = _run(make, data, method, kw, str(tmp_path / "b"), stop_after=7)
    assert part.step == 7 and not part.finished
    assert os.path.exists(tmp_path / "b" / CHECKPOINT)
    assert not os.path.exists(tmp_path / "b" / (CHECKPOINT + ".tmp"))
    # a fresh process would start from a fresh model: re-initialized differently on purpose
    torch.manual_seed(123)
    res, res_out = _run(make, data, method, kw, str(tmp_path / "b"))
    assert res_out.finished and res_out.step == ref_out.step
    a, b = ref.state_dict(), res.state_dict()
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k
    assert ref_out.history == res_out.history
    reached = ref_out.sparsifier.density()["total"]
    assert abs(reached / 0.3 - 1) <= 0.1


def test_loader_with_own_generator_resumes_exactly(tmp_path):
    ref, _ = _run(SmallCNN, _cnn_data, "vardrop-lr", {}, str(tmp_path / "a"), loader_gen=True)
    _run(SmallCNN, _cnn_data, "vardrop-lr", {}, str(tmp_path / "b"), stop_after=5, loader_gen=True)
    res, _ = _run(SmallCNN, _cnn_data, "vardrop-lr", {}, str(tmp_path / "b"), loader_gen=True)
    for k, v in ref.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, res.state_dict()[k]), k


def test_fit_validates_arguments():
    model = SmallCNN()
    loader = DataLoader(_cnn_data(), batch_size=8)
    with pytest.raises(ValueError, match="exactly one of steps"):
        fit(model, "logsum", loader, _ce, progress=False)
    with pytest.raises(ValueError, match="exactly one of steps"):
        fit(model, "logsum", loader, _ce, steps=3, epochs=1, progress=False)
    with pytest.raises(TypeError, match="loss_fn"):
        fit(model, "logsum", loader, None, steps=3, progress=False)
    empty = DataLoader(_cnn_data(), batch_size=10_000, drop_last=True)  # no full batch
    with pytest.raises(ValueError, match="train_loader is empty"):
        fit(SmallCNN(), "logsum", empty, _ce, steps=3, n_train=10, progress=False)


def test_checkpoint_of_another_budget_is_refused(tmp_path):
    _run(SmallCNN, _cnn_data, "logsum", {}, str(tmp_path), stop_after=2)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="budget"):
        fit(SmallCNN(), "logsum", DataLoader(_cnn_data(), batch_size=8), _ce, steps=5,
            checkpoint_dir=str(tmp_path), progress=False)


def test_train_step_runs_in_the_documented_order():
    """regularizer, zero_grad, backward, all-reduce, optimizer step, after_step (the finished
    count), and the scheduler last."""
    calls = []
    w = nn.Parameter(torch.ones(3))

    class Opt(torch.optim.SGD):
        def zero_grad(self, set_to_none=True):
            calls.append("zero_grad")
            super().zero_grad(set_to_none=set_to_none)

        def step(self, closure=None):
            calls.append(("step", w.grad.clone()))
            return super().step(closure)

    class Sp:
        def regularizer(self, n_train, value=True):
            calls.append(("regularizer", n_train))
            r = (w ** 2).sum()
            return r - r.detach()

        def after_step(self, optimizer, step, total_steps):
            calls.append(("after_step", step, total_steps, optimizer.param_groups[0]["lr"]))

    class Sched:
        def step(self):
            calls.append("scheduler")

    opt = Opt([w], lr=0.5)
    step = train_step(w.sum(), opt, step=4, total_steps=9, sp=Sp(), scheduler=Sched(),
                      n_train=10, allreduce=lambda: calls.append("allreduce"), world=2)
    assert step == 5
    names = [c if isinstance(c, str) else c[0] for c in calls]
    assert names == ["regularizer", "zero_grad", "allreduce", "step", "after_step", "scheduler"]
    # the data loss's gradient 1 plus the regularizer's 2 w / world = 1
    assert torch.equal(calls[3][1], torch.full((3,), 2.0))
    assert calls[4] == ("after_step", 5, 9, 0.5)


def _adaprox_by_hand(after_step_first: bool):
    """AdaProx trained by a hand-written loop, with the prox before or after the scheduler."""
    from dualdrop.nn import sparsify

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    sp = sparsify(model, "adaprox", lam=0.05)
    total = 2 * len(_plain_loader())
    opt = torch.optim.Adam(sp.method_param_groups(1e-2, total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
    step = 0
    for _ in range(2):
        for batch in _plain_loader():
            loss = _ce(model, batch) + sp.regularizer(len(_plain_data()), value=False)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if after_step_first:
                sp.after_step(opt, step, total)
                sched.step()
            else:
                sched.step()
                sp.after_step(opt, step, total)
    return model


def _plain_data():
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(40, 8, generator=g), torch.randint(0, 3, (40,), generator=g))


def _plain_loader():
    return DataLoader(_plain_data(), batch_size=8)


def test_adaprox_last_prox_uses_the_learning_rate_of_its_step():
    """AdaProx's prox scales with the learning rate of the gradient step it completes; with the
    scheduler stepped first, the last step's prox would see the next rate, 0 under a linear
    decay, and be skipped. fit must match the loop that proxes first, not the other."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    fit(model, "adaprox", _plain_loader(), _ce, epochs=2, lr=1e-2, hparams={"lam": 0.05},
        progress=False, log_every=0)
    right, wrong = _adaprox_by_hand(True), _adaprox_by_hand(False)
    got = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    assert got
    for k, v in got.items():
        assert torch.equal(v, right.state_dict()[k]), k
    assert any(not torch.equal(v, wrong.state_dict()[k]) for k, v in got.items())


class _EpochLoader:
    """A loader with ``set_epoch``: its order is a function of the epoch alone."""

    def __init__(self, data, bs=8):
        self.data, self.bs, self.epoch, self.seen = data, bs, 0, []

    def __len__(self):
        return -(-len(self.data) // self.bs)

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.seen.append(epoch)

    def __iter__(self):
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.epoch))
        for b in range(len(self)):
            idx = order[b * self.bs:(b + 1) * self.bs]
            yield self.data[idx]


def test_a_protocol_through_hooks_and_no_method_resumes_bit_for_bit(tmp_path):
    """fit(method=None) with EpochHooks, as the CLI's protocol uses it: set_epoch before every
    epoch, start / row / extra / saved at the boundaries, a stop due on an epoch's last batch
    waiting for its row and checkpoint, and the resumed run equal to the uninterrupted one."""
    from dualdrop.train.engine import EpochHooks

    def run(folder, stop=None):
        torch.manual_seed(0)
        model = SmallCNN()
        loader = _EpochLoader(_cnn_data())
        log = []
        hooks = EpochHooks(start=lambda e: log.append(("start", e)),
                           row=lambda e, s: {"epoch": e, "step": s,
                                             "w": float(model.fc.weight.detach().sum())},
                           extra=lambda e, s: {"mine": e},
                           saved=lambda e, s: log.append(("saved", e, s)))
        out = fit(model, None, loader, _ce, epochs=3, checkpoint_dir=folder,
                  checkpoint_every=len(loader), stop_after=stop, log_every=0, progress=False,
                  hooks=hooks)
        return model, out, log, loader

    whole, out, log, loader = run(tmp_path / "a")
    assert loader.seen == [0, 1, 2] and out.sparsifier is None and out.finished
    assert [r["epoch"] for r in out.history] == [1, 2, 3]  # the rows only, no "final" row
    assert log[:2] == [("start", 0), ("saved", 1, 6)]
    _, part, _, _ = run(tmp_path / "b", stop=6)  # the stop falls on epoch 1's last batch
    assert part.step == 6 and [r["epoch"] for r in part.history] == [1]
    ck = torch.load(tmp_path / "b" / CHECKPOINT, weights_only=True)
    assert ck["mine"] == 1 and ck["epoch"] == 1 and ck["done_in_epoch"] == 0
    resumed, out2, _, loader2 = run(tmp_path / "b")
    assert loader2.seen == [1, 2] and out2.history == out.history
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="method=None .* hparams"):
        fit(SmallCNN(), None, loader, _ce, steps=2, hparams={"lam": 1.0})
