"""alpha_max for every kind of penalty and for multiclass logistic; path input handling."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_diabetes, load_wine
from sklearn.exceptions import ConvergenceWarning

from dualdrop.linear import (SparseLinearRegression, SparseLogisticRegression, alpha_max,
                             regularization_path)


@pytest.mark.parametrize("pen,prm", [
    ("l1", None), ("lp", {"p": 0.5}), ("lp", {"p": 0.2}), ("mcp", {"a": 3.0, "lam": 1.0}),
    ("scad", {"a": 3.7, "lam": 1.0}), ("logsum", {"eps": 1.0}), ("hardconcrete", None),
])
def test_alpha_max_is_the_threshold_of_the_empty_model(pen, prm):
    X, y = load_diabetes(return_X_y=True)
    X = X[:, :6]
    am = alpha_max(X, y, pen, prm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert not np.any(SparseLinearRegression(pen, prm, alpha=am).fit(X, y).coef_)
        assert np.any(SparseLinearRegression(pen, prm, alpha=am * (1 - 1e-3)).fit(X, y).coef_)


def test_alpha_max_lp_below_one_is_the_prox_jump_not_the_l1_value():
    X, y = load_diabetes(return_X_y=True)
    a1, ah = alpha_max(X, y, "l1"), alpha_max(X, y, "lp", {"p": 0.5})
    # the catalog's Lp(1/2) is Omega = 2 |w|^(1/2); on unit columns the prox of
    # t |w|^(1/2) is 0 iff |v| <= (3/2) t^(2/3), so w = 0 is kept iff ||g||_inf <= 1.5 (2 alpha)^(2/3)
    assert np.isclose(ah, (a1 / 1.5) ** 1.5 / 2.0, rtol=1e-9)


def test_multiclass_logistic_alpha_max_covers_all_classes_and_string_labels():
    X, y = load_wine(return_X_y=True)
    labels = np.array(["barolo", "grignolino", "barbera"])[y]
    am = alpha_max(X, labels, datafit="logistic")
    per_class = [alpha_max(X, (labels == c).astype(int), datafit="logistic")
                 for c in np.unique(labels)]
    assert np.isclose(am, max(per_class), rtol=1e-12)
    assert not np.any(SparseLogisticRegression(alpha=am).fit(X, labels).coef_)
    assert np.any(SparseLogisticRegression(alpha=am * 0.99).fit(X, labels).coef_)
    path = regularization_path(X, labels, datafit="logistic", n_alphas=4, alpha_min_ratio=0.1)
    assert path["coefs"].shape == (4, 3, 13)
    assert not np.any(path["coefs"][0]) and np.any(path["coefs"][-1])


def test_mismatched_lengths_raise_valueerror():
    X, y = load_diabetes(return_X_y=True)
    with pytest.raises(ValueError, match="X has 442 samples but y has 441"):
        alpha_max(X, y[:-1])
    with pytest.raises(ValueError, match="X has 442 samples but y has 441"):
        regularization_path(X, y[:-1], n_alphas=3)
