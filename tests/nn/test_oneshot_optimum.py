"""The optimization methods of one-shot pruning (admm, the penalty family, the polish) against
the exact optimum of layers small enough to enumerate every support, exact budgets and N:M
patterns, the polish's exact moves, and allocation="penalty"."""

import itertools

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from dualdrop.nn.oneshot.methods import _moves as K
from dualdrop.nn.oneshot.methods import polish as P
from dualdrop.nn.oneshot.methods._layer import ScaledLayer, exact_optimum
from dualdrop.nn.oneshot.methods.base import Budget, LayerProblem, layer_objective
from dualdrop.nn.oneshot.methods.penalty import _Path, allocate_penalty, nm_start, resolve
from dualdrop.nn.oneshot.registry import get_method
from oneshot_reference import blob_images


def _digits_layer(n_inputs=12, seed=0):
    """A real layer: a least-squares classifier of the digits on 12 of their pixels (raw 0..16
    intensities, unstandardized), its Gram from the images."""
    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.choice(np.flatnonzero(X.var(0) > 1.0), n_inputs, replace=False))
    Xs = X[:, cols]
    Y = np.eye(10)[y]
    W0 = np.linalg.lstsq(np.column_stack([Xs, np.ones(len(Xs))]), Y, rcond=None)[0][:-1].T
    return torch.from_numpy(W0.copy()), torch.from_numpy(Xs.T @ Xs / len(Xs))


