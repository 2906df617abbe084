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
from numba import njit

import torch

from penalties.checks import check_int
from .base import Budget, OneShotMethod
from ._layer import ScaledLayer
from .sparsegpt import SparseGPT

__all__ = ["Polish", "SupportSearch", "polish", "polish_support"]

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
DEPTH = 3  # sizes each row explores down and up before the sizes are re-split (reallocate)
PAIR_OUT = 8  # 2-for-2 replacements in a row: pairs of its cheapest PAIR_OUT inputs out ...
PAIR_IN = 12  # ... and pairs of the PAIR_IN inputs of largest gain after that removal in


# The kernels may reorder sums (vectorized loops) but keep NaN and inf semantics: NaN is how a
# refused move is reported. numpy's error model: no zero-division checks inside the loops.
_kernel = njit(cache=True, error_model="numpy",
               fastmath={"nsz", "arcp", "contract", "reassoc"})


# ----------------------------------------------------------------------------------------------
# compiled row kernels. A row's state: support S[:s] (positions of live inputs), H[:s, :s] =
# (Gd_SS)^-1, u[:s] its refit weights, g = Gd u - b and c (Schur complements) over all inputs
# (0 on the support), inS the support as a mask; during swaps also MT[:s] = H Gd_{S,:} (the
# rows m_i = Gd_{:,S} H e_i of the swap search, kept up to date by each swap).


@_kernel
def _build(Gd, b, c0, S, s, H, u, g, c, inS, MT, has_mt, want_c):
    """The state of support ``S[:s]`` from scratch (the Schur complements ``c`` only with
    ``want_c`` or ``has_mt``: they cost ``O(p s^2)``, the rest ``O(s^3 + p s)``); returns
    ``f = 1/2 (u - u0)^T Gd (u - u0)``."""
    p = Gd.shape[0]
    inS[:] = False
    for k in range(p):
        g[k] = -b[k]
        c[k] = Gd[k, k]
    if s == 0:
        return 0.5 * c0
    idx = S[:s].copy()
    GSS = np.empty((s, s))
    for a in range(s):
        for d in range(s):
            GSS[a, d] = Gd[idx[a], idx[d]]
    Hs = np.linalg.inv(GSS)
    fb = 0.0
    for a in range(s):
        acc = 0.0
        for d in range(s):
            h = 0.5 * (Hs[a, d] + Hs[d, a])
            H[a, d] = h
            acc += h * b[idx[d]]
        u[a] = acc
        fb += b[idx[a]] * acc
    for a in range(s):
        ua = u[a]
        Ra = Gd[idx[a]]
        for k in range(p):
            g[k] += ua * Ra[k]
    if has_mt or want_c:
        rows = np.empty((s, p))
        for a in range(s):
            rows[a] = Gd[idx[a]]
        M = H[:s, :s].copy() @ rows  # (s, p)
        for a in range(s):
            Ra = rows[a]
            Ma = M[a]
            for k in range(p):
                c[k] -= Ma[k] * Ra[k]
        if has_mt:
            MT[:s] = M
    for a in range(s):
        inS[idx[a]] = True
        g[idx[a]] = 0.0
    for k in range(p):
        if inS[k] or c[k] < 0.0:
            c[k] = 0.0
    return 0.5 * (c0 - fb)


@_kernel
def _remove(Gd, S, s, H, u, g, c, inS, MT, has_mt, i):
    """Remove the support input at position ``i`` (the rest refit; the last position moves to
    ``i``; ``MT`` updated when ``has_mt``). Returns the rise of f."""
    p = Gd.shape[0]
    Hii = H[i, i]
    coef = u[i] / Hii
    hi = H[:s, i].copy()
    if has_mt:
        v = MT[i].copy()
    else:
        v = np.zeros(p)  # Gd_{:,S} H e_i
        for a in range(s):
            ha = hi[a]
            Ra = Gd[S[a]]
            for k in range(p):
                v[k] += ha * Ra[k]
    df = 0.5 * u[i] * coef
    for k in range(p):
        g[k] -= coef * v[k]
        c[k] += v[k] * v[k] / Hii
    for a in range(s):
        u[a] -= coef * hi[a]
    if has_mt:
        for a in range(s):
            if a != i:
                fa = hi[a] / Hii
                Ma = MT[a]
                for k in range(p):
                    Ma[k] -= fa * v[k]
    for a in range(s):
        fa = hi[a] / Hii
        for d in range(s):
            H[a, d] -= fa * hi[d]
    j = S[i]
    last = s - 1
    if i != last:
        S[i] = S[last]
        u[i] = u[last]
        for d in range(s):
            H[i, d] = H[last, d]
        for d in range(s):
            H[d, i] = H[d, last]
        if has_mt:
            MT[i] = MT[last]
    s -= 1
    inS[j] = False
    for a in range(s):
        g[S[a]] = 0.0
        c[S[a]] = 0.0
    c[j] = 1.0 / Hii
    return df


