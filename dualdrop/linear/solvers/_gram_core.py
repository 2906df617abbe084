"""The compiled core of :mod:`.gram_cd` (its module docstring: the problem, the working-set
iteration, the proximal coordinate passes): one row's solver, the loop over rows, and the same
kernels compiled for one penalty code (:func:`kernels_for`), which ``gram_cd.solve_gram`` runs."""

from __future__ import annotations

import types as _pytypes

import numpy as np
from numba import njit, prange

from penalties.kernels import OWN_PROX, omega_of, omega_scalar, prox_of

from .. import _jit, _penalty
from .._jit import prox_step, score_thresholds, select_ws
from .anderson import weights as anderson_weights

__all__ = ["Kernels", "kernels", "kernels_for"]


# ----------------------------------------------------------------------------------------------
# compiled core: one row. The row loop, the row and its working-set loop are one compiled
# function (``inline="always"``): numba re-optimizes a callee's code in every caller that links
# it, so each level of calls cost its own compile time on a first call.


@njit(cache=True)
def _refresh_grad(G, b, w, grad):
    """``grad = G w - b`` from the nonzeros of ``w`` (exact; the passes update it by moves)."""
    p = w.shape[0]
    for k in range(p):
        grad[k] = -b[k]
    for j in range(p):
        wj = w[j]
        if wj != 0.0:
            Gj = G[j]
            for k in range(p):
                grad[k] += wj * Gj[k]


@njit(cache=True)
def _objective(w, grad, b, c0, lam, code, params):
    """``F = 1/2 w^T G w - b^T w + c0/2 + sum_j lam_j Omega(w_j)`` from ``grad = G w - b``
    (``1/2 w^T G w - b^T w = 1/2 w^T (grad - b)``)."""
    s = 0.0
    pen = 0.0
    for j in range(w.shape[0]):
        wj = w[j]
        if wj != 0.0:
            s += wj * (grad[j] - b[j])
            if lam[j] != 0.0:
                pen += lam[j] * omega_scalar(code, params, wj)
    return 0.5 * s + 0.5 * c0 + pen


@njit(cache=True)
def _scores(w, grad, lips, lam, code, params, positive, Tg, score):
    """Gradient mapping ``L_j |w_j - prox_{lam_j Omega / L_j}(w_j - g_j / L_j)|`` of every
    coordinate into ``score`` (0 for a zero coordinate inside the prox's zero interval, or with
    ``L_j = 0``); returns the max."""
    m = 0.0
    for j in range(w.shape[0]):
        L = lips[j]
        g = grad[j]
        if L == 0.0 or (w[j] == 0.0 and abs(g) <= Tg[j]):
            score[j] = 0.0
            continue
        s = L * abs(w[j] - prox_step(code, params, w[j] - g / L, lam[j] / L, positive))
        score[j] = s
        if s > m:
            m = s
    return m


@njit(cache=True)
def _local_objective(w, g, b, lam, code, params):
    """``1/2 w^T Gw w - b^T w + sum_j lam_j Omega(w_j)`` from ``g = Gw w - b``."""
    s = 0.0
    for j in range(w.shape[0]):
        wj = w[j]
        if wj != 0.0:
            s += 0.5 * wj * (g[j] - b[j])
            if lam[j] != 0.0:
                s += lam[j] * omega_scalar(code, params, wj)
    return s


