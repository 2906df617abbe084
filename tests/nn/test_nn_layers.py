"""Layer numerics: gradchecks in float64, formulas against independent derivations."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.func import functional_call

import penalties
from dualdrop.nn import sparsify
from dualdrop.nn.hardconcrete import HardConcreteMixin
from dualdrop.nn.magnitude import target_sparsity
from dualdrop.nn.penalty import abs_threshold, logsum_dual, penalty_value
from dualdrop.nn.vardrop import kl_approx


def tiny_layer(method, conv=False, seed=0, **hp):
    torch.manual_seed(seed)
    layer = nn.Conv2d(2, 3, 3, padding=1) if conv else nn.Linear(5, 4)
    layer = layer.double()
    holder = nn.Sequential(layer)
    sp = sparsify(holder, method, **hp)
    return holder[0], sp


def seeded_call(layer, names):
    """f(x, *params) that reruns the layer with the same noise each call (for gradcheck)."""
    def f(x, *tensors):
        torch.manual_seed(1234)
        return functional_call(layer, dict(zip(names, tensors)), (x,))
    return f


GRAD_METHODS = ["vardrop", "vardrop-lr", "vardrop-lr-ar", "hardconcrete", "hardconcrete-neuron",
                "magnitude", "eta-trick", "logsum"]


@pytest.mark.parametrize("conv", [False, True])
@pytest.mark.parametrize("method", GRAD_METHODS)
def test_gradcheck_train_forward(method, conv):
    layer, _ = tiny_layer(method, conv)
    layer.train()
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for _, p in layer.named_parameters()]
    x = (torch.randn(3, 2, 4, 4) if conv else torch.randn(3, 5)).double().requires_grad_(True)
    assert torch.autograd.gradcheck(seeded_call(layer, names), (x, *params), eps=1e-6,
                                    atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", ["vardrop-lr", "vardrop-lr-ar", "hardconcrete",
                                    "hardconcrete-neuron", "eta-trick", "logsum"])
def test_gradcheck_regularizer(method):
    layer, sp = tiny_layer(method)
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for _, p in layer.named_parameters()]

    def reg(*tensors):
        saved = {n: getattr(layer, n) for n in names}
        try:
            for n, t in zip(names, tensors):
                delattr(layer, n)
                setattr(layer, n, t)
            return sp.regularizer(50)
        finally:
            for n in names:
                delattr(layer, n)
                layer.register_parameter(n, saved[n])

    assert torch.autograd.gradcheck(reg, tuple(params), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_gradcheck_eval_forward():
    layer, _ = tiny_layer("hardconcrete")
    layer.eval()
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for _, p in layer.named_parameters()]
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(seeded_call(layer, names), (x, *params), eps=1e-6, atol=1e-5)


# ---- variational dropout --------------------------------------------------------------------

def test_kl_approx_matches_penalties_dual():
    """f(eta) = 2 KL(a = 1/eta) (DUALITY.md section 3) for the lead's VarDrop penalty."""
    la = np.linspace(-6, 6, 25)
    ours = kl_approx(torch.from_numpy(la)).numpy()
    np.testing.assert_allclose(ours, penalties.get("vardrop").kl(la), rtol=1e-12)
    np.testing.assert_allclose(2 * ours, penalties.get("vardrop").f(np.exp(-la)), rtol=1e-9,
                               atol=1e-12)
    # KL vanishes as a -> inf and is positive
    assert kl_approx(torch.tensor(40.0)).abs() < 1e-8
    assert (torch.from_numpy(ours) > 0).all()


@pytest.mark.parametrize("method", ["vardrop-lr", "vardrop-lr-ar"])
def test_local_reparameterization_moments_exclude_bias(method):
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    holder = nn.Sequential(layer)
    sparsify(holder, method)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.5, -1.0, 0.2], [1.5, 0.3, -0.7]]))
        layer.bias.fill_(100.0)  # a large bias must not show up in the variance
        if method == "vardrop-lr":
            layer.log_alpha.fill_(math.log(0.3))
            var_w = 0.3 * layer.weight ** 2
        else:
            layer.log_sigma2.fill_(math.log(0.05))
            var_w = torch.full_like(layer.weight, 0.05)
    x = torch.tensor([[1.0, 2.0, -1.0]])
    layer.train()
    with torch.no_grad():
        out = layer(x.expand(200000, 3))
    mean = x @ layer.weight.T + layer.bias
    var = (x * x) @ var_w.T
    torch.testing.assert_close(out.mean(0), mean[0].detach(), atol=0.02, rtol=0)
    torch.testing.assert_close(out.var(0), var[0].detach(), rtol=0.02, atol=0)


