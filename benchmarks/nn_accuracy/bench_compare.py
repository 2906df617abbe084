"""Comparison of sparsification methods on MNIST: timing estimate and the run itself.

Two modes, both through the library's own training loop (``dualdrop.train.train``):

``--estimate``: for every method (and the dense baseline, in the same process, one after the
other) train ONE epoch of the full-length configuration (``--epochs`` sets the schedule, the run
stops after epoch 1), and print seconds per epoch and the projected time of the full comparison.
The timing runs go to a scratch folder and are deleted.

default: ``run_comparison`` (resumable: rerun the same command to continue; finished runs are
skipped), then print the table. Equivalent to ``dualdrop compare``.

Examples::

    PYTHONPATH=. nice -n 10 python3 benchmarks/nn_accuracy/bench_compare.py --estimate --data-dir data/mnist
    PYTHONPATH=. nice -n 10 python3 benchmarks/nn_accuracy/bench_compare.py --epochs 200 \
        --data-dir data/mnist --out results/compare200
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time

import torch

from dualdrop.data import load_dataset
from dualdrop.train import TrainConfig, train
from dualdrop.train.experiments.compare import DEFAULT_METHODS, run_comparison


def estimate(methods, data, epochs, threads, seed):
    scratch = tempfile.mkdtemp(prefix="bench_compare_")
    rows = []
    try:
        for m in ["none", *methods]:
            cfg = TrainConfig(method=m, epochs=epochs, stop_after=1, seed=seed, threads=threads,
                              progress=False, out=os.path.join(scratch, m.replace(":", "_")))
            t0 = time.perf_counter()
            rep = train(cfg, data=data)
            wall = time.perf_counter() - t0
            h = rep["history"][-1]
            rows.append({"method": m, "s_per_epoch": h["seconds"],
                         "eval_s": h["eval_seconds"], "wall_s": wall,
                         "val_error_epoch1": h["val_error"], "nonzero_epoch1": h["nonzero_total"]})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    dense = rows[0]["s_per_epoch"]
    print(f"# seconds per epoch, {data.summary()}, torch threads {torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}, load avg {os.getloadavg()[0]:.2f}")
    print("| method | s/epoch (train) | ratio to dense | eval s | val. error after 1 epoch "
          "| nonzero after 1 epoch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['method']} | {r['s_per_epoch']:.2f} | {r['s_per_epoch'] / dense:.2f} | "
              f"{r['eval_s']:.2f} | {100 * r['val_error_epoch1']:.2f}% | "
              f"{r['nonzero_epoch1']:.4f} |")
    total = sum(r["s_per_epoch"] + r["eval_s"] for r in rows[1:]) * epochs
    print(f"\nprojected {epochs}-epoch comparison of {len(methods)} methods, one process: "
          f"{total / 3600:.2f} h")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="*", default=list(DEFAULT_METHODS))
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="results/compare")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--estimate", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_dataset(args.data_dir, seed=args.seed)
    if args.estimate:
        rows = estimate(args.methods, data, args.epochs, args.threads, args.seed)
        print(json.dumps(rows))
        return 0
    run_comparison(args.methods, epochs=args.epochs, out=args.out, data_dir=args.data_dir,
                   seed=args.seed, threads=args.threads, progress=not args.no_progress,
                   stop_after=args.stop_after, data=data)
    print(open(os.path.join(args.out, "table.md")).read())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
