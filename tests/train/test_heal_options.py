"""heal's freeze= (the named parameters not trained, the rest healed as usual) and until= (a
stop asked after every step: budgets of time rather than steps)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from dualdrop.train import heal


def _nets():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(),
                            nn.Linear(24, 4))
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.3 * torch.randn_like(p))
    X = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    return teacher, student, X


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_frozen_parameters_unchanged_and_run_equals_requires_grad_false():
    teacher, student, X = _nets()
    manual = copy.deepcopy(student)
    before = _state(student)
    heal(student, teacher, X, steps=15, lr=1e-2, freeze=["0.*", "4.bias"], progress=False)
    after = student.state_dict()
    for k in ("0.weight", "0.bias", "4.bias"):
        assert torch.equal(after[k], before[k]), k
    for k in ("2.weight", "2.bias", "4.weight"):
        assert not torch.equal(after[k], before[k]), k
    assert all(p.requires_grad for p in student.parameters())  # set back as given
    # the same run with the user's own requires_grad=False: bit for bit the same student
    for n, p in manual.named_parameters():
        p.requires_grad_(n not in ("0.weight", "0.bias", "4.bias"))
    heal(manual, teacher, X, steps=15, lr=1e-2, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(manual.state_dict().values(),
                                                 student.state_dict().values()))


def test_freeze_refusals_leave_the_student_as_given(tmp_path):
    teacher, student, X = _nets()
    before = _state(student)
    with pytest.raises(ValueError, match="freeze: 'embeddings' matches no parameter"):
        heal(student, teacher, X, steps=5, freeze="embeddings", progress=False)
    with pytest.raises(TypeError, match="freeze must be"):
        heal(student, teacher, X, steps=5, freeze=[0], progress=False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        heal(student, teacher, X, steps=5, freeze="*", progress=False)
    assert all(torch.equal(a, before[k]) for k, a in student.state_dict().items())
    assert all(p.requires_grad for p in student.parameters())
    # a checkpoint of a run with other frozen parameters is not resumed
    heal(student, teacher, X, steps=6, stop_after=3, freeze="0.*", progress=False,
         checkpoint_dir=str(tmp_path))
    mid = _state(student)
    with pytest.raises(ValueError, match="other settings"):
        heal(student, teacher, X, steps=6, progress=False, checkpoint_dir=str(tmp_path))
    assert all(torch.equal(a, mid[k]) for k, a in student.state_dict().items())


def test_until_stops_where_it_says_as_stop_after_does(tmp_path):
    teacher, student, X = _nets()
    twin = copy.deepcopy(student)
    asked = []
    out = heal(student, teacher, X, steps=10, lr=1e-2, progress=False,
               until=lambda step: asked.append(step) or step >= 4,
               checkpoint_dir=str(tmp_path / "a"))
    assert out.step == 4 and not out.finished and asked == [1, 2, 3, 4]
    ref = heal(twin, teacher, X, steps=10, lr=1e-2, progress=False, stop_after=4,
               checkpoint_dir=str(tmp_path / "b"))
    assert ref.step == 4
    assert all(torch.equal(a, b) for a, b in zip(student.state_dict().values(),
                                                 twin.state_dict().values()))
    # both resume from their checkpoints to the same finished student
    heal(student, teacher, X, steps=10, lr=1e-2, progress=False, checkpoint_dir=str(tmp_path / "a"))
    heal(twin, teacher, X, steps=10, lr=1e-2, progress=False, checkpoint_dir=str(tmp_path / "b"))
    assert all(torch.equal(a, b) for a, b in zip(student.state_dict().values(),
                                                 twin.state_dict().values()))
    with pytest.raises(TypeError, match="until must be"):
        heal(student, teacher, X, steps=5, until=3, progress=False)
