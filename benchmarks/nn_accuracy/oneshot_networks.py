"""One-shot pruning of the trained reference networks: every method x target x allocation.

For each cell the reference network is loaded afresh and pruned by ``dualdrop.nn.prune_oneshot``
from the same calibration set (the first ``--calib`` examples of a seeded permutation of the
training split; for GPT-2, windows of the training split's bytes), then evaluated on the test
set (error for MNIST, perplexity for GPT-2), fine-tuned with the masks held and evaluated again.
Recorded per cell: the report (per-layer density and layer objective), seconds, peak memory
(the process's resident high-water mark during the one-shot call, and the part the call added),
test error before and after fine-tuning. Cells are appended to ``OUT/cells.jsonl`` as they
finish; a rerun skips finished cells (resumable; a cell measured with ``--finetune-lr 0``, no
fine-tuning, is measured again when fine-tuning is asked), ``--report`` writes
``OUT/tables.md``.

    python3 benchmarks/nn_accuracy/oneshot_networks.py --net lenet300 \\
        --ref results/oneshot/ref/lenet300 --data-dir ../shared/mnist --out results/oneshot/lenet300
    python3 benchmarks/nn_accuracy/oneshot_networks.py --net lenet300 --out results/oneshot/lenet300 --report

Fine-tuning: one epoch of the training split (batch 128, Adam at ``--finetune-lr`` decayed
linearly to 0; the rate of each network chosen on its validation split, ``FINETUNE_LR``) through ``dualdrop.train.fit`` with magnitude pruning's held masks; for GPT-2,
``--gpt2-finetune-steps`` steps of 32 windows (AdamW without weight decay, linear decay), and
test perplexity on ``--gpt2-eval-windows`` windows (the dense network's too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oneshot_tables import cell_key, done_cells, write_tables  # noqa: E402

TARGETS = ["0.5", "0.2", "0.1", "0.05", "2:4"]
#: fine-tuning learning rates, chosen on each network's validation split among 1e-3, 3e-3,
#: 1e-2 (GPT-2: 1e-4, 3e-4, 1e-3) by the mean error of its SparseGPT cells after fine-tuning
#: (oneshot_finetune_lr.py; benchmarks/history/oneshot.md)
FINETUNE_LR = {"lenet300": 1e-2, "lenet5": 3e-3, "transformer": 1e-2, "gpt2": 1e-3}
ALLOCATIONS = ["uniform", "global", "owl", "penalty"]


def parse_target(t: str) -> dict:
    return {"pattern": t} if ":" in t else {"target_density": float(t)}


# ---- the networks --------------------------------------------------------------------------------

class MNISTNet:
    """An MNIST reference run: loading, calibration, error, fine-tuning."""

    def __init__(self, ref: Path, data_dir: str, calib: int, seed: int = 0):
        from dualdrop.data import load_dataset
        self.ref = ref
        cfg = json.loads((ref / "config.json").read_text())
        data = load_dataset(data_dir, seed=cfg.get("seed", 0),
                            val_fraction=cfg.get("val_fraction", 0.2))
        if cfg.get("data_fingerprint") not in (None, data.fingerprint()):
            raise SystemExit(f"{data_dir} is not the data {ref} was trained on")
        self.Xtr, self.ytr = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
        self.Xva, self.yva = torch.from_numpy(data.X_val), torch.from_numpy(data.y_val)
        self.Xte, self.yte = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
        g = torch.Generator().manual_seed(seed)
        self.calib = self.Xtr[torch.randperm(len(self.Xtr), generator=g)[:calib]]
        self.seed = seed
        self.exclude_for = {}

    def load(self):
        from dualdrop.train import load_run
        return load_run(self.ref)

    def errors(self, net) -> dict:
        from dualdrop.train.evaluate import error_rate
        net.eval()
        return {"val": error_rate(net, self.Xva, self.yva),
                "test": error_rate(net, self.Xte, self.yte)}

    def finetune(self, net, res, lr: float):
        from dualdrop.nn import export_sparse
        from dualdrop.train import fit
        res.sparsify()
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(self.Xtr, self.ytr), batch_size=128, shuffle=True,
            generator=torch.Generator().manual_seed(self.seed))
        fit(net, "magnitude", loader, lambda m, b: F.cross_entropy(m(b[0]), b[1]), epochs=1,
            lr=lr, hparams=res.hparams, progress=False)
        return export_sparse(net).eval()


class GPT2Net:
    """The small GPT-2 of oneshot_gpt2.py: perplexity instead of error."""

    def __init__(self, ref: Path, calib: int, finetune_steps: int, eval_windows: int,
                 seed: int = 0, with_val: bool = False):
        import oneshot_gpt2 as g2
        self.g2, self.ref, self.seed = g2, ref, seed
        self.eval_windows = eval_windows
        self.val = g2.corpus("val") if with_val else None
        self.ctx = g2.CONFIG["n_positions"]
        self.train = g2.corpus("train")
        self.test = g2.corpus("test")
        self.calib = [{"input_ids": b} for b in
                      g2.windows(self.train, calib, self.ctx, seed=10 ** 9 + seed).split(32)]
        self.finetune_steps = finetune_steps

    def load(self):
        return self.g2.load(self.ref)

    def errors(self, net) -> dict:
        """Test perplexity; validation perplexity too when built ``with_val`` (the choice of
        the fine-tuning rate)."""
        net.eval()
        val = None if self.val is None else self.g2.perplexity(net, self.val, self.ctx,
                                                               limit=self.eval_windows)
        return {"val": val,
                "test": self.g2.perplexity(net, self.test, self.ctx, limit=self.eval_windows)}

    def finetune(self, net, res, lr: float):
        from dualdrop.nn import export_sparse
        from dualdrop.train import fit
        res.sparsify()
        steps = self.finetune_steps
        batches = [self.g2.windows(self.train, 32, self.ctx, seed=2 * 10 ** 9 + self.seed + i)
                   for i in range(steps)]
        fit(net, "magnitude", batches, self.g2.lm_loss, steps=steps, lr=lr, hparams=res.hparams,
            n_train=32 * steps, progress=False,
            optimizer=lambda groups: torch.optim.AdamW(groups, weight_decay=0.0))
        return export_sparse(net).eval()


# ---- cells ---------------------------------------------------------------------------------------

def method_spec(label: str):
    """A method label: a registry name, or ``NAME+polish`` (that method, then the support
    polish, ``options={"polish": True}``). Returns ``(name, options)``."""
    name, plus, extra = label.partition("+")
    if plus and extra != "polish":
        raise ValueError(f"method label {label!r}: NAME or NAME+polish")
    return name, ({"polish": True} if plus else {})


def run_cell(net_spec, method, target, allocation, refit, finetune_lr, exclude) -> dict:
    from dualdrop.nn import prune_oneshot
    net = net_spec.load()
    name, options = method_spec(method)
    t0 = time.perf_counter()
    res = prune_oneshot(net, net_spec.calib, name, options=options, allocation=allocation,
                        refit=refit or None, exclude=exclude, progress=False,
                        **parse_target(target))
    secs = time.perf_counter() - t0
    rep = res.report
    before = net_spec.errors(net)
    t1 = time.perf_counter()
    tuned = net_spec.finetune(net, res, finetune_lr) if finetune_lr else None
    ft_secs = time.perf_counter() - t1
    after = net_spec.errors(tuned) if tuned is not None else None
    return {"method": method, "target": target, "allocation": allocation, "refit": refit,
            "density": rep.density, "seconds": secs, "peak_mb": rep.peak_mb,
            "added_mb": rep.peak_mb - rep.start_mb,
            "layers": [{k: r[k] for k in ("layer", "shape", "kept", "density", "objective",
                                          "seconds", "gram_mb")} for r in rep.layers],
            "skipped": rep.skipped, "val": before["val"], "test": before["test"],
            "val_ft": after["val"] if after else None, "test_ft": after["test"] if after else None,
            "finetune_seconds": ft_secs, "finetune_lr": finetune_lr,
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", required=True, choices=["lenet300", "lenet5", "transformer", "gpt2"])
    ap.add_argument("--ref", type=Path, default=None, help="reference run folder")
    ap.add_argument("--data-dir", default="../shared/mnist")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--methods", nargs="+", default=None,
                    help="registry names, or NAME+polish (that method, then the support "
                         "polish); default: every registered method")
    ap.add_argument("--targets", nargs="+", default=TARGETS)
    ap.add_argument("--allocations", nargs="+", default=ALLOCATIONS)
    ap.add_argument("--refit", action="store_true", help="also every cell with refit=True")
    ap.add_argument("--calib", type=int, default=1024)
    ap.add_argument("--finetune-lr", type=float, default=None,
                    help="fine-tuning learning rate (default: the network's FINETUNE_LR, "
                    "chosen on its validation split by oneshot_finetune_lr.py); 0: no "
                    "fine-tuning")
    ap.add_argument("--finetune-allocations", nargs="+", default=None,
                    help="fine-tune only the cells of these allocations (default: all)")
    ap.add_argument("--gpt2-finetune-steps", type=int, default=50)
    ap.add_argument("--gpt2-eval-windows", type=int, default=1024,
                    help="test windows of 128 bytes, evenly spaced (default 1024: 131 kB)")
    ap.add_argument("--report", action="store_true", help="only write OUT/tables.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    cells_path = args.out / "cells.jsonl"
    if args.report:
        write_tables(args.out, done_cells(cells_path))
        return
    from dualdrop.nn.oneshot.registry import METHODS
    methods = args.methods or sorted(METHODS)
    ref = args.ref or Path("results/oneshot/ref") / args.net
    net_spec = (GPT2Net(ref, args.calib, args.gpt2_finetune_steps, args.gpt2_eval_windows)
                if args.net == "gpt2"
                else MNISTNet(ref, args.data_dir, args.calib))
    if args.finetune_lr is None:
        args.finetune_lr = FINETUNE_LR[args.net]
    done = done_cells(cells_path)
    dense = args.out / "dense.json"
    if not dense.is_file():
        dense.write_text(json.dumps(net_spec.errors(net_spec.load())))
    # LeNet-5's first convolution has 25 inputs: no N:M group fits; it stays dense for 2:4
    exclude = {"lenet5": ["conv1"]}.get(args.net)
    for target in args.targets:
        for allocation in (args.allocations if ":" not in target else ["uniform"]):
            for method in methods:
                for refit in ([False, True] if args.refit else [False]):
                    key = cell_key(method, target, allocation, refit)
                    if key in done and (not args.finetune_lr or (
                            done[key].get("test_ft") is not None
                            and done[key].get("finetune_lr") == args.finetune_lr)):
                        continue
                    print(f"== {args.net} {key} {time.strftime('%H:%M:%S')}", flush=True)
                    lr = args.finetune_lr
                    if args.finetune_allocations and allocation not in args.finetune_allocations:
                        lr = 0.0
                        if key in done:
                            continue
                    try:
                        cell = run_cell(net_spec, method, target, allocation, refit,
                                        lr, exclude if ":" in target else None)
                    except (ValueError, ImportError, RuntimeError) as exc:
                        print(f"   skipped: {exc}", flush=True)
                        continue
                    with open(cells_path, "a") as f:
                        f.write(json.dumps(cell) + "\n")
                    print(f"   density {cell['density']:.4f} test {cell['test']:.4g} -> "
                          f"{cell['test_ft']} in {cell['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()


def allocation_kwargs(spec: str) -> dict:
    """``prune_structured``'s allocation arguments of a benchmark's ``--allocations`` entry:
    ``"uniform"``, ``"flap"``, ``"penalty"`` (the defaults), or ``"penalty:NORMALIZE"`` (the
    penalty allocation with ``normalize="none"`` / ``"energy"``)."""
    name, _, normalize = spec.partition(":")
    out = {"allocation": name}
    if normalize:
        out["allocation_options"] = {"normalize": normalize}
    return out


def compact_speedup(dense, small, x, rounds: int = 9) -> float:
    """The dense network's time over the compact one's on ``x`` (one thread, interleaved
    rounds, medians of CPU time)."""
    import statistics

    from dualdrop.nn._timing import interleaved, torch_threads

    with torch_threads(1), torch.no_grad():
        t = interleaved({"dense": lambda: dense(x), "small": lambda: small(x)},
                        rounds=rounds, warmup=2, clock="cpu")
    return statistics.median(t["dense"]) / statistics.median(t["small"])
