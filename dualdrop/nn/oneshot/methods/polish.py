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

from collections import OrderedDict

import numpy as np

import torch

from penalties.checks import check_int
from .base import Budget, OneShotMethod
from ._layer import ScaledLayer
from .sparsegpt import SparseGPT
from . import _ahead
from ._moves import KERNELS, SWAP_KERNELS, _add, _build, _fill_mt, _ladder, _remove, _swap_loop

__all__ = ["Polish", "SupportSearch", "default_effort", "polish", "polish_support"]

REFRESH = 100  # moves between two rebuilds of a row's state (against drift)
MEMORY = 256 * 2**20  # bytes of row states kept between moves (the rest are rebuilt)
# The polish works on Gd = Gs + RIDGE I (unit-diagonal Gs): an input in the span of the support
# (a duplicate column: MNIST's constant border pixels) then has a Schur complement >= RIDGE, not
# 0, so that adding it (to fill an N:M group) is well posed and gives it a weight ~0; the
# objective moves by at most RIDGE ||u||^2 / 2, ~1e-8 of the layer's error. The final weights are
# refit without it (LayerProblem.refit).
RIDGE = 1e-8
FLOOR = 1e-12  # a Schur complement below this is refused (rounding): the input is skipped
# ... and below this for swaps and the ladder's moves: an input that nearly lies in the span of
# the support (a constant input, as standardized border pixels are, beside others) has its
# gain scored by rounding, and swaps scored so can cycle or lower nothing real. Filling a
# budget or an N:M group (fix_budget, fix_pattern, transfers) still takes such inputs.
SWAP_FLOOR = 1e-6
# A swap (or a transfer) is taken when it lowers the row's error by more than this fraction:
# smaller gains are at the level of the rounding of the scores on a rank-deficient Gram (a
# search at 1e-9 cycled between near-duplicate inputs until each check showed no progress),
# and 1e-4 of a row's error is below what any layer objective is reported to.
SWAP_RTOL = 1e-4
DEPTH = 3  # sizes each row explores down and up before the sizes are re-split (reallocate)
# The penalty path's default effort (:func:`default_effort`): "full" on layers of at most this
# many live weights, "swaps" on larger ones. On LeNet-300-100's first layer (300 x 784 live
# inputs) "full" cost 3.2x "swaps"' CPU at 20% (11.5 s against 3.6 s) for 3% of objective (both
# 23-26% below ADMM's), 3.2x at 50% for none; on its 28,800- and 910-weight layers "swaps"
# alone ended above ADMM's objective (10% and 5%), "full" below it everywhere
# (benchmarks/RESULTS.md, "Cold and warm first call").
FULL_WEIGHTS = 100_000


# ----------------------------------------------------------------------------------------------


