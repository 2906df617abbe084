"""Every method with its defaults on the embedded 8x8 digits: the quick start's numbers.

The digits defaults (``dualdrop.train.config.DATASET_DEFAULTS``) were chosen on the validation
split of seed 0; this script reports validation and test error, the fraction of nonzero weights
and the seconds per run for several seeds, so that the README's quick-start claims are checked.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python3 benchmarks/nn_accuracy/digits_defaults.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from dualdrop.data import load_dataset
from dualdrop.train import TrainConfig, available_methods, train


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", nargs="+", default=None, help="default: every method")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="seeds (default 0)")
    ap.add_argument("--epochs", type=int, default=None, help="default: the digits default")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    methods = args.methods or list(available_methods())
    print("| method | epochs | val. error | test error | fraction nonzero | s/run |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for m in methods:
            rows = []
            for seed in args.seeds:
                data = load_dataset(None, seed=seed)
                t0 = time.perf_counter()
                rep = train(TrainConfig(method=m, epochs=args.epochs, seed=seed, progress=False,
                                        threads=1, out=f"{tmp}/{m}-{seed}"), data=data)
                rows.append((rep["val_error"], rep["test_error"], rep["nonzero_total"],
                             time.perf_counter() - t0, rep["epochs"]))

            def cell(i, pct=True):
                vals = [r[i] * (100 if pct else 1) for r in rows]
                mean = statistics.fmean(vals)
                sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                return f"{mean:.2f}% ± {sd:.2f}" if pct else f"{mean:.4f} ± {sd:.4f}"

            print(f"| {m} | {rows[0][4]} | {cell(0)} | {cell(1)} | {cell(2, pct=False)} | "
                  f"{statistics.fmean(r[3] for r in rows):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
