"""Fine-tune the surviving weights of a finished sparsify run with the regularizer off.

A sparsity-inducing penalty shrinks the weights it keeps as well as the ones it removes (for the
eta-trick the survivors see the ridge ``lam w^2 / eta``); retraining the survivors on the data
loss alone, with the pruning mask fixed, is the last step of magnitude pruning with retraining
(Han, Pool, Tran & Dally, "Learning both Weights and Connections for Efficient Neural Networks",
2015). This script does that for any finished run: it folds the run's test-time mask at a
tolerance (``--tol``, default: the sparsest one whose *validation* error in the run's
``val_tol_sweep`` is at most ``--margin`` above the trained one), trains the plain network with
Adam (learning rate decayed linearly to 0, batch 128) on the run's training split with every
pruned weight held at 0, keeps the epoch of lowest validation error (epoch 0, the network
before fine-tuning, included) and reads the test set once, for that epoch only. ``--epochs 0``
only reports the test error at the validation-chosen tolerance (no training).

Usage (from the repository root)::

    python3 benchmarks/nn_accuracy/finetune_eta_survivors.py results/eta_released_dual/seed0 \
        --data-dir data/mnist --epochs 20 --lr 1e-4 --out results/finetune_eta.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dualdrop.data.datasets import load_dataset  # noqa: E402
from dualdrop.nn import export_sparse  # noqa: E402
from dualdrop.train import error_rate  # noqa: E402
from dualdrop.train.checkpoint import read_checkpoint  # noqa: E402
from dualdrop.train.export import training_network  # noqa: E402


def choose_tol(final: dict, margin: float) -> float:
    """The sparsest swept tolerance whose validation error is within ``margin`` of the trained
    one (validation only)."""
    sweep = final.get("val_tol_sweep") or []
    if not sweep:
        raise ValueError("the run has no val_tol_sweep in final.json; pass --tol")
    ok = [r for r in sweep if r["error"] <= final["val_error"] + margin]
    return max(ok, key=lambda r: r["tol"])["tol"] if ok else float(final["hparams"]["tol"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a finished dualdrop sparsify run folder")
    ap.add_argument("--data-dir", required=True, help="the MNIST IDX folder the run used")
    ap.add_argument("--tol", type=float, default=None, help="test-time tolerance to fold")
    ap.add_argument("--margin", type=float, default=0.001,
                    help="validation margin for choosing the tolerance (default 0.001)")
    ap.add_argument("--epochs", type=int, default=20, help="fine-tuning epochs (0: none)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSON file for the result")
    a = ap.parse_args(argv)
    if a.epochs < 0 or not a.lr > 0:
        raise SystemExit("--epochs must be >= 0 (0: only the chosen tolerance's test error) and "
                         "--lr > 0")
    torch.set_num_threads(1)
    run = Path(a.run)
    final = json.loads((run / "final.json").read_text())
    ck = read_checkpoint(run / "checkpoint.pt", fix="rerun the training")
    conf = ck["config"]
    data = load_dataset(a.data_dir, seed=conf["seed"], val_fraction=conf["val_fraction"])
    if conf.get("data_fingerprint") != data.fingerprint():
        raise ValueError(f"{run} was trained on other data than {a.data_dir}")
    tol = a.tol if a.tol is not None else choose_tol(final, a.margin)
    net, sp = training_network(ck)
    sp.set_tol(tol)
    density = float(sp.density()["total"])
    net = export_sparse(net, layout="dense")
    masks = {n: (p != 0) for n, p in net.named_parameters() if n.endswith("weight")}
    Xtr, ytr = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    Xva, yva = torch.from_numpy(data.X_val), torch.from_numpy(data.y_val)
    params = [p for p in net.parameters()]
    opt = torch.optim.Adam(params, lr=a.lr)
    steps = max(1, math.ceil(len(ytr) / a.batch_size) * a.epochs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / steps))
    g = torch.Generator().manual_seed(a.seed)
    best = (error_rate(net, Xva, yva), 0, {k: v.clone() for k, v in net.state_dict().items()})
    history = [{"epoch": 0, "val_error": best[0]}]
    t0 = time.perf_counter()
    for epoch in range(1, a.epochs + 1):
        net.train()
        order = torch.randperm(len(ytr), generator=g)
        for i in range(0, len(ytr), a.batch_size):
            idx = order[i:i + a.batch_size]
            loss = F.cross_entropy(net(Xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            with torch.no_grad():
                for n, p in net.named_parameters():
                    if n in masks:
                        p.mul_(masks[n])
        v = error_rate(net, Xva, yva)
        history.append({"epoch": epoch, "val_error": v, "train_loss_last": float(loss.detach())})
        print(f"epoch {epoch}: validation error {100 * v:.2f}%", flush=True)
        if v < best[0]:
            best = (v, epoch, {k: t.clone() for k, t in net.state_dict().items()})
    with torch.no_grad():  # not load_state_dict: export_sparse's copy keeps the sparsified
        for n, p in net.named_parameters():  # layers' legacy-key load hook, which renames keys
            p.copy_(best[2][n])
    nz = sum(int((p != 0).sum()) for n, p in net.named_parameters() if n in masks)
    tot = sum(p.numel() for n, p in net.named_parameters() if n in masks)
    result = {
        "run": str(run), "tol": tol, "nonzero_total_before": density, "nonzero_total": nz / tot,
        "val_error_before": history[0]["val_error"], "chosen_epoch": best[1],
        "val_error": best[0],
        "test_error": error_rate(net, torch.from_numpy(data.X_test),
                                 torch.from_numpy(data.y_test)),
        "epochs": a.epochs, "lr": a.lr, "seconds": time.perf_counter() - t0, "history": history,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"tol {tol}: {100 * result['test_error']:.2f}% test error at "
          f"{result['nonzero_total']:.4f} nonzero (epoch {best[1]} chosen on validation, "
          f"{100 * best[0]:.2f}%; before fine-tuning {100 * history[0]['val_error']:.2f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