@_kernel
def _settle(S, s, g, c):
    """After a move: the support's own gradients and Schur complements are 0, and round-off
    below 0 in the others' complements is clipped."""
    for a in range(s):
        g[S[a]] = 0.0
        c[S[a]] = 0.0
    for q in range(c.shape[0]):
        if c[q] < 0.0:
            c[q] = 0.0


@_kernel
def _add(Gd, S, s, H, u, g, c, inS, MT, has_mt, k, floor):
    """Add input ``k`` at position ``s`` (the support refit; ``MT`` updated when ``has_mt``,
    which then needs a row ``s``). Returns the change of f (<= 0), or NaN, changing nothing but
    ``c[k] = 0``, when the Schur complement of ``k`` is below ``floor``."""
    p = Gd.shape[0]
    h = np.zeros(s)  # H Gd_{S,k}
    if has_mt:
        for a in range(s):
            h[a] = MT[a, k]
    else:
        for a in range(s):
            acc = 0.0
            for d in range(s):
                acc += H[a, d] * Gd[S[d], k]
            h[a] = acc
    sc = Gd[k, k]
    for a in range(s):
        sc -= Gd[S[a], k] * h[a]
    if not sc > floor:
        c[k] = 0.0
        return np.nan  # refused: nothing changed
    cvec = Gd[k].copy()
    for a in range(s):
        ha = h[a]
        Ra = Gd[S[a]]
        for q in range(p):
            cvec[q] -= ha * Ra[q]
    for q in range(p):
        cvec[q] /= sc
    gk = g[k]
    delta = -gk / sc
    df = -0.5 * gk * gk / sc
    for q in range(p):
        g[q] += delta * sc * cvec[q]
        c[q] -= sc * cvec[q] * cvec[q]
    for a in range(s):
        u[a] -= delta * h[a]
    u[s] = delta
    for a in range(s):
        fa = h[a] / sc
        for d in range(s):
            H[a, d] += fa * h[d]
        H[a, s] = -fa
        H[s, a] = -fa
    H[s, s] = 1.0 / sc
    if has_mt:
        for a in range(s):
            ha = h[a]
            Ma = MT[a]
            for q in range(p):
                Ma[q] -= ha * cvec[q]
        MT[s] = cvec
    S[s] = k
    s += 1
    inS[k] = True
    _settle(S, s, g, c)
    return df


