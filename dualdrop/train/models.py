"""Networks for the sparsification experiments: LeNet-300-100 and LeNet-5-Caffe (the field's
MNIST benchmarks), and a small residual network and a small Transformer for structured sparsity
(whole channels and attention heads) on the same data."""

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


def _image_side(n_features, model: str) -> int:
    side = int(round(n_features ** 0.5)) if isinstance(n_features, int) else 0
    if isinstance(n_features, bool) or not isinstance(n_features, int) or side * side != \
            n_features:
        raise ValueError(f"n_features={n_features!r}; {model} needs square images "
                         "(784 for MNIST's 28x28)")
    return side


def _check_classes(n_classes):
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
        raise ValueError(f"n_classes={n_classes!r}; expected a positive int")


class BasicBlock(nn.Module):
    """He et al.'s (2016) basic residual block: ``relu(bn(conv(relu(bn(conv(x))))) + s(x))``,
    ``s`` the identity, or a strided 1x1 convolution with BatchNorm when the width or the
    resolution changes. Removing a channel of the block's output couples both sides of the add
    (and every later block on the same stream), which is what the compact export must handle."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNetMNIST(nn.Module):
    """A small ResNet for 28x28 images: a 3x3 stem (16 channels) and 2x2 max-pooling, then one
    basic block per stage at 16, 32 and 64 channels (the last two with stride 2: 14x14, 7x7,
    4x4), global average pooling and a Linear classifier; 9 convolutions (two of them 1x1
    shortcuts) with BatchNorm, about 77k weights and 5.3 MFLOP per image (LeNet-5-Caffe: 4.6,
    so it trains on two CPU cores)."""

    def __init__(self, n_features: int = 784, n_classes: int = 10,
                 widths: Sequence[int] = (16, 32, 64)):
        super().__init__()
        self.side = _image_side(n_features, "the ResNet")
        _check_classes(n_classes)
        widths = tuple(widths)
        if len(widths) != 3 or any(isinstance(w, bool) or not isinstance(w, int) or w < 1
                                   for w in widths):
            raise ValueError(f"widths={widths!r}; expected three positive ints, e.g. (16, 32, 64)")
        self.stem = nn.Conv2d(1, widths[0], 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        self.layer1 = BasicBlock(widths[0], widths[0])
        self.layer2 = BasicBlock(widths[0], widths[1], stride=2)
        self.layer3 = BasicBlock(widths[1], widths[2], stride=2)
        self.fc = nn.Linear(widths[2], n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], 1, self.side, self.side)
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 2)
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean((2, 3)))


class RowTransformer(nn.Module):
    """A small Transformer encoder that reads an image as a sequence of its rows (28 tokens of
    28 pixels on MNIST): a Linear embedding of each row plus a learned position embedding, two
    pre-norm ``nn.TransformerEncoderLayer`` (width 64, 4 attention heads, feed-forward 128, no
    dropout), a final LayerNorm, the mean over tokens and a Linear classifier; about 70k
    weights and 3.8 MFLOP per image. Its attention heads (``nn.MultiheadAttention``) and
    feed-forward units are what ``granularity="head"`` prunes and the compact export removes."""

    def __init__(self, n_features: int = 784, n_classes: int = 10, d_model: int = 64,
                 heads: int = 4, ff: int = 128, layers: int = 2):
        super().__init__()
        self.side = _image_side(n_features, "the row Transformer")
        _check_classes(n_classes)
        for name, v in (("d_model", d_model), ("heads", heads), ("ff", ff), ("layers", layers)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}; expected a positive int")
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not a multiple of heads={heads}")
        self.embed = nn.Linear(self.side, d_model)
        self.pos = nn.Parameter(torch.zeros(1, self.side, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x.reshape(x.shape[0], self.side, self.side)) + self.pos
        for layer in self.encoder:
            x = layer(x)
        return self.fc(self.norm(x).mean(1))


#: network name -> constructor ``f(n_features, n_classes)``
MODELS = {"lenet300": lenet_300_100, "lenet5": LeNet5, "resnet": ResNetMNIST,
          "transformer": RowTransformer}
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
