"""Every method end to end on tiny data: trains, lowers density, deterministic eval, export,
deepcopy / pickle / state_dict round trips, Conv2d support."""

import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import METHODS, export_sparse, sparsify, sparsity_report

ALL = list(METHODS) + ["penalty:mcp", "penalty:l1"]
STOCHASTIC = {"vardrop", "vardrop-lr", "vardrop-lr-ar", "hardconcrete", "hardconcrete-neuron"}


def trained(h, method, data, epochs=2, seed=0):
    X, y = data
    model = h.make_mlp(seed)
    sp = sparsify(model, method, **h.FAST_HPARAMS[method])
    opt, _ = h.train(model, sp, X, y, epochs=epochs, lr=h.FAST_LR.get(method, 1e-2))
    model.eval()
    return model, sp, opt


@pytest.fixture(scope="module")
def trained_models(h, tiny_data):
    return {m: trained(h, m, tiny_data) for m in ALL}


@pytest.mark.parametrize("method", ALL)
def test_trains_and_lowers_density(method, trained_models, tiny_data, h):
    model, sp, _ = trained_models[method]
    X, y = tiny_data
    dens = sp.density()
    assert set(dens) == {"fc1", "fc2", "fc3", "total"}
    assert dens["total"] < 0.9, dens
    assert all(0.0 < v <= 1.0 for v in dens.values()), dens  # no layer deleted entirely
    # the pruned net still fits the data better than chance (4 classes)
    with torch.no_grad():
        acc = (model(X).argmax(1) == y).float().mean().item()
    assert acc > 0.5, acc
    # density agrees with the report and with the exported weights
    rows = sparsity_report(model)
    assert rows[-1]["layer"] == "total"
    assert rows[-1]["fraction"] == pytest.approx(dens["total"])
    plain = export_sparse(model, "dense")
    nnz = sum(int(torch.count_nonzero(m.weight)) for m in plain.modules()
              if isinstance(m, nn.Linear))
    assert nnz == rows[-1]["nonzero"]


@pytest.mark.parametrize("method", ALL)
def test_eval_is_deterministic_and_train_is_stochastic(method, trained_models, tiny_data):
    model, _, _ = trained_models[method]
    X, _ = tiny_data
    model.eval()
    with torch.no_grad():
        a, b = model(X[:50]), model(X[:50])
    assert torch.equal(a, b)
    model.train()
    with torch.no_grad():
        c, d = model(X[:50]), model(X[:50])
    model.eval()
    if method in STOCHASTIC:
        assert not torch.equal(c, d)
    else:
        assert torch.equal(c, d)


@pytest.mark.parametrize("method", ALL)
def test_export_dense_loads_strictly_and_matches(method, trained_models, tiny_data, h):
    model, _, _ = trained_models[method]
    X, _ = tiny_data
    exported = export_sparse(model, "dense")
    assert not exported.training
    plain = h.make_mlp(123)
    plain.load_state_dict(exported.state_dict(), strict=True)
    assert all(type(m) in (h.TinyMLP, nn.Linear) for m in plain.modules())
    plain.eval()
    with torch.no_grad():
        ref = model(X)
        assert torch.equal(exported(X), ref)
        assert torch.equal(plain(X), ref)
        csr = export_sparse(model, "csr")
        assert type(csr.fc1).__name__ == "CSRLinear"
        torch.testing.assert_close(csr(X), ref, rtol=1e-5, atol=1e-5)
        # feature-major input (features x batch storage, passed as a transposed view)
        fm = X.t().contiguous().t()
        assert not fm.is_contiguous()
        torch.testing.assert_close(csr(fm), ref, rtol=1e-5, atol=1e-5)
        auto = export_sparse(model, "auto")
        torch.testing.assert_close(auto(X), ref, rtol=1e-5, atol=1e-5)
    # the source model is untouched and still sparsified
    assert type(model.fc1).__name__ != "Linear"


