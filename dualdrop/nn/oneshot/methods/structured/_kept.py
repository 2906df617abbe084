"""Exact moves on the kept units of a consumer, each scored with the kept weights refit.

In the notation of ``base`` (Gram ``A``, ``B = W0 A``, kept columns ``S``, ``H = (A_SS)^-1``,
refit ``W_S = B_S H``), the error left is ``f(S) = tr(W0 A W0^T) - tr(B_S H B_S^T)``, and:

- removing unit ``g`` (its columns ``c_g`` in ``S``) raises it by ``tr(W_g H_gg^-1 W_g^T)``
  (Optimal Brain Surgeon on the whole layer, Hassibi & Stork 1993, for a block of columns: the
  structured OBS step of ZipLM, Kurtic et al., NeurIPS 2023), with ``W_g`` the refit weights of
  its columns and ``H_gg`` its block of the inverse;
- adding unit ``a`` lowers it by ``tr(R_a C_a^-1 R_a^T)``, ``R_a = B_a - W_S A_Sa`` (minus the
  gradient on its columns) and ``C_a = A_aa - A_aS H A_Sa`` (the Schur complement: what is left
  of its inputs after regressing them on the kept ones);
- a swap (remove ``g``, add ``a``) combines both with the addition's terms updated for the
  removal: ``R'_a = R_a + W_g H_gg^-1 Z_ga`` and ``C'_a = C_a + Z_ga^T H_gg^-1 Z_ga``,
  ``Z = H A_{S, .}`` (rank-``m`` updates, ``m`` the columns of a unit), so every pair is scored
  from two products, ``H A_{S,Sc}`` and ``W_S^T R``, as in OSSCAR's local search (Meng et al.,
  ICML 2024).

:func:`backward_greedy` removes units one at a time by the OBS step, updating ``H`` and the
refit weights in place (rank-``m`` downdates); :func:`swap_search` applies the best improving
swap until none improves (at most ``max_swaps``); :func:`fix_count` brings any kept set to a
count by exact greedy additions or removals.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._swaps import column_swap_search
from .problem import (SWAP_FLOOR, SWAP_TOL, UnitProblem, as_mask, inverse_psd, solve_psd,
                      unit_matrix)

def damped(problem: UnitProblem, damp: float) -> np.ndarray:
    """The damped Gram ``A + lambda I`` of ``problem.terms(damp)``."""
    return problem.terms(damp)[0]


def backward_greedy(problem: UnitProblem, n_keep: int, damp: float = 0.01,
                    start=None) -> np.ndarray:
    """Remove units one at a time, each the one whose removal raises the (damped) refit error
    least, from ``start`` (all units by default) down to ``n_keep``; returns the kept units."""
    return greedy_path(problem, n_keep, damp, start)[0]


def greedy_path(problem: UnitProblem, n_keep: int, damp: float = 0.01, start=None):
    """``(kept, order, costs)``: :func:`backward_greedy`'s kept units, the units it removed in
    order and the rise of the (damped) error at each removal. Units of one column each run in
    a compiled loop (``_greedy_columns``)."""
    A, B, _ = problem.terms(damp)
    p = A.shape[0]
    alive = np.ones(problem.n_units, bool) if start is None else as_mask(start, problem.n_units)
    S = problem.kept_columns(np.flatnonzero(alive))
    H = np.zeros((p, p))
    H[np.ix_(S, S)] = inverse_psd(A[np.ix_(S, S)])
    W = np.zeros_like(problem.W0)
    W[:, S] = B[:, S] @ H[np.ix_(S, S)]
    U = unit_matrix(problem.columns)
    n_remove = max(int(alive.sum()) - n_keep, 0)
    costs = np.zeros(n_remove)
    if U is not None and U.shape[1] == 1 and n_remove > 0:
        cand = np.zeros(p, bool)
        cand[U[alive, 0]] = True
        gone = _greedy_columns(H, np.ascontiguousarray(W), cand, n_remove, costs)
        col_unit = np.full(p, -1)
        col_unit[U[:, 0]] = np.arange(problem.n_units)
        order = col_unit[gone]
        alive[order] = False
        return np.flatnonzero(alive), order, costs
    order = []
    while alive.sum() > n_keep:
        idx = np.flatnonzero(alive)
        cost = np.array([_removal_cost(W, H, problem.columns[g]) for g in idx])
        best = int(np.argmin(cost))
        g = idx[best]
        costs[len(order)] = cost[best]
        c = np.asarray(problem.columns[g])
        Hg = H[c]                                   # (m, p)
        K = solve_psd(H[np.ix_(c, c)], Hg)          # Hgg^-1 H_g.
        W -= W[:, c] @ K
        H -= Hg.T @ K
        W[:, c] = 0.0
        H[c] = 0.0
        H[:, c] = 0.0
        alive[g] = False
        order.append(g)
    return np.flatnonzero(alive), np.asarray(order, np.int64), costs


@njit(cache=True)
def _greedy_columns(H, W, cand, n_remove, costs):
    """The OBS greedy for units of one column: ``n_remove`` times, the candidate column ``c``
    of least ``||W_c||^2 / H_cc`` leaves, ``W -= W_c H_c. / H_cc`` (in place) and ``H -=
    H_.c H_c. / H_cc``. ``H`` (the inverse Gram of the kept columns, zero elsewhere) is not
    updated but kept as ``H0 - V^T V`` with ``V``'s rows the removals' scaled rows: a removal
    then costs ``O(p (R + removals so far))`` instead of ``O(p^2)``. Returns the removed
    columns in order."""
    p = H.shape[0]
    R = W.shape[0]
    out = np.empty(n_remove, np.int64)
    norms = np.zeros(p)
    for r in range(R):
        for j in range(p):
            norms[j] += W[r, j] * W[r, j]
    diag = np.empty(p)
    for j in range(p):
        diag[j] = H[j, j]
    V = np.zeros((n_remove, p))
    h = np.empty(p)
    for step in range(n_remove):
        c = -1
        best = np.inf
        for j in range(p):
            if cand[j]:
                s = norms[j] / max(diag[j], 1e-300)
                if s < best:
                    best = s
                    c = j
        for j in range(p):
            h[j] = H[c, j]
        for i in range(step):
            f = V[i, c]
            if f != 0.0:
                for j in range(p):
                    h[j] -= f * V[i, j]
        costs[step] = best
        Hcc = max(h[c], 1e-300)
        sc = 1.0 / np.sqrt(Hcc)
        for j in range(p):
            V[step, j] = h[j] * sc
            diag[j] -= V[step, j] * V[step, j]
            h[j] /= Hcc
        h[c] = 0.0
        for j in range(p):
            norms[j] = 0.0
        for r in range(R):
            f = W[r, c]
            if f != 0.0:
                for j in range(p):
                    W[r, j] -= f * h[j]
            W[r, c] = 0.0
            for j in range(p):
                norms[j] += W[r, j] * W[r, j]
        cand[c] = False
        out[step] = c
    return out


def _removal_cost(W, H, c) -> float:
    c = np.asarray(c)
    Wg = W[:, c]
    return float(np.sum(Wg * solve_psd(H[np.ix_(c, c)], Wg.T).T))


class _State:
    """``H``, the refit weights and the addition terms of one kept set (rebuilt per move)."""

    def __init__(self, problem: UnitProblem, damp: float, kept_mask: np.ndarray):
        A, self.B, self.c0 = problem.terms(damp)
        self.problem, self.A, self.kept = problem, A, kept_mask
        self.S = problem.kept_columns(np.flatnonzero(kept_mask))
        self.H = inverse_psd(A[np.ix_(self.S, self.S)])
        self.WS = self.B[:, self.S] @ self.H            # (out, |S|)
        self.pos = {int(j): i for i, j in enumerate(self.S)}

    def error(self) -> float:
        return self.c0 - float(np.sum(self.WS * self.B[:, self.S]))

    def local(self, g):
        return np.array([self.pos[int(j)] for j in self.problem.columns[g]], np.int64)

    def removal_costs(self, units):
        units = np.asarray(units, np.int64)
        U = unit_matrix(self.problem.columns)
        if U is not None and U.shape[1] == 1:
            li = np.array([self.pos[int(j)] for j in U[units, 0]], np.int64)
            Hii = np.maximum(np.diag(self.H)[li], 1e-300)
            return (self.WS[:, li] ** 2).sum(0) / Hii
        out = np.empty(len(units))
        for k, g in enumerate(units):
            li = self.local(g)
            Wg = self.WS[:, li]
            out[k] = float(np.sum(Wg * solve_psd(self.H[np.ix_(li, li)], Wg.T).T))
        return out

    def addition_gains(self, units):
        A, S = self.A, self.S
        units = np.asarray(units, np.int64)
        U = unit_matrix(self.problem.columns)
        if U is not None and U.shape[1] == 1:
            ca = U[units, 0]
            ASa = A[np.ix_(S, ca)]
            C = A[ca, ca] - np.einsum("sa,sa->a", ASa, self.H @ ASa)
            R = self.B[:, ca] - self.WS @ ASa
            gains = (R * R).sum(0) / np.maximum(C, 1e-300)
            return np.where(C > SWAP_FLOOR * A[ca, ca], gains, 0.0)
        out = np.empty(len(units))
        for k, a in enumerate(units):
            ca = np.asarray(self.problem.columns[a])
            ASa = A[np.ix_(S, ca)]
            C = A[np.ix_(ca, ca)] - ASa.T @ self.H @ ASa
            R = self.B[:, ca] - self.WS @ ASa
            out[k] = float(np.sum(R * solve_psd(C, R.T).T))
        return out


def fix_count(problem: UnitProblem, kept, n_keep: int, damp: float = 1e-6) -> np.ndarray:
    """``kept`` brought to ``n_keep`` units by exact greedy moves: removals by
    :func:`backward_greedy` from ``kept``, or the best addition, one at a time."""
    mask = as_mask(kept, problem.n_units)
    if mask.sum() > n_keep:
        return backward_greedy(problem, n_keep, damp, start=np.flatnonzero(mask))
    while mask.sum() < n_keep:
        st = _State(problem, damp, mask)
        idx = np.flatnonzero(~mask)
        mask[idx[int(np.argmax(st.addition_gains(idx)))]] = True
    return np.flatnonzero(mask)


def best_swap(st: _State):
    """``(delta, g, a)``: the swap (remove kept ``g``, add removed ``a``) that changes the error
    by the least ``delta`` (module docstring), or None if there is no pair."""
    problem, A, S, H = st.problem, st.A, st.S, st.H
    kept = np.flatnonzero(st.kept)
    out = np.flatnonzero(~st.kept)
    if kept.size == 0 or out.size == 0:
        return None
    U = unit_matrix(problem.columns)
    if U is not None and U.shape[1] == 1:
        li = np.array([st.pos[int(j)] for j in U[kept, 0]])
        ca = U[out, 0]
        ASa = A[np.ix_(S, ca)]                       # (|S|, n_out)
        Z = H @ ASa                                  # H A_{S,a}
        C = A[ca, ca] - np.einsum("sa,sa->a", ASa, Z)
        R = st.B[:, ca] - st.WS @ ASa                # (out, n_out)
        Hii = np.diag(H)[li]
        Wi = st.WS[:, li]                            # (out, n_kept)
        Zi = Z[li]                                   # (n_kept, n_out)
        t = Zi / Hii[:, None]
        num = ((R * R).sum(0)[None, :] + 2 * t * (Wi.T @ R)
               + t * t * (Wi * Wi).sum(0)[:, None])
        den = np.maximum(C[None, :] + Zi * t, 1e-300)
        delta = (Wi * Wi).sum(0)[:, None] / Hii[:, None] - num / den
        delta[:, C <= SWAP_FLOOR * A[ca, ca]] = np.inf
        k = int(np.argmin(delta))
        i, j = divmod(k, out.size)
        return float(delta[i, j]), int(kept[i]), int(out[j])
    best = None
    locs = {g: st.local(g) for g in kept}
    Hinv = {g: solve_psd(H[np.ix_(locs[g], locs[g])], np.eye(len(locs[g]))) for g in kept}
    for a in out:
        ca = np.asarray(problem.columns[a])
        ASa = A[np.ix_(S, ca)]
        Z = H @ ASa
        C = A[np.ix_(ca, ca)] - ASa.T @ Z
        if np.linalg.eigvalsh(C)[0] <= SWAP_FLOOR * float(np.diag(A)[ca].max()):
            continue
        R = st.B[:, ca] - st.WS @ ASa
        for g in kept:
            li = locs[g]
            Wg, Zg, Hi = st.WS[:, li], Z[li], Hinv[g]
            R2 = R + Wg @ Hi @ Zg
            C2 = C + Zg.T @ Hi @ Zg
            delta = float(np.sum(Wg * (Wg @ Hi))) - float(np.sum(R2 * solve_psd(C2, R2.T).T))
            if best is None or delta < best[0]:
                best = (delta, int(g), int(a))
    return best


def swap_search(problem: UnitProblem, kept, max_swaps: int = 200, damp: float = 1e-6,
                candidates: int = 128):
    """Apply the best improving swap until none lowers the refit error (at most
    ``max_swaps``); returns ``(kept, swaps)``. Units of one column use the rank-one updates of
    ``_swaps`` (pairs among ``candidates`` cheapest removals and best additions first)."""
    A, B, c0 = problem.terms(damp)
    mask = as_mask(kept, problem.n_units)
    energy = max(c0, 1e-300)
    U = unit_matrix(problem.columns)
    if U is not None and U.shape[1] == 1:
        free = problem.free
        S = np.concatenate([U[mask, 0], free]) if free.size else U[mask, 0]
        n_fixed = free.size
        # the free columns must stay: give them no chance to leave (they are appended and
        # scored like the rest, so a swap could take one out: search without them instead)
        if n_fixed:
            return _swap_search_rebuild(problem, damp, mask, max_swaps, energy)
        S, O, swaps = column_swap_search(A, B, energy, S, U[~mask, 0], max_swaps, candidates)
        col_unit = np.full(A.shape[0], -1)
        col_unit[U[:, 0]] = np.arange(problem.n_units)
        return np.sort(col_unit[S]), swaps
    return _swap_search_rebuild(problem, damp, mask, max_swaps, energy)


def _swap_search_rebuild(problem, damp, mask, max_swaps, energy):
    swaps = 0
    for _ in range(max_swaps):
        st = _State(problem, damp, mask)
        found = best_swap(st)
        if found is None or found[0] >= -SWAP_TOL * energy:
            break
        _, g, a = found
        mask[g], mask[a] = False, True
        swaps += 1
    return np.flatnonzero(mask), swaps
