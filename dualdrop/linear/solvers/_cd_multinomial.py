"""Proximal Newton with working sets for the multinomial logistic model
(``dualdrop.linear.multinomial.MultinomialProblem``): ``K`` outputs that share one design.

The scheme of ``_newton`` with a row of ``K`` coefficients per feature. The model of the loss at
``Z = X W + b`` is ``sum_k [G_k . X D_k + 1/2 sum_i H_ik (X D_k + db_k)_i^2]`` (``G = dL/dZ``,
``H`` the diagonal of each sample's Hessian, ``dualdrop.linear.families.multinomial``), minimized
over the working set's rows by coordinate descent: with ``grouped`` (glmnet's grouped
multinomial: the penalty acts on each row's norm ``||W_j||``) one block step per row with the
block prox (``_jit.block_prox``) and the largest of its ``K`` curvatures, otherwise one scalar
step per coefficient. Each class's intercept is kept at its exact minimizer, the coordinates
moving on the ``H_k``-weighted centred columns as in the single-output kernel. Then the line
search of ``_newton.line_search`` on the true loss.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._jit import block_prox, block_scores, col_dot, col_wnorm2, penalty_sum, prox_step
from ._newton import line_search, working_set_loop


@njit(cache=True)
def multinomial_direction(X, data, indices, indptr, is_sparse, ws, W, G, H, fit_intercept, lam_w,
                          code, params, grouped, positive, tol_in, max_cd, D, XD, hjj, hx, U,
                          db):
    """Minimize the model over the rows ``ws``; ``G``, ``H``, ``U``, ``XD``: ``K x n``
    (class-major), ``D``, ``hjj``, ``hx``: ``len(ws) x K``, ``db``: ``K`` (all written in place;
    ``XD`` includes ``db``)."""
    K, n = G.shape
    nws = ws.shape[0]
    sH = np.empty(K)
    elim = np.empty(K, dtype=np.bool_)
    for k in range(K):
        sH[k] = H[k].sum()
        elim[k] = fit_intercept and sH[k] > 1e-300
    for jj in range(nws):
        j = ws[jj]
        for k in range(K):
            hjj[jj, k] = col_wnorm2(X, data, indices, indptr, is_sparse, j, H[k])
            if elim[k]:
                hx[jj, k] = col_dot(X, data, indices, indptr, is_sparse, j, H[k])
                hjj[jj, k] -= hx[jj, k] * hx[jj, k] / sH[k]
            else:
                hx[jj, k] = 0.0
    U[:, :] = G
    XD[:, :] = 0.0
    D[:, :] = 0.0
    for k in range(K):
        db[k] = -G[k].sum() / sH[k] if elim[k] else 0.0
    v = np.empty(K)
    new = np.empty(K)
    cur = np.empty(K)
    for cd in range(max_cd):
        maxd = 0.0
        for jj in range(nws):
            j = ws[jj]
            if grouped:
                L = 0.0
                for k in range(K):
                    L = max(L, hjj[jj, k])
                if L <= 1e-300:
                    continue
                for k in range(K):
                    cur[k] = W[j, k] + D[jj, k]
                    grad = col_dot(X, data, indices, indptr, is_sparse, j, U[k]) + db[k] * hx[jj, k]
                    v[k] = cur[k] - grad / L
                block_prox(code, params, v, lam_w[j] / L, new)
                dn = 0.0
                for k in range(K):
                    delta = new[k] - cur[k]
                    if delta != 0.0:
                        _move(X, data, indices, indptr, is_sparse, j, k, delta, H, U, XD)
                        D[jj, k] += delta
                        if elim[k]:
                            db[k] -= delta * hx[jj, k] / sH[k]
                        dn += delta * delta
                dd = L * np.sqrt(dn)
                if dd > maxd:
                    maxd = dd
            else:
                for k in range(K):
                    L = hjj[jj, k]
                    if L <= 1e-300:
                        continue
                    c = W[j, k] + D[jj, k]
                    grad = col_dot(X, data, indices, indptr, is_sparse, j, U[k]) + db[k] * hx[jj, k]
                    nw = prox_step(code, params, c - grad / L, lam_w[j] / L, positive)
                    if nw != c:
                        delta = nw - c
                        _move(X, data, indices, indptr, is_sparse, j, k, delta, H, U, XD)
                        D[jj, k] += delta
                        if elim[k]:
                            db[k] -= delta * hx[jj, k] / sH[k]
                        dd = L * abs(delta)
                        if dd > maxd:
                            maxd = dd
        if maxd <= 0.3 * tol_in:
            break
    for k in range(K):
        if db[k] != 0.0:
            for i in range(n):
                XD[k, i] += db[k]


@njit(cache=True)
def _move(X, data, indices, indptr, is_sparse, j, k, delta, H, U, XD):
    """``XD_k += delta x_j``, ``U_k += delta H_k o x_j``."""
    if is_sparse:
        for q in range(indptr[j], indptr[j + 1]):
            i = indices[q]
            XD[k, i] += delta * data[q]
            U[k, i] += delta * H[k, i] * data[q]
    else:
        dc = delta * data[j]  # the dense design's column multiplier
        for i in range(X.shape[0]):
            XD[k, i] += dc * X[i, j]
            U[k, i] += dc * H[k, i] * X[i, j]


@njit(cache=True)
def entry_scores(grad, W, lips, lam_w, code, params, positive, out):
    """Per row, the largest coordinate gradient mapping of its ``K`` entries (the ungrouped
    penalty); returns the max."""
    m = 0.0
    for j in range(W.shape[0]):
        L = lips[j]
        s = 0.0
        if L > 0.0:
            for k in range(W.shape[1]):
                g = grad[j, k]
                a = L * abs(W[j, k] - prox_step(code, params, W[j, k] - g / L, lam_w[j] / L,
                                                positive))
                if a > s:
                    s = a
        out[j] = s
        if s > m:
            m = s
    return m


def row_penalty(problem, W, rows):
    """The penalty over the rows ``rows``: of their norms (grouped) or of their entries."""
    code, params = problem.spec
    sub = np.ascontiguousarray(W[rows])
    lam = np.ascontiguousarray(problem.lam_w[rows])
    if problem.grouped_rows:
        norms = np.sqrt(np.einsum("ij,ij->i", sub, sub))
        return penalty_sum(norms, np.arange(len(rows)), lam, code, params)
    lam = np.repeat(lam, W.shape[1])
    return penalty_sum(sub.ravel(), np.arange(lam.shape[0]), lam, code, params)


def multinomial_scores(problem, W, grad, out):
    """The criterion's violation of every row into ``out``; returns the max."""
    code, params = problem.spec
    if problem.grouped_rows:
        return block_scores(grad, W, problem.lips, problem.lam_w, code, params, out)
    return entry_scores(grad, W, problem.lips, problem.lam_w, code, params, problem.positive,
                        out)


