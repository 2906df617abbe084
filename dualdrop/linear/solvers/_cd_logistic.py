"""The compiled proximal Newton inner solver of ``solvers.cd`` for the logistic loss.

Each Newton step builds the quadratic model of the mean logistic loss at the current point on the
working set and minimizes it (plus the penalty) by proximal coordinate descent, then a
backtracking line search on the true objective (``solvers.cd`` runs the working-set outer loop).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._jit import penalty_sum
from ._newton import newton_direction, ws_violation


@njit(cache=True)
def _log1pexp_neg(m):
    """``log(1 + exp(-m))``, stable."""
    if m > 0:
        return np.log1p(np.exp(-m))
    return -m + np.log1p(np.exp(m))


@njit(cache=True)
def _logistic_value(y, z, sw):
    s = 0.0
    for i in range(y.shape[0]):
        s += sw[i] * _log1pexp_neg(y[i] * z[i])
    return s / y.shape[0]


@njit(cache=True)
def inner_logistic(X, data, indices, indptr, is_sparse, y, sw, ws, w, z, b, fit_intercept, lips,
                   lam_w, code, params, positive, tol_in, max_newton, max_cd):
    """Proximal Newton on the working set; updates ``w`` and ``z = X w + b`` in place.
    Returns ``(newton_steps, b)``. ``sw``: sample weights (mean 1; ones when unweighted).

    Each Newton step stops when the working-set criterion *at the current point* (the gradient
    mapping with the problem's Lipschitz constants ``lips``, as in the outer loop) is below
    ``tol_in``, and otherwise always takes the direction it computed (``_newton.
    newton_direction``). (Judging convergence by the size of the first coordinate-descent pass
    instead is wrong on badly scaled, correlated columns: after one large column moves, the
    others barely do, and the step was discarded while the point was far from optimal.)"""
    n = y.shape[0]
    nws = ws.shape[0]
    G = np.empty(n)
    H = np.empty(n)
    u = np.empty(n)
    Xd = np.empty(n)
    d = np.empty(nws)
    hjj = np.empty(nws)
    hx = np.zeros(nws)
    it = 0
    for it in range(max_newton):
        for i in range(n):
            s = 1.0 / (1.0 + np.exp(-y[i] * z[i]))
            G[i] = -sw[i] * y[i] * (1.0 - s) / n
            H[i] = sw[i] * s * (1.0 - s) / n
        if ws_violation(X, data, indices, indptr, is_sparse, ws, w, G, lips, lam_w, code,
                        params, positive, fit_intercept) <= tol_in:
            break
        db = newton_direction(X, data, indices, indptr, is_sparse, ws, w, G, H, fit_intercept,
                              lam_w, code, params, positive, tol_in, max_cd, d, Xd, hjj, hx, u)
        # the backtracking of _newton.line_search (its acceptance rule), compiled
        P0 = penalty_sum(w, ws, lam_w, code, params)
        F0 = _logistic_value(y, z, sw) + P0
        w0 = np.empty(nws)
        for jj in range(nws):
            w0[jj] = w[ws[jj]]
        t = 1.0
        accepted = False
        zt = np.empty(n)
        for ls in range(40):
            slope = 0.0
            for i in range(n):
                zt[i] = z[i] + t * Xd[i]
                slope -= sw[i] * y[i] * Xd[i] / (1.0 + np.exp(y[i] * zt[i]))
            for jj in range(nws):
                w[ws[jj]] = w0[jj] + t * d[jj]
            Pt = penalty_sum(w, ws, lam_w, code, params)
            if Pt - P0 + t * slope / n < 0.0 or _logistic_value(y, zt, sw) + Pt <= F0:
                accepted = True
                break
            t *= 0.5
        if not accepted:
            for jj in range(nws):
                w[ws[jj]] = w0[jj]
            break
        z[:] = zt
        b += t * db
    return it + 1, b
