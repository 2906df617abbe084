"""Raw, unstandardized real data (scikit-learn's bundled sets, columns spanning ~6 orders of
magnitude) against skglm and scikit-learn at tight tolerance."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.linear_model import LogisticRegression

from dualdrop.linear import SparseLogisticRegression

skglm = pytest.importorskip("skglm")
from skglm.datafits import Logistic as SkLogistic  # noqa: E402
from skglm.penalties import L1 as SkL1  # noqa: E402
from skglm.solvers import ProxNewton  # noqa: E402


def _logistic_obj(X, yy, w, b, pen):
    z = X @ w + b
    return float(np.mean(np.logaddexp(0.0, -yy * z)) + pen)


def _skglm_l1_logistic(X, yy, alpha, fit_intercept=True):
    from skglm import GeneralizedLinearEstimator

    est = GeneralizedLinearEstimator(SkLogistic(), SkL1(alpha),
                                     ProxNewton(tol=1e-12, max_iter=500,
                                                fit_intercept=fit_intercept)).fit(X, yy)
    return est.coef_.ravel(), float(np.ravel(est.intercept_)[0]) if fit_intercept else 0.0


@pytest.mark.parametrize("loader", [load_breast_cancer, load_wine], ids=["breast_cancer", "wine"])
@pytest.mark.parametrize("scaling", ["none", "dropout"])
def test_raw_logistic_l1_matches_skglm(loader, scaling):
    X, y = loader(return_X_y=True)
    alpha = 0.01
    est = SparseLogisticRegression(alpha=alpha, scaling=scaling, tol=1e-8).fit(X, y)
    s = np.ones(X.shape[1]) if scaling == "none" else np.sqrt((X ** 2).mean(axis=0))
    Xs = X / s  # dropout scaling = plain l1 on columns scaled to unit mean square
    targets = est.classes_[1:] if est.classes_.size == 2 else est.classes_
    for k, cls in enumerate(targets):
        yy = np.where(y == cls, 1.0, -1.0)
        w_ref, b_ref = _skglm_l1_logistic(Xs, yy, alpha)
        ref = _logistic_obj(Xs, yy, w_ref, b_ref, alpha * np.abs(w_ref).sum())
        w = est.coef_[k] * s
        ours = _logistic_obj(Xs, yy, w, est.intercept_[k], alpha * np.abs(w).sum())
        assert ours - ref <= 1e-9 * ref, (cls, ours, ref)
        np.testing.assert_array_equal(w != 0, w_ref != 0)
    assert np.all(est.criterion_ <= 1e-8)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:Inconsistent values:UserWarning")
def test_raw_logistic_l1_no_intercept_matches_liblinear():
    """liblinear solves C sum_i log(1 + exp(-y_i x_i w)) + ||w||_1 exactly (no intercept):
    the same problem with C = 1 / (n alpha)."""
    X, y = load_breast_cancer(return_X_y=True)
    X = X[:, :10]
    alpha = 0.02
    ours = SparseLogisticRegression(alpha=alpha, scaling="none", fit_intercept=False,
                                    tol=1e-9).fit(X, y)
    ref = LogisticRegression(penalty="l1", solver="liblinear", C=1.0 / (X.shape[0] * alpha),
                             fit_intercept=False, tol=1e-12, max_iter=100000).fit(X, y)
    yy = np.where(y == 1, 1.0, -1.0)
    o = _logistic_obj(X, yy, ours.coef_[0], 0.0, alpha * np.abs(ours.coef_).sum())
    r = _logistic_obj(X, yy, ref.coef_[0], 0.0, alpha * np.abs(ref.coef_).sum())
    assert o <= r * (1 + 1e-7), (o, r)
