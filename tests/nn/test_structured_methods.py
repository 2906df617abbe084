"""Structured one-shot methods against brute force on consumer layers small enough to enumerate
every kept set of units (synthetic unstandardized data and a real tiny BERT's Grams)."""

import itertools

import numpy as np
import pytest

from dualdrop.nn.oneshot.methods.structured import METHODS, UnitProblem
from dualdrop.nn.oneshot.registry import get_unit_method
from dualdrop.nn.oneshot.registry import unit_methods as available
from dualdrop.nn.oneshot.methods.structured import _kept
from dualdrop.nn.oneshot.methods.structured.base import objective, refit
from dualdrop.nn.oneshot.methods.structured.problem import as_mask

ALL = ["magnitude", "wanda-sp", "flap", "ziplm", "osscar", "logsum", "mcp", "penalty:l1",
       "penalty:scad"]


def make_problem(seed=0, n_units=7, m=1, out=5, n=300, centered=True, free=0):
    rng = np.random.default_rng(seed)
    p = n_units * m + free
    # unstandardized, correlated, non-negative inputs with a mean (post-activation features)
    X = np.maximum(rng.standard_normal((n, p)) @ rng.standard_normal((p, p)), 0) \
        * rng.uniform(0.2, 5.0, p) + rng.uniform(0, 2, p)
    W0 = rng.standard_normal((out, p)) * rng.uniform(0.1, 3.0, p)
    cols = [np.arange(g * m, (g + 1) * m) for g in range(n_units)]
    return UnitProblem("layer", W0, X.T @ X / n, X.mean(0), cols, b0=rng.standard_normal(out),
                       centered=centered, part_sq=rng.uniform(0, 2, n_units)), X


def brute(problem, k, damp=1e-6):
    vals = {S: objective(problem, refit(problem, list(S), damp))
            for S in itertools.combinations(range(problem.n_units), k)}
    return vals


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("centered", [True, False])
def test_methods_against_enumeration(m, centered):
    pr, _ = make_problem(seed=m + 10 * centered, m=m, centered=centered)
    k = 3
    vals = brute(pr, k)
    best = min(vals.values())
    for name in ALL:
        meth = get_unit_method(name)
        sol = meth.solve(pr, k)
        S = tuple(int(u) for u in sol.kept)
        assert len(S) == k and len(set(S)) == k, name
        assert sol.objective >= best - 1e-9, name
        if meth.options["refit"]:
            # the refit is the least-squares optimum of its kept set
            assert sol.objective == pytest.approx(vals[S], rel=1e-7, abs=1e-12), name
        if meth.options["polish"]:
            # a local optimum of single swaps: no swap of the enumeration lowers it
            for i in S:
                for j in set(range(pr.n_units)) - set(S):
                    T = tuple(sorted(set(S) - {i} | {j}))
                    assert vals[T] >= vals[S] - 1e-9 * max(1.0, vals[S]), (name, i, j)


def test_ziplm_is_the_exact_greedy():
    """ZipLM's removal order is the OBS greedy: each step removes the unit whose removal (with
    the rest refit on the damped Gram) raises the error least; checked by refitting every
    candidate from scratch, for one-column units (the compiled path) and blocks."""
    for m in (1, 2):
        pr, _ = make_problem(seed=3, n_units=8, m=m)
        damp = 0.01
        got = set(get_unit_method("ziplm", damp=damp).solve(pr, 3).kept.tolist())
        A = _kept.damped(pr, damp)
        alive = list(range(pr.n_units))
        while len(alive) > 3:
            def err(S):
                cols = pr.kept_columns(S)
                B = pr.W0 @ A
                return -float(np.sum(B[:, cols] * np.linalg.solve(A[np.ix_(cols, cols)],
                                                                 B[:, cols].T).T))
            costs = [err([u for u in alive if u != g]) for g in alive]
            alive.remove(alive[int(np.argmin(costs))])
        assert got == set(alive)


