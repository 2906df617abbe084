"""Escaping a sharp minimum in 2-D: noise structure at equal noise norm (Zhu et al., ICML 2019).

The loss ``L(w) = -log(exp(-q_1(w)) + exp(-q_2(w)))`` has a sharp minimum at (1, 1)
(``q_1 = (w - mu_1)^T A_1 (w - mu_1) / 2``, eigenvalues 40 and 2 of ``A_1``, the sharp direction
rotated 30 degrees off the diagonal) and a flat one at (-1, -1) (``A_2 = I``).  From the sharp
minimum every dynamics runs ``w <- w - lr grad L(w) + eps`` with ``eps ~ N(0, Sigma)`` and the same
noise norm ``Tr(Sigma) = E |eps|^2``:

* GD: ``Sigma = 0``;  GLD const: ``Sigma ∝ I``;  GLD diag: ``Sigma ∝ diag(H)``;
* GLD leading-k (k = 1): the top eigenpair of H kept, the rest of ``Tr(H)`` spread isotropically,
  ``Sigma ∝ lambda_1 v_1 v_1^T + (lambda_2 / D) I``;
* GLD Hessian: ``Sigma ∝ H``;  GLD 1st eigvec(H): ``Sigma ∝ v_1 v_1^T``,

with ``H`` the Hessian at the sharp minimum.  A run has escaped when it sits in the flat basin
(``q_2 < q_1``).  Printed: the escape fraction over ``--runs`` runs after each of the horizons and
the indicator ratio ``Tr(H Sigma) / Tr(H Sigma_bar)`` of ``dualdrop.diagnostics.escape_indicator``.

    python3 benchmarks/diagnostics/diag_escape2d.py     # ~1 min; figure figures/diag_escape2d.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from dualdrop.diagnostics import escape_indicator

FIG = Path(__file__).resolve().parent / "figures"
MU1, MU2 = torch.tensor([1.0, 1.0], dtype=torch.float64), torch.tensor([-1.0, -1.0],
                                                                         dtype=torch.float64)
_ang = math.radians(45 - 30)
_R = torch.tensor([[math.cos(_ang), -math.sin(_ang)], [math.sin(_ang), math.cos(_ang)]],
                  dtype=torch.float64)
A1 = _R @ torch.diag(torch.tensor([40.0, 2.0], dtype=torch.float64)) @ _R.T
A2 = torch.eye(2, dtype=torch.float64)


def quads(w):
    q1 = 0.5 * (((w - MU1) @ A1) * (w - MU1)).sum(-1)
    q2 = 0.5 * (((w - MU2) @ A2) * (w - MU2)).sum(-1)
    return q1, q2


def loss(w):
    q1, q2 = quads(w)
    return -torch.logsumexp(torch.stack([-q1, -q2]), 0)


def grad_loss(w):
    w = w.detach().requires_grad_(True)
    return torch.autograd.grad(loss(w).sum(), w)[0]


def noise_shapes(H):
    lam, V = torch.linalg.eigh(H)
    v1 = V[:, -1]
    eye = torch.eye(2, dtype=torch.float64)
    return {"GD": torch.zeros(2, 2, dtype=torch.float64), "GLD const": eye,
            "GLD diag": torch.diag(torch.diag(H)),
            "GLD leading-1": lam[-1] * torch.outer(v1, v1) + lam[0] / 2 * eye,
            "GLD Hessian": H, "GLD 1st eigvec(H)": torch.outer(v1, v1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--noise", type=float, default=0.01, help="Tr(Sigma) = E|eps|^2 per step")
    ap.add_argument("--out", default=str(FIG / "diag_escape2d.png"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    H = torch.autograd.functional.hessian(loss, MU1)
    results = {}
    traj = {}
    for name, C in noise_shapes(H).items():
        tr = float(C.trace())
        Sig = C * (a.noise / tr) if tr > 0 else C
        ind = escape_indicator(H, Sig) if tr > 0 else {"trace": 0.0, "ratio": float("nan")}
        L = torch.linalg.cholesky(Sig + 1e-15 * torch.eye(2, dtype=torch.float64))
        g = torch.Generator().manual_seed(0)
        w = MU1.expand(a.runs, 2).clone()
        frac = []
        path = [w[0].clone()]
        for _ in range(a.steps):
            w = w - a.lr * grad_loss(w) + torch.randn(a.runs, 2, generator=g,
                                                      dtype=torch.float64) @ L.T
            q1, q2 = quads(w)
            frac.append(float((q2 < q1).double().mean()))
            path.append(w[0].clone())
        results[name] = {"trace_H_Sigma": ind["trace"], "ratio": ind["ratio"],
                         "escaped_final": frac[-1], "escaped_half": frac[a.steps // 2 - 1]}
        traj[name] = (frac, torch.stack(path).numpy())
        print(f"{name:18s} Tr(H Sigma)={ind['trace']:.4f} ratio={ind['ratio']:.3f} "
              f"escaped after {a.steps // 2}: {frac[a.steps // 2 - 1]:.3f}, after {a.steps}: "
              f"{frac[-1]:.3f}", flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.4))
    gx = np.linspace(-2.5, 2, 200)
    GX, GY = np.meshgrid(gx, gx)
    Z = loss(torch.tensor(np.stack([GX, GY], -1))).numpy()
    ax0.contour(GX, GY, Z, levels=30, cmap="viridis", linewidths=0.7)
    for name in ("GLD const", "GLD Hessian", "GLD 1st eigvec(H)"):
        ax0.plot(*traj[name][1].T, lw=0.6, label=name)
    ax0.plot([1, -1], [1, -1], "k*", ms=10)
    ax0.set_title("loss contours, one run each (sharp min (1,1), flat min (-1,-1))", fontsize=9)
    ax0.legend(fontsize=7)
    for name, (frac, _) in traj.items():
        ax1.plot(np.arange(1, a.steps + 1), frac,
                 label=f"{name} (Tr(HΣ)/Tr(HΣ_iso)={results[name]['ratio']:.2f})")
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("fraction of runs in the flat basin")
    ax1.set_title(f"escape from the sharp minimum, lr={a.lr}, Tr(Σ)={a.noise}, "
                  f"{a.runs} runs", fontsize=9)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    Path(a.out).with_suffix(".json").write_text(json.dumps({"args": vars(a), "results": results},
                                                          indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
