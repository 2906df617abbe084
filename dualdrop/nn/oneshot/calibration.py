"""The calibration forward: its mode, the batches fed, the hooks, the float64 Gram accumulation.

Layers are pruned in the order the forward calls them, each one on the inputs it receives from
the layers already pruned (as SparseGPT and llm-compressor's sequential pipeline do), so a
layer's problem accounts for the error its predecessors left. ``pipeline`` organizes the passes
(block by block, cost linear in depth); this module gives it its parts:

1. :class:`GramAccumulator`: forward pre-hooks on the layers of a *stage* (the layers one pass
   feeds: those that read the same tensor, as an attention's q/k/v projections do) turn their
   inputs into rows of ``X`` (im2col for a convolution, the recomputed context for an
   attention's output projection) and add ``X^T X`` to a float64 sum, batch by batch, so no
   activation outlives its batch; layers that read the same input share one sum, hence one
   Gram (the same tensor object, which the methods may factorize once);
2. the pass stops once the stage's layers have had their inputs (an exception caught here: the
   rest of the forward is not run);
3. ``G = sum X^T X / n`` goes to the method with the layer's dense weight.

**Padding.** Only real tokens enter a Gram: for a batch given as a dict with a 2-D
``attention_mask`` (a Hugging Face batch) the rows of padded positions are dropped, and
``token_mask_fn(batch)`` (a bool ``(batch, tokens)`` tensor) says which tokens are real for
any other batch (``layers.real_rows``).

**Precision.** Gram sums are float64. The product ``X^T X`` of one batch is formed in float64
for layers of at most :data:`FLOAT64_MAX_IN` inputs and in float32 above
(``gram_precision="auto"``, the default: the float32 product costs half as much on a CPU, and
for wide layers it is the walk's largest cost; SparseGPT's own code works in float32); or always
in ``"float32"`` or ``"float64"``. Float64 inputs always give float64 products.

The calibration forward runs in ``eval()`` mode under ``torch.no_grad()`` with PyTorch's fused
attention fast path off (it would bypass the hooks) and a Hugging Face model's key/value cache
off (``config.use_cache``); all of it is restored afterwards.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from dualdrop.nn.oneshot.layers import Step

PRECISIONS = ("auto", "float32", "float64")
#: the widest layer input whose batch products ``gram_precision="auto"`` forms in float64
FLOAT64_MAX_IN = 1024


class _Stop(Exception):
    """Raised by a hook once the stage in flight has its inputs: the rest of the forward is
    not needed."""


def default_forward(model: nn.Module, batch):
    """How a calibration batch is fed when no ``forward_fn`` is given: a tensor as
    ``model(batch)``, a tuple or list as ``model(batch[0])`` (``(inputs, targets)`` batches of a
    DataLoader), a dict as ``model(**batch)`` (Hugging Face batches); tensors are moved to the
    model's device."""
    dev = _device(model)
    if isinstance(batch, torch.Tensor):
        return model(batch.to(dev))
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return model(batch[0].to(dev))
    if isinstance(batch, dict):
        return model(**{k: v.to(dev) if isinstance(v, torch.Tensor) else v
                        for k, v in batch.items()})
    raise TypeError(f"a calibration batch of type {type(batch).__name__} cannot be fed to the "
                    "model as is; pass forward_fn(model, batch) to say how")


def token_mask(batch, token_mask_fn=None):
    """The real tokens of a calibration batch (bool ``(batch, tokens)``) or ``None`` (every row
    is real): ``token_mask_fn(batch)`` when given, else a dict batch's 2-D
    ``attention_mask``."""
    if token_mask_fn is not None:
        mask = token_mask_fn(batch)
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise TypeError("token_mask_fn(batch) must return a 2-D (batch, tokens) tensor of "
                            f"the real tokens (or None), got {_describe(mask)}")
        return mask.bool()
    if isinstance(batch, dict):
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            return mask.bool()
    return None


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def _device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def calibration_mode(model: nn.Module):
    """``eval()``, no gradients, attention fast path off, a Hugging Face model's cache off;
    everything restored on exit."""
    modes = [(m, m.training) for m in model.modules()]
    mha = getattr(torch.backends, "mha", None)
    fast = mha.get_fastpath_enabled() if mha is not None else None
    config = getattr(model, "config", None)
    cache = getattr(config, "use_cache", None)
    try:
        model.eval()
        if mha is not None:
            mha.set_fastpath_enabled(False)
        if cache is not None:
            config.use_cache = False
        with torch.no_grad():
            yield
    finally:
        for m, mode in modes:
            m.training = mode
        if mha is not None:
            mha.set_fastpath_enabled(fast)
        if cache is not None:
            config.use_cache = cache


