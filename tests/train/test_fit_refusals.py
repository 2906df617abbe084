"""``fit`` refuses bad input before it trains and leaves the model exactly as given (state_dict
compared key by key, no parametrization or hook left, the random generators untouched); from
the first update on a failure keeps the work and never leaves a non-finite weight."""

import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from dualdrop.nn import Sparsifier, sparsify
from dualdrop.nn.sparsifier import is_sparsified
from dualdrop.train.engine import CHECKPOINT, fit

torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.fc1 = nn.Linear(6, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def data(n=32):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def loader(n=32, **kw):
    return DataLoader(data(n), batch_size=8, **kw)


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def fresh(hidden=8):
    torch.manual_seed(0)
    return Net(hidden)


class Given:
    """What a model (and the global generators) looked like before a call."""

    def __init__(self, model):
        self.model = model
        self.sd = {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                   for k, v in model.state_dict().items()}
        self.flags = [(p, p.requires_grad, p.grad) for p in model.parameters()]
        self.training = [(m, m.training) for m in model.modules()]
        self.rng = torch.get_rng_state()

    def check(self):
        sd = self.model.state_dict()
        assert list(sd) == list(self.sd)
        for k, v in self.sd.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(sd[k], v), k
            else:
                assert sd[k] == v, k
        for m, training in self.training:
            assert m.training == training
            assert not m._forward_hooks and not m._forward_pre_hooks
        assert [(p, p.requires_grad, p.grad) for p in self.model.parameters()] == self.flags
        assert not any(hasattr(m, "parametrizations") for m in self.model.modules()) \
            or is_sparsified(self.model)
        assert torch.equal(torch.get_rng_state(), self.rng)


def refused(model, exc, match, *args, **kw):
    given = Given(model)
    with pytest.raises(exc, match=match) as info:
        fit(model, *args, progress=False, **kw)
    given.check()
    return info.value


# ---- before anything acts -----------------------------------------------------------------------

def test_empty_loader_is_refused_by_name():
    empty = DataLoader(data(4), batch_size=8, drop_last=True)
    refused(fresh(), ValueError, "train_loader is empty", "logsum", empty, ce, epochs=1,
            n_train=4)
    refused(fresh(), ValueError, "train_loader is empty", "logsum", empty, ce, steps=2,
            n_train=4)


@pytest.mark.parametrize("kw,exc,match", [
    ({"stop_after": 0}, ValueError, "stop_after"),
    ({"stop_after": -1}, ValueError, "stop_after"),
    ({"checkpoint_every": -2}, ValueError, "checkpoint_every"),
    ({"checkpoint_every": 0}, ValueError, "checkpoint_every"),
    ({"log_every": -1}, ValueError, "log_every"),
    ({"lr": 0.0}, ValueError, "lr"),
    ({"lr": float("nan")}, ValueError, "lr"),
    ({"val_loader": DataLoader(data(4), batch_size=8, drop_last=True)}, ValueError,
     "val_loader is empty"),
    ({"val_fn": 3}, TypeError, "val_fn"),
    ({"scheduler": "cosine"}, ValueError, "scheduler"),
    ({"optimizer": "adam"}, TypeError, "optimizer"),
    ({"target_density": 1.5}, ValueError, "target_density"),
    ({"hparams": [("lam", 1)]}, TypeError, "hparams"),
    ({"resume": "yes"}, TypeError, "resume"),
    ({"checkpoint_dir": 3}, TypeError, "checkpoint_dir"),
])
def test_bad_arguments_are_refused_before_the_model_is_touched(kw, exc, match):
    refused(fresh(), exc, match, "logsum", loader(), ce, steps=3, **kw)


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_training(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    refused(fresh(), ValueError, "is a file", "logsum", loader(), ce, steps=3, checkpoint_dir=f)
    refused(fresh(), ValueError, "cannot be made", "logsum", loader(), ce, steps=3,
            checkpoint_dir=f / "sub")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_checkpoint_dir_that_is_not_writable_is_refused_before_training(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        refused(fresh(), PermissionError, "not writable", "logsum", loader(), ce, steps=3,
                checkpoint_dir=ro / "run")
    finally:
        ro.chmod(0o700)


def test_a_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        model = Net()
    with pytest.raises(ValueError, match="meta device"):
        fit(model, "logsum", loader(), ce, steps=2, progress=False)


# ---- the first batch's loss, checked before its update -------------------------------------

@pytest.mark.parametrize("loss_fn,exc,match", [
    (lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none"), ValueError,
     r"loss_fn must return a scalar tensor.*shape \(8,\)"),
    (lambda m, b: (m(b[0]).argmax(1) == b[1]).sum(), TypeError, "torch.int64 loss"),
    (lambda m, b: ce(m, b).detach(), ValueError, "no gradient"),
    (lambda m, b: float(ce(m, b)), TypeError, "must return a torch.Tensor"),
    (lambda m, b: ce(m, b) * float("nan"), FloatingPointError,
     "nan at step 1; the model is left as it was given"),
])
@pytest.mark.parametrize("method", ["logsum", "vardrop-lr", "hardconcrete"])
def test_a_bad_first_loss_is_refused_and_the_model_left_as_given(loss_fn, exc, match, method):
    model = fresh()
    err = refused(model, exc, match, method, loader(), loss_fn, steps=3, target_density=0.5)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert "\n" not in str(err)
    fit(model, method, loader(), ce, steps=2, progress=False)  # the same call can be retried


def test_a_refused_call_on_a_sparsified_model_keeps_its_method_state():
    torch.manual_seed(0)
    model = Net()
    sp = sparsify(model, "vardrop")
    counts = [st.noise_count for _, st in sp.states()]
    refused(model, FloatingPointError, "nan", "vardrop", loader(),
            lambda m, b: ce(m, b) * float("nan"), steps=3)
    assert [st.noise_count for _, st in sp.states()] == counts  # the noise streams too


def test_a_later_nan_keeps_the_work_and_every_weight_finite():
    model = fresh()
    calls = []

    def loss_fn(m, b):
        calls.append(1)
        loss = ce(m, b)
        return loss * float("nan") if len(calls) == 3 else loss

    with pytest.raises(FloatingPointError, match="nan at step 3; no update was made"):
        fit(model, "logsum", loader(), loss_fn, steps=5, lr=1e-2, progress=False)
    assert is_sparsified(model)                         # two steps of training kept
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(b).all() for b in model.buffers())


# ---- checkpoints: corrupt, truncated, of another model or method ---------------------------------

def _checkpointed(tmp_path, method="logsum", hidden=8):
    fit(fresh(hidden), method, loader(), ce, steps=6, stop_after=2, checkpoint_dir=tmp_path,
        progress=False)
    return tmp_path / CHECKPOINT


def test_a_corrupt_or_truncated_checkpoint_is_one_line(tmp_path):
    path = _checkpointed(tmp_path)
    good = path.read_bytes()
    for bad in (b"\x00garbage" * 50, good[: len(good) // 2], b""):
        path.write_bytes(bad)
        err = refused(fresh(), ValueError, str(path), "logsum", loader(), ce, steps=6,
                      checkpoint_dir=tmp_path)
        assert "\n" not in str(err) and "resume=False" in str(err)


def test_a_checkpoint_of_another_method_leaves_the_model_as_given(tmp_path):
    _checkpointed(tmp_path, "vardrop")
    refused(fresh(), ValueError, r"written by method\(s\) \['vardrop'\], this run uses "
            "'vardrop-lr'", "vardrop-lr", loader(), ce, steps=6, checkpoint_dir=tmp_path)
    refused(fresh(), ValueError, "'logsum'", "logsum", loader(), ce, steps=6,
            checkpoint_dir=tmp_path)


def test_a_checkpoint_of_another_architecture_copies_nothing(tmp_path):
    _checkpointed(tmp_path, "logsum", hidden=8)
    model = Net(hidden=12)                              # fc2.bias and bn have other shapes
    err = refused(model, ValueError, "of another model", "logsum", loader(), ce, steps=6,
                  checkpoint_dir=tmp_path)
    assert "other shapes ['bn.bias'" in str(err)


def test_a_checkpoint_whose_optimizer_state_does_not_fit_is_undone(tmp_path):
    path = _checkpointed(tmp_path)
    ck = torch.load(path, weights_only=True)
    ck["optimizer"]["param_groups"][0]["params"] = [0]   # loaded after the model's tensors
    torch.save(ck, path)
    refused(fresh(), ValueError, "does not fit this run", "logsum", loader(), ce, steps=6,
            checkpoint_dir=tmp_path)


def test_resume_after_a_refusal_still_continues_exactly(tmp_path):
    ref = fresh()
    fit(ref, "logsum", loader(shuffle=True), ce, steps=8, progress=False)
    model = fresh()
    fit(model, "logsum", loader(shuffle=True), ce, steps=8, stop_after=3,
        checkpoint_dir=tmp_path, progress=False)
    again = fresh()
    refused(again, FloatingPointError, "nan", "logsum", loader(shuffle=True),
            lambda m, b: ce(m, b) * float("nan"), steps=8, checkpoint_dir=tmp_path)
    fit(again, "logsum", loader(shuffle=True), ce, steps=8, checkpoint_dir=tmp_path,
        progress=False)
    for k, v in ref.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, again.state_dict()[k]), k


# ---- validation ----------------------------------------------------------------------------------

def test_a_validation_loader_without_batches_logs_nan_and_says_so():
    class Empty:
        def __iter__(self):
            return iter(())

    with pytest.warns(RuntimeWarning, match="val_loader yielded no batch"):
        out = fit(fresh(), "logsum", loader(), ce, steps=2, val_loader=Empty(), progress=False)
    assert math.isnan(out.history[-1]["val_loss"])


def test_an_optimizer_of_the_plain_model_after_remove_or_a_refusal_is_accepted():
    model = fresh()
    sp = sparsify(model, "vardrop")                     # the handle (and its states) alive
    sp.remove()
    opt = torch.optim.Adam(model.parameters())
    ce(model, next(iter(loader()))).backward()
    opt.step()                                          # the removed states are not watched
    assert sp.states is not None


def test_sparsifier_state_that_is_not_a_state_is_refused():
    sp = sparsify(fresh(), "logsum", target_density=0.5)
    for junk, exc in (("junk", TypeError), ({"bogus": 1}, ValueError), ({}, ValueError),
                      ({"controller": {"target": 0.5}}, ValueError)):
        before = sp.controller.state_dict()
        with pytest.raises(exc):
            sp.load_state_dict(junk)
        assert sp.controller.state_dict() == before
    sp2 = Sparsifier.attach(sp.model, "logsum")
    with pytest.raises(ValueError, match="controller"):
        sp2.load_state_dict(sp.state_dict())
