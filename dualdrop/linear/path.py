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
from joblib import Parallel, delayed
from sklearn.base import clone

from . import _penalty
from .datafits import Logistic, Quadratic
from .estimators import SparseLinearRegression, SparseLogisticRegression

__all__ = ["alpha_max", "regularization_path"]


def _gradient_at_zero(X, y, datafit, fit_intercept, scaling, penalty, penalty_params):
    """``(|g|, L)`` over the features with ``L > 0``, stacked over the binary problems a
    multiclass logistic fit solves (one-vs-rest: ``w = 0`` must be stationary for every class)."""
    from sklearn.utils import check_array

    est = _estimator(datafit, penalty, penalty_params, 1.0, fit_intercept, scaling)
    X = check_array(X, accept_sparse="csc", dtype=np.float64)
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got an array of shape {y.shape}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} samples but y has {y.shape[0]}; pass one target per "
                         "row of X")
    design = est._scaled_design(X, est._scales(X))
    if datafit == "logistic":
        classes = np.unique(y)
        if classes.size < 2:
            raise ValueError(f"y has a single class ({classes[0]!r}); logistic needs two or more")
        targets = classes[1:] if classes.size == 2 else classes
        ys = [np.where(y == c, 1.0, -1.0) for c in targets]
        df = Logistic()
    else:
        ys = [np.asarray(y, dtype=np.float64)]
        df = Quadratic()
    L = df.lipschitz(design.col_norms2, design.n)
    keep = L > 0
    gs = []
    for yk in ys:
        b0 = df.intercept_init(yk) if fit_intercept else 0.0
        gs.append(np.abs(design.rmatvec(df.raw_grad(yk, np.full(yk.shape[0], b0))))[keep])
    return np.concatenate(gs), np.tile(L[keep], len(ys))


def alpha_max(X, y, penalty="l1", penalty_params=None, datafit="quadratic", fit_intercept=True,
              scaling="dropout"):
    """Smallest ``alpha`` for which ``w = 0`` is a stationary point (see the module docstring).

    For multiclass logistic the largest over the one-vs-rest problems; ``y`` may hold any class
    labels the estimator accepts (strings included)."""
    g, L = _gradient_at_zero(X, y, datafit, fit_intercept, scaling, penalty, penalty_params)
    return alpha_max_from_gradient(g, L, penalty, penalty_params)


