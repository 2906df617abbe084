"""A small GPT-2 trained here on the Python standard library's sources: the language-model
reference network of the one-shot pruning measurements (benchmarks/RESULTS.md, "One-shot
pruning").

Corpus: every ``*.py`` file of the running Python's standard library (``sysconfig``'s
``stdlib`` folder), without ``site-packages`` and without test suites (``test/``, ``tests/``,
``idle_test/``), read as bytes. The split is by whole modules (a top-level ``.py`` file, or a
package folder with all its files): a module goes to the test split when the first byte of the
SHA-256 of its name is below 26 (about 10%), to validation below 39 (5%), to training otherwise,
so no test file was ever seen in training. Tokens are bytes (vocabulary 256: no tokenizer to
download); perplexity is per byte, on 2,048 windows of 128 bytes evenly spaced over the split
(262 kB of the test split's 2.2 MB).

Model: ``transformers.GPT2LMHeadModel`` from a config (4 layers, width 160, 4 heads, context 128,
no dropout: 1.3M parameters). Training: AdamW (lr 2e-3, weight decay 0.01, 200 warm-up steps,
then linear decay to 0), batch 32 windows of 128 bytes at random offsets of the training split,
gradient clipping at 1; a checkpoint every 100 steps, exactly resumable (the windows of step t
come from a generator seeded with t).

    python3 benchmarks/nn_accuracy/oneshot_gpt2.py train --out results/oneshot/ref/gpt2
    python3 benchmarks/nn_accuracy/oneshot_gpt2.py corpus          # the split's sizes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

import torch

CONFIG = {"vocab_size": 256, "n_positions": 128, "n_embd": 160, "n_layer": 4, "n_head": 4,
          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0,
          "eos_token_id": 0}
TRAIN = {"steps": 1500, "batch": 32, "lr": 2e-3, "warmup": 200, "weight_decay": 0.01,
         "clip": 1.0, "seed": 0, "checkpoint_every": 100}
#: perplexities are measured on this many windows of 128 bytes, evenly spaced over the split
EVAL_WINDOWS = 2048
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def modules() -> dict[str, list[Path]]:
    """Top-level module name -> its ``.py`` files (sorted), test suites left out."""
    root = stdlib_root()
    out: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts[:-1]):
            continue
        name = rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]
        out.setdefault(name, []).append(path)
    return out


def split_of(name: str) -> str:
    h = hashlib.sha256(name.encode()).digest()[0]
    return "test" if h < 26 else "val" if h < 39 else "train"


def corpus(split: str) -> torch.Tensor:
    """The bytes of a split's modules, files joined by blank lines, as a uint8 tensor."""
    parts = []
    for name, files in modules().items():
        if split_of(name) == split:
            parts.extend(p.read_bytes() + b"\n\n" for p in files)
    data = b"".join(parts)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def corpus_stats() -> dict:
    mods = modules()
    stats = {"python": sys.version.split()[0], "root": str(stdlib_root())}
    for split in ("train", "val", "test"):
        names = [n for n in mods if split_of(n) == split]
        stats[split] = {"modules": len(names), "files": sum(len(mods[n]) for n in names),
                        "bytes": sum(p.stat().st_size + 2 for n in names for p in mods[n])}
    stats["test_modules"] = sorted(n for n in mods if split_of(n) == "test")
    return stats


def build_model(config: dict | None = None):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(**(config or CONFIG)))


