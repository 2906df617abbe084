"""Experiments built on the training loop: each trains many runs and reports on them.

- :mod:`~dualdrop.train.experiments.compare`: several methods (and seeds) side by side, the
  paper's Figure 2 and table (``dualdrop compare``).
- :mod:`~dualdrop.train.experiments.frontier`: each method's accuracy–sparsity frontier, chosen
  on validation data only: an Optuna sweep of its sparsity knob, or the test-time tolerance of
  finished runs over seeds (``dualdrop frontier``).

Experiments call :func:`dualdrop.train.train` for every run and :mod:`dualdrop.train.report` for
their figures and tables; nothing below them imports them.
"""
