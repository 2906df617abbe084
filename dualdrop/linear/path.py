"""Regularization paths: fits over a decreasing grid of ``alpha`` with warm starts.

``alpha_max`` is the smallest ``alpha`` at which ``w = 0`` is a fixed point of the coordinate
prox-gradient step every solver's criterion uses: ``prox_{alpha Omega / L_j}(g_j / L_j) = 0`` for
all ``j`` (``g = grad_w L(0, b0)`` on the scaled design, ``b0`` the best intercept). For convex
penalties this is ``||g||_inf / Omega'(0+)``; for nonconvex ones it is found by bracketing and
bisection on that condition (the prox of MCP with a small ``a lam`` can jump away from 0 where 0
is first-order stationary, and Lp with p < 1 has ``Omega'(0+) = inf`` but a finite prox
threshold). For multiclass logistic it is the largest over the one-vs-rest problems. For
penalties smooth at 0 (no exact zeros) the L1 value ``||g||_inf`` is returned.

Warm starts are sequential by nature; with ``n_jobs > 1`` the grid is cut into
``n_jobs`` contiguous chunks solved in parallel by joblib, each chunk warm-started along itself
(this pays on long grids and large problems).
"""

from __future__ import annotations

import warnings

import numpy as np
from joblib import Parallel, delayed, effective_n_jobs
from sklearn.base import clone
from sklearn.utils._param_validation import StrOptions, validate_params

from . import _penalty
from ._validation import check_path_data, constraints
from .datafits import available_datafits, normalized_sample_weight
from .estimators import SparseLinearRegression, SparseLogisticRegression

__all__ = ["alpha_max", "estimator_alpha_max", "regularization_path"]


def _gradient_at_zero(est, X, y, sample_weight=None):
    """``(|g|, L, scaling)`` over the penalized features with ``L > 0``, stacked over the binary
    problems a multiclass logistic fit solves (one-vs-rest: ``w = 0`` must be stationary for
    every class). The problem is the one the estimator ``est`` hands its solver (scaled columns,
    sample weights, the intercept at its best value for ``w = 0``)."""
    if hasattr(est, "_null_gradient"):  # the GLM estimators and the multinomial
        return est._null_gradient(X, y, sample_weight)
    logistic = isinstance(est, SparseLogisticRegression)
    X, y = check_path_data(X, y, y_numeric=not logistic)
    sw = normalized_sample_weight(sample_weight, X.shape[0])
    if logistic:
        classes = np.unique(y)
        if classes.size < 2:
            raise ValueError(f"y has a single class ({classes[0]!r}); logistic needs two or more")
        targets = classes[1:] if classes.size == 2 else classes
        ys = [np.where(y == c, 1.0, -1.0) for c in targets]
    else:
        ys = [np.asarray(y, dtype=np.float64)]
    data = est._fit_data(X, ys[0], sw)
    df = data.datafit
    p = X.shape[1]
    L = df.lipschitz(data.design)[:p]
    keep = L > 0
    gs = []
    for yk in ys:
        yk = data.y if not logistic else yk
        if data.extra:  # the intercept column at its best value: the weighted mean of y
            u0, b0 = data.to_solver(np.zeros(p), float(np.sum(sw * y)) / y.shape[0])[0], 0.0
        else:
            u0 = np.zeros(p)
            b0 = df.intercept_init(yk) if data.fit_intercept else 0.0
        z = data.design.matvec(u0) + b0
        gs.append(np.abs(data.design.rmatvec(df.raw_grad(yk, z)))[:p][keep])
    return np.concatenate(gs), np.tile(L[keep], len(ys)), data.scaling


def _user_penalty(est):
    """``pen(a)``: the estimator's penalty (with its ridge term) at ``alpha = a``."""
    follow = _penalty.follows_alpha(est.penalty_params)

    def pen(a):
        P = _penalty.resolve_penalty(est.penalty, est.penalty_params, alpha=a if follow else None)
        return _penalty.with_ridge(P, est.l1_ratio)

    return pen


