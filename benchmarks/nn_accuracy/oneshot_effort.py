"""The optimization methods' time against ADMM on the benchmark networks, in one process: seconds
of the whole ``prune_oneshot`` call, each layer's objective and the test error (perplexity for
GPT-2), for ``admm`` and the penalty method with each polish effort, interleaved over
``--rounds`` rounds (the order rotated each round; medians of seconds; the pruned weights are
the same every round), one thread. Wall and CPU seconds of the process (on a shared machine the
CPU time is what the method cost, the wall time what the load made of it).

    OMP_NUM_THREADS=1 python3 benchmarks/nn_accuracy/oneshot_effort.py --nets lenet300 lenet5 \\
        transformer gpt2 --data-dir ../shared/mnist --targets 0.2 0.1 0.05 2:4 --rounds 3 \\
        --out results/oneshot/effort.jsonl

Methods: ``--methods`` labels ``NAME`` or ``NAME:opt=value,...`` (default: ``admm``, and
``logsum`` with ``polish`` False, "swaps" and its default). Prints a Markdown table per
network (the machine's load average at the start and the end of each target), and appends
each cell to ``--out`` (JSON lines). The reference networks come from
``oneshot_references.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_admm import EXCLUDE_NM, method_spec, network  # noqa: E402
from oneshot_networks import parse_target  # noqa: E402

METHODS = ["admm", "logsum:polish=False", "logsum:polish='swaps'", "logsum"]


def load() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def warm_up(methods, target):
    """Compile (or load from numba's cache) what each method needs, on a small problem: the
    first compile is not what this benchmark times."""
    from dualdrop.nn.oneshot import Budget, get_method
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 16, generator=g, dtype=torch.float64)
    W0 = torch.randn(8, 16, generator=g, dtype=torch.float64)
    budget = Budget(pattern=(2, 4)) if ":" in target else Budget(n_keep=24)
    for m in methods:
        name, opts = method_spec(m)
        get_method(name, **opts).prune(W0, X.T @ X / 64, budget)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", nargs="+", default=["lenet300"],
                    choices=["lenet300", "lenet5", "transformer", "gpt2"])
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--targets", nargs="+", default=["0.2", "0.1", "0.05", "2:4"])
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="append each cell here (JSON lines)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from dualdrop.nn import prune_oneshot
    from dualdrop.nn.oneshot import get_method
    for net_name in args.nets:
        net = network(net_name, args.data_dir, args.calib)
        ppl = net_name == "gpt2"
        print(f"\n#### {net_name}\n\n| target | method | s (median) | CPU s (median) | "
              f"layer objectives | {'test perplexity' if ppl else 'test error (%)'} | load |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for target in args.targets:
            exclude = EXCLUDE_NM.get(net_name) if ":" in target else None
            secs = {m: [] for m in args.methods}
            cpu = {m: [] for m in args.methods}
            out = {}
            load0 = load()
            warm_up(args.methods, target)
            for r in range(args.rounds):
                order = args.methods[r % len(args.methods):] + args.methods[:r % len(args.methods)]
                for m in order:
                    name, opts = method_spec(m)
                    model = net.load()
                    t0, c0 = time.perf_counter(), time.process_time()
                    res = prune_oneshot(model, net.calib, get_method(name, **opts),
                                        progress=False, exclude=exclude, **parse_target(target))
                    secs[m].append(time.perf_counter() - t0)
                    cpu[m].append(time.process_time() - c0)
                    if m not in out:
                        out[m] = ([(row["layer"], row["objective"]) for row in res.report.layers],
                                  net.errors(model)["test"])
            span = f"{load0} -> {load()}"
            for m in args.methods:
                objs, err = out[m]
                shown = f"{err:.3f}" if ppl else f"{100 * err:.2f}"
                print(f"| {target} | {m} | {statistics.median(secs[m]):.2f} | "
                      f"{statistics.median(cpu[m]):.2f} | "
                      f"{', '.join(f'{o:.5f}' for _, o in objs)} | {shown} | {span} |", flush=True)
                if args.out:
                    with args.out.open("a") as fh:
                        fh.write(json.dumps({"net": net_name, "target": target, "method": m,
                                             "seconds": secs[m], "cpu_seconds": cpu[m],
                                             "layers": objs, "test": err,
                                             "load": span,
                                             "when": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
