"""Peak memory of a ``SparseLinearRegression`` fit above its input, in copies of ``X``.

Each cell runs in a fresh process: it builds a dense float64 ``X`` (C- or Fortran-ordered),
compiles the kernels on a small problem, then fits ``SparseLinearRegression(alpha, scaling=S)``
on ``X`` under ``tracemalloc`` (numpy's allocations are traced) and reports the peak of the fit
alone, in MiB and in copies of ``X``, beside the growth of the process's maximum resident set
(``ru_maxrss``) over the fit.

    python3 benchmarks/linear/bench_memory.py --n 20000 --p 5000

The solvers need ``X`` Fortran-ordered (column access) and, with ``scaling="dropout"`` (the
default), divided by the columns' RMS: one copy of ``X`` at most. A Fortran-ordered float64 ``X``
with ``scaling="none"`` is used as given (no copy).
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--p", type=int, default=5000)
    ap.add_argument("--cell", nargs=2, metavar=("ORDER", "SCALING"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
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
