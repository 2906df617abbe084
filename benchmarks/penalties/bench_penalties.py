"""Time Omega (and derivative, eta_hat, prox) on 1e6 points for every catalog penalty.

Measured in one process: the first call (JIT compile, or load from numba's on-disk cache when
``cache=True`` files exist; tables of the numeric penalties are built then too), then the best of
``--repeat`` warm calls. The peer, measured in the same run, is the naive approach: one
``scipy.optimize.minimize_scalar`` per point on ``1/2 (w^2/eta + f(eta))`` (timed on
``--baseline-points`` points and scaled to 1e6), plus our generic vectorized ``from_dual`` numerics.

    python benchmarks/penalties/bench_penalties.py [--n 1000000] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
from scipy import optimize

import penalties as P

CATALOG = [
    ("l1", {}), ("lp", {"p": 0.5}), ("logsum", {"eps": 2.0}), ("log2sum", {"eps": 1.0}), ("scad", {"a": 3.7, "lam": 1.0}),
    ("mcp", {"a": 3.0, "lam": 1.0}), ("vardrop", {}), ("vardrop_exact", {}), ("hardconcrete", {}), ("standout", {"a": 1.0, "b": 0.0}),
]


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def baseline_minimize_scalar(pen, w):
    t = time.perf_counter()
    for wi in w:
        optimize.minimize_scalar(lambda le: 0.5 * (wi * wi / math.exp(le) + float(pen.f(math.exp(le)))),
                                 bounds=(-40, 40), method="bounded")
    return time.perf_counter() - t


_FIRST_CALL = """
import time, numpy as np
t = time.perf_counter()
import penalties as P
w = np.linspace(-3, 3, 10)
for name in ["l1", "logsum", "mcp", "vardrop_exact", "hardconcrete"]:
    p = P.get(name)
    p.omega(w); p.derivative(w); p.eta_hat(w); p.prox(w, 0.5)
    p.omega(np.linspace(0, 3, 50000))
print(time.perf_counter() - t)
"""


def jit_cold_and_cached():
    """Seconds for import + first calls in a fresh process: empty numba cache, then warm cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        out = []
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True, check=True)
            out.append(float(r.stdout.strip().splitlines()[-1]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline-points", type=int, default=300)
    ap.add_argument("--generic-points", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    w = np.exp(rng.uniform(math.log(1e-4), math.log(1e2), args.n)) * rng.choice([-1.0, 1.0], args.n)
    t = np.full(args.n, 0.5)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, n = {args.n:,}")
    cold, cached = jit_cold_and_cached()
    print(f"\nFresh process, import + first calls of 5 penalties (all four kernels, both maps): "
          f"empty numba cache {cold:.1f} s (compilation), warm cache {cached:.1f} s (cache=True load + tables)\n")
    print("| penalty | first call (JIT/cache + table) s | omega s / 1e6 | derivative s | eta_hat s | prox s | "
          "scipy minimize_scalar per point, s / 1e6 (scaled) | generic from_dual s / 1e6 (scaled) | speed-up vs scipy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, params in CATALOG:
        pen = P.get(name, **params)
        t0 = time.perf_counter()
        pen.omega(w[:10])
        pen.derivative(w[:10]); pen.eta_hat(w[:10]); pen.prox(w[:10], 0.5)
        pen.omega(w[:50000]); pen.derivative(w[:50000]); pen.eta_hat(w[:50000]); pen.prox(w[:50000], t[:50000])
        first = time.perf_counter() - t0
        scale = 1e6 / args.n
        t_om = best_of(lambda: pen.omega(w), args.repeat) * scale
        t_d = best_of(lambda: pen.derivative(w), args.repeat) * scale
        t_e = best_of(lambda: pen.eta_hat(w), args.repeat) * scale
        t_p = best_of(lambda: pen.prox(w, t), max(1, args.repeat // 2)) * scale
        sub = w[: args.baseline_points]
        t_base = baseline_minimize_scalar(pen, sub) * 1e6 / sub.size
        gen = P.from_dual(pen.f, eta_range=(1e-14, 1e14))
        # f of the numeric penalties is itself a quadrature / bisection: fewer points
        g = w[: args.generic_points if name not in ("vardrop_exact", "hardconcrete") else args.generic_points // 50]
        t_gen = best_of(lambda: gen.omega(g), 1) * 1e6 / g.size
        print(f"| {name} | {first:.2f} | {t_om:.4f} | {t_d:.4f} | {t_e:.4f} | {t_p:.4f} | {t_base:.0f} | {t_gen:.1f} | {t_base / t_om:,.0f}x |")


if __name__ == "__main__":
    main()
