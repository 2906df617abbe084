"""The one-shot job: every argument of a one-shot prune checked once, before any model is touched.

``prune_oneshot``, ``prune_structured`` and ``dualdrop prune`` all describe the work as one
:class:`Job` built by :func:`make_job` and hand it to ``run.run`` (docs/oneshot.md). A job says

- **what** is pruned: ``"weights"`` (single weights, ``granularity`` None or ``"weight"``) or
  ``"units"`` (whole neurons, heads, channels: ``granularity``);
- the **budget**: ``("density", d)``, the fraction kept of the *prunable weights of the pruned
  layers* (every weight of each pruned layer for single weights; the producer rows and consumer
  columns of the unit groups for units), ``("pattern", (n, m))`` (N:M, weights only),
  ``("params", n)`` (the whole pruned model's parameters, units only) or ``("speedup", s)``
  (units only);
- the **method** (``registry``) and its options, the **allocation** over layers and its
  options, the layers (``include`` / ``exclude``), how a batch is fed (``forward_fn``,
  ``token_mask_fn``), and the pipeline's options (``sequential``, ``blocks``, the activation
  cache on disk, per-block resume, ``gram_precision``, ``distributed``);
- the **source**: where the weights live (``sources``): None, the model in memory; or a
  ``SafetensorsSource``, a checkpoint read and written block by block
  (``prune_oneshot_from_disk``: single weights, a uniform allocation, block by block).

Arguments of the other kind (``pattern=`` for units; ``target_params=`` for weights; the
activation cache on disk for units) are refused with a ``ValueError`` naming them, so a job
never carries an argument it ignores. The checks that need the model or the calibration data
(the data's batches, one forward of its first batch, the layers found) run in ``run.run``,
still before the model is changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from dualdrop.nn._groups import check_unit_granularity
from dualdrop.nn.oneshot.allocation import units as unit_allocation
from dualdrop.nn.oneshot.allocation import weights as weight_allocation
from dualdrop.nn.oneshot.calibration import PRECISIONS
from dualdrop.nn.oneshot.methods.base import OneShotMethod, parse_pattern
from dualdrop.nn.oneshot.pipeline import SEQUENTIAL
from dualdrop.nn.oneshot.registry import METHODS as WEIGHT_METHODS
from dualdrop.nn.oneshot.registry import (UNIT_METHODS, get_method, get_unit_method,
                                          unit_methods)
from penalties.checks import check_float, check_int

#: rows per calibration batch when ``calib`` is one tensor
CALIB_BATCH = 128

#: the options of the latency table of a ``target_speedup`` budget and their defaults
LATENCY_DEFAULTS = {"threads": 1, "clock": "wall", "rounds": 5, "cache": True, "measure": True}


@dataclass
class Job:
    """One one-shot prune, checked (module docstring). Build it with :func:`make_job`; two jobs
    built from the same arguments are equal (the CLI's and the library's alike).

    ``budget`` is ``(kind, value)``, kind one of ``"density"``, ``"pattern"``, ``"params"``,
    ``"speedup"``; ``meth`` the method built from ``method`` and ``options`` (not compared:
    ``method`` and ``options`` say the same)."""

    what: str
    method: object
    options: dict
    budget: tuple
    allocation: str
    allocation_options: dict
    granularity: tuple | None = None
    include: object = None
    exclude: object = None
    forward_fn: object = None
    token_mask_fn: object = None
    progress: bool = True
    sequential: str = "auto"
    blocks: object = None
    offload_dir: object = None
    cache_memory_mb: float | None = None
    gram_precision: str = "auto"
    checkpoint_dir: object = None
    distributed: bool | None = None
    calibration_sharded: bool = False
    bias_compensation: bool | None = None
    target: str | None = None
    latency_options: dict | None = None
    source: object = None
    latency_inputs: object = field(default=None, compare=False)
    meth: object = field(default=None, compare=False, repr=False)

    @property
    def describe(self) -> str:
        """The budget in a few words, as the report gives it."""
        kind, v = self.budget
        if kind == "pattern":
            return f"pattern {v[0]}:{v[1]}"
        if kind == "density":
            return f"density {v:g}"
        return f"{v:,} parameters" if kind == "params" else f"speed-up {v:g}x"


def make_job(method=None, target_density: float | None = None, pattern=None,
             allocation: str | None = None, *, granularity=None, target_params: int | None = None,
             target_speedup: float | None = None, options: dict | None = None,
             refit: bool | None = None, allocation_options: dict | None = None, forward_fn=None,
             include=None, exclude=None, progress: bool = True, sequential: str = "auto",
             blocks=None, token_mask_fn=None, offload_dir=None,
             cache_memory_mb: float | None = None, gram_precision: str = "auto",
             checkpoint_dir=None, distributed: bool | None = None,
             bias_compensation: bool | None = None, target: str | None = None,
             latency_inputs=None, latency_options: dict | None = None,
             calibration_sharded: bool = False, source=None) -> Job:
    """The :class:`Job` of these arguments (those of ``prune_oneshot``, plus ``target`` of
    ``prune_structured``), every one checked: a ``TypeError`` / ``ValueError`` names a bad one
    and says what to give instead. ``allocation=None``: ``"uniform"`` for single weights,
    ``allocation.units.DEFAULT_ALLOCATION`` for units."""
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError("forward_fn must be callable as forward_fn(model, batch)")
    common = dict(include=include, exclude=exclude, forward_fn=forward_fn,
                  token_mask_fn=token_mask_fn, progress=progress, sequential=sequential,
                  blocks=blocks, gram_precision=gram_precision,
                  calibration_sharded=calibration_sharded)
    if not isinstance(calibration_sharded, bool):
        raise TypeError(f"calibration_sharded must be True or False, got "
                        f"{calibration_sharded!r}")
    if granularity is None or granularity == "weight":
        for name, v in (("target_params", target_params), ("target_speedup", target_speedup),
                        ("bias_compensation", bias_compensation), ("target", target),
                        ("latency_inputs", latency_inputs),
                        ("latency_options", latency_options)):
            if v is not None:
                raise ValueError(f"{name}= is for structured pruning: give granularity="
                                 "'neuron', 'head' or 'channel' too (single weights take "
                                 "target_density or pattern)")
        job = _weights_job(method, target_density, pattern, allocation, options, refit,
                           allocation_options, offload_dir, cache_memory_mb, checkpoint_dir,
                           distributed, common)
        return with_source(job, source)
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
    if source is not None:
        raise ValueError(f"source= (a checkpoint on disk) prunes single weights; structured "
                         f"pruning (granularity={g!r}) needs the model in memory")
    if distributed or calibration_sharded:
        raise ValueError(f"distributed=True and calibration_sharded=True are not available "
                         f"for structured pruning (granularity={g!r}); leave them unset")
    return _units_job(method, granularity, target_density, target_params, target_speedup,
                      allocation, method_options(options, refit), allocation_options,
                      True if bias_compensation is None else bias_compensation,
                      "pruned" if target is None else target, latency_inputs, latency_options,
                      common)


def _weights_job(method, target_density, pattern, allocation, options, refit,
                 allocation_options, offload_dir, cache_memory_mb, checkpoint_dir, distributed,
                 common) -> Job:
    method = "sparsegpt" if method is None else method
    allocation = "uniform" if allocation is None else allocation
    if refit is not None and isinstance(method, OneShotMethod):
        raise ValueError("method is a built OneShotMethod: set refit in its constructor")
    opts = method_options(options, refit)
    meth = get_method(method, **opts)
    budget = weight_budget(target_density, pattern)
    if allocation_options is not None and not isinstance(allocation_options, dict):
        raise TypeError("allocation_options must be a dict")
    alloc_opts = weight_allocation.check_allocation(allocation, dict(allocation_options or {}))
    if budget[0] == "pattern" and allocation != "uniform":
        raise ValueError(f"pattern={pattern!r} fixes every layer's density; allocation must be "
                         f"'uniform', not {allocation!r}")
    check_pipeline_options(common["sequential"], common["blocks"], common["token_mask_fn"],
                           offload_dir, cache_memory_mb, common["gram_precision"],
                           checkpoint_dir)
    if distributed not in (None, True, False):
        raise TypeError(f"distributed must be None (auto), True or False, got {distributed!r}")
    return Job("weights", method, opts, budget, allocation, alloc_opts, offload_dir=offload_dir,
               cache_memory_mb=cache_memory_mb, checkpoint_dir=checkpoint_dir,
               distributed=distributed, meth=meth, **common)


def with_source(job: Job, source) -> Job:
    """``job`` with its weights read from ``source`` (None: the model in memory). A source
    that holds one block at a time (``needs_blocks``) takes a uniform allocation (the others
    measure every layer of the dense model first), runs block by block in one process and
    keeps its own resume record."""
    if source is None:
        return job
    if not hasattr(source, "needs_blocks") or not hasattr(source, "prepare"):
        raise TypeError(f"source must be a pipeline source (dualdrop.nn.oneshot.sources), got "
                        f"{type(source).__name__}")
    if source.needs_blocks:
        for name, bad, why in (
                ("allocation", job.allocation != "uniform", "'uniform'"),
                ("sequential", job.sequential == "layer", "'block' or 'auto'"),
                ("checkpoint_dir", job.checkpoint_dir is not None,
                 "None (the run resumes from out_dir)"),
                ("distributed", bool(job.distributed) or job.calibration_sharded,
                 "None or False")):
            if bad:
                raise ValueError(f"{name}: pruning from disk takes {why}")
        job.sequential, job.distributed = "block", False
    job.source = source
    return job


def _units_job(method, granularity, target_density, target_params, target_speedup, allocation,
               options, allocation_options, bias_compensation, target, latency_inputs,
               latency_options, common) -> Job:
    method = "osscar" if method is None else method
    allocation = unit_allocation.DEFAULT_ALLOCATION if allocation is None else allocation
    meth = get_unit_method(method, **options)
    kinds = check_unit_granularity(granularity)
    budget = unit_budget(target_density, target_params, target_speedup)
    alloc_opts = unit_allocation.check_allocation(allocation, allocation_options)
    lat_opts = latency_options_of(latency_options)
    if not isinstance(bias_compensation, bool):
        raise TypeError(f"bias_compensation must be True or False, got {bias_compensation!r}")
    if target not in ("pruned", "dense"):
        raise ValueError(f"target={target!r}; expected 'pruned' (each layer reproduces its own "
                         "output) or 'dense' (the dense model's)")
    for name in ("include", "exclude"):
        items = common[name]
        if items is not None and (isinstance(items, str) or not all(
                isinstance(i, str) for i in items)):
            raise TypeError(f"{name} must be a list of name patterns (fnmatch), e.g. "
                            "['encoder.layer.*']")
    check_pipeline_options(common["sequential"], common["blocks"], common["token_mask_fn"],
                           None, None, common["gram_precision"], None)
    return Job("units", method, options, budget, allocation, alloc_opts, granularity=kinds,
               bias_compensation=bias_compensation, target=target, latency_options=lat_opts,
               latency_inputs=latency_inputs, meth=meth, **common)


def method_options(options, refit) -> dict:
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
    kinds = check_unit_granularity(granularity)
    g = granularity if isinstance(granularity, str) else "+".join(kinds)
    if isinstance(method, OneShotMethod):
        raise ValueError(f"method is a {type(method).__name__}, a method for single weights; "
                         f"with granularity={g!r} give one of {unit_methods()} (or a "
                         "UnitMethod)")
    if isinstance(method, str) and method in WEIGHT_METHODS and method not in UNIT_METHODS:
        raise ValueError(f"method={method!r} prunes single weights; with granularity={g!r} "
                         f"choose a structured method: expected one of {unit_methods()}")
    return g


def weight_budget(target_density, pattern) -> tuple:
    """``("density", d)`` or ``("pattern", (n, m))``: exactly one of the two given."""
    if (target_density is None) == (pattern is None):
        raise ValueError("give exactly one of target_density=D (fraction of weights kept, e.g. "
                         "0.1) and pattern='N:M' (e.g. '2:4')")
    if pattern is not None:
        return "pattern", parse_pattern(pattern)
    return "density", check_float("target_density", target_density, low=0.0, high=1.0,
                                  low_open=True)


def unit_budget(target_density, target_params, target_speedup) -> tuple:
    """``("density", d)``, ``("params", n)`` or ``("speedup", s)``: exactly one given."""
    given = [(k, v) for k, v in (("target_density", target_density),
                                 ("target_params", target_params),
                                 ("target_speedup", target_speedup)) if v is not None]
    if len(given) != 1:
        raise ValueError("give exactly one budget: target_density=D (fraction of the prunable "
                         "parameters kept, e.g. 0.5), target_params=N (parameters of the whole "
                         "pruned model) or target_speedup=S (measured, e.g. 1.5)")
    k, v = given[0]
    if k == "target_density":
        return "density", check_float(k, v, low=0.0, high=1.0, low_open=True)
    if k == "target_params":
        return "params", check_int(k, v, low=1)
    return "speedup", check_float(k, v, low=1.0)


def latency_options_of(opts) -> dict:
    """The latency table's options (:data:`LATENCY_DEFAULTS` filled in), checked."""
    if opts is None:
        return dict(LATENCY_DEFAULTS)
    if not isinstance(opts, dict):
        raise TypeError("latency_options must be a dict, e.g. {'threads': 1, 'clock': 'cpu'}")
    unknown = sorted(set(opts) - set(LATENCY_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown latency option(s) {unknown}; known: "
                         f"{sorted(LATENCY_DEFAULTS)}")
    out = {**LATENCY_DEFAULTS, **opts}
    if out["clock"] not in ("wall", "cpu"):
        raise ValueError(f"latency_options clock={out['clock']!r}; expected 'wall' or 'cpu'")
    if out["threads"] is not None:
        out["threads"] = check_int("latency_options threads", out["threads"], low=1)
    out["rounds"] = check_int("latency_options rounds", out["rounds"], low=1)
    for k in ("cache", "measure"):
        if not isinstance(out[k], bool):
            raise TypeError(f"latency_options {k} must be True or False")
    return out


def check_pipeline_options(sequential, blocks, token_mask_fn, offload_dir, cache_memory_mb,
                           gram_precision, checkpoint_dir) -> None:
    """The block pipeline's options (``pipeline.run``), checked."""
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


# ---- the calibration data ------------------------------------------------------------------------

def check_calib(calib):
    """``calib`` as a re-iterable of batches: a tensor split into batches of
    :data:`CALIB_BATCH` rows, a list of batches or a DataLoader as they are. Refused: an
    iterator (read once per layer), an empty tensor, a batch with no rows, and a tuple of
    tensors of different shapes (an ``(inputs, targets)`` pair would be read as two batches)."""
    if isinstance(calib, torch.Tensor):
        if calib.dim() == 0 or calib.shape[0] == 0:
            raise ValueError("calib is an empty tensor; pass calibration samples along dim 0")
        return list(calib.split(CALIB_BATCH))
    if isinstance(calib, Iterator) or calib is None or isinstance(calib, (str, bytes, dict)):
        raise TypeError("calib must be re-iterable (read once per layer): a tensor of samples, "
                        "a list of batches or a DataLoader, not "
                        f"{type(calib).__name__}; e.g. list(your_batches)"
                        + ("; a dict is one batch: pass [batch]" if isinstance(calib, dict)
                           else ""))
    try:
        iter(calib)
    except TypeError:
        raise TypeError(f"calib must be a tensor, a list of batches or a DataLoader, got "
                        f"{type(calib).__name__}") from None
    if (isinstance(calib, tuple) and len(calib) >= 2
            and all(isinstance(t, torch.Tensor) for t in calib)
            and len({tuple(t.shape[1:]) for t in calib}) > 1):
        shapes = ", ".join(str(tuple(t.shape)) for t in calib[:4])
        raise TypeError(f"calib is a tuple of {len(calib)} tensors of different shapes "
                        f"({shapes}), which would be read as {len(calib)} batches; for "
                        "(inputs, targets) give the inputs alone (calib=inputs) or a list of "
                        "batches ([(inputs, targets)])")
    return calib


def check_batches(calib) -> None:
    """Refuse calibration batches with no rows, or with NaN or infinite values (they would
    reach every Gram), naming the batch."""
    n = 0
    for b, batch in enumerate(calib):
        n += 1
        items = (batch.items() if isinstance(batch, dict) else
                 enumerate(batch) if isinstance(batch, (tuple, list)) else [(None, batch)])
        for key, t in items:
            if not isinstance(t, torch.Tensor):
                continue
            where = f"batch {b}" + (f", {key!r}" if key is not None else "")
            if t.dim() > 0 and t.shape[0] == 0:
                raise ValueError(f"calib has an empty batch ({where}: shape {tuple(t.shape)}); "
                                 "drop it (every batch needs at least one sample)")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"calib has NaN or infinite values ({where}); clean the "
                                 "calibration data (every value reaches the layers' Grams)")
    if n == 0:
        raise ValueError("calib gave no batch")
