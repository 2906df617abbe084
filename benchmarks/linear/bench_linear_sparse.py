"""Lasso on sparse CSC designs at small alpha: ``SparseLinearRegression`` against skglm's
``Lasso`` (and, with ``--peer sklearn``, scikit-learn's ``Lasso``) at matched objective.

Designs: ``scipy.sparse.random(n, p, density, format="csc", random_state=seed)`` (uniform entries
in [0, 1): raw, uncentred columns), 50 true nonzeros of standard normal size, noise 0.1;
``(1/2n)||y - Xw - b||^2 + alpha ||w||_1`` with the intercept fitted (``--no-intercept``:
``b = 0``) (ours with
``scaling="none"``, the same problem as skglm's), at ``alpha = alpha_max / {10, 100, 1000}``.

Matched objective: ``best`` is the lowest objective over both methods and every tol; each
method is timed at the loosest tol in 1e-2 .. 1e-10 whose objective is within ``--rtol`` (1e-7,
relative) of ``best``. Timings are medians of ``--repeats`` interleaved rounds (one run of each
method per round: a change of load on the shared machine hits both alike), wall and process-CPU
time, one thread (numba, BLAS). Ratio: ours / skglm (below 1: we are faster).

``--large``: the 10000 x 50000 design at 0.1% density instead (the held-out row of the skglm
port: L1 at alpha_max/100 against scikit-learn).

Run:  nice -n 10 python3 benchmarks/linear/bench_linear_sparse.py --repeats 7 --markdown out.md
      nice -n 10 python3 benchmarks/linear/bench_linear_sparse.py --large --peer sklearn \
          --divisors 100 --seeds 1 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _matched import matched_row  # noqa: E402
from bench_linear_real import alpha_max, fit_time, objective  # noqa: E402

from dualdrop.linear import SparseLinearRegression  # noqa: E402

DESIGNS = [(2000, 10000, 0.01), (5000, 20000, 0.005)]
LARGE = [(10000, 50000, 0.001)]


def design(n, p, density, seed):
    X = sp.random(n, p, density=density, format="csc", random_state=seed)
    rng = np.random.default_rng(seed)
    w = np.zeros(p)
    w[rng.choice(p, 50, replace=False)] = rng.standard_normal(50)
    return X, np.asarray(X @ w).ravel() + 0.1 * rng.standard_normal(n)


def methods(fit_intercept=True, peer="skglm"):
    import skglm
    from sklearn.linear_model import Lasso

    peers = {
        "skglm": lambda a, t: skglm.Lasso(alpha=a, tol=t, max_iter=1000,
                                          fit_intercept=fit_intercept),
        "sklearn": lambda a, t: Lasso(alpha=a, tol=t, max_iter=100000,
                                      fit_intercept=fit_intercept),
    }
    return {
        "ours": lambda a, t: SparseLinearRegression(alpha=a, scaling="none", tol=t,
                                                    max_iter=1000, fit_intercept=fit_intercept),
        peer: peers[peer],
    }


def row(X, y, alpha, args):
    meths = {name: (lambda t, make=make: make(alpha, t))
             for name, make in methods(not args.no_intercept, args.peer).items()}
    out = matched_row(meths, lambda est: objective("lasso", X, y, alpha, est.coef_,
                                                   est.intercept_),
                      X, y, rtol=args.rtol, repeats=args.repeats, budget=args.budget)
    out["peer"] = args.peer
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rtol", type=float, default=1e-7)
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--divisors", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--small", action="store_true", help="the 2000 x 10000 design only")
    ap.add_argument("--no-intercept", action="store_true", help="fit_intercept=False for both")
    ap.add_argument("--large", action="store_true", help="the 10000 x 50000 (0.1%%) design only")
    ap.add_argument("--peer", choices=["skglm", "sklearn"], default="skglm")
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    Xw, yw = design(200, 500, 0.05, 0)
    for make in methods(not args.no_intercept, args.peer).values():  # JIT warm-up
        fit_time(make(alpha_max("lasso", Xw, yw) / 100, 1e-6), Xw, yw)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    lines = [f"Command: `python3 benchmarks/linear/bench_linear_sparse.py "
             f"{' '.join(argv if argv is not None else sys.argv[1:])}`", "",
             f"Load average at the start: {load}.", "",
             f"| design | seed | alpha | ours tol | {args.peer} tol | ours s | {args.peer} s | "
             f"ours/{args.peer} (wall) | ours/{args.peer} (cpu) |",
             "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for n, p, dens in LARGE if args.large else DESIGNS[:1] if args.small else DESIGNS:
        for seed in args.seeds:
            X, y = design(n, p, dens, seed)
            amax = alpha_max("lasso", X, y)
            for d in args.divisors:
                r = row(X, y, amax / d, args)
                o, s = r["ours"], r[args.peer]
                lines.append(f"| {n} x {p}, {dens:.1%} | {seed} | alpha_max/{d} | {o['tol']:g} | "
                             f"{s['tol']:g} | {o['wall']:.4f} | {s['wall']:.4f} | "
                             f"{o['wall'] / s['wall']:.2f} | {o['cpu'] / s['cpu']:.2f} |")
                print(lines[-1], flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