def test_vardrop_weight_noise_is_one_sample_per_minibatch():
    layer, _ = tiny_layer("vardrop")
    with torch.no_grad():
        layer.log_alpha.fill_(0.0)
    x = torch.randn(1, 5, dtype=torch.float64).expand(4, 5)
    with torch.no_grad():
        out = layer(x)
    assert torch.allclose(out, out[:1].expand_as(out))  # same weights for all rows
    assert not torch.allclose(out, layer.eval()(x))


def test_vardrop_threshold_and_clipping():
    layer, sp = tiny_layer("vardrop-lr", tol=0.05)
    la = torch.linspace(-10, 10, 20, dtype=torch.float64)
    with torch.no_grad():
        layer.log_alpha.copy_(la.view(4, 5))
    clipped = layer.clipped_log_alpha()
    assert clipped.max() == 8.0 and clipped.min() == -8.0
    keep = 1.0 / (1.0 + torch.exp(clipped))
    assert torch.equal(layer.keep_mask(), keep >= 0.05)
    assert layer.log_alpha_threshold() == pytest.approx(math.log(19))
    assert sp.density()["total"] == pytest.approx(float((la <= math.log(19)).double().mean()))
    # the official code's log a >= 3 rule is tol = 1/(1 + e^3)
    layer.tol = 1.0 / (1.0 + math.exp(3.0))
    assert layer.log_alpha_threshold() == pytest.approx(3.0)


def test_vardrop_lr_ar_alpha_from_sigma():
    layer, _ = tiny_layer("vardrop-lr-ar")
    with torch.no_grad():
        layer.log_sigma2.fill_(math.log(0.01))
    expected = (math.log(0.01) - torch.log(layer.weight ** 2 + 1e-8)).clamp(-8, 8)
    torch.testing.assert_close(layer.clipped_log_alpha(), expected)


# ---- hard concrete ---------------------------------------------------------------------------

def test_hardconcrete_gates_formulas():
    layer, sp = tiny_layer("hardconcrete")
    la = torch.linspace(-4, 4, 20, dtype=torch.float64).view(4, 5)
    with torch.no_grad():
        layer.gate_logits.copy_(la)
    beta, gamma, zeta = 2 / 3, -0.1, 1.1
    z_hat = (torch.sigmoid(la) * (zeta - gamma) + gamma).clamp(0, 1)
    torch.testing.assert_close(layer.test_gates(), z_hat)
    w, _ = layer.eval_weight_bias()
    torch.testing.assert_close(w, layer.weight * z_hat)
    # P(z != 0) against Monte Carlo frequencies of sampled gates
    torch.manual_seed(0)
    with torch.no_grad():
        z = layer.sample_gates((20000, 4, 5))
    freq = (z > 0).double().mean(0)
    p = torch.sigmoid(la - beta * math.log(-gamma / zeta))
    torch.testing.assert_close(layer.prob_nonzero(), p)
    torch.testing.assert_close(freq, p.detach(), atol=0.015, rtol=0)
    assert ((z == 0) | (z == 1)).double().mean() > 0.05  # point masses exist
    assert sp.regularizer(10).item() == pytest.approx(0.1 * p.sum().item() / 10)


def test_hardconcrete_neuron_counts_weights_not_gates():
    layer, sp = tiny_layer("hardconcrete-neuron")  # Linear(5, 4): 5 input gates, 4 weights each
    assert layer.gate_logits.shape == (5,)
    assert layer.group_size() == 4
    p = layer.prob_nonzero()
    assert sp.regularizer(7).item() == pytest.approx(0.1 * 4 * p.sum().item() / 7)
    with torch.no_grad():
        layer.gate_logits.copy_(torch.tensor([-9.0, 9, 9, -9, 9], dtype=torch.float64))
    assert sp.density()["total"] == pytest.approx(12 / 20)
    conv, spc = tiny_layer("hardconcrete-neuron", conv=True)  # gates on 3 output channels
    assert conv.gate_logits.shape == (3,) and conv.group_size() == 2 * 9
    with torch.no_grad():
        conv.gate_logits.copy_(torch.tensor([-9.0, 9, 9], dtype=torch.float64))
    w, b = conv.eval_weight_bias()
    assert torch.all(w[0] == 0) and b[0] == 0 and torch.all(w[1:] != 0)
    assert isinstance(conv, HardConcreteMixin)


