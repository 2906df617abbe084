"""Depth regularity of 1/L-scaled residual MLPs on the digits, dense and sparsified.

Marion et al. ("Implicit regularization of deep residual networks towards neural ODEs"): with
blocks ``h <- h + (1/L) tanh(W_l h + b_l)`` and a smooth initialization (``W_l = W(l/L)``), the
trained weights stay a Lipschitz function of ``l/L`` with a constant independent of ``L``; with
i.i.d. initialization the constant grows with ``L``.  For ``L`` in {8, 32, 128, 512} (width 16)
and each initialization this script trains on the embedded digits (1149 training images) with
SGD, the blocks' learning rate multiplied by ``L`` (the gradient-flow time scale of the paper:
a block's gradient is ``O(1/L)``), and reports ``depth_regularity``: ``Lip = L max_l ||W_{l+1} -
W_l||_F`` at initialization and after training, the same for the change ``W_l(T) - W_l(0)``, and
the test accuracy.  Then each trained network is fine-tuned with a ``dualdrop`` method on the
blocks (gradual magnitude pruning to 80% sparsity; LogSum, the penalty dual to adaptive dropout,
``lam = 0.03``) and the
constant is measured on the effective (pruned, test-time) weights.  Writes
``figures/dyn_depth.{png,json}``.

    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_depth.py            # ~6 min on one core
    OMP_NUM_THREADS=1 python3 benchmarks/dynamics/dyn_depth.py --quick    # depths 8, 32 only
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dualdrop.data import load_digits_dataset
from dualdrop.diagnostics import depth_regularity, residual_mlp
from dualdrop.nn import sparsify
from dualdrop.train.engine import train_step

FIG = Path(__file__).resolve().parent / "figures"
WIDTH = 16


def batches(n, bs, steps, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=g)
        out += [perm[i:i + bs] for i in range(0, n - bs + 1, bs)]
    return out[:steps]


def accuracy(net, X, y):
    net.eval()
    with torch.no_grad():
        return float((net(X).argmax(1) == y).float().mean())


def train_dense(net, X, y, steps, lr, seed):
    L = net.depth
    blocks = [p for n, p in net.named_parameters() if n.startswith("blocks.")]
    rest = [p for n, p in net.named_parameters() if not n.startswith("blocks.")]
    opt = torch.optim.SGD([{"params": blocks, "lr": lr * L}, {"params": rest, "lr": lr}])
    net.train()
    for idx in batches(X.shape[0], 64, steps, seed):
        loss = F.cross_entropy(net(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


#: fine-tuning runs: (method or None for a dense control, its hyperparameters, Adam's lr)
FINETUNE = {"adam (dense control)": (None, {}, 3e-3),
            "magnitude 80%": ("magnitude", {"sparsity": 0.8, "end": 0.6}, 1e-3),
            "logsum": ("logsum", {"lam": 3e-2}, 3e-3)}


def finetune(net, name, X, y, steps, seed):
    method, hp, lr = FINETUNE[name]
    sp = sparsify(net, method, include=["blocks.*"], **hp) if method else None
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    n = X.shape[0]
    for step, idx in enumerate(batches(n, 64, steps, seed), 1):
        loss = F.cross_entropy(net(X[idx]), y[idx])
        train_step(loss, opt, step=step - 1, total_steps=steps, sp=sp, n_train=n)  # the engine's
    return sp.density()["total"] if sp is not None else 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_digits_dataset(seed=0)
    X, y = torch.as_tensor(ds.X_train), torch.as_tensor(ds.y_train)
    Xt, yt = torch.as_tensor(ds.X_test), torch.as_tensor(ds.y_test)
    depths = [8, 32] if args.quick else [8, 32, 128, 512]
    methods = list(FINETUNE)
    rows = []
    t0 = time.time()
    for init in ("smooth", "iid"):
        for L in depths:
            net = residual_mlp(X.shape[1], WIDTH, L, 10, init=init, seed=0)
            W0 = [b.linear.weight.detach().clone() for b in net.blocks]
            r0 = depth_regularity(net)
            norm_init_max = max(r0["norm"])
            loss = train_dense(net, X, y, args.steps, args.lr, seed=0)
            r1 = depth_regularity(net)
            dW = [b.linear.weight.detach() - w for b, w in zip(net.blocks, W0)]
            rd = depth_regularity(dW)
            row = {"init": init, "L": L, "lip_init": r0["lipschitz"], "lip": r1["lipschitz"],
                   "lip_rel": r1["lipschitz"] / max(r1["norm"]), "norm_init_max": norm_init_max,
                   "lip_bias": r1["bias_lipschitz"], "lip_delta": rd["lipschitz"],
                   "delta_norm_max": max(rd["norm"]), "train_loss": loss,
                   "test_acc": accuracy(net, Xt, yt), "diff_profile": r1["diff"]}
            for m in methods:
                sn = copy.deepcopy(net)
                dens = finetune(sn, m, X, y, args.steps // 2, seed=1)
                rs = depth_regularity(sn)
                row[m] = {"lip": rs["lipschitz"], "lip_mean": rs["lipschitz_mean"],
                          "lip_rel": rs["lipschitz"] / max(rs["norm"]),
                          "density": dens, "test_acc": accuracy(sn, Xt, yt)}
            rows.append(row)
            print(f"{init:6s} L={L:4d}  Lip init {row['lip_init']:8.2f}  trained {row['lip']:8.2f}"
                  f"  (bias {row['lip_bias']:7.2f}; of the change {row['lip_delta']:6.2f}, max "
                  f"||dW_l|| {row['delta_norm_max']:.3f})  acc {row['test_acc']:.3f}  | " +
                  "  ".join(f"{m}: Lip {row[m]['lip']:8.2f} (/max||W|| {row[m]['lip_rel']:.2f})"
                            f" dens {row[m]['density']:.2f} acc "
                            f"{row[m]['test_acc']:.3f}" for m in methods)
                  + f"  [{time.time() - t0:.0f} s]", flush=True)
    FIG.mkdir(exist_ok=True)
    (FIG / "dyn_depth.json").write_text(json.dumps({"width": WIDTH, "steps": args.steps,
                                                    "lr": args.lr, "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    styles = {"smooth": "o", "iid": "s"}
    for init in ("smooth", "iid"):
        rs = [r for r in rows if r["init"] == init]
        Ls = [r["L"] for r in rs]
        ax.plot(Ls, [r["lip_init"] / r["norm_init_max"] for r in rs], styles[init] + ":",
                color="0.5",
                label=f"{init}: init")
        ax.plot(Ls, [r["lip_rel"] for r in rs], styles[init] + "-", color="C0",
                label=f"{init}: trained")
        for i, m in enumerate(methods):
            ax.plot(Ls, [r[m]["lip_rel"] for r in rs], styles[init] + "--", color=f"C{i + 1}",
                    label=f"{init}: + {m}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("depth L")
    ax.set_ylabel("L max_l ||W_{l+1} - W_l||_F / max_l ||W_l||_F")
    ax.legend(fontsize=7)
    ax.set_title("discrete Lipschitz constant of the weights in depth", fontsize=9)
    ax = axes[1]
    for init, c in (("smooth", "C0"), ("iid", "C3")):
        r = [r for r in rows if r["init"] == init][-1]
        s = (np.arange(1, r["L"]) / r["L"])
        ax.plot(s, r["diff_profile"], color=c, label=f"{init}, L={r['L']}, trained")
    ax.set_yscale("log")
    ax.set_xlabel("depth l / L")
    ax.set_ylabel("||W_{l+1} - W_l||_F")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIG / "dyn_depth.png", dpi=130)
    print("wrote", FIG / "dyn_depth.png", f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