def alpha_max_from_gradient(g, L, penalty="l1", penalty_params=None):
    """Smallest ``alpha`` with ``prox_{alpha Omega / L_j}(g_j / L_j) = 0`` for every ``j``, given
    the gradient magnitudes ``g`` (``|g_j|``, or the row norms ``||g_j||_2`` of a multi-output
    gradient: the block prox is 0 exactly when the scalar prox of the norm is) and the
    curvatures ``L`` of the features with ``L > 0``."""
    follow = _penalty.follows_alpha(penalty_params)

    def pen(a):  # MCP/SCAD with lam following alpha change shape with alpha
        return _penalty.resolve_penalty(penalty, penalty_params, alpha=a if follow else None)

    P = pen(1.0)
    if g.size == 0 or not np.any(g):
        return 0.0
    gmax = float(np.max(g))

    def all_zero(a):
        return not np.any(np.asarray((pen(a) if follow else P).prox(g / L, a / L)))

    d0 = _penalty.right_derivative_at_zero(P)
    if d0 == 0.0:
        return gmax  # smooth at 0: no alpha gives exact zeros
    # bracket [lo, hi] with all_zero(hi) and not all_zero(lo), by factors of 10 from the convex
    # guess ||g||_inf / Omega'(0+) (which is exact for convex penalties; Omega'(0+) is huge for
    # Lp with p < 1, whose threshold is set by the jump of the prox instead), then bisect on a
    # log scale
    guess = gmax / d0 if np.isfinite(d0) and gmax / d0 > 0 else gmax
    lo = hi = guess
    if all_zero(hi):
        for _ in range(700):
            lo = hi / 10.0
            if lo == 0.0 or not all_zero(lo):
                break
            hi = lo
        else:
            return 0.0
    else:
        for _ in range(700):
            lo, hi = hi, 10.0 * hi
            if not np.isfinite(hi):
                return gmax  # no alpha gives exact zeros
            if all_zero(hi):
                break
        else:
            return gmax
    for _ in range(200):
        mid = np.sqrt(lo * hi) if lo > 0 else 0.5 * hi
        if all_zero(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-13 * hi:
            break
    return float(hi)


def _estimator(datafit, penalty, penalty_params, alpha, fit_intercept, scaling, **kw):
    cls = {"quadratic": SparseLinearRegression, "logistic": SparseLogisticRegression}.get(datafit)
    if cls is None:
        raise ValueError(f"datafit must be 'quadratic' or 'logistic', got {datafit!r}")
    return cls(penalty=penalty, penalty_params=penalty_params, alpha=alpha,
               fit_intercept=fit_intercept, scaling=scaling, **kw)


def _run_chunk(est, X, y, alphas):
    est = clone(est).set_params(warm_start=True)
    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for a in alphas:
            est.set_params(alpha=float(a)).fit(X, y)
            out.append((np.array(est.coef_, copy=True), np.copy(est.intercept_), est.n_iter_,
                        est.criterion_))
    return out, [str(w.message) for w in caught]


def regularization_path(X, y, penalty="l1", penalty_params=None, *, alphas=None, n_alphas=30,
                        alpha_min_ratio=1e-3, datafit="quadratic", solver="auto", tol=1e-5,
                        max_iter=None, fit_intercept=True, scaling="dropout", n_jobs=None,
                        solver_params=None):
    """Fit along a decreasing ``alpha`` grid with warm starts.

    Returns a dict with ``alphas`` (decreasing), ``coefs`` (``n_alphas x p``, or
    ``n_alphas x K x p`` for multiclass logistic), ``intercepts``, ``n_iter``, ``criterion``.
    Convergence warnings of individual fits are re-raised once, summarized.
    """
    if alphas is None:
        if not (isinstance(n_alphas, (int, np.integer)) and n_alphas >= 1):
            raise ValueError(f"n_alphas must be a positive integer, got {n_alphas!r}")
        if not (0 < alpha_min_ratio < 1):
            raise ValueError(f"alpha_min_ratio must be in (0, 1), got {alpha_min_ratio!r}")
        amax = alpha_max(X, y, penalty, penalty_params, datafit, fit_intercept, scaling)
        alphas = amax * np.logspace(0, np.log10(alpha_min_ratio), n_alphas)
    alphas = np.sort(np.asarray(alphas, dtype=np.float64).ravel())[::-1]
    if alphas.size == 0 or np.any(~np.isfinite(alphas)) or np.any(alphas < 0):
        raise ValueError("alphas must be a non-empty array of finite numbers >= 0")
    est = _estimator(datafit, penalty, penalty_params, float(alphas[0]), fit_intercept, scaling,
                     solver=solver, tol=tol, max_iter=max_iter, solver_params=solver_params)
    n_jobs = 1 if n_jobs is None else int(n_jobs)
    chunks = [c for c in np.array_split(alphas, max(1, min(n_jobs, alphas.size))) if c.size]
    if len(chunks) == 1:
        results = [_run_chunk(est, X, y, chunks[0])]
    else:
        results = Parallel(n_jobs=len(chunks))(delayed(_run_chunk)(est, X, y, c) for c in chunks)
    fits = [f for r, _ in results for f in r]
    msgs = [m for _, ms in results for m in ms]
    if msgs:
        from sklearn.exceptions import ConvergenceWarning

        warnings.warn(f"{len(msgs)} of {alphas.size} fits on the path did not converge; first: "
                      f"{msgs[0]}", ConvergenceWarning, stacklevel=2)
    return {
        "alphas": alphas,
        "coefs": np.array([f[0] for f in fits]),
        "intercepts": np.array([f[1] for f in fits]),
        "n_iter": [f[2] for f in fits],
        "criterion": [f[3] for f in fits],
    }
