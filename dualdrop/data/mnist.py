"""MNIST from the standard IDX files: reading, checksum verification, download.

The four files of the MNIST database (LeCun, Cortes, Burges) are looked up in a directory, in
either of two layouts:

- flat: ``DIR/train-images-idx3-ubyte[.gz]`` and the three sibling files;
- torchvision's: ``DIR/MNIST/raw/train-images-idx3-ubyte[.gz]`` (also ``DIR/raw/...``).

Each file may be gzip-compressed or not. What is verified is the MD5 of the *decompressed*
content (``MD5`` below), which does not depend on how (or whether) the file was compressed.

Nothing here imports torch: the arrays are plain numpy ``uint8`` (images, ``n x 28 x 28``) and
``int64`` (labels).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

# file stem -> (MD5 of the decompressed content, number of items, item shape)
FILES: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "train-images-idx3-ubyte": ("6bbc9ace898e44ae57da46a324031adb", 60000, (28, 28)),
    "train-labels-idx1-ubyte": ("a25bea736e30d166cdddb491f175f624", 60000, ()),
    "t10k-images-idx3-ubyte": ("2646ac647ad5339dbf082846283269ea", 10000, (28, 28)),
    "t10k-labels-idx1-ubyte": ("27ae3e4e09519cfbb04c329615203637", 10000, ()),
}
MD5 = {stem: v[0] for stem, v in FILES.items()}

SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# Usual public mirrors (tried in order). The gzip wrappers differ between mirrors; the check is
# on the decompressed content, so any faithful copy passes.
MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)

# IDX type codes (third byte of the magic number) -> numpy dtype (big-endian on disk)
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class MNISTDataError(ValueError):
    """A missing, truncated, corrupt or unverifiable MNIST file (a ``ValueError``)."""


def _candidate_dirs(data_dir: Path) -> list[Path]:
    return [data_dir, data_dir / "MNIST" / "raw", data_dir / "raw"]


def find_file(data_dir: str | os.PathLike, stem: str) -> Path:
    """Path of ``stem`` (``.gz`` or uncompressed) under ``data_dir`` in a supported layout.

    Raises
    ------
    FileNotFoundError
        Naming every place looked at, and how to obtain the files.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"data_dir={str(data_dir)!r} is not a directory; pass the folder holding the MNIST "
            "IDX files (e.g. data/mnist), or call dualdrop.data.download_mnist(DIR) on a "
            "machine with network"
        )
    tried = []
    for d in _candidate_dirs(data_dir):
        for name in (stem + ".gz", stem):
            p = d / name
            tried.append(str(p))
            if p.is_file():
                return p
    raise FileNotFoundError(
        f"MNIST file {stem!r} not found (looked for {', '.join(tried)}); put the four IDX files "
        "(gzip or not) in data_dir or data_dir/MNIST/raw, or call "
        "dualdrop.data.download_mnist(data_dir) on a machine with network"
    )


def read_bytes(path: str | os.PathLike) -> bytes:
    """Decompressed content of an IDX file (gzip detected from its magic bytes, not its name)."""
    path = Path(path)
    with open(path, "rb") as fh:
        raw = fh.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise MNISTDataError(
                f"{path}: corrupt or truncated gzip stream ({exc}); delete the file and "
                "download it again"
            ) from exc
    return raw


