"""A dense MNIST reference trained the way a user would train the model they then prune: longer,
with dropout, weight decay and a cosine schedule, the recipe chosen on the validation split.

The references of the one-shot tables (``oneshot_references.sh``: the paper's protocol, Adam with
a linear decay, no regularization) are the start of the pruning benchmarks; a teacher for
healing (``heal_mnist.py``) is better the better it generalizes, and the student healed from
the short-trained LeNet-300-100 sat at that network's validation error. This script trains
LeNet-300-100 or LeNet-5-Caffe (``dualdrop.train.models``: the same architectures, the same
parameters; dropout is applied by forward pre-hooks on the inputs of the layers, so the saved
network is the plain architecture) with

- AdamW (``--lr``, ``--wd``), batch 128, a linear warm-up of one epoch then a cosine decay to 0;
- dropout of ``--dropout`` on the inputs of every layer after the first (the hidden units) and
  of ``--in-dropout`` on the image;
- optionally ``--shift`` pixels of random translation of each training image (off by default).

The run folder is what ``dualdrop.train.load_run`` reads (``config.json`` with the data split's
seed and fingerprint, ``final.json`` with the architecture and the errors, ``model.pt``), so
``heal_mnist.py --ref FOLDER`` heals from it. A checkpoint after every epoch (atomic): a killed
run resumes where it stopped; a finished folder is skipped. ::

    python3 benchmarks/nn_accuracy/heal_reference.py --net lenet300 --epochs 30 --dropout 0.5 \\
        --in-dropout 0.2 --wd 0.01 --lr 0.001 --out results/heal/ref/lenet300-d5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.data import load_dataset
from dualdrop.train.checkpoint import atomic_save
from dualdrop.train.evaluate import error_rate
from dualdrop.train.export import build

CK = "checkpoint.pt"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def with_dropout(net: nn.Module, p_in: float, p_hidden: float) -> list:
    """Dropout on the input of every Linear/Conv2d layer while ``net.training``: ``p_in`` on the
    first layer's, ``p_hidden`` on the others'. Returns the hook handles."""
    layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    handles = []
    for i, layer in enumerate(layers):
        p = p_in if i == 0 else p_hidden
        if p > 0:
            handles.append(layer.register_forward_pre_hook(
                lambda m, a, p=p: (F.dropout(a[0], p, m.training),) + tuple(a[1:])))
    return handles


def shifted(x: torch.Tensor, px: int, g: torch.Generator) -> torch.Tensor:
    """Each 28x28 image of ``x`` (flat rows) translated by up to ``px`` pixels each way (zeros
    shifted in)."""
    n = len(x)
    img = F.pad(x.view(n, 1, 28, 28), (px, px, px, px))
    dx = torch.randint(0, 2 * px + 1, (n,), generator=g)
    dy = torch.randint(0, 2 * px + 1, (n,), generator=g)
    out = torch.empty(n, 1, 28, 28)
    for i in range(n):
        out[i] = img[i, :, dy[i]:dy[i] + 28, dx[i]:dx[i] + 28]
    return out.view(n, -1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", choices=["lenet300", "lenet5"], default="lenet300")
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--in-dropout", type=float, default=0.2)
    ap.add_argument("--shift", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0, help="initialization and batch order")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    if (out / "final.json").exists():
        print(f"{out}: finished")
        return
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    data = load_dataset(args.data_dir, seed=0, val_fraction=0.2)
    Xtr, ytr = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    Xva, yva = torch.from_numpy(data.X_val), torch.from_numpy(data.y_val)
    Xte, yte = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
    arch = {"name": args.net, "n_features": 784, "n_classes": 10}
    torch.manual_seed(args.seed)
    net = build(arch)
    with_dropout(net, args.in_dropout, args.dropout)
    decay = [p for p in net.parameters() if p.dim() >= 2]
    rest = [p for p in net.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr)
    per = math.ceil(len(Xtr) / args.batch_size)
    total, warm = args.epochs * per, per

    def factor(s):
        return (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm)
                                                                  / max(1, total - warm)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    g = torch.Generator().manual_seed(args.seed)
    history, epoch, secs = [], 0, 0.0
    if (out / CK).exists():
        ck = torch.load(out / CK, weights_only=True)
        net.load_state_dict(ck["net"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        g.set_state(ck["gen"])
        history, epoch, secs = ck["history"], ck["epoch"], ck["cpu_s"]
    while epoch < args.epochs:
        c0 = cpu()
        net.train()
        order = torch.randperm(len(Xtr), generator=g)
        for idx in order.split(args.batch_size):
            x = Xtr[idx]
            if args.shift:
                x = shifted(x, args.shift, g)
            loss = F.cross_entropy(net(x), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        net.eval()
        epoch += 1
        secs += cpu() - c0
        history.append({"epoch": epoch, "loss": float(loss), "val_error": error_rate(net, Xva, yva)})
        print(json.dumps(history[-1]), flush=True)
        atomic_save({"net": net.state_dict(), "opt": opt.state_dict(),
                     "sched": sched.state_dict(), "gen": g.get_state(), "history": history,
                     "epoch": epoch, "cpu_s": secs}, out / CK)
    recipe = {k: getattr(args, k) for k in ("epochs", "lr", "wd", "dropout", "in_dropout",
                                             "shift", "batch_size", "seed")}
    (out / "config.json").write_text(json.dumps(
        {"seed": 0, "val_fraction": 0.2, "data_fingerprint": data.fingerprint(),
         "data": "mnist", "recipe": recipe}, indent=1))
    torch.save(net.state_dict(), out / "model.pt")
    final = {"status": "finished", "architecture": arch, "recipe": recipe,
             "val_error": error_rate(net, Xva, yva), "test_error": error_rate(net, Xte, yte),
             "cpu_s": secs}
    (out / "final.json").write_text(json.dumps(final, indent=1))
    print(json.dumps(final), flush=True)


if __name__ == "__main__":
    main()
