"""The Gram-form multi-output group block CD (``solvers.gram_bcd``) against the design-form group
solver of ``SparseLinearRegression(groups=...)``: one output directly, several outputs through
the vectorized problem (``vec(W)``, a block-diagonal design)."""

import numpy as np
import pytest

import penalties
from dualdrop.linear import SparseLinearRegression
from dualdrop.linear.solvers.gram_bcd import gram_group_alpha_max, gram_group_cd


def data(seed=0, n=300, p=12):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) @ rng.standard_normal((p, p)) * rng.uniform(0.3, 4.0, p)
    w = np.zeros(p)
    w[:3] = [1.0, -2.0, 0.5]
    w[6:9] = [0.3, 0.2, -1.0]
    y = X @ w + 0.5 * rng.standard_normal(n)
    return X, y


@pytest.mark.parametrize("penalty,params,alpha", [("l1", None, 0.1), ("logsum", {"eps": 1.0}, 0.1),
                                                  ("mcp", {"a": 3.0, "lam": 1.0}, 0.05)])
@pytest.mark.parametrize("groups", [[3, 3, 3, 3], [[0, 5, 7], [1, 2], [3, 4, 6, 8, 9],
                                                  [10, 11]]])
def test_one_output_equals_the_estimator(penalty, params, alpha, groups):
    X, y = data()
    n = X.shape[0]
    est = SparseLinearRegression(penalty=penalty, penalty_params=params, alpha=alpha,
                                 groups=groups, fit_intercept=False, scaling="none",
                                 tol=1e-10).fit(X, y)
    G = X.T @ X / n
    w0 = np.linalg.solve(G, X.T @ y / n)
    P = penalties.get(penalty, **(params or {}))
    # a nonconvex fit is a stationary point: start both at the estimator's to compare points
    start = None if penalty == "l1" else est.coef_[None]
    res = gram_group_cd(G, w0[None], alpha, P, groups, tol=1e-12, max_epochs=20000,
                        start=start)
    assert res.converged
    np.testing.assert_allclose(res.coef[0], est.coef_, atol=1e-8)


def test_several_outputs_equal_the_vectorized_problem():
    """``1/2 tr((W - W0) G (W - W0)^T)`` is least squares on ``vec(W)`` with the design
    ``kron(I_R, L^T)`` (``G = L L^T``); the groups span every output."""
    X, _ = data(seed=1)
    n, p = X.shape
    R = 3
    rng = np.random.default_rng(2)
    W0 = rng.standard_normal((R, p))
    G = X.T @ X / n
    L = np.linalg.cholesky(G)
    Xv = np.kron(np.eye(R), L.T)
    yv = Xv @ W0.reshape(-1)
    nv = Xv.shape[0]
    groups_v = [np.concatenate([r * p + np.arange(3 * g, 3 * g + 3) for r in range(R)])
                for g in range(p // 3)]
    alpha = 0.5 * gram_group_alpha_max(G, W0, "l1", 3)
    est = SparseLinearRegression(penalty="l1", alpha=alpha, groups=groups_v,
                                 fit_intercept=False, scaling="none",
                                 tol=1e-12).fit(Xv * np.sqrt(nv), yv * np.sqrt(nv))
    res = gram_group_cd(G, W0, alpha, "l1", 3, tol=1e-13, max_epochs=50000)
    np.testing.assert_allclose(res.coef.reshape(-1), est.coef_, atol=1e-8)
    zero = [bool(np.all(res.coef[:, 3 * g:3 * g + 3] == 0)) for g in range(p // 3)]
    assert any(zero) and not all(zero)   # whole groups at exactly zero, across outputs


def test_alpha_max_is_the_first_nonzero_group_and_weights_unpenalize():
    X, _ = data(seed=3)
    G = X.T @ X / X.shape[0]
    W0 = np.random.default_rng(4).standard_normal((2, 12))
    for pen in ("l1", "logsum"):
        am = gram_group_alpha_max(G, W0, pen, 4)
        assert not gram_group_cd(G, W0, am * 1.001, pen, 4).coef.any()
        assert gram_group_cd(G, W0, am * 0.98, pen, 4).coef.any()
    w = np.array([1.0, 0.0, 1.0])
    res = gram_group_cd(G, W0, 1e6, "l1", 4, weights=w, tol=1e-10, max_epochs=5000)
    assert not res.coef[:, :4].any() and not res.coef[:, 8:].any()
    assert np.all(res.coef[:, 4:8] != 0)


def test_bad_inputs():
    G = np.eye(4)
    with pytest.raises(ValueError, match="groups"):
        gram_group_cd(G, np.ones((2, 4)), 0.1, "l1", 3)
    with pytest.raises(ValueError, match="G must be"):
        gram_group_cd(np.eye(3), np.ones((2, 4)), 0.1, "l1", 2)
    with pytest.raises(ValueError, match="alpha"):
        gram_group_cd(G, np.ones((2, 4)), -1.0, "l1", 2)
    with pytest.raises(ValueError, match="weights"):
        gram_group_cd(G, np.ones((2, 4)), 0.1, "l1", 2, weights=[1.0])