@njit(cache=True)
def _passes(Gw, dg, b, w, g, lam, T, code, params, positive, tol_in, max_epochs, K, convex):
    """Proximal CD passes on a working set's own Gram ``Gw`` (its rows and columns of ``G``:
    a move costs the working-set size, not ``p``), full passes alternating with passes over the
    nonzeros, until the largest scaled move ``Gw_jj |delta|`` of a full pass is at most
    ``tol_in``. Every ``K + 1`` passes the iterates are extrapolated (Anderson acceleration,
    ``K = 0``: none) and the extrapolation kept if it lowers the objective; for a convex
    penalty it is first brought back to the current orthant face (as in ``solvers.cd``). The
    gradient ``g = Gw w - b`` is affine in ``w``: it extrapolates with the same weights. Updates
    ``w`` and ``g`` in place; returns the number of passes."""
    n = w.shape[0]
    act = np.empty(n, dtype=np.int64)
    for j in range(n):
        act[j] = j
    n_act = n
    full = True
    hist = np.zeros((K + 1, n))
    ghist = np.zeros((K + 1, n))
    n_hist = 0
    ep = 0
    for ep in range(max_epochs):
        n_feats = n if full else n_act
        maxd = 0.0
        for jj in range(n_feats):
            j = jj if full else act[jj]
            L = dg[j]
            if L == 0.0:
                continue
            old = w[j]
            gj = g[j]
            if old == 0.0 and abs(gj) <= T[j]:
                continue  # the prox would return 0
            new = prox_step(code, params, old - gj / L, lam[j] / L, positive)
            if new != old:
                delta = new - old
                Gj = Gw[j]
                for k in range(n):
                    g[k] += delta * Gj[k]
                w[j] = new
                d = L * abs(delta)
                if d > maxd:
                    maxd = d
        if full:
            if maxd <= tol_in:
                break
            n_act = 0
            for j in range(n):
                if w[j] != 0.0:
                    act[n_act] = j
                    n_act += 1
            full = n_act == n
        elif maxd <= tol_in:
            full = True
        if K == 0:
            continue
        # (element loops, not array expressions: numba compiles each array expression's
        # broadcasting and shape-error paths, seconds of every first call)
        for j in range(n):
            hist[n_hist, j] = w[j]
            ghist[n_hist, j] = g[j]
        n_hist += 1
        if n_hist < K + 1:
            continue
        n_hist = 0
        ok, cw = anderson_weights(hist)
        if not ok:
            continue
        w_acc = np.zeros(n)
        g_acc = np.zeros(n)
        neg = False
        for k in range(K):
            ck = cw[k]
            for j in range(n):
                w_acc[j] += ck * hist[k + 1, j]
                g_acc[j] += ck * ghist[k + 1, j]
        for j in range(n):
            neg = neg or w_acc[j] < 0.0
        if positive and neg:
            continue
        if convex:
            for j in range(n):
                a = w_acc[j]
                if a != 0.0 and (w[j] == 0.0 or (a > 0.0) != (w[j] > 0.0)):
                    Gj = Gw[j]
                    for k in range(n):
                        g_acc[k] -= a * Gj[k]
                    w_acc[j] = 0.0
        if _local_objective(w_acc, g_acc, b, lam, code, params) < \
                _local_objective(w, g, b, lam, code, params):
            for j in range(n):
                w[j] = w_acc[j]
                g[j] = g_acc[j]
    return ep + 1


@njit(cache=True, inline="always")
def _solve_row(G, dg, lips, b, c0, w, lam, code, params, positive, tol, max_iter, max_epochs,
               p0, working_set, lbar, K, convex):
    """The working-set outer loop for one row, from ``w`` (updated in place). Returns
    ``(n_iter, criterion, converged, passes, objective)``; ``n_iter`` counts outer iterations,
    the final check included."""
    p = w.shape[0]
    grad = np.empty(p)
    score = np.empty(p)
    Tg = np.empty(p)
    score_thresholds(code, params, lam, lips, Tg)  # zero thresholds of the scores
    T = np.empty(p)  # ... and of the steps (curvature dg: the same unless lips differ)
    score_thresholds(code, params, lam, dg, T)
    all_feats = np.arange(p)
    f_null = 0.5 * c0
    total = 0
    crit = np.inf
    F = 0.0
    for it in range(1, max_iter + 2):
        _refresh_grad(G, b, w, grad)
        F = _objective(w, grad, b, c0, lam, code, params)
        m = _scores(w, grad, lips, lam, code, params, positive, Tg, score)
        f = max(F, 1e-10 * f_null)
        scale = np.sqrt(2.0 * f * lbar) if f > 0.0 else 1.0
        crit = m / scale
        if crit <= tol:
            return it, crit, True, total, F
        if it > max_iter:
            break
        if working_set:
            nnz = 0
            for j in range(p):
                if w[j] != 0.0:
                    nnz += 1
            ws = select_ws(score, w != 0.0, min(p, max(p0, 2 * nnz)))
        else:
            ws = all_feats
        if ws.shape[0] == 0:
            ws = all_feats
        tol_in = max(0.3 * crit, 0.1 * tol) * scale
        n = ws.shape[0]
        if n == p:
            total += _passes(G, dg, b, w, grad, lam, T, code, params, positive, tol_in,
                             max_epochs, K, convex)
            continue
        Gw = np.empty((n, n))
        for a in range(n):
            Ga = G[ws[a]]
            for c in range(n):
                Gw[a, c] = Ga[ws[c]]
        wl, gl, dl, bl, ll, Tl = (np.empty(n), np.empty(n), np.empty(n), np.empty(n),
                                  np.empty(n), np.empty(n))
        for a in range(n):  # (loops, not fancy indexing: see _passes)
            j = ws[a]
            wl[a], gl[a], dl[a], bl[a], ll[a], Tl[a] = w[j], grad[j], dg[j], b[j], lam[j], T[j]
        total += _passes(Gw, dl, bl, wl, gl, ll, Tl, code, params, positive, tol_in,
                         max_epochs, K, convex)
        for a in range(n):
            w[ws[a]] = wl[a]
    return max_iter, crit, False, total, F


