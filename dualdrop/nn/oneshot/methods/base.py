"""The one-shot layer problem, its budget, and the base class of every one-shot method.

One-shot pruning replaces a trained layer ``W0`` (``out x in``) by a sparse ``W`` that keeps the
layer's outputs on calibration inputs ``X`` (``n x in``, one row per sample, token or image
patch)::

    min_W  ||X (W - W0)^T||_F^2     subject to the budget,

and since ``||X (W - W0)^T||_F^2 = n tr((W - W0) G (W - W0)^T)`` with ``G = X^T X / n``, the
problem is the pair ``(W0, G)``: no method ever needs ``X`` itself, and every output row is a
least-squares problem in the same Gram matrix. The *layer objective* reported for every layer
is the relative reconstruction error ``tr((W - W0) G (W - W0)^T) / tr(W0 G W0^T)`` (0: the layer's
outputs are unchanged; 1: as bad as outputting zero).

The contract every method follows (a method is one module in this package plus one line in
``dualdrop.nn.oneshot.registry``):

- ``W0``: ``(out, in)`` float64, the dense weight (a convolution's kernel flattened to
  ``(out, in * kh * kw)``, a transformers ``Conv1D`` transposed to ``(out, in)``);
- ``G``: ``(in, in)`` float64, symmetric positive semi-definite, *undamped*: each method damps as
  it needs (SparseGPT adds a fraction of the mean diagonal, a refit a tiny one);
- ``budget``: a :class:`Budget`, exactly one of ``n_keep`` (the number of nonzeros in the whole
  layer: the unstructured budget is per layer, as in ALPS, not per row) or ``pattern = (N, M)``
  (at most N nonzeros in every M consecutive inputs of each row; 2:4 and 4:8 are what sparse
  tensor cores run);
- ``prune`` returns ``(out, in)`` float64 whose zeros are exact and meet the budget: at most
  ``n_keep`` nonzeros (exactly ``n_keep`` unless kept weights are exactly 0), or the N:M
  pattern in every group.

Subclasses set ``name`` and ``defaults`` and implement ``_prune(W0, G, budget)``; the public
``prune`` checks the inputs, calls it, refits the kept weights by least squares on their
support when ``refit=True`` (an option of every method) and checks the result meets the budget.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from penalties._numba_cache import announce_first_use
from penalties.checks import check_float

#: options every method takes, with their defaults
COMMON_DEFAULTS = {"refit": False}


@dataclass(frozen=True)
class Budget:
    """What one layer may keep: exactly one of ``n_keep`` (nonzeros in the whole ``(out, in)``
    layer) or ``pattern=(N, M)`` (at most N nonzeros in every M consecutive inputs of a row)."""

    n_keep: int | None = None
    pattern: tuple[int, int] | None = None

    def __post_init__(self):
        if (self.n_keep is None) == (self.pattern is None):
            raise ValueError("a Budget takes exactly one of n_keep=... (nonzeros in the layer) "
                             "or pattern=(N, M)")
        if self.n_keep is not None:
            if isinstance(self.n_keep, bool) or not isinstance(self.n_keep, int) \
                    or self.n_keep < 0:
                raise ValueError(f"n_keep={self.n_keep!r}; expected an int >= 0")
        else:
            p = self.pattern
            if (not isinstance(p, tuple) or len(p) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int) for v in p)
                    or not 0 < p[0] <= p[1]):
                raise ValueError(f"pattern={p!r}; expected (N, M) with 0 < N <= M, e.g. (2, 4)")

    def check_shape(self, shape) -> None:
        """Refuse a budget the ``(out, in)`` layer cannot meet."""
        out, inp = shape
        if self.n_keep is not None and self.n_keep > out * inp:
            raise ValueError(f"n_keep={self.n_keep} exceeds the layer's {out * inp} weights")
        if self.pattern is not None and inp % self.pattern[1]:
            raise ValueError(f"pattern {self.pattern[0]}:{self.pattern[1]} needs the number of "
                             f"inputs ({inp}) to be a multiple of {self.pattern[1]}")

    def keep_count(self, shape) -> int:
        """The number of weights the budget keeps in an ``(out, in)`` layer."""
        out, inp = shape
        if self.n_keep is not None:
            return self.n_keep
        return out * (inp // self.pattern[1]) * self.pattern[0]

    def met_by(self, W: torch.Tensor) -> bool:
        """Whether the exact zeros of ``W`` meet the budget."""
        nz = W != 0
        if self.n_keep is not None:
            return int(nz.sum()) <= self.n_keep
        n, m = self.pattern
        return bool((nz.reshape(W.shape[0], -1, m).sum(-1) <= n).all())


def parse_pattern(pattern) -> tuple[int, int]:
    """``"2:4"`` (or ``(2, 4)``) as ``(2, 4)``; a ``ValueError`` naming ``pattern`` otherwise."""
    if isinstance(pattern, str):
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", pattern)
        if m is None:
            raise ValueError(f"pattern={pattern!r}; expected 'N:M', e.g. '2:4' or '4:8'")
        pattern = (int(m.group(1)), int(m.group(2)))
    if (not isinstance(pattern, (tuple, list)) or len(pattern) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in pattern)
            or not 0 < pattern[0] < pattern[1]):
        raise ValueError(f"pattern={pattern!r}; expected 'N:M' with 0 < N < M, e.g. '2:4'")
    return int(pattern[0]), int(pattern[1])


@dataclass
class LayerProblem:
    """One layer's one-shot problem: its name, dense weight ``W0`` ``(out, in)`` and input Gram
    ``G = X^T X / n`` ``(in, in)``, both float64 (the module docstring)."""

    name: str
    W0: torch.Tensor
    G: torch.Tensor


# ---- shared tools of the methods -----------------------------------------------------------------

def layer_objective(W: torch.Tensor, W0: torch.Tensor, G: torch.Tensor) -> float:
    """``||X (W - W0)^T||^2 / ||X W0^T||^2 = tr(D G D^T) / tr(W0 G W0^T)``, ``D = W - W0``
    (0 when the layer's outputs on the calibration inputs are 0, i.e. nothing to keep)."""
    D = (W - W0).to(torch.float64)
    W0 = W0.to(torch.float64)
    num = float(((D @ G) * D).sum())
    den = float(((W0 @ G) * W0).sum())
    return num / den if den > 0 else 0.0


def select_mask(score: torch.Tensor, budget: Budget) -> torch.Tensor:
    """Boolean ``(out, in)`` mask of the weights of highest ``score`` meeting ``budget`` exactly:
    the ``n_keep`` highest over the whole layer, or the N highest of every M consecutive inputs
    of each row (ties to the lower index, deterministically)."""
    out, inp = score.shape
    if budget.n_keep is not None:
        flat = score.reshape(-1)
        keep = torch.zeros(flat.numel(), dtype=torch.bool, device=score.device)
        if budget.n_keep:
            keep[_top_indices(flat, budget.n_keep)] = True
        return keep.view(out, inp)
    n, m = budget.pattern
    groups = score.reshape(out, inp // m, m)
    idx = torch.sort(groups, dim=-1, descending=True, stable=True).indices[..., :n]
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, idx, True)
    return keep.view(out, inp)


def _top_indices(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries (a stable sort: ties to the lower index)."""
    return torch.sort(flat, descending=True, stable=True).indices[:k]


def split_count(total: int, sizes) -> list[int]:
    """``total`` split over parts of the given sizes in proportion, exactly (largest remainders,
    ties to the earlier part; no part above its size)."""
    sizes = [int(s) for s in sizes]
    whole = sum(sizes)
    if not 0 <= total <= whole:
        raise ValueError(f"cannot split {total} over parts of {whole} in all")
    if whole == 0:
        return [0] * len(sizes)
    exact = [total * s / whole for s in sizes]
    base = [min(s, math.floor(e)) for s, e in zip(sizes, exact)]
    left = total - sum(base)
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order:
        if left == 0:
            break
        if base[i] < sizes[i]:
            base[i] += 1
            left -= 1
    return base


def refit_on_support(W0: torch.Tensor, W: torch.Tensor, G: torch.Tensor, *,
                     damp: float = 1e-10) -> torch.Tensor:
    """The least-squares refit of every row on its support ``S`` (the nonzeros of ``W``):

        w_S = w0_S + G_SS^{-1} G_{S, S^c} w0_{S^c},

    the minimizer of ``(w - w0)^T G (w - w0)`` over ``w`` with ``w_{S^c} = 0`` (its gradient on
    ``S``, ``G_SS (w_S - w0_S) - G_{S,S^c} w0_{S^c}``, vanishes). ``G_SS`` gets ``damp`` times its
    mean diagonal on the diagonal (collinear inputs); kept weights of inputs never seen on the
    calibration data (``G_jj = 0``: they do not change the objective) keep ``W``'s value, so the
    refit never turns a kept weight into a zero it did not choose; a row whose refit is not
    finite keeps ``W``'s row. Rows that share their support are solved together."""
    W0 = W0.to(torch.float64)
    out = W.to(torch.float64).clone()
    live = G.diagonal() > 0
    support = (W != 0) & live.unsqueeze(0)
    keys: dict[bytes, list[int]] = {}
    for r in range(W0.shape[0]):
        keys.setdefault(support[r].cpu().numpy().tobytes(), []).append(r)
    for rows in keys.values():
        s = support[rows[0]]
        if not bool(s.any()):
            continue
        rows_t = torch.tensor(rows, device=W0.device)
        Gss = G[s][:, s]
        eps = damp * float(Gss.diagonal().mean())
        Gss = Gss + eps * torch.eye(Gss.shape[0], dtype=Gss.dtype, device=Gss.device)
        rhs = G[s] @ W0[rows_t].T                     # (G w0)_S = G_SS w0_S + G_SSc w0_Sc
        try:
            sol = torch.cholesky_solve(rhs, torch.linalg.cholesky(Gss))
        except RuntimeError:
            sol = torch.linalg.lstsq(Gss, rhs).solution
        block = out[rows_t]
        block[:, s] = sol.T
        fine = torch.isfinite(block).all(1)
        out[rows_t[fine]] = block[fine]
    return out


# ---- the base class ------------------------------------------------------------------------------

class OneShotMethod:
    """Base of every one-shot method: ``name``, ``defaults`` (options and their defaults; the
    common ``refit`` is added), ``__init__(**options)`` validating them (a ``ValueError`` naming
    the option), and ``prune(W0, G, budget)`` around the subclass's ``_prune``.

    A subclass implements ``_prune(W0, G, budget) -> W`` (the module docstring's contract; the
    inputs are already checked) and, for option checks beyond "a known name", ``_validate(opts)
    -> opts`` (use ``penalties.checks.check_float`` / ``check_int`` / ``check_choice``).
    ``self.options`` holds the validated options.
    """

    name: str = ""
    defaults: dict = {}
    #: ``_prune`` returns the least-squares refit of its support itself when ``refit=True``
    #: (it scored the support by that refit): ``prune`` does not solve it again
    refits_itself: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "prune" in cls.__dict__:
            raise TypeError(f"{cls.__name__} overrides prune(); implement _prune(W0, G, budget) "
                            "instead (prune checks the inputs, refits and checks the budget)")

    def __init__(self, **options):
        known = {**COMMON_DEFAULTS, **self.defaults}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for one-shot method {self.name!r}; "
                             f"its options: {sorted(known)}")
        opts = {**known, **options}
        if not isinstance(opts["refit"], bool):
            raise TypeError(f"refit must be True or False, got {opts['refit']!r}")
        self.options = self._validate(opts)

    def _validate(self, opts: dict) -> dict:
        return opts

    def kernels(self) -> tuple:
        """The numba dispatchers the method compiles on its first use: :meth:`prune` says so
        on stderr before they compile (once a process); none by default."""
        return ()

    def __repr__(self):
        changed = {k: v for k, v in self.options.items()
                   if v != {**COMMON_DEFAULTS, **self.defaults}.get(k)}
        inner = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"{type(self).__name__}({inner})"

    def prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        """The pruned ``(out, in)`` float64 weight (module docstring)."""
        check_problem(W0, G)
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, got {type(budget).__name__}")
        budget.check_shape(W0.shape)
        announce_first_use(self.kernels(), f"one-shot {self.name}")
        W = self._prune(W0, G, budget)
        if not isinstance(W, torch.Tensor) or W.shape != W0.shape:
            raise RuntimeError(f"one-shot method {self.name!r} returned "
                               f"{getattr(W, 'shape', type(W))}, expected {tuple(W0.shape)}")
        W = W.to(torch.float64)
        if self.options["refit"] and not self.refits_itself:
            W = refit_on_support(W0, W, G)
        if not budget.met_by(W):
            raise RuntimeError(f"one-shot method {self.name!r} broke its budget {budget} "
                               f"({int((W != 0).sum())} nonzeros): a bug in the method")
        return W

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        raise NotImplementedError


def check_problem(W0: torch.Tensor, G: torch.Tensor) -> None:
    """Refuse a layer problem that breaks the contract (shapes, float64, finite, symmetric G)."""
    for name, t in (("W0", W0), ("G", G)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float64:
            raise TypeError(f"{name} must be float64 (the layer problem is solved in double "
                            f"precision), got {t.dtype}; pass {name}.double()")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} has non-finite entries (NaN or inf): "
                             + ("the layer's weights hold NaN or inf; prune a finite model"
                                if name == "W0" else
                                "the layer's calibration inputs hold NaN or inf, or their "
                                "Gram X^T X / n overflowed; check the calibration data "
                                "(torch.isfinite(calib).all()) and the outputs of the layers "
                                "before this one, and scale inputs of huge magnitude down"))
    if G.shape != (W0.shape[1], W0.shape[1]):
        raise ValueError(f"G has shape {tuple(G.shape)}; expected ({W0.shape[1]}, "
                         f"{W0.shape[1]}) for W0 of shape {tuple(W0.shape)}")
    scale = float(G.abs().max()) if G.numel() else 0.0
    step = max(1, 2 ** 22 // max(1, G.shape[0]))  # row blocks: no in^2 temporary
    for i in range(0, G.shape[0], step) if scale else ():
        if float((G[i:i + step] - G[:, i:i + step].T).abs().max()) > 1e-8 * scale:
            raise ValueError("G must be symmetric (X^T X / n)")


def check_damp(value, name: str = "damp") -> float:
    """A relative damping: a finite float >= 0 (a fraction of G's mean diagonal)."""
    return check_float(name, value, low=0.0)
