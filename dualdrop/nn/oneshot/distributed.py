"""One-shot pruning across processes (``torchrun``): the calibration data split over the ranks,
the Grams summed, the layers of a stage solved on different ranks.

Under ``torch.distributed`` (any backend: ``gloo`` on CPUs, ``nccl`` on GPUs) every rank runs
``prune_oneshot`` on the same model and the same calibration batches; the pipeline
(``pipeline``) then:

- checks, before the first stage, that every rank was given the same calibration batches (the
  ranks compare their batch counts and a checksum of the batches' tensors): a rank given only
  its own shard (as a ``DistributedSampler`` deals them) would otherwise prune from a fraction
  of the data without a word, so differing batches are refused with a ``ValueError`` on every
  rank, unless ``calibration_sharded=True`` says that each rank holds its own shard;
- feeds each rank the batches ``b`` with ``b % world_size == rank`` (the forward passes, the
  activation cache and the Gram products are split ``world_size`` ways), or, with
  ``calibration_sharded=True``, every batch of its own shard;
- sums each stage's Grams and row counts over the ranks (``all_reduce``) before any layer is
  solved, so every rank holds the Grams one process would have (the same sums, added in
  another order: equal to float tolerance);
- solves the stage's layers round-robin over the ranks (an attention's separate q/k/v
  projections, an MLP's gate and up projections are solved at the same time), and broadcasts
  each pruned weight and its report rows from the rank that solved it.

So the pruned model is the same on every rank and equal to one process's, to float tolerance.
A stage of one layer (GPT-2's fused ``c_attn``) is solved on one rank while the others wait: the
split pays on the forward passes and Grams, and on the solves of stages of several layers.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping

import torch


class DistContext:
    """The ranks of the default process group (or ``group``), as the pipeline uses them."""

    def __init__(self, group=None, sharded: bool = False):
        import torch.distributed as dist  # lazy: start-up time (only under torchrun)

        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.sharded = sharded

    def mine(self, b: int) -> bool:
        """Whether calibration batch ``b`` is this rank's: every batch of a rank's own shard,
        else one batch in ``world_size``."""
        return self.sharded or b % self.world == self.rank

    def check_calibration(self, calib) -> None:
        """Compare the ranks' calibration data (batch count and checksum) before any pass:
        without ``sharded``, every rank must hold the same batches; with it, every rank at
        least one batch (a rank without any would leave the others waiting for it)."""
        mine = calibration_digest(calib)
        seen = [None] * self.world
        self.dist.all_gather_object(seen, mine, group=self.group)
        counts = ", ".join(f"rank {r}: {n} batches, checksum {d[:8]}"
                           for r, (n, d) in enumerate(seen))
        if self.sharded:
            if min(n for n, _ in seen) == 0:
                raise ValueError(f"calibration_sharded=True, but a rank holds no calibration "
                                 f"batch ({counts}); give every rank at least one batch")
            if all(s == seen[0] for s in seen):
                warnings.warn(f"calibration_sharded=True, but every rank holds the same "
                              f"{seen[0][0]} batches: each is counted {self.world} times (the "
                              "Grams are the same, the work is not split); drop "
                              "calibration_sharded to have the ranks split the batches",
                              UserWarning, stacklevel=4)
        elif any(s != seen[0] for s in seen):
            raise ValueError(f"the ranks were given different calibration data ({counts}): "
                             "under torchrun the one-shot pipeline splits the calibration "
                             "batches over the ranks itself, so give every rank every batch; "
                             "or, if each rank holds its own shard (a DistributedSampler's), "
                             "pass calibration_sharded=True")

    def owner(self, i: int) -> int:
        """The rank that solves the ``i``-th layer of a stage."""
        return i % self.world

    def _src(self, rank: int) -> int:
        return rank if self.group is None else self.dist.get_global_rank(self.group, rank)

    def all_reduce_grams(self, acc) -> None:
        """Sum a stage's ``GramAccumulator`` over the ranks (sums and row counts)."""
        keys = sorted(acc.sums, key=repr)
        counts = torch.tensor([acc.rows[k] for k in keys] + [len(keys)], dtype=torch.float64)
        dev = next(iter(acc.sums.values())).device if keys else torch.device("cpu")
        if self._backend() == "nccl":
            counts = counts.to(dev)
        n = counts.clone()
        self.dist.all_reduce(n, op=self.dist.ReduceOp.MAX, group=self.group)
        if int(n[-1]) != len(keys) or any(acc.rows[k] == 0 for k in keys):
            raise RuntimeError("a rank saw no calibration input for this stage: give at least "
                               f"as many calibration batches as processes ({self.world})")
        for k in keys:
            self.dist.all_reduce(acc.sums[k], group=self.group)
        self.dist.all_reduce(counts, group=self.group)
        for k, c in zip(keys, counts[:-1].tolist()):
            acc.rows[k] = int(round(c))

    def share_step(self, step, owner: int, rows):
        """The pruned weights of ``step`` and its report rows, from the rank that solved it to
        every rank."""
        with torch.no_grad():
            for _, p in step.parameters():
                buf = p.data if p.data.is_contiguous() else p.data.contiguous()
                self.dist.broadcast(buf, src=self._src(owner), group=self.group)
                if buf is not p.data:
                    p.data.copy_(buf)
        box = [rows]
        self.dist.broadcast_object_list(box, src=self._src(owner), group=self.group)
        return box[0]

    def _backend(self) -> str:
        return str(self.dist.get_backend(self.group))


def calibration_digest(calib) -> tuple[int, str]:
    """``(batches, checksum)`` of calibration data: a BLAKE2 digest of every tensor's dtype,
    shape and bytes (dict, tuple and list batches walked in order; other values by ``repr``)."""
    h = hashlib.blake2b(digest_size=16)

    def add(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, Mapping):
            for k, v in x.items():
                h.update(repr(k).encode())
                add(v)
        elif isinstance(x, (tuple, list)):
            h.update(b"(")
            for v in x:
                add(v)
            h.update(b")")
        else:
            h.update(repr(x).encode())

    n = 0
    for batch in calib:
        add(batch)
        n += 1
    return n, h.hexdigest()


def context(distributed, calibration_sharded: bool = False):
    """The distributed context of ``prune_oneshot``'s ``distributed`` argument: ``None``
    (auto: when a process group of two or more ranks is initialized), ``True`` (one must be),
    ``False`` (none). ``calibration_sharded``: each rank holds its own shard of the batches
    (:class:`DistContext`)."""
    if not isinstance(calibration_sharded, bool):
        raise TypeError(f"calibration_sharded must be True or False, got "
                        f"{calibration_sharded!r}")
    if distributed is False:
        return None
    import torch.distributed as dist  # lazy: start-up time (only under torchrun)

    ready = dist.is_available() and dist.is_initialized()
    if distributed is True and not ready:
        raise ValueError("distributed=True needs an initialized torch.distributed process "
                         "group (run under torchrun and call "
                         "torch.distributed.init_process_group first)")
    if not ready or dist.get_world_size() < 2:
        return None
    return DistContext(sharded=calibration_sharded)
