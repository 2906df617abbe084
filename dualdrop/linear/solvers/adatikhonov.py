"""AdaTikhonov: gradient steps on ``L(w) + lam/2 sum_j w_j^2 / eta_j`` with ``eta = eta_hat(w)``
recomputed and frozen at every step (docs/theory.md section 4). Its gradient equals the penalty's,
``grad L + lam w / eta_hat(w) = grad L + lam Omega'(w)``, so this is gradient descent on ``F`` with
the minimum-norm subgradient (``Omega'(0) = 0``).

The step is chosen by Armijo backtracking on ``F`` itself (monotone objective). It is the
deep-network method of the paper, shown here on linear models: for penalties non-smooth at 0 it
does not produce exact zeros (coefficients hover near 0 and the step shrinks), so it stops when
the objective stalls and reports the optimality criterion it reached (usually above ``tol``:
then the estimator warns). Use ``cd`` for exact sparsity.
"""

from __future__ import annotations

import numpy as np

from ._base import BaseSolver
from ._common import armijo_step, descent_loop

NAME = "adatikhonov"


class AdaTikhonov(BaseSolver):
    """Options: ``stall_rtol`` (stop when the objective's relative decrease falls below it)."""

    name = NAME
    requires = ("separable", "classical")
    default_max_iter = 5000

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, stall_rtol=1e-13):
        return _adatikhonov(problem, w, b, tol, max_iter, verbose, stall_rtol)


def _adatikhonov(problem, w, b, tol, max_iter, verbose, stall_rtol):
    P = problem.penalty
    lam = problem.lam_w
    L = problem.global_lipschitz()
    rho = 1.0 / L if L > 0 else 1.0

    def step(state):
        nonlocal rho
        w, b, z, F = state
        gw, gb = problem.gradient(w, b, z)
        gw = gw + lam * np.asarray(P.derivative(w), dtype=np.float64)
        gb = gb if problem.fit_intercept else 0.0

        def trial(r):
            w_t, b_t = w - r * gw, b - r * gb
            z_t = problem.z(w_t, b_t)
            return (w_t, b_t, z_t), problem.objective(w_t, b_t, z_t)

        found = armijo_step(trial, F, gw @ gw + gb * gb, rho)
        if found is None:
            return None
        (w, b, z), F, rho = found
        return w, b, z, F

    z = problem.z(w, b)
    (w, b, _, _), it, history, crit, converged = descent_loop(
        problem, (w, b, z, problem.objective(w, b, z)), step, tol=tol, max_iter=max_iter,
        verbose=verbose, name=NAME, stall_rtol=stall_rtol)
    return w, b, it, history, crit, converged


SOLVER = AdaTikhonov()
solve, supports = SOLVER.solve, SOLVER.supports
