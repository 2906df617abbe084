"""Bad inputs get a ValueError that names the argument and the fix (not NumPy's conversion error)."""

import numpy as np
import pytest

from dualdrop.linear import (SparseLinearRegression, SparseLinearRegressionCV,
                             SparseLogisticRegression, SparseMultiTaskRegression, alpha_max,
                             regularization_path)

rng = np.random.default_rng(0)
X = rng.standard_normal((20, 3))
y = X @ np.array([1.0, 0.0, -2.0])
X_TEXT = np.array([["a", "b", "c"]] * 20, dtype=object)


@pytest.mark.parametrize("fit", [
    lambda yy: SparseLinearRegression().fit(X, yy),
    lambda yy: SparseLinearRegressionCV(alphas=3, cv=2).fit(X, yy),
    lambda yy: regularization_path(X, yy, n_alphas=3),
    lambda yy: alpha_max(X, yy),
])
def test_text_target_for_regression_names_y_and_the_fix(fit):
    with pytest.raises(ValueError, match=r"y must be numeric.*'a'.*astype\(float\).*"
                                         r"SparseLogisticRegression"):
        fit(np.array(["a"] * 20))


@pytest.mark.parametrize("fit", [
    lambda XX: SparseLinearRegression().fit(XX, y),
    lambda XX: SparseLogisticRegression().fit(XX, np.arange(20) % 2),
    lambda XX: SparseMultiTaskRegression().fit(XX, np.c_[y, y]),
    lambda XX: regularization_path(XX, y, n_alphas=3),
])
def test_text_design_names_x_dtype_and_the_fix(fit):
    with pytest.raises(ValueError, match=r"X must be numeric.*'a'.*dtype object.*OneHotEncoder"):
        fit(X_TEXT)
    with pytest.raises(ValueError, match=r"X must be numeric.*'a'"):  # a list of lists
        fit(X_TEXT.tolist())


def test_numbers_stored_as_text_or_object_are_accepted_as_before():
    ref = SparseLinearRegression(alpha=0.01).fit(X, y).coef_
    got = SparseLinearRegression(alpha=0.01).fit(X.astype(str).astype(object), y.astype(str))
    np.testing.assert_allclose(got.coef_, ref, rtol=1e-12)


def test_string_class_labels_stay_valid_for_logistic():
    labels = np.where(y > 0, "pos", "neg")
    assert set(SparseLogisticRegression().fit(X, labels).classes_) == {"neg", "pos"}


def test_dict_entry_keeps_numpys_type_error():  # scikit-learn's check_dtype_object expects it
    Xo = X.astype(object)
    Xo[0, 0] = {"foo": "bar"}
    with pytest.raises(TypeError, match="argument must be a string.* number"):
        SparseLinearRegression().fit(Xo, y)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_path_names_y_for_a_non_finite_target(bad):
    yy = y.copy()
    yy[4] = bad
    with pytest.raises(ValueError, match=r"^y contains NaN or infinity \(first at index 4\); "
                                         r"remove those samples or impute"):
        regularization_path(X, yy, n_alphas=3)
