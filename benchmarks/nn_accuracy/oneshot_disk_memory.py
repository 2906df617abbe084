"""Peak memory of ``prune_oneshot_from_disk`` against depth: the from-disk path holds the process,
one block, the activation cache up to ``cache_memory_mb`` and one stage's Grams, so its peak must
not grow with the number of blocks (benchmarks/RESULTS.md, "One-shot at scale").

A random Llama-shaped checkpoint (``LlamaConfig``: width 1,024, FFN 4,096, 16 heads, a vocabulary
of 2,048 so the blocks hold the weights) is written at each depth, shard by shard; each cell
prunes it in a fresh process (``sparsegpt`` at 50%, 8 x 256 calibration tokens, one torch
thread) and records the process's peak resident set (``VmHWM``), and, sampled every 50 ms by a
thread, the peaks of its anonymous and file-backed parts; each time a block's shard appears in
the output folder the sampler appends the peak so far to ``blocks-<depth>x<width>-<mode>.jsonl``
(the peak through block k, kept even when a cell is stopped before its end; ``blocks`` prints
them). Cells: without files for the
activation cache (``offload_dir=None``, ``cache_memory_mb=None``: all of it in memory), and with
``offload_dir`` and ``cache_memory_mb=0`` (all of it in files). Results are appended to a
JSON-lines file, one line per cell; a cell already there is skipped.

    python3 benchmarks/nn_accuracy/oneshot_disk_memory.py run --depths 8 24 48 \\
        --dir results/oneshot_disk --out results/oneshot_disk/memory.jsonl
    python3 benchmarks/nn_accuracy/oneshot_disk_memory.py table results/oneshot_disk/memory.jsonl
    python3 benchmarks/nn_accuracy/oneshot_disk_memory.py blocks results/oneshot_disk/blocks-*.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oneshot_scale import _append, _calib, _done, write_llama  # noqa: E402

SHAPE = {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
         "num_key_value_heads": 16, "vocab_size": 2048, "max_position_embeddings": 1024,
         "tie_word_embeddings": False}


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024
    return out


class _Sampler(threading.Thread):
    """The peaks of the anonymous and file-backed resident memory, sampled; with ``out_dir``
    and ``log``, one line per block shard written (the peaks so far)."""

    def __init__(self, every=0.05, out_dir=None, log=None):
        super().__init__(daemon=True)
        self.every, self.peak, self.stop = every, {}, threading.Event()
        self.out_dir, self.log, self.blocks = out_dir, log, 0
        self.c0 = time.process_time()

    def run(self):
        tick = 0
        while not self.stop.is_set():
            for k, v in _status().items():
                self.peak[k] = max(self.peak.get(k, 0.0), v)
            tick += 1
            if self.log and tick % 20 == 0:
                self._blocks()
            time.sleep(self.every)

    def _blocks(self):
        try:
            n = sum(f.startswith("model-block-") and f.endswith(".safetensors")
                    for f in os.listdir(self.out_dir))
        except OSError:
            return
        if n > self.blocks:
            self.blocks = n
            row = {"block": n, "hwm_mb": _status()["VmHWM"],
                   "anon_peak_mb": self.peak.get("RssAnon"),
                   "file_peak_mb": self.peak.get("RssFile"),
                   "cpu": time.process_time() - self.c0, "date": time.strftime("%H:%M:%S")}
            with open(self.log, "a") as f:
                f.write(json.dumps(row) + "\n")


def cell(a):
    import torch

    from dualdrop.nn import prune_oneshot_from_disk

    torch.set_num_threads(1)
    calib = _calib(a.batches, a.batch, a.seq, SHAPE["vocab_size"])
    out_dir = a.out_dir
    shutil.rmtree(out_dir, ignore_errors=True)
    start = _status()
    sampler = _Sampler(out_dir=out_dir, log=a.block_log)
    sampler.start()
    c0, w0 = time.process_time(), time.perf_counter()
    offload = dict(offload_dir=a.offload_dir, cache_memory_mb=0) if a.offload_dir else \
        dict(offload_dir=None, cache_memory_mb=None)
    rep = prune_oneshot_from_disk(a.ckpt, calib, "sparsegpt", out_dir, target_density=0.5,
                                  progress=False, exclude=["lm_head"], **offload)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    sampler.stop.set()
    sampler.join()
    end = _status()
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"peak_mb": end["VmHWM"], "start_mb": start["VmRSS"],
            "anon_peak_mb": sampler.peak.get("RssAnon"),
            "file_peak_mb": sampler.peak.get("RssFile"),
            "block_peak_mb": [round(b["peak_mb"]) for b in rep.pipeline["block_info"]],
            "cpu": cpu, "wall": wall, "density": rep.density}


def _ckpt_bytes(folder) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.endswith(".safetensors"))


def _shape(width) -> dict:
    """:data:`SHAPE` at another width (FFN 4x, heads of 64)."""
    return {**SHAPE, "hidden_size": width, "intermediate_size": 4 * width,
            "num_attention_heads": width // 64, "num_key_value_heads": width // 64}


def cmd_run(a):
    done = _done(a.out)
    shape = _shape(a.width)
    for depth in a.depths:
        ckpt = os.path.join(a.dir, f"llama-{depth}x{a.width}")
        cells = [f"{depth}/{a.width}/{mode}/{a.batches}x{a.batch}x{a.seq}"
                 for mode in a.modes]
        if all(c in done for c in cells):
            continue
        if not os.path.exists(os.path.join(ckpt, "model.safetensors.index.json")):
            write_llama({**shape, "num_hidden_layers": depth}, ckpt, shard_mb=256)
        size = _ckpt_bytes(ckpt)
        for mode, name in zip(a.modes, cells):
            if name in done:
                continue
            cmd = [sys.executable, __file__, "_cell", "--ckpt", ckpt, "--out-dir",
                   os.path.join(a.dir, f"pruned-{depth}x{a.width}-{mode}"),
                   "--batches", str(a.batches),
                   "--batch", str(a.batch), "--seq", str(a.seq)]
            if mode == "offload":
                cmd += ["--offload-dir", os.path.join(a.dir, f"offload-{depth}x{a.width}")]
            cmd += ["--block-log", os.path.join(a.dir, f"blocks-{depth}x{a.width}-{mode}.jsonl")]
            print("running", name, flush=True)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode:
                print(f"cell {name} failed:\n{p.stderr[-3000:]}", flush=True)
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1])
            row.update({"cell": name, "depth": depth, "width": a.width,
                        "mode": mode, "checkpoint_mb": size / 2 ** 20,
                        "date": time.strftime("%Y-%m-%d %H:%M")})
            _append(a.out, row)
            print(json.dumps(row), flush=True)
        if not a.keep:
            shutil.rmtree(ckpt, ignore_errors=True)


def cmd_table(a):
    rows = [json.loads(line) for line in open(a.file) if line.strip()]
    print("| width | blocks | checkpoint MB | activation cache | peak resident MB "
          "| peak anonymous MB | peak file-backed MB | CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (r["width"], r["depth"], r["mode"])):
        mode = "in memory" if r["mode"] == "memory" else "offload_dir, cache_memory_mb=0"
        print(f"| {r['width']} | {r['depth']} | {r['checkpoint_mb']:,.0f} | {mode} | "
              f"{r['peak_mb']:,.0f} | "
              f"{r['anon_peak_mb']:,.0f} | {r['file_peak_mb']:,.0f} | {r['cpu']:,.0f} |")


def cmd_blocks(a):
    """The peak through block k of each cell's block log (the last line of a finished cell is
    its last block; the whole call's peak is in the table)."""
    for path in a.files:
        rows = [json.loads(line) for line in open(path) if line.strip()]
        marks = [r for r in rows if r["block"] in (1, 8, 16, 24, 32, 40, 48)] or rows[-1:]
        print(os.path.basename(path) + ": " + ", ".join(
            f"block {r['block']}: {r['hwm_mb']:,.0f} MB (anon {r['anon_peak_mb']:,.0f})"
            for r in marks))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--depths", nargs="+", type=int, default=[8, 24, 48])
    r.add_argument("--width", type=int, default=SHAPE["hidden_size"])
    r.add_argument("--dir", default="results/oneshot_disk")
    r.add_argument("--out", default="results/oneshot_disk/memory.jsonl")
    r.add_argument("--modes", nargs="+", default=["memory", "offload"],
                   choices=["memory", "offload"])
    r.add_argument("--keep", action="store_true", help="keep the checkpoints written")
    t = sub.add_parser("table")
    t.add_argument("file")
    bl = sub.add_parser("blocks")
    bl.add_argument("files", nargs="+")
    c = sub.add_parser("_cell")
    c.add_argument("--ckpt", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("--offload-dir", default=None)
    c.add_argument("--block-log", default=None)
    for q in (r, c):
        q.add_argument("--batches", type=int, default=8)
        q.add_argument("--batch", type=int, default=1)
        q.add_argument("--seq", type=int, default=256)
    a = p.parse_args(argv)
    if a.cmd == "_cell":
        print(json.dumps(cell(a)), flush=True)
    elif a.cmd == "run":
        cmd_run(a)
    elif a.cmd == "blocks":
        cmd_blocks(a)
    else:
        cmd_table(a)


if __name__ == "__main__":
    main()
