"""Support polish: local search on the support of a pruned layer, each move scored exactly.

Given a pruned layer, the polish keeps its budget and improves its support by single moves whose
effect on the reconstruction error ``E(W) = sum_r (w_r - w0_r)^T G (w_r - w0_r)`` is known in
closed form *with the kept weights refit by least squares* (the coordinates of
``dualdrop.nn.oneshot.methods._layer``: unit-diagonal Gram, scaled weights ``u``):

- removing input ``j`` from a row with support ``S`` (Optimal Brain Surgeon, Hassibi & Stork
  1993, on the row's least-squares problem) raises the row's error by ``u_j^2 / (2 [H]_jj)``
  with ``H = (Gs_SS)^-1``;
- adding input ``k`` lowers it by ``g_k^2 / (2 c_k)``, ``g = Gs (u - u0)`` the gradient and
  ``c_k = Gs_kk - Gs_kS H Gs_Sk`` the Schur complement (the error left of input ``k`` after
  regressing it on the support);
- a swap (remove ``j``, add ``k`` in the same row) combines the two with the gradient and Schur
  complements updated for the removal: ``g'_k = g_k - (u_j / H_jj) m_kj``, ``c'_k = c_k +
  m_kj^2 / H_jj``, ``m = Gs_{:,S} H``;
- a transfer moves one nonzero from one row to another (the layer budget is shared, as ALPS's
  per-layer budget): the cheapest removal anywhere against the best addition anywhere else.

The polish applies the best improving swap of each row until none is left, then the best
improving transfers, and repeats both until neither improves (at most ``max_rounds``). For N:M
patterns the swaps stay inside their group of ``M`` inputs and there are no transfers. Each
accepted move updates ``H``, ``u``, ``g`` and ``c`` by rank-one formulas in ``O(p |S|)``; a row's
state is rebuilt from scratch (``O(p |S|^2)``) every ``REFRESH`` moves against drift. The result
is a local optimum for these moves (the local combinatorial search of L0Learn, Hazimeh &
Mazumder 2020, here with exact refits): no swap and no transfer lowers ``E``.

The same machinery meets a budget exactly from any support (:meth:`SupportSearch.fix_budget`:
greedy exact removals or additions), which the penalty family uses after its path.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict

import numpy as np
import scipy.linalg as sla

from ._layer import DAMP, LayerProblem, check_budget

__all__ = ["SupportSearch", "polish"]

REFRESH = 200  # moves between two rebuilds of a row's state
MEMORY = 256 * 2**20  # bytes of row states kept between moves (the rest are rebuilt)


class _Row:
    """One row's least-squares state on its support ``S`` (positions into the live inputs):
    ``H = (Gd_SS)^-1``, ``u`` (on ``S``), gradient ``g`` and Schur complements ``c`` (all
    inputs; 0 on ``S``), objective ``f = 1/2 (u - u0)^T Gd (u - u0)``."""

    __slots__ = ("S", "H", "u", "g", "c", "f", "moves")

    def __init__(self, Gd, b, c0, S):
        S = np.asarray(S, dtype=np.int64)
        self.S = S
        self.moves = 0
        p = Gd.shape[0]
        if S.size == 0:
            self.H = np.zeros((0, 0))
            self.u = np.zeros(0)
            self.g = -b.copy()
            self.c = np.diag(Gd).copy()
            self.f = 0.5 * c0
            return
        GS = Gd[:, S]
        L = sla.cholesky(GS[S], lower=True, check_finite=False)
        Linv = sla.solve_triangular(L, np.eye(S.size), lower=True, check_finite=False)
        self.H = Linv.T @ Linv
        self.u = self.H @ b[S]
        self.g = GS @ self.u - b
        A = sla.solve_triangular(L, GS.T, lower=True, check_finite=False)  # L^-1 Gd_{S,:}
        self.c = np.diag(Gd) - np.einsum("sp,sp->p", A, A)
        self.g[S] = 0.0
        self.c[S] = 0.0
        np.maximum(self.c, 0.0, out=self.c)
        self.f = 0.5 * (c0 - float(b[S] @ self.u))
        del p

    def nbytes(self):
        return self.H.nbytes + self.u.nbytes + self.g.nbytes + self.c.nbytes + self.S.nbytes

    # -- scores --------------------------------------------------------------------------------
    def costs(self):
        """Error increase of removing each support input (with refit)."""
        return self.u * self.u / (2.0 * np.diag(self.H)) if self.S.size else np.zeros(0)

    def gains(self, floor):
        """Error decrease of adding each input (with refit); 0 on the support and where the
        Schur complement is below ``floor`` (the input is a combination of the support)."""
        ok = self.c > floor
        out = np.zeros_like(self.g)
        out[ok] = self.g[ok] ** 2 / (2.0 * self.c[ok])
        out[self.S] = 0.0
        return out

    # -- moves ---------------------------------------------------------------------------------
    def remove(self, Gd, i):
        """Remove the support input at position ``i`` (refit the rest)."""
        H = self.H
        hi = H[:, i].copy()
        Hii = hi[i]
        coef = self.u[i] / Hii
        v = Gd[:, self.S] @ hi
        self.f += 0.5 * self.u[i] * coef
        self.g -= coef * v
        self.c += v * v / Hii
        self.u = np.delete(self.u - coef * hi, i)
        H = H - np.outer(hi, hi) / Hii
        self.H = np.delete(np.delete(H, i, axis=0), i, axis=1)
        j = self.S[i]
        self.S = np.delete(self.S, i)
        self.g[self.S] = 0.0
        self.c[self.S] = 0.0
        self.c[j] = 1.0 / Hii
        self.moves += 1
        return v, hi

    def add(self, Gd, k):
        """Add input ``k`` to the support (refit)."""
        S = self.S
        a = Gd[S, k]
        h = self.H @ a
        s = float(Gd[k, k] - a @ h)
        if s <= 0.0:
            s = float(self.c[k])
        delta = -self.g[k] / s
        cvec = (Gd[:, k] - Gd[:, S] @ h) / s
        self.f -= 0.5 * self.g[k] * self.g[k] / s
        self.g += (delta * s) * cvec
        self.c -= s * cvec * cvec
        n = S.size
        H = np.empty((n + 1, n + 1))
        H[:n, :n] = self.H + np.outer(h, h) / s
        H[:n, n] = H[n, :n] = -h / s
        H[n, n] = 1.0 / s
        self.H = H
        self.u = np.append(self.u - delta * h, delta)
        self.S = np.append(S, k)
        self.g[self.S] = 0.0
        self.c[self.S] = 0.0
        np.maximum(self.c, 0.0, out=self.c)
        self.moves += 1
        return cvec, h


class SupportSearch:
    """The support of a whole layer with every row's least-squares state (module docstring).

    ``lp`` a :class:`~._layer.LayerProblem`, ``mask`` ``(R, q)`` the starting support over the
    live inputs; ``pattern`` ``(N, M)`` restricts swaps to groups and forbids transfers."""

    def __init__(self, lp: LayerProblem, mask, pattern=None, memory=MEMORY):
        self.lp = lp
        self.Gd = lp.Gs + DAMP * np.eye(lp.q)
        self.floor = 1e-9  # Schur complements below this (unit diagonal) count as 0
        self.supports = [np.flatnonzero(mask[r]) for r in range(lp.R)]
        self.pattern = pattern
        self.gid = lp.groups(pattern[1])[0] if pattern is not None else None
        self.memory = int(memory)
        self._cache: OrderedDict[int, _Row] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._bytes = 0
        # per-row bests: cheapest removal, best addition (value, position / input)
        self.f = np.zeros(lp.R)
        self.cost = np.full(lp.R, np.inf)
        self.cost_at = np.zeros(lp.R, dtype=np.int64)
        self.gain = np.zeros(lp.R)
        self.gain_at = np.zeros(lp.R, dtype=np.int64)
        for r in range(lp.R):
            self._summarize(r, self.row(r))

    # -- states --------------------------------------------------------------------------------
    def row(self, r) -> _Row:
        st = self._cache.get(r)
        if st is not None and st.moves < REFRESH:
            self._cache.move_to_end(r)
            return st
        if st is not None:
            self._drop(r)
        st = _Row(self.Gd, self.lp.B[r], self.lp.c0[r], self.supports[r])
        self._cache[r] = st
        self._sizes[r] = st.nbytes()
        self._bytes += self._sizes[r]
        while self._bytes > self.memory and len(self._cache) > 1:
            old = next(iter(self._cache))
            self._drop(old)
        return st

    def _drop(self, r):
        del self._cache[r]
        self._bytes -= self._sizes.pop(r)

    def _touch(self, r, st):
        self.supports[r] = st.S
        if r in self._sizes:
            n = st.nbytes()
            self._bytes += n - self._sizes[r]
            self._sizes[r] = n
        self._summarize(r, st)

    def _summarize(self, r, st):
        self.f[r] = st.f
        if st.S.size:
            costs = st.costs()
            i = int(np.argmin(costs))
            self.cost[r], self.cost_at[r] = costs[i], i
        else:
            self.cost[r] = np.inf
        gains = st.gains(self.floor)
        k = int(np.argmax(gains))
        self.gain[r], self.gain_at[r] = gains[k], k

    @property
    def n_keep(self):
        return int(sum(s.size for s in self.supports))

    def mask(self):
        m = np.zeros((self.lp.R, self.lp.q), dtype=bool)
        for r, S in enumerate(self.supports):
            m[r, S] = True
        return m

    def weights(self):
        """The refit scaled weights ``U`` ``(R, q)`` of the current support."""
        return self.lp.refit(self.mask())

    def objective(self):
        """The current ``E / E(0)`` (from the row states; :meth:`weights` recomputes it)."""
        return 2.0 * float(self.f.sum()) / self.lp.energy if self.lp.energy > 0 else 0.0

    # -- moves ---------------------------------------------------------------------------------
    def _remove(self, r, i):
        st = self.row(r)
        st.remove(self.Gd, i)
        self._touch(r, st)

    def _add(self, r, k):
        st = self.row(r)
        st.add(self.Gd, k)
        self._touch(r, st)

    def fix_budget(self, n_keep):
        """Greedy exact moves to ``n_keep`` live nonzeros: while above, remove the cheapest
        nonzero of the layer; while below, add the best input of the layer (each with refit)."""
        cur = self.n_keep
        while cur > n_keep:
            r = int(np.argmin(self.cost))
            self._remove(r, int(self.cost_at[r]))
            cur -= 1
        while cur < n_keep:
            g = np.where([s.size < self.lp.q for s in self.supports], self.gain, -np.inf)
            r = int(np.argmax(g))
            k = int(self.gain_at[r])
            if self.gain[r] <= 0.0:  # nothing helps: add any free input (keeps the count)
                free = np.setdiff1d(np.arange(self.lp.q), self.supports[r])
                k = int(free[0])
            self._add(r, k)
            cur += 1

    def fix_pattern(self):
        """Each row to exactly ``min(N, live inputs of the group)`` nonzeros in every group:
        greedy exact removals in groups above ``N``, additions in groups below."""
        N, M = self.pattern
        gid = self.gid
        n_groups = int(gid.max()) + 1 if gid.size else 0
        size = np.bincount(gid, minlength=n_groups)
        want = np.minimum(N, size)
        for r in range(self.lp.R):
            st = self.row(r)
            while True:
                have = np.bincount(gid[st.S], minlength=n_groups)
                over = have > want
                under = have < want
                if not over.any() and not under.any():
                    break
                if over.any():
                    costs = np.where(over[gid[st.S]], st.costs(), np.inf)
                    st.remove(self.Gd, int(np.argmin(costs)))
                else:
                    gains = st.gains(self.floor)
                    free = np.ones(self.lp.q, dtype=bool)
                    free[st.S] = False
                    cand = free & under[gid]
                    k = int(np.argmax(np.where(cand, gains + 1.0, -np.inf)))
                    st.add(self.Gd, k)
            self._touch(r, st)

    def _best_swap(self, st):
        """The best swap of a row: ``(change of f, position i, input k)``."""
        S = st.S
        if S.size == 0 or S.size == self.lp.q:
            return 0.0, -1, -1
        Mx = self.Gd[:, S] @ st.H  # (q, s)
        Hd = np.diag(st.H)
        coef = st.u / Hd
        gp = st.g[None, :] - coef[:, None] * Mx.T  # (s, q)
        cp = st.c[None, :] + Mx.T ** 2 / Hd[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            add = np.where(cp > self.floor, gp * gp / (2.0 * cp), 0.0)
        add[:, S] = 0.0
        if self.pattern is not None:
            add[self.gid[S][:, None] != self.gid[None, :]] = 0.0
        val = (st.u * coef / 2.0)[:, None] - add
        flat = int(np.argmin(val))
        i, k = divmod(flat, self.lp.q)
        return float(val[i, k]), i, k

    def swap_rows(self, rows=None, max_swaps=10_000):
        """Best-improvement swaps in each row of ``rows`` until none improves; returns the number
        of swaps."""
        tol = 1e-12 * max(self.lp.energy, 1e-300)
        n = 0
        for r in range(self.lp.R) if rows is None else rows:
            st = self.row(r)
            for _ in range(max_swaps):
                val, i, k = self._best_swap(st)
                if not val < -tol:
                    break
                st.remove(self.Gd, i)
                st.add(self.Gd, k)
                n += 1
                if st.moves >= REFRESH:
                    self.supports[r] = st.S
                    st = self.row(r)
            self._touch(r, st)
        return n

    def transfer(self, max_moves=100_000):
        """Best-improvement transfers of one nonzero between rows until none improves; returns
        the rows changed."""
        tol = 1e-12 * max(self.lp.energy, 1e-300)
        changed = set()
        for _ in range(max_moves):
            a = int(np.argmax(self.gain))
            b = int(np.argmin(self.cost))
            if a == b:  # best gain and cheapest cost in one row: the swap search covers it;
                # pair each with the runner-up of the other side
                g2 = self.gain.copy()
                g2[a] = -np.inf
                c2 = self.cost.copy()
                c2[b] = np.inf
                a2, b2 = int(np.argmax(g2)), int(np.argmin(c2))
                if self.gain[a2] - self.cost[b] >= self.gain[a] - self.cost[b2]:
                    a = a2
                else:
                    b = b2
            if not self.gain[a] - self.cost[b] > tol:
                break
            self._add(a, int(self.gain_at[a]))
            self._remove(b, int(self.cost_at[b]))
            changed.update((a, b))
        return changed

    def polish(self, max_rounds=20):
        """Swaps in every row, then transfers (none for N:M), repeated until neither improves.
        Returns ``(rounds, swaps, transfers)``."""
        swaps = self.swap_rows()
        rounds, moves = 1, 0
        if self.pattern is None:
            for rounds in range(1, max_rounds + 1):
                changed = self.transfer()
                moves += len(changed)
                if not changed:
                    break
                s = self.swap_rows(sorted(changed))
                swaps += s
        return rounds, swaps, moves


def _to_numpy(A, name):
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of dualdrop.nn
        torch = None
    if torch is not None and isinstance(A, torch.Tensor):
        return A.detach().to("cpu", torch.float64).numpy()
    return np.asarray(A, dtype=np.float64)


def polish(W, W0, G, *, n_keep=None, pattern=None, max_rounds=20, memory=MEMORY):
    """Polish the support of a pruned layer ``W`` ``(out, in)`` of trained weights ``W0`` with
    input Gram ``G`` (module docstring); returns the refit, polished weights (numpy float64) with
    exactly ``n_keep`` nonzeros (default: those of ``W``) or the N:M ``pattern``. The objective
    never rises above that of ``W`` refit on its own support."""
    W = _to_numpy(W, "W")
    lp = LayerProblem(_to_numpy(W0, "W0"), _to_numpy(G, "G"))
    if W.shape != (lp.R, lp.p):
        raise ValueError(f"W must have the shape of W0 {(lp.R, lp.p)}, got {W.shape}")
    if n_keep is None and pattern is None:
        n_keep = int(np.count_nonzero(W))
    n_keep, pattern = check_budget(n_keep, pattern, lp.R, lp.p)
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, numbers.Integral) \
            or max_rounds < 0:
        raise ValueError(f"max_rounds must be an integer >= 0, got {max_rounds!r}")
    search = SupportSearch(lp, W[:, lp.live] != 0, pattern=pattern, memory=memory)
    if pattern is None:
        search.fix_budget(lp.live_budget(n_keep))
    else:
        search.fix_pattern()
    if max_rounds:
        search.polish(max_rounds)
    return lp.to_weights(search.weights(), n_keep, pattern)
