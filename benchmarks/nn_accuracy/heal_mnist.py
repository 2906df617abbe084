"""MNIST networks pruned once, then healed by distillation from the dense network, against the
same epochs of training with the labels from the pruned start.

The reference networks of the one-shot benchmarks (``oneshot_references.sh``): LeNet-300-100
(20 epochs) and LeNet-5-Caffe (10 epochs). Cells:

- ``lenet300``: unstructured, ``prune_oneshot`` from 1,024 training images at 5% of the weights
  (``admm``, ``allocation="penalty"``: the best 5% cell of the one-shot table) and at 2:4
  (``sparsegpt``), the masks held through the training;
- ``lenet5``: by channel and neuron (``prune_structured(..., granularity=("channel", "neuron"),
  method="ziplm", allocation="uniform", target_params=18224)``: the widths of the training-based
  row of RESULTS "Structured sparsity", 18,224 parameters and 138,600 MACs), the compact model
  trained.

Each pruned network is then trained for ``--epochs`` epochs of the 48,000 training images
(batch 128) two ways, every learning rate of ``--lrs``, the rate of each way chosen on the
validation split:

- ``heal``: ``dualdrop.train.heal(pruned, dense, train images)``: KL to the dense network's
  logits (temperature 2), AdamW with 5% warm-up and a cosine decay; the images only, no label;
- ``labels``: cross-entropy on the labels, the same optimizer, schedule and steps (``heal``'s
  loop with the teacher replaced by the labels, so nothing differs but the target).

``--label-weight a`` mixes the labels into ``heal`` (``label_weight=a``: ``(1 - a)`` KL plus
``a`` cross-entropy); ``--ref`` heals from another dense network, e.g. one trained by
``heal_reference.py`` (longer, regularized: the teacher a user would have); ``--seed`` the
batch order (the table averages a cell over its seeds).

Recorded per cell: validation and test error, whether every mask is unchanged, the CPU seconds.
One JSON line per cell to ``--out`` (resumable); ``--tables`` prints the table. ::

    python3 benchmarks/nn_accuracy/heal_mnist.py --net lenet300 \\
        --ref results/oneshot/ref/lenet300 --data-dir ../shared/mnist --out results/heal/mnist.jsonl
    python3 benchmarks/nn_accuracy/heal_mnist.py --tables --out results/heal/mnist.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_networks import MNISTNet, allocation_kwargs  # noqa: E402
from structured_oneshot_cnn import macs  # noqa: E402

from dualdrop.nn import prune_oneshot  # noqa: E402
from dualdrop.nn.oneshot import prune_structured  # noqa: E402
from dualdrop.train import heal  # noqa: E402

CELLS = {"lenet300": ["0.05", "2:4"], "lenet5": ["params:18224"]}
LAYERS = ["fc1", "fc2", "fc3"]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Labels(nn.Module):
    """A 'teacher' that returns the one-hot labels of a batch as logits scaled so that the KL
    at temperature 1 is the cross-entropy: the batch carries ``(images, labels)`` and the
    forward reads the labels (the ``labels`` way: heal's loop, the labels as the target)."""

    def forward(self, y):
        return torch.log(F.one_hot(y, 10).float().clamp_min(1e-30))


def pruned(net, spec, target, method=None, layers=None, allocation=None):
    """``(dense, pruned, masks)``: ``method`` (``NAME`` or ``NAME+polish``; default ``admm``
    at a density, ``sparsegpt`` at N:M) with the ``penalty`` allocation, or, with ``layers``
    (one density per layer, forward order), each layer pruned to its own density in turn
    (``include=[layer]``: the later layers see the earlier ones pruned). LeNet-5: by channel
    and neuron, ``method`` (default ``ziplm``) with ``allocation`` (default ``uniform``: the
    widths of the training-based row; ``penalty:energy``: the penalty allocation with
    ``normalize="energy"``), the compact model."""
    dense = net.load().eval()
    m = copy.deepcopy(dense)
    if spec == "lenet5":
        res = prune_structured(m, list(net.calib.split(128)), method or "ziplm",
                               granularity=("channel", "neuron"),
                               **allocation_kwargs(allocation or "uniform"),
                               target_params=int(target.split(":")[1]), progress=False)
        return dense, res.compact(net.Xte[:128]), None
    kw = {"pattern": target} if ":" in target else {"target_density": float(target)}
    name, alloc = ("sparsegpt", "uniform") if ":" in target else ("admm", "penalty")
    name = method or name
    opts = {"polish": True} if name.endswith("+polish") else None
    name = name.split("+")[0]
    if layers and ":" not in target:
        masks = {}
        for layer, d in zip(LAYERS, layers):
            res = prune_oneshot(m, net.calib, name, target_density=d, include=[layer],
                                options=opts, progress=False)
            masks.update(res.masks)
        return dense, m, masks
    res = prune_oneshot(m, net.calib, name, allocation=alloc, options=opts, progress=False,
                        **kw)
    return dense, m, res.masks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", choices=list(CELLS), default="lenet300")
    ap.add_argument("--ref", default=None)
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--targets", nargs="+", default=None)
    ap.add_argument("--ways", nargs="+", default=["heal", "labels"])
    ap.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-3])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=2.0, help="heal's KL temperature")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--method", default=None,
                    help="one-shot method (NAME or NAME+polish; default admm, 2:4 sparsegpt)")
    ap.add_argument("--layer-densities", type=float, nargs=2, default=None, metavar=("FC2", "FC3"),
                    help="LeNet-300-100 at a density: fc2's and fc3's densities, fc1 the rest "
                    "of the budget (default: the penalty allocation)")
    ap.add_argument("--allocation", default=None,
                    help="LeNet-5: prune_structured's allocation (default uniform; "
                    "penalty:energy: the penalty allocation with normalize='energy')")
    ap.add_argument("--label-weight", type=float, default=0.0,
                    help="heal's label_weight: the labels' cross-entropy mixed in (0: images only)")
    ap.add_argument("--seed", type=int, default=0, help="heal's batch order")
    ap.add_argument("--out", default="results/heal/mnist.jsonl")
    ap.add_argument("--tables", action="store_true")
    args = ap.parse_args(argv)
    if args.tables:
        return tables(args.out)
    torch.set_num_threads(1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    done = {json.loads(line)["key"] for line in open(args.out)} if os.path.exists(args.out) \
        else set()
    net = MNISTNet(Path(args.ref or f"results/oneshot/ref/{args.net}"), args.data_dir, args.calib)
    for target in args.targets or CELLS[args.net]:
        base = None
        for way in args.ways:
            for lr in args.lrs:
                start = {k: v for k, v in (("method", args.method),
                                           ("layers", _layers(args, target)),
                                           ("allocation", args.allocation),
                                           ("ref", args.ref),
                                           ("label_weight", args.label_weight
                                            if way == "heal" else 0),
                                           ("seed", args.seed)) if v}
                key = json.dumps([args.net, target, way, lr, args.epochs, args.calib]
                                 + ([args.temperature, args.batch_size]
                                    if (args.temperature, args.batch_size) != (2.0, 128) else [])
                                 + ([start] if start else []))
                if key in done:
                    continue
                if base is None:
                    base = pruned(net, args.net, target, args.method, start.get("layers"),
                                  args.allocation)
                dense, student, masks = (base[0], copy.deepcopy(base[1]),
                                         copy.deepcopy(base[2]))
                before = net.errors(student)
                c0 = cpu()
                pairs = list(zip(net.Xtr.split(args.batch_size), net.ytr.split(args.batch_size)))
                if way == "heal":
                    heal(student, dense, pairs if args.label_weight else net.Xtr,
                         epochs=args.epochs, batch_size=args.batch_size, lr=lr, masks=masks,
                         loss="kl", temperature=args.temperature,
                         label_weight=args.label_weight, seed=args.seed, progress=False)
                else:
                    heal(student, _Labels(), pairs, epochs=args.epochs, lr=lr, masks=masks,
                         loss="kl", temperature=1.0, forward_fn=_feed, seed=args.seed,
                         progress=False)
                secs = cpu() - c0
                after = net.errors(student)
                kept = None
                if masks is not None:
                    named = dict(student.named_parameters())
                    kept = all(torch.equal(named[n].detach() != 0, m) for n, m in masks.items())
                row = {"key": key, "net": args.net, "target": target, "way": way, "lr": lr,
                       "epochs": args.epochs, "temperature": args.temperature,
                       "batch_size": args.batch_size, "val_before": before["val"],
                       "test_before": before["test"], "val": after["val"], "test": after["test"],
                       "masks_unchanged": kept, "cpu_s": secs,
                       "params": sum(int((p != 0).sum()) for p in student.parameters()),
                       "dense_test": net.errors(dense)["test"], "load": os.getloadavg()[0],
                       "method": args.method, "layers": start.get("layers"),
                       "allocation": args.allocation, "ref": str(net.ref),
                       "label_weight": args.label_weight if way == "heal" else None,
                       "dense_val": net.errors(dense)["val"], "macs": macs(student, net.Xte[:4]),
                       "seed": args.seed}
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)


