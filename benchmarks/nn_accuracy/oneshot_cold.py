"""The first call of ``prune_oneshot(..., "logsum")`` in a fresh process: with an empty numba
cache (every kernel compiled) and with the cache that call left (kernels loaded from disk),
against a second call in the same process (warm: nothing compiled or loaded)
(benchmarks/RESULTS.md, "One-shot pruning", "Cold and warm first call").

Each cell runs in its own process on LeNet-300-100 trained here, 1,024 calibration images, one
thread, 20% density, ``progress=False``; seconds of wall clock (the compile is what the user
waits for) and of the process's CPU, with the machine's load noted.

    python3 benchmarks/nn_accuracy/oneshot_cold.py --ref results/oneshot/ref/lenet300 \\
        --data-dir ../shared/mnist --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cell(a):
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from oneshot_networks import MNISTNet

    from dualdrop.nn import prune_oneshot

    torch.set_num_threads(1)
    spec = MNISTNet(Path(a.ref), a.data_dir, 1024)
    out = {}
    for name in ("first", "second"):
        net = spec.load()
        w0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu()
        prune_oneshot(net, spec.calib, a.method, target_density=a.density, progress=False)
        out[name] = {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0,
                     "children_cpu": _children_cpu() - k0}
    print(json.dumps(out))


def _children_cpu():
    """CPU seconds of the child processes waited for (the polish compiled ahead)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="results/oneshot/ref/lenet300")
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--method", default="logsum")
    ap.add_argument("--density", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ahead", default="1", choices=["0", "1"],
                    help="DUALDROP_COMPILE_AHEAD: 1 (default) compiles the polish's kernels in "
                         "a second process while the call runs the path, 0 in the process")
    ap.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.cell:
        return _cell(a)
    rows = []
    for r in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
            for kind in ("empty cache", "filled cache"):
                cmd = [sys.executable, __file__, "--cell", "--ref", a.ref, "--data-dir",
                       a.data_dir, "--method", a.method, "--density", str(a.density)]
                out = subprocess.run(cmd, env={**env, "DUALDROP_COMPILE_AHEAD": a.ahead},
                                     capture_output=True, text=True, check=True)
                res = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append((r, kind, res, os.getloadavg()[0]))
                print(f"round {r} {kind} (ahead={a.ahead}): first call "
                      f"{res['first']['wall']:.1f} s wall ({res['first']['cpu']:.1f} s CPU, "
                      f"+{res['first']['children_cpu']:.1f} s in the second process), second call "
                      f"{res['second']['wall']:.1f} s wall ({res['second']['cpu']:.1f} s CPU); "
                      f"load {rows[-1][3]:.1f}", flush=True)
    print("\n| numba cache | compiled ahead | first call, s wall (CPU + second process) "
          "| second call in the process, s wall (CPU) | compile and load, s CPU | load |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r, kind, res, load in rows:
        f, s = res["first"], res["second"]
        print(f"| {kind} | {'yes' if a.ahead == '1' else 'no'} | {f['wall']:.1f} ({f['cpu']:.1f} "
              f"+ {f['children_cpu']:.1f}) | {s['wall']:.1f} ({s['cpu']:.1f}) | "
              f"{f['cpu'] + f['children_cpu'] - s['cpu']:.1f} | {load:.1f} |")


if __name__ == "__main__":
    main()