def _group_alpha_max(est, X, y, sample_weight=None):
    """:func:`estimator_alpha_max` with ``groups``: the largest over the binary problems of
    ``_groups.group_alpha_max`` on the problem the estimator builds (in the solver's units,
    then the user's)."""
    from ._groups import group_alpha_max

    prep = est._prepare(X, y, sample_weight)
    data = prep[0]
    ys = prep[2] if isinstance(est, SparseLogisticRegression) else [data.y]
    user_pen = _user_penalty(est)
    follow = _penalty.follows_alpha(est.penalty_params)
    scaling = data.scaling
    k = 0.0 if scaling.trivial else scaling.rescale(user_pen(1.0))[1]

    def to_user(a):
        return a if scaling.trivial else scaling.from_solver_alpha(a, k)

    def pen_at(a):  # the solver's penalty of the group norms at the solver's alpha a
        P, _ = scaling.solver_penalty(user_pen(to_user(a)), to_user(a))
        return P.penalty if isinstance(P, _penalty.WithRidge) else P

    best = 0.0
    for yk in ys:
        pr = est._problem(data, yk, user_pen(1.0), 1.0)
        w0 = np.zeros(pr.p)
        if data.extra:  # the intercept column at its best value (it is unpenalized)
            d = data.design.matrix[:, -1].toarray().ravel()
            w0 = data.to_solver(np.zeros(pr.p - 1), float(d @ data.y) / pr.n)[0]
        grad = pr.design.rmatvec(pr.datafit.raw_grad(pr.y, pr.z(w0, pr.initial_intercept())))
        a = group_alpha_max(grad, pr.Lg, pr.groups, pr.group_weights, pr.penalty, pr.l1_ratio,
                            pr.group_l1_ratio, pen_at if follow else None)
        best = max(best, to_user(a))
    return best


def estimator_alpha_max(est, X, y, sample_weight=None):
    """The smallest ``alpha`` for which ``est`` (an unfitted estimator: its penalty, datafit,
    scaling, ``groups``, ``l1_ratio`` are used, its ``alpha`` is not) returns ``w = 0``."""
    est = clone(est)
    est._validate_params()
    P = est._check_params()
    if getattr(P, "is_separable", True) is False:
        raise ValueError(
            f"alpha_max is not defined for penalty={est.penalty!r}: {P!r} is a constraint on "
            "the number of nonzeros, not a penalty that alpha scales, so no alpha makes every "
            "coefficient 0; choose its k instead, or pass a separable penalty (l1, mcp, logsum, "
            "...)")
    if getattr(est, "groups", None) is not None:
        return _group_alpha_max(est, X, y, sample_weight)
    g, L, scale = _gradient_at_zero(est, X, y, sample_weight)
    return alpha_max_from_gradient(g, L, est.penalty, est.penalty_params, l1_ratio=est.l1_ratio,
                                   scaling=scale)


_DATAFIT = {"datafit": [StrOptions(set(available_datafits()))]}


@validate_params(constraints("X", "y", "penalty", "penalty_params", "fit_intercept", "scaling",
                             "l1_ratio", "sample_weight", "groups", "group_l1_ratio",
                             "datafit_params", **_DATAFIT),
                 prefer_skip_nested_validation=True)
def alpha_max(X, y, penalty="l1", penalty_params=None, datafit="quadratic", fit_intercept=True,
              scaling="dropout", *, l1_ratio=1.0, sample_weight=None, groups=None,
              group_l1_ratio=0.0, datafit_params=None):
    """Smallest ``alpha`` for which ``w = 0`` is a stationary point (see the module docstring).

    For multiclass logistic the largest over the one-vs-rest problems; ``y`` may hold any class
    labels the estimator accepts (strings included). ``l1_ratio``, ``sample_weight``,
    ``groups`` and ``group_l1_ratio`` as in the estimators (``l1_ratio < 1`` divides the convex
    value by ``l1_ratio``, as scikit-learn's ElasticNet grid does); ``datafit`` any name of
    ``datafits.available_datafits()`` with its ``datafit_params``."""
    est = _estimator(datafit, penalty, penalty_params, 1.0, fit_intercept, scaling,
                     l1_ratio=l1_ratio, groups=groups, group_l1_ratio=group_l1_ratio,
                     datafit_params=datafit_params)
    return estimator_alpha_max(est, X, y, sample_weight)


def alpha_max_from_gradient(g, L, penalty="l1", penalty_params=None, *, l1_ratio=1.0,
                            scaling=None):
    """Smallest ``alpha`` with ``prox_{alpha Omega / L_j}(g_j / L_j) = 0`` for every ``j``, given
    the gradient magnitudes ``g`` (``|g_j|``, or the row norms ``||g_j||_2`` of a multi-output
    gradient: the block prox is 0 exactly when the scalar prox of the norm is) and the
    curvatures ``L`` of the features with ``L > 0``; ``l1_ratio`` as in the estimators.
    ``scaling`` (:class:`._scale.Scaling`): ``g`` and ``L`` are those of the solver's rescaled
    problem; the answer is in the user's units."""
    follow = _penalty.follows_alpha(penalty_params)

    def user_pen(a):  # MCP/SCAD with lam following alpha change shape with alpha
        P = _penalty.resolve_penalty(penalty, penalty_params, alpha=a if follow else None)
        return _penalty.with_ridge(P, l1_ratio)

    if scaling is None or scaling.trivial:
        pen, to_user = user_pen, float
    else:
        k = scaling.rescale(user_pen(1.0))[1]

        def to_user(a):
            return scaling.from_solver_alpha(a, k)

        def pen(a):  # the solver's penalty at the solver's alpha a
            return scaling.rescale(user_pen(to_user(a)))[0]

    P = pen(1.0)
    if g.size == 0 or not np.any(g):
        return 0.0
    return to_user(_solver_alpha_max(g, L, P, pen, follow))