# ---- magnitude pruning -----------------------------------------------------------------------

def test_cubic_schedule():
    hp = {"sparsity": 0.9, "begin": 0.1, "end": 0.5}
    assert target_sparsity(hp, 0, 100) == 0.0
    assert target_sparsity(hp, 10, 100) == 0.0
    assert target_sparsity(hp, 30, 100) == pytest.approx(0.9 * (1 - 0.5 ** 3))
    assert target_sparsity(hp, 50, 100) == pytest.approx(0.9)
    assert target_sparsity(hp, 100, 100) == pytest.approx(0.9)
    vals = [target_sparsity(hp, s, 100) for s in range(101)]
    assert all(b >= a for a, b in zip(vals, vals[1:]))


def test_magnitude_pruned_weights_stay_zero_after_every_adam_step(h, tiny_data):
    X, y = tiny_data
    model = h.make_mlp()
    sp = sparsify(model, "magnitude", sparsity=0.9, prune_every=3, end=0.5)
    history = []

    def check(step):
        masks = [l.weight_mask.clone() > 0 for _, l in sp.layers]
        for (_, l), m in zip(sp.layers, masks):
            assert torch.all(l.weight[~m] == 0), f"pruned weight nonzero after step {step}"
        if history:  # masks only shrink: pruned weights never regrow
            for old, new in zip(history[-1], masks):
                assert not torch.any(new & ~old)
        history.append(masks)

    h.train(model, sp, X, y, epochs=2, lr=5e-2, check=check)
    assert sp.density()["total"] == pytest.approx(0.1, abs=0.01)
    assert len(history) == 50


def test_global_magnitude_floor_keeps_every_layer(h):
    """A layer initialized at a tiny scale would be deleted by a global threshold."""
    model = h.make_mlp()
    with torch.no_grad():
        model.fc3.weight.mul_(1e-4)
    sp = sparsify(model, "magnitude", sparsity=0.9, prune_every=1, end=0.5,
                  min_layer_density=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for s in range(1, 11):
        sp.after_step(opt, s, 10)
    d = sp.density()
    assert d["fc3"] == pytest.approx(math.ceil(0.05 * 64) / 64)
    assert d["total"] == pytest.approx(0.1, abs=0.005)
    # without the floor the whole layer goes
    model2 = h.make_mlp()
    with torch.no_grad():
        model2.fc3.weight.mul_(1e-4)
    sp2 = sparsify(model2, "magnitude", sparsity=0.9, prune_every=1, end=0.5,
                   min_layer_density=0.0)
    for s in range(1, 11):
        sp2.after_step(opt, s, 10)
    assert sp2.density()["fc3"] == pytest.approx(1 / 64)  # at least one weight, by design
    # per-layer scope prunes every layer to the same sparsity
    model3 = h.make_mlp()
    sp3 = sparsify(model3, "magnitude", sparsity=0.75, prune_every=1, scope="layer")
    for s in range(1, 11):
        sp3.after_step(None, s, 10)
    for name in ("fc1", "fc2", "fc3"):
        assert sp3.density()[name] == pytest.approx(0.25, abs=0.01)


def test_magnitude_zeroes_adam_momentum_at_pruned_entries(h, tiny_data):
    X, y = tiny_data
    model = h.make_mlp()
    sp = sparsify(model, "magnitude", sparsity=0.5, prune_every=1, end=0.1)
    opt, _ = h.train(model, sp, X, y, epochs=1, lr=1e-2)
    for _, layer in sp.layers:
        m = opt.state[layer.weight]["exp_avg"]
        assert torch.all(m[layer.weight_mask == 0] == 0)


# ---- penalty family ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, params", [("logsum", {"eps": 2.0}), ("mcp", {"a": 3.0, "lam": 0.1}),
                                          ("l1", {}), ("scad", {"a": 3.7, "lam": 0.1}),
                                          ("vardrop", {})])
