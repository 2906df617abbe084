"""Sparse linear models with any effective penalty (issue 4).

Split as in skglm: a *datafit* (:mod:`.datafits`), a *penalty* (objects of the top-level
:mod:`penalties` package) and a *solver* (:mod:`.solvers`, one module per algorithm). The
scikit-learn estimators (:mod:`.estimators`) and the regularization path (:mod:`.path`) sit on top.
"""

from .datafits import Logistic, Quadratic
from ._problem import Problem, SolverResult
from .solvers import SOLVERS, get_solver

__all__ = ["Quadratic", "Logistic", "Problem", "SolverResult", "SOLVERS", "get_solver"]
