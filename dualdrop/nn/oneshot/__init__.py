"""One-shot pruning of a trained network from calibration data (docs/oneshot.md).

Each prunable layer's problem is ``(W0, G)``: its dense weight and the Gram ``G = X^T X / n`` of
its calibration inputs (``methods.base``); a method (``registry``) turns it into a sparse weight
under a budget (a number of nonzeros, or an N:M pattern).
"""

from dualdrop.nn.oneshot.methods.base import Budget, LayerProblem, OneShotMethod, layer_objective
from dualdrop.nn.oneshot.registry import METHODS, available, get_method

__all__ = ["Budget", "LayerProblem", "OneShotMethod", "layer_objective", "METHODS",
           "available", "get_method"]