def test_exact_moves_match_refits():
    """Removal costs, addition gains and swap deltas of the low-rank formulas equal the
    differences of refit errors."""
    for m in (1, 2):
        pr, _ = make_problem(seed=5, n_units=6, m=m)
        E = pr.energy()
        f = {S: v * E for S, v in brute(pr, 3, damp=0.0).items()}
        f.update({S: v * E for S, v in brute(pr, 2, damp=0.0).items()})
        f.update({S: v * E for S, v in brute(pr, 4, damp=0.0).items()})
        S = (0, 2, 4)
        st = _kept._State(pr, 0.0, as_mask(S, 6))
        assert st.error() == pytest.approx(f[S], rel=1e-8)
        for g, c in zip(S, st.removal_costs(S)):
            assert c == pytest.approx(f[tuple(u for u in S if u != g)] - f[S], rel=1e-6,
                                      abs=1e-9 * E)
        out = (1, 3, 5)
        for a, gain in zip(out, st.addition_gains(out)):
            assert gain == pytest.approx(f[S] - f[tuple(sorted(S + (a,)))], rel=1e-6,
                                         abs=1e-9 * E)
        delta, g, a = _kept.best_swap(st)
        want = min((f[tuple(sorted(set(S) - {i} | {j}))] - f[S], i, j) for i in S for j in out)
        assert delta == pytest.approx(want[0], rel=1e-6, abs=1e-9 * E)
        assert (g, a) == want[1:]


def test_column_swaps_reach_a_local_optimum_with_rank_one_updates():
    """The incremental swap search (rank-one updates, candidate pairs first) ends where no
    single swap lowers the refit error, as the rebuild-every-move search does."""
    pr, _ = make_problem(seed=7, n_units=14, m=1, out=4)
    start = np.arange(6)
    got, _ = _kept.swap_search(pr, start, 500, damp=1e-6, candidates=2)
    vals = brute(pr, 6)
    S = tuple(int(u) for u in got)
    for i in S:
        for j in set(range(14)) - set(S):
            assert vals[tuple(sorted(set(S) - {i} | {j}))] >= vals[S] - 1e-10


def test_scores_are_the_papers_formulas():
    pr, X = make_problem(seed=2, m=2)
    mag = get_unit_method("magnitude").scores(pr)
    want = [np.sqrt((pr.W0[:, c] ** 2).sum() + pr.part_sq[g]) for g, c in enumerate(pr.columns)]
    np.testing.assert_allclose(mag, want, rtol=1e-12)
    wanda = get_unit_method("wanda-sp").scores(pr)
    norms = np.sqrt((X ** 2).mean(0))
    want = [float((np.abs(pr.W0[:, c]) * norms[c]).sum()) for c in pr.columns]
    np.testing.assert_allclose(wanda, want, rtol=1e-10)
    flap = get_unit_method("flap").scores(pr)
    var = X.var(0)           # the fluctuation of each input over the calibration samples
    want = [float((var[c] * (pr.W0[:, c] ** 2).sum(0)).sum()) for c in pr.columns]
    np.testing.assert_allclose(flap, want, rtol=1e-8)


@pytest.mark.parametrize("name", ["flap", "osscar", "magnitude"])
def test_bias_compensation_keeps_the_output_mean(name):
    """With bias compensation the consumer's mean output over the calibration inputs is the
    dense one (FLAP's rule, for every method); without it the removed units' mean is lost."""
    pr, X = make_problem(seed=4, m=1)
    sol = get_unit_method(name).solve(pr, 3)
    dense = (X @ pr.W0.T + pr.b0).mean(0)
    np.testing.assert_allclose((X @ sol.W.T + sol.b).mean(0), dense, rtol=1e-9, atol=1e-9)
    pr2, _ = make_problem(seed=4, m=1, centered=False)
    sol2 = get_unit_method(name).solve(pr2, 3)
    assert np.abs((X @ sol2.W.T + sol2.b).mean(0) - dense).max() > 1e-3


def test_free_columns_always_kept():
    pr, _ = make_problem(seed=6, n_units=5, m=1, free=2)
    for name in ALL:
        sol = get_unit_method(name).solve(pr, 2)
        assert np.all(sol.W[:, -2:] != 0), name