def _solver_alpha_max(g, L, P, pen, follow):
    """:func:`alpha_max_from_gradient` in the solver's units: ``P`` the penalty, ``pen(a)`` the
    penalty at ``alpha = a`` (it changes with ``a`` only when ``follow``)."""
    gmax = float(np.max(g))

    def all_zero(a):
        return not np.any(np.asarray((pen(a) if follow else P).prox(g / L, a / L)))

    d0 = _penalty.right_derivative_at_zero(P)
    if d0 == 0.0:
        return gmax  # smooth at 0: no alpha gives exact zeros
    # from the convex guess ||g||_inf / Omega'(0+) (exact for convex penalties; Omega'(0+) is
    # huge for Lp with p < 1, whose threshold is set by the jump of the prox instead)
    guess = gmax / d0 if np.isfinite(d0) and gmax / d0 > 0 else gmax
    return _penalty.smallest_zero_alpha(all_zero, guess, fallback=gmax)


def _estimator(datafit, penalty, penalty_params, alpha, fit_intercept, scaling,
               datafit_params=None, **kw):
    """The estimator of ``datafit`` (a name of ``datafits.available_datafits()``) with these
    parameters, validated as its ``fit`` would."""
    from .glm import GLM_DATAFITS, SparseGLM
    from .multinomial import SparseMultinomialRegression

    common = dict(penalty=penalty, penalty_params=penalty_params, alpha=alpha, scaling=scaling,
                  **kw)
    if datafit in GLM_DATAFITS:
        est = SparseGLM(datafit=datafit, datafit_params=datafit_params,
                        fit_intercept=fit_intercept, **common)
        est._validate_params()
        return est
    cls = {"quadratic": SparseLinearRegression, "logistic": SparseLogisticRegression,
           "multinomial": SparseMultinomialRegression}.get(datafit)
    if cls is None:
        raise ValueError(f"datafit must be one of {available_datafits()}, got {datafit!r}")
    if datafit_params:
        raise ValueError(f"datafit_params is for the datafits with parameters "
                         f"(huber, quantile), not {datafit!r}")
    if cls is SparseMultinomialRegression:
        if common.pop("groups", None) is not None or common.pop("group_l1_ratio", 0.0):
            raise ValueError("groups= is not available with the multinomial datafit: its "
                             "penalty already groups each feature's row of coefficients")
    est = cls(fit_intercept=fit_intercept, **common)
    est._validate_params()
    return est


def fit_path_chunk(est, X, y, alphas, sample_weight=None, callback=None):
    """Fit ``est`` at each alpha of ``alphas`` (decreasing), each fit warm-started at the previous
    one; ``callback(fitted_est)`` runs after each fit. Returns the fits and the warnings."""
    est = clone(est).set_params(warm_start=True, alpha=float(alphas[0]))
    est._validate_params()
    # the data are checked and prepared once; the penalty too unless it follows alpha
    prep = est._prepare(X, y, sample_weight)
    P = None if _penalty.follows_alpha(est.penalty_params) else est._check_params()
    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = getattr(est, "_path_prepared", None)
        if P is not None and compiled is not None:  # the whole path in compiled code
            out = compiled(prep, P, alphas, callback)
            if out is not None:
                return out, [str(w.message) for w in caught]
            out = []
        for a in alphas:
            est.alpha = float(a)
            est._fit_prepared(prep, P)
            out.append((np.array(est.coef_, copy=True), np.copy(est.intercept_), est.n_iter_,
                        est.criterion_))
            if callback is not None:
                callback(est)
    return out, [str(w.message) for w in caught]


def warn_unconverged(msgs, n_fits, what="path"):
    """One ConvergenceWarning summarizing the fits of a path that did not converge."""
    if msgs:
        from sklearn.exceptions import ConvergenceWarning

        warnings.warn(f"{len(msgs)} of {n_fits} fits on the {what} did not converge; first: "
                      f"{msgs[0]}", ConvergenceWarning, stacklevel=3)


