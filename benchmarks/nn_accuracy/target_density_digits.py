"""Target density on the embedded digits: reached vs target density and test accuracy, per method.

A 64-100-10 MLP, Adam at 1e-2 over ``sp.method_param_groups`` (budget-aware rate of the method's
own parameters), batch 32, ``--steps`` steps, one thread; the same budget as
tests/nn/test_target_density.py. Prints one line per method: the reached density (after the
final calibration), the density the method's own test-time rule gave before it ("natural"),
the log multiplier at the end of the pruning ramp (before the regularizer is released for the
fine-tuning) and the test accuracy.

    OMP_NUM_THREADS=1 python3 benchmarks/nn_accuracy/target_density_digits.py --density 0.05 --steps 200

``--granularity neuron`` prunes hidden units (rows of the first layer) instead of weights; the
classifier (its rows are the classes) is then left dense, and the density is over the first
layer (hardconcrete-neuron takes only granularity="weight" and is left out).
"""

import argparse
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.data.datasets import load_digits_dataset
from dualdrop.nn import sparsify
from dualdrop.nn.registry import METHODS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--density", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--granularity", default="weight", choices=("weight", "neuron"))
    ap.add_argument("methods", nargs="*", default=list(METHODS) + ["penalty:mcp"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    d = load_digits_dataset(a.seed)
    X, y = torch.from_numpy(d.X_train), torch.from_numpy(d.y_train)
    Xt, yt = torch.from_numpy(d.X_test), torch.from_numpy(d.y_test)
    print(f"{'method':20s} target  reached natural  log_m  test_acc")
    grouped = a.granularity != "weight"
    for m in a.methods:
        if grouped and m == "hardconcrete-neuron":
            continue
        torch.manual_seed(a.seed)
        model = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 10))
        kw = {"granularity": a.granularity, "exclude": ["2"]} if grouped else {}
        sp = sparsify(model, m, target_density=a.density, **kw)
        opt = torch.optim.Adam(sp.method_param_groups(1e-2, a.steps))
        g = torch.Generator().manual_seed(a.seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for step in range(1, a.steps + 1):
                idx = torch.randint(0, len(y), (32,), generator=g)
                loss = F.cross_entropy(model(X[idx]), y[idx]) + sp.regularizer(len(y))
                opt.zero_grad()
                loss.backward()
                opt.step()
                sp.after_step(opt, step, a.steps)
        model.eval()
        with torch.no_grad():
            acc = (model(Xt).argmax(1) == yt).float().mean().item()
        c = sp.controller
        print(f"{m:20s} {a.density:.4f}  {c.reached:.4f}  {c.natural_density:.4f}  "
              f"{'—' if c.ramp_log_m is None else format(c.ramp_log_m, '6.2f'):>6s}  {acc:.3f}")


if __name__ == "__main__":
    main()
