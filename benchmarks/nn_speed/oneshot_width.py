"""One-shot weight methods at width: layer objective and process CPU seconds per layer problem
(benchmarks/RESULTS.md, "One-shot pruning", "One-shot at width").

Layer problems ``(W0, G)``, the per-layer contract ``get_method(name).prune(W0, G, budget)``:

- ``minilm:B:query`` (384 x 384), ``minilm:B:intermediate`` (1,536 x 384) and
  ``minilm:B:output`` (384 x 1,536), also ``key``, ``value``, ``attn_out`` (384 x 384): the
  layers of block ``B`` of all-MiniLM-L6-v2 (``benchmarks/nn_accuracy/structured_minilm_data.py``),
  each Gram ``X^T X / n`` over the real tokens of ``--calib`` calibration sentences (128) that the
  dense model feeds the layer;
- ``gpt2:qkv`` (2,304 x 768), ``gpt2:768`` (768 x 768), ``gpt2:fc`` (3,072 x 768) and
  ``gpt2:3072`` (768 x 3,072): the four layers of a GPT-2-small-sized block, random.
  The Gram is that of ``--tokens`` (8,192) synthetic activations ``X = Z A`` with ``Z`` Gaussian
  and ``A`` of singular values decaying as ``1 / (1 + i)^0.7`` in random directions, a few inputs
  (1%) scaled up 20x (the outlier features of trained transformers); ``W0`` Gaussian with
  per-row scales drawn log-uniformly over a decade (``seed`` fixed).

Budgets: ``50%`` (half the layer's weights, one count for the whole layer) and ``2:4``. Every
cell runs in this process with one torch / BLAS thread; the time is process CPU seconds
(``time.process_time``) of one ``prune`` call. The layer problems are cached in ``--cache``
(``.pt``, loaded with ``weights_only=True``); the cells go to ``OUT/cells.jsonl`` as they finish
(resumable: a finished cell is skipped; ``--max-seconds`` skips a method on a layer once one of
its cells took longer) and the table to ``OUT/table.md``.

    OMP_NUM_THREADS=1 python benchmarks/nn_speed/oneshot_width.py --out results/oneshot_width \\
        --layers minilm:0:query minilm:0:intermediate minilm:0:output gpt2:768 gpt2:3072 \\
        --methods sparsegpt admm logsum mcp
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "nn_accuracy"))

MINILM_LAYERS = {  # name -> module path inside a BertLayer
    "query": "attention.self.query", "key": "attention.self.key",
    "value": "attention.self.value", "attn_out": "attention.output.dense",
    "intermediate": "intermediate.dense", "output": "output.dense"}
BUDGETS = ("50%", "2:4")


def _minilm_problems(block: int, n_calib: int) -> dict:
    from structured_minilm_data import batches, load_minilm, split

    model, tok = load_minilm()
    calib, _ = split(n_calib=max(n_calib, 1), n_eval=1)
    data = batches(tok, calib[:n_calib])
    layer = model.encoder.layer[block]
    grams, counts, hooks = {}, {}, []
    mask_holder = {}
    for short, path in MINILM_LAYERS.items():
        mod = layer.get_submodule(path)

        def hook(_m, inp, _o, short=short):
            x = inp[0].detach().to(torch.float64)
            keep = mask_holder["m"].reshape(-1).bool()
            x = x.reshape(-1, x.shape[-1])[keep]
            grams[short] = grams.get(short, 0) + x.T @ x
            counts[short] = counts.get(short, 0) + x.shape[0]
        hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        for b in data:
            mask_holder["m"] = b["attention_mask"]
            model(**b)
    for h in hooks:
        h.remove()
    out = {}
    for short, path in MINILM_LAYERS.items():
        W = layer.get_submodule(path).weight.detach().to(torch.float64).clone()
        G = grams[short] / counts[short]
        out[f"minilm:{block}:{short}"] = (W, 0.5 * (G + G.T), counts[short])
    return out


GPT2_LAYERS = {  # name -> (outputs, inputs) of one GPT-2-small block (width 768, FFN 3,072)
    "qkv": (2304, 768), "768": (768, 768), "fc": (3072, 768), "3072": (768, 3072)}


def _gpt2_problem(p: int, tokens: int, seed: int = 0, rows: int = 768):
    g = torch.Generator().manual_seed(seed + p)
    sv = 1.0 / (1.0 + torch.arange(p, dtype=torch.float64)) ** 0.7
    Q1, _ = torch.linalg.qr(torch.randn(p, p, generator=g, dtype=torch.float64))
    A = (sv[:, None] * Q1)
    out_scale = torch.ones(p, dtype=torch.float64)
    out_scale[torch.randperm(p, generator=g)[: max(1, p // 100)]] = 20.0
    A = A * out_scale
    Z = torch.randn(tokens, p, generator=g, dtype=torch.float64)
    X = Z @ A
    G = X.T @ X / tokens
    scales = 10 ** (torch.rand(rows, 1, generator=g, dtype=torch.float64))
    W = torch.randn(rows, p, generator=g, dtype=torch.float64) * scales / p ** 0.5
    return W, 0.5 * (G + G.T), tokens


def load_problem(name: str, cache: Path, n_calib: int, tokens: int):
    """``(W0, G)`` of the layer problem ``name`` (module docstring), cached in ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    f = cache / (name.replace(":", "_") + f"_{n_calib if name.startswith('minilm') else tokens}.pt")
    if f.exists():
        d = torch.load(f, weights_only=True)
        return d["W0"], d["G"]
    if name.startswith("minilm:"):
        _, block, _short = name.split(":")
        probs = _minilm_problems(int(block), n_calib)
        for k, (W, G, n) in probs.items():
            torch.save({"W0": W, "G": G, "n": n},
                       cache / (k.replace(":", "_") + f"_{n_calib}.pt"))
        W, G, _ = probs[name]
    elif name.startswith("gpt2:") and name.split(":")[1] in GPT2_LAYERS:
        rows, p = GPT2_LAYERS[name.split(":")[1]]
        W, G, n = _gpt2_problem(p, tokens, rows=rows)
        torch.save({"W0": W, "G": G, "n": n}, f)
    else:
        raise ValueError(f"unknown layer {name!r}: minilm:B:{{{','.join(MINILM_LAYERS)}}} "
                         f"or gpt2:{{{','.join(GPT2_LAYERS)}}}")
    return W, G


