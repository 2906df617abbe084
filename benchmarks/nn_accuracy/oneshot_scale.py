"""One-shot pruning at the size users prune: time and memory of ``prune_oneshot`` on a
GPT-2-small-sized model, of one block against SparseGPT's, and of ``prune_oneshot_from_disk`` on a
Llama-shaped model of 1.1B parameters (benchmarks/RESULTS.md, "One-shot at scale").

Every cell runs in a fresh process (its peak resident memory is its own), one torch thread,
and measures, in the same process, one dense forward of the model over the same calibration
tokens: times are given as CPU seconds of the process (what contention from other processes
changes least), wall seconds, and the prune's CPU time as a multiple of the dense forward's.
Weights are random (time and memory do not depend on them); calibration tokens are random ids.
Results are appended to a JSON-lines file, one line per cell; a cell already there is skipped
(the runs are resumable).

    python3 benchmarks/nn_accuracy/oneshot_scale.py gpt2 --out results/oneshot_scale/gpt2.jsonl
    python3 benchmarks/nn_accuracy/oneshot_scale.py block --out results/oneshot_scale/block.jsonl
    python3 benchmarks/nn_accuracy/oneshot_scale.py llama-write --dir results/oneshot_scale/llama1b
    python3 benchmarks/nn_accuracy/oneshot_scale.py llama --dir results/oneshot_scale/llama1b \\
        --out results/oneshot_scale/llama.jsonl
    python3 benchmarks/nn_accuracy/oneshot_scale.py dist --out results/oneshot_scale/dist.jsonl
    python3 benchmarks/nn_accuracy/oneshot_scale.py table results/oneshot_scale
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GPT2_SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
              "vocab_size": 50257}
# TinyLlama-1.1B's shape: 22 blocks of width 2048, FFN 5632, 32 heads, 4 key/value heads
LLAMA_1B = {"num_hidden_layers": 22, "hidden_size": 2048, "intermediate_size": 5632,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
            "max_position_embeddings": 2048, "tie_word_embeddings": False}


def _target_kwargs(target: str) -> dict:
    return {"pattern": target} if ":" in target else {"target_density": float(target)}


def _done(path) -> set:
    out = set()
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    out.add(json.loads(line)["cell"])
    return out


def _append(path, row):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _calib(n_batches, batch, seq, vocab, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, vocab, (batch, seq), generator=g)}
            for _ in range(n_batches)]


def _dense_forward(model, calib):
    import torch

    model.eval()
    c0, w0 = time.process_time(), time.perf_counter()
    with torch.no_grad():
        for b in calib:
            model(**b)
    return time.process_time() - c0, time.perf_counter() - w0


def _load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


# ---- cells (each in its own process) -------------------------------------------------------------

def cell_gpt2(a):
    import torch
    import transformers

    from dualdrop.nn import prune_oneshot
    from dualdrop.nn._memory import reset_peak_memory

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = dict(GPT2_SMALL)
    if a.width:
        cfg.update(n_embd=a.width, n_head=max(1, a.width // 64), n_layer=a.layers)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))
    calib = _calib(a.batches, a.batch, a.seq, cfg["vocab_size"])
    dense_cpu, dense_wall = _dense_forward(model, calib)
    load0 = _load()
    reset_peak_memory()
    c0, w0 = time.process_time(), time.perf_counter()
    res = prune_oneshot(model, calib, a.method, progress=False, sequential=a.sequential,
                        **_target_kwargs(a.target))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    rep = res.report
    solve = sum(r["seconds"] for r in rep.layers)
    return {"cpu": cpu, "wall": wall, "dense_cpu": dense_cpu, "dense_wall": dense_wall,
            "ratio_cpu": cpu / dense_cpu, "ratio_wall": wall / dense_wall,
            "peak_mb": rep.peak_mb, "start_mb": rep.start_mb, "density": rep.density,
            "mode": rep.pipeline.get("mode"), "blocks": rep.pipeline.get("blocks"),
            "block_seconds": [b["seconds"] for b in rep.pipeline.get("block_info", [])],
            "layer_seconds_sum": solve, "load": [load0, _load()],
            "tokens": a.batches * a.batch * a.seq}


def cell_block(a):
    a.layers = 1
    return cell_gpt2(a)


def cell_llama(a):
    import torch

    from dualdrop.nn import prune_oneshot_from_disk

    torch.set_num_threads(a.threads)
    calib = _calib(a.batches, a.batch, a.seq, LLAMA_1B["vocab_size"])
    c0, w0 = time.process_time(), time.perf_counter()
    rep = prune_oneshot_from_disk(a.dir, calib, a.method, a.out_dir, progress=a.progress,
                                  offload_dir=a.offload_dir, cache_memory_mb=a.cache_mb,
                                  exclude=a.exclude or None, **_target_kwargs(a.target))
    return {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0,
            "peak_mb": rep.peak_mb, "start_mb": rep.start_mb, "density": rep.density,
            "block_seconds": [b["seconds"] for b in rep.pipeline["block_info"]],
            "block_peak_mb": [b["peak_mb"] for b in rep.pipeline["block_info"]],
            "tokens": a.batches * a.batch * a.seq, "load": _load()}


DIST_MODEL = {"num_hidden_layers": 4, "hidden_size": 1024, "intermediate_size": 2816,
              "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000}


def cell_dist(a):
    """One rank of a torchrun (or a lone process): a Llama-shaped model built here, pruned;
    the blocks' seconds (their passes, Grams and solves) of rank 0."""
    import torch
    import torch.distributed as dist
    import transformers

    from dualdrop.nn import prune_oneshot

    torch.set_num_threads(a.threads)
    on = "RANK" in os.environ
    if on:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**DIST_MODEL))
    calib = _calib(a.batches, a.batch, a.seq, DIST_MODEL["vocab_size"])
    c0, w0 = time.process_time(), time.perf_counter()
    res = prune_oneshot(model, calib, a.method, progress=False, exclude=["lm_head"],
                        **_target_kwargs(a.target))
    wall = time.perf_counter() - w0
    blocks = sum(b["seconds"] for b in res.report.pipeline["block_info"])
    digest = float(sum(p.detach().double().abs().sum() for p in model.parameters()))
    rank = dist.get_rank() if on else 0
    world = dist.get_world_size() if on else 1
    if on:
        dist.destroy_process_group()
    if rank:
        sys.exit(0)
    return {"wall": wall, "cpu_rank0": time.process_time() - c0, "blocks_seconds": blocks,
            "world": world, "digest": digest, "tokens": a.batches * a.batch * a.seq}


