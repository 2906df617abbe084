"""The compiled row kernels of the support polish (``polish.py``): a row's least-squares state
and the exact single moves on it (build, removal, addition, swap), each scored with the rest of
the row refit. The searches built from them (swap loops, 2-for-2 replacements, the size ladder)
are in ``_moves``.

A row's state: support ``S[:s]`` (positions of live inputs), ``H[:s, :s] = (Gd_SS)^-1``, ``u[:s]``
its refit weights, ``g = Gd u - b`` and ``c`` (Schur complements) over all inputs (0 on the
support), ``inS`` the support as a mask; during swaps also ``MT[:s] = H Gd_{S,:}`` (the rows
``m_i = Gd_{:,S} H e_i`` of the swap search, kept up to date by each swap). The formulas (Optimal
Brain Surgeon removals, Schur-complement additions, swaps, 2-for-2 replacements) are derived in
``polish.py``'s docstring; ``Gd`` is the unit-diagonal Gram plus ``polish.RIDGE``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


# The kernels may reorder sums (vectorized loops) but keep NaN and inf semantics: NaN is how a
# refused move is reported. numpy's error model: no zero-division checks inside the loops.
_kernel = njit(cache=True, error_model="numpy",
               fastmath={"nsz", "arcp", "contract", "reassoc"})


# ----------------------------------------------------------------------------------------------
# dense algebra of a support's Gram, written out: the Gram ``Gd_SS`` is symmetric positive
# definite (``Gd`` carries polish.RIDGE on its diagonal), so a Cholesky factorization serves
# both the inverse and the solves. numba's LAPACK wrappers (their checks, copies and error
# messages) cost seconds of compile time on the first call; these loops a fraction of it.


@_kernel
def _cholesky(A, n):
    """``A[:n, :n] = L L^T`` in place (``L`` in the lower triangle, the upper one left as it
    was). A pivot that rounding leaves at or below 0 is floored at ``1e-300`` (with the ridge
    it does not happen)."""
    for j in range(n):
        d = A[j, j]
        for t in range(j):
            d -= A[j, t] * A[j, t]
        d = np.sqrt(d) if d > 0.0 else 1e-300
        A[j, j] = d
        for i in range(j + 1, n):
            v = A[i, j]
            for t in range(j):
                v -= A[i, t] * A[j, t]
            A[i, j] = v / d


@_kernel
def _cholesky_solve(L, n, x):
    """``x <- (L L^T)^-1 x`` from the factor of :func:`_cholesky`."""
    for i in range(n):
        v = x[i]
        for t in range(i):
            v -= L[i, t] * x[t]
        x[i] = v / L[i, i]
    for i in range(n - 1, -1, -1):
        v = x[i]
        for t in range(i + 1, n):
            v -= L[t, i] * x[t]
        x[i] = v / L[i, i]


@_kernel
def _spd_inverse(A, n, out):
    """``out[:n, :n] = A[:n, :n]^-1`` (symmetric) for ``A`` symmetric positive definite;
    ``A`` is overwritten by its factor."""
    _cholesky(A, n)
    e = np.empty(n)
    for j in range(n):
        for i in range(n):
            e[i] = 0.0
        e[j] = 1.0
        _cholesky_solve(A, n, e)
        for i in range(n):
            out[i, j] = e[i]


# ----------------------------------------------------------------------------------------------
# compiled row kernels (the state: the module docstring)


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
    Hs = np.empty((s, s))
    _spd_inverse(GSS, s, Hs)
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
    for a in range(s):
        inS[idx[a]] = True
        g[idx[a]] = 0.0
    if has_mt:
        _fill_mt(Gd, S, s, H, MT, c, inS)
    elif want_c:
        _fill_mt(Gd, S, s, H, np.empty((s, p)), c, inS)
    else:
        for k in range(p):
            if inS[k]:
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
            for k in range(p):  # (a loop: an array assignment compiles shape checks)
                MT[i, k] = MT[last, k]
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
def _schur_column(Gd, S, s, h, k, skip, sc):
    """``(Gd[k] - Gd[:, S] h) / sc``: input ``k``'s column of the support's update, ``h`` its
    least-squares coefficients on the support (position ``skip`` left out; -1: none) and ``sc``
    its Schur complement; shared by :func:`_add` and :func:`_swap`."""
    p = Gd.shape[0]
    cvec = Gd[k].copy()
    for a in range(s):
        if a == skip:
            continue
        ha = h[a]
        Ra = Gd[S[a]]
        for q in range(p):
            cvec[q] -= ha * Ra[q]
    for q in range(p):
        cvec[q] /= sc
    return cvec


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
    cvec = _schur_column(Gd, S, s, h, k, np.int64(-1), sc)  # not a literal: one compile
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
        for q in range(p):  # (a loop: an array assignment compiles its shape checks)
            MT[s, q] = cvec[q]
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
    cvec = _schur_column(Gd, S, s, hp, k, i, sc)  # the support S' without position i
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
    for q in range(p):  # (a loop: an array assignment compiles its shape checks)
        MT[i, q] = cvec[q]
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
    ``c = diag(Gd) - sum_a MT[a] * Gd[S_a]`` from them (``inS`` must mark ``S[:s]``). Only the
    columns outside the support are multiplied out: on it ``H Gd_SS = I``, so ``MT[a, S_d]``
    is 1 for ``d = a`` and 0 otherwise, and ``c`` is 0 (half the product at 2:4)."""
    p = Gd.shape[0]
    n = 0
    for k in range(p):
        if not inS[k]:
            n += 1
    out = np.empty(n, dtype=np.int64)
    n = 0
    for k in range(p):
        c[k] = 0.0
        if not inS[k]:
            out[n] = k
            c[k] = Gd[k, k]
            n += 1
    if s == 0:
        return
    rows = np.empty((s, n))
    for a in range(s):
        Ra = Gd[S[a]]
        for t in range(n):
            rows[a, t] = Ra[out[t]]
    M = H[:s, :s].copy() @ rows  # (s, n)
    for a in range(s):
        Ma = MT[a]
        for d in range(s):
            Ma[S[d]] = 0.0
        Ma[S[a]] = 1.0
        Mr = M[a]
        Ra = rows[a]
        for t in range(n):
            Ma[out[t]] = Mr[t]
            c[out[t]] -= Mr[t] * Ra[t]
    for k in range(p):
        if c[k] < 0.0:
            c[k] = 0.0
