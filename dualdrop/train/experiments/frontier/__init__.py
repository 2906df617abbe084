"""The accuracy–sparsity frontier of each method, chosen on validation data only.

One trained network is one point ``(error, fraction of nonzero weights)``; a method is better
described by the set of points it can reach. For a method ``m`` with a sparsity knob ``theta``
(the regularization weight ``lam`` of the penalty methods, the KL weight of variational dropout,
the target sparsity of magnitude pruning), a start ``s`` (random or from a dense network) and,
when the method prunes by a keep-ratio tolerance, the test-time ``tol``, the candidates are

    P_m = { (E_val(theta, s, tol), rho(theta, s, tol)) },

``E_val`` the validation error and ``rho`` the fraction of nonzero weights (biases excluded). The
frontier is the Pareto set of ``P_m`` for minimizing both,

    F_m = { p in P_m : no q in P_m has E_val(q) <= E_val(p), rho(q) <= rho(p), q != p },

and only its members are evaluated on the test set, once each. Choosing among trained networks
by test error would make the reported test error an optimistically biased estimate (the
selection would fit the test set); the validation split is the 20% of the training set held out
by :func:`dualdrop.train.train`.

How it runs:

- every trial trains one network with :func:`dualdrop.train.train` into
  ``OUT/trials/<method>/<trial-id>/`` (the folder of an ordinary ``dualdrop sparsify`` run; the
  trial id spells its knob value and start, e.g. ``lam=0.00316-warm``), so a trial is
  inspectable and resumable on its own. The tolerance is swept after training on the validation
  split (``final.json["val_tol_sweep"]``), without retraining: one trial gives several candidates.
- the trials of each method form a multi-objective Optuna study (objectives: validation error and
  fraction nonzero at the trained tolerance) in a journal file, ``OUT/study.journal``, which Optuna
  recommends for several processes sharing one file (on one machine, or several machines on a
  shared file system); start the command again, or with ``workers > 1``, to add processes. The
  default sampler is Optuna's scrambled Sobol (QMC) sequence: with a one-dimensional knob the goal
  is even coverage of its log range, which a low-discrepancy sequence gives with few trials.
- a trial whose process was killed is detected (same host: its process id is gone; any host: its
  heartbeat file is older than ``stale_after`` seconds), marked failed and re-queued with the same
  parameters; the new trial trains into the same folder and resumes from its last checkpoint.
  Trials that diverge are recorded as failed, with the error, and listed in the report.
- :func:`train` also writes the test error of every trial into its ``final.json``; the frontier
  never reads it (nor ``selected_tol`` or ``exported_test_error``): the test error of a frontier
  point is computed here from the trial's checkpoint at the point's tolerance, once, and cached in
  ``OUT/test_errors.json``.


Outputs: ``frontier.png``/``frontier.pdf`` (test error vs fraction nonzero, log x, one line per
method through its frontier; on MNIST also the paper's table, the published points and the goal
boxes), ``frontier.md`` and ``frontier.csv``.

One module per job: :mod:`~dualdrop.train.experiments.frontier.search` (the knob, the Pareto
set), :mod:`~dualdrop.train.experiments.frontier.storage` (the Optuna journal, heartbeats, stale
trials), :mod:`~dualdrop.train.experiments.frontier.runner` (the workers and one trial),
:mod:`~dualdrop.train.experiments.frontier.evaluation` (the test errors of the selected points
and the report), :mod:`~dualdrop.train.experiments.frontier.runs` (the frontier of finished
runs over seeds, ``dualdrop frontier --from-runs``); figures and tables in
:mod:`dualdrop.train.report`.
"""

from dualdrop.train.experiments.compare import DEFAULT_METHODS
from dualdrop.train.experiments.frontier.evaluation import TEST_CACHE, collect, frontier_report
from dualdrop.train.experiments.frontier.runner import run_frontier
from dualdrop.train.experiments.frontier.search import (
    TARGET_DENSITY,
    Knob,
    default_knob,
    method_slug,
    pareto_front,
    target_density_knob,
    validation_points,
)
from dualdrop.train.experiments.frontier.storage import JOURNAL, open_storage, requeue_stale
from dualdrop.train.report.figures import plot_frontier
from dualdrop.train.report.references import GOALS, PUBLISHED_POINTS, reference_rows
from dualdrop.train.report.tables import frontier_table

__all__ = ["DEFAULT_METHODS", "GOALS", "JOURNAL", "Knob", "PUBLISHED_POINTS", "TARGET_DENSITY",
           "TEST_CACHE", "target_density_knob",
           "collect", "default_knob", "frontier_report", "frontier_table", "method_slug",
           "open_storage", "pareto_front", "plot_frontier", "reference_rows", "requeue_stale",
           "run_frontier", "validation_points"]
