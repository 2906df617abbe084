"""Per-step cost of each sparsification method against its own floor, as ratios to dense.

A method's *floor* is the dense training step plus the least extra work the method needs per step,
derived from what it must compute (``FLOOR_COUNTS``) and measured component by component in the
same run:

===================  ==========================================================================
component            what it costs (each over all sparsified weights of the network)
===================  ==========================================================================
``pass``             one fused elementwise pass over the weights (read one or two weight-sized
                     tensors, write one): e.g. adding a penalty's gradient, applying a mask
``trans``            one pass with a transcendental per weight (exp, log, sigmoid)
``adam``             Adam over one extra weight-sized parameter (log-alpha, log-eta, log-sigma2)
``rand``             one uniform random number per weight (torch's generator)
``rand_cb``          one uniform per weight from the counter-based generator
                     (``dualdrop.nn._noise``: reproducible from (seed, stream, step))
``normal_cb``        one normal per weight from the counter-based generator
``normal_act_cb``    one counter-based normal per pre-activation of the sparsified layers
``matmul``           the sparsified layers' linear maps once more, forward and backward, on
                     their inputs of a real step (local reparameterization's variance path)
===================  ==========================================================================

The counts per method are derived from the method's mathematics, not from our implementation:
e.g. a penalty method must evaluate ``Omega'(w)`` and add it to the gradient (one fused pass); a
hard-concrete gate per weight must draw ``u``, evaluate ``sigmoid((logit u + log a)/beta)``
forward (one transcendental pass), its derivative backward (one pass), the expected L0's gradient
(one transcendental pass), mask the weight forward and backward (two passes), and update one more
parameter per weight. The components are the cheapest torch eager forms of each (``out=``/in-place,
preallocated buffers), so the floor is what a fused implementation on this CPU could approach.

Each round times, interleaved: the dense step, every component, and every method's real step as
``dualdrop.train`` runs it (fused Adam, the regularizer's gradient only, ``after_step``) twice:
``before`` with ``dualdrop.nn._numba.ENABLED = False`` (the torch expressions and torch's
generator) and ``after`` with the fused paths (the default). Figures are medians over rounds,
ratios to the dense median of the same run; spreads are min-max over rounds; the load average is
printed at the start and the end because the machine may be shared.

Ablations (``ABLATIONS``, on unless ``--no-ablations``): for the stochastic and extra-parameter
methods the same rounds also time the method's fused step with one part replaced (the floor's
per-weight work behind the method's API; the random numbers read from a fixed tensor; the
regularizer left out of the loss), so that the time between the hand-written floor and the
method's step splits into measured parts: ``floor + API + per-weight loops + regularizer + noise
= measured`` (section "ablations" below).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_floors.py --rounds 7 --steps 30 --clock cpu
    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_floors.py --sizes 784,1200,1200,10 --steps 10
    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_floors.py --model lenet5 --steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dualdrop.nn import _noise, _numba, sparsify  # noqa: E402
from dualdrop.nn.methods.hardconcrete import fused as _hc_fused  # noqa: E402
from dualdrop.nn.methods.penalty import fused as _pen_fused  # noqa: E402
from dualdrop.nn.methods.vardrop import fused as _vd_fused  # noqa: E402
from dualdrop.nn._layers import linear_op  # noqa: E402
from dualdrop.nn.registry import REGISTRY, method_class  # noqa: E402
from penalties.kernels import LOGSUM as _LOGSUM  # noqa: E402
from dualdrop.train.engine import train_step  # noqa: E402
from dualdrop.train.loop import make_adam  # noqa: E402
from dualdrop.train.models import build_model  # noqa: E402

#: the catalog penalties timed beside the registered methods
CATALOG = ("penalty:mcp", "penalty:l1")
#: extra work per step of each method beyond the dense step (see the module docstring), from
#: each method's record (``Method.floor``); ``r`` stands for the number of neuron gates per step
#: over the number of weights
FLOOR_COUNTS: dict[str, dict[str, object]] = {
    m: dict(method_class(m).floor) for m in (*REGISTRY, *CATALOG) if method_class(m).floor}
#: the ratio to the floor each method's fused step is expected to stay under (``floor_target``)
TARGETS = {m: method_class(m).floor_target for m in FLOOR_COUNTS
           if method_class(m).floor_target is not None}


def lenet(sizes) -> nn.Sequential:
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def make_model(args) -> nn.Module:
    if args.model == "lenet5":
        return build_model("lenet5", 784, 10)
    return lenet(args.sizes)


class Batches:
    """A fixed pool of synthetic MNIST-shaped batches."""

    def __init__(self, n_in, n_out, batch, n=4096, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.X = torch.randn(n, n_in, generator=g)
        self.y = torch.randint(0, n_out, (n,), generator=g)
        self.batch = batch
        self.i = 0

    def next(self):
        i = self.i
        self.i = (i + self.batch) % (len(self.y) - self.batch)
        return self.X[i:i + self.batch], self.y[i:i + self.batch]


def dense_step(model, opt, data):
    x, y = data.next()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def make_method(method, args, data, steps_total, fused: bool, ablation: str | None = None):
    """The training step of ``method`` as ``dualdrop.train`` runs it, with the fused paths on or
    off (``dualdrop.nn._numba.ENABLED``) while it runs; ``ablation`` (``ABLATIONS``) changes one
    part of the fused step (the returned step's ``patches`` applies it around a timed run)."""
    torch.manual_seed(0)
    model = make_model(args)
    sp = sparsify(model, method)
    opt = make_adam(list(model.parameters()), sp.hparams["lr"])
    state = {"step": 0}
    n = 48000
    keep_reg = ablation not in ("fixed_noreg",)

    def step():
        _numba.ENABLED = fused
        try:
            x, y = data.next()
            loss = F.cross_entropy(model(x), y)
            if keep_reg:  # the engine's step (dualdrop.train.engine.train_step)
                state["step"] = train_step(loss, opt, step=state["step"],
                                           total_steps=steps_total, sp=sp, n_train=n)
            else:  # the same step, the regularizer left out
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                state["step"] += 1
                sp.after_step(opt, state["step"], steps_total)
        finally:
            _numba.ENABLED = True

    step.patches = lambda: ablation_patches(method, ablation)
    return step


#: the minimal hand-written step each method is compared with (module docstring): ``mask``
#: multiplies every weight by a fixed 0/1 mask in the forward; ``loop`` adds lam Omega'(w) of
#: LogSum to every weight's gradient with one numba loop after the backward; ``adam`` adds one
#: weight-sized parameter per weight tensor to the optimizer (its gradient filled by the loop);
#: ``var`` adds to every layer's output its linear map of ``x^2`` with that extra parameter times
#: fixed noise (local reparameterization's second matmul set, without any per-weight work)
HAND = {"magnitude": "mask", "logsum": "loop", "adatikhonov": "loop", "adaprox": "loop",
        "penalty:mcp": "loop", "penalty:l1": "loop", "eta-trick": "loop+adam",
        "hardconcrete": "mask+adam", "vardrop": "mask+adam", "hardconcrete-neuron": "mask",
        "vardrop-lr": "adam+var", "vardrop-lr-ar": "adam+var"}


def make_hand(kind, args, data):
    """The hand-written floor step ``kind`` (``HAND``'s values) on a fresh dense model."""
    from torch.func import functional_call

    torch.manual_seed(0)
    model = make_model(args)
    weights = {n: p for n, p in model.named_parameters()
               if n.endswith("weight") and p.dim() > 1}
    g = torch.Generator().manual_seed(1)
    masks = {n: (torch.rand(w.shape, generator=g) > 0.1).float() for n, w in weights.items()}
    extra = ([nn.Parameter(torch.zeros_like(w)) for w in weights.values()]
             if "adam" in kind else [])
    opt = make_adam(list(model.parameters()) + extra, 1e-3)
    lam, eps = 1e-3, 2.0
    if "var" in kind:
        layers = [m for m in linear_layers(model) if m.weight.dim() > 1]
        noise = {}
        for m, v in zip(layers, extra):
            def hook(m, args, out, v=v):
                e = noise.setdefault(m, torch.randn(out.shape, generator=g))
                return out + linear_op(m, args[0] * args[0], v) * e
            m.register_forward_hook(hook)

    def step():
        x, y = data.next()
        if "mask" in kind:
            params = dict(model.named_parameters())
            params.update({n: w * masks[n] for n, w in weights.items()})
            out = functional_call(model, params, (x,))
        else:
            out = model(x)
        loss = F.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if "loop" in kind or extra:
            for i, w in enumerate(weights.values()):
                wf = w.detach().view(-1).numpy()
                if "loop" in kind:
                    _pen_fused._penalty_slope_add(wf, _LOGSUM, np.float32(lam), np.float32(eps),
                                              np.float32(0.0), w.grad.view(-1).numpy())
                if extra and "var" not in kind:
                    extra[i].grad = torch.empty_like(w)
                    _pen_fused._penalty_slope(wf, _LOGSUM, np.float32(lam), np.float32(eps),
                                          np.float32(0.0), extra[i].grad.view(-1).numpy())
        opt.step()

    return step


# ---- ablations: where a method's step spends the time over its hand-written floor -------------
#
# Each ablation replaces one part of a method's fused step, the rest as it runs in training:
#   floor_fn     the per-weight Function replaced by the hand-written floor's work behind the
#                same API (parametrization or hook, kept term, regularizer, Adam over the same
#                parameters): the weight times a fixed mask, the mask on the gradient, the extra
#                parameter's gradient from the floor's loop (eta-trick: the floor's two loops in
#                the hook, no exp pass); LR: the extra parameter itself as the weight variance and
#                fixed noise times the variance, as the floor's ``adam+var``
#   fixed_noreg  the method's own loops with the random numbers read from a fixed precomputed
#                tensor and the regularizer left out of the loss
#   fixed        the same with the regularizer's gradient (the kept term) in the loss
#   (real)       the method's step
# so that ``floor + API + loops + regularizer + noise = measured``, each difference of two
# interleaved medians: API = floor_fn - hand, loops = fixed_noreg - floor_fn, regularizer =
# fixed - fixed_noreg, noise = real - fixed.
_STOCHASTIC = ("floor_fn", "fixed_noreg", "fixed")
ABLATIONS = {"eta-trick": ("floor_fn",), "hardconcrete": _STOCHASTIC, "vardrop": _STOCHASTIC,
             "vardrop-lr": _STOCHASTIC, "vardrop-lr-ar": _STOCHASTIC}
_FIXED: dict = {}


def _fixed(kind: str, shape, dtype=torch.float32) -> torch.Tensor:
    """A fixed tensor per (kind, shape): uniforms in (0, 1), normals, or a 0/1 mask (90% ones)."""
    key = (kind, tuple(shape), dtype)
    if key not in _FIXED:
        g = torch.Generator().manual_seed(len(_FIXED) + 1)
        u = torch.rand(shape, generator=g, dtype=dtype).clamp_(1e-6, 1 - 1e-6)
        _FIXED[key] = {"u": u, "normal": torch.randn(shape, generator=g, dtype=dtype),
                       "mask": (u > 0.1).to(dtype)}[kind]
    return _FIXED[key]


def _floor_extra_grad(x: torch.Tensor) -> torch.Tensor:
    """The floor's gradient of the extra parameter: LogSum's slope of ``x`` from one loop."""
    out = torch.empty_like(x)
    _pen_fused._penalty_slope(x.detach().reshape(-1).numpy(), _LOGSUM, np.float32(1e-3), np.float32(2.0),
                          np.float32(0.0), out.view(-1).numpy())
    return out


class _MaskFloor(torch.autograd.Function):
    """``(x * mask, 0)``: the floor's masked forward behind a method's Function; backward ``g *
    mask`` and the floor loop's fresh gradient for the extra parameter."""

    @staticmethod
    def forward(ctx, x, extra):
        mask = _fixed("mask", x.shape, x.dtype)
        ctx.save_for_backward(x, mask)
        return x * mask, x.new_zeros(())

    @staticmethod
    def backward(ctx, g, g_term):
        x, mask = ctx.saved_tensors
        return g * mask, _floor_extra_grad(x)


class _ZeroTerm(torch.autograd.Function):
    """A 0 term that depends on ``x`` and gives it no gradient (the kept regularizer's place)."""

    @staticmethod
    def forward(ctx, x):
        return x.new_zeros(())

    @staticmethod
    def backward(ctx, g):
        return None


@njit(cache=True, error_model="numpy")
def _hc_forward_fixed_u(x, e, u, mode, inv_beta, gamma, span, out, z):
    """``_hc_fused._hc_forward`` with the uniforms read from ``u`` instead of hashed."""
    for i in range(x.size):
        zi, _ = _hc_fused._gate_u(u[i], e[i], mode, inv_beta, gamma, span)
        out[i] = x[i] * zi
        z[i] = zi


def _eta_floor_loops(w, ep, p, lam, eps, c, quadratic, log_lam, g, gw, gp, add_p):
    """The floor's two loops in the eta-trick's hook: LogSum's slope into ``w.grad`` and into a
    fresh ``p.grad``."""
    _pen_fused._penalty_slope_add(w, _LOGSUM, lam, eps, np.float32(0.0), gw)
    _pen_fused._penalty_slope(w, _LOGSUM, lam, eps, np.float32(0.0), gp)


@contextlib.contextmanager
def ablation_patches(method: str, ablation: str | None):
    """Apply ``ablation`` (``ABLATIONS``) to ``method``'s fused step while the block runs."""
    patches = []  # (object, attribute, value)
    fixed_noise = ablation in ("fixed_noreg", "fixed")
    if ablation is None:
        pass
    elif method == "eta-trick":
        patches += [(_pen_fused, "_eta_trick_grad_add", _eta_floor_loops),
                    (_pen_fused.EtaTrickGradHook, "_exp_p",
                     lambda self, p: _fixed("u", p.shape, p.dtype))]
    elif method in ("hardconcrete", "vardrop") and ablation == "floor_fn":
        name = "hard_concrete_gate" if method == "hardconcrete" else "vardrop_noise"
        patches.append((_hc_fused if method == "hardconcrete" else _vd_fused, name,
                        lambda x, extra, *a: _MaskFloor.apply(x, extra)))
    elif method == "hardconcrete" and fixed_noise:
        patches.append((_hc_fused, "_hc_forward", lambda x, e, key, *a: _hc_forward_fixed_u(
            x, e, _fixed("u", x.shape, torch.float32).numpy(), *a)))
    elif method.startswith("vardrop") and fixed_noise:
        patches.append((_vd_fused, "normal",
                        lambda shape, key, dtype=torch.float32, device="cpu":
                        _fixed("normal", shape, dtype)))
    elif method.startswith("vardrop-lr") and ablation == "floor_fn":
        name = "lr_variance_kl" if method == "vardrop-lr" else "ar_variance_kl"
        patches += [(_vd_fused, name, lambda w, extra, *a: (extra, _ZeroTerm.apply(extra))),
                    (_vd_fused, "add_lr_noise",
                     lambda out, var, key: out + var * _fixed("normal", out.shape, out.dtype))]
    else:
        raise ValueError(f"no ablation {ablation!r} for {method}")
    saved = [(obj, name, obj.__dict__[name]) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def linear_layers(model):
    return [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def record_inputs(model, data):
    """``[(layer, input, output shape)]`` of every Linear/Conv2d layer in one forward."""
    rec = []
    hooks = [m.register_forward_hook(lambda m, a, o: rec.append((m, a[0].detach(), o.shape)))
             for m in linear_layers(model)]
    with torch.no_grad():
        model(data.next()[0])
    for h in hooks:
        h.remove()
    return rec


def make_components(model, data):
    """One callable per floor component, each doing that work once for every layer; and the
    neuron gates per weight ``r``."""
    rec = record_inputs(model, data)
    weights = [m.weight.detach().clone() for m, _, _ in rec]
    bufs = [torch.empty_like(w) for w in weights]
    extra = [nn.Parameter(torch.zeros_like(w)) for w in weights]
    for p in extra:
        p.grad = torch.randn_like(p)
    opt = make_adam(extra, 1e-3)
    gen = torch.Generator().manual_seed(0)
    acts = [torch.empty(shape) for _, _, shape in rec]
    xs = [x.clone().requires_grad_(i > 0) for i, (_, x, _) in enumerate(rec)]
    ws = [w.clone().requires_grad_(True) for w in weights]
    n_w = sum(w.numel() for w in weights)
    gates = sum(x.shape[0] * (m.in_features if isinstance(m, nn.Linear) else m.out_channels)
                for m, x, _ in rec)

    def pass_():
        for w, g in zip(weights, bufs):
            g.add_(w, alpha=1e-4)

    def trans():
        for w, o in zip(weights, bufs):
            torch.sigmoid(w, out=o)

    def adam():
        opt.step()

    def rand():
        for o in bufs:
            o.uniform_(generator=gen)

    def rand_cb():
        for i, o in enumerate(bufs):
            _noise.uniform_(o, _noise.make_key(0, i, 0))

    def normal_cb():
        for i, o in enumerate(bufs):
            _noise.normal_(o, _noise.make_key(0, i, 0))

    def normal_act_cb():
        for i, a in enumerate(acts):
            _noise.normal_(a, _noise.make_key(0, i, 0))

    def matmul():
        out = sum(linear_op(m, x, w).sum() for (m, _, _), x, w in zip(rec, xs, ws))
        out.backward()

    comps = {"pass": pass_, "trans": trans, "adam": adam, "rand": rand, "rand_cb": rand_cb,
             "normal_cb": normal_cb, "normal_act_cb": normal_act_cb, "matmul": matmul}
    return comps, gates / n_w, n_w


def timeit(fn, steps, clock=time.perf_counter):
    t0 = clock()
    for _ in range(steps):
        fn()
    return (clock() - t0) / steps


#: ``--clock`` choices: the process's CPU time (what the step costs; not inflated when other
#: processes take the core away on a shared machine) or wall-clock time
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def add_common_args(ap, *, steps: int, clock: str) -> None:
    """The options every step benchmark here shares."""
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median reported)")
    ap.add_argument("--steps", type=int, default=steps, help="steps timed per item and round")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--batch", type=int, default=128, help="batch size")
    ap.add_argument("--model", choices=["mlp", "lenet5"], default="mlp",
                    help="mlp: the MLP of --sizes; lenet5: LeNet-5-Caffe (dualdrop.train.models)")
    ap.add_argument("--sizes", default="784,300,100,10",
                    help="layer widths of the MLP, e.g. 784,1200,1200,10 for the wide network")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default=clock,
                    help="wall: time.perf_counter; cpu: time.process_time (robust on a shared "
                         "machine: the process's own CPU time, not the time others hold the core)")


def run_rounds(items: dict, rounds: int, steps: int, clock) -> dict:
    """Warm every item up, then time them interleaved: ``{name: [seconds per step, ...]}``."""
    def timed(fn, n):
        with getattr(fn, "patches", contextlib.nullcontext)():
            return timeit(fn, n, clock)

    for fn in items.values():  # warm-up: compilation, allocator, optimizer state
        timed(fn, 5)
    times = {k: [] for k in items}
    for r in range(rounds):
        for k, fn in items.items():
            times[k].append(timed(fn, steps))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return times


def _count(c, r: float) -> float:
    return float(c) if not isinstance(c, str) else (float(c[:-1] or 1) * r)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, steps=30, clock="cpu")
    ap.add_argument("--methods", nargs="*", default=list(FLOOR_COUNTS), help="methods to time")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="do not flush subnormal floats to zero (dualdrop.train flushes them by "
                         "default, so the benchmark does too)")
    ap.add_argument("--no-ablations", action="store_true",
                    help="skip the per-method ablations (ABLATIONS) that attribute the time "
                         "between the hand-written floor and the method's step")
    args = ap.parse_args(argv)
    unknown = [m for m in args.methods if m not in FLOOR_COUNTS]
    if unknown:
        ap.error(f"--methods: no floor counts for {unknown}; known: {list(FLOOR_COUNTS)}")
    flushed = not args.keep_denormals and torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    args.sizes = tuple(int(s) for s in args.sizes.split(","))
    data = Batches(784 if args.model == "lenet5" else args.sizes[0],
                   10 if args.model == "lenet5" else args.sizes[-1], args.batch)
    clock = CLOCKS[args.clock]
    torch.manual_seed(0)
    dmodel = make_model(args)
    dopt = make_adam(list(dmodel.parameters()), 1e-3)
    items = {"dense": lambda: dense_step(dmodel, dopt, data)}
    comps, r, n_w = make_components(dmodel, data)
    items.update({f"component:{k}": f for k, f in comps.items()})
    for kind in sorted({HAND[m] for m in args.methods}):
        items[f"hand:{kind}"] = make_hand(kind, args, data)
    total = 75000  # a long nominal schedule, as in a real run (magnitude prunes every 100 steps)
    for m in args.methods:
        items[f"{m} before"] = make_method(m, args, data, total, fused=False)
        items[f"{m} after"] = make_method(m, args, data, total, fused=True)
        for ab in ([] if args.no_ablations else ABLATIONS.get(m, ())):
            items[f"{m} {ab}"] = make_method(m, args, data, total, fused=True, ablation=ab)
    load0 = os.getloadavg()
    times = run_rounds(items, args.rounds, args.steps, clock)
    load1 = os.getloadavg()
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: (min(v), max(v)) for k, v in times.items()}
    dense = med["dense"]
    what = ("LeNet-5-Caffe" if args.model == "lenet5"
            else f"MLP {'-'.join(map(str, args.sizes))}")
    print(f"\nPer-step times, {what} ({n_w} weights in Linear/Conv2d layers), batch {args.batch}, "
          f"{args.threads} thread(s), median of {args.rounds} interleaved rounds x {args.steps} "
          f"steps, {args.clock} clock, subnormals {'flushed' if flushed else 'kept'}; load "
          f"average (1, 5, 15 min) {tuple(round(x, 2) for x in load0)} at the start, "
          f"{tuple(round(x, 2) for x in load1)} at the end; neuron gates per weight r = {r:.3f}\n")
    print(f"dense step: {dense * 1e3:.3f} ms (min {spread['dense'][0] * 1e3:.3f}, max "
          f"{spread['dense'][1] * 1e3:.3f})\n")
    print("| component | ms | x dense |\n| --- | --- | --- |")
    for k in items:
        if k.startswith("component:"):
            print(f"| {k.split(':', 1)[1]} | {med[k] * 1e3:.3f} | {med[k] / dense:.3f} |")
    print("\n| hand-written step | ms | x dense (min-max) |\n| --- | --- | --- |")
    for k in items:
        if k.startswith("hand:"):
            print(f"| {k[5:]} | {med[k] * 1e3:.3f} | {med[k] / dense:.3f} "
                  f"({spread[k][0] / dense:.2f}-{spread[k][1] / dense:.2f}) |")
    print("\n| method | extra work per step (derived) | floor x dense (components) | hand-written "
          "floor x dense | before x dense | after x dense | after / floor | target x dense | "
          "after ms (min-max) |\n|" + " --- |" * 9)
    for m in args.methods:
        counts = {k: _count(c, r) for k, c in FLOOR_COUNTS[m].items()}
        floor = dense + sum(c * med[f"component:{k}"] for k, c in counts.items())
        work = ", ".join(f"{c:.3g} {k}" for k, c in counts.items())
        a, b = med[f"{m} after"], med[f"{m} before"]
        lo, hi = spread[f"{m} after"]
        hand = f"{HAND[m]} {med['hand:' + HAND[m]] / dense:.2f}"
        print(f"| {m} | {work} | {floor / dense:.2f} | {hand} | {b / dense:.2f} | "
              f"{a / dense:.2f} | {a / floor:.2f} | {TARGETS.get(m, float('nan')):.2f} | "
              f"{a * 1e3:.2f} ({lo * 1e3:.2f}-{hi * 1e3:.2f}) |")
    abl = [m for m in args.methods if not args.no_ablations and m in ABLATIONS]
    if abl:
        print_ablations(abl, med, spread, dense)
    return 0


