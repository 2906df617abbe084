"""Depth as a granularity: whole blocks removed by ShortGPT's block influence or by the
reconstruction loss of skipping each one; the shallower model loads back."""

import copy

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import prune_oneshot
from dualdrop.nn.oneshot.depth import DepthResult, block_importance, prune_depth

from tests.nn.hf_tiny_models import ids, tiny_bert, tiny_llama


class Residual(nn.Module):
    def __init__(self, width, scale):
        super().__init__()
        self.f = nn.Linear(width, width)
        with torch.no_grad():
            self.f.weight.mul_(scale)
            self.f.bias.mul_(scale)

    def forward(self, x):
        return x + self.f(x)


class Stack(nn.Module):
    def __init__(self, scales, width=8):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Residual(width, s) for s in scales)
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


def test_block_influence_is_one_minus_the_cosine_of_input_and_output():
    model = Stack([1.0, 0.0, 0.3])
    X = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    bi = block_importance(model, [X[:20], X[20:]], metric="cosine")
    # independent derivation: the hidden states in order
    h0 = X
    h1 = model.layers[0](h0)
    h2 = model.layers[1](h1)
    h3 = model.layers[2](h2)
    with torch.no_grad():
        want = [1 - float(torch.cosine_similarity(a, b, -1).mean())
                for a, b in ((h0, h1), (h1, h2), (h2, h3))]
    assert bi == pytest.approx(want, abs=1e-6)
    assert bi[1] == pytest.approx(0.0, abs=1e-12)  # an identity block


def test_reconstruction_metric_and_removal():
    model = Stack([1.0, 0.0, 0.3, 1.0])
    X = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model(X)
    rec = block_importance(model, [X], metric="reconstruction")
    skip = copy.deepcopy(model)
    skip.layers[2] = nn.Identity()
    with torch.no_grad():
        want = float(((skip(X) - y) ** 2).sum() / (y ** 2).sum())
    assert rec[2] == pytest.approx(want, rel=1e-6) and rec[1] == 0.0
    res = prune_depth(model, [X], target_density=0.5, metric="reconstruction")
    assert isinstance(res, DepthResult) and res.removed == [1, 2] and res.kept == [0, 3]
    assert len(model.layers) == 2 and res.params_after < res.params_before


def test_prune_oneshot_block_granularity_hf_loads_back(tmp_path):
    from transformers import BertModel

    model = tiny_bert(num_hidden_layers=4)
    x = ids(n=4, t=9)
    res = prune_oneshot(model, [{"input_ids": x}], granularity="block", target_density=0.5,
                        progress=False)
    assert len(res.kept) == 2 and model.config.num_hidden_layers == 2
    assert len(model.encoder.layer) == 2
    model.save_pretrained(tmp_path)
    back = BertModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(back(x).last_hidden_state, model(x).last_hidden_state, atol=1e-5)
    with pytest.raises(ValueError, match="pattern"):
        prune_oneshot(tiny_bert(num_hidden_layers=4), [{"input_ids": x}], granularity="block",
                      target_density=0.5, pattern="2:4")


def test_decoder_blocks_renumbered_for_the_cache():
    model = tiny_llama(num_hidden_layers=4)
    x = ids(n=2, t=6)
    res = prune_depth(model, [{"input_ids": x}], target_density=0.5)
    assert [blk.self_attn.layer_idx for blk in model.model.layers] == [0, 1]
    assert model.config.num_hidden_layers == 2 and len(res.removed) == 2
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, 9)


def test_depth_then_heal_matches_kept_blocks():
    from dualdrop.train import heal

    teacher = Stack([1.0, 0.05, 0.3, 1.0])
    student = copy.deepcopy(teacher)
    X = torch.randn(128, 8, generator=torch.Generator().manual_seed(2))
    res = prune_depth(student, [X], target_density=0.5)
    with torch.no_grad():
        before = float(((student(X) - teacher(X)) ** 2).mean())
    heal(res, teacher, X, steps=40, lr=3e-3, loss="mse", block_weight=0.1, progress=False)
    with torch.no_grad():
        after = float(((student(X) - teacher(X)) ** 2).mean())
    assert after < before
