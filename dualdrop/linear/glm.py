"""Sparse generalized linear models: any datafit of :mod:`.families` with any penalty.

Objective (``n`` samples, ``z = X w + b``; the penalty exactly as in
:class:`~dualdrop.linear.SparseLinearRegression`, column scales ``s_j``, ``l1_ratio``,
``penalty_weights`` and ``groups`` included)::

    L(y, z) + alpha * sum_j Omega_rho(s_j w_j)

=================================  ==============  ==============================================
estimator                          datafit         ``predict``
=================================  ==============  ==============================================
:class:`SparsePoissonRegression`   ``"poisson"``   the mean ``exp(z)``
:class:`SparseGammaRegression`     ``"gamma"``     the mean ``exp(z)``
:class:`SparseHuberRegression`     ``"huber"``     ``z``
:class:`SparseQuantileRegression`  ``"quantile"``  ``z``, the ``quantile``-th conditional quantile
:class:`SparseCoxRegression`       ``"cox"``       the risk score ``X w`` (no intercept)
:class:`SparseGLM`                 any of those    as the named estimator
=================================  ==============  ==============================================

(the multinomial logistic model, a classifier with a coefficient matrix, is
:class:`~dualdrop.linear.multinomial.SparseMultinomialRegression`). ``SparseGLM(datafit="huber",
datafit_params={"delta": 2.0})`` composes a datafit (a name of
``dualdrop.linear.datafits.available_datafits()`` or a datafit object) with any penalty; the
named estimators are the same with the datafit fixed and its parameters as their own (so that
``GridSearchCV`` reaches them).

All share one validation path with the least-squares and logistic estimators (scikit-learn's
parameter constraints, ``validate_data``, then the datafit's own target check, a
``ValueError`` naming ``y``: counts ``>= 0`` for Poisson, ``> 0`` for Gamma, ``[time, event]``
for Cox), the solver registry (``solver="auto"`` is the working-set proximal Newton of ``"cd"``;
``"reweighted_l1"`` for penalties concave in ``|w|``), ``sample_weight`` (the weighted average
of the per-sample losses; integer weights are repeated samples), sparse ``X``, warm starts,
:func:`~dualdrop.linear.regularization_path` (``datafit="poisson"``, ...) and
:class:`~dualdrop.linear.SparseGLMCV`.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils._param_validation import HasMethods, StrOptions
from sklearn.utils.validation import check_is_fitted

from ._validation import constraints, fit_context, validate_data
from .datafits import Datafit, available_datafits, get_datafit, normalized_sample_weight
from ._fitdata import GLMData
from .estimators import SparseLinearBase
from .families.cox import survival_target

__all__ = ["SparseGLM", "SparsePoissonRegression", "SparseGammaRegression",
           "SparseHuberRegression", "SparseQuantileRegression", "SparseCoxRegression",
           "concordance_index", "GLM_DATAFITS"]

#: the datafits of the single-output regression estimators (and of ``SparseGLM``)
GLM_DATAFITS = ("poisson", "gamma", "huber", "quantile", "cox")


class _SparseGLMBase(RegressorMixin, SparseLinearBase):
    """What the GLM estimators share: the datafit (``_datafit_spec``), the target check, the
    fit, ``predict`` and ``score``."""

    def _datafit_spec(self):  # pragma: no cover - abstract
        """``(name or Datafit object, params)``."""
        raise NotImplementedError

    def _make_datafit(self, sw=None):
        kind, params = self._datafit_spec()
        if isinstance(kind, Datafit):
            df = kind if sw is None else kind.with_sample_weight(sw)
            return df
        return get_datafit(kind, **params, sample_weight=sw)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        try:
            name = self._make_datafit().name
        except Exception:  # invalid parameters: the fit reports them
            return tags
        tags.target_tags.positive_only = name in ("poisson", "gamma")
        return tags

    def _check_target(self, y):
        return self._make_datafit().check_target(y)

    def _sample_weight_equivalence_failure(self):
        if self._make_datafit().name == "cox":
            return "Cox: y is (time, event), which scikit-learn's checks do not generate"
        return super()._sample_weight_equivalence_failure()

    # ---- fit --------------------------------------------------------------------------------
    def _fit_data(self, X, y, sw):
        return GLMData(X, self._scaling(X, sw), self._make_datafit(sw), self.fit_intercept,
                       self._penalty_weights(X.shape[1]), y=y)

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Fit on ``X`` (dense or sparse) and the target ``y`` (see the datafit); ``sample_weight``:
        nonnegative weights of the samples or ``None``."""
        return self._fit_prepared(self._prepare(X, y, sample_weight))

    def _prepare(self, X, y, sample_weight):
        """Checked data and what the solvers receive, ``(data, dtype)`` (reused along a path)."""
        cox = self._make_datafit().name == "cox"  # the datafit's parameters, before the data
        X, y = validate_data(self, X, y, accept_sparse="csc", dtype=[np.float64, np.float32],
                             multi_output=cox, y_numeric=not cox)
        y = self._check_target(y)
        dtype = X.dtype
        X = X.astype(np.float64, copy=False)
        sw = normalized_sample_weight(sample_weight, X.shape[0])
        data = self._fit_data(X, y, sw)
        return data, dtype


    def _null_gradient(self, X, y, sample_weight=None):
        """``(|g|, L, scaling)`` at the null model (``w = 0``, the best intercept) of the scaled
        problem, over the features with ``L > 0``: what :func:`~dualdrop.linear.path.alpha_max`
        needs."""
        data, _ = self._prepare(X, y, sample_weight)
        df, yy = data.datafit, data.y
        b0 = df.intercept_init(yy) if data.fit_intercept else 0.0
        z = np.full(data.design.n, b0)
        L = df.lipschitz(data.design, yy)
        keep = L > 0
        g = np.abs(data.design.rmatvec(df.raw_grad(yy, z)))
        return g[keep], L[keep], data.scaling

    # ---- predictions ------------------------------------------------------------------------
    def _linear_predictor(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32],
                          reset=False)
        return np.asarray(X @ self.coef_).ravel() + self.intercept_

    def predict(self, X):
        """The mean ``exp(X w + b)`` (Poisson, Gamma), ``X w + b`` (Huber, quantile) or the
        risk score ``X w`` (Cox)."""
        z = self._linear_predictor(X)
        return np.exp(z) if self._make_datafit().name in ("poisson", "gamma") else z

    def score(self, X, y, sample_weight=None):
        """Poisson / Gamma: the fraction of deviance explained, ``D^2`` (scikit-learn's
        ``PoissonRegressor.score``); quantile: ``d2_pinball_score``; Huber: ``R^2``; Cox:
        Harrell's concordance index."""
        df = self._make_datafit()
        if df.name == "cox":
            yy = survival_target(y)
            return concordance_index(yy[:, 0], yy[:, 1], self.predict(X), sample_weight)
        if df.name in ("poisson", "gamma"):
            from sklearn.metrics import d2_tweedie_score

            return d2_tweedie_score(y, self.predict(X), sample_weight=sample_weight,
                                    power=1 if df.name == "poisson" else 2)
        if df.name == "quantile":
            from sklearn.metrics import d2_pinball_score

            return d2_pinball_score(y, self.predict(X), sample_weight=sample_weight,
                                    alpha=df.quantile)
        return super().score(X, y, sample_weight)