class _Row:
    """One row's state (arrays for the kernels, capacity grown on demand)."""

    __slots__ = ("S", "s", "H", "u", "g", "c", "inS", "f", "moves", "c_ok")

    def __init__(self, Gd, b, c0, support, want_c=True):
        p = Gd.shape[0]
        s = int(support.size)
        cap = min(p, s + 8)
        self.S = np.zeros(cap, dtype=np.int64)
        self.S[:s] = support
        self.s = s
        self.H = np.zeros((cap, cap))
        self.u = np.zeros(cap)
        self.g = np.zeros(p)
        self.c = np.zeros(p)
        self.inS = np.zeros(p, dtype=np.bool_)
        self.f = _build(Gd, b, c0, self.S, s, self.H, self.u, self.g, self.c, self.inS,
                        _NO_MT, False, want_c)
        self.c_ok = bool(want_c)
        self.moves = 0

    def ensure_c(self, Gd):
        """Compute the Schur complements if the state was built without them."""
        if not self.c_ok:
            MT = np.empty((max(self.s, 1), Gd.shape[0]))
            _fill_mt(Gd, self.S, self.s, self.H, MT, self.c, self.inS)
            self.c_ok = True

    def grow(self):
        cap = self.S.size
        if self.s < cap:
            return
        new = min(self.g.size, 2 * cap + 8)
        S, H, u = self.S, self.H, self.u
        self.S = np.zeros(new, dtype=np.int64)
        self.S[:cap] = S
        self.H = np.zeros((new, new))
        self.H[:cap, :cap] = H
        self.u = np.zeros(new)
        self.u[:cap] = u

    def nbytes(self):
        return self.H.nbytes + self.u.nbytes + self.g.nbytes + self.c.nbytes + self.S.nbytes \
            + self.inS.nbytes

    @property
    def support(self):
        return self.S[: self.s].copy()

    def costs(self):
        s = self.s
        return self.u[:s] ** 2 / (2.0 * np.diag(self.H)[:s]) if s else np.zeros(0)

    def gains(self):
        ok = (self.c > FLOOR) & ~self.inS
        out = np.zeros_like(self.g)
        out[ok] = self.g[ok] ** 2 / (2.0 * self.c[ok])
        return out

    def remove(self, Gd, i):
        self.f += _remove(Gd, self.S, self.s, self.H, self.u, self.g, self.c, self.inS, _NO_MT,
                          False, i)
        self.s -= 1
        self.moves += 1

    def swaps(self, Gd, b, c0, gid, gstart, use_groups, pairs, rtol, max_swaps):
        """Swaps until none improves, then (``pairs``) 2-for-2 replacements (:func:`_swap_loop`
        from the state's ``MT`` and Schur complements, computed here; within groups with
        ``use_groups``), leaving the state up to date; returns their number. (Driven from
        here, not from a compiled wrapper: each compiled caller re-optimizes the whole search.)"""
        p = Gd.shape[0]
        if self.s == 0 or self.s == p:
            return 0
        MT = np.empty((self.s, p))
        _fill_mt(Gd, self.S, self.s, self.H, MT, self.c, self.inS)
        self.f, n = _swap_loop(Gd, b, c0, self.S, self.s, self.H, self.u, self.g, self.c,
                               self.inS, MT, self.f, self.moves == 0, gid, use_groups, gstart,
                               pairs, SWAP_FLOOR, rtol, max_swaps, REFRESH)
        if n:
            self.moves = 0  # _swap_loop rebuilds against drift itself, and ends on an exact error
        self.c_ok = True
        return n

    def add(self, Gd, k):
        """Add input ``k``; False (nothing added) when it lies in the span of the support."""
        self.grow()
        df = _add(Gd, self.S, self.s, self.H, self.u, self.g, self.c, self.inS, _NO_MT, False,
                  k, FLOOR)
        if np.isnan(df):
            return False
        self.f += df
        self.s += 1
        self.moves += 1
        return True


_NO_MT = np.zeros((1, 1))


