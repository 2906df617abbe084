"""Compiled building blocks shared by the problem definition and the solvers (numba,
``cache=True``). They sit below both: :mod:`._problem` (objective, criterion) and every module of
:mod:`.solvers` import from here, and nothing here imports from either.

Each function takes the design as ``(X, data, indices, indptr, is_sparse)`` (see
``dualdrop.linear._design.Design.arrays``) and the penalty as ``(code, params)`` (see
``penalties.kernels``), so that one compiled kernel serves dense and sparse designs and every
penalty of the catalog.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from penalties.kernels import omega_scalar, prox_scalar


# 'reassoc' lets LLVM vectorize the reductions (the data are finite: the estimators check it)
@njit(cache=True, fastmath={"reassoc", "contract"})
def col_dot(X, data, indices, indptr, is_sparse, j, v):
    """``x_j . v``"""
    s = 0.0
    if is_sparse:
        for k in range(indptr[j], indptr[j + 1]):
            s += data[k] * v[indices[k]]
    else:
        for i in range(X.shape[0]):
            s += X[i, j] * v[i]
    return s


@njit(cache=True, fastmath={"reassoc", "contract"})
def col_axpy(X, data, indices, indptr, is_sparse, j, a, v):
    """``v += a x_j`` in place."""
    if is_sparse:
        for k in range(indptr[j], indptr[j + 1]):
            v[indices[k]] += a * data[k]
    else:
        for i in range(X.shape[0]):
            v[i] += a * X[i, j]


@njit(cache=True, fastmath={"reassoc", "contract"})
def col_wnorm2(X, data, indices, indptr, is_sparse, j, h):
    """``sum_i h_i x_ij^2``"""
    s = 0.0
    if is_sparse:
        for k in range(indptr[j], indptr[j + 1]):
            s += h[indices[k]] * data[k] * data[k]
    else:
        for i in range(X.shape[0]):
            s += h[i] * X[i, j] * X[i, j]
    return s


@njit(cache=True)
def penalty_sum(w, feats, lam_w, code, params):
    """``sum_{j in feats} lam_w[j] * Omega(w_j)`` (terms with ``w_j = 0`` vanish)."""
    s = 0.0
    for jj in range(feats.shape[0]):
        j = feats[jj]
        if w[j] != 0.0 and lam_w[j] != 0.0:
            s += lam_w[j] * omega_scalar(code, params, w[j])
    return s


@njit(cache=True)
def prox_step(code, params, v, t, positive):
    """The penalty's prox with the conventions the solvers need at the edges: ``t = 0`` is the
    identity, ``t = inf`` gives 0. With ``positive`` the prox of ``t Omega + indicator(x >= 0)``,
    which is ``max(prox(v), 0)`` for any penalty even and nondecreasing in ``|x|`` (for ``v < 0``
    both terms grow on ``x > 0``)."""
    if positive and v <= 0.0:
        return 0.0
    if t == 0.0:
        return v
    if not np.isfinite(t):
        return 0.0
    return prox_scalar(code, params, v, t)


@njit(cache=True)
def scores(X, data, indices, indptr, is_sparse, feats, v, coef, w, lips, lam_w, code, params,
           positive, out):
    """Optimality violation of each feature in ``feats``, written to ``out[feats]``.

    With ``g_j = coef * x_j . v`` the gradient of the datafit, the score is the gradient mapping
    ``L_j |w_j - prox_{lam_j Omega / L_j}(w_j - g_j / L_j)|``: zero exactly at the stationary
    points of a coordinate-wise prox-gradient step, in the units of a gradient. Returns the max.
    """
    m = 0.0
    for jj in range(feats.shape[0]):
        j = feats[jj]
        L = lips[j]
        if L == 0.0:
            out[j] = 0.0
            continue
        g = coef * col_dot(X, data, indices, indptr, is_sparse, j, v)
        new = prox_step(code, params, w[j] - g / L, lam_w[j] / L, positive)
        s = L * abs(w[j] - new)
        out[j] = s
        if s > m:
            m = s
    return m


@njit(cache=True)
def zero_threshold(code, params, t):
    """``T`` such that ``prox(v, t) = 0`` for every ``|v| <= T`` (0 if none is known).

    A 1-D prox is nondecreasing in ``v`` for any penalty, and odd for an even penalty, so its
    zero set is an interval ``[-T*, T*]``; ``T`` is the largest point of it found by doubling and
    bisection with the kernel's own prox (about 100 calls). Coordinate descent then skips the
    prox for zero coefficients whose step lands inside it: the same result, fewer prox calls
    (they dominate the cost for penalties with a piecewise prox such as MCP and SCAD)."""
    if not (t > 0.0) or not np.isfinite(t):
        return 0.0
    lo = 0.0
    hi = t
    for _ in range(60):
        if prox_scalar(code, params, hi, t) != 0.0:
            break
        lo = hi
        hi *= 2.0
    else:
        return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if prox_scalar(code, params, mid, t) == 0.0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return lo


@njit(cache=True)
def zero_thresholds(code, params, t, out):
    """:func:`zero_threshold` of every entry of ``t`` into ``out`` (one bisection per run of
    equal values: on standardized columns without intercept they are all equal)."""
    last_t = np.nan
    last_T = 0.0
    for j in range(t.shape[0]):
        if t[j] != last_t:
            last_t = t[j]
            last_T = zero_threshold(code, params, t[j])
        out[j] = last_T


@njit(cache=True)
def scores_from_grad(grad, w, lips, lam_w, code, params, positive, t_ref, T_ref, out):
    """Same as :func:`scores` for all features, with the datafit gradient ``grad`` given (computed
    by one BLAS/sparse matrix-vector product). Zero coefficients whose prox step ``t`` equals
    ``t_ref`` and whose step lands in ``[-T_ref, T_ref]`` (see :func:`zero_threshold`) score 0
    without a prox call. Returns the max."""
    m = 0.0
    for j in range(w.shape[0]):
        L = lips[j]
        if L == 0.0:
            out[j] = 0.0
            continue
        t = lam_w[j] / L
        if w[j] == 0.0 and t == t_ref and abs(grad[j]) <= T_ref * L:
            out[j] = 0.0
            continue
        new = prox_step(code, params, w[j] - grad[j] / L, t, positive)
        s = L * abs(w[j] - new)
        out[j] = s
        if s > m:
            m = s
    return m