def test_penalty_function_value_and_gradient(name, params):
    P = penalties.get(name, **params)
    layer, _ = tiny_layer(f"penalty:{name}", lam=0.3, penalty_params=params)
    w = (torch.randn(4, 5, dtype=torch.float64) * 0.5).requires_grad_(True)
    val = penalty_value(layer, w)
    assert val.item() == pytest.approx(0.3 * P.omega(w.detach().numpy()).sum(), rel=1e-12)
    val.backward()
    np.testing.assert_allclose(w.grad.numpy(), 0.3 * P.derivative(w.detach().numpy()),
                               rtol=1e-12)
    w2 = w.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: penalty_value(layer, t), (w2,), eps=1e-7,
                                    atol=1e-6)
    # float32 weights go through the same kernel
    w32 = w.detach().float().requires_grad_(True)
    layer32 = layer.float()
    penalty_value(layer32, w32).backward()
    np.testing.assert_allclose(w32.grad.numpy(), 0.3 * P.derivative(w.detach().numpy()),
                               rtol=1e-5)


def test_adatikhonov_value_and_gradient_equal_logsum_gradient():
    layer, _ = tiny_layer("adatikhonov", lam=0.2, eps=2.0)
    P = penalties.get("logsum", eps=2.0)
    w = torch.randn(4, 5, dtype=torch.float64).requires_grad_(True)
    v = penalty_value(layer, w, tikhonov=True)
    wn = w.detach().numpy()
    assert v.item() == pytest.approx(0.2 * 0.5 * np.sum(wn ** 2 / P.eta_hat(wn)), rel=1e-12)
    v.backward()
    np.testing.assert_allclose(w.grad.numpy(), 0.2 * wn / (np.abs(wn) * (np.abs(wn) + 2.0)),
                               rtol=1e-12)


@pytest.mark.parametrize("name, params", [("logsum", {"eps": 2.0}), ("mcp", {"a": 3.0, "lam": 0.1}),
                                          ("log2sum", {"eps": 0.01}), ("vardrop", {})])
def test_prune_rule_matches_keep_ratio(name, params):
    P = penalties.get(name, **params)
    lam, tol = 1e-2, 0.05
    t = abs_threshold(P, lam * tol / (1 - tol))
    assert t is not None
    w = np.abs(np.random.default_rng(0).standard_normal(5000)) * 3 * max(t, 1e-3)
    w = w[np.abs(w - t) > 1e-9 * max(t, 1)]
    np.testing.assert_array_equal(w >= t, P.keep_ratio(w, lam) >= tol)


def test_penalty_density_uses_keep_ratio_tol():
    layer, sp = tiny_layer("logsum", lam=1e-3, tol=0.05)
    thr = (-2.0 + math.sqrt(4.0 + 4 * 1e-3 * 0.05 / 0.95)) / 2  # |w|(|w| + 2) = lam tol/(1-tol)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([0.5 * thr, 2 * thr, -0.9 * thr, -1.1 * thr, 0.3] * 4)
                           .view(4, 5))
    assert sp.density()["total"] == pytest.approx(3 / 5)


