"""Block coordinate descent for multi-output least squares with a row (group) penalty.

Problem (``Y`` of shape ``n x T``, ``W`` of shape ``p x T``, one intercept per output)::

    min_{W, b}  (1/2n) ||Y - X W - 1 b^T||_F^2 + sum_j lam_j Omega(||W_j||_2)

The rows ``W_j`` are the blocks: the datafit restricted to one row is a quadratic with curvature
``L_j = ||x_j||^2 / n`` (the same for every output), so the block step is
``W_j <- bprox_{lam_j Omega / L_j}(W_j + x_j^T R / (n L_j))`` with ``R`` the residual and
``bprox`` the prox of the penalty of the row norm (``_jit.block_prox``: the scalar prox applied to
``||v||``; group soft thresholding for l1, i.e. the L2,1 norm of scikit-learn's
``MultiTaskLasso``). As in the single-output solver (:mod:`.cd`), with an intercept each row moves
along ``(e_j, -mean_j)`` (the intercepts staying at their exact minimizer, on the implicitly
centred column of curvature ``||x_j||^2 / n - mean_j^2``), which keeps sparse designs sparse and
converges on raw columns with large means; the outer loop keeps a working set of rows scored by
their block gradient mapping (``_jit.block_scores``), solves the restricted problem to a fraction
of the current violation and extrapolates the inner iterates (Anderson acceleration, kept only
when it lowers the objective). Nonconvex penalties give a stationary point.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._base import BaseSolver
from .._jit import block_prox, block_scores, penalty_sum
from ._newton import working_set_loop
from .anderson import extrapolate

NAME = "bcd"


_FM = {"reassoc", "contract"}  # lets LLVM vectorize the loops over samples (finite data)


@njit(cache=True, fastmath=_FM)
def _restricted_objective(R, W, ws, lam_w, code, params, norms):
    n = R.shape[1]
    s = 0.0
    for t in range(R.shape[0]):
        for i in range(n):
            s += R[t, i] * R[t, i]
    for jj in range(ws.shape[0]):
        j = ws[jj]
        q = 0.0
        for k in range(W.shape[1]):
            q += W[j, k] * W[j, k]
        norms[j] = np.sqrt(q)
    return 0.5 * s / n + penalty_sum(norms, ws, lam_w, code, params)


@njit(cache=True, fastmath=_FM)
def _axpy_rows(X, data, indices, indptr, is_sparse, j, delta, R):
    """``R -= delta x_j^T`` (``R`` is the residual transposed, ``T x n``)."""
    for t in range(R.shape[0]):
        d = delta[t]
        if d == 0.0:
            continue
        if is_sparse:
            for k in range(indptr[j], indptr[j + 1]):
                R[t, indices[k]] -= d * data[k]
        else:
            d *= data[j]  # the dense design's column multiplier
            for i in range(R.shape[1]):
                R[t, i] -= d * X[i, j]


@njit(cache=True, fastmath=_FM)
def _centre(R, b):
    """Move the means of the rows of ``R`` (``T x n``) into ``b``; returns the norm of the
    move."""
    T, n = R.shape
    s = 0.0
    for t in range(T):
        m = 0.0
        for i in range(n):
            m += R[t, i]
        m /= n
        if m != 0.0:
            b[t] += m
            for i in range(n):
                R[t, i] -= m
        s += m * m
    return np.sqrt(s)


@njit(cache=True, fastmath=_FM)
def _inner_bcd(X, data, indices, indptr, is_sparse, ws, W, R, b, fit_intercept, Lin, means,
               lam_w, code, params, tol_in, max_epochs, K):
    """Block CD passes over the rows ``ws`` until the largest scaled row move is below
    ``tol_in``; updates ``W``, ``R`` (the residual transposed, ``T x n``: each output's residual
    contiguous) and ``b`` in place. Returns the passes."""
    T, n = R.shape
    nws = ws.shape[0]
    g = np.empty(T)
    v = np.empty(T)
    new = np.empty(T)
    delta = np.empty(T)
    c = np.empty(T)  # the residual is R + c (the centring shift, added once per pass)
    norms = np.zeros(W.shape[0])
    hist = np.zeros((K + 1, nws * T))
    n_hist = 0
    ep = 0
    if fit_intercept:
        _centre(R, b)
    for ep in range(max_epochs):
        maxd = 0.0
        c[:] = 0.0
        for jj in range(nws):
            j = ws[jj]
            L = Lin[j]
            if L == 0.0:
                continue
            for t in range(T):
                acc = 0.0
                if is_sparse:
                    for k in range(indptr[j], indptr[j + 1]):
                        acc += data[k] * R[t, indices[k]]
                else:
                    for i in range(n):
                        acc += X[i, j] * R[t, i]
                    acc *= data[j]
                g[t] = acc
            for t in range(T):
                v[t] = W[j, t] + (g[t] + c[t] * n * means[j]) / (n * L)
            block_prox(code, params, v, lam_w[j] / L, new)
            dn = 0.0
            for t in range(T):
                delta[t] = new[t] - W[j, t]
                dn += delta[t] * delta[t]
            if dn == 0.0:
                continue
            _axpy_rows(X, data, indices, indptr, is_sparse, j, delta, R)
            for t in range(T):
                c[t] += delta[t] * means[j]
                b[t] -= delta[t] * means[j]
                W[j, t] = new[t]
            d = L * np.sqrt(dn)
            if d > maxd:
                maxd = d
        for t in range(T):
            if c[t] != 0.0:
                for i in range(n):
                    R[t, i] += c[t]
        if fit_intercept:
            m = _centre(R, b)
            if m > maxd:
                maxd = m
        if maxd <= tol_in:
            break
        if K > 0:
            for jj in range(nws):
                for t in range(T):
                    hist[n_hist, jj * T + t] = W[ws[jj], t]
            n_hist += 1
            if n_hist == K + 1:
                n_hist = 0
                ok, w_acc = extrapolate(hist)
                if not ok:
                    continue
                R_acc = R.copy()
                b_acc = b.copy()
                for jj in range(nws):
                    j = ws[jj]
                    for t in range(T):
                        delta[t] = w_acc[jj * T + t] - W[j, t]
                    _axpy_rows(X, data, indices, indptr, is_sparse, j, delta, R_acc)
                if fit_intercept:
                    _centre(R_acc, b_acc)
                obj = _restricted_objective(R, W, ws, lam_w, code, params, norms)
                W_old = np.empty((nws, T))
                for jj in range(nws):
                    for t in range(T):
                        W_old[jj, t] = W[ws[jj], t]
                        W[ws[jj], t] = w_acc[jj * T + t]
                if _restricted_objective(R_acc, W, ws, lam_w, code, params, norms) < obj:
                    R[:, :] = R_acc
                    b[:] = b_acc
                else:
                    for jj in range(nws):
                        for t in range(T):
                            W[ws[jj], t] = W_old[jj, t]
    return ep + 1


class BCD(BaseSolver):
    """Working-set block coordinate descent for multi-output least squares with a row penalty
    (``dualdrop.linear.multitask.MultiTaskProblem``). Options as :class:`.cd.CD`:
    ``anderson=0`` disables extrapolation, ``working_set=False`` solves on all rows at once,
    ``max_epochs`` bounds the inner passes, ``p0`` is the first working-set size."""

    name = NAME
    requires = ("kernel", "quadratic")
    multitask = True
    default_max_iter = 100

    def _solve(self, problem, W, b, *, tol, max_iter, verbose, working_set=True, anderson=5,
               max_epochs=5000, p0=10):
        code, params = problem.spec
        des = problem.design
        Y = problem.y
        lips, lam_w = problem.lips, problem.lam_w
        Lin, means = problem.centred_curvatures()
        score = np.zeros(problem.p)

        def scores(W, Z):
            G = (Z - Y) / problem.n
            m = block_scores(np.ascontiguousarray(des.rmatvec(G)), W, lips, lam_w, code, params,
                             score)
            if problem.fit_intercept:
                m = max(float(m), float(np.linalg.norm(G.sum(axis=0))))
            return m, score, np.any(W != 0.0, axis=1)

        def inner(ws, W, Z, b, tol_in):
            R = np.ascontiguousarray((Y - Z).T)
            n_in = _inner_bcd(*des.arrays, ws, W, R, b, problem.fit_intercept, Lin, means, lam_w,
                              code, params, tol_in, max_epochs, int(anderson))
            return n_in, Y - R.T, b

        return working_set_loop(problem, W, b, tol, max_iter, verbose, working_set, p0, None,
                                scores, inner, NAME)


SOLVER = BCD()
solve, supports = SOLVER.solve, SOLVER.supports
