"""penalties: the numeric core of dualdrop (never imports torch).

Every adaptive dropout method whose dropout rate falls as |w| grows is regularized ERM with a
subquadratic penalty ``Omega(w) = 1/2 min_eta [w^2/eta + f(eta)]`` (DUALITY.md). This package
holds that duality as code:

- the catalog of penalties (closed forms and dropout-derived ones), ``get(name, **params)``;
- constructors from any one description: ``from_dual``, ``from_penalty``, ``from_eta_hat``,
  ``from_keep_ratio``, ``from_mask_moments``;
- vector penalties (sums, the top-k indicator of magnitude pruning, ARD) and the curves and
  figure that compare them.
"""

from __future__ import annotations

from .base import KernelPenalty, Penalty
from .catalog import L1, MCP, SCAD, Log2Sum, LogSum, Lp

__all__ = [
    "Penalty",
    "KernelPenalty",
    "L1",
    "Lp",
    "LogSum",
    "Log2Sum",
    "SCAD",
    "MCP",
    "get",
    "available",
]

_REGISTRY = {
    "l1": L1,
    "lp": Lp,
    "logsum": LogSum,
    "log2sum": Log2Sum,
    "scad": SCAD,
    "mcp": MCP,
}


def _register_more():
    from . import dropout, vector

    _REGISTRY.update(
        {
            "vardrop": dropout.VarDrop,
            "vardrop_exact": dropout.VarDropExact,
            "hardconcrete": dropout.HardConcrete,
            "standout": dropout.Standout,
            "hard_threshold": vector.HardThreshold,
        }
    )


def available() -> list[str]:
    """Names accepted by :func:`get`."""
    return sorted(_REGISTRY)


def get(name, **params):
    """Build a catalog penalty by name, e.g. ``get("logsum", eps=2.0)``.

    An existing :class:`Penalty` is returned unchanged (``params`` must then be empty).
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
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for penalty {name!r}: {exc}") from None


try:  # the dropout-derived and vector penalties (import lazily-failing pieces last)
    _register_more()
    from .dropout import HardConcrete, Standout, VarDrop, VarDropExact  # noqa: F401
    from .vector import HardThreshold  # noqa: F401

    __all__ += ["VarDrop", "VarDropExact", "HardConcrete", "Standout", "HardThreshold"]
except ImportError:  # pragma: no cover - during bootstrap only
    pass
