"""The forward passes of one healing run (``dualdrop.train.heal``): the teacher's targets,
cached in memory or on disk, the student's loss on a batch, the per-block hooks and
projections.

Teacher memory. The teacher runs under ``no_grad``, so it holds one layer's activations at a
time, never a graph; what costs memory is its weights and its cached outputs (a language
model's logits: batch x tokens x vocabulary floats per batch). Three ways to keep them small:

- ``teacher_dtype=torch.bfloat16``: a bfloat16 copy of the teacher runs (half the weights);
- a teacher left on another device than the student (the CPU, say, with the student on a
  GPU): its inputs are moved to its device and its outputs to the student's, so only the
  student's weights, activations and graph take the accelerator's memory;
- ``cache_teacher=FOLDER``: the targets of each batch written to ``FOLDER`` when first
  computed (one ``torch.save`` file a batch, written atomically) and read back memory-mapped
  (``torch.load(mmap=True)``): pages come from the disk as a step reads them and the operating
  system drops them under pressure. After the first epoch the teacher is not run at all; the
  folder survives a kill, so a resumed run (or a second run on the same teacher and data) reads
  what is there. ``FOLDER/teacher.json`` fingerprints the teacher (its parameters' sums), the
  data (every batch's shapes and sums) and what is cached (the losses, the matched blocks): a
  folder of another teacher or data is refused, never read.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import torch
import torch.nn as nn

from dualdrop.nn.oneshot.calibration import token_mask
from dualdrop.nn.oneshot.depth import block_chain
from dualdrop.train import heal_losses as L
from dualdrop.train.checkpoint import atomic_save, atomic_write_json

MANIFEST = "teacher.json"


class HealRun:
    """The teacher and student forward runs of one healing run: targets (cached), the student's
    loss on a batch, the block hooks and projections."""

    def __init__(self, student, teacher, source, fwd, losses, temperature, block_weight,
                 blocks, block_map, teacher_dtype, cache_teacher, cache_mb, dist,
                 label_weight=0.0):
        self.student, self.source, self.fwd, self.dist = student, source, fwd, dist
        self.losses, self.temperature, self.block_weight = losses, temperature, block_weight
        self.label_weight = label_weight
        self.teacher = teacher if teacher_dtype is None else copy.deepcopy(teacher).to(
            teacher_dtype)
        self.teacher.eval()
        self.dtype = teacher_dtype
        self.t_device = next((p.device for p in self.teacher.parameters()), None)
        self.disk = None if isinstance(cache_teacher, (bool, str)) and cache_teacher in (
            True, False, "auto") else Path(cache_teacher)
        self.cache, self.cache_on = {}, (cache_teacher is True or (
            cache_teacher == "auto" and source.cacheable)) and source.cacheable
        self.cache_mb = cache_mb
        self.captured = {"s": [], "t": []}
        self.hooks = []
        self.projections = nn.ModuleList()
        self.map = None
        if block_weight > 0:
            sb, tb = _blocks(student, blocks, "student"), _blocks(self.teacher, blocks, "teacher")
            self.map = list(block_map) if block_map is not None else L.default_block_map(
                len(sb), len(tb))
            if len(self.map) != len(sb) or not all(
                    isinstance(i, int) and 0 <= i < len(tb) for i in self.map):
                raise ValueError(f"block_map must give a teacher block (0..{len(tb) - 1}) for "
                                 f"each of the student's {len(sb)} blocks, got {block_map!r}")
            for m in sb:  # the student's blocks run in order
                self.hooks.append(m.register_forward_hook(
                    lambda mod, a, out: self.captured["s"].append(L.hidden_of(out))))
            for i in sorted(set(self.map)):  # the teacher's, kept by index: block_map's order
                self.hooks.append(tb[i].register_forward_hook(
                    lambda mod, a, out, i=i: self.captured["t"].append((i, L.hidden_of(out)))))
        if self.disk is not None:
            self._claim_disk()

    def close(self):
        for h in self.hooks:
            h.remove()

    def _claim_disk(self):
        """Write ``FOLDER/teacher.json`` (module docstring), or check the one there."""
        h = hashlib.sha256()
        with torch.no_grad():
            for name, t in list(self.teacher.named_parameters()) + list(
                    self.teacher.named_buffers()):
                h.update(f"{name}{tuple(t.shape)}{t.dtype}{float(t.double().sum())!r}".encode())
            for b in self.source.batches:
                for t in _tensors(b):
                    h.update(f"{tuple(t.shape)}{t.dtype}{float(t.double().sum())!r}".encode())
        what = {"teacher_and_data": h.hexdigest(), "batches": len(self.source),
                "losses": repr(self.losses), "blocks": self.map, "world": self.dist.world,
                "dtype": str(self.dtype)}
        path = self.disk / MANIFEST
        if path.is_file():
            try:
                there = json.loads(path.read_text())
            except (OSError, ValueError):
                there = None
            if there != what:
                diff = [k for k in what if not isinstance(there, dict) or there.get(k) != what[k]]
                raise ValueError(f"cache_teacher: {self.disk} holds the outputs of another "
                                 f"healing run (it differs in {', '.join(diff) or 'format'}); "
                                 "delete it or give another folder")
        elif self.dist.main:
            self.disk.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, what)

    def _disk_file(self, key) -> Path:
        return self.disk / f"r{self.dist.rank}-b{key}.pt"

    def shard(self, batch):
        """This rank's rows of a batch (every row for one process)."""
        d = self.dist
        if d.world == 1:
            return batch
        if isinstance(batch, torch.Tensor):
            return batch[d.rank::d.world]
        if isinstance(batch, dict):
            return {k: v[d.rank::d.world] if isinstance(v, torch.Tensor) and v.dim() else v
                    for k, v in batch.items()}
        return type(batch)(self.shard(b) for b in batch)

    def targets(self, key, batch):
        """The teacher's targets of ``batch`` (cached under ``key`` when caching)."""
        if key is not None and key in self.cache:
            return self.cache[key]
        dev = next(self.student.parameters()).device
        if self.disk is not None and key is not None and self._disk_file(key).is_file():
            return {k: _moved(v, dev) for k, v in torch.load(
                self._disk_file(key), map_location="cpu", mmap=True, weights_only=True).items()}
        self.captured["t"] = []
        with torch.no_grad():
            inp = _cast(batch, self.dtype, self.t_device)
            kind, x = L.main_output(self.fwd(self.teacher, inp))
        names = self._names(kind)
        mask = token_mask(batch)
        out = {k: v.to(dev) for k, v in (L.targets_of(names, x, mask) if names else
                                          {"out": x.float()}).items()}
        by_index = dict(self.captured["t"])
        out["blocks"] = [by_index[i].float().to(dev) for i in self.map] if self.map else []
        self.captured["t"] = []
        if self.disk is not None and key is not None:
            self.disk.mkdir(parents=True, exist_ok=True)
            atomic_save({k: _moved(v, "cpu") for k, v in out.items()}, self._disk_file(key))
        elif self.cache_on and key is not None:
            if not self.cache:
                size = sum(t.numel() * 4 for t in _tensors(out)) / 2**20
                self.cache_on = size * len(self.source) <= self.cache_mb
            if self.cache_on:
                self.cache[key] = out
        return out

    def _names(self, kind):
        if callable(self.losses):
            return None
        return L.AUTO[kind] if self.losses == "auto" else self.losses

    def loss(self, key, batch):
        batch = self.shard(batch)
        t = self.targets(key, batch)
        self.captured["s"] = []
        out = self.fwd(self.student, batch)
        kind, x = L.main_output(out)
        names = self._names(kind)
        mask = token_mask(batch)
        if names is None:
            value = self.losses(x, t["out"], batch)
        else:
            s = L.targets_of(names, x, mask)
            for n in names:
                if s[n].shape != t[n].shape:
                    raise ValueError(f"the student's output ({tuple(s[n].shape)}) and the "
                                     f"teacher's ({tuple(t[n].shape)}) differ in shape for loss "
                                     f"{n!r}; heal a student of the teacher's output shape")
            value = L.distill_loss(names, s, t, mask, self.temperature)
        if self.label_weight > 0:
            a = self.label_weight
            value = (1 - a) * value + a * L.label_loss(out, x, batch)
        if self.block_weight > 0:
            value = value + self.block_weight * L.block_loss(self.captured["s"], t["blocks"],
                                                             self.projections, mask)
        self.captured["s"] = []
        return value

    def make_projections(self, key, batch):
        """One no-grad forward of both models on ``batch`` (the teacher's cached under ``key``
        when caching): the projections where a student block's width differs from its teacher
        block's (identity: None)."""
        if self.block_weight <= 0:
            return
        batch = self.shard(batch)
        t = self.targets(key, batch)
        with torch.no_grad():
            self.captured["s"] = []
            self.fwd(self.student, batch)
        dev = next(self.student.parameters()).device
        for a, b in zip(self.captured["s"], t["blocks"]):
            ws, wt = a.shape[-1], b.shape[-1]
            if ws == wt:
                self.projections.append(nn.Identity())
            else:
                p = nn.Linear(ws, wt, bias=False).to(dev)
                with torch.no_grad():
                    p.weight.zero_()
                    k = min(ws, wt)
                    p.weight[:k, :k] = torch.eye(k)
                self.projections.append(p)
        self.captured["s"] = []


