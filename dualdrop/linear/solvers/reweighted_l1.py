"""Reweighted l1 (Candes, Wakin & Boyd 2008) for penalties concave in ``|w|``: the MM scheme whose
step is the weighted Lasso ``min L(w) + sum_j lam_j Omega'(|w_j^k|) |w_j|``.

The weights are ``Omega'(|w|) >= 0`` evaluated at ``|w|`` with the *right* derivative at 0
(``Omega'(0+)``, e.g. ``1/eps`` for LogSum), never the signed derivative (which is 0 at 0 and would
leave zero coefficients unpenalized). Concavity of ``Omega`` on ``[0, inf)`` gives
``Omega(|u|) <= Omega(|w|) + Omega'(|w|)(|u| - |w|)``, so the objective is monotone whenever each
weighted Lasso is solved from the previous iterate by a descent method (our CD) or exactly
(``inner="cvxpy"``, a certifiable reference). A weight of ``inf`` (Lp, p < 1, at 0) keeps the
coefficient at 0.
"""

from __future__ import annotations

import numpy as np

import penalties

from .._penalty import abs_derivative, is_concave_in_abs, is_separable
from .._problem import Problem, SolverResult
from ._common import check_tol_iter, mm_loop, start_point

NAME = "reweighted_l1"


def supports(problem: Problem):
    P = problem.penalty
    if not is_separable(P):
        return "reweighted l1 needs a separable penalty"
    if not is_concave_in_abs(P):
        return f"reweighted l1 needs a penalty concave in |w| (Omega' nonincreasing); {P!r} is not"
    return None


def solve(problem: Problem, w0=None, b0=None, *, tol=1e-4, max_iter=100, verbose=False,
          inner="cd", inner_tol=None, inner_max_iter=1000) -> SolverResult:
    reason = supports(problem)
    if reason:
        raise ValueError(reason)
    tol, max_iter = check_tol_iter(tol, max_iter)
    if inner == "cd":
        from . import cd as inner_mod
    elif inner == "cvxpy":
        from . import cvxpy_solver as inner_mod
    else:
        raise ValueError(f"inner must be 'cd' or 'cvxpy', got {inner!r}")
    inner_tol = 0.1 * tol if inner_tol is None else float(inner_tol)
    P = problem.penalty
    l1 = penalties.get("l1")
    w, b = start_point(problem, w0, b0)
    n_inner = 0

    def step(w, b):
        nonlocal n_inner
        weights = problem.weights * abs_derivative(P, w)
        sub = Problem(problem.design, problem.y, problem.datafit, l1, problem.alpha,
                      problem.fit_intercept, weights=weights)
        # an infinite weight pins the coefficient at 0
        w = np.where(np.isfinite(weights), w, 0.0)
        res = inner_mod.solve(sub, w, b, tol=inner_tol, max_iter=inner_max_iter)
        n_inner += res.n_iter
        return res.coef, res.intercept

    w, b, it, history, crit, converged, seconds = mm_loop(
        problem, w, b, step, tol=tol, max_iter=max_iter, verbose=verbose, name=NAME, stall_rtol=1e-15)
    return SolverResult(w, float(b), it, history, crit, converged, NAME, seconds, info={"inner_iterations": n_inner, "inner": inner})
