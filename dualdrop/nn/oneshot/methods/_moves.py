"""The compiled searches of the support polish (``polish.py``) over a row's state: 2-for-2
replacements, the swap loop and the size ladder, built on the single moves of ``_row_kernels``
(the row's state and the formulas: its module docstring and ``polish.py``'s)."""

from __future__ import annotations

import numpy as np

from ._row_kernels import (_add, _build, _cholesky, _cholesky_solve, _fill_mt,  # noqa: F401 (polish uses them from here)
                           _kernel, _remove, _swap)

__all__ = ["KERNELS"]

PAIR_OUT = 8  # 2-for-2 replacements in a row: pairs of its cheapest PAIR_OUT inputs out ...
PAIR_IN = 12  # ... and pairs of the PAIR_IN inputs of largest gain after that removal in


@_kernel
def _copy(src, dst, n):
    """``dst[:n] = src[:n]`` (a loop: numba compiles an array assignment's shape checks and
    their error messages, seconds of the first call)."""
    for a in range(n):
        dst[a] = src[a]


@_kernel
def _argsort(values, order):
    """``order[:n]`` = the positions of ``values`` (length ``n``) from the smallest value up,
    ties by position (a heap sort: numba's ``np.argsort`` costs seconds of compile time on the
    first call)."""
    n = values.shape[0]
    for i in range(n):
        order[i] = i
    for start in range(n // 2 - 1, -1, -1):
        _sift(values, order, start, n)
    for end in range(n - 1, 0, -1):
        order[0], order[end] = order[end], order[0]
        _sift(values, order, np.int64(0), end)  # not a literal: _sift compiles once


@_kernel
def _sift(values, order, i, n):
    """Restore the max-heap (by value, then position) of ``order[:n]`` below ``i``."""
    while True:
        big = i
        for child in (2 * i + 1, 2 * i + 2):
            if child < n:
                a, b = order[child], order[big]
                if values[a] > values[b] or (values[a] == values[b] and a > b):
                    big = child
        if big == i:
            return
        order[i], order[big] = order[big], order[i]
        i = big


@_kernel
def _pair_out(H, u, a1, a2):
    """Removing the support inputs at positions ``a1``, ``a2`` together (block Optimal Brain
    Surgeon): ``(H_PP)^-1`` as ``(i11, i12, i22)``, ``z = (H_PP)^-1 u_P`` and the rise of f,
    ``1/2 u_P^T z``; a rise of ``inf`` when ``H_PP`` is singular."""
    h11, h12, h22 = H[a1, a1], H[a1, a2], H[a2, a2]
    det = h11 * h22 - h12 * h12
    if not det > 0.0:
        return 0.0, 0.0, 0.0, 0.0, 0.0, np.inf
    i11, i12, i22 = h22 / det, -h12 / det, h11 / det
    z1 = i11 * u[a1] + i12 * u[a2]
    z2 = i12 * u[a1] + i22 * u[a2]
    return i11, i12, i22, z1, z2, 0.5 * (u[a1] * z1 + u[a2] * z2)


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
                i11, i12, i22, z1, z2, cost = _pair_out(H, u, a1, a2)
                if cost == np.inf:
                    continue
                v, k1, k2 = _best_pair_in(Gd, S, s, MT, g, c, inS, a1, a2, i11, i12, i22, z1,
                                          z2, cost, lo, hi, lo, hi, floor, best)
                if k1 >= 0:
                    best, ba1, ba2, bk1, bk2 = v, a1, a2, k1, k2
    return best, ba1, ba2, bk1, bk2


@_kernel
def _best_pair_in(Gd, S, s, MT, g, c, inS, a1, a2, i11, i12, i22, z1, z2, cost, lo1, hi1, lo2,
                  hi2, floor, best):
    """The best pair of inputs outside the support, ``k1`` in ``[lo1, hi1)`` and ``k2 > k1`` in
    ``[lo2, hi2)``, to add once the support pair at positions ``a1``, ``a2`` is removed (its
    :func:`_pair_out` terms, a rise of ``cost``). Returns ``(change of f, k1, k2)``, ``k1 = -1``
    when no pair changes f by less than ``best``."""
    bk1, bk2 = -1, -1
    for k1 in range(lo1, hi1):
        if inS[k1]:
            continue
        for k2 in range(max(lo2, k1 + 1), hi2):
            if inS[k2]:
                continue
            gain = _pair_value(Gd, S, s, MT, g, c, a1, a2, i11, i12, i22, z1, z2, k1, k2, floor)
            if cost - gain < best:
                best = cost - gain
                bk1, bk2 = k1, k2
    return best, bk1, bk2


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
        costs[a] = -u[a] * u[a] / (2.0 * H[a, a])
    order = _top(costs, n_out)  # the n_out cheapest, cheapest first
    gain1 = np.empty(p)
    for x1 in range(order.shape[0]):
        for x2 in range(x1 + 1, order.shape[0]):
            a1, a2 = order[x1], order[x2]
            if use_groups and gid[S[a1]] == gid[S[a2]]:
                continue  # one group: _best_pair's
            i11, i12, i22, z1, z2, cost = _pair_out(H, u, a1, a2)
            if cost == np.inf:
                continue
            if use_groups:  # one input of each of the two groups (the lower group first)
                g1 = min(gid[S[a1]], gid[S[a2]])
                g2 = max(gid[S[a1]], gid[S[a2]])
                v, k1, k2 = _best_pair_in(Gd, S, s, MT, g, c, inS, a1, a2, i11, i12, i22, z1,
                                          z2, cost, gstart[g1], gstart[g1 + 1], gstart[g2],
                                          gstart[g2 + 1], floor, best)
                if k1 >= 0:
                    best, ba1, ba2, bk1, bk2 = v, a1, a2, k1, k2
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
def _swap_loop(Gd, b, c0, S, s, H, u, g, c, inS, MT, f, f_exact, gid, use_groups, gstart,
               pairs, floor, rtol, max_swaps, refresh):
    """Swaps in one row until none improves by more than ``rtol`` of its error (``MT`` valid
    on entry): removal candidates in order of their cost, each paired with its best addition (in
    its group with ``use_groups``), the first improving pair applied (:func:`_swap`); with
    ``pairs``, when no single swap improves, the best 2-for-2 replacement
    (:func:`_best_pair_row`, and for N:M :func:`_best_pair`), applied as two swaps. Rebuilt
    from scratch every ``refresh`` swaps; the search ends there, back at the previous
    rebuild's support if that was better, when the rebuilt error is not below the previous
    rebuild's (swaps scored by rounding, not progress: inputs nearly in the span of the support,
    on a rank-deficient Gram, can make them cycle); a tracked error below 0 (drift) rebuilds at
    once. The support the search ends on is checked from scratch against the last checked
    one, which it replaces only if it is not worse: the row never ends above where it
    started. Returns ``(f, swaps)``."""
    p = Gd.shape[0]
    yes = p >= 0  # a run-time True: a literal would compile the callee once more
    n = 0
    since = 0
    refused = 0
    f_built = f  # the error of S_built (exact once checked, or given so: f_exact)
    exact = f_exact
    S_built = S[:s].copy()
    banned = np.zeros(p, dtype=np.bool_)  # inputs refused since the last swap
    costs = np.empty(s)
    order = np.empty(s, dtype=np.int64)
    while n < max_swaps:
        tol = rtol * (f + 1e-12 * c0)
        for a in range(s):
            costs[a] = u[a] * u[a] / (2.0 * H[a, a])
        _argsort(costs, order)
        found = False
        bi = bk = np.int64(-1)  # typed int64: a literal -1 would compile _swap a second time
        best = -tol
        for ii in range(s):
            i = order[ii]
            Hii = H[i, i]
            coef = u[i] / Hii
            base = costs[i]
            if not use_groups:
                best = -tol
            Mi = MT[i]
            k_lo, k_hi = 0, p
            if use_groups:  # the live inputs of its own group only
                gi = gid[S[i]]
                k_lo, k_hi = gstart[gi], gstart[gi + 1]
            for k in range(k_lo, k_hi):
                if inS[k] or banned[k]:
                    continue
                m = Mi[k]
                cp = c[k] + m * m / Hii
                if cp <= floor:
                    continue
                gp = g[k] - coef * m
                val = base - gp * gp / (2.0 * cp)
                if val < best:
                    best = val
                    bi, bk = i, k
            if bk >= 0 and not use_groups:
                break  # the first improving removal (a search costs a swap's); N:M: the best
        if bk >= 0:
            df = _swap(Gd, S, s, H, u, g, c, inS, MT, bi, bk, floor)
            found = True
            if np.isnan(df):  # k refused: search again without it, a bounded number of times
                refused += 1
                banned[bk] = True
                if refused > p:
                    found = False
            else:
                if refused:
                    banned[:] = False
                refused = 0
                f += df
                n += 1
                since += 1
        if not found and pairs:
            v, a1, a2, k1, k2 = _best_pair_row(Gd, S, s, H, u, g, c, inS, MT, gid, gstart,
                                               use_groups, floor, tol, np.int64(PAIR_OUT),
                                               np.int64(PAIR_IN))  # int64: _top compiles once
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
        if since >= refresh or f < 0.0:  # f < 0 cannot be: the tracked state has drifted
            f = _build(Gd, b, c0, S, s, H, u, g, c, inS, MT, yes, yes)
            since = 0
            if not exact:
                f_built = _exact_f(Gd, b, c0, S_built, s)
                exact = True
            if not f < f_built - rtol * (f_built + 1e-12 * c0):
                if f > f_built:
                    _copy(S_built, S, s)
                    f = _build(Gd, b, c0, S, s, H, u, g, c, inS, MT, yes, yes)
                break
            f_built = f
            _copy(S, S_built, s)
    if since:  # the swaps since the last check, checked from scratch: never end above it
        f_now = _exact_f(Gd, b, c0, S, s)
        if not exact:
            f_built = _exact_f(Gd, b, c0, S_built, s)
        if f_now > f_built:
            _copy(S_built, S, s)
            f = _build(Gd, b, c0, S, s, H, u, g, c, inS, MT, yes, yes)
        else:
            f = f_now
    return f, n


@_kernel
def _exact_f(Gd, b, c0, S, s):
    """``f = 1/2 (c0 - b_S^T Gd_SS^-1 b_S)`` of the support ``S[:s]`` from scratch (a Cholesky
    solve: a fraction of :func:`_build`'s inverse, and none of its other work)."""
    if s == 0:
        return 0.5 * c0
    GSS = np.empty((s, s))
    bs = np.empty(s)
    for a in range(s):
        bs[a] = b[S[a]]
        for d in range(s):
            GSS[a, d] = Gd[S[a], S[d]]
    x = bs.copy()
    _cholesky(GSS, s)
    _cholesky_solve(GSS, s, x)
    v = 0.0
    for a in range(s):
        v += bs[a] * x[a]
    return 0.5 * (c0 - v)


@_kernel
def _step(Gd, S, s, H, u, g, c, inS, MT, down, floor):
    """One exact step of the ladder: remove the cheapest input (``down``) or add the input of
    largest gain (``MT`` needs a free row). Returns the change of f (NaN: no step)."""
    p = Gd.shape[0]
    yes = p >= 0  # a run-time True: a literal would compile the callee once more
    if down:
        if s == 0:
            return np.nan
        best, bi = np.inf, np.int64(-1)  # not a literal: _remove compiles once
        for a in range(s):
            v = u[a] * u[a] / (2.0 * H[a, a])
            if v < best:
                best, bi = v, a
        return _remove(Gd, S, s, H, u, g, c, inS, MT, yes, bi)
    for _ in range(p):
        best, bk = -1.0, np.int64(-1)  # not a literal: _add compiles once
        for k in range(p):
            if not inS[k] and c[k] > floor:
                v = g[k] * g[k] / c[k]
                if v > best:
                    best, bk = v, k
        if bk < 0:
            return np.nan
        df = _add(Gd, S, s, H, u, g, c, inS, MT, yes, bk, floor)
        if not np.isnan(df):
            return df
    return np.nan


def _ladder(Gd, b, c0, S, s, H, u, g, c, inS, f, gid, gstart, floor, rtol, max_swaps,
            refresh, depth, out_S, out_f):
    """Polished supports of one row at sizes around its own: from the polished state ``(S, s,
    f)`` (left as it is), round trips that remove the cheapest input and polish, ``away``
    times, then add the best input and polish as many times back (and the same upward:
    add, then remove), for ``away`` in ``{1, depth}``. Every size passed records its polished
    support; ``out_S[depth + d]``, ``out_f[depth + d]``: the best found at size ``s + d``
    (``out_f = inf``: none). A round trip is a perturbation and a local search back: it finds
    other local optima at the row's own size too.

    Python over the compiled moves (:func:`_step`, :func:`_swap_loop`), not one kernel: a
    compiled caller links and re-optimizes the whole swap search once more, seconds of the
    first call for a loop of at most ``4 depth`` steps."""
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
            f1, _ = _swap_loop(Gd, b, c0, S1, s1, H1, u1, g1, c1, in1, MT1, f1 + df, False, gid,
                               False, gstart, False, floor, rtol, max_swaps, refresh)
            at = depth + s1 - s
            if f1 < out_f[at] - rtol * f1:
                out_f[at] = f1
                out_S[at, :s1] = S1[:s1]


#: the kernels the polish calls from Python (each compiles the ones it calls): those of
#: every polish, then the size ladder's step (``effort="full"`` only)
SWAP_KERNELS = (_build, _fill_mt, _add, _remove, _swap_loop)
KERNELS = (*SWAP_KERNELS, _step)
