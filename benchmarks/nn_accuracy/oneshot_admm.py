"""The layer problems of the benchmark networks, solved by each optimization method against the
plain growing-rho ADMM (``tests/nn/oneshot_reference.py``): per layer, the objective and the
seconds of each method, in one process, interleaved, medians over ``--rounds``.

``record`` prunes each reference network once with ``prune_oneshot`` (sequentially, as every
cell of "One-shot pruning" is: each layer's Gram on the inputs the already pruned layers give
it) with the default ``admm``, and saves every layer problem ``(W0, G, budget)`` it solved;
``compare`` solves the saved problems with each method (``NAME`` or ``NAME:opt=value,...``, or
``plain``: the reference), so that every method sees the same problems.

    OMP_NUM_THREADS=1 python3 benchmarks/nn_accuracy/oneshot_admm.py record --nets lenet300 \\
        lenet5 transformer gpt2 --targets 0.2 0.1 0.05 2:4 --out results/oneshot/problems
    OMP_NUM_THREADS=1 python3 benchmarks/nn_accuracy/oneshot_admm.py compare \\
        --out results/oneshot/problems --methods plain admm logsum --rounds 3

``compare`` appends one JSON line per layer and method to ``OUT/compare.jsonl`` and prints a
Markdown table: each method's objective over the reference's (``plain``; <= 1: as good or
better) and its seconds.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests" / "nn"))

from oneshot_networks import GPT2Net, MNISTNet, parse_target  # noqa: E402
from oneshot_reference import objective, plain_admm  # noqa: E402

EXCLUDE_NM = {"lenet5": ["conv1"]}  # 25 inputs: no N:M group fits


def network(name, data_dir, calib):
    ref = Path("results/oneshot/ref") / name
    if name == "gpt2":
        return GPT2Net(ref, 128, finetune_steps=0, eval_windows=1024)
    return MNISTNet(ref, data_dir, calib)


def method_spec(label: str):
    """``NAME`` or ``NAME:opt=value,...`` (values as Python literals) -> ``(name, options)``."""
    name, _, rest = label.partition(":")
    opts = {}
    for part in filter(None, rest.split(",")):
        k, _, v = part.partition("=")
        try:
            opts[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            opts[k] = v
    return name, opts


def record(args):
    from dualdrop.nn import prune_oneshot
    from dualdrop.nn.oneshot import get_method
    from dualdrop.nn.oneshot.methods.base import OneShotMethod

    class Recorder(OneShotMethod):
        name = "admm"

        def __init__(self):
            super().__init__()
            self.inner, self.seen = get_method("admm"), []

        def _prune(self, W0, G, budget):
            self.seen.append({"W0": W0.clone(), "G": G.clone(), "n_keep": budget.n_keep,
                              "pattern": budget.pattern})
            return self.inner.prune(W0, G, budget)

    for net_name in args.nets:
        net = network(net_name, args.data_dir, args.calib)
        for target in args.targets:
            path = args.out / net_name / f"{target.replace(':', '-')}.pt"
            if path.is_file():
                continue
            rec = Recorder()
            t0 = time.perf_counter()
            res = prune_oneshot(net.load(), net.calib, rec, progress=False,
                                exclude=EXCLUDE_NM.get(net_name) if ":" in target else None,
                                **parse_target(target))
            for p, row in zip(rec.seen, res.report.layers):
                p["layer"] = row["layer"]
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(rec.seen, tmp)
            tmp.replace(path)
            print(f"{net_name} {target}: {len(rec.seen)} layers in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)


def solve(label, W0, G, n_keep, pattern):
    """``(W, seconds)`` of one method on one problem."""
    from dualdrop.nn.oneshot import Budget, get_method

    t0 = time.perf_counter()
    if label == "plain":
        W, _ = plain_admm(W0.numpy(), G.numpy(), n_keep, pattern)
    else:
        name, opts = method_spec(label)
        budget = Budget(n_keep=n_keep) if pattern is None else Budget(pattern=tuple(pattern))
        W = get_method(name, **opts).prune(W0, G, budget).numpy()
    return W, time.perf_counter() - t0


def compare(args):
    torch.set_num_threads(1)
    out = args.out / "compare.jsonl"
    done = set()
    if out.is_file():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["net"], r["target"], r["layer"], r["method"]))
    files = sorted(args.out.glob("*/*.pt"))
    for f in files:
        net_name, target = f.parent.name, f.stem.replace("-", ":")
        if args.nets and net_name not in args.nets:
            continue
        if args.targets and target not in args.targets:
            continue
        for p in torch.load(f, weights_only=False):
            todo = [m for m in args.methods if (net_name, target, p["layer"], m) not in done]
            if not todo:
                continue
            secs = {m: [] for m in todo}
            objs = {}
            for r in range(args.rounds):
                order = todo[r % len(todo):] + todo[:r % len(todo)]
                for m in order:
                    W, s = solve(m, p["W0"], p["G"], p["n_keep"], p["pattern"])
                    secs[m].append(s)
                    objs[m] = objective(W, p["W0"].numpy(), p["G"].numpy())
            with out.open("a") as fh:
                for m in todo:
                    fh.write(json.dumps({"net": net_name, "target": target, "layer": p["layer"],
                                         "shape": list(p["W0"].shape), "method": m,
                                         "objective": objs[m],
                                         "seconds": statistics.median(secs[m])}) + "\n")
            print(f"{net_name} {target} {p['layer']}: " + ", ".join(
                f"{m} {objs[m]:.5f} {statistics.median(secs[m]):.2f}s" for m in todo),
                flush=True)
    print(table(out, args.methods))


def table(path: Path, methods) -> str:
    """Markdown: per network, target and layer, each method's objective over ``plain``'s and
    its seconds."""
    rows = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        rows.setdefault((r["net"], r["target"], r["layer"]), {})[r["method"]] = r
    others = [m for m in methods if m != "plain"]
    head = ("| net | target | layer | plain objective | plain s | "
            + " | ".join(f"{m} / plain | {m} s" for m in others) + " |")
    lines = [head, "|" + " --- |" * (5 + 2 * len(others))]
    for (net, target, layer), by_m in rows.items():
        if "plain" not in by_m:
            continue
        base = by_m["plain"]
        cells = []
        for m in others:
            r = by_m.get(m)
            cells += ([f"{r['objective'] / base['objective']:.3f}", f"{r['seconds']:.2f}"]
                      if r and base["objective"] > 0 else ["", ""])
        lines.append(f"| {net} | {target} | {layer} | {base['objective']:.5f} | "
                     f"{base['seconds']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["record", "compare", "table"])
    ap.add_argument("--nets", nargs="+", default=None)
    ap.add_argument("--targets", nargs="+", default=None)
    ap.add_argument("--methods", nargs="+", default=["plain", "admm", "logsum"])
    ap.add_argument("--out", type=Path, default=Path("results/oneshot/problems"))
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.cmd == "record":
        args.nets = args.nets or ["lenet300", "lenet5", "transformer", "gpt2"]
        args.targets = args.targets or ["0.2", "0.1", "0.05", "2:4"]
        record(args)
    elif args.cmd == "compare":
        compare(args)
    else:
        print(table(args.out / "compare.jsonl", args.methods))


if __name__ == "__main__":
    main()
