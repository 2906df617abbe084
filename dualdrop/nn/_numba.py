"""Shared machinery of the fused paths: the switch, the dtype rules and the numba options.

Why fused: beyond the matmuls, a method's training step is elementwise work over every weight
(draw noise, evaluate a gate or a penalty slope, mask, add a regularizer's gradient). Written as
torch expressions it becomes a chain of passes, each reading and writing weight-sized tensors and
most allocating one; on one CPU thread a pass over LeNet-300-100's 266k weights costs ~0.05 ms, a
transcendental pass 0.06-0.2 ms, torch's generator 0.7 ms, and the chains made hard-concrete 3.1x
and variational dropout 3.5x a dense step (benchmarks/RESULTS.md). Each method's per-weight work
is therefore one numba loop forward and one backward (plus at most a vectorized torch ``exp``
where a transcendental is unavoidable: numba's scalar ``exp``/``log`` do not vectorize on this
CPU, torch's do), in each method family's ``fused`` module (``dualdrop.nn.methods.<family>``).
Loops compute in the tensor's dtype (float32 arithmetic vectorizes twice as wide as float64) and
use ``error_model="numpy"`` (Python's division checks block vectorization). All loops run on CPU
tensors; on another device every Function falls back to the torch expression of the same formula.

``ENABLED`` (default on, or ``DUALDROP_FUSED=0``) switches every fused path at once: off, every
method runs its reference torch expressions with torch's generator.

Keys and exact resume: every draw is a pure function of ``make_key(seed, rank, counter)``
(``dualdrop.nn._base.NoiseState``, ``dualdrop.nn._noise``): each stochastic state draws its seed
from torch's generator when built and counts its training forwards; both are host integers in the
state dict, so a checkpoint resumes the exact noise sequence. A per-forward counter rather than
the optimizer step keeps micro-batches of one step (gradient accumulation) on fresh noise; the
rank of ``torch.distributed`` separates the processes of a data-parallel run. A parametrization
must return one tensor, so the second output (expected L0 or KL) is kept on the state for
``regularizer_term`` to take (once, only under autograd).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from dualdrop.nn._base import compiling

#: numba options of the loops (numpy's error model: no division checks, so loops vectorize)
NUMBA = dict(cache=True, error_model="numpy")
#: the same for reductions, which may reassociate
NUMBA_SUM = dict(cache=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract"})
NP_TYPES = {torch.float32: np.float32, torch.float64: np.float64}


#: whether the methods use these Functions (``DUALDROP_FUSED=0`` in the environment, or False
#: here, restores the earlier torch expressions and torch's generator: the benchmark's "before")
ENABLED = os.environ.get("DUALDROP_FUSED", "1") != "0"


def active(*tensors) -> bool:
    """Whether the methods take the fused path for ``tensors`` (enabled, float32/float64, not
    under ``torch.compile``)."""
    if not ENABLED or compiling():
        return False
    for t in tensors:
        if t.dtype not in NP_TYPES:
            return False
    return True


def np_type(t: torch.Tensor):
    """The numpy scalar type of ``t`` (the loops' arithmetic type)."""
    return NP_TYPES[t.dtype]


def check_inputs(**tensors) -> None:
    """Tensors of one floating dtype the loops support, with a clear error otherwise."""
    dtypes = set()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in NP_TYPES:
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
        dtypes.add(t.dtype)
    if len(dtypes) > 1:
        raise TypeError(f"{', '.join(tensors)} must share one dtype, got "
                        f"{sorted(map(str, dtypes))}")


def check_same_shape(w: torch.Tensor, other: torch.Tensor, name: str) -> None:
    """A clear error when ``other`` (named ``name``) has not ``w``'s shape."""
    if w.shape != other.shape:
        raise ValueError(f"{name} must have w's shape {tuple(w.shape)}, got "
                         f"{tuple(other.shape)}")


def flat(t: torch.Tensor) -> np.ndarray:
    """A zero-copy flat numpy view of a CPU tensor (a copy if it is not contiguous)."""
    return t.detach().contiguous().view(-1).numpy()


def is_cpu(*ts) -> bool:
    """Whether every tensor lives on the CPU (where the loops run)."""
    return all(t.device.type == "cpu" for t in ts)
