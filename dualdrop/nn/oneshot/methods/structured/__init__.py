"""Structured one-shot methods by name: one module per method, one line in :data:`METHODS`;
``dualdrop.nn.oneshot.registry.get_unit_method`` builds one with its options checked (and
parses ``"penalty:<catalog name>"``: the group penalty on any separable catalog penalty)."""

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

__all__ = ["METHODS", "UnitMethod", "UnitProblem", "UnitSolution"]