class SupportSearch:
    """The support of a whole layer with every row's least-squares state (module docstring).

    ``sl`` a :class:`~._layer.ScaledLayer`, ``mask`` ``(R, q)`` the starting support over the
    live inputs; ``pattern`` ``(N, M)`` restricts swaps to groups and forbids transfers."""

    def __init__(self, sl: ScaledLayer, mask, pattern=None, memory=MEMORY):
        _ahead.wait(SWAP_KERNELS)  # the kernels compiled ahead in a second process, if any
        self.lp = lp = sl
        self.Gd = np.ascontiguousarray(lp.Gs + RIDGE * np.eye(lp.q))
        self.supports = [np.flatnonzero(mask[r]) for r in range(lp.R)]
        self.pattern = pattern
        self.gid = lp.gid(pattern[1]) if pattern is not None else np.zeros(lp.q, np.int64)
        # live positions of each group: gid is nondecreasing (live inputs in order)
        self.gstart = np.searchsorted(self.gid, np.arange(int(self.gid.max(initial=0)) + 2)) \
            if pattern is not None else np.zeros(2, np.int64)
        self.memory = int(memory)
        self.need_c = False  # Schur complements (gains) are built only once additions start
        self._ladders = {}  # row -> (its support, its ladder): reused while the row is unchanged
        self._cache: OrderedDict[int, _Row] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._bytes = 0
        # per-row bests: cheapest removal, best addition (value, position / input)
        self.f = np.zeros(lp.R)
        self.cost = np.full(lp.R, np.inf)
        self.cost_at = np.zeros(lp.R, dtype=np.int64)
        self.gain = np.zeros(lp.R)
        self.gain_at = np.zeros(lp.R, dtype=np.int64)
        if pattern is None:  # N:M: fix_pattern, which comes first, summarizes each row it fixes
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
        st = _Row(self.Gd, self.lp.B[r], self.lp.c0[r], self.supports[r], self.need_c)
        self._cache[r] = st
        self._sizes[r] = st.nbytes()
        self._bytes += self._sizes[r]
        while self._bytes > self.memory and len(self._cache) > 1:
            self._drop(next(iter(self._cache)))
        return st

    def _drop(self, r):
        del self._cache[r]
        self._bytes -= self._sizes.pop(r)

    def _touch(self, r, st):
        self.supports[r] = st.support
        if r in self._sizes:
            n = st.nbytes()
            self._bytes += n - self._sizes[r]
            self._sizes[r] = n
        self._summarize(r, st)

    def _summarize(self, r, st):
        self.f[r] = st.f
        if st.s:
            costs = st.costs()
            i = int(np.argmin(costs))
            self.cost[r], self.cost_at[r] = costs[i], i
        else:
            self.cost[r] = np.inf
        if st.c_ok:
            gains = st.gains()
            k = int(np.argmax(gains))
            self.gain[r], self.gain_at[r] = gains[k], k
        else:
            self.gain[r], self.gain_at[r] = np.nan, -1

    def _with_gains(self):
        """Build the Schur complements of every row (for additions and transfers)."""
        self.need_c = True
        for r in range(self.lp.R):
            st = self.row(r)
            if not st.c_ok:
                st.ensure_c(self.Gd)
                self._summarize(r, st)

    def keep_better(self, start):
        """Back to the supports ``start`` (one array of live positions per row, the same
        layer count) wherever they are better, scored from scratch
        (:meth:`ScaledLayer.row_errors`), not by the rows' tracked states: each row that kept
        its size takes the better of its two supports; the rows whose size changed move
        together (their sum against the start's). The search then never ends above its
        start, whatever rounding did to the moves' scores. Returns the rows put back (their
        states are rebuilt when next asked for; the per-row summaries are not refreshed)."""
        changed = [r for r in range(self.lp.R)
                   if not np.array_equal(np.sort(start[r]), np.sort(self.supports[r]))]
        if not changed:
            return []
        e0 = self.lp.row_errors(start, changed)
        e1 = self.lp.row_errors(self.supports, changed)
        same = np.array([start[r].size == self.supports[r].size for r in changed])
        back = [r for r, a, b, k in zip(changed, e0, e1, same) if k and b > a]
        if not same.all() and e1[~same].sum() > e0[~same].sum():
            back += [r for r, k in zip(changed, same) if not k]
        for r in back:
            self.supports[r] = np.array(start[r], dtype=np.int64)
            if r in self._cache:
                self._drop(r)
            self._ladders.pop(r, None)
        return back

    @property
    def n_keep(self):
        return int(sum(s.size for s in self.supports))

    def mask(self):
        m = np.zeros((self.lp.R, self.lp.q), dtype=bool)
        for r, S in enumerate(self.supports):
            m[r, S] = True
        return m

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
        ok = st.add(self.Gd, k)
        self._touch(r, st)
        return ok

    def fix_budget(self, n_keep):
        """Greedy exact moves to ``n_keep`` live nonzeros: while above, remove the cheapest
        nonzero of the layer; while below, add the best input of the layer (each with refit)."""
        cur = self.n_keep
        while cur > n_keep:
            r = int(np.argmin(self.cost))
            self._remove(r, int(self.cost_at[r]))
            cur -= 1
        if cur < n_keep:
            self._with_gains()
        # rows that take no more input: full, or every input left in the span of the support
        closed = np.array([s.size >= self.lp.q for s in self.supports])
        while cur < n_keep and not closed.all():
            r = int(np.argmax(np.where(closed, -np.inf, self.gain)))
            k = int(self.gain_at[r])
            st = self.row(r)
            if not self.gain[r] > 0.0 or k < 0 or st.inS[k]:  # nothing helps: any free input
                free = np.flatnonzero(~st.inS & (st.c > FLOOR))
                if not free.size:
                    closed[r] = True
                    continue
                k = int(free[0])
            # a refused input gets c = 0 (it leaves the candidates): the loop is bounded
            if self._add(r, k):
                cur += 1
                closed[r] = self.supports[r].size >= self.lp.q
        if cur < n_keep:
            self._pad(n_keep - cur)

    def _pad(self, n):
        """Complete the count with ``n`` inputs that no row can take with a well-posed refit
        (a Gram of lower rank than the budget: fewer calibration samples than kept weights per
        row): the largest ``|u0|`` outside the supports, kept without a refit move (their
        least-squares weights are ~0; the final refit is damped). The budget is met exactly."""
        score = np.abs(self.lp.U0).copy()
        for r, S in enumerate(self.supports):
            score[r, S] = -np.inf
        flat = np.argpartition(-score.ravel(), n - 1)[:n]
        rows, cols = np.divmod(flat, self.lp.q)
        for r in np.unique(rows):
            self.supports[r] = np.sort(np.concatenate([self.supports[r], cols[rows == r]]))
            if r in self._cache:
                self._drop(r)
            self._summarize(r, self.row(r))

    def meet_budget(self, budget: Budget, effort=None, max_rounds=20):
        """Bring the supports to ``budget`` exactly (:meth:`fix_budget` or :meth:`fix_pattern`)
        and, with ``effort``, polish them (:meth:`polish`; for a pattern row by row, inside
        :meth:`fix_pattern`). Returns ``(swaps, rows changed by transfers and re-splits)``."""
        if budget.pattern is not None:
            return self.fix_pattern(effort), 0
        self.fix_budget(self.lp.live_target(budget))
        if not effort:
            return 0, 0
        _, swaps, moves = self.polish(effort, max_rounds)
        return swaps, moves

    def fix_pattern(self, effort=None):
        """Each row to exactly ``min(N, live inputs of the group)`` nonzeros in every group:
        greedy exact removals in groups above ``N``, additions in groups below. A group whose
        remaining inputs all lie in the span of the row's support (a rank-deficient Gram:
        inputs seen on few calibration examples) cannot gain an input without a singular
        support, and adding one would not lower the objective: it stays short here (the swaps keep
        every group's count), and :meth:`ScaledLayer.finish` completes the pattern with those
        inputs (their refit weights).

        With ``effort`` (``"swaps"`` or ``"full"``: :meth:`polish`'s for a pattern) each row is
        polished right after it is fixed, from the same state (the rows of a pattern are
        independent: one build per row, and no state kept between rows); each row's search
        ends no worse than its fixed support, both errors computed from scratch
        (:func:`~._moves._swap_loop`). Returns the swaps."""
        N, _ = self.pattern
        gid = self.gid
        n_groups = int(gid.max()) + 1 if gid.size else 0
        want0 = np.minimum(N, np.bincount(gid, minlength=n_groups))
        swaps = 0
        for r in range(self.lp.R):
            st = self.row(r)
            want = want0.copy()
            while True:
                have = np.bincount(gid[st.support], minlength=n_groups)
                over = have > want
                under = have < want
                if over.any():
                    costs = np.where(over[gid[st.support]], st.costs(), np.inf)
                    st.remove(self.Gd, int(np.argmin(costs)))
                elif under.any():
                    st.ensure_c(self.Gd)  # the gains: only when a group must gain an input
                    cand = ~st.inS & under[gid] & (st.c > FLOOR)
                    if not cand.any():  # every short group is in the support's span
                        want[under] = have[under]
                        continue
                    k = int(np.argmax(np.where(cand, st.gains() + 1.0, -np.inf)))
                    st.add(self.Gd, k)
                else:
                    break
            self.supports[r] = st.support
            if effort:
                swaps += st.swaps(self.Gd, self.lp.B[r], self.lp.c0[r], gid, self.gstart, True,
                                  effort == "full", SWAP_RTOL, 100_000)
                self.supports[r] = st.support
                self._drop(r)  # the next row's state takes its memory
            else:
                self._touch(r, st)
        # each row's swaps end no worse than its fixed support (checked from scratch in
        # _swap_loop): the rows are independent, nothing more to compare
        return swaps

    def swap_rows(self, rows=None, pairs=True, max_swaps=100_000, rtol=SWAP_RTOL):
        """Swaps (and with ``pairs`` 2-for-2 replacements) in each row of ``rows`` (default all)
        until none improves by more than ``rtol`` of the row's error; returns their number."""
        total = 0
        for r in range(self.lp.R) if rows is None else rows:
            st = self.row(r)
            total += st.swaps(self.Gd, self.lp.B[r], self.lp.c0[r], self.gid, self.gstart,
                              self.pattern is not None, pairs, rtol, max_swaps)
            self._touch(r, st)
        return total

    def transfer(self, max_moves=1_000_000):
        """Best-improvement transfers of one nonzero between rows until none improves; returns
        the rows changed."""
        self._with_gains()
        changed = set()
        for _ in range(max_moves):
            tol = 1e-9 * float(self.f.sum()) + 1e-15 * self.lp.energy
            a = int(np.argmax(self.gain))
            b = int(np.argmin(self.cost))
            if a == b:  # best gain and cheapest cost in one row (the swaps cover that row):
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
            if not self._add(a, int(self.gain_at[a])):
                continue  # refused: the row's gains were recomputed without that input
            self._remove(b, int(self.cost_at[b]))
            changed.update((a, b))
        return changed

    def reallocate(self, rows=None, depth=DEPTH):
        """Each row's polished supports up to ``depth`` sizes down and up (:func:`_ladder`),
        then the sizes re-split over the rows by dynamic programming (the layer's count
        unchanged: the best choice of a size change in ``[-depth, depth]`` per row, summing to
        0), which catches what single transfers miss (a row whose error curve bends). Returns
        the rows changed."""
        R, q = self.lp.R, self.lp.q
        rows = list(range(R)) if rows is None else list(rows)
        _ahead.wait()  # the ladder's step: the last kernel the second process compiles
        self._with_gains()
        cand = {}
        for r in rows:
            key = np.sort(self.supports[r]).tobytes()
            hit = self._ladders.get(r)
            if hit is not None and hit[0] == key:  # the row has not changed since
                cand[r] = hit[1]
                continue
            st = self.row(r)
            s = st.s
            out_S = np.zeros((2 * depth + 1, max(1, min(q, s + depth))), dtype=np.int64)
            out_f = np.empty(2 * depth + 1)
            _ladder(self.Gd, self.lp.B[r], self.lp.c0[r], st.S, s, st.H, st.u, st.g, st.c,
                    st.inS, st.f, self.gid, self.gstart, SWAP_FLOOR, 1e-9, 100_000, REFRESH,
                    depth, out_S, out_f)
            cand[r] = (s, out_S, out_f)
            self._ladders[r] = (key, cand[r])
        # dynamic programming over the rows: state = the count moved so far, in [-m, m]
        n = len(rows)
        m = depth * n
        dp = np.full(2 * m + 1, np.inf)
        dp[m] = 0.0
        choice = np.zeros((n, 2 * m + 1), dtype=np.int8)
        for t, r in enumerate(rows):
            f = cand[r][2]
            new = np.full_like(dp, np.inf)
            for d in range(-depth, depth + 1):
                if not np.isfinite(f[d + depth]):
                    continue
                shifted = np.full_like(dp, np.inf)
                if d >= 0:
                    shifted[d:] = dp[: dp.size - d]
                else:
                    shifted[:d] = dp[-d:]
                val = shifted + f[d + depth]
                better = val < new
                new[better] = val[better]
                choice[t, better] = d
            dp = new
        changed = []
        state = m
        for t in range(n - 1, -1, -1):
            r = rows[t]
            d = int(choice[t, state])
            state -= d
            s, out_S, out_f = cand[r]
            if d != 0 or out_f[depth] < self.f[r]:
                self.supports[r] = np.sort(out_S[d + depth, : s + d])
                if r in self._cache:
                    self._drop(r)
                self._summarize(r, self.row(r))
                changed.append(r)
        return changed

    def polish(self, effort="full", max_rounds=20):
        """Swaps in every row, then transfers between rows, repeated until neither improves
        (``effort="swaps"``); ``"full"`` adds 2-for-2 replacements to the swaps and, once the
        transfers have converged, the re-split of the rows' sizes (:meth:`reallocate`), both
        repeated until nothing improves. N:M: swaps (and 2-for-2 replacements) only. The
        result is never worse than the supports it started from, scored from scratch
        (:meth:`keep_better`). Returns ``(rounds, swaps, rows changed by transfers and
        re-splits)``."""
        start = [S.copy() for S in self.supports]
        full = effort == "full"
        swaps = self.swap_rows(pairs=full)
        rounds, moves = 1, 0
        if self.pattern is None:
            for rounds in range(1, max_rounds + 1):
                changed = self.transfer()
                if changed:
                    swaps += self.swap_rows(sorted(changed), pairs=full)
                    moves += len(changed)
                    continue
                re = self.reallocate() if full else []
                moves += len(re)
                if not re:
                    break
                swaps += self.swap_rows(sorted(re), pairs=True)
        self.keep_better(start)
        return rounds, swaps, moves


