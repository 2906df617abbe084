"""``target_speedup`` asked against measured: three models, two batch shapes, two targets
(benchmarks/RESULTS.md, "Structured one-shot", "Measured against asked speed-up").

Each row prunes a fresh copy of the model with ``prune_structured(..., target_speedup=S,
latency_inputs=X)`` (default allocation and method ``wanda-sp``: the method does not change the
time of a unit count; one torch thread, the library's own correction loop) and
then times the compact model against the dense one on ``X`` itself, independently of the loop:
the ratio of each one's fastest of ``--rounds`` interleaved rounds
(``allocation.latency.timed_ratio``), on the wall clock or (``--clock cpu``, on a machine busy
beyond its cores) the process's CPU time, the loop and the check alike. Models:

- ``mlp``: a user's MLP 64-256-256-10 (random weights, random calibration inputs), neurons;
- ``minilm``: all-MiniLM-L6-v2 (``structured_minilm_data``), heads and FFN neurons, calibrated
  on 128 standard-library docstring sentences;
- ``lenet5``: LeNet-5-Caffe (``dualdrop.train.models``, freshly initialized), channels and
  neurons, calibrated on 256 MNIST images (``--data-dir``).

Batch shapes: ``1`` (one input; for MiniLM one sequence of 128 tokens) and ``big`` (128 inputs;
for MiniLM 32 sequences of 128 tokens). One JSON line per row in ``--out``; rerunning skips the
rows already there (resumable), ``--table`` prints the table. Run it with ``nice`` beside other
work and read the load it records.

    python3 benchmarks/nn_speed/bench_speedup_measured.py --data-dir ../shared/mnist \\
        --clock cpu --out results/speedup_measured.jsonl
    python3 benchmarks/nn_speed/bench_speedup_measured.py --out results/speedup_measured.jsonl --table
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "nn_accuracy"))

from dualdrop.nn._timing import torch_threads  # noqa: E402
from dualdrop.nn.oneshot import prune_structured  # noqa: E402
from dualdrop.nn.oneshot.allocation.latency import timed_ratio  # noqa: E402


def _mlp(shape):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10)).eval()
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(128, 64, generator=g) for _ in range(8)]
    x = torch.randn(1 if shape == "1" else 128, 64, generator=g)
    return model, calib, x, "neuron"


def _lenet5(shape, data_dir):
    from dualdrop.data import load_dataset
    from dualdrop.train.models import LeNet5

    torch.manual_seed(0)
    model = LeNet5().eval()
    data = load_dataset(data_dir, seed=0, val_fraction=0.2)
    X = torch.from_numpy(data.X_train[:256 + 128])
    calib = [X[i:i + 64] for i in range(0, 256, 64)]
    x = X[256:257] if shape == "1" else X[256:256 + 128]
    return model, calib, x, ("channel", "neuron")


def _minilm(shape):
    from structured_minilm_data import batches, load_minilm, split

    model, tok = load_minilm()
    calib_s, _ = split(n_calib=128, n_eval=10)
    calib = batches(tok, calib_s, batch=32)
    g = torch.Generator().manual_seed(0)
    n = 1 if shape == "1" else 32
    ids = torch.randint(1000, tok.vocab_size, (n, 128), generator=g)
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
         "token_type_ids": torch.zeros_like(ids)}
    return model, calib, x, ("head", "neuron")


def _forward(model, x):
    return model(**x) if isinstance(x, dict) else model(x)


def run_row(name, shape, target, args):
    if name == "mlp":
        model, calib, x, gran = _mlp(shape)
    elif name == "lenet5":
        model, calib, x, gran = _lenet5(shape, args.data_dir)
    else:
        model, calib, x, gran = _minilm(shape)
    dense = copy.deepcopy(model)
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = prune_structured(model, calib, args.method, granularity=gran,
                               target_speedup=target, latency_inputs=x, progress=False,
                               latency_options={"clock": args.clock})
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    small = res.compact(x)
    with torch_threads(1), torch.no_grad():
        check, spread = timed_ratio({"dense": lambda: _forward(dense, x),
                                     "compact": lambda: _forward(small, x)}, rounds=args.rounds,
                                    clock=args.clock)
    rep = res.report
    missed = [str(w.message) for w in caught if "closest measured speed-up" in str(w.message)]
    return {"model": name, "batch": shape, "asked": target, "clock": args.clock,
            "predicted": rep.predicted_speedup, "measured_in_loop": rep.measured_speedup,
            "measured_check": check, "check_spread": spread, "met_warning": missed,
            "prune_seconds": secs, "prune_cpu_seconds": cpu, "method": args.method,
            "load_before": load0, "load_after": os.getloadavg()[0],
            "kept": {k: len(v) for k, v in res.units.items()}}


def table(path):
    rows = [json.loads(line) for line in open(path)]
    print("| model | batch | asked | predicted | measured (loop) | measured (check) "
          "| check / asked | prune, s wall | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['asked']:.2f}x | {r['predicted']:.2f}x | "
              f"{r['measured_in_loop']:.2f}x | {r['measured_check']:.2f}x | "
              f"{r['measured_check'] / r['asked']:.3f} | {r['prune_seconds']:.0f} | "
              f"{r['load_before']:.1f}-{r['load_after']:.1f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "lenet5", "minilm"])
    ap.add_argument("--batches", nargs="+", default=["1", "big"])
    ap.add_argument("--targets", nargs="+", type=float, default=[1.5, 2.0])
    ap.add_argument("--method", default="wanda-sp")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of the independent check")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="what the loop and the check time: the wall clock (an idle machine) or "
                         "the process's CPU time (a machine busy beyond its cores)")
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--out", default="results/speedup_measured.jsonl")
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args(argv)
    if args.table:
        return table(args.out)
    done = set()
    if os.path.exists(args.out):
        done = {(r["model"], r["batch"], r["asked"]) for r in map(json.loads, open(args.out))}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for name in args.models:
        for shape in args.batches:
            for target in args.targets:
                if (name, shape, target) in done:
                    continue
                row = run_row(name, shape, target, args)
                with open(args.out, "a") as f:   # one line per finished row: resumable
                    f.write(json.dumps(row) + "\n")
                print(f"{name} batch {shape} asked {target}: predicted {row['predicted']:.2f}x, "
                      f"loop {row['measured_in_loop']:.2f}x, check {row['measured_check']:.2f}x "
                      f"({row['prune_seconds']:.0f} s; load {row['load_before']:.1f})",
                      flush=True)


if __name__ == "__main__":
    main()
