"""Counter-based noise and the fused per-weight Functions: statistics, determinism, gradchecks in
float64, and agreement with the layers' current torch implementation for the same noise."""

import math

import numpy as np
import penalties
import pytest
import torch
from scipy import stats

from dualdrop.nn import _numba
from dualdrop.nn.methods.hardconcrete import fused as HCF
from dualdrop.nn.methods.penalty import fused as PF
from dualdrop.nn.methods.vardrop import fused as VDF
import fused_test_only as TO
from dualdrop.nn import _noise as N
from dualdrop.nn.methods.hardconcrete.method import _HardConcreteSample
from dualdrop.nn.methods.vardrop.method import _LRVariance, kl_approx

F64 = torch.float64
KEY = N.make_key(7, 3, 11)


# ---- keys ---------------------------------------------------------------------------------------

def test_make_key_is_a_deterministic_hash_of_its_three_arguments():
    keys = {N.make_key(s, t, k) for s in range(4) for t in range(4) for k in range(4)}
    assert len(keys) == 64
    assert N.make_key(1, 2, 3) == N.make_key(1, 2, 3)
    assert 0 <= N.make_key(2**64 - 1, 2**64 - 1, 2**64 - 1) < 2**64


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True, "3"])
def test_make_key_rejects_what_is_not_a_64_bit_count(bad):
    with pytest.raises((TypeError, ValueError), match="seed"):
        N.make_key(bad, 0, 0)


def test_functions_reject_bad_keys_and_dtypes():
    with pytest.raises(TypeError, match="key"):
        N.uniform_(torch.empty(3), 1.0)
    with pytest.raises(ValueError, match="key"):
        N.normal_(torch.empty(3), -1)
    with pytest.raises(TypeError, match="float32 or float64"):
        N.uniform_(torch.empty(3, dtype=torch.float16), 1)


# ---- uniforms -----------------------------------------------------------------------------------

def test_uniform_float32_is_on_the_open_half_integer_grid():
    u = N.uniform(200_000, KEY)
    assert u.dtype == torch.float32
    assert 0.0 < u.min().item() and u.max().item() < 1.0
    k = u.double() * 2.0**23 - 0.5
    assert torch.equal(k, k.round())                     # (k + 1/2) 2^-23 exactly
    assert torch.equal(1.0 - u, (1.0 - u.double()).float())  # 1 - u exact: logit antisymmetric


def test_uniform_is_a_function_of_key_and_flat_index_only():
    a = N.uniform((6, 7), KEY)
    assert torch.equal(a, N.uniform((6, 7), KEY))                  # bit-exact repeat
    assert torch.equal(a.view(-1), N.uniform(42, KEY))            # shape does not matter
    assert torch.equal(a.view(-1)[:10], N.uniform(10, KEY))       # a prefix of a longer draw
    t = torch.zeros(7, 6).t()                                       # non-contiguous target
    N.uniform_(t, KEY)
    assert torch.equal(t.contiguous(), a)
    assert not torch.equal(a, N.uniform((6, 7), KEY + 1))


def test_uniform_distribution_ks_mean_variance():
    u = N.uniform(200_000, N.make_key(0, 0, 0)).double().numpy()
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    se = math.sqrt(1 / 12 / u.size)
    assert abs(u.mean() - 0.5) < 5 * se
    assert abs(u.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / u.size)


def test_uniform_float64_uses_53_bits():
    u = N.uniform(100_000, KEY, dtype=F64)
    assert 0.0 < u.min().item() and u.max().item() < 1.0
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-3
    # the top 23 bits agree with the float32 draw of the same index
    assert torch.equal(torch.floor(u * 2**23), torch.floor(N.uniform(100_000, KEY).double()
                                                          * 2**23))


