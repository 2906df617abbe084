"""Layer problems of a trained LeNet-300-100: the optimization methods against ADMM and the exact
optimum (benchmarks/RESULTS.md, "One-shot pruning", layer problems).

The layer problems ``(W0, G)`` are those of the dense network (each layer's Gram on the inputs
the dense network gives it, from the first ``--calib`` examples of the seeded permutation of the
training split that ``oneshot_networks.py`` calibrates on), so every method solves the same
problems. For every target (a density of each layer, or an N:M pattern) and layer, each method
prunes the layer; the rounds run the methods interleaved (the order rotated each round), and the
time of a method is its median over ``--rounds`` rounds (one torch / BLAS / numba thread). Per
cell: the layer objective ``||X (W - W0)^T||^2 / ||X W0^T||^2`` and seconds, and their ratios to
``admm`` (the slowly growing rho schedule) and to ``admm:alps``.

Small layers: ``--small`` random subsets of ``--small-inputs`` inputs and ``--small-rows`` rows of
each layer (live inputs only), whose exact optimum is enumerated (``_layer.exact_optimum``):
every method's objective over the optimum.

    python3 -m dualdrop sparsify --model lenet300 --method none --epochs 10 \\
        --data-dir ../shared/mnist --seed 0 --threads 1 --out results/oneshot_opt/lenet300
    OMP_NUM_THREADS=1 python3 benchmarks/nn_accuracy/oneshot_layers.py \\
        --run results/oneshot_opt/lenet300 --data-dir ../shared/mnist --out results/oneshot_opt/layers

Writes ``OUT/cells.jsonl`` (one line per method x target x layer, resumable: finished cells are
skipped), ``OUT/small.jsonl`` and ``OUT/tables.md`` (``--report`` only rewrites the tables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

METHODS = {  # label -> (registry name, options)
    "admm": ("admm", {}),
    "admm:alps": ("admm", {"schedule": "alps"}),
    "admm+polish": ("admm", {"polish": True}),
    "logsum": ("logsum", {}),
    "logsum-nopolish": ("logsum", {"polish": False}),
    "logsum:full": ("logsum", {"polish": "full"}),  # the full polish on every layer
    "logsum:swaps": ("logsum", {"polish": "swaps"}),
    "mcp": ("mcp", {}),
    "penalty:l1": ("penalty:l1", {}),
    "vardrop": ("vardrop", {}),
    "hardconcrete": ("hardconcrete", {}),
    "sparsegpt": ("sparsegpt", {}),
    "wanda": ("wanda", {}),
}
TARGETS = ["0.2", "0.1", "0.05", "2:4"]


def budget_of(target: str, shape):
    from dualdrop.nn.oneshot.methods.base import Budget, parse_pattern

    if ":" in target:
        return Budget(pattern=parse_pattern(target))
    return Budget(n_keep=round(float(target) * shape[0] * shape[1]))


def layer_problems(run: str, data_dir: str, calib: int, seed: int = 0):
    """``{name: (W0, G)}`` of the dense network's Linear layers, float64."""
    from dualdrop.data import load_dataset
    from dualdrop.train import load_run

    cfg = json.loads((Path(run) / "config.json").read_text())
    data = load_dataset(data_dir, seed=cfg.get("seed", 0),
                        val_fraction=cfg.get("val_fraction", 0.2))
    Xtr = torch.from_numpy(data.X_train)
    g = torch.Generator().manual_seed(seed)
    X = Xtr[torch.randperm(len(Xtr), generator=g)[:calib]].double()
    net = load_run(run).double().eval()
    out = {}
    with torch.no_grad():
        h = X
        for name in ("fc1", "fc2", "fc3"):
            lin = getattr(net, name)
            out[name] = (lin.weight.detach().clone(), h.T @ h / h.shape[0])
            h = lin(h)
            if name != "fc3":
                h = torch.relu(h)
    return out


def done_keys(path: Path, fields):
    if not path.exists():
        return set()
    return {tuple(json.loads(line)[f] for f in fields) for line in path.read_text().splitlines()
            if line.strip()}


def run_layers(problems, methods, targets, rounds, out: Path):
    from dualdrop.nn.oneshot.methods.base import layer_objective
    from dualdrop.nn.oneshot.registry import get_method

    cells = out / "cells.jsonl"
    done = done_keys(cells, ("target", "layer", "method"))
    for target in targets:
        for layer, (W0, G) in problems.items():
            todo = [m for m in methods if (target, layer, m) not in done]
            if not todo:
                continue
            budget = budget_of(target, W0.shape)
            times = {m: [] for m in todo}
            objs = {}
            for r in range(rounds):
                order = todo[r % len(todo):] + todo[:r % len(todo)]
                for m in order:
                    name, opts = METHODS[m]
                    meth = get_method(name, **opts)
                    t0 = time.perf_counter()
                    W = meth.prune(W0, G, budget)
                    times[m].append(time.perf_counter() - t0)
                    objs[m] = layer_objective(W, W0, G)
                    assert budget.met_by(W)
            with cells.open("a") as f:
                for m in todo:
                    rec = {"target": target, "layer": layer, "method": m,
                           "objective": objs[m], "seconds": statistics.median(times[m]),
                           "all_seconds": times[m]}
                    f.write(json.dumps(rec) + "\n")
                    print(f"{target:>5} {layer} {m:<16} objective {objs[m]:.5f} "
                          f"{statistics.median(times[m]):7.2f}s", flush=True)


