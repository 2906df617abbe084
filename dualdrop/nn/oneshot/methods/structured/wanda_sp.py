"""``wanda-sp``: Wanda's score ``|W_ij| ||x_j||`` summed over each unit's consumer columns (the
structured Wanda baseline of FLAP, An et al., AAAI 2024; Wanda: Sun et al., ICLR 2024)."""

import numpy as np

from .base import UnitMethod, UnitProblem, column_sums


class WandaSP(UnitMethod):
    name = "wanda-sp"
    common = {"refit": False}
    scoring = True

    def scores(self, problem: UnitProblem) -> np.ndarray:
        norms = np.sqrt(np.clip(np.diag(problem.G), 0.0, None))
        return column_sums(np.abs(problem.W0).sum(0) * norms, problem.columns)
