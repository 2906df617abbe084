"""``magnitude``: keep the units of largest weight norm, ``||(producer rows, consumer columns)||``
(the group-norm criterion of structured magnitude pruning, Li et al., "Pruning Filters for
Efficient ConvNets", ICLR 2017, for the whole group of a unit)."""

import numpy as np

from .base import UnitMethod, UnitProblem, column_sums


class Magnitude(UnitMethod):
    name = "magnitude"
    common = {"refit": False}
    scoring = True

    def scores(self, problem: UnitProblem) -> np.ndarray:
        s = column_sums((problem.W0 ** 2).sum(0), problem.columns)
        if problem.part_sq is not None:
            s = s + problem.part_sq
        return np.sqrt(s)
