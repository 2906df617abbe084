"""all-MiniLM-L6-v2 made faster, then healed: cosine to the dense embeddings against healing
CPU-minutes; distillation against training without the teacher and against
sentence-transformers' layer-dropping recipe.

Students (``--student``):

- ``pruned``: ``prune_structured(..., granularity="head+neuron", method="osscar",
  allocation="penalty", allocation_options={"normalize": "none"}, target_speedup=S)`` from 512
  calibration sentences (the structured one-shot rows of benchmarks/RESULTS.md), kept in
  ``--work`` (``save_compact``) so that a rerun does not prune again: the allocation reads a
  latency table measured when it runs, so pruning again under another load can keep other
  widths;
- ``layers``: sentence-transformers' model-distillation recipe: the dense model with only the
  blocks ``--keep-layers`` (default: every other one, 0 2 4), every width kept.

Every student is timed against the dense model (batch 32 x 128 tokens, one thread, CPU clock,
median of 7 interleaved rounds), then trained for ``--minutes`` of the process's CPU time, one
torch thread:

- ``--mode heal``: ``dualdrop.train.heal(student, dense, texts, tokenizer=tok)`` with
  ``--loss``: ``auto`` (heal's default for an encoder: ``1 - cos`` of the mean-pooled
  embeddings plus the MSE of every token's last hidden state), ``cosine`` (the pooled
  embeddings only: sentence-transformers' MSE on the normalized embeddings is ``(2 - 2 cos) /
  384``, the same loss up to scale), or ``tokens:W`` (``1 - cos`` of the pooled embeddings plus
  ``W`` times the mean over the real tokens of ``1 - cos`` of each token's hidden state: every
  token a target, scale-free); ``--block-weight``: heal's per-block hidden-state matching
  (every block's output to the teacher's same block: the pruned model keeps the width 384);
  ``--freeze``: heal's ``freeze`` (``'embeddings.word_embeddings.*'``: the 11.7M-entry
  word-embedding matrix not trained, each step about a quarter cheaper);
- ``--mode scratch``: the same steps and schedule without the teacher: unsupervised SimCSE (Gao
  et al., 2021; two dropout views of each sentence, in-batch InfoNCE at temperature 0.05), the
  self-supervised objective a user without the dense model would train on.

Text (``--text``): ``calib``, the standard library's calibration pool (every sentence of the
files whose ``crc32 % 4 == 0``: 3,305 sentences, reused every epoch), ``packages``, fresh
sentences of installed packages' docstrings (``heal_minilm_data.py``), or ``mix``, both
(``--fresh N``: the first ``N`` package sentences joined to the pool, which the steps go over
in epochs; without it, one epoch of fresh text, the teacher run on every step). The
evaluation sentences (``--eval test``) come from the other standard-library files
(``structured_minilm_data.py``); ``--eval val`` scores on 1,000 sentences of packages held
apart from the healing text instead (recipes are chosen there).

The schedule's horizon in steps is the CPU budget over the CPU time of a step, measured per
padded token on 10 of the run's batches (the teacher's forward counted once for every batch of
a fixed pool, on every step for fresh text); the teacher's outputs are cached on disk for the
run (``cache_teacher``), so the mid-run stops at the ``--marks`` (CPU-minutes; evaluated there:
mid-schedule states of the same run) never run it again. The budget is a hard stop: heal's
``until`` ends the run when the process's CPU spent in healing reaches ``--minutes`` (the
horizon is an estimate; a row that stopped short says so by ``steps < total_steps``, and the
cosine schedule's last steps, which a stop cuts, move the weights least). Rows are appended to
``--out`` (JSON lines) with the CPU actually spent; a killed run continues from heal's
checkpoint. ``--seed`` changes the order of the batches alone (a repeat of a row: the same
student, text and schedule).

    python3 benchmarks/nn_accuracy/heal_minilm.py --speedup 2.05 --minutes 10 --lr 3e-4 \\
        --freeze 'embeddings.word_embeddings.*' --out results/heal/minilm.jsonl \\
        --work results/heal/work
    python3 benchmarks/nn_accuracy/heal_minilm.py --tables --out results/heal/minilm.jsonl
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import functools
import hashlib
import json
import os
import random
import resource
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heal_minilm_data import package_sentences  # noqa: E402
from structured_minilm_data import (batches, embed, load_minilm, quality, split,  # noqa: E402
                                    stdlib_sentences)
from structured_oneshot_minilm import measured_speedup, sort_by_length, timing_batch  # noqa: E402

from dualdrop.nn.oneshot import prune_structured  # noqa: E402
from dualdrop.train import heal  # noqa: E402
from dualdrop.train.heal import warmup_cosine  # noqa: E402

stdlib_sentences = functools.lru_cache(stdlib_sentences)  # read once per process


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def atomic_json(obj, path):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def prune(model, tok, speedup, n_calib=512):
    calib_s, _ = split(n_calib=n_calib)
    calib = batches(tok, sort_by_length(tok, calib_s))
    m = copy.deepcopy(model)
    tbatch = timing_batch(tok.vocab_size)
    res = prune_structured(m, calib, "osscar", granularity="head+neuron", target_speedup=speedup,
                           allocation="penalty", allocation_options={"normalize": "none"},
                           latency_inputs=tbatch, progress=False,
                           latency_options={"clock": "cpu"})
    return res.compact(tbatch), res.report.params_after


def student_of(model, tok, args, work: Path):
    """``(student, measured speed-up, parameters)``, kept in ``work``."""
    from dualdrop.nn import load_compact, save_compact

    name = (f"pruned-{args.speedup}" if args.student == "pruned"
            else "layers-" + "-".join(map(str, args.keep_layers)))
    path, meta = work / f"{name}.pt", work / f"{name}.json"
    if meta.is_file() and (args.student == "layers" or path.is_file()):
        m = json.loads(meta.read_text())
        small = (load_compact(path, copy.deepcopy(model)) if args.student == "pruned"
                 else keep_layers(model, args.keep_layers))
        return small, m["measured_speedup"], m["params"]
    if args.student == "pruned":
        small, params = prune(model, tok, args.speedup)
    else:
        small = keep_layers(model, args.keep_layers)
        params = sum(p.numel() for p in small.parameters())
    sp = measured_speedup(model, small, timing_batch(tok.vocab_size))[0]
    work.mkdir(parents=True, exist_ok=True)
    if args.student == "pruned":
        save_compact(small, path)
    atomic_json({"measured_speedup": sp, "params": params}, meta)
    return small, sp, params


def keep_layers(model, keep):
    """A copy of ``model`` with only the encoder blocks ``keep`` (sentence-transformers' model
    distillation: the student starts from the teacher's own blocks)."""
    small = copy.deepcopy(model)
    small.encoder.layer = torch.nn.ModuleList([small.encoder.layer[i] for i in keep])
    small.config.num_hidden_layers = len(keep)
    return small


def token_cosine_loss(weight):
    """``1 - cos`` of the pooled embeddings plus ``weight`` times the mean ``1 - cos`` of the
    real tokens' hidden states (module docstring, ``--loss tokens:W``)."""
    def loss(s, t, batch):
        m = batch["attention_mask"].unsqueeze(-1).to(s.dtype)
        pool = lambda h: (h * m).sum(1) / m.sum(1).clamp_min(1)  # noqa: E731
        sent = 1 - F.cosine_similarity(pool(s), pool(t), dim=-1).mean()
        tok = ((1 - F.cosine_similarity(s, t, dim=-1)) * m[..., 0]).sum() / m.sum()
        return sent + weight * tok
    return loss


def loss_of(spec):
    if spec == "auto":
        return "auto"
    if spec == "cosine":
        return "cosine"
    if spec.startswith("tokens:"):
        return token_cosine_loss(float(spec.split(":", 1)[1]))
    raise SystemExit(f"--loss: auto, cosine or tokens:W, got {spec!r}")


def simcse(small, data, steps, lr, warmup, stop_at, state, seed=0):
    """Unsupervised SimCSE from the student's start (module docstring), ``stop_at`` steps of a
    ``steps`` budget; ``state``: the optimizer and step of the run, kept between calls."""
    if not state:
        opt = torch.optim.AdamW([p for p in small.parameters()], lr=lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(steps, int(warmup * steps)))
        state.update(opt=opt, sched=sched, step=0, gen=torch.Generator().manual_seed(seed))
    small.train()
    while state["step"] < stop_at:
        for i in torch.randperm(len(data), generator=state["gen"]).tolist():
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


def healing_texts(tok, kind, n_fresh, work):
    """The healing sentences (``--text``), sorted by length (each batch pads little; heal
    shuffles the batches' order)."""
    calib = stdlib_sentences()[0] if kind in ("calib", "mix") else []
    fresh = package_sentences(work)[0][:n_fresh] if kind in ("packages", "mix") else []
    return sort_by_length(tok, calib + fresh)


def probe_costs(small, model, data, args):
    """``(student, teacher)`` CPU seconds per padded token, on 10 of the run's batches
    ``data``: the student's forward, loss, backward and AdamW update on a copy (heal's own
    set-up, a one-time cost, left out), the teacher's no-grad forward. Per token, because the
    batches are cut from length-sorted text and their padded lengths differ 10-fold."""
    pick = random.Random(0).sample(range(len(data)), min(10, len(data)))
    probe = copy.deepcopy(small).train(args.mode == "scratch")
    for name, p in probe.named_parameters():
        p.requires_grad_(not any(fnmatch.fnmatchcase(name, q) for q in args.freeze))
    opt = torch.optim.AdamW([p for p in probe.parameters() if p.requires_grad], lr=1e-9)
    views = 2 if args.mode == "scratch" else 1
    tokens = sum(data[i]["input_ids"].numel() for i in pick)
    c0 = cpu()
    for i in pick:
        b = data[i]
        loss = sum(probe(**b).last_hidden_state.square().mean() for _ in range(views))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(probe.parameters(), 1.0)
        opt.step()
    step = (cpu() - c0) / tokens
    if args.mode != "heal":
        return step, 0.0
    c0 = cpu()
    with torch.no_grad():
        for i in pick:
            model(**data[i])
    return step, (cpu() - c0) / tokens


def budget_steps(small, model, tok, args, work):
    """Steps that spend ``--minutes`` of CPU (module docstring): the calibration pool's
    batches cost the teacher once, fresh text costs it on every step."""
    pool = args.text == "calib" or args.fresh is not None  # a fixed pool, epochs over it
    data = batches(tok, healing_texts(tok, args.text, args.fresh if args.fresh is not None
                                      else 20_000, work), batch=args.batch)
    s_tok, t_tok = probe_costs(small, model, data, args)
    per_batch = sum(b["input_ids"].numel() for b in data) / len(data)
    budget = args.minutes * 60
    if pool:
        epoch = t_tok * per_batch * len(data)
        total = int((budget - epoch) / (s_tok * per_batch))
        if total < len(data):  # not one epoch: the teacher runs on every step
            total = int(budget / ((s_tok + t_tok) * per_batch))
    else:  # one epoch over fresh batches
        total = int(budget / ((s_tok + t_tok) * per_batch))
    return {"student_per_token": s_tok, "teacher_per_token": t_tok, "tokens_per_batch":
            per_batch, "total": max(10, total), "spent": 0.0, "step": 0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speedup", type=float, default=2.0, help="target (predicted) speed-up")
    ap.add_argument("--student", choices=["pruned", "layers"], default="pruned")
    ap.add_argument("--keep-layers", type=int, nargs="+", default=[0, 2, 4])
    ap.add_argument("--minutes", type=float, default=10.0, help="healing CPU-minutes")
    ap.add_argument("--marks", type=float, nargs="*", default=[1.0, 3.0])
    ap.add_argument("--mode", choices=["heal", "scratch"], default="heal")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=float, default=0.05, help="fraction of the steps")
    ap.add_argument("--loss", default="auto", help="auto, cosine or tokens:W")
    ap.add_argument("--block-weight", type=float, default=0.0)
    ap.add_argument("--freeze", nargs="*", default=[],
                    help="parameter names or patterns not trained (heal's freeze), e.g. "
                         "'embeddings.word_embeddings.*'")
    ap.add_argument("--text", choices=["calib", "packages", "mix"], default="calib")
    ap.add_argument("--fresh", type=int, default=None,
                    help="package sentences in the pool (--text packages/mix): a fixed pool "
                         "the steps go over in epochs, the teacher run once per batch "
                         "(default: one epoch of fresh text, the teacher on every step)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0,
                    help="the order of the batches (heal's seed; SimCSE's shuffle): "
                         "repeats of a row, the student and text fixed")
    ap.add_argument("--eval", choices=["test", "val"], default="test")
    ap.add_argument("--out", default="results/heal/minilm.jsonl")
    ap.add_argument("--work", default="results/heal/work")
    ap.add_argument("--tables", action="store_true")
    args = ap.parse_args(argv)
    if args.tables:
        return tables(args.out)
    torch.set_num_threads(1)
    work = Path(args.work)
    conf = {k: getattr(args, k) for k in ("speedup", "student", "keep_layers", "minutes",
                                          "mode", "lr", "warmup", "loss", "block_weight",
                                          "text", "batch", "eval")}
    for k in ("freeze", "fresh", "seed"):  # in the key only when given (older rows keep theirs)
        if getattr(args, k):
            conf[k] = getattr(args, k)
    if args.student == "layers":
        conf.pop("speedup")
    else:
        conf.pop("keep_layers")
    key = json.dumps(conf, sort_keys=True)
    tag = hashlib.sha1(key.encode()).hexdigest()[:10]
    done = set()
    if os.path.exists(args.out):
        done = {(r["key"], r["minutes"]) for r in map(json.loads, open(args.out))}
    model, tok = load_minilm()
    small, sp, params = student_of(model, tok, args, work)
    if args.eval == "test":
        eval_s = split(n_calib=512)[1]
    else:
        eval_s = package_sentences(work)[1][:1000]
    evals = batches(tok, sort_by_length(tok, eval_s), batch=64)
    cached = work / ("dense_embeddings.pt" if args.eval == "test" else "dense_val.pt")
    if cached.is_file():
        dense_emb = torch.load(cached, weights_only=True)
    else:
        dense_emb = embed(model, evals)
        torch.save(dense_emb, cached)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)

    def record(minutes, cpu_s, steps, total):
        cos, rec = quality(dense_emb, embed(small, evals))
        row = {"key": key, **conf, "measured_speedup": sp, "params": params,
               "minutes": minutes, "cpu_s": cpu_s, "steps": steps, "total_steps": total,
               "cosine": cos, "recall10": rec, "load": os.getloadavg()[0]}
        if (key, minutes) not in done:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    ck = work / f"run-{tag}"
    meta_path = work / f"run-{tag}.json"
    kw = dict(tokenizer=tok, batch_size=args.batch, lr=args.lr, warmup=args.warmup,
              loss=loss_of(args.loss), block_weight=args.block_weight, masks=None,
              freeze=args.freeze or None, cache_teacher=str(work / f"teacher-{tag}"),
              progress=False, seed=args.seed)
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if args.mode == "scratch":  # its optimizer lives in memory: a rerun starts it again
            meta.update(spent=0.0, step=0)
            small, sp, params = student_of(model, tok, args, work)
    else:
        record(0.0, 0.0, 0, 0)
        if args.minutes <= 0:  # the student and its start only
            return
        meta = budget_steps(small, model, tok, args, work)
        atomic_json(meta, meta_path)
    total = meta["total"]
    n_fresh = args.fresh if args.fresh is not None else max(
        0, total * args.batch - (len(stdlib_sentences()[0]) if args.text == "mix" else 0))
    texts = healing_texts(tok, args.text, n_fresh, work)
    data = batches(tok, texts, batch=args.batch) if args.mode == "scratch" else None
    marks = sorted(m for m in args.marks if m < args.minutes) + [args.minutes]
    budget = args.minutes * 60
    state = {}
    for mark in marks:
        stop = total if mark == args.minutes else min(total, int(mark / args.minutes * total))
        if meta.get("stopped") or stop <= meta["step"]:
            continue
        c0, spent = cpu(), meta["spent"]
        over = lambda step: spent + cpu() - c0 >= budget  # noqa: E731  the hard CPU stop
        if args.mode == "heal":
            out = heal(small, model, texts, steps=total, stop_after=stop - meta["step"],
                       until=over, checkpoint_dir=str(ck), **kw)
            step = out.step
        else:
            simcse(small, data, total, args.lr, args.warmup, stop, state, args.seed)
            step = state["step"]
        meta["spent"] += cpu() - c0
        meta["step"] = step
        meta["stopped"] = step < stop
        atomic_json(meta, meta_path)
        record(args.minutes if meta["stopped"] else mark, meta["spent"], step, total)
    shutil.rmtree(work / f"teacher-{tag}", ignore_errors=True)


