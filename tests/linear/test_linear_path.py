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


def test_mcp_lam_following_alpha_is_skglm_mcp_and_alpha_max():
    """``{"lam": "alpha"}``: alpha * Omega is skglm's MCPenalty(alpha, gamma=a)."""
    skglm = pytest.importorskip("skglm")
    from skglm.datafits import Quadratic as SkQuad
    from skglm.penalties import MCPenalty
    from skglm.solvers import AndersonCD

    X, y = load_diabetes(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    y = y - y.mean()
    prm = {"a": 3.0, "lam": "alpha"}
    am = alpha_max(X, y, "mcp", prm, fit_intercept=False)
    assert np.isclose(am, np.max(np.abs(X.T @ y)) / len(y), rtol=1e-9)
    from dualdrop.linear import Problem, Quadratic
    from dualdrop.linear._penalty import resolve_penalty

    for frac in (0.5, 0.1, 0.02):
        alpha = frac * am
        ours = SparseLinearRegression("mcp", prm, alpha=alpha, fit_intercept=False,
                                      tol=1e-10).fit(X, y)
        pen = MCPenalty(alpha, 3.0)
        ref = skglm.GeneralizedLinearEstimator(
            SkQuad(), pen, AndersonCD(tol=1e-12, fit_intercept=False)).fit(X, y)
        # same objective: skglm's penalty value equals ours at both points, and skglm's solution
        # is a stationary point of our problem (nonconvex: the two may be different minima)
        pr = Problem(X, y, Quadratic(), resolve_penalty("mcp", prm, alpha),
                     alpha, fit_intercept=False)
        for w in (ours.coef_, ref.coef_):
            assert np.isclose(pr.penalty_value(w), pen.value(w), rtol=1e-12)
        assert pr.criterion(ref.coef_, 0.0) <= 1e-8
        assert pr.criterion(ours.coef_, 0.0) <= 1e-8
    # the concavity region moves with alpha: a fixed-lam fit differs once |w| > a lam matters
    fixed = SparseLinearRegression("mcp", {"a": 3.0, "lam": 1.0}, alpha=0.02 * am,
                                   fit_intercept=False, tol=1e-10).fit(X, y)
    assert not np.allclose(fixed.coef_, ours.coef_, atol=1e-3)
