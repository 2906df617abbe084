"""Layer numerics: gradchecks in float64, formulas against independent derivations."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.func import functional_call

import penalties
from dualdrop.nn import sparsify
from dualdrop.nn._base import original_of, state_of
from dualdrop.nn.methods.hardconcrete.method import HardConcreteState
from dualdrop.nn.methods.magnitude import target_sparsity
from dualdrop.nn.methods.penalty.method import abs_threshold, logsum_dual, penalty_value
from dualdrop.nn.methods.vardrop.method import kl_approx
from nn_tiny_models import same_noise


def W(layer):
    """The layer's original (trained) weight tensor."""
    return original_of(layer, "weight")


def S(layer):
    """The method state of the layer's weight."""
    return state_of(layer, "weight")


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
        same_noise(layer)
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
    st = S(layer)
    names = list(st._parameters)
    params = [W(layer).detach().clone().requires_grad_(True)] + \
        [st._parameters[n].detach().clone().requires_grad_(True) for n in names]

    def reg(w, *tensors):
        saved = dict(st._parameters)
        try:
            st._parameters.update(zip(names, tensors))
            return st.regularizer_term(w, 50)
        finally:
            st._parameters.update(saved)

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
    """f(eta) = 2 KL(a = 1/eta) (docs/theory.md section 3) for the lead's VarDrop penalty."""
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
        W(layer).copy_(torch.tensor([[0.5, -1.0, 0.2], [1.5, 0.3, -0.7]]))
        layer.bias.fill_(100.0)  # a large bias must not show up in the variance
        if method == "vardrop-lr":
            S(layer).log_alpha.fill_(math.log(0.3))
            var_w = 0.3 * W(layer) ** 2
        else:
            S(layer).log_sigma2.fill_(math.log(0.05))
            var_w = torch.full_like(W(layer), 0.05)
    x = torch.tensor([[1.0, 2.0, -1.0]])
    layer.train()
    with torch.no_grad():
        out = layer(x.expand(200000, 3))
    mean = x @ W(layer).T + layer.bias
    var = (x * x) @ var_w.T
    torch.testing.assert_close(out.mean(0), mean[0].detach(), atol=0.02, rtol=0)
    torch.testing.assert_close(out.var(0), var[0].detach(), rtol=0.02, atol=0)


def test_vardrop_weight_noise_is_one_sample_per_minibatch():
    layer, _ = tiny_layer("vardrop")
    with torch.no_grad():
        S(layer).log_alpha.fill_(0.0)
    x = torch.randn(1, 5, dtype=torch.float64).expand(4, 5)
    with torch.no_grad():
        out = layer(x)
    assert torch.allclose(out, out[:1].expand_as(out))  # same weights for all rows
    assert not torch.allclose(out, layer.eval()(x))


def test_vardrop_threshold_and_clipping():
    layer, sp = tiny_layer("vardrop-lr", tol=0.05)
    la = torch.linspace(-10, 10, 20, dtype=torch.float64)
    st = S(layer)
    with torch.no_grad():
        st.log_alpha.copy_(la.view(4, 5))
    clipped = st.clipped_log_alpha(W(layer))
    assert clipped.max() == 8.0 and clipped.min() == -8.0
    keep = 1.0 / (1.0 + torch.exp(clipped))
    assert torch.equal(st.keep_mask(W(layer)), keep >= 0.05)
    assert st.log_alpha_threshold() == pytest.approx(math.log(19))
    assert sp.density()["total"] == pytest.approx(float((la <= math.log(19)).double().mean()))
    # the official code's log a >= 3 rule is tol = 1/(1 + e^3)
    st.tol = 1.0 / (1.0 + math.exp(3.0))
    assert st.log_alpha_threshold() == pytest.approx(3.0)


def test_vardrop_lr_ar_alpha_from_sigma():
    layer, _ = tiny_layer("vardrop-lr-ar")
    with torch.no_grad():
        S(layer).log_sigma2.fill_(math.log(0.01))
    expected = (math.log(0.01) - torch.log(W(layer) ** 2 + 1e-8)).clamp(-8, 8)
    torch.testing.assert_close(S(layer).clipped_log_alpha(W(layer)), expected)


# ---- hard concrete ---------------------------------------------------------------------------