@pytest.mark.parametrize("pair", ["keys", "steps", "streams", "lag1"])
def test_uniform_streams_and_adjacent_indices_are_uncorrelated(pair):
    n = 100_000
    if pair == "keys":
        a, b = N.uniform(n, 1), N.uniform(n, 2)            # raw adjacent keys, no hashing
    elif pair == "steps":
        a, b = N.uniform(n, N.make_key(0, 0, 5)), N.uniform(n, N.make_key(0, 0, 6))
    elif pair == "streams":
        a, b = N.uniform(n, N.make_key(0, 1, 5)), N.uniform(n, N.make_key(0, 2, 5))
    else:
        u = N.uniform(n + 1, KEY)
        a, b = u[:-1], u[1:]
    r = np.corrcoef(a.double().numpy(), b.double().numpy())[0, 1]
    assert abs(r) < 4.0 / math.sqrt(n)
    # joint uniformity of the pairs on a 10 x 10 grid (chi-square, 99 degrees of freedom)
    cells = (a.double() * 10).long() * 10 + (b.double() * 10).long()
    counts = torch.bincount(cells, minlength=100).double().numpy()
    assert stats.chisquare(counts).pvalue > 1e-3


# ---- normals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_normal_distribution_and_independence(dtype):
    n = 200_001                                              # odd: the last sine is dropped
    z = N.normal(n, KEY, dtype=dtype)
    assert z.dtype == dtype and torch.isfinite(z).all()
    x = z.double().numpy()
    assert stats.kstest(x, "norm").pvalue > 1e-3
    assert abs(x.mean()) < 5 / math.sqrt(n)
    assert abs(x.var() - 1.0) < 5 * math.sqrt(2.0 / n)
    assert abs(stats.kurtosis(x)) < 5 * math.sqrt(24.0 / n)
    half = (n + 1) // 2                                       # cos and sin of the same pair
    r = np.corrcoef(x[: n - half], x[half:])[0, 1]
    assert abs(r) < 4.0 / math.sqrt(n - half)
    assert abs(np.corrcoef(x[:-1], x[1:])[0, 1]) < 4.0 / math.sqrt(n)


def test_normal_is_reproducible_and_shape_independent():
    a = N.normal((5, 9), KEY)
    assert torch.equal(a, N.normal((5, 9), KEY))
    assert torch.equal(a.view(-1), N.normal(45, KEY))
    t = torch.zeros(9, 5).t()
    assert torch.equal(N.normal_(t, KEY).contiguous(), a)
    assert not torch.equal(a, N.normal((5, 9), KEY ^ 1))
    assert N.normal(0, KEY).numel() == 0 and N.uniform(0, KEY).numel() == 0


# ---- hard-concrete gate -------------------------------------------------------------------------

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


def _hc_reference(w, la, u, beta=BETA):
    z = _HardConcreteSample.apply(la, u, beta, GAMMA, ZETA)
    l0 = torch.sigmoid(la - beta * math.log(-GAMMA / ZETA)).sum()
    return w * z, l0


@pytest.mark.parametrize("beta", [BETA, 0.7])
def test_hard_concrete_gate_matches_the_layer_for_the_same_uniforms(beta):
    torch.manual_seed(0)
    w = (torch.randn(30, 40) * 0.1).requires_grad_()
    la = (torch.randn(30, 40) * 2.0).requires_grad_()
    out, l0 = HCF.hard_concrete_gate(w, la, KEY, beta, GAMMA, ZETA)
    (out * torch.randn(30, 40, generator=torch.Generator().manual_seed(1))).sum().add(
        0.3 * l0).backward()
    got = (out.detach(), l0.detach(), w.grad.clone(), la.grad.clone())
    w.grad = la.grad = None
    ref, l0r = _hc_reference(w, la, N.uniform(w.shape, KEY), beta)
    (ref * torch.randn(30, 40, generator=torch.Generator().manual_seed(1))).sum().add(
        0.3 * l0r).backward()
    torch.testing.assert_close(got[0], ref.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[1], l0r.detach(), atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(got[2], w.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[3], la.grad, atol=1e-6, rtol=1e-5)
    assert (got[0] == 0).any() and (got[0] == w.detach()).any()  # both clamps were exercised


@pytest.mark.parametrize("beta", [BETA, 0.7])
@pytest.mark.parametrize("per_column", [False, True])
def test_hard_concrete_gate_gradcheck(beta, per_column):
    torch.manual_seed(1)
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)
    la = torch.randn(5 if per_column else (4, 5), dtype=F64, requires_grad=True)

    def f(x, la):
        out, l0 = HCF.hard_concrete_gate(x, la, KEY, beta, GAMMA, ZETA)
        return out, 0.7 * l0

    assert torch.autograd.gradcheck(f, (x, la))


