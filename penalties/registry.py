"""The catalog by name: ``get(name, **params)`` and ``available()``, the one place a penalty
name is parsed (the package and its curves both build penalties through it)."""

from __future__ import annotations

import difflib
import inspect

from .base import Penalty
from .catalog import L1, MCP, SCAD, Log2Sum, LogSum, Lp
from .dropout import HardConcrete, Standout, VarDrop, VarDropExact
from .vector import HardThreshold

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