@pytest.mark.parametrize("method", ALL)
def test_deepcopy_pickle_state_dict(method, trained_models, tiny_data, h):
    model, _, opt = trained_models[method]
    X, _ = tiny_data
    model.eval()
    with torch.no_grad():
        ref = model(X)
    clone = copy.deepcopy(model)
    pick = pickle.loads(pickle.dumps(model))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = h.make_mlp(99)
    sparsify(fresh, method, **h.FAST_HPARAMS[method])
    fresh.load_state_dict(torch.load(buf), strict=True)
    for other in (clone, pick, fresh):
        other.eval()
        with torch.no_grad():
            assert torch.equal(other(X), ref)
    # the optimizer state of the original loads into an optimizer of the fresh model
    opt2 = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    opt2.load_state_dict(opt.state_dict())


@pytest.mark.parametrize("method", ["vardrop", "magnitude", "penalty:mcp"])
def test_resume_continues_exactly(method, tiny_data, h):
    """state_dict + optimizer state (+ RNG) fully describe a run: stop, reload, continue."""
    X, y = tiny_data
    hp = h.FAST_HPARAMS[method]
    lr = h.FAST_LR.get(method, 1e-2)
    total = 2 * 25

    full = h.make_mlp(0)
    sp = sparsify(full, method, **hp)
    h.train(full, sp, X, y, epochs=2, lr=lr, total_steps=total)

    part = h.make_mlp(0)
    sp1 = sparsify(part, method, **hp)
    opt1, step = h.train(part, sp1, X, y, epochs=2, lr=lr, total_steps=total, stop_step=19)
    ck = {"model": copy.deepcopy(part.state_dict()), "opt": copy.deepcopy(opt1.state_dict()),
          "rng": torch.get_rng_state()}
    resumed = h.make_mlp(5)
    sp2 = sparsify(resumed, method, **hp)
    resumed.load_state_dict(ck["model"])
    opt2 = torch.optim.Adam(resumed.parameters(), lr=lr)
    opt2.load_state_dict(ck["opt"])
    # continue with the noise RNG state captured at the stop (a training loop checkpoints it)
    torch.set_rng_state(ck["rng"])
    _continue(h, resumed, sp2, opt2, X, y, start_step=step, total=total)
    for (n1, p1), (n2, p2) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert n1 == n2
        if isinstance(p1, torch.Tensor):
            assert torch.equal(p1, p2), n1


def _continue(h, model, sp, opt, X, y, start_step, total, batch=16, seed=0):
    """The tail of conftest.train after ``start_step``, without reseeding the noise RNG."""
    import torch.nn.functional as F

    n = len(y)
    spe = (n + batch - 1) // batch
    g = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(n, generator=g) for _ in range(2)]
    model.train()
    for e in range(2):
        for b in range(spe):
            k = e * spe + b + 1
            if k <= start_step:
                continue
            idx = orders[e][b * batch:(b + 1) * batch]
            loss = F.cross_entropy(model(X[idx]), y[idx]) + sp.regularizer(n)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sp.after_step(opt, k, total)


@pytest.mark.parametrize("method", ALL)
def test_conv2d_layers(method, h):
    torch.manual_seed(0)
    X = torch.randn(64, 2, 6, 6)
    y = (X[:, 0].mean((1, 2)) > 0).long() + (X[:, 1].mean((1, 2)) > 0).long()
    model = h.make_cnn()
    sp = sparsify(model, method, **h.FAST_HPARAMS[method])
    assert {n for n, _ in sp.named_states()} == {"conv", "fc"}
    h.train(model, sp, X, y, epochs=2, batch=16, lr=h.FAST_LR.get(method, 1e-2))
    model.eval()
    with torch.no_grad():
        out = model(X)
        assert torch.equal(model(X), out)
        exp = export_sparse(model, "auto")
        assert type(exp.conv) is nn.Conv2d
        torch.testing.assert_close(exp(X), out, rtol=1e-5, atol=1e-5)
    plain = h.make_cnn(3)
    plain.load_state_dict(export_sparse(model, "dense").state_dict(), strict=True)
    d = sp.density()
    assert 0.0 < d["conv"] <= 1.0 and 0.0 < d["total"] <= 1.0
