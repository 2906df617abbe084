"""The GLM estimators against independent solutions at tight tolerance: cvxpy (convex problems
written out here), scikit-learn (PoissonRegressor, GammaRegressor, HuberRegressor,
QuantileRegressor, LogisticRegression multinomial; L2 only or its own L1) and skglm (Huber with
L1; Poisson, Gamma and Cox in benchmarks/linear/bench_glm.py), on raw bundled data (diabetes
and wine, unstandardized; counts and survival times made from them) and standardized synthetic
data. Then what every estimator shares: sample weights as repetitions, sparse X, paths,
alpha_max, CV, errors."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_diabetes, load_wine

from dualdrop.linear import (SparseCoxRegression, SparseGammaRegression, SparseGLM, SparseGLMCV,
                             SparseHuberRegression, SparseMultinomialRegression,
                             SparseMultinomialRegressionCV, SparsePoissonRegression,
                             SparseQuantileRegression, alpha_max, regularization_path)
from dualdrop.linear.families.huber import Huber

TOL = 1e-10


def _diabetes(p=10):
    X, y = load_diabetes(return_X_y=True, scaled=False)  # raw: sex 1/2, bmi ~26, tc ~190
    return X[:, :p], y


def _counts():
    X, y = _diabetes()
    return X, np.round(y / 25.0)  # disease progression in counts of 25


def _survival(seed=0):
    """Survival times from raw diabetes: the progression score drives the hazard, about 30%
    censored, times rounded (ties)."""
    X, y = _diabetes()
    rng = np.random.default_rng(seed)
    t = np.round(rng.exponential(np.exp(-(y - y.mean()) / y.std())), 2) + 0.01
    c = rng.exponential(2.5, t.size)
    return X, np.column_stack([np.minimum(t, c), (t <= c).astype(float)])


def _synthetic(kind, n=120, p=30, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    X = (X - X.mean(0)) / X.std(0)
    w = np.zeros(p)
    w[:5] = [0.5, -0.4, 0.3, 0.3, -0.2]
    z = X @ w + 0.3
    if kind == "poisson":
        return X, rng.poisson(np.exp(z)).astype(float)
    if kind == "gamma":
        return X, rng.gamma(2.0, np.exp(z) / 2.0)
    return X, z + rng.standard_t(2, n)


# ---- cvxpy references ------------------------------------------------------------------------

def _cvx_fit(X, y, kind, alpha, fit_intercept=True, **kw):
    """The convex problem of the estimators with scaling='none' and the l1 penalty, in cvxpy."""
    import cvxpy as cp

    n, p = X.shape
    w = cp.Variable(p)
    b = cp.Variable() if fit_intercept else 0.0
    z = X @ w + b
    if kind == "poisson":
        fit = cp.sum(cp.exp(z) - cp.multiply(y, z)) / n
    elif kind == "gamma":
        fit = cp.sum(z + cp.multiply(y, cp.exp(-z))) / n
    elif kind == "huber":
        fit = cp.sum(cp.huber(y - z, kw["delta"])) / (2 * n)
    elif kind == "quantile":
        tau, d = kw["quantile"], kw["delta"]
        u = cp.Variable(n)
        r = y - z
        fit = cp.sum((tau * cp.square(cp.pos(u)) + (1 - tau) * cp.square(cp.neg(u))) / (2 * d)
                     + tau * cp.pos(r - u) + (1 - tau) * cp.neg(r - u)) / n
    elif kind == "cox":
        t, ev = y[:, 0], y[:, 1]
        fit = sum(-z[i] + cp.log_sum_exp(z[np.flatnonzero(t >= t[i])])
                  for i in np.flatnonzero(ev == 1)) / n
    prob = cp.Problem(cp.Minimize(fit + alpha * cp.norm1(w)))
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return np.asarray(w.value), (float(b.value) if fit_intercept else 0.0)


def _standardized(X):
    return (X - X.mean(0)) / X.std(0)


@pytest.mark.parametrize("kind,est,data,frac,kw", [
    ("poisson", SparsePoissonRegression, "synthetic", 0.1, {}),
    ("poisson", SparsePoissonRegression, "raw", 0.05, {}),
    ("gamma", SparseGammaRegression, "synthetic", 0.1, {}),
    ("gamma", SparseGammaRegression, "raw", 0.05, {}),
    ("huber", SparseHuberRegression, "synthetic", 0.1, {"delta": 1.0}),
    ("huber", SparseHuberRegression, "raw", 0.05, {"delta": 40.0}),
    ("quantile", SparseGLM, "synthetic", 0.1, {"quantile": 0.3, "delta": 0.05}),
    ("cox", SparseCoxRegression, "raw", 0.1, {}),
])
def test_l1_fits_match_cvxpy(kind, est, data, frac, kw):
    if data == "raw":
        X, y = {"poisson": _counts, "gamma": _diabetes, "huber": _diabetes,
                "cox": _survival}[kind]()
        if kind == "cox":
            X, y = X[:80], y[:80]  # cvxpy's log-sum-exp per event: keep it small
    else:
        X, y = _synthetic(kind)
    if est is SparseGLM:
        model = SparseGLM(datafit=kind, datafit_params=kw, scaling="none", tol=TOL)
    else:
        model = est(scaling="none", tol=TOL, **kw)
    a = frac * alpha_max(X, y, datafit=kind, scaling="none",
                         datafit_params=kw if kind in ("huber", "quantile") else None)
    ours = model.set_params(alpha=a).fit(X, y)
    w, b = _cvx_fit(X, y, kind, a, fit_intercept=kind != "cox", **kw)
    scale = max(1.0, np.abs(w).max())
    assert np.count_nonzero(ours.coef_) >= 2
    np.testing.assert_allclose(ours.coef_, w, atol=2e-6 * scale)
    if kind != "cox":
        assert abs(ours.intercept_ - b) <= 2e-6 * max(1.0, abs(b))


@pytest.mark.parametrize("kind", ["poisson", "gamma"])
def test_l2_fits_match_sklearn_on_raw_data(kind):
    from sklearn.linear_model import GammaRegressor, PoissonRegressor

    X, y = _counts() if kind == "poisson" else _diabetes()
    ref_cls, ours_cls = ((PoissonRegressor, SparsePoissonRegression) if kind == "poisson" else
                         (GammaRegressor, SparseGammaRegression))
    for alpha in (1e-2, 1e-5):  # to alpha -> 0: the unpenalized fit of raw columns
        ref = ref_cls(alpha=alpha, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(X, y)
        ours = ours_cls(alpha=alpha, l1_ratio=0.0, scaling="none", tol=TOL).fit(X, y)
        np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-6, atol=1e-8)
        assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-7, abs=1e-8)
        assert ours.score(X, y) == pytest.approx(ref.score(X, y), rel=1e-8)


def test_huber_matches_sklearn_at_its_scale():
    """HuberRegressor minimizes sum_i sigma H_eps(r_i / sigma) + alpha ||w||^2 over (w, sigma);
    at its sigma that is (2 / sigma) sum_i h_delta(r_i) + alpha ||w||^2 with delta = eps sigma:
    our mean Huber loss with l1_ratio=0 and alpha' = alpha sigma / n. Ours is the exact
    minimizer at that sigma: its objective is at most scikit-learn's (whose L-BFGS stops
    ~1e-5 relative away in the coefficients), and the two agree to that."""
    from sklearn.linear_model import HuberRegressor

    X, y = _diabetes()
    Xs = _standardized(X)
    ref = HuberRegressor(epsilon=1.35, alpha=10.0, tol=1e-12, max_iter=100000).fit(Xs, y)
    s = ref.scale_
    ours = SparseHuberRegression(delta=1.35 * s, alpha=10.0 * s / len(y), l1_ratio=0.0,
                                 scaling="none", tol=TOL).fit(Xs, y)

    def F(m):  # scikit-learn's objective at its sigma
        r = np.abs(y - m.predict(Xs)) / s
        H = np.where(r <= 1.35, r * r, 2 * 1.35 * r - 1.35 ** 2)
        return float(np.sum(s + s * H) + 10.0 * m.coef_ @ m.coef_)

    assert F(ours) <= F(ref) * (1 + 1e-12)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-3, atol=1e-3)
    assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-4)


def test_huber_far_beyond_delta_is_not_called_converged_at_zero():
    """Residuals 1e10 times delta: the loss grows like |r| but its gradient stays below delta,
    so a criterion scaled by the objective called w = 0 converged (all zeros, no warning). The
    scaled-up fit at y's own scale is far below the objective at 0, so 0 is not the answer:
    the fit must move away from it."""
    X, y = load_diabetes(return_X_y=True, scaled=False)
    ys = y * 1e10
    w1 = SparseHuberRegression(alpha=0.01).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = SparseHuberRegression(alpha=0.01).fit(X, ys)
    null = Huber(1.35).value(ys, np.full(len(ys), np.median(ys)))
    scaled = Huber(1.35).value(ys, X @ (w1.coef_ * 1e10) + w1.intercept_ * 1e10)
    assert scaled < 0.9 * null  # the premise: zero is far from optimal
    assert np.count_nonzero(est.coef_) > 0
    z = X @ est.coef_ + est.intercept_
    assert Huber(1.35).value(ys, z) < null


def test_huber_l1_matches_skglm():
    """skglm's Huber + L1 (AndersonCD): the same objective; ours at least as low. (Poisson,
    Gamma and Cox against skglm: benchmarks/linear/bench_glm.py, at matched objective; here they
    are checked against cvxpy and scikit-learn, whose compile times are shorter.)"""
    from skglm import GeneralizedLinearEstimator
    from skglm.datafits import Huber
    from skglm.penalties import L1
    from skglm.solvers import AndersonCD

    X, y = _synthetic("huber", n=200, p=40, seed=3)
    a = 0.05 * alpha_max(X, y, datafit="huber", scaling="none", datafit_params={"delta": 1.0})
    ours = SparseHuberRegression(delta=1.0, alpha=a, scaling="none", tol=TOL).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = GeneralizedLinearEstimator(Huber(1.0), L1(a), AndersonCD(
            tol=1e-12, fit_intercept=True)).fit(X, y)
    df = ours._make_datafit()

    def F(w, b):
        return df.value(y, X @ w + b) + a * np.abs(w).sum()

    assert F(ours.coef_, ours.intercept_) <= F(ref.coef_, ref.intercept_) + 1e-10
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-5)


def test_quantile_within_smoothing_bound_of_sklearn_exact_lp():
    from sklearn.linear_model import QuantileRegressor

    X, y = _diabetes()
    Xs = _standardized(X)
    ref = QuantileRegressor(quantile=0.8, alpha=0.5, solver="highs").fit(Xs, y)
    ours = SparseQuantileRegression(quantile=0.8, alpha=0.5, scaling="none", tol=1e-8).fit(Xs, y)
    df = ours._make_datafit()

    def F(m):
        return df.pinball(y, m.predict(Xs)) + 0.5 * np.abs(m.coef_).sum()

    bound = 0.8 * ours.smoothing_ / 2
    assert ours.smoothing_ < 1e-2
    assert F(ref) - 1e-9 <= F(ours) <= F(ref) + bound
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=0.05 * np.abs(ref.coef_).max())


def test_multinomial_matches_sklearn_l2_and_l1_saga():
    from sklearn.linear_model import LogisticRegression

    X, y = load_wine(return_X_y=True)
    Xs = _standardized(X)
    n = len(y)
    ref = LogisticRegression(C=0.5, tol=1e-12, max_iter=10000).fit(Xs, y)
    ours = SparseMultinomialRegression(alpha=1 / (0.5 * n), l1_ratio=0.0, grouped=False,
                                       scaling="none", tol=TOL).fit(Xs, y)
    np.testing.assert_allclose(ours.predict_proba(Xs), ref.predict_proba(Xs), atol=1e-7)
    np.testing.assert_allclose(ours.coef_, ref.coef_ - ref.coef_.mean(0), atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        saga = LogisticRegression(C=0.5, l1_ratio=1.0, solver="saga", tol=1e-12,
                                  max_iter=20000).fit(Xs, y)
    ours = SparseMultinomialRegression(alpha=1 / (0.5 * n), grouped=False, scaling="none",
                                       tol=TOL).fit(Xs, y)

    def F(m):
        return (-np.mean(np.log(m.predict_proba(Xs)[np.arange(n), y]))
                + np.abs(m.coef_).sum() / (0.5 * n))

    assert F(ours) <= F(saga) + 1e-9
    assert F(ours) == pytest.approx(F(saga), rel=1e-6)


def test_grouped_multinomial_matches_cvxpy_on_raw_wine():
    import cvxpy as cp

    X, y = load_wine(return_X_y=True)  # raw: proline ~750, hue ~1
    n, p = X.shape
    a = 0.05 * alpha_max(X, y, datafit="multinomial", scaling="none")
    ours = SparseMultinomialRegression(alpha=a, scaling="none", tol=TOL).fit(X, y)
    Y = np.eye(3)[y]
    W, b = cp.Variable((p, 3)), cp.Variable(3)
    Z = X @ W + np.ones((n, 1)) @ cp.reshape(b, (1, 3), order="C")
    fit = (cp.sum(cp.log_sum_exp(Z, axis=1)) - cp.sum(cp.multiply(Y, Z))) / n
    cp.Problem(cp.Minimize(fit + a * cp.sum(cp.norm(W, 2, axis=1)))).solve(
        solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    Wc = W.value - W.value.mean(1, keepdims=True)  # the softmax ignores a shift per row
    assert 0 < np.count_nonzero(np.abs(ours.coef_).sum(0)) < p  # whole features dropped
    np.testing.assert_allclose(ours.coef_.T, Wc, atol=2e-5 * np.abs(Wc).max())


# ---- what every estimator shares --------------------------------------------------------------

_CASES = {
    "poisson": (lambda: _counts(), SparsePoissonRegression, {}),
    "gamma": (lambda: _diabetes(), SparseGammaRegression, {}),
    "huber": (lambda: _diabetes(), SparseHuberRegression, {"delta": 40.0}),
    "quantile": (lambda: _diabetes(), SparseGLM, {"datafit": "quantile",
                                                   "datafit_params": {"quantile": 0.7,
                                                                      "delta": 1.0}}),
    "cox": (lambda: _survival(), SparseCoxRegression, {}),
}


@pytest.mark.parametrize("kind", list(_CASES))
def test_integer_weights_equal_repetition_and_sparse_equals_dense(kind):
    make, cls, kw = _CASES[kind]
    X, y = make()
    X, y = X[:150], y[:150]
    est = cls(alpha=0.05 * alpha_max(X, y, datafit=kind, datafit_params=kw.get(
        "datafit_params", {"delta": 40.0} if kind == "huber" else None)), tol=TOL, **kw)
    sw = np.random.default_rng(3).integers(0, 4, len(y)).astype(float)
    a = est.fit(X, y, sample_weight=sw)
    ca, ia = a.coef_.copy(), a.intercept_
    rows = np.repeat(np.arange(len(y)), sw.astype(int))
    b = est.fit(X[rows], y[rows])
    assert np.count_nonzero(ca) >= 2
    np.testing.assert_allclose(ca, b.coef_, rtol=1e-6, atol=1e-8 * np.abs(ca).max())
    assert ia == pytest.approx(b.intercept_, rel=1e-6, abs=1e-8)
    c = est.fit(sp.csc_matrix(X), y, sample_weight=sw)
    np.testing.assert_allclose(c.coef_, ca, rtol=1e-6, atol=1e-8 * np.abs(ca).max())


@pytest.mark.parametrize("kind", list(_CASES))
def test_alpha_max_and_path(kind):
    make, cls, kw = _CASES[kind]
    X, y = make()
    params = kw.get("datafit_params", {"delta": 40.0} if kind == "huber" else None)
    amax = alpha_max(X, y, datafit=kind, datafit_params=params)
    assert np.all(cls(alpha=amax * 1.0001, **kw).fit(X, y).coef_ == 0)
    assert np.any(cls(alpha=amax * 0.99, **kw).fit(X, y).coef_ != 0)
    path = regularization_path(X, y, datafit=kind, datafit_params=params, n_alphas=5,
                               alpha_min_ratio=0.05)
    nnz = [np.count_nonzero(c) for c in path["coefs"]]
    assert nnz[0] == 0 and nnz[-1] >= 3 and path["coefs"].shape == (5, X.shape[1])


def test_multinomial_alpha_max_path_and_predictions():
    X, y = load_wine(return_X_y=True)
    labels = np.array(["a", "b", "c"])[y]
    for grouped in (True, False):
        amax = SparseMultinomialRegression(grouped=grouped)
        from dualdrop.linear.path import estimator_alpha_max

        a = estimator_alpha_max(amax, X, labels)
        assert np.all(amax.set_params(alpha=a * 1.0001).fit(X, labels).coef_ == 0)
        m = amax.set_params(alpha=a * 0.05).fit(X, labels)
        assert np.any(m.coef_ != 0) and m.coef_.shape == (3, X.shape[1])
        P = m.predict_proba(X)
        np.testing.assert_allclose(P.sum(1), 1.0)
        assert set(m.predict(X)) <= set(labels) and m.score(X, labels) > 0.9
        np.testing.assert_allclose(m.intercept_.sum(), 0.0, atol=1e-10)
    path = regularization_path(X, y, datafit="multinomial", n_alphas=4, alpha_min_ratio=0.05)
    assert path["coefs"].shape == (4, 3, X.shape[1])


def test_cox_predictions_and_baseline_hazard():
    X, y = _survival()
    m = SparseCoxRegression(alpha=0.02).fit(X, y)
    times = np.array([0.0, 0.5, 1.0, 5.0])
    S = m.predict_survival_function(X[:5], times)
    assert S.shape == (5, 4) and np.all(np.diff(S, axis=1) <= 0) and np.all(S <= 1)
    assert m.intercept_ == 0.0
    # Breslow's baseline at the last event time: sum over events of 1 / risk-set sum
    risk = np.exp(X @ m.coef_)
    t, ev = y[:, 0], y[:, 1]
    H = sum(1.0 / risk[t >= ti].sum() for ti in t[ev == 1])
    assert m.baseline_cumulative_hazard_[-1] == pytest.approx(H, rel=1e-10)
    rec = np.array(list(zip(ev.astype(bool), t)), dtype=[("event", "?"), ("time", "f8")])
    np.testing.assert_allclose(SparseCoxRegression(alpha=0.02).fit(X, rec).coef_, m.coef_)


def test_nonconvex_penalty_on_glm_starts_from_best():
    X, y = _synthetic("poisson", n=80, p=60, seed=4)
    kw = dict(penalty="mcp", penalty_params={"a": 3.0, "lam": "alpha"}, alpha=0.05)
    best = SparsePoissonRegression(**kw).fit(X, y)
    zero = SparsePoissonRegression(start="zero", **kw).fit(X, y)
    convex = SparsePoissonRegression(start="convex", **kw).fit(X, y)
    assert best.objective_[-1] <= min(zero.objective_[-1], convex.objective_[-1]) + 1e-12


def test_glm_cv_chooses_alpha():
    X, y = _counts()
    cv = SparseGLMCV(datafit="poisson", alphas=8, cv=3).fit(X, y)
    assert cv.alpha_ in cv.alphas_ and cv.scores_.shape == (3, 8)
    assert cv.score(X, y) > 0.3
    X, y = load_wine(return_X_y=True)
    cvm = SparseMultinomialRegressionCV(alphas=6, cv=3).fit(X, y)
    assert cvm.score(X, y) > 0.9 and cvm.scores_.shape == (3, 6)


@pytest.mark.parametrize("kind,bad,match", [
    ("poisson", -1.0, ">= 0"), ("gamma", 0.0, "> 0"),
])
def test_bad_targets_name_y_and_leave_the_estimator_unchanged(kind, bad, match):
    make, cls, kw = _CASES[kind]
    X, y = make()
    est = cls(**kw).fit(X, y)
    coef = est.coef_.copy()
    y2 = y.copy()
    y2[0] = bad
    with pytest.raises(ValueError, match=match):
        est.fit(X, y2)
    np.testing.assert_array_equal(est.coef_, coef)


def test_parameter_errors():
    X, y = _counts()
    with pytest.raises(ValueError, match="delta"):
        SparseHuberRegression(delta=0.0).fit(X, y)
    with pytest.raises(ValueError, match="quantile"):
        SparseQuantileRegression(quantile=1.5).fit(X, y)
    with pytest.raises(ValueError, match="datafit"):
        SparseGLM(datafit="logistic").fit(X, y)
    with pytest.raises(ValueError, match="group_l1_ratio"):
        SparsePoissonRegression(group_l1_ratio=0.5).fit(X, y)
    with pytest.raises(ValueError, match="cd"):  # irls fits least squares and logistic only
        SparsePoissonRegression(solver="irls").fit(X, y)


@pytest.mark.parametrize("est", [SparsePoissonRegression(), SparseGammaRegression(),
                                 SparseHuberRegression(), SparseQuantileRegression(),
                                 SparseMultinomialRegression(), SparseGLM(datafit="huber")],
                         ids=lambda e: type(e).__name__)
def test_sklearn_estimator_checks(est):
    """scikit-learn's estimator checks, the sample-weight equivalence ones included (none is
    expected to fail for these convex fits). Cox is left out: its y is (time, event), which the
    checks do not generate."""
    from sklearn.utils.estimator_checks import check_estimator

    from dualdrop.linear import expected_failed_checks

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(est, on_fail=None,
                                  expected_failed_checks=expected_failed_checks(est))
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results
              if r["status"] == "failed"]
    assert not failed
