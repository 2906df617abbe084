"""The small GPT-2 pruned by heads and neurons in one shot, then healed by distillation from the
dense model: test perplexity per byte against healing CPU-minutes, beside the same steps trained
on the language-model loss alone.

The GPT-2 of the one-shot benchmarks (``oneshot_gpt2.py``: 4 layers, 160 wide, 1.3M parameters,
bytes of the Python standard library's sources, whole modules held out for the validation and
test splits) is pruned once by ``prune_structured(..., granularity=("head", "neuron"))`` from
128 windows of 128 bytes of the training split (``--method``, default ``osscar``, the penalty
allocation with ``normalize="energy"``: the best validation perplexity of the structured one-shot
table at 50%), the compact model kept in ``--work`` (a rerun does not prune again). Each cell then
trains the compact model for ``steps`` batches of 32 fresh training windows (AdamW, 5% warm-up,
cosine decay, gradient norm clipped at 1, through ``dualdrop.train.heal``'s loop):

- ``heal``: ``(1 - a) * T^2 KL(teacher || student)`` of the next-byte distributions at
  temperature ``T`` plus ``a`` times the next-byte cross-entropy of the text (``--label-weights``
  ``a``; 0: distillation alone);
- ``lm``: the next-byte cross-entropy alone (no teacher: what training the pruned model without
  the dense one does, the same loop, steps and schedule).

Validation and test perplexity per byte on 2,048 windows each; the rate (and ``a``) of a row is
chosen on the validation split. CPU seconds of the process for the training (teacher included).
One JSON line per cell to ``--out`` (resumable); ``--tables``. ::

    python3 benchmarks/nn_accuracy/heal_gpt2.py --ref results/oneshot/ref/gpt2 \\
        --steps 100 300 1000 --lrs 1e-3 3e-3 --out results/heal/gpt2.jsonl --work results/heal/gpt2
    python3 benchmarks/nn_accuracy/heal_gpt2.py --tables --out results/heal/gpt2.jsonl
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

from oneshot_networks import GPT2Net, allocation_kwargs  # noqa: E402

from dualdrop.nn import load_compact, save_compact  # noqa: E402
from dualdrop.nn.oneshot import prune_structured  # noqa: E402
from dualdrop.train import heal  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def kd_lm(a: float, temperature: float):
    """``(1 - a) T^2 KL(softmax(t / T) || softmax(s / T)) + a CE(s, next byte)``, per position
    (the last position has no next byte and is left out of both)."""
    def loss(s, t, batch):
        ids = batch["input_ids"]
        s, t = s[:, :-1].float(), t[:, :-1].float()
        total = 0.0
        if a < 1:
            T = temperature
            per = (F.softmax(t / T, -1) * (F.log_softmax(t / T, -1)
                                            - F.log_softmax(s / T, -1))).sum(-1)
            total = total + (1 - a) * T * T * per.mean()
        if a > 0:
            total = total + a * F.cross_entropy(s.reshape(-1, s.shape[-1]),
                                                ids[:, 1:].reshape(-1))
        return total
    return loss


class _NoTeacher(nn.Module):
    """The ``lm`` way's 'teacher': zeros of the logits' shape (the loss does not read them)."""

    def forward(self, input_ids, **_):
        return torch.zeros(*input_ids.shape, 256)


def compact_start(net: GPT2Net, dense, args):
    """The pruned compact model, from ``--work`` when it is there."""
    path = Path(args.work) / f"{args.method}-{args.allocation}-{args.density}-{args.calib}.pt"
    if path.exists():
        return load_compact(path, net.g2.build_model()), None
    m = copy.deepcopy(dense)
    c0 = cpu()
    res = prune_structured(m, net.calib, args.method, granularity=("head", "neuron"),
                           target_density=args.density, **allocation_kwargs(args.allocation),
                           progress=False)
    secs = cpu() - c0
    small = res.compact({"input_ids": net.calib[0]["input_ids"]})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_compact(small, path)
    return small, secs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="results/oneshot/ref/gpt2")
    ap.add_argument("--method", default="osscar")
    ap.add_argument("--allocation", default="penalty:energy")
    ap.add_argument("--density", type=float, default=0.5)
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--steps", nargs="+", type=int, default=[100, 300, 1000])
    ap.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-3])
    ap.add_argument("--ways", nargs="+", default=["heal", "lm"])
    ap.add_argument("--label-weights", nargs="+", type=float, default=[0.0],
                    help="heal's weight a of the text's cross-entropy (0: distillation alone)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-windows", type=int, default=2048)
    ap.add_argument("--work", default="results/heal/gpt2")
    ap.add_argument("--out", default="results/heal/gpt2.jsonl")
    ap.add_argument("--tables", action="store_true")
    args = ap.parse_args(argv)
    if args.tables:
        return tables(args.out)
    torch.set_num_threads(1)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    done = {json.loads(line)["key"] for line in open(args.out)} if os.path.exists(args.out) \
        else set()
    net = GPT2Net(Path(args.ref), args.calib, 0, args.eval_windows, with_val=True)
    dense = net.load().eval()
    start, dense_errs, start_errs = None, None, None
    for steps in args.steps:
        for way in args.ways:
            for a in (args.label_weights if way == "heal" else [1.0]):
                for lr in args.lrs:
                    key = json.dumps([args.method, args.allocation, args.density, args.calib,
                                      way, a, args.temperature, steps, lr, args.batch])
                    if key in done:
                        continue
                    if start is None:
                        start, prune_s = compact_start(net, dense, args)
                        dense_errs, start_errs = net.errors(dense), net.errors(start)
                        print(f"dense {dense_errs}, pruned {start_errs} "
                              f"(prune CPU s {prune_s})", flush=True)
                    student = copy.deepcopy(start)
                    data = [{"input_ids": net.g2.windows(net.train, args.batch, net.ctx,
                                                         seed=3 * 10 ** 9 + i)}
                            for i in range(steps)]
                    teacher = dense if way == "heal" else _NoTeacher()
                    c0 = cpu()
                    heal(student, teacher, data, steps=steps, lr=lr, masks=None,
                         loss=kd_lm(a, args.temperature), weight_decay=0.0, shuffle=False,
                         cache_teacher=False, progress=False)
                    secs = cpu() - c0
                    errs = net.errors(student)
                    row = {"key": key, "method": args.method, "allocation": args.allocation,
                           "density": args.density, "way": way, "label_weight": a,
                           "temperature": args.temperature, "steps": steps, "lr": lr,
                           "batch": args.batch, "val": errs["val"], "test": errs["test"],
                           "val_before": start_errs["val"], "test_before": start_errs["test"],
                           "dense_val": dense_errs["val"], "dense_test": dense_errs["test"],
                           "params": sum(p.numel() for p in student.parameters()),
                           "dense_params": sum(p.numel() for p in dense.parameters()),
                           "cpu_s": secs, "load": os.getloadavg()[0]}
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)


def tables(path):
    rows = [json.loads(line) for line in open(path)]
    best = {}
    for r in rows:
        k = (r["density"], r["steps"], r["way"], r["label_weight"])
        if k not in best or r["val"] < best[k]["val"]:
            best[k] = r
    r0 = rows[0]
    print(f"dense: validation {r0['dense_val']:.3f}, test {r0['dense_test']:.3f} "
          f"({r0['dense_params']:,} parameters); one-shot start: validation "
          f"{r0['val_before']:.3f}, test {r0['test_before']:.3f} ({r0['params']:,})")
    print("| prunable kept | steps | training | lr, a (rate by validation) | CPU-minutes | "
          "val ppl/byte | test ppl/byte | test vs dense |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in sorted(best):
        r = best[k]
        a = f", a={r['label_weight']:g}" if r["way"] == "heal" else ""
        print(f"| {r['density']:.0%} | {r['steps']} | {r['way']} | {r['lr']:g}{a} | "
              f"{r['cpu_s'] / 60:.1f} | {r['val']:.3f} | {r['test']:.3f} | "
              f"{100 * (r['test'] / r['dense_test'] - 1):+.1f}% |")


if __name__ == "__main__":
    main()
