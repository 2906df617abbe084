"""heal's label_weight: distillation mixed with the student's loss on the batches' own labels."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.nn import prune_oneshot
from dualdrop.train import heal


def _setup(seed=0):
    torch.manual_seed(seed)
    teacher = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 10))
    X = torch.randn(192, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (192,), generator=torch.Generator().manual_seed(2))
    student = copy.deepcopy(teacher)
    res = prune_oneshot(student, X, "magnitude", target_density=0.3, progress=False)
    return teacher, res, list(zip(X.split(32), y.split(32)))


def _healed(res, teacher, pairs, **kw):
    s = copy.deepcopy(res.model)
    heal(s, teacher, pairs, steps=12, lr=3e-3, shuffle=False, masks=res.masks, progress=False,
         **kw)
    return s.state_dict()


def _close(a, b, atol):
    return all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


def test_label_weight_is_the_weighted_sum_of_kl_and_cross_entropy():
    teacher, res, pairs = _setup()
    T, a = 2.0, 0.3

    def by_hand(s, t, batch):  # Hinton et al.'s mix written independently (kl_div)
        kl = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean")
        return (1 - a) * T * T * kl + a * F.cross_entropy(s, batch[1])

    mixed = _healed(res, teacher, pairs, temperature=T, label_weight=a)
    manual = _healed(res, teacher, pairs, loss=by_hand)
    distil = _healed(res, teacher, pairs, temperature=T)
    assert _close(mixed, manual, 1e-5)
    assert not _close(mixed, distil, 1e-3)  # the labels change the result


def test_label_weight_one_ignores_the_teacher():
    teacher, res, pairs = _setup()
    other = copy.deepcopy(teacher)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    a = _healed(res, teacher, pairs, label_weight=1.0)
    b = _healed(res, other, pairs, label_weight=1.0)
    ce = _healed(res, teacher, pairs, loss=lambda s, t, batch: F.cross_entropy(s, batch[1]))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _close(a, ce, 1e-6)


def test_label_weight_uses_a_hugging_face_models_own_loss():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    teacher = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 32, (4, 8, 16), generator=torch.Generator().manual_seed(3))
    batches = [{"input_ids": b, "labels": b} for b in ids]

    def next_token(s, t, batch):  # the causal shift written out: position i predicts i + 1
        return F.cross_entropy(s[:, :-1].reshape(-1, 32), batch["labels"][:, 1:].reshape(-1))

    out = {}
    for name, kw in (("own", {"label_weight": 1.0}), ("manual", {"loss": next_token})):
        s = copy.deepcopy(teacher)
        heal(s, teacher, batches, steps=4, lr=1e-2, shuffle=False, masks=None,
             progress=False, **kw)
        out[name] = s.state_dict()
    assert _close(out["own"], out["manual"], 1e-5)
    assert not _close(out["own"], teacher.state_dict(), 1e-4)  # it trained


def test_label_weight_refusals_leave_the_student_as_given():
    teacher, res, pairs = _setup()
    before = {k: v.clone() for k, v in res.model.state_dict().items()}
    X = torch.cat([x for x, _ in pairs])
    with pytest.raises(ValueError, match="label_weight"):
        heal(res, teacher, pairs, steps=2, label_weight=1.5, progress=False)
    with pytest.raises(ValueError, match="label_weight > 0 needs labels"):
        heal(res, teacher, X, steps=2, label_weight=0.5, progress=False)
    floats = [(x, y.float()) for x, y in pairs]
    with pytest.raises(ValueError, match="class indices"):
        heal(res, teacher, floats, steps=2, label_weight=0.5, progress=False)
    assert all(torch.equal(before[k], v) for k, v in res.model.state_dict().items())
