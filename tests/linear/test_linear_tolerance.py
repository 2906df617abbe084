"""The default tolerance: an objective within 1e-6 relative of the optimum on convex problems
(Lasso, l1 logistic), on raw unstandardized data and standardized synthetic data, against
scikit-learn / skglm at tight tolerance; the criterion does not depend on the units of X or y;
the closed-form zero thresholds agree with the prox."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.linear_model import Lasso
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

import penalties
from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression, alpha_max
from dualdrop.linear._jit import zero_threshold
from penalties.kernels import prox_scalar


def _lasso_obj(X, y, alpha, w, b):
    r = y - X @ w - b
    return 0.5 * float(r @ r) / len(y) + alpha * float(np.abs(w).sum())


def _logistic_obj(X, yy, alpha, w, b):
    return float(np.mean(np.logaddexp(0.0, -yy * (X @ w + b)))) + alpha * float(np.abs(w).sum())


def _diabetes_poly():
    X, y = load_diabetes(return_X_y=True, scaled=False)
    return PolynomialFeatures(2, include_bias=False).fit_transform(X), y  # columns up to ~1e5


def _synthetic(n=200, p=400, seed=0):
    rng = np.random.default_rng(seed)
    X = StandardScaler().fit_transform(rng.standard_normal((n, p)))
    w = np.zeros(p)
    w[:10] = rng.standard_normal(10)
    return X, X @ w + 0.5 * rng.standard_normal(n)


@pytest.mark.parametrize("data", ["diabetes_poly_raw", "synthetic_std"])
@pytest.mark.parametrize("ratio", [20, 100, 1000])
def test_default_tol_lasso_within_1e6_of_optimum(data, ratio):
    X, y = _diabetes_poly() if data == "diabetes_poly_raw" else _synthetic()
    alpha = alpha_max(X, y, scaling="none") / ratio
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = Lasso(alpha=alpha, tol=1e-12, max_iter=200000).fit(X, y)
    tight = SparseLinearRegression(alpha=alpha, scaling="none", tol=1e-12, max_iter=1000).fit(X, y)
    best = min(_lasso_obj(X, y, alpha, ref.coef_, ref.intercept_),
               _lasso_obj(X, y, alpha, tight.coef_, tight.intercept_))
    est = SparseLinearRegression(alpha=alpha, scaling="none").fit(X, y)
    assert est.tol == 1e-5
    gap = (_lasso_obj(X, y, alpha, est.coef_, est.intercept_) - best) / best
    assert gap <= 1e-6, gap


@pytest.mark.parametrize("data", ["raw", "poly_std"])
@pytest.mark.parametrize("ratio", [20, 100])
def test_default_tol_l1_logistic_within_1e6_of_optimum(data, ratio):
    skglm = pytest.importorskip("skglm")
    X, y = load_breast_cancer(return_X_y=True)  # raw columns from ~1e-3 to ~1e3
    if data == "poly_std":
        X = StandardScaler().fit_transform(PolynomialFeatures(2, include_bias=False)
                                           .fit_transform(X))
    yy = np.where(y == 1, 1.0, -1.0)
    alpha = alpha_max(X, y, datafit="logistic", scaling="none") / ratio
    ref = skglm.SparseLogisticRegression(alpha=alpha, tol=1e-12, max_iter=1000).fit(X, y)
    best = _logistic_obj(X, yy, alpha, ref.coef_.ravel(), float(np.ravel(ref.intercept_)[0]))
    est = SparseLogisticRegression(alpha=alpha, scaling="none").fit(X, y)
    gap = (_logistic_obj(X, yy, alpha, est.coef_.ravel(), est.intercept_[0]) - best) / best
    assert gap <= 1e-6, gap


def test_criterion_does_not_depend_on_units():
    """Multiplying y by c multiplies the solution by c and leaves the relative criterion (and so
    the iterations) unchanged; an absolute threshold would stop 1e6 times earlier or later."""
    X, y = _diabetes_poly()
    fits = []
    for c in (1e-3, 1.0, 1e3):
        a = alpha_max(X, c * y, scaling="none") / 50
        fits.append(SparseLinearRegression(alpha=a, scaling="none").fit(X, c * y))
    for c, f in zip((1e-3, 1.0, 1e3), fits):
        np.testing.assert_allclose(f.coef_ / c, fits[1].coef_, rtol=1e-6, atol=1e-12)
        assert f.n_iter_ == fits[1].n_iter_
        assert np.isclose(f.criterion_, fits[1].criterion_, rtol=1e-3, atol=1e-12)


@pytest.mark.parametrize("P", [penalties.get("l1"), penalties.get("lp", p=1.0),
                               penalties.get("mcp", a=3.0, lam=0.5),
                               penalties.get("mcp", a=1.5, lam=0.2),
                               penalties.get("logsum", eps=0.3)])
def test_zero_threshold_is_the_edge_of_the_prox_zero_set(P):
    code, params = P.kernel_spec()
    for t in (1e-3, 0.1, 0.3, 1.0, 5.0):
        T = zero_threshold(code, params, t)
        # (a bisected edge may sit where the prox rounds to ~1e-8 T instead of 0: harmless)
        assert abs(prox_scalar(code, params, T * (1 - 1e-9), t)) <= 1e-6 * T
        assert prox_scalar(code, params, T * (1 + 1e-7) + 1e-300, t) != 0.0
