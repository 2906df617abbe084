"""Structured one-shot pruning of the trained LeNet-5-Caffe (conv channels and fc neurons) on
MNIST, against training-based structured sparsity at the same parameter count.

The reference network of the one-shot benchmarks (``oneshot_references.sh``: 10 epochs, test
error 0.82%) is pruned by ``prune_structured(..., granularity=("channel", "neuron"))`` from 1,024
training images, no fine-tuning, for every method and allocation, at the parameter count of the
training-based row of RESULTS "Structured sparsity" (magnitude by channel, 4 epochs: 18,224
parameters, 1.40%) and at fractions of the prunable parameters (``--budgets``: ``params:N``,
``density:D``, or ``speedup:S``, a measured speed-up at the calibration batch). Recorded: test error, the
compact model's parameters and multiply-accumulates per image, its speed against the dense
network (batch 128, one thread, interleaved rounds, CPU-time medians), the prune's seconds.
One JSON line per cell to ``--out`` (resumable); ``--tables`` prints the table. ::

    python3 benchmarks/nn_accuracy/structured_oneshot_cnn.py --ref results/oneshot/ref/lenet5 \\
        --data-dir ../shared/mnist --out results/structured_cnn/lenet5.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_networks import MNISTNet, allocation_kwargs, compact_speedup  # noqa: E402

from dualdrop.nn.oneshot import prune_structured  # noqa: E402

BUDGETS = ["params:18224", "density:0.2", "density:0.1"]


def macs(model, x) -> int:
    """Multiply-accumulates of one forward of ``x`` (convolutions and Linear layers)."""
    total = [0]

    def hook(m, args, out):
        if isinstance(m, torch.nn.Conv2d):
            total[0] += out.numel() * m.in_channels // m.groups * m.kernel_size[0] * \
                m.kernel_size[1]
        elif isinstance(m, torch.nn.Linear):
            total[0] += out.numel() * m.in_features

    hs = [m.register_forward_hook(hook) for m in model.modules()
          if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(x)
    for h in hs:
        h.remove()
    return total[0] // x.shape[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="results/oneshot/ref/lenet5")
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--methods", nargs="+",
                    default=["magnitude", "wanda-sp", "flap", "ziplm", "osscar", "logsum"])
    ap.add_argument("--allocations", nargs="+", default=["uniform", "flap", "penalty"],
                    help="penalty:none / penalty:energy: the penalty allocation's normalize")
    ap.add_argument("--budgets", nargs="+", default=BUDGETS)
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--out", default="results/structured_cnn/lenet5.jsonl")
    ap.add_argument("--tables", action="store_true")
    args = ap.parse_args(argv)
    if args.tables:
        print_tables(args.out)
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    done = {json.loads(line)["key"] for line in open(args.out)} if os.path.exists(args.out) \
        else set()
    torch.set_num_threads(1)
    net = MNISTNet(Path(args.ref), args.data_dir, args.calib)
    dense = net.load().eval()
    x_time = net.Xte[:128]
    dense_err = net.errors(dense)["test"]
    dense_macs = macs(dense, x_time)
    n_dense = sum(p.numel() for p in dense.parameters())
    for budget in args.budgets:
        kind, val = budget.split(":")
        kw = ({"target_params": int(val)} if kind == "params" else
              {"target_speedup": float(val)} if kind == "speedup" else
              {"target_density": float(val)})
        for alloc in args.allocations:
            for meth in args.methods:
                key = json.dumps([meth, alloc, budget, args.calib])
                if key in done:
                    continue
                m = copy.deepcopy(dense)
                t0, c0 = time.perf_counter(), time.process_time()
                res = prune_structured(m, list(net.calib.split(128)), meth,
                                       granularity=("channel", "neuron"),
                                       **allocation_kwargs(alloc), progress=False, **kw)
                secs, cpu = time.perf_counter() - t0, time.process_time() - c0
                errs = net.errors(m)
                err = errs["test"]
                small = res.compact(x_time)
                sp = compact_speedup(dense, small, x_time)
                row = {"key": key, "method": meth, "allocation": alloc, "budget": budget,
                       "test_error": err, "val_error": errs["val"], "dense_error": dense_err,
                       "params": sum(p.numel() for p in small.parameters()),
                       "dense_params": n_dense, "macs": macs(small, x_time),
                       "dense_macs": dense_macs, "speedup": sp, "seconds": secs,
                       "cpu_seconds": cpu, "kept": res.units and {k: len(v) for k, v in
                                                                  res.units.items()},
                       "objectives": res.report.objectives(),
                       "load": os.getloadavg()[0]}
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{budget:14s} {alloc:8s} {meth:9s} error {100 * err:.2f}% params "
                      f"{row['params']:,} MACs {row['macs']:,} speed-up {sp:.2f}x "
                      f"{secs:.1f} s", flush=True)


def print_tables(path):
    rows = [json.loads(line) for line in open(path)]
    print("| budget | allocation | method | validation error | test error | parameters | "
          "MACs / image | compact vs dense | prune s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        val = f"{100 * r['val_error']:.2f}%" if "val_error" in r else "-"
        print(f"| {r['budget']} | {r['allocation']} | {r['method']} | {val} | "
              f"{100 * r['test_error']:.2f}% | {r['params']:,} | {r['macs']:,} | "
              f"{r['speedup']:.2f}x | {r['seconds']:.1f} |")


if __name__ == "__main__":
    main()
