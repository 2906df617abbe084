"""Data parallel over ``torchrun``: one process per device, the same step as one process.

Launched by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment), each process takes an
interleaved share of every global batch, and the gradients are summed with ``all_reduce`` (gloo
on CPU, nccl on CUDA), so that every process makes the step one process would make on the whole
batch. Weights must therefore stay identical across processes; :meth:`Dist.check_in_sync`
verifies it after every epoch. For a single process every method is a no-op.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn


class Dist:
    """World description; a no-op for a single process."""

    def __init__(self, device: torch.device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.owned = False
        self.device = device
        if self.world > 1:
            import torch.distributed as dist

            if device.type == "cuda":
                self.device = torch.device("cuda", self.local_rank)
                torch.cuda.set_device(self.device)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
                self.owned = True
            self.world = dist.get_world_size()
            self.rank = dist.get_rank()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def broadcast_module(self, module: nn.Module) -> None:
        if self.world > 1:
            import torch.distributed as dist

            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, 0)

    def allreduce_grads(self, params: list[torch.Tensor]) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def sum_floats(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    @torch.no_grad()
    def check_in_sync(self, module: nn.Module) -> None:
        """Raise if the processes' parameters or buffers have drifted apart (they must not)."""
        if self.world == 1:
            return
        tensors = list(module.parameters()) + [b for b in module.buffers()
                                                if b.is_floating_point()]
        digest = [float(t.double().sum()) for t in tensors]
        digests = self.gather(digest)
        if any(d != digests[0] for d in digests[1:]):
            raise RuntimeError(
                "data-parallel processes hold different weights; a method's state is updated "
                "from per-process randomness or data outside the gradient all-reduce"
            )

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.owned:
            import torch.distributed as dist

            # every rank reaches this point before any tears gloo down: a rank destroying its
            # process group while a peer still uses the connection aborts the peer at exit
            dist.barrier()
            dist.destroy_process_group()

