"""Extreme but finite scales are solved (the problems are scale-free) or refused naming the
argument, never answered with all-zero coefficients; parameters are checked on one path for
the estimators and the path functions; a refused call leaves the estimator as it was."""

import numpy as np
import pytest
import scipy.sparse as sp

from dualdrop.linear import (SparseLinearRegression, SparseLinearRegressionCV,
                             SparseLogisticRegression, SparseMultiTaskRegression, alpha_max,
                             multitask_alpha_max, regularization_path)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 8)) * rng.uniform(0.5, 3.0, 8) + rng.uniform(-1, 1, 8)
    w = np.array([2.0, -1.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0])
    y = X @ w + 0.3 * rng.standard_normal(60)
    return X, y, (y > np.median(y)).astype(int), rng.uniform(0.5, 2.0, 60)


def _close(a, b, rtol=1e-6):
    scale = max(np.max(np.abs(b)), 1e-300)
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("c", [1e155, 1e-170, 1e300, 1e-300])
@pytest.mark.parametrize("sparse", [False, True])
def test_regression_is_equivariant_in_the_scale_of_x(data, c, sparse):
    X, y, _, sw = data
    ref = SparseLinearRegression(alpha=0.05, tol=1e-10).fit(X, y, sample_weight=sw)
    Xc = sp.csc_matrix(X * c) if sparse else X * c
    est = SparseLinearRegression(alpha=0.05, tol=1e-10).fit(Xc, y, sample_weight=sw)
    assert np.count_nonzero(est.coef_) == np.count_nonzero(ref.coef_) > 0
    _close(est.coef_ * c, ref.coef_)
    assert est.intercept_ == pytest.approx(ref.intercept_, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("d", [1e300, 1e-300, 1e120, 1e-120])
def test_regression_is_equivariant_in_the_scale_of_y(data, d):
    X, y, _, _ = data
    ref = SparseLinearRegression(alpha=0.05, tol=1e-10).fit(X, y)
    est = SparseLinearRegression(alpha=0.05 * d, tol=1e-10).fit(X, y * d)
    _close(est.coef_ / d, ref.coef_)
    assert est.intercept_ / d == pytest.approx(ref.intercept_, rel=1e-6)
    # a penalty with a scale: LogSum(eps d) at alpha d^2 is the same problem in other units
    d2 = d if abs(np.log10(d)) < 150 else np.sqrt(d)
    ref = SparseLinearRegression("logsum", {"eps": 0.5}, alpha=0.05, tol=1e-10).fit(X, y)
    est = SparseLinearRegression("logsum", {"eps": 0.5 * d2}, alpha=0.05 * d2 * d2,
                                 tol=1e-10).fit(X, y * d2)
    _close(est.coef_ / d2, ref.coef_)


def test_a_penalty_without_a_scale_is_refused_at_an_extreme_y(data):
    X, y, _, _ = data
    with pytest.raises(ValueError, match="y has magnitude.*VarDrop.*no scale parameter"):
        SparseLinearRegression("vardrop").fit(X, y * 1e300)
    SparseLinearRegression("vardrop").fit(X, y * 1e50)  # inside the band: computed as given


def test_scaling_none_in_extreme_units(data):
    X, y, labels, _ = data
    for c in (1e155, 1e-170):
        ref = SparseLinearRegression(alpha=0.05, scaling="none", tol=1e-10).fit(X, y)
        # the penalty on w' = w / c: alpha |w| = alpha c |w'|
        est = SparseLinearRegression(alpha=0.05 * c, scaling="none", tol=1e-10).fit(X * c, y)
        _close(est.coef_ * c, ref.coef_)
        ref = SparseLogisticRegression(alpha=0.01, scaling="none", tol=1e-10).fit(X, labels)
        est = SparseLogisticRegression(alpha=0.01 * c, scaling="none", tol=1e-10).fit(X * c, labels)
        _close(est.coef_ * c, ref.coef_, 1e-5)
    wide = X.copy()
    wide[:, 0] *= 1e200
    wide[:, 1] *= 1e-200
    with pytest.raises(ValueError, match="columns of X.*scaling='dropout'"):
        SparseLinearRegression(scaling="none").fit(wide, y)
    est = SparseLinearRegression(alpha=0.05).fit(wide, y)  # dropout scaling: any column scale
    assert est.coef_[0] * 1e200 == pytest.approx(
        SparseLinearRegression(alpha=0.05).fit(X, y).coef_[0], rel=1e-6)


@pytest.mark.parametrize("c", [1e155, 1e-170])
def test_logistic_is_equivariant_in_the_scale_of_x(data, c):
    X, _, labels, sw = data
    ref = SparseLogisticRegression(alpha=0.01, tol=1e-10).fit(X, labels, sample_weight=sw)
    est = SparseLogisticRegression(alpha=0.01, tol=1e-10).fit(X * c, labels, sample_weight=sw)
    assert np.count_nonzero(est.coef_) > 0
    _close(est.coef_ * c, ref.coef_, 1e-5)


def test_sample_weight_whose_sum_overflows(data):
    X, y, labels, sw = data
    ref = SparseLinearRegression(alpha=0.05).fit(X, y, sample_weight=sw)
    with np.errstate(over="ignore"):
        assert np.isinf(np.sum(sw * 1e307))
    est = SparseLinearRegression(alpha=0.05).fit(X, y, sample_weight=sw * 1e307)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-12)
    ref = SparseLogisticRegression().fit(X, labels, sample_weight=sw)
    est = SparseLogisticRegression().fit(X, labels, sample_weight=sw * 1e307)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-10)
    ref = SparseLinearRegression(alpha=0.05).fit(X, y, sample_weight=sw)
    est = SparseLinearRegression(alpha=0.05).fit(X, y, sample_weight=sw * 1e-310)  # subnormal
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-6)


