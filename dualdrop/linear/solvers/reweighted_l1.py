"""Reweighted l1 (Candes, Wakin & Boyd 2008) for penalties concave in ``|w|``: the MM scheme whose
step is the weighted Lasso ``min L(w) + sum_j lam_j Omega'(|w_j^k|) |w_j|``.

The weights are ``Omega'(|w|) >= 0`` evaluated at ``|w|`` with the *right* derivative at 0
(``Omega'(0+)``, e.g. ``1/eps`` for LogSum), never the signed derivative (which is 0 at 0 and would
leave zero coefficients unpenalized). Concavity of ``Omega`` on ``[0, inf)`` gives
``Omega(|u|) <= Omega(|w|) + Omega'(|w|)(|u| - |w|)``, so the objective is monotone whenever each
weighted Lasso is solved from the previous iterate by a descent method (our CD) or exactly
(``inner="cvxpy"``, a certifiable reference). A weight of ``inf`` (Lp, p < 1, at 0) keeps the
coefficient at 0; from ``w = 0`` with every weight infinite the first step takes unit weights
(Candes, Wakin & Boyd's own first iteration: the lasso) and the iteration continues from there,
its result kept when below the objective at 0.
"""

from __future__ import annotations

import numpy as np

import penalties

from .._penalty import abs_derivative
from .._problem import Problem
from ._base import BaseSolver
from ._common import mm_loop

NAME = "reweighted_l1"


class ReweightedL1(BaseSolver):
    """Options: ``inner`` (``"cd"`` or ``"cvxpy"``), ``inner_tol`` (default ``tol / 10``),
    ``inner_max_iter``."""

    name = NAME
    requires = ("separable", "concave_in_abs")
    default_max_iter = 100

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, inner="cd", inner_tol=None,
               inner_max_iter=1000):
        return _reweighted(problem, w, b, tol, max_iter, verbose, inner, inner_tol,
                           inner_max_iter)


def _reweighted(problem, w, b, tol, max_iter, verbose, inner, inner_tol, inner_max_iter):
    if inner == "cd":
        from . import cd as inner_mod
    elif inner == "cvxpy":
        from . import cvxpy_solver as inner_mod
    else:
        raise ValueError(f"inner must be 'cd' or 'cvxpy', got {inner!r}")
    inner_tol = 0.1 * tol if inner_tol is None else float(inner_tol)
    P = problem.penalty
    l1 = penalties.get("l1")
    n_inner = 0

    def step(w, b, weights=None):
        nonlocal n_inner
        if weights is None:
            weights = problem.weights * abs_derivative(P, w)
        sub = Problem(problem.design, problem.y, problem.datafit, l1, problem.alpha,
                      problem.fit_intercept, weights=weights)
        # an infinite weight pins the coefficient at 0
        w = np.where(np.isfinite(weights), w, 0.0)
        res = inner_mod.solve(sub, w, b, tol=inner_tol, max_iter=inner_max_iter)
        n_inner += res.n_iter
        return res.coef, res.intercept

    info = {"inner": inner}
    zero_start = None
    if not np.any(w) and not np.any(step(w, b)[0]):
        # From w = 0 with Omega'(0+) = inf or huge (Lp, p < 1: |w|^(p-1)) the weights hold
        # every coefficient at 0 and the iteration never leaves it (a stationary point of such
        # penalties): the first step takes unit weights, the lasso (Candes, Wakin & Boyd's
        # initialization), and the iteration goes on from there; the result is kept when it is
        # below the objective at 0.
        zero_start = (w.copy(), b, problem.objective(w, b))
        w, b = step(w, b, problem.weights.copy())
        info["first_step"] = "unit weights"
    out = mm_loop(problem, w, b, step, tol=tol, max_iter=max_iter, verbose=verbose, name=NAME,
                  stall_rtol=1e-15)
    if zero_start is not None and out[3][-1] >= zero_start[2]:
        w0, b0, f0 = zero_start
        crit = problem.criterion(w0, b0)
        out = (w0, b0, out[2], np.append(out[3], f0), crit, crit <= tol)
        info["first_step"] = "unit weights, not kept (the objective at 0 is lower)"
    return out + ({**info, "inner_iterations": n_inner},)


SOLVER = ReweightedL1()
solve, supports = SOLVER.solve, SOLVER.supports
