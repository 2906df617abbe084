"""SGD noise becomes more curvature-aligned with width (Zhu et al., ICML 2019, their width study).

One-hidden-layer ReLU nets with 32 / 128 / 512 hidden units are trained (full-batch Adam, cross
entropy) on 1,000 linearly separable 2-D points; at the end of training the dense Hessian ``H``
and the minibatch-noise covariance ``Sigma_SGD`` (batch ``--batch``, sampling without replacement,
``dualdrop.diagnostics.sgd_noise_cov``) give the escaping indicator's ratio
``Tr(H Sigma) / Tr(H Sigma_bar)`` with ``Sigma_bar = Tr(Sigma)/D I``.  The paper's claim: the ratio
is well above 1 and grows with width (more parameters, same few sharp directions).

    python3 benchmarks/diagnostics/diag_width.py     # ~3 min on one core; figure figures/diag_width.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dualdrop.diagnostics import alignment, escape_indicator, hessian, sgd_noise_cov

FIG = Path(__file__).resolve().parent / "figures"


def data(n=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, generator=g)
    w = torch.tensor([1.0, -0.6])
    X = X + 0.3 * torch.sign(X @ w)[:, None] * w / w.norm()      # a margin of 0.3 around the line
    return X, (X @ w > 0).long()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=str(FIG / "diag_width.png"))
    ap.add_argument("--replot", action="store_true", help="redraw the figure from OUT's .json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    X, y = data()
    lf = nn.functional.cross_entropy
    rows = []
    if a.replot:
        rows = json.loads(Path(a.out).with_suffix(".json").read_text())["rows"]
        a.widths = sorted({r["width"] for r in rows})
    for width in ([] if a.replot else a.widths):
        for seed in range(a.seeds):
            torch.manual_seed(seed)
            net = nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, 2))
            opt = torch.optim.Adam(net.parameters(), lr=1e-2)
            for _ in range(a.steps):
                opt.zero_grad()
                loss = lf(net(X), y)
                loss.backward()
                opt.step()
            H = hessian(net, lf, X, y)
            S = sgd_noise_cov(net, lf, X, y, a.batch)
            ind = escape_indicator(H, S)
            al = alignment(H, S, k=5, null_samples=0)
            acc = float((net(X).argmax(1) == y).float().mean())
            rows.append({"width": width, "seed": seed, "D": H.shape[0],
                         "loss": float(loss.detach()),
                         "train_acc": acc, "ratio": ind["ratio"], "trace": ind["trace"],
                         "cosine": al["cosine"], "null_cosine": al["null_mean_exact"],
                         "top_eig": float(torch.linalg.eigvalsh(H)[-1])})
            r = rows[-1]
            print(f"width {width:4d} seed {seed} D={r['D']} loss={r['loss']:.4f} acc={acc:.3f} "
                  f"Tr(H S)/Tr(H S_bar)={r['ratio']:.1f} cosine={r['cosine']:.3f} "
                  f"(null {r['null_cosine']:.4f}) lambda_max={r['top_eig']:.3f}", flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for width in a.widths:
        rs = [r["ratio"] for r in rows if r["width"] == width]
        ax.plot([width] * len(rs), rs, "o", color="C0", alpha=0.6)
    med = [float(np.median([r["ratio"] for r in rows if r["width"] == w])) for w in a.widths]
    ax.plot(a.widths, med, "-", color="C0", label="median over seeds")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("hidden units")
    ax.set_ylabel("Tr(H Σ_SGD) / Tr(H Σ_iso)")
    ax.set_title(f"SGD noise vs isotropic noise, batch {a.batch}, 1,000 separable 2-D points",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    if not a.replot:
        Path(a.out).with_suffix(".json").write_text(json.dumps({"args": vars(a), "rows": rows},
                                                              indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
