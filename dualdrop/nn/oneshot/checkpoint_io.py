"""Pruning a model that does not fit in memory: a Hugging Face checkpoint read and written one
block at a time (``prune_oneshot_from_disk``).

The model is built from its ``config.json`` with its parameters on PyTorch's ``meta`` device
(shapes, no storage; buffers such as rotary frequencies are computed as usual), so building it
costs nothing. The weights outside the blocks (embeddings, final norm, a head) are read from the
checkpoint's safetensors files; then the pipeline (``pipeline``) runs block by block: a block's
weights are read (safetensors maps the file and copies only that block's tensors), its layers are
pruned over the activation cache, the pruned block is written to ``out_dir`` as one safetensors
shard, and its weights go back to ``meta``. At the end the weights outside the blocks are
written, with ``model.safetensors.index.json`` (the Hugging Face layout of a sharded
checkpoint), ``config.json`` and the checkpoint's other files (tokenizer, generation config), so
``AutoModel*.from_pretrained(out_dir)`` loads the pruned model.

Memory: the process itself (Python, torch, transformers: ~0.5 GB), the weights outside the
blocks, one block, the activation cache up to ``cache_memory_mb`` (the rest in ``offload_dir``),
and one stage's Grams and solve (float64, ``in^2`` each). A Llama-shaped model of 1.1B
parameters (TinyLlama's shape: 22 blocks of width 2048, FFN 5632, 4.4 GB in float32) needs
about 2.5 GB (``benchmarks/RESULTS.md``, "One-shot at scale").

Resume: the run's progress is kept in ``out_dir/.oneshot-progress`` (a finished block's shard is
written before the block is recorded as done); started again with the same arguments, it
continues after the last finished block, with the same result. A finished run removes it and
writes its report to ``out_dir/oneshot_report.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time

import torch
from torch import nn

from dualdrop.nn.oneshot.allocation import raise_empty_layers, uniform_counts
from dualdrop.nn.oneshot.job import check_calib, check_pipeline_options, weight_budget
from dualdrop.nn.oneshot.layers import discover
from dualdrop.nn.oneshot.methods.base import Budget
from dualdrop.nn.oneshot.pipeline import find_blocks, run as run_pipeline
from dualdrop.nn.oneshot.registry import get_method
from dualdrop.nn.oneshot.run import first_use_notice
from dualdrop.nn.oneshot.storage import Resume
from dualdrop.nn.oneshot.walker import default_forward, peak_rss_mb, reset_peak_memory

__all__ = ["prune_oneshot_from_disk", "SafetensorsCheckpoint"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PROGRESS = ".oneshot-progress"


def _safetensors():
    try:
        from safetensors import safe_open
        from safetensors.torch import save_file
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        raise ImportError("pruning from disk reads safetensors files: pip install safetensors "
                          "(or dualdrop[hf])") from None
    return safe_open, save_file


class SafetensorsCheckpoint:
    """The tensors of a Hugging Face checkpoint folder (``model.safetensors`` or a sharded
    ``model.safetensors.index.json``), read one at a time."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise ValueError(f"path={self.path!r} is not a folder; give a Hugging Face "
                             "checkpoint folder (config.json and model.safetensors, or a "
                             "sharded model.safetensors.index.json)")
        index = os.path.join(self.path, INDEX)
        single = os.path.join(self.path, SINGLE)
        safe_open, _ = _safetensors()
        self.files: dict[str, str] = {}
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError
            except (OSError, ValueError, KeyError, TypeError):
                raise ValueError(f"{index} is not a safetensors index (a JSON object with a "
                                 "'weight_map'); the checkpoint folder is damaged") from None
            self.files = {k: os.path.join(self.path, v) for k, v in weight_map.items()}
        elif os.path.exists(single):
            try:
                with safe_open(single, framework="pt") as f:
                    self.files = {k: single for k in f.keys()}
            except Exception as e:  # noqa: BLE001 - a damaged file is one message
                raise ValueError(f"{single} cannot be read as safetensors "
                                 f"({type(e).__name__}: {str(e)[:80]})") from None
        else:
            raise ValueError(f"path={self.path!r} holds no {SINGLE} nor {INDEX}; save the model "
                             "with save_pretrained(..., safe_serialization=True)")
    def keys(self):
        return self.files.keys()

    def get_many(self, keys) -> dict[str, torch.Tensor]:
        """The tensors ``keys``, each file opened once and closed again: a tensor maps its
        bytes from the file until it is dropped, so nothing read stays resident after its
        block is done (an open handle would keep every page it ever read)."""
        safe_open, _ = _safetensors()
        by_file: dict[str, list[str]] = {}
        for k in keys:
            by_file.setdefault(self.files[k], []).append(k)
        out = {}
        for file, ks in by_file.items():
            with safe_open(file, framework="pt") as f:
                for k in ks:
                    out[k] = f.get_tensor(k)
        return out


