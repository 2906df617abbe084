"""Solvers for ``min_{w,b} L(y, Xw + b) + sum_j lam_j Omega(w_j)``, one module each.

Every solver is a :class:`._base.BaseSolver`; :func:`get_solver` returns the instance::

    result = get_solver("cd").solve(problem, w0=None, b0=None, *, tol=None, max_iter=None,
                                    verbose=False, **options)

with ``problem`` a :class:`dualdrop.linear._problem.Problem` and ``result`` a
:class:`~dualdrop.linear._problem.SolverResult` (coef, intercept, n_iter, objective history,
final criterion, converged). ``solver.supports(problem)`` returns ``None`` or the reason the
solver cannot handle the problem; ``solver.options`` lists its option names.
"""

from __future__ import annotations

import importlib

from ._base import UnsupportedProblem

__all__ = ["SOLVERS", "UnsupportedProblem", "capable_solvers", "get_solver"]

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
    "bcd": "bcd",
    "gram_cd": "gram_cd",
}


def get_solver(name):
    """The solver registered under ``name`` (a :class:`._base.BaseSolver` instance)."""
    if not isinstance(name, str) or name not in SOLVERS:
        raise ValueError(f"solver={name!r} is unknown; use one of {sorted(SOLVERS)}")
    return importlib.import_module(f"{__name__}.{SOLVERS[name]}").SOLVER


def capable_solvers(problem):
    """Names of the solvers that can handle ``problem``."""
    return [n for n in SOLVERS if get_solver(n).supports(problem) is None]
