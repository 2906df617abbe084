"""Ready-to-train datasets: train / validation / test arrays, normalized, flattened.

``load_dataset(data_dir)`` returns a :class:`Dataset`:

- with ``data_dir``: MNIST from its IDX files (see :mod:`dualdrop.data.mnist`), 28x28 images
  flattened to 784 features, scaled to [0, 1] and normalized with MNIST's training-set pixel mean
  0.1307 and std 0.3081; the official 60000 training images are split 80/20 into train and
  validation by a seeded permutation; the official 10000 test images are the test set.
- without: scikit-learn's bundled ``digits`` (1797 images, 8x8, so **64 features**; no network
  needed). A fixed 20% (permutation seed 0, independent of the run's seed) is the test set, the
  rest is split 80/20 into train and validation by the seeded permutation. Pixels (0..16) are
  scaled to [0, 1] and normalized with the mean and std of the non-test pixels.

A network built for a dataset takes its input size from ``Dataset.n_features`` (784 for MNIST,
64 for digits). The test set is meant for final reports only; select on validation.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

import numpy as np

from dualdrop.data.mnist import load_mnist_split

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
DIGITS_TEST_SEED = 0


@dataclass
class Dataset:
    """Flattened, normalized float32 features and int64 labels for three splits."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int = 10
    info: dict = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        return int(self.X_train.shape[1])

    def fingerprint(self) -> str:
        """Short hash of the train/validation content (to refuse resuming on other data)."""
        h = hashlib.sha1()
        for a in (self.X_train, self.y_train, self.X_val, self.y_val):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    def summary(self) -> str:
        return (
            f"{self.name}: {len(self.y_train)} train / {len(self.y_val)} validation / "
            f"{len(self.y_test)} test, {self.n_features} features, {self.n_classes} classes"
        )


def is_full_mnist(summary: str | None) -> bool:
    """Whether a :meth:`Dataset.summary` describes all of MNIST (60,000 training and 10,000 test
    images of 784 pixels): the data of the paper's LeNet-300-100 table, the only runs its
    numbers may be printed beside."""
    m = re.match(r"mnist: (\d+) train / (\d+) validation / (\d+) test, 784 features",
                 summary or "")
    return bool(m) and int(m[1]) + int(m[2]) == 60000 and int(m[3]) == 10000


def split_train_val(
    n: int, val_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``range(n)`` into (train indices, validation indices), both sorted."""
    if not (isinstance(val_fraction, (float, int)) and 0.0 < float(val_fraction) < 1.0):
        raise ValueError(f"val_fraction={val_fraction!r}; expected a number in (0, 1), e.g. 0.2")
    if n < 2:
        raise ValueError(f"cannot split {n} samples into train and validation; need at least 2")
    n_val = min(max(int(round(val_fraction * n)), 1), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def _flatten01(images: np.ndarray, scale: float) -> np.ndarray:
    return images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(scale)


def load_mnist(
    data_dir: str | os.PathLike, seed: int = 0, val_fraction: float = 0.2, verify: bool = True
) -> Dataset:
    """MNIST as a :class:`Dataset` (see the module docstring)."""
    xtr, ytr = load_mnist_split(data_dir, "train", verify=verify)
    xte, yte = load_mnist_split(data_dir, "test", verify=verify)
    if xtr.shape[1:] != xte.shape[1:]:
        raise ValueError(
            f"train images are {xtr.shape[1:]} but test images are {xte.shape[1:]}; the files in "
            f"{data_dir} do not belong together"
        )
    tr, va = split_train_val(len(ytr), val_fraction, seed)
    Xtr = (_flatten01(xtr, 255.0) - np.float32(MNIST_MEAN)) / np.float32(MNIST_STD)
    Xte = (_flatten01(xte, 255.0) - np.float32(MNIST_MEAN)) / np.float32(MNIST_STD)
    return Dataset(
        name="mnist",
        X_train=Xtr[tr],
        y_train=ytr[tr],
        X_val=Xtr[va],
        y_val=ytr[va],
        X_test=Xte,
        y_test=yte,
        info={"data_dir": str(data_dir), "split_seed": seed, "val_fraction": val_fraction,
              "mean": MNIST_MEAN, "std": MNIST_STD, "verified": verify},
    )


def load_digits_dataset(seed: int = 0, val_fraction: float = 0.2) -> Dataset:
    """scikit-learn's bundled 8x8 digits as a :class:`Dataset` (64 features)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X = d.data.astype(np.float32) / np.float32(16.0)
    y = d.target.astype(np.int64)
    rest, test = split_train_val(len(y), 0.2, DIGITS_TEST_SEED)
    tr, va = split_train_val(len(rest), val_fraction, seed)
    mean = float(X[rest].mean())
    std = float(X[rest].std())
    Xn = (X - np.float32(mean)) / np.float32(std)
    return Dataset(
        name="digits",
        X_train=Xn[rest][tr],
        y_train=y[rest][tr],
        X_val=Xn[rest][va],
        y_val=y[rest][va],
        X_test=Xn[test],
        y_test=y[test],
        info={"source": "sklearn.datasets.load_digits", "split_seed": seed,
              "val_fraction": val_fraction, "mean": mean, "std": std},
    )


def load_dataset(
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    val_fraction: float = 0.2,
    verify: bool = True,
) -> Dataset:
    """MNIST from ``data_dir`` if given, else the embedded scikit-learn digits."""
    if data_dir is None:
        return load_digits_dataset(seed=seed, val_fraction=val_fraction)
    return load_mnist(data_dir, seed=seed, val_fraction=val_fraction, verify=verify)
