"""Training-step time of the tabulated catalog penalties relative to the dense step.

``penalty:vardrop_exact`` / ``penalty:hardconcrete`` / ``penalty:vardrop`` have no closed form
(``penalties`` tabulates them); their gradient is interpolated in torch (``dualdrop.nn._table``).
Peer in the same run: the numba kernel path they used before (float64 round trip per step), and
the dense model without any regularizer (the floor). Median of the timed steps, one torch
thread; MLP 784-1000-500-10 (1.3M weights), batch 128, Adam, float32.

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_table_penalty.py [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn as nn

from dualdrop.nn import _table, sparsify


def step_time(method, value, steps, numba=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 500), nn.ReLU(),
                          nn.Linear(500, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sp = sparsify(model, method) if method else None
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    saved = _table.of_kernel
    if numba:
        _table.of_kernel = lambda *a: None
    try:
        times = []
        for s in range(1, steps + 4):
            t0 = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            if sp is not None:
                loss = loss + sp.regularizer(60000, value=value)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sp is not None:
                sp.after_step(opt, s, 1000)
            times.append(time.perf_counter() - t0)
    finally:
        _table.of_kernel = saved
    return statistics.median(times[3:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dense = step_time(None, True, args.steps)
    print(f"dense step {dense * 1e3:.1f} ms")
    print("| method | value | torch table / dense | numba kernel / dense |")
    print("|---|---|---|---|")
    for method in ("penalty:vardrop_exact", "penalty:hardconcrete", "penalty:vardrop"):
        for value in (False, True):
            t = step_time(method, value, args.steps)
            n = step_time(method, value, args.steps, numba=True)
            print(f"| {method} | {value} | {t / dense:.2f} | {n / dense:.2f} |")


if __name__ == "__main__":
    main()