def solve_multinomial(problem, W, b, tol, max_iter, verbose, working_set, p0, callback,
                      max_newton=50, max_cd=50):
    """The working-set proximal Newton solver of the module docstring."""
    des, df, Y = problem.design, problem.datafit, problem.y
    arrs = des.arrays
    code, params = problem.spec
    K = problem.n_outputs
    score = np.zeros(problem.p)

    def scores(W, Z):
        G = df.raw_grad(Y, Z)
        grad = np.ascontiguousarray(des.rmatvec(G))
        m = multinomial_scores(problem, W, grad, score)
        gb = float(np.max(np.abs(G.sum(axis=0)))) if problem.fit_intercept else 0.0
        return max(m, gb), score, np.any(W != 0.0, axis=1)

    def inner(ws, W, Z, b, tol_in):
        nws = ws.shape[0]
        D, hjj, hx = np.empty((nws, K)), np.empty((nws, K)), np.empty((nws, K))
        XD, U = np.empty((K, problem.n)), np.empty((K, problem.n))
        db = np.empty(K)
        sub = np.zeros(problem.p)

        def penalty(W):
            return row_penalty(problem, W, ws)

        it = 0
        for it in range(max_newton):
            G = df.raw_grad(Y, Z)
            grad = np.zeros((problem.p, K))
            grad[ws] = des.rmatvec(G, ws)
            sub[:] = 0.0
            lips_ws = np.zeros(problem.p)
            lips_ws[ws] = problem.lips[ws]
            viol = (block_scores(grad, W, lips_ws, problem.lam_w, code, params, sub)
                    if problem.grouped_rows else
                    entry_scores(grad, W, lips_ws, problem.lam_w, code, params,
                                 problem.positive, sub))
            if problem.fit_intercept:
                viol = max(viol, float(np.max(np.abs(G.sum(axis=0)))))
            if viol <= tol_in:
                break
            Gt = np.ascontiguousarray(G.T)
            Ht = np.ascontiguousarray(df.raw_hess(Y, Z).T)
            multinomial_direction(*arrs, ws, W, Gt, Ht, problem.fit_intercept, problem.lam_w,
                                  code, params, problem.grouped_rows, problem.positive, tol_in,
                                  max_cd, D, XD, hjj, hx, U, db)
            ok, Z, b = line_search(problem, ws, W, D, Z, np.ascontiguousarray(XD.T), b,
                                   db.copy(), penalty)
            if not ok:
                break
        return it + 1, Z, b

    return working_set_loop(problem, W, b, tol, max_iter, verbose, working_set, p0, callback,
                            scores, inner, "cd")