def _synthetic_layer(R=8, p=12, seed=0):
    """Correlated inputs of unequal scales, standard normal trained weights."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((400, p)) @ (np.eye(p) + 0.6 * rng.standard_normal((p, p)) / np.sqrt(p))
    X *= rng.uniform(0.2, 3.0, p)
    return torch.from_numpy(rng.standard_normal((R, p))), torch.from_numpy(X.T @ X / 400)


LAYERS = [("digits0", lambda: _digits_layer(seed=0)), ("digits1", lambda: _digits_layer(seed=1)),
          ("synthetic0", lambda: _synthetic_layer(seed=0)),
          ("synthetic1", lambda: _synthetic_layer(seed=1))]


def _budgets(W0):
    n = W0.numel()
    return [Budget(n_keep=round(f * n)) for f in (0.4, 0.2, 0.1)] + [Budget(pattern=(2, 4))]


def test_exact_optimum_against_brute_force():
    """The per-row curves and the dynamic programming split against every support of the whole
    layer; N:M against every pattern."""
    W0, G = _synthetic_layer(R=2, p=6, seed=3)
    sl = ScaledLayer(W0, G)
    n = W0.numel()
    for k in (2, 4, 7):
        best = np.inf
        for S in itertools.combinations(range(n), k):
            mask = np.zeros(n, dtype=bool)
            mask[list(S)] = True
            W = sl.finish(mask.reshape(W0.shape), Budget(n_keep=k))
            best = min(best, layer_objective(W, W0, G))
        opt, sizes = exact_optimum(W0, G, Budget(n_keep=k))
        assert opt == pytest.approx(best, rel=1e-7)
        assert sizes.sum() == k
    W0, G = _synthetic_layer(R=2, p=8, seed=4)
    best = np.inf
    groups = [list(itertools.combinations(range(g, g + 4), 2)) for g in (0, 4)]
    for rows in itertools.product(itertools.product(*groups), repeat=2):
        mask = np.zeros((2, 8), dtype=bool)
        for r, parts in enumerate(rows):
            mask[r, [j for part in parts for j in part]] = True
        W = ScaledLayer(W0, G).finish(mask, Budget(pattern=(2, 4)))
        best = min(best, layer_objective(W, W0, G))
    assert exact_optimum(W0, G, Budget(pattern=(2, 4)))[0] == pytest.approx(best, rel=1e-7)


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS])
def test_methods_against_the_exact_optimum(layer):
    """Every budget: the exact count / pattern; the default penalty method within 2% of the
    enumerated optimum and never above ADMM with ALPS's schedule, ADMM within 10%; the polish
    never worse than the support it starts from. (ADMM's slow schedule reaches the optimum itself
    on some of these small layers, where the penalty method stays up to 2% above it.)"""
    W0, G = dict(LAYERS)[layer]()
    for budget in _budgets(W0):
        opt, _ = exact_optimum(W0, G, budget)
        res = {}
        for name, opts in [("logsum", {}), ("admm", {}),
                           ("admm", {"schedule": "alps", "coordinates": "scaled"}),
                           ("sparsegpt", {"refit": True}),
                           ("polish", {"start": get_method("sparsegpt")})]:
            W = get_method(name, **opts).prune(W0, G, budget)
            if budget.n_keep is not None:
                assert int((W != 0).sum()) == budget.n_keep, (name, budget)
            else:
                nz = (W != 0).reshape(W.shape[0], -1, 4).sum(-1)
                assert bool((nz == 2).all()), (name, budget)
            res[name + str(opts.get("schedule", ""))] = layer_objective(W, W0, G) / opt
        assert min(res.values()) >= 1 - 1e-7, res
        assert res["logsum"] <= 1.02, (budget, res)
        assert res["logsum"] <= res["admmalps"] * (1 + 1e-9), (budget, res)
        assert res["admm"] <= 1.10, (budget, res)
        assert res["polish"] <= res["sparsegpt"] + 1e-12, (budget, res)


def test_penalty_family_and_options():
    W0, G = _digits_layer(seed=2)
    budget = Budget(n_keep=30)
    opt, _ = exact_optimum(W0, G, budget)
    for name, opts in [("mcp", {}), ("penalty:l1", {}), ("penalty:scad", {"a": 3.7}),
                       ("vardrop", {}), ("hardconcrete", {}), ("logsum", {"eps": 0.3})]:
        W = get_method(name, **opts).prune(W0, G, budget)
        assert int((W != 0).sum()) == 30
        assert layer_objective(W, W0, G) <= 1.05 * opt, name
    # without refit: the penalized weights of the path (shrunk), a worse objective
    W = get_method("logsum", refit=False, polish=False).prune(W0, G, budget)
    assert int((W != 0).sum()) == 30
    assert layer_objective(W, W0, G) > layer_objective(
        get_method("logsum", polish=False).prune(W0, G, budget), W0, G)
    with pytest.raises(ValueError, match="eps"):
        get_method("logsum", eps=-1.0)
    with pytest.raises(ValueError, match="epz"):
        get_method("logsum", epz=1.0)
    with pytest.raises(ValueError, match="compiled kernel"):
        get_method("penalty:hard_threshold", k=3)
    with pytest.raises(ValueError, match="needs refit"):
        get_method("mcp", refit=False, polish=True)
    with pytest.raises(ValueError, match="schedule"):
        get_method("admm", schedule="fast")
    with pytest.raises(TypeError, match="start"):
        get_method("polish", start="wanda")


def test_full_density_and_dead_inputs():
    """Full density returns W0; dead inputs (never seen: G_jj = 0) are kept only where the
    budget needs more weights than the live inputs hold, at their trained values; an N:M group
    of dead inputs keeps N of them."""
    W0, G = _synthetic_layer(R=4, p=8, seed=5)
    for name in ("logsum", "admm", "polish"):
        W = get_method(name).prune(W0, G, Budget(n_keep=W0.numel()))
        assert torch.allclose(W, W0, atol=1e-9)
    G = G.clone()
    G[:4, :] = 0
    G[:, :4] = 0  # inputs 0-3 dead: one whole 2:4 group
    for name in ("logsum", "admm"):
        W = get_method(name).prune(W0, G, Budget(n_keep=20))  # 16 live weights
        assert int((W != 0).sum()) == 20
        assert int((W[:, :4] != 0).sum()) == 4
        kept = W[:, :4] != 0
        assert torch.equal(W[:, :4][kept], W0[:, :4][kept])
        W = get_method(name).prune(W0, G, Budget(pattern=(2, 4)))
        assert bool(((W != 0).reshape(4, 2, 4).sum(-1) == 2).all())


def test_polish_moves_are_exact():
    """Every rank-one move of a row's state equals the state rebuilt from scratch."""
    W0, G = _synthetic_layer(R=1, p=20, seed=6)
    sl = ScaledLayer(W0, G)
    Gd = sl.Gs + P.RIDGE * np.eye(sl.q)
    rng = np.random.default_rng(0)
    st = P._Row(Gd, sl.B[0], sl.c0[0], np.array([1, 4, 7, 9]))
    for _ in range(60):
        if st.s and (rng.random() < 0.5 or st.s == sl.q):
            st.remove(Gd, int(rng.integers(st.s)))
        else:
            assert st.add(Gd, int(rng.choice(np.flatnonzero(~st.inS))))
        fresh = P._Row(Gd, sl.B[0], sl.c0[0], st.support)
        assert st.f == pytest.approx(fresh.f, rel=1e-9, abs=1e-12)
        assert np.allclose(st.g, fresh.g, atol=1e-9) and np.allclose(st.c, fresh.c, atol=1e-9)
        assert np.allclose(st.H[:st.s, :st.s], fresh.H[:st.s, :st.s], atol=1e-8)
    MT = np.empty((st.s, sl.q))
    K._fill_mt(Gd, st.S, st.s, st.H, MT, st.c.copy(), st.inS)
    for _ in range(30):  # the fused swap
        i = int(rng.integers(st.s))
        k = int(rng.choice(np.flatnonzero(~st.inS)))
        st.f += K._swap(Gd, st.S, st.s, st.H, st.u, st.g, st.c, st.inS, MT, i, k, P.FLOOR)
        fresh = P._Row(Gd, sl.B[0], sl.c0[0], st.support)
        assert st.f == pytest.approx(fresh.f, rel=1e-9, abs=1e-12)
        MT2 = np.empty_like(MT)
        K._fill_mt(Gd, st.S, st.s, st.H, MT2, st.c.copy(), st.inS)
        assert np.allclose(MT, MT2, atol=1e-8)


