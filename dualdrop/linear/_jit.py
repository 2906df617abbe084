"""Compiled building blocks shared by the problem definition and the solvers (numba,
``cache=True``). They sit below both: :mod:`._problem` (objective, criterion) and every module of
:mod:`.solvers` import from here, and nothing here imports from either.

Each function takes the design as ``(X, data, indices, indptr, is_sparse)`` (see
``dualdrop.linear._design.Design.arrays``): a sparse design is the CSC triple ``(data, indices,
indptr)``; a dense one is the Fortran-ordered ``X`` with ``data`` its column multipliers ``c``
(length ``p``): the design the solvers see is ``X[:, j] * c_j``, so that a column scaling costs
no scaled copy of ``X``. The multiplier is applied once per column operation (a dot product
times ``c_j``, an update with ``a c_j``), never per entry. The penalty comes as ``(code,
params)`` (see ``penalties.kernels``): one compiled kernel serves dense and sparse designs and
every penalty of the catalog.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from penalties.kernels import L1, LP, MCP, omega_scalar, prox_scalar


# 'reassoc' lets LLVM vectorize the reductions (the data are finite: the estimators check it).
# The sparse and dense loops are separate functions so that a hot loop that knows its design
# (``solvers.cd._pass_sparse``) calls its kernel directly, without the branch on ``is_sparse``.
@njit(cache=True, fastmath={"reassoc", "contract"})
def _sp_dot(data, indices, indptr, j, v):
    s = 0.0
    for k in range(indptr[j], indptr[j + 1]):
        s += data[k] * v[indices[k]]
    return s


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dn_dot(X, j, v):
    s = 0.0
    for i in range(X.shape[0]):
        s += X[i, j] * v[i]
    return s


@njit(cache=True, fastmath={"reassoc", "contract"})
def _sp_axpy(data, indices, indptr, j, a, v):
    for k in range(indptr[j], indptr[j + 1]):
        v[indices[k]] += a * data[k]


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dn_axpy(X, j, a, v):
    for i in range(X.shape[0]):
        v[i] += a * X[i, j]


@njit(cache=True, fastmath={"reassoc", "contract"})
def _sp_wnorm2(data, indices, indptr, j, h):
    s = 0.0
    for k in range(indptr[j], indptr[j + 1]):
        s += h[indices[k]] * data[k] * data[k]
    return s


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dn_wnorm2(X, j, h):
    s = 0.0
    for i in range(X.shape[0]):
        s += h[i] * X[i, j] * X[i, j]
    return s


@njit(cache=True)
def col_dot(X, data, indices, indptr, is_sparse, j, v):
    """``x_j . v``"""
    if is_sparse:
        return _sp_dot(data, indices, indptr, j, v)
    return _dn_dot(X, j, v) * data[j]


@njit(cache=True)
def col_axpy(X, data, indices, indptr, is_sparse, j, a, v):
    """``v += a x_j`` in place."""
    if is_sparse:
        _sp_axpy(data, indices, indptr, j, a, v)
    else:
        _dn_axpy(X, j, a * data[j], v)


@njit(cache=True)
def col_wnorm2(X, data, indices, indptr, is_sparse, j, h):
    """``sum_i h_i x_ij^2``"""
    if is_sparse:
        return _sp_wnorm2(data, indices, indptr, j, h)
    c = data[j]
    return _dn_wnorm2(X, j, h) * (c * c)


@njit(cache=True)
def col_wnorms2(X, data, indices, indptr, is_sparse, h, out):
    """``out_j = sum_i h_i x_ij^2`` for every column (one pass, no ``n x p`` temporary)."""
    for j in range(out.shape[0]):
        out[j] = col_wnorm2(X, data, indices, indptr, is_sparse, j, h)


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


@njit(cache=True, inline="always")
def grad_map(code, params, wj, g, L, lam, positive):
    """The gradient mapping ``L |w_j - prox_{lam Omega / L}(w_j - g / L)|`` of one coordinate."""
    return L * abs(wj - prox_step(code, params, wj - g / L, lam / L, positive))


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
        s = grad_map(code, params, w[j], g, L, lam_w[j], positive)
        out[j] = s
        if s > m:
            m = s
    return m


@njit(cache=True)
def threshold_closed_form(code, params):
    """Whether :func:`zero_threshold` has a closed form for this penalty (no bisection)."""
    return code == L1 or code == MCP or (code == LP and params[0] == 1.0)


@njit(cache=True)
def zero_threshold(code, params, t):
    """``T`` such that ``prox(v, t) = 0`` for every ``|v| <= T`` (0 if none is known).

    A 1-D prox is nondecreasing in ``v`` for any penalty, and odd for an even penalty, so its
    zero set is an interval ``[-T*, T*]``. Soft thresholding (l1, lp with p = 1) has ``T = t``;
    MCP with ``A = a lam`` (firm thresholding for ``t < A``, hard thresholding beyond, as in
    ``penalties.kernels.prox_scalar``) has ``T = t`` for ``t < A`` and ``sqrt(t A)`` otherwise.
    Other penalties: the largest point of the interval found by doubling and bisection with the
    kernel's own prox (about 100 calls). Coordinate descent then skips the prox for zero
    coefficients whose step lands inside it: the same result, fewer prox calls (they dominate the
    cost for penalties with a piecewise or numeric prox)."""
    if not (t > 0.0) or not np.isfinite(t):
        return 0.0
    if code == L1 or (code == LP and params[0] == 1.0):
        return t
    if code == MCP:
        A = params[0] * params[1]
        return t if t < A else np.sqrt(t * A)
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
def zero_thresholds(code, params, t, feats, out):
    """:func:`zero_threshold` of ``t[j]`` into ``out[j]`` for the ``j`` in ``feats`` whose
    ``out[j]`` is still NaN (a cache the caller keeps across working sets; one bisection per
    run of equal values: on standardized columns without intercept they are all equal)."""
    last_t = np.nan
    last_T = 0.0
    for jj in range(feats.shape[0]):
        j = feats[jj]
        if not np.isnan(out[j]):
            continue
        if t[j] != last_t:
            last_t = t[j]
            last_T = zero_threshold(code, params, t[j])
        out[j] = last_T


@njit(cache=True)
def scores_from_grad(grad, w, lips, lam_w, code, params, positive, Tg, out):
    """Same as :func:`scores` for all features, with the datafit gradient ``grad`` given (computed
    by one BLAS/sparse matrix-vector product). A zero coefficient with ``|grad_j| <= Tg_j`` (the
    prox's zero threshold in gradient units, ``L_j T(lam_j / L_j)``; negative where unknown)
    scores 0 without a prox call; for the l1 penalty the score is then soft thresholding
    inline. Returns the max."""
    m = 0.0
    l1 = code == L1 and not positive
    for j in range(w.shape[0]):
        L = lips[j]
        if L == 0.0:
            out[j] = 0.0
            continue
        g = grad[j]
        if w[j] == 0.0:
            if abs(g) <= Tg[j]:
                out[j] = 0.0
                continue
            if l1:
                s = max(abs(g) - lam_w[j], 0.0)
                out[j] = s
                if s > m:
                    m = s
                continue
        s = grad_map(code, params, w[j], g, L, lam_w[j], positive)
        out[j] = s
        if s > m:
            m = s
    return m


@njit(cache=True, fastmath={"reassoc", "contract"})
def col_sums(X, data, indices, indptr, is_sparse, p, sums, sq):
    """Column sums and sums of squares of the design into ``sums`` and ``sq`` (one pass; a
    sparse design never materializes ``X * X``)."""
    for j in range(p):
        s = 0.0
        q = 0.0
        if is_sparse:
            for k in range(indptr[j], indptr[j + 1]):
                v = data[k]
                s += v
                q += v * v
        else:
            for i in range(X.shape[0]):
                v = X[i, j]
                s += v
                q += v * v
            c = data[j]
            s *= c
            q *= c * c
        sums[j] = s
        sq[j] = q


# ----------------------------------------------------------------------------------------------
# row (group) penalties of multi-output models: Omega applied to the row norm ||W_j||_2


@njit(cache=True)
def group_prox(code, params, v, t, t_l1, t_ridge, positive, out):
    """Prox of ``t Omega(||x||_2) + t_l1 ||x||_1 + t_ridge / 2 ||x||_2^2`` (and ``x >= 0`` when
    ``positive``) at the vector ``v``, into ``out``; returns the new norm.

    The penalty of a group's norm (docs/theory.md, section 6: the form ``dualdrop.nn`` prunes
    neurons, channels and heads with). For ``Omega`` a function of the norm the minimizer lies
    on the ray of ``v`` (for a fixed norm, the distance to ``v`` is smallest along it), so it is
    ``v / ||v|| * prox(||v||)``: the scalar prox of :func:`prox_step` applied to the norm; for the
    l1 penalty, group soft thresholding (the L2,1 norm of multi-task and group Lasso). With the
    l1 term (the sparse group lasso of Simon, Friedman, Hastie & Tibshirani 2013, any
    ``Omega`` on the norms): for a fixed norm ``r`` the best ``x`` maximizes
    ``sum_j (x_j v_j - t_l1 |x_j|)``, i.e. is along the soft-thresholded ``v``, so the prox is
    soft thresholding followed by the norm's prox. The ridge term (a function of the norm too)
    rescales it: ``prox(r) = prox_{t Omega / s}(r / s)`` with ``s = 1 + t_ridge``."""
    nv = 0.0
    for k in range(v.shape[0]):
        a = v[k]
        if positive:
            a = a - t_l1 if a > t_l1 else 0.0
        elif a > t_l1:
            a -= t_l1
        elif a < -t_l1:
            a += t_l1
        else:
            a = 0.0
        out[k] = a
        nv += a * a
    nv = np.sqrt(nv)
    if nv == 0.0:
        out[:] = 0.0
        return 0.0
    s = 1.0 + t_ridge
    r = prox_step(code, params, nv / s, t / s, False)
    f = r / nv
    for k in range(v.shape[0]):
        out[k] *= f
    return r


@njit(cache=True)
def block_prox(code, params, v, t, out):
    """Prox of ``t Omega(||.||_2)`` at the vector ``v``, into ``out``; returns the new norm
    (:func:`group_prox` without the l1 and ridge terms: the row penalty of multi-output
    models, whose ridge term comes with the penalty's ``MIXED`` kernel)."""
    return group_prox(code, params, v, t, 0.0, 0.0, False, out)


@njit(cache=True)
def row_norms(W, out):
    """``out[j] = ||W_j||_2`` for the rows of ``W``."""
    for j in range(W.shape[0]):
        s = 0.0
        for k in range(W.shape[1]):
            s += W[j, k] * W[j, k]
        out[j] = np.sqrt(s)


@njit(cache=True)
def block_scores(grad, W, lips, lam_w, code, params, out):
    """Block gradient mapping ``L_j ||W_j - prox_{lam_j Omega(||.||) / L_j}(W_j - grad_j / L_j)||``
    of every row (the multi-output analogue of :func:`scores_from_grad`) into ``out``; returns
    the max."""
    T = W.shape[1]
    v = np.empty(T)
    new = np.empty(T)
    m = 0.0
    for j in range(W.shape[0]):
        L = lips[j]
        if L == 0.0:
            out[j] = 0.0
            continue
        for k in range(T):
            v[k] = W[j, k] - grad[j, k] / L
        block_prox(code, params, v, lam_w[j] / L, new)
        s = 0.0
        for k in range(T):
            d = W[j, k] - new[k]
            s += d * d
        s = L * np.sqrt(s)
        out[j] = s
        if s > m:
            m = s
    return m


@njit(cache=True, fastmath={"reassoc", "contract"})
def csc_rmatvec(data, indices, indptr, v, out):
    """``out = X^T v`` for a CSC design (no transposed copy of the matrix, unlike ``X.T @ v``)."""
    for j in range(out.shape[0]):
        s = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            s += data[k] * v[indices[k]]
        out[j] = s


@njit(cache=True, inline="always")
def _ranks_before(key, a, b):
    """Whether candidate ``a`` ranks before ``b``: a larger key, or an equal key and a lower
    position."""
    return key[a] > key[b] or (key[a] == key[b] and a < b)


@njit(cache=True)
def _sift_down(heap, n, i, key):
    """Restore the heap below ``i`` (the root ranks last of the ``n`` entries)."""
    while True:
        worst = i
        left = 2 * i + 1
        right = left + 1
        if left < n and _ranks_before(key, heap[worst], heap[left]):
            worst = left
        if right < n and _ranks_before(key, heap[worst], heap[right]):
            worst = right
        if worst == i:
            return
        heap[i], heap[worst] = heap[worst], heap[i]
        i = worst


@njit(cache=True)
def select_ws(score, nz, size):
    """A working set: the nonzero features (``nz``) first, then the largest positive scores; at
    most ``size`` features, sorted. Features scoring 0 (optimal at 0) are left out: they only
    cost passes. Ties at the cut keep the lower index.

    The ``size`` best candidates are kept in a heap whose root is the one ranked last
    (``O(p log size)``), not found by sorting: numba's sorts cost seconds of compile time on
    the first call of every solver that uses working sets."""
    p = score.shape[0]
    cand = np.empty(p, dtype=np.int64)
    n_cand = 0
    for j in range(p):
        if score[j] > 0.0 or nz[j]:
            cand[n_cand] = j
            n_cand += 1
    if n_cand <= size:
        return cand[:n_cand]
    if size <= 0:
        return cand[:0]
    key = np.empty(n_cand)
    for k in range(n_cand):
        key[k] = np.inf if nz[cand[k]] else score[cand[k]]
    heap = np.empty(size, dtype=np.int64)  # positions in cand
    for k in range(size):
        heap[k] = k
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(heap, size, i, key)
    for k in range(size, n_cand):
        if _ranks_before(key, k, heap[0]):
            heap[0] = k
            _sift_down(heap, size, np.int64(0), key)  # not a literal: one compile
    keep = np.zeros(n_cand, dtype=np.bool_)
    for t in range(size):
        keep[heap[t]] = True
    out = np.empty(size, dtype=np.int64)
    n = 0
    for k in range(n_cand):
        if keep[k]:
            out[n] = cand[k]
            n += 1
    return out


@njit(cache=True)
def prox_steps(lam_w, L, out):
    """``out_j = lam_j / L_j`` (0 where ``L_j = 0``): the step of each coordinate prox."""
    for j in range(L.shape[0]):
        out[j] = lam_w[j] / L[j] if L[j] > 0.0 else 0.0


@njit(cache=True)
def score_thresholds(code, params, lam_w, lips, out):
    """Zero thresholds of the outer scores in gradient units (``L_j T(lam_j / L_j)``, see
    :func:`scores_from_grad`), where they cost nothing: a closed form, or one bisection when
    every step is the same (standardized columns); ``-1`` (unknown: the score calls the prox)
    otherwise."""
    p = lips.shape[0]
    t = np.empty(p)
    prox_steps(lam_w, lips, t)
    if not threshold_closed_form(code, params):
        first = np.nan
        for j in range(p):
            if lips[j] > 0.0:
                if np.isnan(first):
                    first = t[j]
                elif t[j] != first:
                    out[:] = -1.0
                    return
    out[:] = np.nan
    zero_thresholds(code, params, t, np.arange(p), out)
    for j in range(p):
        out[j] *= lips[j]
