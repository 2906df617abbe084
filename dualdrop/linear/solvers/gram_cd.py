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
from numba import get_num_threads, set_num_threads

from .. import _penalty
from ._base import BaseSolver, UnsupportedProblem
from ._common import single_thread_blas
from ._gram_core import kernels, kernels_for  # noqa: F401 (public here)

__all__ = ["GramCD", "GramResult", "gram_cd", "gram_path", "kernels", "kernels_for", "solve_gram"]

NAME = "gram_cd"


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
    k = kernels_for(code)
    args = (G, dg, lips, B, c0, W, alphas, weights, int(code), params, bool(positive), tol,
            max_iter, max_epochs, p0, bool(working_set), float(lbar), anderson,
            bool(getattr(P, "is_convex", False)), n_iter, crit, conv, passes, obj)
    if n_threads > 1 and R > 1:
        with _threads(min(n_threads, int(_numba_config.NUMBA_NUM_THREADS))):
            k.rows_parallel(*args)
    else:
        k.rows_serial(*args)
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
            G = des.gram() / n
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
