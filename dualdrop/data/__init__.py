"""Dataset loaders: MNIST IDX files (verified, downloadable) and the embedded sklearn digits.

See :func:`load_dataset`. Nothing here imports torch.
"""

from dualdrop.data.datasets import (
    MNIST_MEAN,
    MNIST_STD,
    Dataset,
    is_full_mnist,
    load_dataset,
    load_digits_dataset,
    load_mnist,
    split_train_val,
)
from dualdrop.data.mnist import (
    MD5,
    MIRRORS,
    MNISTDataError,
    download_mnist,
    load_idx,
    load_mnist_split,
    write_idx,
)

__all__ = [
    "MD5", "MIRRORS", "MNIST_MEAN", "MNIST_STD", "Dataset", "MNISTDataError", "download_mnist",
    "is_full_mnist", "load_dataset", "load_digits_dataset", "load_idx", "load_mnist",
    "load_mnist_split", "split_train_val", "write_idx",
]
