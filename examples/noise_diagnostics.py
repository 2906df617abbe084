"""Dropout noise against SGD noise along training, measured against the Hessian.

A 64-32-10 MLP with variational dropout (``vardrop``) on scikit-learn's digits. Every 60 steps
``dualdrop.diagnostics.measure`` computes, on 256 fixed training images: the top Hessian
eigenvalue, the escaping indicator Tr(H Sigma) of the minibatch (SGD) noise and of the dropout
noise, and the cosine of each noise covariance with the Hessian (a random direction's cosine is
near 0). The math: docs/diagnostics.md.

    python examples/noise_diagnostics.py --out results/examples
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dualdrop.data import load_digits_dataset  # noqa: E402
from dualdrop.diagnostics import measure  # noqa: E402
from dualdrop.nn import sparsify  # noqa: E402


def main(out: Path, steps: int = 300, every: int = 60) -> Path:
    d = load_digits_dataset()
    X, y = torch.from_numpy(d.X_train), torch.from_numpy(d.y_train)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    sp = sparsify(model, "vardrop")
    opt = torch.optim.Adam(sp.method_param_groups(1e-2, steps))
    g = torch.Generator().manual_seed(0)
    rows = []
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(y), (32,), generator=g)
        loss = F.cross_entropy(model(X[idx]), y[idx]) + sp.regularizer(len(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, steps)
        if step % every == 0:
            state = torch.get_rng_state()  # measure seeds torch's generator: keep training's
            s = measure(model, F.cross_entropy, X[:256], y[:256], sp, k=3, batch_size=32,
                        population=len(y))
            torch.set_rng_state(state)
            rows.append((step, s))
            print(f"step {step}: lambda_1 {s['lambda_1']:.3g}  Tr(H S) SGD {s['sgd_trace']:.3g} "
                  f"dropout {s['drop_trace']:.3g}  cos SGD {s['sgd_cosine']:.2f} "
                  f"dropout {s['drop_cosine']:.2f}")
    steps_x = [r[0] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].plot(steps_x, [r[1]["lambda_1"] for r in rows], "o-", color="k")
    axes[0].set(title="sharpness", ylabel="top Hessian eigenvalue λ1")
    for key, lab, col in (("sgd", "SGD (minibatch) noise", "C0"), ("drop", "dropout noise", "C1")):
        axes[1].plot(steps_x, [r[1][f"{key}_trace"] for r in rows], "o-", color=col, label=lab)
        axes[2].plot(steps_x, [r[1][f"{key}_cosine"] for r in rows], "o-", color=col, label=lab)
    axes[2].plot(steps_x, [r[1]["drop_null_cosine"] for r in rows], ":", color="0.4",
                 label="a random direction (null)")
    axes[1].set(title="escaping indicator", ylabel="Tr(H Σ)", yscale="log")
    axes[2].set(title="alignment with the Hessian", ylabel="cos(H, Σ)", ylim=(0, 1))
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "noise_diagnostics.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/examples"))
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    main(a.out, a.steps)