def test_paths_and_alpha_max_in_extreme_units(data):
    X, y, labels, _ = data
    for c in (1e155, 1e-170):
        assert alpha_max(X * c, y) == pytest.approx(alpha_max(X, y), rel=1e-12)
        assert alpha_max(X, y * c) == pytest.approx(c * alpha_max(X, y), rel=1e-12)
        assert alpha_max(X * c, labels, datafit="logistic") == pytest.approx(
            alpha_max(X, labels, datafit="logistic"), rel=1e-12)
        mcp = {"a": 3.0, "lam": "alpha"}
        assert alpha_max(X, y * c, "mcp", mcp) == pytest.approx(c * alpha_max(X, y, "mcp", mcp),
                                                               rel=1e-9)
        ref = regularization_path(X, y, n_alphas=5, tol=1e-10)
        got = regularization_path(X * c, y, n_alphas=5, tol=1e-10)
        _close(got["coefs"] * c, ref["coefs"])
    Y = np.column_stack([y, -2 * y])
    ref = SparseMultiTaskRegression(alpha=0.05, tol=1e-10).fit(X, Y)
    got = SparseMultiTaskRegression(alpha=0.05 * 1e300, tol=1e-10).fit(X, Y * 1e300)
    _close(got.coef_ / 1e300, ref.coef_)
    assert multitask_alpha_max(X, Y * 1e300) == pytest.approx(1e300 * multitask_alpha_max(X, Y),
                                                              rel=1e-12)


# ------------------------------------------------------------------------------------------------
# one validation path
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    ({"fit_intercept": "no"}, "fit_intercept"), ({"scaling": "bogus"}, "scaling"),
    ({"l1_ratio": True}, "l1_ratio"), ({"datafit": "tweedie"}, "datafit"),
    ({"penalty": 3}, "penalty"), ({"sample_weight": -1.0}, "sample_weight"),
])
def test_alpha_max_checks_its_arguments_as_the_estimators_do(data, kwargs, name):
    X, y, _, _ = data
    with pytest.raises(ValueError, match=f"'{name}' parameter of alpha_max"):
        alpha_max(X, y, **kwargs)


def test_logistic_functions_refuse_a_continuous_target(data):
    X, y, _, _ = data
    for call in (lambda: alpha_max(X, y, datafit="logistic"),
                 lambda: regularization_path(X, y, datafit="logistic", n_alphas=3),
                 lambda: SparseLogisticRegression().fit(X, y)):
        with pytest.raises(ValueError, match="y must hold class labels.*SparseLinearRegression"):
            call()


