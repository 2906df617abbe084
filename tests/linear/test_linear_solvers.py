"""Solvers of dualdrop.linear against cvxpy, against each other, and their MM properties."""

import numpy as np
import pytest
import scipy.sparse as sp

import penalties
from dualdrop.linear import Logistic, Problem, Quadratic, get_solver
from dualdrop.linear._penalty import abs_derivative


def _data(n=60, p=30, seed=0, classif=False, density=None):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    if density is not None:
        X = X * (rng.random((n, p)) < density)
    w = np.zeros(p)
    w[:4] = [1.5, -1.0, 0.8, 0.5]
    z = X @ w + 0.3
    if classif:
        y = np.where(z + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0)
    else:
        y = z + 0.3 * rng.standard_normal(n)
    return X, y


def _problem(X, y, pen, alpha, logistic=False, **kw):
    return Problem(X, y, Logistic() if logistic else Quadratic(), pen, alpha, **kw)


@pytest.fixture(scope="module")
def l1_quadratic_truth():
    X, y = _data()
    pr = _problem(X, y, penalties.get("l1"), 0.05)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10)
    return X, y, ref


@pytest.mark.parametrize("solver,opts", [
    ("cd", {}),
    ("cd", {"working_set": False, "anderson": 0}),
    ("irls", {}),
    ("reweighted_l1", {}),
    ("adaprox", {"eta_at": "iterate", "max_iter": 20000}),
])
def test_convex_lasso_matches_cvxpy(l1_quadratic_truth, solver, opts):
    X, y, ref = l1_quadratic_truth
    pr = _problem(X, y, penalties.get("l1"), 0.05)
    res = get_solver(solver).solve(pr, tol=1e-9, **opts)
    assert abs(res.final_objective - ref.final_objective) <= 1e-6 * abs(ref.final_objective)
    assert np.max(np.abs(res.coef - ref.coef)) <= 1e-5
    assert abs(res.intercept - ref.intercept) <= 1e-5


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_convex_logistic_matches_cvxpy(fit_intercept):
    X, y = _data(n=80, p=20, seed=1, classif=True)
    pen = penalties.get("l1")
    pr = _problem(X, y, pen, 0.02, logistic=True, fit_intercept=fit_intercept)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10)
    res = get_solver("cd").solve(pr, tol=1e-9)
    assert res.converged
    assert abs(res.final_objective - ref.final_objective) <= 1e-6 * ref.final_objective
    assert np.max(np.abs(res.coef - ref.coef)) <= 1e-5
    # IRLS converges sublinearly on coefficients at the l1 threshold: objective only
    res = get_solver("irls").solve(pr, tol=1e-9, max_iter=300)
    assert abs(res.final_objective - ref.final_objective) <= 1e-6 * ref.final_objective


def test_lp_convex_cd_matches_cvxpy():
    X, y = _data(seed=2)
    pen = penalties.get("lp", p=1.5)
    pr = _problem(X, y, pen, 0.05)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10)
    res = get_solver("cd").solve(pr, tol=1e-10)
    assert abs(res.final_objective - ref.final_objective) <= 1e-6 * ref.final_objective
    assert np.max(np.abs(res.coef - ref.coef)) <= 1e-4


@pytest.mark.parametrize("logistic", [False, True])
@pytest.mark.parametrize("pen", [penalties.get("l1"), penalties.get("mcp", a=3.0, lam=0.1),
                                 penalties.get("logsum", eps=0.3)], ids=repr)
def test_sparse_and_dense_designs_agree(pen, logistic):
    X, y = _data(n=70, p=40, seed=3, classif=logistic, density=0.3)
    alpha = 0.02 if logistic else 0.05
    rd = get_solver("cd").solve(_problem(X, y, pen, alpha, logistic), tol=1e-10)
    rs = get_solver("cd").solve(_problem(sp.csc_matrix(X), y, pen, alpha, logistic), tol=1e-10)
    # same problem, same path up to floating-point summation order: equal to solver accuracy
    assert np.max(np.abs(rd.coef - rs.coef)) <= 1e-7
    assert abs(rd.intercept - rs.intercept) <= 1e-7
    ri_d = get_solver("irls").solve(_problem(X, y, pen, alpha, logistic), tol=1e-8, max_iter=50)
    ri_s = get_solver("irls").solve(_problem(sp.csc_matrix(X), y, pen, alpha, logistic), tol=1e-8,
                                    max_iter=50)
    assert np.max(np.abs(ri_d.coef - ri_s.coef)) <= 1e-7


