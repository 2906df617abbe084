"""The last classes of bad input to the linear estimators, each refused naming the argument:
complex or text ``penalty_weights`` (a ``TypeError``; numpy's casting warning or message
before), a subnormal design (infinite coefficients and an overflow warning before), NaN in
``regularization_path``'s ``X`` ("Input contains NaN" before), a quantile smoothing wider than
every residual (a ``ZeroDivisionError`` before), and a NaN data loss given to
``Sparsifier.check_balance`` (``inf`` before)."""

import warnings

import numpy as np
import pytest

from dualdrop.linear import SparseLinearRegression, SparseQuantileRegression, regularization_path


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6))
    return X, X[:, 0] + 0.1 * rng.normal(size=40)


@pytest.mark.parametrize("weights", [np.ones(6) * (1 + 1j), ["a"] * 6])
def test_complex_or_text_penalty_weights_are_type_errors(weights):
    X, y = _data()
    est = SparseLinearRegression(alpha=0.01, penalty_weights=weights)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="^penalty_weights must"):
            est.fit(X, y)
    assert not hasattr(est, "coef_")


def test_nan_and_negative_penalty_weights_are_named():
    X, y = _data()
    with pytest.raises(ValueError, match="penalty_weights contains NaN"):
        SparseLinearRegression(penalty_weights=[1, 1, np.nan, 1, 1, 1]).fit(X, y)
    with pytest.raises(ValueError, match="penalty_weights must be >= 0.*-1.0"):
        SparseLinearRegression(penalty_weights=[1, 1, -1, 1, 1, 1]).fit(X, y)
    inf_ok = SparseLinearRegression(alpha=0.01, penalty_weights=[1, np.inf, 1, 1, 1, 1])
    assert inf_ok.fit(X, y).coef_[1] == 0.0  # inf: the feature is excluded


@pytest.mark.parametrize("scaling", ["dropout", "none"])
def test_a_subnormal_design_is_refused_naming_x(scaling):
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="X has subnormal columns.*multiply X"):
            SparseLinearRegression(alpha=0.01, scaling=scaling).fit(X * 1e-320, y)
    tiny = SparseLinearRegression(alpha=0.01).fit(X * 1e-300, y)  # normal numbers: fitted
    ref = SparseLinearRegression(alpha=0.01).fit(X, y)
    np.testing.assert_allclose(tiny.coef_ * 1e-300, ref.coef_, rtol=1e-6, atol=1e-12)


def test_nan_in_the_path_design_names_x():
    X, y = _data()
    X[3, 2] = np.nan
    with pytest.raises(ValueError, match="X contains NaN"):
        regularization_path(X, y)


def test_a_quantile_smoothing_wider_than_every_residual_is_refused():
    X, y = _data()
    with pytest.raises(ValueError, match="smoothing=1e\\+300 is above"):
        SparseQuantileRegression(smoothing=1e300).fit(X, y)


def test_check_balance_refuses_a_nan_loss():
    import torch

    from dualdrop.nn import sparsify

    sp = sparsify(torch.nn.Sequential(torch.nn.Linear(4, 3)), "logsum")
    for bad in (float("nan"), float("inf"), torch.tensor(float("nan"))):
        with pytest.raises(ValueError, match="data_loss must be a finite number"):
            sp.check_balance(bad, n_train=100)
    assert sp.check_balance(1.0, n_train=100) >= 0.0
