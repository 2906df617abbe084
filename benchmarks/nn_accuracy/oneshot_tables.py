"""Markdown tables of ``oneshot_networks.py``'s cells (``OUT/cells.jsonl`` -> ``OUT/tables.md``),
and the reading of that file (imported by the scripts that write it: no import cycle).

    python3 benchmarks/nn_accuracy/oneshot_tables.py results/oneshot/lenet300
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGET_ORDER = ["0.5", "0.2", "0.1", "0.05", "0.02", "2:4", "4:8"]


def cell_key(method, target, allocation, refit):
    return f"{method}|{target}|{allocation}|{'refit' if refit else ''}"


def done_cells(path: Path) -> dict:
    """The cells of a ``cells.jsonl`` by :func:`cell_key` (a later line replaces an earlier)."""
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                c = json.loads(line)
                out[cell_key(c["method"], c["target"], c["allocation"], c["refit"])] = c
    return out


def _targets(cells):
    seen = {c["target"] for c in cells}
    return [t for t in TARGET_ORDER if t in seen] + sorted(seen - set(TARGET_ORDER))


def _label(t):
    return t if ":" in t else f"{100 * float(t):g}%"


def _fmt(v, ppl):
    if v is None:
        return "-"
    return f"{v:.3f}" if ppl else f"{100 * v:.2f}"


def error_table(cells, key, ppl, allocations=None) -> str:
    targets = _targets(cells)
    rows = {}
    for c in cells:
        if allocations and c["allocation"] not in allocations:
            continue
        name = c["method"] + (" + refit" if c["refit"] else "")
        rows.setdefault((name, c["allocation"]), {})[c["target"]] = c
    head = "| method | allocation | " + " | ".join(_label(t) for t in targets) + " |"
    lines = [head, "|" + " --- |" * (len(targets) + 2)]
    for (name, alloc), by_t in sorted(rows.items(), key=lambda kv: (kv[0][1] != "uniform",
                                                                      kv[0][1], kv[0][0])):
        vals = []
        for t in targets:
            c = by_t.get(t)
            vals.append(_fmt(c[key], ppl) if c else "")
        lines.append(f"| {name} | {alloc} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def objective_table(cells, target, allocation="uniform") -> str:
    sel = [c for c in cells if c["target"] == target and c["allocation"] == allocation]
    if not sel:
        return ""
    layers = [r["layer"] for r in sel[0]["layers"]]
    lines = ["| method | " + " | ".join(layers) + " |", "|" + " --- |" * (len(layers) + 1)]
    for c in sorted(sel, key=lambda c: (c["method"], c["refit"])):
        obj = {r["layer"]: r["objective"] for r in c["layers"]}
        name = c["method"] + (" + refit" if c["refit"] else "")
        lines.append(f"| {name} | " + " | ".join(f"{obj.get(l, float('nan')):.4f}"
                                                  for l in layers) + " |")
    return "\n".join(lines)


def cost_table(cells) -> str:
    targets = _targets(cells)
    rows = {}
    for c in cells:
        if c["allocation"] != "uniform":
            continue
        rows.setdefault(c["method"] + (" + refit" if c["refit"] else ""), {})[c["target"]] = c
    lines = ["| method | " + " | ".join(f"s at {_label(t)}" for t in targets)
             + " | peak MB (added) | fine-tuning s |",
             "|" + " --- |" * (len(targets) + 3)]
    for name, by_t in sorted(rows.items()):
        secs = [f"{by_t[t]['seconds']:.2f}" if t in by_t else "" for t in targets]
        peak = max(c["peak_mb"] for c in by_t.values())
        added = max(c["added_mb"] for c in by_t.values())
        ft = [c["finetune_seconds"] for c in by_t.values() if c.get("finetune_seconds")]
        lines.append(f"| {name} | " + " | ".join(secs) + f" | {peak:.0f} ({added:+.0f}) | "
                     + (f"{sum(ft) / len(ft):.1f}" if ft else "-") + " |")
    return "\n".join(lines)


def write_tables(out: Path, done: dict) -> str:
    cells = list(done.values())
    if not cells:
        raise SystemExit(f"no cells in {out}/cells.jsonl")
    ppl = cells[0]["test"] > 1.0 or "gpt2" in str(out)
    dense = json.loads((out / "dense.json").read_text()) if (out / "dense.json").is_file() \
        else None
    what = "test perplexity (per byte)" if ppl else "test error (%)"
    parts = [f"# One-shot pruning: {out.name}", ""]
    if dense:
        parts += [f"Dense network: {what} {_fmt(dense['test'], ppl)} (validation "
                  f"{_fmt(dense['val'], ppl)}).", ""]
    parts += [f"## {what}, one-shot, no fine-tuning", "", error_table(cells, "test", ppl), "",
              f"## {what} after fine-tuning with the masks held", "",
              error_table(cells, "test_ft", ppl), "",
              "## Seconds of the one-shot call and its peak memory (uniform allocation)", "",
              cost_table(cells), ""]
    for t in _targets(cells):
        tab = objective_table(cells, t)
        if tab:
            parts += [f"## Layer objective at {_label(t)} (uniform)", "", tab, ""]
    text = "\n".join(parts)
    (out / "tables.md").write_text(text)
    return text


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    print(write_tables(folder, done_cells(folder / "cells.jsonl")))