EFFORTS = ("swaps", "full")


def default_effort(sl: ScaledLayer) -> str:
    """The polish the penalty path applies by default to the layer ``sl``: ``"full"`` up to
    :data:`FULL_WEIGHTS` live weights, ``"swaps"`` beyond (where the 2-for-2 replacements and
    the size ladder cost most and bought least)."""
    return "full" if sl.R * sl.q <= FULL_WEIGHTS else "swaps"


def check_effort(name, value):
    """A polish option: ``False`` (none), ``True`` (``"full"``), ``"swaps"`` or ``"full"``;
    returns ``None``, ``"swaps"`` or ``"full"``."""
    if value is False:
        return None
    if value is True:
        return "full"
    if value not in EFFORTS:
        raise ValueError(f"{name} must be True, False, 'swaps' or 'full', got {value!r}")
    return value


def polish_support(sl: ScaledLayer, mask, budget: Budget, effort="full", max_rounds=20):
    """The polished live support ``(R, q)`` from the live support ``mask`` (module docstring),
    first brought to the budget exactly (greedy exact moves), then never made worse
    (:meth:`SupportSearch.polish`)."""
    search = SupportSearch(sl, mask, pattern=budget.pattern)
    search.meet_budget(budget, effort if max_rounds else None, max_rounds)
    return search.mask()


