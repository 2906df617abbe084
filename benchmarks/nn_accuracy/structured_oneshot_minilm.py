"""Structured one-shot pruning of all-MiniLM-L6-v2 (attention heads and FFN neurons) at measured
speed-ups: quality of the sentence embeddings and the compact model's measured speed.

For every (method, allocation, target speed-up): the dense model is pruned by
``prune_structured(..., granularity=("head", "neuron"), target_speedup=S)`` from the calibration
sentences (``structured_minilm_data``: stdlib docstrings, never the evaluation files), then

- quality on 2,000 held-out sentences: mean cosine between the pruned and dense embeddings,
  recall@10 of the nearest neighbours (``structured_minilm_data.quality``);
- the compact model (``res.compact()``) timed against the dense one, one thread, batch 32 x
  128 tokens, interleaved rounds, medians of the process's CPU time (``dualdrop.nn._timing``;
  the machine is shared, and one thread's CPU time is what the forward computes): the
  *measured* speed-up; the latency table of the budget is measured the same way;
- the prune's wall time (torch on ``--threads`` threads, 2 by default: the budget of the
  goal), the per-layer objectives and kept units.

One JSON line per configuration goes to ``--out`` (resumable: configurations already there are
skipped). ``--tables`` prints the RESULTS tables from it. Run::

    python benchmarks/nn_accuracy/structured_oneshot_minilm.py --methods flap osscar logsum \\
        --allocations uniform flap penalty --speedups 1.25 1.5 2.0
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from structured_minilm_data import batches, embed, load_minilm, quality, split  # noqa: E402

from dualdrop.nn._timing import interleaved, torch_threads  # noqa: E402
from dualdrop.nn.oneshot import prune_structured  # noqa: E402


def sort_by_length(tok, sentences):
    lens = [len(tok(s)["input_ids"]) for s in sentences]
    return [s for _, s in sorted(zip(lens, sentences), key=lambda t: t[0])]


def timing_batch(vocab, batch=32, length=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids)}


def measured_speedup(dense, small, inputs, rounds=7):
    with torch_threads(1), torch.no_grad():
        t = interleaved({"dense": lambda: dense(**inputs), "small": lambda: small(**inputs)},
                        rounds=rounds, warmup=1, clock="cpu")
    import statistics
    d, s = statistics.median(t["dense"]), statistics.median(t["small"])
    return d / s, d, s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["flap", "osscar", "logsum"])
    ap.add_argument("--allocations", nargs="+", default=["uniform", "flap", "penalty"])
    ap.add_argument("--speedups", nargs="*", type=float, default=[1.25, 1.5, 2.0])
    ap.add_argument("--params", nargs="+", type=int, default=[],
                    help="parameter budgets (target_params: the pruned model's parameter "
                         "count), run after the --speedups (give --speedups with no value "
                         "for these alone)")
    ap.add_argument("--granularity", default="head+neuron")
    ap.add_argument("--n-calib", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--options", default="{}", help="JSON: method options")
    ap.add_argument("--allocation-options", default="{}", help="JSON")
    ap.add_argument("--latency-options", default='{"clock": "cpu"}',
                    help='JSON for prune_structured\'s latency_options (\'{"measure": false}\': the '
                    'prediction alone, so that every method gets the same unit counts)')
    ap.add_argument("--no-bias-compensation", action="store_true")
    ap.add_argument("--target", default="pruned", choices=["pruned", "dense"])
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="results/structured_minilm/runs.jsonl")
    ap.add_argument("--tables", action="store_true")
    ap.add_argument("--layer-objectives", action="store_true",
                    help="per consumer layer, every --methods on the dense model's Gram at the "
                         "unit counts of each --out row of --allocations (penalty) and "
                         "--speedups (or at each --fractions of every consumer's units): the "
                         "objectives side by side, each method's relative to the first's")
    ap.add_argument("--fractions", nargs="+", type=float, default=None,
                    help="with --layer-objectives: every consumer keeps these fractions of its "
                         "units instead of a run's counts")
    args = ap.parse_args(argv)
    if args.tables:
        print_tables(args.out)
        return
    if args.layer_objectives:
        layer_objectives(args)
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            for line in f:
                r = json.loads(line)
                done.add(r["key"])
    model, tok = load_minilm()
    calib_s, eval_s = split(n_calib=args.n_calib)
    calib = batches(tok, sort_by_length(tok, calib_s))
    evals = batches(tok, sort_by_length(tok, eval_s), batch=64)
    dense_emb = embed(model, evals)
    tbatch = timing_batch(tok.vocab_size)
    opts, aopts = json.loads(args.options), json.loads(args.allocation_options)
    budgets = [(s, {"target_speedup": s, "latency_inputs": tbatch,
                    "latency_options": json.loads(args.latency_options)}) for s in args.speedups]
    budgets += [(f"params:{n}", {"target_params": n}) for n in args.params]
    for s, budget in budgets:
        for alloc in args.allocations:
            for meth in args.methods:
                key = json.dumps([meth, alloc, s, args.granularity, args.n_calib, opts, aopts,
                                  not args.no_bias_compensation, args.tag, args.target])
                if key in done:
                    continue
                m = copy.deepcopy(model)
                torch.set_num_threads(args.threads)
                t0, c0 = time.perf_counter(), time.process_time()
                res = prune_structured(m, calib, meth, granularity=args.granularity,
                                       allocation=alloc, options=opts,
                                       allocation_options=aopts,
                                       bias_compensation=not args.no_bias_compensation,
                                       target=args.target, progress=False, **budget)
                secs, cpu = time.perf_counter() - t0, time.process_time() - c0
                cos, rec = quality(dense_emb, embed(m, evals))
                small = res.compact(tbatch)
                sp, td, ts = measured_speedup(model, small, tbatch)
                row = {"key": key, "method": meth, "allocation": alloc, "speedup": s,
                       "granularity": args.granularity, "tag": args.tag, "cosine": cos,
                       "recall10": rec, "measured_speedup": sp, "dense_s": td, "small_s": ts,
                       "predicted_speedup": res.report.predicted_speedup,
                       "params": res.report.params_after, "prune_seconds": secs,
                       "prune_cpu_seconds": cpu,
                       "options": opts, "allocation_options": aopts,
                       "bias_compensation": not args.no_bias_compensation,
                       "fit_target": args.target, "n_calib": args.n_calib,
                       "load": os.getloadavg()[0],
                       "layers": [{k: r[k] for k in ("layer", "kind", "units", "kept",
                                                     "objective", "seconds")}
                                  for r in res.report.layers]}
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                pred = res.report.predicted_speedup
                print(f"{meth:10s} {alloc:8s} {s}: cos {cos:.4f} R@10 {rec:.3f} "
                      f"measured {sp:.2f}x (pred {pred if pred is None else round(pred, 2)}x) "
                      f"{res.report.params_after:,} params, {secs:.0f} s", flush=True)


def layer_objectives(args):
    """The consumer objectives of ``args.methods`` on the dense model's Grams (one calibration
    pass over ``--n-calib`` sentences), each layer keeping the units of a finished run."""
    from dualdrop.nn.oneshot.registry import get_unit_method
    from dualdrop.nn.oneshot.structured import UnitStep, unit_problem
    from dualdrop.nn.oneshot.units import find_units
    from dualdrop.nn.oneshot.run import collect_grams
    from dualdrop.nn.oneshot.calibration import default_forward

    torch.set_num_threads(args.threads)
    model, tok = load_minilm()
    calib_s, _ = split(n_calib=args.n_calib)
    calib = batches(tok, sort_by_length(tok, calib_s))
    groups, _ = find_units(model, calib[0], default_forward, args.granularity)
    steps = [UnitStep(g) for g in groups]
    grams = collect_grams(model, steps, calib, default_forward)
    problems = [unit_problem(s.group, s.weights()[0], grams[s.group.name], True) for s in steps]
    tables = []
    if args.fractions:
        tables = [(f"{f:g} of every consumer's units",
                   {pr.name: max(1, round(f * pr.n_units)) for pr in problems})
                  for f in args.fractions]
    else:
        seen = set()
        for r in (json.loads(line) for line in open(args.out)):
            if r["allocation"] not in args.allocations or _speedup(r) not in args.speedups:
                continue
            counts = {x["layer"]: x["kept"] for x in r["layers"]}
            if json.dumps(counts, sort_keys=True) in seen:   # the same units as a row before
                continue
            seen.add(json.dumps(counts, sort_keys=True))
            tables.append((f"the units of {r['method']} {r['allocation']} "
                           f"{r['allocation_options']} {_speedup(r)}x", counts))
    for title, counts in tables:
        print(f"### {title}: objective on the dense model's Gram (CPU seconds; after the "
              f"first, the change against it)")
        print("| layer | kept | " + " | ".join(args.methods) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in args.methods) + " |")
        total = [0.0] * len(args.methods)
        for pr in problems:
            k = counts[pr.name]
            if k >= pr.n_units:
                continue
            cells, first = [], None
            for i, m in enumerate(args.methods):
                c0 = time.process_time()
                sol = get_unit_method(m).solve(pr, k)
                sec = time.process_time() - c0
                total[i] += sec
                rel = "" if first is None or first <= 0 else \
                    f", {100 * (sol.objective / first - 1):+.3f}%"
                first = sol.objective if first is None else first
                cells.append(f"{sol.objective:.6g} ({sec:.2f} s{rel})")
            print(f"| {pr.name} | {k}/{pr.n_units} | " + " | ".join(cells) + " |", flush=True)
        print("| total CPU s | | " + " | ".join(f"{t:.1f}" for t in total) + " |", flush=True)


def print_tables(path):
    rows = [json.loads(line) for line in open(path)]
    print("| method | allocation | target | measured speed-up | cosine | recall@10 | params |"
          " prune s (wall) | prune s (CPU) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (str(_speedup(r)), r["allocation"], r["method"])):
        t = _speedup(r)
        print(f"| {r['method']}{' ' + r['tag'] if r['tag'] else ''} | {r['allocation']} | "
              f"{t if isinstance(t, str) else f'{t:.2f}x'} | {r['measured_speedup']:.2f}x | "
              f"{r['cosine']:.4f} | "
              f"{r['recall10']:.3f} | {r['params']:,} | {r['prune_seconds']:.0f} | "
              f"{r.get('prune_cpu_seconds', float('nan')):.0f} |")


def _speedup(row):
    """The target speed-up of a row (the third entry of its key: rows written before the
    field had its own name stored the fit target under the same name), or its parameter
    budget as ``"params:N"``."""
    t = json.loads(row["key"])[2]
    return t if isinstance(t, str) else float(t)


if __name__ == "__main__":
    main()
