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
    the cost of a combination instead of a recomputation."""
    K = hist.shape[0] - 1
    c = np.zeros(K)
    U = hist[1:] - hist[:-1]
    C = U @ U.T
    tr = 0.0
    for k in range(K):
        tr += C[k, k]
    if tr == 0.0:
        return False, c
    for k in range(K):
        C[k, k] += 1e-10 * tr
    c = np.linalg.solve(C, np.ones(K))
    sc = c.sum()
    if sc == 0.0 or not np.isfinite(sc):
        return False, c
    return True, c / sc
