"""The splitting solver's pieces (``methods/_split.py``): the prox read off the penalty's
stationarity map against the prox solved point by point (``penalties.kernels.map_kernel``),
the penalty's run started from ADMM's support (the start left as given, only the rows it
changed refit, each kept only where lower), budgets met exactly for every duality method."""

import numpy as np
import pytest

from dualdrop.linear._jit import zero_threshold
from dualdrop.nn.oneshot.methods import _split, admm
from dualdrop.nn.oneshot.methods._layer import ScaledLayer
from dualdrop.nn.oneshot.methods.base import Budget, layer_objective
from dualdrop.nn.oneshot.methods.penalty import resolve
from dualdrop.nn.oneshot.registry import get_method
from penalties.kernels import map_kernel
from tests.nn.test_oneshot_admm_width import _layer as _width_layer

SMOOTH = ("logsum", "vardrop", "log2sum", "lp")  # Omega' continuous above 0
KINKED = ("mcp", "scad", "hardconcrete")  # Omega' with kinks or a jump: the prox may jump


def _spec(name):
    code, params = resolve(name).kernel_spec()
    return code, np.ascontiguousarray(params, dtype=np.float64)


def _steps(name):
    """Steps as the splitting takes them: from ``LEVEL`` times the step whose zero threshold is
    the largest left-out ``|z|`` (0.3, 1, 3) down by 30."""
    P = resolve(name)
    return [f * _split.LEVEL * _split.alpha_max(P, T) for T in (0.3, 1.0, 3.0)
            for f in (3.0, 1.0, 1 / 3, 1 / 30)]


@pytest.mark.parametrize("name", SMOOTH + KINKED)
def test_prox_table_is_the_solved_prox(name):
    """At the grid's points the table's values are the solved prox: to 1e-6 of the range for
    a smooth penalty. The D-step it gives (``_table_prox``, linear interpolation between grid
    points) against the solved prox of random ``z``: as close as the table of solved grid
    points gives, to 1e-6 of the range (smooth penalties) or half a grid cell (a kink of
    ``Omega'`` falls between the stationarity map's samples); grids starting below and above
    the zero threshold."""
    code, params = _spec(name)
    rng = np.random.default_rng(0)
    for t in _steps(name):
        T = zero_threshold(code, params, t)
        for lo in (max(1.0001 * T, 1e-3), 0.5 * T + 1e-4):
            hi = max(5.0, 3 * lo)
            grid = np.linspace(lo, hi, _split.TABLE)
            got = _split.prox_table(code, params, grid, t)
            solved = map_kernel("prox", code, params, grid, np.full(grid.shape, t))
            assert got[0] == pytest.approx(solved[0], abs=1e-12)
            assert got[-1] == pytest.approx(solved[-1], abs=1e-12)
            if name in SMOOTH:
                assert np.abs(got - solved).max() <= 1e-6 * hi, (name, t, lo)
            Z = rng.uniform(lo, hi, (20, 100)) * rng.choice([-1.0, 1.0], (20, 100))
            mask = np.ones(Z.shape, dtype=bool)
            exact = map_kernel("prox", code, params, Z, np.full(Z.shape, t))
            errs = []
            for vals in (got, solved):
                out = np.empty_like(Z)
                _split._table_prox(Z, mask, lo, (_split.TABLE - 1) / (hi - lo), vals, out)
                errs.append(np.abs(out - exact).max())
            extra = 1e-6 if name in SMOOTH else 0.5 / _split.TABLE
            assert errs[0] <= errs[1] + extra * hi, (name, t, lo, errs)


