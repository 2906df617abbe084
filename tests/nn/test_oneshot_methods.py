"""One-shot methods on the layer problem (W0, G): hand-computed cases, closed forms, exact budgets."""

import itertools

import numpy as np
import pytest
import torch

from dualdrop.nn.oneshot import Budget, OneShotMethod, get_method, layer_objective
from dualdrop.nn.oneshot.allocation.weights import allocate, outlier_ratio
from dualdrop.nn.oneshot.methods.base import (LayerProblem, parse_pattern, refit_on_support,
                                              split_count)
from dualdrop.nn.oneshot.registry import METHODS, available

D = torch.float64


def problem(out=6, inp=16, n=80, seed=0, dead=(), collinear=()):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, inp, generator=g, dtype=D) * torch.linspace(0.2, 3.0, inp, dtype=D)
    for j in dead:
        X[:, j] = 0
    for j, k in collinear:
        X[:, j] = 2 * X[:, k]
    W0 = torch.randn(out, inp, generator=g, dtype=D)
    return X, W0, X.T @ X / n


# ---- budget, registry, options -----------------------------------------------------------------

def test_budget_takes_exactly_one_and_checks_values():
    with pytest.raises(ValueError, match="exactly one"):
        Budget()
    with pytest.raises(ValueError, match="exactly one"):
        Budget(n_keep=3, pattern=(2, 4))
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="n_keep"):
            Budget(n_keep=bad)
    for bad in ((0, 4), (5, 4), (2,), [2, 4]):
        with pytest.raises(ValueError, match="pattern"):
            Budget(pattern=bad)
    with pytest.raises(ValueError, match="exceeds"):
        Budget(n_keep=13).check_shape((3, 4))
    with pytest.raises(ValueError, match="multiple of 4"):
        Budget(pattern=(2, 4)).check_shape((3, 6))
    assert Budget(pattern=(2, 4)).keep_count((3, 8)) == 12


def test_parse_pattern():
    assert parse_pattern("2:4") == (2, 4) and parse_pattern(" 4 : 8 ") == (4, 8)
    assert parse_pattern((1, 2)) == (1, 2)
    for bad in ("2-4", "4:4", "0:4", "a:b", (2, 2), 3):
        with pytest.raises(ValueError, match="pattern"):
            parse_pattern(bad)


def test_registry_names_and_option_errors():
    assert {"magnitude", "wanda", "sparsegpt"} <= set(available())
    with pytest.raises(ValueError, match="'nope'.*expected one of"):
        get_method("nope")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['blocksz'\].*blocksize"):
        get_method("sparsegpt", blocksz=4)
    with pytest.raises(ValueError, match="blocksize"):
        get_method("sparsegpt", blocksize=0)
    with pytest.raises(ValueError, match="damp"):
        get_method("sparsegpt", damp=-1.0)
    with pytest.raises(ValueError, match="group"):
        get_method("wanda", group="column")
    with pytest.raises(TypeError, match="refit"):
        get_method("magnitude", refit="yes")
    m = get_method("wanda", group="layer")
    assert get_method(m) is m
    with pytest.raises(ValueError, match="already built"):
        get_method(m, group="row")
    with pytest.raises(TypeError, match="method must be"):
        get_method(3)


def test_subclass_must_implement_underscore_prune():
    with pytest.raises(TypeError, match="_prune"):
        class Bad(OneShotMethod):  # noqa: F841
            def prune(self, W0, G, budget):
                return W0


def test_prune_refuses_contract_breaks():
    X, W0, G = problem()
    m = get_method("magnitude")
    with pytest.raises(TypeError, match="float64"):
        m.prune(W0.float(), G, Budget(n_keep=3))
    with pytest.raises(ValueError, match="G has shape"):
        m.prune(W0, G[:3, :3], Budget(n_keep=3))
    G2 = G.clone()
    G2[0, 1] += 1.0
    with pytest.raises(ValueError, match="symmetric"):
        m.prune(W0, G2, Budget(n_keep=3))
    with pytest.raises(TypeError, match="Budget"):
        m.prune(W0, G, 3)


