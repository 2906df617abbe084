"""Controlled pair: the eta-trick with and without the dropout noise of its own keep ratios.

The duality (LeJeune, Javadi, Baraniuk, NeurIPS 2021; ``docs/theory.md``) pairs adaptive dropout
at keep ratio ``alpha = eta/(eta + lam)`` with the eta-trick's adaptive Tikhonov penalty
``lam/2 sum w^2/eta``.  The eta-trick keeps the penalty and drops the noise.  This script trains
LeNet-300-100 twice with *the same* eta-trick objective, hyperparameters (lam, eps, decay),
learning rate, schedule, initialization and data order; the only difference is that the arm
``twin-dropout`` multiplies every sparsified weight, in each training forward pass, by
independent Gaussian noise of mean 1 and variance ``(1 - alpha)/alpha = lam/eta = exp(-p)``
(``p = log(eta/lam)`` the eta-trick's learned log-ratio; one draw per minibatch, the variance
capped at ``e^8`` as variational dropout caps its ``alpha``).  This is Gaussian dropout at the
eta-trick's own keep ratios: on a linear layer its expected squared-error loss adds
``lam/2 sum_j x_j^2 w_j^2 / eta_j`` (Zhang, Xu et al., ICLR 2024, the modified loss), a second copy
of the eta-trick's term weighted by the input's second moments; to first order in the learning
rate the noise therefore changes the drift by that term and adds a diffusion.  The noise scale is
detached: ``eta`` follows the same deterministic gradient in both arms, the weights see the
noise.

Both arms are measured every ``--every`` epochs (and at the end) by the training hook's
``dualdrop.train.diagnose_hook.diagnose_row`` on the same fixed validation subset; in both arms
the dropout-noise columns ``diag_drop_*`` describe the noise above at the current weights (for
the noiseless arm: the noise its twin would draw there).  Outputs: ``--runs/twin-eta-trick`` and
``--runs/twin-dropout`` with ``history.json`` in the format of ``dualdrop sparsify`` (drawn by
``benchmarks/diagnostics/diag_methods.py``) and a resumable ``checkpoint.pt`` per epoch.

    python3 benchmarks/diagnostics/diag_twin.py --data-dir data/mnist --epochs 10 --every 2 \\
        --samples 256 --runs results/diag_mnist          # ~15 min on a loaded 2-core machine
    python3 benchmarks/diagnostics/diag_twin.py --summary results/diag_mnist results/diag_mnist_seed1
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dualdrop.data import load_dataset
from dualdrop.nn import default_hparams, sparsify
from dualdrop.nn.methods.penalty.method import PenaltyState
from dualdrop.train.checkpoint import atomic_save, rng_state, set_rng_state, write_history
from dualdrop.train.diagnose_hook import diagnose_row, due
from dualdrop.train.engine import train_step
from dualdrop.train.evaluate import error_rate
from dualdrop.train.loop import epoch_order, make_adam
from dualdrop.train.models import build_model

ARMS = {"twin-eta-trick": False, "twin-dropout": True}
LOG_VAR_CAP = 8.0


def add_noise(sp) -> list:
    """Wrap each eta-trick weight state's training weight with its Gaussian dropout noise; the
    returned states carry a ``noise_on`` flag."""
    states = [m for m in sp.model.modules() if isinstance(m, PenaltyState)] if hasattr(
        sp, "model") else []
    if not states:
        raise RuntimeError("no eta-trick weight state found")
    for st in states:
        base = st.train_weight
        st.noise_on = False

        def noisy(w, st=st, base=base):
            w = base(w)
            if not st.noise_on:
                return w
            std = torch.exp(-0.5 * st.log_ratio.detach().clamp(min=-LOG_VAR_CAP))
            return w * (1.0 + std * torch.randn_like(w))

        st.train_weight = noisy
    return states


def set_noise(states, on: bool) -> None:
    for st in states:
        st.noise_on = on


def run_arm(name: str, noisy: bool, a, data) -> None:
    out = Path(a.runs) / name
    out.mkdir(parents=True, exist_ok=True)
    hp = default_hparams("eta-trick")
    lr = hp.pop("lr")
    torch.manual_seed(a.seed)
    model = build_model("lenet300", data.n_features, data.n_classes)
    sp = sparsify(model, "eta-trick", **hp)
    states = add_noise(sp)
    opt = make_adam([p for p in model.parameters() if p.requires_grad], lr)
    Xtr, ytr = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    Xva, yva = torch.from_numpy(data.X_val), torch.from_numpy(data.y_val)
    n, bs = len(ytr), 128
    spe = math.ceil(n / bs)
    total = spe * a.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
    torch.manual_seed(a.seed + 7919)  # the noise stream, as the training loop seeds it
    history, start = [], 0
    ck_path = out / "checkpoint.pt"
    if ck_path.is_file():
        ck = torch.load(ck_path, map_location="cpu", weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        set_rng_state(ck["rng"], torch.device("cpu"))
        history, start = list(ck["history"]), int(ck["epoch"])
    for epoch in range(start, a.epochs):
        t0 = time.perf_counter()
        model.train()
        set_noise(states, noisy)
        order, step, ce = epoch_order(n, a.seed, epoch), epoch * spe, 0.0
        for b in range(spe):
            idx = order[b * bs:(b + 1) * bs]
            ce_b = F.cross_entropy(model(Xtr[idx]), ytr[idx])
            step = train_step(ce_b, opt, step=step, total_steps=total, sp=sp, scheduler=sched,
                              n_train=n)  # the engine's step
            ce += float(ce_b.detach()) * len(idx)
        row = {"epoch": epoch + 1, "step": step, "train_loss": ce / n,
               "val_error": error_rate(model, Xva, yva),
               "nonzero_total": float(sp.density()["total"]),
               "seconds": time.perf_counter() - t0, "noise": float(noisy)}
        if due(epoch + 1, a.every, a.epochs):
            set_noise(states, True)  # the dropout columns: this noise, in both arms
            row.update(diagnose_row(model, sp, Xva, yva, samples=a.samples, seed=a.seed,
                                    batch_size=bs, n_train=n, device=torch.device("cpu")))
            set_noise(states, noisy)
        history.append(row)
        atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                     "scheduler": sched.state_dict(), "rng": rng_state(torch.device("cpu")),
                     "history": history, "epoch": epoch + 1}, ck_path)
        write_history(out, history)
        print(f"{name} epoch {epoch + 1}: val err {row['val_error']:.4f} nonzero "
              f"{row['nonzero_total']:.3f} " + (f"lambda_1 {row['diag_lambda_1']:.3g} drop/sgd "
              f"Tr(HS) {row['diag_drop_trace'] / row['diag_sgd_trace']:.3g}"
              if "diag_lambda_1" in row else ""), flush=True)
    (out / "final.json").write_text(json.dumps({"arm": name, "noise": noisy, "lr": lr,
                                                "hparams": hp, "epochs": a.epochs}) + "\n")


def summary(dirs: list[str]) -> str:
    """Markdown rows comparing the two arms, per run folder (seed) and diagnosed epoch."""
    head = ("| runs | epoch | arm | val. err | nonzero | λ₁ | Tr(H) | Tr(HΣ_SGD) | SGD cos | "
            "Tr(HΣ_drop)/Tr(HΣ_SGD) | dropout cos |")
    lines = [head, "|" + "---|" * 11]
    for d in dirs:
        files = {arm: Path(d) / arm / "history.json" for arm in ARMS}
        hist = {arm: [r for r in json.loads(f.read_text()) if "diag_n" in r]
                for arm, f in files.items() if f.is_file()}
        for i in range(max((len(h) for h in hist.values()), default=0)):
            for arm, rows in hist.items():
                if i < len(rows):
                    r = rows[i]
                    lines.append(
                        f"| {d} | {r['epoch']} | {arm} | {100 * r['val_error']:.2f}% | "
                        f"{r['nonzero_total']:.3f} | {r['diag_lambda_1']:.2f} | "
                        f"{r['diag_trace_h']:.1f} | {r['diag_sgd_trace']:.3g} | "
                        f"{r['diag_sgd_cosine']:.3f} | "
                        f"{r['diag_drop_trace'] / r['diag_sgd_trace']:.3g} | "
                        f"{r['diag_drop_cosine']:.3f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", nargs="+", metavar="RUNS",
                    help="print the comparison table of these --runs folders and exit")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="results/diag_mnist")
    a = ap.parse_args()
    if a.summary:
        print(summary(a.summary))
        return
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as the training loop: shrinking weights stay fast
    data = load_dataset(a.data_dir, seed=a.seed)
    for name, noisy in ARMS.items():
        if (Path(a.runs) / name / "final.json").is_file():
            print(f"{name}: finished, skipped")
            continue
        run_arm(name, noisy, a, data)


if __name__ == "__main__":
    main()
