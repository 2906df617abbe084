"""What the default tolerance buys: relative objective gap of ``dualdrop.linear`` fits at its
default ``tol`` on raw and standardized data, Lasso and l1 logistic, at alpha = alpha_max / 20,
/ 100, / 1000.

The reference optimum is the lowest objective of: ours at tol 1e-11, scikit-learn's ``Lasso`` at
tol 1e-12 (Lasso rows), skglm's ``SparseLogisticRegression`` at tol 1e-12 (logistic rows). The
stopping criterion is relative to the data's scale (``dualdrop.linear._problem``), so the gaps
do not depend on the units of y (the "y * 1e-3" row).

Run:  nice -n 10 python3 benchmarks/linear/bench_linear_tol.py
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression, alpha_max  # noqa: E402

RATIOS = (20, 100, 1000)


def cases():
    from sklearn.datasets import load_breast_cancer, load_diabetes
    from sklearn.preprocessing import PolynomialFeatures, StandardScaler

    std = lambda X: StandardScaler().fit_transform(X)  # noqa: E731
    poly = lambda X: PolynomialFeatures(2, include_bias=False).fit_transform(X)  # noqa: E731
    Xd, yd = load_diabetes(return_X_y=True, scaled=False)
    Xb, yb = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(0)
    Xs = rng.standard_normal((300, 1000))
    w = np.zeros(1000)
    w[:20] = rng.standard_normal(20)
    ys = Xs @ w + 0.5 * rng.standard_normal(300)
    Xsp = sp.random(2000, 10000, density=0.01, format="csc", random_state=0)
    w = np.zeros(10000)
    w[rng.choice(10000, 50, replace=False)] = rng.standard_normal(50)
    ysp = Xsp @ w + 0.1 * rng.standard_normal(2000)
    return [
        ("diabetes raw", "lasso", Xd, yd),
        ("diabetes poly2 raw", "lasso", poly(Xd), yd),
        ("diabetes poly2 std", "lasso", std(poly(Xd)), yd),
        ("diabetes poly2 std, y * 1e-3", "lasso", std(poly(Xd)), 1e-3 * yd),
        ("synthetic 300 x 1000", "lasso", Xs, ys),
        ("sparse 2000 x 10000 1%", "lasso", Xsp, ysp),
        ("breast_cancer raw", "logistic", Xb, yb),
        ("breast_cancer poly2 std", "logistic", std(poly(Xb)), yb),
        ("breast_cancer std", "logistic", std(Xb), yb),
    ]


def objective(kind, X, y, alpha, coef, b):
    z = np.asarray(X @ np.ravel(coef)).ravel() + float(np.ravel(b)[0])
    pen = alpha * float(np.abs(coef).sum())
    if kind == "lasso":
        return 0.5 * float(np.mean((y - z) ** 2)) + pen
    yy = np.where(y == y.max(), 1.0, -1.0)
    return float(np.mean(np.logaddexp(0.0, -yy * z))) + pen


def reference(kind, X, y, alpha):
    if kind == "lasso":
        from sklearn.linear_model import Lasso

        return Lasso(alpha=alpha, tol=1e-12, max_iter=1000000).fit(X, y)
    import skglm

    return skglm.SparseLogisticRegression(alpha=alpha, tol=1e-12, max_iter=1000).fit(X, y)


def main():
    warnings.simplefilter("ignore")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    lines = ["| data | " + " | ".join(f"alpha_max/{r}" for r in RATIOS) + " |",
             "|---|" + "---|" * len(RATIOS)]
    for name, kind, X, y in cases():
        est_cls = SparseLinearRegression if kind == "lasso" else SparseLogisticRegression
        amax = alpha_max(X, y, datafit="quadratic" if kind == "lasso" else "logistic",
                         scaling="none")
        row = []
        for r in RATIOS:
            a = amax / r
            fits = [reference(kind, X, y, a),
                    est_cls(alpha=a, scaling="none", tol=1e-11, max_iter=1000).fit(X, y)]
            best = min(objective(kind, X, y, a, f.coef_, f.intercept_) for f in fits)
            est = est_cls(alpha=a, scaling="none").fit(X, y)  # the default tol
            row.append((objective(kind, X, y, a, est.coef_, est.intercept_) - best) / abs(best))
        lines.append(f"| {name} ({kind}) | " + " | ".join(f"{g:.1e}" for g in row) + " |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