def _layers(args, target):
    """fc1's, fc2's and fc3's densities when ``--layer-densities`` gives fc2's and fc3's: fc1
    keeps the rest of ``target``'s budget of the three layers' weights, exactly."""
    if args.layer_densities is None or ":" in target or args.net != "lenet300":
        return None
    sizes = [784 * 300, 300 * 100, 100 * 10]
    d2, d3 = args.layer_densities
    rest = round(float(target) * sum(sizes)) - round(d2 * sizes[1]) - round(d3 * sizes[2])
    return [rest / sizes[0], d2, d3]


def _feed(model, batch):
    """The ``labels`` way's forward: images to the student, labels to the label 'teacher'."""
    x, y = batch
    return model(y) if isinstance(model, _Labels) else model(x)


def _start(r) -> str:
    """The one-shot start of a row: method and allocation (or the three layers' densities)."""
    if r["net"] != "lenet300":
        return f"{r.get('method') or 'ziplm'}, {r.get('allocation') or 'uniform'}"
    method = r.get("method") or ("sparsegpt" if ":" in r["target"] else "admm")
    if r.get("layers"):
        return f"{method}, " + "/".join(f"{100 * d:.1f}" for d in r["layers"]) + "%"
    return f"{method}, {'uniform' if ':' in r['target'] else 'penalty'}"


