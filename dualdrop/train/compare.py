"""Moved to :mod:`dualdrop.train.experiments.compare` (the experiments live in dualdrop.train.experiments); this name stays so that old imports keep working."""

from dualdrop.train.experiments.compare import *  # noqa: F401,F403
from dualdrop.train.experiments.compare import __all__  # noqa: F401
