"""heal: distillation of a pruned student from its dense teacher (dualdrop.train.heal)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.nn import prune_oneshot
from dualdrop.train import HealResult, heal


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(),
                         nn.Linear(48, 10))


def _data(n=256, seed=1):
    return torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))


def _kl(student, teacher, X):
    with torch.no_grad():
        return float(F.kl_div(student(X).log_softmax(-1), teacher(X).softmax(-1),
                              reduction="batchmean"))


def _pruned(density=0.25, pattern=None):
    teacher = _mlp()
    student = copy.deepcopy(teacher)
    X = _data()
    res = prune_oneshot(student, X, "magnitude", target_density=None if pattern else density,
                        pattern=pattern, progress=False)
    return teacher, res, X


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_masks_held_exactly_and_student_moves_toward_teacher():
    teacher, res, X = _pruned(0.2)
    before = _kl(res.model, teacher, X)
    out = heal(res, teacher, X, steps=60, lr=3e-3, progress=False)
    assert isinstance(out, HealResult) and out.finished and out.model is res.model
    for name, p in res.model.named_parameters():
        if name in res.masks:
            assert torch.equal(p.detach() != 0, res.masks[name]), name  # support unchanged
    assert _kl(res.model, teacher, X) < 0.5 * before
    losses = [r["loss"] for r in out.history]
    assert losses[-1] < losses[0]


def test_nm_pattern_held():
    teacher, res, X = _pruned(pattern="2:4")
    heal(res, teacher, X, steps=30, lr=3e-3, progress=False)
    for name, m in res.masks.items():
        W = dict(res.model.named_parameters())[name].detach()
        assert torch.equal(W != 0, m)
        assert int((W.reshape(W.shape[0], -1, 4) != 0).sum(-1).max()) <= 2


def test_zeros_held_by_default_for_a_plain_module():
    teacher, res, X = _pruned(0.3)
    student = res.model
    zeros = {n: (p.detach() == 0) for n, p in student.named_parameters() if p.dim() == 2}
    heal(student, teacher, X, steps=20, lr=3e-3, progress=False)
    for n, p in student.named_parameters():
        if n in zeros:
            assert bool((p.detach()[zeros[n]] == 0).all())


def test_resume_after_interruption_equals_uninterrupted(tmp_path):
    teacher, res, X = _pruned(0.3)
    a, b = copy.deepcopy(res.model), copy.deepcopy(res.model)
    kw = dict(steps=25, lr=3e-3, batch_size=64, progress=False, seed=3)  # 4 batches an epoch
    heal(a, teacher, X, checkpoint_dir=tmp_path / "a", **kw)
    part = heal(b, teacher, X, checkpoint_dir=tmp_path / "b", stop_after=10, **kw)
    assert part.step == 10 and not part.finished
    fresh = copy.deepcopy(res.model)  # as if the process had been killed: a new student
    done = heal(fresh, teacher, X, checkpoint_dir=tmp_path / "b", **kw)
    assert done.step == 25
    assert _same(a.state_dict(), fresh.state_dict())
    with pytest.raises(ValueError, match="other settings"):
        heal(copy.deepcopy(res.model), teacher, X, checkpoint_dir=tmp_path / "b",
             **{**kw, "lr": 1e-3})


def test_refusals_leave_both_models_as_given(tmp_path):
    teacher, res, X = _pruned(0.3)
    s0, t0 = _state(res.model), _state(teacher)
    bad = [dict(lr=-1.0), dict(steps=0), dict(masks={"nope": torch.ones(1)}), dict(loss="l1"),
           dict(teacher_dtype="bf16"), dict(warmup=2.5), dict(blocks="0")]
    for kw in bad:
        with pytest.raises((ValueError, TypeError)):
            heal(res.model, teacher, X, **{"steps": 5, **kw}, progress=False)
    with pytest.raises(ValueError, match="tokenizer"):
        heal(res.model, teacher, ["some text"], steps=5, progress=False)
    with pytest.raises(ValueError, match="empty"):
        heal(res.model, teacher, ["a text", "  "], tokenizer=_Tok(), steps=5, progress=False)
    with pytest.raises(TypeError, match="one-pass"):
        heal(res.model, teacher, (x for x in [X]), steps=5, progress=False)
    with pytest.raises(ValueError, match="teacher is the student"):
        heal(res.model, res.model, X, steps=5, progress=False)
    # a failure while acting: the outputs do not match; the student is put back, modes too
    other = nn.Sequential(nn.Linear(16, 7))
    res.model.train()
    with pytest.raises(ValueError, match="differ in shape"):
        heal(res.model, other, X, steps=5, progress=False)
    assert res.model.training and other.training
    assert _same(s0, res.model.state_dict()) and _same(t0, teacher.state_dict())


class _Tok:
    """A tokenizer of the Hugging Face interface: a character-sum hash of each word."""

    def __call__(self, texts, padding=True, truncation=True, max_length=8, return_tensors="pt"):
        ids = [[(sum(map(ord, w)) % 50) + 1 for w in t.split()][:max_length] for t in texts]
        n = max(map(len, ids))
        return {"input_ids": torch.tensor([i + [0] * (n - len(i)) for i in ids]),
                "attention_mask": torch.tensor([[1] * len(i) + [0] * (n - len(i))
                                                for i in ids])}


class _TextNet(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(51, 12)
        self.head = nn.Linear(12, 5)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        return self.head(h.sum(1) / attention_mask.sum(1, keepdim=True))


TEXTS = [f"the {w} moves over the {v} field" for w in ("cat", "dog", "fox", "owl")
         for v in ("green", "dry", "wide")]


@pytest.mark.parametrize("form", ["texts", "txt", "jsonl"])
def test_text_forms(tmp_path, form):
    teacher, student = _TextNet(0), _TextNet(1)
    data = TEXTS
    if form == "txt":
        data = tmp_path / "heal.txt"
        data.write_text("\n".join(TEXTS) + "\n\n")
    elif form == "jsonl":
        data = tmp_path / "heal.jsonl"
        data.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    batches = [_Tok()(TEXTS)]
    before = sum(_kl_batch(student, teacher, b) for b in batches)
    heal(student, teacher, data, tokenizer=_Tok(), steps=40, lr=1e-2, batch_size=4,
         progress=False)
    assert sum(_kl_batch(student, teacher, b) for b in batches) < 0.5 * before


def _kl_batch(s, t, b):
    with torch.no_grad():
        return float(F.kl_div(s(**b).log_softmax(-1), t(**b).softmax(-1), reduction="batchmean"))


@pytest.mark.parametrize("form", ["batches", "loader", "npy", "pt", "pt-list"])
def test_sample_forms(tmp_path, form):
    teacher, res, X = _pruned(0.3)
    Y = torch.zeros(len(X), dtype=torch.long)
    data = {"batches": [X[i:i + 64] for i in range(0, len(X), 64)],
            "loader": torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y),
                                                  batch_size=64, shuffle=True)}.get(form)
    if form == "npy":
        data = tmp_path / "x.npy"
        np.save(data, X.numpy().astype(np.float64))
    elif form.startswith("pt"):
        data = tmp_path / "x.pt"
        torch.save(X if form == "pt" else list(X.split(64)), data)
    before = _kl(res.model, teacher, X)
    heal(res, teacher, data, steps=30, lr=3e-3, progress=False)
    assert _kl(res.model, teacher, X) < 0.7 * before


def test_bad_files(tmp_path):
    teacher, res, X = _pruned(0.3)
    (tmp_path / "a.csv").write_text("1,2")
    with pytest.raises(ValueError, match="unknown kind"):
        heal(res, teacher, tmp_path / "a.csv", steps=3, progress=False)
    (tmp_path / "b.pt").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="weights_only"):
        heal(res, teacher, tmp_path / "b.pt", steps=3, progress=False)


class _Encoder(nn.Module):
    """A stack of residual blocks returning a Hugging Face-like output."""

    def __init__(self, n_blocks, width=16, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(6, width)
        self.layer = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh())
                                   for _ in range(n_blocks))
        self.out = nn.Linear(width, 16)

    def forward(self, x):
        h = self.inp(x)
        for b in self.layer:
            h = h + b(h)
        return {"last_hidden_state": self.out(h)}


def test_encoder_losses_and_block_matching_with_projection():
    teacher = _Encoder(4)
    student = _Encoder(2, width=8, seed=1)  # shallower and narrower: block_map + projections
    X = torch.randn(64, 5, 6, generator=torch.Generator().manual_seed(0))

    def cos():
        with torch.no_grad():
            a = student(X)["last_hidden_state"].mean(1)
            b = teacher(X)["last_hidden_state"].mean(1)
        return float(F.cosine_similarity(a, b, -1).mean())

    before = cos()
    out = heal(student, teacher, X, steps=80, lr=1e-2, block_weight=0.5, block_map=[3, 1],
               batch_size=16, progress=False)
    assert out.losses == "auto" and cos() > before and cos() > 0.9
    with pytest.raises(ValueError, match="block_map"):
        heal(student, teacher, X, steps=2, block_weight=0.5, block_map=[0, 9], progress=False)


def test_structured_result_heals_its_compact_model():
    from dualdrop.nn.oneshot import prune_structured

    teacher = _mlp()
    student = copy.deepcopy(teacher)
    X = _data()
    res = prune_structured(student, X, "magnitude", granularity="neuron", target_density=0.5,
                           progress=False)
    out = heal(res, teacher, X, steps=40, lr=3e-3, progress=False)
    widths = [m.out_features for m in out.model if isinstance(m, nn.Linear)]
    assert out.model is not res.model and sum(widths[:2]) < 96  # the compact model trained
    assert _kl(out.model, teacher, X) < _kl(res.compact(), teacher, X)


def test_bfloat16_teacher_and_cache_off_give_a_healed_student():
    teacher, res, X = _pruned(0.3)
    before = _kl(res.model, teacher, X)
    heal(res, teacher, X, steps=30, lr=3e-3, teacher_dtype=torch.bfloat16,
         cache_teacher=False, progress=False)
    assert next(teacher.parameters()).dtype == torch.float32  # the teacher as given
    assert _kl(res.model, teacher, X) < 0.7 * before


def test_teacher_runs_once_per_batch_when_cached():
    teacher, res, X = _pruned(0.3)
    calls = []
    teacher.register_forward_hook(lambda *a: calls.append(1))
    heal(res, teacher, X, steps=12, batch_size=64, lr=1e-3, progress=False)  # 4 batches
    assert len(calls) == 4
    calls.clear()
    heal(res, teacher, X, steps=12, batch_size=64, lr=1e-3, cache_teacher=False, progress=False)
    assert len(calls) == 12


def test_prune_heal_rounds_meet_the_budget_exactly():
    from dualdrop.train import prune_heal

    teacher = _mlp()
    X = _data()
    model = copy.deepcopy(teacher)
    out = prune_heal(model, X, "sparsegpt", target_density=0.1, rounds=3, heal_steps=15,
                     teacher=teacher, heal_kwargs={"lr": 3e-3}, progress=False)
    assert [round(r["target_density"], 4) for r in out.rounds] == [0.4642, 0.2154, 0.1]
    one = copy.deepcopy(teacher)
    ref = prune_oneshot(one, X, "sparsegpt", target_density=0.1, progress=False)
    for name, m in ref.masks.items():  # the same count per layer as one shot at the target
        W = dict(out.model.named_parameters())[name]
        assert int((W != 0).sum()) == int(m.sum())
    assert _kl(out.model, teacher, X) < _kl(one, teacher, X)
    with pytest.raises(ValueError, match="target_params"):
        prune_heal(copy.deepcopy(teacher), X, rounds=2, heal_steps=2, target_density=0.5,
                   granularity="neuron", progress=False)


def test_prune_heal_structured_by_parameters():
    from dualdrop.train import prune_heal

    teacher = _mlp()
    X = _data()
    n = sum(p.numel() for p in teacher.parameters())
    out = prune_heal(copy.deepcopy(teacher), X, "osscar", target_params=n // 2, rounds=2,
                     heal_steps=10, granularity="neuron", progress=False)
    assert sum(p.numel() for p in out.model.parameters()) <= n // 2
    assert out.rounds[0]["target_params"] > n // 2


_DP_SCRIPT = """
import copy, os, sys, torch, torch.nn as nn
from dualdrop.nn import prune_oneshot
from dualdrop.train import heal
torch.manual_seed(0)
t = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
X = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
s = copy.deepcopy(t)
res = prune_oneshot(s, X, "magnitude", target_density=0.3, progress=False)
heal(res, t, X, steps=12, batch_size=64, lr=3e-3, progress=False)
if int(os.environ.get("RANK", "0")) == 0:
    torch.save(s.state_dict(), sys.argv[1])
