"""``osscar``: OSSCAR's combinatorial search (Meng et al., "OSSCAR: One-Shot Structured Pruning
in Vision and Language Models with Combinatorial Optimization", ICML 2024): the layer-wise
reconstruction objective with a ridge (``damp``), a backward greedy start with low-rank inverse
updates, then a local search of swaps (a kept unit out, a removed one in), each scored exactly
with the kept weights refit (``_kept.swap_search``), until none improves; the kept weights are
then refit."""

import numpy as np

from penalties.checks import check_float

from ._kept import backward_greedy
from .base import UnitMethod, UnitProblem


class OSSCAR(UnitMethod):
    name = "osscar"
    common = {"polish": True}
    defaults = {"damp": 1e-3}

    def _validate(self, opts):
        opts["damp"] = check_float("damp", opts["damp"], low=0.0)
        return opts

    def _select(self, problem: UnitProblem, n_keep: int) -> np.ndarray:
        return backward_greedy(problem, n_keep, self.options["damp"])