CELLS = {"gpt2": cell_gpt2, "block": cell_block, "llama": cell_llama, "dist": cell_dist}


def run_cell(a):
    row = CELLS[a.kind](a)
    row.update({"cell": a.cell, "kind": a.kind, "method": a.method, "target": a.target,
                "threads": a.threads, "date": time.strftime("%Y-%m-%d %H:%M")})
    _append(a.out, row)
    print(json.dumps(row)[:400], flush=True)


def _spawn(kind, cell, out, extra):
    cmd = [sys.executable, __file__, "_cell", "--kind", kind, "--cell", cell, "--out", out,
           *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print("running", cell, flush=True)
    p = subprocess.run(cmd, env=env)
    if p.returncode:
        print(f"cell {cell} failed ({p.returncode})", flush=True)


# ---- drivers -------------------------------------------------------------------------------------

def cmd_gpt2(a):
    done = _done(a.out)
    for target in a.targets:
        for method in a.methods:
            cell = f"gpt2/{a.batches}x{a.batch}x{a.seq}/{a.sequential}/{method}/{target}"
            if cell in done:
                continue
            _spawn("gpt2", cell, a.out, ["--method", method, "--target", target,
                                         "--batches", str(a.batches), "--batch", str(a.batch),
                                         "--seq", str(a.seq), "--sequential", a.sequential])


def cmd_block(a):
    done = _done(a.out)
    for width in a.widths:
        for tokens in a.tokens:
            batches = max(1, tokens // (a.batch * a.seq))
            for method in a.methods:
                cell = f"block/w{width}/t{tokens}/{method}/{a.target}"
                if cell in done:
                    continue
                _spawn("block", cell, a.out,
                       ["--method", method, "--target", a.target, "--width", str(width),
                        "--batches", str(batches), "--batch", str(a.batch), "--seq",
                        str(a.seq)])


def cmd_dist(a):
    """The same prune in one process and in ``--world`` torchrun processes, interleaved
    rounds."""
    done = _done(a.out)
    for r in range(a.rounds):
        for world in (1, a.world):
            cell = f"dist/{a.method}/{a.target}/{a.batches}x{a.batch}x{a.seq}/w{world}/r{r}"
            if cell in done:
                continue
            args = ["--kind", "dist", "--cell", cell, "--out", a.out, "--method", a.method,
                    "--target", a.target, "--batches", str(a.batches), "--batch", str(a.batch),
                    "--seq", str(a.seq)]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            print("running", cell, flush=True)
            if world == 1:
                cmd = [sys.executable, __file__, "_cell", *args]
            else:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                       str(world), "--master_port", "29541", __file__, "_cell", *args]
            subprocess.run(cmd, env=env)


def cmd_llama_write(a):
    write_llama(LLAMA_1B, a.dir)


def write_llama(config: dict, folder, shard_mb=512):
    """A random Llama-shaped checkpoint of ``LlamaConfig(**config)`` in ``folder``, written
    shard by shard (never whole in memory)."""
    import torch
    import transformers
    from accelerate import init_empty_weights
    from safetensors.torch import save_file

    cfg = transformers.LlamaConfig(**config)
    with init_empty_weights():
        model = transformers.LlamaForCausalLM(cfg)
    os.makedirs(folder, exist_ok=True)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(folder)
    g = torch.Generator().manual_seed(0)
    weight_map, total, cur = {}, 0, {}
    names = [(n, p.shape) for n, p in model.named_parameters()]
    n_params = sum(int(torch.Size(s).numel()) for _, s in names)
    print(f"{n_params / 1e9:.2f}B parameters, {4 * n_params / 2**30:.2f} GiB in float32")

    def flush(k):
        name = f"model-{k:05d}.safetensors"
        save_file(cur, os.path.join(folder, name), metadata={"format": "pt"})
        for n in cur:
            weight_map[n] = name
        cur.clear()

    k = 0
    for n, shape in names:
        if n.endswith("norm.weight"):
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=g) * 0.02
        cur[n] = t
        total += t.numel() * 4
        if sum(v.numel() for v in cur.values()) * 4 > shard_mb * 2**20:
            flush(k)
            k += 1
    if cur:
        flush(k)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    print("written", folder)
    return total