def _blocks(model, blocks, who) -> list:
    """The chain of blocks of ``model``: the modules ``blocks`` lists by name (a network
    without a container of blocks: the hidden layers of an MLP, say), or
    ``depth.block_chain``'s (the container ``blocks`` names, or the largest ModuleList)."""
    if isinstance(blocks, (list, tuple)):
        named = dict(model.named_modules())
        missing = [b for b in blocks if not isinstance(b, str) or b not in named]
        if missing or not blocks:
            raise ValueError(f"blocks: the {who} has no module {missing[0]!r}" if missing else
                             "blocks is an empty list; name the modules whose outputs to match")
        return [named[b] for b in blocks]
    try:
        return list(block_chain(model, blocks)[1])
    except ValueError as exc:
        raise ValueError(f"the {who}: {exc}") from None


def _cast(batch, dtype, device=None):
    """``batch`` on ``device`` (None: where it is), its floating tensors in ``dtype`` (None:
    as they are)."""
    if isinstance(batch, torch.Tensor):
        if dtype is not None and batch.is_floating_point():
            batch = batch.to(dtype)
        return batch if device is None else batch.to(device)
    if isinstance(batch, dict):
        return {k: _cast(v, dtype, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_cast(b, dtype, device) for b in batch)
    return batch


def _moved(v, device):
    """A target (a tensor, or the list of block states) on ``device``."""
    return [t.to(device) for t in v] if isinstance(v, list) else v.to(device)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