def test_polish_function_on_any_result():
    W0, G = _digits_layer(seed=3)
    budget = Budget(n_keep=24)
    W = get_method("wanda").prune(W0, G, budget)
    Wp = P.polish(W, W0, G, budget)
    assert int((Wp != 0).sum()) == 24
    start = get_method("wanda", refit=True).prune(W0, G, budget)
    assert layer_objective(Wp, W0, G) <= layer_objective(start, W0, G)


def test_allocate_penalty_exact_total_and_floors():
    layers = [LayerProblem(f"l{i}", *(_synthetic_layer(R=6 + 2 * i, p=12, seed=10 + i)))
              for i in range(3)]
    sizes = [p.W0.numel() for p in layers]
    prev = None
    for density in (0.1, 0.3, 0.6):
        counts = allocate_penalty(layers, density, floors=[5, 5, 5])
        assert sum(counts.values()) == round(density * sum(sizes))
        assert all(5 <= counts[p.name] <= p.W0.numel() for p in layers)
        if prev is not None:
            assert all(counts[k] >= prev[k] for k in counts)
        prev = counts
    with pytest.raises(ValueError, match="eps"):
        allocate_penalty(layers, 0.2, eps=0.0)


@pytest.mark.parametrize("name", ["logsum", "mcp", "admm", "polish"])
def test_pattern_on_a_rank_deficient_gram(name):
    """Fewer calibration samples than the pattern keeps per row (rank 6, 8 kept of 16): once a
    row's support spans the inputs, a short group cannot gain an input without a singular
    support (the search raised here on LeNet-300-100's first layer, whose border pixels are seen
    on few images). The pattern is still met exactly, and the layer reproduced."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, 16)) * rng.uniform(0.5, 2.0, 16)
    W0 = torch.from_numpy(rng.standard_normal((4, 16)))
    G = torch.from_numpy(X.T @ X / 6)
    W = get_method(name).prune(W0, G, Budget(pattern=(2, 4)))
    nz = (W != 0).reshape(4, -1, 4).sum(-1)
    assert bool((nz == 2).all()), nz
    assert layer_objective(W, W0, G) < 1e-8


def _constant_inputs_layer(seed=0):
    """A layer whose first 12 inputs (three groups of 4) are constant over the calibration set,
    as standardized border pixels are: collinear with each other and nearly with the span of the
    others (inputs of mean 1), so that most rows' supports leave some of those groups short of
    N; 200 examples, 32 inputs, 24 rows."""
    rng = np.random.default_rng(seed)
    X = 1.0 + rng.standard_normal((200, 32)) @ np.diag(rng.uniform(0.5, 2.0, 32))
    X[:, :12] = rng.uniform(0.5, 1.5, 12)
    X[:, 12:17] += 0.8 * X[:, 17:22]  # correlated inputs: greedy choices are not locally optimal
    W0 = torch.from_numpy(rng.standard_normal((24, 32)))
    return W0, torch.from_numpy(X.T @ X / 200)


def _row_error(G, w0, S):
    """min over w supported on S of (w - w0)^T G (w - w0), by least squares (pseudo-inverse:
    collinear inputs allowed)."""
    b = G @ w0
    S = np.asarray(sorted(S))
    return float(w0 @ b - b[S] @ np.linalg.pinv(G[np.ix_(S, S)]) @ b[S])


def test_rows_with_a_short_group_are_polished_too():
    """Every row is left with no improving swap inside a group (checked by brute force with
    least squares), rows with a group that cannot be filled included: on LeNet-300-100's first
    layer at 2:4 every row had such a group, and the polish left the whole layer as the greedy
    fix made it."""
    W0, G = _constant_inputs_layer()
    W = get_method("logsum").prune(W0, G, Budget(pattern=(2, 4)))
    assert bool(((W != 0).reshape(24, -1, 4).sum(-1) == 2).all())
    G, W0, W = G.numpy(), W0.numpy(), W.numpy()
    for r in range(24):
        S = set(np.flatnonzero(W[r]).tolist())
        e = _row_error(G, W0[r], S)
        for j in S:
            for k in range(4 * (j // 4), 4 * (j // 4) + 4):
                if k not in S:
                    assert _row_error(G, W0[r], S - {j} | {k}) >= e - 1e-6 * (e + 1e-9), (r, j, k)


def test_nm_start_ranks_the_fits_weights_then_the_trained_ones():
    """With the polish, an N:M row starts from the N largest ``|u|`` of the path's last fit in
    every group, the inputs the fit left at 0 ranked after them by ``|u0|``; the polished
    result is never above that start's refit."""
    W0, G = _constant_inputs_layer(seed=1)
    sl = ScaledLayer(W0, G)
    b = Budget(pattern=(2, 4))
    rng = np.random.default_rng(0)
    U = sl.U0 * rng.uniform(0.5, 2.0, sl.U0.shape) * (rng.random(sl.U0.shape) < 0.4)
    m = nm_start(sl, U, b)
    assert bool((m.reshape(sl.R, -1, 4).sum(-1) == 2).all())
    a0 = np.abs(sl.U0)
    for r in range(sl.R):
        for lo in range(0, sl.q, 4):
            key = [(U[r, j] != 0, abs(U[r, j]) if U[r, j] else a0[r, j]) for j in range(lo, lo + 4)]
            kept = sorted(range(4), key=lambda j: key[j], reverse=True)[:2]
            assert set(np.flatnonzero(m[r, lo:lo + 4]).tolist()) == set(kept), (r, lo)
    path = _Path(sl, resolve("logsum"), 1e-2, 1)
    U, _ = path.to_budget(sl.live_target(b), ratio=0.5, slack=0.05, max_refine=12)
    start = [np.flatnonzero(row) for row in nm_start(sl, U, b)]
    W = get_method("logsum").prune(W0, G, b)
    after = layer_objective(W, W0, G) * sl.energy
    assert after <= sl.row_errors(start, range(sl.R)).sum() * (1 + 1e-9)