_GLM_INIT_DOC = """
    Parameters as :class:`~dualdrop.linear.SparseLinearRegression` (``penalty``,
    ``penalty_params``, ``alpha``, ``l1_ratio``, ``solver``, ``tol``, ``max_iter``,
    ``fit_intercept``, ``warm_start``, ``scaling``, ``solver_params``, ``verbose``,
    ``positive``, ``penalty_weights``, ``groups``, ``group_l1_ratio``, ``start``); attributes
    ``coef_``, ``intercept_``, ``n_iter_``, ``objective_``, ``criterion_``, ``solver_``.
"""


def _with_init_doc(cls):
    """Append the shared constructor note to ``cls.__doc__`` (a class body cannot build its
    docstring from an expression: a string plus a constant is no docstring, ``__doc__`` is None)."""
    cls.__doc__ = cls.__doc__.rstrip() + "\n" + _GLM_INIT_DOC
    return cls


def _base_params(self, kw):
    for k, v in kw.items():
        setattr(self, k, v)


@_with_init_doc
class SparseGLM(_SparseGLMBase):
    """Any datafit with any penalty: ``L(y, X w + b) + alpha sum_j Omega_rho(s_j w_j)``.

    ``datafit``: a name among ``"poisson"``, ``"gamma"``, ``"huber"``, ``"quantile"``,
    ``"cox"`` (with ``datafit_params``, e.g. ``{"delta": 1.0}`` for Huber, ``{"quantile": 0.9,
    "delta": 1e-3}`` for the smoothed quantile loss) or a datafit object of
    :mod:`dualdrop.linear.families`. ``alpha`` defaults to 0.01. With ``"cox"`` there is no
    intercept (the partial likelihood does not change with one): ``fit_intercept`` has no
    effect and ``intercept_`` is 0.
    """

    _parameter_constraints: dict = {
        **SparseLinearBase._parameter_constraints,
        **constraints("datafit_params"),
        "datafit": [StrOptions(set(GLM_DATAFITS)), HasMethods(["value", "raw_grad", "raw_hess"])],
    }

    def __init__(self, datafit="poisson", datafit_params=None, penalty="l1", penalty_params=None,
                 alpha=0.01, *, l1_ratio=1.0, solver="auto", tol=1e-5, max_iter=None,
                 fit_intercept=True, warm_start=False, scaling="dropout", solver_params=None,
                 verbose=False, positive=False, penalty_weights=None, groups=None,
                 group_l1_ratio=0.0, start="best"):
        super().__init__(penalty, penalty_params, alpha, l1_ratio=l1_ratio, solver=solver,
                         tol=tol, max_iter=max_iter, fit_intercept=fit_intercept,
                         warm_start=warm_start, scaling=scaling, solver_params=solver_params,
                         verbose=verbose, positive=positive, penalty_weights=penalty_weights,
                         groups=groups, group_l1_ratio=group_l1_ratio, start=start)
        self.datafit = datafit
        self.datafit_params = datafit_params

    def _datafit_spec(self):
        if isinstance(self.datafit, Datafit):
            if self.datafit_params:
                raise ValueError("datafit_params is only used with a datafit name; pass the "
                                 "parameters to the datafit object's constructor instead")
            return self.datafit, {}
        if isinstance(self.datafit, str) and self.datafit not in GLM_DATAFITS:
            hint = {"quadratic": "SparseLinearRegression", "logistic": "SparseLogisticRegression",
                    "multinomial": "SparseMultinomialRegression"}.get(self.datafit)
            raise ValueError(f"SparseGLM fits the datafits {list(GLM_DATAFITS)}; "
                             + (f"use {hint} for {self.datafit!r}" if hint else
                                f"{self.datafit!r} is not one of {available_datafits()}"))
        return self.datafit, dict(self.datafit_params or {})


