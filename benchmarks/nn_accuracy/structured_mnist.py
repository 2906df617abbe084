"""Structured sparsity on MNIST: units kept, test error and inference latency of the compact net.

For each finished ``dualdrop sparsify`` run given (e.g. LeNet-300-100 with ``hardconcrete-neuron``
or ``--granularity neuron``), loads its test-time network three ways (``load_run`` layouts
"dense": pruned weights 0; "compact": dead units removed through Torch-Pruning's dependency
graph; "csr": sparse CSR Linear layers) and reports:

- units kept per layer (and attention heads kept) in the convention of Louizos et al. (2018): the input units each layer
  still reads (nonzero columns), e.g. their 219-214-100 for LeNet-300-100, and the compact
  network's widths;
- parameters: dense, nonzero, compact;
- test error of the dense and of the compact network (they must agree: the compact network
  computes what the masked one computes);
- latency of one forward pass at batch 1 and 128 on one thread (median of repeated timings,
  after warm-up, the three layouts interleaved), dense / compact / CSR, and the speed-up
  dense / compact.

Writes ``OUT/structured.md`` and ``OUT/units_per_layer.png``.

    OMP_NUM_THREADS=1 python3 benchmarks/nn_accuracy/structured_mnist.py runs/l0_protocol \
        --data-dir ../shared/mnist --out results/structured
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn

from dualdrop.data import load_dataset
from dualdrop.nn import HeadPrunedAttention
from dualdrop.train import load_run

#: published units kept (input units read per layer)
PUBLISHED = {
    "L0 (Louizos et al. 2018), LeNet-300-100, 1.4%": [219, 214, 100],
}


def _layers(net):
    return [(n, m) for n, m in net.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def inputs_read(small) -> list[int]:
    """Input units of each Linear / Conv2d layer of the compact network that are alive: the
    first layer's inputs with a nonzero column (pixels it reads), then each layer's input
    width (the compact network keeps only units that are produced and read)."""
    layers = _layers(small)
    w = layers[0][1].weight.detach()
    first = int((w.transpose(0, 1).reshape(w.shape[1], -1) != 0).any(1).sum())
    return [first] + [m.weight.shape[1] for _, m in layers[1:]]


def heads_kept(small) -> list[str]:
    """``kept/total`` attention heads of every attention module of the compact network."""
    out = []
    for m in small.modules():
        if isinstance(m, HeadPrunedAttention):
            out.append(f"{m.num_heads}/{m.orig_heads}")
        elif isinstance(m, nn.MultiheadAttention):
            out.append(f"{m.num_heads}/{m.num_heads}")
    return out


def latencies(nets: dict, x, repeats: int) -> dict:
    """Median time of one forward pass of each network on ``x``, the networks timed in turn
    within every repeat (interleaved, so that a load change hits all of them alike)."""
    ts = {k: [] for k in nets}
    with torch.no_grad():
        for net in nets.values():
            for _ in range(5):
                net(x)
        for _ in range(repeats):
            for k, net in nets.items():
                t0 = time.perf_counter()
                net(x)
                ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def error(net, X, y) -> float:
    with torch.no_grad():
        return float((net(X).argmax(1) != y).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="results/structured")
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = None
    rows, units = [], {}
    for run in a.runs:
        final = json.loads((Path(run) / "final.json").read_text())
        cfg = json.loads((Path(run) / "config.json").read_text())
        if data is None:
            data = load_dataset(a.data_dir, seed=cfg.get("seed", 0))
        X = torch.from_numpy(data.X_test).float()
        y = torch.from_numpy(data.y_test).long()
        dense, small, csr = (load_run(run, layout) for layout in ("dense", "compact", "csr"))
        n_dense = sum(p.numel() for p in dense.parameters())
        n_nz = sum(int(torch.count_nonzero(p)) for p in dense.parameters())
        n_small = sum(p.numel() for p in small.parameters())
        e_dense, e_small = error(dense, X, y), error(small, X, y)
        read = inputs_read(small)
        widths = "-".join(str(m.weight.shape[0]) for _, m in _layers(small))
        heads = heads_kept(small)
        if heads:
            widths += "; heads " + ", ".join(heads)
        lat = {}
        for b, reps in ((1, a.repeats), (128, max(20, a.repeats // 4))):
            xb = X[:b]
            lat[b] = latencies({"dense": dense, "compact": small, "csr": csr}, xb, reps)
        label = f"{final['method']} ({Path(run).name})"
        units[label] = read
        rows.append((label, final, read, widths, n_dense, n_nz, n_small, e_dense, e_small, lat))
    lines = ["| run | inputs read per layer | compact widths | params dense / nonzero / compact "
             "| test error (dense = compact) | batch 1: dense / compact / CSR (us) | batch 128: "
             "dense / compact / CSR (us) | speed-up dense/compact (1, 128) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, final, read, widths, nd, nnz, ns, ed, es, lat in rows:
        us = {b: {k: 1e6 * v for k, v in lat[b].items()} for b in lat}
        lines.append(
            f"| {label} | {'-'.join(map(str, read))} | {widths} "
            f"| {nd:,} / {nnz:,} / {ns:,} | {100 * ed:.2f}% = {100 * es:.2f}% "
            f"| {us[1]['dense']:.0f} / {us[1]['compact']:.0f} / {us[1]['csr']:.0f} "
            f"| {us[128]['dense']:.0f} / {us[128]['compact']:.0f} / {us[128]['csr']:.0f} "
            f"| {lat[1]['dense'] / lat[1]['compact']:.2f}x, "
            f"{lat[128]['dense'] / lat[128]['compact']:.2f}x |")
        if abs(ed - es) > 1e-12:
            lines.append(f"|  | **compact and dense disagree** | | | | | | |")
    md = "\n".join(lines) + "\n"
    (out / "structured.md").write_text(md)
    print(md)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if len({len(u) for u in units.values()}) > 1:
        # a compact Transformer lists q/k/v projections the dense one packs into in_proj:
        # layer k is not the same layer in every run, so no bars side by side
        print("units_per_layer.png not drawn: the runs list different layers")
        return
    # published counts only beside runs of the same depth (LeNet-300-100's three layers)
    allu = {**units, **{k: v for k, v in PUBLISHED.items()
                        if all(len(u) == len(v) for u in units.values())}}
    n_layers = max(len(v) for v in allu.values())
    fig, ax = plt.subplots(figsize=(max(7, 0.7 * n_layers + 2), 4))
    width = 0.8 / len(allu)
    for i, (label, ks) in enumerate(allu.items()):
        ax.bar([j + i * width for j in range(len(ks))], ks, width, label=label,
               hatch="//" if label in PUBLISHED else None)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(n_layers)])
    ax.set_xticklabels([f"layer {j + 1}" for j in range(n_layers)],
                       rotation=45 if n_layers > 5 else 0)
    ax.set_ylabel("input units read")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "units_per_layer.png", dpi=150)


if __name__ == "__main__":
    main()
