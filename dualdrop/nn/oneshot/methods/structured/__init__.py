"""Structured one-shot methods by name: one module per method, one line in :data:`METHODS`;
``get_unit_method`` builds one with its options checked and parses ``"penalty:<catalog
name>"`` (the group penalty on any separable catalog penalty)."""

from __future__ import annotations

from .base import UnitMethod, UnitProblem, UnitSolution
from .flap import FLAP
from .magnitude import Magnitude
from .osscar import OSSCAR
from .penalty import GroupLogSum, GroupMCP, GroupPenalty
from .wanda_sp import WandaSP
from .ziplm import ZipLM

#: registry key -> UnitMethod subclass
METHODS: dict[str, type[UnitMethod]] = {
    "magnitude": Magnitude,
    "wanda-sp": WandaSP,
    "flap": FLAP,
    "ziplm": ZipLM,
    "osscar": OSSCAR,
    "penalty": GroupPenalty,
    "logsum": GroupLogSum,
    "mcp": GroupMCP,
}

__all__ = ["METHODS", "UnitMethod", "UnitProblem", "UnitSolution", "available",
           "get_unit_method"]


def available() -> list[str]:
    """The names ``get_unit_method`` accepts (``penalty:<name>`` for the penalty family)."""
    return sorted(METHODS) + ["penalty:<name>"]


def get_unit_method(name, **options) -> UnitMethod:
    """The structured method ``name`` built with ``options`` (a ``ValueError`` names a bad
    one); a :class:`UnitMethod` instance is returned as is (then no options)."""
    if isinstance(name, UnitMethod):
        if options:
            raise ValueError(f"method is an already built {type(name).__name__}; pass its "
                             f"options to its constructor, not {sorted(options)}")
        return name
    if not isinstance(name, str):
        raise TypeError(f"method must be a name (one of {available()}) or a UnitMethod, got "
                        f"{type(name).__name__}")
    if name.startswith("penalty:"):
        penalty = name.split(":", 1)[1]
        if not penalty:
            raise ValueError(f"method={name!r}; expected 'penalty:<catalog name>', e.g. "
                             "'penalty:scad'")
        if "penalty" in options:
            raise ValueError(f"method={name!r} already names the penalty; drop the penalty= "
                             "option")
        return GroupPenalty(penalty=penalty, **options)
    if name not in METHODS:
        raise ValueError(f"method={name!r}; expected one of {available()} for structured "
                         "pruning")
    return METHODS[name](**options)