class _NamedGLM(_SparseGLMBase):
    """:class:`SparseGLM` with the datafit fixed (``_datafit_name``) and its parameters
    (``_datafit_params``) as the estimator's own."""

    _datafit_name = None
    _datafit_params = ()

    def _datafit_spec(self):
        return self._datafit_name, {k: getattr(self, k) for k in self._datafit_params}


_COMMON_KW = ("penalty", "penalty_params", "alpha", "l1_ratio", "solver", "tol", "max_iter",
              "fit_intercept", "warm_start", "scaling", "solver_params", "verbose", "positive",
              "penalty_weights", "groups", "group_l1_ratio", "start")


@_with_init_doc
class SparsePoissonRegression(_NamedGLM):
    """Poisson regression (log link) with any penalty: the half Poisson deviance
    ``(1/n) sum_i [e^z_i - y_i z_i + y_i log y_i - y_i] + alpha sum_j Omega_rho(s_j w_j)``
    (``dualdrop.linear.families.poisson``). With ``penalty="l1", l1_ratio=0, scaling="none"``
    this is scikit-learn's ``PoissonRegressor(alpha)``. ``y``: counts or rates ``>= 0``, not
    all zero. ``predict`` gives the mean ``exp(X w + b)``, ``score`` the fraction of deviance
    explained. ``alpha`` defaults to 0.01.
    """

    _datafit_name = "poisson"

    def __init__(self, penalty="l1", penalty_params=None, alpha=0.01, *, l1_ratio=1.0,
                 solver="auto", tol=1e-5, max_iter=None, fit_intercept=True, warm_start=False,
                 scaling="dropout", solver_params=None, verbose=False, positive=False,
                 penalty_weights=None, groups=None, group_l1_ratio=0.0,
                 start="best"):
        _base_params(self, {k: v for k, v in locals().items() if k in _COMMON_KW})


