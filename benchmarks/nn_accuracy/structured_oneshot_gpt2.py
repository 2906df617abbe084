"""Structured one-shot pruning of the small GPT-2 trained here (attention heads through the fused
``c_attn`` and MLP neurons): test perplexity per byte, parameters and speed of the compact model.

The GPT-2 of the one-shot benchmarks (``oneshot_gpt2.py``: 4 layers, 160 wide, 4 heads of 40,
1.3M parameters, trained on the Python standard library's sources, whole modules held out as the
test split) is pruned by ``prune_structured(..., granularity=("head", "neuron"))`` from 128
windows of 128 bytes of the training split, no fine-tuning, for every method and allocation at
fractions of the prunable parameters; test perplexity per byte on 2,048 windows; the compact
model (``res.compact()``: per-block widths) timed against the dense one (batch 32 x 128 bytes,
one thread, CPU-time medians). One JSON line per cell (resumable); ``--tables``. ::

    python3 benchmarks/nn_accuracy/structured_oneshot_gpt2.py --ref results/oneshot/ref/gpt2 \\
        --out results/structured_gpt2/cells.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_networks import GPT2Net, allocation_kwargs, compact_speedup  # noqa: E402

from dualdrop.nn.oneshot import prune_structured  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="results/oneshot/ref/gpt2")
    ap.add_argument("--methods", nargs="+",
                    default=["magnitude", "wanda-sp", "flap", "ziplm", "osscar", "logsum"])
    ap.add_argument("--allocations", nargs="+", default=["uniform", "flap", "penalty"],
                    help="penalty:none / penalty:energy: the penalty allocation's normalize")
    ap.add_argument("--densities", nargs="+", type=float, default=[0.7, 0.5])
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--eval-windows", type=int, default=2048)
    ap.add_argument("--out", default="results/structured_gpt2/cells.jsonl")
    ap.add_argument("--tables", action="store_true")
    ap.add_argument("--with-val", action="store_true",
                    help="also record the validation perplexity (the split to choose a setting on)")
    args = ap.parse_args(argv)
    if args.tables:
        rows = [json.loads(line) for line in open(args.out)]
        print("| prunable kept | allocation | method | validation ppl/byte | test ppl/byte | "
              "parameters | compact vs dense | prune s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            val = f"{r['val_ppl']:.3f}" if r.get("val_ppl") is not None else "-"
            print(f"| {r['density']:.0%} | {r['allocation']} | {r['method']} | {val} | "
                  f"{r['ppl']:.3f} (dense {r['dense_ppl']:.3f}) | {r['params']:,} | "
                  f"{r['speedup']:.2f}x | {r['seconds']:.1f} |")
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    done = {json.loads(line)["key"] for line in open(args.out)} if os.path.exists(args.out) \
        else set()
    torch.set_num_threads(1)
    net = GPT2Net(Path(args.ref), args.calib, 0, args.eval_windows, with_val=args.with_val)
    dense = net.load().eval()
    dense_ppl = net.errors(dense)["test"]
    x_time = net.g2.windows(net.test, 32, net.ctx, seed=7)
    for d in args.densities:
        for alloc in args.allocations:
            for meth in args.methods:
                key = json.dumps([meth, alloc, d, args.calib])
                if key in done:
                    continue
                m = copy.deepcopy(dense)
                t0 = time.perf_counter()
                res = prune_structured(m, net.calib, meth, granularity=("head", "neuron"),
                                       target_density=d, **allocation_kwargs(alloc),
                                       progress=False)
                secs = time.perf_counter() - t0
                errs = net.errors(m)
                ppl = errs["test"]
                small = res.compact({"input_ids": x_time})
                sp = compact_speedup(dense, small, x_time)
                row = {"key": key, "method": meth, "allocation": alloc, "density": d,
                       "ppl": ppl, "val_ppl": errs["val"], "dense_ppl": dense_ppl,
                       "params": sum(p.numel() for p in small.parameters()),
                       "speedup": sp, "seconds": secs,
                       "kept": {k: len(v) for k, v in res.units.items()},
                       "objectives": res.report.objectives(), "load": os.getloadavg()[0]}
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{d:.2f} {alloc:8s} {meth:9s} ppl/byte {ppl:.3f} (dense {dense_ppl:.3f})"
                      f" params {row['params']:,} speed-up {sp:.2f}x {secs:.1f} s", flush=True)


if __name__ == "__main__":
    main()
