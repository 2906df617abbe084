"""The sequential layer walk: each layer's input Gram from calibration data, one layer in flight.

Layers are pruned in the order the forward calls them, and each one on the inputs it receives
from the layers already pruned (as SparseGPT and llm-compressor's sequential pipeline do), so a
layer's problem accounts for the error its predecessors left. For each layer (a *step*: one
module, one to three problems, ``layers.Step``):

1. a forward pre-hook on the layer turns its inputs into rows of ``X`` (im2col for a
   convolution, the recomputed context for an attention's output projection) and adds
   ``X^T X`` to a float64 accumulator, batch by batch, so no activation outlives its batch;
2. the forward stops right there (an exception the walker catches: the rest of the network is
   not run), unless the layer is called more than once per forward, and the next batch comes;
3. ``G = sum X^T X / n`` goes to the method with the layer's dense weight, the pruned weight is
   written back, the step's line enters the report, and the accumulator is freed.

Memory: the model, one batch's activations up to the layer in flight, and one Gram per problem of
the step (``in^2`` float64: 4.9 MB for LeNet's 784 inputs, 2.6 MB for a GPT-2 MLP's 640); an
allocation other than ``"uniform"``/``"global"`` holds every layer's Gram of the dense model once
before the walk. Cost: one partial forward over the calibration data per step (the forward stops
at the step's layer), about half a full forward per layer on average.

The calibration forward runs in ``eval()`` mode under ``torch.no_grad()`` with PyTorch's fused
attention fast path off (it would bypass the hooks); the model's mode and the fast-path setting
are restored afterwards.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

try:
    import resource
except ImportError:  # not on Windows
    resource = None

from dualdrop.nn.oneshot.layers import Step
from dualdrop.nn.oneshot.methods.base import layer_objective


class _Stop(Exception):
    """Raised by a hook once the layer in flight has its inputs: the rest of the forward is
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


def _device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def calibration_mode(model: nn.Module):
    """``eval()``, no gradients, attention fast path off; everything restored on exit."""
    modes = [(m, m.training) for m in model.modules()]
    mha = getattr(torch.backends, "mha", None)
    fast = mha.get_fastpath_enabled() if mha is not None else None
    try:
        model.eval()
        if mha is not None:
            mha.set_fastpath_enabled(False)
        with torch.no_grad():
            yield
    finally:
        for m, mode in modes:
            m.training = mode
        if mha is not None:
            mha.set_fastpath_enabled(fast)


class GramAccumulator:
    """``sum X^T X`` and the row count of each problem of one step, in float64."""

    def __init__(self, step: Step):
        self.step = step
        self.sums: list = [None] * len(step.names)
        self.rows = [0] * len(step.names)

    def add(self, args, kwargs) -> None:
        xs = self.step.input_rows(args, kwargs)
        done: dict[int, torch.Tensor] = {}
        for i, x in enumerate(xs):
            if id(x) not in done:
                x64 = x.detach().to(torch.float64)
                done[id(x)] = x64.T @ x64
            g = done[id(x)]
            self.sums[i] = g.clone() if self.sums[i] is None else self.sums[i].add_(g)
            self.rows[i] += x.shape[0]

    def grams(self) -> list[torch.Tensor]:
        if any(r == 0 for r in self.rows):
            raise RuntimeError(f"{self.step.names[0]} saw no calibration input")
        return [s / r for s, r in zip(self.sums, self.rows)]

    def nbytes(self) -> int:
        return sum(s.numel() * 8 for s in self.sums if s is not None)


def _hook_step(step: Step, acc: GramAccumulator, stop_after: int | None, counter: list):
    """A forward pre-hook feeding ``acc``; raises ``_Stop`` at the ``stop_after``-th call of a
    forward (``counter[0]`` counts them; the caller resets it per batch)."""
    def hook(module, args, kwargs):
        acc.add(args, kwargs)
        counter[0] += 1
        if stop_after is not None and counter[0] >= stop_after:
            raise _Stop
    return step.module.register_forward_pre_hook(hook, with_kwargs=True)


def run_pass(model, calib, forward_fn, hooks_setup: Callable[[], list], counters: list) -> int:
    """One pass over ``calib`` with the hooks ``hooks_setup()`` registers (removed after);
    returns the number of batches."""
    handles = hooks_setup()
    batches = 0
    try:
        for batch in calib:
            for c in counters:
                c[0] = 0
            try:
                forward_fn(model, batch)
            except _Stop:
                pass
            batches += 1
    finally:
        for h in handles:
            h.remove()
    if batches == 0:
        raise ValueError("calib gave no batch")
    return batches


