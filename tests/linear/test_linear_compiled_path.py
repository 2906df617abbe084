"""The compiled least-squares path (``cd.quadratic_path``, used by ``regularization_path`` and
the CV folds) gives the fits of ``cd`` alpha by alpha, and the outer loop gives the same point
whether run in one call or one iteration at a time (``callback``)."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import lasso_path

import penalties
from dualdrop.linear import Problem, Quadratic, get_solver, regularization_path
from dualdrop.linear.solvers import cd


def _data(sparse, seed=0, n=60, p=40):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) + 2.0  # raw columns with large means
    if sparse:
        X = sp.csc_matrix(X * (rng.random((n, p)) < 0.3))
    w = np.zeros(p)
    w[:5] = [2.0, -1.0, 1.5, 0.5, -2.0]
    return X, np.asarray(X @ w).ravel() + 1.0 + 0.1 * rng.standard_normal(n)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("penalty, positive, weights", [
    (penalties.get("l1"), False, None),
    (penalties.get("l1"), True, None),
    (penalties.get("mcp", a=3.0, lam=0.05), False, None),
    (penalties.get("logsum", eps=1.0), False, "random"),
])
def test_path_equals_warm_started_fits(sparse, penalty, positive, weights):
    X, y = _data(sparse)
    pw = None if weights is None else np.random.default_rng(1).uniform(0.5, 2.0, X.shape[1])
    alphas = np.geomspace(1.0, 1e-3, 12)
    pr = Problem(X, y, Quadratic(), penalty, alphas[0], True, weights=pw, positive=positive)
    W, B, n_iter, crit, conv = cd.quadratic_path(pr, alphas, tol=1e-9, max_iter=500)
    assert conv.all() and np.all(crit <= 1e-9)
    w, b = None, None
    for k, a in enumerate(alphas):
        pk = Problem(X, y, Quadratic(), penalty, a, True, weights=pw, positive=positive)
        res = get_solver("cd").solve(pk, w, b, tol=1e-9, max_iter=500)
        w, b = res.coef, res.intercept
        np.testing.assert_allclose(W[k], w, atol=1e-7)
        assert abs(B[k] - b) < 1e-7
        # the path carries its residual over from the previous alpha, the single fit
        # recomputes it: rounding may move the last criterion check by one outer iteration
        assert abs(n_iter[k] - res.n_iter) <= 1
    if positive:
        assert W.min() >= 0.0


def test_regularization_path_matches_sklearn_lasso_path_on_sparse_raw_columns():
    X, y = _data(True, seed=3)
    Xd = X.toarray()
    Xc, yc = Xd - Xd.mean(axis=0), y - y.mean()  # lasso_path has no intercept: centre
    alphas = np.geomspace(0.5, 5e-4, 15)
    ours = regularization_path(X, y, alphas=alphas, scaling="none", tol=1e-10, max_iter=1000)
    _, ref, _ = lasso_path(Xc, yc, alphas=alphas, tol=1e-14, max_iter=100000)
    np.testing.assert_allclose(ours["coefs"], ref.T, atol=1e-6)


def test_outer_loop_one_call_equals_one_iteration_per_call():
    X, y = _data(True, seed=2)
    seen = []
    pr = Problem(X, y, Quadratic(), penalties.get("scad", a=3.7, lam=0.05), 0.01, True)
    once = get_solver("cd").solve(pr, tol=1e-10, max_iter=200)
    stepped = get_solver("cd").solve(pr, tol=1e-10, max_iter=200,
                                     callback=lambda w, b: seen.append(np.count_nonzero(w)))
    np.testing.assert_allclose(stepped.coef, once.coef, atol=1e-12)
    assert stepped.n_iter == once.n_iter and len(seen) == once.n_iter - 1
    np.testing.assert_allclose(stepped.objective, once.objective, rtol=1e-12)
    assert np.all(np.diff(once.objective) <= 1e-12 * once.objective[0])  # monotone
