"""The Gram-form coordinate descent (solvers/gram_cd.py) against the design-form solver, cvxpy
and scikit-learn at tight tolerance, on raw and standardized data; its many-row API against
per-row estimator fits of the equivalent least-squares problems."""

import numpy as np
import pytest
import scipy.linalg as sla
from sklearn.datasets import load_diabetes
from sklearn.linear_model import Lasso

import penalties
from dualdrop.linear import Problem, Quadratic, SparseLinearRegression, get_solver
from dualdrop.linear.solvers.gram_cd import gram_cd, gram_path, solve_gram


def _synthetic(n=120, p=25, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) @ (np.eye(p) + 0.3 * rng.standard_normal((p, p)))
    X = (X - X.mean(0)) / X.std(0)
    w = np.zeros(p)
    w[:5] = [2.0, -1.5, 1.0, 0.5, -0.3]
    return X, X @ w + 0.5 * rng.standard_normal(n) + 1.0


def _raw():
    X, y = load_diabetes(return_X_y=True, scaled=False)  # unstandardized: ages, blood tests
    return X, y


PENALTIES = [("l1", {}), ("logsum", {"eps": 0.5}), ("mcp", {"a": 3.0}), ("scad", {}),
             ("lp", {"p": 0.5}), ("vardrop", {})]


@pytest.mark.parametrize("name,params", PENALTIES)
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_matches_design_cd_synthetic(name, params, fit_intercept):
    X, y = _synthetic()
    pr = Problem(X, y, Quadratic(), penalties.get(name, **params), 0.05,
                 fit_intercept=fit_intercept)
    ref = get_solver("cd").solve(pr, tol=1e-10)
    res = get_solver("gram_cd").solve(pr, tol=1e-10)
    assert res.converged and res.criterion <= 1e-10
    assert abs(res.final_objective - ref.final_objective) <= 1e-10 * ref.final_objective
    assert np.max(np.abs(res.coef - ref.coef)) <= 1e-7
    assert abs(res.intercept - ref.intercept) <= 1e-7
    assert np.array_equal(res.coef != 0, ref.coef != 0)


@pytest.mark.parametrize("name,params", [("l1", {}), ("logsum", {"eps": 1.0}),
                                         ("mcp", {"a": 3.0, "lam": "alpha"})])
def test_estimator_on_raw_data(name, params):
    """Unstandardized columns (diabetes before scaling: ages, blood pressure, sera), the
    estimator's default dropout scaling and an intercept: the same fit as solver='cd' (both
    without Anderson extrapolation, which on a nonconvex penalty may reach another stationary
    point; the coordinate sequences are then the same)."""
    X, y = _raw()
    kw = dict(penalty=name, penalty_params=params, alpha=0.5, tol=1e-10)
    ref = SparseLinearRegression(solver="cd", solver_params={"anderson": 0}, **kw).fit(X, y)
    est = SparseLinearRegression(solver="gram_cd", solver_params={"anderson": 0}, **kw).fit(X, y)
    assert est.solver_ == "gram_cd"
    assert np.allclose(est.coef_, ref.coef_, rtol=1e-6, atol=1e-8 * np.abs(ref.coef_).max())
    assert abs(est.intercept_ - ref.intercept_) <= 1e-6 * abs(ref.intercept_)


def test_lasso_matches_cvxpy_and_sklearn():
    X, y = _synthetic(seed=3)
    pr = Problem(X, y, Quadratic(), penalties.get("l1"), 0.08)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10)
    res = get_solver("gram_cd").solve(pr, tol=1e-10)
    assert abs(res.final_objective - ref.final_objective) <= 1e-8 * ref.final_objective
    assert np.max(np.abs(res.coef - ref.coef)) <= 1e-6
    sk = Lasso(alpha=0.08, tol=1e-14, max_iter=100000).fit(X, y)
    assert np.max(np.abs(res.coef - sk.coef_)) <= 1e-8
    assert abs(res.intercept - sk.intercept_) <= 1e-8


def test_lp_convex_matches_cvxpy():
    X, y = _synthetic(seed=4)
    pr = Problem(X, y, Quadratic(), penalties.get("lp", p=1.5), 0.05, fit_intercept=False)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10)
    res = get_solver("gram_cd").solve(pr, tol=1e-10)
    assert abs(res.final_objective - ref.final_objective) <= 1e-7 * ref.final_objective
    assert np.max(np.abs(res.coef - ref.coef)) <= 1e-4


def test_positive():
    X, y = _synthetic(seed=5)
    pr = Problem(X, y, Quadratic(), penalties.get("l1"), 0.02, positive=True)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10)
    res = get_solver("gram_cd").solve(pr, tol=1e-10)
    assert np.all(res.coef >= 0)
    assert np.max(np.abs(res.coef - ref.coef)) <= 1e-6


