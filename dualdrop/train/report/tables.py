"""Tables of the training experiments: Markdown (to read) and CSV (to load), one writer each.

:func:`comparison_table` (``table.md/.csv`` of ``dualdrop compare``), :func:`frontier_table`
(``frontier.md/.csv`` of the Optuna frontier) and :func:`runs_table` (of the frontier of
finished runs over seeds). Spreads over seeds are the sample standard deviation
``s = sqrt(sum (x_i - mean)^2 / (n - 1))`` (:func:`mean_std`, none for a single value).
"""

from __future__ import annotations

import csv
import os
import statistics
from pathlib import Path

from dualdrop.data import is_full_mnist
from dualdrop.train.report.references import PAPER_TABLE, method_label, reference_rows


def mean_std(values) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the values that are not None (None, None for no
    values; std None for one)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def schedule_text(result: dict, mnist: bool, unit: str = "finished trials per method",
                   per: str = "trial") -> str:
    """A second title line, "<E> epochs per trial, <n> finished trials per method"; on MNIST a
    schedule shorter than the paper's 200 epochs is labelled a *reduced* budget (its points are
    not comparable with the paper's table at face value)."""
    plans = list(result["methods"].values())
    epochs = sorted({int(r["plan"]["epochs"]) for r in plans if r["plan"].get("epochs")})
    if not epochs:
        return ""
    trials = sorted({int(r["n_complete"]) for r in plans})
    e_txt = "/".join(str(e) for e in epochs)
    t_txt = f"{trials[0]}" if len(trials) == 1 else f"{trials[0]}-{trials[-1]}"
    reduced = ("REDUCED budget (the paper's table: 200 epochs): "
               if mnist and max(epochs) < 200 else "")
    return f"\n{reduced}{e_txt} epochs per {per}, {t_txt} {unit}"


def data_title(runs: dict) -> str:
    """The data sets of ``runs`` by name, for a title."""
    names = sorted({(r.get("data") or "data unknown").split(",")[0] for r in runs.values()})
    return "; ".join(names)


def md_cell(text) -> str:
    """A Markdown table cell: ``|`` escaped, no line breaks."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def selected_field(final, key):
    """A field of ``final["selected_tol"]`` (None when absent)."""
    sel = (final or {}).get("selected_tol") or {}
    return sel.get(key) if "test_error" in sel else None


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
            ("selected_test_error", lambda g: selected_field(g, "test_error")),
            ("selected_nonzero", lambda g: selected_field(g, "nonzero_total")),
        ):
            row[key], row[key + "_std"] = mean_std(get(g) for g in finals)
        if not finals:  # unfinished: the last epoch's density
            row["nonzero"] = h[-1]["nonzero_total"]
        row.update({
            "val_error": h[-1]["val_error"],
            "s_per_epoch": sum(r["seconds"] for r in h) / len(h),
            "selected_tol": selected_field(f, "tol"),
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
        cells = [md_cell(r["label"])]
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
        lines += ["", f"Data: {md_cell(data_title(runs))}. The paper's numbers (LeNet-300-100 on "
                  "all of MNIST) are not shown beside runs on other data."]
    md = "\n".join(lines) + "\n"
    (out / "table.md").write_text(md)
    return md


def knob_text(row: dict, plan: dict) -> str:
    """``name=value`` of the plan\'s knob in a frontier row (empty when the row lacks it)."""
    name = (plan.get("knob") or {}).get("name")
    return f"{name}={row['hparams'][name]:g}" if name in row["hparams"] else ""


def entry_label(name: str, r: dict) -> str:
    """Display name of a frontier entry: the method's label plus what distinguishes the entry
    (``eta-trick [dual=released]`` -> ``eta-Trick [dual=released]``)."""
    m = r.get("method", name)
    return method_label(m) + name[len(m):] if name.startswith(m) else name


