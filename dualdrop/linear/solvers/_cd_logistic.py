"""The compiled proximal Newton inner solver of ``solvers.cd`` for the logistic loss.

Each Newton step builds the quadratic model of the mean logistic loss at the current point on the
working set and minimizes it (plus the penalty) by proximal coordinate descent, then a
backtracking line search on the true objective (``solvers.cd`` runs the working-set outer loop).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._jit import col_dot, col_wnorm2, penalty_sum, prox_step


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
    ``tol_in``, and otherwise always takes the direction it computed. (Judging convergence by the
    size of the first coordinate-descent pass instead is wrong on badly scaled, correlated
    columns: after one large column moves, the others barely do, and the step was discarded
    while the point was far from optimal.)"""
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
        sH = H.sum()
        elim = fit_intercept and sH > 1e-300
        crit = abs(G.sum()) if fit_intercept else 0.0
        for jj in range(nws):
            j = ws[jj]
            hjj[jj] = col_wnorm2(X, data, indices, indptr, is_sparse, j, H)
            if elim:
                hx[jj] = col_dot(X, data, indices, indptr, is_sparse, j, H)
                hjj[jj] -= hx[jj] * hx[jj] / sH  # curvature of the H-centred column
            L = lips[j]
            if L > 0.0:
                g = col_dot(X, data, indices, indptr, is_sparse, j, G)
                s_j = L * abs(w[j] - prox_step(code, params, w[j] - g / L, lam_w[j] / L,
                                               positive))
                if s_j > crit:
                    crit = s_j
        if crit <= tol_in:
            break
        # Newton direction: minimize the quadratic model of the loss plus the penalty over
        # (d, db) by coordinate descent. The intercept step db is kept at its exact minimizer
        # for the current d (db = -sum(u) / sH with u = G + H o (X d)); each coordinate then moves
        # along (e_j, -hx_j / sH), i.e. on the H-weighted centred column, whose curvature is
        # hjj - hx_j^2 / sH. Raw columns with large means are nearly collinear with the
        # intercept; updating them and the intercept one after the other converges at the rate
        # of that collinearity (hundreds of passes on raw breast_cancer or wine features).
        u[:] = G
        Xd[:] = 0.0
        d[:] = 0.0
        db = -G.sum() / sH if elim else 0.0
        for cd in range(max_cd):
            maxd = 0.0
            for jj in range(nws):
                j = ws[jj]
                L = hjj[jj]
                if L <= 1e-300:
                    continue
                cur = w[j] + d[jj]
                grad = col_dot(X, data, indices, indptr, is_sparse, j, u) + db * hx[jj]
                new = prox_step(code, params, cur - grad / L, lam_w[j] / L, positive)
                if new != cur:
                    delta = new - cur
                    d[jj] += delta
                    if is_sparse:
                        for k in range(indptr[j], indptr[j + 1]):
                            i = indices[k]
                            Xd[i] += delta * data[k]
                            u[i] += delta * H[i] * data[k]
                    else:
                        for i in range(n):
                            Xd[i] += delta * X[i, j]
                            u[i] += delta * H[i] * X[i, j]
                    if elim:
                        db -= delta * hx[jj] / sH
                    dd = L * abs(delta)
                    if dd > maxd:
                        maxd = dd
            if maxd <= 0.3 * tol_in:
                break
        if db != 0.0:
            for i in range(n):
                Xd[i] += db
        # Backtracking on the step t. A step is accepted when
        #   P(w + t d) - P(w) + t <grad L(z + t Xd), Xd> < 0,
        # which implies a decrease of the objective (L is convex: L(z_t) - L(z) <= t <grad L(z_t),
        # Xd>) and, unlike comparing objective values, does not cancel catastrophically near the
        # optimum when the columns are large (raw features): the datafit difference is never
        # formed. Plain objective decrease is accepted as well.
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
