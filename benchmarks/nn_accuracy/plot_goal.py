"""Figure of the accuracy-sparsity goal attempts: where each finished run lands.

Left: end-of-training *test* error against the fraction of nonzero weights (log scale) of every
run folder given, at the trained tolerance (filled) and, where the run chose one on validation
(``--select-tol-margin``), at the chosen tolerance (open, joined to its run); beside them the
paper's reported table, the published sparse-VD point and the two goal boxes. Right: the
*validation* sweep over the test-time tolerance (``final.json["val_tol_sweep"]``; recomputed from
the checkpoint for runs written before the sweep existed, which needs ``--data-dir``).

Usage (from the repository root)::

    python3 benchmarks/nn_accuracy/plot_goal.py results/goal_mnist/* --data-dir data/mnist \
        --out benchmarks/nn_accuracy/figures/issue3_goal.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dualdrop.train.experiments.compare import PAPER_TABLE  # noqa: E402

PUBLISHED = {"sparse VD (Molchanov et al. 2017)": (0.0192, 0.0147)}
GOALS = ((0.016, 0.015), (0.014, 0.05))  # (test error, fraction nonzero) upper bounds


def recompute_sweep(run: Path, final: dict, data_dir: str) -> list[dict]:
    import torch

    from dualdrop.data import load_dataset
    from dualdrop.nn import sparsify
    from dualdrop.train import lenet_300_100
    from dualdrop.train.checkpoint import read_checkpoint
    from dualdrop.train.evaluate import SWEEP_TOLS, tol_sweep

    ck = read_checkpoint(run / "checkpoint.pt", fix="rerun that method")
    data = load_dataset(data_dir, seed=final["seed"])
    model = lenet_300_100(data.n_features, data.n_classes)
    sp = sparsify(model, final["method"], **ck["config"]["hparams"])
    model.load_state_dict(ck["model"])
    model.eval()
    return tol_sweep(sp, model, torch.from_numpy(data.X_val), torch.from_numpy(data.y_val),
                     SWEEP_TOLS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (with final.json)")
    ap.add_argument("--data-dir", default=None, help="MNIST folder, to recompute missing sweeps")
    ap.add_argument("--out", default="benchmarks/nn_accuracy/figures/issue3_goal.png")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.8))
    for lo, (err, dens) in zip(("goal 1", "goal 2"), GOALS):
        ax0.add_patch(plt.Rectangle((1e-3, 0), dens - 1e-3, 100 * err, alpha=0.12,
                                    color="green", label=f"{lo}: <= {100 * err:.1f}% at <= {dens:g}"))
    for m, (label, err, dens) in PAPER_TABLE.items():
        ax0.scatter(dens, 100 * err, marker="x", color="gray")
        ax0.annotate(f"seed {label}", (dens, 100 * err), fontsize=7, color="gray")
    for label, (err, dens) in PUBLISHED.items():
        ax0.scatter(dens, 100 * err, marker="*", s=90, color="black")
        ax0.annotate(label, (dens, 100 * err), fontsize=7)
    for i, run in enumerate(sorted(Path(r) for r in args.runs)):
        fpath = run / "final.json"
        if not fpath.exists():
            print(f"skipping {run}: no final.json", file=sys.stderr)
            continue
        final = json.loads(fpath.read_text())
        color = f"C{i % 10}"
        name = run.name
        dens = max(final["nonzero_total"], 1e-3)
        ax0.scatter(dens, 100 * final["test_error"], color=color, label=name)
        sel = final.get("selected_tol") or {}
        if "test_error" in sel and sel["nonzero_total"] != final["nonzero_total"]:
            ax0.scatter(sel["nonzero_total"], 100 * sel["test_error"], facecolors="none",
                        edgecolors=color)
            ax0.plot([dens, sel["nonzero_total"]], [100 * final["test_error"],
                                                     100 * sel["test_error"]], color=color, lw=0.8)
        sweep = final.get("val_tol_sweep")
        if sweep is None and final["method"] != "none" and args.data_dir:
            sweep = recompute_sweep(run, final, args.data_dir)
        if sweep:
            ax1.plot([r["nonzero_total"] for r in sweep], [100 * r["error"] for r in sweep],
                     "o-", ms=3, color=color, label=name)
            ax1.scatter(final["nonzero_total"], 100 * final["val_error"], color=color, s=40)
    for ax in (ax0, ax1):
        ax.set_xscale("log")
        ax.set_xlabel("fraction of nonzero weights (biases excluded)")
        ax.grid(True, which="both", alpha=0.3)
    ax0.set_xlim(3e-3, 1.5)
    ax0.set_ylim(1.0, 4.0)
    ax0.set_ylabel("test error (%), end of training")
    ax0.set_title("LeNet-300-100 / MNIST, 200 epochs, seed 0")
    ax0.legend(fontsize=6, loc="upper right")
    ax1.set_ylim(1.5, 5.0)
    ax1.set_ylabel("validation error (%)")
    ax1.set_title("test-time tolerance sweep (validation; big dot: trained tol)")
    ax1.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