def trace(model, steps: list[Step], calib, forward_fn) -> tuple[list[Step], list[Step], dict]:
    """``(ordered, unreached, calls)``: the steps in the order the forward first calls them (an
    attention's input step before its output step), those no forward call reached, and how often
    each step's module is called per forward; one forward on the first calibration batch."""
    first: dict[int, int] = {}
    calls: dict[int, int] = {}
    order = [0]
    modules = {id(s.module): s.module for s in steps}

    def make(mid):
        def hook(module, args, kwargs):
            if mid not in first:
                first[mid] = order[0]
                order[0] += 1
            calls[mid] = calls.get(mid, 0) + 1
        return hook

    handles = [m.register_forward_pre_hook(make(mid), with_kwargs=True)
               for mid, m in modules.items()]
    try:
        batch = next(iter(calib), None)
        if batch is None:
            raise ValueError("calib gave no batch")
        forward_fn(model, batch)
    finally:
        for h in handles:
            h.remove()
    kind_rank = {"mha_in": 0, "mha_out": 1}
    reached = [s for s in steps if id(s.module) in first]
    reached.sort(key=lambda s: (first[id(s.module)], kind_rank.get(s.kind, 0)))
    unreached = [s for s in steps if id(s.module) not in first]
    return reached, unreached, {id(s.module): calls[id(s.module)] for s in reached}


def collect(model, steps: list[Step], calib, forward_fn) -> dict[str, torch.Tensor]:
    """Every problem's Gram on the model as it is (all steps hooked at once, one full pass):
    what a non-uniform allocation measures on the dense model."""
    accs = [GramAccumulator(s) for s in steps]
    counter = [0]

    def setup():
        return [_hook_step(s, a, None, counter) for s, a in zip(steps, accs)]

    with calibration_mode(model):
        run_pass(model, calib, forward_fn, setup, [counter])
    out = {}
    for a in accs:
        out.update(zip(a.step.names, a.grams()))
    return out


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak_memory() -> float:
    """Start a peak-memory measurement; returns the resident memory now, in MB.

    On Linux the kernel's high-water mark of the process is reset to its current resident set
    (``/proc/self/clear_refs``), so :func:`peak_rss_mb` then reads the peak since this call;
    elsewhere it stays the process's peak so far."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    now = _status_mb("VmRSS")
    return now if now is not None else peak_rss_mb()


def peak_rss_mb() -> float:
    """The process's peak resident memory since :func:`reset_peak_memory` (Linux), or so far,
    in MB."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    if resource is None:
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def walk(model, steps: list[Step], calib, forward_fn, calls: dict,
         prune_step: Callable[[Step, list, list], list], progress: bool = True,
         desc: str = "one-shot") -> list[dict]:
    """Prune ``steps`` in order (module docstring); ``prune_step(step, W0s, Gs) -> (Ws,
    seconds)`` prunes one step's problems. Returns the report's rows, one per problem: layer,
    kind, shape, rows of ``X`` (samples, tokens or patches), kept weights, density, layer
    objective, seconds (the step's calibration pass
    shared over its problems, plus the problem's solve), the step's Gram memory and the peak
    memory so far (the process's resident set on the CPU, allocated memory on a GPU), in MB."""
    rows = []
    bar = _progress(len(steps), desc, progress)
    cuda = _device(model).type == "cuda"
    try:
        for step in steps:
            t0 = time.perf_counter()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            acc, counter = GramAccumulator(step), [0]
            stop = calls[id(step.module)]
            with calibration_mode(model):
                run_pass(model, calib, forward_fn,
                         lambda: [_hook_step(step, acc, stop, counter)], [counter])
            Gs = acc.grams()
            gram_mb, n_rows = acc.nbytes() / 2 ** 20, list(acc.rows)
            del acc
            t_pass = time.perf_counter() - t0
            W0s = step.weights()
            Ws, secs = prune_step(step, W0s, Gs)
            step.set_weights(Ws)
            peak = torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else peak_rss_mb()
            for name, W0, W, G, s, n in zip(step.names, W0s, Ws, Gs, secs, n_rows):
                kept = int((W != 0).sum())
                rows.append({"layer": name, "kind": step.kind, "shape": list(W0.shape),
                             "rows": n, "kept": kept, "density": kept / W0.numel(),
                             "objective": layer_objective(W, W0, G),
                             "seconds": s + t_pass / len(step.names), "gram_mb": gram_mb,
                             "peak_mb": peak})
            del Gs, W0s, Ws
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(step.names[0][-40:])
    finally:
        if bar is not None:
            bar.close()
    return rows


def _progress(total: int, desc: str, enabled: bool):
    return tqdm(total=total, desc=desc, unit="layer", leave=False) if enabled else None
