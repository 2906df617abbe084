"""Wanda: pruning by weights and activations (Sun, Liu, Bair, Kolter, ICLR 2024).

A weight's score is its magnitude times the norm of its input over the calibration set,

    S_ij = |W_ij| * ||X_j||_2,    ||X_j||_2^2 = n G_jj,

the first-order estimate of how much the output changes when the weight alone is removed (for
a diagonal G it is exact: ``||X_j W_ij||_2``). No weight is updated. The paper compares scores
within each output row ("per output"), which it found better than per layer for language
models: ``group="row"`` (default) spreads the layer's ``n_keep`` over the rows as evenly as the
count allows and keeps each row's best; ``group="layer"`` ranks the whole layer at once. N:M
patterns keep the N best of every M consecutive inputs of each row either way.
"""

from __future__ import annotations

import torch

from dualdrop.nn.oneshot.methods.base import Budget, OneShotMethod, select_mask, split_count
from penalties.checks import check_choice


class Wanda(OneShotMethod):
    """Keep the largest ``|W_ij| ||X_j||`` per output row (or per layer)."""

    name = "wanda"
    defaults = {"group": "row"}

    def _validate(self, opts):
        opts["group"] = check_choice("group", opts["group"], {"row", "layer"})
        return opts

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        score = W0.abs() * G.diagonal().clamp_min(0).sqrt()
        if budget.pattern is not None or self.options["group"] == "layer":
            return W0 * select_mask(score, budget)
        return W0 * row_mask(score, budget.n_keep)


def row_mask(score: torch.Tensor, n_keep: int) -> torch.Tensor:
    """The highest scores of each row, ``n_keep`` in all, split over the rows as evenly as
    possible (the first rows take the remainder)."""
    out, inp = score.shape
    per_row = split_count(n_keep, [inp] * out)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(inp, device=score.device).expand(out, inp))
    return rank < torch.tensor(per_row, device=score.device).unsqueeze(1)
