"""The one sequence of a one-shot prune: ``run(job, model, calib)``.

Every entry point (``prune_oneshot``, ``prune_structured``, ``dualdrop prune``) checks its
arguments into one ``job.Job`` and hands it here. The sequence, the same for single weights and
for whole units (the two differ only in their steps and their ``prune_step``):

1. **check** what needs the model and the data: the model (a module, no tensor on the meta
   device), the calibration batches (re-iterable, no empty batch, finite), one forward of the
   first batch (a failure named: shape, dtype, device against what the model holds);
2. **discover** the problems (``layers.discover``: prunable layers; ``units.find_units``:
   unit groups with their consumer) and order them by one traced forward; the layers left as
   they are named, with the reason, in a warning and in the report;
3. **allocate** the budget over them, measured on the dense model (the Grams of a
   non-uniform allocation come through the same block pipeline as the pruning);
4. **pipeline**: every problem solved in forward order on the inputs that come through the
   problems solved before it (``pipeline.run``); the weights the pruning may write are copied
   to the CPU first, and put back if anything fails or the run is interrupted;
5. **report**: one ``report.Report`` (weight rows or unit rows) and the result.

Where the weights live is the job's *source* (``sources``), a plug-in of this sequence and of
the pipeline: the model in memory (the default), or a checkpoint read and written block by
block (``prune_oneshot_from_disk``). The source checks the model, orders the steps (a traced
forward of the whole model, or each block's own forward from disk), prepares the pipeline
(blocks, resume record), guards the weights (copies put back on failure, or nothing to put
back) and finishes the run (the pruned checkpoint written).
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import torch

from dualdrop.nn._inputs import forward_failed
from dualdrop.nn.oneshot.allocation.weights import allocate, raise_empty_layers
from dualdrop.nn.oneshot.distributed import context as dist_context
from dualdrop.nn.oneshot.job import Job, check_batches, check_calib
from dualdrop.nn.oneshot.layers import Step, discover
from dualdrop.nn.oneshot.methods.base import Budget, LayerProblem, layer_objective
from dualdrop.nn.oneshot.pipeline import run as run_pipeline, trace
from dualdrop.nn.oneshot.report import OneShotResult, Report, StructuredResult
from dualdrop.nn.oneshot.sources import MemorySource
from dualdrop.nn.oneshot.structured import (UnitStep, capture_dense_inputs, model_inputs,
                                            unit_budget_counts, unit_masks, unit_problem,
                                            warn_skipped_units)
from dualdrop.nn.oneshot.units import ParamCount, find_units
from dualdrop.nn._memory import peak_rss_mb, reset_peak_memory
from dualdrop.nn.oneshot.calibration import calibration_mode, default_forward

_UNREACHED = "not called by the forward of a calibration batch"


def run(job: Job, model, calib):
    """Prune ``model`` in place as ``job`` says, from the calibration data ``calib`` (module
    docstring); a :class:`~dualdrop.nn.oneshot.report.OneShotResult` for single weights, a
    :class:`~dualdrop.nn.oneshot.report.StructuredResult` for units."""
    if not isinstance(job, Job):
        raise TypeError(f"job must be a Job (dualdrop.nn.oneshot.job.make_job), got "
                        f"{type(job).__name__}")
    t_start = time.perf_counter()
    rss_start = reset_peak_memory()
    (job.source or MemorySource()).check_model(model)
    calib = check_calib(calib)
    check_batches(calib)
    if job.what == "weights":
        return _weights(job, model, calib, t_start, rss_start)
    return _units(job, model, calib, t_start, rss_start)


# ---- the shared parts ------------------------------------------------------------------------

def _pruned(model, steps, calib, fwd, prune_step, params, source, **pipe):
    """``pipeline.run`` with ``params`` (the tensors pruning may write) guarded by the source:
    in memory, copied to the CPU first and put back when anything fails or the run is
    interrupted (``sources.MemorySource.guard``)."""
    with source.guard(params):
        return run_pipeline(model, steps, calib, fwd, prune_step, source=source, **pipe)


def _leave_dense_warning(skipped, stacklevel=5) -> None:
    """The layers left dense, in one warning at the user's call (entry -> run -> here)."""
    if skipped:
        warnings.warn("prune_oneshot leaves these weights dense: "
                      + "; ".join(f"{n} ({why})" for n, why in skipped), UserWarning,
                      stacklevel=stacklevel)


