"""Moved to :mod:`dualdrop.train.experiments.frontier` (split by job: search, storage, runner, evaluation); this name stays so that old imports keep working."""

from dualdrop.train.experiments.frontier import *  # noqa: F401,F403
from dualdrop.train.experiments.frontier import __all__  # noqa: F401
