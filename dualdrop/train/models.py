"""Networks for the sparsification experiments: LeNet-300-100 and LeNet-5-Caffe."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class LeNet300100(nn.Module):
    """LeNet-300-100: ``n_features -> 300 -> 100 -> n_classes`` with ReLU, plain ``nn.Linear`` layers.

    The input size follows the data (784 for MNIST's 28x28 images, 64 for scikit-learn's 8x8
    digits); inputs of shape ``(batch, *image)`` are flattened. The layers are named ``fc1``,
    ``fc2``, ``fc3`` so that per-layer reports read naturally.
    """

    def __init__(self, n_features: int = 784, n_classes: int = 10,
                 hidden: Sequence[int] = (300, 100)):
        super().__init__()
        for name, v in (("n_features", n_features), ("n_classes", n_classes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}; expected a positive int")
        hidden = tuple(hidden)
        if len(hidden) != 2 or any(isinstance(h, bool) or not isinstance(h, int) or h < 1
                                   for h in hidden):
            raise ValueError(f"hidden={hidden!r}; expected two positive ints, e.g. (300, 100)")
        self.n_features = n_features
        self.fc1 = nn.Linear(n_features, hidden[0])
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.fc3 = nn.Linear(hidden[1], n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)
        if x.shape[1] != self.n_features:
            raise ValueError(
                f"input has {x.shape[1]} features per sample but the network was built for "
                f"{self.n_features}; build it with n_features equal to the data's "
                "(784 for MNIST, 64 for the embedded digits)"
            )
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def lenet_300_100(n_features: int = 784, n_classes: int = 10) -> LeNet300100:
    """LeNet-300-100 (784-300-100-10 on MNIST); see :class:`LeNet300100`."""
    return LeNet300100(n_features, n_classes)


class LeNet5(nn.Module):
    """LeNet-5-Caffe: conv 5x5 (20) - max-pool 2 - conv 5x5 (50) - max-pool 2 - fc 500 - fc.

    The network of the Caffe MNIST example, used by Han et al. (2015), Molchanov et al. (2017)
    and Louizos et al. (2018) for sparsification: on 28x28 MNIST the flattened feature map has
    800 = 50 * 4 * 4 entries (``fc1``: 800 -> 500), 431k weights in all. ReLU after ``fc1``
    only, as in the Caffe model. Inputs ``(batch, n_features)`` with ``n_features`` a square
    (784: 28x28) or ``(batch, 1, side, side)``.
    """

    def __init__(self, n_features: int = 784, n_classes: int = 10):
        super().__init__()
        side = int(round(n_features ** 0.5)) if isinstance(n_features, int) else 0
        if isinstance(n_features, bool) or not isinstance(n_features, int) or side * side != \
                n_features:
            raise ValueError(f"n_features={n_features!r}; LeNet-5 needs square images "
                             "(784 for MNIST's 28x28)")
        spatial = ((side - 4) // 2 - 4) // 2
        if spatial < 1:
            raise ValueError(f"LeNet-5 needs images of at least 16x16, got {side}x{side} "
                             "(use --model lenet300 for the embedded 8x8 digits)")
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
            raise ValueError(f"n_classes={n_classes!r}; expected a positive int")
        self.side = side
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(50 * spatial * spatial, 500)
        self.fc2 = nn.Linear(500, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], 1, self.side, self.side)
        x = nn.functional.max_pool2d(self.conv1(x), 2)
        x = nn.functional.max_pool2d(self.conv2(x), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


#: network name -> constructor ``f(n_features, n_classes)``
MODELS = {"lenet300": lenet_300_100, "lenet5": LeNet5}
DEFAULT_MODEL = "lenet300"


def build_model(name: str, n_features: int, n_classes: int) -> nn.Module:
    """The network ``name`` (a key of :data:`MODELS`) for the data's sizes."""
    if name not in MODELS:
        raise ValueError(f"model={name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name](n_features, n_classes)


def example_model(name: str) -> nn.Module:
    """A throwaway network ``name`` at its constructor's default sizes, to check options that
    depend on the architecture alone (the names of its layers, whether a method accepts its
    hyperparameters) before any data is loaded."""
    if name not in MODELS:
        raise ValueError(f"model={name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name]()
