"""Cases ``dualdrop.nn`` handled silently or not at all: a frozen weight under adaprox, NaN weights
in ``density()``, zero-size layers."""

import warnings

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import sparsify
from nn_tiny_models import train_steps


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _steps(model, sp, n=5):
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
    train_steps(model, sp, lambda m: m(x).pow(2).mean(), steps=n)


@pytest.mark.parametrize("method,hp", [("adaprox", {}), ("penalty:mcp",
                                                          {"algorithm": "adaprox"})])
def test_adaprox_leaves_a_frozen_weight_as_it_is(method, hp):
    torch.manual_seed(0)
    model = Net()
    model.fc1.weight.requires_grad_(False)
    frozen = model.fc1.weight.detach().clone()
    trained = model.fc2.weight.detach().clone()
    sp = sparsify(model, method, lam=0.5, **hp)
    _steps(model, sp)                        # the optimizer holds the frozen weight too
    assert torch.equal(model.fc1.parametrizations.weight.original, frozen)
    assert not torch.equal(model.fc2.parametrizations.weight.original, trained)


def test_density_names_weights_holding_nan():
    torch.manual_seed(0)
    model = Net()
    sp = sparsify(model, "logsum")
    with torch.no_grad():
        model.fc2.parametrizations.weight.original[0, :3] = float("nan")
    with pytest.warns(RuntimeWarning, match=r"NaN or inf entries.*fc2 \(3 of 24\)"):
        d = sp.density()
    assert d["fc1"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sparsify(Net(), "logsum").density()          # finite weights: no warning


class WithEmpty(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.empty, self.fc2 = nn.Linear(6, 8), nn.Linear(6, 0), nn.Linear(8, 3)

    def forward(self, x):
        return torch.cat([self.fc2(torch.relu(self.fc1(x))), self.empty(x)], 1)


@pytest.mark.parametrize("method", ["logsum", "vardrop-lr", "magnitude", "hardconcrete-neuron",
                                    "eta-trick"])
def test_a_zero_size_layer_is_named_and_skipped(method):
    torch.manual_seed(0)
    model = WithEmpty()
    with pytest.warns(UserWarning, match=r"empty\.weight .*no entries \(shape \(0, 6\)\)"):
        sp = sparsify(model, method, target_density=0.5)
    assert sp.targets == ["fc1", "fc2"]
    _steps(model, sp)
    d = sp.density()
    assert set(d) == {"fc1", "fc2", "total"} and 0 < d["total"] <= 1