def test_hard_concrete_per_column_gates_vary_by_row_and_sum_their_gradients():
    torch.manual_seed(2)
    x = torch.randn(64, 8)
    la = torch.zeros(8, requires_grad=True)
    out, l0 = HCF.hard_concrete_gate(x, la, KEY, BETA, GAMMA, ZETA)
    u = N.uniform(x.shape, KEY)
    ref, l0r = _hc_reference(x, la.expand(64, 8), u)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(l0, l0r / 64, atol=1e-5, rtol=1e-6)  # one P per gate, not per row
    g = torch.autograd.grad(out.sum(), la)[0]
    gr = torch.autograd.grad(ref.sum(), la)[0]
    torch.testing.assert_close(g, gr, atol=1e-5, rtol=1e-5)


def test_hard_concrete_gate_rejects_bad_shapes_and_hyperparameters():
    with pytest.raises(ValueError, match="log_alpha"):
        HCF.hard_concrete_gate(torch.ones(3, 4), torch.ones(3), KEY, BETA, GAMMA, ZETA)
    with pytest.raises(ValueError, match="gamma"):
        HCF.hard_concrete_gate(torch.ones(3, 4), torch.ones(4), KEY, BETA, 0.1, ZETA)


# ---- variational dropout ------------------------------------------------------------------------

def test_vardrop_noise_matches_the_formula_and_the_layers_kl():
    torch.manual_seed(3)
    w = (torch.randn(20, 30) * 0.1).requires_grad_()
    la = (torch.randn(20, 30) * 5.0).requires_grad_()         # some beyond the clip
    out, kl = VDF.vardrop_noise(w, la, KEY, 8.0, need_kl_value=True)
    gcoef = torch.randn(20, 30, generator=torch.Generator().manual_seed(4))
    ((out * gcoef).sum() + 0.5 * kl).backward()
    got = (out.detach(), kl.detach(), w.grad.clone(), la.grad.clone())
    w.grad = la.grad = None
    e = N.normal(w.shape, KEY)
    ref = w + torch.exp(0.5 * la.clamp(-8.0, 8.0)) * w * e
    klr = kl_approx(la.clamp(-8.0, 8.0)).sum()                # the closed form by autograd
    ((ref * gcoef).sum() + 0.5 * klr).backward()
    torch.testing.assert_close(got[0], ref.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[1], klr.detach(), atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(got[2], w.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[3], la.grad, atol=1e-5, rtol=1e-5)
    assert (la.abs() > 8).any() and (got[3][la.detach().abs() > 8] == 0).all()
    _, kl0 = VDF.vardrop_noise(w, la, KEY, 8.0, need_kl_value=False)
    assert kl0.item() == 0.0


def test_vardrop_noise_gradcheck():
    torch.manual_seed(5)
    w = torch.randn(4, 6, dtype=F64, requires_grad=True)
    la = (torch.randn(4, 6, dtype=F64) * 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda w, la: VDF.vardrop_noise(w, la, KEY, 3.0), (w, la))


def test_kl_sums_gradcheck_and_match_the_closed_form():
    torch.manual_seed(6)
    la = (torch.randn(5, 7, dtype=F64) * 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: VDF.kl_sum(x, 4.0), (la,))
    torch.testing.assert_close(VDF.kl_sum(la, 4.0), kl_approx(la.clamp(-4, 4)).sum())
    w = torch.randn(5, 7, dtype=F64, requires_grad=True)
    ls2 = (torch.randn(5, 7, dtype=F64) - 2).requires_grad_()

    def ar(w, s):
        var_w, kl = VDF.ar_variance_kl(w, s, 4.0)
        return var_w, 0.3 * kl

    assert torch.autograd.gradcheck(ar, (w, ls2))
    assert torch.autograd.gradcheck(lambda w, s: VDF.ar_variance_kl(w, s, 4.0)[1], (w, ls2))
    raw = ls2 - torch.log(w * w + 1e-8)
    assert (raw.abs() > 4).any() and (raw.abs() < 4).any()       # both sides of the clip
    var_w, kl = VDF.ar_variance_kl(w, ls2, 4.0)
    torch.testing.assert_close(var_w, torch.exp(ls2))
    torch.testing.assert_close(kl, kl_approx(raw.clamp(-4, 4)).sum())
    g = torch.autograd.grad(kl, (w, ls2))
    gr = torch.autograd.grad(kl_approx(raw.clamp(-4, 4)).sum(), (w, ls2))
    for a, b in zip(g, gr):
        torch.testing.assert_close(a, b)
    # value-free form: exactly 0, same gradient
    v = VDF.kl_sum(la, 4.0, need_value=False)
    assert v.item() == 0.0
    torch.testing.assert_close(torch.autograd.grad(v, la)[0],
                               torch.autograd.grad(VDF.kl_sum(la, 4.0), la)[0])


def test_kl_sum_is_the_closed_form_in_float32_and_bfloat16():
    la = (torch.randn(50, 60) * 5).requires_grad_()
    g1 = torch.autograd.grad(VDF.kl_sum(la, 8.0), la)[0]
    g2 = torch.autograd.grad(kl_approx(la.clamp(-8.0, 8.0)).sum(), la)[0]
    torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-5)
    la16 = la.detach().bfloat16().requires_grad_()
    g3 = torch.autograd.grad(VDF.kl_sum(la16, 8.0), la16)[0]
    la32 = la16.detach().float().requires_grad_()         # the same inputs in float32
    g4 = torch.autograd.grad(VDF.kl_sum(la32, 8.0), la32)[0]
    assert g3.dtype == torch.bfloat16
    torch.testing.assert_close(g3.float(), g4, atol=2e-2, rtol=2e-2)


