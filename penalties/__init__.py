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

import difflib
import inspect

from . import curves, kernels
from .base import KernelPenalty, Penalty
from .catalog import L1, MCP, SCAD, Log2Sum, LogSum, Lp
from .dropout import HardConcrete, Standout, VarDrop, VarDropExact
from .duality import from_dual, from_eta_hat, from_keep_ratio, from_mask_moments, from_penalty
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

_REGISTRY = {
    "l1": L1,
    "lp": Lp,
    "logsum": LogSum,
    "log2sum": Log2Sum,
    "scad": SCAD,
    "mcp": MCP,
    "vardrop": VarDrop,
    "vardrop_exact": VarDropExact,
    "hardconcrete": HardConcrete,
    "standout": Standout,
    "hard_threshold": HardThreshold,
}


def available() -> list[str]:
    """Names accepted by :func:`get`."""
    return sorted(_REGISTRY)


def get(name, **params):
    """Build a catalog penalty by name, e.g. ``get("logsum", eps=2.0)``.

    An existing penalty object is returned unchanged (``params`` must then be empty).
    """
    if isinstance(name, Penalty) or getattr(name, "is_vector_penalty", False):
        if params:
            raise ValueError("pass parameters either in the penalty object or as keywords, not both")
        return name
    if not isinstance(name, str):
        raise ValueError(f"penalty name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        raise ValueError(f"unknown penalty {name!r}; choose one of {', '.join(available())}")
    cls = _REGISTRY[key]
    valid = _parameter_names(cls)
    unknown = [k for k in params if k not in valid]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, valid, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        listed = ", ".join(valid) if valid else "none"
        raise ValueError(f"bad parameters for penalty {key!r}: unknown {', '.join(hints)}; "
                         f"its parameters are: {listed}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for penalty {name!r}: {exc}") from None


def _parameter_names(cls) -> list[str]:
    """Keyword parameters of a catalog class's constructor, in signature order."""
    sig = inspect.signature(cls.__init__)
    return [n for n, p in sig.parameters.items()
            if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
