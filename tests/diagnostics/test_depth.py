"""depth_regularity and the 1/L-scaled residual MLP (Marion et al.'s neural-ODE diagnostic)."""

import math

import pytest
import torch
from torch import nn

from dualdrop.diagnostics import depth_regularity, residual_mlp


def test_profile_against_hand_computation():
    g = torch.Generator().manual_seed(0)
    W = [torch.randn(3, 3, generator=g) for _ in range(5)]
    b = [torch.randn(3, generator=g) for _ in range(5)]
    r = depth_regularity(W, b)
    diffs = [float((W[i + 1] - W[i]).double().norm()) for i in range(4)]
    assert r["depth"] == 5
    assert r["diff"] == pytest.approx(diffs)
    assert r["lipschitz"] == pytest.approx(5 * max(diffs))
    assert r["lipschitz_mean"] == pytest.approx(5 * sum(diffs) / 4)
    assert r["norm"] == pytest.approx([float(w.double().norm()) for w in W])
    assert r["bias_lipschitz"] == pytest.approx(
        5 * max(float((b[i + 1] - b[i]).double().norm()) for i in range(4)))


def test_tied_init_is_constant_and_scale_is_one_over_depth():
    net = residual_mlp(4, 6, 10, 3, init="tied")
    r = depth_regularity(net)
    assert r["lipschitz"] == 0.0 and r["bias_lipschitz"] == 0.0
    assert all(blk.scale == pytest.approx(0.1) for blk in net.blocks)
    # the forward is the Euler scheme h <- h + (1/L) tanh(W h + b)
    x = torch.randn(2, 4)
    h = net.embed(x)
    W, b = net.blocks[0].linear.weight, net.blocks[0].linear.bias
    for _ in range(10):
        h = h + 0.1 * torch.tanh(h @ W.T + b)
    torch.testing.assert_close(net(x), net.readout(h))


def test_smooth_bounded_iid_growing_in_depth():
    lip = {(init, L): depth_regularity(residual_mlp(8, 16, L, 2, init=init, seed=1))["lipschitz"]
           for init in ("smooth", "iid") for L in (16, 256)}
    # smooth: L max ||W(s + 1/L) - W(s)|| -> max ||W'|| <= pi sqrt(||A||^2 + ||B||^2),
    # about pi * sqrt(2) * 4
    assert lip["smooth", 256] == pytest.approx(lip["smooth", 16], rel=0.1)
    assert lip["smooth", 256] < math.pi * math.sqrt(2) * 4 * 1.5
    # iid: consecutive differences have norm ~ sqrt(2) * ||W||_F = sqrt(2) * 4: Lip grows like L
    assert lip["iid", 256] / lip["iid", 16] > 12
    assert lip["iid", 16] > 16 * math.sqrt(2) * 4 * 0.9


def test_generic_model_and_errors():
    seq = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 5),
                        nn.Linear(5, 5), nn.Linear(5, 2))
    r = depth_regularity(seq)
    assert r["depth"] == 3
    with pytest.raises(ValueError, match="same shape"):
        depth_regularity([torch.zeros(2, 2), torch.zeros(3, 3)])
    with pytest.raises(ValueError, match="at least 2"):
        depth_regularity([torch.zeros(2, 2)])
    with pytest.raises(ValueError, match="init="):
        residual_mlp(2, 2, 2, 2, init="random")
    with pytest.raises(ValueError, match="depth="):
        residual_mlp(2, 2, 0, 2)
    with pytest.raises(TypeError, match="weights must be"):
        depth_regularity(torch.zeros(3, 2, 2))


def test_sparsified_model_reads_the_pruned_weights():
    from dualdrop.nn import sparsify

    net = residual_mlp(4, 8, 6, 2, init="tied")
    before = depth_regularity(net)
    sp = sparsify(net, "magnitude", include=["blocks.*"], sparsity=0.5, begin=0.0, end=0.01,
                  min_layer_density=0.0)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    sp.after_step(opt, 1, 100)
    r = depth_regularity(net)
    assert sp.density()["total"] == pytest.approx(0.5, abs=0.05)
    assert r["norm"][0] < before["norm"][0]     # the effective (pruned) weight is read
    eff = net.blocks[0].linear.weight.detach()
    assert float((eff == 0).float().mean()) == pytest.approx(0.5, abs=0.1)
