"""The layer problem in the coordinates the optimization methods share (ADMM, the penalty family,
the polish), and, for small layers, its exact optimum.

The problem (``base``'s module docstring): a layer ``W0`` (``R`` outputs, ``p`` inputs) with
input Gram ``G = X^T X / n`` is pruned to the ``W`` that minimizes ``E(W) = sum_r (w_r - w0_r)^T
G (w_r - w0_r)`` under a :class:`~.base.Budget`; the layer objective is ``E(W) / E(0)``.

**Scale-free coordinates.** With ``d_j = sqrt(G_jj)`` the methods work on ``u_rj = d_j w_rj / s``
(``s`` the root-mean-square of ``d_j w0_rj`` over the layer) and the unit-diagonal Gram ``Gs =
D^-1 G D^-1``: then ``E = s^2 sum_r (u_r - u0_r)^T Gs (u_r - u0_r)``, nothing depends on the
units of an input (multiplying input ``j`` by ``c`` divides ``w_j`` by ``c`` and leaves ``u`` as it
was), and a penalty ``Omega(u)`` is the penalty adaptive dropout puts on the weights of
unstandardized inputs (``docs/theory.md``: the column scale ``c_j = ||x_j||^2 / n`` multiplies
every dropout-induced term) at the weights' own scale (``u`` has RMS 1), so one parameter
(LogSum's ``eps``, MCP's ``a lam``) means the same on every layer.

**Dead inputs.** An input with ``G_jj = 0`` (a pixel that is constant 0 on the calibration data)
does not reach the output: its weights cost nothing to prune and gain nothing kept. The methods
solve on the live inputs (``q`` of them); :meth:`ScaledLayer.finish` keeps dead weights at their
trained values only where the budget asks for more weights than the live ones can take (largest
``|w0|`` first; an N:M group with fewer than ``N`` live inputs fills up with its dead ones), so
the budget is met exactly, then refits the kept weights (``base.refit_on_support``).
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.linalg
import torch

from .base import Budget, refit_on_support, select_mask

__all__ = ["ScaledLayer", "exact_optimum"]

# Relative ridge on the unit-diagonal Gram of a support where the exact optimum solves it (as
# refit_on_support's damping): keeps collinear inputs (neighbouring pixels) well posed.
DAMP = 1e-10


def as_numpy(A) -> np.ndarray:
    """A float64 numpy copy of a tensor or array."""
    if isinstance(A, torch.Tensor):
        return A.detach().to("cpu", torch.float64).numpy().copy()
    return np.array(A, dtype=np.float64)


class ScaledLayer:
    """One layer in scale-free coordinates (module docstring).

    Attributes: ``R``, ``p``; ``live`` (indices of the inputs with ``G_jj > 0``) and ``q`` their
    number; ``Gs`` ``(q, q)`` the unit-diagonal Gram; ``U0`` ``(R, q)`` the scaled trained
    weights (RMS 1); ``scale`` (``s``); ``B = U0 Gs`` (each row's ``Gs u0_r``); ``c0`` the rows'
    ``u0_r^T Gs u0_r`` and ``energy`` their sum (``E(0) / s^2``)."""

    def __init__(self, W0, G):
        self.W0_t = W0 if isinstance(W0, torch.Tensor) else torch.from_numpy(as_numpy(W0))
        self.G_t = G if isinstance(G, torch.Tensor) else torch.from_numpy(as_numpy(G))
        W0, G = as_numpy(W0), as_numpy(G)
        if W0.ndim != 2 or G.shape != (W0.shape[1], W0.shape[1]):
            raise ValueError(f"W0 must be (out, in) and G (in, in); got {W0.shape} and {G.shape}")
        self.W0 = W0
        self.R, self.p = W0.shape
        diag = np.clip(np.diag(G), 0.0, None)
        self.live = np.flatnonzero(diag > 0)
        self.q = self.live.size
        self.d = np.sqrt(diag[self.live])
        Gs = G[np.ix_(self.live, self.live)] / np.outer(self.d, self.d)
        self.Gs = np.ascontiguousarray(0.5 * (Gs + Gs.T))
        U0 = W0[:, self.live] * self.d
        rms = float(np.sqrt(np.mean(U0 * U0))) if U0.size else 0.0
        self.scale = rms if rms > 0 else 1.0
        self.U0 = np.ascontiguousarray(U0 / self.scale)
        self.B = self.U0 @ self.Gs
        self.c0 = np.einsum("rq,rq->r", self.B, self.U0)
        self.energy = float(self.c0.sum())
        self.cache = {}  # what the methods' runs on this layer share (ADMM's eigendecompositions)

    def gid(self, M):
        """The N:M group (``j // M``) of each live input."""
        return np.ascontiguousarray(self.live // M, dtype=np.int64)

    def live_target(self, budget: Budget) -> int:
        """How many live weights the budget keeps: ``min(n_keep, R q)``, or for N:M ``R`` times
        the sum over groups of ``min(N, live inputs of the group)``."""
        if budget.n_keep is not None:
            return min(int(budget.n_keep), self.R * self.q)
        N, M = budget.pattern
        per_group = np.bincount(self.live // M, minlength=-(-self.p // M))
        return self.R * int(np.minimum(N, per_group).sum())

    def top_mask(self, score, budget: Budget):
        """The live support ``(R, q)`` keeping the largest ``score`` ``(R, q)`` under the budget
        (``base.select_mask``: over the whole layer, or ``N`` per group of ``M`` inputs)."""
        full = torch.full((self.R, self.p), -torch.inf, dtype=torch.float64)
        full[:, torch.from_numpy(self.live)] = torch.from_numpy(np.asarray(score, np.float64))
        if budget.n_keep is not None:
            budget = Budget(n_keep=self.live_target(budget))
        return select_mask(full, budget)[:, torch.from_numpy(self.live)].numpy()

    def row_errors(self, supports, rows) -> np.ndarray:
        """The least-squares error ``min (u - u0_r)^T Gs (u - u0_r)`` of each row of ``rows`` on
        its support ``supports[r]`` (live positions), from scratch: ``c0_r - b_S^T (Gs_SS +
        DAMP I)^-1 b_S`` by Cholesky (least squares where that fails). What a support is
        worth, free of any search's tracked state."""
        return self._solve_rows(supports, rows, None)

    def refit_rows(self, mask, rows=None):
        """Every row's least squares on its live support ``mask`` ``(R, q)``: ``(U, err)``, the
        refit scaled weights (0 off the support) and the rows' errors (:meth:`row_errors`, the
        same solves). A method that scores its supports by their errors keeps the refit of the
        one it returns instead of solving it again (one Cholesky per row, scipy: a batched
        torch Cholesky of the padded supports was measured 3x slower on one thread).
        ``rows`` (indices): only those rows, ``mask`` given for them."""
        mask = np.asarray(mask, dtype=bool)
        U = np.zeros(mask.shape)
        err = self._solve_rows([np.flatnonzero(m) for m in mask], range(len(mask)), U,
                               range(self.R) if rows is None else rows)
        return U, err

    def refit_cg(self, mask, start, steps, tol=1e-4, rows=None):
        """Every row's least squares on its live support ``mask`` ``(R, q)`` by at most
        ``steps`` conjugate-gradient steps from ``start`` (scaled, e.g. ADMM's last point),
        all rows at once: one ``(R x q) (q x q)`` float32 product per step, stopped once every
        row's residual has fallen below ``tol`` times its first (ALPS, Meng et al. 2024: a few
        preconditioned CG steps on the support instead of an exact refit; ``Gs`` has a unit
        diagonal, so this is the diagonally preconditioned CG of the weights). Returns ``(U,
        err)`` as :meth:`refit_rows`, ``err`` the rows' exact errors at ``U`` (float64): never
        below the least squares, within 1e-5 of it in ten steps from ADMM's point on the
        MiniLM layers measured (benchmarks/nn_speed/oneshot_width.py). ``rows`` (indices):
        only those rows, ``mask`` and ``start`` given for them (the rows are independent)."""
        mask = np.asarray(mask, dtype=bool)
        U0 = self.U0 if rows is None else self.U0[rows]
        key = ("Gs", np.float32)
        if key not in self.cache:
            self.cache[key] = self.Gs.astype(np.float32)
        Gs = self.cache[key]
        M = mask.astype(np.float32)
        U = np.where(mask, start, 0.0).astype(np.float32)
        res = ((U0 - U).astype(np.float32) @ Gs) * M  # the negative gradient on S
        P = res.copy()
        rr = np.einsum("rq,rq->r", res, res)
        stop = tol * tol * rr
        for _ in range(steps):
            live = rr > stop
            if not live.any():
                break
            AP = (P @ Gs) * M
            pap = np.einsum("rq,rq->r", P, AP)
            a = np.where(live & (pap > 0), rr / np.where(pap > 0, pap, 1.0), 0.0)
            U += a[:, None].astype(np.float32) * P
            res -= a[:, None].astype(np.float32) * AP
            new = np.einsum("rq,rq->r", res, res)
            b = np.where(rr > 0, new / np.where(rr > 0, rr, 1.0), 0.0)
            P = res + b[:, None].astype(np.float32) * P
            rr = new
        U = U.astype(np.float64)
        E = U - U0
        return U, np.einsum("rq,rq->r", E @ self.Gs, E)

    def _solve_rows(self, supports, rows, U, layer_rows=None):
        # supports[r] and U[r] for r in rows; the layer's row of each (rows itself if None)
        out = np.empty(len(rows))
        layer_rows = rows if layer_rows is None else layer_rows
        for i, (r, lr) in enumerate(zip(rows, layer_rows)):
            S = np.asarray(supports[r], dtype=np.int64)
            if S.size == 0:
                out[i] = self.c0[lr]
                continue
            GSS = self.Gs[np.ix_(S, S)] + DAMP * np.eye(S.size)
            bS = self.B[lr, S]
            try:
                x = scipy.linalg.cho_solve(scipy.linalg.cho_factor(GSS, check_finite=False),
                                           bS, check_finite=False)
            except np.linalg.LinAlgError:
                x = np.linalg.lstsq(GSS, bS, rcond=None)[0]
            out[i] = self.c0[lr] - float(bS @ x)
            if U is not None:
                U[r, S] = x
        return out

    def finish(self, mask, budget: Budget, values=None, refit=True) -> torch.Tensor:
        """The ``(R, p)`` float64 weight of the live support ``mask`` ``(R, q)`` with the dead
        weights the budget needs (module docstring): the kept weights refit by least squares
        (``refit=True``: ``base.refit_on_support``), else the scaled live ``values`` ``(R, q)``
        mapped back (or, without them, the trained weights)."""
        live_t = torch.from_numpy(self.live)
        full = torch.zeros((self.R, self.p), dtype=torch.bool)
        full[:, live_t] = torch.from_numpy(np.asarray(mask, dtype=bool))
        if self.q < self.p or budget.pattern is not None:
            dead = torch.ones(self.p, dtype=torch.bool)
            dead[live_t] = False
            score = torch.where(full, torch.inf, torch.where(dead.expand(self.R, -1),
                                                              self.W0_t.abs(), -torch.inf))
            if budget.n_keep is not None:
                full = select_mask(score, budget) & torch.isfinite(score) | full
            else:  # N:M: dead inputs fill a group first, then live ones the search left out
                # (a group whose live inputs lie in the span of the row's support)
                score = torch.where(score == -torch.inf, -1.0, score)
                full = select_mask(score, budget)
        W0 = self.W0_t.to(torch.float64)
        if values is not None:
            W = torch.where(full, W0, torch.zeros_like(W0))
            vals = torch.from_numpy(np.asarray(values, np.float64) * self.scale / self.d)
            W[:, live_t] = torch.where(full[:, live_t], vals, torch.zeros_like(vals))
        else:
            # placeholders where a kept live weight is 0 in W0 (the refit gives its value)
            live_full = torch.zeros_like(full)
            live_full[:, live_t] = True
            W = torch.where(full, torch.where(live_full & (W0 == 0), torch.ones_like(W0), W0),
                            torch.zeros_like(W0))
        if refit:
            W = refit_on_support(W0, W, self.G_t.to(torch.float64))
        return W


# ----------------------------------------------------------------------------------------------
# the exact optimum of small layers (tests and benchmarks)


def _support_values(Gs, B, c0, S):
    """``min (u - u0)^T Gs (u - u0)`` over ``u`` supported on ``S``, for every row:
    ``c0 - b_S^T Gs_SS^-1 b_S``."""
    if len(S) == 0:
        return c0.copy()
    S = list(S)
    GSS = Gs[np.ix_(S, S)] + DAMP * np.eye(len(S))
    X = np.linalg.solve(GSS, B[:, S].T)
    return c0 - np.einsum("sr,rs->r", X, B[:, S])


def exact_optimum(W0, G, budget: Budget, max_inputs=16):
    """The exact optimum of the layer objective under ``budget``, by enumeration, for layers
    with at most ``max_inputs`` live inputs: each row's best error for every support size over
    all ``2^q`` supports, the layer's ``n_keep`` split over the rows by dynamic programming; for
    N:M every combination of ``N`` inputs in each group. Returns ``(objective, per-row support
    sizes)``."""
    sl = ScaledLayer(W0, G)
    budget.check_shape((sl.R, sl.p))
    q = sl.q
    if q > max_inputs:
        raise ValueError(f"exact_optimum enumerates 2^{q} supports per row; the layer has {q} "
                         f"live inputs (> max_inputs={max_inputs})")
    if sl.energy == 0:
        return 0.0, np.zeros(sl.R, dtype=np.int64)
    if budget.pattern is not None:
        N, M = budget.pattern
        gid = sl.gid(M)
        choices = [list(itertools.combinations(np.flatnonzero(gid == g).tolist(),
                                               min(N, int(np.sum(gid == g)))))
                   for g in np.unique(gid)]
        best = np.full(sl.R, np.inf)
        for combo in itertools.product(*choices):
            S = [j for part in combo for j in part]
            best = np.minimum(best, _support_values(sl.Gs, sl.B, sl.c0, S))
        sizes = np.full(sl.R, sum(len(c[0]) for c in choices))
        return float(best.sum()) / sl.energy, sizes
    F = np.full((sl.R, q + 1), np.inf)  # F[r, k]: the best error of row r with k inputs
    for k in range(q + 1):
        for S in itertools.combinations(range(q), k):
            F[:, k] = np.minimum(F[:, k], _support_values(sl.Gs, sl.B, sl.c0, S))
    K = sl.live_target(budget)
    dp = np.full(K + 1, np.inf)  # dp[t]: the best total of the rows so far with t nonzeros
    dp[0] = 0.0
    arg = np.zeros((sl.R, K + 1), dtype=np.int64)
    for r in range(sl.R):
        new = np.full(K + 1, np.inf)
        for k in range(min(q, K) + 1):
            cand = np.full(K + 1, np.inf)
            cand[k:] = dp[: K + 1 - k] + F[r, k]
            better = cand < new
            new[better] = cand[better]
            arg[r, better] = k
        dp = new
    sizes = np.zeros(sl.R, dtype=np.int64)
    t = K
    for r in range(sl.R - 1, -1, -1):
        sizes[r] = arg[r, t]
        t -= sizes[r]
    return float(dp[K]) / sl.energy, sizes