# ---- exact budgets, every method -----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("refit", [False, True])
def test_every_method_meets_budget_exactly(name, refit):
    X, W0, G = problem(out=5, inp=16, dead=(3,), collinear=((7, 2),))
    opts = {"refit": refit}
    if not refit and "polish" in METHODS[name].defaults:
        opts["polish"] = False           # the support polish scores supports by their refit
    if not refit and METHODS[name].defaults.get("refit") and name == "polish":
        pytest.skip("the polish is a refit method")
    meth = get_method(name, **opts)
    for k in (0, 1, 17, 40, 80):
        W = meth.prune(W0, G, Budget(n_keep=k))
        assert W.dtype == D and W.shape == W0.shape
        assert int((W != 0).sum()) == k, (name, k)
    for n, m in ((2, 4), (4, 8), (1, 4)):
        W = meth.prune(W0, G, Budget(pattern=(n, m)))
        per_group = (W != 0).reshape(5, -1, m).sum(-1)
        if "polish" in opts:   # the raw penalty solution: at most N, zeros it chose stay
            assert bool((per_group <= n).all()), (name, n, m)
        else:
            assert bool((per_group == n).all()), (name, n, m)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_full_budget_keeps_the_layer(name):
    X, W0, G = problem()
    W = get_method(name).prune(W0, G, Budget(n_keep=W0.numel()))
    # a least-squares refit (a relative ridge of 1e-10 on the Gram) may move W0 by ~1e-8
    assert torch.allclose(W, W0, rtol=1e-7, atol=1e-7)
    assert layer_objective(W, W0, G) < 1e-18


def test_layer_objective_is_the_relative_reconstruction_error():
    X, W0, G = problem()
    W = W0 * (torch.rand(W0.shape, generator=torch.Generator().manual_seed(3)) > 0.5)
    direct = float(((X @ (W - W0).T) ** 2).sum() / ((X @ W0.T) ** 2).sum())
    assert layer_objective(W, W0, G) == pytest.approx(direct, rel=1e-12)


# ---- magnitude and Wanda by hand -----------------------------------------------------------------

def test_magnitude_by_hand():
    W0 = torch.tensor([[0.1, -3.0, 0.5, 2.0], [-1.0, 0.2, -2.5, 0.3]], dtype=D)
    G = torch.eye(4, dtype=D)
    W = get_method("magnitude").prune(W0, G, Budget(n_keep=3))
    assert torch.equal(W, torch.tensor([[0, -3.0, 0, 2.0], [0, 0, -2.5, 0]], dtype=D))
    W = get_method("magnitude").prune(W0, G, Budget(pattern=(1, 2)))
    assert torch.equal(W, torch.tensor([[0, -3.0, 0, 2.0], [-1.0, 0, -2.5, 0]], dtype=D))


