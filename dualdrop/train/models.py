"""Networks for the sparsification experiments."""

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