def _build_meta(path, model_class):
    """The model of the checkpoint's ``config.json`` with its parameters on ``meta``."""
    try:
        import transformers
        from accelerate import init_empty_weights
    except ImportError:
        raise ImportError("prune_oneshot_from_disk builds the model with transformers and "
                          "accelerate: pip install dualdrop[hf]") from None
    config = transformers.AutoConfig.from_pretrained(path)
    cls = model_class
    if cls is None:
        archs = getattr(config, "architectures", None) or []
        cls = next((getattr(transformers, a) for a in archs if hasattr(transformers, a)), None)
        if cls is None:
            raise ValueError(f"config.json of {path!r} names no transformers architecture "
                             f"({archs}); pass model_class=, e.g. "
                             "transformers.LlamaForCausalLM")
    if isinstance(cls, str):
        if not hasattr(transformers, cls):
            raise ValueError(f"model_class={cls!r} is not a transformers class")
        cls = getattr(transformers, cls)
    with init_empty_weights(include_buffers=False):
        model = cls(config) if not hasattr(cls, "_from_config") else cls._from_config(config)
    if hasattr(model, "tie_weights"):  # the tied head and embedding: one parameter
        model.tie_weights()
    return model, config


class _Tensors:
    """Sets a model's parameters from a checkpoint, tied parameters together, and puts them back
    on ``meta``."""

    def __init__(self, model: nn.Module, ckpt: SafetensorsCheckpoint):
        self.model, self.ckpt = model, ckpt
        by_id: dict[int, list[str]] = {}
        self.params: dict[str, nn.Parameter] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            by_id.setdefault(id(p), []).append(name)
            self.params[name] = p
        #: every parameter name -> the names tied to it (itself included, first the owner)
        self.group = {n: names for names in by_id.values() for n in names}
        prefix = getattr(model, "base_model_prefix", "")
        self.key: dict[str, str] = {}
        self.dtype: dict[str, torch.dtype] = {}
        for name in self.params:
            for cand in (name, f"{prefix}.{name}" if prefix else None,
                         name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".")
                         else None):
                if cand and cand in ckpt.files:
                    self.key[name] = cand
                    break

    def _set(self, names, tensor):
        p = nn.Parameter(tensor, requires_grad=False)
        for n in names:
            mod_name, _, leaf = n.rpartition(".")
            mod = self.model.get_submodule(mod_name) if mod_name else self.model
            mod._parameters[leaf] = p
            self.params[n] = p

    def load(self, names) -> None:
        """Read the parameters ``names`` (and every name tied to them)."""
        done, wanted = set(), {}
        for n in names:
            if n in done:
                continue
            group = self.group[n]
            key = next((self.key[g] for g in group if g in self.key), None)
            if key is None:
                raise ValueError(f"the checkpoint has no tensor for {n} (nor for the weights "
                                 f"tied to it: {group}); is it the checkpoint of this model?")
            wanted[n] = key
            done.update(group)
        read = self.ckpt.get_many(set(wanted.values()))
        for n, key in wanted.items():
            group = self.group[n]
            t = read[key]
            if tuple(t.shape) != tuple(self.params[n].shape):
                raise ValueError(f"the checkpoint's {key} has shape {tuple(t.shape)}, the "
                                 f"model's {n} {tuple(self.params[n].shape)}; the config and "
                                 "the weights do not match")
            self.dtype[key] = t.dtype
            self._set(group, t.to(self.params[n].dtype))

    def stored(self, name) -> torch.Tensor:
        """A parameter as it is written: contiguous, in the checkpoint's own dtype."""
        p = self.params[name].detach()
        return p.to(self.dtype.get(self.key.get(name), p.dtype)).contiguous()

    def release(self, names) -> None:
        """Put the parameters ``names`` back on ``meta`` (tied ones: only if all are listed)."""
        names = set(names)
        for n in list(names):
            group = self.group[n]
            if all(g in names for g in group):
                p = self.params[n]
                self._set(group, torch.empty(p.shape, dtype=p.dtype, device="meta"))


