"""positive, penalty_weights, float32 against scikit-learn / skglm / cvxpy on real raw data."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.linear_model import Lasso
from sklearn.preprocessing import PolynomialFeatures

from dualdrop.linear import (Logistic, Problem, SparseLinearRegression, SparseLogisticRegression,
                             get_solver)
import penalties


def _diabetes_raw():
    X, y = load_diabetes(return_X_y=True, scaled=False)  # raw: ages, BMI, blood pressure, ...
    return X, y


def test_positive_matches_sklearn_lasso_on_raw_data():
    X, y = _diabetes_raw()
    alpha = 0.5
    ours = SparseLinearRegression(alpha=alpha, scaling="none", positive=True, tol=1e-9).fit(X, y)
    ref = Lasso(alpha=alpha, positive=True, tol=1e-14, max_iter=200000).fit(X, y)
    assert np.all(ours.coef_ >= 0)
    free = SparseLinearRegression(alpha=alpha, scaling="none", tol=1e-9).fit(X, y)
    assert np.any(free.coef_ < 0)  # the constraint is active
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6, atol=1e-6)
    assert abs(ours.intercept_ - ref.intercept_) <= 1e-5 * abs(ref.intercept_)


def test_positive_logistic_matches_cvxpy():
    X, y = load_breast_cancer(return_X_y=True)
    X = X[:, :12] / X[:, :12].std(0)
    y = 1 - y  # malignant as the positive class: most size features enter with w > 0
    yy = np.where(y == 1, 1.0, -1.0)
    pr = Problem(X, yy, Logistic(), penalties.get("l1"), 0.01, positive=True)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10, polish=False)
    ours = SparseLogisticRegression(alpha=0.01, scaling="none", positive=True, tol=1e-9).fit(X, y)
    assert np.all(ours.coef_ >= 0) and np.count_nonzero(ours.coef_) >= 2
    free = SparseLogisticRegression(alpha=0.01, scaling="none", tol=1e-9).fit(X, y)
    assert np.any(free.coef_ < 0)  # the constraint is active
    np.testing.assert_allclose(ours.coef_[0], ref.coef, atol=1e-5)
    with pytest.raises(ValueError, match="does not handle positive=True"):
        SparseLinearRegression(positive=True, solver="irls").fit(X, y)


def test_penalty_weights_match_cvxpy_on_raw_data():
    from dualdrop.linear import Quadratic

    X, y = _diabetes_raw()
    pw = np.array([0.0, 1.0, 2.0, 0.5, 1.0, 1.0, 3.0, 1.0, 0.0, 1.0])
    alpha = 0.3
    ours = SparseLinearRegression(alpha=alpha, scaling="none", penalty_weights=pw,
                                  tol=1e-9).fit(X, y)
    pr = Problem(X, y, Quadratic(), penalties.get("l1"), alpha, weights=pw)
    ref = get_solver("cvxpy").solve(pr, tol=1e-10, polish=False)
    o = pr.objective(ours.coef_, ours.intercept_)
    assert o <= ref.final_objective * (1 + 1e-9)
    np.testing.assert_allclose(ours.coef_, ref.coef, rtol=1e-4, atol=1e-4)
    assert ours.coef_[0] != 0 and ours.coef_[8] != 0  # unpenalized
    inf_w = pw.copy()
    inf_w[2] = np.inf
    assert SparseLinearRegression(alpha=alpha, scaling="none", penalty_weights=inf_w
                                  ).fit(X, y).coef_[2] == 0
    with pytest.raises(ValueError, match="one entry per feature"):
        SparseLinearRegression(penalty_weights=pw[:3]).fit(X, y)
    with pytest.raises(ValueError, match=">= 0"):
        SparseLinearRegression(penalty_weights=-pw).fit(X, y)


def test_float32_kept_and_matches_float64():
    X, y = _diabetes_raw()
    X = PolynomialFeatures(2, include_bias=False).fit_transform(X / X.std(0))
    e64 = SparseLinearRegression(alpha=0.5, tol=1e-8).fit(X, y)
    e32 = SparseLinearRegression(alpha=0.5, tol=1e-8).fit(X.astype(np.float32), y)
    assert e32.coef_.dtype == np.float32 and np.asarray(e32.intercept_).dtype == np.float32
    np.testing.assert_allclose(e32.coef_, e64.coef_, rtol=1e-3, atol=1e-3)
    assert e32.predict(X.astype(np.float32)).dtype == np.float32
    Xc, yc = load_breast_cancer(return_X_y=True)
    c32 = SparseLogisticRegression(alpha=0.01).fit(Xc.astype(np.float32), yc)
    assert c32.coef_.dtype == np.float32 and c32.intercept_.dtype == np.float32
