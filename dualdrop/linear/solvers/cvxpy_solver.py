"""cvxpy for convex penalties (L1 and Lp with ``p >= 1``, per-feature weights allowed): a
certifiable reference used as ground truth in the tests and as the inner solver of reweighted l1
(``inner="cvxpy"``). Least squares and logistic datafits, dense or sparse designs.

Interior-point solvers return points in the interior of the nonsmooth region: coefficients that
are exactly 0 at the optimum come back as ~1e-6 to 1e-4 of noise. ``polish=True`` (default)
finishes in two moves, so that the support is the optimum's: one proximal-gradient step with
step ``1/L`` (``L`` the Lipschitz constant of the datafit's gradient in ``(w, b)``), which never
raises the objective and whose prox sets to exact zero every coordinate whose zero is optimal by
a margin; then coordinate descent from there. The step is needed: coordinate descent stops
before its first pass when the cvxpy point already meets its criterion (on data in large units
the ~1e-6 residues are below the relative tolerance), and would return them untouched. The
unpolished point is kept in ``info["cvxpy_coef"]``.
"""

from __future__ import annotations

import numpy as np

from ._base import BaseSolver

NAME = "cvxpy"


class Cvxpy(BaseSolver):
    """Options: ``cvxpy_solver`` (a cvxpy solver name; default CLARABEL when installed),
    ``polish`` (finish with coordinate descent: exact zeros)."""

    name = NAME
    requires = ("convex_l1_lp", "classical")
    supports_positive = True
    default_tol = 1e-8
    default_max_iter = 10000

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, cvxpy_solver=None, polish=True):
        out = _cvxpy(problem, tol, max_iter, verbose, cvxpy_solver)
        if not polish or problem.spec is None:
            return out
        from .cd import SOLVER as cd

        w1, b1 = _prox_gradient_step(problem, out[0], out[1])
        res = cd.solve(problem, w1, b1, tol=tol, max_iter=100)
        info = {**out[6], "cvxpy_coef": out[0], "polish_iterations": res.n_iter}
        return (res.coef, res.intercept, 1 + res.n_iter, [out[3][0], res.final_objective],
                res.criterion, out[5] and res.converged, info)


def _prox_gradient_step(problem, w, b):
    """``prox_{lam/L}(w - grad/L)`` (and ``b - grad_b/L``): a descent step that zeroes the
    interior-point residues (module docstring)."""
    gw, gb = problem.gradient(w, b)
    L = problem.global_lipschitz()
    if not np.isfinite(L) or L <= 0:
        return w, b
    with np.errstate(divide="ignore", invalid="ignore"):
        new = np.asarray(problem.penalty.prox(w - gw / L, problem.lam_w / L), dtype=np.float64)
    if problem.positive:
        new = np.maximum(new, 0.0)
    new[~np.isfinite(problem.lam_w)] = 0.0
    b_new = b - gb / L if problem.fit_intercept else b
    if problem.objective(new, b_new) > problem.objective(w, b):  # rounding only: keep the point
        return w, b
    return new, b_new


def _cvxpy(problem, tol, max_iter, verbose, cvxpy_solver):
    import cvxpy as cp

    P = problem.penalty
    n, p = problem.n, problem.p
    X = problem.design.toarray()
    y = problem.y
    w = cp.Variable(p)
    b = cp.Variable() if problem.fit_intercept else 0.0
    z = X @ w + b
    if problem.datafit.code == 0:
        fit = cp.sum_squares(y - z) / (2 * n)
    else:
        losses = cp.logistic(-cp.multiply(y, z))
        sw = problem.datafit.sample_weight
        fit = cp.sum(losses if sw is None else cp.multiply(sw, losses)) / n
    lam = problem.lam_w
    finite = np.isfinite(lam)
    cons = [w[np.flatnonzero(~finite)] == 0] if not finite.all() else []
    if problem.positive:
        cons.append(w >= 0)
    lamf = np.where(finite, lam, 0.0)
    if P.name == "l1" or float(P.params["p"]) == 1.0:
        pen = cp.sum(cp.multiply(lamf, cp.abs(w)))
    else:
        pp = float(P.params["p"])
        pen = cp.sum(cp.multiply(lamf / pp, cp.power(cp.abs(w), pp)))
    prob = cp.Problem(cp.Minimize(fit + pen), cons)
    kw = {}
    solver = cvxpy_solver
    if solver is None:
        solver = "CLARABEL" if "CLARABEL" in cp.installed_solvers() else None
    if solver == "CLARABEL":
        kw = dict(tol_gap_abs=tol, tol_gap_rel=tol, tol_feas=tol, max_iter=max_iter)
    prob.solve(solver=solver, verbose=bool(verbose), **kw)
    if w.value is None:
        raise RuntimeError(f"cvxpy failed: status {prob.status}")
    coef = np.asarray(w.value, dtype=np.float64).ravel()
    intercept = float(b.value) if problem.fit_intercept else 0.0
    crit = problem.criterion(coef, intercept)
    obj = problem.objective(coef, intercept)
    return (coef, intercept, 1, [obj], crit, prob.status == "optimal",
            {"status": prob.status, "cvxpy_value": float(prob.value)})


SOLVER = Cvxpy()
solve, supports = SOLVER.solve, SOLVER.supports