def run_small(problems, methods, targets, n_subsets, n_inputs, n_rows, out: Path):
    from dualdrop.nn.oneshot.methods._layer import exact_optimum
    from dualdrop.nn.oneshot.methods.base import layer_objective
    from dualdrop.nn.oneshot.registry import get_method

    path = out / "small.jsonl"
    done = done_keys(path, ("target", "layer", "subset"))
    rng = np.random.default_rng(0)
    for layer, (W0, G) in problems.items():
        live = np.flatnonzero(G.diagonal().numpy() > 0)
        for s in range(n_subsets):
            cols = np.sort(rng.choice(live, size=n_inputs, replace=False))
            rows = np.sort(rng.choice(W0.shape[0], size=min(n_rows, W0.shape[0]),
                                      replace=False))
            w0 = W0[rows][:, cols].contiguous()
            g = G[cols][:, cols].contiguous()
            for target in targets:
                if (target, layer, s) in done:
                    continue
                budget = budget_of(target, w0.shape)
                opt, _ = exact_optimum(w0, g, budget)
                rec = {"target": target, "layer": layer, "subset": s, "optimum": opt,
                       "ratio": {}}
                for m in methods:
                    name, opts = METHODS[m]
                    W = get_method(name, **opts).prune(w0, g, budget)
                    rec["ratio"][m] = layer_objective(W, w0, g) / opt if opt > 0 else 1.0
                with path.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"small {target:>5} {layer} #{s}: " + " ".join(
                    f"{m} {v:.4f}" for m, v in rec["ratio"].items()), flush=True)


def report(out: Path, methods):
    lines = []
    cells = [json.loads(x) for x in (out / "cells.jsonl").read_text().splitlines() if x.strip()] \
        if (out / "cells.jsonl").exists() else []
    if cells:
        lines += ["Layer objective (relative reconstruction error) and seconds per layer; ratios "
                  "to `admm` (slow rho schedule).", ""]
        targets = [t for t in TARGETS if any(c["target"] == t for c in cells)]
        layers = sorted({c["layer"] for c in cells})
        have = [m for m in methods if any(c["method"] == m for c in cells)]
        by = {(c["target"], c["layer"], c["method"]): c for c in cells}
        lines.append("| target | layer | " + " | ".join(have) + " |")
        lines.append("|---|---|" + "---|" * len(have))
        for t in targets:
            for lay in layers:
                ref = by.get((t, lay, "admm"))
                row = []
                for m in have:
                    c = by.get((t, lay, m))
                    if c is None:
                        row.append("")
                    elif ref is None or m == "admm":
                        row.append(f"{c['objective']:.5f} ({c['seconds']:.2f}s)")
                    else:
                        row.append(f"{c['objective']:.5f} (x{c['objective'] / ref['objective']:.3f},"
                                   f" {c['seconds']:.2f}s)")
                lines.append(f"| {t} | {lay} | " + " | ".join(row) + " |")
        lines += ["", "Whole network (sum over layers): seconds and ratio to `admm`.", "",
                  "| target | " + " | ".join(have) + " |", "|---|" + "---|" * len(have)]
        for t in targets:
            tot = {m: sum(by[(t, lay, m)]["seconds"] for lay in layers if (t, lay, m) in by)
                   for m in have}
            ref = tot.get("admm")
            lines.append(f"| {t} | " + " | ".join(
                f"{tot[m]:.2f}s" + (f" (x{tot[m] / ref:.2f})" if ref else "") for m in have)
                + " |")
    small = [json.loads(x) for x in (out / "small.jsonl").read_text().splitlines()
             if x.strip()] if (out / "small.jsonl").exists() else []
    if small:
        have = [m for m in methods if m in small[0]["ratio"]]
        lines += ["", f"Small layers ({len(small)} problems): objective over the enumerated "
                  "optimum, mean / max.", "", "| target | " + " | ".join(have) + " |",
                  "|---|" + "---|" * len(have)]
        for t in TARGETS:
            rs = [s for s in small if s["target"] == t]
            if rs:
                lines.append(f"| {t} | " + " | ".join(
                    f"{np.mean([s['ratio'][m] for s in rs]):.4f} / "
                    f"{np.max([s['ratio'][m] for s in rs]):.4f}" for m in have) + " |")
    (out / "tables.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a finished dualdrop sparsify run (LeNet-300-100)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--out", required=True)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", type=int, default=5, help="random small layers per layer")
    ap.add_argument("--small-inputs", type=int, default=12)
    ap.add_argument("--small-rows", type=int, default=10)
    ap.add_argument("--small-only", action="store_true", help="only the small layers")
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method label(s) {unknown}; known: {list(METHODS)}")
    if not args.report:
        if os.environ.get("OMP_NUM_THREADS") != "1":
            print("note: set OMP_NUM_THREADS=1 for one BLAS thread", flush=True)
        problems = layer_problems(args.run, args.data_dir, args.calib)
        targets = args.targets.split(",")
        if args.small:
            run_small(problems, methods, targets, args.small, args.small_inputs,
                      args.small_rows, out)
        if not args.small_only:
            run_layers(problems, methods, targets, args.rounds, out)
    report(out, methods)


if __name__ == "__main__":
    main()
