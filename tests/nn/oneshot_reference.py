"""Independent references for the one-shot methods (tests and benchmarks/nn_accuracy): written from
the papers' descriptions with numpy only, sharing no code with ``dualdrop.nn.oneshot``.

``plain_admm`` is the "plain growing-rho ADMM" the default ``admm`` must match or beat on every
layer: ADMM on ``min_W tr((W - W0) G (W - W0)^T)`` subject to the budget (Boyd et al.,
"Distributed Optimization and Statistical Learning via ADMM", 2011, Sec. 3.4.1 for a penalty
that varies, the scaled dual rescaled so that ``rho V`` is unchanged), in the original
coordinates of the weights:

- start: the Wanda support (Sun et al. 2024: the largest ``|W_ij| ||X_j||`` of each row, the
  layer's count split evenly over the rows; N of every M for a pattern), ``D`` = the trained
  weights on it, ``V = 0``;
- ``rho`` from ``0.1 mean(diag G)``, times 1.05 every iteration;
- ``U = (G + rho I)^-1 (G W0 + rho (D - V))`` per row, ``D = P(U + V)`` (the largest ``|.|``
  of the layer, or N of every M), ``V += U - D``;
- stop once the support has not changed for 20 iterations (at most 400), then each row's least
  squares on the support found.
"""

from __future__ import annotations

import numpy as np


def wanda_support(W0, G, n_keep=None, pattern=None):
    """Boolean ``(R, p)``: Wanda's per-row selection (numpy, stable ties to the lower index)."""
    W0, G = np.asarray(W0, float), np.asarray(G, float)
    score = np.abs(W0) * np.sqrt(np.clip(np.diag(G), 0.0, None))
    return _top(score, n_keep, pattern, per_row=True)


def _top(score, n_keep, pattern, per_row=False):
    R, p = score.shape
    keep = np.zeros((R, p), dtype=bool)
    if pattern is not None:
        n, m = pattern
        order = np.argsort(-score.reshape(R, p // m, m), axis=-1, kind="stable")[..., :n]
        np.put_along_axis(keep.reshape(R, p // m, m), order, True, axis=-1)
        return keep
    if per_row:
        counts = np.full(R, n_keep // R)
        counts[: n_keep % R] += 1
        order = np.argsort(-score, axis=1, kind="stable")
        for r in range(R):
            keep[r, order[r, : counts[r]]] = True
        return keep
    keep.ravel()[np.argsort(-score.ravel(), kind="stable")[:n_keep]] = True
    return keep


def least_squares_on(W0, G, keep):
    """Each row's ``argmin (w - w0)^T G (w - w0)`` with ``w`` zero off its support
    (pseudo-inverse of ``G_SS``: collinear inputs allowed)."""
    W0, G = np.asarray(W0, float), np.asarray(G, float)
    W = np.zeros_like(W0)
    for r in range(W0.shape[0]):
        S = np.flatnonzero(keep[r])
        if S.size:
            W[r, S] = np.linalg.pinv(G[np.ix_(S, S)]) @ (G[S] @ W0[r])
    return W


def plain_admm(W0, G, n_keep=None, pattern=None, *, growth=1.05, patience=20, max_iter=400):
    """The plain growing-rho ADMM of the module docstring. Returns ``(W, iterations)``."""
    W0, G = np.asarray(W0, float), np.asarray(G, float)
    lam, Q = np.linalg.eigh(G)
    lam = np.clip(lam, 0.0, None)
    A = (W0 @ G) @ Q
    rho = 0.1 * float(np.mean(np.diag(G)))
    keep = wanda_support(W0, G, n_keep, pattern)
    D = np.where(keep, W0, 0.0)
    V = np.zeros_like(W0)
    stable = 0
    t = 0
    for t in range(1, max_iter + 1):
        U = ((A + rho * ((D - V) @ Q)) / (lam + rho)) @ Q.T
        Z = U + V
        new = _top(np.abs(Z), n_keep, pattern)
        stable = stable + 1 if np.array_equal(new, keep) else 0
        keep = new
        D = np.where(keep, Z, 0.0)
        V = Z - D
        if stable >= patience:
            break
        rho *= growth
        V /= growth
    return least_squares_on(W0, G, keep), t


def objective(W, W0, G):
    """``tr((W - W0) G (W - W0)^T) / tr(W0 G W0^T)``."""
    W, W0, G = (np.asarray(a, float) for a in (W, W0, G))
    D = W - W0
    return float(np.sum((D @ G) * D) / np.sum((W0 @ G) * W0))


def blob_images(n, rng, side=24, pad=3):
    """Digit-like images: three Gaussian strokes inside a border that is always 0, normalized
    with one global mean and scale as MNIST is, so that every border pixel is the same constant
    (a block of identical inputs) and the Gram has rank ~n/3 of ``side**2``."""
    yy, xx = np.mgrid[0:side, 0:side]
    out = np.zeros((n, side, side))
    for i in range(n):
        for _ in range(3):
            cy, cx = rng.uniform(pad + 2, side - pad - 3, 2)
            sy, sx = rng.uniform(0.8, 3.0, 2)
            out[i] += rng.uniform(0.5, 1.0) * np.exp(-((yy - cy) / sy) ** 2
                                                     - ((xx - cx) / sx) ** 2)
    out[:, :pad] = out[:, -pad:] = 0
    out[:, :, :pad] = out[:, :, -pad:] = 0
    return (np.clip(out, 0, 1).reshape(n, -1) - 0.13) / 0.31
