"""ADMM's settings at width (``admm.AT_WIDTH``: rows leave the iteration once their support has
settled, supports refit by conjugate gradients) and its projections: the budget met exactly,
the CG refit's error the exact error of the weights it returns and close to the least squares,
the projections equal to ``base.select_mask`` (ties and dead inputs included)."""

import numpy as np
import pytest
import torch

from dualdrop.nn.oneshot.methods import admm
from dualdrop.nn.oneshot.methods._layer import ScaledLayer
from dualdrop.nn.oneshot.methods.base import Budget, layer_objective, select_mask
from dualdrop.nn.oneshot.registry import get_method


def _layer(R=40, p=48, n=300, seed=0):
    """Correlated inputs of unequal scales, one outlier input and one dead input."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) @ (np.eye(p) + 0.5 * rng.standard_normal((p, p)) / np.sqrt(p))
    X *= rng.uniform(0.3, 2.0, p)
    X[:, 3] *= 15.0
    X[:, 9] = 0.0
    W0 = rng.standard_t(3, (R, p))
    return torch.from_numpy(W0), torch.from_numpy(X.T @ X / n)


@pytest.mark.parametrize("budget", [Budget(n_keep=700), Budget(pattern=(2, 4)),
                                    Budget(pattern=(1, 8))])
def test_projections_are_select_mask(budget):
    """Rows of scores with ties (repeated values) and a dead input: the same support as
    ``select_mask`` on the live columns (ties to the lower index)."""
    W0, G = _layer()
    sl = ScaledLayer(W0, G)
    rng = np.random.default_rng(1)
    A = rng.integers(0, 6, (sl.R, sl.q)).astype(np.float32)  # many ties
    got = admm._project(A, sl, sl.live_target(budget), budget)
    full = torch.full((sl.R, sl.p), -torch.inf, dtype=torch.float64)
    full[:, torch.from_numpy(sl.live)] = torch.from_numpy(A.astype(np.float64))
    if budget.n_keep is not None:  # a flat count: the k largest, ties to the lower flat index
        want = select_mask(full, Budget(n_keep=sl.live_target(budget)))
    else:
        want = select_mask(full, budget)
    assert np.array_equal(got, want[:, torch.from_numpy(sl.live)].numpy())


def test_cg_refit_is_the_error_of_its_weights_and_near_least_squares():
    W0, G = _layer()
    sl = ScaledLayer(W0, G)
    budget = Budget(n_keep=900)
    mask, D, _ = admm.admm_support(sl, budget, precision="float32")
    U_exact, e_exact = sl.refit_rows(mask)
    U, e = sl.refit_cg(mask, D, 10)
    assert np.all(U[~mask] == 0)
    E = U - sl.U0  # the error recomputed from the returned weights, independently
    assert np.allclose(e, np.einsum("rq,qs,rs->r", E, sl.Gs, E), rtol=1e-9, atol=1e-12)
    assert np.all(e >= e_exact - 1e-9 * sl.c0)  # never below the least squares
    assert e.sum() <= e_exact.sum() * (1 + 1e-3)
    assert sl.refit_cg(mask, D, 0)[1].sum() >= e.sum()  # 0 steps: D itself, worse


@pytest.mark.parametrize("budget", [Budget(n_keep=900), Budget(pattern=(2, 4))])
def test_width_settings_meet_the_budget_at_the_exact_objective(budget):
    """The width settings forced on a small layer: the budget met exactly, rows frozen (fewer
    row iterations than rows x iterations), the objective within 1% of the narrow settings'."""
    W0, G = _layer()
    m = get_method("admm", **admm.AT_WIDTH)
    W = m.prune(W0, G, budget)
    assert budget.met_by(W)
    runs = m.info["runs"]
    assert any(r["row_iterations"] < r["iterations"] * W0.shape[0] for r in runs.values())
    ref = get_method("admm", **admm.NARROW).prune(W0, G, budget)
    assert layer_objective(W, W0, G) <= layer_objective(ref, W0, G) * 1.01
    for name in ("logsum", "mcp"):  # the splitting with the same settings: never above ADMM's
        Wp = get_method(name, solver="split", **admm.AT_WIDTH).prune(W0, G, budget)
        assert budget.met_by(Wp)
        assert layer_objective(Wp, W0, G) <= layer_objective(W, W0, G) * (1 + 1e-9)


def test_width_options_are_checked_and_picked_by_width():
    with pytest.raises(TypeError, match="freeze"):
        get_method("admm", freeze="yes")
    with pytest.raises(ValueError, match="cg_steps"):
        get_method("admm", cg_steps=-1)
    small = ScaledLayer(torch.ones(8, admm.WIDE, dtype=torch.float64),
                        torch.eye(admm.WIDE, dtype=torch.float64))
    wide = ScaledLayer(torch.ones(admm.WIDE, admm.WIDE, dtype=torch.float64),
                       torch.eye(admm.WIDE, dtype=torch.float64))
    assert admm.sized({}, small) == admm.NARROW and admm.sized({}, wide) == admm.AT_WIDTH
    assert admm.sized({"patience": 7}, wide)["patience"] == 7


def test_folded_u_step_is_the_same_iteration():
    """``fold``: the U-step as ``u0 + (D - V - u0) M`` (rows outnumbering inputs) is the same
    iteration as the eigenbasis form: in double precision, the same supports at every
    iteration."""
    W0, G = _layer(R=80, p=24)
    sl = ScaledLayer(W0, G)
    for budget in (Budget(n_keep=900), Budget(pattern=(2, 4))):
        seen = {}
        for fold in (False, True):
            masks = []
            admm.admm_support(sl, budget, precision="float64", fold=fold,
                              callback=lambda t, m: masks.append(m.copy()))
            seen[fold] = masks
        assert len(seen[True]) == len(seen[False]) > 20
        assert all(np.array_equal(a, b) for a, b in zip(seen[True], seen[False]))


def test_row_iteration_cap_stops_with_the_budget_met():
    W0, G = _layer()
    sl = ScaledLayer(W0, G)
    for budget in (Budget(n_keep=900), Budget(pattern=(2, 4))):
        cap = 3 * sl.R + 5
        mask, D, info = admm.admm_support(sl, budget, freeze=True, patience=5,
                                          max_row_iterations=cap)
        assert info["stopped"] == "budget" and info["row_iterations"] <= cap
        assert info["iterations"] == 3  # three whole iterations fit under the cap, not four
        assert mask.sum() == sl.live_target(budget)  # the count, or N in every group
        assert np.all(D[~mask] == 0)
