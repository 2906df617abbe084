"""Solvers for ``min_{w,b} L(y, Xw + b) + sum_j lam_j Omega(w_j)``, one module each.

Shared calling convention::

    result = module.solve(problem, w0=None, b0=None, *, tol=..., max_iter=..., verbose=False, **opts)

with ``problem`` a :class:`dualdrop.linear._problem.Problem` and ``result`` a
:class:`~dualdrop.linear._problem.SolverResult` (coef, intercept, n_iter, objective history,
final criterion, converged). ``module.supports(problem)`` returns ``None`` or the reason the solver
cannot handle the problem.
"""

from __future__ import annotations

import importlib

# name -> module (imported lazily: cvxpy is slow to import)
SOLVERS = {
    "cd": "cd",
    "irls": "irls",
    "adaprox": "adaprox",
    "adatikhonov": "adatikhonov",
    "eta_trick": "eta_trick",
    "reweighted_l1": "reweighted_l1",
    "cvxpy": "cvxpy_solver",
    "dropout_sgd": "dropout_sgd",
}


def get_solver(name):
    """The solver module registered under ``name``."""
    if not isinstance(name, str) or name not in SOLVERS:
        raise ValueError(f"solver={name!r} is unknown; use one of {sorted(SOLVERS)}")
    return importlib.import_module(f"{__name__}.{SOLVERS[name]}")


def capable_solvers(problem):
    """Names of the solvers that can handle ``problem``."""
    return [n for n in SOLVERS if get_solver(n).supports(problem) is None]