def test_hardconcrete_gates_formulas():
    layer_, sp = tiny_layer("hardconcrete")
    layer = S(layer_)
    la = torch.linspace(-4, 4, 20, dtype=torch.float64).view(4, 5)
    with torch.no_grad():
        layer.gate_logits.copy_(la)
    beta, gamma, zeta = 2 / 3, -0.1, 1.1
    z_hat = (torch.sigmoid(la) * (zeta - gamma) + gamma).clamp(0, 1)
    torch.testing.assert_close(layer.test_gates(), z_hat)
    w = layer.eval_weight(W(layer_))
    torch.testing.assert_close(w, W(layer_) * z_hat)
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
    assert sparsify(nn.Linear(5, 4), "hardconcrete", lam=0.3).regularizer(10).item() == \
        pytest.approx(0.3 * torch.sigmoid(torch.tensor(math.log(4)) + 2 / 3 * math.log(11)).item()
                      * 20, rel=0.05)


def test_hardconcrete_neuron_counts_weights_not_gates():
    lin, sp = tiny_layer("hardconcrete-neuron")  # Linear(5, 4): 5 input gates, 4 weights each
    layer = S(lin)
    assert layer.gate_logits.shape == (5,)
    assert layer.group_size() == 4
    p = layer.prob_nonzero()
    assert sp.regularizer(7).item() == pytest.approx(0.1 * 4 * p.sum().item() / 7)
    with torch.no_grad():
        layer.gate_logits.copy_(torch.tensor([-9.0, 9, 9, -9, 9], dtype=torch.float64))
    assert sp.density()["total"] == pytest.approx(12 / 20)
    conv_, spc = tiny_layer("hardconcrete-neuron", conv=True)  # gates on 3 output channels
    conv = S(conv_)
    assert conv.gate_logits.shape == (3,) and conv.group_size() == 2 * 9
    with torch.no_grad():
        conv.gate_logits.copy_(torch.tensor([-9.0, 9, 9], dtype=torch.float64))
    conv_.eval()
    w, b = conv_.weight, conv_.bias   # the eval forward's tensors: bias gated with its channel
    assert torch.all(w[0] == 0) and b[0] == 0 and torch.all(w[1:] != 0)
    assert isinstance(conv, HardConcreteState) and state_of(conv_, "bias") is conv


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
        masks = [st.weight_mask.clone() > 0 for _, st in sp.states()]
        for (t, _), m in zip(sp.states(), masks):
            assert torch.all(t.param[~m] == 0), f"pruned weight nonzero after step {step}"
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
    out, inp = model.fc3.weight.shape
    fan = math.ceil((out + inp) / 2)  # one weight per two units (dualdrop.nn._base.layer_floor)
    assert d["fc3"] == pytest.approx(max(math.ceil(0.05 * 64), fan) / 64)
    assert d["total"] == pytest.approx(0.1, abs=0.005)
    # without the floor the whole layer goes
    model2 = h.make_mlp()
    with torch.no_grad():
        model2.fc3.weight.mul_(1e-4)
    sp2 = sparsify(model2, "magnitude", sparsity=0.9, prune_every=1, end=0.5,
                   min_layer_density=0.0)
    for s in range(1, 11):
        sp2.after_step(None, s, 10)
    assert sp2.density()["fc3"] == pytest.approx(fan / 64)  # (fan_out + fan_in) / 2 weights
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
    for t, st in sp.states():
        m = opt.state[t.param]["exp_avg"]
        assert torch.all(m[st.weight_mask == 0] == 0)


# ---- penalty family ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, params", [("logsum", {"eps": 2.0}), ("mcp", {"a": 3.0, "lam": 0.1}),
                                          ("l1", {}), ("scad", {"a": 3.7, "lam": 0.1}),
                                          ("vardrop", {})])
def test_penalty_function_value_and_gradient(name, params):
    P = penalties.get(name, **params)
    layer_, _ = tiny_layer(f"penalty:{name}", lam=0.3, penalty_params=params)
    layer = S(layer_)
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
    v = penalty_value(S(layer), w, tikhonov=True)
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
        W(layer).copy_(torch.tensor([0.5 * thr, 2 * thr, -0.9 * thr, -1.1 * thr, 0.3] * 4)
                           .view(4, 5))
    assert sp.density()["total"] == pytest.approx(3 / 5)


