"""Inference speed of trained MNIST networks in every export layout, and the issue's goals.

For each finished ``dualdrop sparsify`` run given as ``LABEL=RUN_FOLDER``, runs
``dualdrop.nn.latency`` on one thread over every layout (dense, CSR, auto, compact, their
dynamic-int8 forms, and onnxruntime on the dense / compact / compact-int8 ONNX files) at batch
1, 32 and 128: the layouts are checked to compute the dense outputs, then timed in interleaved
rounds (medians). The inputs are the first 128 MNIST test images; every layout's test error is
measured on the whole test set. Writes per network ``OUT/<label>/latency.{json,csv,png}`` and
one Markdown table per network into ``OUT/inference.md`` (times in microseconds with the
speed-up over dense, the ideal speed-up of the products (FLOP ratio) at batch 128, parameters,
nonzeros, size on disk, test error), then the goals:

- compact within 1.5x of its FLOP ratio at batch 128 (speed-up >= FLOP ratio / 1.5);
- ``auto`` >= 1.0x dense at every batch size;
- int8 compact >= 1.5x the float compact at batch 128, test error within 0.1 points (torch's
  ``compact-int8`` against ``compact``; onnxruntime's compact-int8 against its float compact).

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_inference.py \\
        "LeNet-300-100, 5% of weights=results/inference_runs/lenet300/magnitude-5pct" \\
        --data-dir ../shared/mnist --out results/inference
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from dualdrop.data import load_dataset
from dualdrop.nn.inference import latency
from dualdrop.train import load_run

BATCHES = (1, 32, 128)


def table(rep, label: str) -> list[str]:
    lays = rep.meta["layouts"]
    b_hi = max(rep.meta["batch_sizes"])
    head = ("| layout | " + " | ".join(f"batch {b}: us (speed-up) [fastest rounds]"
                                      for b in rep.meta["batch_sizes"])
            + f" | ideal at {b_hi} (FLOP ratio) | params | nonzero | size on disk (KB) "
            "| test error |")
    lines = [f"##### {label}", "", head, "|" + " --- |" * (head.count("|") - 1)]
    for lay in lays:
        cells = []
        for b in rep.meta["batch_sizes"]:
            r = rep.row(lay, b)
            cells.append(f"{1e6 * r['median_s']:.0f} ({r['speedup']:.2f}x) "
                         f"[{r['speedup_min']:.2f}x]")
        r = rep.row(lay, b_hi)
        err = "—" if r["error"] is None else f"{100 * r['error']:.2f}%"
        lines.append(f"| {lay} | " + " | ".join(cells) + f" | {r['flop_ratio']:.2f}x "
                     f"| {r['params']:,} | {r['nonzero']:,} | {r['bytes'] / 1024:.1f} | {err} |")
    notes = sorted({f"{r['layout']} at batch {r['batch']}: {r['note']}" for r in rep.rows
                    if r["note"] and r["layout"] == "auto"})
    lines += ["", "auto's choice: " + "; ".join(notes) if notes else ""]
    return lines


def goals(rep, key: str = "speedup") -> list[str]:
    """The issue's goals read from the medians (``key="speedup"``) or the fastest rounds
    (``"speedup_min"``)."""
    lays, b_hi = rep.meta["layouts"], max(rep.meta["batch_sizes"])
    out = []
    if "compact" in lays:
        r = rep.row("compact", b_hi)
        ok = r[key] >= r["flop_ratio"] / 1.5
        out.append(f"compact within 1.5x of its FLOP ratio at batch {b_hi}: "
                   f"{'met' if ok else 'NOT met'} ({r[key]:.2f}x of {r['flop_ratio']:.2f}x)")
    if "auto" in lays:
        sp = {b: rep.row("auto", b)[key] for b in rep.meta["batch_sizes"]}
        ok = all(v >= 1.0 for v in sp.values())
        out.append("auto >= 1.0x dense at every batch size: " + ("met" if ok else "NOT met")
                   + " (" + ", ".join(f"{v:.2f}x at {b}" for b, v in sp.items()) + ")")
    for q, f in (("compact-int8", "compact"), ("onnxruntime-compact-int8", "onnxruntime-compact")):
        if q in lays and f in lays:
            rq, rf = rep.row(q, b_hi), rep.row(f, b_hi)
            ratio = rq[key] / rf[key]
            derr = None if rq["error"] is None else 100 * (rq["error"] - rf["error"])
            ok = ratio >= 1.5 and (derr is None or abs(derr) <= 0.1)
            out.append(f"{q} >= 1.5x {f} at batch {b_hi}, test error within 0.1 points: "
                       f"{'met' if ok else 'NOT met'} ({ratio:.2f}x"
                       + (f", error {derr:+.2f} points" if derr is not None else "") + ")")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", default="results/inference")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--min-time", type=float, default=1e-3)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--layouts", nargs="+", default=None)
    ap.add_argument("--clock", default="cpu", choices=("wall", "cpu"),
                    help="cpu (default here): the process's CPU time, robust on a shared machine")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    md, data = [], {}
    for spec in a.runs:
        label, sep, run = spec.rpartition("=")
        if not sep:
            label, run = Path(spec).name, spec
        cfg = json.loads((Path(run) / "config.json").read_text())
        key = (cfg.get("seed", 0), cfg.get("val_fraction", 0.2))
        if key not in data:
            ds = load_dataset(a.data_dir, seed=key[0], val_fraction=key[1])
            data[key] = (torch.from_numpy(ds.X_test).float(), torch.from_numpy(ds.y_test).long())
        X, y = data[key]
        net = load_run(run)
        rep = latency(net, X[:128], layouts=a.layouts, batch_sizes=tuple(a.batch_sizes),
                      threads=1, rounds=a.rounds, min_time=a.min_time, clock=a.clock,
                      eval_data=(X, y))
        folder = out / re.sub(r"[^A-Za-z0-9.]+", "-", label).strip("-")
        rep.save(folder)
        print(rep.table())
        m = rep.meta
        md += table(rep, label)
        md += ["Goals, medians: " + "; ".join(goals(rep)) + ".", "",
               "Goals, fastest rounds: " + "; ".join(goals(rep, "speedup_min")) + ".", "",
               f"Load average {m['load_before']} -> {m['load_after']} on {m['cpus']} CPUs, "
               f"{m['date']}; {m['rounds']} interleaved rounds, medians of {m['clock']} time; "
               f"run `{run}`; "
               f"figure `{folder}/latency.png`.", ""]
        if m["notes"]:
            md += ["Notes: " + "; ".join(m["notes"]), ""]
        (out / "inference.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
