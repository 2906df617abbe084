"""Tiny models for the dualdrop.nn tests (importable by pickle under a unique module name)."""

import torch
import torch.nn as nn


class TinyMLP(nn.Module):
    """A small LeNet-like MLP (two hidden layers) for fast tests."""

    def __init__(self, d_in=20, h1=24, h2=16, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, h1)
        self.fc2 = nn.Linear(h1, h2)
        self.fc3 = nn.Linear(h2, d_out)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))
