"""The penalty methods' splitting solver (``solver="split"``, the default on wide layers) and
ADMM's own refit: exact budgets and N:M patterns, the returned weights against an independent
least-squares solve on their support (numpy ``lstsq`` on the calibration-like data), the
objective never above ADMM's."""

import numpy as np
import pytest
import torch

from dualdrop.nn.oneshot.methods._layer import ScaledLayer
from dualdrop.nn.oneshot.methods.base import Budget, layer_objective
from dualdrop.nn.oneshot.methods.admm import WIDE
from dualdrop.nn.oneshot.registry import get_method


def _layer(R=24, p=32, n=200, seed=0):
    """Correlated inputs of unequal scales with one outlier input (as transformer activations
    have), a dead input, heavy-tailed trained weights: ``(W0, G, X)``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) @ (np.eye(p) + 0.5 * rng.standard_normal((p, p)) / np.sqrt(p))
    X *= rng.uniform(0.3, 2.0, p)
    X[:, 3] *= 15.0
    X[:, 7] = 0.0
    W0 = rng.standard_t(3, (R, p))
    return torch.from_numpy(W0), torch.from_numpy(X.T @ X / n), X


def _lstsq_refit(W, W0, X):
    """Each row's least squares on its live support, from the data: ``min ||X (w - w0)||`` over
    ``w`` supported there (numpy, independent of the package's Gram solves)."""
    W, W0 = W.numpy(), W0.numpy()
    live = np.abs(X).sum(0) > 0
    out = np.zeros_like(W)
    for r in range(W.shape[0]):
        S = np.flatnonzero((W[r] != 0) & live)
        y = X @ W0[r]
        out[r, S] = np.linalg.lstsq(X[:, S], y, rcond=None)[0]
    return out, live


@pytest.mark.parametrize("budget", [Budget(n_keep=300), Budget(pattern=(2, 4))],
                         ids=["count", "2:4"])
@pytest.mark.parametrize("name", ["logsum", "mcp", "admm"])
def test_split_and_admm_meet_the_budget_and_return_the_least_squares(name, budget):
    W0, G, X = _layer()
    opts = {"solver": "split"} if name != "admm" else {}
    W = get_method(name, **opts).prune(W0, G, budget)
    nz = (W != 0)
    if budget.n_keep is not None:
        assert int(nz.sum()) == budget.n_keep
    else:
        assert bool((nz.reshape(W.shape[0], -1, 4).sum(-1) == 2).all())
    ref, live = _lstsq_refit(W, W0, X)
    Wl = W.numpy()[:, live]
    assert np.allclose(Wl, ref[:, live], rtol=1e-6, atol=1e-8 * np.abs(ref).max())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("budget", [Budget(n_keep=200), Budget(pattern=(2, 4))],
                         ids=["count", "2:4"])
def test_split_objective_never_above_admm(seed, budget):
    """The splitting keeps ADMM's two runs among its candidates and the support of least
    error: never above ADMM (same runs, same float32 products)."""
    W0, G, _ = _layer(seed=seed)
    admm = layer_objective(get_method("admm").prune(W0, G, budget), W0, G)
    for name in ("logsum", "mcp", "vardrop"):
        m = get_method(name, solver="split")
        obj = layer_objective(m.prune(W0, G, budget), W0, G)
        assert obj <= admm * (1 + 1e-9), (name, obj, admm)
        assert m.info["solver"] == "split" and m.info["kept"] in ("penalty", "scaled", "weights")


def test_refit_rows_matches_row_errors_and_lstsq():
    W0, G, X = _layer(R=6, p=16, seed=3)
    sl = ScaledLayer(W0, G)
    rng = np.random.default_rng(0)
    mask = rng.random(sl.U0.shape) < 0.4
    U, err = sl.refit_rows(mask)
    assert not U[~mask].any()
    assert np.allclose(err, sl.row_errors([np.flatnonzero(m) for m in mask], range(sl.R)))
    W = sl.finish(mask, Budget(n_keep=int(mask.sum())), values=U, refit=False)
    ref, live = _lstsq_refit(W, W0, X)
    assert np.allclose(W.numpy()[:, live], ref[:, live], rtol=1e-6, atol=1e-9)


def test_auto_solver_by_width_and_options():
    small = ScaledLayer(torch.ones(8, WIDE, dtype=torch.float64),
                        torch.eye(WIDE, dtype=torch.float64))
    wide = ScaledLayer(torch.ones(WIDE, WIDE, dtype=torch.float64),
                       torch.eye(WIDE, dtype=torch.float64))
    m = get_method("logsum")
    assert m.solver_for(small) == "path" and m.solver_for(wide) == "split"
    assert get_method("logsum", solver="path").solver_for(wide) == "path"
    with pytest.raises(ValueError, match="solver"):
        get_method("logsum", solver="fast")
    with pytest.raises(ValueError, match="needs refit"):
        get_method("logsum", refit=False, polish=True)
    # without the refit: the splitting's last D-step on the support, a higher objective
    W0, G, _ = _layer(seed=4)
    b = Budget(n_keep=250)
    raw = get_method("logsum", solver="split", refit=False).prune(W0, G, b)
    fit = get_method("logsum", solver="split").prune(W0, G, b)
    assert int((raw != 0).sum()) <= 250
    assert layer_objective(raw, W0, G) >= layer_objective(fit, W0, G)