def _skipped_text(skipped) -> str:
    return ("; skipped: " + "; ".join(f"{n} ({why})" for n, why in skipped[:6])
            + (" ..." if len(skipped) > 6 else "")) if skipped else ""


def weight_prune_step(meth, budgets: dict):
    """The pipeline's step for weights: each layer of a stage pruned by ``meth`` to its budget
    (``budgets[name]``) from its dense weight and Gram; returns the weights and the seconds each
    took. One home for the memory and the from-disk paths."""
    def prune_step(step: Step, W0s, Gs):
        Ws, secs = [], []
        for name, W0, G in zip(step.names, W0s, Gs):
            t0 = time.perf_counter()
            Ws.append(meth.prune(W0, G, budgets[name]))
            secs.append(time.perf_counter() - t0)
        return Ws, secs
    return prune_step


def first_use_notice(meth, allocation) -> None:
    """Say so on stderr when the method's numba kernels compile now (up to a minute or two on
    the first use after an install): a progress bar standing still looks like a hang. The
    polish's kernels, when the method uses them, start compiling in a second process
    (``methods._ahead``)."""
    from penalties._numba_cache import first_use_notice as notice_of  # lazy: start-up time

    from dualdrop.nn.oneshot.methods._ahead import start as start_ahead  # lazy: start-up time
    from dualdrop.nn.oneshot.methods.polish import KERNELS as POLISH_KERNELS  # lazy: the same

    # (allocation="penalty" announces its own kernels: allocate_penalty knows its penalty)
    kernels = tuple(meth.kernels())
    notice = notice_of(kernels, f"one-shot {meth.name}")
    if notice:
        print(notice, file=sys.stderr, flush=True)
    if any(k in POLISH_KERNELS for k in kernels):
        start_ahead(POLISH_KERNELS)  # the polish's kernels compile in a second process


def collect_grams(model, steps, calib, forward_fn, progress=False, **pipe) -> dict:
    """Every problem's Gram on the model as it is (what a non-uniform allocation measures on
    the dense model), through the same pipeline as the pruning (linear in depth); nothing is
    changed."""
    grams = {}

    def record(step, W0s, Gs):
        grams.update(zip(step.names, Gs))
        return None, [0.0] * len(W0s)

    run_pipeline(model, steps, calib, forward_fn, record, progress=progress,
                 desc="one-shot: the dense model's Grams", **pipe)
    return grams


def _calib_size(calib) -> int | None:
    try:
        return len(calib)
    except TypeError:
        return None


# ---- single weights --------------------------------------------------------------------------

