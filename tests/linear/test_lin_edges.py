"""The last unclear and silent inputs of the linear estimators: sample weights that are not real
numbers, a huge max_iter, folds or classes that the weights empty, a binary scorer with three
classes, alpha_max of a constraint, a smoothing below float precision, feature names through the
CV estimators, a group fit whose working set is empty; and the scale check's shortcut (its
answer equals the full column-RMS computation's). Each case failed (a raw NumPy or Python error,
a 7 TiB allocation, a silent cast or intercept of -460, minutes of work) before the fix."""

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from dualdrop.linear import (SparseGLMCV, SparseHuberRegression, SparseLinearRegression,
                             SparseLinearRegressionCV, SparseLogisticRegression,
                             SparseLogisticRegressionCV, SparseMultinomialRegression,
                             SparsePoissonRegression, SparseQuantileRegression, alpha_max,
                             regularization_path)
from dualdrop.linear._scale import BAND, col_rms, plan_scaling, surely_in_band
from dualdrop.linear.datafits import weighted_col_norms2


def _data(n=40, p=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    return X, X[:, 0] - 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)


def _state(est):
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
            for k, v in vars(est).items()}


BAD_WEIGHTS = {
    "text": (np.array(["a"] * 40), "sample_weight must be numeric, got text such as 'a'"),
    "numbers as text": (["1"] * 40, "numeric, got text such as '1'"),
    "complex": (np.ones(40) + 1j, "must be real, got complex"),
    "complex, zero imaginary part": (np.ones(40) + 0j, "must be real, got complex"),
    "booleans": (np.ones(40, dtype=bool), "got booleans"),
    "objects": (np.array([{}] * 40, dtype=object), "must be real numbers, got dict"),
}


@pytest.mark.parametrize("kind", sorted(BAD_WEIGHTS))
@pytest.mark.parametrize("make", [
    lambda: SparseLinearRegression(alpha=0.1),
    lambda: SparseLogisticRegression(alpha=0.01),
    lambda: SparsePoissonRegression(alpha=0.01),
    lambda: SparseLinearRegressionCV(alphas=3, cv=3),
], ids=["linear", "logistic", "poisson", "cv"])
def test_sample_weights_that_are_not_real_numbers_are_refused(kind, make):
    X, y = _data()
    est = make()
    if isinstance(est, SparseLogisticRegression):
        y = (y > 0).astype(int)
    elif isinstance(est, SparsePoissonRegression):
        y = np.round(np.exp(np.clip(y, -2, 2)))
    est.fit(X, y)
    before = _state(est)
    sw, match = BAD_WEIGHTS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning: nothing is cast
        with pytest.raises(ValueError, match=match):
            est.fit(X, y, sample_weight=sw)
    assert _state(est).keys() == before.keys()
    np.testing.assert_array_equal(_state(est)["coef_"], before["coef_"])


def test_a_huge_max_iter_allocates_what_the_fit_needs():
    X, y = _data()
    est = SparseLinearRegression(alpha=0.01, max_iter=10 ** 12).fit(X, y)  # 7 TiB before
    assert 1 <= len(est.objective_) <= est.n_iter_ + 1
    assert est.objective_[-1] == pytest.approx(
        SparseLinearRegression(alpha=0.01).fit(X, y).objective_[-1], rel=1e-9)
    res = regularization_path(X, y, n_alphas=3, max_iter=10 ** 12)
    assert res["coefs"].shape[0] == 3
    with pytest.raises(ValueError, match="max_iter"):
        SparseLinearRegression(max_iter=2 ** 60).fit(X, y)


def test_history_buffer_keeps_the_last_objective_when_full():
    from dualdrop.linear.solvers import cd

    assert cd.history_buffer(10 ** 12).shape == (cd._HISTORY_CAP + 1,)
    assert cd.history_buffer(5).shape == (6,)


def test_a_fold_whose_weights_are_all_zero_is_refused_before_any_fit():
    X, y = _data()
    sw = np.ones(40)
    sw[:8] = 0.0  # KFold(5) without shuffling: fold 1 tests on samples 0..7 only
    cv = SparseLinearRegressionCV(alphas=3, cv=5)
    with pytest.raises(ValueError, match="sample_weight is 0 on every test sample of "
                                         "cross-validation fold 1 of 5.*shuffle=True"):
        cv.fit(X, y, sample_weight=sw)  # ZeroDivisionError before
    assert not hasattr(cv, "alpha_")
    sw2 = np.zeros(40)
    sw2[:8] = 1.0  # every training sample of fold 1 weighs 0
    with pytest.raises(ValueError, match="every training sample of cross-validation fold 1"):
        cv.fit(X, y, sample_weight=sw2)