def test_swaps_end_when_a_refresh_shows_no_progress():
    """Swaps that only seem to improve (scored by rounding: inputs nearly in the span of the
    support) are caught by a rebuild, and the search never ends above the support it started
    from. Here the scores are made wrong on purpose: the row's error is passed as -1e9 (an
    error below 0 cannot be: the state is rebuilt at once, not after ``refresh`` swaps), and the
    error returned is the support's own, from scratch."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 32)) @ rng.standard_normal((32, 32))
    sl = ScaledLayer(torch.from_numpy(rng.standard_normal((8, 32))),
                     torch.from_numpy(X.T @ X / 200))
    mask = sl.top_mask(np.abs(sl.U0), Budget(pattern=(2, 4)))
    search = P.SupportSearch(sl, mask, pattern=(2, 4))
    search.fix_pattern()
    st = search.row(0)
    f0 = K._exact_f(search.Gd, sl.B[0], sl.c0[0], st.S, st.s)
    MT = np.empty((st.s, search.Gd.shape[0]))
    K._fill_mt(search.Gd, st.S, st.s, st.H, MT, st.c, st.inS)
    f, n = K._swap_loop(search.Gd, sl.B[0], sl.c0[0], st.S, st.s, st.H, st.u, st.g, st.c,
                        st.inS, MT, -1e9, False, search.gid, True, search.gstart, False, P.FLOOR,
                        1e-3, 100_000, 10)
    assert f == pytest.approx(K._exact_f(search.Gd, sl.B[0], sl.c0[0], st.S, st.s), rel=1e-9)
    assert f <= f0 * (1 + 1e-12)
    assert f == pytest.approx(_row_error(sl.Gs, sl.U0[0], st.S[:st.s]) / 2, rel=1e-6)


@pytest.mark.parametrize("start", ["wanda", "sparsegpt"])
def test_the_polish_never_raises_the_objective_on_constant_border_pixels(start):
    """The first layer of an MNIST network at 2:4 (LeNet-300-100: the polish took ADMM's
    0.001374 to 0.001500): hundreds of identical border inputs and a rank-deficient Gram made
    the swaps' scores drift (a row's tracked error reached -2800 with no rebuild), and the
    polish ended 1.1-1.9x above the support it was given on these images. It never ends above
    it now, and here it lowers it."""
    rng = np.random.default_rng(0)
    X = blob_images(300, rng)
    G = torch.from_numpy(X.T @ X / len(X))
    W0 = torch.from_numpy(rng.standard_normal((6, X.shape[1])) * 0.05)
    b = Budget(pattern=(2, 4))
    W = get_method(start, refit=True).prune(W0, G, b)
    before = layer_objective(W, W0, G)
    after = layer_objective(P.polish(W, W0, G, b), W0, G)
    assert after <= before * (1 + 1e-9)
    assert after < 0.9 * before