def windows(data: torch.Tensor, n: int, ctx: int, seed: int) -> torch.Tensor:
    """``n`` windows of ``ctx`` bytes at random offsets (generator seeded with ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - ctx, (n,), generator=g)
    return torch.stack([data[s:s + ctx] for s in starts.tolist()]).long()


def tiled_windows(data: torch.Tensor, ctx: int, limit: int | None = EVAL_WINDOWS) -> torch.Tensor:
    """Non-overlapping windows of ``ctx`` bytes; ``limit`` of them evenly spaced over the
    split when it has more."""
    n = data.numel() // ctx
    tiles = data[:n * ctx].view(n, ctx).long()
    if limit is not None and n > limit:
        tiles = tiles[torch.linspace(0, n - 1, limit).round().long()]
    return tiles


@torch.no_grad()
def perplexity(model, data: torch.Tensor, ctx: int, batch: int = 64,
               limit: int | None = EVAL_WINDOWS) -> float:
    """``exp`` of the mean next-byte negative log-likelihood over ``tiled_windows``."""
    model.eval()
    x = tiled_windows(data, ctx, limit)
    total, count = 0.0, 0
    for i in range(0, len(x), batch):
        xb = x[i:i + batch]
        logits = model(xb).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                xb[:, 1:].reshape(-1), reduction="sum")
        total += float(nll)
        count += xb[:, 1:].numel()
    return math.exp(total / count)


def load(folder) -> torch.nn.Module:
    """The trained network of a finished ``train`` folder, in eval mode."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    model = build_model(cfg["model"])
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    return model.eval()


def lm_loss(model, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy of a batch of windows."""
    return model(batch, labels=batch).loss


def train(out: Path, steps: int, progress: bool = True) -> dict:
    from dualdrop.train.checkpoint import atomic_save, atomic_write_json
    out.mkdir(parents=True, exist_ok=True)
    if (out / "final.json").is_file():
        return json.loads((out / "final.json").read_text())
    torch.manual_seed(TRAIN["seed"])
    torch.set_num_threads(1)
    hp = {**TRAIN, "steps": steps}
    model = build_model()
    train_data = corpus("train")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=hp["lr"])

    def lr_at(t):
        return hp["lr"] * (t + 1) / hp["warmup"] if t < hp["warmup"] else \
            hp["lr"] * max(0.0, (steps - t) / (steps - hp["warmup"]))

    ck_path, log = out / "checkpoint.pt", []
    step = 0
    if ck_path.is_file():
        ck = torch.load(ck_path, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step, log = ck["step"], json.loads(ck["log"])
    stats = corpus_stats()
    t0, t_last = time.perf_counter(), time.perf_counter()
    model.train()
    while step < steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        xb = windows(train_data, hp["batch"], CONFIG["n_positions"], hp["seed"] * 1_000_003 + step)
        loss = lm_loss(model, xb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
        opt.step()
        step += 1
        if step % 20 == 0:
            log.append({"step": step, "loss": loss.item(), "sec": time.perf_counter() - t_last})
            t_last = time.perf_counter()
            if progress:
                print(f"step {step}/{steps} loss {loss.item():.4f}", flush=True)
        if step % hp["checkpoint_every"] == 0 or step == steps:
            atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                         "step": step, "log": json.dumps(log)}, ck_path)
    model.eval()
    val_ppl = perplexity(model, corpus("val"), CONFIG["n_positions"])
    test_ppl = perplexity(model, corpus("test"), CONFIG["n_positions"])
    n_params = sum(p.numel() for p in model.parameters())
    atomic_save(model.state_dict(), out / "model.pt")
    atomic_write_json(out / "config.json", {"model": CONFIG, "train": hp, "corpus": stats})
    final = {"val_perplexity": val_ppl, "test_perplexity": test_ppl, "parameters": n_params,
             "train_seconds_this_call": time.perf_counter() - t0, "log": log}
    atomic_write_json(out / "final.json", final)
    return final


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train (or resume) the reference GPT-2")
    t.add_argument("--out", type=Path, default=Path("results/oneshot/ref/gpt2"))
    t.add_argument("--steps", type=int, default=TRAIN["steps"])
    t.add_argument("--no-progress", action="store_true")
    sub.add_parser("corpus", help="print the corpus split's sizes")
    args = ap.parse_args(argv)
    if args.cmd == "corpus":
        print(json.dumps(corpus_stats(), indent=1))
        return
    final = train(args.out, args.steps, progress=not args.no_progress)
    print(f"test perplexity {final['test_perplexity']:.3f} (val {final['val_perplexity']:.3f}), "
          f"{final['parameters']} parameters")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
