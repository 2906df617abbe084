"""Per-step cost of each sparsification method against its own floor, as ratios to dense.

A method's *floor* is the dense training step plus the least extra work the method needs per step,
counted from what it must compute and measured component by component in the same run:

===================  ==========================================================================
component            what it costs (LeNet-300-100: 266,200 weights, batch 128)
===================  ==========================================================================
``pass``             one fused elementwise pass over the weights (read one or two weight-sized
                     tensors, write one): e.g. adding a penalty's gradient, applying a mask
``trans``            one pass with a transcendental per weight (exp, log, sigmoid)
``adam``             Adam over one extra weight-sized parameter (log-alpha, log-eta, log-sigma2)
``rand``             one uniform random number per weight (torch's generator)
``rand_act``         one normal random number per pre-activation (128 x 410, torch's generator)
``rand_cb``          one uniform per weight from the counter-based generator
                     (``dualdrop.nn._noise``: reproducible from (seed, stream, step), 5-6x faster)
``normal_cb``        one normal per weight from the counter-based generator
``normal_act_cb``    one normal per pre-activation from the counter-based generator
``matmul``           the layers' matmuls once more, forward and backward (local
                     reparameterization's variance path)
===================  ==========================================================================

The counts per method (``FLOOR_COUNTS``) are derived from the method's mathematics, not from our
implementation: e.g. a penalty method must evaluate ``Omega'(w)`` and add it to the gradient (one
fused pass); a hard-concrete gate per weight must draw ``u``, evaluate ``sigmoid((logit u +
log a)/beta)`` forward (one transcendental pass), its derivative backward (one pass), the expected
L0's gradient (one transcendental pass), mask the weight forward and backward (two passes), and
update one more parameter per weight. The measured components are the cheapest torch eager forms
of each (``out=``/in-place, preallocated buffers), so the floor is what a fused implementation on
this CPU could approach, not a guess.

Each round times, interleaved: the dense step, every component, and every method's real step as
``dualdrop.train`` runs it (fused Adam, the regularizer's gradient only, ``after_step``); the
reported figures are medians over rounds, ratios to the dense median of the same run.

Usage (from the repository root)::

    python3 benchmarks/bench_floors.py --rounds 7 --steps 60 --threads 1
    OMP_NUM_THREADS=1 python3 benchmarks/bench_floors.py --rounds 7 --steps 30 --clock cpu --with-fused

``--with-fused`` adds, in the same rounds, each method's step with the fused Functions of
``dualdrop.nn._fused`` (``benchmarks/bench_fused.py``'s step, the wiring plan's result).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dualdrop.nn import _noise, sparsify  # noqa: E402
from dualdrop.train.loop import make_adam  # noqa: E402

#: extra work per step of each method beyond the dense step (see the module docstring)
FLOOR_COUNTS: dict[str, dict[str, float]] = {
    "magnitude": {"pass": 2},  # mask forward, mask the gradient backward
    "logsum": {"pass": 1},  # grad += lam sign(w)/(|w| + eps): one fused pass, no transcendental
    "adatikhonov": {"pass": 1},  # grad += lam w/eta_hat(w): same work as logsum
    "adaprox": {"pass": 1},  # prox w <- w eta/(eta + rho lam) with rho from Adam's v: one pass
    "penalty:mcp": {"pass": 1},
    "eta-trick": {"pass": 1, "trans": 1, "adam": 1},  # w/eta and f'(eta) with eta = lam e^p
    "hardconcrete": {"rand_cb": 1, "trans": 2, "pass": 3, "adam": 1},
    # one gate per input unit and example: 128 x (784 + 300 + 100) gates = 0.57 x the weights,
    # each a random number, two transcendental passes (sample, derivative), three passes
    "hardconcrete-neuron": {"rand_cb": 0.57, "trans": 1.14, "pass": 1.71},
    "vardrop": {"normal_cb": 1, "trans": 1, "pass": 3, "adam": 1},  # w(1 + sqrt(a) e), KL grad
    "vardrop-lr": {"matmul": 1, "normal_act_cb": 1, "trans": 1, "pass": 2, "adam": 1},
    "vardrop-lr-ar": {"matmul": 1, "normal_act_cb": 1, "trans": 1, "pass": 2, "adam": 1},
}
TARGETS = {"magnitude": 1.05, "logsum": 1.15, "adatikhonov": 1.15, "adaprox": 1.15,
           "penalty:mcp": 1.15, "eta-trick": 1.15, "hardconcrete": 1.5, "vardrop": 1.5,
           "hardconcrete-neuron": 1.5, "vardrop-lr": 2.2, "vardrop-lr-ar": 2.2}

SIZES = (784, 300, 100, 10)


def lenet(sizes=SIZES) -> nn.Sequential:
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Batches:
    """A fixed pool of batches (synthetic MNIST-shaped unless real data is given)."""

    def __init__(self, sizes, batch, n=4096, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.X = torch.randn(n, sizes[0], generator=g)
        self.y = torch.randint(0, sizes[-1], (n,), generator=g)
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


def make_method(method, sizes, data, steps_total):
    torch.manual_seed(0)
    model = lenet(sizes)
    sp = sparsify(model, method)
    opt = make_adam(list(model.parameters()), sp.hparams["lr"])
    state = {"step": 0}
    n = 48000

    def step():
        x, y = data.next()
        loss = F.cross_entropy(model(x), y) + sp.regularizer(n, value=False)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        state["step"] += 1
        sp.after_step(opt, state["step"], steps_total)

    return step


def make_components(sizes, batch):
    """One callable per floor component, each doing that work once for every layer."""
    weights = [torch.randn(b, a) * 0.05 for a, b in zip(sizes[:-1], sizes[1:])]
    bufs = [torch.empty_like(w) for w in weights]
    extra = [nn.Parameter(torch.zeros_like(w)) for w in weights]
    for p in extra:
        p.grad = torch.randn_like(p)
    opt = make_adam(extra, 1e-3)
    gen = torch.Generator().manual_seed(0)
    acts = [torch.empty(batch, b) for b in sizes[1:]]
    xs = [torch.randn(batch, a, requires_grad=True) for a in sizes[:-1]]
    ws = [w.clone().requires_grad_(True) for w in weights]

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

    def rand_act():
        for a in acts:
            a.normal_(generator=gen)

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
        out = sum(F.linear(x, w).sum() for x, w in zip(xs, ws))
        out.backward()

    return {"pass": pass_, "trans": trans, "adam": adam, "rand": rand, "rand_act": rand_act,
            "rand_cb": rand_cb, "normal_cb": normal_cb, "normal_act_cb": normal_act_cb,
            "matmul": matmul}


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
    ap.add_argument("--sizes", default="784,300,100,10",
                    help="layer widths of the MLP, e.g. 784,1200,1200,10 for the wide network")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default=clock,
                    help="wall: time.perf_counter; cpu: time.process_time (robust on a shared "
                         "machine: the process's own CPU time, not the time others hold the core)")


def run_rounds(items: dict, rounds: int, steps: int, clock) -> dict:
    """Warm every item up, then time them interleaved: ``{name: [seconds per step, ...]}``."""
    for fn in items.values():  # warm-up: compilation, allocator, optimizer state
        timeit(fn, 5, clock)
    times = {k: [] for k in items}
    for r in range(rounds):
        for k, fn in items.items():
            times[k].append(timeit(fn, steps, clock))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return times


def dense_setup(args):
    """From the common options: the clock, the layer sizes, the batches and ``{"dense": step}``
    (threads set, dense model seeded)."""
    torch.set_num_threads(args.threads)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    data = Batches(sizes, args.batch)
    torch.manual_seed(0)
    dmodel = lenet(sizes)
    dopt = make_adam(list(dmodel.parameters()), 1e-3)
    return CLOCKS[args.clock], sizes, data, {"dense": lambda: dense_step(dmodel, dopt, data)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, steps=60, clock="wall")
    ap.add_argument("--methods", nargs="*", default=list(FLOOR_COUNTS), help="methods to time")
    ap.add_argument("--with-fused", action="store_true",
                    help="also time each method's step with dualdrop.nn._fused "
                         "(benchmarks/bench_fused.py's step) in the same rounds")
    args = ap.parse_args(argv)
    unknown = [m for m in args.methods if m not in FLOOR_COUNTS]
    if unknown:
        ap.error(f"--methods: no floor counts for {unknown}; known: {list(FLOOR_COUNTS)}")
    clock, sizes, data, items = dense_setup(args)
    items.update({f"component:{k}": f for k, f in make_components(sizes, args.batch).items()})
    total = args.steps * (args.rounds + 1) * 10
    items.update({m: make_method(m, sizes, data, total) for m in args.methods})
    if args.with_fused:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_fused import make_fused

        items.update({f"{m} fused": make_fused(m, sizes, data, total) for m in args.methods})
    times = run_rounds(items, args.rounds, args.steps, clock)
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: (min(v), max(v)) for k, v in times.items()}
    dense = med["dense"]
    n_w = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    print(f"\nPer-step times, MLP {'-'.join(map(str, sizes))} ({n_w} weights), batch {args.batch}, "
          f"{args.threads} thread(s), median of {args.rounds} interleaved rounds x {args.steps} "
          f"steps, {args.clock} clock; load average {os.getloadavg()[0]:.2f} at the end\n")
    print(f"dense step: {dense * 1e3:.3f} ms (min {spread['dense'][0] * 1e3:.3f}, max "
          f"{spread['dense'][1] * 1e3:.3f})\n")
    print("| component | ms | x dense |\n| --- | --- | --- |")
    for k in items:
        if k.startswith("component:"):
            print(f"| {k.split(':', 1)[1]} | {med[k] * 1e3:.3f} | {med[k] / dense:.3f} |")
    fused_head = " fused x dense | fused / floor |" if args.with_fused else ""
    print("\n| method | extra work per step | floor x dense | measured x dense | measured / floor "
          f"|{fused_head} target x dense | ms/step (min-max) |\n|"
          + " --- |" * (8 if args.with_fused else 6) + " --- |")
    for m in args.methods:
        counts = FLOOR_COUNTS[m]
        floor = dense + sum(c * med[f"component:{k}"] for k, c in counts.items())
        work = ", ".join(f"{c} {k}" for k, c in counts.items())
        lo, hi = spread[m]
        fused = (f" {med[m + ' fused'] / dense:.2f} | {med[m + ' fused'] / floor:.2f} |"
                 if args.with_fused else "")
        print(f"| {m} | {work} | {floor / dense:.2f} | {med[m] / dense:.2f} | "
              f"{med[m] / floor:.2f} |{fused} {TARGETS.get(m, float('nan')):.2f} | "
              f"{med[m] * 1e3:.2f} ({lo * 1e3:.2f}-{hi * 1e3:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