def _monotone(h):
    return np.all(np.diff(h) <= 1e-12 * np.maximum(1.0, np.abs(h[:-1])))


@pytest.mark.parametrize("pen", [penalties.get("logsum", eps=0.2), penalties.get("mcp", a=2.0, lam=0.2),
                                 penalties.get("scad", a=3.7, lam=0.1), penalties.get("lp", p=0.5)],
                         ids=repr)
@pytest.mark.parametrize("logistic", [False, True])
def test_mm_solvers_are_monotone(pen, logistic):
    # least squares with p > n: IRLS takes the Woodbury branch; logistic with n > p (not separable)
    X, y = _data(n=150 if logistic else 50, p=80, seed=4, classif=logistic)
    alpha = 0.02 if logistic else 0.1
    pr = _problem(X, y, pen, alpha, logistic)
    w0 = get_solver("cd").solve(_problem(X, y, penalties.get("l1"), alpha, logistic), tol=1e-6).coef
    runs = [get_solver("irls").solve(pr, w0, tol=1e-9, max_iter=60),
            get_solver("adaprox").solve(pr, w0, tol=1e-9, max_iter=300, eta_at="iterate")]
    if pen.name != "lp":  # Omega'(0+) = inf: reweighted l1 from the l1 start is still fine, but slow
        runs.append(get_solver("reweighted_l1").solve(pr, w0, tol=1e-9, max_iter=30))
    for res in runs:
        assert len(res.objective) >= 3, res.solver
        assert _monotone(res.objective), (res.solver, np.diff(res.objective).max())
        assert res.objective[-1] < res.objective[0], res.solver


def test_reweighted_l1_uses_right_derivative_and_cvxpy_inner_is_monotone():
    pen = penalties.get("logsum", eps=0.5)
    # Omega'(|w|) >= 0 with the right derivative at 0 (1/eps), not the signed derivative (0 at 0)
    wts = abs_derivative(pen, np.array([0.0, -1.0, 2.0]))
    np.testing.assert_allclose(wts, [2.0, 1 / 1.5, 1 / 2.5], rtol=1e-12)
    X, y = _data(n=40, p=15, seed=5)
    pr = _problem(X, y, pen, 0.1)
    res = get_solver("reweighted_l1").solve(pr, tol=1e-8, max_iter=15, inner="cvxpy")
    assert _monotone(res.objective)
    # zero coefficients stay penalized: the solution is sparse and the objective finite
    assert np.isfinite(res.final_objective) and np.count_nonzero(np.abs(res.coef) > 1e-6) < 15
    ref = get_solver("reweighted_l1").solve(pr, tol=1e-10, max_iter=100)
    assert abs(res.final_objective - ref.final_objective) <= 1e-5 * ref.final_objective


def test_reweighted_l1_refuses_penalty_convex_in_abs():
    X, y = _data(n=20, p=5)
    pr = _problem(X, y, penalties.get("lp", p=1.5), 0.1)
    assert "concave" in get_solver("reweighted_l1").supports(pr)


@pytest.mark.parametrize("pen", [penalties.get("logsum", eps=0.5), penalties.get("mcp", a=3.0, lam=0.3)],
                         ids=repr)
def test_nonconvex_solvers_reach_stationary_points_with_equal_objective(pen):
    """Same start (the Lasso solution), same penalty: CD, IRLS and reweighted l1 reach stationary
    points (criterion small) of equal objective."""
    X, y = _data(n=80, p=30, seed=6)
    alpha = 0.1
    w0 = get_solver("cd").solve(_problem(X, y, penalties.get("l1"), alpha), tol=1e-8).coef
    pr = _problem(X, y, pen, alpha)
    vals = {}
    for name, kw in [("cd", {}), ("irls", {"max_iter": 500}), ("reweighted_l1", {})]:
        res = get_solver(name).solve(pr, w0, tol=1e-7, **kw)
        assert res.criterion <= 1e-6, (name, res.criterion)
        vals[name] = res.final_objective
    ref = vals["cd"]
    for name, v in vals.items():
        assert abs(v - ref) <= 1e-7 * ref, (name, v, ref)


