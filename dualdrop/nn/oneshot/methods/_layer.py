"""The layer problem in the form the optimization methods share (ADMM, the penalty family, the
polish), its exact least-squares refit, N:M groups and, for small layers, its exact optimum.

A linear layer ``W0`` (``R`` outputs, ``p`` inputs) with input Gram ``G = X^T X / n`` is pruned
to ``W`` minimizing the reconstruction error

    E(W) = ||X (W - W0)^T||^2 / n = sum_r (w_r - w0_r)^T G (w_r - w0_r)

under a budget: ``n_keep`` nonzeros in the whole layer, or at most ``N`` nonzeros in every ``M``
consecutive inputs of each row (N:M). The report's layer objective is ``E(W) / E(0)``, ``E(0) =
||X W0^T||^2 / n`` the dense output energy.

**Scale-free coordinates.** With ``d_j = sqrt(G_jj)`` the methods work on ``u_rj = d_j w_rj / s``
(``s`` the root-mean-square of ``d_j w0_rj`` over the layer) and the unit-diagonal Gram ``Gs =
D^-1 G D^-1``: then ``E = s^2 sum_r (u_r - u0_r)^T Gs (u_r - u0_r)``, the problem no longer
depends on the units of the inputs (multiplying input ``j`` by ``c`` divides ``w_j`` by ``c`` and
leaves ``u`` as it was), and a penalty ``Omega(u)`` is the penalty adaptive dropout puts on the
weights of unstandardized inputs (docs/theory.md: the per-column scale ``c_j = ||x_j||^2 / n``
multiplies every dropout-induced term), at the weights' own scale (``u`` has RMS 1), so one
penalty parameter (LogSum's ``eps``, MCP's ``a``) means the same on every layer.

**Dead inputs.** An input with ``G_jj = 0`` (a pixel that is 0 on every calibration image) does
not reach the output: its weights cost nothing to prune and nothing to keep. The methods solve
on the live inputs; a budget larger than the live weights keeps dead weights at their trained
values (largest first), and an N:M group with fewer than ``N`` live inputs fills up with its dead
ones, so the budget is met exactly either way.
"""

from __future__ import annotations

import itertools
import numbers

import numpy as np
import scipy.linalg as sla

__all__ = ["LayerProblem", "check_budget", "exact_optimum", "layer_objective"]

# Relative ridge added to the unit-diagonal Gram where it is factorized: keeps a refit on
# collinear inputs (neighbouring pixels) well posed without moving the optimum measurably.
DAMP = 1e-10


def check_budget(n_keep, pattern, R, p):
    """``(n_keep, pattern)`` checked for an ``(R, p)`` layer: exactly one of them set,
    ``0 <= n_keep <= R p``, ``pattern = (N, M)`` with ``1 <= N <= M``."""
    if (n_keep is None) == (pattern is None):
        raise ValueError("give exactly one of n_keep (a number of nonzeros for the whole layer) "
                         "and pattern (N, M)")
    if n_keep is not None:
        if isinstance(n_keep, bool) or not isinstance(n_keep, numbers.Integral) \
                or not 0 <= n_keep <= R * p:
            raise ValueError(f"n_keep must be an integer in [0, {R * p}] for a ({R}, {p}) layer, "
                             f"got {n_keep!r}")
        return int(n_keep), None
    try:
        N, M = (int(v) for v in pattern)
        ok = all(not isinstance(v, bool) and float(v) == int(v) for v in pattern)
    except (TypeError, ValueError):
        ok = False
    if not ok or not 1 <= N <= M:
        raise ValueError(f"pattern must be (N, M) with integers 1 <= N <= M, e.g. (2, 4); got "
                         f"{pattern!r}")
    return None, (N, M)


def layer_objective(W, W0, G):
    """``E(W) / E(0)``: the relative reconstruction error (module docstring); 0 for a layer with
    no output energy."""
    D = W - W0
    e0 = float(np.einsum("rp,rp->", W0 @ G, W0))
    e = float(np.einsum("rp,rp->", D @ G, D))
    return e / e0 if e0 > 0 else 0.0


