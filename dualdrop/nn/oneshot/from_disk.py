"""Pruning a model that does not fit in memory: a Hugging Face checkpoint read and written one
block at a time (``prune_oneshot_from_disk``). A thin entry: the one job (``job.make_job``) with
the checkpoint's safetensors source (``sources.SafetensorsSource``) as where its weights live,
run by the one sequence (``run.run``), the same as ``prune_oneshot`` in memory.

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

from dualdrop.nn.oneshot.job import make_job, with_source
from dualdrop.nn.oneshot.report import Report
from dualdrop.nn.oneshot.run import run
from dualdrop.nn.oneshot.sources import SafetensorsCheckpoint, SafetensorsSource

__all__ = ["prune_oneshot_from_disk", "SafetensorsCheckpoint"]


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
    if out_dir is None:
        raise ValueError("out_dir is required: the folder the pruned checkpoint is written to")
    path, out_dir = os.fspath(path), os.fspath(out_dir)
    if os.path.abspath(path) == os.path.abspath(out_dir):
        raise ValueError("out_dir must differ from path (the source checkpoint is read while "
                         "the pruned one is written)")
    if offload_dir is None:
        offload_dir = os.path.join(out_dir, ".activation-cache")
    # every argument checked before the checkpoint is read
    job = make_job(method, target_density, pattern, options=options, forward_fn=forward_fn,
                   include=include, exclude=exclude, progress=progress, sequential="block",
                   blocks=blocks, token_mask_fn=token_mask_fn, offload_dir=offload_dir,
                   cache_memory_mb=cache_memory_mb, gram_precision=gram_precision,
                   distributed=False)
    source = SafetensorsSource(path, out_dir, model_class)
    job = with_source(job, source)
    report = run(job, source.model, calib).report
    with contextlib.suppress(OSError):
        if os.path.isdir(offload_dir) and not os.listdir(offload_dir):
            os.rmdir(offload_dir)
    return report
