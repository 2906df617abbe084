"""Stationary loss level vs gradient-noise scale: SGD, SignSGD, Adam, Adam + L2, AdamW.

On ``f(x) = x^T H x / 2`` with ``H = diag(1, 2)`` (``mu = 1``, ``L = 2``, ``L_tau = 3``), lr 0.02,
decay ``gamma = 0.5`` for Adam + L2 and AdamW, gradient noise ``N(0, sigma^2 I)`` with sigma over
2.5 decades: the level ``E[f - f_*]`` of each optimizer's SDE (Euler--Maruyama, one step per
optimizer step) and of the torch optimizer itself (``dualdrop.dynamics.stationary_loss``, 1024
paths each, run lengths from the relaxation time), against the closed-form bounds
(``dualdrop.dynamics.stationary_bound``, dashed).  Prints the log-log slopes over the upper two
decades (sigma in [0.1, 10]) and over the top decade, and writes
``figures/dyn_stationary.{png,json}``.

    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_stationary.py           # ~3 min on one core
    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_stationary.py --quick   # fewer paths and sigmas
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from dualdrop.dynamics import OPTIMIZERS, stationary_bound, stationary_loss

FIG = Path(__file__).resolve().parent / "figures"
DECAY = {"sgd": 0.0, "signsgd": 0.0, "adam": 0.0, "adam-l2": 0.5, "adamw": 0.5,
         "rmsprop": 0.0}
LABEL = {"sgd": "SGD", "signsgd": "SignSGD", "adam": "Adam", "adam-l2": "Adam + L2 (0.5)",
         "adamw": "AdamW (0.5)", "rmsprop": "RMSprop"}


def slope(sig, val, lo, hi):
    sig, val = np.asarray(sig), np.asarray(val)
    keep = (sig >= lo * 0.999) & (sig <= hi * 1.001)
    return float(np.polyfit(np.log(sig[keep]), np.log(val[keep]), 1)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--lr", type=float, default=0.02)
    args = ap.parse_args()
    torch.set_num_threads(1)
    H = torch.diag(torch.tensor([1.0, 2.0], dtype=torch.float64))
    sigmas = [0.1, 1.0, 10.0] if args.quick else [0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
    paths = 256 if args.quick else 1024
    rows = []
    t0 = time.time()
    for opt in OPTIMIZERS:
        for s in sigmas:
            row = {"optimizer": opt, "sigma": s, "weight_decay": DECAY[opt],
                   "bound": stationary_bound(opt, H, s, args.lr, DECAY[opt])}
            for method in ("sde", "discrete"):
                r = stationary_loss(opt, H, s, args.lr, method=method, weight_decay=DECAY[opt],
                                    paths=paths, seed=1 if method == "sde" else 2)
                row[method], row[method + "_se"], row["steps"] = r["loss"], r["stderr"], r["steps"]
            rows.append(row)
            print(f"{opt:8s} sigma={s:6.2f}  sde {row['sde']:.4g} ± {row['sde_se']:.2g}  "
                  f"discrete {row['discrete']:.4g} ± {row['discrete_se']:.2g}  bound "
                  f"{row['bound']:.4g}  ({row['steps']} steps)", flush=True)
    slopes = {}
    lo2, hi = (0.1, 10.0)
    for opt in OPTIMIZERS:
        rs = [r for r in rows if r["optimizer"] == opt]
        sig = [r["sigma"] for r in rs]
        slopes[opt] = {m + "_" + rng: slope(sig, [r[m] for r in rs], *lim)
                       for m in ("sde", "discrete", "bound")
                       for rng, lim in (("2dec", (lo2, hi)), ("top", (1.0, hi)))}
    print("\nlog-log slope of the level in sigma, sigma in [0.1, 10] (two decades) / [1, 10]:")
    for opt, sl in slopes.items():
        print(f"  {opt:8s} sde {sl['sde_2dec']:.2f} / {sl['sde_top']:.2f}   discrete "
              f"{sl['discrete_2dec']:.2f} / {sl['discrete_top']:.2f}   bound "
              f"{sl['bound_2dec']:.2f} / {sl['bound_top']:.2f}")
    print(f"total {time.time() - t0:.0f} s")
    FIG.mkdir(exist_ok=True)
    out = {"H": "diag(1, 2)", "lr": args.lr, "paths": paths, "rows": rows, "slopes": slopes}
    (FIG / "dyn_stationary.json").write_text(json.dumps(out, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for i, opt in enumerate(OPTIMIZERS):
        rs = [r for r in rows if r["optimizer"] == opt]
        sig = [r["sigma"] for r in rs]
        c = f"C{i}"
        ax.errorbar(sig, [r["sde"] for r in rs], [2 * r["sde_se"] for r in rs], fmt="o",
                    color=c, ms=5, label=f"{LABEL[opt]} (slope {slopes[opt]['sde_2dec']:.2f})")
        ax.plot(sig, [r["discrete"] for r in rs], "x", color=c, ms=7)
        ax.plot(sig, [r["bound"] for r in rs], "--", color=c, lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("gradient-noise scale sigma")
    ax.set_ylabel("stationary E[f - f*]")
    ax.set_title(f"quadratic diag(1, 2), lr {args.lr}: SDE (o), torch optimizer (x), bound (--)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIG / "dyn_stationary.png", dpi=130)
    print("wrote", FIG / "dyn_stationary.png")


if __name__ == "__main__":
    main()