@_kernel
def _swap(Gd, S, s, H, u, g, c, inS, MT, i, k, floor):
    """Remove the input at position ``i`` and add input ``k`` in its place, the support refit:
    :func:`_remove` then :func:`_add` fused, so that ``MT`` is swept once (plus one read of the
    support's rows of ``Gd``), the new input taking position ``i``. Returns the change of f, or
    NaN (nothing changed but ``c[k] = 0``) when the Schur complement of ``k`` without input
    ``i`` is below ``floor``."""
    p = Gd.shape[0]
    Hii = H[i, i]
    coef = u[i] / Hii
    v = MT[i].copy()
    hi = H[:s, i].copy()
    j = S[i]
    # after the removal: h' = MT'[:, k], the Schur complement of k, its gradient
    hp = np.empty(s)
    vk = v[k]
    for a in range(s):
        hp[a] = MT[a, k] - hi[a] / Hii * vk
    hp[i] = 0.0
    sc = Gd[k, k]  # exactly, not from the maintained c: Gd_kk - Gd_{S',k} . h'
    for a in range(s):
        if a != i:
            sc -= Gd[S[a], k] * hp[a]
    if not sc > floor:
        c[k] = 0.0
        return np.nan
    gk = g[k] - coef * vk
    delta = -gk / sc
    df = 0.5 * u[i] * coef - 0.5 * gk * gk / sc
    # cvec = (Gd[k] - Gd[:, S'] h') / sc
    cvec = Gd[k].copy()
    for a in range(s):
        if a == i:
            continue
        ha = hp[a]
        Ra = Gd[S[a]]
        for q in range(p):
            cvec[q] -= ha * Ra[q]
    for q in range(p):
        cvec[q] /= sc
    # gradient and Schur complements: removal, then addition
    for q in range(p):
        gq = g[q] - coef * v[q]
        cq = c[q] + v[q] * v[q] / Hii
        g[q] = gq + delta * sc * cvec[q]
        c[q] = cq - sc * cvec[q] * cvec[q]
    # one sweep over MT
    for a in range(s):
        if a == i:
            continue
        fa = hi[a] / Hii
        ha = hp[a]
        Ma = MT[a]
        for q in range(p):
            Ma[q] -= fa * v[q] + ha * cvec[q]
    MT[i] = cvec
    for a in range(s):
        if a != i:
            u[a] -= coef * hi[a] + delta * hp[a]
    u[i] = delta
    for a in range(s):
        if a == i:
            continue
        fa = hi[a] / Hii
        ga = hp[a] / sc
        for d in range(s):
            if d != i:
                H[a, d] += ga * hp[d] - fa * hi[d]
        H[a, i] = -ga
        H[i, a] = -ga
    H[i, i] = 1.0 / sc
    S[i] = k
    inS[j] = False
    inS[k] = True
    _settle(S, s, g, c)
    return df


@_kernel
def _fill_mt(Gd, S, s, H, MT, c, inS):
    """``MT[:s] = H Gd_{S,:}`` (the rows ``m_a`` of the swap search) and the Schur complements
    ``c = diag(Gd) - sum_a MT[a] * Gd[S_a]`` from them."""
    p = Gd.shape[0]
    rows = np.empty((s, p))
    for a in range(s):
        rows[a] = Gd[S[a]]
    MT[:s] = H[:s, :s].copy() @ rows
    for k in range(p):
        c[k] = Gd[k, k]
    for a in range(s):
        Ra = rows[a]
        Ma = MT[a]
        for k in range(p):
            c[k] -= Ma[k] * Ra[k]
    for k in range(p):
        if inS[k] or c[k] < 0.0:
            c[k] = 0.0


@_kernel
def _best_pair(Gd, S, s, H, u, g, c, inS, MT, gstart, floor, tol):
    """The best 2-for-2 replacement inside one N:M group: two support inputs ``P`` of a group
    out, two other inputs ``K`` of the same group in, scored exactly (block Optimal Brain
    Surgeon for ``P``: ``1/2 u_P^T (H_PP)^-1 u_P``; block gain for ``K`` with the gradient and
    the 2 x 2 Schur complement after the removal: ``g'_K = g_K - M_KP z``, ``z = H_PP^-1 u_P``,
    ``C'_KK = C_KK + M_KP H_PP^-1 M_KP^T``, ``C_kk' = Gd_kk' - m_k . Gd_{S,k'}``). The live
    inputs of group ``j`` are ``gstart[j] .. gstart[j + 1] - 1``. Returns ``(change of f,
    position a1, position a2, input k1, input k2)`` (``a1 = -1``: none below ``-tol``)."""
    best = -tol
    ba1, ba2, bk1, bk2 = -1, -1, -1, -1
    pos = np.full(Gd.shape[0], -1, dtype=np.int64)
    for a in range(s):
        pos[S[a]] = a
    for grp in range(gstart.shape[0] - 1):
        lo, hi = gstart[grp], gstart[grp + 1]
        for x1 in range(lo, hi):
            if not inS[x1]:
                continue
            for x2 in range(x1 + 1, hi):
                if not inS[x2]:
                    continue
                a1, a2 = pos[x1], pos[x2]
                h11, h12, h22 = H[a1, a1], H[a1, a2], H[a2, a2]
                det = h11 * h22 - h12 * h12
                if not det > 0.0:
                    continue
                i11, i12, i22 = h22 / det, -h12 / det, h11 / det  # (H_PP)^-1
                z1 = i11 * u[a1] + i12 * u[a2]
                z2 = i12 * u[a1] + i22 * u[a2]
                cost = 0.5 * (u[a1] * z1 + u[a2] * z2)
                for k1 in range(lo, hi):
                    if inS[k1]:
                        continue
                    for k2 in range(k1 + 1, hi):
                        if inS[k2]:
                            continue
                        gain = _pair_value(Gd, S, s, MT, g, c, a1, a2, i11, i12, i22, z1, z2,
                                           k1, k2, floor)
                        if cost - gain < best:
                            best = cost - gain
                            ba1, ba2, bk1, bk2 = a1, a2, k1, k2
    return best, ba1, ba2, bk1, bk2


