"""The one-shot methods by name: one line per method in :data:`METHODS`; ``get_method`` builds one
with its options checked, and is the only parser of ``"penalty:<catalog name>"`` (the duality's
penalty methods on any separable penalty of the ``penalties`` catalog)."""

from __future__ import annotations

from dualdrop.nn.oneshot.methods.admm import ADMM
from dualdrop.nn.oneshot.methods.base import OneShotMethod
from dualdrop.nn.oneshot.methods.magnitude import Magnitude
from dualdrop.nn.oneshot.methods.penalty import MCP, HardConcrete, LogSum, Penalty, VarDrop
from dualdrop.nn.oneshot.methods.polish import Polish
from dualdrop.nn.oneshot.methods.sparsegpt import SparseGPT
from dualdrop.nn.oneshot.methods.wanda import Wanda

#: registry key -> OneShotMethod subclass
METHODS: dict[str, type[OneShotMethod]] = {
    "magnitude": Magnitude,
    "wanda": Wanda,
    "sparsegpt": SparseGPT,
    "admm": ADMM,
    "penalty": Penalty,
    "logsum": LogSum,
    "mcp": MCP,
    "vardrop": VarDrop,
    "hardconcrete": HardConcrete,
    "polish": Polish,
}


def available() -> list[str]:
    """The method names ``get_method`` accepts (``penalty:<name>`` for the penalty family)."""
    names = sorted(METHODS)
    if "penalty" in METHODS:
        names.append("penalty:<name>")
    return names


def get_method(name, **options) -> OneShotMethod:
    """The method ``name`` built with ``options`` (checked: a ``ValueError`` names a bad one).

    ``name`` may also be a :class:`OneShotMethod` instance (returned as is; then no options), or
    ``"penalty:<catalog name>"``: the ``penalty`` method on that penalty
    (``get_method("penalty:scad", a=3.7)`` is ``get_method("penalty", penalty="scad", a=3.7)``).
    """
    if isinstance(name, OneShotMethod):
        if options:
            raise ValueError(f"method is an already built {type(name).__name__}; pass its "
                             f"options to its constructor, not {sorted(options)}")
        return name
    if not isinstance(name, str):
        raise TypeError(f"method must be a name (one of {available()}) or a OneShotMethod, "
                        f"got {type(name).__name__}")
    if name.startswith("penalty:"):
        penalty = name.split(":", 1)[1]
        if "penalty" not in METHODS:
            raise ValueError(f"method={name!r}: the penalty methods are not available in this "
                             f"version; available: {available()}")
        if not penalty:
            raise ValueError(f"method={name!r}; expected 'penalty:<catalog name>', e.g. "
                             "'penalty:scad'")
        if "penalty" in options:
            raise ValueError(f"method={name!r} already names the penalty; drop the penalty= "
                             "option")
        return METHODS["penalty"](penalty=penalty, **options)
    if name not in METHODS:
        raise ValueError(f"method={name!r}; expected one of {available()}")
    return METHODS[name](**options)