def test_a_binary_scorer_with_three_classes_is_refused_naming_scoring():
    X, _ = _data(60)
    y = np.arange(60) % 3
    with pytest.raises(ValueError, match=r"scoring='roc_auc' cannot score this 3-class problem"
                                         r".*roc_auc_ovr"):
        SparseLogisticRegressionCV(alphas=3, cv=3, scoring="roc_auc").fit(X, y)
    est = SparseLogisticRegressionCV(alphas=3, cv=3, scoring="roc_auc_ovr").fit(X, y)
    assert est.scores_.shape == (3, 3)


def test_alpha_max_of_a_constraint_is_refused():
    X, y = _data()
    with pytest.raises(ValueError, match="alpha_max is not defined for penalty='hard_threshold'"):
        alpha_max(X, y, penalty="hard_threshold")  # AttributeError before


def test_quantile_smoothing_below_float_precision_is_refused_at_once():
    X, y = _data()
    est = SparseQuantileRegression(smoothing=5e-324)
    with pytest.raises(ValueError, match=r"smoothing=5e-324 is below 1e-12 times the scale of y"):
        est.fit(X, y)  # minutes of continuation stages before
    assert not hasattr(est, "coef_")
    SparseQuantileRegression(smoothing=1e-9).fit(X, y)


@pytest.mark.parametrize("cls", [SparseMultinomialRegression, SparseLogisticRegression])
def test_weights_that_empty_a_class_are_refused(cls):
    X, _ = _data(60)
    y = np.arange(60) % 3
    sw = np.where(y == 2, 0.0, 1.0)
    with pytest.raises(ValueError, match="sample_weight is 0 on every sample of class 2"):
        cls(alpha=0.01).fit(X, y, sample_weight=sw)  # intercepts of +-460 before