@_with_init_doc
class SparseGammaRegression(_NamedGLM):
    """Gamma regression (log link) with any penalty: the half Gamma deviance
    ``(1/n) sum_i [z_i + y_i e^-z_i - log y_i - 1] + alpha sum_j Omega_rho(s_j w_j)``
    (``dualdrop.linear.families.gamma``). With ``penalty="l1", l1_ratio=0, scaling="none"``
    this is scikit-learn's ``GammaRegressor(alpha)``. ``y > 0``. ``predict`` gives the mean
    ``exp(X w + b)``, ``score`` the fraction of deviance explained. ``alpha`` defaults to 0.01.
    """

    _datafit_name = "gamma"

    def __init__(self, penalty="l1", penalty_params=None, alpha=0.01, *, l1_ratio=1.0,
                 solver="auto", tol=1e-5, max_iter=None, fit_intercept=True, warm_start=False,
                 scaling="dropout", solver_params=None, verbose=False, positive=False,
                 penalty_weights=None, groups=None, group_l1_ratio=0.0,
                 start="best"):
        _base_params(self, {k: v for k, v in locals().items() if k in _COMMON_KW})


@_with_init_doc
class SparseHuberRegression(_NamedGLM):
    """Huber regression with any penalty: ``(1/n) sum_i h_delta(y_i - z_i) + alpha sum_j
    Omega_rho(s_j w_j)``, ``h_delta(r) = r^2/2`` for ``|r| <= delta``, ``delta |r| - delta^2/2``
    beyond (``dualdrop.linear.families.huber``; skglm's ``Huber(delta)``).

    ``delta`` (default 1.35) is in the units of ``y``: the classical choice is about 1.35 times
    the noise's standard deviation (scikit-learn's ``HuberRegressor`` estimates that scale and
    takes ``epsilon = 1.35`` relative to it). ``alpha`` defaults to 0.01.
    """

    _datafit_name = "huber"
    _datafit_params = ("delta",)
    _parameter_constraints: dict = {**SparseLinearBase._parameter_constraints,
                                    **constraints("delta")}

    def __init__(self, delta=1.35, penalty="l1", penalty_params=None, alpha=0.01, *,
                 l1_ratio=1.0, solver="auto", tol=1e-5, max_iter=None, fit_intercept=True,
                 warm_start=False, scaling="dropout", solver_params=None, verbose=False,
                 positive=False, penalty_weights=None, groups=None, group_l1_ratio=0.0,
                 start="best"):
        self.delta = delta
        _base_params(self, {k: v for k, v in locals().items() if k in _COMMON_KW})


_MIN_SMOOTHING = 1e-12  # the smallest smoothing, relative to the scale of y
# the largest: wider than every residual, the smoothed loss is a quadratic / (2 delta) with no
# trace of the quantile (its curvature 1/delta underflows the solvers' steps beyond ~1e300)
_MAX_SMOOTHING = 1e4


