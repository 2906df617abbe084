"""Per-epoch cost of every dualdrop.nn method vs dense LeNet-300-100, and sparse inference.

(a) Seconds per training epoch (Adam, batch 128, the method's regularizer and after_step hook)
    of every method on MNIST's 48000-image training split, beside a dense LeNet-300-100 timed in
    the same run. Methods are timed in interleaved rounds (dense, m1, m2, ..., dense, m1, ...) so
    that load from other processes hits all of them alike; the reported figure per method is the
    median over rounds, the ratio is median(method) / median(dense). Two step implementations
    (``--modes``), each with its own dense row: ``loop`` (what ``dualdrop.train`` runs: fused
    Adam where torch has it, the regularizer's gradient only) and ``plain`` (default Adam,
    ``loss + sp.regularizer(n)`` with its value: the textbook loop).
(b) Inference time of ``export_sparse`` (CSR, dense layout) vs the dense network at a reached
    density: a LeNet-300-100 is sparsified with gradual magnitude pruning to each target density
    (short training, the weights are realistic enough for timing) and timed on the 10000 test
    images (batch 1000 and batch 128), median of repeats; the CSR export is also timed on the same
    batches stored feature-major (passed as ``H.t()``, a view), which skips the one transpose
    copy of the first layer.

Usage (from the repository root)::

    python3 benchmarks/nn_speed/bench_nn_overhead.py --data-dir data/mnist --rounds 3 --threads 1

Torch runs on ``--threads`` intra-op threads (1 by default: the reference machine has 2 cores
shared with other jobs). Results go to stdout as a markdown table (and JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dualdrop.nn import METHODS, export_sparse, sparsify  # noqa: E402
from dualdrop.train.engine import train_step  # noqa: E402
from dualdrop.train.loop import make_adam  # noqa: E402

# How a step is run. "loop": as dualdrop.train does it (torch's fused Adam where available, the
# regularizer's gradient only: sp.regularizer(n, value=False)); "plain": the textbook loop
# (default Adam, loss + sp.regularizer(n) with its value), i.e. what a user writes first.
MODES = ("loop", "plain")


def lenet(n_in=784, n_out=10):
    return nn.Sequential(nn.Linear(n_in, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(),
                         nn.Linear(100, n_out))


def load(data_dir):
    from dualdrop.data import load_mnist  # PART B's verified loader

    d = load_mnist(data_dir, seed=0)
    return (torch.from_numpy(d.X_train), torch.from_numpy(d.y_train),
            torch.from_numpy(d.X_test), torch.from_numpy(d.y_test))


def build(method, mode, seed=0):
    torch.manual_seed(seed)
    model = lenet()
    sp = None if method == "dense" else sparsify(model, method)
    lr = 1e-3 if sp is None else sp.hparams["lr"]
    params = list(model.parameters())
    opt = make_adam(params, lr) if mode == "loop" else torch.optim.Adam(params, lr=lr)
    return model, sp, opt, mode == "plain"


def one_epoch(model, sp, opt, value, X, y, batch=128, total_epochs=200, epoch=0):
    n = len(y)
    steps = (n + batch - 1) // batch
    total = steps * total_epochs
    g = torch.Generator().manual_seed(epoch)
    order = torch.randperm(n, generator=g)
    model.train()
    t0 = time.perf_counter()
    for b in range(steps):
        idx = order[b * batch:(b + 1) * batch]
        loss = F.cross_entropy(model(X[idx]), y[idx])
        if not value:  # "loop": the engine's step (dualdrop.train.engine.train_step)
            train_step(loss, opt, step=epoch * steps + b, total_steps=total, sp=sp, n_train=n)
            continue
        if sp is not None:  # "plain": the textbook loop
            loss = loss + sp.regularizer(n, value=value)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sp is not None:
            sp.after_step(opt, epoch * steps + b + 1, total)
    return time.perf_counter() - t0


def bench_epochs(methods, X, y, rounds, modes):
    states = {(m, mode): build(m, mode) for mode in modes for m in ["dense"] + methods}
    # warm-up: a few steps each (numba compilation, allocator)
    for st in states.values():
        one_epoch(*st, X[:1280], y[:1280])
    times = {key: [] for key in states}
    for r in range(rounds):
        for key, st in states.items():
            times[key].append(one_epoch(*st, X, y, epoch=r + 1))
            print(f"  round {r + 1} {key[1]:5s} {key[0]:22s} {times[key][-1]:.2f}s",
                  file=sys.stderr, flush=True)
    return times


def time_fn(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


@torch.no_grad()
def bench_inference(X, y, Xte, densities, repeats, train_steps):
    rows = []
    for target in densities:
        torch.manual_seed(0)
        model = lenet()
        sp = sparsify(model, "magnitude", sparsity=1.0 - target, end=0.5,
                      prune_every=max(1, train_steps // 20), min_layer_density=target / 4)
        opt = make_adam(list(model.parameters()), 1e-3)
        with torch.enable_grad():
            for s in range(1, train_steps + 1):
                idx = torch.randint(0, len(y), (128,))
                loss = F.cross_entropy(model(X[idx]), y[idx])
                train_step(loss, opt, step=s - 1, total_steps=train_steps, sp=sp,
                           n_train=len(y))  # the engine's step
        model.eval()
        dense = export_sparse(model, "dense")
        csr = export_sparse(model, "csr")
        auto = export_sparse(model, "auto")
        dens = sp.density()["total"]
        assert torch.allclose(csr(Xte[:256]), dense(Xte[:256]), atol=1e-4)
        for bs in (1000, 128):
            batches = [Xte[i:i + bs] for i in range(0, len(Xte), bs)]
            # the same batches stored feature-major (features x batch); b.t() is a view
            batches_fm = [b.t().contiguous() for b in batches]

            def run(net, bb, transpose=False):
                if transpose:
                    return lambda: [net(b.t()) for b in bb]
                return lambda: [net(b) for b in bb]

            td = time_fn(run(dense, batches), repeats)
            tc = time_fn(run(csr, batches), repeats)
            ta = time_fn(run(auto, batches), repeats)
            tf = time_fn(run(csr, batches_fm, True), repeats)
            rows.append({"target_density": target, "density": dens, "batch": bs,
                         "dense_s": td, "csr_s": tc, "auto_s": ta, "csr_fm_s": tf,
                         "speedup_csr": td / tc, "speedup_auto": td / ta,
                         "speedup_csr_fm": td / tf})
            print(f"  density {dens:.4f} batch {bs}: dense {td * 1e3:.1f} ms, csr "
                  f"{tc * 1e3:.1f} ms, auto {ta * 1e3:.1f} ms, csr feature-major input "
                  f"{tf * 1e3:.1f} ms", file=sys.stderr, flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="data/mnist")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", nargs="*", default=list(METHODS) + ["penalty:mcp"])
    ap.add_argument("--densities", nargs="*", type=float, default=[0.01, 0.02, 0.05, 0.1, 0.3])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--train-steps", type=int, default=600)
    ap.add_argument("--skip-epochs", action="store_true")
    ap.add_argument("--skip-inference", action="store_true")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES,
                    help="step implementations to time (see MODES); each has its own dense row")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    X, y, Xte, _ = load(args.data_dir)
    out = {"threads": args.threads, "torch": torch.__version__}
    if not args.skip_epochs:
        times = bench_epochs(args.methods, X, y, args.rounds, args.modes)
        print(f"\n(a) seconds per epoch, 48000 MNIST images, batch 128, Adam, {args.threads} "
              f"thread(s), median of {args.rounds} interleaved rounds; ratio = method / dense "
              "of the same mode\n")
        print("| method | " + " | ".join(f"{md} s/epoch | {md} ratio" for md in args.modes) + " |")
        print("| --- |" + " --- | --- |" * len(args.modes))
        for m in ["dense"] + args.methods:
            cells = []
            for md in args.modes:
                med = statistics.median(times[(m, md)])
                cells += [f"{med:.2f}", f"{med / statistics.median(times[('dense', md)]):.2f}"]
            print(f"| {m} | " + " | ".join(cells) + " |")
        out["epochs"] = {f"{md}:{m}": ts for (m, md), ts in times.items()}
    if not args.skip_inference:
        rows = bench_inference(X, y, Xte, args.densities, args.repeats, args.train_steps)
        print("\n(b) inference on the 10000 test images: exported model (layout csr / auto) vs "
              "dense export, median of repeats\n")
        print("| density | batch | dense ms | csr ms | auto ms | csr, feature-major input ms | "
              "speedup csr | speedup auto | speedup csr feature-major |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['density']:.4f} | {r['batch']} | {r['dense_s'] * 1e3:.1f} | "
                  f"{r['csr_s'] * 1e3:.1f} | {r['auto_s'] * 1e3:.1f} | {r['csr_fm_s'] * 1e3:.1f} | "
                  f"{r['speedup_csr']:.2f} | {r['speedup_auto']:.2f} | "
                  f"{r['speedup_csr_fm']:.2f} |")
        out["inference"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