# ---- local reparameterization -------------------------------------------------------------------

def test_lr_variance_and_linear_gradcheck():
    torch.manual_seed(7)
    x = torch.randn(6, 4, dtype=F64, requires_grad=True)
    w = torch.randn(3, 4, dtype=F64, requires_grad=True)
    b = torch.randn(3, dtype=F64, requires_grad=True)
    la = (torch.randn(3, 4, dtype=F64) * 2).requires_grad_()

    def f(x, w, b, la):
        var_w, kl = VDF.lr_variance_kl(w, la, 2.0)
        return TO.local_reparam_linear(x, w, b, var_w, KEY), 0.3 * kl

    assert torch.autograd.gradcheck(f, (x, w, b, la))
    assert torch.autograd.gradcheck(lambda w, la: VDF.lr_variance_kl(w, la, 2.0)[0], (w, la))
    assert torch.autograd.gradcheck(lambda w, la: VDF.lr_variance_kl(w, la, 2.0)[1], (w, la))
    var_w, kl = VDF.lr_variance_kl(w, la, 2.0)
    torch.testing.assert_close(var_w, torch.exp(la.clamp(-2, 2)) * w * w)
    torch.testing.assert_close(kl, kl_approx(la.clamp(-2, 2)).sum())


def test_local_reparam_linear_matches_the_layer_for_the_same_noise():
    torch.manual_seed(8)
    x = torch.randn(2, 16, 30)                                  # leading dims are flattened
    w = (torch.randn(10, 30) * 0.1).requires_grad_()
    b = torch.randn(10).requires_grad_()
    la = (torch.randn(10, 30) * 3).requires_grad_()
    out = TO.local_reparam_linear(x, w, b, VDF.lr_variance_kl(w, la, 8.0)[0], KEY)
    g = torch.autograd.grad(out.square().sum(), (w, b, la))
    vw = _LRVariance.apply(w, la, 8.0)
    x2 = x.reshape(32, 30)
    ref = (torch.nn.functional.linear(x2, w, b) + torch.sqrt(
        torch.nn.functional.linear(x2 * x2, vw) + 1e-8) * N.normal((32, 10), KEY)).view(2, 16, 10)
    gr = torch.autograd.grad(ref.square().sum(), (w, b, la))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, r in zip(g, gr):
        torch.testing.assert_close(a, r, atol=1e-4, rtol=1e-4)


# ---- penalty slopes -----------------------------------------------------------------------------