@_kernel
def _pair_value(Gd, S, s, MT, g, c, a1, a2, i11, i12, i22, z1, z2, k1, k2, floor):
    """The gain of adding inputs ``k1``, ``k2`` after the support pair at positions ``a1``,
    ``a2`` is removed (:func:`_best_pair`'s formulas); ``-inf`` when singular."""
    m11, m12 = MT[a1, k1], MT[a2, k1]
    m21, m22 = MT[a1, k2], MT[a2, k2]
    g1 = g[k1] - m11 * z1 - m12 * z2
    g2 = g[k2] - m21 * z1 - m22 * z2
    c11 = c[k1] + m11 * (i11 * m11 + i12 * m12) + m12 * (i12 * m11 + i22 * m12)
    c22 = c[k2] + m21 * (i11 * m21 + i12 * m22) + m22 * (i12 * m21 + i22 * m22)
    c12 = Gd[k1, k2] + m11 * (i11 * m21 + i12 * m22) + m12 * (i12 * m21 + i22 * m22)
    for a in range(s):
        c12 -= MT[a, k1] * Gd[S[a], k2]
    dk = c11 * c22 - c12 * c12
    if not (c11 > floor and c22 > floor and dk > floor * floor):
        return -np.inf
    return 0.5 * (c22 * g1 * g1 - 2.0 * c12 * g1 * g2 + c11 * g2 * g2) / dk


@_kernel
def _top(values, k):
    """The positions of the ``k`` largest ``values``, largest first (a partial insertion sort:
    ``O(n k)`` at worst, ``O(n)`` when few values enter; a full sort per call cost more than
    the rest of :func:`_best_pair_row`)."""
    n = values.shape[0]
    k = min(k, n)
    idx = np.empty(k, dtype=np.int64)
    val = np.empty(k)
    m = 0
    for i in range(n):
        v = values[i]
        if m < k:
            j = m
            m += 1
        elif v > val[k - 1]:
            j = k - 1
        else:
            continue
        while j > 0 and val[j - 1] < v:
            val[j] = val[j - 1]
            idx[j] = idx[j - 1]
            j -= 1
        val[j] = v
        idx[j] = i
    return idx[:m]


@_kernel
def _best_pair_row(Gd, S, s, H, u, g, c, inS, MT, gid, gstart, use_groups, floor, tol, n_out,
                   n_in):
    """A 2-for-2 replacement in one row: the pairs of its ``n_out`` cheapest support inputs out
    and, for each, pairs in scored exactly as in :func:`_best_pair`: the pairs of the ``n_in``
    inputs of largest gain after that removal (all of them in a small row), or with
    ``use_groups`` (N:M) each input replaced by one of its own group (two groups changed at
    once; :func:`_best_pair` covers two changes in one group). Returns ``(change of f, a1, a2,
    k1, k2)`` (``a1 = -1``: none below ``-tol``)."""
    p = Gd.shape[0]
    best = -tol
    ba1, ba2, bk1, bk2 = -1, -1, -1, -1
    if s < 2 or p - s < 2:
        return best, ba1, ba2, bk1, bk2
    costs = np.empty(s)
    for a in range(s):
        costs[a] = u[a] * u[a] / (2.0 * H[a, a])
    order = np.argsort(costs)[:min(s, n_out)]
    gain1 = np.empty(p)
    for x1 in range(order.shape[0]):
        for x2 in range(x1 + 1, order.shape[0]):
            a1, a2 = order[x1], order[x2]
            if use_groups and gid[S[a1]] == gid[S[a2]]:
                continue  # one group: _best_pair's
            h11, h12, h22 = H[a1, a1], H[a1, a2], H[a2, a2]
            det = h11 * h22 - h12 * h12
            if not det > 0.0:
                continue
            i11, i12, i22 = h22 / det, -h12 / det, h11 / det
            z1 = i11 * u[a1] + i12 * u[a2]
            z2 = i12 * u[a1] + i22 * u[a2]
            cost = 0.5 * (u[a1] * z1 + u[a2] * z2)
            if use_groups:
                g1, g2 = gid[S[a1]], gid[S[a2]]
                for k1 in range(gstart[g1], gstart[g1 + 1]):
                    if inS[k1]:
                        continue
                    for k2 in range(gstart[g2], gstart[g2 + 1]):
                        if inS[k2]:
                            continue
                        gain = _pair_value(Gd, S, s, MT, g, c, a1, a2, i11, i12, i22, z1, z2,
                                           k1, k2, floor)
                        if cost - gain < best:
                            best = cost - gain
                            ba1, ba2, bk1, bk2 = a1, a2, k1, k2
                continue
            for k in range(p):
                gain1[k] = -np.inf
                if inS[k]:
                    continue
                m1, m2 = MT[a1, k], MT[a2, k]
                gk = g[k] - m1 * z1 - m2 * z2
                ck = c[k] + m1 * (i11 * m1 + i12 * m2) + m2 * (i12 * m1 + i22 * m2)
                if ck > floor:
                    gain1[k] = gk * gk / (2.0 * ck)
            top = _top(gain1, min(n_in, p - s))
            for y1 in range(top.shape[0]):
                for y2 in range(y1 + 1, top.shape[0]):
                    k1, k2 = top[y1], top[y2]
                    if gain1[k1] == -np.inf or gain1[k2] == -np.inf:
                        continue
                    gain = _pair_value(Gd, S, s, MT, g, c, a1, a2, i11, i12, i22, z1, z2, k1,
                                       k2, floor)
                    if cost - gain < best:
                        best = cost - gain
                        ba1, ba2, bk1, bk2 = a1, a2, k1, k2
    return best, ba1, ba2, bk1, bk2


