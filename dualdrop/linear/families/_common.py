"""What several families share: the 1-D best constant of a convex loss and the target checks."""

from __future__ import annotations

import numpy as np

from .._validation import check_finite_target


def best_constant(raw_grad, y, lo=None, hi=None):
    """The ``b`` with ``sum_i raw_grad(y, b)_i = 0`` (the minimizer over constants of a convex
    loss, whose derivative in ``b`` is nondecreasing): bracketing, then bisection to machine
    precision. ``lo`` / ``hi`` default to the range of ``y``."""
    n = y.shape[0]

    def slope(b):
        return float(np.sum(raw_grad(y, np.full(n, b))))

    lo = float(np.min(y)) if lo is None else lo
    hi = float(np.max(y)) if hi is None else hi
    width = max(hi - lo, 1.0)
    for _ in range(200):
        if slope(lo) <= 0.0:
            break
        lo -= width
        width *= 2.0
    width = max(hi - lo, 1.0)
    for _ in range(200):
        if slope(hi) >= 0.0:
            break
        hi += width
        width *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if slope(mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


def real_target(y, name="y"):
    """``y`` as a finite float64 vector (``ValueError`` naming it otherwise)."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one target per sample), got shape {y.shape}")
    if y.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold numbers, got dtype {y.dtype}")
    y = y.astype(np.float64)
    check_finite_target(y, name)
    return y
