"""Synthetic sparse regression/classification problems (the benchmark's design).

Correlated Gaussian design with Toeplitz correlation ``rho^|i-j|`` (an AR(1) process across
columns), centred and standardized (``||x_j||^2 / n = 1``); a sparse truth with random signs and
unit magnitudes; noise at a given signal-to-noise ratio (standard deviations).
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_sparse_problem"]


def make_sparse_problem(n, p, support=0.05, snr=5.0, rho=0.5, task="regression", random_state=0):
    """Return ``(X, y, w_true)``; ``X`` is Fortran-ordered, ``y`` centred for regression and in
    ``{0, 1}`` for classification (``y = 1[X w + noise > 0]``)."""
    for name, v in (("n", n), ("p", p)):
        if not isinstance(v, (int, np.integer)) or v < 2:
            raise ValueError(f"{name} must be an integer >= 2, got {v!r}")
    if not 0 < support <= 1:
        raise ValueError(f"support must be in (0, 1] (fraction of nonzero coefficients), got {support!r}")
    if not snr > 0:
        raise ValueError(f"snr must be > 0, got {snr!r}")
    if not -1 < rho < 1:
        raise ValueError(f"rho must be in (-1, 1), got {rho!r}")
    if task not in ("regression", "classification"):
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
    rng = np.random.default_rng(random_state)
    X = np.empty((n, p), order="F")
    X[:, 0] = rng.standard_normal(n)
    c = np.sqrt(1.0 - rho * rho)
    for j in range(1, p):
        X[:, j] = rho * X[:, j - 1] + c * rng.standard_normal(n)
    X -= X.mean(axis=0)
    X /= np.sqrt((X ** 2).mean(axis=0))
    k = max(1, int(round(support * p)))
    w = np.zeros(p)
    idx = rng.choice(p, k, replace=False)
    w[idx] = rng.choice([-1.0, 1.0], k)
    signal = X @ w
    y = signal + rng.standard_normal(n) * signal.std() / snr
    if task == "classification":
        return X, (y > 0).astype(int), w
    return X, y - y.mean(), w