class _BlockLoader:
    """The pipeline's hooks: read a block before it runs, write it once pruned, free it."""

    def __init__(self, tensors: _Tensors, chain, out_dir, resume: Resume):
        self.t, self.out, self.resume = tensors, out_dir, resume
        self.outside, self.keep, self.released = [], set(), []
        self.prefix = [name for name, _ in chain]
        self.saved: set[int] = set()
        _, self.save_file = _safetensors()

    def _names(self, k):
        pre = self.prefix[k] + "."
        return [n for n in self.t.params if n.startswith(pre)]

    def shard(self, k) -> str:
        return f"model-block-{k:05d}.safetensors"

    def load(self, k, block):
        names = self._names(k)
        if self.resume.done(f"block-{k:04d}") is not None:
            # finished before an interruption: the pruned weights are in its shard
            safe_open, _ = _safetensors()
            path = os.path.join(self.out, self.shard(k))
            with safe_open(path, framework="pt") as f:
                for n in names:
                    t = f.get_tensor(n).to(self.t.params[n].dtype)
                    self.t._set(self.t.group[n], t)
        else:
            self.t.load(names)

    def save(self, k, block):
        tensors = {n: self.t.stored(n) for n in self._names(k)}
        path = os.path.join(self.out, self.shard(k))
        self.save_file(tensors, path + ".tmp", metadata={"format": "pt"})
        os.replace(path + ".tmp", path)
        self.saved.add(k)

    def after_capture(self):
        """Between the capture and the epilogue only blocks run: the weights outside them that
        no layer of the prologue pruned go back to ``meta`` (an embedding of 32,000 x 2,048 is
        262 MB)."""
        self.released = [n for n in self.outside if n not in self.keep]
        self.t.release(self.released)

    def before_epilogue(self):
        self.t.load(self.released)
        self.released = []

    def release(self, k, block, write=True):
        if write and k not in self.saved:
            self.save(k, block)  # a block without prunable layers: written as read
        self.t.release(self._names(k))