def frontier_table(result: dict, out: str | os.PathLike, mnist: bool = False) -> str:
    """``frontier.md`` and ``frontier.csv``: every selected point with its knob, start,
    tolerance, validation error, fraction nonzero and test error; on MNIST also the paper's
    row and the published points. Returns the Markdown."""
    out = Path(out)
    rows = []
    for m, r in result["methods"].items():
        for p in sorted(r["frontier"], key=lambda p: p["nonzero_total"]):
            rows.append({"method": m, "label": method_label(m), "knob": knob_text(p, r["plan"]),
                         "warm_start": p["warm"], "tol": p["tol"], "val_error": p["val_error"],
                         "nonzero_total": p["test_nonzero_total"], "test_error": p["test_error"],
                         "trial": p["trial"], "run_dir": p["run_dir"]})
    fields = ["method", "label", "knob", "warm_start", "tol", "val_error", "nonzero_total",
              "test_error", "trial", "run_dir"]
    with open(out / "frontier.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    warm_col = any(r["plan"].get("init_from") for r in result["methods"].values())
    lines = [f"Frontier on {result.get('dataset', '')}: each method's Pareto set on "
             "(validation error, fraction nonzero); the test error is read once per point.",
             ""]
    schedule = schedule_text(result, mnist).strip()
    if schedule:
        lines += [schedule + ".", ""]
    for m, r in result["methods"].items():
        plan = r["plan"]
        knob = plan.get("knob") or {}
        cand = (f" ({r['n_candidates']} candidates with the tolerance sweep)"
                if r["n_candidates"] > r["n_complete"] else "")
        notes = "".join(f"; {f['run_dir']}: "
                        + ("interrupted, re-queued" if f["requeued"] else "failed")
                        + f" ({f['error'][:100]})" for f in r["failed"])
        if r["n_running"] or r["n_waiting"]:
            notes += f"; {r['n_running']} running, {r['n_waiting']} queued"
        lines.append(f"- {method_label(m)}: {r['n_complete']} finished trials{cand}, "
                     f"{plan.get('epochs')} epochs, {knob.get('name')} in "
                     f"[{knob.get('low'):g}, {knob.get('high'):g}]{notes}")
    lines += ["", "| method | knob |" + (" start |" if warm_col else "") +
              " tol | val. error | fraction nonzero | test error |",
              "| --- | --- |" + (" --- |" if warm_col else "") + " --- | --- | --- | --- |"]
    for r in rows:
        tol = tol_cell(r["tol"])
        start = (" warm |" if r["warm_start"] else " random |") if warm_col else ""
        lines.append(f"| {r['label']} | {r['knob']} |{start} {tol} | "
                     f"{100 * r['val_error']:.2f}% | {r['nonzero_total']:.4f} | "
                     f"{100 * r['test_error']:.2f}% |")
    return _write_frontier_md(out, lines, mnist)


def tol_cell(tol: float | None) -> str:
    """A tolerance as a table shows it (a dash for a method without one)."""
    return "—" if tol is None else f"{tol:g}"


def _write_frontier_md(out: Path, lines: list[str], mnist: bool) -> str:
    """``frontier.md`` from ``lines``, with the reference rows on MNIST; returns the Markdown."""
    if mnist:
        lines = lines + reference_rows()
    md = "\n".join(lines) + "\n"
    (out / "frontier.md").write_text(md)
    return md


def pm(mean: float, sd: float | None, scale: float, fmt: str) -> str:
    """``mean ± sd`` scaled by ``scale`` in format ``fmt`` (the mean alone when ``sd`` is None)."""
    return f"{mean * scale:{fmt}}" + ("" if sd is None else f" ± {sd * scale:{fmt}}")


def runs_table(result: dict, out: str | os.PathLike, mnist: bool, tols) -> str:
    """``frontier.md`` / ``frontier.csv`` of
    :func:`~dualdrop.train.experiments.frontier.runs.frontier_of_runs`; returns the Markdown."""
    out = Path(out)
    fields = ["line", "config", "method", "n_seeds", "tol", "val_error", "test_error",
              "test_error_std", "nonzero_total", "nonzero_std"]
    with open(out / "frontier.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for name, r in result["methods"].items():
            for p in r["frontier"]:
                w.writerow({"line": name, "config": p["config"], "method": r["method"],
                            "n_seeds": p["n_seeds"], "tol": p["tol"],
                            "val_error": p["val_error"], "test_error": p["test_error"],
                            "test_error_std": p["test_error_std"],
                            "nonzero_total": p["test_nonzero_total"],
                            "nonzero_std": p["nonzero_std"]})
    pooled = (" Configurations of one method are pooled into one Pareto set."
              if result.get("by") == "method" else "")
    lines = [f"Frontier of finished runs on {result.get('dataset')}: the test-time tolerance "
             "swept on validation (" + ", ".join(f"{t:g}" for t in tols) + "), the Pareto set "
             "of the seed-mean (validation error, fraction nonzero) kept, the test error read "
             "once per seed at each kept tolerance; mean ± sample std over the seeds." + pooled,
             "", "| method | seeds | epochs | tol | val. error | test error | fraction nonzero |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["methods"].values():
        m = r["method"]
        for p in sorted(r["frontier"], key=lambda p: -p["test_nonzero_total"]):
            label = method_label(m) + p["config"][len(m):]
            tol = tol_cell(p["tol"])
            lines.append(f"| {label} | {p['n_seeds']} | {r['plan']['epochs']} | {tol} | "
                         f"{100 * p['val_error']:.2f}% | "
                         f"{pm(p['test_error'], p['test_error_std'], 100, '.2f')}% | "
                         f"{pm(p['test_nonzero_total'], p['nonzero_std'], 1, '.4f')} |")
    return _write_frontier_md(out, lines, mnist)


__all__ = ["comparison_table", "data_title", "entry_label", "frontier_table", "mean_std",
           "runs_table", "schedule_text"]
