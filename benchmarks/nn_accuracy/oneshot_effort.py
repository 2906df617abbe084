"""The penalty methods' polish effort against ADMM on one network, in one process: seconds of
the one-shot call, each layer's objective and the test error, for ``polish`` False, "swaps" and
"full" (the default) of a penalty method, and ADMM's default (slow) schedule, interleaved over
``--rounds`` rounds (medians of seconds; the pruned weights are the same every round).

    OMP_NUM_THREADS=1 python3 benchmarks/nn_accuracy/oneshot_effort.py --net lenet300 \\
        --ref results/oneshot/ref/lenet300 --data-dir ../shared/mnist --targets 0.2 0.05

Prints a Markdown table. The reference network comes from ``oneshot_references.sh``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_networks import MNISTNet, parse_target  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="lenet300", choices=["lenet300", "lenet5", "transformer"])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--targets", nargs="+", default=["0.2", "0.05"])
    ap.add_argument("--method", default="logsum", help="the penalty method (default logsum)")
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from dualdrop.nn import prune_oneshot
    net = MNISTNet(Path(args.ref), args.data_dir, args.calib)
    variants = [("admm", {}), (args.method, {"polish": False}),
                (args.method, {"polish": "swaps"}), (args.method, {"polish": "full"})]
    print("| target | method | polish | s (median) | layer objectives | test error (%) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for target in args.targets:
        secs = {i: [] for i in range(len(variants))}
        out = {}
        for _ in range(args.rounds):
            for i, (name, opts) in enumerate(variants):
                model = net.load()
                t0 = time.perf_counter()
                res = prune_oneshot(model, net.calib, name, options=opts, progress=False,
                                    **parse_target(target))
                secs[i].append(time.perf_counter() - t0)
                out[i] = ([r["objective"] for r in res.report.layers],
                          net.errors(model)["test"])
        for i, (name, opts) in enumerate(variants):
            objs, err = out[i]
            pol = opts.get("polish", "-") if name != "admm" else "-"
            print(f"| {target} | {name} | {pol} | {statistics.median(secs[i]):.2f} | "
                  f"{', '.join(f'{o:.5f}' for o in objs)} | {100 * err:.2f} |", flush=True)


if __name__ == "__main__":
    main()
