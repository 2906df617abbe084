"""Depth regularity of residual networks: are the weights a Lipschitz function of depth?

Marion, Wu, Sander, Biau ("Implicit regularization of deep residual networks towards neural
ODEs") study residual networks with blocks scaled by ``1/L``,

    h_{l+1} = h_l + (1/L) sigma(W_{l+1} h_l + b_{l+1}),      l = 0, ..., L - 1,

the Euler discretization of ``dh/ds = sigma(W(s) h + b(s))`` on ``s in [0, 1]`` when
``W_l = W(l/L)``.  If the initialization is smooth in depth (``W_l = W(l/L)`` for a Lipschitz
``W``) or tied (``W_l = W``), gradient-flow training keeps ``l -> W_l`` Lipschitz with a constant
independent of ``L`` and the trained network stays a discretized neural ODE; with i.i.d.
initialization consecutive weights differ by ``O(1)`` and the large-depth limit is an SDE.  The
paper's diagnostic is the discrete Lipschitz constant

    Lip = L * max_l ||W_{l+1} - W_l||_F,

bounded in ``L`` for the ODE regime and growing like ``L`` for i.i.d. weights.

:func:`depth_regularity` computes it (and the same for biases) from a list of per-block tensors or
from a model; :func:`residual_mlp` builds the network above with smooth, tied or i.i.d.
initialization.  For a sparsified model (``dualdrop.nn.sparsify``) the weights read are the
effective ones of the eval-mode forward (``module.weight`` through its parametrization: the
pruned, deterministic test-time weight).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from dualdrop.diagnostics._core import _mode

INITS = ("smooth", "tied", "iid")
ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "gelu": nn.functional.gelu}


class ResidualBlock(nn.Module):
    """``h -> h + scale * activation(W h + b)`` (one ``nn.Linear`` named ``linear``)."""

    def __init__(self, width: int, scale: float, activation: str):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.scale = scale
        self.activation = activation

    def forward(self, h):
        return h + self.scale * ACTIVATIONS[self.activation](self.linear(h))


class ResidualMLP(nn.Module):
    """``Linear(in, width) -> L residual blocks -> Linear(width, out)``; ``blocks`` in order."""

    def __init__(self, in_features, width, depth, out_features, scale, activation):
        super().__init__()
        self.embed = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(ResidualBlock(width, scale, activation) for _ in range(depth))
        self.readout = nn.Linear(width, out_features)
        self.depth = depth

    def forward(self, x):
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h)
        return self.readout(h)


def _smooth_path(depth: int, shape, std: float, gen) -> torch.Tensor:
    """``W(l/L) = A cos(pi l/L) + B sin(pi l/L)``, ``A, B`` i.i.d. ``N(0, std^2)``: every layer has
    the i.i.d. layer's marginal law, and ``||W'||_F <= pi sqrt(||A||^2 + ||B||^2)``."""
    A = torch.randn(*shape, generator=gen) * std
    B = torch.randn(*shape, generator=gen) * std
    s = torch.arange(1, depth + 1, dtype=torch.float32) / depth
    ang = math.pi * s.view(-1, *([1] * len(shape)))
    return A * torch.cos(ang) + B * torch.sin(ang)


def residual_mlp(in_features: int, width: int, depth: int, out_features: int, *,
                 init: str = "smooth", scale: float | None = None, activation: str = "tanh",
                 std: float = 1.0, seed: int = 0) -> ResidualMLP:
    """The residual MLP of the module docstring with blocks scaled by ``scale`` (default ``1/L``).

    ``init``: ``"smooth"`` (``W_l = W(l/L)``, a random smooth curve), ``"tied"`` (one random
    ``W`` for every block) or ``"iid"`` (independent layers); block entries have standard
    deviation ``std / sqrt(width)`` in each case (biases ``std``).  Embedding and readout keep
    torch's default initialization (seeded by ``seed`` as well).
    """
    for name, v in (("in_features", in_features), ("width", width), ("depth", depth),
                    ("out_features", out_features)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name}={v!r}; expected a positive int")
    if init not in INITS:
        raise ValueError(f"init={init!r}; choose one of {', '.join(INITS)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    if scale is None:
        scale = 1.0 / depth
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not scale > 0:
        raise ValueError(f"scale={scale!r}; expected a positive number (None: 1/depth)")
    if isinstance(std, bool) or not isinstance(std, numbers.Real) or not std >= 0:
        raise ValueError(f"std={std!r}; expected a non-negative number")
    torch.manual_seed(seed)
    net = ResidualMLP(in_features, width, depth, out_features, float(scale), activation)
    gen = torch.Generator().manual_seed(seed + 1)
    w_std = std / math.sqrt(width)
    if init == "smooth":
        W = _smooth_path(depth, (width, width), w_std, gen)
        b = _smooth_path(depth, (width,), std, gen)
    elif init == "tied":
        W = (torch.randn(width, width, generator=gen) * w_std).expand(depth, -1, -1)
        b = (torch.randn(width, generator=gen) * std).expand(depth, -1)
    else:
        W = torch.randn(depth, width, width, generator=gen) * w_std
        b = torch.randn(depth, width, generator=gen) * std
    with torch.no_grad():
        for l, blk in enumerate(net.blocks):
            blk.linear.weight.copy_(W[l])
            blk.linear.bias.copy_(b[l])
    return net


def _block_tensors(model: nn.Module):
    """Per-block (weights, biases) of a model: its ``blocks`` (a ModuleList of identical blocks)
    if it has one, else every ``nn.Linear`` whose weight has the most common square shape."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)) and len(blocks) >= 2:
        mods = list(blocks)
        per = [[m for m in blk.modules() if isinstance(m, nn.Linear)] for blk in mods]
    else:
        lin = [m for m in model.modules() if isinstance(m, nn.Linear)
               and m.weight.shape[0] == m.weight.shape[1]]
        if not lin:
            raise ValueError("model has no `blocks` ModuleList and no square nn.Linear layer; "
                             "pass the per-block weights as a list of tensors")
        shapes = [tuple(m.weight.shape) for m in lin]
        common = max(set(shapes), key=shapes.count)
        per = [[m] for m in lin if tuple(m.weight.shape) == common]
    if any(not p for p in per):
        raise ValueError("a block of model.blocks has no nn.Linear layer")
    with _mode(model, False), torch.no_grad():
        W = [torch.cat([m.weight.detach().reshape(-1) for m in p]) for p in per]
        B = [torch.cat([m.bias.detach().reshape(-1) for m in p]) if all(
            m.bias is not None for m in p) else None for p in per]
    return W, (None if any(b is None for b in B) else B)