def cmd_llama(a):
    done = _done(a.out)
    cell = (f"llama/{a.batches}x{a.batch}x{a.seq}/{a.method}/{a.target}/cache{a.cache_mb}"
            f"/exclude{'+'.join(a.exclude)}")
    if cell in done:
        return
    extra = ["--method", a.method, "--target", a.target, "--dir", a.dir, "--out-dir",
             a.out_dir, "--batches", str(a.batches), "--batch", str(a.batch), "--seq",
             str(a.seq), "--cache-mb", str(a.cache_mb), "--exclude", *a.exclude]
    if a.offload_dir:
        extra += ["--offload-dir", a.offload_dir]
    if a.progress:
        extra += ["--progress"]
    _spawn("llama", cell, a.out, extra)


def cmd_table(a):
    rows = []
    for f in sorted(os.listdir(a.folder)):
        if f.endswith(".jsonl"):
            with open(os.path.join(a.folder, f)) as fh:
                rows += [r for r in (json.loads(x) for x in fh if x.strip()) if "kind" in r]
    gp = [r for r in rows if r["kind"] == "gpt2"]
    if gp:
        print("| method | target | walk | CPU s | x dense forward (CPU) | wall s | x dense (wall) "
              "| peak MB | load |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in gp:
            print(f"| {r['method']} | {r['target']} | {r['mode']} | {r['cpu']:.0f} | "
                  f"{r['ratio_cpu']:.2f} | {r['wall']:.0f} | {r['ratio_wall']:.2f} | "
                  f"{r['peak_mb']:.0f} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    bl = [r for r in rows if r["kind"] == "block"]
    if bl:
        sg = {(r["cell"].split("/")[1], r["cell"].split("/")[2]): r["cpu"] for r in bl
              if r["method"] == "sparsegpt"}
        print("\n| width | tokens | method | CPU s | x SparseGPT | peak MB |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in bl:
            w, t = r["cell"].split("/")[1:3]
            ref = sg.get((w, t))
            print(f"| {w[1:]} | {t[1:]} | {r['method']} | {r['cpu']:.1f} | "
                  f"{r['cpu'] / ref if ref else float('nan'):.2f} | {r['peak_mb']:.0f} |")
    ds = [r for r in rows if r["kind"] == "dist"]
    if ds:
        print("\n| method | target | processes | wall s | blocks s (Grams + solves) | digest |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in ds:
            print(f"| {r['method']} | {r['target']} | {r['world']} | {r['wall']:.1f} | "
                  f"{r['blocks_seconds']:.1f} | {r['digest']:.6g} |")
    ll = [r for r in rows if r["kind"] == "llama"]
    for r in ll:
        bs = r["block_seconds"]
        print(f"\nllama {r['method']} {r['target']}: peak {r['peak_mb']:.0f} MB, "
              f"{len(bs)} blocks, {sum(bs) / len(bs):.0f} s per block, total {r['wall']:.0f} s "
              f"wall, {r['cpu']:.0f} s CPU")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpt2")
    g.add_argument("--out", default="results/oneshot_scale/gpt2.jsonl")
    g.add_argument("--methods", nargs="+",
                   default=["magnitude", "wanda", "sparsegpt", "admm", "logsum"])
    g.add_argument("--targets", nargs="+", default=["0.5", "2:4"])
    g.add_argument("--batches", type=int, default=64)
    g.add_argument("--batch", type=int, default=2)
    g.add_argument("--seq", type=int, default=512)
    g.add_argument("--sequential", default="auto")
    b = sub.add_parser("block")
    b.add_argument("--out", default="results/oneshot_scale/block.jsonl")
    b.add_argument("--methods", nargs="+",
                   default=["sparsegpt", "magnitude", "wanda", "admm", "logsum"])
    b.add_argument("--target", default="0.5")
    b.add_argument("--widths", nargs="+", type=int, default=[768, 1536, 3072])
    b.add_argument("--tokens", nargs="+", type=int, default=[8192, 32768])
    b.add_argument("--batch", type=int, default=2)
    b.add_argument("--seq", type=int, default=512)
    w = sub.add_parser("llama-write")
    w.add_argument("--dir", required=True)
    ll = sub.add_parser("llama")
    ll.add_argument("--dir", required=True)
    ll.add_argument("--out", default="results/oneshot_scale/llama.jsonl")
    ll.add_argument("--out-dir", default=None)
    ll.add_argument("--offload-dir", default=None)
    ll.add_argument("--cache-mb", type=float, default=256)
    ll.add_argument("--method", default="sparsegpt")
    ll.add_argument("--target", default="0.5")
    ll.add_argument("--batches", type=int, default=64)
    ll.add_argument("--batch", type=int, default=2)
    ll.add_argument("--seq", type=int, default=512)
    ll.add_argument("--progress", action="store_true")
    ll.add_argument("--exclude", nargs="*", default=["lm_head"],
                    help="layers left dense (default: the LM head, as SparseGPT and Wanda do)")
    d = sub.add_parser("dist")
    d.add_argument("--out", default="results/oneshot_scale/dist.jsonl")
    d.add_argument("--method", default="sparsegpt")
    d.add_argument("--target", default="0.5")
    d.add_argument("--world", type=int, default=2)
    d.add_argument("--rounds", type=int, default=2)
    d.add_argument("--batches", type=int, default=16)
    d.add_argument("--batch", type=int, default=2)
    d.add_argument("--seq", type=int, default=512)
    t = sub.add_parser("table")
    t.add_argument("folder")
    c = sub.add_parser("_cell")
    c.add_argument("--kind", required=True)
    c.add_argument("--cell", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--method", default="sparsegpt")
    c.add_argument("--target", default="0.5")
    c.add_argument("--batches", type=int, default=64)
    c.add_argument("--batch", type=int, default=2)
    c.add_argument("--seq", type=int, default=512)
    c.add_argument("--sequential", default="auto")
    c.add_argument("--width", type=int, default=0)
    c.add_argument("--layers", type=int, default=12)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--dir", default=None)
    c.add_argument("--out-dir", default=None)
    c.add_argument("--offload-dir", default=None)
    c.add_argument("--cache-mb", type=float, default=256)
    c.add_argument("--progress", action="store_true")
    c.add_argument("--exclude", nargs="*", default=[])
    a = p.parse_args(argv)
    if a.cmd == "llama" and a.out_dir is None:
        a.out_dir = a.dir.rstrip("/") + "-pruned"
    {"gpt2": cmd_gpt2, "block": cmd_block, "llama-write": cmd_llama_write, "llama": cmd_llama,
     "dist": cmd_dist, "table": cmd_table, "_cell": run_cell}[a.cmd](a)


if __name__ == "__main__":
    main()
