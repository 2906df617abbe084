"""Fixtures for the training tests: tiny MNIST-shaped IDX files made on the fly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dualdrop.data import write_idx


def make_tiny_mnist(folder, n_train=300, n_test=100, seed=0, side=28, compress=True):
    """Learnable MNIST-shaped IDX files: each class is a bright block at its own place + noise."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if compress else ""

    def images(n):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = rng.integers(0, 60, (n, side, side)).astype(np.uint8)
        for c in range(10):
            r, q = divmod(c, 4)
            x[y == c, 2 + 6 * r:6 + 6 * r, 2 + 6 * q:6 + 6 * q] = 250
        return x, y

    xtr, ytr = images(n_train)
    xte, yte = images(n_test)
    write_idx(folder / f"train-images-idx3-ubyte{ext}", xtr)
    write_idx(folder / f"train-labels-idx1-ubyte{ext}", ytr)
    write_idx(folder / f"t10k-images-idx3-ubyte{ext}", xte)
    write_idx(folder / f"t10k-labels-idx1-ubyte{ext}", yte)
    return folder, (xtr, ytr, xte, yte)


@pytest.fixture
def tiny_mnist(tmp_path):
    folder, arrays = make_tiny_mnist(tmp_path / "mnist")
    return folder, arrays


@pytest.fixture
def tiny_data(tmp_path):
    """A loaded :class:`dualdrop.data.Dataset` from tiny IDX files (checksums not verified)."""
    from dualdrop.data import load_mnist

    folder, _ = make_tiny_mnist(tmp_path / "mnist")
    return load_mnist(folder, seed=0, verify=False)


@pytest.fixture
def mnist_maker():
    """The :func:`make_tiny_mnist` function (fixture, to avoid importing conftest by name)."""
    return make_tiny_mnist


def _resume_cfg(tmp_path, name, **kw):
    from dualdrop.train import TrainConfig

    base = dict(method="none", out=str(tmp_path / name), seed=0, progress=False, threads=1)
    base.update(kw)
    return TrainConfig(**base)


def _weights(out):
    ck = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)
    return ck["model"], ck["optimizer"], ck


def _assert_resume_exact(tmp_path, data, **kw):
    """Stop after epoch 1 + resume == uninterrupted 2 epochs, bit for bit (weights, Adam state)."""
    from dualdrop.train import train

    full = train(_resume_cfg(tmp_path, "full", epochs=2, **kw), data=data)
    part = train(_resume_cfg(tmp_path, "part", epochs=2, stop_after=1, **kw), data=data)
    assert part["status"] == "stopped"
    assert not (tmp_path / "part" / "final.json").exists()
    res = train(_resume_cfg(tmp_path, "part", epochs=2, resume=True, **kw), data=data)
    a, oa, _ = _weights(tmp_path / "full")
    b, ob, _ = _weights(tmp_path / "part")
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
    for pid, st in oa["state"].items():
        for name, t in st.items():
            assert torch.equal(t, ob["state"][pid][name]), (pid, name)
    assert res["test_error"] == full["test_error"]
    ha = json.loads((tmp_path / "full" / "history.json").read_text())
    hb = json.loads((tmp_path / "part" / "history.json").read_text())
    strip = lambda h: [{k: v for k, v in r.items() if "seconds" not in k} for r in h]  # noqa: E731
    assert strip(ha) == strip(hb)
    return a


@pytest.fixture
def assert_resume_exact():
    return _assert_resume_exact
