"""What the second process of ``_ahead`` runs: the polish of a tiny random layer, which
compiles (and caches) every polish kernel for the argument types of a real layer."""

from __future__ import annotations

import torch

from .base import Budget
from .polish import polish


def compile_polish() -> None:
    """Polish a tiny random layer (12 x 40 weights, a quarter kept, the Gram of 96 random
    inputs): every kernel of the polish is called, so numba compiles and caches each one."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(96, 40, generator=g, dtype=torch.float64)
    W0 = torch.randn(12, 40, generator=g, dtype=torch.float64)
    k = W0.numel() // 4
    W = W0 * (W0.abs() >= W0.abs().flatten().kthvalue(W0.numel() - k).values)
    polish(W, W0, X.T @ X, Budget(n_keep=k))