@_kernel
def _swap_loop(Gd, b, c0, S, s, H, u, g, c, inS, MT, f, gid, use_groups, gstart, pairs,
               floor, rtol, max_swaps, refresh):
    """Swaps in one row until none improves by more than ``rtol`` of its error (``MT`` valid
    on entry): removal candidates in order of their cost, each paired with its best addition (in
    its group with ``use_groups``), the first improving pair applied (:func:`_swap`); with
    ``pairs``, when no single swap improves, the best 2-for-2 replacement
    (:func:`_best_pair_row`, and for N:M :func:`_best_pair`), applied as two swaps. Rebuilt
    from scratch every ``refresh`` swaps; the search ends there, back at the previous
    rebuild's support if that was better, when the rebuilt error is not below the previous
    rebuild's (swaps scored by rounding, not progress: inputs nearly in the span of the support,
    on a rank-deficient Gram, can make them cycle). Returns ``(f, swaps)``."""
    p = Gd.shape[0]
    n = 0
    since = 0
    refused = 0
    f_built = f
    S_built = S[:s].copy()
    banned = np.zeros(p, dtype=np.bool_)  # inputs refused since the last swap
    costs = np.empty(s)
    while n < max_swaps:
        tol = rtol * (f + 1e-12 * c0)
        for a in range(s):
            costs[a] = u[a] * u[a] / (2.0 * H[a, a])
        order = np.argsort(costs)
        found = False
        for ii in range(s):
            i = order[ii]
            Hii = H[i, i]
            coef = u[i] / Hii
            base = costs[i]
            gi = gid[S[i]]
            best = -tol
            bk = -1
            Mi = MT[i]
            for k in range(p):
                if inS[k] or banned[k] or (use_groups and gid[k] != gi):
                    continue
                m = Mi[k]
                cp = c[k] + m * m / Hii
                if cp <= floor:
                    continue
                gp = g[k] - coef * m
                val = base - gp * gp / (2.0 * cp)
                if val < best:
                    best = val
                    bk = k
            if bk >= 0:
                df = _swap(Gd, S, s, H, u, g, c, inS, MT, i, bk, floor)
                found = True
                if np.isnan(df):  # k refused: search again without it, a bounded number of
                    refused += 1  # times
                    banned[bk] = True
                    if refused > p:
                        found = False
                    break
                if refused:
                    banned[:] = False
                refused = 0
                f += df
                n += 1
                since += 1
                break
        if not found and pairs:
            v, a1, a2, k1, k2 = _best_pair_row(Gd, S, s, H, u, g, c, inS, MT, gid, gstart,
                                               use_groups, floor, tol, PAIR_OUT, PAIR_IN)
            if use_groups:
                v2, b1, b2, l1, l2 = _best_pair(Gd, S, s, H, u, g, c, inS, MT, gstart, floor,
                                                tol)
                if v2 < v:
                    a1, a2, k1, k2 = b1, b2, l1, l2
            if a1 >= 0:
                df1 = _swap(Gd, S, s, H, u, g, c, inS, MT, a1, k1, floor)
                if not np.isnan(df1):
                    f += df1
                    df2 = _swap(Gd, S, s, H, u, g, c, inS, MT, a2, k2, floor)
                    if not np.isnan(df2):
                        f += df2
                    n += 2
                    since += 2
                    found = True
        if not found:
            break
        if since >= refresh:
            f = _build(Gd, b, c0, S, s, H, u, g, c, inS, MT, True, True)
            since = 0
            if not f < f_built - rtol * (f_built + 1e-12 * c0):
                if f > f_built:
                    S[:s] = S_built
                    f = _build(Gd, b, c0, S, s, H, u, g, c, inS, MT, True, True)
                break
            f_built = f
            S_built[:] = S[:s]
    return f, n


