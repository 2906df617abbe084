"""Sparse linear regression with three penalties on raw data: regularization paths and a
cross-validated fit.

On scikit-learn's diabetes data (10 raw, unstandardized features), the coefficient paths of the
Lasso (l1), MCP and LogSum (the penalty of adaptive dropout), warm-started from alpha_max down;
then alpha chosen by 5-fold cross-validation for each penalty.

    python examples/sparse_linear_fit.py --out results/examples
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_diabetes  # noqa: E402

from dualdrop.linear import SparseLinearRegressionCV, regularization_path  # noqa: E402

PENALTIES = {"l1": {}, "mcp": {"a": 3.0}, "logsum": {"eps": 1.0}}


def main(out: Path) -> Path:
    data = load_diabetes(scaled=False)
    X, y, names = data.data, data.target, data.feature_names
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, (pen, params) in zip(axes, PENALTIES.items()):
        path = regularization_path(X, y, pen, params, n_alphas=40)
        cv = SparseLinearRegressionCV(penalty=pen, penalty_params=params, alphas=40, cv=5)
        cv.fit(X, y)
        # coefficients scaled by each column's standard deviation: comparable across features
        coefs = path["coefs"] * X.std(axis=0)
        for j in range(X.shape[1]):
            ax.plot(path["alphas"], coefs[:, j], label=names[j])
        ax.axvline(cv.alpha_, color="k", ls="--", lw=1)
        ax.set(xscale="log", xlabel="alpha", title=f"{pen}: {np.count_nonzero(cv.coef_)} "
               f"features at the CV alpha (dashed)")
        ax.grid(alpha=0.3)
        print(f"{pen:7s} CV alpha {cv.alpha_:.3g}: {np.count_nonzero(cv.coef_)} of "
              f"{X.shape[1]} features, R^2 {cv.score(X, y):.3f}")
    axes[0].set_ylabel("coefficient x std of its column")
    axes[2].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig_path = out / "linear_paths.png"
    fig.savefig(fig_path, dpi=110)
    plt.close(fig)
    print(f"wrote {fig_path}")
    return fig_path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/examples"))
    main(ap.parse_args().out)
