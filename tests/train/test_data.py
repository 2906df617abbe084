"""MNIST IDX loading, checksum verification, splits and the embedded digits."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from dualdrop.data import (
    MD5,
    MNIST_MEAN,
    MNIST_STD,
    MNISTDataError,
    load_dataset,
    load_idx,
    load_mnist,
    load_mnist_split,
    split_train_val,
    write_idx,
)
from dualdrop.data import mnist as mnist_mod

REAL = Path(__file__).resolve().parents[3] / "shared" / "mnist"


def test_roundtrip_gzip_and_plain(tmp_path, mnist_maker):
    _, (xtr, ytr, xte, yte) = mnist_maker(tmp_path / "gz", compress=True)
    mnist_maker(tmp_path / "plain", compress=False)
    for sub in ("gz", "plain"):
        x, y = load_mnist_split(tmp_path / sub, "train", verify=False)
        assert x.dtype == np.uint8 and x.shape == (300, 28, 28)
        assert y.dtype == np.int64
        np.testing.assert_array_equal(x, xtr)
        np.testing.assert_array_equal(y, ytr)
        x, y = load_mnist_split(tmp_path / sub, "test", verify=False)
        np.testing.assert_array_equal(x, xte)


def test_gzip_detected_by_content_not_name(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    p = write_idx(tmp_path / "a.idx", arr, compress=True)  # gzip without .gz suffix
    np.testing.assert_array_equal(load_idx(p), arr)


def test_torchvision_layout(tmp_path, mnist_maker):
    _, (xtr, *_rest) = mnist_maker(tmp_path / "root" / "MNIST" / "raw", compress=False)
    x, _ = load_mnist_split(tmp_path / "root", "train", verify=False)
    np.testing.assert_array_equal(x, xtr)


def test_checksum_of_decompressed_content(tiny_mnist, monkeypatch):
    folder, _ = tiny_mnist
    # the tiny files are not MNIST: verification must refuse them, naming the MD5
    with pytest.raises(MNISTDataError, match="MD5"):
        load_mnist_split(folder, "train")
    # with the tiny files' own decompressed-content digests, verification passes
    digests = {}
    for stem in MD5:
        content = gzip.decompress((folder / f"{stem}.gz").read_bytes())
        digests[stem] = hashlib.md5(content).hexdigest()
    monkeypatch.setattr(mnist_mod, "MD5", digests)
    x, y = load_mnist_split(folder, "train")
    assert len(y) == 300
    # recompressing at another level changes the gzip bytes, not the verified content
    p = folder / "train-labels-idx1-ubyte.gz"
    p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes()), compresslevel=1))
    load_mnist_split(folder, "train")


def test_missing_file_and_dir(tiny_mnist, tmp_path):
    folder, _ = tiny_mnist
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    load_mnist_split(folder, "train", verify=False)
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_mnist_split(folder, "test", verify=False)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_dataset(tmp_path / "nowhere")


def test_truncated_and_corrupt_files(tmp_path, mnist_maker):
    folder, _ = mnist_maker(tmp_path / "m", compress=False)
    p = folder / "train-images-idx3-ubyte"
    raw = p.read_bytes()
    p.write_bytes(raw[:-100])
    with pytest.raises(MNISTDataError, match="truncated"):
        load_mnist_split(folder, "train", verify=False)
    p.write_bytes(b"\x12\x34" + raw[2:])
    with pytest.raises(MNISTDataError, match="not an IDX file"):
        load_mnist_split(folder, "train", verify=False)
    p.write_bytes(raw)
    # truncated gzip stream
    gz = folder / "train-labels-idx1-ubyte"
    data = gzip.compress(gz.read_bytes())
    gz.unlink()
    (folder / "train-labels-idx1-ubyte.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(MNISTDataError, match="gzip"):
        load_mnist_split(folder, "train", verify=False)


def test_images_labels_mismatch(tmp_path, mnist_maker):
    folder, (xtr, ytr, *_r) = mnist_maker(tmp_path / "m")
    write_idx(folder / "train-labels-idx1-ubyte.gz", ytr[:-1])
    with pytest.raises(MNISTDataError, match="300 images but 299 labels"):
        load_mnist_split(folder, "train", verify=False)
    write_idx(folder / "train-labels-idx1-ubyte.gz", (ytr + 20).astype(np.uint8))
    with pytest.raises(MNISTDataError, match="outside 0..9"):
        load_mnist_split(folder, "train", verify=False)


def test_split_seeded_disjoint():
    tr, va = split_train_val(1000, 0.2, seed=3)
    assert len(va) == 200 and len(tr) == 800
    assert np.intersect1d(tr, va).size == 0
    np.testing.assert_array_equal(np.union1d(tr, va), np.arange(1000))
    tr2, va2 = split_train_val(1000, 0.2, seed=3)
    np.testing.assert_array_equal(va, va2)
    _, va3 = split_train_val(1000, 0.2, seed=4)
    assert not np.array_equal(va, va3)
    with pytest.raises(ValueError, match="val_fraction"):
        split_train_val(10, 1.5)


def test_mnist_normalization_and_split(tiny_mnist):
    folder, (xtr, ytr, xte, yte) = tiny_mnist
    d = load_mnist(folder, seed=0, verify=False)
    assert d.n_features == 784
    assert len(d.y_train) == 240 and len(d.y_val) == 60 and len(d.y_test) == 100
    tr, va = split_train_val(300, 0.2, 0)
    expect = (xtr[va[0]].reshape(-1).astype(np.float32) / 255 - MNIST_MEAN) / MNIST_STD
    np.testing.assert_allclose(d.X_val[0], expect, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(d.y_test, yte)


def test_embedded_digits():
    a = load_dataset(None, seed=0)
    b = load_dataset(None, seed=1)
    assert a.name == "digits" and a.n_features == 64
    assert len(a.y_train) + len(a.y_val) + len(a.y_test) == 1797
    np.testing.assert_array_equal(a.X_test, b.X_test)  # test set does not depend on the seed
    assert not np.array_equal(a.y_val, b.y_val)
    assert abs(float(a.X_train.mean())) < 0.05 and abs(float(a.X_train.std()) - 1) < 0.05


@pytest.mark.skipif(not REAL.is_dir(), reason="real MNIST files not present")
def test_real_mnist_checksums_and_counts():
    x, y = load_mnist_split(REAL, "test")  # verifies the MD5 of the decompressed content
    assert x.shape == (10000, 28, 28)
    np.testing.assert_array_equal(
        np.bincount(y), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    )


@pytest.mark.skipif(not REAL.is_dir(), reason="real MNIST files not present")
def test_real_mnist_corrupted_copy_refused(tmp_path):
    for f in REAL.glob("t10k-*"):
        shutil.copy(f, tmp_path / f.name)
    p = tmp_path / "t10k-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(p.read_bytes()))
    content[100] = (content[100] + 1) % 10  # one label changed: structure fine, MD5 not
    p.write_bytes(gzip.compress(bytes(content)))
    with pytest.raises(MNISTDataError, match="MD5"):
        load_mnist_split(tmp_path, "test")