def polish(W, W0, G, budget: Budget, effort="full", max_rounds=20) -> torch.Tensor:
    """Polish the support of a pruned layer ``W`` (``(out, in)``, any method's result) of the
    trained ``W0`` with input Gram ``G``: the refit weights (float64) on the polished support,
    which meets ``budget`` exactly and whose objective is never above that of ``W``'s own
    support refit."""
    sl = ScaledLayer(W0, G)
    W = torch.as_tensor(W)
    if tuple(W.shape) != (sl.R, sl.p):
        raise ValueError(f"W must have the shape of W0 {(sl.R, sl.p)}, got {tuple(W.shape)}")
    budget.check_shape((sl.R, sl.p))
    mask = polish_support(sl, (W != 0).numpy()[:, sl.live], budget, effort, max_rounds)
    return sl.finish(mask, budget)


class Polish(OneShotMethod):
    """Any method, then the support polish (module docstring).

    Options: ``start`` (the built method whose support is polished, e.g.
    ``get_method("wanda")``; default ``None``: SparseGPT with its defaults), ``effort``
    (``"full"``, default, or ``"swaps"``: :meth:`SupportSearch.polish`), ``max_rounds`` (rounds
    of transfers and re-splits, default 20). The kept weights are always refit (``refit`` must
    stay True)."""

    name = "polish"
    defaults = {"start": None, "effort": "full", "max_rounds": 20, "refit": True}

    def _validate(self, opts):
        start = opts["start"]
        if start is None:
            start = SparseGPT()
        if not isinstance(start, OneShotMethod):
            raise TypeError(f"start must be a built one-shot method, e.g. "
                            f"dualdrop.nn.oneshot.get_method({start!r}), got "
                            f"{type(start).__name__}")
        if isinstance(start, Polish):
            raise ValueError("start must be another method than polish")
        opts["start"] = self.start = start
        opts["max_rounds"] = check_int("max_rounds", opts["max_rounds"], low=0)
        opts["effort"] = check_effort("effort", opts["effort"]) or "full"
        if not opts["refit"]:
            raise ValueError("polish scores supports by their least-squares refit: refit "
                             "must be True")
        return opts

    def kernels(self) -> tuple:
        return (*self.start.kernels(), *KERNELS)

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        W = self.start.prune(W0, G, budget)
        sl = ScaledLayer(W0, G)
        mask = polish_support(sl, (W != 0).numpy()[:, sl.live], budget,
                              self.options["effort"], self.options["max_rounds"])
        return sl.finish(mask, budget, refit=False)  # prune() refits
