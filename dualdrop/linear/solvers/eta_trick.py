"""eta-trick: joint gradient descent on ``J(w, s) = L(w) + lam/2 sum_j [w_j^2 / eta_j + f(eta_j)]``
in ``(w, s = log eta)`` (docs/theory.md sections 1 and 4).

``dJ/dw = grad L + lam w / eta``, ``dJ/ds = lam/2 [-w^2/eta + eta f'(eta)]`` (``eta f'(eta)``, the
derivative of ``f`` in ``log eta``, by a central difference of the penalty's ``f``). Armijo
backtracking on ``J`` makes ``J`` monotone; since ``min_eta J = F``, the reported objective ``F(w)``
lies below it. Needs the dual function ``f`` of the penalty. Like AdaTikhonov it is the
deep-network method, shown on linear models; zeros are approached, not reached.
"""

from __future__ import annotations

import numpy as np

from ._base import BaseSolver
from ._common import armijo_step, descent_loop

NAME = "eta_trick"
_H = 1e-5


def _dfds(P, eta):
    return (np.asarray(P.f(eta * np.exp(_H))) - np.asarray(P.f(eta * np.exp(-_H)))) / (2 * _H)


def _J(problem, w, s, b, z):
    lam = problem.lam_w
    eta = np.exp(s)
    return problem.datafit.value(problem.y, z) + 0.5 * float(
        np.sum(lam * (w * w / eta + np.asarray(problem.penalty.f(eta)))))


class EtaTrick(BaseSolver):
    """Options: ``eta0`` (start of eta; default eta_hat of the start point, 1 where that is 0 or
    inf), ``stall_rtol``, ``log_eta_min`` (floor of log eta)."""

    name = NAME
    requires = ("separable", "dual_f", "classical")
    default_max_iter = 5000

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, eta0=None, stall_rtol=1e-13,
               log_eta_min=-60.0):
        return _eta_trick(problem, w, b, tol, max_iter, verbose, eta0, stall_rtol, log_eta_min)


def _eta_trick(problem, w, b, tol, max_iter, verbose, eta0, stall_rtol, log_eta_min):
    P = problem.penalty
    lam = problem.lam_w
    if eta0 is None:
        eta = np.asarray(P.eta_hat(w), dtype=np.float64)
        eta = np.where((eta > 0) & np.isfinite(eta), eta, 1.0)
    else:
        eta = np.broadcast_to(np.asarray(eta0, dtype=np.float64), w.shape).copy()
    L = problem.global_lipschitz()
    rho = 1.0 / L if L > 0 else 1.0

    def step(state):
        nonlocal rho
        w, b, z, Jv, s = state
        eta = np.exp(s)
        gw, gb = problem.gradient(w, b, z)
        gw = gw + lam * w / eta
        gs = 0.5 * lam * (-w * w / eta + _dfds(P, eta))
        gb = gb if problem.fit_intercept else 0.0

        def trial(r):
            w_t, b_t = w - r * gw, b - r * gb
            s_t = np.maximum(s - r * gs, log_eta_min)
            z_t = problem.z(w_t, b_t)
            return (w_t, b_t, z_t, s_t), _J(problem, w_t, s_t, b_t, z_t)

        found = armijo_step(trial, Jv, gw @ gw + gs @ gs + gb * gb, rho)
        if found is None:
            return None
        (w, b, z, s), Jv, rho = found
        return w, b, z, Jv, s

    Jhist = []

    def record(state):  # the history holds F(w); J is kept beside it
        Jhist.append(state[3])
        return problem.objective(*state[:3])

    s = np.log(eta)
    z = problem.z(w, b)
    (w, b, _, _, s), it, history, crit, converged = descent_loop(
        problem, (w, b, z, _J(problem, w, s, b, z), s), step, tol=tol, max_iter=max_iter,
        verbose=verbose, name=NAME, stall_rtol=stall_rtol, record=record)
    return w, b, it, history, crit, converged, {"J": np.asarray(Jhist), "eta": np.exp(s)}


SOLVER = EtaTrick()
solve, supports = SOLVER.solve, SOLVER.supports