def parse_idx(content: bytes, source: str = "<bytes>") -> np.ndarray:
    """Parse IDX bytes into an array, checking the header and the exact payload length."""
    if len(content) < 4:
        raise MNISTDataError(f"{source}: {len(content)} bytes, too short for an IDX header")
    zero0, zero1, code, ndim = struct.unpack(">BBBB", content[:4])
    if zero0 != 0 or zero1 != 0 or code not in _IDX_DTYPES or ndim == 0:
        raise MNISTDataError(
            f"{source}: not an IDX file (magic bytes {content[:4].hex()}); expected "
            "00 00 <type> <ndim>"
        )
    header = 4 + 4 * ndim
    if len(content) < header:
        raise MNISTDataError(f"{source}: truncated IDX header")
    shape = struct.unpack(">" + "I" * ndim, content[4:header])
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(content) - header
    if got != expected:
        raise MNISTDataError(
            f"{source}: header announces shape {shape} ({expected} payload bytes) but the file "
            f"holds {got}; the file is truncated or corrupt: download it again"
        )
    arr = np.frombuffer(content, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def load_idx(path: str | os.PathLike, md5: str | None = None) -> np.ndarray:
    """Read one IDX file (gzip or not); verify the MD5 of its decompressed content if given."""
    content = read_bytes(path)
    if md5 is not None:
        got = hashlib.md5(content).hexdigest()
        if got != md5:
            raise MNISTDataError(
                f"{path}: MD5 of the decompressed content is {got}, expected {md5}; the file is "
                "corrupt, truncated or not the MNIST file its name says: download it again "
                "(or pass verify=False to skip the check for a deliberately modified copy)"
            )
    return parse_idx(content, str(path))


def load_mnist_split(
    data_dir: str | os.PathLike, split: str = "train", verify: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Images (``uint8``, n x 28 x 28) and labels (``int64``) of MNIST's ``train`` or ``test`` split.

    Parameters
    ----------
    data_dir : folder with the IDX files (flat, or torchvision's ``MNIST/raw``).
    split : ``"train"`` (60000) or ``"test"`` (10000).
    verify : check the MD5 of the decompressed content against the known values. With
        ``verify=False`` (for custom IDX files, e.g. in tests) only the IDX structure is checked.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; expected one of {sorted(SPLITS)}")
    img_stem, lab_stem = SPLITS[split]
    images = load_idx(find_file(data_dir, img_stem), MD5[img_stem] if verify else None)
    labels = load_idx(find_file(data_dir, lab_stem), MD5[lab_stem] if verify else None)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise MNISTDataError(
            f"{img_stem}: expected a 3-d uint8 IDX array (n x rows x cols), got "
            f"{images.ndim}-d {images.dtype}"
        )
    if labels.ndim != 1:
        raise MNISTDataError(f"{lab_stem}: expected a 1-d IDX array, got {labels.ndim}-d")
    if images.shape[0] != labels.shape[0]:
        raise MNISTDataError(
            f"{split} split: {images.shape[0]} images but {labels.shape[0]} labels; the files do "
            "not belong together"
        )
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise MNISTDataError(f"{lab_stem}: labels outside 0..9 (min {labels.min()}, max {labels.max()})")
    return images, labels


def download_mnist(
    data_dir: str | os.PathLike,
    mirrors: tuple[str, ...] = MIRRORS,
    timeout: float = 60.0,
    overwrite: bool = False,
) -> Path:
    """Download the four MNIST IDX files (gzip) into ``data_dir`` and verify them.

    Each file is fetched from the first mirror that answers, written to a temporary file, checked
    (MD5 of the decompressed content) and only then moved into place. Files already present and
    valid are kept unless ``overwrite``. Requires network access; raises ``RuntimeError`` naming
    every mirror tried when a file cannot be obtained.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    for stem, md5 in MD5.items():
        target = data_dir / (stem + ".gz")
        if target.is_file() and not overwrite:
            try:
                load_idx(target, md5)
                continue
            except MNISTDataError:
                pass  # present but bad: fetch again
        errors = []
        for base in mirrors:
            url = base + stem + ".gz"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    payload = resp.read()
                content = gzip.decompress(payload) if payload[:2] == b"\x1f\x8b" else payload
                got = hashlib.md5(content).hexdigest()
                if got != md5:
                    raise MNISTDataError(f"MD5 {got} != {md5}")
            except Exception as exc:  # network or content error: try the next mirror
                errors.append(f"{url}: {exc}")
                continue
            fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=stem, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(gzip.compress(content))
            os.replace(tmp, target)
            break
        else:
            raise RuntimeError(f"could not download {stem}: " + "; ".join(errors))
    return data_dir


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``array`` (uint8 or int32/float) as an IDX file; gzip if ``compress`` or name ends .gz.

    Used to build small MNIST-shaped files (tests, subsets); the inverse of :func:`load_idx`.
    """
    path = Path(path)
    array = np.asarray(array)
    codes = {v.newbyteorder("="): k for k, v in _IDX_DTYPES.items()}
    dt = array.dtype.newbyteorder("=")
    if dt not in codes:
        raise TypeError(f"array dtype {array.dtype} has no IDX type code; use uint8/int32/float32")
    if array.ndim == 0:
        raise ValueError("array must have at least one dimension")
    header = struct.pack(">BBBB", 0, 0, codes[dt], array.ndim)
    header += struct.pack(">" + "I" * array.ndim, *array.shape)
    content = header + array.astype(_IDX_DTYPES[codes[dt]], copy=False).tobytes()
    if compress is None:
        compress = path.suffix == ".gz"
    with open(path, "wb") as fh:
        fh.write(gzip.compress(content) if compress else content)
    return path
