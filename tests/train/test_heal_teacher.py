"""heal's teacher memory: its outputs cached on disk (memory-mapped), the same healing as the
teacher run every step; a cache folder of another teacher refused (dualdrop.train.heal_run)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import prune_oneshot
from dualdrop.train import heal


class _Encoder(nn.Module):
    """Residual blocks returning a Hugging Face-like output (token states: 3-D targets)."""

    def __init__(self, n_blocks=3, width=12, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(6, width)
        self.layer = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh())
                                   for _ in range(n_blocks))
        self.out = nn.Linear(width, 8)

    def forward(self, x):
        h = self.inp(x)
        for b in self.layer:
            h = h + b(h)
        return {"last_hidden_state": self.out(h)}


def _setup():
    teacher = _Encoder()
    student = copy.deepcopy(teacher)
    X = torch.randn(48, 5, 6, generator=torch.Generator().manual_seed(0))
    res = prune_oneshot(student, X, "magnitude", target_density=0.4, progress=False)
    return teacher, res, X


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _counting(teacher):
    calls = []
    teacher.register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_teacher_cached_on_disk_heals_as_the_teacher_run_every_step(tmp_path):
    teacher, res, X = _setup()
    kw = dict(steps=15, lr=1e-2, batch_size=16, block_weight=0.5, progress=False, seed=2)
    a, b, c = (copy.deepcopy(res.model) for _ in range(3))     # 3 batches an epoch, 5 epochs
    calls = _counting(teacher)
    heal(a, teacher, X, cache_teacher=False, **kw)
    assert len(calls) == 16                 # every step, and once to size the projections
    calls.clear()
    folder = tmp_path / "teacher"
    heal(b, teacher, X, cache_teacher=folder, **kw)
    assert len(calls) == 3                                      # the first epoch only
    assert _same(a.state_dict(), b.state_dict())                # bit for bit
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["r0-b0.pt", "r0-b1.pt", "r0-b2.pt", "teacher.json"]
    # what is on disk is the teacher's output (the pooled embedding and the token states)
    # and its matched blocks' states, read memory-mapped
    t = torch.load(folder / "r0-b1.pt", mmap=True, weights_only=True)
    with torch.no_grad():
        ref = teacher(X[16:32])["last_hidden_state"]
    assert torch.equal(t["mse"], ref) and torch.allclose(t["cosine"], ref.mean(1))
    assert len(t["blocks"]) == 3 and t["blocks"][0].shape == (16, 5, 12)
    # a second run on the same teacher and data reads the folder: the teacher is not run
    calls.clear()
    heal(c, teacher, X, cache_teacher=folder, **kw)
    assert len(calls) == 0 and _same(a.state_dict(), c.state_dict())


def test_disk_cache_resumes_and_refuses_another_teacher(tmp_path):
    teacher, res, X = _setup()
    kw = dict(steps=12, lr=1e-2, batch_size=16, progress=False, seed=1,
              cache_teacher=tmp_path / "cache")
    a = copy.deepcopy(res.model)
    heal(a, teacher, X, **{**kw, "cache_teacher": False})
    b = copy.deepcopy(res.model)
    part = heal(b, teacher, X, checkpoint_dir=tmp_path / "ck", stop_after=4, **kw)
    assert part.step == 4
    fresh = copy.deepcopy(res.model)                            # a killed process, restarted
    heal(fresh, teacher, X, checkpoint_dir=tmp_path / "ck", **kw)
    assert _same(a.state_dict(), fresh.state_dict())
    other = _Encoder(seed=5)                                    # another teacher: refused
    given = {k: v.clone() for k, v in res.model.state_dict().items()}
    with pytest.raises(ValueError, match="another healing run .*teacher_and_data"):
        heal(res.model, other, X, **kw)
    assert _same(given, res.model.state_dict())                 # the student as given
    with pytest.raises(ValueError, match="DataLoader"):
        loader = torch.utils.data.DataLoader(X, batch_size=16)
        heal(res.model, teacher, loader, **kw)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        heal(res.model, teacher, X, **{**kw, "cache_teacher": tmp_path / "f"})
    with pytest.raises(ValueError, match="cache_teacher must be"):
        heal(res.model, teacher, X, **{**kw, "cache_teacher": 3})

