"""Block coordinate descent on the Gram form for many outputs with a penalty on groups of columns.

The problem (``W`` of shape ``R x p``: ``R`` outputs, ``p`` inputs; ``G`` the ``p x p`` Gram of
the inputs; groups ``g`` partitioning the inputs)::

    min_W  1/2 tr((W - W0) G (W - W0)^T) + alpha sum_g v_g Omega(||W[:, g]||_F)

is least squares on the Gram form (``(1/2n) ||Y - X W^T||^2`` up to a constant, with ``G = X^T
X / n`` and ``W0`` the least-squares fit) with the group penalty of ``dualdrop.linear._groups``
on blocks that span every output: a group is an *input unit* of a layer (a neuron, an attention
head, a channel's kernel taps), and a zero block removes the unit from every output. It is the
group lasso (``Omega = |.|``) and its nonconvex relatives (log-sum, MCP, the dropout penalties:
any catalog penalty with a compiled kernel, through ``_jit.group_prox``) of multi-output
regression; for ``R = 1`` it is ``SparseLinearRegression(groups=...)`` without intercept, for
groups of one input the row penalty of ``MultiTaskRegression``.

The block step is the one of ``_groups.group_step``: with ``L_g`` the largest eigenvalue of
``G_gg`` (the block's curvature, the same for every output), ``W_g <- prox_{alpha v_g Omega(||.||)
/ L_g}(W_g - Grad_g / L_g)``, ``Grad = (W - W0) G``. The gradient is kept up to date by the
moves; a move of block ``g`` by ``Delta`` changes it by ``Delta G[g, :]`` (``R m p``
operations). To use matrix products rather than ``R m p`` scalar updates, the blocks are swept
in chunks of consecutive columns: inside a chunk the gradient of the chunk's own columns is
updated after every block (exact Gauss-Seidel), and the rest of the gradient once per chunk by
one product ``G[rest, chunk] Delta_chunk`` (BLAS): the iterates are those of plain block
coordinate descent in the same order. A pass skips the arithmetic of a block that stays 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .._groups import GroupStructure, check_groups, group_alpha_max, group_penalty_sum, group_step
from .._penalty import kernel_spec, resolve_penalty
from ._common import single_thread_blas

__all__ = ["GramGroupResult", "gram_group_cd", "gram_group_alpha_max"]

#: columns per chunk of the blocked sweep
CHUNK = 64


@dataclass
class GramGroupResult:
    """``coef`` ``(R, p)``; ``n_epochs`` passes; ``converged`` (the largest block move, ``L_g
    ||Delta_g||``, fell below ``tol`` times the largest block gradient at 0); ``objective``."""

    coef: np.ndarray
    n_epochs: int
    converged: bool
    objective: float


@njit(cache=True)
def _chunk_pass(Ut, Gt, Gp, Lg, lam_g, cptr, fptr, fidx, g0, g1, code, params, v, out, tmp, D):
    """One Gauss-Seidel sweep over the blocks ``g0 .. g1 - 1`` (columns ``cptr[g0] ..
    cptr[g1] - 1``): ``Ut`` / ``Gt`` ``(p, R)`` the coefficients and gradient transposed, ``D``
    the chunk's accumulated moves; returns the largest ``L_g ||Delta_g||``."""
    R = Ut.shape[1]
    w = Ut.reshape(-1)
    grad = Gt.reshape(-1)
    j0 = cptr[g0]
    j1 = cptr[g1]
    maxd = 0.0
    for g in range(g0, g1):
        L = Lg[g]
        if L <= 0.0:
            continue
        a0 = cptr[g]
        m = cptr[g + 1] - a0
        group_step(w, grad, fptr, fidx, g, L, lam_g[g], code, params, 1.0, 0.0, 0.0, False,
                   v, out)
        dn = 0.0
        for a in range(m):
            for r in range(R):
                d = out[a * R + r] - Ut[a0 + a, r]
                tmp[a, r] = d
                dn += d * d
        if dn == 0.0:
            continue
        for a in range(m):
            for r in range(R):
                Ut[a0 + a, r] += tmp[a, r]
                D[a0 + a - j0, r] += tmp[a, r]
        for i in range(j0, j1):
            for a in range(m):
                s = Gp[i, a0 + a]
                if s != 0.0:
                    for r in range(R):
                        Gt[i, r] += s * tmp[a, r]
        d = L * np.sqrt(dn)
        if d > maxd:
            maxd = d
    return maxd


def _setup(G, W0, groups):
    G = np.asarray(G, dtype=np.float64)
    W0 = np.asarray(W0, dtype=np.float64)
    if W0.ndim == 1:
        W0 = W0[None, :]
    if G.ndim != 2 or G.shape[0] != G.shape[1] or W0.ndim != 2 or W0.shape[1] != G.shape[0]:
        raise ValueError(f"G must be (p, p) and W0 (R, p); got {G.shape} and {W0.shape}")
    if not (np.all(np.isfinite(G)) and np.all(np.isfinite(W0))):
        raise ValueError("G and W0 must be finite")
    gs = check_groups(groups, G.shape[0])
    perm = gs.idx
    Gp = np.ascontiguousarray(G[np.ix_(perm, perm)])
    Gp = 0.5 * (Gp + Gp.T)
    Lg = np.empty(gs.n_groups)
    for g in range(gs.n_groups):
        blk = Gp[gs.ptr[g]:gs.ptr[g + 1], gs.ptr[g]:gs.ptr[g + 1]]
        Lg[g] = max(float(blk[0, 0]) if blk.shape[0] == 1 else float(np.linalg.eigvalsh(blk)[-1]),
                    0.0)
    return G, W0, gs, perm, Gp, Lg


