"""``ziplm``: structured Optimal Brain Surgeon removal (Kurtic et al., "ZipLM: Inference-Aware
Structured Pruning of Language Models", NeurIPS 2023): units leave one at a time, each the one
whose removal raises the refit error least, ``tr(W_g H_gg^-1 W_g^T)`` with ``H`` the inverse
damped Gram (``damp`` times its mean diagonal, 1% as in SparseGPT and ZipLM), the kept weights
updated after every removal (``_kept.backward_greedy``); the final weights are the refit."""

import numpy as np

from penalties.checks import check_float

from ._kept import backward_greedy
from .base import UnitMethod, UnitProblem


class ZipLM(UnitMethod):
    name = "ziplm"
    defaults = {"damp": 0.01}

    def _validate(self, opts):
        opts["damp"] = check_float("damp", opts["damp"], low=0.0)
        return opts

    def _select(self, problem: UnitProblem, n_keep: int) -> np.ndarray:
        return backward_greedy(problem, n_keep, self.options["damp"])
