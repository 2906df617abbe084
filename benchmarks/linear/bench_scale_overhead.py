"""What computing every fit at unit scale costs (dualdrop/linear/_scale.py).

Times, interleaved, on the same design: a whole ``SparseLinearRegression`` fit, the scaling
plan alone (column RMS, target divisor), and the same fit in extreme units (``X * 1e155`` and
``y * 1e300``, where the plan takes its overflow-safe path). Prints medians and the ratios
plan / fit and extreme fit / fit.

    python3 benchmarks/linear/bench_scale_overhead.py --n 500 --p 5000 --reps 7
    python3 benchmarks/linear/bench_scale_overhead.py --n 2000 --p 10000 --reps 9 --sparse \
        --scaling none

``--scaling none`` (skglm's and scikit-learn's convention, the sparse benchmark's): the plan
first bounds the columns' RMS by the extreme magnitudes of X and computes them only when that
bound leaves the band.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp

from dualdrop.linear import SparseLinearRegression, alpha_max
from dualdrop.linear._scale import plan_scaling
from dualdrop.linear.synthetic import make_sparse_problem


def _time(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--p", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sparse", action="store_true", help="a CSC design of density 1%%")
    ap.add_argument("--scaling", choices=["dropout", "none"], default="dropout")
    args = ap.parse_args()
    X, y, _ = make_sparse_problem(args.n, args.p, random_state=0)
    if args.sparse:
        rng = np.random.default_rng(0)
        X = sp.random(args.n, args.p, density=0.01, format="csc", random_state=rng)
        y = X @ rng.standard_normal(args.p) + rng.standard_normal(args.n)
    alpha = 0.05 * alpha_max(X, y, scaling=args.scaling)
    big_X, big_y = X * 1e155, y * 1e300
    est = SparseLinearRegression(alpha=alpha, scaling=args.scaling)
    # the same problem in extreme units: with scaling="dropout" alpha scales with y only (with
    # "none" it would need alpha * 1e455, beyond the floats: not timed)
    big = (SparseLinearRegression(alpha=alpha * 1e300, scaling=args.scaling)
           if args.scaling == "dropout" else None)
    est.fit(X, y)  # compile / load the kernels first
    times = {"fit": [], "plan": []}
    if big is not None:
        big.fit(big_X, big_y)
        times["fit at 1e155 / 1e300"] = []
    for _ in range(args.reps):  # interleaved: the machine's load hits all three alike
        times["fit"].append(_time(lambda: est.fit(X, y)))
        times["plan"].append(_time(lambda: plan_scaling(X, None, args.scaling, y)))
        if big is not None:
            times["fit at 1e155 / 1e300"].append(_time(lambda: big.fit(big_X, big_y)))
    med = {k: float(np.median(v)) for k, v in times.items()}
    kind = "CSC 1%" if args.sparse else "dense"
    print(f"{kind} {args.n}x{args.p}, scaling={args.scaling!r}, {args.reps} interleaved "
          "repetitions, medians:")
    for k, v in med.items():
        print(f"  {k:22s} {1e3 * v:9.2f} ms")
    print(f"  plan / fit             {med['plan'] / med['fit']:.3f}")
    if big is not None:
        print(f"  extreme / plain fit    {med['fit at 1e155 / 1e300'] / med['fit']:.3f}")


if __name__ == "__main__":
    main()