def _weights(weights, n_groups):
    if weights is None:
        return np.ones(n_groups)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n_groups,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be {n_groups} finite numbers >= 0 (one per group; 0: "
                         "unpenalized)")
    return w


def _flat(gs: GroupStructure, R: int):
    fptr = np.ascontiguousarray(gs.ptr * R, dtype=np.int64)
    return fptr, np.arange(gs.p * R, dtype=np.int64)


def gram_group_alpha_max(G, W0, penalty, groups, weights=None) -> float:
    """The smallest ``alpha`` at which every block's step from ``W = 0`` stays 0
    (``_groups.group_alpha_max`` on the blocks, which span every output)."""
    G, W0, gs, perm, Gp, Lg = _setup(G, W0, groups)
    R = W0.shape[0]
    P = resolve_penalty(penalty)
    grad = -(Gp @ np.ascontiguousarray(W0[:, perm].T)).reshape(-1)
    fptr, fidx = _flat(gs, R)
    flat = GroupStructure(fptr, fidx, gs.p * R)
    return float(group_alpha_max(grad, Lg, flat, _weights(weights, gs.n_groups), P))


def gram_group_cd(G, W0, alpha, penalty, groups, *, weights=None, start=None, tol=1e-4,
                  max_epochs=1000, chunk=CHUNK) -> GramGroupResult:
    """Minimize the module docstring's objective by blocked coordinate descent.

    ``G`` ``(p, p)`` symmetric positive semidefinite; ``W0`` ``(R, p)``; ``alpha >= 0``;
    ``penalty`` a catalog name or penalty object with a compiled kernel; ``groups`` any form
    ``check_groups`` takes (sizes of consecutive groups, or index arrays covering every input
    once); ``weights`` one per group (0: unpenalized; default 1); ``start`` ``(R, p)`` (default
    zeros); ``tol`` on the largest block move relative to the largest block gradient at 0;
    ``max_epochs`` passes; ``chunk`` columns per blocked sweep."""
    G, W0, gs, perm, Gp, Lg = _setup(G, W0, groups)
    R, p = W0.shape
    P = resolve_penalty(penalty)
    spec = kernel_spec(P)
    if spec is None:
        raise ValueError(f"penalty={penalty!r} has no compiled kernel; use a catalog penalty "
                         "(every name of penalties.available() but 'hard_threshold')")
    code, params = spec
    alpha = float(alpha)
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    lam_g = alpha * _weights(weights, gs.n_groups)
    U0t = np.ascontiguousarray(W0[:, perm].T)
    if start is None:
        Ut = np.zeros((p, R))
    else:
        start = np.asarray(start, dtype=np.float64)
        if start.shape != (R, p):
            raise ValueError(f"start must have shape {(R, p)}, got {start.shape}")
        Ut = np.ascontiguousarray(start[:, perm].T)
    Gt = Gp @ (Ut - U0t)
    scale = float(np.max(np.sqrt(np.add.reduceat((Gp @ U0t) ** 2, gs.ptr[:-1], axis=0)
                                 .sum(1)), initial=0.0))
    fptr, fidx = _flat(gs, R)
    mmax = int(np.max(gs.sizes))
    v, out = np.empty(mmax * R), np.empty(mmax * R)
    tmp = np.empty((mmax, R))
    bounds = [0]
    for g in range(gs.n_groups):  # chunks of consecutive groups of about `chunk` columns
        if gs.ptr[g + 1] - gs.ptr[bounds[-1]] > chunk and g > bounds[-1]:
            bounds.append(g)
    bounds.append(gs.n_groups)
    D = np.zeros((max(gs.ptr[b1] - gs.ptr[b0] for b0, b1 in zip(bounds, bounds[1:])), R))
    converged, ep = False, 0
    with single_thread_blas():
        for ep in range(1, max_epochs + 1):
            maxd = 0.0
            for b0, b1 in zip(bounds, bounds[1:]):
                j0, j1 = int(gs.ptr[b0]), int(gs.ptr[b1])
                Dc = D[:j1 - j0]
                Dc[:] = 0.0
                md = _chunk_pass(Ut, Gt, Gp, Lg, lam_g, gs.ptr, fptr, fidx, b0, b1, code,
                                 params, v, out, tmp, D)
                if md > 0.0:  # the rest of the gradient: one product per side of the chunk
                    moved = j0 + np.flatnonzero(np.any(Dc != 0.0, axis=1))
                    Dm = D[moved - j0]
                    if j0:
                        Gt[:j0] += Gp[:j0, moved] @ Dm
                    if j1 < p:
                        Gt[j1:] += Gp[j1:, moved] @ Dm
                maxd = max(maxd, md)
            if maxd <= tol * scale:
                converged = True
                break
    coef = np.empty((R, p))
    coef[:, perm] = Ut.T
    Dt = Ut - U0t
    obj = 0.5 * float(np.sum(Dt * (Gp @ Dt))) + float(group_penalty_sum(
        Ut.reshape(-1), fptr, fidx, np.arange(gs.n_groups, dtype=np.int64), lam_g, code,
        params, 1.0, 0.0, 0.0))
    return GramGroupResult(coef, ep, converged, obj)
