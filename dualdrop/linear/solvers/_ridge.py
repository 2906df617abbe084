"""Weighted ridge solve shared by the eta-trick solvers (IRLS, and the Newton steps of its
logistic version).

Solves ``min_{w, b} 1/2 sum_i h_i (t_i - x_i . w - b)^2 + 1/2 sum_j w_j^2 / D_j`` where
``D_j = eta_j / lam_j``; ``D_j = 0`` pins ``w_j = 0`` and ``D_j = inf`` leaves ``w_j`` unpenalized
(as is the intercept). With ``S`` the free features:

- ``|S| <= n``: Cholesky of ``X_S^T H X_S + diag(1/D)`` (``|S| x |S|``);
- ``|S| > n``: Woodbury. With ``P`` the penalized and ``U`` the unpenalized columns (intercept
  included) and ``K = H^{-1} + X_P D X_P^T`` (``n x n``), ``w_U = (X_U^T K^{-1} X_U)^{-1}
  X_U^T K^{-1} t`` and ``w_P = D X_P^T K^{-1} (t - X_U w_U)`` (push-through identity).
"""

from __future__ import annotations

import contextlib

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from ._common import single_thread_blas


def _solve_spd(A, rhs):
    try:
        c = sla.cho_factor(A, lower=True, check_finite=False)
        return sla.cho_solve(c, rhs, check_finite=False)
    except (np.linalg.LinAlgError, sla.LinAlgError):
        return np.linalg.lstsq(A, rhs, rcond=None)[0]


def weighted_ridge(design, h, t, D, fit_intercept):
    """Return ``(w, b)``; see the module docstring. ``D`` may hold 0 and ``inf``.

    Systems of size <= 1000 are factorized with one BLAS thread: there threading gains nothing and,
    on a busy machine, oversubscription made OpenBLAS's Cholesky 100x slower (measured)."""
    small = min(design.n, int(np.count_nonzero(D > 0)) + int(fit_intercept)) <= 1000
    with (single_thread_blas() if small else contextlib.nullcontext()):
        return _weighted_ridge(design, h, t, D, fit_intercept)


def _weighted_ridge(design, h, t, D, fit_intercept):
    n, p = design.n, design.p
    h = np.maximum(h, 1e-300)
    free = D > 0
    pen = free & np.isfinite(D)
    unp = free & ~np.isfinite(D)
    w = np.zeros(p)
    S = np.flatnonzero(free)
    n_free = S.size + int(fit_intercept)
    if n_free == 0:
        return w, 0.0
    if n_free <= n:
        XS = design.columns(S)
        if fit_intercept:
            XS = np.column_stack([XS, np.ones(n)])
        XH = XS * h[:, None]
        A = XS.T @ XH
        diag = np.zeros(n_free)
        with np.errstate(over="ignore", divide="ignore"):
            diag[: S.size] = np.where(np.isfinite(D[S]), 1.0 / np.where(np.isfinite(D[S]), D[S], 1.0), 0.0)
        A[np.diag_indices_from(A)] += diag
        sol = _solve_spd(A, XH.T @ t)
        w[S] = sol[: S.size]
        return w, float(sol[-1]) if fit_intercept else 0.0
    P = np.flatnonzero(pen)
    U = np.flatnonzero(unp)
    XP = design.matrix[:, P] if design.is_sparse else design.columns(P)
    if design.is_sparse:
        K = (XP @ sp.diags(D[P]) @ XP.T).toarray()
    else:
        K = (XP * D[P]) @ XP.T
    K[np.diag_indices_from(K)] += 1.0 / h
    c = sla.cho_factor(K, lower=True, check_finite=False)
    XU = design.columns(U) if U.size else np.zeros((n, 0))
    if fit_intercept:
        XU = np.column_stack([XU, np.ones(n)])
    resid = t
    bU = np.zeros(XU.shape[1])
    if XU.shape[1]:
        KiXU = sla.cho_solve(c, XU, check_finite=False)
        bU = _solve_spd(XU.T @ KiXU, KiXU.T @ t)
        resid = t - XU @ bU
    v = sla.cho_solve(c, resid, check_finite=False)
    w[P] = D[P] * np.asarray(XP.T @ v).ravel()
    if U.size:
        w[U] = bU[: U.size]
    return w, float(bU[-1]) if fit_intercept else 0.0