PENALTY_CASES = [("l1", {}), ("logsum", {"eps": 0.5}), ("mcp", {"a": 3.0, "lam": 0.2}),
                 ("scad", {"a": 3.7, "lam": 0.2})]


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("kind,params", PENALTY_CASES)
def test_penalty_grad_is_lam_times_the_catalog_derivative(kind, params, dtype):
    w = torch.linspace(-2.0, 2.0, 401, dtype=dtype)             # includes 0 and the kinks
    w = torch.cat([w, torch.tensor([0.2, -0.2, 0.74, -0.74], dtype=dtype)]).requires_grad_()
    lam = 0.3
    P = penalties.get(kind, **params)
    want = lam * torch.from_numpy(np.asarray(P.derivative(w.detach().double().numpy())))
    v = TO.penalty_grad(w, kind, lam, params)
    assert v.item() == 0.0
    (2.0 * v).backward()                                        # upstream gradient scales it
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(w.grad.double(), 2.0 * want, atol=tol, rtol=tol)
    grad = torch.ones_like(w.detach())
    PF.add_penalty_grad_(grad, w.detach(), kind, lam, params)
    torch.testing.assert_close(grad.double(), 1.0 + want, atol=tol, rtol=tol)


def test_penalty_grad_rejects_unknown_kinds_and_missing_parameters():
    with pytest.raises(ValueError, match="kind"):
        TO.penalty_grad(torch.ones(3), "lp", 1.0, {"p": 0.5})
    with pytest.raises(ValueError, match="eps"):
        TO.penalty_grad(torch.ones(3), "logsum", 1.0, {})
    with pytest.raises(ValueError, match="shape"):
        PF.add_penalty_grad_(torch.ones(3), torch.ones(4), "l1", 1.0, {})


def test_fused_functions_are_bit_exact_for_a_key():
    torch.manual_seed(9)
    w, la = torch.randn(40, 50), torch.randn(40, 50)
    a = HCF.hard_concrete_gate(w, la, KEY, BETA, GAMMA, ZETA)[0]
    assert torch.equal(a, HCF.hard_concrete_gate(w, la, KEY, BETA, GAMMA, ZETA)[0])
    assert not torch.equal(a, HCF.hard_concrete_gate(w, la, KEY + 1, BETA, GAMMA, ZETA)[0])
    b = VDF.vardrop_noise(w, la, KEY, 8.0)[0]
    assert torch.equal(b, VDF.vardrop_noise(w, la, KEY, 8.0)[0])


# ---- AdaProx and the eta-trick ------------------------------------------------------------------

@pytest.mark.parametrize("kind,params", PENALTY_CASES)
def test_adaptive_prox_matches_the_catalog_eta_hat(kind, params):
    w0 = torch.linspace(-2.0, 2.0, 801, dtype=F64)
    v = torch.rand(801, dtype=F64, generator=torch.Generator().manual_seed(0)) * 1e-4
    lr_lam, bc2, eps = 0.05, 0.3, 1e-8
    P = penalties.get(kind, **params)
    eta = np.asarray(P.eta_hat(w0.numpy()))
    rho_lam = lr_lam / (np.sqrt(v.numpy() / bc2) + eps)
    with np.errstate(invalid="ignore"):
        want = np.where(np.isinf(eta), w0.numpy(), w0.numpy() * eta / (eta + rho_lam))
    w = w0.clone()
    PF.adaptive_prox_(w, v, kind, params, lr_lam, bc2, eps)
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-12, atol=1e-15)
    w32 = w0.float()
    PF.adaptive_prox_(w32, v.float(), kind, params, lr_lam, bc2, eps)
    np.testing.assert_allclose(w32.double().numpy(), want, rtol=2e-6, atol=1e-7)
    with pytest.raises(ValueError, match="lr_lam"):
        PF.adaptive_prox_(w, v, kind, params, 0.0, bc2, eps)


