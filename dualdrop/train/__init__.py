"""Training for network sparsification: LeNet-300-100, the loop, comparisons.

- :func:`lenet_300_100`: the network (input size from the data).
- :class:`TrainConfig`, :func:`train`: one method, checkpointed every epoch, exact resume,
  ``torchrun`` data parallel. One job per module: :mod:`~dualdrop.train.config` (the run's
  configuration and hyperparameters), :mod:`~dualdrop.train.distributed` (``torchrun``),
  :mod:`~dualdrop.train.checkpoint` (run files, exact resume), :mod:`~dualdrop.train.evaluate`
  (errors, densities, tolerances), :mod:`~dualdrop.train.export` (the trained network,
  :func:`load_run`), :mod:`~dualdrop.train.loop` (the loop),
  :mod:`~dualdrop.train.command` (the command line of a run, rebuilt from its configuration).
- :func:`fit` (:mod:`~dualdrop.train.engine`): any model, any DataLoader, a target density,
  atomic checkpoints and exact resume; :mod:`~dualdrop.train.callbacks` for PyTorch Lightning
  and ``transformers.Trainer``.
- :func:`heal` (:mod:`~dualdrop.train.heal`): a pruned model trained by distillation from the
  dense one, masks and widths held; :func:`prune_heal`: prune and heal in rounds.
- :mod:`~dualdrop.train.experiments`: many runs, one question each: :func:`run_comparison`
  (several methods, the paper's Figure 2 and its table; LeJeune, Javadi, Baraniuk, NeurIPS 2021)
  and the accuracy–sparsity frontier (:mod:`~dualdrop.train.experiments.frontier`).
- :mod:`~dualdrop.train.report`: the figures and tables of the experiments
  (:func:`plot_comparison`, :func:`comparison_table`, the frontier's and the diagnostics').
"""

from dualdrop.train.engine import EpochHooks, FitResult, fit
from dualdrop.train.heal import HealResult, heal
from dualdrop.train.heal_schedule import PruneHealResult, prune_heal
from dualdrop.train.config import TrainConfig, available_methods, check_method, resolve_hparams
from dualdrop.train.evaluate import error_rate
from dualdrop.train.experiments.compare import load_runs, run_comparison
from dualdrop.train.export import load_run
from dualdrop.train.loop import epoch_order, train
from dualdrop.train.models import LeNet300100, lenet_300_100
from dualdrop.train.report import PAPER_TABLE, comparison_table, plot_comparison

__all__ = [
    "EpochHooks", "FitResult", "PAPER_TABLE", "LeNet300100", "TrainConfig", "available_methods", "check_method",
    "comparison_table", "epoch_order", "error_rate", "lenet_300_100", "load_run", "load_runs",
    "fit", "heal", "HealResult", "prune_heal", "PruneHealResult", "plot_comparison",
    "resolve_hparams", "run_comparison", "train",
]
