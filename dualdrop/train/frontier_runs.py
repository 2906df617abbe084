"""Moved to :mod:`dualdrop.train.experiments.frontier.runs` (one of the frontier's modules); this name stays so that old imports keep working."""

from dualdrop.train.experiments.frontier.runs import *  # noqa: F401,F403
from dualdrop.train.experiments.frontier.runs import __all__  # noqa: F401
