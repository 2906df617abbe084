"""Weak error of each SDE against its torch optimizer, as the learning rate shrinks.

For SGD, SignSGD, Adam, Adam + L2 and AdamW on ``f(x) = x^T H x / 2`` with ``H = diag(1, 2)``,
start ``x0 = (1, 1)``, noise ``N(0, sigma^2 I)`` with sigma = 1, horizon ``T = 2`` (``T / lr``
steps), the weak error ``|E phi(x_{T/lr}) - E phi(X_T)|`` for ``phi = f`` and ``phi = x_1``.
The SDE is solved with 16 Euler--Maruyama steps per optimizer step; Adam's ``rho_i`` are held
fixed (``beta_i = 1 - lr rho_i``, ``rho_1 = 2``, ``rho_2 = 1``) as in the SDE's scaling limit;
decay 0.5 for Adam + L2 and AdamW.  The two are coupled through their Gaussians: the optimizer's
noise at step ``k`` is the normalized sum of the SDE's 16 increments over that step (for SignSGD,
``sign(g + sigma z_k)`` with that ``z_k``), which leaves each law unchanged and shrinks the
Monte Carlo error of the difference (SignSGD gets 8x the paths: its sign noise couples
loosely).  Prints the error, its standard error and the fitted order
(log-log slope in lr, over all lrs and over the three smallest), and writes
``figures/dyn_weak_error.{png,json}``.

    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_weak_error.py           # ~6 min on one core
    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_weak_error.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from dualdrop.dynamics import OPTIMIZERS, run_discrete, simulate_sde

FIG = Path(__file__).resolve().parent / "figures"
DECAY = {"sgd": 0.0, "signsgd": 0.0, "adam": 0.0, "adam-l2": 0.5, "adamw": 0.5,
         "rmsprop": 0.0}
RHO = (2.0, 1.0)
SUB = 16


class Coupled:
    """Standard normals for SDE step n from a counter-seeded generator; the optimizer's step k
    gets the normalized sum of SDE steps k*SUB .. k*SUB + SUB - 1."""

    def __init__(self, paths, d, seed):
        self.paths, self.d, self.seed = paths, d, seed

    def sde(self, n):
        g = torch.Generator().manual_seed(self.seed * 10_000_019 + n)
        return torch.randn(self.paths, self.d, generator=g, dtype=torch.float64)

    def discrete(self, k):
        return sum(self.sde(k * SUB + j) for j in range(SUB)) / math.sqrt(SUB)


def one(opt, lr, H, x0, T, sigma, paths, seed):
    steps = round(T / lr)
    betas = (1 - lr * RHO[0], 1 - lr * RHO[1])
    cp = Coupled(paths, H.shape[0], seed)
    kw = dict(sigma=sigma, weight_decay=DECAY[opt], betas=betas, paths=paths, x0=x0,
              burn_in=steps)
    a = simulate_sde(opt, H, lr, steps, substeps=SUB, z_source=cp.sde, **kw)
    b = run_discrete(opt, H, lr, steps, z_source=cp.discrete, **kw)
    out = {}
    for name, phi_a, phi_b in (("f", a["final_loss"], b["final_loss"]),
                               ("x1", a["x"][:, 0], b["x"][:, 0])):
        diff = phi_b - phi_a
        out[name] = float(diff.mean())
        out[name + "_se"] = float(diff.std() / math.sqrt(paths))
        out[name + "_sde"] = float(phi_a.mean())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    H = torch.diag(torch.tensor([1.0, 2.0], dtype=torch.float64))
    x0 = torch.tensor([1.0, 1.0], dtype=torch.float64)
    lrs = [0.1, 0.05, 0.025] if args.quick else [0.1, 0.05, 0.025, 0.0125, 0.00625]
    paths = 4000 if args.quick else 20000
    T, sigma = 2.0, 1.0
    rows, orders = [], {}
    t0 = time.time()
    for opt in OPTIMIZERS:
        for lr in lrs:
            # SignSGD's sign noise couples loosely with the SDE's Gaussians: 8x the paths
            r = one(opt, lr, H, x0, T, sigma, paths * (8 if opt == "signsgd" else 1), seed=7)
            r.update(optimizer=opt, lr=lr)
            rows.append(r)
            print(f"{opt:8s} lr={lr:<7g} E f: SDE {r['f_sde']:.4f}, error {r['f']:+.2e} ± "
                  f"{r['f_se']:.1e};  E x1: error {r['x1']:+.2e} ± {r['x1_se']:.1e}", flush=True)
        rs = [r for r in rows if r["optimizer"] == opt]
        orders[opt] = {k + sfx: float(np.polyfit(np.log(lrs[lo:]),
                                                 np.log([abs(r[k]) for r in rs[lo:]]), 1)[0])
                       for k in ("f", "x1") for sfx, lo in (("", 0), ("_small", -3))}
    print("\nweak order (log-log slope of |error| in lr), all lrs / the three smallest:")
    for opt, o in orders.items():
        print(f"  {opt:8s} phi=f {o['f']:.2f} / {o['f_small']:.2f}   phi=x1 {o['x1']:.2f} / "
              f"{o['x1_small']:.2f}")
    print(f"total {time.time() - t0:.0f} s")
    FIG.mkdir(exist_ok=True)
    (FIG / "dyn_weak_error.json").write_text(json.dumps(
        {"T": T, "sigma": sigma, "rho": RHO, "substeps": SUB, "paths": paths, "rows": rows,
         "orders": orders}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharex=True)
    for ax, key, title in ((axes[0], "f", "phi = f(x_T)"), (axes[1], "x1", "phi = x_1(T)")):
        for i, opt in enumerate(OPTIMIZERS):
            rs = [r for r in rows if r["optimizer"] == opt]
            ax.errorbar(lrs, [abs(r[key]) for r in rs], [2 * r[key + "_se"] for r in rs],
                        fmt="o-", color=f"C{i}", ms=4,
                        label=f"{opt} (order {orders[opt][key + '_small']:.2f})")
        ref = np.array(lrs)
        ax.plot(ref, ref * abs(rows[0][key]) / lrs[0], "k:", lw=1, label="slope 1")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("|E phi(optimizer) - E phi(SDE)|")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIG / "dyn_weak_error.png", dpi=130)
    print("wrote", FIG / "dyn_weak_error.png")


if __name__ == "__main__":
    main()
