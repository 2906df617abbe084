"""Every method at matched density: fine-tuning one dense-pretrained network to a target density.

For each density ``D`` in ``--densities``, ``dualdrop compare --target-density D --init-from
DENSE`` trains every method (``--methods``, default all registered methods and penalty:mcp)
for ``--epochs`` epochs from the same dense network (its test-time weights), each with its own
defaults for the data, into ``OUT/d<D>/runs/<method>[/seed<k>]``. Everything is resumable: the
same command continues unfinished runs and skips finished ones. Then writes ``OUT/table.md`` /
``.csv`` (pruned test error, mean +- std over the finished seeds, per method and density;
magnitude pruning is the baseline) and ``OUT/matched_density.png`` (test error vs density, one
line per method, log density axis).

    python3 benchmarks/nn_accuracy/matched_density.py --dense runs/dense20 \
        --data-dir ../shared/mnist --densities 0.05 0.02 0.01 0.005 --epochs 10 \
        --seeds 0 --out runs/matched
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from dualdrop.nn.registry import METHODS
from dualdrop.train.experiments.compare import load_runs, method_label, run_comparison


def _cell(runs: dict, key: str = "test_error") -> tuple[float, float, int] | None:
    seeds = runs.get("seeds") or {0: runs}
    vals = [r["final"][key] for r in seeds.values() if r.get("final")]
    if not vals:
        return None
    return statistics.mean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0), len(vals)


def report(out: Path, methods: list[str], densities: list[float]) -> str:
    table = {}
    for D in densities:
        runs = load_runs(out / f"d{D:g}", methods)
        for m in methods:
            if m in runs:
                table[(m, D)] = (_cell(runs[m]), _cell(runs[m], "nonzero_total"))
    head = "| method | " + " | ".join(f"{100 * D:g}% nonzero" for D in densities) + " |"
    lines = [head, "| --- |" + " --- |" * len(densities)]
    rows = []
    for m in methods:
        cells = []
        for D in densities:
            err, dens = table.get((m, D), (None, None))
            if err is None:
                cells.append("—")
                continue
            mean, sd, n = err
            cells.append(f"{100 * mean:.2f}%" + (f" ± {100 * sd:.2f}" if n > 1 else "")
                         + (f" (at {dens[0]:.4f})" if abs(dens[0] / D - 1) > 0.1 else ""))
            rows.append({"method": m, "density": D, "test_error_mean": mean, "test_error_std": sd,
                         "seeds": n, "nonzero_total": dens[0]})
        lines.append(f"| {method_label(m)} | " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    (out / "table.md").write_text(md)
    with open(out / "table.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["method", "density", "test_error_mean",
                                           "test_error_std", "seeds", "nonzero_total"])
        w.writeheader()
        w.writerows(rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return md
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in methods:
        pts = [(r["density"], r["test_error_mean"], r["test_error_std"]) for r in rows
               if r["method"] == m]
        if pts:
            xs, ys, es = zip(*sorted(pts))
            ax.errorbar(xs, [100 * y for y in ys], yerr=[100 * e for e in es], marker="o",
                        capsize=2, label=method_label(m),
                        lw=2.5 if m == "magnitude" else 1.2, color="k" if m == "magnitude" else None)
    ax.set_xscale("log")
    ax.set_xlabel("fraction of nonzero weights (target)")
    ax.set_ylabel("test error (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "matched_density.png", dpi=150)
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense", required=True, help="finished dense run (dualdrop sparsify "
                    "--method none) every method starts from")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--densities", nargs="+", type=float, default=[0.05, 0.02, 0.01, 0.005])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS) + ["penalty:mcp"])
    ap.add_argument("--out", default="runs/matched")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    if not a.report_only:
        for D in a.densities:
            run_comparison(methods=a.methods, epochs=a.epochs, out=out / f"d{D:g}",
                           data_dir=a.data_dir, threads=a.threads, progress=False,
                           init_from=a.dense, seeds=a.seeds, target_density=D)
    out.mkdir(parents=True, exist_ok=True)
    print(report(out, a.methods, a.densities))


if __name__ == "__main__":
    main()
