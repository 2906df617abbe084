"""The engine's step against the same step written by hand: what the one training loop costs.

``dualdrop.train.engine.train_step`` (what ``fit``, the CLI's protocol, heal and the benchmarks
run) against the step the benchmarks wrote out before: ``loss + sp.regularizer(n, value=False)``,
``zero_grad``, ``backward``, ``optimizer.step()``, ``sp.after_step``. Both on LeNet-300-100
(784-300-100-10), batch 128, torch's fused Adam where it has one, one thread, subnormals
flushed; every (method, step) pair built once and timed in interleaved rounds of ``--steps``
steps in the same process, CPU time; medians over rounds, as a multiple of the hand-written dense
step, and engine / hand per method (1.00: the engine adds nothing).

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_engine_step.py --rounds 9
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dualdrop.nn import sparsify  # noqa: E402
from dualdrop.train.engine import train_step  # noqa: E402
from dualdrop.train.loop import make_adam  # noqa: E402

METHODS = ["dense", "logsum", "magnitude", "hardconcrete", "vardrop", "vardrop-lr"]
N_TRAIN, TOTAL = 48000, 10 ** 6


def make(method: str, engine: bool, X, Y):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(),
                          nn.Linear(100, 10))
    sp = sparsify(model, method) if method != "dense" else None
    opt = make_adam(list(model.parameters()), sp.hparams["lr"] if sp else 1e-3)
    st = {"step": 0, "i": 0}

    def step():
        i = st["i"]
        st["i"] = (i + 128) % (len(Y) - 128)
        loss = F.cross_entropy(model(X[i:i + 128]), Y[i:i + 128])
        if engine:
            st["step"] = train_step(loss, opt, step=st["step"], total_steps=TOTAL, sp=sp,
                                    n_train=N_TRAIN)
            return
        if sp is not None:
            loss = loss + sp.regularizer(N_TRAIN, value=False)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        st["step"] += 1
        if sp is not None:
            sp.after_step(opt, st["step"], TOTAL)
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(4096, 784, generator=g), torch.randint(0, 10, (4096,), generator=g)
    items = {(m, e): make(m, e, X, Y) for m in METHODS for e in (False, True)}
    for f in items.values():
        for _ in range(5):
            f()
    times = {k: [] for k in items}
    load0 = os.getloadavg()[0]
    for _ in range(args.rounds):
        for k, f in items.items():
            t0 = time.process_time()
            for _ in range(args.steps):
                f()
            times[k].append((time.process_time() - t0) / args.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    dense = med[("dense", False)]
    print("| method | hand-written step x dense | engine train_step x dense | engine / hand |")
    print("| --- | --- | --- | --- |")
    for m in METHODS:
        print(f"| {m} | {med[(m, False)] / dense:.2f} | {med[(m, True)] / dense:.2f} | "
              f"{med[(m, True)] / med[(m, False)]:.3f} |")
    print(f"\n{args.rounds} interleaved rounds x {args.steps} steps, CPU time, 1 thread; load "
          f"average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
