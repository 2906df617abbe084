"""``flap``: FLAP's fluctuation metric (An et al., "Fluctuation-based Adaptive Structured
Pruning for Large Language Models", AAAI 2024): input feature ``j`` scores ``Var(x_j)
||W[:, j]||^2`` (the variance of its values over the calibration tokens times its squared column
norm: how much the consumer's output moves with it), a unit the sum over its columns. A removed
unit's mean contribution goes into the bias (``bias_compensation``, on by default); the kept
weights are not refit (``refit=False``, as in the paper). The ``"flap"`` allocation
standardizes these scores per layer and ranks them across layers."""

import numpy as np

from .base import UnitMethod, UnitProblem, column_sums


class FLAP(UnitMethod):
    name = "flap"
    common = {"refit": False}
    scoring = True

    def scores(self, problem: UnitProblem) -> np.ndarray:
        var = np.clip(np.diag(problem.G) - problem.mu ** 2, 0.0, None)
        return column_sums(var * (problem.W0 ** 2).sum(0), problem.columns)