def test_eta_trick_and_adatikhonov_decrease_their_objectives():
    X, y = _data(n=50, p=10, seed=7)
    pen = penalties.get("logsum", eps=1.0)
    pr = _problem(X, y, pen, 0.1)
    ref = get_solver("cd").solve(pr, tol=1e-10)
    et = get_solver("eta_trick").solve(pr, tol=1e-6, max_iter=3000)
    assert _monotone(et.info["J"])  # J(w, eta) is what the joint descent decreases
    assert np.all(et.objective <= et.info["J"] + 1e-12)  # F = min_eta J <= J
    assert et.final_objective - ref.final_objective <= 1e-2 * ref.final_objective
    at = get_solver("adatikhonov").solve(pr, tol=1e-6, max_iter=3000)
    assert _monotone(at.objective)
    assert at.final_objective - ref.final_objective <= 2e-2 * ref.final_objective


def test_adaprox_hard_threshold_is_iht():
    X, y = _data(n=100, p=30, seed=8)
    pen = penalties.get("hard_threshold", k=4)
    pr = _problem(X, y, pen, 1.0)
    res = get_solver("adaprox").solve(pr, tol=1e-8, max_iter=2000, step="lipschitz")
    assert np.count_nonzero(res.coef) <= 4
    assert set(np.flatnonzero(res.coef)) == {0, 1, 2, 3}
    assert _monotone(res.objective)
    # on its support the result is the least-squares fit
    A = np.column_stack([X[:, :4], np.ones(100)])
    ls = np.linalg.lstsq(A, y, rcond=None)[0]
    np.testing.assert_allclose(res.coef[:4], ls[:4], atol=1e-6)


def test_theorem1_dropout_sgd_average_approaches_erm():
    """Adaptive dropout with real random masks and keep ratios eta_hat/(eta_hat + lambda): the
    averaged SGD iterate approaches the regularized ERM solution (not the least-squares one), and
    more epochs bring it closer."""
    rng = np.random.default_rng(0)
    n, p = 200, 10
    X = rng.standard_normal((n, p))
    X = (X - X.mean(0)) / X.std(0)  # standardized: c_j = 1
    w = np.zeros(p)
    w[:3] = [1.0, -0.5, 0.3]
    y = X @ w + 0.5 * rng.standard_normal(n)
    pr = _problem(X, y, penalties.get("log2sum", eps=0.1), 0.05)
    ref = get_solver("cd").solve(pr, tol=1e-12).coef
    ols = np.linalg.lstsq(np.column_stack([X, np.ones(n)]), y, rcond=None)[0][:p]
    d_ols = np.linalg.norm(ols - ref)
    errs = {}
    for mask in ("bernoulli", "gaussian"):
        for epochs in (30, 300):
            res = get_solver("dropout_sgd").solve(pr, max_iter=epochs, mask=mask, batch_size=10,
                                                  random_state=1)
            errs[mask, epochs] = np.linalg.norm(res.coef - ref)
        assert errs[mask, 300] < 0.05 * d_ols, errs
        assert errs[mask, 300] < errs[mask, 30], errs


@pytest.mark.parametrize("name", ["l1", "lp", "logsum", "log2sum", "mcp", "scad", "standout",
                                  "vardrop", "vardrop_exact", "hardconcrete"])
def test_cd_with_every_catalog_penalty_is_coordinatewise_optimal(name):
    """CD uses the engine's prox (closed form or numeric). Independent check: at the result, each
    coordinate minimizes its 1-D objective (others fixed) over a fine grid, up to grid error."""
    X, y = _data(n=60, p=12, seed=9)
    pen = penalties.get(name)
    pr = _problem(X, y, pen, 0.1)
    res = get_solver("cd").solve(pr, tol=1e-9, max_iter=200)
    assert res.converged, (name, res.criterion)
    w, b = res.coef, res.intercept
    F0 = pr.objective(w, b)
    grid = np.linspace(-4, 4, 4001)
    for j in range(X.shape[1]):
        r = y - b - X @ w + X[:, j] * w[j]
        # 1-D objective in w_j: (1/2n)||r - x_j t||^2 + alpha Omega(t)
        vals = ((r[None, :] - grid[:, None] * X[:, j][None, :]) ** 2).sum(1) / (2 * len(y)) \
            + 0.1 * np.asarray(pen.omega(grid))
        F_j = ((r - X[:, j] * w[j]) ** 2).sum() / (2 * len(y)) + 0.1 * float(pen.omega(w[j]))
        assert F_j <= vals.min() + 1e-6 * (1 + abs(F0)), (name, j, w[j], grid[np.argmin(vals)])