@njit(cache=True, inline="always")
def _row(r, G, dg, lips, B, c0, W, alphas, weights, code, params, positive, tol, max_iter,
         max_epochs, p0, working_set, lbar, K, convex, n_iter, crit, conv, passes, obj):
    p = W.shape[1]
    lam = np.empty(p)
    w = np.empty(p)
    for j in range(p):  # (loops, not array expressions: see _passes)
        lam[j] = alphas[r] * weights[j]
        w[j] = W[r, j]
    it, c, ok, tot, F = _solve_row(G, dg, lips, B[r], c0[r], w, lam, code, params, positive, tol,
                                   max_iter, max_epochs, p0, working_set, lbar, K, convex)
    for j in range(p):
        W[r, j] = w[j]
    n_iter[r] = it
    crit[r] = c
    conv[r] = ok
    passes[r] = tot
    obj[r] = F


@njit(cache=True)
def _rows_serial(G, dg, lips, B, c0, W, alphas, weights, code, params, positive, tol, max_iter,
                 max_epochs, p0, working_set, lbar, K, convex, n_iter, crit, conv, passes, obj):
    for r in range(W.shape[0]):
        _row(r, G, dg, lips, B, c0, W, alphas, weights, code, params, positive, tol, max_iter,
             max_epochs, p0, working_set, lbar, K, convex, n_iter, crit, conv, passes, obj)




@njit(cache=True, parallel=True)
def _rows_parallel(G, dg, lips, B, c0, W, alphas, weights, code, params, positive, tol,
                   max_iter, max_epochs, p0, working_set, lbar, K, convex, n_iter, crit, conv, passes,
                   obj):
    for r in prange(W.shape[0]):
        _row(r, G, dg, lips, B, c0, W, alphas, weights, code, params, positive, tol, max_iter,
             max_epochs, p0, working_set, lbar, K, convex, n_iter, crit, conv, passes, obj)


# ----------------------------------------------------------------------------------------------
# the kernels of one penalty


def _clone(dispatcher, code, overrides, **options):
    """``dispatcher``'s function compiled anew (``njit(cache=True, **options)``) with the
    global names ``overrides`` bound to other objects, under its own qualified name (suffix
    ``_c<code>``: numba's cache keeps one index per name, and a global's value is not part of
    its key)."""
    fn = getattr(dispatcher, "py_func", dispatcher)  # a dispatcher, or a plain function
    new = _pytypes.FunctionType(fn.__code__, {**fn.__globals__, **overrides},
                                f"{fn.__name__}_c{code}", fn.__defaults__, fn.__closure__)
    new.__qualname__ = f"{fn.__qualname__}_c{code}"
    new.__module__, new.__doc__ = fn.__module__, fn.__doc__
    return njit(cache=True, **options)(new)


