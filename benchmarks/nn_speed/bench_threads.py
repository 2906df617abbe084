"""Training speed with 1 vs 2 torch intra-op threads, with and without a competing process.

Why: torch starts one intra-op thread per core. On a small machine that also runs other work,
two threads per training process oversubscribe the cores, and a thread that is descheduled
stalls every parallel op of the other (each op waits for its slowest chunk). This measures the
milliseconds per training step of LeNet-300-100 on MNIST (a 6,400-image slice of the training
split, so one epoch is 50 steps of batch 128) for ``--threads 1`` and ``--threads 2``: as the
machine is found, and with one extra training process (dense, 1 thread) running beside it.
Each configuration runs in a fresh process, interleaved, ``--repeats`` times; medians reported.

    PYTHONPATH=. nice -n 10 python3 benchmarks/nn_speed/bench_threads.py --data-dir /path/to/mnist
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, tempfile
from dualdrop.data import load_dataset
from dualdrop.train import TrainConfig, train
method, data_dir = sys.argv[1], sys.argv[3]
threads, n, epochs = int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
d = load_dataset(data_dir, seed=0)
d.X_train, d.y_train = d.X_train[:n], d.y_train[:n]
with tempfile.TemporaryDirectory() as tmp:
    rep = train(TrainConfig(method=method, epochs=epochs, batch_size=128, threads=threads,
                            progress=False, out=tmp + "/r"), data=d)
    h = json.load(open(tmp + "/r/history.json"))
print(json.dumps([r["seconds"] for r in h]))
"""

LOAD = r"""
import sys, tempfile, time
from dualdrop.data import load_dataset
from dualdrop.train import TrainConfig, train
d = load_dataset(sys.argv[1], seed=0)
d.X_train, d.y_train = d.X_train[:6400], d.y_train[:6400]
end = time.time() + float(sys.argv[2])
while time.time() < end:
    with tempfile.TemporaryDirectory() as tmp:
        train(TrainConfig(method="none", epochs=3, threads=1, progress=False, out=tmp + "/r"),
              data=d)
"""


def run_child(method, threads, data_dir, n, epochs) -> float:
    """Median seconds per step over the epochs after the first (warm-up)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", CHILD, method, str(threads), data_dir, str(n),
                          str(epochs)], capture_output=True, text=True, env=env, check=True)
    secs = json.loads(out.stdout.strip().splitlines()[-1])
    steps = -(-n // 128)
    return statistics.median(secs[1:]) / steps * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", required=True, help="folder with the MNIST IDX files")
    ap.add_argument("--methods", nargs="+", default=["none", "logsum"],
                    help="methods to time (default: none logsum)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (default 3)")
    ap.add_argument("--n", type=int, default=6400, help="training images (default 6400)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is "
                    "warm-up (default 4)")
    args = ap.parse_args(argv)
    results: dict = {}
    with tempfile.TemporaryDirectory():
        for load in ("as found", "+1 training process"):
            loader = None
            if load != "as found":
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
                loader = subprocess.Popen([sys.executable, "-c", LOAD, args.data_dir, "100000"],
                                          env=env, stdout=subprocess.DEVNULL)
                time.sleep(5)
            try:
                for _ in range(args.repeats):
                    for m in args.methods:
                        for t in (1, 2):
                            ms = run_child(m, t, args.data_dir, args.n, args.epochs)
                            results.setdefault((load, m, t), []).append(ms)
                            print(f"{load}: {m} threads={t}: {ms:.2f} ms/step "
                                  f"(load average {os.getloadavg()[0]:.1f})", file=sys.stderr,
                                  flush=True)
            finally:
                if loader is not None:
                    loader.terminate()
                    loader.wait()
    print(f"cores: {os.cpu_count()}; load average at the end {os.getloadavg()[0]:.1f}")
    print("| machine | method | 1 thread (ms/step) | 2 threads (ms/step) | 2 / 1 |")
    print("| --- | --- | --- | --- | --- |")
    for load in ("as found", "+1 training process"):
        for m in args.methods:
            a = statistics.median(results[(load, m, 1)])
            b = statistics.median(results[(load, m, 2)])
            print(f"| {load} | {m} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
