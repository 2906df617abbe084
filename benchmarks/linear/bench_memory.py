"""Peak memory of a ``SparseLinearRegression`` fit above its input, in copies of ``X``.

Each cell runs in a fresh process: it builds a dense float64 ``X`` (C- or Fortran-ordered),
compiles the kernels on a small problem, then fits ``SparseLinearRegression(alpha, scaling=S)``
on ``X`` under ``tracemalloc`` (numpy's allocations are traced) and reports the peak of the fit
alone, in MiB and in copies of ``X``, beside the growth of the process's maximum resident set
(``ru_maxrss``) over the fit.

    python3 benchmarks/linear/bench_memory.py --n 20000 --p 5000
    OMP_NUM_THREADS=1 python3 benchmarks/linear/bench_memory.py --time --n 500 --p 5000 --repeats 9

The solvers need ``X`` Fortran-ordered (column access): a C-ordered ``X`` is copied once. The
default ``scaling="dropout"`` divides the columns by their RMS as multipliers in the kernels
(``dualdrop/linear/_design.py``), so a Fortran-ordered float64 ``X`` is used as given with either
scaling.

``--time``: what the multipliers cost. On raw columns (RMS from 0.01 to 100), the default fit on
``X`` against the same problem handed over already divided (``X / s`` with ``scaling="none"``,
where the kernels multiply by 1), interleaved, medians of ``--repeats``: a ratio near 1 says the
copy was saved for free.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def _cell(n, p, order, scaling):
    import tracemalloc

    import numpy as np

    from dualdrop.linear import SparseLinearRegression

    rng = np.random.default_rng(0)
    X = np.asarray(rng.standard_normal((n, p)), order=order)
    y = X[:, :10].sum(axis=1) + rng.standard_normal(n)
    SparseLinearRegression(alpha=0.1, scaling=scaling).fit(X[:100, :50].copy(order=order),
                                                          y[:100])  # compile and load
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    SparseLinearRegression(alpha=0.1, scaling=scaling).fit(X, y)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"order": order, "scaling": scaling, "x_mib": X.nbytes / 2**20,
            "peak_mib": peak / 2**20, "copies": peak / X.nbytes, "rss_growth_mib": (rss1 - rss0) / 1024}


def _timing(n, p, repeats):
    import time

    import numpy as np

    from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression

    rng = np.random.default_rng(0)
    scales = np.logspace(-2, 2, p)
    rng.shuffle(scales)
    X = np.asfortranarray(rng.standard_normal((n, p)) * scales)
    s = np.sqrt(np.mean(X ** 2, axis=0))
    Xs = np.asfortranarray(X / s)
    t = Xs[:, :25] @ rng.choice([-1.0, 1.0], 25) + rng.standard_normal(n)
    cases = [("Lasso", SparseLinearRegression, dict(alpha=0.05), t),
             ("LogSum least squares", SparseLinearRegression,
              dict(alpha=0.05, penalty="logsum"), t),
             ("l1-logistic", SparseLogisticRegression, dict(alpha=0.01), (t > 0).astype(int))]
    print(f"X: {n} x {p} float64, Fortran-ordered, column RMS 0.01 .. 100\n")
    print("| fit | default on X (multipliers), ms | `scaling=\"none\"` on X / s, ms | ratio "
          "| max abs coef difference |")
    print("| --- | --- | --- | --- | --- |")
    for name, cls, kw, y in cases:
        cls(**kw).fit(X[:50, :40].copy(order="F"), y[:50])  # compile and load
        ta, tb = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a = cls(**kw).fit(X, y)
            ta.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = cls(scaling="none", **kw).fit(Xs, y)
            tb.append(time.perf_counter() - t0)
        ma, mb = float(np.median(ta)), float(np.median(tb))
        diff = float(np.max(np.abs(np.ravel(a.coef_) * np.tile(s, np.size(a.coef_) // p)
                                   - np.ravel(b.coef_))))
        print(f"| {name} | {1e3 * ma:.1f} | {1e3 * mb:.1f} | {ma / mb:.3f} | {diff:.1e} |",
              flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--p", type=int, default=5000)
    ap.add_argument("--time", action="store_true",
                    help="time the default fit against the pre-divided design instead")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--cell", nargs=2, metavar=("ORDER", "SCALING"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.time:
        _timing(a.n, a.p, a.repeats)
        return
    if a.cell:
        print(json.dumps(_cell(a.n, a.p, *a.cell)))
        return
    print(f"X: {a.n} x {a.p} float64\n")
    print("| X order | scaling | X, MiB | peak of the fit above X, MiB (tracemalloc) | copies of X "
          "| max RSS growth, MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for order in ("C", "F"):
        for scaling in ("dropout", "none"):
            out = subprocess.run([sys.executable, __file__, "--n", str(a.n), "--p", str(a.p),
                                  "--cell", order, scaling], capture_output=True, text=True,
                                 check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {order} | {scaling} | {r['x_mib']:.0f} | {r['peak_mib']:.0f} | "
                  f"{r['copies']:.2f} | {r['rss_growth_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