def test_logsum_dual_and_eta_trick_minimum():
    P = penalties.get("logsum", eps=2.0)
    eta = np.logspace(-8, 4, 50)
    np.testing.assert_allclose(logsum_dual(torch.from_numpy(eta), 2.0).numpy(), P.f(eta),
                               rtol=1e-10, atol=1e-14)
    # min over log eta of the eta-trick objective is lam * Omega(w): descend in log eta only
    layer, sp = tiny_layer("eta-trick", lam=0.5, eta_decay=0.0)
    with torch.no_grad():
        layer.log_eta.zero_()
    opt = torch.optim.LBFGS([layer.log_eta], max_iter=500, tolerance_grad=1e-12,
                            tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = sp.regularizer(1)
        loss.backward()
        return loss

    opt.step(closure)
    w = layer.weight.detach().numpy()
    assert sp.regularizer(1).item() == pytest.approx(0.5 * P.omega(w).sum(), rel=1e-6)
    np.testing.assert_allclose(torch.exp(layer.log_eta).detach().numpy(), P.eta_hat(w),
                               rtol=1e-3)


def test_eta_trick_init_and_decay():
    layer, sp = tiny_layer("eta-trick", lam=1e-3, eta_decay=0.1)
    P = penalties.get("logsum", eps=2.0)
    w = layer.weight.detach().numpy()
    np.testing.assert_allclose(layer.log_eta.detach().numpy(), np.log(P.eta_hat(w)), rtol=1e-12)
    reg = sp.regularizer(1)
    expected = 1e-3 * P.omega(w).sum() + 0.05 * np.sum(np.log(P.eta_hat(w)) ** 2)
    assert reg.item() == pytest.approx(expected, rel=1e-9)
    layer.prune_rule = "eta"
    with torch.no_grad():
        layer.log_eta.copy_(torch.linspace(-15, 0, 20, dtype=torch.float64).view(4, 5))
    cut = 1e-3 * 0.05 / 0.95
    assert torch.equal(layer.keep_mask(), torch.exp(layer.log_eta) >= cut)


def test_adaprox_step_uses_adam_step_size():
    layer, sp = tiny_layer("adaprox", lam=0.05, eps=2.0)
    opt = torch.optim.Adam(layer.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    x = torch.randn(8, 5, dtype=torch.float64)
    for step in range(1, 4):
        loss = (layer(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        w = layer.weight.detach().clone()
        st = opt.state[layer.weight]
        v_hat = st["exp_avg_sq"] / (1 - 0.99 ** step)
        rho = 0.01 / (v_hat.sqrt() + 1e-8)
        eta = w.abs() * (w.abs() + 2.0)
        expected = w * eta / (eta + rho * 0.05)
        sp.after_step(opt, step, 3)
        torch.testing.assert_close(layer.weight.detach(), expected, rtol=1e-12, atol=0)
    assert sp.regularizer(10).item() == 0.0
    # SGD: rho = lr
    layer2, sp2 = tiny_layer("adaprox", lam=0.05)
    opt2 = torch.optim.SGD(layer2.parameters(), lr=0.1)
    w = layer2.weight.detach().clone()
    sp2.after_step(opt2, 1, 3)
    eta = w.abs() * (w.abs() + 2.0)
    torch.testing.assert_close(layer2.weight.detach(), w * eta / (eta + 0.1 * 0.05))


def test_eta_trick_fused_objective_matches_plain_autograd():
    layer, sp = tiny_layer("eta-trick", lam=0.3, eps=1.5, eta_decay=0.02)
    with torch.no_grad():
        layer.log_eta.copy_(torch.randn(4, 5, dtype=torch.float64) * 3)
    reg = sp.regularizer(1)
    reg.backward()
    gw, ge = layer.weight.grad.clone(), layer.log_eta.grad.clone()
    w = layer.weight.detach().clone().requires_grad_(True)
    le = layer.log_eta.detach().clone().requires_grad_(True)
    eta = torch.exp(le)
    ref = 0.3 * 0.5 * (w * w / eta + logsum_dual(eta, 1.5)).sum() + 0.01 * (le * le).sum()
    ref.backward()
    assert reg.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(gw, w.grad, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(ge, le.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name, params", [("logsum", {"eps": 2.0}), ("logsum", {"eps": 0.1}),
                                          ("l1", {}), ("lp", {"p": 0.5}), ("lp", {"p": 1.5}),
                                          ("log2sum", {"eps": 0.3}),
                                          ("mcp", {"a": 3.0, "lam": 0.1}),
                                          ("scad", {"a": 3.7, "lam": 0.2})])
def test_torch_forms_match_penalties(name, params):
    """The torch speed path reproduces the penalties object (omega, derivative, eta_hat)."""
    from dualdrop.nn.penalty import TORCH_FORMS, torch_form

    P = penalties.get(name, **params)
    assert torch_form(P) == name
    w = np.concatenate([[0.0, 1e-12, -1e-6], np.linspace(-3, 3, 601),
                        np.random.default_rng(1).standard_normal(200) * 0.3])
    wt = torch.from_numpy(w)
    om, d, eta = TORCH_FORMS[name](wt, wt.abs(), P.params)
    np.testing.assert_allclose(om.numpy(), P.omega(w), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(d.numpy(), P.derivative(w), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(eta.numpy(), P.eta_hat(w), rtol=1e-12, atol=1e-15)
    # and the layer's regularizer agrees with the generic kernel path
    layer, _ = tiny_layer(f"penalty:{name}", lam=0.7, penalty_params=params)
    wt4 = torch.from_numpy(w[:20].reshape(4, 5)).clone().requires_grad_(True)
    fast = penalty_value(layer, wt4)
    (g_fast,) = torch.autograd.grad(fast, wt4)
    layer._torch_form = None
    slow = penalty_value(layer, wt4)
    (g_slow,) = torch.autograd.grad(slow, wt4)
    assert fast.item() == pytest.approx(slow.item(), rel=1e-12)
    torch.testing.assert_close(g_fast, g_slow, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("method, kw", [("adaprox", {"lam": 0.05}),
                                        ("penalty:mcp", {"lam": 0.05, "algorithm": "adaprox",
                                                         "penalty_params": {"a": 2.0,
                                                                            "lam": 0.2}})])
def test_adaprox_generic_kernel_path_matches_torch_form(method, kw):
    a, spa = tiny_layer(method, seed=3, **kw)
    b, spb = tiny_layer(method, seed=3, **kw)
    b._torch_form = None  # force the numba loop over penalties.kernels
    for layer, sp in ((a, spa), (b, spb)):
        with torch.no_grad():
            layer.weight.mul_(3.0)  # some beyond MCP's flat part (eta_hat = inf)
        opt = torch.optim.Adam(layer.parameters(), lr=0.2)
        layer(torch.ones(2, 5, dtype=torch.float64)).sum().backward()
        opt.step()
        sp.after_step(opt, 1, 2)
    torch.testing.assert_close(a.weight, b.weight, rtol=1e-12, atol=1e-15)


def test_adaprox_zero_step_is_identity_and_never_nan():
    """A zero learning rate (the last step of a linear decay) must not turn exact zeros into NaN."""
    import torch

    from dualdrop.nn import sparsify

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4))
    sp = sparsify(model, "adaprox")
    with torch.no_grad():
        model[0].weight[:, :3] = 0.0
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    model(torch.randn(5, 6)).sum().backward()
    opt.step()
    before = model[0].weight.detach().clone()
    sp.after_step(opt, 1, 10)
    assert torch.isfinite(model[0].weight).all()
    assert torch.equal(model[0].weight, before)


@pytest.mark.parametrize("method", ["vardrop", "vardrop-lr", "vardrop-lr-ar", "hardconcrete",
                                    "hardconcrete-neuron", "eta-trick", "logsum", "adatikhonov",
                                    "penalty:mcp", "penalty:vardrop_exact", "penalty:lp"])
def test_gradient_only_regularizer(method):
    """value=False: value exactly 0, gradient identical to the full regularizer's (whose
    gradient test_gradcheck_regularizer checks against finite differences)."""
    hp = {"penalty_params": {"p": 0.5}} if method == "penalty:lp" else {}
    layer, sp = tiny_layer(method, **hp)
    params = [p for p in layer.parameters()]
    full = sp.regularizer(50)
    g_full = torch.autograd.grad(full, params, allow_unused=True)
    cheap = sp.regularizer(50, value=False)
    g_cheap = torch.autograd.grad(cheap, params, allow_unused=True)
    assert cheap.item() == 0.0
    assert full.item() != 0.0
    for a, b in zip(g_full, g_cheap):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=0.0)
    with pytest.raises(TypeError, match="value must be True or False"):
        sp.regularizer(50, value=1)


def test_eta_trick_coupled_decay_fixed_point():
    """The documented effect of the coupled log-eta decay: at w = 0 the eta-trick objective's
    log-eta gradient vanishes at eta = 0.922 (independent root of lam/2 * 4 eta/s^2 = -decay log
    eta), so eta stays O(1) instead of following eta_hat(0) = 0; with decay 0 it only vanishes
    as eta -> 0."""
    from scipy.optimize import brentq

    lam = decay = 1e-3
    eps = 2.0

    def g(le):
        e = math.exp(le)
        return lam / 2 * 4 * e / (math.sqrt(eps * eps + 4 * e) + eps) ** 2 + decay * le

    root = brentq(g, -10.0, 1.0, xtol=1e-14)
    assert math.exp(root) == pytest.approx(0.922, abs=5e-4)
    layer, sp = tiny_layer("eta-trick", eta_decay=decay)
    with torch.no_grad():
        layer.weight.zero_()
        layer.log_eta.fill_(root)
    layer.log_eta.grad = None
    sp.regularizer(1).backward()
    assert layer.log_eta.grad.abs().max().item() < 1e-12
    layer2, sp2 = tiny_layer("eta-trick", eta_decay=0.0)
    with torch.no_grad():
        layer2.weight.zero_()
        layer2.log_eta.fill_(root)
    sp2.regularizer(1).backward()
    assert (layer2.log_eta.grad > 1e-5).all()  # pushes eta down towards eta_hat(0) = 0
