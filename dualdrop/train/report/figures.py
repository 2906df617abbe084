"""Figures of the training experiments, drawn with matplotlib's Agg backend (files only).

:func:`plot_comparison` (the paper's Figure 2: fraction nonzero and validation error against
the epoch), :func:`plot_frontier` (test error against fraction nonzero, log x, one line per
method through its validation-selected points) and :func:`plot_diagnostics` (the noise
diagnostics of ``dualdrop diagnose``). Each writes its files and closes its figure.
"""

from __future__ import annotations

import os
from pathlib import Path

from dualdrop.train.report.references import GOALS, PAPER_TABLE, PUBLISHED_POINTS, method_label
from dualdrop.train.report.tables import data_title, entry_label, schedule_text


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
        fig.suptitle(f"LeNet-300-100 on {data_title(runs)}", fontsize=10)
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


def plot_frontier(result: dict, out: str | os.PathLike, mnist: bool = False,
                  seeds: bool = False) -> list[Path]:
    """``frontier.png`` and ``frontier.pdf``: test error (%) vs fraction nonzero (log x).

    Lines join each method's validation-selected points in order of density; with ``seeds``
    (points that are means over seeds, :mod:`dualdrop.train.experiments.frontier.runs`) each point carries
    its seeds' standard deviation as error bars in both directions. With ``mnist``
    the paper's table (hollow stars in the method's colour), the published points (black) and
    the goal boxes are drawn on the same axes; never for other data. The legend sits outside the
    axes so that it covers no data.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(10.5, 5.2))
    cmap = plt.get_cmap("tab10")
    table = dict(PAPER_TABLE) if mnist else {}
    methods = list(result["methods"])
    colors = {m: cmap(i % 10) for i, m in enumerate(methods + [m for m in table
                                                                if m not in methods])}
    for m in table:  # a paper star takes the colour of its method's first entry
        first = next((n for n, r in result["methods"].items() if r.get("method") == m), None)
        if first is not None:
            colors[m] = colors[first]
    xs, ys, n_ref = [], [], 0
    markers = "osD^v<>ph"
    for i, (m, r) in enumerate(result["methods"].items()):
        rows = sorted(r["frontier"], key=lambda p: p["test_nonzero_total"])
        if not rows:
            continue
        x = [max(p["test_nonzero_total"], 1e-6) for p in rows]
        y = [100 * p["test_error"] for p in rows]
        xs += x
        ys += y
        ns = sorted({p.get("n_seeds", r.get("n_seeds")) for p in rows}) if seeds else []
        what = (f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}") + " seeds, " if ns else ""
        ax.plot(x, y, marker=markers[i % len(markers)], color=colors[m], linewidth=1.3,
                markersize=5, label=f"{entry_label(m, r)} ({what}{len(rows)} pts)")
        if seeds and any(p.get("test_error_std") is not None for p in rows):
            ax.errorbar(x, y, yerr=[100 * (p["test_error_std"] or 0.0) for p in rows],
                        xerr=[p["nonzero_std"] or 0.0 for p in rows], fmt="none",
                        ecolor=colors[m], elinewidth=0.9, capsize=2, alpha=0.8)
    if mnist:
        for m, (label, err, dens) in table.items():
            ax.plot([dens], [100 * err], linestyle="none", marker="*", markersize=12,
                    markerfacecolor="none", markeredgecolor=colors[m], markeredgewidth=1.4,
                    label=f"paper: {label}")
            xs.append(dens)
            ys.append(100 * err)
            n_ref += 1
        for (label, (err, dens)), mk in zip(PUBLISHED_POINTS.items(), "XPd"):
            ax.plot([dens], [100 * err], linestyle="none", marker=mk, color="black",
                    markersize=8, label=f"published: {label}")
            xs.append(dens)
            ys.append(100 * err)
            n_ref += 1
    lo_x = min(xs) / 1.5 if xs else 1e-3
    if mnist:
        for (err, dens), hatch, c in zip(GOALS, ("////", "\\\\\\\\"), ("tab:green", "tab:olive")):
            ax.add_patch(Rectangle((lo_x, 0), dens - lo_x, 100 * err, facecolor=c, alpha=0.12,
                                   edgecolor=c, hatch=hatch, linewidth=1.0,
                                   label=f"goal: <= {100 * err:.1f}% at <= {100 * dens:g}% "
                                         "nonzero"))
    ax.set_xscale("log")
    ax.set_xlim(lo_x, min(1.4, max(xs + [0.01]) * 1.5))  # dense points clear of the frame
    ax.set_xlabel("fraction of nonzero weights (log scale; biases not counted)")
    ax.set_ylabel("test error (%)")
    name = result.get("dataset", "")
    if seeds:
        ax.set_title(f"accuracy–sparsity frontier on {name} over the test-time tolerance: chosen "
                     "on validation, test error read once per seed (mean ± std)"
                     f"{schedule_text(result, mnist, 'runs per method', 'run')}", fontsize=10)
    else:
        ax.set_title(f"accuracy–sparsity frontier on {name}: points chosen on validation, "
                     f"test error read once each{schedule_text(result, mnist)}", fontsize=10)
    if ys:
        # zoom: every method's best point and every reference point in view (and the goals on
        # MNIST); the high-error tails of very sparse frontiers may leave the axes, counted below
        best = [min(100 * p["test_error"] for p in r["frontier"])
                for r in result["methods"].values() if r["frontier"]]
        top = min(max(ys), max([1.35 * v for v in best + ys[len(ys) - n_ref:]]
                               + ([4.0] if mnist else [])))
        ax.set_ylim(0, top * 1.08)
        hidden = sum(v > top * 1.08 for v in ys)
        if hidden:
            ax.text(0.99, 0.98, f"{hidden} point(s) above {top * 1.08:.1f}% not shown "
                    "(see frontier.md)", transform=ax.transAxes, ha="right", va="top",
                    fontsize=8)
    else:
        ax.text(0.5, 0.5, "no finished trials yet", transform=ax.transAxes, ha="center")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    out = Path(out)
    paths = [out / "frontier.png", out / "frontier.pdf"]
    for p in paths:
        fig.savefig(p, dpi=130, bbox_inches="tight")  # the legend outside the axes included
    plt.close(fig)
    return paths


def diagnostics_figure(records: list[dict]):
    """The figure of :func:`plot_diagnostics` (returned open, for inspection).

    One group per run on the x axis (the runs are unrelated: nothing joins them). Left: the
    escaping indicator ``Tr(H Sigma)`` relative to isotropic noise of the same variance, for SGD
    and dropout noise; middle: the cosine of each noise covariance with the Hessian, its
    random-direction null mean as a black tick; right: the top Hessian eigenvalues. Bars start at
    0 on linear axes (a ratio spread over more than two decades switches the left panel to a log
    axis with markers instead of bars, which a log axis cannot show honestly). A value that was
    not measured (NaN: a dense run has no dropout noise) is marked "n/a" where its bar would be.
    The legend sits below the panels.
    """
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    labels = [f"{r['method']}\n(epoch {r['epoch']})" for r in records]
    x = np.arange(len(records))
    width = 0.38
    noises = (("sgd", "C0", "SGD (minibatch) noise"), ("drop", "C1", "dropout noise"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4))

    def finite(v):
        return v is not None and isinstance(v, (int, float)) and math.isfinite(v)

    def na(ax, xs, y):
        ax.text(xs, y, "n/a", ha="center", va="bottom", fontsize=8, color="0.35")

    ratios = [r.get(f"{n}_ratio") for r in records for n, _, _ in noises]
    pos = [v for v in ratios if finite(v) and v > 0]
    log_ratio = bool(pos) and max(pos) / min(pos) > 100
    for ax, key, title, ylabel in (
            (axes[0], "ratio", "escaping: Tr(H Σ) against isotropic noise",
             "Tr(H Σ) / Tr(H Σ_iso)  (1 = isotropic)"),
            (axes[1], "cosine", "alignment of the noise with H", "cos(H, Σ)")):
        vals_all = [r.get(f"{n}_{key}") for r in records for n, _, _ in noises]
        top = max([v for v in vals_all if finite(v)] or [1.0])
        for j, (noise, col, _) in enumerate(noises):
            xs = x + (j - 0.5) * width
            vals = [r.get(f"{noise}_{key}") for r in records]
            for xi, v in zip(xs, vals):
                if not finite(v):
                    na(ax, xi, (1.0 if key == "ratio" and log_ratio else 0.0))
                elif key == "ratio" and log_ratio:
                    ax.plot([xi], [v], "o", color=col, markersize=7)
                else:
                    ax.bar([xi], [v], width, color=col)
                    ax.text(xi, v, f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}", ha="center",
                            va="bottom", fontsize=7)
            if key == "cosine":
                nulls = [r.get(f"{noise}_null_cosine") for r in records]
                for xi, v in zip(xs, nulls):
                    if finite(v):
                        ax.plot([xi - width / 2, xi + width / 2], [v, v], "k-", lw=2)
        if key == "cosine":
            nulls = [r.get(f"{n}_null_cosine") for r in records for n, _, _ in noises]
            nulls = [v for v in nulls if finite(v)]
            if nulls and max(nulls) < 0.02 * top:  # too close to 0 to see: say it
                ax.text(0.98, 0.97, f"null: {min(nulls):.1g} to {max(nulls):.1g}", ha="right",
                        va="top", transform=ax.transAxes, fontsize=8)
        if key == "ratio" and log_ratio:
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1.15 * top if top > 0 else 1.0)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_xlim(-0.6, len(records) - 0.4)
        ax.grid(True, axis="y", alpha=0.3)
    ks = sorted(int(k.split("_")[1]) for k in records[0] if k.startswith("lambda_"))
    shift = np.linspace(-0.25, 0.25, len(ks)) if len(ks) > 1 else np.zeros(1)
    for dx, i in zip(shift, ks):
        vals = [r.get(f"lambda_{i}") for r in records]
        axes[2].plot(x + dx, [v if finite(v) else np.nan for v in vals], "o",
                     color=plt.cm.viridis(0.85 * (i - 1) / max(1, len(ks) - 1)), linestyle="none")
    axes[2].set_title("top Hessian eigenvalues", fontsize=10)
    axes[2].set_ylabel("eigenvalue of H", fontsize=9)
    if all(finite(r.get(f"lambda_{i}")) and r[f"lambda_{i}"] >= 0 for r in records for i in ks):
        axes[2].set_ylim(bottom=0)
    axes[2].set_xticks(x, labels, fontsize=7)
    axes[2].set_xlim(-0.6, len(records) - 0.4)
    axes[2].grid(True, axis="y", alpha=0.3)
    handles = [Patch(color=c, label=lab) for _, c, lab in noises]
    handles.append(Line2D([], [], color="k", lw=2, label="cosine of a random direction (null)"))
    handles += [Line2D([], [], marker="o", linestyle="none",
                       color=plt.cm.viridis(0.85 * (i - 1) / max(1, len(ks) - 1)),
                       label=f"λ{i}") for i in ks]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_diagnostics(records: list[dict], path: Path) -> None:
    """Write :func:`diagnostics_figure` of the runs' records to ``path``."""
    import matplotlib.pyplot as plt

    fig = diagnostics_figure(records)
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["diagnostics_figure", "plot_comparison", "plot_diagnostics", "plot_frontier"]
