"""Pruning a model that does not fit in memory: a Hugging Face checkpoint read and written one
block at a time (``prune_oneshot_from_disk``), the block pipeline (``pipeline``) over the
checkpoint's safetensors source (``sources.SafetensorsSource``).

Memory: the process itself (Python, torch, transformers: ~0.5 GB), the weights outside the
blocks, one block, the activation cache up to ``cache_memory_mb`` (the rest in ``offload_dir``),
and one stage's Grams and solve (float64, ``in^2`` each), whatever the depth
(``benchmarks/RESULTS.md``, "One-shot at scale", peak memory against depth; a Llama-shaped
checkpoint of 1.1B parameters, 4.4 GB in float32, peaked at about 2.3 GB).

Resume: the run's progress is kept in ``out_dir/.oneshot-progress`` (a finished block's shard is
written before the block is recorded as done); started again with the same arguments, it
continues after the last finished block, with the same result. A finished run removes it and
writes its report to ``out_dir/oneshot_report.json``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

from dualdrop.nn.oneshot.allocation.weights import raise_empty_layers, uniform_counts
from dualdrop.nn.oneshot.job import check_calib, check_pipeline_options, weight_budget
from dualdrop.nn.oneshot.layers import discover
from dualdrop.nn.oneshot.methods.base import Budget
from dualdrop.nn.oneshot.blocks import find_blocks
from dualdrop.nn.oneshot.pipeline import run as run_pipeline
from dualdrop.nn.oneshot.registry import get_method
from dualdrop.nn.oneshot.report import Report
from dualdrop.nn.oneshot.run import first_use_notice, weight_prune_step
from dualdrop.nn.oneshot.sources import SafetensorsCheckpoint, SafetensorsSource, write_json
from dualdrop.nn.oneshot.storage import Resume
from dualdrop.nn._memory import peak_rss_mb, reset_peak_memory
from dualdrop.nn.oneshot.calibration import default_forward

__all__ = ["prune_oneshot_from_disk", "SafetensorsCheckpoint"]

PROGRESS = ".oneshot-progress"
UNREACHED = "not called by the forward"


def prune_oneshot_from_disk(path, calib, method="sparsegpt", out_dir=None, *,
                            target_density: float | None = None, pattern=None,
                            options: dict | None = None, model_class=None, blocks=None,
                            forward_fn=None, include=None, exclude=None, token_mask_fn=None,
                            offload_dir=None, cache_memory_mb: float | None = 256,
                            gram_precision: str = "auto", progress: bool = True) -> Report:
    """Prune the Hugging Face checkpoint in the folder ``path`` once, from calibration data,
    without ever holding the whole model in memory (module docstring); the pruned checkpoint
    goes to ``out_dir`` (a folder ``from_pretrained`` loads). Returns the report (a
    ``Report``, as ``prune_oneshot``'s; also written to ``out_dir/oneshot_report.json``).

    ``method``, ``target_density`` / ``pattern``, ``options``, ``include`` / ``exclude``,
    ``forward_fn``, ``token_mask_fn`` and ``gram_precision`` as for ``prune_oneshot`` (the
    budget is uniform: every layer keeps ``target_density`` of its weights, or the N:M
    pattern). ``model_class``: the transformers class to build (default: the config's
    ``architectures``); ``blocks``: the container of the blocks (default: found, e.g.
    ``"model.layers"``); ``offload_dir``: where the activation cache goes beyond
    ``cache_memory_mb`` (default: a folder in ``out_dir``). An interrupted run started again
    with the same arguments continues after its last finished block."""
    t_start = time.perf_counter()
    rss_start = reset_peak_memory()
    if out_dir is None:
        raise ValueError("out_dir is required: the folder the pruned checkpoint is written to")
    path, out_dir = os.fspath(path), os.fspath(out_dir)
    if os.path.abspath(path) == os.path.abspath(out_dir):
        raise ValueError("out_dir must differ from path (the source checkpoint is read while "
                         "the pruned one is written)")
    meth = get_method(method, **dict(options or {}))
    kind, value = weight_budget(target_density, pattern)
    density, nm = (value, None) if kind == "density" else (None, value)
    if offload_dir is None:
        offload_dir = os.path.join(out_dir, ".activation-cache")
    check_pipeline_options("block", blocks, token_mask_fn, offload_dir, cache_memory_mb,
                            gram_precision, None)
    calib = check_calib(calib)
    source = SafetensorsSource(path, out_dir, model_class)
    model = source.model
    steps, skipped = discover(model, include, exclude)
    if not steps:
        raise ValueError("nothing to prune: the model has no prunable layer after "
                         "include/exclude")
    cands = find_blocks(model, steps, blocks)
    if not cands:
        raise ValueError("no container of blocks (a ModuleList of decoder layers) holds the "
                         "model's layers; pass blocks='model.layers' (its name)")
    label, chain = cands[0]
    if nm is not None:
        budgets = {n: Budget(pattern=nm) for s in steps for n in s.names}
        for s in steps:
            for n, W in zip(s.names, _shapes(s)):
                if W[1] % nm[1]:
                    raise ValueError(f"pattern {nm[0]}:{nm[1]} needs each layer's inputs to be "
                                     f"a multiple of {nm[1]}; {n} has {W[1]} (exclude it)")
        target = f"pattern {nm[0]}:{nm[1]}"
    else:
        shapes = {n: shp for s in steps for n, shp in zip(s.names, _shapes(s))}
        counts = uniform_counts(density, {n: shp[0] * shp[1] for n, shp in shapes.items()})
        budgets = raise_empty_layers({n: Budget(n_keep=c) for n, c in counts.items()}, shapes)
        target = f"density {density:g}"
    os.makedirs(out_dir, exist_ok=True)
    fingerprint = {"path": os.path.abspath(path), "method": repr(meth), "target": target,
                   "blocks": label, "gram_precision": gram_precision,
                   "batches": len(calib) if hasattr(calib, "__len__") else None,
                   "include": repr(include), "exclude": repr(exclude)}
    # the blocks' pruned weights are kept in their shards; the prologue's and epilogue's (the
    # weights outside the blocks) by the resume state itself
    resume = Resume(os.path.join(out_dir, PROGRESS), fingerprint,
                    store_weights=lambda segment: not segment.startswith("block-"))
    source.start(chain, steps, resume)  # reads the weights outside the blocks
    fwd = forward_fn or default_forward

    prune_step = weight_prune_step(meth, budgets)

    first_use_notice(meth, "uniform")
    res = run_pipeline(model, steps, calib, fwd, prune_step, progress=progress,
                       desc=f"one-shot {meth.name} from disk", sequential="block",
                       blocks=label if blocks is None else blocks, token_mask_fn=token_mask_fn,
                       offload_dir=offload_dir, cache_memory_mb=cache_memory_mb,
                       gram_precision=gram_precision, source=source, resume=resume)
    source.finish()
    report = Report(method=repr(meth), allocation="uniform", target=target, layers=res.rows,
                    skipped=[*skipped, *((s.names[0], UNREACHED) for s in res.unreached)],
                    seconds=time.perf_counter() - t_start, peak_mb=peak_rss_mb(),
                    start_mb=rss_start, pipeline={"mode": res.mode, "blocks": res.blocks,
                                                  "block_info": res.block_info})
    write_json(os.path.join(out_dir, "oneshot_report.json"), report.to_dict())
    shutil.rmtree(os.path.join(out_dir, PROGRESS), ignore_errors=True)
    with contextlib.suppress(OSError):
        if os.path.isdir(offload_dir) and not os.listdir(offload_dir):
            os.rmdir(offload_dir)
    return report


def _shapes(step):
    """The ``(out, in)`` shape of each of a step's problems, without reading the weights."""
    m = step.module
    if step.kind == "linear":
        return [tuple(m.weight.shape)]
    if step.kind == "hf_conv1d":
        return [tuple(m.weight.shape[::-1])]
    if step.kind == "conv":
        return [(m.weight.shape[0], m.weight[0].numel())]
    if step.kind == "mha_out":
        return [tuple(m.out_proj.weight.shape)]
    E = m.embed_dim
    return [(E, E if m._qkv_same_embed_dim else d) for d in (E, m.kdim, m.vdim)]