@_kernel
def _swaps(Gd, b, c0, S, s, H, u, g, c, inS, f, gid, use_groups, gstart, pairs, floor, rtol,
           max_swaps, refresh):
    """:func:`_swap_loop` from the row's state (``f`` its error; ``MT`` and ``c`` computed
    here), leaving the state up to date. Returns ``(f, swaps)``."""
    p = Gd.shape[0]
    if s == 0 or s == p:
        return f, 0
    MT = np.empty((s, p))
    _fill_mt(Gd, S, s, H, MT, c, inS)
    return _swap_loop(Gd, b, c0, S, s, H, u, g, c, inS, MT, f, gid, use_groups, gstart, pairs,
                      floor, rtol, max_swaps, refresh)


@_kernel
def _step(Gd, S, s, H, u, g, c, inS, MT, down, floor):
    """One exact step of the ladder: remove the cheapest input (``down``) or add the input of
    largest gain (``MT`` needs a free row). Returns the change of f (NaN: no step)."""
    p = Gd.shape[0]
    if down:
        if s == 0:
            return np.nan
        best, bi = np.inf, -1
        for a in range(s):
            v = u[a] * u[a] / (2.0 * H[a, a])
            if v < best:
                best, bi = v, a
        return _remove(Gd, S, s, H, u, g, c, inS, MT, True, bi)
    for _ in range(p):
        best, bk = -1.0, -1
        for k in range(p):
            if not inS[k] and c[k] > floor:
                v = g[k] * g[k] / c[k]
                if v > best:
                    best, bk = v, k
        if bk < 0:
            return np.nan
        df = _add(Gd, S, s, H, u, g, c, inS, MT, True, bk, floor)
        if not np.isnan(df):
            return df
    return np.nan


@_kernel
def _ladder(Gd, b, c0, S, s, H, u, g, c, inS, f, gid, gstart, floor, rtol, max_swaps,
            refresh, depth, out_S, out_f):
    """Polished supports of one row at sizes around its own: from the polished state ``(S, s,
    f)`` (left as it is), round trips that remove the cheapest input and polish, ``away``
    times, then add the best input and polish as many times back (and the same upward:
    add, then remove), for ``away`` in ``{1, depth}``. Every size passed records its polished
    support; ``out_S[depth + d]``, ``out_f[depth + d]``: the best found at size ``s + d``
    (``out_f = inf``: none). A round trip is a perturbation and a local search back: it finds
    other local optima at the row's own size too."""
    p = Gd.shape[0]
    out_f[:] = np.inf
    out_f[depth] = f
    out_S[depth, :s] = S[:s]
    cap = min(p, s + depth)
    if cap == 0:
        return
    MT0 = np.empty((cap, p))
    cc = c.copy()
    _fill_mt(Gd, S, s, H, MT0, cc, inS)
    for trip in range(4):
        sign = -1 if trip % 2 == 0 else 1
        away = 1 if trip < 2 else depth
        if away == 1 and trip >= 2:
            continue
        if trip >= 2 and depth == 1:
            break
        S1 = np.zeros(cap, dtype=np.int64)
        S1[:s] = S[:s]
        H1 = np.zeros((cap, cap))
        H1[:s, :s] = H[:s, :s]
        u1 = np.zeros(cap)
        u1[:s] = u[:s]
        g1, c1, in1 = g.copy(), cc.copy(), inS.copy()
        MT1 = MT0.copy()
        f1 = f
        s1 = s
        for leg in range(2 * away):
            down = (sign < 0) == (leg < away)
            if (down and s1 == 0) or (not down and s1 == cap):
                break
            df = _step(Gd, S1, s1, H1, u1, g1, c1, in1, MT1, down, floor)
            if np.isnan(df):
                break
            s1 += -1 if down else 1
            f1, _ = _swap_loop(Gd, b, c0, S1, s1, H1, u1, g1, c1, in1, MT1, f1 + df, gid, False,
                               gstart, False, floor, rtol, max_swaps, refresh)
            at = depth + s1 - s
            if f1 < out_f[at] - rtol * f1:
                out_f[at] = f1
                out_S[at, :s1] = S1[:s1]


