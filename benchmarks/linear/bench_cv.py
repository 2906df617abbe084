"""Cross-validated Lasso: ``SparseLinearRegressionCV`` against scikit-learn's ``LassoCV`` on the
same folds and grid, raw and standardized data, with and without sample weights (and the
elastic net, ``l1_ratio=0.5``, against ``ElasticNetCV``).

Both fit the same problems (``scaling="none"``, 5-fold ``KFold``, ``--n-alphas`` alphas from
``alpha_max`` down to ``1e-3 alpha_max``), each at its default tolerance (1e-4, on different
criteria: scikit-learn's duality gap, our gradient-mapping criterion) and at a tight one. Reported:
the chosen ``alpha_`` (same index?), the largest relative difference of the test-error paths, and
the fit times (median of ``--repeats``; one BLAS thread, first call excluded: numba compiles once).
The ratio is ours / scikit-learn (below 1: we are faster); the two are timed alternately, so a
change of load on the shared machine hits both.

Run:  nice -n 10 python3 benchmarks/linear/bench_cv.py --repeats 5 --markdown out.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from sklearn.datasets import load_diabetes  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import ElasticNetCV, LassoCV  # noqa: E402
from sklearn.preprocessing import PolynomialFeatures, StandardScaler  # noqa: E402

from dualdrop.linear import SparseLinearRegressionCV  # noqa: E402


def _data():
    X, y = load_diabetes(return_X_y=True, scaled=False)
    P = PolynomialFeatures(2, include_bias=False).fit_transform(X)
    rng = np.random.default_rng(0)
    sw = rng.integers(0, 4, X.shape[0]).astype(float)
    std = StandardScaler().fit_transform
    return [("diabetes raw", X, y, None, 1.0), ("diabetes raw, weighted", X, y, sw, 1.0),
            ("diabetes std", std(X), y, None, 1.0), ("diabetes poly2 raw", P, y, None, 1.0),
            ("diabetes poly2 std", std(P), y, None, 1.0),
            ("diabetes poly2 std, l1_ratio 0.5", std(P), y, None, 0.5)]


def _time_pair(makes, X, y, sw, repeats):
    """Median fit times of each ``make()`` and the fitted estimators; each round fits every
    one once (interleaved)."""
    for make in makes:
        make().fit(X, y, sample_weight=sw)  # compile / warm up
    ts, ests = [[] for _ in makes], [None] * len(makes)
    for _ in range(repeats):
        for k, make in enumerate(makes):
            t0 = time.perf_counter()
            ests[k] = make().fit(X, y, sample_weight=sw)
            ts[k].append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in ts], ests


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-alphas", type=int, default=100)
    ap.add_argument("--tols", default="1e-4/1e-4,1e-8/1e-12",
                    help="pairs ours/sklearn, comma-separated")
    ap.add_argument("--only", default=None, help="the rows whose name contains this")
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    rows = ["| data | n x p | tol (ours / sklearn) | same alpha_ | max rel diff mse_path | "
            "ours s | sklearn s | ours/sklearn |", "|---|---|---|---|---|---|---|---|"]
    tols = [tuple(float(t) for t in pair.split("/")) for pair in args.tols.split(",")]
    for name, X, y, sw, l1 in _data():
        if args.only and args.only not in name:
            continue
        for tol_o, tol_s in tols:
            ours = lambda: SparseLinearRegressionCV(  # noqa: E731
                alphas=args.n_alphas, cv=5, scaling="none", tol=tol_o, max_iter=10000,
                l1_ratio=l1)
            if l1 == 1.0:
                peer = lambda: LassoCV(  # noqa: E731
                    alphas=args.n_alphas, cv=5, tol=tol_s, max_iter=100000)
            else:
                peer = lambda: ElasticNetCV(  # noqa: E731
                    l1_ratio=l1, alphas=args.n_alphas, cv=5, tol=tol_s, max_iter=100000)
            (t_o, t_s), (o, s) = _time_pair([ours, peer], X, y, sw, args.repeats)
            same = bool(np.isclose(o.alpha_, s.alpha_, rtol=1e-9))
            diff = float(np.max(np.abs(o.mse_path_ - s.mse_path_) / s.mse_path_))
            rows.append(f"| {name} | {X.shape[0]} x {X.shape[1]} | {tol_o:g} / {tol_s:g} | "
                        f"{'yes' if same else 'no'} | {diff:.1e} | {t_o:.3f} | {t_s:.3f} | "
                        f"{t_o / t_s:.2f} |")
            print(rows[-1], flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
