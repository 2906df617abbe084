"""Dropout noise vs SGD noise along short LeNet-300-100 / MNIST runs of five methods.

Each method is trained with its paper defaults (``dualdrop.nn.sparsify`` + Adam at the method's
learning rate, batch 128, the method's regularizer and ``after_step``; a short schedule of
``--epochs`` epochs) and after every epoch ``dualdrop.diagnostics.measure`` runs on one fixed
subset of the training data (``--n`` points, the same for all methods): top Hessian eigenvalues,
``Tr(H Sigma)`` and the isotropic ratio, cosine with the Hessian and its null mean, and the share of
variance in the top-k Hessian eigenspace, for the SGD noise (batch 128) and the method's dropout
noise.  Results go to ``--out`` as one JSON line per (method, epoch); a rerun skips what is done.

    python3 benchmarks/diag_methods.py --data-dir data/mnist --epochs 2 \
        --out benchmarks/figures/diag_methods.jsonl     # ~15 min on a loaded 2-core machine
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dualdrop.data import load_dataset
from dualdrop.diagnostics import measure
from dualdrop.nn import sparsify
from dualdrop.train.models import lenet_300_100

FIG = Path(__file__).resolve().parent / "figures"
METHODS = ["vardrop", "vardrop-lr", "hardconcrete", "eta-trick", "logsum"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--noise-samples", type=int, default=32)
    ap.add_argument("--out", default=str(FIG / "diag_methods.jsonl"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset(a.data_dir, seed=0)
    Xtr, ytr = torch.tensor(ds.X_train), torch.tensor(ds.y_train)
    idx = torch.as_tensor(np.random.default_rng(0).permutation(len(ytr))[: a.n])
    Xs, ys = Xtr[idx], ytr[idx]
    out = Path(a.out)
    done = set()
    if out.is_file():
        done = {(r["method"], r["epoch"]) for r in map(json.loads, out.read_text().splitlines())}
    lf = torch.nn.functional.cross_entropy
    for method in a.methods:
        if all((method, e) in done for e in range(1, a.epochs + 1)):
            continue
        torch.manual_seed(0)
        net = lenet_300_100(Xtr.shape[1], 10)
        sp = sparsify(net, method)
        opt = torch.optim.Adam(net.parameters(), lr=sp.hparams["lr"])
        g = torch.Generator().manual_seed(0)
        steps_per_epoch = (len(ytr) + 127) // 128
        total, step = steps_per_epoch * a.epochs, 0
        for epoch in range(1, a.epochs + 1):
            net.train()
            for b in torch.randperm(len(ytr), generator=g).split(128):
                opt.zero_grad()
                loss = lf(net(Xtr[b]), ytr[b]) + sp.regularizer(len(ytr))
                loss.backward()
                opt.step()
                step += 1
                sp.after_step(opt, step, total)
            if (method, epoch) in done:
                continue
            net.eval()
            with torch.no_grad():
                val_err = float((net(torch.tensor(ds.X_val)).argmax(1) !=
                                 torch.tensor(ds.y_val)).float().mean())
            r = measure(net, lf, Xs, ys, sp, k=a.k, batch_size=128, n_samples=a.noise_samples)
            r.update(method=method, epoch=epoch, val_error=val_err,
                     density=float(sp.density()["total"]))
            with out.open("a") as fh:
                fh.write(json.dumps(r) + "\n")
            print(f"{method} epoch {epoch}: val err {val_err:.4f} density {r['density']:.3f} "
                  f"lambda_1 {r['lambda_1']:.3g} | SGD ratio {r['sgd_ratio']:.1f} cos "
                  f"{r['sgd_cosine']:.3f} top-k share {r['sgd_energy_topk']:.3f} | dropout ratio "
                  f"{r['drop_ratio']:.1f} cos {r['drop_cosine']:.4f} top-k share "
                  f"{r['drop_energy_topk']:.4f}", flush=True)
    plot(out)


def plot(path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(s) for s in path.read_text().splitlines()]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for i, m in enumerate(methods):
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["epoch"])
        ep = [r["epoch"] for r in rs]
        col = f"C{i}"
        axes[0].plot(ep, [r["sgd_ratio"] for r in rs], "o-", color=col, label=f"{m} SGD")
        axes[0].plot(ep, [r["drop_ratio"] for r in rs], "s--", color=col, label=f"{m} dropout")
        axes[1].plot(ep, [r["sgd_cosine"] for r in rs], "o-", color=col)
        axes[1].plot(ep, [r["drop_cosine"] for r in rs], "s--", color=col)
        axes[1].plot(ep, [r["sgd_null_cosine"] for r in rs], ":", color=col)
        axes[2].plot(ep, [r["lambda_1"] for r in rs], "o-", color=col, label=m)
    axes[0].set_title("Tr(H Σ)/Tr(H Σ_iso): SGD (solid) vs dropout noise (dashed)", fontsize=9)
    axes[1].set_title("cos(H, Σ); dotted: random-eigenvector null mean", fontsize=9)
    axes[2].set_title("sharpness λ_1 of the Hessian", fontsize=9)
    for ax in axes[:2]:
        ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("epoch")
    axes[0].legend(fontsize=6, ncol=2)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    print("wrote", path.with_suffix(".png"))


if __name__ == "__main__":
    main()