"""


@pytest.mark.slow
def test_torchrun_two_processes_heal_as_one(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "dp.py"
    script.write_text(_DP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for cmd, out in (([sys.executable], "one.pt"),
                     ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node", "2"], "two.pt")):
        proc = subprocess.run([*cmd, str(script), str(tmp_path / out)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a = torch.load(tmp_path / "one.pt", weights_only=True)
    b = torch.load(tmp_path / "two.pt", weights_only=True)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)  # the rows split, grads summed


def test_block_map_pairs_each_student_block_with_its_teacher_block():
    teacher = _Encoder(3)
    X = torch.randn(16, 5, 6, generator=torch.Generator().manual_seed(0))

    def first_loss(block_map):
        out = heal(copy.deepcopy(teacher), teacher, X, steps=1, lr=1e-9, loss="mse",
                   block_weight=1.0, block_map=block_map, log_every=1, warmup=0,
                   progress=False)
        return out.history[0]["loss"]

    assert first_loss([0, 1, 2]) == pytest.approx(0.0, abs=1e-10)  # each block onto itself
    assert first_loss([2, 1, 0]) > 1e-3  # reversed: blocks 0 and 2 compared across


def test_blocks_by_name_match_an_mlps_hidden_layers():
    teacher, res, X = _pruned(0.3)
    hid = {}

    def gap():
        with torch.no_grad():
            for who, m in (("s", res.model), ("t", teacher)):
                h = m[2].register_forward_hook(lambda mod, a, out, who=who: hid.update({who: out}))
                m(X)
                h.remove()
        return float(((hid["s"] - hid["t"]) ** 2).sum() / (hid["t"] ** 2).sum())

    before = gap()
    # only the hidden layers' loss trains: the output loss is multiplied by 0
    heal(res, teacher, X, steps=60, lr=1e-2, block_weight=1.0, blocks=["0", "2"],
         loss=lambda s, t, b: 0.0 * s.sum(), progress=False)
    assert gap() < 0.6 * before                 # 0.46 -> 0.21 when written
    with pytest.raises(ValueError, match="no module 'fc9'"):
        heal(res, teacher, X, steps=2, block_weight=1.0, blocks=["0", "fc9"], progress=False)
