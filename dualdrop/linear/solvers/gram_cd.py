"""Coordinate descent on the Gram form, for many rows at once.

Least squares only sees the data through ``G = X^T X / n``, ``q = X^T y / n`` and ``c0 = y^T y /
n``: ``(1/2n) ||y - X w||^2 = 1/2 w^T G w - q^T w + c0 / 2``. Each row ``r`` of this module's
problem is

    min_w  F_r(w) = 1/2 w^T G w - b_r^T w + c0_r / 2 + alpha_r sum_j weights_j Omega(w_j),

one Gram ``G`` (``p x p``, symmetric positive semidefinite) shared by all rows. With ``b_r = G
w0_r`` and ``c0_r = w0_r^T G w0_r`` it is ``1/2 (w - w0_r)^T G (w - w0_r) + alpha_r sum_j Omega(w_j)``:
the reconstruction of a linear layer ``W0`` from the Gram of its inputs, one output unit per row,
which is what one-shot pruning solves (Theorem 1 of LeJeune, Javadi & Baraniuk 2021: adaptive
dropout on ``W`` while reconstructing ``X W0^T`` is this least squares plus the effective penalty
``Omega``).

Why the Gram form: the coordinate step needs the gradient ``g = G w - b`` and the curvature
``G_jj``; a move of ``w_j`` by ``delta`` changes ``g`` by ``delta G[j]``, ``p`` operations, where
the design form of :mod:`.cd` costs ``n`` (one pass of the residual). When ``n > p`` (calibration
data: thousands of samples, hundreds of inputs), or when many right-hand sides share the design
(the rows of a layer), the Gram form is cheaper, and it never holds the data.

The iteration is that of :mod:`.cd` on the Gram: the outer loop scores every coordinate by its
gradient mapping (the criterion every solver shares, ``Problem.criterion``: the largest
violation divided by ``sqrt(2 F Lbar)``), keeps the nonzeros plus the worst violators as a working
set (twice the support), and solves it by proximal coordinate steps
``w_j <- prox_{alpha_r weights_j Omega / G_jj}(w_j - g_j / G_jj)`` to a fraction of the current
violation, alternating full passes with passes over the nonzeros. The prox is
``penalties.kernels.prox_scalar`` (through ``_jit.prox_step``): any separable catalog penalty,
convex or not; for a nonconvex one the result is a coordinate-wise minimum that depends on the
start point, so warm starts along a decreasing ``alpha`` (:func:`gram_path`) are the way to use
them.

Rows are independent: :func:`solve_gram` runs them in a compiled loop, in parallel on numba's
threads when ``n_threads > 1`` (an explicit argument: next to torch, numba's spinning OpenMP
workers slow torch's own kernels, so the default is one thread).

As a solver of :mod:`dualdrop.linear` (``SparseLinearRegression(solver="gram_cd")``) the problem
is one row: ``G``, ``q`` from the design (centred when there is an intercept, which then is
``ybar - means^T w``). It forms the ``p x p`` Gram (``8 p^2`` bytes): for ``n >> p``.
"""

from __future__ import annotations

import numbers

import numpy as np
from numba import config as _numba_config
from numba import get_num_threads, njit, prange, set_num_threads

from penalties.kernels import omega_scalar

from .. import _penalty
from .._jit import prox_step, score_thresholds, select_ws
from ._base import BaseSolver, UnsupportedProblem
from ._common import single_thread_blas
from .anderson import weights as anderson_weights

__all__ = ["GramCD", "GramResult", "gram_cd", "gram_path", "solve_gram"]

NAME = "gram_cd"


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


KERNELS = (_rows_serial,)  # what a first call compiles (penalties._numba_cache.is_compiled)