def test_wanda_by_hand():
    # input norms ||X_j|| = sqrt(n G_jj) with G_jj = (1, 100, 0.01, 4): scores |W_ij| sqrt(G_jj)
    W0 = torch.tensor([[1.0, 0.2, 5.0, 0.6], [-2.0, 0.1, 30.0, -0.4]], dtype=D)
    G = torch.diag(torch.tensor([1.0, 100.0, 0.01, 4.0], dtype=D))
    # scores row 0: 1.0, 2.0, 0.5, 1.2   row 1: 2.0, 1.0, 3.0, 0.8
    W = get_method("wanda").prune(W0, G, Budget(n_keep=4))         # two per row
    assert torch.equal(W != 0, torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.bool))
    W = get_method("wanda").prune(W0, G, Budget(n_keep=5))         # 3 + 2, first row first
    assert torch.equal(W != 0, torch.tensor([[1, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.bool))
    W = get_method("wanda", group="layer").prune(W0, G, Budget(n_keep=3))  # 3.0, 2.0, 2.0
    assert torch.equal(W != 0, torch.tensor([[0, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool))
    W = get_method("wanda").prune(W0, G, Budget(pattern=(1, 2)))
    assert torch.equal(W != 0, torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.bool))
    assert torch.equal(W[W != 0], W0[W != 0])   # kept weights keep their values


# ---- SparseGPT: full density and the OBS closed form ---------------------------------------------

def obs_on(W0, H, r, q, F):
    """Optimal Brain Surgeon on the set F (hand-written from Hassibi & Stork's formula):
    remove w_rq and let the weights of F in row r absorb it."""
    W = W0.clone()
    HFi = torch.linalg.inv(H[F][:, F])
    iq = F.index(q)
    W[r, F] -= W0[r, q] / HFi[iq, iq] * HFi[:, iq]
    W[r, q] = 0.0
    return W


@pytest.mark.parametrize("damp", [0.0, 0.01])
@pytest.mark.parametrize("blocksize", [16, 5])
def test_sparsegpt_one_weight_is_obs(damp, blocksize):
    X, W0, G = problem(out=4, inp=10, n=60)
    H = G + damp * G.diagonal().mean() * torch.eye(10, dtype=D)
    meth = get_method("sparsegpt", damp=damp, blocksize=blocksize)
    # column 0: the whole row absorbs the loss -- plain OBS
    W0a = W0.clone()
    W0a[2, 0] = 1e-4
    W = meth.prune(W0a, G, Budget(n_keep=39))
    assert torch.allclose(W, obs_on(W0a, H, 2, 0, list(range(10))), rtol=1e-9, atol=1e-12)
    # a later column q: SparseGPT lets only the columns not yet visited (q, ..., in-1) absorb it
    W0b = W0.clone()
    W0b[1, 3] = 1e-4
    W = meth.prune(W0b, G, Budget(n_keep=39))
    expect = obs_on(W0b, H, 1, 3, list(range(3, 10)))
    assert torch.allclose(W, expect, rtol=1e-9, atol=1e-12)
    # the loss OBS predicts is the loss incurred
    loss = float(((W - W0b) @ H * (W - W0b)).sum())
    HFi = torch.linalg.inv(H[3:, 3:])
    assert loss == pytest.approx(float(W0b[1, 3] ** 2 / HFi[0, 0]), rel=1e-8)


def test_sparsegpt_full_density_returns_w0_even_with_dead_inputs():
    X, W0, G = problem(dead=(0, 5))
    assert torch.equal(get_method("sparsegpt").prune(W0, G, Budget(n_keep=W0.numel())), W0)
    assert torch.equal(get_method("sparsegpt").prune(W0, G, Budget(pattern=(4, 4))), W0)


def test_sparsegpt_lazy_batches_change_nothing_for_a_fixed_mask():
    # N:M masks are chosen column group by column group whatever the block size: the lazy
    # batch updates are the same arithmetic in another order
    X, W0, G = problem(out=7, inp=24)
    a = get_method("sparsegpt", blocksize=24).prune(W0, G, Budget(pattern=(2, 4)))
    b = get_method("sparsegpt", blocksize=4).prune(W0, G, Budget(pattern=(2, 4)))
    c = get_method("sparsegpt", blocksize=6).prune(W0, G, Budget(pattern=(2, 4)))
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-12) and torch.allclose(a, c, rtol=1e-9,
                                                                          atol=1e-12)


def test_sparsegpt_removes_unseen_inputs_first_and_beats_magnitude():
    X, W0, G = problem(out=6, inp=16, dead=(2, 9))
    W = get_method("sparsegpt").prune(W0, G, Budget(n_keep=60))
    assert not bool((W[:, [2, 9]] != 0).any())
    Wm = get_method("magnitude").prune(W0, G, Budget(n_keep=60))
    assert layer_objective(W, W0, G) < layer_objective(Wm, W0, G)


# ---- refit on support ----------------------------------------------------------------------------

def test_refit_is_least_squares_on_each_rows_support():
    X, W0, G = problem(out=4, inp=12, n=50)
    mask = torch.rand(W0.shape, generator=torch.Generator().manual_seed(1)) > 0.5
    W = refit_on_support(W0, W0 * mask, G)
    Xn, W0n = X.numpy(), W0.numpy()
    for r in range(4):
        s = mask[r].numpy()
        sol = np.linalg.lstsq(Xn[:, s], Xn @ W0n[r], rcond=None)[0]
        np.testing.assert_allclose(W[r, mask[r]].numpy(), sol, rtol=1e-7, atol=1e-9)
        assert not bool((W[r, ~mask[r]] != 0).any())


@pytest.mark.parametrize("name", sorted(METHODS))
def test_refit_never_worse(name):
    X, W0, G = problem(out=5, inp=16, n=100)
    a = get_method(name).prune(W0, G, Budget(n_keep=30))
    b = get_method(name, refit=True).prune(W0, G, Budget(n_keep=30))
    assert torch.equal(a != 0, b != 0)
    assert layer_objective(b, W0, G) <= layer_objective(a, W0, G) * (1 + 1e-9)


def test_refit_on_singular_support_is_finite():
    X, W0, G = problem(out=3, inp=8, dead=(1,), collinear=((5, 4),))
    W = refit_on_support(W0, W0, G)   # full support, singular Gram
    assert bool(torch.isfinite(W).all())
    assert layer_objective(W, W0, G) < 1e-8


def test_split_count_is_exact_and_proportional():
    assert split_count(10, [5, 5]) == [5, 5]
    assert split_count(7, [10, 10, 10]) == [3, 2, 2]
    assert sum(split_count(1234, [100, 333, 1000, 7])) == 1234
    with pytest.raises(ValueError):
        split_count(11, [5, 5])


# ---- allocations ---------------------------------------------------------------------------------

def problems():
    out = []
    for i, (o, n) in enumerate([(30, 40), (20, 30), (5, 20)]):
        X, W0, G = problem(out=o, inp=n, n=200, seed=i)
        out.append(LayerProblem(f"l{i}", W0 * (i + 1), G))
    return out


@pytest.mark.parametrize("kind", ["uniform", "global", "owl"])
@pytest.mark.parametrize("density", [0.9, 0.5, 0.1, 0.01, 0.001])
def test_allocations_meet_the_total_exactly(kind, density):
    ps = problems()
    total = sum(p.W0.numel() for p in ps)
    counts = allocate(ps, density, kind)
    assert sum(counts.values()) == round(density * total)
    assert all(0 <= counts[p.name] <= p.W0.numel() for p in ps)


def test_global_is_one_magnitude_threshold():
    ps = problems()
    counts = allocate(ps, 0.5, "global")
    allw = torch.cat([p.W0.abs().flatten() for p in ps])
    thr = torch.sort(allw, descending=True).values[round(0.5 * allw.numel()) - 1]
    for p in ps:
        assert counts[p.name] == int((p.W0.abs() >= thr).sum())


def test_owl_gives_more_to_layers_with_more_outliers():
    ps = problems()
    # a layer with a few huge weights has many outliers (scores above 5x the mean)
    W = ps[1].W0.clone()
    W[:, :3] *= 40
    ps[1] = LayerProblem("l1", W, ps[1].G)
    lod = [outlier_ratio(p.W0, p.G, 5.0) for p in ps]
    counts = allocate(ps, 0.3, "owl", owl_lambda=0.1)
    dens = [counts[p.name] / p.W0.numel() for p in ps]
    assert lod[1] == max(lod)
    assert dens[1] == max(dens)
    assert max(dens) - min(dens) == pytest.approx(0.2, abs=0.01)
    flat, uni = allocate(ps, 0.3, "owl", owl_lambda=0.0), allocate(ps, 0.3, "uniform")
    assert all(abs(flat[k] - uni[k]) <= 1 for k in uni)


def test_allocation_option_errors():
    ps = problems()
    with pytest.raises(ValueError, match="allocation='best'"):
        allocate(ps, 0.5, "best")
    with pytest.raises(ValueError, match="owl_q"):
        allocate(ps, 0.5, "owl", owl_q=1)
    with pytest.raises(ValueError, match="owl_m"):
        allocate(ps, 0.5, "owl", owl_m=0)
    with pytest.raises(ValueError, match="density"):
        allocate(ps, 0.0, "uniform")
    with pytest.raises(ValueError, match="none"):
        allocate(ps, 0.5, "uniform", x=1)


def test_pattern_counts():
    for (n, m), inp in itertools.product(((2, 4), (4, 8)), (8, 16)):
        assert Budget(pattern=(n, m)).keep_count((3, inp)) == 3 * inp * n // m