def prune_oneshot_from_disk(path, calib, method="sparsegpt", out_dir=None, *,
                            target_density: float | None = None, pattern=None,
                            options: dict | None = None, model_class=None, blocks=None,
                            forward_fn=None, include=None, exclude=None, token_mask_fn=None,
                            offload_dir=None, cache_memory_mb: float | None = 256,
                            gram_precision: str = "auto", progress: bool = True) -> dict:
    """Prune the Hugging Face checkpoint in the folder ``path`` once, from calibration data,
    without ever holding the whole model in memory (module docstring); the pruned checkpoint
    goes to ``out_dir`` (a folder ``from_pretrained`` loads). Returns the report as a dict
    (also written to ``out_dir/oneshot_report.json``).

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
    ckpt = SafetensorsCheckpoint(path)
    model, config = _build_meta(path, model_class)
    tensors = _Tensors(model, ckpt)
    steps, skipped = discover(model, include, exclude)
    if not steps:
        raise ValueError("nothing to prune: the model has no prunable layer after "
                         "include/exclude")
    cands = find_blocks(model, steps, blocks)
    if not cands:
        raise ValueError("no container of blocks (a ModuleList of decoder layers) holds the "
                         "model's layers; pass blocks='model.layers' (its name)")
    label, chain = cands[0]
    block_prefixes = tuple(name + "." for name, _ in chain)
    outside = [n for n in tensors.params if not n.startswith(block_prefixes)]
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
    loader = _BlockLoader(tensors, chain, out_dir, resume)
    loader.outside = outside
    loader.keep = {n for s in steps for n, _ in s.parameters()  # pruned outside the blocks
                   if not n.startswith(block_prefixes)}
    fwd = forward_fn or default_forward
    tensors.load(outside)  # embeddings, final norm, head: what runs outside the blocks

    def prune_step(step, W0s, Gs):
        Ws, secs = [], []
        for name, W0, G in zip(step.names, W0s, Gs):
            t0 = time.perf_counter()
            Ws.append(meth.prune(W0, G, budgets[name]))
            secs.append(time.perf_counter() - t0)
        return Ws, secs

    first_use_notice(meth, "uniform")
    res = run_pipeline(model, steps, calib, fwd, prune_step, progress=progress,
                       desc=f"one-shot {meth.name} from disk", sequential="block",
                       blocks=label if blocks is None else blocks, token_mask_fn=token_mask_fn,
                       offload_dir=offload_dir, cache_memory_mb=cache_memory_mb,
                       gram_precision=gram_precision, loader=loader, resume=resume)
    # the weights outside the blocks (pruned prologue / epilogue layers included)
    _, save_file = _safetensors()
    rest = {}
    for n in outside:
        p = tensors.params[n]
        first = tensors.group[n][0]
        if n == first and n in tensors.key:
            rest[n] = tensors.stored(n)
    save_file(rest, os.path.join(out_dir, "model-rest.safetensors.tmp"),
              metadata={"format": "pt"})
    os.replace(os.path.join(out_dir, "model-rest.safetensors.tmp"),
               os.path.join(out_dir, "model-rest.safetensors"))
    weight_map = {n: "model-rest.safetensors" for n in rest}
    total = sum(t.numel() * t.element_size() for t in rest.values())
    for k in range(len(chain)):
        for n in loader._names(k):
            if n == tensors.group[n][0]:
                weight_map[n] = loader.shard(k)
                p = tensors.params[n]
                total += p.numel() * tensors.dtype.get(tensors.key.get(n), p.dtype).itemsize
    _write_json(os.path.join(out_dir, INDEX), {"metadata": {"total_size": total},
                                              "weight_map": weight_map})
    for f in os.listdir(path):  # config, tokenizer, generation config: as they were
        src = os.path.join(path, f)
        if os.path.isfile(src) and not f.endswith((".safetensors", ".bin", ".pt", ".pth")) \
                and f != INDEX:
            shutil.copyfile(src, os.path.join(out_dir, f))
    kept = sum(r["kept"] for r in res.rows)
    total_w = sum(r["shape"][0] * r["shape"][1] for r in res.rows)
    report = {"method": repr(meth), "target": target, "blocks": label,
              "density": kept / total_w if total_w else 1.0,
              "seconds": time.perf_counter() - t_start, "peak_mb": peak_rss_mb(),
              "start_mb": rss_start, "layers": res.rows, "block_info": res.block_info,
              "skipped": [list(s) for s in skipped]
              + [[s.names[0], "not called by the forward"] for s in res.unreached]}
    _write_json(os.path.join(out_dir, "oneshot_report.json"), report)
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


def _write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