@pytest.mark.parametrize("quadratic", [False, True])
def test_eta_trick_objective_gradcheck_and_matches_the_torch_function(quadratic):
    from dualdrop.nn.methods.penalty.method import _EtaTrickObjective

    torch.manual_seed(10)
    w = torch.randn(5, 6, dtype=F64, requires_grad=True)
    p = torch.randn(5, 6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda w, p: PF.eta_trick_objective(w, p, 0.3, 2.0, 0.1, quadratic), (w, p))
    for need in (True, False):
        got = PF.eta_trick_objective(w, p, 0.3, 2.0, 0.1, quadratic, need)
        ref = _EtaTrickObjective.apply(w, p, 0.3, 2.0, 0.1, quadratic, need)
        torch.testing.assert_close(got, ref)
        for a, b in zip(torch.autograd.grad(got, (w, p)), torch.autograd.grad(ref, (w, p))):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("quadratic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_eta_trick_hook_adds_the_torch_functions_gradients_in_place(quadratic, dtype):
    """The hook's in-place gradients equal autograd's through ``_EtaTrickObjective`` (p.grad None
    or not, the term twice, no data gradient, torch.autograd.grad, removed)."""
    from dualdrop.nn.methods.penalty.method import _EtaTrickObjective

    torch.manual_seed(12)
    w = torch.nn.Parameter(torch.randn(6, 5, dtype=dtype))
    p = torch.nn.Parameter(torch.randn(6, 5, dtype=dtype) + 1.0)
    x = torch.randn(4, 5, dtype=dtype)
    args = (0.3, 2.0, 0.1, quadratic)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}

    def want(scale, data=True):
        w.grad = p.grad = None
        loss = scale * _EtaTrickObjective.apply(w, p, *args, False, False)
        (loss + (x @ w.t()).square().sum() if data else loss).backward()
        out = w.grad.clone(), p.grad.clone()
        w.grad = p.grad = None
        return out

    def check(got, ref):
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, **tol)

    ref, data_only = want(3.0), want(0.0)[0]
    hook = PF.EtaTrickGradHook(w, p, *args)
    (3.0 * hook.term() + (x @ w.t()).square().sum()).backward()
    check((w.grad, p.grad), ref)
    ((x @ w.t()).square().sum() + 1.5 * hook.term() + 1.5 * hook.term()).backward()  # adds
    check((w.grad, p.grad), (2 * ref[0], 2 * ref[1]))
    w.grad = p.grad = None
    (2.0 * hook.term()).backward()                                   # no data gradient: flush
    check((w.grad, p.grad), want(2.0, data=False))
    check(torch.autograd.grad(hook.term() * 2.0, (w, p)), want(2.0, data=False))
    hook.remove()
    w.grad = p.grad = None
    ((x @ w.t()).square().sum() + hook.term()).backward()
    check((w.grad,), (data_only,))
    assert p.grad is None
    # the state's training path (value=False) takes the hook, and agrees with the value path
    t1 = PF.eta_trick_grad_term(w, p, *args)
    assert t1.grad_fn is not None and t1.item() == 0.0
    with pytest.raises(TypeError, match="leaf"):
        PF.EtaTrickGradHook(w, p.detach(), *args)


def test_penalty_grad_hook_adds_the_gradient_only_when_its_term_is_in_the_loss():
    torch.manual_seed(11)
    w = torch.nn.Parameter(torch.randn(6, 5))
    x = torch.randn(4, 5)
    params = {"eps": 0.5}
    hook = PF.PenaltyGradHook(w, "logsum", 0.3, params)
    data = (x @ w.t()).square().sum()
    (data + 3.0 * hook.term()).backward()
    got = w.grad.clone()
    w.grad = None
    ((x @ w.t()).square().sum() + 3.0 * TO.penalty_grad(w, "logsum", 0.3, params)).backward()
    torch.testing.assert_close(got, w.grad)
    w.grad = None
    (x @ w.t()).square().sum().backward()                          # term not in the loss
    plain = w.grad.clone()
    w.grad = None
    ((x @ w.t()).square().sum() + hook.term() + hook.term()).backward()  # twice: counted twice
    want = plain + 2 * 0.3 * torch.from_numpy(
        np.asarray(penalties.get("logsum", **params).derivative(w.detach().double().numpy()))
    ).float()
    torch.testing.assert_close(w.grad, want)
    w.grad = None
    hook.term().backward()                      # no data gradient: added at the end
    torch.testing.assert_close(w.grad, (want - plain) / 2)
    hook.remove()
    w.grad = None
    ((x @ w.t()).square().sum() + hook.term()).backward()
    torch.testing.assert_close(w.grad, plain)
    with pytest.raises(TypeError, match="leaf"):
        PF.PenaltyGradHook(torch.ones(3), "l1", 1.0, {})


