"""Compare sparsification methods: train several, draw the seed's Figure 2, tabulate.

:func:`run_comparison` trains every method into ``out/runs/<method>/`` with :func:`train` and
``resume=True``, so that an interrupted comparison continues where it stopped and finished runs
are skipped. :func:`plot_comparison` draws the seed's Figure 2 (fraction of nonzero weights vs
epoch on a log scale; validation error vs epoch) as PNG and PDF, and :func:`comparison_table`
writes the end-of-training test error and fraction of nonzero weights beside the seed's reported
table (DUALITY.md section 5) as Markdown and CSV.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path

import sys

from dualdrop.train.checkpoint import RunLockedError
from dualdrop.train.config import DENSE, TrainConfig, check_method
from dualdrop.train.loop import train

# Seed's reported results after 200 epochs on MNIST: method -> (label, test error, fraction nonzero)
SEED_TABLE: dict[str, tuple[str, float, float]] = {
    "vardrop-lr-ar": ("VarDrop+LR+AR", 0.0321, 0.0238),
    "vardrop-lr": ("VarDrop+LR", 0.0141, 0.0885),
    "vardrop": ("VarDrop", 0.0154, 0.595),
    "eta-trick": ("eta-Trick", 0.0216, 0.0513),
    "adaprox": ("AdaProx", 0.0294, 0.0276),
    "adatikhonov": ("AdaTikhonov", 0.0288, 0.0183),
    "logsum": ("LogSum", 0.0293, 0.0190),
}
# The comparison: the seed's seven methods plus hard-concrete and magnitude pruning.
DEFAULT_METHODS = ("vardrop-lr-ar", "vardrop-lr", "vardrop", "eta-trick", "adaprox",
                   "adatikhonov", "logsum", "hardconcrete", "magnitude")


def run_dir(out: str | os.PathLike, method: str) -> Path:
    """Folder of one method's run inside a comparison folder."""
    return Path(out) / "runs" / method.replace(":", "_").replace("/", "_")


def run_comparison(
    methods=DEFAULT_METHODS,
    epochs: int = 200,
    out: str | os.PathLike = "runs/compare",
    data_dir: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    data=None,
    flush_denormal: bool = True,
    select_tol_margin: float | None = None,
    init_from: str | None = None,
) -> dict:
    """Train each method (resumable), then write the figure and the table.

    Returns ``{method: report}`` (the final report, a ``"stopped"`` record when ``stop_after`` <
    ``epochs``, or a ``"locked"`` record when another process is training that method into the
    same folder: several processes may thus share one comparison). Unknown methods are refused
    before any training starts. ``select_tol_margin``: see :class:`TrainConfig` (the table then
    also shows the validation-selected tolerance's test error and density); ``init_from``: every
    method warm-starts from that run's test-time network.
    """
    methods = [check_method(m) for m in methods]
    if not methods:
        raise ValueError("methods is empty; name at least one method, e.g. vardrop-lr logsum")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods={methods!r} lists a method twice")
    out = Path(out)
    if data is None:
        from dualdrop.data import load_dataset

        data = load_dataset(data_dir, seed=seed)
    base = TrainConfig(epochs=epochs, data_dir=data_dir, seed=seed, device=device,
                       threads=threads, progress=progress, stop_after=stop_after, resume=True,
                       flush_denormal=flush_denormal, select_tol_margin=select_tol_margin,
                       init_from=init_from)
    reports = {}
    for m in methods:
        cfg = dataclasses.replace(base, method=m, out=str(run_dir(out, m)))
        try:
            reports[m] = train(cfg, data=data)
        except RunLockedError as exc:  # another process trains it right now: go on with the rest
            print(f"skipping {m}: {exc}", file=sys.stderr)
            reports[m] = {"status": "locked", "method": m, "message": str(exc)}
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        runs = load_runs(out, methods)
        plot_comparison(runs, out)
        comparison_table(runs, out)
    return reports


def load_runs(out: str | os.PathLike, methods) -> dict:
    """``{method: {"history": [...], "final": {...} or None}}`` for the runs present in ``out``."""
    runs = {}
    for m in methods:
        d = run_dir(out, m)
        hist = d / "history.json"
        if not hist.exists():
            continue
        final = d / "final.json"
        runs[m] = {
            "history": json.loads(hist.read_text()),
            "final": json.loads(final.read_text()) if final.exists() else None,
        }
    return runs


def _label(m: str) -> str:
    if m in SEED_TABLE:
        return SEED_TABLE[m][0]
    return {"none": "dense", "hardconcrete": "HardConcrete", "magnitude": "Magnitude (GMP)",
            "hardconcrete-neuron": "HardConcrete (neuron)"}.get(m, m)


