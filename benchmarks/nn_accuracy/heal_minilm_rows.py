"""all-MiniLM-L6-v2 made faster in depth AND width, then healed: the "both" row beside
heal_minilm.py's width-only (``--student pruned``) and depth-only (``--student layers``) rows.

The student: ``prune_oneshot(model, calib, "cosine", target_density=(6 - K) / 6,
granularity="block")`` removes the ``K`` (``--drop-blocks``) blocks whose output turns their
input least (ShortGPT's block influence; ``--depth-metric reconstruction``: the blocks whose
skipping changes the model's output least), then ``prune_structured(..., "osscar",
granularity="head+neuron", allocation="penalty", target_speedup=S)`` narrows the heads and FFN
neurons of the shallower model (``--speedup S``: the width part's target, measured against the
shallower model, so the whole is about ``6 / (6 - K) x S``; the allocation under-delivers by
5-10%). Both from the same 512 calibration sentences as heal_minilm.py's students. The student is
timed against the dense model (batch 32 x 128 tokens, one thread, CPU clock), kept in ``--work``
(``save_compact`` plus the kept blocks, so that a rerun rebuilds it without pruning again), and
healed exactly as heal_minilm.py heals its students: every other flag (``--minutes``,
``--marks``, ``--lr``, ``--text``, ``--loss``, ``--mode``, ...) is heal_minilm.py's, and so is
the run's resumable checkpoint. Give each ``--drop-blocks`` its own ``--work`` and ``--out``
(the rows' keys do not name the depth; the work folder's student file does).

    python3 benchmarks/nn_accuracy/heal_minilm_rows.py --drop-blocks 1 --speedup 1.8 \\
        --minutes 10 --marks 1 3 --lr 3e-4 --text calib \\
        --out results/heal/depth1.jsonl --work results/heal/work-depth1

``--retime WORK [WORK ...]`` times every student saved in those folders (heal_minilm.py's
``pruned-S``, this script's ``depthK-...``) against the dense model in ONE interleaved loop
(batch 32 x 128 tokens, one thread, CPU clock, median of ``--rounds`` rounds), so that students
measured at different times under a changing load are compared under the same one:

    python3 benchmarks/nn_accuracy/heal_minilm_rows.py --retime results/heal/work \
        results/heal/work-depth1
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import heal_minilm  # noqa: E402
from structured_minilm_data import batches, load_minilm, split  # noqa: E402
from structured_oneshot_minilm import measured_speedup, sort_by_length, timing_batch  # noqa: E402

from dualdrop.nn._timing import interleaved, torch_threads  # noqa: E402
from dualdrop.nn.oneshot import prune_oneshot  # noqa: E402


def depth_width_student(drop, metric):
    """A ``student_of(model, tok, args, work)`` for heal_minilm.main (module docstring):
    ``(student, measured speed-up, parameters)``."""
    def student_of(model, tok, args, work: Path):
        from dualdrop.nn import load_compact, save_compact

        if args.student != "pruned":
            raise SystemExit("--drop-blocks prunes the widths too: leave --student out")
        name = f"depth{drop}-{metric}-width-{args.speedup}"
        path, meta = work / f"{name}.pt", work / f"{name}.json"
        if meta.is_file() and path.is_file():
            m = json.loads(meta.read_text())
            shallow = heal_minilm.keep_layers(model, m["kept"])
            return load_compact(path, shallow), m["measured_speedup"], m["params"]
        n = len(model.encoder.layer)
        if not 0 < drop < n:
            raise SystemExit(f"--drop-blocks must be in 1..{n - 1}, got {drop}")
        calib_s, _ = split(n_calib=512)
        calib = batches(tok, sort_by_length(tok, calib_s))
        shallow = copy.deepcopy(model)
        depth = prune_oneshot(shallow, calib, metric, target_density=(n - drop) / n,
                              granularity="block")
        print(depth.format(), flush=True)
        small, params = heal_minilm.prune(shallow, tok, args.speedup)
        sp = measured_speedup(model, small, timing_batch(tok.vocab_size))[0]
        work.mkdir(parents=True, exist_ok=True)
        save_compact(small, path)
        heal_minilm.atomic_json({"measured_speedup": sp, "params": params, "kept": depth.kept,
                                 "block_scores": depth.scores, "metric": metric}, meta)
        return small, sp, params
    return student_of


def retime(folders, rounds):
    """Every saved student of ``folders`` against the dense model, timed in one interleaved
    loop (module docstring); prints one JSON line per student and returns them."""
    from dualdrop.nn import load_compact

    model, tok = load_minilm()
    students = {}
    for folder in map(Path, folders):
        for meta in sorted(folder.glob("*.json")):
            path = meta.with_suffix(".pt")
            m = json.loads(meta.read_text())
            if "measured_speedup" not in m:
                continue
            if meta.stem.startswith("layers-"):  # heal_minilm.py --student layers: no file
                small = heal_minilm.keep_layers(model, list(map(int, meta.stem.split("-")[1:])))
            elif path.is_file():
                small = load_compact(path, heal_minilm.keep_layers(model, m["kept"])
                                     if "kept" in m else copy.deepcopy(model))
            else:
                continue
            students[f"{folder.name}/{meta.stem}"] = (small, m)
    if not students:
        raise SystemExit(f"no saved students in {folders}")
    inputs = timing_batch(tok.vocab_size)
    fns = {"dense": lambda: model(**inputs)}
    fns.update({k: (lambda s=s: s(**inputs)) for k, (s, _) in students.items()})
    with torch_threads(1), torch.no_grad():
        t = interleaved(fns, rounds=rounds, warmup=1, clock="cpu")
    dense = statistics.median(t["dense"])
    rows = []
    for k, (_, m) in students.items():
        row = {"student": k, "speedup_now": dense / statistics.median(t[k]),
               "speedup_saved": m["measured_speedup"], "params": m["params"],
               "dense_s": dense, "rounds": rounds}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    ap.add_argument("--drop-blocks", type=int, default=1)
    ap.add_argument("--depth-metric", choices=["cosine", "reconstruction"], default="cosine")
    ap.add_argument("--retime", nargs="+", metavar="WORK")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("-h", "--help", action="store_true")
    args, rest = ap.parse_known_args(argv)
    if args.help:
        print(__doc__)
        return heal_minilm.main(["--help"])
    if args.retime:
        torch.set_num_threads(1)
        return retime(args.retime, args.rounds)
    heal_minilm.student_of = depth_width_student(args.drop_blocks, args.depth_metric)
    return heal_minilm.main(rest)


if __name__ == "__main__":
    main()