class LayerProblem:
    """One layer in scale-free coordinates (module docstring).

    Attributes: ``R``, ``p``; ``live`` (indices of the inputs with ``G_jj > 0``), ``q`` (their
    number); ``Gs`` ``(q, q)`` unit-diagonal Gram; ``U0`` ``(R, q)`` the scaled trained weights
    (RMS 1); ``scale`` (``s``); ``energy`` ``sum_r u0_r^T Gs u0_r`` (``E(0) / s^2``)."""

    def __init__(self, W0, G):
        W0 = np.ascontiguousarray(W0, dtype=np.float64)
        G = np.ascontiguousarray(G, dtype=np.float64)
        if W0.ndim != 2 or G.shape != (W0.shape[1], W0.shape[1]):
            raise ValueError(f"W0 must be (out, in) and G (in, in); got {W0.shape} and {G.shape}")
        self.W0, self.G = W0, G
        self.R, self.p = W0.shape
        diag = np.clip(np.diag(G), 0.0, None)
        top = float(diag.max(initial=0.0))
        self.live = np.flatnonzero(diag > 1e-12 * top) if top > 0 else np.zeros(0, dtype=np.int64)
        self.q = self.live.size
        self.d = np.sqrt(diag[self.live])
        Gs = G[np.ix_(self.live, self.live)] / np.outer(self.d, self.d)
        self.Gs = np.ascontiguousarray(0.5 * (Gs + Gs.T))
        U0 = W0[:, self.live] * self.d
        rms = float(np.sqrt(np.mean(U0 * U0))) if U0.size else 0.0
        self.scale = rms if rms > 0 else 1.0
        self.U0 = np.ascontiguousarray(U0 / self.scale)
        self.B = self.U0 @ self.Gs  # linear terms of the rows: Gs u0_r
        self.c0 = np.einsum("rq,rq->r", self.B, self.U0)  # u0_r^T Gs u0_r
        self.energy = float(self.c0.sum())

    # ------------------------------------------------------------------------------------------
    def live_budget(self, n_keep):
        """How many of ``n_keep`` the live weights take (the rest are dead weights kept as they
        are)."""
        return min(int(n_keep), self.R * self.q)

    def groups(self, M):
        """``(gid, pad)`` for N:M groups of the inputs: ``gid[k]`` the group of live input ``k``;
        ``pad`` ``(n_groups, M)`` the live positions of each group's inputs, ``-1`` for dead or
        missing ones (the last group of a width not divisible by ``M`` is short)."""
        n_groups = -(-self.p // M)
        gid = self.live // M
        pad = np.full((n_groups, M), -1, dtype=np.int64)
        pad[gid, self.live % M] = np.arange(self.q)
        return gid, pad

    def rel_objective_u(self, U):
        """``E / E(0)`` of scaled live weights ``U`` (dead weights at their trained values do not
        count: they do not reach the output)."""
        D = U - self.U0
        return float(np.einsum("rq,rq->", D @ self.Gs, D)) / self.energy if self.energy > 0 \
            else 0.0

    def to_weights(self, U, n_keep=None, pattern=None):
        """The ``(R, p)`` weights of scaled live weights ``U``, with the dead weights that the
        budget keeps (module docstring) at their trained values."""
        W = np.zeros((self.R, self.p))
        W[:, self.live] = U * (self.scale / self.d)
        dead = np.setdiff1d(np.arange(self.p), self.live)
        if dead.size == 0:
            return W
        if n_keep is not None:
            extra = int(n_keep) - int(np.count_nonzero(U))
            if extra > 0:
                vals = np.abs(self.W0[:, dead]).ravel()
                pick = np.argsort(-vals, kind="stable")[:extra]
                r, c = np.unravel_index(pick, (self.R, dead.size))
                W[r, dead[c]] = self.W0[r, dead[c]]
            return W
        N, M = pattern
        for g0 in range(0, self.p, M):
            cols = np.arange(g0, min(g0 + M, self.p))
            dc = cols[np.isin(cols, dead)]
            if dc.size == 0:
                continue
            have = np.count_nonzero(W[:, cols], axis=1)
            need = np.minimum(N, cols.size) - have
            for r in np.flatnonzero(need > 0):
                order = dc[np.argsort(-np.abs(self.W0[r, dc]), kind="stable")][:need[r]]
                W[r, order] = self.W0[r, order]
        return W

    # ------------------------------------------------------------------------------------------
    def refit(self, mask):
        """Least squares on the support ``mask`` ``(R, q)``: each row's ``u_S`` minimizing
        ``(u - u0)^T Gs (u - u0)`` with ``u = 0`` off ``S``. Solved for ``u_S - u0_S`` (the
        system ``Gs_SS delta = Gs_{S,S^c} u0_{S^c}``, ridge ``DAMP``), so that a full support
        returns ``U0`` exactly and a singular ``Gs_SS`` moves ``u_S`` least from ``u0_S``."""
        U = np.zeros_like(self.U0)
        for r in range(self.R):
            S = np.flatnonzero(mask[r])
            if S.size == 0:
                continue
            GSS = self.Gs[np.ix_(S, S)]
            rhs = self.B[r, S] - GSS @ self.U0[r, S]
            GSS = GSS + DAMP * np.eye(S.size)
            try:
                delta = sla.cho_solve(sla.cho_factor(GSS, lower=True, check_finite=False), rhs,
                                      check_finite=False)
            except sla.LinAlgError:
                delta = np.linalg.lstsq(GSS, rhs, rcond=None)[0]
            U[r, S] = self.U0[r, S] + delta
        return U

    def keep_top(self, score, n_keep=None, pattern=None):
        """The support keeping the largest ``score`` ``(R, q)``: ``n_keep`` over the whole layer
        (live part), or ``N`` in each group of ``M`` inputs of every row. Ties keep the lower
        index."""
        mask = np.zeros((self.R, self.q), dtype=bool)
        if n_keep is not None:
            k = self.live_budget(n_keep)
            if k > 0:
                flat = score.ravel()
                idx = np.argsort(-flat, kind="stable")[:k]
                mask.ravel()[idx] = True
            return mask
        N, M = pattern
        _, pad = self.groups(M)
        vals = np.where(pad[None] >= 0, score[:, np.maximum(pad, 0)], -np.inf)
        order = np.argsort(-vals, axis=2, kind="stable")[:, :, :N]
        pos = np.take_along_axis(np.broadcast_to(pad, vals.shape), order, axis=2)
        rows = np.broadcast_to(np.arange(self.R)[:, None, None], pos.shape)
        ok = pos >= 0
        mask[rows[ok], pos[ok]] = True
        return mask


# ----------------------------------------------------------------------------------------------
# the exact optimum of small layers (tests and benchmarks)


def _support_values(Gs, B, c0, S):
    """``min (u - u0)^T Gs (u - u0)`` over ``u`` supported on ``S`` for every row:
    ``c0 - b_S^T Gs_SS^-1 b_S``."""
    if len(S) == 0:
        return c0.copy()
    S = list(S)
    GSS = Gs[np.ix_(S, S)] + DAMP * np.eye(len(S))
    X = np.linalg.solve(GSS, B[:, S].T)
    return c0 - np.einsum("sr,rs->r", X, B[:, S])


def exact_optimum(W0, G, n_keep=None, pattern=None, max_inputs=16):
    """The exact optimum of :func:`layer_objective` under the budget, by enumeration, for layers
    with at most ``max_inputs`` live inputs: every row's best objective for each support size
    over all ``2^q`` supports, the layer budget split over rows by dynamic programming; for N:M,
    every combination of ``N`` inputs per group. Returns ``(relative objective, per-row support
    sizes)`` (sizes over the live inputs)."""
    lp = LayerProblem(W0, G)
    n_keep, pattern = check_budget(n_keep, pattern, lp.R, lp.p)
    q = lp.q
    if q > max_inputs:
        raise ValueError(f"exact_optimum enumerates 2^{q} supports per row; the layer has {q} "
                         f"live inputs (> max_inputs={max_inputs})")
    if lp.energy == 0:
        return 0.0, np.zeros(lp.R, dtype=np.int64)
    if pattern is not None:
        N, M = pattern
        _, pad = lp.groups(M)
        choices = [list(itertools.combinations([int(v) for v in g if v >= 0],
                                               min(N, int(np.sum(g >= 0)))))
                   for g in pad]
        best = np.full(lp.R, np.inf)
        for combo in itertools.product(*choices):
            S = [j for part in combo for j in part]
            best = np.minimum(best, _support_values(lp.Gs, lp.B, lp.c0, S))
        sizes = np.full(lp.R, sum(len(c[0]) for c in choices))
        return float(best.sum()) / lp.energy, sizes
    # per-row curves: best objective with k inputs
    F = np.full((lp.R, q + 1), np.inf)
    for k in range(q + 1):
        for S in itertools.combinations(range(q), k):
            F[:, k] = np.minimum(F[:, k], _support_values(lp.Gs, lp.B, lp.c0, S))
    K = lp.live_budget(n_keep)
    # dp[t] = best total over the rows so far with t nonzeros
    dp = np.full(K + 1, np.inf)
    dp[0] = 0.0
    arg = np.zeros((lp.R, K + 1), dtype=np.int64)
    for r in range(lp.R):
        new = np.full(K + 1, np.inf)
        for k in range(min(q, K) + 1):
            cand = np.full(K + 1, np.inf)
            cand[k:] = dp[: K + 1 - k] + F[r, k]
            better = cand < new
            new[better] = cand[better]
            arg[r, better] = k
        dp = new
    sizes = np.zeros(lp.R, dtype=np.int64)
    t = K
    for r in range(lp.R - 1, -1, -1):
        sizes[r] = arg[r, t]
        t -= sizes[r]
    return float(dp[K]) / lp.energy, sizes