def test_float32_cos_sin_polynomials_match_numpy():
    b = np.concatenate([np.linspace(0.0, 1.0, 100_001, endpoint=False),
                        np.arange(16) / 16.0]).astype(np.float32)
    from numba import njit

    @njit
    def both(b, c, s):
        for i in range(b.size):
            c[i], s[i] = N.cos_sin_2pi_f32(b[i])

    c, s = np.empty_like(b), np.empty_like(b)
    both(b, c, s)
    ang = 2 * np.pi * b.astype(np.float64)
    np.testing.assert_allclose(c, np.cos(ang), atol=3e-7)
    np.testing.assert_allclose(s, np.sin(ang), atol=3e-7)


def test_functions_reject_other_dtypes_and_mixed_dtypes():
    w16 = torch.ones(3, 4, dtype=torch.float16)
    with pytest.raises(TypeError, match="float32 or float64"):
        HCF.hard_concrete_gate(w16, w16, KEY, BETA, GAMMA, ZETA)
    with pytest.raises(TypeError, match="one dtype"):
        VDF.vardrop_noise(torch.ones(3, 4), torch.ones(3, 4, dtype=F64), KEY, 8.0)
    with pytest.raises(ValueError, match="var_w"):
        TO.local_reparam_linear(torch.ones(2, 4), torch.ones(3, 4), None, torch.ones(4, 3), KEY)


@pytest.mark.parametrize("method", ["logsum", "penalty:mcp", "penalty:scad", "penalty:l1"])
def test_penalty_grad_matches_the_torch_form_of_the_penalty_state(method):
    from dualdrop.nn import sparsify
    from dualdrop.nn._base import original_of, state_of
    from dualdrop.nn.methods.penalty.method import penalty_value

    torch.manual_seed(12)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20))
    extra = {"penalty_params": {"lam": 0.05}} if method in ("penalty:mcp", "penalty:scad") else {}
    sparsify(model, method, lam=0.01, **extra)
    st, w = state_of(model[0]), original_of(model[0], "weight")
    ref = torch.autograd.grad(penalty_value(st, w, False), w)[0]
    got = torch.autograd.grad(TO.penalty_grad(w, st.penalty.name, st.lam, st.penalty.params),
                              w)[0]
    torch.testing.assert_close(got, ref, atol=1e-7, rtol=1e-6)


def test_adaprox_step_takes_the_loop_and_matches_its_torch_form(monkeypatch):
    from dualdrop.nn import sparsify
    from dualdrop.nn._base import original_of, state_of
    from dualdrop.nn.methods.penalty.method import adaprox_step

    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20))
    sparsify(model, "adaprox", lam=0.05)
    st, w = state_of(model[0]), original_of(model[0], "weight")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 30)).square().sum().backward()
        opt.step()
    w0 = w.detach().clone()
    calls = []
    monkeypatch.setattr(PF, "adaptive_prox_",
                        lambda *a, _f=PF.adaptive_prox_: calls.append(1) or _f(*a))
    adaprox_step([(w, st)], opt)
    got = w.detach().clone()
    assert calls and not torch.equal(got, w0)                         # the loop, and it acted
    with torch.no_grad():
        w.copy_(w0)
    monkeypatch.setattr(_numba, "ENABLED", False)                          # the torch form
    adaprox_step([(w, st)], opt)
    assert len(calls) == 1
    torch.testing.assert_close(got, w.detach(), atol=1e-7, rtol=1e-6)


def _outputs_and_grads(fn, *tensors):
    outs = fn(*tensors)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o * (1.0 + torch.arange(o.numel(), dtype=o.dtype).view(o.shape) / o.numel()))
               .sum() for o in outs)
    grads = torch.autograd.grad(loss, tensors, allow_unused=True)
    return [o.detach() for o in outs], grads


