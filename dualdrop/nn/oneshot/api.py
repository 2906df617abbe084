"""``prune_oneshot``: prune a trained network once, from calibration data (docs/oneshot.md).

Everything is checked before the model is touched (the method and its options, the budget, the
allocation, the layers, the calibration data, one forward of its first batch): a refused call
leaves the model as given, and a failure during the walk puts every weight back.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from dualdrop.nn.oneshot.depth import DEPTH_REFUSES, prune_depth
from dualdrop.nn.oneshot.allocation import allocate, check_allocation
from dualdrop.nn.oneshot.distributed import context as dist_context
from dualdrop.nn.oneshot.layers import Step, discover
from dualdrop.nn.oneshot.methods.base import Budget, LayerProblem, OneShotMethod, parse_pattern
from dualdrop.nn.oneshot.registry import get_method
from dualdrop.nn.oneshot.pipeline import SEQUENTIAL, run as run_pipeline
from dualdrop.nn.oneshot.walker import (PRECISIONS, calibration_mode, default_forward,
                                        peak_rss_mb, reset_peak_memory, trace)
from dualdrop.nn.sparsifier import Sparsifier, sparsify
from penalties.checks import check_float

#: rows per calibration batch when ``calib`` is one tensor
CALIB_BATCH = 128

#: the magnitude-pruning hyperparameters that hold the masks while fine-tuning: no schedule
#: (target sparsity 0 keeps every weight still alive; pruned weights never regrow)
HOLD_HPARAMS = {"sparsity": 0.0}


@dataclass
class OneShotReport:
    """What ``prune_oneshot`` did, one row per pruned problem (``layers``) and the totals.

    A row: ``layer``, ``kind`` (linear, conv, hf_conv1d, mha_in, mha_out), ``shape`` (out, in),
    ``rows`` (of its calibration input ``X``: samples, tokens or image patches), ``kept`` and
    ``density`` (nonzeros of the pruned weight), ``objective`` (the layer objective
    ``||X (W - W0)^T||^2 / ||X W0^T||^2`` on the layer's calibration inputs, which come through
    the layers pruned before it), ``seconds``, ``gram_mb`` and ``peak_mb`` (the process's peak
    resident memory since the call began, or the GPU's peak allocation in the step). Totals:
    ``seconds`` (the whole call), ``peak_mb`` and ``start_mb`` (the resident memory when the
    call began: the model, the data, the libraries; ``peak_mb - start_mb`` is what pruning
    added)."""

    method: str
    allocation: str
    target: str
    layers: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    seconds: float = 0.0
    peak_mb: float = 0.0
    start_mb: float = 0.0
    pipeline: dict = field(default_factory=dict)

    @property
    def density(self) -> float:
        """Fraction of nonzero weights over the pruned layers."""
        total = sum(r["shape"][0] * r["shape"][1] for r in self.layers)
        return sum(r["kept"] for r in self.layers) / total if total else 1.0

    def objectives(self) -> dict[str, float]:
        return {r["layer"]: r["objective"] for r in self.layers}

    def to_dict(self) -> dict:
        return {"method": self.method, "allocation": self.allocation, "target": self.target,
                "density": self.density, "seconds": self.seconds, "peak_mb": self.peak_mb,
                "start_mb": self.start_mb, "pipeline": dict(self.pipeline),
                "layers": [dict(r) for r in self.layers],
                "skipped": [list(s) for s in self.skipped]}

    def format(self) -> str:
        """The report as a plain-text table."""
        head = (f"one-shot {self.method}, {self.target}, allocation {self.allocation}: density "
                f"{self.density:.4f}, {self.seconds:.2f} s, peak {self.peak_mb:.0f} MB "
                f"({self.peak_mb - self.start_mb:+.0f} MB over the start)")
        if self.pipeline.get("mode") == "block":
            head += (f"; block by block over {self.pipeline['blocks']} "
                     f"({len(self.pipeline.get('block_info', []))} blocks)")
        w = max([len(r["layer"]) for r in self.layers] + [5])
        lines = [head, f"{'layer':<{w}}  {'shape':>11}  {'density':>8}  {'objective':>10}  "
                       f"{'seconds':>8}"]
        for r in self.layers:
            shape = "x".join(str(s) for s in r["shape"])
            lines.append(f"{r['layer']:<{w}}  {shape:>11}  {r['density']:>8.4f}  "
                         f"{r['objective']:>10.4g}  {r['seconds']:>8.3f}")
        for name, why in self.skipped:
            lines.append(f"{name:<{w}}  left dense: {why}")
        return "\n".join(lines)

    def __str__(self):
        return self.format()


@dataclass
class OneShotResult:
    """The pruned ``model`` (the same object, exact zeros in its weights), its ``report``, and
    ``masks``: ``{parameter name: bool tensor}`` of the kept weights, in the parameter's layout.

    Fine-tune with the masks held: ``sp = result.sparsify()`` puts magnitude pruning's 0/1
    masks on the pruned weights, with no schedule (``HOLD_HPARAMS``), so a pruned weight stays
    0 whatever the optimizer does; then your own loop (``sp.after_step(opt, step, total)`` after
    each step) or ``dualdrop.train.fit(model, "magnitude", loader, loss_fn, epochs=1,
    hparams=result.hparams)``."""

    model: nn.Module
    report: OneShotReport
    masks: dict

    @property
    def hparams(self) -> dict:
        """Magnitude pruning's hyperparameters that hold the masks (pass them to ``fit``)."""
        return dict(HOLD_HPARAMS)

    def sparsify(self, **kwargs) -> Sparsifier:
        """``dualdrop.nn.sparsify(model, "magnitude")`` on the pruned weights, its masks set to
        the one-shot masks and held (``kwargs`` go to ``sparsify``, e.g. ``example_inputs``)."""
        for k in ("include", "exclude", "target_density"):
            if k in kwargs:
                raise ValueError(f"{k}= is fixed by the one-shot masks; leave it out")
        sp = sparsify(self.model, "magnitude", include=list(self.masks), **HOLD_HPARAMS,
                      **kwargs)
        with torch.no_grad():
            for target, state in sp.states():
                mask = next(self.masks[a] for a in target.aliases if a in self.masks)
                state.weight_mask.copy_(mask.to(state.weight_mask))
        return sp


def _first_use_notice(meth, allocation):
    """Say so on stderr when the method's numba kernels compile now (up to a minute or two on
    the first use after an install): a progress bar standing still looks like a hang."""
    from penalties._numba_cache import first_use_notice

    from dualdrop.linear.solvers import gram_cd

    kernels = (*meth.kernels(), *(gram_cd.KERNELS if allocation == "penalty" else ()))
    notice = first_use_notice(kernels, f"one-shot {meth.name}")
    if notice:
        print(notice, file=sys.stderr, flush=True)


def _check_calib(calib):
    if isinstance(calib, torch.Tensor):
        if calib.dim() == 0 or calib.shape[0] == 0:
            raise ValueError("calib is an empty tensor; pass calibration samples along dim 0")
        return list(calib.split(CALIB_BATCH))
    if isinstance(calib, Iterator) or calib is None or isinstance(calib, (str, bytes)):
        raise TypeError("calib must be re-iterable (read once per layer): a tensor of samples, "
                        "a list of batches or a DataLoader, not "
                        f"{type(calib).__name__}; e.g. list(your_batches)")
    try:
        iter(calib)
    except TypeError:
        raise TypeError(f"calib must be a tensor, a list of batches or a DataLoader, got "
                        f"{type(calib).__name__}") from None
    return calib


def _check_finite(calib) -> None:
    """Refuse calibration batches with NaN or infinite values (they would reach every Gram)."""
    for b, batch in enumerate(calib):
        items = (batch.items() if isinstance(batch, dict) else
                 enumerate(batch) if isinstance(batch, (tuple, list)) else [(None, batch)])
        for key, t in items:
            if isinstance(t, torch.Tensor) and t.is_floating_point() \
                    and not bool(torch.isfinite(t).all()):
                where = f"batch {b}" + (f", {key!r}" if key is not None else "")
                raise ValueError(f"calib has NaN or infinite values ({where}); clean the "
                                 "calibration data (every value reaches the layers' Grams)")


def _check_pipeline_options(sequential, blocks, token_mask_fn, offload_dir, cache_memory_mb,
                            gram_precision, checkpoint_dir):
    if sequential not in SEQUENTIAL:
        raise ValueError(f"sequential={sequential!r}; expected one of {list(SEQUENTIAL)}")
    if sequential == "layer" and blocks is not None:
        raise ValueError("blocks= chooses the blocks of sequential='block'; drop it or use "
                         "sequential='auto'/'block'")
    if blocks is not None and not isinstance(blocks, (str, list, tuple)):
        raise TypeError(f"blocks must be a container's name (e.g. 'transformer.h') or a list "
                        f"of module names, got {type(blocks).__name__}")
    if token_mask_fn is not None and not callable(token_mask_fn):
        raise TypeError("token_mask_fn must be callable as token_mask_fn(batch) -> a bool "
                        "(batch, tokens) tensor of the real tokens")
    for name, v in (("offload_dir", offload_dir), ("checkpoint_dir", checkpoint_dir)):
        if v is not None and not isinstance(v, (str, os.PathLike)):
            raise TypeError(f"{name} must be a folder path, got {type(v).__name__}")
        if v is not None and os.path.exists(v) and not os.path.isdir(v):
            raise ValueError(f"{name}={os.fspath(v)!r} is a file, not a folder")
    if cache_memory_mb is not None:
        if offload_dir is None:
            raise ValueError("cache_memory_mb limits the activation cache kept in memory; the "
                             "rest goes to offload_dir, so give offload_dir too")
        check_float("cache_memory_mb", cache_memory_mb, low=0.0)
    if gram_precision not in PRECISIONS:
        raise ValueError(f"gram_precision={gram_precision!r}; expected one of "
                         f"{list(PRECISIONS)}")


def _raise_empty_layers(budgets: dict, sizes: dict) -> dict:
    """A density budget that rounds a layer down to no weight at all is raised to one weight
    per output row of it (an emptied layer cuts the network), with a warning naming it."""
    emptied = [n for n, b in budgets.items() if b.n_keep == 0 and sizes[n][0] * sizes[n][1]]
    if emptied:
        for n in emptied:
            budgets[n] = Budget(n_keep=min(sizes[n][0], sizes[n][0] * sizes[n][1]))
        warnings.warn(f"the budget rounds {len(emptied)} layer(s) to no weight at all, which "
                      f"would cut the network: {emptied[:5]}{' ...' if len(emptied) > 5 else ''}"
                      " keep one weight per output row instead (raise target_density to keep "
                      "more)", UserWarning, stacklevel=3)
    return budgets


def _budget_spec(target_density, pattern):
    if (target_density is None) == (pattern is None):
        raise ValueError("give exactly one of target_density=D (fraction of weights kept, e.g. "
                         "0.1) and pattern='N:M' (e.g. '2:4')")
    if pattern is not None:
        return None, parse_pattern(pattern)
    return check_float("target_density", target_density, low=0.0, high=1.0, low_open=True), None


def prune_oneshot(model: nn.Module, calib, method=None, target_density: float | None = None,
                  pattern=None, allocation: str | None = None, *, options: dict | None = None,
                  refit: bool | None = None, allocation_options: dict | None = None,
                  forward_fn=None, include=None, exclude=None, progress: bool = True,
                  sequential: str = "auto", blocks=None, token_mask_fn=None, offload_dir=None,
                  cache_memory_mb: float | None = None, gram_precision: str = "auto",
                  checkpoint_dir=None, distributed: bool | None = None, granularity=None,
                  target_params: int | None = None, target_speedup: float | None = None,
                  bias_compensation: bool | None = None, latency_inputs=None,
                  latency_options: dict | None = None):
    """Prune the trained ``model`` once, in place, from the calibration data ``calib``.

    ``granularity=None`` (or ``"weight"``) prunes single weights (below); ``"neuron"``,
    ``"head"``, ``"channel"`` or several (``("head", "neuron")``) remove whole units and return
    what :func:`~dualdrop.nn.oneshot.structured.prune_structured` returns (a
    ``StructuredResult``, ``res.compact()`` the smaller model): ``method`` one of its methods
    (default ``"osscar"``), the budget ``target_density`` (of the prunable parameters),
    ``target_params`` or ``target_speedup`` (measured: ``latency_inputs``,
    ``latency_options``), ``allocation`` ``"penalty"`` (the default for units) / ``"uniform"`` /
    ``"flap"``,
    ``bias_compensation`` (default True); docs/oneshot.md "Smaller and faster: structured
    one-shot". The arguments of the other kind (``pattern=``, the activation cache on disk,
    ``checkpoint_dir``, ``distributed=True`` for units; the unit budgets for weights) are
    refused with a ``ValueError`` naming them.

    Layers (Linear, Conv1d/2d, transformers' Conv1D, MultiheadAttention's projections; others
    are named in a warning and left dense) are pruned in forward order, each on the inputs that
    come through the layers already pruned (``walker``), by ``method`` (``registry``: magnitude,
    wanda, sparsegpt (the default), and the optimization methods; or a ``OneShotMethod``
    instance) solving ``min ||X (W - W0)^T||^2`` under each layer's budget.

    - ``calib``: a tensor of samples (batches of 128 along dim 0), a list of batches or a
      DataLoader (read once per layer: it must give the same samples every time);
      ``forward_fn(model, batch)`` feeds one batch (default: ``walker.default_forward``).
    - ``target_density``: the fraction of weights kept over the pruned layers, split over them
      by ``allocation`` (``"uniform"``: the default for weights, ``"global"``, ``"owl"``,
      ``"penalty"``;
      ``allocation_options`` its options, see ``allocation``); or ``pattern="2:4"`` / ``"4:8"``
      (N:M in every layer; allocation must then be uniform).
    - ``options``: the method's options (``refit=True``: least squares on each row's support
      after the method, for any method; the ``refit`` argument sets it too).
    - ``include`` / ``exclude``: layer name patterns (fnmatch) or module types.
    - Large models (``pipeline``; docs/oneshot.md "Large models"): ``sequential="auto"`` runs
      the calibration data through one block (decoder layer) at a time when the model has a
      chain of them (``blocks``: found, or a container's name such as ``"transformer.h"``), so
      the cost grows linearly with depth; ``"layer"`` walks the whole model.
      ``offload_dir`` / ``cache_memory_mb``: the activation cache on disk beyond that much
      memory; ``checkpoint_dir``: per-block resume of an interrupted run;
      ``gram_precision``: the batch products ``X^T X`` in float64 up to 1,024 inputs and
      float32 above (``"auto"``), or always ``"float32"`` / ``"float64"`` (the sums are
      float64).
    - ``token_mask_fn(batch)``: the real tokens of a padded batch (bool ``(batch, tokens)``);
      by default a dict batch's ``attention_mask``: padded positions never enter a Gram.
    - ``distributed``: under ``torchrun`` (``None``: whenever a process group of two or more
      ranks is initialized) the calibration batches are split over the ranks, the Grams summed
      and a stage's layers solved on different ranks (``distributed``); every rank ends with the
      same pruned model.

    Returns a :class:`OneShotResult`: the model (exact zeros), the :class:`OneShotReport` and
    the masks, from which ``fit`` / ``sparsify`` fine-tune with the masks held.
    """
    if granularity == "block":  # depth: whole blocks (depth.py)
        return prune_depth(model, calib, target_density=target_density,
                           metric=method or "cosine", blocks=blocks, forward_fn=forward_fn,
                           refused={k: v for k, v in locals().items() if k in DEPTH_REFUSES})
    if granularity is not None and granularity != "weight":
        return _prune_units(model, calib, method, granularity, target_density=target_density,
                            target_params=target_params, target_speedup=target_speedup,
                            pattern=pattern, allocation=allocation, options=options,
                            refit=refit, allocation_options=allocation_options,
                            forward_fn=forward_fn, include=include, exclude=exclude,
                            progress=progress, sequential=sequential, blocks=blocks,
                            token_mask_fn=token_mask_fn, offload_dir=offload_dir,
                            cache_memory_mb=cache_memory_mb, gram_precision=gram_precision,
                            checkpoint_dir=checkpoint_dir, distributed=distributed,
                            bias_compensation=bias_compensation,
                            latency_inputs=latency_inputs, latency_options=latency_options)
    for name, v in (("target_params", target_params), ("target_speedup", target_speedup),
                    ("bias_compensation", bias_compensation),
                    ("latency_inputs", latency_inputs), ("latency_options", latency_options)):
        if v is not None:
            raise ValueError(f"{name}= is for structured pruning: give granularity='neuron', "
                             "'head' or 'channel' too (single weights take target_density or "
                             "pattern)")
    method = "sparsegpt" if method is None else method
    allocation = "uniform" if allocation is None else allocation
    t_start = time.perf_counter()
    rss_start = reset_peak_memory()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if refit is not None and isinstance(method, OneShotMethod):
        raise ValueError("method is a built OneShotMethod: set refit in its constructor")
    opts = _method_options(options, refit)
    meth = get_method(method, **opts)
    density, nm = _budget_spec(target_density, pattern)
    if allocation_options is not None and not isinstance(allocation_options, dict):
        raise TypeError("allocation_options must be a dict")
    alloc_opts = check_allocation(allocation, dict(allocation_options or {}))
    if nm is not None and allocation != "uniform":
        raise ValueError(f"pattern={pattern!r} fixes every layer's density; allocation must be "
                         f"'uniform', not {allocation!r}")
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError("forward_fn must be callable as forward_fn(model, batch)")
    fwd = forward_fn or default_forward
    _check_pipeline_options(sequential, blocks, token_mask_fn, offload_dir, cache_memory_mb,
                            gram_precision, checkpoint_dir)
    if distributed not in (None, True, False):
        raise TypeError(f"distributed must be None (auto), True or False, got {distributed!r}")
    pipe = {"sequential": sequential, "blocks": blocks, "token_mask_fn": token_mask_fn,
            "offload_dir": offload_dir, "cache_memory_mb": cache_memory_mb,
            "gram_precision": gram_precision, "dist": dist_context(distributed)}
    calib = _check_calib(calib)
    _check_finite(calib)
    steps, skipped = discover(model, include, exclude)
    if nm is not None:
        for s in steps:
            for name, W in zip(s.names, s.weights()):
                if W.shape[1] % nm[1]:
                    raise ValueError(f"pattern {nm[0]}:{nm[1]} needs each layer's inputs to be "
                                     f"a multiple of {nm[1]}; {name} has {W.shape[1]} (exclude "
                                     "it, or choose another pattern)")
    if not steps:
        raise ValueError("nothing to prune: the model has no Linear, Conv1d/2d, transformers "
                         "Conv1D or MultiheadAttention layer left after include/exclude")
    steps, unreached, calls = trace(model, steps, calib, fwd)
    skipped += [(s.names[0], "not called by the forward of a calibration batch")
                for s in unreached]
    if not steps:
        raise ValueError("no prunable layer is called by the forward of a calibration batch; "
                         "check calib and forward_fn")
    if skipped:
        warnings.warn("prune_oneshot leaves these weights dense: "
                      + "; ".join(f"{n} ({why})" for n, why in skipped), UserWarning,
                      stacklevel=2)

    # the budgets: per problem, from the allocation on the dense model
    if nm is not None:
        budgets = {n: Budget(pattern=nm) for s in steps for n in s.names}
        target = f"pattern {nm[0]}:{nm[1]}"
    else:
        grams = (collect_grams(model, steps, calib, fwd, progress, **pipe)
                 if allocation in ("owl", "penalty") else {})
        problems = [LayerProblem(n, W, grams.get(n)) for s in steps
                    for n, W in zip(s.names, s.weights())]
        counts = allocate(problems, density, allocation, **alloc_opts)
        del grams, problems
        budgets = {n: Budget(n_keep=int(counts[n])) for s in steps for n in s.names}
        budgets = _raise_empty_layers(budgets, {n: tuple(W.shape) for s in steps
                                                for n, W in zip(s.names, s.weights())})
        target = f"density {density:g}"

    originals = [(p, p.detach().to("cpu", copy=True)) for s in steps for _, p in s.parameters()]

    def prune_step(step: Step, W0s, Gs):
        Ws, secs = [], []
        for name, W0, G in zip(step.names, W0s, Gs):
            t0 = time.perf_counter()
            Ws.append(meth.prune(W0, G, budgets[name]))
            secs.append(time.perf_counter() - t0)
        return Ws, secs

    _first_use_notice(meth, allocation)
    fingerprint = {"method": repr(meth), "target": target, "allocation": allocation,
                   "budgets": {n: [b.n_keep, b.pattern] for n, b in budgets.items()},
                   "batches": _calib_size(calib), "gram_precision": gram_precision}
    try:
        res = run_pipeline(model, steps, calib, fwd, prune_step, progress=progress,
                           desc=f"one-shot {meth.name}", checkpoint_dir=checkpoint_dir,
                           fingerprint=fingerprint, **pipe)
        rows = res.rows
    except BaseException:
        with torch.no_grad():
            for p, orig in originals:
                p.copy_(orig)
        raise
    del originals
    if res.unreached:
        names = [s.names[0] for s in res.unreached]
        skipped += [(n, "not called by the forward of a calibration batch") for n in names]
        warnings.warn(f"prune_oneshot leaves these weights dense: {names} (not called by the "
                      "forward of a calibration batch)", UserWarning, stacklevel=2)
        reached = {id(s) for s in steps} - {id(s) for s in res.unreached}
        steps = [s for s in steps if id(s) in reached]
    masks = {name: (p.detach() != 0) for s in steps for name, p in s.parameters()}
    cpu = next(model.parameters()).device.type == "cpu"
    report = OneShotReport(method=repr(meth), allocation=allocation, target=target, layers=rows,
                           skipped=skipped, seconds=time.perf_counter() - t_start,
                           peak_mb=max([r["peak_mb"] for r in rows]
                                       + ([peak_rss_mb()] if cpu else [])),
                           start_mb=rss_start if cpu else 0.0,
                           pipeline={"mode": res.mode, "blocks": res.blocks,
                                     "block_info": res.block_info})
    return OneShotResult(model, report, masks)


def _prune_units(model, calib, method, granularity, *, pattern, refit, options, offload_dir,
                 cache_memory_mb, checkpoint_dir, distributed, bias_compensation, **kwargs):
    """``prune_oneshot(granularity=...)``: the arguments of weight pruning refused, the rest
    handed to ``prune_structured`` (which checks them all before touching the model)."""
    from dualdrop.nn.oneshot.structured import prune_structured

    g = check_unit_method(method, granularity)
    if pattern is not None:
        raise ValueError(f"pattern={pattern!r} is N:M sparsity of single weights; with "
                         f"granularity={g!r} give target_density, target_params or "
                         "target_speedup (or drop granularity for N:M)")
    for name, v in (("offload_dir", offload_dir), ("cache_memory_mb", cache_memory_mb),
                    ("checkpoint_dir", checkpoint_dir)):
        if v is not None:
            raise ValueError(f"{name}= is not available for structured pruning "
                             f"(granularity={g!r}): drop it (the activations are kept in "
                             "memory, block by block)")
    if distributed:
        raise ValueError(f"distributed=True is not available for structured pruning "
                         f"(granularity={g!r}); leave it None or False")
    return prune_structured(model, calib, "osscar" if method is None else method,
                            granularity=granularity, options=_method_options(options, refit),
                            bias_compensation=True if bias_compensation is None
                            else bias_compensation, **kwargs)


def _method_options(options, refit) -> dict:
    """The method's options, with ``refit`` set in them unless it is None."""
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict of the method's options, got "
                        f"{type(options).__name__}")
    opts = dict(options or {})
    if refit is not None:
        if not isinstance(refit, bool):
            raise TypeError(f"refit must be True, False or None, got {refit!r}")
        opts["refit"] = refit
    return opts


def check_unit_method(method, granularity) -> str:
    """Refuse a method of single weights with ``granularity`` (checked too); the granularity
    as one string for messages."""
    from dualdrop.nn.oneshot.methods.structured import METHODS as UNIT_METHODS
    from dualdrop.nn.oneshot.methods.structured import available as unit_methods
    from dualdrop.nn.oneshot.registry import METHODS as WEIGHT_METHODS
    from dualdrop.nn.oneshot.units import check_granularity

    g = "+".join(check_granularity(granularity))
    if isinstance(method, OneShotMethod):
        raise ValueError(f"method is a {type(method).__name__}, a method for single weights; "
                         f"with granularity={g!r} give one of {unit_methods()} (or a "
                         "UnitMethod)")
    if isinstance(method, str) and method in WEIGHT_METHODS and method not in UNIT_METHODS:
        raise ValueError(f"method={method!r} prunes single weights; with granularity={g!r} "
                         f"choose one of {unit_methods()}")
    return g


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
