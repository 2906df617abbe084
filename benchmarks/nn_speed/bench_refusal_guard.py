"""What the guarantee "a refused call leaves the model as given" costs (``dualdrop.nn._undo``).

``sparsify`` and ``fit`` take a snapshot of the model before they act (modules' tables, hooks,
flags; the buffers, and every tensor when ``fit`` resumes from a checkpoint). This times, in
interleaved rounds on the same model: the snapshot alone (``values=None``, ``"buffers"``,
``"all"``) and a whole ``sparsify(model, "logsum")`` call (which takes the first one), and
prints the medians and their ratios to the ``sparsify`` call.

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_refusal_guard.py --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import warnings

import torch
import torch.nn as nn

from dualdrop.nn import sparsify
from dualdrop.nn._undo import Snapshot


def lenet300():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100),
                         nn.ReLU(), nn.Linear(100, 10))


def gpt2_small():
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    return GPT2LMHeadModel(GPT2Config())  # 124M parameters: 12 layers, width 768


def _time(fn) -> float:
    gc.collect()  # the previous round's removed states are garbage: not this call's cost
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _sparsify_and_remove(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sp = sparsify(model, "logsum")
    return sp


def bench(name, model, rounds):
    cases = {
        "snapshot (values=None)": lambda: Snapshot(model),
        "snapshot (buffers)": lambda: Snapshot(model, values="buffers", rng=True),
        "snapshot (all tensors)": lambda: Snapshot(model, values="all", rng=True),
    }
    times = {k: [] for k in list(cases) + ["sparsify(logsum)"]}
    for _ in range(rounds):
        for k, fn in cases.items():
            times[k].append(_time(fn))
        sp = None

        def run():
            nonlocal sp
            sp = _sparsify_and_remove(model)

        times["sparsify(logsum)"].append(_time(run))
        sp.remove(leave_sparse=False)  # back to the plain model for the next round
    base = statistics.median(times["sparsify(logsum)"])
    n = sum(p.numel() for p in model.parameters())
    print(f"\n{name} ({n / 1e6:.2f}M parameters), medians of {rounds} interleaved rounds")
    print(f"| call | ms | / sparsify |\n| --- | --- | --- |")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"| {k} | {1e3 * m:.2f} | {m / base:.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-gpt2", action="store_true", help="LeNet-300-100 only")
    args = ap.parse_args()
    torch.manual_seed(0)
    bench("LeNet-300-100", lenet300(), args.rounds)
    if not args.no_gpt2:
        bench("GPT-2 small", gpt2_small(), args.rounds)


if __name__ == "__main__":
    main()
