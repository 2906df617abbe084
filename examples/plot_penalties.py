"""The effective penalty of adaptive dropout methods, beside classical penalties and a penalty
built from its dual.

Every adaptive dropout method whose keep ratio grows with |w| minimizes a penalty
Omega(w) = 1/2 min_eta [w^2/eta + f(eta)]. This script evaluates Omega, the rule eta_hat(w) and
the dropout keep ratio eta/(eta + lambda) of five penalties, one of them built from nothing but
its dual f, and draws them side by side.

    python examples/plot_penalties.py --out results/examples
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import penalties  # noqa: E402


def main(out: Path) -> Path:
    w = np.linspace(0.0, 4.0, 400)
    curves = {
        "L1 (Lasso)": penalties.get("l1"),
        "LogSum(eps=1)": penalties.get("logsum", eps=1.0),
        "MCP(a=3)": penalties.get("mcp", a=3.0, lam=1.0),
        "VarDrop (exact KL)": penalties.VarDropExact(),
        # a penalty from its dual alone: f(eta) = 2 sqrt(eta) gives Omega(w) = 1.5 |w|^(2/3)
        "from_dual(f = 2 sqrt(eta))": penalties.from_dual(lambda eta: 2.0 * np.sqrt(eta)),
    }
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for label, P in curves.items():
        axes[0].plot(w, P.omega(w), label=label)
        axes[1].plot(w[1:], P.eta_hat(w[1:]), label=label)
        axes[2].plot(w[1:], P.keep_ratio(w[1:], lam=0.5), label=label)
    axes[0].set(title="penalty Ω(w)", xlabel="|w|", ylabel="Ω(w)", ylim=(0, 4))
    axes[1].set(title="rule η̂(w) (the minimizing η)", xlabel="|w|", ylabel="η̂(w)",
                yscale="log")
    axes[2].set(title="dropout keep ratio η̂/(η̂ + λ), λ = 0.5", xlabel="|w|",
                ylabel="keep ratio", ylim=(0, 1.02))
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "penalties.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/examples"))
    main(ap.parse_args().out)
