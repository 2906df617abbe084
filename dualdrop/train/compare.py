"""Compare sparsification methods: train several, draw the paper's Figure 2, tabulate.

The paper (LeJeune, Javadi, Baraniuk, "The Flip Side of the Reweighted Coin: Duality of Adaptive
Dropout and Regularization", NeurIPS 2021) compares seven methods on LeNet-300-100 / MNIST: its
Figure 2 draws the fraction of nonzero weights and the validation error against the epoch, its
table the end-of-training test error and fraction of nonzero weights. :func:`run_comparison`
trains every method into ``out/runs/<method>/`` with :func:`~dualdrop.train.train` and
``resume=True``, so that an interrupted comparison continues where it stopped and finished runs
are skipped. :func:`plot_comparison` draws the figure (PNG and PDF), :func:`comparison_table`
writes the table as Markdown and CSV, beside the paper's numbers when, and only when, every run
is on all of MNIST (the paper's data).

Several seeds (``seeds=[0, 1, 2]``) put each method's runs in ``out/runs/<method>/seed<k>/``
(the seed drives the initialization, the train/validation split, the data order and the noise);
the table then reports the mean and the sample standard deviation over the finished seeds, and
the figure draws the mean curve with the band between the smallest and largest seed.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
from pathlib import Path

from dualdrop.data import is_full_mnist

from dualdrop.nn.registry import compare_defaults, method_class, paper_table
from dualdrop.train.checkpoint import RunLockedError
from dualdrop.train.config import DENSE, TrainConfig, check_method
from dualdrop.train.loop import train

# The paper's reported results after 200 epochs on MNIST, from each method's record in
# dualdrop.nn.registry: method -> (label, test error, fraction nonzero)
PAPER_TABLE: dict[str, tuple[str, float, float]] = paper_table()
# The comparison: the paper's seven methods plus hard-concrete and magnitude pruning.
# (each method's record: Method.compare_rank)
DEFAULT_METHODS = compare_defaults()


def run_dir(out: str | os.PathLike, method: str, seed: int | None = None) -> Path:
    """Folder of one method's run inside a comparison folder (``seed``: a multi-seed comparison's
    run of that seed)."""
    d = Path(out) / "runs" / method.replace(":", "_").replace("/", "_")
    return d if seed is None else d / f"seed{seed}"


def check_seeds(seeds) -> list[int] | None:
    """``seeds`` as a list of distinct non-negative ints (None: a single-seed comparison)."""
    if seeds is None:
        return None
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty; give at least one seed, e.g. seeds=[0, 1, 2]")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise TypeError(f"seeds={seeds!r}: every seed must be a non-negative int")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={seeds!r} lists a seed twice")
    return seeds


def run_comparison(
    methods=DEFAULT_METHODS,
    epochs: int | None = None,
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
    seeds=None,
) -> dict:
    """Train each method (resumable), then write the figure and the table.

    Returns ``{method: report}`` (the final report, a ``"stopped"`` record when ``stop_after`` <
    ``epochs``, or a ``"locked"`` record when another process is training that method into the
    same folder: several processes may thus share one comparison). Unknown methods are refused
    before any training starts. ``epochs`` None: the dataset's default (200 on MNIST).
    ``select_tol_margin``: see :class:`TrainConfig` (the table then also shows the
    validation-selected tolerance's test error and density); ``init_from``: every method
    warm-starts from that run's test-time network. ``seeds``: train every method once per seed
    (method by method, so that each method's error bars are complete before the next starts)
    into ``out/runs/<method>/seed<k>``; the result is then ``{method: {seed: report}}`` and
    ``seed`` is ignored.
    """
    seeds = check_seeds(seeds)
    methods = [check_method(m) for m in methods]
    if not methods:
        raise ValueError("methods is empty; name at least one method, e.g. vardrop-lr logsum")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods={methods!r} lists a method twice")
    out = Path(out)
    if seeds is not None and data is not None:
        raise ValueError("data= is one seed's split; with seeds= every seed loads its own split "
                         "from data_dir (drop data=)")
    base = TrainConfig(epochs=epochs, data_dir=data_dir, seed=seed, device=device,
                       threads=threads, progress=progress, stop_after=stop_after, resume=True,
                       flush_denormal=flush_denormal, select_tol_margin=select_tol_margin,
                       init_from=init_from)
    datasets = {}

    def dataset(s):
        if data is not None:
            return data
        if s not in datasets:
            from dualdrop.data import load_dataset

            datasets.clear()  # one split in memory at a time
            datasets[s] = load_dataset(data_dir, seed=s)
        return datasets[s]

    def one(m, s, folder):
        cfg = dataclasses.replace(base, method=m, seed=s, out=str(folder))
        try:
            return train(cfg, data=dataset(s))
        except RunLockedError as exc:  # another process trains it right now: go on with the rest
            print(f"skipping {folder}: {exc}", file=sys.stderr)
            return {"status": "locked", "method": m, "message": str(exc)}

    reports = {}
    for m in methods:
        if seeds is None:
            reports[m] = one(m, seed, run_dir(out, m))
        else:
            reports[m] = {s: one(m, s, run_dir(out, m, s)) for s in seeds}
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        runs = load_runs(out, methods)
        plot_comparison(runs, out)
        comparison_table(runs, out)
    return reports


def _load_run(d: Path) -> dict | None:
    hist = d / "history.json"
    if not hist.exists():
        return None
    final = json.loads((d / "final.json").read_text()) if (d / "final.json").exists() else None
    data = (final or {}).get("data")
    if data is None and (d / "config.json").exists():
        data = json.loads((d / "config.json").read_text()).get("data_summary")
    return {"history": json.loads(hist.read_text()), "final": final, "data": data}


def load_runs(out: str | os.PathLike, methods) -> dict:
    """``{method: {"history": [...], "final": {...} or None, "data": summary or None}}`` for the
    runs present in ``out``.

    A method whose folder holds ``seed<k>/`` runs (a multi-seed comparison) gets the same keys
    for its lowest seed plus ``"seeds": {k: run}`` with every seed's run.
    """
    runs = {}
    for m in methods:
        d = run_dir(out, m)
        run = _load_run(d)
        if run is None:
            per_seed = {}
            for sd in sorted(d.glob("seed*"), key=lambda p: p.name):
                if sd.name[4:].isdigit() and (r := _load_run(sd)) is not None:
                    per_seed[int(sd.name[4:])] = r
            if per_seed:
                run = dict(per_seed[min(per_seed)], seeds=dict(sorted(per_seed.items())))
        if run is not None:
            runs[m] = run
    return runs


def _mean_std(values) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None, None for no values; std None for one)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    if len(vals) < 2:
        return mean, None
    return mean, (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5


def method_label(m: str) -> str:
    """A method's display name (the paper's label where it has one)."""
    if m == DENSE:
        return "dense"
    try:
        return method_class(m).display_label()
    except (TypeError, ValueError):
        return m


def _data_title(runs: dict) -> str:
    names = sorted({(r.get("data") or "data unknown").split(",")[0] for r in runs.values()})
    return "; ".join(names)


def plot_comparison(runs: dict, out: str | os.PathLike) -> list[Path]:
    """The paper's Figure 2 from the runs' histories: ``figure2.png`` and ``figure2.pdf``.

    Left: fraction of nonzero weights (log scale); right: validation error; both against the
    epoch (integer ticks). Every curve has its own line style and markers when there are few
    epochs (a run of one epoch is a point); the legend sits below the panels, never on data.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.6))
    styles = ("-", "--", "-.", ":")
    markers = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")
    n_max = max((len(r["history"]) for run in runs.values()
                 for r in run.get("seeds", {0: run}).values()), default=0)
    for i, (m, run) in enumerate(runs.items()):
        hists = [r["history"] for r in run.get("seeds", {0: run}).values()]
        n = min(len(h) for h in hists)  # the epochs every seed has reached
        ep = [r["epoch"] for r in hists[0][:n]]
        nz = [[max(h[j]["nonzero_total"], 1e-6) for h in hists] for j in range(n)]
        ve = [[100 * h[j]["val_error"] for h in hists] for j in range(n)]
        label = method_label(m) + (f" (mean of {len(hists)} seeds)" if len(hists) > 1 else "")
        kw = dict(label=label, linestyle=styles[i % len(styles)],  # coinciding curves
                  marker=markers[i % len(markers)], markevery=max(1, n // 12),  # stay
                  markersize=5 if n_max <= 30 else 4, zorder=3 + 0.01 * i)  # visible
        for ax, vals in ((ax0, nz), (ax1, ve)):
            line, = ax.plot(ep, [sum(v) / len(v) for v in vals], **kw)
            if len(hists) > 1:  # the band between the smallest and the largest seed
                ax.fill_between(ep, [min(v) for v in vals], [max(v) for v in vals],
                                color=line.get_color(), alpha=0.15, linewidth=0)
    ax0.set_yscale("log")
    ax0.set_ylabel("fraction of nonzero weights")
    ax0.set_title("sparsity (weights of all layers, no biases)")
    ax1.set_ylabel("validation error (%)")
    ax1.set_title("validation error")
    hists = [r["history"] for run in runs.values() for r in run.get("seeds", {0: run}).values()]
    errs = [100 * r["val_error"] for h in hists for r in h]
    if errs:  # zoom on the end of training: every run's last value in view
        lo = min(errs)
        last = max(100 * h[-1]["val_error"] for h in hists)
        ax1.set_ylim(max(0.0, lo - 0.5), min(100.0, max(1.5 * last, lo + 3)))
    for ax in (ax0, ax1):
        ax.set_xlabel("epoch")
        if n_max <= 10:  # few epochs: one tick each, room around the points
            ax.set_xticks(range(1, max(n_max, 1) + 1))
            ax.set_xlim(0.5, max(n_max, 1) + 0.5)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, which="both", alpha=0.3)
    if runs:
        fig.suptitle(f"LeNet-300-100 on {_data_title(runs)}", fontsize=10)
        handles, labels = ax0.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8,
                   frameon=False)
        fig.tight_layout(rect=(0, 0.06 + 0.045 * ((len(labels) - 1) // 5), 1, 1))
    else:  # nothing trained yet: say so on the figure instead of an empty legend
        ax1.text(0.5, 0.5, "no runs yet", transform=ax1.transAxes, ha="center")
        fig.tight_layout()
    out = Path(out)
    paths = [out / "figure2.png", out / "figure2.pdf"]
    for p in paths:
        fig.savefig(p, dpi=130)
    plt.close(fig)
    return paths


def _md(text) -> str:
    """A Markdown table cell: ``|`` escaped, no line breaks."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def comparison_table(runs: dict, out: str | os.PathLike) -> str:
    """Markdown (``table.md``) and CSV (``table.csv``) of the runs; returns the Markdown.

    Ours: end-of-training test error of the pruned test-time network (the headline) and its
    fraction of nonzero weights (biases excluded); beside them the test error of the same
    network without its test-time pruning step ("unpruned"; the paper's released code reports
    this one for LogSum, AdaTikhonov, AdaProx and eta-Trick, see
    :func:`~dualdrop.train.evaluate.unpruned_error`). An unfinished run shows its last epoch and
    validation error, and no test error. The paper's numbers (:data:`PAPER_TABLE`, all of MNIST)
    are added only when every run is on all of MNIST; otherwise a note says why they are not.
    """
    paper = bool(runs) and all(is_full_mnist(run.get("data")) for run in runs.values())
    rows = []
    for m, run in runs.items():
        reps = list(run.get("seeds", {0: run}).values())
        finals = [r["final"] for r in reps if r["final"]]
        h, f = run["history"], run["final"]
        ref = PAPER_TABLE.get(m) if paper else None
        row = {"method": m, "label": method_label(m), "data": run.get("data"),
               "seeds": ",".join(map(str, run["seeds"])) if "seeds" in run else "",
               "n_finished": len(finals),
               "epochs": f["epochs"] if f else h[-1]["epoch"], "finished": bool(f)}
        for key, get in (
            ("test_error", lambda g: g["test_error"]),
            ("nonzero", lambda g: g["nonzero_total"]),
            ("test_error_unpruned", lambda g: g.get("test_error_unpruned")),
            ("selected_test_error", lambda g: _sel(g, "test_error")),
            ("selected_nonzero", lambda g: _sel(g, "nonzero_total")),
        ):
            row[key], row[key + "_std"] = _mean_std(get(g) for g in finals)
        if not finals:  # unfinished: the last epoch's density
            row["nonzero"] = h[-1]["nonzero_total"]
        row.update({
            "val_error": h[-1]["val_error"],
            "s_per_epoch": sum(r["seconds"] for r in h) / len(h),
            "selected_tol": _sel(f, "tol"),
            "paper_test_error": ref[1] if ref else None,
            "paper_nonzero": ref[2] if ref else None,
        })
        rows.append(row)
    out = Path(out)
    with open(out / "table.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["method"])
        w.writeheader()
        w.writerows(rows)

    def pct(v, sd=None):
        if v is None:
            return "—"
        return f"{100 * v:.2f}%" + ("" if sd is None else f" ± {100 * sd:.2f}")

    def frac(v, sd=None):
        return "—" if v is None else f"{v:.4f}" + ("" if sd is None else f" ± {sd:.4f}")

    selected = any(r["selected_test_error"] is not None for r in rows)
    multi = any(r["seeds"] for r in rows)
    head = ["method"] + (["seeds finished"] if multi else []) + [
        "epochs", "test error", "fraction nonzero", "unpruned: test error", "val. error",
        "s/epoch"]
    if selected:
        head += ["tol chosen on val.", "its test error", "its fraction nonzero"]
    if paper:
        head += ["paper: test error (200 ep.)", "paper: fraction nonzero"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for r in rows:
        ep = str(r["epochs"]) if r["finished"] else f"{r['epochs']} (unfinished)"
        cells = [_md(r["label"])]
        if multi:
            cells.append(f"{r['n_finished']} of {len(r['seeds'].split(','))}" if r["seeds"]
                         else "1")
        cells += [ep, pct(r["test_error"], r["test_error_std"]),
                  frac(r["nonzero"], r["nonzero_std"]),
                  pct(r["test_error_unpruned"], r["test_error_unpruned_std"]),
                  pct(r["val_error"]), f"{r['s_per_epoch']:.1f}"]
        if selected:
            tol = "—" if r["selected_tol"] is None else f"{r['selected_tol']:g}"
            cells += [tol, pct(r["selected_test_error"], r["selected_test_error_std"]),
                      frac(r["selected_nonzero"], r["selected_nonzero_std"])]
        if paper:
            cells += [pct(r["paper_test_error"]), frac(r["paper_nonzero"])]
        lines.append("| " + " | ".join(cells) + " |")
    if multi:
        lines += ["", "Test errors and fractions nonzero: mean ± sample standard deviation over "
                  "the finished seeds; epochs, validation error and s/epoch: the lowest seed's "
                  "run."]
    if runs and not paper:
        lines += ["", f"Data: {_md(_data_title(runs))}. The paper's numbers (LeNet-300-100 on "
                  "all of MNIST) are not shown beside runs on other data."]
    md = "\n".join(lines) + "\n"
    (out / "table.md").write_text(md)
    return md


def _sel(final, key):
    """A field of ``final["selected_tol"]`` (None when absent)."""
    sel = (final or {}).get("selected_tol") or {}
    return sel.get(key) if "test_error" in sel else None


__all__ = ["DEFAULT_METHODS", "DENSE", "PAPER_TABLE", "check_seeds", "comparison_table",
           "load_runs", "plot_comparison", "run_comparison", "run_dir"]
