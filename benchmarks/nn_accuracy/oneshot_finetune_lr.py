"""The fine-tuning learning rate of the one-shot tables, chosen on the validation split: a
network's SparseGPT cells (uniform allocation) at the given targets, fine-tuned with the masks
held at each rate; the rate of lowest mean validation error is the network's ``FINETUNE_LR`` in
oneshot_networks.py.

    python3 benchmarks/nn_accuracy/oneshot_finetune_lr.py --ref results/oneshot/ref/lenet300 \\
        --data-dir ../shared/mnist
    python3 benchmarks/nn_accuracy/oneshot_finetune_lr.py --ref results/oneshot/ref/lenet5 \\
        --data-dir ../shared/mnist --targets 0.1 2:4 --exclude conv1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_networks import GPT2Net, MNISTNet, run_cell  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", type=Path, default=Path("results/oneshot/ref/lenet300"))
    ap.add_argument("--gpt2", action="store_true",
                    help="--ref is the GPT-2 of oneshot_gpt2.py (validation perplexity, 128 "
                    "calibration windows, 50 steps)")
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--method", default="sparsegpt")
    ap.add_argument("--targets", nargs="+", default=["0.5", "0.2", "0.1", "0.05", "2:4"])
    ap.add_argument("--rates", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2])
    ap.add_argument("--exclude", nargs="+", default=None, help="layers left dense at N:M")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    spec = (GPT2Net(args.ref, 128, 50, 1024, with_val=True) if args.gpt2
            else MNISTNet(args.ref, args.data_dir, 1024))
    scale = 1 if args.gpt2 else 100
    print("| rate | " + " | ".join(args.targets) + " | mean |")
    print("|" + " --- |" * (len(args.targets) + 2))
    for lr in args.rates:
        vals = [run_cell(spec, args.method, t, "uniform", False, lr,
                         args.exclude if ":" in t else None)["val_ft"] for t in args.targets]
        print(f"| {lr:g} | " + " | ".join(f"{scale * v:.3f}" for v in vals)
              + f" | {scale * sum(vals) / len(vals):.3f} |", flush=True)


if __name__ == "__main__":
    main()
