"""The one-shot methods by name, of single weights (:data:`METHODS`, ``get_method``) and of whole
units (:data:`UNIT_METHODS`, ``get_unit_method``): one line per method; both build a method with
its options checked through :func:`_build`, the only parser of ``"penalty:<catalog name>"``
(the duality's penalty methods on any separable penalty of the ``penalties`` catalog: one weight
at a time, or the group penalty on the units' norms)."""

from __future__ import annotations

from dualdrop.nn.oneshot.methods.admm import ADMM
from dualdrop.nn.oneshot.methods.base import OneShotMethod
from dualdrop.nn.oneshot.methods.magnitude import Magnitude
from dualdrop.nn.oneshot.methods.penalty import MCP, HardConcrete, LogSum, Penalty, VarDrop
from dualdrop.nn.oneshot.methods.polish import Polish
from dualdrop.nn.oneshot.methods.sparsegpt import SparseGPT
from dualdrop.nn.oneshot.methods.structured import METHODS as UNIT_METHODS
from dualdrop.nn.oneshot.methods.structured import UnitMethod
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
    return _names(METHODS)


def unit_methods() -> list[str]:
    """The method names ``get_unit_method`` accepts (``penalty:<name>``: the group penalty)."""
    return _names(UNIT_METHODS)


def _names(table) -> list[str]:
    names = sorted(table)
    if "penalty" in table:
        names.append("penalty:<name>")
    return names


def get_method(name, **options) -> OneShotMethod:
    """The method ``name`` built with ``options`` (checked: a ``ValueError`` names a bad one).

    ``name`` may also be a :class:`OneShotMethod` instance (returned as is; then no options), or
    ``"penalty:<catalog name>"``: the ``penalty`` method on that penalty
    (``get_method("penalty:scad", a=3.7)`` is ``get_method("penalty", penalty="scad", a=3.7)``).
    """
    return _build(name, options, METHODS, OneShotMethod, "")


def get_unit_method(name, **options) -> UnitMethod:
    """The structured method ``name`` built with ``options`` (a ``ValueError`` names a bad
    one); a :class:`UnitMethod` instance is returned as is (then no options);
    ``"penalty:<catalog name>"`` is the group penalty on that penalty."""
    return _build(name, options, UNIT_METHODS, UnitMethod, " for structured pruning")


def _build(name, options: dict, table: dict, base: type, where: str):
    """``table[name](**options)``, a ``base`` instance as is, or ``"penalty:<name>"`` parsed."""
    if isinstance(name, base):
        if options:
            raise ValueError(f"method is an already built {type(name).__name__}; pass its "
                             f"options to its constructor, not {sorted(options)}")
        return name
    if not isinstance(name, str):
        raise TypeError(f"method must be a name (one of {_names(table)}) or a "
                        f"{base.__name__}, got {type(name).__name__}")
    if name.startswith("penalty:"):
        penalty = name.split(":", 1)[1]
        if "penalty" not in table:
            raise ValueError(f"method={name!r}: the penalty methods are not available in this "
                             f"version; available: {_names(table)}")
        if not penalty:
            raise ValueError(f"method={name!r}; expected 'penalty:<catalog name>', e.g. "
                             "'penalty:scad'")
        if "penalty" in options:
            raise ValueError(f"method={name!r} already names the penalty; drop the penalty= "
                             "option")
        return table["penalty"](penalty=penalty, **options)
    if name not in table:
        raise ValueError(f"method={name!r}; expected one of {_names(table)}{where}")
    return table[name](**options)