def budget_of(target: str, shape):
    from dualdrop.nn.oneshot.methods.base import Budget, parse_pattern

    if ":" in target:
        return Budget(pattern=parse_pattern(target))
    return Budget(n_keep=round(float(target.rstrip("%")) / 100 * shape[0] * shape[1]))


def parse_method(spec: str):
    """``name`` or ``name,key=value,...`` (values parsed as JSON where they parse)."""
    name, *kv = spec.split(",")
    opts = {}
    for item in kv:
        k, v = item.split("=", 1)
        try:
            opts[k] = json.loads(v)
        except json.JSONDecodeError:
            opts[k] = v
    return name, opts


def run_cell(spec, W0, G, budget):
    from dualdrop.nn.oneshot import get_method
    from dualdrop.nn.oneshot.methods.admm import WIDE
    from dualdrop.nn.oneshot.methods.base import layer_objective

    name, opts = parse_method(spec)
    m = get_method(name, **opts)
    # compile the numba kernels outside the timed call: a tiny problem of the same kind, and
    # one at the width where the penalty methods switch solvers (an identity Gram: fast)
    kind = "50%" if budget.n_keep is not None else "2:4"
    m.prune(W0[:4, :8].clone(), G[:8, :8].clone() + torch.eye(8, dtype=torch.float64),
            budget_of(kind, (4, 8)))
    w = WIDE
    m.prune(torch.randn(w, w, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
            torch.eye(w, dtype=torch.float64), budget_of(kind, (w, w)))
    t0 = time.process_time()
    W = m.prune(W0, G, budget)
    cpu = time.process_time() - t0
    return layer_objective(W, W0, G), cpu, int((W != 0).sum())


def table(cells, layers, methods) -> str:
    lines = ["| layer (out x in), budget | " + " | ".join(methods) + " |",
             "| --- |" + " --- |" * len(methods)]
    for layer in layers:
        for b in BUDGETS:
            row = [c for c in cells if c["layer"] == layer and c["budget"] == b]
            if not row:
                continue
            shape = row[0]["shape"]
            ref = {c["method"]: c for c in row}
            cols = []
            for m in methods:
                c = ref.get(m)
                if c is None:
                    cols.append("-")
                elif c.get("skipped"):
                    cols.append(f"skipped ({c['skipped']})")
                else:
                    t = f"{c['cpu']:.2f}" if c["cpu"] < 1 else f"{c['cpu']:.1f}"
                    cols.append(f"{c['objective']:.3g} / {t}")
            lines.append(f"| {layer} ({shape[0]} x {shape[1]}), {b} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n\nEach cell: layer objective / process CPU seconds (one thread).\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", nargs="+",
                    default=["minilm:0:query", "minilm:0:intermediate", "minilm:0:output",
                             "gpt2:768", "gpt2:3072"])
    ap.add_argument("--methods", nargs="+", default=["sparsegpt", "admm", "logsum", "mcp"])
    ap.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=BUDGETS)
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                     "dualdrop_width"))
    ap.add_argument("--max-seconds", type=float, default=float("inf"),
                    help="skip a method's later cells on a layer once one took longer")
    ap.add_argument("--report", action="store_true", help="only rewrite the table")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cells_f = out / "cells.jsonl"
    cells = [json.loads(s) for s in cells_f.read_text().splitlines()] if cells_f.exists() else []
    done = {(c["layer"], c["budget"], c["method"]) for c in cells}
    if not a.report:
        for layer in a.layers:
            W0, G = load_problem(layer, Path(a.cache), a.calib, a.tokens)
            slow = set()
            for b in a.budgets:
                for spec in a.methods:
                    if (layer, b, spec) in done:
                        continue
                    if spec in slow:
                        cell = {"layer": layer, "budget": b, "method": spec,
                                "shape": list(W0.shape), "skipped": f"> {a.max_seconds:g} s"}
                    else:
                        obj, cpu, nnz = run_cell(spec, W0, G, budget_of(b, W0.shape))
                        cell = {"layer": layer, "budget": b, "method": spec,
                                "shape": list(W0.shape), "objective": obj, "cpu": cpu,
                                "nnz": nnz}
                        if cpu > a.max_seconds:
                            slow.add(spec)
                        print(f"{layer} {b} {spec}: objective {obj:.5f}, {cpu:.1f} s CPU",
                              flush=True)
                    cells.append(cell)
                    with open(cells_f, "a") as f:
                        f.write(json.dumps(cell) + "\n")
    layers = list(dict.fromkeys([c["layer"] for c in cells]))
    methods = list(dict.fromkeys([c["method"] for c in cells]))
    (out / "table.md").write_text(table(cells, layers, methods))
    print(table(cells, layers, methods))


if __name__ == "__main__":
    main()