def _weights(job: Job, model, calib, t_start, rss_start) -> OneShotResult:
    meth, fwd = job.meth, job.forward_fn or default_forward
    source = job.source or MemorySource()
    pipe = {"sequential": job.sequential, "blocks": job.blocks,
            "token_mask_fn": job.token_mask_fn, "offload_dir": job.offload_dir,
            "cache_memory_mb": job.cache_memory_mb, "gram_precision": job.gram_precision,
            "dist": dist_context(job.distributed, job.calibration_sharded)}
    kind, value = job.budget
    steps, skipped = discover(model, job.include, job.exclude)
    if kind == "pattern":
        for s in steps:
            for name, W in zip(s.names, s.weights()):
                if W.shape[1] % value[1]:
                    raise ValueError(f"pattern {value[0]}:{value[1]} needs each layer's inputs "
                                     f"to be a multiple of {value[1]}; {name} has "
                                     f"{W.shape[1]} (exclude it, or choose another pattern)")
    if not steps:
        raise ValueError("nothing to prune: the model has no Linear, Conv1d/2d, transformers "
                         "Conv1D or MultiheadAttention layer left after include/exclude"
                         + _skipped_text(skipped))
    steps, unreached = source.order(steps, lambda: trace(model, steps, calib, fwd)[:2])
    skipped += [(s.names[0], _UNREACHED) for s in unreached]
    if not steps:
        raise ValueError("no prunable layer is called by the forward of a calibration batch; "
                         "check calib and forward_fn")
    _leave_dense_warning(skipped)

    # the budgets: per problem, from the allocation on the dense model
    if kind == "pattern":
        budgets = {n: Budget(pattern=value) for s in steps for n in s.names}
    else:
        grams = (collect_grams(model, steps, calib, fwd, job.progress, **pipe)
                 if job.allocation in ("owl", "penalty") else {})
        problems = [LayerProblem(n, W, grams.get(n)) for s in steps
                    for n, W in zip(s.names, s.weights())]
        counts = allocate(problems, value, job.allocation, **job.allocation_options)
        del grams, problems
        budgets = {n: Budget(n_keep=int(counts[n])) for s in steps for n in s.names}
        budgets = raise_empty_layers(budgets, {n: tuple(W.shape) for s in steps
                                               for n, W in zip(s.names, s.weights())},
                                     stacklevel=5)

    prune_step = weight_prune_step(meth, budgets)

    first_use_notice(meth, job.allocation)
    fingerprint = {"method": repr(meth), "target": job.describe, "allocation": job.allocation,
                   "budgets": {n: [b.n_keep, b.pattern] for n, b in budgets.items()},
                   "batches": _calib_size(calib), "gram_precision": job.gram_precision}
    pipe["resume"], pipe["blocks"] = source.prepare(model, steps, job.blocks, fingerprint)
    res = _pruned(model, steps, calib, fwd, prune_step,
                  [p for s in steps for _, p in s.parameters()], source,
                  progress=job.progress, desc=f"one-shot {meth.name}{source.where}",
                  checkpoint_dir=job.checkpoint_dir, fingerprint=fingerprint, **pipe)
    if res.unreached:
        names = [s.names[0] for s in res.unreached]
        skipped += [(n, _UNREACHED) for n in names]
        warnings.warn(f"prune_oneshot leaves these weights dense: {names} ({_UNREACHED})",
                      UserWarning, stacklevel=4)
        reached = {id(s) for s in steps} - {id(s) for s in res.unreached}
        steps = [s for s in steps if id(s) in reached]
    masks = {name: (p.detach() != 0) for s in steps for name, p in s.parameters()}
    cpu = next(model.parameters()).device.type in ("cpu", "meta")  # meta: read from disk
    report = Report(method=repr(meth), allocation=job.allocation, target=job.describe,
                    layers=res.rows, skipped=skipped, seconds=time.perf_counter() - t_start,
                    peak_mb=max([r["peak_mb"] for r in res.rows]
                                + ([peak_rss_mb()] if cpu else [])),
                    start_mb=rss_start if cpu else 0.0,
                    pipeline={"mode": res.mode, "blocks": res.blocks,
                              "block_info": res.block_info})
    source.finish(report)
    return OneShotResult(model, report, masks)


# ---- whole units -----------------------------------------------------------------------------

def _check_forward(model, batch, fwd) -> None:
    """One forward of the first calibration batch, its failure named (``_inputs``)."""
    with calibration_mode(model):
        try:
            fwd(model, batch)
        except Exception as e:  # noqa: BLE001 - the user's data or forward_fn: one message
            raise forward_failed(e, model, batch, "the first calibration batch") from e


