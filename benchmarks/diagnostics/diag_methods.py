"""Dropout noise vs SGD noise along LeNet-300-100 / MNIST training, read from the runs' histories.

Each method is trained by ``dualdrop sparsify`` with the training-loop hook ``--diagnose-every``
(``dualdrop.train.diagnose_hook``): its paper defaults (Adam at the method's learning rate,
batch 128, linear decay to 0 over ``--epochs``), measured every ``--every`` epochs and at the end
on the same fixed validation subset of ``--samples`` points.  The runs go one after the other
(one torch thread) into ``--runs/<method>`` and are resumable: rerunning the command continues
an interrupted run (``--resume``) and skips finished ones.  ``--plot-only`` redraws the figure
from the histories, also of the controlled pair of ``benchmarks/diagnostics/diag_twin.py`` when its runs
are in ``--runs``.

    python3 benchmarks/diagnostics/diag_methods.py --data-dir data/mnist --epochs 4 --every 1 \\
        --samples 256 --runs results/diag_mnist      # ~1 h on a loaded 2-core machine
    python3 benchmarks/diagnostics/diag_methods.py --runs results/diag_mnist --plot-only

Writes ``benchmarks/diagnostics/figures/diag_methods.png`` ("methods along training") and
``benchmarks/diagnostics/figures/diag_methods.json`` (the diagnosed history rows of every run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

FIG = Path(__file__).resolve().parent / "figures"
METHODS = ["eta-trick", "vardrop", "vardrop-lr", "hardconcrete", "logsum", "none"]
#: run folders of benchmarks/diagnostics/diag_twin.py drawn with the methods when present
TWINS = ["twin-eta-trick", "twin-dropout"]


def train_all(a) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for method in a.methods:
        out = Path(a.runs) / method
        if (out / "final.json").is_file():
            print(f"{method}: finished, skipped", flush=True)
            continue
        cmd = [sys.executable, "-m", "dualdrop", "sparsify", "--method", method,
               "--epochs", str(a.epochs), "--diagnose-every", str(a.every),
               "--diagnose-samples", str(a.samples), "--threads", "1", "--no-progress",
               "--out", str(out), "--resume", "--seed", str(a.seed)]
        if a.data_dir:
            cmd += ["--data-dir", a.data_dir]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)


def diagnosed_rows(runs: Path, names: list[str]) -> dict:
    """``{name: [history rows with diag_* columns]}`` of the run folders that exist."""
    out = {}
    for name in names:
        path = runs / name / "history.json"
        if path.is_file():
            rows = [r for r in json.loads(path.read_text()) if "diag_lambda_1" in r]
            if rows:
                out[name] = rows
    return out


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for i, (name, rs) in enumerate(runs.items()):
        ep = [r["epoch"] for r in rs]
        col = f"C{i}"
        axes[0].plot(ep, [r["diag_sgd_ratio"] for r in rs], "o-", color=col, label=f"{name} SGD")
        axes[1].plot(ep, [r["diag_sgd_cosine"] for r in rs], "o-", color=col)
        if any(r["diag_dropout_noise"] for r in rs):
            axes[0].plot(ep, [r["diag_drop_ratio"] for r in rs], "s--", color=col,
                         label=f"{name} dropout")
            axes[1].plot(ep, [r["diag_drop_cosine"] for r in rs], "s--", color=col)
            axes[2].plot(ep, [r["diag_drop_trace"] / r["diag_sgd_trace"] for r in rs], "s--",
                         color=col, label=name)
        axes[3].plot(ep, [r["diag_lambda_1"] for r in rs], "o-", color=col, label=name)
    axes[0].set_title("Tr(HΣ)/Tr(HΣ_iso): SGD (solid), dropout noise (dashed)", fontsize=9)
    axes[1].set_title("cos(H, Σ) (null mean ~1e-5 for all)", fontsize=9)
    axes[2].set_title("Tr(HΣ_drop) / Tr(HΣ_SGD): dropout's escaping drive", fontsize=9)
    axes[3].set_title("sharpness λ₁ of the Hessian", fontsize=9)
    for ax in axes[:3]:
        ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("epoch")
    axes[0].legend(fontsize=6, ncol=2)
    axes[2].legend(fontsize=7)
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("wrote", path)


def table(runs: dict) -> str:
    """Markdown rows: one per run and diagnosed epoch."""
    head = ("| run | epoch | val. err | nonzero | λ₁ | SGD ratio | SGD cos | SGD top-5 overlap "
            "| dropout ratio | dropout cos | dropout top-5 overlap | Tr(HΣ_drop)/Tr(HΣ_SGD) | "
            "max p-value |")
    lines = [head, "|" + "---|" * 13]

    def f(v, fmt):
        return "–" if v != v else format(v, fmt)

    for name, rs in runs.items():
        for r in rs:
            rel = r["diag_drop_trace"] / r["diag_sgd_trace"]
            p = max(r["diag_sgd_p_value"], r["diag_drop_p_value"]
                    if r["diag_drop_p_value"] == r["diag_drop_p_value"] else 0.0)
            lines.append(
                f"| {name} | {r['epoch']} | {100 * r['val_error']:.2f}% | "
                f"{r['nonzero_total']:.3f} | {r['diag_lambda_1']:.1f} | "
                f"{r['diag_sgd_ratio']:.0f} | {r['diag_sgd_cosine']:.3f} | "
                f"{r['diag_sgd_overlap_topk']:.2f} | {f(r['diag_drop_ratio'], '.0f')} | "
                f"{f(r['diag_drop_cosine'], '.3f')} | {f(r['diag_drop_overlap_topk'], '.2f')} | "
                f"{f(rel, '.3f')} | {p:.1e} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None, help="MNIST folder (default: embedded digits)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--every", type=int, default=1, help="--diagnose-every of the runs")
    ap.add_argument("--samples", type=int, default=256, help="--diagnose-samples of the runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="results/diag_mnist", help="folder of the run folders")
    ap.add_argument("--plot-only", action="store_true")
    a = ap.parse_args()
    if not a.plot_only:
        train_all(a)
    runs = diagnosed_rows(Path(a.runs), a.methods + TWINS)
    if not runs:
        sys.exit(f"no diagnosed history in {a.runs}")
    FIG.mkdir(exist_ok=True)
    (FIG / "diag_methods.json").write_text(json.dumps(runs, indent=1) + "\n")
    plot(runs, FIG / "diag_methods.png")
    print(table(runs))


if __name__ == "__main__":
    main()