class GramAccumulator:
    """``sum X^T X`` and the row count of every problem of a stage's steps, in float64.

    Problems that read the same rows share one sum: an attention's q/k/v on one input (within a
    step), and the Linear / Conv1D steps of a ``shared`` stage (steps that read one tensor).
    ``new_batch(mask)`` starts a batch (its token mask, see :func:`token_mask`); ``add(i, args,
    kwargs)`` takes one call of step ``i``'s module."""

    def __init__(self, steps: list[Step], shared: bool = False, precision: str = "auto"):
        if precision not in PRECISIONS:
            raise ValueError(f"gram_precision={precision!r}; expected one of {list(PRECISIONS)}")
        self.steps = list(steps)
        self.shared = shared and len(self.steps) > 1
        self.precision = precision
        self.keys: list[list | None] = [None] * len(self.steps)  # slot of each problem
        self.sums: dict = {}
        self.rows: dict = {}
        self.mask = None
        self._done: set = set()
        self._G: dict = {}

    def new_batch(self, mask=None) -> None:
        self.mask = mask
        self._done = set()

    def _slots(self, i: int, xs: list) -> list:
        step = self.steps[i]
        if self.shared and step.kind in ("linear", "hf_conv1d"):
            return ["shared"]
        keys = []
        for j, x in enumerate(xs):
            first = next(k for k in range(j + 1) if xs[k] is x)
            keys.append((i, first))
        return keys

    def add(self, i: int, args, kwargs) -> None:
        step = self.steps[i]
        mask = self.mask
        if self.shared and step.kind in ("linear", "hf_conv1d"):
            self.keys[i] = ["shared"]
            if "shared" in self._done:
                return
        x0 = step.input_key(args, kwargs)
        if mask is not None:
            ref = x0 if x0 is not None else next(
                (a for a in args if isinstance(a, torch.Tensor)), None)
            if ref is not None and mask.device != ref.device:
                mask = mask.to(ref.device)
        xs = step.input_rows(args, kwargs, mask)
        if self.keys[i] is None:
            self.keys[i] = self._slots(i, xs)
        done_here: dict = {}
        for key, x in zip(self.keys[i], xs):
            if key in done_here or (key == "shared" and key in self._done):
                continue
            done_here[key] = True
            if not torch.is_floating_point(x):
                x = x.float()
            if (self.precision == "float64" or x.dtype == torch.float64
                    or (self.precision == "auto" and x.shape[1] <= FLOAT64_MAX_IN)):
                x = x.detach().to(torch.float64)
            else:
                x = x.detach().float()
            if key not in self.sums:
                self.sums[key] = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64,
                                             device=x.device)
                self.rows[key] = 0
            add_gram(self.sums[key], x)
            self.rows[key] += x.shape[0]
        if self.shared and step.kind in ("linear", "hf_conv1d"):
            self._done.add("shared")

    def grams(self, i: int) -> list[torch.Tensor]:
        """The Grams of step ``i``'s problems (one tensor object per shared slot)."""
        keys = self.keys[i]
        if keys is None or any(self.rows.get(k, 0) == 0 for k in keys):
            raise RuntimeError(f"{self.steps[i].names[0]} saw no calibration input (every "
                               "token masked out, or the layer was not called)")
        out = []
        for k in keys:
            if k not in self._G:
                self._G[k] = symmetric_gram(self.sums.pop(k)).div_(self.rows[k])
            out.append(self._G[k])
        return out

    def row_counts(self, i: int) -> list[int]:
        return [self.rows.get(k, 0) for k in (self.keys[i] or [])]

    def nbytes(self) -> int:
        return sum(s.numel() * 8 for s in self.sums.values())

    def release(self) -> None:
        self.sums, self.rows, self._G = {}, {}, {}

#: column blocks of the Gram products: a wide layer's ``X^T X`` is summed on its upper block
#: triangle only (about half the multiply-adds of the full product; :func:`add_gram`)
GRAM_BLOCK = 512


def add_gram(S: torch.Tensor, x: torch.Tensor) -> None:
    """``S += X^T X`` on the upper block triangle of ``S`` (blocks of :data:`GRAM_BLOCK`
    columns; the whole product for narrower ``X``): ``X^T X`` is symmetric, so the blocks below
    the diagonal are the transposes of those above, and skipping them halves the largest cost
    of the walk for wide layers. :func:`symmetric_gram` completes the matrix once."""
    n = x.shape[1]
    if n < 2 * GRAM_BLOCK:
        S.add_(x.T @ x)  # a float32 product added in float64, no copy
        return
    for i in range(0, n, GRAM_BLOCK):
        j = min(i + GRAM_BLOCK, n)
        S[i:j, i:].add_(x[:, i:j].T @ x[:, i:])


def symmetric_gram(S: torch.Tensor) -> torch.Tensor:
    """The full Gram from a sum of :func:`add_gram` (a new tensor; ``S`` is consumed), exactly
    symmetric: a BLAS ``X^T X`` need not be (its two triangles may be summed in different
    orders), and the solvers factor the Gram as symmetric, so both triangles are averaged.
    Where the product was symmetric already, ``(a + a) / 2 = a`` leaves it bit for bit."""
    n = S.shape[0]
    G = S + S.T
    del S
    if n < 2 * GRAM_BLOCK:
        return G.mul_(0.5)
    for i in range(0, n, GRAM_BLOCK):  # the diagonal blocks were full products: counted twice
        G[i:i + GRAM_BLOCK, i:i + GRAM_BLOCK] *= 0.5
    return G


def hook_steps(steps: list[Step], acc: GramAccumulator, stop_after: int | None,
               counter: list) -> list:
    """Forward pre-hooks feeding ``acc`` from each step's module; raise ``_Stop`` once
    ``counter[0]`` (every call of these modules in a forward; the caller resets it per batch)
    reaches ``stop_after``."""
    handles = []
    for i, step in enumerate(steps):
        def hook(module, args, kwargs, i=i):
            acc.add(i, args, kwargs)
            counter[0] += 1
            if stop_after is not None and counter[0] >= stop_after:
                raise _Stop
        handles.append(step.module.register_forward_pre_hook(hook, with_kwargs=True))
    return handles
