"""Tiny models for the dualdrop.nn tests (importable by pickle under a unique module name), and
the few training steps many tests take."""

import torch
import torch.nn as nn


def train_steps(model, sp, make_batch, steps=3):
    """``steps`` Adam steps (lr 1e-2) on ``make_batch(model) + sp.regularizer(100)``, with the
    method's ``after_step``; returns the optimizer."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for s in range(1, steps + 1):
        loss = make_batch(model) + sp.regularizer(100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, s, steps)
    return opt


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


class Zoo(nn.Module):
    """Every kind of weight-bearing layer, a tied weight and a module under two names.

    ``head.weight`` is ``emb.weight`` (an Embedding tied to the output Linear); ``mid2`` is
    ``mid`` (one Linear registered twice, used twice)."""

    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.conv = nn.Conv1d(d, d, 3, padding=1)
        self.up = nn.ConvTranspose2d(1, 2, 3, stride=2)
        self.mid = nn.Linear(d, d)
        self.mid2 = self.mid
        self.head = nn.Linear(d, vocab)
        self.head.weight = self.emb.weight

    def forward(self, tok):
        x = self.emb(tok)                                   # (B, L, d)
        x, _ = self.lstm(x)
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.norm(x + a)
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        u = self.up(x.unsqueeze(1))                         # (B, 2, 2L + 1, 2d + 1)
        x = x + u.mean(1)[:, :x.shape[1], :x.shape[2]]
        x = self.mid2(torch.relu(self.mid(x)))
        return self.head(x)


def same_noise(module, seed=1234):
    """Make the next training forward of ``module`` draw the same noise as the last call did:
    torch's generator reseeded and every counter-based noise counter back to 0."""
    import torch

    from dualdrop.nn._base import NoiseState

    torch.manual_seed(seed)
    for m in module.modules():
        if isinstance(m, NoiseState):
            m.noise_count = 0
