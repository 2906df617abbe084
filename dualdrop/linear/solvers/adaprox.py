"""AdaProx: a gradient step on the datafit, then the prox of the adaptive Tikhonov term,
``w <- (w - rho grad L(w)) * eta / (eta + rho lam)`` (docs/theory.md section 4).

Where ``eta`` is evaluated (``eta_at``):

- ``"gradient_step"`` (default, the method of the paper): ``eta = eta_hat(v)`` at the gradient-step
  point ``v = w - rho grad L(w)``. Coefficients can leave and re-enter zero. Its fixed points
  satisfy ``grad L(w) + lam w / eta_hat(v) = 0``: stationary points of ``F`` up to an ``O(rho)``
  bias (``v`` and ``w`` differ by ``rho grad L``), so it stops on the fixed-point residual
  ``||w_{k+1} - w_k||_inf / rho <= tol`` and reports the shared optimality criterion of ``F`` in
  ``info["optimality"]``. With the top-k indicator (``penalties.HardThreshold``, ``eta`` in
  {0, inf}) this is iterative hard thresholding (magnitude pruning).
- ``"iterate"``: ``eta = eta_hat(w_k)`` frozen through the step. The update is then a
  forward-backward step on the majorizer ``J(., eta_k)``: with ``rho <= 1/L`` (or backtracking,
  which enforces the descent lemma) the objective is monotone and the fixed points are exactly the
  stationary points ``grad L + lam w / eta_hat(w) = 0``. A coefficient at 0 (``eta_hat(0) = 0``)
  stays at 0, so the first step from ``w = 0`` uses the gradient-step point.

``eta = 0`` gives ``w_j = 0``, ``eta = inf`` a plain gradient step.
"""

from __future__ import annotations

import numpy as np

from .._penalty import is_separable
from ._base import BaseSolver
from ._common import progress

NAME = "adaprox"


def _shrink(eta, rho_lam):
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(np.isinf(eta), 1.0, eta / (eta + rho_lam))
    m[np.isnan(m)] = 0.0
    return m


class AdaProx(BaseSolver):
    """Any penalty with ``eta_hat`` (separable or the top-k indicator). Options: ``step``
    (``"backtracking"`` or ``"lipschitz"``), ``eta_at`` (``"gradient_step"`` or ``"iterate"``)."""

    name = NAME
    requires = ("classical",)
    default_max_iter = 5000

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, step="backtracking",
               eta_at="gradient_step"):
        return _adaprox(problem, w, b, tol, max_iter, verbose, step, eta_at)


def _adaprox(problem, w, b, tol, max_iter, verbose, step, eta_at):
    if eta_at not in ("gradient_step", "iterate"):
        raise ValueError(f"eta_at must be 'gradient_step' or 'iterate', got {eta_at!r}")
    if step not in ("lipschitz", "backtracking"):
        raise ValueError(f"step must be 'lipschitz' or 'backtracking', got {step!r}")
    P = problem.penalty
    separable = is_separable(P)
    at_iterate = separable and eta_at == "iterate"
    y, df = problem.y, problem.datafit
    lam = problem.lam_w
    L = problem.global_lipschitz()
    rho = 1.0 / L if L > 0 else 1.0
    z = problem.z(w, b)
    history = [_objective(problem, w, b, z, separable)]
    converged, crit, it = False, np.inf, 0
    with progress(max_iter, verbose, NAME) as bar:
        for it in range(1, max_iter + 1):
            gw, gb = problem.gradient(w, b, z)
            first_from_zero = it == 1 and not np.any(w)
            if at_iterate:
                crit = problem.criterion(w, b, z)
                if crit <= tol:
                    converged = True
                    break
                eta = np.asarray(P.eta_hat(w), dtype=np.float64)
            Lw = df.value(y, z)
            if step == "backtracking":
                rho = min(rho * 2.0, 1e6 / max(L, 1e-300))
            while True:
                v = w - rho * gw
                if not at_iterate or first_from_zero:
                    eta = np.asarray(P.eta_hat(v), dtype=np.float64)
                w_new = v * _shrink(eta, rho * lam)
                b_new = b - rho * gb if problem.fit_intercept else 0.0
                z_new = problem.z(w_new, b_new)
                if step == "lipschitz":
                    break
                d, db = w_new - w, b_new - b
                bound = Lw + gw @ d + gb * db + (d @ d + db * db) / (2 * rho)
                if df.value(y, z_new) <= bound + 1e-14 * abs(bound) or rho < 1e-12 / L:
                    break
                rho *= 0.5
            moved = np.max(np.abs(w_new - w), initial=abs(b_new - b))
            w, b, z = w_new, b_new, z_new
            history.append(_objective(problem, w, b, z, separable))
            bar.update(1)
            if not at_iterate:
                crit = moved / rho
                if crit <= tol:
                    converged = True
                    break
        else:
            if at_iterate:
                crit = problem.criterion(w, b, z)
                converged = crit <= tol
    info = {"step": rho, "eta_at": eta_at}
    if separable:
        info["optimality"] = problem.criterion(w, b, z)
    return w, b, it, history, crit, converged, info


def _objective(problem, w, b, z, separable):
    if separable:
        return problem.objective(w, b, z)
    pen = float(np.sum(problem.penalty.omega(w)))
    return problem.datafit.value(problem.y, z) + problem.alpha * pen


SOLVER = AdaProx()
solve, supports = SOLVER.solve, SOLVER.supports