def alpha_grid(X, y, n_alphas, ratio, *, estimator, sample_weight=None,
               names=("n_alphas", "alpha_min_ratio")):
    """``n_alphas`` values from ``alpha_max`` of ``estimator`` (:func:`estimator_alpha_max`)
    down to ``ratio * alpha_max``, evenly spaced on a log scale (scikit-learn's grid for
    ``ratio = eps``). ``names``: the caller's names of the two arguments, for the error
    messages."""
    if not (isinstance(n_alphas, (int, np.integer)) and not isinstance(n_alphas, bool)
            and n_alphas >= 1):
        raise ValueError(f"{names[0]} must be a positive integer, got {n_alphas!r}")
    if not (isinstance(ratio, (int, float, np.floating)) and 0 < ratio < 1):
        raise ValueError(f"{names[1]} must be in (0, 1), got {ratio!r}")
    amax = estimator_alpha_max(estimator, X, y, sample_weight)
    return amax * np.logspace(0, np.log10(ratio), int(n_alphas))


def check_alphas(alphas):
    """A user's alpha grid, sorted decreasing; ``ValueError`` naming ``alphas`` otherwise."""
    alphas = np.sort(np.asarray(alphas, dtype=np.float64).ravel())[::-1]
    if alphas.size == 0 or np.any(~np.isfinite(alphas)) or np.any(alphas < 0):
        raise ValueError("alphas must be a non-empty array of finite numbers >= 0")
    return alphas


@validate_params(constraints("X", "y", "penalty", "penalty_params", "n_alphas",
                             "alpha_min_ratio", "solver", "tol", "max_iter", "fit_intercept",
                             "scaling", "n_jobs", "solver_params", "l1_ratio", "sample_weight",
                             "groups", "group_l1_ratio", "datafit_params",
                             alphas=["array-like", None], **_DATAFIT),
                 prefer_skip_nested_validation=True)
def regularization_path(X, y, penalty="l1", penalty_params=None, *, alphas=None, n_alphas=30,
                        alpha_min_ratio=1e-3, datafit="quadratic", solver="auto", tol=1e-5,
                        max_iter=None, fit_intercept=True, scaling="dropout", n_jobs=None,
                        solver_params=None, l1_ratio=1.0, sample_weight=None, groups=None,
                        group_l1_ratio=0.0, datafit_params=None):
    """Fit along a decreasing ``alpha`` grid with warm starts.

    Returns a dict with ``alphas`` (decreasing), ``coefs`` (``n_alphas x p``, or
    ``n_alphas x K x p`` for multiclass logistic and the multinomial), ``intercepts``,
    ``n_iter``, ``criterion``. ``l1_ratio``, ``sample_weight``, ``groups`` and
    ``group_l1_ratio`` as in the estimators; ``datafit`` any name of
    ``datafits.available_datafits()`` (``"poisson"``, ``"cox"``, ...) with its
    ``datafit_params``. Convergence warnings of individual fits are re-raised once,
    summarized.
    """
    est = _estimator(datafit, penalty, penalty_params, 1.0, fit_intercept, scaling,
                     solver=solver, tol=tol, max_iter=max_iter, solver_params=solver_params,
                     l1_ratio=l1_ratio, groups=groups, group_l1_ratio=group_l1_ratio,
                     datafit_params=datafit_params)
    if alphas is None:
        alphas = alpha_grid(X, y, n_alphas, alpha_min_ratio, estimator=est,
                            sample_weight=sample_weight)
    alphas = check_alphas(alphas)
    est.set_params(alpha=float(alphas[0]))
    n_jobs = effective_n_jobs(n_jobs)  # joblib's reading of None and -1, -2, ...
    chunks = [c for c in np.array_split(alphas, max(1, min(n_jobs, alphas.size))) if c.size]
    if len(chunks) == 1:
        results = [fit_path_chunk(est, X, y, chunks[0], sample_weight)]
    else:
        results = Parallel(n_jobs=len(chunks))(
            delayed(fit_path_chunk)(est, X, y, c, sample_weight) for c in chunks)
    fits = [f for r, _ in results for f in r]
    warn_unconverged([m for _, ms in results for m in ms], alphas.size)
    return {
        "alphas": alphas,
        "coefs": np.array([f[0] for f in fits]),
        "intercepts": np.array([f[1] for f in fits]),
        "n_iter": [f[2] for f in fits],
        "criterion": [f[3] for f in fits],
    }
