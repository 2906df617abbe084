"""IRLS, the eta-trick majorization-minimization: alternate ``eta = eta_hat(w)`` and the weighted
ridge solve ``w = argmin L(w) + lam/2 sum_j w_j^2 / eta_j`` (docs/theory.md section 4).

Monotone: ``F(w_{k+1}) <= J(w_{k+1}, eta_k) <= J(w_k, eta_k) = F(w_k)``, because
``J(w, eta) = L(w) + lam/2 sum [w^2/eta + f(eta)] >= F(w)`` with equality at ``eta_hat(w)``.

- Least squares: one weighted ridge solve per step (Cholesky when the free features fit in ``n``,
  Woodbury otherwise; see ``_ridge``).
- Logistic: the ridge-logistic subproblem is solved by damped Newton steps (each a weighted ridge
  solve), each accepted only if it lowers ``J(., eta_k)``: the outer sequence stays monotone.

``eta_hat(w) = 0`` pins ``w_j = 0`` (exact for penalties non-smooth at 0); ``eta_hat = inf`` leaves
``w_j`` unpenalized (MCP/SCAD beyond their flat part). Coefficients that go to zero shrink
geometrically and reach exact zero only in the limit: use ``cd`` for exact sparsity. A start at
``w = 0`` with ``eta_hat(0) = 0`` would pin everything, so the first step uses ``eta = 1`` (a ridge
warm start) and the history starts there.
"""

from __future__ import annotations

import numpy as np

from ._base import BaseSolver
from ._common import mm_loop
from ._ridge import weighted_ridge

NAME = "irls"


def _D(problem, eta):
    lam = problem.lam_w
    with np.errstate(divide="ignore", invalid="ignore"):
        D = np.where(lam > 0, eta / np.where(lam > 0, lam, 1.0), np.inf)
    D[np.isnan(D)] = 0.0
    return D


def _surrogate(problem, w, z, D):
    with np.errstate(divide="ignore", invalid="ignore"):
        quad = np.where(w != 0, w * w / D, 0.0)
    return problem.datafit.value(problem.y, z) + 0.5 * float(np.sum(quad))


class IRLS(BaseSolver):
    """Options: ``max_newton`` (damped Newton steps per logistic subproblem)."""

    name = NAME
    requires = ("separable", "classical")
    default_max_iter = 200

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, max_newton=30):
        return _irls(problem, w, b, tol, max_iter, verbose, max_newton)


def _irls(problem, w, b, tol, max_iter, verbose, max_newton):
    P = problem.penalty
    quad = problem.datafit.code == 0
    eta = np.asarray(P.eta_hat(w), dtype=np.float64)
    if not np.any(eta > 0):
        eta = np.ones(problem.p)
        w, b = _ridge_step(problem, w, b, _D(problem, eta), quad, max_newton)

    def step(w, b):
        eta = np.asarray(P.eta_hat(w), dtype=np.float64)
        return _ridge_step(problem, w, b, _D(problem, eta), quad, max_newton)

    return mm_loop(problem, w, b, step, tol=tol, max_iter=max_iter, verbose=verbose, name=NAME,
                   stall_rtol=1e-16)


def _ridge_step(problem, w, b, D, quad, max_newton):
    des, y = problem.design, problem.y
    if quad:
        return weighted_ridge(des, np.full(problem.n, 1.0 / problem.n), y, D, problem.fit_intercept)
    # logistic: damped Newton on J(., eta) = L + 1/2 sum w^2 / D, from the current point
    w = np.where(D > 0, w, 0.0)
    z = problem.z(w, b)
    Jcur = _surrogate(problem, w, z, D)
    for _ in range(max_newton):
        G = problem.datafit.raw_grad(y, z)
        H = np.maximum(problem.datafit.raw_hess(y, z), 1e-12 / problem.n)
        t = z - G / H
        w_new, b_new = weighted_ridge(des, H, t, D, problem.fit_intercept)
        step, accepted = 1.0, False
        for _ls in range(40):
            wt = w + step * (w_new - w)
            bt = b + step * (b_new - b)
            zt = problem.z(wt, bt)
            Jt = _surrogate(problem, wt, zt, D)
            if Jt <= Jcur:
                accepted = True
                break
            step *= 0.5
        if not accepted:
            break
        done = Jcur - Jt <= 1e-15 * max(1.0, abs(Jt))
        w, b, z, Jcur = wt, bt, zt, Jt
        if done:
            break
    return w, b


SOLVER = IRLS()
solve, supports = SOLVER.solve, SOLVER.supports
