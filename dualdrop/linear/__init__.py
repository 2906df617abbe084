"""Sparse linear models with any effective penalty.

Split as in skglm: a *datafit* (:mod:`.datafits`), a *penalty* (objects of the top-level
:mod:`penalties` package) and a *solver* (:mod:`.solvers`, one module per algorithm). The
scikit-learn estimators (:mod:`.estimators`, multi-output :mod:`.multitask`) and the
regularization path (:mod:`.path`) sit on top.

    >>> from dualdrop.linear import SparseLinearRegression
    >>> est = SparseLinearRegression(penalty="logsum", penalty_params={"eps": 1.0}, alpha=0.05)
"""

from ._problem import Problem, SolverResult
from .datafits import Logistic, Quadratic
from .cv import (SparseGLMCV, SparseLinearRegressionCV, SparseLogisticRegressionCV,
                 SparseMultinomialRegressionCV)
from .estimators import SparseLinearRegression, SparseLogisticRegression, expected_failed_checks
from .glm import (SparseCoxRegression, SparseGammaRegression, SparseGLM, SparseHuberRegression,
                  SparsePoissonRegression, SparseQuantileRegression, concordance_index)
from .multinomial import SparseMultinomialRegression
from .multitask import SparseMultiTaskRegression, multitask_alpha_max
from .path import alpha_max, regularization_path
from .solvers import SOLVERS, get_solver

__all__ = [
    "SparseLinearRegression",
    "SparseLogisticRegression",
    "SparseLinearRegressionCV",
    "SparseLogisticRegressionCV",
    "SparseGLMCV",
    "SparseMultinomialRegressionCV",
    "SparseMultiTaskRegression",
    "SparseMultinomialRegression",
    "SparseGLM",
    "SparsePoissonRegression",
    "SparseGammaRegression",
    "SparseHuberRegression",
    "SparseQuantileRegression",
    "SparseCoxRegression",
    "concordance_index",
    "multitask_alpha_max",
    "regularization_path",
    "alpha_max",
    "Quadratic",
    "Logistic",
    "Problem",
    "SolverResult",
    "SOLVERS",
    "get_solver",
    "expected_failed_checks",
]