@_with_init_doc
class SparseQuantileRegression(_NamedGLM):
    """Quantile regression with any penalty, on the smoothed pinball loss:
    ``(1/n) sum_i rho_{tau,delta}(y_i - z_i) + alpha sum_j Omega_rho(s_j w_j)``
    (``dualdrop.linear.families.quantile``: the pinball loss ``r (tau - 1{r < 0})`` made
    quadratic on ``[-delta, delta]``, within ``max(tau, 1 - tau) delta / 2`` of it everywhere).

    ``quantile`` (``tau``, default 0.5: the median). ``smoothing`` (``delta``): ``None``
    (default) is ``1e-4`` times a robust scale of ``y`` (``1.4826`` times its median absolute
    deviation, or its standard deviation when that is 0), a number is taken in the units of
    ``y``. The fit reaches it by continuation: the problem is solved at ``delta`` = that scale,
    then at each tenth down to ``smoothing``, each fit warm-started at the previous one
    (``n_iter_`` and ``objective_`` are the last fit's). The last fit runs to ``tol / 1000``:
    near the solution of a piecewise-quadratic loss the semismooth Newton steps converge in a
    few iterations, and fits of the same problem from different data (weighted against repeated
    rows) then agree to rounding, as scikit-learn's estimator checks ask. With the l1 penalty and
    ``scaling="none"`` the objective is then within ``max(tau, 1 - tau) delta / 2`` of
    scikit-learn's ``QuantileRegressor(quantile, alpha)`` (an exact linear program).
    ``alpha`` defaults to 0.01.
    """

    _datafit_name = "quantile"
    _datafit_params = ("quantile",)
    _parameter_constraints: dict = {**SparseLinearBase._parameter_constraints,
                                    **constraints("quantile", "smoothing")}

    def __init__(self, quantile=0.5, smoothing=None, penalty="l1", penalty_params=None,
                 alpha=0.01, *, l1_ratio=1.0, solver="auto", tol=1e-5, max_iter=None,
                 fit_intercept=True, warm_start=False, scaling="dropout", solver_params=None,
                 verbose=False, positive=False, penalty_weights=None, groups=None,
                 group_l1_ratio=0.0, start="best"):
        self.quantile = quantile
        self.smoothing = smoothing
        _base_params(self, {k: v for k, v in locals().items() if k in _COMMON_KW})

    def _datafit_spec(self):
        return "quantile", {"quantile": self.quantile,
                            "delta": getattr(self, "_delta", None) or 1.0}

    def _deltas(self, y, sw=None):
        """The continuation: the robust scale of ``y`` down to ``smoothing`` by factors of 10
        (weighted: integer weights give the scale of the repeated rows)."""
        med = _weighted_median(y, sw)
        scale = 1.4826 * _weighted_median(np.abs(y - med), sw)
        if scale <= 0:
            scale = float(np.sqrt(np.average((y - np.average(y, weights=sw)) ** 2,
                                             weights=sw)))
        if scale <= 0:
            scale = 1.0
        final = 1e-4 * scale if self.smoothing is None else float(self.smoothing)
        if final < _MIN_SMOOTHING * scale:
            # below this the smoothed loss is the pinball loss to float precision, the Newton
            # steps see curvatures of 1/delta, and the continuation has ~300 stages (5e-324
            # ran for minutes)
            raise ValueError(
                f"smoothing={self.smoothing!r} is below {_MIN_SMOOTHING:g} times the scale of y "
                f"({scale:.4g}, 1.4826 times its median absolute deviation): pass smoothing >= "
                f"{_MIN_SMOOTHING * scale:.3g} (None, the default, is 1e-4 times that scale)")
        if final > _MAX_SMOOTHING * scale:
            raise ValueError(
                f"smoothing={self.smoothing!r} is above {_MAX_SMOOTHING:g} times the scale of y "
                f"({scale:.4g}): the loss would be quadratic over every residual, not a quantile "
                f"loss; pass smoothing <= {_MAX_SMOOTHING * scale:.3g} (None, the default, is "
                "1e-4 times that scale)")
        deltas = [final]
        while deltas[-1] * 10.0 < scale:
            deltas.append(deltas[-1] * 10.0)
        return deltas[::-1]

    def _fit_prepared(self, prep, P=None):
        data, dtype = prep
        P = self._check_params() if P is None else P
        deltas = self._deltas(data.y, data.datafit.sample_weight)
        if self.warm_start and hasattr(self, "coef_"):
            deltas = deltas[-1:]  # a warm start is already close: the final delta only
        sw = data.datafit.sample_weight
        warm, tol = self.warm_start, self.tol
        try:
            for k, delta in enumerate(deltas):
                self._delta = delta
                if k == len(deltas) - 1:
                    self.tol = tol * 1e-3  # the last stage: see the class docstring
                data.datafit = self._make_datafit(sw)
                super()._fit_prepared((data, dtype), P)
                self.warm_start = True
        finally:
            self.warm_start, self.tol = warm, tol
            self.__dict__.pop("_delta", None)
        self.smoothing_ = deltas[-1]
        return self

    def _null_gradient(self, X, y, sample_weight=None):
        sw = normalized_sample_weight(sample_weight, np.shape(y)[0])
        self._delta = self._deltas(self._check_target(np.asarray(y, dtype=float)), sw)[-1]
        try:
            return super()._null_gradient(X, y, sample_weight)
        finally:
            self.__dict__.pop("_delta", None)


