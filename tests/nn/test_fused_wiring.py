"""The fused paths as the methods use them: seeded counter-based noise that resumes exactly from
a state dict, the kept regularizer terms, and no host reads inside a training step."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F

from dualdrop.nn import _numba
from dualdrop.nn.methods.hardconcrete import fused as HCF
from dualdrop.nn import sparsify
from dualdrop.nn._base import NoiseState

from dualdrop.nn.registry import REGISTRY, stochastic

STOCHASTIC = list(stochastic())
ALL = STOCHASTIC + [m for m in REGISTRY if m not in STOCHASTIC] + ["penalty:mcp", "penalty:l1"]
HP = {"penalty:mcp": {"penalty_params": {"lam": 0.1}}, "magnitude": {"prune_every": 2}}


def _mlp(method, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.ReLU(), torch.nn.Linear(10, 4))
    return model, sparsify(model, method, **HP.get(method, {}))


def _steps(model, sp, n, total=50, opt=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    opt = opt or torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    model.train()
    for k in range(1, n + 1):
        x, y = torch.randn(8, 12, generator=g), torch.randint(0, 4, (8,), generator=g)
        loss = F.cross_entropy(model(x), y) + sp.regularizer(400, value=False)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sp.after_step(opt, k, total)
    return opt


@pytest.mark.parametrize("method", STOCHASTIC)
def test_noise_is_seeded_and_a_loaded_state_dict_continues_it(method):
    a, _ = _mlp(method)
    b, _ = _mlp(method)
    x = torch.randn(5, 12)
    a.train(), b.train()
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)   # same torch seed, same noise
    assert not torch.equal(a(x), a(x))                        # a fresh draw at every forward
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    c, _ = _mlp(method, seed=1)                               # another seed, then a's state
    c.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    c.train()
    torch.testing.assert_close(c(x), a(x), rtol=0, atol=0)    # continues a's sequence
    d = copy.deepcopy(a)
    torch.testing.assert_close(d(x), a(x), rtol=0, atol=0)
    counts = [m.noise_count for m in a.modules() if isinstance(m, NoiseState)]
    assert counts and all(n == 5 for n in counts)  # a ran five training forwards


@pytest.mark.parametrize("method", STOCHASTIC)
def test_a_training_run_matches_its_resumed_copy_bit_for_bit(method):
    model, sp = _mlp(method)
    opt = _steps(model, sp, 3)
    buf = io.BytesIO()
    torch.save({"m": model.state_dict(), "o": opt.state_dict()}, buf)
    _steps(model, sp, 3, opt=opt, seed=1)
    ref = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    other, sp2 = _mlp(method, seed=5)
    ck = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    other.load_state_dict(ck["m"])
    opt2 = torch.optim.Adam(other.parameters(), lr=1e-2, fused=True)
    opt2.load_state_dict(ck["o"])
    _steps(other, sp2, 3, opt=opt2, seed=1)
    for k, v in other.state_dict().items():
        if torch.is_tensor(v):
            assert torch.equal(v, ref[k]), k


@pytest.mark.parametrize("method", STOCHASTIC)
def test_the_kept_term_has_the_fresh_regularizers_value_and_gradient(method):
    model, sp = _mlp(method)
    model.double().train()
    params = list(model.parameters())
    x = torch.randn(6, 12, dtype=torch.float64)
    for value in (True, False):
        model(x)
        kept = sp.regularizer(400, value=value)          # takes the forward's term
        g1 = torch.autograd.grad(kept, params, allow_unused=True)
        fresh = sp.regularizer(400, value=value)         # nothing kept: computed afresh
        g2 = torch.autograd.grad(fresh, params, allow_unused=True)
        torch.testing.assert_close(kept.detach(), fresh.detach(), rtol=1e-12, atol=0)
        for a, b in zip(g1, g2):
            a = torch.zeros_like(b) if a is None and b is not None else a
            b = torch.zeros_like(a) if b is None and a is not None else b
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    with torch.no_grad():
        model(x)
    assert all(getattr(m, "_term", None) is None for m in model.modules())  # nothing kept


def test_the_fused_path_is_the_default_and_can_be_switched_off(monkeypatch):
    model, _ = _mlp("hardconcrete")
    calls = []
    monkeypatch.setattr(HCF, "hard_concrete_gate",
                        lambda *a, _f=HCF.hard_concrete_gate: calls.append(1) or _f(*a))
    model.train()
    model(torch.randn(2, 12))
    assert len(calls) == 2
    monkeypatch.setattr(_numba, "ENABLED", False)
    model(torch.randn(2, 12))
    assert len(calls) == 2


class _HostReads:
    """Counts reads of tensor values to the host (what syncs a GPU) while installed."""

    NAMES = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")

    def __init__(self, monkeypatch):
        self.n = 0
        for name in self.NAMES:
            orig = getattr(torch.Tensor, name)

            def counted(t, *a, _orig=orig, **k):
                self.n += 1
                return _orig(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("method", ALL)
def test_a_training_step_reads_nothing_back_on_another_device(method, monkeypatch):
    """The other-device paths (taken for non-CPU tensors; run here on the CPU by pretending) read
    no tensor value to the host per step: 4 and 12 steps cost the same number of reads (the
    one-off ones: magnitude's first count of its masks). Untested on a GPU: none is available."""
    monkeypatch.setattr(_numba, "is_cpu", lambda *ts: False)
    reads = []
    for n in (4, 12):
        model, sp = _mlp(method)
        with monkeypatch.context() as m:
            counter = _HostReads(m)
            _steps(model, sp, n, total=24)
        reads.append(counter.n)
    assert reads[0] == reads[1], reads


@pytest.mark.parametrize("method", ["vardrop", "hardconcrete", "vardrop-lr"])
def test_preserved_noise_restores_the_streams_and_reseeds_reproducibly(method):
    from dualdrop.nn._base import preserved_noise

    model, sp = _mlp(method)
    model.train()
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(1))
    before = [(s.noise_seed, s.noise_count) for s in model.modules()
              if isinstance(s, NoiseState)]
    assert before
    with preserved_noise(model, seed=5):
        a = model(x).detach()
    with preserved_noise(model, seed=5):
        b = model(x).detach()
    with preserved_noise(model, seed=6):
        c = model(x).detach()
    assert torch.equal(a, b) and not torch.equal(a, c)
    after = [(s.noise_seed, s.noise_count) for s in model.modules() if isinstance(s, NoiseState)]
    assert after == before
    model2, _ = _mlp(method)  # the same run without any measurement
    model2.train()
    for _ in range(2):  # the run's own stream continues where it was
        with preserved_noise(model):
            model(x)
        assert torch.equal(model(x).detach(), model2(x).detach())
