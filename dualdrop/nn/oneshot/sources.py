"""Where the weights live while the block pipeline runs: its *source* plug-in.

``pipeline.run`` asks its source for a block's weights before the block runs
(:meth:`~MemorySource.load`), tells it when the block's layers are pruned
(:meth:`~MemorySource.pruned`) and when the block is done (:meth:`~MemorySource.release`),
and around the capture (:meth:`~MemorySource.after_capture`,
:meth:`~MemorySource.before_epilogue`). Two sources:

- :class:`MemorySource` (the default): the model is in memory, every call is a no-op;
- :class:`SafetensorsSource`: a Hugging Face checkpoint folder read and written one block at a
  time (``prune_oneshot_from_disk``). The model is built from its ``config.json`` with its
  parameters on PyTorch's ``meta`` device (shapes, no storage). A block's tensors are mapped
  from their safetensors file when the block starts (only the pages its forwards touch are
  read), the pruned block is written to ``out_dir`` as one shard, and its parameters go back to
  ``meta``: nothing of a finished block stays referenced, so the memory is that of one block
  whatever the depth. :meth:`SafetensorsSource.finish` writes the weights outside the blocks,
  ``model.safetensors.index.json`` (the Hugging Face layout of a sharded checkpoint) and the
  checkpoint's other files, so ``AutoModel*.from_pretrained(out_dir)`` loads the pruned model.

**Memory whatever the depth.** Freed memory is not necessarily given back: glibc's ``malloc``
serves allocations below its *mmap threshold* from its heap, and raises that threshold (up to
32 MB) each time a larger mapped block is freed, so a block's Grams, weights and activations
(1-32 MB each at width 1,024) end up in a heap whose free holes stay resident and fragment a
little more with every block: the peak crept up by about 2 MB per block at width 512 and 20
MB at width 1,024 (Llama-shaped checkpoints, ``benchmarks/RESULTS.md``, "One-shot at scale"),
and stood about 200 MB higher from the first block on (width 1,024). So a
:class:`SafetensorsSource` fixes the threshold at :data:`MMAP_THRESHOLD` for the process (as
``MALLOC_MMAP_THRESHOLD_=1048576`` in the environment would; every tensor of a megabyte or more
then has its own mapping, unmapped when freed) and gives the heap's free pages back
(``malloc_trim``) after each block, once the cyclic garbage is collected. The price is CPU time: each such tensor's pages are mapped
and zeroed afresh (measured: about a quarter more CPU time at width 512, where the blocks' work
is small). A ``MALLOC_MMAP_THRESHOLD_`` set in the environment is left as it is (set it, e.g.
to 33554432, to trade that memory back for the CPU time). Elsewhere than glibc both are
skipped.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil

import torch
from torch import nn

from dualdrop.nn._inputs import check_model
from dualdrop.nn._memory import set_malloc, trim_heap
from dualdrop.nn.oneshot.blocks import find_blocks
from dualdrop.nn.oneshot.storage import Resume

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
REST = "model-rest.safetensors"
#: the folder in ``out_dir`` that records the finished blocks of a run from disk
PROGRESS = ".oneshot-progress"
#: glibc's mmap threshold while pruning from disk: allocations from 1 MiB get their own mapping
MMAP_THRESHOLD = 1 << 20
#: and its trim threshold: free memory above this at the heap's top is given back at once
TRIM_THRESHOLD = 128 << 10


class MemorySource:
    """The model's weights are in memory: nothing to read, write or free. Its hooks of
    ``run.run`` (:meth:`check_model`, :meth:`order`, :meth:`prepare`, :meth:`guard`,
    :meth:`finish`) are those of a model the caller holds."""

    #: whether the pipeline must run block by block (a source that holds one block at a time)
    needs_blocks = False
    #: what the progress bar says after the method's name
    where = ""

    def check_model(self, model) -> None:
        """Before anything runs: a module holding its weights (``nn._inputs.check_model``)."""
        check_model(model, hint="; a checkpoint on disk is pruned by prune_oneshot_from_disk")

    def order(self, steps, trace):
        """``(steps in forward order, steps the forward does not reach)``: ``trace()``, one
        traced forward of the whole model."""
        return trace()

    def prepare(self, model, steps, blocks, fingerprint):
        """Before the pipeline: ``(its resume record, its blocks)``; None and ``blocks`` as
        given here (the pipeline keeps ``checkpoint_dir``'s record itself)."""
        return None, blocks

    @contextlib.contextmanager
    def guard(self, params):
        """The tensors ``params`` (those pruning may write) copied to the CPU, and put back if
        anything fails or the run is interrupted: a refused or failed call leaves the model
        as given."""
        originals = [(p, p.detach().to("cpu", copy=True)) for p in params]
        try:
            yield
        except BaseException:
            with torch.no_grad():
                for p, orig in originals:
                    p.copy_(orig)
            raise

    def finish(self, report) -> None:
        """The run is done; ``report`` is its report."""

    def load(self, k: int, block: nn.Module) -> None:
        """Before block ``k`` runs: its weights in place."""

    def pruned(self, k: int, block: nn.Module) -> None:
        """Block ``k``'s layers are pruned (before the block is recorded as done)."""

    def release(self, k: int, block: nn.Module, write: bool = True) -> None:
        """Block ``k`` is done (``write``: keep what it holds; ``False`` after a probe)."""

    def after_capture(self) -> None:
        """The inputs of the first block are cached: until the epilogue only blocks run."""

    def before_epilogue(self) -> None:
        """The blocks are done: the layers after them run next."""


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


class SafetensorsSource(MemorySource):
    """The weights of a Hugging Face checkpoint folder ``path``, block by block (module
    docstring); the pruned checkpoint goes to ``out_dir``. ``model`` is built on ``meta``
    from the folder's ``config.json`` (``model_class``: the transformers class, default the
    config's ``architectures``). ``run.run`` calls :meth:`prepare` (the blocks found, the
    weights outside them read, the resume record in ``out_dir``), the pipeline
    (``pipeline.run(..., source=self)``), then :meth:`finish`."""

    needs_blocks = True
    where = " from disk"

    def __init__(self, path, out_dir, model_class=None):
        self.ckpt = SafetensorsCheckpoint(path)
        self.path, self.out = self.ckpt.path, os.fspath(out_dir)
        self.model, self.config = _build_meta(self.path, model_class)
        self.t = _Tensors(self.model, self.ckpt)
        self.prefix: list[str] = []
        self.outside: list[str] = []
        self.keep: set = set()
        self.released: list[str] = []
        self.saved: set[int] = set()
        self.resume: Resume | None = None

    def check_model(self, model) -> None:
        """The model is the one this source built on ``meta``: nothing to check."""

    def order(self, steps, trace):
        """No whole-model forward (the weights are on ``meta``): the steps as found; the
        pipeline orders each block's steps by the block's own forward."""
        return steps, []

    def prepare(self, model, steps, blocks, fingerprint):
        """The first container of blocks that holds the steps (``blocks.find_blocks``); the
        resume record in ``out_dir`` (the blocks' pruned weights are kept in their shards,
        the weights outside the blocks by the record itself); :meth:`start`."""
        cands = find_blocks(model, steps, blocks)
        if not cands:
            raise ValueError("no container of blocks (a ModuleList of decoder layers) holds "
                             "the model's layers; pass blocks='model.layers' (its name)")
        label, chain = cands[0]
        os.makedirs(self.out, exist_ok=True)
        resume = Resume(os.path.join(self.out, PROGRESS),
                        {**fingerprint, "path": os.path.abspath(self.path), "blocks": label},
                        store_weights=lambda segment: not segment.startswith("block-"))
        self.start(chain, steps, resume)  # reads the weights outside the blocks
        return resume, label if blocks is None else blocks

    @contextlib.contextmanager
    def guard(self, params):
        """Nothing to put back: the checkpoint read is never written, and ``out_dir`` keeps
        the finished blocks for a run started again."""
        yield

    def start(self, chain, steps, resume: Resume) -> None:
        """The blocks (``(name, module)`` in forward order), the steps to prune, the run's
        resume record (a finished block's weights are read back from its shard); the weights
        outside the blocks are read, glibc's mmap threshold fixed (module docstring)."""
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # the user's own choice stands
            # the trim threshold back to glibc's default (the dynamic threshold had raised it
            # with the mmap threshold, up to 64 MB kept at the heap's top)
            set_malloc(MMAP_THRESHOLD, TRIM_THRESHOLD)
        self.prefix = [name for name, _ in chain]
        pre = tuple(p + "." for p in self.prefix)
        self.outside = [n for n in self.t.params if not n.startswith(pre)]
        # pruned outside the blocks (a prologue or epilogue layer): kept through the blocks
        self.keep = {n for s in steps for n, _ in s.parameters() if not n.startswith(pre)}
        self.resume = resume
        self.t.load(self.outside)

    def _names(self, k):
        pre = self.prefix[k] + "."
        return [n for n in self.t.params if n.startswith(pre)]

    @staticmethod
    def shard(k) -> str:
        return f"model-block-{k:05d}.safetensors"

    def load(self, k, block):
        names = self._names(k)
        if self.resume is not None and self.resume.done(f"block-{k:04d}") is not None:
            # finished before an interruption: the pruned weights are in its shard
            safe_open, _ = _safetensors()
            with safe_open(os.path.join(self.out, self.shard(k)), framework="pt") as f:
                for n in names:
                    self.t._set(self.t.group[n], f.get_tensor(n).to(self.t.params[n].dtype))
        else:
            self.t.load(names)

    def pruned(self, k, block):
        _, save_file = _safetensors()
        tensors = {n: self.t.stored(n) for n in self._names(k)}
        path = os.path.join(self.out, self.shard(k))
        save_file(tensors, path + ".tmp", metadata={"format": "pt"})
        os.replace(path + ".tmp", path)
        self.saved.add(k)

    def release(self, k, block, write=True):
        if write and k not in self.saved:
            self.pruned(k, block)  # a block without prunable layers: written as read
        self.t.release(self._names(k))
        # whatever the cyclic collector holds freed now rather than at its next turn, then the
        # heap's free pages back
        gc.collect()
        trim_heap()

    def after_capture(self):
        """The weights outside the blocks that no layer of the prologue pruned go back to
        ``meta`` until the epilogue (an embedding of 32,000 x 2,048 is 262 MB)."""
        self.released = [n for n in self.outside if n not in self.keep]
        self.t.release(self.released)

    def before_epilogue(self):
        self.t.load(self.released)
        self.released = []

    def finish(self, report) -> None:
        """Write the weights outside the blocks (pruned prologue / epilogue layers included),
        the index of every shard, the checkpoint's other files (config, tokenizer,
        generation config: as they were) and ``oneshot_report.json`` (``report``) to
        ``out_dir``; the resume record goes."""
        _, save_file = _safetensors()
        rest = {n: self.t.stored(n) for n in self.outside
                if n == self.t.group[n][0] and n in self.t.key}
        save_file(rest, os.path.join(self.out, REST + ".tmp"), metadata={"format": "pt"})
        os.replace(os.path.join(self.out, REST + ".tmp"), os.path.join(self.out, REST))
        weight_map = {n: REST for n in rest}
        total = sum(t.numel() * t.element_size() for t in rest.values())
        for k in range(len(self.prefix)):
            for n in self._names(k):
                if n == self.t.group[n][0]:
                    weight_map[n] = self.shard(k)
                    p = self.t.params[n]
                    total += p.numel() * self.t.dtype.get(self.t.key.get(n), p.dtype).itemsize
        write_json(os.path.join(self.out, INDEX), {"metadata": {"total_size": total},
                                                   "weight_map": weight_map})
        for f in os.listdir(self.path):
            src = os.path.join(self.path, f)
            if os.path.isfile(src) and not f.endswith((".safetensors", ".bin", ".pt", ".pth")) \
                    and f != INDEX:
                shutil.copyfile(src, os.path.join(self.out, f))
        write_json(os.path.join(self.out, "oneshot_report.json"), report.to_dict())
        shutil.rmtree(os.path.join(self.out, PROGRESS), ignore_errors=True)


def write_json(path, obj) -> None:
    """``obj`` as JSON in ``path``, written to a temporary name and moved into place."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
