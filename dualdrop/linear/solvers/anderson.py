"""Anderson acceleration (Anderson 1965; as used for coordinate descent by Bertrand & Massias,
"Anderson acceleration of coordinate descent", AISTATS 2021).

Given the last ``K + 1`` iterates ``x_0 .. x_K`` of a fixed-point map, with differences
``U = [x_1 - x_0, ..., x_K - x_{K-1}]``, the extrapolation is ``sum_k c_k x_k`` (over
``x_1 .. x_K``) with ``c = argmin ||U^T c||`` subject to ``sum c = 1``, i.e.
``c = (U U^T)^{-1} 1 / (1^T (U U^T)^{-1} 1)``. The Gram matrix is regularized by ``1e-10`` of its
trace. The caller keeps the extrapolated point only if it lowers the objective (the map is not
linear, so nothing guarantees it does).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def extrapolate(hist):
    """``hist``: ``(K + 1) x m`` array of the last iterates (oldest first). Returns
    ``(ok, x_acc)``; ``ok`` is False when the differences vanish or the system is singular."""
    ok, c = weights(hist)
    if not ok:
        return False, hist[hist.shape[0] - 1].copy()
    return True, c @ hist[1:]


@njit(cache=True)
def weights(hist):
    """``(ok, c)``: the extrapolation weights of ``hist[1:]`` (summing to 1). Any quantity
    affine in the iterate (a residual ``y - X w - b``) extrapolates with the same weights, at
    the cost of a combination instead of a recomputation.

    The ``K x K`` system (``K`` is a handful) is solved by Gaussian elimination with partial
    pivoting written out here (LAPACK's ``gesv``, what ``np.linalg.solve`` calls) rather than
    through numba's LAPACK wrapper, whose checks, copies and error messages cost several seconds
    of compile time on every first use of a coordinate-descent solver. The regularized
    ``U U^T`` is ill-conditioned when iterates align, so the elimination order matters to the
    weights' rounding: a Cholesky factorization here moved some fits by two outer iterations.
    A zero pivot (an exactly singular system) reports ``ok = False``."""
    K = hist.shape[0] - 1
    m = hist.shape[1]
    c = np.zeros(K)
    C = np.zeros((K, K))
    for i in range(K):
        for j in range(i + 1):
            s = 0.0
            for t in range(m):
                s += (hist[i + 1, t] - hist[i, t]) * (hist[j + 1, t] - hist[j, t])
            C[i, j] = s
    tr = 0.0
    for k in range(K):
        tr += C[k, k]
    if tr == 0.0:
        return False, c
    for k in range(K):
        C[k, k] += 1e-10 * tr
    for i in range(K):
        for j in range(i + 1, K):
            C[i, j] = C[j, i]
    # Gaussian elimination with partial pivoting on C c = 1 (LAPACK's gesv, written out)
    for k in range(K):
        c[k] = 1.0
    for j in range(K):
        piv = j
        for i in range(j + 1, K):
            if abs(C[i, j]) > abs(C[piv, j]):
                piv = i
        if C[piv, j] == 0.0:
            return False, c
        if piv != j:
            for t in range(K):
                C[j, t], C[piv, t] = C[piv, t], C[j, t]
            c[j], c[piv] = c[piv], c[j]
        for i in range(j + 1, K):
            f = C[i, j] / C[j, j]
            for t in range(j + 1, K):
                C[i, t] -= f * C[j, t]
            c[i] -= f * c[j]
    for i in range(K - 1, -1, -1):
        s = c[i]
        for t in range(i + 1, K):
            s -= C[i, t] * c[t]
        c[i] = s / C[i, i]
    sc = 0.0
    for k in range(K):
        sc += c[k]
    if sc == 0.0 or not np.isfinite(sc):
        return False, c
    for k in range(K):
        c[k] /= sc
    return True, c
