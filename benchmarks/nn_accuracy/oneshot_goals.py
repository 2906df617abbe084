"""The one-shot goals, checked on the cells of ``oneshot_networks.py`` (every network's
``cells.jsonl``): prints a Markdown report.

    python3 benchmarks/nn_accuracy/oneshot_goals.py results/oneshot

1. The best duality penalty's layer objective <= ADMM's on every layer, and its test error <=
   ADMM's, at 20/10/5% and 2:4 on every network (uniform allocation; "best": the penalty method
   of lowest test error in the cell; ADMM: the better of its registered variants).
2. The whole one-shot no slower than ADMM in the same run (LeNet-300-100 under 5 s).
3. ``allocation="penalty"`` better than uniform at 10% and 5% (the same method).
4. One-shot plus one epoch of fine-tuning within 0.2 points of the 10-epoch training-based table
   (RESULTS, "Target density on MNIST", from the same dense LeNet-300-100: magnitude 1.69% at 5%,
   2.57% at 2%) at 5% and 2%.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_tables import done_cells  # noqa: E402

NETS = ["lenet300", "lenet5", "transformer", "gpt2"]
PENALTY_NAMES = {"logsum", "mcp", "vardrop", "hardconcrete"}
#: best of the training-based table at matched density (10 epochs from the same dense network)
TRAINED = {"0.05": 0.0169, "0.02": 0.0257}


def is_penalty(m: str) -> bool:
    return m.startswith("penalty") or m in PENALTY_NAMES


def is_admm(m: str) -> bool:
    return m.startswith("admm") and not m.endswith("+polish")  # ADMM as published


def best(cells, pred):
    sel = [c for c in cells if pred(c["method"])]
    return min(sel, key=lambda c: c["test"]) if sel else None


def main(root: Path):
    out = ["# One-shot goals", ""]
    for net in NETS:
        cells = list(done_cells(root / net / "cells.jsonl").values())
        if not cells:
            continue
        out += [f"## {net}", "", "| target | penalty (best) | ADMM (best) | max layer ratio | "
                "test | ADMM test | objective goal | test goal | s penalty / s ADMM |",
                "|" + " --- |" * 9]
        for t in ["0.2", "0.1", "0.05", "2:4"]:
            cell = [c for c in cells if c["target"] == t and c["allocation"] == "uniform"
                    and not c["refit"]]
            p, a = best(cell, is_penalty), best(cell, is_admm)
            if p is None or a is None:
                continue
            pobj = {r["layer"]: r["objective"] for r in p["layers"]}
            aobj = {r["layer"]: r["objective"] for r in a["layers"]}
            ratio = max(pobj[k] / aobj[k] if aobj[k] > 0 else (1.0 if pobj[k] == 0 else
                                                                float("inf")) for k in pobj)
            out.append(f"| {t} | {p['method']} | {a['method']} | {ratio:.3f} | "
                       f"{p['test']:.4g} | {a['test']:.4g} | {'met' if ratio <= 1 else 'not'} | "
                       f"{'met' if p['test'] <= a['test'] else 'not'} | "
                       f"{p['seconds']:.1f} / {a['seconds']:.1f} |")
        out += ["", "| target | method | uniform | penalty allocation | goal |",
                "|" + " --- |" * 5]
        for t in ["0.1", "0.05"]:
            for m in sorted({c["method"] for c in cells}):
                u = [c for c in cells if c["target"] == t and c["method"] == m
                     and c["allocation"] == "uniform" and not c["refit"]]
                q = [c for c in cells if c["target"] == t and c["method"] == m
                     and c["allocation"] == "penalty" and not c["refit"]]
                if u and q:
                    out.append(f"| {t} | {m} | {u[0]['test']:.4g} | {q[0]['test']:.4g} | "
                               f"{'met' if q[0]['test'] < u[0]['test'] else 'not'} |")
        out.append("")
        if net == "lenet300":
            out += ["| target | best after fine-tuning | test | trained 10 epochs | goal "
                    "(within 0.2 points) |", "|" + " --- |" * 5]
            for t, ref in TRAINED.items():
                ft = [c for c in cells if c["target"] == t and c.get("test_ft") is not None]
                if ft:
                    b = min(ft, key=lambda c: c["test_ft"])
                    name = f"{b['method']} ({b['allocation']})"
                    out.append(f"| {t} | {name} | {100 * b['test_ft']:.2f}% | {100 * ref:.2f}% | "
                               f"{'met' if b['test_ft'] <= ref + 0.002 else 'not'} |")
            out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/oneshot"))
