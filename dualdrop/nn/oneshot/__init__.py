"""One-shot pruning of a trained network from calibration data (docs/oneshot.md)::

    from dualdrop.nn import prune_oneshot
    res = prune_oneshot(model, calib_images, "sparsegpt", target_density=0.1)
    print(res.report)                  # per layer: density, layer objective, seconds, memory

Each prunable layer's problem is ``(W0, G)``: its dense weight and the Gram ``G = X^T X / n`` of
its calibration inputs (``methods.base``); a method (``registry``) turns it into a sparse weight
under a budget (a number of nonzeros, or an N:M pattern). Every entry point (``entry``:
``prune_oneshot``, ``prune_structured``; the CLI's ``dualdrop prune``) checks its arguments into
one ``job.Job`` and runs it with ``run.run`` (``run_job``): discover, allocate, the block pipeline
(``pipeline``: one block at a time over the calibration data, from disk if need be:
``prune_oneshot_from_disk``), the weights put back on failure, one ``report.Report``.
``prune_oneshot(..., granularity="neuron" | "head" | "channel")`` (``prune_structured``)
removes whole units instead, for a smaller, faster model.
"""

from dualdrop.nn.oneshot.allocation.weights import ALLOCATIONS, allocate
from dualdrop.nn.oneshot.from_disk import prune_oneshot_from_disk
from dualdrop.nn.oneshot.entry import prune_oneshot, prune_structured
from dualdrop.nn.oneshot.job import Job, make_job
from dualdrop.nn.oneshot.methods.base import Budget, LayerProblem, OneShotMethod, layer_objective
from dualdrop.nn.oneshot.registry import METHODS, available, get_method
from dualdrop.nn.oneshot.report import (OneShotReport, OneShotResult, Report, StructuredReport,
                                        StructuredResult)
from dualdrop.nn.oneshot.run import run as run_job

__all__ = ["prune_oneshot", "prune_oneshot_from_disk", "OneShotResult", "OneShotReport",
           "Report", "Budget", "LayerProblem", "OneShotMethod", "layer_objective", "METHODS",
           "available", "get_method", "ALLOCATIONS", "allocate", "prune_structured",
           "StructuredResult", "StructuredReport", "Job", "make_job", "run_job"]
