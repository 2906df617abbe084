"""groups= on the single-output estimators: the group forms against cvxpy and skglm (group
lasso, sparse group lasso), for least squares, logistic and the GLM datafits, on raw and
standardized data; the group structure's checks; alpha_max; weights per group."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_diabetes

from dualdrop.linear import (SparseLinearRegression, SparseLinearRegressionCV,
                             SparseLogisticRegression, SparsePoissonRegression, alpha_max)
from dualdrop.linear._groups import check_groups

TOL = 1e-10
GROUPS = [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9]]  # diabetes: age/sex, bmi/bp/tc, the serum rest


def _diabetes():
    return load_diabetes(return_X_y=True, scaled=False)


def _synthetic(n=120, p=24, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) + 0.5
    w = np.zeros(p)
    w[:6] = [0.6, -0.4, 0.5, 0.3, 0.0, 0.2]
    return X, X @ w + 0.3 + 0.5 * rng.standard_normal(n), w


def _cvx_group(X, y, kind, alpha, groups, gw, rho=1.0, tau=0.0):
    import cvxpy as cp

    n, p = X.shape
    w, b = cp.Variable(p), cp.Variable()
    z = X @ w + b
    fit = {"quadratic": lambda: cp.sum_squares(y - z) / (2 * n),
           "logistic": lambda: cp.sum(cp.logistic(-cp.multiply(y, z))) / n,
           "poisson": lambda: cp.sum(cp.exp(z) - cp.multiply(y, z)) / n}[kind]()
    pen = sum(gw[g] * (rho * (1 - tau) * cp.norm(w[idx], 2) + rho * tau * cp.norm1(w[idx])
                       + (1 - rho) / 2 * cp.sum_squares(w[idx])) for g, idx in enumerate(groups))
    cp.Problem(cp.Minimize(fit + alpha * pen)).solve(
        solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return np.asarray(w.value), float(b.value)


@pytest.mark.parametrize("kind", ["quadratic", "logistic", "poisson"])
@pytest.mark.parametrize("rho,tau", [(1.0, 0.0), (1.0, 0.4), (0.7, 0.0)])
def test_group_penalties_match_cvxpy(kind, rho, tau):
    X, y, _ = _synthetic()
    if kind == "logistic":
        y = np.where(y > np.median(y), 1, 0)
    elif kind == "poisson":
        y = np.random.default_rng(1).poisson(np.exp(0.3 * (y - y.mean()))).astype(float)
    groups = [np.arange(0, 3), np.arange(3, 6), np.arange(6, 10), np.arange(10, 24)]
    gw = np.sqrt([3, 3, 4, 14])  # Yuan & Lin's weights
    cls = {"quadratic": SparseLinearRegression, "logistic": SparseLogisticRegression,
           "poisson": SparsePoissonRegression}[kind]
    alpha = 0.3 * alpha_max(X, y, datafit=kind, scaling="none", groups=groups, l1_ratio=rho,
                            group_l1_ratio=tau) if kind != "logistic" else 0.02
    ours = cls(alpha=alpha, groups=groups, penalty_weights=gw, l1_ratio=rho, group_l1_ratio=tau,
               scaling="none", tol=TOL).fit(X, y)
    yy = np.where(y == 1, 1.0, -1.0) if kind == "logistic" else y
    w, b = _cvx_group(X, yy, kind, alpha, groups, gw, rho, tau)
    coef = np.ravel(ours.coef_)
    np.testing.assert_allclose(coef, w, atol=1e-6 * max(1.0, np.abs(w).max()))
    assert np.ravel(ours.intercept_)[0] == pytest.approx(b, abs=1e-6 * max(1.0, abs(b)))
    norms = [np.linalg.norm(coef[g]) for g in groups]
    assert 0.0 in norms and any(v > 0 for v in norms)  # whole groups out, some in


def test_group_lasso_matches_skglm_on_diabetes():
    from skglm import GroupLasso

    X, y = _diabetes()
    X = (X - X.mean(0)) / X.std(0)  # skglm's block CD crawls on the raw columns
    a = 0.2 * alpha_max(X, y, groups=GROUPS, scaling="none")
    ours = SparseLinearRegression(alpha=a, groups=GROUPS, scaling="none", tol=TOL).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = GroupLasso(groups=GROUPS, alpha=a, tol=1e-10, max_iter=1000).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6, atol=1e-6)
    assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-8)


def test_sparse_group_lasso_matches_skglm():
    from skglm import GeneralizedLinearEstimator
    from skglm.datafits import QuadraticGroup
    from skglm.penalties import WeightedL1GroupL2
    from skglm.solvers import GroupBCD

    X, y, _ = _synthetic(n=150, p=30, seed=2)
    X = (X - X.mean(0)) / X.std(0)
    y = y - y.mean()  # skglm's sparse group lasso fails with an intercept (a numba error)
    ptr = np.arange(0, 31, 5, dtype=np.int32)  # skglm's own index type
    idx = np.arange(30, dtype=np.int32)
    tau, a = 0.5, 0.05
    ours = SparseLinearRegression(alpha=a, groups=5, group_l1_ratio=tau, scaling="none",
                                  fit_intercept=False, tol=TOL).fit(X, y)
    pen = WeightedL1GroupL2(alpha=a, weights_groups=(1 - tau) * np.ones(6),
                            weights_features=tau * np.ones(30), grp_ptr=ptr, grp_indices=idx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = GeneralizedLinearEstimator(QuadraticGroup(ptr, idx), pen, GroupBCD(
            tol=1e-10, max_iter=1000, fit_intercept=False, ws_strategy="fixpoint")).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    assert 0 < np.count_nonzero(ours.coef_) < 30


@pytest.mark.parametrize("sparse", [False, True])
def test_weighted_raw_fit_equals_repetition_and_dense(sparse, monkeypatch):
    from dualdrop.linear import _fitdata

    if sparse:  # the intercept as an unpenalized column of its own (a group of one)
        monkeypatch.setattr(_fitdata, "_DENSE_CENTRING", 0)
    X, y = _diabetes()
    sw = np.random.default_rng(3).integers(0, 4, len(y)).astype(float)
    est = SparseLinearRegression(alpha=0.5, groups=GROUPS, group_l1_ratio=0.3, tol=TOL)
    f = sp.csc_matrix if sparse else np.asarray
    a = est.fit(f(X), y, sample_weight=sw)
    ca, ia = a.coef_.copy(), a.intercept_
    rows = np.repeat(np.arange(len(y)), sw.astype(int))
    b = est.fit(X[rows], y[rows])
    assert np.count_nonzero(ca) >= 3
    np.testing.assert_allclose(ca, b.coef_, rtol=1e-6, atol=1e-6)
    assert ia == pytest.approx(b.intercept_, rel=1e-7)


def test_singleton_groups_are_the_plain_penalty():
    """Groups of one feature are the separable problem: the same fit for l1; for nonconvex
    penalties the block solver's point is a stationary point of the scalar solver (a warm start
    there stops at once, unmoved)."""
    X, y = _diabetes()
    for pen, pp in [("l1", None), ("mcp", {"a": 3.0, "lam": "alpha"}),
                    ("logsum", {"eps": 1.0})]:
        kw = dict(penalty=pen, penalty_params=pp, alpha=0.3, tol=TOL)
        grouped = SparseLinearRegression(groups=1, **kw).fit(X, y)
        plain = SparseLinearRegression(**kw)
        if pen == "l1":
            np.testing.assert_allclose(grouped.coef_, plain.fit(X, y).coef_, rtol=1e-6,
                                       atol=1e-8)
            continue
        plain.set_params(warm_start=True)
        plain.coef_, plain.intercept_ = grouped.coef_.copy(), grouped.intercept_
        plain.fit(X, y)
        assert plain.n_iter_ == 1
        np.testing.assert_allclose(plain.coef_, grouped.coef_, rtol=1e-8)


def test_catalog_penalties_on_group_norms_and_alpha_max():
    X, y = _diabetes()
    for pen, pp in [("mcp", {"a": 3.0, "lam": "alpha"}), ("logsum", {"eps": 0.5}),
                    ("scad", {"a": 3.7, "lam": "alpha"})]:
        amax = alpha_max(X, y, penalty=pen, penalty_params=pp, groups=GROUPS)
        kw = dict(penalty=pen, penalty_params=pp, groups=GROUPS)
        assert np.all(SparseLinearRegression(alpha=1.0001 * amax, **kw).fit(X, y).coef_ == 0)
        fit = SparseLinearRegression(alpha=0.3 * amax, **kw).fit(X, y)
        norms = check_groups(GROUPS, 10).norms(fit.coef_)
        assert np.any(norms > 0)
        assert fit.criterion_ <= 1e-5


def test_penalty_weights_per_group():
    X, y = _diabetes()
    fit = SparseLinearRegression(alpha=5.0, groups=GROUPS,
                                 penalty_weights=[0.0, np.inf, 1.0]).fit(X, y)
    assert np.all(fit.coef_[[0, 1]] != 0)  # unpenalized
    assert np.all(fit.coef_[[2, 3, 4]] == 0)  # excluded
    with pytest.raises(ValueError, match="one entry per group"):
        SparseLinearRegression(groups=GROUPS, penalty_weights=np.ones(10)).fit(X, y)


@pytest.mark.parametrize("groups,match", [
    (3, "equal groups"),
    ([3, 3], "sum to the 10"),
    ([[0, 1, 2], [2, 3, 4, 5, 6, 7, 8, 9]], "overlap: feature 2"),
    ([[0, 1], [2, 3]], "in no group"),
    ([[0, 11]], "outside"),
    ([[0, 0, 1]], "twice"),
    ([[0.5, 1.0]], "feature indices"),
    (True, "groups"),
])
def test_group_structure_errors_name_groups(groups, match):
    X, y = _diabetes()
    est = SparseLinearRegression(groups=groups)
    with pytest.raises(ValueError, match=match):
        est.fit(X, y)
    assert not hasattr(est, "coef_")


def test_group_structure_forms():
    assert check_groups(5, 10).n_groups == 2
    g = check_groups([2, 3, 5], 10)
    np.testing.assert_array_equal(g.ptr, [0, 2, 5, 10])
    g = check_groups([np.array([9, 0]), range(1, 9)], 10)
    assert g.n_groups == 2 and g.group_of[9] == 0 and g.group_of[5] == 1


def test_groups_in_cv():
    X, y = _diabetes()
    cv = SparseLinearRegressionCV(groups=GROUPS, alphas=8, cv=3).fit(X, y)
    norms = check_groups(GROUPS, 10).norms(cv.coef_)
    assert cv.alpha_ in cv.alphas_ and np.any(norms > 0)
