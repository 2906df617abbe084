"""Multi-output regression with row penalties against scikit-learn's MultiTaskLasso and closed
forms (orthonormal designs), on raw and standardized data."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_diabetes
from sklearn.linear_model import MultiTaskLasso
from sklearn.preprocessing import StandardScaler

import penalties
from dualdrop.linear import (SparseLinearRegression, SparseMultiTaskRegression, get_solver,
                             multitask_alpha_max)
from dualdrop.linear.multitask import MultiTaskProblem


def _raw_data():
    """Raw diabetes columns (age in years, blood serum values in the hundreds) and three outputs
    on different scales."""
    X, y = load_diabetes(return_X_y=True, scaled=False)
    rng = np.random.default_rng(0)
    Y = np.column_stack([y, X[:, :4] @ rng.standard_normal(4) + rng.standard_normal(len(y)),
                         1e-2 * y + rng.standard_normal(len(y))])
    return X, Y


def _std_data(n=80, p=30, T=4, seed=1):
    rng = np.random.default_rng(seed)
    X = StandardScaler().fit_transform(rng.standard_normal((n, p)))
    W = np.zeros((p, T))
    W[:5] = rng.standard_normal((5, T))
    return X, X @ W + 0.3 * rng.standard_normal((n, T))


def _obj(X, Y, alpha, coef, b):
    R = Y - X @ coef.T - b
    return 0.5 * float((R ** 2).sum()) / len(Y) + alpha * float(np.linalg.norm(coef, axis=0).sum())


@pytest.mark.parametrize("data", ["raw", "std"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_l21_matches_sklearn_multitask_lasso(data, fit_intercept):
    X, Y = _raw_data() if data == "raw" else _std_data()
    alpha = multitask_alpha_max(X, Y, scaling="none", fit_intercept=fit_intercept) / 10
    ref = MultiTaskLasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-12,
                         max_iter=200000).fit(X, Y)
    est = SparseMultiTaskRegression(alpha=alpha, scaling="none", fit_intercept=fit_intercept,
                                    tol=1e-10, max_iter=1000).fit(X, Y)
    assert est.coef_.shape == ref.coef_.shape and est.intercept_.shape == (Y.shape[1],)
    f_ref, f = _obj(X, Y, alpha, ref.coef_, ref.intercept_), _obj(X, Y, alpha, est.coef_,
                                                                 est.intercept_)
    assert f <= f_ref * (1 + 1e-10)
    scale = np.abs(ref.coef_).max()
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-6 * scale)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, atol=1e-6 * np.abs(Y).max())
    assert np.array_equal(np.any(est.coef_ != 0, axis=0), np.any(ref.coef_ != 0, axis=0))
    # the default tolerance: within 1e-6 relative of the optimum
    dflt = SparseMultiTaskRegression(alpha=alpha, scaling="none",
                                     fit_intercept=fit_intercept).fit(X, Y)
    assert _obj(X, Y, alpha, dflt.coef_, dflt.intercept_) <= f_ref * (1 + 1e-6)


@pytest.mark.parametrize("data", ["raw", "std"])
def test_l1_ratio_matches_sklearn_multitask_elastic_net(data):
    from sklearn.linear_model import MultiTaskElasticNet

    X, Y = _raw_data() if data == "raw" else _std_data()
    rho = 0.6
    amax = multitask_alpha_max(X, Y, scaling="none", l1_ratio=rho)
    ref0 = MultiTaskElasticNet(alpha=amax * 1.001, l1_ratio=rho, tol=1e-12).fit(X, Y)
    assert not np.any(ref0.coef_)  # alpha_max is scikit-learn's threshold too
    ref0 = MultiTaskElasticNet(alpha=amax * 0.98, l1_ratio=rho, tol=1e-12).fit(X, Y)
    assert np.any(ref0.coef_)
    alpha = amax / 10
    ref = MultiTaskElasticNet(alpha=alpha, l1_ratio=rho, tol=1e-12, max_iter=200000).fit(X, Y)
    est = SparseMultiTaskRegression(alpha=alpha, l1_ratio=rho, scaling="none", tol=1e-10,
                                    max_iter=1000).fit(X, Y)

    def obj(c, b):
        R = Y - X @ c.T - b
        return (0.5 * float((R ** 2).sum()) / len(Y)
                + alpha * rho * float(np.linalg.norm(c, axis=0).sum())
                + 0.5 * alpha * (1 - rho) * float((c ** 2).sum()))

    assert obj(est.coef_, est.intercept_) <= obj(ref.coef_, ref.intercept_) * (1 + 1e-10)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-6 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(est.intercept_, ref.intercept_, atol=1e-6 * np.abs(Y).max())


def test_sparse_design_matches_dense():
    X, Y = _std_data(n=60, p=40, T=3, seed=3)
    X[np.abs(X) < 0.8] = 0.0  # a sparse design
    alpha = multitask_alpha_max(X, Y, scaling="none") / 8
    dense = SparseMultiTaskRegression(alpha=alpha, scaling="none", tol=1e-10).fit(X, Y)
    csc = SparseMultiTaskRegression(alpha=alpha, scaling="none", tol=1e-10).fit(
        sp.csc_matrix(X), Y)
    np.testing.assert_allclose(csc.coef_, dense.coef_, atol=1e-9)
    np.testing.assert_allclose(csc.intercept_, dense.intercept_, atol=1e-9)
    ref = MultiTaskLasso(alpha=alpha, tol=1e-12, max_iter=200000).fit(X, Y)
    np.testing.assert_allclose(csc.coef_, ref.coef_, atol=1e-7)
    # (skglm's MultiTaskLasso is compared in benchmarks/bench_linear_real.py: compiling it takes
    # ~30 s per process)


def test_one_output_is_the_lasso():
    X, Y = _raw_data()
    y = Y[:, :1]
    alpha = 5.0
    mt = SparseMultiTaskRegression(alpha=alpha, scaling="dropout", tol=1e-10).fit(X, y)
    st = SparseLinearRegression(alpha=alpha, scaling="dropout", tol=1e-10).fit(X, y.ravel())
    np.testing.assert_allclose(mt.coef_[0], st.coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(mt.intercept_[0], st.intercept_, rtol=1e-7)


@pytest.mark.parametrize("name,params", [("mcp", {"a": 3.0, "lam": 0.5}),
                                         ("logsum", {"eps": 0.5}), ("l1", {})])
def test_group_penalty_is_the_block_prox_on_an_orthonormal_design(name, params):
    """With X^T X / n = I (no intercept) the objective separates over rows:
    W_j = argmin 1/2 ||W_j - c_j||^2 + alpha Omega(||W_j||), c_j = x_j^T Y / n, i.e. the scalar
    prox of the norm of c_j along c_j."""
    rng = np.random.default_rng(4)
    n, p, T = 64, 8, 3
    Q, _ = np.linalg.qr(rng.standard_normal((n, p)))
    X = Q * np.sqrt(n)
    Y = X[:, :3] @ rng.standard_normal((3, T)) * 0.6 + 0.4 * rng.standard_normal((n, T))
    alpha = 0.3
    P = penalties.get(name, **params)
    est = SparseMultiTaskRegression(penalty=name, penalty_params=params, alpha=alpha,
                                    scaling="none", fit_intercept=False, tol=1e-12).fit(X, Y)
    C = X.T @ Y / n
    norms = np.linalg.norm(C, axis=1)
    r = np.asarray(P.prox(norms, alpha * np.ones(p)), dtype=float)
    expected = C * (r / norms)[:, None]
    np.testing.assert_allclose(est.coef_.T, expected, atol=1e-10)
    assert 0 < np.count_nonzero(r) < p


def test_alpha_max_gives_the_empty_model():
    X, Y = _raw_data()
    for kw in ({"penalty": "l1"}, {"penalty": "mcp", "penalty_params": {"a": 3.0, "lam": "alpha"}}):
        amax = multitask_alpha_max(X, Y, scaling="dropout", **kw)
        above = SparseMultiTaskRegression(alpha=1.001 * amax, **kw).fit(X, Y)
        below = SparseMultiTaskRegression(alpha=0.98 * amax, **kw).fit(X, Y)
        assert not np.any(above.coef_) and np.any(below.coef_), kw
    # l1: the closed form max_j ||x_j^T (Y - Ybar)|| / n with scaling "none"
    g = np.linalg.norm(X.T @ (Y - Y.mean(axis=0)), axis=1) / len(Y)
    assert np.isclose(multitask_alpha_max(X, Y, scaling="none"), g.max(), rtol=1e-12)


def test_warm_start_and_errors():
    X, Y = _std_data()
    alpha = multitask_alpha_max(X, Y) / 10
    est = SparseMultiTaskRegression(alpha=alpha, warm_start=True, tol=1e-8).fit(X, Y)
    cold = SparseMultiTaskRegression(alpha=0.9 * alpha, tol=1e-8).fit(X, Y)
    est.set_params(alpha=0.9 * alpha).fit(X, Y)
    np.testing.assert_allclose(est.coef_, cold.coef_, atol=1e-6)
    assert est.n_iter_ <= cold.n_iter_
    np.testing.assert_allclose(est.predict(X), X @ est.coef_.T + est.intercept_)
    with pytest.raises(ValueError, match="2-D"):
        SparseMultiTaskRegression().fit(X, Y[:, 0])
    with pytest.raises(ValueError, match="solver"):
        SparseMultiTaskRegression(solver="cd").fit(X, Y)
    with pytest.raises(ValueError, match="bcd"):
        get_solver("cd").solve(MultiTaskProblem(X, Y, penalties.get("l1"), alpha))
    with pytest.raises(ValueError, match="no option"):
        SparseMultiTaskRegression(solver_params={"foo": 1}).fit(X, Y)


def test_check_estimator():
    from sklearn.utils.estimator_checks import check_estimator

    check_estimator(SparseMultiTaskRegression(alpha=0.1))
