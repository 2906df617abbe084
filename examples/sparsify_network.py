"""Sparsify your own network with ``fit``: four methods at 5% of the weights, against the dense
network.

A 64-100-10 MLP on scikit-learn's digits (1,400 training images, 397 held out), five epochs of
Adam at 1e-2 per method with ``target_density=0.05``: the density is the target, the method
decides which weights go. The figure shows held-out accuracy and how each method spread the
kept weights over the two layers.

    python examples/sparsify_network.py --out results/examples
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dualdrop.train import fit  # noqa: E402

METHODS = ("magnitude", "logsum", "hardconcrete", "vardrop-lr")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))


def main(out: Path, epochs: int = 5) -> Path:
    X, y = load_digits(return_X_y=True)
    X, y = torch.tensor((X - X.mean()) / X.std(), dtype=torch.float32), torch.tensor(y)
    train = DataLoader(TensorDataset(X[:1400], y[:1400]), batch_size=32, shuffle=True)
    X_val, y_val = X[1400:], y[1400:]
    loss = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731

    def accuracy(model):
        model.eval()
        with torch.no_grad():
            return (model(X_val).argmax(1) == y_val).float().mean().item()

    torch.manual_seed(0)
    dense = mlp()
    opt = torch.optim.Adam(dense.parameters(), lr=1e-2)
    for _ in range(epochs):
        for xb, yb in train:
            opt.zero_grad()
            F.cross_entropy(dense(xb), yb).backward()
            opt.step()
    results = {"dense": (accuracy(dense), {"0": 1.0, "2": 1.0})}
    for method in METHODS:
        torch.manual_seed(0)
        model = mlp()
        res = fit(model, method, train, loss, epochs=epochs, lr=1e-2, target_density=0.05,
                  progress=False)
        results[method] = (accuracy(model), res.sparsifier.density())
        print(f"{method:12s} accuracy {results[method][0]:.3f} at "
              f"{res.sparsifier.density()['total']:.3f} of the weights")
    print(f"{'dense':12s} accuracy {results['dense'][0]:.3f}")

    names = list(results)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    a1.bar(names, [results[n][0] for n in names], color=["0.6"] + ["C0"] * len(METHODS))
    for i, n in enumerate(names):
        a1.text(i, results[n][0], f"{results[n][0]:.3f}", ha="center", va="bottom", fontsize=8)
    a1.set(ylabel="held-out accuracy", ylim=(0, 1), title="accuracy at 5% of the weights")
    width = 0.38
    xs = range(len(METHODS))
    for k, (layer, lab) in enumerate((("0", "layer 1 (64 -> 100)"), ("2", "layer 2 (100 -> 10)"))):
        a2.bar([x + (k - 0.5) * width for x in xs], [results[m][1][layer] for m in METHODS],
               width, label=lab)
    a2.set_xticks(list(xs), METHODS)
    a2.set(ylabel="fraction of the layer's weights kept", title="where each method keeps weights")
    a2.legend(fontsize=8)
    for ax in (a1, a2):
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sparsify_network.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/examples"))
    ap.add_argument("--epochs", type=int, default=5)
    a = ap.parse_args()
    main(a.out, a.epochs)
