"""Weak first-order check of dropout's stochastic modified equation (Zhang, Xu et al., ICLR 2024).

Dropout-SGD (full batch; one Bernoulli mask per step, keep probability p, inverted scaling)

    theta_{k+1} = theta_k - lr * grad L_drop(theta_k; eta_k)

against the Euler--Maruyama discretization (step lr / SUB) of

    d theta = -grad L_S(theta) dt + sqrt(lr) S(theta)^{1/2} dW,   t in [0, T],  T = steps * lr,

from the same start, where ``L_S`` is ``dualdrop.diagnostics.modified_loss`` and ``S(theta)`` the
covariance of the dropout gradient.  Masks are enumerated exactly (2^units of them), so
``grad L_S = sum_m pi_m g_m`` (checked against autograd of the closed-form L_S every step) and
``S^{1/2} z`` is realized as ``sum_m sqrt(pi_m) (g_m - gbar) z_m`` (covariance exactly S, no
matrix square root).  The "naive" SDE has drift ``grad L`` (no dropout correction) and the same
diffusion.  For each lr the weak error ``|E phi(theta_T^alg) - E phi(X_T)|`` is averaged over
``R`` independent runs simulated as one batch, for phi in {theta_1, |theta|^2, L(theta)}.

    python3 benchmarks/diagnostics/diag_sde.py            # ~10 min on a loaded core; figure diag_weak_error.png
    python3 benchmarks/diagnostics/diag_sde.py --quick    # fewer runs, a smoke test
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from dualdrop.diagnostics import dropout_loss, modified_loss, plain_loss

FIG = Path(__file__).resolve().parent / "figures"


def problems():
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 2, 8, dtype=torch.float64)
    # linear regression, 3 unstandardized features, dropout on the inputs
    Xl = torch.stack([x, x ** 2 - 1, torch.ones_like(x)], 1)
    yl = 1.5 * x - 0.5 * x ** 2 + 0.3 * torch.randn(8, generator=g, dtype=torch.float64)
    lin = dict(name="linear regression (d=3, p=0.7)", kind="linear", X=Xl, y=yl, p=0.7,
               theta0=torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), units=3,
               lrs=[0.2, 0.1, 0.05, 0.025])
    # two-layer tanh network, 4 hidden units, dropout on the hidden units
    X2 = torch.stack([x, torch.ones_like(x)], 1)
    y2 = torch.sin(1.3 * x)
    W0 = torch.tensor([[1.0, 0.2], [-0.7, 0.1], [0.4, -0.3], [1.5, 0.5]], dtype=torch.float64)
    a0 = torch.tensor([0.5, -0.4, 0.8, 0.3], dtype=torch.float64)
    two = dict(name="two-layer tanh net (m=4, p=0.6)", kind="two_layer", X=X2, y=y2, p=0.6,
               theta0=torch.cat([W0.reshape(-1), a0]), units=4, lrs=[0.2, 0.1, 0.05])
    return [lin, two]


def split(theta, prob):
    if prob["kind"] == "linear":
        return theta
    m = prob["units"]
    W = theta[..., : 2 * m].reshape(*theta.shape[:-1], m, 2)
    return (W, theta[..., 2 * m:])


def masks_and_probs(prob):
    M = torch.tensor(list(itertools.product([0.0, 1.0], repeat=prob["units"])),
                     dtype=torch.float64)
    p = prob["p"]
    pi = (p ** M.sum(1)) * ((1 - p) ** (prob["units"] - M.sum(1)))
    return M, pi


def per_mask_grads(theta, prob, M):
    """Gradients ``g_m(theta_r)`` for every run r and mask m, shape ``(R, n_masks, D)``, by hand
    (the hidden activations do not depend on the mask, so they are computed once); checked against
    autograd of ``dropout_loss`` in ``simulate``."""
    X, y, p = prob["X"], prob["y"], prob["p"]
    n = X.shape[0]
    S = M / p                                                   # (masks, units)
    if prob["kind"] == "linear":
        A, b = X.T @ X / n, X.T @ y / n
        Wm = theta[:, None, :] * S[None]                        # D_m w
        return S[None] * (Wm @ A - b)                           # D_m (A D_m w - b)
    W, a = split(theta, prob)
    h = torch.tanh(torch.einsum("nj,rkj->rnk", X, W))           # (R, n, units)
    e = torch.einsum("rnk,mk->rmn", h * a[:, None, :], S) - y   # residual per mask
    ga = torch.bmm(e, h) * S / n
    B = ((1 - h ** 2)[..., None] * X[None, :, None, :]).reshape(h.shape[0], n, -1)
    gW = torch.bmm(e, B).reshape(*e.shape[:2], *W.shape[1:]) * (a[:, None, :] * S)[..., None] / n
    return torch.cat([gW.reshape(*gW.shape[:2], -1), ga], -1)


def per_mask_grads_autograd(theta, prob, M):
    th = theta.detach().unsqueeze(1).expand(-1, M.shape[0], -1).clone().requires_grad_(True)
    L = dropout_loss(split(th, prob), prob["X"], prob["y"], prob["p"], M, kind=prob["kind"])
    return torch.autograd.grad(L.sum(), th)[0]


def grad_of(fn, theta, prob):
    th = theta.detach().clone().requires_grad_(True)
    return torch.autograd.grad(fn(split(th, prob)).sum(), th)[0]


def phis(theta, prob):
    L = plain_loss(split(theta, prob), prob["X"], prob["y"], kind=prob["kind"])
    return torch.stack([theta[:, 0], (theta ** 2).sum(1), L], 1)


def simulate(prob, lr, T, R, sub, gen):
    M, pi = masks_and_probs(prob)
    X, y, p, kind = prob["X"], prob["y"], prob["p"], prob["kind"]
    steps = round(T / lr)
    th0 = prob["theta0"].expand(R, -1).clone()
    # the algorithm
    th = th0.clone()
    for _ in range(steps):
        idx = torch.multinomial(pi, R, replacement=True, generator=gen)
        th = th - lr * grad_of(lambda q: dropout_loss(q, X, y, p, M[idx], kind=kind), th, prob)
    out = {"alg": phis(th, prob)}
    # the SDE (with the L_S drift) and the naive SDE (drift grad L), Euler--Maruyama step lr/sub
    h = lr / sub
    for label, drift in (("sde", lambda q: modified_loss(q, X, y, p, kind=kind)),
                         ("naive", lambda q: plain_loss(q, X, y, kind=kind))):
        th = th0.clone()
        for k in range(steps * sub):
            G = per_mask_grads(th, prob, M)
            gbar = torch.einsum("m,rmd->rd", pi, G)
            if label == "sde" and k == 0:
                err = float((G[:64] - per_mask_grads_autograd(th[:64], prob, M)).abs().max())
                assert err < 1e-10, f"hand-written per-mask gradients are off by {err}"
                err = float((gbar - grad_of(drift, th, prob)).abs().max())
                assert err < 1e-10, f"grad L_S != mean dropout gradient ({err})"
            z = torch.randn(R, M.shape[0], generator=gen, dtype=torch.float64)
            noise = torch.einsum("rm,rmd->rd", z * pi.sqrt(), G - gbar[:, None])
            th = th - h * grad_of(drift, th, prob) + math.sqrt(lr * h) * noise
        out[label] = phis(th, prob)
    res = {}
    for label in ("sde", "naive"):
        diff = out["alg"].mean(0) - out[label].mean(0)
        se = (out["alg"].var(0) / R + out[label].var(0) / R).sqrt()
        res[label] = {"err": diff.abs().tolist(), "se": se.tolist()}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--T", type=float, default=1.0)
    ap.add_argument("--sub", type=int, default=2, help="Euler-Maruyama substeps per lr")
    ap.add_argument("--lrs", type=float, nargs="+", default=None,
                    help="learning rates (default 0.2 .. 0.025 for the linear problem, "
                    "0.2 .. 0.05 for the network)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(FIG / "diag_weak_error.png"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.quick:
        a.runs, a.lrs = 5_000, [0.2, 0.1]
    gen = torch.Generator().manual_seed(0)
    table = {}
    for prob in problems():
        rows = []
        for lr in a.lrs or prob["lrs"]:
            t0 = time.time()
            r = simulate(prob, lr, a.T, a.runs, a.sub, gen)
            rows.append({"lr": lr, **r})
            print(f"{prob['name']}: lr={lr:g} weak error (theta_1, |theta|^2, L): SDE "
                  + ", ".join(f"{e:.2e}" for e in r["sde"]["err"]) + " | naive "
                  + ", ".join(f"{e:.2e}" for e in r["naive"]["err"])
                  + f" | 2se {2 * max(r['sde']['se']):.1e} ({time.time() - t0:.1f}s)", flush=True)
        table[prob["name"]] = rows
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    summary = {}
    for ax, (name, rows) in zip(axes, table.items()):
        lrs = np.array([r["lr"] for r in rows])
        for label, style in (("sde", "o-"), ("naive", "s--")):
            err = np.array([max(r[label]["err"]) for r in rows])
            se = np.array([max(r[label]["se"]) for r in rows])
            slope = float(np.polyfit(np.log(lrs), np.log(err), 1)[0])
            summary[f"{name} / {label}"] = slope
            lab = ("SDE with modified loss L_S" if label == "sde" else "naive SDE (drift grad L)")
            ax.errorbar(lrs, err, yerr=2 * se, fmt=style, capsize=3,
                        label=f"{lab}: slope {slope:.2f}")
        ref = max(rows[0]["sde"]["err"])
        ax.loglog(lrs, ref * lrs / lrs[0], ":", color="gray", label="slope 1")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("max over phi of |E phi(alg) - E phi(SDE)| at T")
        ax.set_title(name, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"Dropout-SGD vs its SDE: weak error at T={a.T:g}, {a.runs} runs per point, "
                 f"EM step lr/{a.sub}", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(json.dumps({"slopes": summary}, indent=1))
    Path(a.out).with_suffix(".json").write_text(json.dumps(
        {"args": vars(a), "table": table, "slopes": summary}, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
