"""The swap search for units of one column (MLP neurons), with every quantity kept by rank-one
updates: OSSCAR's local search with low-rank updates (Meng et al., ICML 2024).

For the kept columns ``S`` (slots ``0 .. s-1``) and the removed ones ``O`` (slots ``0 ..
o-1``) the search keeps, in the notation of ``_kept``: ``H = A_SS^-1``, the refit weights ``WS
= B_S H``, ``Z = H A_SO``, the Schur complements ``C_a = A_aa - A_aS Z_a`` and the residual
gradients ``Rr = B_O - WS A_SO``. A swap (slot ``i`` of ``S`` out, slot ``j`` of ``O`` in) is
the removal of ``i`` (``H -= h h^T / H_ii`` with ``h = H[:, i]``, ``WS -= W_i h^T / H_ii``,
``Z -= h Z_i / H_ii``, ``C += Z_i^2 / H_ii``, ``Rr += W_i Z_i / H_ii``), then the addition of
``a`` into the freed slot (with ``z = Z_a``, ``c = C_a``, ``r = Rr_a`` and ``q = A_aO - A_aS Z``:
``H += z z^T / c`` bordered by ``-z / c`` and ``1 / c``, ``WS -= r z^T / c`` with column ``r /
c``, ``Z -= z q / c`` with row ``q / c``, ``C -= q^2 / c``, ``Rr -= r q / c``), and the removed
column takes ``a``'s slot in ``O``: ``O(s^2 + (R + s)(s + o))`` per swap instead of a
rebuild's ``O(s^3 + R s o)``.

Every swap's change of the error is exact (``_kept.best_swap``'s formula); pairs are scored among
the ``candidates`` cheapest removals and best additions, and when none of them improves, over
every pair once (so the search ends at a local optimum of all single swaps). The state is
rebuilt from scratch every ``REFRESH`` swaps against drift.
"""

from __future__ import annotations

import numpy as np

from .problem import SWAP_FLOOR, SWAP_TOL, inverse_psd

REFRESH = 64


class ColumnSwaps:
    """The state of the module docstring for the kept columns ``S`` and removed ``O``."""

    def __init__(self, A, B, c0, S, O):
        self.A, self.B, self.c0 = A, B, c0
        self.S, self.O = np.array(S, np.int64), np.array(O, np.int64)
        self.rebuild()

    def rebuild(self):
        A, B, S, O = self.A, self.B, self.S, self.O
        self.H = inverse_psd(A[np.ix_(S, S)])
        self.WS = B[:, S] @ self.H
        ASO = A[np.ix_(S, O)]
        self.Z = self.H @ ASO
        self.C = A[O, O] - np.einsum("so,so->o", ASO, self.Z)
        self.Rr = B[:, O] - self.WS @ ASO

    def pair_deltas(self, ki, ko):
        """The exact error change of swapping kept slots ``ki`` with removed slots ``ko``
        (a ``len(ki) x len(ko)`` matrix)."""
        Hii = np.maximum(np.diag(self.H)[ki], 1e-300)
        Wi = self.WS[:, ki]
        nW = (Wi * Wi).sum(0)
        R = self.Rr[:, ko]
        nR = (R * R).sum(0)
        Zi = self.Z[np.ix_(ki, ko)]
        with np.errstate(over="ignore", invalid="ignore"):
            t = Zi / Hii[:, None]
            num = nR[None, :] + 2 * t * (Wi.T @ R) + t * t * nW[:, None]
            den = np.maximum(self.C[ko][None, :] + Zi * t, 1e-300)
            D = nW[:, None] / Hii[:, None] - num / den
        D[~np.isfinite(D)] = np.inf
        return D

    def best(self, candidates: int):
        """``(delta, slot i, slot j)`` of the best swap among the candidates, or over every
        pair when ``candidates`` covers them (or none of the candidates improves)."""
        s, o = self.S.size, self.O.size
        if s == 0 or o == 0:
            return None
        Hii = np.maximum(np.diag(self.H), 1e-300)
        rem = (self.WS * self.WS).sum(0) / Hii
        ok = self.C > SWAP_FLOOR * np.diag(self.A)[self.O]   # not in the span of S
        if not ok.any():
            return None
        add = np.where(ok, (self.Rr * self.Rr).sum(0) / np.maximum(self.C, 1e-300), -np.inf)
        ki = np.argsort(rem)[:candidates]
        ko = np.argsort(-add)[:min(candidates, int(ok.sum()))]
        D = self.pair_deltas(ki, ko)
        k = int(np.argmin(D))
        a, b = divmod(k, ko.size)
        return float(D[a, b]), int(ki[a]), int(ko[b])

    def swap(self, i: int, j: int) -> None:
        """Slot ``i`` of ``S`` out, slot ``j`` of ``O`` in (module docstring)."""
        A, B = self.A, self.B
        H, WS, Z = self.H, self.WS, self.Z
        Hii = H[i, i]
        h = H[:, i].copy()
        Wi = WS[:, i].copy()
        Zi = Z[i].copy()
        H -= np.outer(h, h) / Hii
        WS -= np.outer(Wi, h) / Hii
        Z -= np.outer(h, Zi) / Hii
        self.C += Zi * Zi / Hii
        self.Rr += np.outer(Wi, Zi) / Hii
        col_out, col_in = int(self.S[i]), int(self.O[j])
        z = Z[:, j].copy()
        c = max(float(self.C[j]), 1e-300)
        r = self.Rr[:, j].copy()
        self.S[i] = col_in
        q = A[col_in, self.O] - A[col_in, self.S] @ Z
        H += np.outer(z, z) / c
        H[i, :] = -z / c
        H[:, i] = -z / c
        H[i, i] = 1.0 / c
        WS -= np.outer(r, z) / c
        WS[:, i] = r / c
        Z -= np.outer(z, q) / c
        Z[i, :] = q / c
        self.C -= q * q / c
        self.Rr -= np.outer(r, q) / c
        self.O[j] = col_out                  # the removed column takes a's slot
        a_S = A[self.S, col_out]
        Z[:, j] = H @ a_S
        self.C[j] = A[col_out, col_out] - a_S @ Z[:, j]
        self.Rr[:, j] = B[:, col_out] - WS @ a_S


def column_swap_search(A, B, c0, S, O, max_swaps: int, candidates: int = 128):
    """Swap kept and removed columns while a swap lowers the error by more than ``SWAP_TOL
    c0`` (at most ``max_swaps``); returns ``(S, O, swaps)``."""
    st = ColumnSwaps(A, B, c0, S, O)
    swaps = 0
    full = False
    while swaps < max_swaps:
        found = st.best(st.S.size + st.O.size if full else candidates)
        if found is None:
            break
        delta, i, j = found
        if delta >= -SWAP_TOL * c0:
            if full or candidates >= max(st.S.size, st.O.size):
                break
            full = True   # no candidate improves: look at every pair once
            continue
        full = False
        S0, O0 = st.S.copy(), st.O.copy()
        st.swap(i, j)
        swaps += 1
        if swaps % REFRESH == 0 or not np.isfinite(st.C).all():
            st.rebuild()
            if not (np.isfinite(st.H).all() and np.isfinite(st.C).all()):
                st.S, st.O = S0, O0     # numerically unusable: stop at the last good set
                swaps -= 1
                break
    return st.S, st.O, swaps
