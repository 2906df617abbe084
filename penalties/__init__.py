"""penalties: the numeric core of dualdrop (never imports torch).

Every adaptive dropout method whose dropout rate falls as |w| grows is regularized ERM with a
subquadratic penalty ``Omega(w) = 1/2 min_eta [w^2/eta + f(eta)]`` (docs/theory.md). This package
holds that duality as code:

- the catalog of penalties (closed forms and dropout-derived ones), ``get(name, **params)``;
- constructors from any one description: ``from_dual``, ``from_penalty``, ``from_eta_hat``,
  ``from_keep_ratio``, ``from_mask_moments``;
- vector penalties (sums, the top-k indicator of magnitude pruning, ARD) and the curves and
  figure that compare them.
"""

from __future__ import annotations

from . import curves, kernels
from .base import KernelPenalty, Penalty
from .catalog import L1, MCP, SCAD, Log2Sum, LogSum, Lp
from .dropout import HardConcrete, Standout, VarDrop, VarDropExact
from .duality import from_dual, from_eta_hat, from_keep_ratio, from_mask_moments, from_penalty
from .registry import available, get
from .vector import ARD, HardThreshold, SumPenalty

__all__ = [
    "Penalty",
    "KernelPenalty",
    "L1",
    "Lp",
    "LogSum",
    "Log2Sum",
    "SCAD",
    "MCP",
    "VarDrop",
    "VarDropExact",
    "HardConcrete",
    "Standout",
    "HardThreshold",
    "SumPenalty",
    "ARD",
    "from_dual",
    "from_penalty",
    "from_eta_hat",
    "from_keep_ratio",
    "from_mask_moments",
    "get",
    "available",
    "curves",
    "kernels",
]
