"""LeNet-5-Caffe on MNIST: table and figure of the runs of ``run_lenet5_mnist.sh``.

Prints a Markdown table (end-of-training test error of the pruned network, fraction of nonzero
weights in total and per layer, the validation-chosen tolerance where the run chose one, seconds
per epoch) and draws test error against the fraction of nonzero weights (log scale) beside the
published LeNet-5 points. Weight fractions of the L0 points are *our* count of the weights
implied by the architectures Louizos et al. (2018) report (they count neurons), out of
LeNet-5-Caffe's 430,500 weights.

Usage (from the repository root)::

    python3 benchmarks/nn_accuracy/plot_lenet5.py results/lenet5_mnist --out benchmarks/nn_accuracy/figures/lenet5_mnist.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

N_WEIGHTS = 20 * 25 + 50 * 20 * 25 + 800 * 500 + 500 * 10  # 430,500


def _l0_weights(c1, c2, f1, f2):
    """Weights of LeNet-5-Caffe with c1, c2 conv channels, f1 fc1 inputs, f2 fc2 inputs."""
    return c1 * 25 + c2 * c1 * 25 + f1 * f2 + f2 * 10


# label -> (test error, fraction nonzero)
PUBLISHED = {
    "sparse VD (Molchanov et al. 2017)": (0.0075, 1 / 280),
    "L0, lam=0.1/N (Louizos et al. 2018; 20-25-45-462)": (0.009,
                                                          _l0_weights(20, 25, 45, 462) / N_WEIGHTS),
    "L0-sep (Louizos et al. 2018; 9-18-65-25)": (0.010, _l0_weights(9, 18, 65, 25) / N_WEIGHTS),
    "pruning (Han et al. 2015)": (0.0077, 0.08),
}


def load(root: Path) -> dict:
    runs = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        hist = d / "history.json"
        if not hist.exists():
            continue
        final = d / "final.json"
        runs[d.name] = {"history": json.loads(hist.read_text()),
                        "final": json.loads(final.read_text()) if final.exists() else None}
    return runs


def table(runs: dict) -> str:
    lines = ["| run | epochs | test error | nonzero | conv1 | conv2 | fc1 | fc2 | "
             "val-chosen tol: test error at nonzero | s/epoch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        f, h = r["final"], r["history"]
        if f is None:
            last = h[-1]
            lines.append(f"| {name} (running) | {last['epoch']} | "
                         f"(val {100 * last['val_error']:.2f}%) | {last['nonzero_total']:.4f} "
                         f"| | | | | | {last['seconds']:.0f} |")
            continue
        nz = f.get("nonzero", {})
        sel = f.get("selected_tol") or {}
        chosen = (f"tol {sel['tol']:g}: {100 * sel['test_error']:.2f}% at "
                  f"{sel['nonzero_total']:.4f}" if "test_error" in sel else "")
        lines.append(
            f"| {name} | {f['epochs']} | {100 * f['test_error']:.2f}% | {f['nonzero_total']:.4f} | "
            + " | ".join(f"{nz.get(k, float('nan')):.3f}" for k in ("conv1", "conv2", "fc1", "fc2"))
            + f" | {chosen} | {f['seconds_per_epoch']:.0f} |")
    return "\n".join(lines)


def plot(runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = 5.0  # errors above it are drawn at the top edge with their value
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, r) in enumerate(runs.items()):
        f = r["final"]
        if f is None:
            continue
        x = max(f["nonzero_total"], 1e-4)
        err = 100 * f["test_error"]
        label = name if err <= top else f"{name} ({err:.1f}%)"
        y = min(err, top * 0.98)
        ax.scatter(x, y, s=36, marker="o" if err <= top else "^", label=label,
                   color=plt.cm.tab20(i % 20))
        sel = f.get("selected_tol") or {}
        if "test_error" in sel and sel["nonzero_total"] != f["nonzero_total"]:
            ax.scatter(sel["nonzero_total"], 100 * sel["test_error"], s=36, facecolors="none",
                       edgecolors="k")
            ax.plot([x, sel["nonzero_total"]], [100 * f["test_error"], 100 * sel["test_error"]],
                    "k:", lw=0.8)
    for (label, (err, frac)), marker in zip(PUBLISHED.items(), "*PXD"):
        ax.scatter(frac, 100 * err, marker=marker, s=90, color="k", label=label)
    ax.add_patch(plt.Rectangle((1e-4, 0), 0.005 - 1e-4, 0.75, alpha=0.12, color="g",
                               label="goal: <= 0.75% at <= 0.5%"))
    ax.set_ylim(0, top)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xscale("log")
    ax.set_xlabel("fraction of nonzero weights (biases excluded)")
    ax.set_ylabel("test error (%) of the pruned network")
    ax.set_title("LeNet-5-Caffe, MNIST (black: published; open: val.-chosen tol)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="folder of run folders (results/lenet5_mnist)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/nn_accuracy/figures/lenet5_mnist.png"))
    args = p.parse_args(argv)
    runs = load(args.root)
    print(table(runs))
    plot(runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