@pytest.mark.parametrize("kwargs, name", [
    ({"n_jobs": 0}, "n_jobs"), ({"tol": True}, "tol"), ({"n_alphas": True}, "n_alphas"),
    ({"max_iter": 0}, "max_iter"), ({"alpha_min_ratio": 1.5}, "alpha_min_ratio"),
])
def test_regularization_path_checks_its_arguments(data, kwargs, name):
    X, y, _, _ = data
    with pytest.raises(ValueError, match=f"'{name}' parameter of regularization_path"):
        regularization_path(X, y, **kwargs)


def test_regularization_path_reads_n_jobs_as_joblib_does(data):
    X, y, _, _ = data
    ref = regularization_path(X, y, n_alphas=4, tol=1e-12)
    got = regularization_path(X, y, n_alphas=4, n_jobs=-1, tol=1e-12)  # chunks warm-start apart
    np.testing.assert_allclose(got["coefs"], ref["coefs"], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name, value", [("alpha", True), ("max_iter", True), ("tol", False),
                                         ("l1_ratio", np.True_)])
def test_booleans_are_not_numbers(data, name, value):
    X, y, _, _ = data
    with pytest.raises(ValueError, match=f"'{name}' parameter of SparseLinearRegression"):
        SparseLinearRegression(**{name: value}).fit(X, y)
    cv_name = "eps" if name == "alpha" else name  # the CV estimators choose alpha
    with pytest.raises(ValueError, match=f"'{cv_name}' parameter of SparseLinearRegressionCV"):
        SparseLinearRegressionCV(**{cv_name: value}).fit(X, y)


# ------------------------------------------------------------------------------------------------
# a refused call leaves the estimator as it was
# ------------------------------------------------------------------------------------------------
def _state(est):
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
            for k, v in vars(est).items()}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        elif k != "objective_":
            assert a[k] == b[k] or (a[k] is b[k]), k


def test_refit_with_one_class_leaves_the_classifier_as_it_was(data):
    X, _, labels, _ = data
    clf = SparseLogisticRegression().fit(X, labels)
    before, pred = _state(clf), clf.predict(X)
    with pytest.raises(ValueError, match="only one class"):
        clf.fit(X[:, :5], np.zeros(60))
    _same(_state(clf), before)
    np.testing.assert_array_equal(clf.predict(X), pred)  # it used to raise IndexError


@pytest.mark.parametrize("bad", [
    lambda X, y: (X, y, -np.ones(60)),  # negative weights
    lambda X, y: (X[:, :3], y * np.nan, None),  # NaN target, other width
    lambda X, y: (X[:, :3], y * 1e300, None),  # a penalty without a scale at an extreme y
])
def test_refused_fits_leave_the_regressor_as_it_was(data, bad):
    X, y, _, _ = data
    est = SparseLinearRegression("vardrop", alpha=0.05).fit(X, y)
    before, pred = _state(est), est.predict(X)
    Xb, yb, swb = bad(X, y)
    with pytest.raises(ValueError):
        est.fit(Xb, yb, sample_weight=swb)
    _same(_state(est), before)
    np.testing.assert_array_equal(est.predict(X), pred)


def test_refused_set_params_changes_nothing():
    est = SparseLinearRegression(penalty="logsum", penalty_params={"eps": 2.0})
    before = est.get_params()
    with pytest.raises(ValueError):
        est.set_params(alpha=5.0, penalty="mcp", bogus=1)
    with pytest.raises(ValueError):
        est.set_params(alpha=5.0, penalty__eps=3.0)  # a name, not an object: refused
    assert est.get_params() == before


def test_refused_cv_fit_leaves_the_cv_estimator_as_it_was(data):
    X, y, _, _ = data
    cv = SparseLinearRegressionCV(alphas=5, cv=3).fit(X, y)
    before = _state(cv)
    with pytest.raises(ValueError):
        cv.fit(X, y, sample_weight=-np.ones(60))
    _same(_state(cv), before)