@njit(cache=True, parallel=True)
def _rows_parallel(G, dg, lips, B, c0, W, alphas, weights, code, params, positive, tol,
                   max_iter, max_epochs, p0, working_set, lbar, K, convex, n_iter, crit, conv, passes,
                   obj):
    for r in prange(W.shape[0]):
        _row(r, G, dg, lips, B, c0, W, alphas, weights, code, params, positive, tol, max_iter,
             max_epochs, p0, working_set, lbar, K, convex, n_iter, crit, conv, passes, obj)


# ----------------------------------------------------------------------------------------------
# Python API


class GramResult:
    """What :func:`solve_gram` returns, one entry per row: ``coef`` ``(R, p)``, ``n_iter``,
    ``criterion``, ``converged``, ``passes`` (coordinate passes) and ``objective`` (``F_r`` at
    ``coef``)."""

    __slots__ = ("coef", "n_iter", "criterion", "converged", "passes", "objective")

    def __init__(self, coef, n_iter, criterion, converged, passes, objective):
        self.coef = coef
        self.n_iter = n_iter
        self.criterion = criterion
        self.converged = converged
        self.passes = passes
        self.objective = objective

    def __repr__(self):
        return (f"GramResult(rows={self.coef.shape[0]}, converged={int(self.converged.sum())}/"
                f"{self.converged.size}, max criterion={float(np.max(self.criterion)):.2e})")


def _check_real(name, v, *, low=None, low_open=False):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if low is not None and (v <= low if low_open else v < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {v!r}")
    return float(v)


def _check_int(name, v, low):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    return int(v)


def _check_gram(G):
    G = np.asarray(G)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"G must be a square (p, p) matrix, got shape {G.shape}")
    if not np.issubdtype(G.dtype, np.number) or np.iscomplexobj(G):
        raise TypeError(f"G must hold real numbers, got dtype {G.dtype}")
    G = np.ascontiguousarray(G, dtype=np.float64)
    if not np.all(np.isfinite(G)):
        raise ValueError("G holds NaN or infinite entries")
    dg = np.diag(G).copy()
    scale = float(np.max(np.abs(dg), initial=0.0))
    if np.any(dg < -1e-12 * scale):
        raise ValueError("G must be positive semidefinite; it has a negative diagonal entry")
    if not np.allclose(G, G.T, rtol=1e-10, atol=1e-12 * max(scale, 1e-300)):
        raise ValueError("G must be symmetric (G = X^T X / n); symmetrize it, e.g. (G + G.T) / 2")
    return G, np.maximum(dg, 0.0)


def _rows_array(name, A, R, p):
    A = np.asarray(A)
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2 or A.shape[1] != p or (R is not None and A.shape[0] != R):
        want = f"({R}, {p})" if R is not None else f"(rows, {p})"
        raise ValueError(f"{name} must have shape {want} (or ({p},) for one row), got "
                         f"{np.shape(A)}")
    if not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
        raise TypeError(f"{name} must hold real numbers, got dtype {A.dtype}")
    A = np.array(A, dtype=np.float64, order="C", copy=True)
    if not np.all(np.isfinite(A)):
        raise ValueError(f"{name} holds NaN or infinite entries")
    return A