def _units(job: Job, model, calib, t_start, rss_start) -> StructuredResult:
    meth, fwd = job.meth, job.forward_fn or default_forward
    pipe = {"sequential": job.sequential, "blocks": job.blocks,
            "token_mask_fn": job.token_mask_fn, "gram_precision": job.gram_precision}
    first = next(iter(calib))
    _check_forward(model, first, fwd)
    groups, skipped = find_units(model, first, fwd, job.granularity, job.include, job.exclude)
    if not groups:
        raise ValueError(f"no {' / '.join(job.granularity)} units to prune in this model"
                         + (": " + "; ".join(f"{n} ({w})" for n, w in skipped[:4])
                            if skipped else "") + " (check granularity and include/exclude)")
    steps = [UnitStep(g) for g in groups]
    steps, unreached, _ = trace(model, steps, calib, fwd)
    skipped += [(s.names[0], _UNREACHED) for s in unreached]
    groups = [s.group for s in steps]
    if not groups:
        raise ValueError("no unit group's consumer is called by the forward of a calibration "
                         "batch; check calib and forward_fn")
    warn_skipped_units(skipped)

    n_params = sum(p.numel() for p in model.parameters())
    counter = ParamCount(groups)

    def grams():
        return collect_grams(model, steps, calib, fwd, job.progress, **pipe)

    counts, desc, table, measured = unit_budget_counts(job, model, groups, steps, first, fwd,
                                                       counter, n_params, grams)
    if job.target == "dense":
        capture_dense_inputs(model, steps, calib, fwd, job.token_mask_fn)

    info_rows: dict[str, dict] = {}

    def prune_step(step: UnitStep, W0s, Gs):
        t0 = time.perf_counter()
        g = step.group
        problem = unit_problem(g, W0s[0], Gs[0], job.bias_compensation)
        sol = meth.solve(problem, counts[g.name])
        removed = np.setdiff1d(np.arange(g.n_units), sol.kept)
        g.zero_parts(removed)
        W = torch.from_numpy(sol.W)
        p = W.shape[1]
        b = W0s[0][:, p].cpu() if sol.b is None else torch.from_numpy(sol.b)
        parts = [W, b[:, None]] + ([torch.zeros_like(W)] if step.dense is not None else [])
        W_aug = torch.cat(parts, 1).to(W0s[0].device)
        step.dense = None if step.dense is None else []   # its rows are no longer needed
        info_rows[g.name] = {"kept_units": sol.kept, "info": sol.info,
                             "objective": layer_objective(W_aug, W0s[0], Gs[0])}
        return [W_aug], [time.perf_counter() - t0]

    res = _pruned(model, steps, calib, fwd, prune_step,
                  [p for g in groups for _, p in g.parameters()], MemorySource(),
                  progress=job.progress, desc=f"structured {meth.name}", **pipe)
    secs = {r["layer"]: r["seconds"] for r in res.rows}
    layers, units = [], {}
    for g in groups:
        ir = info_rows[g.name]
        units[g.name] = [int(u) for u in ir["kept_units"]]
        layers.append({"layer": g.name, "kind": g.kind, "units": g.n_units,
                       "kept": len(units[g.name]), "objective": ir["objective"],
                       "seconds": secs.get(g.name, 0.0), "info": ir["info"]})
    kept = {n: len(u) for n, u in units.items()}
    report = Report(
        method=repr(meth), allocation=job.allocation, target=desc, layers=layers,
        skipped=skipped, what="units", params_before=n_params,
        params_after=int(n_params - counter.removed(kept)), prunable=int(counter.prunable()),
        predicted_speedup=table.speedup(kept) if table else None, measured_speedup=measured,
        seconds=time.perf_counter() - t_start, peak_mb=peak_rss_mb(), start_mb=rss_start)
    return StructuredResult(model, report, unit_masks(groups), units=units, groups=groups,
                            example_inputs=model_inputs(first) if job.forward_fn is None
                            else None, latency=table)