class SparseCoxRegression(_NamedGLM):
    """Cox proportional hazards with any penalty: the negative log partial likelihood with
    Breslow's ties, averaged over the samples, ``+ alpha sum_j Omega_rho(s_j w_j)``
    (``dualdrop.linear.families.cox``; skglm's ``Cox()``, glmnet's ``family="cox"`` up to its
    scaling). No intercept (the partial likelihood does not see one).

    ``y``: an ``(n, 2)`` array ``[time, event]`` (event 1, censored 0) or a structured array
    of a boolean event and a time (scikit-survival's ``Surv``). ``predict`` gives the risk score
    ``X w`` (higher: earlier events), ``score`` Harrell's concordance index;
    ``predict_cumulative_hazard`` and ``predict_survival_function`` use Breslow's estimate of
    the baseline hazard (``baseline_times_``, ``baseline_cumulative_hazard_``). ``alpha``
    defaults to 0.01.

    Parameters as :class:`~dualdrop.linear.SparseLinearRegression` but ``fit_intercept``.
    """

    _datafit_name = "cox"
    _parameter_constraints: dict = {k: v for k, v in SparseLinearBase._parameter_constraints.items()
                                    if k != "fit_intercept"}
    fit_intercept = False

    def __init__(self, penalty="l1", penalty_params=None, alpha=0.01, *, l1_ratio=1.0,
                 solver="auto", tol=1e-5, max_iter=None, warm_start=False, scaling="dropout",
                 solver_params=None, verbose=False, positive=False, penalty_weights=None,
                 groups=None, group_l1_ratio=0.0,
                 start="best"):
        _base_params(self, {k: v for k, v in locals().items() if k in _COMMON_KW})

    def _fit_prepared(self, prep, P=None):
        super()._fit_prepared(prep, P)
        data, _ = prep
        # Breslow's baseline: H0(t) = sum_{event times t_i <= t} d_i / sum_{j at risk} sw_j e^z_j
        y = data.y
        z = data.design.matvec(data.to_solver(np.asarray(self.coef_, dtype=np.float64), 0.0)[0])
        sw = data.datafit.sample_weight
        sw = np.ones(y.shape[0]) if sw is None else sw
        t, ev = y[:, 0], y[:, 1]
        order = np.argsort(t, kind="stable")
        ts = t[order]
        e = (sw * np.exp(z - z.max()))[order]
        rev = np.cumsum(e[::-1])[::-1]  # the risk-set sums, at each sorted position
        times = np.unique(t[ev == 1])
        first = np.searchsorted(ts, times, side="left")
        dcum = np.concatenate([[0.0], np.cumsum((sw * ev)[order])])
        deaths = dcum[np.searchsorted(ts, times, side="right")] - dcum[first]
        self.baseline_times_ = times
        self.baseline_cumulative_hazard_ = np.cumsum(deaths / rev[first]) * np.exp(-z.max())
        return self

    def predict(self, X):
        """The risk score ``X w`` (no intercept)."""
        return self._linear_predictor(X)

    def predict_cumulative_hazard(self, X, times):
        """``H(t | x) = H0(t) exp(x w)`` at ``times``: an array of shape ``(n_samples,
        len(times))``; ``H0`` is Breslow's step function (0 before the first event time)."""
        check_is_fitted(self)
        times = np.asarray(times, dtype=np.float64).ravel()
        idx = np.searchsorted(self.baseline_times_, times, side="right") - 1
        H0 = np.where(idx >= 0, self.baseline_cumulative_hazard_[np.maximum(idx, 0)], 0.0)
        return np.exp(self.predict(X))[:, None] * H0[None, :]

    def predict_survival_function(self, X, times):
        """``S(t | x) = exp(-H(t | x))`` at ``times``, shape ``(n_samples, len(times))``."""
        return np.exp(-self.predict_cumulative_hazard(X, times))


def _weighted_median(v, sw=None):
    """The median of ``v`` with weights ``sw`` (``None``: unweighted): the smallest value whose
    cumulative weight reaches half, averaged with the next when it lands exactly on half (the
    ordinary median when the weights are equal integers, as for repeated rows)."""
    if sw is None:
        return float(np.median(v))
    order = np.argsort(v, kind="stable")
    vs, ws = v[order], sw[order]
    keep = ws > 0
    vs, ws = vs[keep], ws[keep]
    c = np.cumsum(ws)
    half = 0.5 * c[-1]
    k = int(np.searchsorted(c, half, side="left"))
    if np.isclose(c[k], half, rtol=1e-12, atol=0.0) and k + 1 < vs.size:
        return 0.5 * float(vs[k] + vs[k + 1])
    return float(vs[k])


def concordance_index(time, event, risk, sample_weight=None):
    """Harrell's concordance index: among the comparable pairs (the earlier time is an event),
    the share whose earlier-failing sample has the higher ``risk`` (ties in ``risk`` count
    one half). O(n^2) memory-free loop over events; weights multiply each pair by the product
    of its samples' weights."""
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event, dtype=np.float64)
    risk = np.asarray(risk, dtype=np.float64)
    sw = np.ones(time.shape[0]) if sample_weight is None else np.asarray(sample_weight, float)
    num = den = 0.0
    for i in np.flatnonzero(event == 1):
        later = time > time[i]
        wts = sw[i] * sw[later]
        num += float(np.sum(wts * ((risk[i] > risk[later]) + 0.5 * (risk[i] == risk[later]))))
        den += float(np.sum(wts))
    if den == 0:
        raise ValueError("no comparable pair: the concordance index needs an event before "
                         "another sample's time")
    return num / den
