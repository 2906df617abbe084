"""The whole all-MiniLM-L6-v2 pruned unstructured in one shot: process CPU seconds of the prune
(one thread) and the cosine of the sentence embeddings to the dense model's on held-apart text.

    OMP_NUM_THREADS=1 python benchmarks/nn_speed/oneshot_minilm_whole.py --method logsum \
        --budget 0.5 [--n-calib 128] [--n-eval 1000]

``--budget`` is a density (0.5) or an N:M pattern (2:4). Calibration and evaluation sentences come
from different files of the standard library (benchmarks/nn_accuracy/structured_minilm_data.py).
One JSON line per run is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "nn_accuracy"))
from structured_minilm_data import batches, embed, load_minilm, quality, split  # noqa: E402

from dualdrop.nn.oneshot import prune_oneshot  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="logsum")
    ap.add_argument("--budget", default="0.5", help="a density (0.5) or an N:M pattern (2:4)")
    ap.add_argument("--n-calib", type=int, default=128)
    ap.add_argument("--n-eval", type=int, default=1000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = load_minilm()
    calib_s, eval_s = split(n_calib=args.n_calib, n_eval=args.n_eval)
    calib, evals = batches(tok, calib_s), batches(tok, eval_s)
    dense = embed(model, evals)
    budget = ({"pattern": args.budget} if ":" in args.budget
              else {"target_density": float(args.budget)})
    t0 = time.process_time()
    prune_oneshot(model, calib, args.method, progress=False, **budget)
    cpu = time.process_time() - t0
    cos, recall = quality(dense, embed(model, evals))
    print(json.dumps({"method": args.method, "budget": args.budget, "n_calib": args.n_calib,
                      "cpu_s": round(cpu, 1), "cosine": round(cos, 4),
                      "recall@10": round(recall, 4)}), flush=True)


if __name__ == "__main__":
    main()
