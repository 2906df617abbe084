"""SparseLinearRegressionCV / SparseLogisticRegressionCV against scikit-learn's LassoCV and
LogisticRegressionCV on the same folds and grid; clone/get_params; errors naming the argument."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from joblib import parallel_config
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine
from sklearn.linear_model import LassoCV, LogisticRegressionCV
from sklearn.model_selection import KFold

from dualdrop.linear import (SparseLinearRegression, SparseLinearRegressionCV,
                             SparseLogisticRegressionCV, expected_failed_checks)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_lasso_cv_on_raw_diabetes(sparse, weighted):
    X, y = load_diabetes(return_X_y=True, scaled=False)
    sw = np.random.default_rng(0).integers(0, 4, X.shape[0]).astype(float) if weighted else None
    XX = sp.csc_matrix(X) if sparse else X
    ref = LassoCV(alphas=12, eps=1e-3, tol=1e-13, max_iter=200000).fit(XX, y, sample_weight=sw)
    ours = SparseLinearRegressionCV(alphas=12, eps=1e-3, scaling="none", tol=1e-9,
                                    max_iter=2000).fit(XX, y, sample_weight=sw)
    np.testing.assert_allclose(ours.alphas_, ref.alphas_, rtol=1e-12)
    np.testing.assert_allclose(ours.mse_path_, ref.mse_path_, rtol=1e-7)
    assert ours.alpha_ == pytest.approx(ref.alpha_, rel=1e-12)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6, atol=1e-6)
    assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-7)
    assert ours.predict(X[:3]) == pytest.approx(ref.predict(X[:3]), rel=1e-7)


def test_logistic_cv_matches_logistic_regression_cv_standardized():
    # same folds (equal training sizes: 448) and grid: scikit-learn's C on n_train samples is
    # alpha = 1 / (C n_train); the ridge penalty (l1_ratio=0) lets lbfgs converge tightly
    X, y = load_breast_cancer(return_X_y=True)
    X, y = X[:560], y[:560]
    X = (X - X.mean(0)) / X.std(0)
    cv = KFold(5, shuffle=True, random_state=0)
    Cs = np.logspace(-3, 0, 6)
    ref = LogisticRegressionCV(Cs=Cs, l1_ratios=(0.0,), cv=cv, scoring="neg_log_loss",
                               tol=1e-10, max_iter=100000, use_legacy_attributes=False).fit(X, y)
    ours = SparseLogisticRegressionCV(alphas=1.0 / (Cs * 448), l1_ratio=0.0, cv=cv,
                                      scaling="none", tol=1e-10).fit(X, y)
    np.testing.assert_allclose(ours.scores_, np.squeeze(ref.scores_), rtol=1e-6)
    assert 1.0 / (ours.alpha_ * 448) == pytest.approx(ref.C_, rel=1e-12)


def test_logistic_cv_l1_on_raw_multiclass_wine():
    X, y = load_wine(return_X_y=True)  # raw: proline ~ 750, hue ~ 1; three classes
    y = np.array(["a", "b", "c"])[y]
    est = SparseLogisticRegressionCV(alphas=6, eps=1e-2, cv=3, tol=1e-8)
    est.fit(X, y)
    assert est.scores_.shape == (3, 6) and est.coef_.shape == (3, X.shape[1])
    assert est.alpha_ in est.alphas_ and est.alphas_[0] > est.alphas_[-1]
    # the first alpha is alpha_max: every fold's first model is (almost) empty, so its score is
    # the worst; the chosen model is sparse and predicts the labels
    assert np.all(est.scores_[:, 0] < est.scores_.max(axis=1))
    assert set(est.predict(X)) <= {"a", "b", "c"} and est.score(X, y) > 0.9
    # a scorer of scikit-learn by name
    acc = SparseLogisticRegressionCV(alphas=4, eps=1e-2, cv=3, scoring="accuracy").fit(X, y)
    assert np.all((acc.scores_ >= 0) & (acc.scores_ <= 1))


def test_n_jobs_and_splitter_give_the_same_result():
    X, y = load_diabetes(return_X_y=True)
    a = SparseLinearRegressionCV(alphas=8, cv=KFold(4), tol=1e-8).fit(X, y)
    with parallel_config(backend="threading"):  # process workers take seconds to start
        b = SparseLinearRegressionCV(alphas=8, cv=4, n_jobs=2, tol=1e-8).fit(X, y)
    np.testing.assert_allclose(a.mse_path_, b.mse_path_, rtol=1e-12)
    assert a.alpha_ == b.alpha_
    # the refit is the single-fit estimator at alpha_
    single = SparseLinearRegression(alpha=a.alpha_, tol=1e-8).fit(X, y)
    np.testing.assert_allclose(a.coef_, single.coef_, rtol=1e-12)


def test_clone_get_params_and_nonconvex_penalty():
    est = SparseLinearRegressionCV(penalty="mcp", penalty_params={"a": 3.0, "lam": "alpha"},
                                   alphas=5, cv=3, l1_ratio=0.8)
    params = est.get_params()
    assert params["penalty"] == "mcp" and params["alphas"] == 5 and params["l1_ratio"] == 0.8
    c = clone(est)
    assert c.get_params() == params and c is not est
    X, y = load_diabetes(return_X_y=True)
    c.fit(X, y)
    assert c.mse_path_.shape == (5, 3) and np.isfinite(c.mse_path_).all()
    assert not hasattr(est, "alpha_")


def test_errors_name_the_argument():
    X, y = load_diabetes(return_X_y=True)
    for kw, name in [({"alphas": 0}, "alphas"), ({"alphas": [[1.0, 2.0]]}, "alphas"),
                     ({"alphas": [-1.0]}, "alphas"), ({"eps": 2.0}, "eps"),
                     ({"cv": "five"}, "cv"), ({"l1_ratio": -0.1}, "l1_ratio"),
                     ({"penalty": "nope"}, "nope")]:
        with pytest.raises(ValueError, match=name):
            SparseLinearRegressionCV(**kw).fit(X, y)
    with pytest.raises(ValueError, match="sample_weight"):
        SparseLinearRegressionCV(alphas=3).fit(X, y, sample_weight=-np.ones(X.shape[0]))
    with pytest.raises(ValueError, match="scoring"):
        SparseLogisticRegressionCV(scoring=3).fit(X, y > 150)
    with pytest.raises(ValueError, match="2 classes"):
        SparseLogisticRegressionCV(alphas=3).fit(X, np.zeros(X.shape[0]))


@pytest.mark.parametrize("est", [SparseLinearRegressionCV(alphas=2, cv=2),
                                 SparseLogisticRegressionCV(alphas=2, cv=2)],
                         ids=lambda e: type(e).__name__)
def test_check_estimator(est):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils.estimator_checks import check_estimator

    # as for scikit-learn's LassoCV: repeating rows moves them between folds, so a weighted
    # and a repeated data set are cross-validated on different splits
    xfail = expected_failed_checks(est)
    assert set(xfail) == {f"check_sample_weight_equivalence_on_{k}_data"
                          for k in ("dense", "sparse")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check_estimator(est, expected_failed_checks=xfail)