def tables(path):
    """The best cell of each (teacher, start, training) by validation error; a cell run with
    several ``--seed`` values (heal's batch order) shows the means over them, the range of the
    test errors and the count."""
    cells, seen = {}, set()
    for r in map(json.loads, open(path)):
        cell = (r["net"], r.get("ref"), r["target"], r["way"], _start(r), r["lr"], r["epochs"],
                r.get("batch_size", 128), r.get("label_weight") or 0,
                r.get("temperature", 2.0) if r["way"] == "heal" else None)  # labels: no T
        if (cell, r.get("seed", 0)) not in seen:
            seen.add((cell, r.get("seed", 0)))
            cells.setdefault(cell, []).append(r)
    best = {}
    for rs in cells.values():
        r = dict(rs[0], val=sum(x["val"] for x in rs) / len(rs),
                 test=sum(x["test"] for x in rs) / len(rs), tests=[x["test"] for x in rs])
        k = (r["net"], r.get("ref") or "", r["target"], r["way"], _start(r), r["epochs"],
             r.get("batch_size", 128), r.get("label_weight") or 0)
        if k not in best or r["val"] < best[k]["val"]:
            best[k] = r
    print("| network | teacher: val / test | target | one-shot start | training | epochs | batch "
          "| lr, T (by validation) | test before | val after | test after | masks unchanged "
          "| CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in sorted(best):
        r = best[k]
        t = "" if r["way"] == "labels" else f", T={r.get('temperature', 2.0):g}"
        t += f", a={r['label_weight']:g}" if r.get("label_weight") else ""
        dv = f"{100 * r['dense_val']:.2f}%" if r.get("dense_val") is not None else "-"
        teacher = f"{Path(r['ref']).name if r.get('ref') else 'oneshot ref'}: {dv} / {100 * r['dense_test']:.2f}%"
        print(f"| {r['net']} | {teacher} | {r['target']} | {k[4]} | {r['way']} | {r['epochs']} | "
              f"{r.get('batch_size', 128)} | {r['lr']:g}{t} | "
              f"{100 * r['test_before']:.2f}% | {100 * r['val']:.2f}% | {_test(r['tests'])} | "
              f"{'' if r['masks_unchanged'] is None else r['masks_unchanged']} | "
              f"{r['cpu_s']:.0f} |")


def _test(tests) -> str:
    """A cell's test error: the mean, and over several seeds the range and the count."""
    mean = 100 * sum(tests) / len(tests)
    if len(tests) == 1:
        return f"{mean:.2f}%"
    return f"{mean:.2f}% ({100 * min(tests):.2f}-{100 * max(tests):.2f}, {len(tests)} seeds)"


if __name__ == "__main__":
    main()