def test_the_other_device_fallbacks_compute_the_same_as_the_loops(monkeypatch):
    """Every public Function's torch fallback (taken on non-CPU tensors; no GPU here) run on the
    CPU by pretending the tensors live elsewhere: same values and gradients as the loops."""
    torch.manual_seed(14)
    w = (torch.randn(6, 7, dtype=F64) * 0.5).requires_grad_()
    la = (torch.randn(6, 7, dtype=F64) * 3).requires_grad_()
    x = torch.randn(5, 7, dtype=F64, requires_grad=True)
    cases = {
        "hc": lambda w, la: HCF.hard_concrete_gate(w, la, KEY, BETA, GAMMA, ZETA),
        "vd": lambda w, la: VDF.vardrop_noise(w, la, KEY, 4.0),
        "kl": lambda w, la: VDF.kl_sum(la, 4.0) + 0 * w.sum(),
        "lrkl": lambda w, la: VDF.lr_variance_kl(w, la, 4.0),
        "arkl": lambda w, la: VDF.ar_variance_kl(w, la, 4.0),
        "lin": lambda w, la: TO.local_reparam_linear(x, w, None, torch.exp(la), KEY),
        "eta": lambda w, la: PF.eta_trick_objective(w, la, 0.3, 2.0, 0.1, True),
        "pen": lambda w, la: TO.penalty_grad(w, "scad", 0.3, {"a": 3.7, "lam": 0.2})
        + 0 * la.sum(),
    }
    fused = {k: _outputs_and_grads(f, w, la) for k, f in cases.items()}
    v = torch.rand(6, 7, dtype=F64) * 1e-3
    prox = PF.adaptive_prox_(w.detach().clone(), v, "mcp", {"a": 3.0, "lam": 0.3}, 0.01, 0.5,
                             1e-8)
    grad = PF.add_penalty_grad_(torch.ones(6, 7, dtype=F64), w.detach(), "logsum", 0.3,
                                {"eps": 0.5})
    wp = torch.nn.Parameter(w.detach().clone())
    hook = PF.PenaltyGradHook(wp, "mcp", 0.3, {"a": 3.0, "lam": 0.3})
    (wp.square().sum() + 2.0 * hook.term()).backward()
    hooked = wp.grad.clone()
    monkeypatch.setattr(_numba, "is_cpu", lambda *ts: False)
    wp.grad = None
    (wp.square().sum() + 2.0 * hook.term()).backward()
    torch.testing.assert_close(wp.grad, hooked)
    for k, f in cases.items():
        outs, grads = _outputs_and_grads(f, w, la)
        for a, b in zip(outs, fused[k][0]):
            torch.testing.assert_close(a, b, msg=k)
        for a, b in zip(grads, fused[k][1]):
            if a is None or b is None:
                assert (a is None or not a.any()) and (b is None or not b.any()), k
            else:
                torch.testing.assert_close(a, b, msg=k)
    torch.testing.assert_close(
        PF.adaptive_prox_(w.detach().clone(), v, "mcp", {"a": 3.0, "lam": 0.3}, 0.01, 0.5, 1e-8),
        prox)
    torch.testing.assert_close(
        PF.add_penalty_grad_(torch.ones(6, 7, dtype=F64), w.detach(), "logsum", 0.3,
                             {"eps": 0.5}), grad)


def test_second_outputs_alone_have_the_right_gradients():
    torch.manual_seed(15)
    w = torch.randn(4, 5, dtype=F64, requires_grad=True)
    la = torch.randn(4, 5, dtype=F64, requires_grad=True)
    for f, ref in [
        (lambda: HCF.hard_concrete_gate(w, la, KEY, BETA, GAMMA, ZETA)[1],
         lambda: torch.sigmoid(la - BETA * math.log(-GAMMA / ZETA)).sum()),
        (lambda: VDF.vardrop_noise(w, la, KEY, 3.0)[1],
         lambda: kl_approx(la.clamp(-3, 3)).sum()),
        (lambda: VDF.lr_variance_kl(w, la, 3.0)[1], lambda: kl_approx(la.clamp(-3, 3)).sum()),
    ]:
        g = torch.autograd.grad(f(), (w, la), allow_unused=True)
        gr = torch.autograd.grad(ref(), la)[0]
        assert g[0] is None or not g[0].any()
        torch.testing.assert_close(g[1], gr)
