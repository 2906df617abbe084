"""Property-based checks of prune_oneshot over random models, budgets, dtypes and calibration
sizes: the budget met exactly (or raised with a warning where it would empty a layer), the
masks equal to the weights' nonzeros, nothing left behind (hooks, modes), refused calls that
change nothing, tied and unused layers left as they were and named."""

import copy
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from dualdrop.nn import prune_oneshot

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class MLP(nn.Module):
    def __init__(self, widths, tie=False, unused=False):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.tied = None
        if tie:  # a layer sharing the last layer's weight
            self.tied = nn.Linear(widths[-2], widths[-1])
            self.tied.weight = self.layers[-1].weight
        self.unused = nn.Linear(3, 3) if unused else None

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        if self.tied is not None:
            x = x + 0.0 * self.tied.bias.sum()
        return x


widths = st.lists(st.integers(1, 12), min_size=2, max_size=4)


def hooks_left(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@SETTINGS
@given(widths=widths, density=st.floats(0.01, 1.0), n=st.integers(1, 40),
       method=st.sampled_from(["magnitude", "wanda", "sparsegpt"]),
       double=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_the_budget_is_met_and_nothing_is_left_behind(widths, density, n, method, double,
                                                      seed):
    torch.manual_seed(seed)
    net = MLP(widths).train()
    dtype = torch.float64 if double else torch.float32
    net.to(dtype)
    x = torch.randn(n, widths[0], dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = prune_oneshot(net, x, method, target_density=density, progress=False)
    sizes = [(layer.out_features, layer.in_features) for layer in net.layers]
    total = sum(o * i for o, i in sizes)
    kept = [r["kept"] for r in res.report.layers]
    emptied = any("no weight at all" in str(w.message) for w in caught)
    if not emptied:
        assert sum(kept) == round(density * total)
    else:  # raised to one weight per output row where the budget emptied a layer
        assert sum(kept) >= round(density * total)
    assert all(k >= 1 for k in kept)
    for name, mask in res.masks.items():
        assert torch.equal(mask, dict(net.named_parameters())[name] != 0)
    assert hooks_left(net) == 0 and net.training
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert all(0.0 <= r["objective"] or math.isnan(r["objective"]) for r in res.report.layers)


@SETTINGS
@given(groups=st.lists(st.integers(1, 3), min_size=1, max_size=3), n=st.integers(1, 30),
       method=st.sampled_from(["magnitude", "wanda", "sparsegpt"]), seed=st.integers(0, 999))
def test_n_m_patterns_hold_in_every_group(groups, n, method, seed):
    torch.manual_seed(seed)
    widths = [4 * g for g in groups] + [5]
    net = MLP(widths)
    res = prune_oneshot(net, torch.randn(n, widths[0]), method, pattern="2:4", progress=False)
    for layer in net.layers:
        nz = (layer.weight != 0).reshape(layer.out_features, -1, 4).sum(-1)
        assert int(nz.max()) <= 2
    assert len(res.report.layers) == len(widths) - 1


@SETTINGS
@given(widths=st.lists(st.integers(1, 9), min_size=2, max_size=3).filter(
    lambda w: any(v % 4 for v in w[:-1])), seed=st.integers(0, 999))
def test_a_refused_pattern_changes_nothing(widths, seed):
    torch.manual_seed(seed)
    net = MLP(widths).train()
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match="multiple of 4"):
        prune_oneshot(net, torch.randn(8, widths[0]), "magnitude", pattern="2:4",
                      progress=False)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert hooks_left(net) == 0 and net.training


@SETTINGS
@given(widths=st.lists(st.integers(2, 8), min_size=3, max_size=4), seed=st.integers(0, 999))
def test_tied_and_unused_layers_are_named_and_left_as_they_were(widths, seed):
    torch.manual_seed(seed)
    net = MLP(widths, tie=True, unused=True)
    tied = net.layers[-1].weight.detach().clone()
    unused = net.unused.weight.detach().clone()
    with pytest.warns(UserWarning) as record:
        prune_oneshot(net, torch.randn(16, widths[0]), "magnitude", target_density=0.5,
                      progress=False)
    text = " ".join(str(w.message) for w in record)
    assert "tied" in text and "unused" in text
    assert torch.equal(net.layers[-1].weight, tied)
    assert torch.equal(net.unused.weight, unused)
