"""sample_weight of the linear estimators against scikit-learn and cvxpy (tight tolerance), on
raw unstandardized data (diabetes, breast_cancer) and standardized synthetic data; integer
weights equal row repetition, a zero weight equals row removal."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.linear_model import ElasticNet, Lasso, LogisticRegression

from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression, _fitdata, alpha_max

TOL = 1e-10


def _diabetes():
    return load_diabetes(return_X_y=True, scaled=False)  # columns from ~1 (sex) to ~300 (tc)


def _cancer(p=8):
    X, y = load_breast_cancer(return_X_y=True)
    return X[:, :p], y  # raw: radius ~10, area ~1000, smoothness ~0.1


def _weights(n, seed=0, zeros=True):
    rng = np.random.default_rng(seed)
    w = rng.integers(0 if zeros else 1, 4, n).astype(float)
    return w


@pytest.mark.parametrize("sparse", [False, True, "intercept_column"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_weighted_lasso_matches_sklearn_on_raw_diabetes(sparse, fit_intercept, monkeypatch):
    if sparse == "intercept_column":  # the path of large sparse designs (no dense centring)
        monkeypatch.setattr(_fitdata, "_DENSE_CENTRING", 0)
    X, y = _diabetes()
    sw = _weights(X.shape[0]) + 0.5 * np.random.default_rng(1).random(X.shape[0])
    XX = sp.csc_matrix(X) if sparse else X
    alpha = 0.5
    # sparse X with an intercept: the intercept is a column of the solver's design, nearly
    # collinear with these raw columns (large means), hence slower
    ours = SparseLinearRegression(alpha=alpha, scaling="none", tol=TOL, max_iter=2000,
                                  fit_intercept=fit_intercept).fit(XX, y, sample_weight=sw)
    ref = Lasso(alpha=alpha, tol=1e-14, max_iter=500000,
                fit_intercept=fit_intercept).fit(XX, y, sample_weight=sw)
    assert np.count_nonzero(ref.coef_) >= 3
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6, atol=1e-6)
    assert abs(ours.intercept_ - ref.intercept_) <= 1e-6 * max(1.0, abs(ref.intercept_))
    # the same support: exact zeros where scikit-learn has them
    np.testing.assert_array_equal(ours.coef_ == 0, ref.coef_ == 0)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("logistic", [False, True])
@pytest.mark.parametrize("penalty", ["l1", "mcp"])
def test_integer_weights_equal_repetition_and_zero_weight_removal(sparse, logistic, penalty):
    if logistic:
        X, y = _cancer()
        est = SparseLogisticRegression(penalty=penalty, alpha=0.02, tol=TOL)
    else:
        X, y = _diabetes()
        est = SparseLinearRegression(penalty=penalty, alpha=0.3, tol=TOL)
    if penalty == "mcp":
        est.set_params(penalty_params={"a": 3.0, "lam": "alpha"})
    sw = _weights(X.shape[0], seed=3)
    assert np.any(sw == 0) and np.any(sw > 1)
    f = sp.csc_matrix if sparse else np.asarray
    a = est.fit(f(X), y, sample_weight=sw)
    ca, ba = np.array(a.coef_), np.array(a.intercept_)
    rows = np.repeat(np.arange(X.shape[0]), sw.astype(int))  # zero weight: row removed
    b = est.fit(f(X[rows]), y[rows])
    assert np.count_nonzero(ca) >= 2
    np.testing.assert_allclose(ca, b.coef_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ba, b.intercept_, rtol=1e-6, atol=1e-7)


def test_weighted_logistic_matches_cvxpy_on_raw_data():
    import cvxpy as cp

    X, y = _cancer(6)
    sw = _weights(X.shape[0], seed=5, zeros=False) + 0.25
    alpha = 0.01
    ours = SparseLogisticRegression(alpha=alpha, scaling="none", tol=TOL).fit(
        X, y, sample_weight=sw)
    yy = np.where(y == 1, 1.0, -1.0)
    w, b = cp.Variable(X.shape[1]), cp.Variable()
    v = sw / sw.sum()
    obj = cp.sum(cp.multiply(v, cp.logistic(-cp.multiply(yy, X @ w + b)))) + alpha * cp.norm1(w)
    prob = cp.Problem(cp.Minimize(obj))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)

    def F(coef, icpt):
        z = X @ coef + icpt
        return float(v @ np.logaddexp(0, -yy * z) + alpha * np.abs(coef).sum())

    assert F(ours.coef_[0], ours.intercept_[0]) <= prob.value + 1e-9
    np.testing.assert_allclose(ours.coef_[0], w.value, atol=1e-4)
    assert np.count_nonzero(ours.coef_) >= 2


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_weighted_ridge_logistic_matches_sklearn_lbfgs(fit_intercept):
    # l1_ratio=0 is a pure ridge: scikit-learn's LogisticRegression(C, l1_ratio=0) minimizes
    # C sum_i v_i loss_i + ||w||^2 / 2, i.e. ours at alpha = 1 / (C sum v)
    X, y = _cancer(5)
    sw = _weights(X.shape[0], seed=7) + 0.1
    C = 0.5
    ref = LogisticRegression(C=C, l1_ratio=0.0, tol=1e-12, max_iter=100000,
                             fit_intercept=fit_intercept).fit(X, y, sample_weight=sw)
    ours = SparseLogisticRegression(alpha=1.0 / (C * sw.sum()), l1_ratio=0.0, scaling="none",
                                    tol=1e-12, fit_intercept=fit_intercept).fit(
        X, y, sample_weight=sw)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-5, atol=1e-7)


def test_weighted_elastic_net_standardized_synthetic():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 30))
    X = (X - X.mean(0)) / X.std(0)
    y = X[:, :4] @ np.array([2.0, -1.0, 0.5, 1.5]) + 0.1 * rng.standard_normal(80)
    sw = rng.random(80) * 3
    ref = ElasticNet(alpha=0.05, l1_ratio=0.7, tol=1e-14, max_iter=100000).fit(
        X, y, sample_weight=sw)
    ours = SparseLinearRegression(alpha=0.05, l1_ratio=0.7, tol=TOL).fit(X, y, sample_weight=sw)
    # scaling="dropout" with weights uses the weighted second moments: not 1 here, so compare
    # with scaling="none"
    ours_none = SparseLinearRegression(alpha=0.05, l1_ratio=0.7, scaling="none", tol=TOL).fit(
        X, y, sample_weight=sw)
    np.testing.assert_allclose(ours_none.coef_, ref.coef_, rtol=1e-6, atol=1e-7)
    assert abs(ours_none.intercept_ - ref.intercept_) <= 1e-7
    assert not np.allclose(ours.coef_, ref.coef_, atol=1e-4)


def test_alpha_max_with_weights_gives_empty_model(monkeypatch):
    X, y = _diabetes()
    sw = _weights(X.shape[0], seed=11)
    for sparse in (False, True, "intercept_column"):
        if sparse == "intercept_column":
            monkeypatch.setattr(_fitdata, "_DENSE_CENTRING", 0)
        XX = sp.csc_matrix(X) if sparse else X
        a = alpha_max(XX, y, sample_weight=sw)
        at = SparseLinearRegression(alpha=a * 1.0001, tol=TOL).fit(XX, y, sample_weight=sw)
        below = SparseLinearRegression(alpha=a * 0.99, tol=TOL).fit(XX, y, sample_weight=sw)
        assert np.count_nonzero(at.coef_) == 0 and np.count_nonzero(below.coef_) > 0
    # the unweighted value differs (the weights matter)
    assert abs(alpha_max(X, y) - alpha_max(X, y, sample_weight=sw)) > 1e-3 * alpha_max(X, y)
    Xc, yc = _cancer()
    swc = _weights(Xc.shape[0], seed=2)
    a = alpha_max(Xc, yc, datafit="logistic", sample_weight=swc)
    at = SparseLogisticRegression(alpha=a * 1.0001, tol=TOL).fit(Xc, yc, sample_weight=swc)
    below = SparseLogisticRegression(alpha=a * 0.99, tol=TOL).fit(Xc, yc, sample_weight=swc)
    assert np.count_nonzero(at.coef_) == 0 and np.count_nonzero(below.coef_) > 0


def test_sample_weight_errors_name_the_argument(monkeypatch):
    X, y = _diabetes()
    est = SparseLinearRegression(alpha=1.0)
    for bad, msg in [(np.ones(5), "one entry per sample"), (-np.ones(X.shape[0]), ">= 0"),
                     (np.zeros(X.shape[0]), "all zero"),
                     (np.full(X.shape[0], np.nan), ">= 0")]:
        with pytest.raises(ValueError, match="sample_weight.*" + msg):
            est.fit(X, y, sample_weight=bad)
    monkeypatch.setattr(_fitdata, "_DENSE_CENTRING", 0)
    with pytest.raises(ValueError, match="positive=True with sparse X, sample_weight"):
        SparseLinearRegression(positive=True).fit(sp.csc_matrix(X), y,
                                                  sample_weight=_weights(X.shape[0]))
    # constant weights: the unweighted fit exactly
    a = SparseLinearRegression(alpha=1.0).fit(X, y, sample_weight=np.full(X.shape[0], 3.0))
    b = SparseLinearRegression(alpha=1.0).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
