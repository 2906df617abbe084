"""The entry points of one-shot pruning: ``prune_oneshot`` (single weights, or whole units with
``granularity``) and ``prune_structured`` (whole units). Each is a thin wrapper: its arguments
checked into one ``job.Job`` (``make_job``, the CLI's too), then ``run.run(job, model, calib)``.
"""

from __future__ import annotations

from torch import nn

import dualdrop.nn.oneshot.run as _run
from dualdrop.nn.oneshot.depth import DEPTH_REFUSES, prune_depth
from dualdrop.nn.oneshot.job import make_job
from dualdrop.nn.oneshot.report import OneShotResult, StructuredResult


def prune_oneshot(model: nn.Module, calib, method=None, target_density: float | None = None,
                  pattern=None, allocation: str | None = None, *, options: dict | None = None,
                  refit: bool | None = None, allocation_options: dict | None = None,
                  forward_fn=None, include=None, exclude=None, progress: bool = True,
                  sequential: str = "auto", blocks=None, token_mask_fn=None, offload_dir=None,
                  cache_memory_mb: float | None = None, gram_precision: str = "auto",
                  checkpoint_dir=None, distributed: bool | None = None, granularity=None,
                  target_params: int | None = None, target_speedup: float | None = None,
                  bias_compensation: bool | None = None, latency_inputs=None,
                  latency_options: dict | None = None, calibration_sharded: bool = False):
    """Prune the trained ``model`` once, in place, from the calibration data ``calib``.

    ``granularity=None`` (or ``"weight"``) prunes single weights (below); ``"neuron"``,
    ``"head"``, ``"channel"`` or several (``("head", "neuron")``) remove whole units and return
    what :func:`prune_structured` returns (a
    ``StructuredResult``, ``res.compact()`` the smaller model): ``method`` one of its methods
    (default ``"osscar"``), the budget ``target_density`` (of the prunable parameters),
    ``target_params`` or ``target_speedup`` (measured: ``latency_inputs``,
    ``latency_options``), ``allocation`` ``"penalty"`` (the default for units) / ``"uniform"``
    / ``"flap"``,
    ``bias_compensation`` (default True); docs/oneshot.md "Smaller and faster: structured
    one-shot". The arguments of the other kind (``pattern=``, the activation cache on disk,
    ``checkpoint_dir``, ``distributed=True`` for units; the unit budgets for weights) are
    refused with a ``ValueError`` naming them.

    Layers (Linear, Conv1d/2d, transformers' Conv1D, MultiheadAttention's projections; others
    are named in a warning and left dense) are pruned in forward order, each on the inputs that
    come through the layers already pruned (``pipeline``), by ``method`` (``registry``: magnitude,
    wanda, sparsegpt (the default), and the optimization methods; or a ``OneShotMethod``
    instance) solving ``min ||X (W - W0)^T||^2`` under each layer's budget.

    - ``calib``: a tensor of samples (batches of 128 along dim 0), a list of batches or a
      DataLoader (read once per layer: it must give the same samples every time);
      ``forward_fn(model, batch)`` feeds one batch (default: ``calibration.default_forward``: a
      tuple batch as ``model(batch[0])``).
    - ``target_density``: the fraction kept of the prunable weights of the pruned layers (for
      single weights, every weight of those layers; for units, the producer rows and consumer
      columns of their unit groups), split over them
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
      same pruned model. Every rank must be given every batch (the ranks compare their batches
      before the first pass and refuse differing ones); ``calibration_sharded=True`` says that
      each rank holds its own shard instead (a ``DistributedSampler``'s): each rank then feeds
      all of its batches.

    Returns a :class:`OneShotResult`: the model (exact zeros), the ``Report`` (``report``)
    and the masks, from which ``fit`` / ``sparsify`` fine-tune with the masks held.
    """
    if granularity == "block":  # depth: whole blocks (depth.py)
        return prune_depth(model, calib, target_density=target_density,
                           metric=method or "cosine", blocks=blocks, forward_fn=forward_fn,
                           refused={k: v for k, v in locals().items() if k in DEPTH_REFUSES})
    job = make_job(method, target_density, pattern, allocation, granularity=granularity,
                   target_params=target_params, target_speedup=target_speedup, options=options,
                   refit=refit, allocation_options=allocation_options, forward_fn=forward_fn,
                   include=include, exclude=exclude, progress=progress, sequential=sequential,
                   blocks=blocks, token_mask_fn=token_mask_fn, offload_dir=offload_dir,
                   cache_memory_mb=cache_memory_mb, gram_precision=gram_precision,
                   checkpoint_dir=checkpoint_dir, distributed=distributed,
                   bias_compensation=bias_compensation, latency_inputs=latency_inputs,
                   latency_options=latency_options, calibration_sharded=calibration_sharded)
    return _run.run(job, model, calib)


