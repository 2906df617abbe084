"""``layout="auto"`` against dense and CSR at several densities and batch sizes.

LeNet-300-100 shaped MLPs (784-300-100-10) whose weights are pruned at random to a density d
(every layer), for d in 1% ... 50%: ``dualdrop.nn.latency`` times dense, CSR and auto (exported
at each batch size on that batch: every layer timed dense and CSR, then the whole network) on
one thread, interleaved: medians, and in brackets the ratio of the fastest rounds (the figure a
loaded machine cannot inflate). The question: is auto ever slower than dense, and where does CSR
pay off? Writes ``OUT/auto_layout.md``.

    OMP_NUM_THREADS=1 python3 benchmarks/nn_speed/bench_auto_layout.py --out results/auto_layout
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn as nn

from dualdrop.nn.inference import latency


def mlp(density: float, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(),
                      nn.Linear(100, 10))
    with torch.no_grad():
        for layer in m:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_((torch.rand_like(layer.weight) < density).float())
    return m.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--densities", type=float, nargs="+",
                    default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--out", default="results/auto_layout")
    ap.add_argument("--clock", default="cpu", choices=("wall", "cpu"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    x = torch.randn(128, 784, generator=torch.Generator().manual_seed(0))
    head = ("| density | " + " | ".join(f"batch {b}: dense us / CSR / auto [fastest rounds: CSR "
                                        "/ auto] (auto's CSR layers)"
                                        for b in a.batch_sizes) + " |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    slower = []
    for d in a.densities:
        rep = latency(mlp(d), x, layouts=("csr", "auto"), batch_sizes=tuple(a.batch_sizes),
                      rounds=a.rounds, min_time=1e-3, clock=a.clock)
        cells = []
        for b in a.batch_sizes:
            dn, cs, au = (rep.row(lay, b) for lay in ("dense", "csr", "auto"))
            chosen = au["note"].removeprefix("CSR: ") if au["note"].startswith("CSR") else "none"
            cells.append(f"{1e6 * dn['median_s']:.0f} / {cs['speedup']:.2f}x / "
                         f"{au['speedup']:.2f}x [{cs['speedup_min']:.2f}x / "
                         f"{au['speedup_min']:.2f}x] ({chosen})")
            if au["speedup"] < 1.0 or au["speedup_min"] < 1.0:
                slower.append(f"d={d}, batch {b}: {au['speedup']:.2f}x (median), "
                              f"{au['speedup_min']:.2f}x (fastest rounds)")
        lines.append(f"| {d:g} | " + " | ".join(cells) + " |")
        print(lines[-1], f"(load {rep.meta['load_before']} -> {rep.meta['load_after']})",
              flush=True)
    lines += ["", "auto slower than dense: " + ("; ".join(slower) if slower else "never")]
    (out / "auto_layout.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
