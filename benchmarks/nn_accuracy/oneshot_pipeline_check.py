"""The block pipeline against the whole-model layer walk on the trained reference networks
(benchmarks/RESULTS.md, "One-shot at scale"): the same method, budget and calibration set
pruned three ways, ``sequential="layer"`` with float64 Gram products (the walk as it was before
the pipeline), ``sequential="auto"`` with the default ``gram_precision="auto"`` (float64 batch
products up to 1,024 inputs) and with float32 products;
recorded per network and method: which walk ran, the largest weight difference from the layer
walk, the largest relative difference of a layer objective, the test error (perplexity for
GPT-2), and the seconds of each (one thread).

    python3 benchmarks/nn_accuracy/oneshot_pipeline_check.py --refs results/oneshot/ref \\
        --data-dir ../shared/mnist --out results/oneshot_scale/pipeline_check.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_networks import GPT2Net, MNISTNet, parse_target  # noqa: E402

CELLS = [("sparsegpt", "0.2"), ("sparsegpt", "2:4"), ("wanda", "0.5"), ("admm", "0.1")]
WAYS = [("layer", "float64"), ("auto", "auto"), ("auto", "float32")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refs", default="results/oneshot/ref")
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--nets", nargs="+", default=["lenet300", "lenet5", "transformer", "gpt2"])
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--out", default="results/oneshot_scale/pipeline_check.jsonl")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from dualdrop.nn import prune_oneshot

    done = set()
    if os.path.exists(a.out):
        with open(a.out) as f:
            done = {(r["net"], r["method"], r["target"]) for r in map(json.loads, f)}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for net_name in a.nets:
        ref = Path(a.refs) / net_name
        if not (ref / "model.pt").exists() and not (ref / "final.json").exists():
            print(f"no reference network at {ref}; skipped", flush=True)
            continue
        spec = (GPT2Net(ref, 128, 0, 512) if net_name == "gpt2"
                else MNISTNet(ref, a.data_dir, a.calib))
        for method, target in CELLS:
            if (net_name, method, target) in done:
                continue
            runs = []
            for sequential, precision in WAYS:
                net = spec.load()
                t0 = time.perf_counter()
                exclude = ["conv1"] if net_name == "lenet5" and ":" in target else None
                res = prune_oneshot(net, spec.calib, method, progress=False,
                                    sequential=sequential, gram_precision=precision,
                                    exclude=exclude, **parse_target(target))
                secs = time.perf_counter() - t0
                runs.append((net, res, secs, spec.errors(net)["test"]))
            base_net, base_res = runs[0][0], runs[0][1]
            row = {"net": net_name, "method": method, "target": target}
            for (sequential, precision), (net, res, secs, test) in zip(WAYS, runs):
                diff = max(float((p - q).abs().max()) for p, q in
                           zip(base_net.state_dict().values(), net.state_dict().values()))
                objs = [abs(x["objective"] - y["objective"]) / max(abs(x["objective"]), 1e-30)
                        for x, y in zip(base_res.report.layers, res.report.layers)]
                row[f"{sequential}/{precision}"] = {
                    "walk": res.report.pipeline.get("mode"),
                    "blocks": res.report.pipeline.get("blocks"), "max_weight_diff": diff,
                    "max_objective_rel_diff": max(objs), "test": test, "seconds": secs}
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