def _layer(R=6, p=15, n=400, seed=0):
    """A layer problem from data: inputs with unequal scales and correlations."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) @ (np.eye(p) + 0.5 * rng.standard_normal((p, p)) / np.sqrt(p))
    X *= rng.uniform(0.1, 4.0, p)
    return rng.standard_normal((R, p)), X.T @ X / n


@pytest.mark.parametrize("name,params", [("l1", {}), ("logsum", {"eps": 0.3}),
                                         ("mcp", {"a": 2.0, "lam": 0.5})])
def test_rows_match_estimator_on_the_cholesky_design(name, params):
    """Each row of min 1/2 (w - w0)^T G (w - w0) + alpha sum Omega(w) is least squares with
    X = sqrt(p) L^T (G = L L^T, so X^T X / p = G) and y = X w0: the estimator's fit, row by row.
    """
    W0, G = _layer()
    p = G.shape[0]
    X = np.sqrt(p) * sla.cholesky(G, lower=True).T
    alphas = np.array([0.02, 0.05, 0.1, 0.2, 0.3, 0.5])
    res = gram_cd(G, W0, alphas, penalties.get(name, **params), tol=1e-11)
    assert res.converged.all()
    for r in range(W0.shape[0]):
        est = SparseLinearRegression(penalty=name, penalty_params=params, alpha=alphas[r],
                                     fit_intercept=False, scaling="none", tol=1e-11).fit(
            X, X @ W0[r])
        assert np.max(np.abs(res.coef[r] - est.coef_)) <= 1e-7 * np.abs(W0[r]).max()
        assert np.array_equal(res.coef[r] != 0, est.coef_ != 0)
        D = res.coef[r] - W0[r]
        pen = penalties.get(name, **params)
        F = 0.5 * D @ G @ D + alphas[r] * pen.omega(res.coef[r]).sum()
        assert res.objective[r] == pytest.approx(F, rel=1e-10)


def test_parallel_rows_equal_serial():
    W0, G = _layer(R=12, p=30, seed=1)
    a = gram_cd(G, W0, 0.05, "logsum", tol=1e-9)
    b = gram_cd(G, W0, 0.05, "logsum", tol=1e-9, n_threads=2)
    assert np.array_equal(a.coef, b.coef)
    assert np.array_equal(a.n_iter, b.n_iter)


def test_warm_path_convex_matches_cold():
    W0, G = _layer(R=4, p=20, seed=2)
    alphas = np.geomspace(1.0, 0.01, 8)
    path = gram_path(G, W0, alphas, "l1", tol=1e-11)
    cold = gram_cd(G, W0, alphas[-1], "l1", tol=1e-11)
    assert np.max(np.abs(path[-1].coef - cold.coef)) <= 1e-8
    nnz = [np.count_nonzero(r.coef) for r in path]
    assert nnz[0] < nnz[-1]
    stopped = gram_path(G, W0, alphas, "l1", callback=lambda k, r: k == 2)
    assert len(stopped) == 3


def test_zero_alpha_is_least_squares_and_b_form():
    W0, G = _layer(R=3, p=10, seed=3)
    res = gram_cd(G, W0, 0.0, "l1", tol=1e-12, max_iter=500)
    assert np.max(np.abs(res.coef - W0)) <= 1e-6
    # solve_gram with B = G w0 is the same problem
    res2 = solve_gram(G, W0 @ G, 0.0, 0.0, "l1", tol=1e-12, max_iter=500)
    assert np.allclose(res.coef, res2.coef, atol=1e-12)


def test_bad_input_is_refused():
    W0, G = _layer(R=2, p=5)
    with pytest.raises(ValueError, match="square"):
        gram_cd(G[:4], W0, 0.1, "l1")
    with pytest.raises(ValueError, match="symmetric"):
        gram_cd(G + np.triu(np.ones_like(G), 1), W0, 0.1, "l1")
    with pytest.raises(ValueError, match="W0 must have shape"):
        gram_cd(G, W0[:, :3], 0.1, "l1")
    with pytest.raises(ValueError, match="alpha"):
        gram_cd(G, W0, -1.0, "l1")
    with pytest.raises(ValueError, match="compiled kernel"):
        gram_cd(G, W0, 0.1, penalties.get("hard_threshold", k=2))
    with pytest.raises(ValueError, match="NaN"):
        gram_cd(np.full_like(G, np.nan), W0, 0.1, "l1")
    with pytest.raises(ValueError, match="n_threads"):
        gram_cd(G, W0, 0.1, "l1", n_threads=0)
    with pytest.raises(ValueError, match="has no option"):
        SparseLinearRegression(solver="gram_cd", solver_params={"step": 1}).fit(
            *_synthetic())