def print_ablations(methods, med, spread, dense) -> None:
    """``floor + API + loops + regularizer + noise = measured`` per method (ms and x dense)."""
    print("\nWhere the time between the hand-written floor and the method's step goes (ablations "
          "of the fused step, module docstring; ms per step, x dense in parentheses; the parts "
          "are differences of medians, so a part within the spread of its two items reads as "
          "0)\n")
    print("| method | hand-written floor | + API | + per-weight loops | + regularizer | + noise |"
          " = measured | floor_fn / fixed_noreg / fixed spread (x dense) |\n|" + " --- |" * 8)
    for m in methods:
        chain = [f"hand:{HAND[m]}"] + [f"{m} {a}" for a in ABLATIONS[m]] + [f"{m} after"]
        parts = {"api": (chain[0], f"{m} floor_fn"), "loops": (f"{m} floor_fn", f"{m} fixed_noreg"),
                 "reg": (f"{m} fixed_noreg", f"{m} fixed"), "noise": (f"{m} fixed", f"{m} after")}
        if m == "eta-trick":  # no noise; the regularizer is the per-weight work itself
            parts = {"api": parts["api"], "loops": (f"{m} floor_fn", f"{m} after")}

        def cell(key):
            if key not in parts:
                return "-"
            a, b = parts[key]
            d = med[b] - med[a]
            return f"{d * 1e3:+.2f} ({d / dense:+.2f})"

        f0, total = med[chain[0]], med[f"{m} after"]
        spreads = " / ".join(f"{spread[k][0] / dense:.2f}-{spread[k][1] / dense:.2f}"
                             for k in chain[1:-1])
        print(f"| {m} | {HAND[m]} {f0 * 1e3:.2f} ({f0 / dense:.2f}) | {cell('api')} | "
              f"{cell('loops')} | {cell('reg')} | {cell('noise')} | {total * 1e3:.2f} "
              f"({total / dense:.2f}) | {spreads} |")


if __name__ == "__main__":
    sys.exit(main())
