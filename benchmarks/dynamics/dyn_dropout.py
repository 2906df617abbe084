"""Dropout noise meets the optimizer: Adam vs Adam + L2 vs AdamW under variational-dropout noise.

The stationary-level experiment of ``benchmarks/dynamics/dyn_stationary.py`` with the gradient noise
coming from a ``dualdrop`` method instead of injected Gaussians.  An MLP 64-32-10 (tanh) on the
embedded digits (1149 training images) is trained on the **full batch** (no minibatch noise), its
weights multiplied by ``dualdrop.nn``'s variational-dropout noise ``(1 + sqrt(alpha) eps)`` with
``log alpha`` frozen at a common value (the noise knob; ``vardrop``, no KL term, nothing pruned
since ``log alpha < 3``).  For Adam, Adam + L2 and AdamW at matched decay ``gamma`` the level is
the noiseless training loss (eval mode) averaged over the second half of the run, mean and
spread over seeds; the excess is that level minus the same optimizer's level at the weakest
noise (``log alpha = -8``, its noiseless floor), and slopes are fitted to the excess.  The noise
each level corresponds to is measured at the end of each Adam run
with ``dualdrop.diagnostics.dropout_noise_cov``: ``sigma_eff = sqrt(Tr Sigma / D)``.  Question:
does decoupled decay also bound the loss level under dropout noise?  Writes
``figures/dyn_dropout.{png,json}`` (``dyn_dropout_gamma<g>`` for another ``--gamma``).

    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_dropout.py           # ~2.5 min on one core
    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_dropout.py --gamma 0.1
    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_dropout.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dualdrop.data import load_digits_dataset
from dualdrop.diagnostics import dropout_noise_cov
from dualdrop.dynamics import make_optimizer
from dualdrop.nn import sparsify

FIG = Path(__file__).resolve().parent / "figures"
OPTS = ("adam", "adam-l2", "adamw")


def build(log_alpha, seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sparsify(net, "vardrop", init_log_alpha=log_alpha)
    for n, p in net.named_parameters():
        if n.endswith("log_alpha"):
            p.requires_grad_(False)
    return net


def weights(net):
    return [p for n, p in net.named_parameters() if p.requires_grad]


def run(opt_name, log_alpha, X, y, steps, lr, gamma, seed):
    net = build(log_alpha, seed)
    opt = make_optimizer(opt_name, weights(net), lr, gamma if opt_name != "adam" else 0.0)
    torch.manual_seed(seed + 100)
    levels = []
    for k in range(steps):
        net.train()
        loss = F.cross_entropy(net(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if k >= steps // 2 and k % 10 == 0:
            net.eval()
            with torch.no_grad():
                levels.append(float(F.cross_entropy(net(X), y)))
    return float(np.mean(levels)), net


def noise_scale(net, X, y):
    names = [n for n, p in net.named_parameters() if p.requires_grad]
    S = dropout_noise_cov(net, F.cross_entropy, X, y, n_samples=32, params=names, dense=False)
    return math.sqrt(S.trace() / S.shape[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--gamma", type=float, default=0.01)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_digits_dataset(seed=0)
    X, y = torch.as_tensor(ds.X_train), torch.as_tensor(ds.y_train)
    log_alphas = [-6.0, -2.0, 0.0] if args.quick else [-8.0, -6.0, -4.0, -2.0, -1.0, 0.0, 1.0]
    seeds = [0] if args.quick else [0, 1]
    rows = []
    t0 = time.time()
    for la in log_alphas:
        row = {"log_alpha": la}
        for o in OPTS:
            vals = []
            for s in seeds:
                v, net = run(o, la, X, y, args.steps, args.lr, args.gamma, s)
                vals.append(v)
                if o == "adam" and s == seeds[0]:
                    row["sigma_eff"] = noise_scale(net, X, y)
            row[o], row[o + "_spread"] = float(np.mean(vals)), float(np.std(vals))
        rows.append(row)
        print(f"log alpha {la:5.1f}  sigma_eff {row['sigma_eff']:.3g}  " +
              "  ".join(f"{o} {row[o]:.4f} ± {row[o + '_spread']:.4f}" for o in OPTS) +
              f"  [{time.time() - t0:.0f} s]", flush=True)
    # excess over each optimizer's level at the weakest noise (its noiseless floor)
    for r in rows:
        for o in OPTS:
            r[o + "_excess"] = r[o] - rows[0][o]
    sig = np.array([r["sigma_eff"] for r in rows])
    top = sig >= np.sort(sig)[len(sig) // 2]
    slopes = {o: float(np.polyfit(np.log(sig[top]), np.log([max(r[o + "_excess"], 1e-12)
                                                            for r, t in zip(rows, top) if t]),
                                  1)[0]) for o in OPTS}
    print("log-log slope of the excess level in sigma_eff over the upper half:",
          ", ".join(f"{o} {v:.2f}" for o, v in slopes.items()))
    FIG.mkdir(exist_ok=True)
    name = "dyn_dropout" if args.gamma == 0.01 else f"dyn_dropout_gamma{args.gamma:g}"
    (FIG / f"{name}.json").write_text(json.dumps(
        {"steps": args.steps, "lr": args.lr, "gamma": args.gamma, "seeds": seeds, "rows": rows,
         "slopes_upper_half": slopes}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    for i, o in enumerate(OPTS):
        ax.errorbar(sig[1:], [r[o + "_excess"] for r in rows[1:]],
                    [r[o + "_spread"] for r in rows[1:]], fmt="o-",
                    color=f"C{i + 2}", ms=4, label=f"{o} (upper slope {slopes[o]:.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("dropout gradient-noise scale sqrt(Tr Sigma / D)")
    ax.set_ylabel("training loss - its level at the weakest noise")
    ax.set_title(f"MLP on digits, vardrop noise, lr {args.lr}, decay {args.gamma}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIG / f"{name}.png", dpi=130)
    print("wrote", FIG / f"{name}.png", f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
