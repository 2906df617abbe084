"""all-MiniLM-L6-v2 pruned for a measured speed-up, then healed: cosine to the dense embeddings
against healing CPU-minutes, distillation against training without the teacher.

Each configuration: ``prune_structured(..., granularity="head+neuron", method="osscar",
allocation="penalty", allocation_options={"normalize": "none"}, target_speedup=S)`` from 512
calibration sentences (the structured one-shot rows of benchmarks/RESULTS.md), the compact
model timed against the dense one (batch 32 x 128 tokens, one thread, CPU clock), then trained
for ``--minutes`` of the process's CPU time on the calibration pool's text (every sentence of the
files whose ``crc32 % 4 == 0``: 3,305 sentences; the evaluation sentences come from the other
files, ``structured_minilm_data.py``), one torch thread:

- ``--mode heal``: ``dualdrop.train.heal(compact, dense, texts, tokenizer=tok)``: the default
  losses of an encoder's ``last_hidden_state``, cosine of the mean-pooled embeddings plus the
  MSE of the token states;
- ``--mode scratch``: the same steps, optimizer and schedule without the teacher: unsupervised
  SimCSE (Gao et al., 2021; two dropout views of each sentence, in-batch InfoNCE at temperature
  0.05), the self-supervised objective a user without the dense model would train on.

The budget in steps is the CPU budget over the CPU time of the first 10 steps; the run stops at
1 and 3 CPU-minutes (evaluated there: mid-schedule states of the same run) and at the end. Rows
are appended to ``--out`` (JSON lines); the pruned model is kept in ``--work``
(``save_compact``) and a rerun reads it and continues the healing from its checkpoint there:
the allocation reads a latency table measured when it runs, so pruning again under another load
can keep other widths (at 2.0x, two prunings kept 17.01M and 17.35M parameters, measured 1.98x
and 1.87x).

    python3 benchmarks/nn_accuracy/heal_minilm.py --speedup 1.75 --minutes 10 --mode heal \\
        --out results/heal/minilm.jsonl --work results/heal/work
    python3 benchmarks/nn_accuracy/heal_minilm.py --tables --out results/heal/minilm.jsonl
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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from structured_minilm_data import (batches, embed, load_minilm, quality, split,  # noqa: E402
                                    stdlib_sentences)
from structured_oneshot_minilm import measured_speedup, sort_by_length, timing_batch  # noqa: E402

from dualdrop.nn.oneshot import prune_structured  # noqa: E402
from dualdrop.train import heal  # noqa: E402
from dualdrop.train.heal import warmup_cosine  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def prune(model, tok, speedup, n_calib=512):
    calib_s, _ = split(n_calib=n_calib)
    calib = batches(tok, sort_by_length(tok, calib_s))
    m = copy.deepcopy(model)
    tbatch = timing_batch(tok.vocab_size)
    res = prune_structured(m, calib, "osscar", granularity="head+neuron", target_speedup=speedup,
                           allocation="penalty", allocation_options={"normalize": "none"},
                           latency_inputs=tbatch, progress=False,
                           latency_options={"clock": "cpu"})
    small = res.compact(tbatch)
    sp = measured_speedup(model, small, tbatch)[0]
    return small, sp, res.report.params_after


def pruned_cached(model, tok, speedup, work: Path):
    """``prune``'s result, kept in ``work`` (``save_compact``: the compact model, and its
    measured speed-up and parameters) so that a rerun does not prune again."""
    from dualdrop.nn import load_compact, save_compact

    path, meta = work / f"pruned-{speedup}.pt", work / f"pruned-{speedup}.json"
    if path.is_file() and meta.is_file():
        m = json.loads(meta.read_text())
        return load_compact(path, copy.deepcopy(model)), m["measured_speedup"], m["params"]
    small, sp, params = prune(model, tok, speedup)
    work.mkdir(parents=True, exist_ok=True)
    save_compact(small, path)
    meta.write_text(json.dumps({"measured_speedup": sp, "params": params}))
    return small, sp, params


def simcse(small, data, steps, lr, stop_at, state):
    """Unsupervised SimCSE from the pruned start (module docstring), ``stop_at`` steps of a
    ``steps`` budget; ``state``: the optimizer and step of the run, kept between calls."""
    if not state:
        opt = torch.optim.AdamW([p for p in small.parameters()], lr=lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(steps, int(0.05 * steps)))
        state.update(opt=opt, sched=sched, step=0, gen=torch.Generator().manual_seed(0))
    small.train()
    while state["step"] < stop_at:
        order = torch.randperm(len(data), generator=state["gen"]).tolist()
        for i in order:
            if state["step"] >= stop_at:
                break
            b = data[i]
            m = b["attention_mask"].unsqueeze(-1).float()

            def emb():
                h = small(**b).last_hidden_state
                return F.normalize((h * m).sum(1) / m.sum(1).clamp_min(1), dim=-1)

            a, c = emb(), emb()
            loss = F.cross_entropy(a @ c.T / 0.05, torch.arange(len(a)))
            state["opt"].zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(small.parameters(), 1.0)
            state["opt"].step()
            state["sched"].step()
            state["step"] += 1
    small.eval()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speedup", type=float, default=1.75, help="target (predicted) speed-up")
    ap.add_argument("--minutes", type=float, default=10.0, help="healing CPU-minutes")
    ap.add_argument("--marks", type=float, nargs="*", default=[1.0, 3.0])
    ap.add_argument("--mode", choices=["heal", "scratch"], default="heal")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--out", default="results/heal/minilm.jsonl")
    ap.add_argument("--work", default="results/heal/work")
    ap.add_argument("--tables", action="store_true")
    args = ap.parse_args(argv)
    if args.tables:
        return tables(args.out)
    torch.set_num_threads(1)
    key = json.dumps([args.speedup, args.minutes, args.mode, args.lr])
    done = set()
    if os.path.exists(args.out):
        done = {json.loads(line)["key"] + str(json.loads(line)["minutes"])
                for line in open(args.out)}
    model, tok = load_minilm()
    small, sp, params = pruned_cached(model, tok, args.speedup, Path(args.work))
    _, eval_s = split(n_calib=512)
    evals = batches(tok, sort_by_length(tok, eval_s), batch=64)
    cached = Path(args.work) / "dense_embeddings.pt"  # the same for every configuration
    if cached.is_file():
        dense_emb = torch.load(cached, weights_only=True)
    else:
        dense_emb = embed(model, evals)
        cached.parent.mkdir(parents=True, exist_ok=True)
        torch.save(dense_emb, cached)
    pool, _ = stdlib_sentences()
    data = batches(tok, sort_by_length(tok, pool), batch=32)
    texts_in_order = [s for s in sort_by_length(tok, pool)]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)

    def record(minutes, cpu_s, steps, total):
        cos, rec = quality(dense_emb, embed(small, evals))
        row = {"key": key, "speedup": args.speedup, "measured_speedup": sp, "params": params,
               "mode": args.mode, "minutes": minutes, "cpu_s": cpu_s, "steps": steps,
               "total_steps": total, "cosine": cos, "recall10": rec, "lr": args.lr,
               "load": os.getloadavg()[0]}
        if key + str(minutes) not in done:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    record(0.0, 0.0, 0, 0)
    ck = os.path.join(args.work, f"{args.mode}-{args.speedup}-{args.minutes}-{args.lr}")
    meta_path = ck + ".json"
    kw = dict(tokenizer=tok, batch_size=32, lr=args.lr, masks=None, progress=False, seed=0)
    if os.path.exists(meta_path):
        meta = json.load(open(meta_path))
        if args.mode == "scratch":  # its optimizer lives in memory: a rerun starts it again
            meta.update(spent=0.0, step=0)
    else:  # the CPU time of a step, with the teacher's forward (its cache still empty)
        probe = copy.deepcopy(small)
        c0 = cpu()
        if args.mode == "heal":
            heal(probe, model, texts_in_order, steps=10, **kw)
        else:
            simcse(probe, data, 10, args.lr, 10, {})
        per_step = (cpu() - c0) / 10
        meta = {"per_step": per_step, "total": max(10, int(args.minutes * 60 / per_step)),
                "spent": 0.0, "step": 0}
        os.makedirs(args.work, exist_ok=True)
        json.dump(meta, open(meta_path, "w"))
    total = meta["total"]
    marks = sorted(m for m in args.marks if m < args.minutes) + [args.minutes]
    state = {}
    for mark in marks:
        stop = total if mark == args.minutes else min(total, int(mark * 60 / meta["per_step"]))
        if stop <= meta["step"]:
            continue
        c0 = cpu()
        if args.mode == "heal":
            out = heal(small, model, texts_in_order, steps=total,
                       stop_after=stop - meta["step"], checkpoint_dir=ck, **kw)
            step = out.step
        else:
            simcse(small, data, total, args.lr, stop, state)
            step = state["step"]
        meta["spent"] += cpu() - c0
        meta["step"] = step
        json.dump(meta, open(meta_path, "w"))
        record(mark, meta["spent"], step, total)


def tables(path):
    rows = [json.loads(line) for line in open(path)]
    print("| target | measured speed-up | parameters | mode | CPU-minutes | steps | cosine | "
          "recall@10 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (r["speedup"], r["mode"], r["minutes"])):
        print(f"| {r['speedup']:.2f}x | {r['measured_speedup']:.2f}x | {r['params'] / 1e6:.2f}M | "
              f"{r['mode']} | {r['cpu_s'] / 60:.1f} | {r['steps']} | {r['cosine']:.3f} | "
              f"{r['recall10']:.3f} |")


if __name__ == "__main__":
    main()