def _per_row(name, v, R):
    a = np.asarray(v, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(R, float(a))
    if a.shape != (R,) or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must be a number >= 0 or one per row ({R}), got {v!r}")
    return np.ascontiguousarray(a)


def _spec(penalty):
    P = _penalty.resolve_penalty(penalty)
    spec = _penalty.kernel_spec(P)
    if spec is None:
        raise ValueError(f"penalty={P!r} has no compiled kernel (kernel_spec); gram_cd needs a "
                         "separable catalog penalty (every name of penalties.available() but "
                         "'hard_threshold')")
    return P, spec


class _threads:
    """``numba.set_num_threads(n)`` for the duration of a block."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.old = get_num_threads()
        set_num_threads(self.n)

    def __exit__(self, *exc):
        set_num_threads(self.old)


def solve_gram(G, B, c0, alpha, penalty, *, start=None, weights=None, positive=False, tol=1e-5,
               max_iter=100, max_epochs=5000, p0=10, working_set=True, anderson=5, lips=None,
               lbar=None, n_threads=1) -> GramResult:
    """Minimize ``1/2 w^T G w - B[r]^T w + c0[r]/2 + alpha[r] sum_j weights_j Omega(w_j)`` for
    every row ``r`` of ``B`` (module docstring).

    Parameters
    ----------
    G : (p, p) array, symmetric positive semidefinite.
    B : (R, p) array (or (p,) for one row): the linear terms.
    c0 : number or (R,) array: the constant terms (``y^T y / n``, ``w0^T G w0``); they enter the
        objective and the criterion's scale only.
    alpha : number or (R,) array >= 0; penalty : a catalog name or penalty object with a
        compiled kernel.
    start : (R, p) array or None (zeros): the warm start.
    weights : (p,) array >= 0 or None (ones): per-coordinate strengths (0: unpenalized).
    positive : constrain ``w >= 0``.
    tol, max_iter : the stopping criterion (``Problem.criterion``) and outer iterations per row;
        ``max_epochs`` bounds the passes of one working-set solve, ``p0`` is the first working-set
        size, ``working_set=False`` solves on all coordinates at once, ``anderson`` is the
        number of extrapolated iterates (0: no extrapolation).
    lips, lbar : the curvatures the criterion divides by (default ``diag(G)`` and its mean over
        the positive entries); the estimator passes those of its design.
    n_threads : rows solved in parallel on this many numba threads (1: a serial loop).

    Returns a :class:`GramResult`; a row that did not converge is marked in ``converged`` (no
    warning here: callers decide).
    """
    G, dg = _check_gram(G)
    p = G.shape[0]
    B = _rows_array("B", B, None, p)
    R = B.shape[0]
    c0 = _per_row("c0", c0, R)
    alphas = _per_row("alpha", alpha, R)
    W = np.zeros((R, p)) if start is None else _rows_array("start", start, R, p)
    if weights is None:
        weights = np.ones(p)
    else:
        weights = np.ascontiguousarray(weights, dtype=np.float64)
        if weights.shape != (p,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError(f"weights must be {p} finite numbers >= 0 (0: unpenalized)")
    if lips is None:
        lips = dg
    else:
        lips = np.ascontiguousarray(lips, dtype=np.float64)
        if lips.shape != (p,):
            raise ValueError(f"lips must have shape ({p},), got {lips.shape}")
    if lbar is None:
        pos = lips[lips > 0]
        lbar = float(pos.mean()) if pos.size else 1.0
    P, (code, params) = _spec(penalty)
    tol = _check_real("tol", tol, low=0.0, low_open=True)
    max_iter = _check_int("max_iter", max_iter, 1)
    max_epochs = _check_int("max_epochs", max_epochs, 1)
    p0 = _check_int("p0", p0, 1)
    n_threads = _check_int("n_threads", n_threads, 1)
    anderson = _check_int("anderson", anderson, 0)
    if positive:
        W = np.maximum(W, 0.0)
    n_iter = np.zeros(R, dtype=np.int64)
    crit = np.zeros(R)
    conv = np.zeros(R, dtype=np.bool_)
    passes = np.zeros(R, dtype=np.int64)
    obj = np.zeros(R)
    args = (G, dg, lips, B, c0, W, alphas, weights, int(code), params, bool(positive), tol,
            max_iter, max_epochs, p0, bool(working_set), float(lbar), anderson,
            bool(getattr(P, "is_convex", False)), n_iter, crit, conv, passes, obj)
    if n_threads > 1 and R > 1:
        with _threads(min(n_threads, int(_numba_config.NUMBA_NUM_THREADS))):
            _rows_parallel(*args)
    else:
        _rows_serial(*args)
    return GramResult(W, n_iter, crit, conv, passes, obj)


def gram_cd(G, W0, alpha, penalty, *, start=None, **options) -> GramResult:
    """``min_w 1/2 (w - w0_r)^T G (w - w0_r) + alpha_r sum_j weights_j Omega(w_j)`` for every
    row ``w0_r`` of ``W0`` ``(R, p)``: :func:`solve_gram` with ``B = W0 G`` and ``c0_r = w0_r^T G
    w0_r`` (the objective is then 0 at ``w = w0`` without penalty). ``start`` defaults to zeros
    (from ``W0`` a nonconvex penalty would stay near the dense weights); ``options`` are those
    of :func:`solve_gram`."""
    G, _ = _check_gram(G)
    W0 = _rows_array("W0", W0, None, G.shape[0])
    B = W0 @ G
    c0 = np.maximum(np.einsum("rp,rp->r", B, W0), 0.0)
    return solve_gram(G, B, c0, alpha, penalty, start=start, **options)


def gram_path(G, W0, alphas, penalty, *, start=None, callback=None, **options):
    """:func:`gram_cd` along ``alphas`` (decreasing), each fit warm-started at the previous one.

    ``callback(k, result)`` runs after fit ``k``; when it returns ``True`` the path stops there
    (e.g. once a sparsity budget is reached). Returns the list of :class:`GramResult`."""
    alphas = np.asarray(alphas, dtype=np.float64)
    if alphas.ndim != 1 or alphas.size == 0 or np.any(np.diff(alphas) > 0) or np.any(alphas < 0):
        raise ValueError("alphas must be a nonempty decreasing sequence of numbers >= 0")
    out = []
    cur = start
    for k, a in enumerate(alphas):
        res = gram_cd(G, W0, float(a), penalty, start=cur, **options)
        out.append(res)
        cur = res.coef
        if callback is not None and callback(k, res):
            break
    return out


# ----------------------------------------------------------------------------------------------
# the solver of dualdrop.linear


class GramCD(BaseSolver):
    """Working-set coordinate descent on the Gram form (least squares). ``max_iter`` counts
    outer iterations; ``tol`` applies to ``Problem.criterion``. Options: ``working_set=False``
    solves on all features at once, ``anderson=0`` disables extrapolation, ``max_epochs`` bounds
    the inner passes, ``p0`` is the first working-set size."""

    name = NAME
    requires = ("kernel", "quadratic")
    supports_positive = True
    default_max_iter = 100

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, working_set=True, anderson=5,
               max_epochs=5000, p0=10):
        des = problem.design
        n = problem.n
        y = problem.y
        with single_thread_blas(des):
            XtX = des.X.T @ des.X
            G = np.asarray(XtX.toarray() if hasattr(XtX, "toarray") else XtX) / n
            q = des.rmatvec(y) / n
        c0 = float(y @ y) / n
        if problem.fit_intercept:
            mu = des.col_sums / n
            ybar = float(y.mean())
            G = G - np.outer(mu, mu)
            q = q - mu * ybar
            c0 -= ybar * ybar
        G = 0.5 * (G + G.T)
        z = problem.z(w, b)
        history = [problem.objective(w, b, z)]
        res = solve_gram(G, q, max(c0, 0.0), 1.0, problem.penalty, start=w,
                         weights=problem.lam_w, positive=problem.positive, tol=tol,
                         max_iter=max_iter, max_epochs=max_epochs, p0=p0,
                         working_set=working_set, anderson=anderson, lips=problem.lips,
                         lbar=problem._lbar)
        w = res.coef[0]
        if problem.fit_intercept:
            b = ybar - float(mu @ w)
        z = problem.z(w, b)
        history.append(problem.objective(w, b, z))
        crit = problem.criterion(w, b, z)
        return (w, b, int(res.n_iter[0]), history, crit, crit <= tol,
                {"inner_iterations": int(res.passes[0])})


SOLVER = GramCD()
