"""Which solvers return exact zeros: cvxpy's polished point has the support of coordinate descent
(also on data in large units, where its interior-point residues sit below the stopping rule),
and the solvers the docs list as giving exact zeros do."""

from __future__ import annotations

import numpy as np
import pytest

from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression


def _regression(scale_x=1.0, scale_y=1.0):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 50))
    w = np.zeros(50)
    w[:5] = [3.0, -2.0, 1.5, 1.0, -1.0]
    y = X @ w + 0.5 * rng.standard_normal(200)
    return X * scale_x, y * scale_y


@pytest.mark.parametrize("scale_x, scale_y", [(1.0, 1.0), (10.0, 1e4), (1.0, 1e4)])
def test_cvxpy_polished_to_the_support_of_cd(scale_x, scale_y):
    X, y = _regression(scale_x, scale_y)
    alpha = 0.1 * scale_y  # the same problem in other units (the penalty acts on ||x_j|| w_j)
    cd = SparseLinearRegression(penalty="l1", alpha=alpha, solver="cd", tol=1e-10).fit(X, y)
    cv = SparseLinearRegression(penalty="l1", alpha=alpha, solver="cvxpy").fit(X, y)
    assert np.count_nonzero(cd.coef_) <= 6
    np.testing.assert_array_equal(cv.coef_ != 0, cd.coef_ != 0)
    f_cd, f_cv = np.ravel(cd.objective_)[-1], np.ravel(cv.objective_)[-1]
    assert abs(f_cv - f_cd) <= 1e-7 * f_cd
    # the unpolished interior point is kept, and it is not sparse
    raw = SparseLinearRegression(penalty="l1", alpha=alpha, solver="cvxpy",
                                 solver_params={"polish": False}).fit(X, y)
    assert np.count_nonzero(raw.coef_) > np.count_nonzero(cv.coef_)


def test_cvxpy_polish_positive_and_logistic():
    X, y = _regression()
    cd = SparseLinearRegression(penalty="l1", alpha=0.05, positive=True, tol=1e-10).fit(X, y)
    cv = SparseLinearRegression(penalty="l1", alpha=0.05, positive=True, solver="cvxpy").fit(X, y)
    np.testing.assert_array_equal(cv.coef_ != 0, cd.coef_ != 0)
    labels = (y > 0).astype(int)
    cd = SparseLogisticRegression(penalty="l1", alpha=0.05, tol=1e-10).fit(X * 10, labels)
    cv = SparseLogisticRegression(penalty="l1", alpha=0.05, solver="cvxpy").fit(X * 10, labels)
    np.testing.assert_array_equal(cv.coef_ != 0, cd.coef_ != 0)


@pytest.mark.parametrize("solver", ["cd", "cvxpy", "reweighted_l1"])
def test_solvers_documented_as_exact_zeros_give_them(solver):
    X, y = _regression(10.0, 1e4)
    est = SparseLinearRegression(penalty="l1", alpha=1e3, solver=solver).fit(X, y)
    assert 5 <= np.count_nonzero(est.coef_) <= 6