def tables(path):
    """The rows of ``path`` as a markdown table (the rate, text and evaluation set are the
    command's; pruning-only calls left out)."""
    rows = [r for r in map(json.loads, open(path)) if json.loads(r["key"]).get("minutes", 1) > 0]
    print("| student | measured speed-up | parameters | training | CPU-minutes | steps | cosine "
          "| recall@10 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (-r["measured_speedup"], r["key"], r["minutes"])):
        who = (f"pruned {r['speedup']}x" if r["student"] == "pruned"
               else "blocks " + ",".join(map(str, r["keep_layers"])))
        how = "SimCSE" if r["mode"] == "scratch" else f"heal, {r['loss']}"
        how += "".join(text for cond, text in (
            (r.get("freeze"), ", embeddings frozen"),
            (r.get("block_weight"), f", blocks x{r.get('block_weight')}"),
            (r.get("batch", 32) != 32, f", batch {r.get('batch')}"),
            (r.get("fresh"), f", +{r.get('fresh')} package sentences"),
            (r.get("seed"), f", seed {r.get('seed')}")) if cond)
        print(f"| {who} | {r['measured_speedup']:.2f}x | {r['params'] / 1e6:.2f}M | {how} | "
              f"{r['cpu_s'] / 60:.1f} | {r['steps']} | {r['cosine']:.3f} | {r['recall10']:.3f} |")


if __name__ == "__main__":
    main()
