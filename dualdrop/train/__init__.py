"""Training for network sparsification: LeNet-300-100, the loop, comparisons.

- :func:`lenet_300_100`: the network (input size from the data).
- :class:`TrainConfig`, :func:`train`: one method, checkpointed every epoch, exact resume,
  ``torchrun`` data parallel.
- :func:`run_comparison`, :func:`plot_comparison`, :func:`comparison_table`: several methods, the
  seed's Figure 2 and its table.
"""

from dualdrop.train.compare import (
    SEED_TABLE,
    comparison_table,
    load_runs,
    plot_comparison,
    run_comparison,
)
from dualdrop.train.loop import (
    TrainConfig,
    available_methods,
    check_method,
    epoch_order,
    error_rate,
    resolve_hparams,
    train,
)
from dualdrop.train.models import LeNet300100, lenet_300_100

__all__ = [
    "SEED_TABLE", "LeNet300100", "TrainConfig", "available_methods", "check_method",
    "comparison_table", "epoch_order", "error_rate", "lenet_300_100", "load_runs",
    "plot_comparison", "resolve_hparams", "run_comparison", "train",
]