KERNELS = (_build, _swap_loop, _ladder)  # what a first polish compiles


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
        """Swaps until none improves, then (``pairs``) 2-for-2 replacements (:func:`_swaps`;
        within groups with ``use_groups``); returns their number."""
        self.f, n = _swaps(Gd, b, c0, self.S, self.s, self.H, self.u, self.g, self.c, self.inS,
                           self.f, gid, use_groups, gstart, pairs, SWAP_FLOOR, rtol, max_swaps,
                           REFRESH)
        self.moves = 0  # _swaps rebuilds against drift itself
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
        while cur < n_keep:
            full = np.array([s.size >= self.lp.q for s in self.supports])
            g = np.where(full, -np.inf, self.gain)
            r = int(np.argmax(g))
            k = int(self.gain_at[r])
            st = self.row(r)
            if self.gain[r] <= 0.0 or k < 0 or st.inS[k]:  # nothing helps: any free input
                free = np.flatnonzero(~st.inS & (st.c > FLOOR))
                k = int(free[0]) if free.size else int(np.flatnonzero(~st.inS)[0])
            if self._add(r, k):
                cur += 1

    def fix_pattern(self):
        """Each row to exactly ``min(N, live inputs of the group)`` nonzeros in every group:
        greedy exact removals in groups above ``N``, additions in groups below. A group whose
        remaining inputs all lie in the span of the row's support (a rank-deficient Gram:
        inputs seen on few calibration examples) cannot gain an input without a singular
        support, and adding one would not lower the objective: it stays short here (the swaps keep
        every group's count), and :meth:`ScaledLayer.finish` completes the pattern with those
        inputs (their refit weights)."""
        N, _ = self.pattern
        self.need_c = True  # rows are completed one at a time: no pass over all of them first
        gid = self.gid
        n_groups = int(gid.max()) + 1 if gid.size else 0
        want0 = np.minimum(N, np.bincount(gid, minlength=n_groups))
        for r in range(self.lp.R):
            st = self.row(r)
            st.ensure_c(self.Gd)
            want = want0.copy()
            while True:
                have = np.bincount(gid[st.support], minlength=n_groups)
                over = have > want
                under = have < want
                if over.any():
                    costs = np.where(over[gid[st.support]], st.costs(), np.inf)
                    st.remove(self.Gd, int(np.argmin(costs)))
                elif under.any():
                    cand = ~st.inS & under[gid] & (st.c > FLOOR)
                    if not cand.any():  # every short group is in the support's span
                        want[under] = have[under]
                        continue
                    k = int(np.argmax(np.where(cand, st.gains() + 1.0, -np.inf)))
                    st.add(self.Gd, k)
                else:
                    break
            self._touch(r, st)

    def swap_rows(self, rows=None, pairs=True, max_swaps=100_000, rtol=1e-9):
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
        repeated until nothing improves. N:M: swaps (and 2-for-2 replacements) only. Returns
        ``(rounds, swaps, rows changed by transfers and re-splits)``."""
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
        return rounds, swaps, moves


EFFORTS = ("swaps", "full")


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
    first brought to the budget exactly (greedy exact moves)."""
    search = SupportSearch(sl, mask, pattern=budget.pattern)
    if budget.pattern is None:
        search.fix_budget(sl.live_target(budget))
    else:
        search.fix_pattern()
    if max_rounds:
        search.polish(effort, max_rounds)
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