def _profile(ts, prefix):
    T = torch.stack([t.detach().to(torch.float64).reshape(-1) for t in ts])
    diff = (T[1:] - T[:-1]).norm(dim=1)
    L = T.shape[0]
    return {f"{prefix}diff": diff.tolist(), f"{prefix}norm": T.norm(dim=1).tolist(),
            f"{prefix}lipschitz": float(L * diff.max()),
            f"{prefix}lipschitz_mean": float(L * diff.mean())}


def depth_regularity(weights, biases=None) -> dict:
    """How smoothly the residual blocks' parameters vary with depth ``l / L``.

    ``weights``: a model (its ``blocks`` in order, each block's ``nn.Linear`` weights concatenated;
    without ``blocks``, its square ``nn.Linear`` layers of the most common shape, in module order)
    or a list of ``L >= 2`` tensors of one shape, in depth order; ``biases`` optionally a list of
    ``L`` tensors (taken from the model when a model is given).

    Returns a dict: ``depth`` (``L``), ``diff`` (``||W_{l+1} - W_l||_F``, ``L - 1`` floats),
    ``norm`` (``||W_l||_F``), ``lipschitz`` (``L * max_l ||W_{l+1} - W_l||_F``, the paper's
    discrete Lipschitz constant), ``lipschitz_mean`` (``L`` times the mean difference), and the
    same for the biases under ``bias_diff``, ``bias_norm``, ``bias_lipschitz``,
    ``bias_lipschitz_mean`` when there are biases.
    """
    if isinstance(weights, nn.Module):
        if biases is not None:
            raise ValueError("biases must be None when weights is a model (they are read from it)")
        W, B = _block_tensors(weights)
    elif isinstance(weights, (list, tuple)):
        W, B = list(weights), (None if biases is None else list(biases))
    else:
        raise TypeError("weights must be an nn.Module or a list of per-block tensors, got "
                        f"{type(weights).__name__}")
    for name, ts in (("weights", W), ("biases", B)):
        if ts is None:
            continue
        if len(ts) < 2:
            raise ValueError(f"{name}: need at least 2 blocks, got {len(ts)}")
        if not all(isinstance(t, torch.Tensor) for t in ts):
            raise TypeError(f"{name} must be torch tensors")
        if len({tuple(t.shape) for t in ts}) != 1:
            raise ValueError(f"{name}: every block must have the same shape, got "
                             f"{sorted({tuple(t.shape) for t in ts})}")
    if B is not None and len(B) != len(W):
        raise ValueError(f"biases has {len(B)} blocks but weights has {len(W)}")
    out = {"depth": len(W)}
    out.update(_profile(W, ""))
    if B is not None:
        out.update(_profile(B, "bias_"))
    return out