def test_registry_and_option_errors():
    assert set(METHODS) <= set(available())
    with pytest.raises(ValueError, match="expected one of"):
        get_unit_method("sparsegpt")
    with pytest.raises(ValueError, match="unknown option"):
        get_unit_method("flap", damp=0.1)
    with pytest.raises(ValueError, match="needs refit=True"):
        get_unit_method("flap", polish=True)
    with pytest.raises(ValueError, match="no compiled kernel"):
        get_unit_method("penalty:hard_threshold")
    with pytest.raises(TypeError):
        get_unit_method("osscar", refit="yes")
    with pytest.raises(ValueError, match="refit=False"):
        get_unit_method("logsum", refit=False, polish=False)
    pr, _ = make_problem()
    with pytest.raises(ValueError):
        get_unit_method("osscar").solve(pr, pr.n_units + 1)


def test_dense_target_refit_is_least_squares_on_the_dense_output():
    """With a dense target the refit of a kept set (and its bias) is the least-squares fit of
    the dense model's output ``X_d W0^T + b0`` from the pruned inputs' kept columns with an
    intercept; the objective is its residual over the centred target's energy."""
    rng = np.random.default_rng(8)
    n, n_units, out = 400, 6, 4
    Xp = np.maximum(rng.standard_normal((n, n_units)) @ rng.standard_normal((n_units, n_units)),
                    0) + 0.3
    Xd = Xp + 0.3 * rng.standard_normal((n, n_units))      # the dense model's inputs
    W0, b0 = rng.standard_normal((out, n_units)), rng.standard_normal(out)
    pr = UnitProblem("l", W0, Xp.T @ Xp / n, Xp.mean(0), [np.array([j]) for j in range(n_units)],
                     b0=b0, cross=Xd.T @ Xp / n, dense_gram=Xd.T @ Xd / n, mu_dense=Xd.mean(0))
    S = [0, 2, 3]
    sol = get_unit_method("ziplm", damp=0.0, refit_damp=0.0).solve(pr, 3)
    S = list(sol.kept)
    Y = Xd @ W0.T + b0
    design = np.hstack([Xp[:, S], np.ones((n, 1))])
    coef, *_ = np.linalg.lstsq(design, Y, rcond=None)
    np.testing.assert_allclose(sol.W[:, S], coef[:-1].T, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(sol.b, coef[-1], rtol=1e-7, atol=1e-9)
    resid = Y - design @ coef
    Yc = Y - Y.mean(0)
    assert sol.objective == pytest.approx((resid ** 2).sum() / (Yc ** 2).sum(), rel=1e-7)
    # and the best kept set by enumeration is no better than ziplm's by more than the greedy's
    # gap; every set's refit objective is the same least squares
    for T in itertools.combinations(range(n_units), 3):
        d = np.hstack([Xp[:, T], np.ones((n, 1))])
        r = Y - d @ np.linalg.lstsq(d, Y, rcond=None)[0]
        assert objective(pr, refit(pr, T, 0.0)) == pytest.approx(
            (r ** 2).sum() / (Yc ** 2).sum(), rel=1e-7)


def test_dropout_path_step_is_the_eta_trick_ridge():
    """One step of the group penalty's path is the ridge of the eta-trick: at the trained norms
    ``t``, ``(Gs + alpha diag(1 / eta_hat(t))) U^T = Gs U0^T`` (float64 here, by a plain solve),
    and the path's start is the units of largest norm of that solve."""
    import penalties
    from dualdrop.nn.oneshot.methods.structured.penalty import PATH_PARAMS, Scaled, dropout_path

    for m in (1, 3):
        pr, _ = make_problem(seed=5, n_units=70, m=m, free=1, n=600)
        sc = Scaled(pr)
        P = penalties.get("logsum", **PATH_PARAMS["logsum"])
        alpha = 0.3
        t = np.array([np.linalg.norm(sc.U0[:, c]) for c in sc.groups[:sc.n]])
        ridge = np.zeros(sc.Gs.shape[0])
        for g in range(sc.n):
            ridge[sc.groups[g]] = alpha / P.eta_hat(t[g])
        UT = np.linalg.solve(sc.Gs + np.diag(ridge), sc.Gs @ sc.U0.T)
        norms = np.array([np.linalg.norm(UT[c]) for c in sc.groups[:sc.n]])
        start, steps, a = dropout_path(sc, P, 20, alpha0=alpha, grow=2.0, over=1.5, thr=0.0,
                                       max_steps=1)
        assert steps == 1 and a == alpha
        assert set(start.tolist()) == set(np.argsort(-norms)[:30].tolist())