def prune_structured(model: nn.Module, calib, method, *, granularity,
                     target_density: float | None = None, target_params: int | None = None,
                     target_speedup: float | None = None, allocation: str | None = None,
                     options: dict | None = None, allocation_options: dict | None = None,
                     bias_compensation: bool = True, target: str = "pruned",
                     forward_fn=None, include=None,
                     exclude=None, latency_inputs=None, latency_options: dict | None = None,
                     progress: bool = True, sequential: str = "auto", blocks=None,
                     token_mask_fn=None, gram_precision: str = "auto") -> StructuredResult:
    """Remove whole units of the trained ``model`` in place (``structured``: how a unit group's
    consumer problem is set up and solved), by ``run.run`` as ``prune_oneshot(...,
    granularity=...)`` does; the same ``target_density`` gives the same pruned model.

    - ``method``: a name of ``methods.structured.available()`` (``magnitude``, ``wanda-sp``,
      ``flap``, ``ziplm``, ``osscar``, ``logsum``, ``mcp``, ``penalty:<catalog name>``) or a
      ``UnitMethod``; ``options`` its options (every method takes ``refit``, ``polish``: exact
      swaps of kept and removed units after the method, ``max_swaps``, ``refit_damp``).
    - ``granularity``: ``"neuron"``, ``"head"``, ``"channel"`` or several (``("head",
      "neuron")``, ``"head+neuron"``).
    - The budget, one of: ``target_density`` (fraction of the prunable parameters kept: the
      units' producer rows and consumer columns), ``target_params`` (parameters of the whole
      pruned model), ``target_speedup`` (the model's time over the pruned model's on
      ``latency_inputs``, default the first calibration batch: predicted by a latency table,
      then measured on the compact model and the allocation corrected until within 5% of the
      target, or the closest try kept with a warning; ``latency_options``: ``threads`` (1),
      ``clock`` (``"wall"``, or ``"cpu"`` on a busy machine), ``rounds`` (5), ``cache``
      (True), ``measure`` (True; False keeps the prediction); ``allocation.latency``).
    - ``allocation``: ``"penalty"`` (None: the default, the best measured), ``"uniform"`` or
      ``"flap"`` (``allocation.units``); ``allocation_options`` its options.
    - ``bias_compensation``: fold the removed units' mean contribution into the consumer's
      bias, the kept weights fit on centred inputs (every method; a consumer without a bias
      is pruned without).
    - ``target``: what each consumer reproduces from the inputs that come through the layers
      pruned before it: its own output on them (``"pruned"``, as SparseGPT's and OSSCAR's
      sequential pruning) or the dense model's output on the same tokens (``"dense"``:
      asymmetric calibration, which also corrects the error the earlier layers left; it holds
      every consumer's dense inputs over the calibration data in memory, ``tokens x inputs x
      4`` bytes, released layer by layer).
    - ``calib``, ``forward_fn``, ``token_mask_fn``, ``sequential``, ``blocks``,
      ``gram_precision``: as for ``prune_oneshot``; ``include`` / ``exclude``: fnmatch
      patterns on the names of a unit group's layers.

    Returns a :class:`StructuredResult`.
    """
    job = make_job(method, target_density, None, allocation, granularity=granularity,
                   target_params=target_params, target_speedup=target_speedup, options=options,
                   allocation_options=allocation_options, forward_fn=forward_fn,
                   include=include, exclude=exclude, progress=progress, sequential=sequential,
                   blocks=blocks, token_mask_fn=token_mask_fn, gram_precision=gram_precision,
                   bias_compensation=bias_compensation, target=target,
                   latency_inputs=latency_inputs, latency_options=latency_options)
    return _run.run(job, model, calib)