def _leaves(code):
    """The penalty's prox and ``Omega`` compiled for ``code`` alone: ``code`` is the closures'
    free variable, a compile-time constant to numba, so ``prox_of`` / ``omega_of`` keep that
    penalty's branch only; a penalty with a prox of its own (``penalties.kernels.OWN_PROX``)
    inlines that function alone (:func:`_own_prox`: nothing else to inline, then prune; half a
    second of logsum's first call). Their first argument (a code) is ignored: they replace
    ``prox_scalar`` / ``omega_scalar`` in the cloned kernels."""

    @njit(cache=True)
    def prox_leaf(code_, p, v, t):
        return prox_of(code, p, v, t)

    @njit(cache=True)
    def omega_leaf(code_, p, w):
        return omega_of(code, p, w)

    own = OWN_PROX.get(code)
    return (prox_leaf if own is None else _clone(_own_prox, code, {"own_prox": own})), omega_leaf


def _own_prox(code_, p, v, t):
    """A penalty's own prox (``own_prox``, bound by :func:`_clone` in :func:`_leaves`)."""
    return own_prox(p, v, t)  # noqa: F821 (a global of the clone only)


class Kernels:
    """The kernels :func:`kernels_for` compiled for one penalty code: ``rows_serial``,
    ``rows_parallel`` (every row of :func:`solve_gram`) and ``zero_threshold``
    (``dualdrop.linear._jit.zero_threshold``)."""

    __slots__ = ("rows_serial", "rows_parallel", "zero_threshold")

    def __init__(self, rows_serial, rows_parallel, zero_threshold):
        self.rows_serial = rows_serial
        self.rows_parallel = rows_parallel
        self.zero_threshold = zero_threshold


_KERNELS: dict[int, Kernels] = {}


def kernels_for(code) -> Kernels:
    """This module's kernels (and the ``_jit`` helpers they call) compiled for one penalty
    ``code`` (``kernel_spec()[0]``): the same functions, the same calls, with the catalog's
    general ``prox_scalar`` / ``omega_scalar`` replaced by the penalty's own (:func:`_leaves`),
    so a first call compiles one penalty's formulas, not the whole catalog's (the general
    prox's numeric root finding, SCAD's and the tables' branches: benchmarks/RESULTS.md, "Cold
    and warm first call"). Compiled on first call, cached on disk per code."""
    code = int(code)
    k = _KERNELS.get(code)
    if k is not None:
        return k
    prox_leaf, omega_leaf = _leaves(code)
    j = {"prox_scalar": prox_leaf}
    prox_step_c = _clone(_jit.prox_step, code, j)
    zero_threshold_c = _clone(_jit.zero_threshold, code, j)
    zero_thresholds_c = _clone(_jit.zero_thresholds, code, {"zero_threshold": zero_threshold_c})
    score_thresholds_c = _clone(_jit.score_thresholds, code,
                                {"zero_thresholds": zero_thresholds_c})
    local_c = _clone(_local_objective, code, {"omega_scalar": omega_leaf})
    solve_c = _clone(_solve_row, code, {
        "score_thresholds": score_thresholds_c,
        "_objective": _clone(_objective, code, {"omega_scalar": omega_leaf}),
        "_scores": _clone(_scores, code, {"prox_step": prox_step_c}),
        "_passes": _clone(_passes, code, {"prox_step": prox_step_c,
                                          "_local_objective": local_c})}, inline="always")
    row_c = _clone(_row, code, {"_solve_row": solve_c}, inline="always")
    k = _KERNELS[code] = Kernels(_clone(_rows_serial, code, {"_row": row_c}),
                                 _clone(_rows_parallel, code, {"_row": row_c}, parallel=True),
                                 zero_threshold_c)
    return k


def kernels(penalty) -> tuple:
    """The dispatchers a first :func:`solve_gram` with ``penalty`` (an object with a compiled
    kernel) compiles (``penalties._numba_cache.is_compiled``, first-use notices)."""
    spec = _penalty.kernel_spec(penalty)
    if spec is None:
        raise ValueError(f"penalty={penalty!r} has no compiled kernel (kernel_spec)")
    k = kernels_for(spec[0])
    return (k.rows_serial, k.zero_threshold)