def plot_comparison(runs: dict, out: str | os.PathLike) -> list[Path]:
    """The seed's Figure 2 from the runs' histories: ``figure2.png`` and ``figure2.pdf``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = ("-", "--", "-.", ":")
    for i, (m, run) in enumerate(runs.items()):
        h = run["history"]
        ep = [r["epoch"] for r in h]
        kw = dict(label=_label(m), linestyle=styles[i % len(styles)])  # coinciding curves stay visible
        ax0.plot(ep, [max(r["nonzero_total"], 1e-6) for r in h], **kw)
        ax1.plot(ep, [100 * r["val_error"] for r in h], **kw)
    ax0.set_yscale("log")
    ax0.set_xlabel("epoch")
    ax0.set_ylabel("fraction of nonzero weights")
    ax0.set_title("sparsity (weights of all layers, no biases)")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("validation error (%)")
    ax1.set_title("validation error")
    errs = [100 * r["val_error"] for run in runs.values() for r in run["history"]]
    if errs:  # zoom on the end of training: every run's last value in view
        lo = min(errs)
        last = max(100 * run["history"][-1]["val_error"] for run in runs.values())
        ax1.set_ylim(max(0.0, lo - 0.5), min(100.0, max(1.5 * last, lo + 3)))
    for ax in (ax0, ax1):
        ax.grid(True, which="both", alpha=0.3)
    if runs:
        ax1.legend(fontsize=8, loc="upper right")
    else:  # nothing trained yet: say so on the figure instead of an empty legend
        ax1.text(0.5, 0.5, "no runs yet", transform=ax1.transAxes, ha="center")
    fig.tight_layout()
    out = Path(out)
    paths = [out / "figure2.png", out / "figure2.pdf"]
    for p in paths:
        fig.savefig(p, dpi=130)
    plt.close(fig)
    return paths


def comparison_table(runs: dict, out: str | os.PathLike) -> str:
    """Markdown (``table.md``) and CSV (``table.csv``) of ours beside the seed's; returns the Markdown.

    Ours: end-of-training test error and fraction of nonzero weights (biases excluded). An
    unfinished run shows its last epoch and validation error, and no test error.
    """
    rows = []
    for m, run in runs.items():
        h, f = run["history"], run["final"]
        seed = SEED_TABLE.get(m)
        rows.append({
            "method": m,
            "label": _label(m),
            "epochs": f["epochs"] if f else h[-1]["epoch"],
            "finished": bool(f),
            "test_error": f["test_error"] if f else None,
            "nonzero": f["nonzero_total"] if f else h[-1]["nonzero_total"],
            "val_error": h[-1]["val_error"],
            "s_per_epoch": sum(r["seconds"] for r in h) / len(h),
            "selected_tol": _sel(f, "tol"),
            "selected_test_error": _sel(f, "test_error"),
            "selected_nonzero": _sel(f, "nonzero_total"),
            "seed_test_error": seed[1] if seed else None,
            "seed_nonzero": seed[2] if seed else None,
        })
    out = Path(out)
    with open(out / "table.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["method"])
        w.writeheader()
        w.writerows(rows)

    def pct(v):
        return "—" if v is None else f"{100 * v:.2f}%"

    def frac(v):
        return "—" if v is None else f"{v:.4f}"

    selected = any(r["selected_test_error"] is not None for r in rows)
    extra_h = " | tol chosen on val. | its test error | its fraction nonzero" if selected else ""
    lines = [
        "| method | epochs | test error | fraction nonzero | val. error | s/epoch" + extra_h +
        " | seed: test error (200 ep.) | seed: fraction nonzero |",
        "| --- | --- | --- | --- | --- | ---" + " | ---" * (3 if selected else 0) +
        " | --- | --- |",
    ]
    for r in rows:
        ep = str(r["epochs"]) if r["finished"] else f"{r['epochs']} (unfinished)"
        extra = ""
        if selected:
            tol = "—" if r["selected_tol"] is None else f"{r['selected_tol']:g}"
            extra = (f" | {tol} | {pct(r['selected_test_error'])} | "
                     f"{frac(r['selected_nonzero'])}")
        lines.append(
            f"| {r['label']} | {ep} | {pct(r['test_error'])} | {frac(r['nonzero'])} | "
            f"{pct(r['val_error'])} | {r['s_per_epoch']:.1f}{extra} | "
            f"{pct(r['seed_test_error'])} | {frac(r['seed_nonzero'])} |"
        )
    md = "\n".join(lines) + "\n"
    (out / "table.md").write_text(md)
    return md


def _sel(final, key):
    """A field of ``final["selected_tol"]`` (None when absent)."""
    sel = (final or {}).get("selected_tol") or {}
    return sel.get(key) if "test_error" in sel else None


__all__ = ["DEFAULT_METHODS", "DENSE", "SEED_TABLE", "comparison_table", "load_runs",
           "plot_comparison", "run_comparison", "run_dir"]