def test_prox_table_handles_a_map_with_two_increasing_runs():
    """hardconcrete at a large step: its stationarity map ``x + t Omega'(x)`` falls somewhere
    (two increasing runs, so the prox jumps), and the table still equals the solved prox away
    from the jump."""
    code, params = _spec("hardconcrete")
    t = _steps("hardconcrete")[4]  # T = 1, the first step
    x = np.linspace(1e-3, 5.0, 4000)
    z = x + t * map_kernel("derivative", code, params, x)
    assert np.any(np.diff(z) < 0)  # the case this test is about
    grid = np.linspace(max(1.0001 * zero_threshold(code, params, t), 1e-3), 5.0, _split.TABLE)
    got = _split.prox_table(code, params, grid, t)
    solved = map_kernel("prox", code, params, grid, np.full(grid.shape, t))
    jump = np.abs(np.diff(solved)).argmax()  # the one grid cell the prox jumps in
    off = np.ones(grid.shape, dtype=bool)
    off[max(jump - 2, 0):jump + 3] = False
    assert np.abs(got - solved)[off].max() <= 1e-5


def _layer(seed=0):
    """The width tests' layer (correlated inputs of unequal scales, an outlier and a dead input),
    smaller."""
    return _width_layer(R=30, p=40, seed=seed)


def test_row_refits_equal_the_whole_layers_rows():
    """``rows=``: the refit of a few rows, given their supports only, is those rows of the
    whole layer's refit (exact and CG)."""
    W0, G = _layer()
    sl = ScaledLayer(W0, G)
    mask = np.random.default_rng(0).random(sl.U0.shape) < 0.4
    rows = np.array([2, 5, 11, 29])
    U, e = sl.refit_rows(mask)
    Ur, er = sl.refit_rows(mask[rows], rows=rows)
    assert np.allclose(er, e[rows], rtol=1e-12) and np.allclose(Ur, U[rows], rtol=1e-12)
    Uc, ec = sl.refit_cg(mask, U, 10)
    Ucr, ecr = sl.refit_cg(mask[rows], U[rows], 10, rows=rows)
    assert np.allclose(ecr, ec[rows], rtol=1e-6)
    assert np.allclose(Ucr, Uc[rows], rtol=1e-5, atol=1e-5 * np.abs(Uc).max())


@pytest.mark.parametrize("budget", [Budget(n_keep=500), Budget(pattern=(2, 4))],
                         ids=["count", "2:4"])
def test_warm_started_run_leaves_its_start_and_meets_the_budget(budget):
    W0, G = _layer()
    sl = ScaledLayer(W0, G)
    mask, D, _ = admm.admm_support(sl, budget, freeze=True, patience=5)
    start = mask.copy()
    m2, D2, info = admm.admm_support(sl, budget, start=(mask, D), freeze=True, patience=5,
                                     rho0=0.1, growth=1.05)
    assert np.array_equal(mask, start)  # the start is not written into
    assert m2.sum() == sl.live_target(budget) and np.all(D2[~m2] == 0)
    assert info["iterations"] >= 5 and not np.array_equal(D2, D)


@pytest.mark.parametrize("seed", [1, 3])
@pytest.mark.parametrize("budget", [Budget(n_keep=500), Budget(pattern=(2, 4))],
                         ids=["count", "2:4"])
def test_every_duality_method_meets_the_budget_never_above_admm(seed, budget):
    """The splitting with the width settings for logsum, mcp, vardrop, hardconcrete and
    penalty:scad: the budget met exactly; the objective never above ADMM's, and strictly
    below it exactly when the penalty's run improved some rows (``info["improved"]``)."""
    W0, G = _layer(seed=seed)
    ref = layer_objective(get_method("admm", **admm.AT_WIDTH).prune(W0, G, budget), W0, G)
    improved = 0
    for name in ("logsum", "mcp", "vardrop", "hardconcrete", "penalty:scad"):
        m = get_method(name, solver="split", **admm.AT_WIDTH)
        W = m.prune(W0, G, budget)
        assert budget.met_by(W)
        obj = layer_objective(W, W0, G)
        assert obj <= ref * (1 + 1e-9), (name, obj, ref)
        if m.info["improved"]:
            assert obj < ref * (1 - 1e-9), name
            improved += 1
        else:
            assert obj == pytest.approx(ref, rel=1e-9)
        assert m.info["changed"] >= m.info["improved"]
    assert improved >= 1  # the penalty's run finds better supports on these layers