@pytest.mark.parametrize("make,classes", [
    (lambda: SparseLinearRegressionCV(alphas=3, cv=3), False),
    (lambda: SparseLogisticRegressionCV(alphas=3, cv=3), True),
    (lambda: SparseGLMCV(datafit="huber", alphas=3, cv=3), False),
])
def test_cv_estimators_predict_from_a_dataframe_without_a_warning(make, classes):
    X, y = _data()
    df = pd.DataFrame(X, columns=[f"gene_{j}" for j in range(X.shape[1])])
    est = make().fit(df, (y > 0).astype(int) if classes else y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.predict(df)
    np.testing.assert_array_equal(est.estimator_.feature_names_in_, df.columns)
    with pytest.warns(UserWarning, match="feature names"):
        est.predict(X)  # an array to a model fitted with names: scikit-learn's own warning


def test_a_group_fit_whose_working_set_is_empty_updates_the_intercept():
    """A hypothesis case: no group violates its optimality, the intercept does (a target near
    -6.5e12 with a spread of 1e-3): the group solver concatenated an empty list."""
    X = np.array([[3.38109042, 3.], [17.22200813, 3.], [-14.40502189, 3.], [35.06668505, 3.],
                  [-18.92458667, 3.], [-16.76086543, 3.]])
    y = np.array([-6.474175309380423e+12, -6.474175309379492e+12, -6.474175309381218e+12,
                  -6.474175309379015e+12, -6.474175309382009e+12, -6.474175309380510e+12])
    fits = []
    for groups in (None, [[0], [1]]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fits.append(SparseHuberRegression(penalty="mcp", alpha=8.5, tol=1e-8,
                                              groups=groups).fit(X, y))
    for est in fits:
        assert not np.any(est.coef_)
        # every residual within delta: the Huber loss is quadratic there, the intercept the mean
        assert est.intercept_ == pytest.approx(np.mean(y), rel=1e-14)
    assert fits[1].intercept_ == pytest.approx(fits[0].intercept_, rel=1e-14)


# ------------------------------------------------------------------------------------------------
# the scale check: a max-abs bound first, one pass over the stored values for the norms
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["dense", "csc"])
@pytest.mark.parametrize("c", [1.0, 1e-3, 1e70, 1e80, 1e-75, 1e-80])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_band_shortcut_agrees_with_the_full_computation(fmt, c, weighted):
    rng = np.random.default_rng(1)
    X = sp.random(50, 8, density=0.3, random_state=rng, format="csc")
    X.data = (X.data - 0.5) * c
    X = X.toarray() if fmt == "dense" else X
    sw = rng.uniform(0.5, 2.0, 50) if weighted else None
    rms = col_rms(X, sw)
    live = rms[rms > 0]
    really = bool(np.all((live >= 1 / BAND) & (live <= BAND)))
    if surely_in_band(X, sw):
        assert really
    plan = plan_scaling(X, sw, "none", None)
    ref_cx = 1.0 if really else None
    if ref_cx is not None:
        np.testing.assert_array_equal(plan.t, np.ones(8))
    else:
        assert plan.t[0] != 1.0  # rescaled by a power of two


def test_csc_column_norms_in_one_pass_match_scipy():
    rng = np.random.default_rng(2)
    X = sp.random(30, 12, density=0.2, random_state=rng, format="csc")
    X[:, 3] = 0.0  # an empty column
    X.eliminate_zeros()
    sw = rng.uniform(0.0, 2.0, 30)
    for w in (None, sw):
        ref = np.asarray(X.multiply(X).T @ (np.ones(30) if w is None else w)).ravel()
        np.testing.assert_allclose(weighted_col_norms2(X, w), ref, rtol=1e-14)
        np.testing.assert_allclose(weighted_col_norms2(X.tocsr(), w), ref, rtol=1e-14)


def test_adaprox_biased_fixed_points_warn_and_auto_takes_the_iterate():
    """adaprox's default (eta at the gradient-step point) stops at a fixed point O(step) from a
    stationary point: on this 6 x 1 MCP problem 0.00635 for the stationary 0.00281, criterion
    0.28 against tol 1e-6, without a warning. Now it warns, criterion_ is the objective's;
    a user's own penalty (solver="auto" falls back to adaprox) gets eta at the iterate, whose
    fixed points are stationary (the same objective as cd on the catalog's LogSum)."""
    import penalties
    from sklearn.exceptions import ConvergenceWarning

    X = np.array([[0.3357243], [-0.35274585], [1.71005385], [0.28010385], [-1.43034209],
                  [0.96552958]])
    y = np.array([-0.00331046, -0.00757707, 0.01986105, -0.00994744, -0.01765532, 0.00402857])
    a = 0.75 * alpha_max(X, y, "mcp")
    est = SparseLinearRegression("mcp", alpha=a, tol=1e-6, solver="adaprox")
    with pytest.warns(ConvergenceWarning, match="not a stationary point.*eta_at"):
        est.fit(X, y)
    assert est.criterion_ > 1e-6
    ref = SparseLinearRegression("mcp", alpha=a, tol=1e-10).fit(X, y)
    fixed = SparseLinearRegression("mcp", alpha=a, tol=1e-10, solver="adaprox",
                                   solver_params={"eta_at": "iterate"}).fit(X, y)
    np.testing.assert_allclose(fixed.coef_, ref.coef_, rtol=1e-6)

    rng = np.random.default_rng(0)
    X2 = rng.standard_normal((50, 8))
    y2 = X2[:, 0] - X2[:, 1] + 0.1 * rng.standard_normal(50)

    def rule(w):  # LogSum(1)'s keep ratio at lam = 1
        e = np.abs(w) * (np.abs(w) + 1.0)
        return e / (e + 1.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        mine = SparseLinearRegression(penalties.from_keep_ratio(rule, lam=1.0), alpha=0.05,
                                      tol=1e-8).fit(X2, y2)
    cd = SparseLinearRegression(penalties.LogSum(1.0), alpha=0.05, tol=1e-10).fit(X2, y2)
    assert mine.solver_ == "adaprox"
    np.testing.assert_allclose(mine.coef_, cd.coef_, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("stored", ["sparse", "every entry near 100"])
def test_the_l1_polish_on_sparse_designs_is_exact(stored):
    """The polish solves the support's system from the sparse columns (centred implicitly)
    or, where that would cancel digits (columns near 100 with unit spread: mean^2 / variance
    ~ 1e5), densely: at a loose tol the fit is scikit-learn's Lasso at a tight one, for
    sparse and dense X alike."""
    from sklearn.linear_model import Lasso

    rng = np.random.default_rng(3)
    if stored == "sparse":
        X = sp.random(300, 60, density=0.2, random_state=rng, format="csc")
    else:
        X = sp.csc_matrix(100.0 + rng.standard_normal((300, 60)) * 0.3)
    Xd = X.toarray()
    w = np.zeros(60)
    w[:5] = [1.0, -2.0, 1.5, 0.5, -1.0]
    y = Xd @ w + 0.1 * rng.standard_normal(300) + 3.0
    a = 0.05 * alpha_max(Xd, y, scaling="none")
    ref = Lasso(alpha=a, tol=1e-14, max_iter=100000).fit(Xd, y)
    for data in (X, Xd):
        est = SparseLinearRegression(alpha=a, scaling="none", tol=1e-3).fit(data, y)
        np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
        assert est.intercept_ == pytest.approx(ref.intercept_, rel=1e-9)
