"""l1_ratio (an added ridge term) against scikit-learn's ElasticNet / LogisticRegression and
cvxpy, on raw unstandardized data and standardized synthetic data; the prox of a penalty plus
ridge against brute-force minimization."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine
from sklearn.linear_model import ElasticNet, LogisticRegression, enet_path

import penalties
from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression, alpha_max
from dualdrop.linear._penalty import WithRidge

TOL = 1e-10


@pytest.mark.parametrize("name,params", [("l1", {}), ("mcp", {"a": 2.0, "lam": 0.5}),
                                         ("scad", {"a": 3.7, "lam": 0.3}),
                                         ("logsum", {"eps": 0.3}), ("lp", {"p": 0.5}),
                                         ("hardconcrete", {})])
def test_ridge_prox_is_the_minimizer(name, params):
    P = penalties.get(name, **params)
    M = WithRidge(P, 0.4)
    v = np.linspace(-4, 4, 41)
    t = 0.8
    grid = np.linspace(-5, 5, 40001)
    val = lambda x, vi: 0.5 * (x - vi) ** 2 + t * (0.4 * P.omega(x) + 0.3 * x ** 2)  # noqa: E731
    brute = np.array([grid[np.argmin(val(grid, vi))] for vi in v])
    ours = M.prox(v, t)
    # ours is at least as good as the best grid point, and next to it
    assert np.all(val(ours, v) <= val(brute, v) + 1e-12)
    np.testing.assert_allclose(ours, brute, atol=3e-4)
    np.testing.assert_allclose(M.omega(v), 0.4 * P.omega(v) + 0.3 * v ** 2, rtol=1e-14)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("l1_ratio", [0.3, 0.9])
def test_matches_sklearn_elastic_net_on_raw_diabetes(sparse, fit_intercept, l1_ratio):
    X, y = load_diabetes(return_X_y=True, scaled=False)
    XX = sp.csc_matrix(X) if sparse else X
    alpha = 3.0  # some coefficients are 0 at l1_ratio=0.9
    ref = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, tol=1e-14, max_iter=500000,
                     fit_intercept=fit_intercept).fit(XX, y)
    ours = SparseLinearRegression(alpha=alpha, l1_ratio=l1_ratio, scaling="none", tol=TOL,
                                  fit_intercept=fit_intercept).fit(XX, y)
    assert 0 < np.count_nonzero(ref.coef_) < X.shape[1] or l1_ratio < 0.5, ref.coef_
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6, atol=1e-6)
    assert abs(ours.intercept_ - ref.intercept_) <= 1e-6 * max(1.0, abs(ref.intercept_))
    np.testing.assert_array_equal(ours.coef_ == 0, ref.coef_ == 0)


def test_matches_sklearn_elastic_net_path_on_standardized_synthetic():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 40))
    X = (X - X.mean(0)) / X.std(0)
    y = X[:, :5] @ rng.standard_normal(5) + 0.2 * rng.standard_normal(60)
    alphas, coefs, _ = enet_path(X, y - y.mean(), l1_ratio=0.6, eps=1e-2, alphas=8,
                                 tol=1e-14, max_iter=100000)
    # the grid's first alpha is alpha_max / l1_ratio, ours too
    assert alpha_max(X, y, l1_ratio=0.6, scaling="none") == pytest.approx(alphas[0], rel=1e-12)
    for a, c in zip(alphas, coefs.T):
        ours = SparseLinearRegression(alpha=a, l1_ratio=0.6, tol=TOL).fit(X, y)
        np.testing.assert_allclose(ours.coef_, c, atol=1e-7)


def test_logistic_elastic_net_matches_saga_standardized():
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    C, l1_ratio = 0.05, 0.5
    ref = LogisticRegression(C=C, l1_ratio=l1_ratio, solver="saga", tol=1e-12,
                             max_iter=20000).fit(X, y)
    # scikit-learn: C sum_i loss_i + l1_ratio |w|_1 + (1 - l1_ratio)/2 |w|^2 -> alpha = 1/(C n)
    ours = SparseLogisticRegression(alpha=1.0 / (C * X.shape[0]), l1_ratio=l1_ratio,
                                    tol=TOL).fit(X, y)
    assert 1 < np.count_nonzero(ref.coef_) < X.shape[1]
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=2e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=2e-6)
    np.testing.assert_array_equal(ours.coef_ == 0, ref.coef_ == 0)


@pytest.mark.parametrize("data", ["breast_cancer", "wine"])
def test_logistic_elastic_net_matches_cvxpy_on_raw_data(data):
    import cvxpy as cp

    if data == "wine":  # raw: proline ~ 750, hue ~ 1; class 0 against the rest
        X, y = load_wine(return_X_y=True)
        y = (y == 0).astype(int)
        X = X[:, [0, 4, 9, 12]]
    else:
        X, y = load_breast_cancer(return_X_y=True)
        X = X[:, :6]
    alpha, l1_ratio = 0.02, 0.5
    ours = SparseLogisticRegression(alpha=alpha, l1_ratio=l1_ratio, scaling="none",
                                    tol=TOL, max_iter=500).fit(X, y)
    yy = np.where(y == 1, 1.0, -1.0)
    w, b = cp.Variable(X.shape[1]), cp.Variable()
    obj = (cp.sum(cp.logistic(-cp.multiply(yy, X @ w + b))) / X.shape[0]
           + alpha * (l1_ratio * cp.norm1(w) + 0.5 * (1 - l1_ratio) * cp.sum_squares(w)))
    prob = cp.Problem(cp.Minimize(obj))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    c, b0 = ours.coef_[0], ours.intercept_[0]
    F = (np.mean(np.logaddexp(0, -yy * (X @ c + b0)))
         + alpha * (l1_ratio * np.abs(c).sum() + 0.5 * (1 - l1_ratio) * c @ c))
    assert F <= prob.value + 1e-9
    np.testing.assert_allclose(c, w.value, atol=1e-4)


def test_mcp_with_ridge_is_stationary_and_between_its_ends():
    X, y = load_diabetes(return_X_y=True)
    kw = dict(penalty="mcp", penalty_params={"a": 3.0, "lam": "alpha"}, alpha=0.5, tol=TOL)
    mix = SparseLinearRegression(l1_ratio=0.5, **kw).fit(X, y)
    assert mix.criterion_ <= TOL
    # the ridge shrinks: smaller norm than MCP alone at the same alpha * l1_ratio
    alone = SparseLinearRegression(**{**kw, "alpha": 0.25}).fit(X, y)
    assert np.linalg.norm(mix.coef_) < np.linalg.norm(alone.coef_)
    # l1_ratio=1 is the penalty itself, bit for bit
    a = SparseLinearRegression(l1_ratio=1.0, **kw).fit(X, y)
    b = SparseLinearRegression(**kw).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_l1_ratio_errors_name_the_argument():
    X, y = load_diabetes(return_X_y=True)
    with pytest.raises(ValueError, match="l1_ratio"):
        SparseLinearRegression(l1_ratio=1.5).fit(X, y)
    with pytest.raises(ValueError, match="ridge term.*compiled kernel"):
        SparseLinearRegression(penalty="hard_threshold", penalty_params={"k": 3},
                               l1_ratio=0.5, solver="adaprox").fit(X, y)
    with pytest.raises(ValueError, match="solver='cvxpy' cannot handle.*Solvers that can"):
        SparseLinearRegression(l1_ratio=0.5, solver="cvxpy").fit(X, y)