def test_logsum_dual_and_eta_trick_minimum():
    P = penalties.get("logsum", eps=2.0)
    eta = np.logspace(-8, 4, 50)
    np.testing.assert_allclose(logsum_dual(torch.from_numpy(eta), 2.0).numpy(), P.f(eta),
                               rtol=1e-10, atol=1e-14)
    # min over eta of the eta-trick objective (no decay) is lam * Omega(w): descend in p only
    layer, sp = tiny_layer("eta-trick", lam=0.5, eta_weight_decay=0.0)
    st = S(layer)
    with torch.no_grad():
        st.log_ratio.zero_()
    opt = torch.optim.LBFGS([st.log_ratio], max_iter=500, tolerance_grad=1e-12,
                            tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = sp.regularizer(1)
        loss.backward()
        return loss

    opt.step(closure)
    w = W(layer).detach().numpy()
    assert sp.regularizer(1).item() == pytest.approx(0.5 * P.omega(w).sum(), rel=1e-6)
    np.testing.assert_allclose(0.5 * torch.exp(st.log_ratio).detach().numpy(), P.eta_hat(w),
                               rtol=1e-3)


def test_eta_trick_released_objective_and_init():
    """The released objective lam/2 (sum w^2/eta + sum f(eta) + c sum p), eta = lam e^p, p = 5 at
    the start; the gradient of the decay term in p is the constant lam c / 2."""
    lam, eps, c = 1e-3, 2.0, 1e-3
    layer, sp = tiny_layer("eta-trick")
    st = S(layer)
    assert (st.lam, st.eps, st.eta_weight_decay, st.decay) == (lam, eps, c, "linear")
    assert torch.all(st.log_ratio == 5.0)
    with torch.no_grad():
        st.log_ratio.copy_(torch.randn(4, 5, dtype=torch.float64) * 2)
    w = W(layer).detach().numpy()
    p = st.log_ratio.detach().numpy()
    eta = lam * np.exp(p)
    P = penalties.get("logsum", eps=eps)
    expected = lam / 2 * (np.sum(w ** 2 / eta) + np.sum(P.f(eta)) + c * np.sum(p))
    assert sp.regularizer(1).item() == pytest.approx(expected, rel=1e-10)
    # gradient of the decay term alone: the objective with c minus the one without
    with_c = sp.regularizer(1)
    (g1,) = torch.autograd.grad(with_c, st.log_ratio)
    st.eta_weight_decay = 0.0
    (g0,) = torch.autograd.grad(sp.regularizer(1), st.log_ratio)
    torch.testing.assert_close(g1 - g0, torch.full_like(g1, lam * c / 2), rtol=1e-9, atol=0)
    # keep ratio alpha = sigmoid(p); pruned when alpha < tol
    alpha = torch.sigmoid(st.log_ratio)
    assert torch.equal(st.keep_mask(W(layer)), alpha >= 0.05)
    layer.eval()
    torch.testing.assert_close(layer.weight, W(layer) * (alpha >= 0.05))


def test_eta_trick_quadratic_option():
    """decay="quadratic", eta_init="eta_hat": the earlier form, started at eta = eta_hat(w)."""
    layer, sp = tiny_layer("eta-trick", lam=1e-3, eta_weight_decay=0.1, decay="quadratic",
                           eta_init="eta_hat", prune_rule="eta_hat")
    st = S(layer)
    P = penalties.get("logsum", eps=2.0)
    w = W(layer).detach().numpy()
    log_eta = st.log_ratio.detach().numpy() + math.log(1e-3)
    np.testing.assert_allclose(log_eta, np.log(P.eta_hat(w)), rtol=1e-12)
    expected = 1e-3 * P.omega(w).sum() + 0.05 * np.sum(np.log(P.eta_hat(w)) ** 2)
    assert sp.regularizer(1).item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("decay", ["linear", "quadratic"])
def test_eta_trick_fused_objective_matches_plain_autograd(decay):
    layer, sp = tiny_layer("eta-trick", lam=0.3, eps=1.5, eta_weight_decay=0.02, decay=decay)
    st = S(layer)
    with torch.no_grad():
        st.log_ratio.copy_(torch.randn(4, 5, dtype=torch.float64) * 3)
    reg = sp.regularizer(1)
    reg.backward()
    gw, ge = W(layer).grad.clone(), st.log_ratio.grad.clone()
    w = W(layer).detach().clone().requires_grad_(True)
    p = st.log_ratio.detach().clone().requires_grad_(True)
    eta = 0.3 * torch.exp(p)
    ref = 0.3 * 0.5 * (w * w / eta + logsum_dual(eta, 1.5)).sum()
    if decay == "linear":
        ref = ref + 0.3 * 0.5 * 0.02 * p.sum()
    else:
        ref = ref + 0.01 * (torch.log(eta) ** 2).sum()
    ref.backward()
    assert reg.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(gw, w.grad, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(ge, p.grad, rtol=1e-10, atol=1e-14)


def test_adaprox_step_uses_adam_step_size():
    layer, sp = tiny_layer("adaprox", lam=0.05, eps=2.0)
    opt = torch.optim.Adam(layer.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    x = torch.randn(8, 5, dtype=torch.float64)
    for step in range(1, 4):
        loss = (layer(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        w = W(layer).detach().clone()
        st = opt.state[W(layer)]
        v_hat = st["exp_avg_sq"] / (1 - 0.99 ** step)
        rho = 0.01 / (v_hat.sqrt() + 1e-8)
        eta = w.abs() * (w.abs() + 2.0)
        expected = w * eta / (eta + rho * 0.05)
        sp.after_step(opt, step, 3)
        torch.testing.assert_close(W(layer).detach(), expected, rtol=1e-12, atol=0)
    assert sp.regularizer(10).item() == 0.0
    # SGD: rho = lr
    layer2, sp2 = tiny_layer("adaprox", lam=0.05)
    opt2 = torch.optim.SGD(layer2.parameters(), lr=0.1)
    w = W(layer2).detach().clone()
    sp2.after_step(opt2, 1, 3)
    eta = w.abs() * (w.abs() + 2.0)
    torch.testing.assert_close(W(layer2).detach(), w * eta / (eta + 0.1 * 0.05))


@pytest.mark.parametrize("name, params", [("logsum", {"eps": 2.0}), ("logsum", {"eps": 0.1}),
                                          ("l1", {}), ("lp", {"p": 0.5}), ("lp", {"p": 1.5}),
                                          ("log2sum", {"eps": 0.3}),
                                          ("mcp", {"a": 3.0, "lam": 0.1}),
                                          ("scad", {"a": 3.7, "lam": 0.2})])
def test_torch_forms_match_penalties(name, params):
    """The torch speed path reproduces the penalties object (omega, derivative, eta_hat)."""
    from dualdrop.nn.methods.penalty.method import TORCH_FORMS, torch_form

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
    layer_, _ = tiny_layer(f"penalty:{name}", lam=0.7, penalty_params=params)
    layer = S(layer_)
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
    S(b)._torch_form = None  # force the numba loop over penalties.kernels
    for layer, sp in ((a, spa), (b, spb)):
        with torch.no_grad():
            W(layer).mul_(3.0)  # some beyond MCP's flat part (eta_hat = inf)
        opt = torch.optim.Adam(layer.parameters(), lr=0.2)
        layer(torch.ones(2, 5, dtype=torch.float64)).sum().backward()
        opt.step()
        sp.after_step(opt, 1, 2)
    torch.testing.assert_close(W(a), W(b), rtol=1e-12, atol=1e-15)


def test_adaprox_zero_step_is_identity_and_never_nan():
    """A zero learning rate (the last step of a linear decay) must not turn exact zeros into NaN."""
    import torch

    from dualdrop.nn import sparsify

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4))
    sp = sparsify(model, "adaprox")
    with torch.no_grad():
        W(model[0])[:, :3] = 0.0
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    model(torch.randn(5, 6)).sum().backward()
    opt.step()
    before = W(model[0]).detach().clone()
    sp.after_step(opt, 1, 10)
    assert torch.isfinite(W(model[0])).all()
    assert torch.equal(W(model[0]), before)


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
    layer, sp = tiny_layer("eta-trick", eta_weight_decay=decay, decay="quadratic")
    with torch.no_grad():
        W(layer).zero_()
        S(layer).log_ratio.fill_(root - math.log(lam))
    sp.regularizer(1).backward()
    assert S(layer).log_ratio.grad.abs().max().item() < 1e-12
    layer2, sp2 = tiny_layer("eta-trick", eta_weight_decay=0.0, decay="quadratic")
    with torch.no_grad():
        W(layer2).zero_()
        S(layer2).log_ratio.fill_(root - math.log(lam))
    sp2.regularizer(1).backward()
    assert (S(layer2).log_ratio.grad > 1e-5).all()  # pushes eta down towards eta_hat(0) = 0
    # the released linear term has no such fixed point: its p-gradient at w = 0 stays positive
    layer3, sp3 = tiny_layer("eta-trick")
    with torch.no_grad():
        W(layer3).zero_()
        S(layer3).log_ratio.fill_(root - math.log(lam))
    sp3.regularizer(1).backward()
    assert (S(layer3).log_ratio.grad > lam * 1e-3 / 2).all()