@pytest.mark.parametrize("logistic", [False, True])
def test_cvxpy_polished_support_is_cd_support(logistic):
    X, y = _data(n=80, p=30, seed=3, classif=logistic)
    pr = _problem(X, y, penalties.get("l1"), 0.05 if not logistic else 0.03, logistic=logistic)
    ref = get_solver("cd").solve(pr, tol=1e-10)
    res = get_solver("cvxpy").solve(pr, tol=1e-9)
    raw = res.info["cvxpy_coef"]
    assert np.count_nonzero(raw) > np.count_nonzero(ref.coef)  # interior point: no exact zeros
    np.testing.assert_array_equal(res.coef != 0, ref.coef != 0)
    np.testing.assert_allclose(res.coef, ref.coef, atol=1e-7)
    assert abs(res.final_objective - ref.final_objective) <= 1e-10 * ref.final_objective


def test_hardconcrete_at_tiny_alpha_converges_on_raw_data():
    """1e-7 alpha_max: the generic numeric prox used to lose the root at |v| for penalties flat
    beyond a point (hard concrete), and CD wandered."""
    from sklearn.datasets import load_diabetes

    from dualdrop.linear import SparseLinearRegression, alpha_max

    X, y = load_diabetes(return_X_y=True)
    for scaling in ("dropout", "none"):
        am = alpha_max(X, y, "hardconcrete", scaling=scaling)
        est = SparseLinearRegression("hardconcrete", alpha=1e-7 * am, scaling=scaling,
                                     tol=1e-6).fit(X, y)
        assert est.criterion_ <= 1e-6
        hist = est.objective_
        assert np.all(np.diff(hist) <= 1e-12 * hist[0])


@pytest.mark.parametrize("positive", [False, True])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.7])
def test_cd_anderson_on_the_orthant_face_keeps_residual_and_reaches_the_lasso(positive, l1_ratio):
    """At small alpha on a raw sparse design (support about n) the least-squares CD keeps its
    Anderson extrapolations on the current orthant face (convex penalties): the coordinates an
    extrapolation would flip are set to 0 and their columns taken out of the extrapolated
    residual. The residual it carries must stay y - X w - b (the criterion recomputed from the
    coefficients is at the tol), and the point is scikit-learn's (elastic net) Lasso."""
    from sklearn.linear_model import ElasticNet

    from dualdrop.linear._penalty import with_ridge

    X = sp.random(150, 600, density=0.05, format="csc", random_state=3)
    rng = np.random.default_rng(3)
    w = np.zeros(600)
    w[rng.choice(600, 15, replace=False)] = rng.standard_normal(15)
    y = np.asarray(X @ w).ravel() + 0.1 * rng.standard_normal(150)
    amax = np.max(np.abs(X.T @ (y - y.mean()))) / len(y)
    alpha = amax / 1000
    pen = with_ridge(penalties.get("l1"), l1_ratio)
    pr = Problem(X, y, Quadratic(), pen, alpha, True, positive=positive)
    res = get_solver("cd").solve(pr, tol=1e-9, max_iter=1000)
    assert res.converged
    # recomputed from the coefficients: the carried residual drifts by rounding only (a column
    # left out of an extrapolated residual would show as a violation of the size of its
    # coefficient)
    assert pr.criterion(res.coef, res.intercept) <= 1e-8
    assert np.count_nonzero(res.coef) > 100  # the regime where extrapolations flip signs
    ref = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, positive=positive, tol=1e-14,
                     max_iter=200000).fit(X.toarray(), y)
    f = pr.objective(res.coef, res.intercept)
    f_ref = pr.objective(ref.coef_, ref.intercept_)
    assert f <= f_ref + 1e-9 * abs(f_ref)
    if positive:
        assert res.coef.min() >= 0.0
