"""Magnitude pruning, once: keep the weights of largest ``|w|``.

The baseline every one-shot paper reports (and the layer-wise form of Han et al. 2015): with an
``n_keep`` budget the ``n_keep`` largest magnitudes of the whole layer, with an N:M pattern the N
largest of every M consecutive inputs of each row. It ignores the inputs (``G``); its kept
weights keep their trained values unless ``refit=True``.
"""

from __future__ import annotations

import torch

from dualdrop.nn.oneshot.methods.base import Budget, OneShotMethod, select_mask


class Magnitude(OneShotMethod):
    """Keep the largest ``|w|`` (per layer, or per N:M group)."""

    name = "magnitude"
    defaults: dict = {}

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        return W0 * select_mask(W0.abs(), budget)
