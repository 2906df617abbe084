"""SDE simulators and discrete runners of dualdrop.dynamics against closed forms."""

import math

import numpy as np
import pytest
import scipy.linalg as sl
import torch

import dualdrop.dynamics as dy
from dualdrop.diagnostics import LowRankCov


def test_sgd_one_dimensional_ou_process():
    # SDE: Ornstein-Uhlenbeck, stationary variance eta sigma^2 / (2h): E f = eta sigma^2 / 4.
    # SGD itself: variance eta sigma^2 / (h (2 - eta h)); at eta h = 0.5 the two differ by 33%.
    h, sigma, lr = 2.0, 1.5, 0.25
    H = torch.tensor([[h]])
    sde = dy.stationary_loss("sgd", H, sigma, lr, method="sde", substeps=32, paths=1024,
                             steps=1200, burn_in=150)
    disc = dy.stationary_loss("sgd", H, sigma, lr, method="discrete", paths=1024, steps=2000,
                              burn_in=200)
    exact_sde = lr * sigma ** 2 / 4
    exact_disc = h / 2 * lr * sigma ** 2 / (h * (2 - lr * h))
    assert exact_sde == pytest.approx(dy.sgd_stationary_loss(H, sigma, lr))
    assert exact_disc == pytest.approx(dy.sgd_stationary_loss(H, sigma, lr, discrete=True))
    # Euler-Maruyama with dt = lr/32 has its own O(dt) bias: h dt / 4 relative, about 0.4%
    assert abs(sde["loss"] - exact_sde) < 4 * sde["stderr"] + 0.01 * exact_sde
    assert abs(disc["loss"] - exact_disc) < 4 * disc["stderr"]
    assert disc["loss"] > sde["loss"] * 1.2


def test_sgd_sde_level_is_eta_sigma2_d_over_4_on_any_spd_hessian():
    g = torch.Generator().manual_seed(1)
    Q, _ = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    H = Q @ torch.diag(torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)) @ Q.T
    r = dy.stationary_loss("sgd", H, 1.0, 0.01, substeps=4, paths=512)
    assert r["loss"] == pytest.approx(3 * 0.01 / 4, rel=0.06)
    assert abs(r["loss"] - 3 * 0.01 / 4) < 4 * r["stderr"] + 0.01 * r["loss"]


def test_bounds_closed_forms():
    H = torch.diag(torch.tensor([1.0, 4.0], dtype=torch.float64))
    mu, L, Lt, eta, s, gam = 1.0, 4.0, 5.0, 0.1, 3.0, 0.5
    assert dy.stationary_bound("sgd", H, s, eta) == pytest.approx(eta * Lt * s ** 2 / (4 * mu))
    inv_delta = math.pi * s ** 2 / (math.sqrt(2 * math.pi) * s + eta * mu)
    assert dy.stationary_bound("signsgd", H, s, eta) == pytest.approx(eta / 2 * Lt / (2 * mu)
                                                                      * inv_delta)
    assert dy.stationary_bound("adam-l2", H, s, eta, gam) == pytest.approx(
        eta * Lt * s / 2 * L / (2 * mu * L + gam * (L + mu)))
    assert dy.stationary_bound("adamw", H, s, eta, gam) == pytest.approx(
        eta * Lt * s / 2 * L / (2 * mu * L + s * gam * (L + mu)))
    # AdamW's level saturates in sigma, Adam + L2's does not
    big = [dy.stationary_bound("adamw", H, x, eta, gam) for x in (1e3, 1e4)]
    assert big[1] / big[0] < 1.01
    assert dy.stationary_bound("adam-l2", H, 1e4, eta, gam) / dy.stationary_bound(
        "adam-l2", H, 1e3, eta, gam) == pytest.approx(10)


def _adam_linear_discrete_level(eta, sigma, h, b1, gamma, decoupled, l2):
    """Exact stationary E f of Adam's recursion linearized at the minimum (v frozen at sigma^2,
    bias corrections at 1): x' = x - eta m'/sigma [- eta gamma x], m' = b1 m + (1 - b1) (a x +
    sigma z) with a = h (+ gamma for L2)."""
    a = h + (gamma if l2 else 0.0)
    dec = eta * gamma if decoupled else 0.0
    F = np.array([[1 - dec - eta / sigma * (1 - b1) * a, -eta / sigma * b1], [(1 - b1) * a, b1]])
    G = np.array([[-eta * (1 - b1)], [(1 - b1) * sigma]])
    return h / 2 * sl.solve_discrete_lyapunov(F, G @ G.T)[0, 0]


@pytest.mark.parametrize("opt,gamma", [("adam", 0.0), ("adam-l2", 0.5), ("adamw", 0.5)])
def test_torch_adam_family_matches_linearized_recursion(opt, gamma):
    h, sigma, eta, b1 = 1.0, 2.0, 0.02, 0.9
    r = dy.stationary_loss(opt, torch.tensor([[h]]), sigma, eta, method="discrete",
                           weight_decay=gamma, betas=(b1, 0.99), paths=512)
    exact = _adam_linear_discrete_level(eta, sigma, h, b1, gamma, opt == "adamw", opt == "adam-l2")
    assert abs(r["loss"] - exact) < 4 * r["stderr"] + 0.02 * exact
    # and the 1-D bound is that level up to O(1 - beta1)
    assert r["loss"] == pytest.approx(r["bound"], rel=0.1)


def test_adam_sde_matches_its_linearization():
    # the SDE's X-drift carries eta rho_1 (grad f - M): the linear SDE (V = sigma^2) has the level
    # of a continuous Lyapunov equation, below the discrete one by O(1 - beta1)
    h, sigma, eta, b1 = 1.0, 2.0, 0.02, 0.9
    rho, a, c = (1 - b1) / eta, 1 / sigma, 1 - b1
    A = np.array([[-a * c * h, -a * (1 - c)], [rho * h, -rho]])
    B = np.array([[0.0], [math.sqrt(eta) * rho * sigma]])
    exact = h / 2 * sl.solve_continuous_lyapunov(A, -B @ B.T)[0, 0]
    r = dy.stationary_loss("adam", torch.tensor([[h]]), sigma, eta, betas=(b1, 0.999),
                           substeps=2, paths=512)
    assert abs(r["loss"] - exact) < 4 * r["stderr"] + 0.03 * exact


def test_signsgd_sde_and_discrete_agree_and_scale_linearly():
    H = torch.tensor([[1.0]])
    lv = {}
    for s in (2.0, 8.0):
        for m in ("sde", "discrete"):
            lv[s, m] = dy.stationary_loss("signsgd", H, s, 0.02, method=m, paths=1024,
                                          seed=int(s) + len(m))
        a, b = lv[s, "sde"], lv[s, "discrete"]
        tol = 4 * math.hypot(a["stderr"], b["stderr"]) + 0.02 * a["loss"]
        assert abs(a["loss"] - b["loss"]) < tol
        # linearized at the minimum: OU with rate sqrt(2/pi) h / s, noise eta: eta s sqrt(pi/2)/4,
        # which the 1-D bound equals up to eta mu / (sqrt(2 pi) s)
        lin = 0.02 * s * math.sqrt(math.pi / 2) / 4
        assert abs(a["loss"] - lin) < 4 * a["stderr"] + 0.01 * lin
        assert a["bound"] == pytest.approx(lin, rel=0.01)
    slope = math.log(lv[8.0, "sde"]["loss"] / lv[2.0, "sde"]["loss"]) / math.log(4)
    assert slope == pytest.approx(1.0, abs=0.06)


def test_signsgd_optimizer_step():
    x = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = dy.SignSGD([x], lr=0.1)
    x.grad = torch.tensor([0.5, -3.0, 0.0])
    opt.step()
    assert torch.equal(x.detach(), torch.tensor([0.9, -1.9, 3.0]))


def test_callable_loss_equals_hessian_form():
    H = torch.tensor([[2.0, 0.3], [0.3, 1.0]], dtype=torch.float64)
    kw = dict(sigma=0.7, paths=64, burn_in=5, x0=torch.tensor([1.0, -1.0]), seed=3)
    for opt in ("sgd", "signsgd", "adam", "rmsprop"):
        a = dy.simulate_sde(opt, H, 0.05, 40, **kw)
        b = dy.simulate_sde(opt, lambda x: 0.5 * ((x @ H) * x).sum(-1), 0.05, 40, **kw)
        torch.testing.assert_close(a["x"], b["x"])
        c = dy.run_discrete(opt, lambda x: 0.5 * ((x @ H) * x).sum(-1), 0.05, 40, **kw)
        d = dy.run_discrete(opt, H, 0.05, 40, **kw)
        torch.testing.assert_close(c["x"], d["x"])


def test_sde_equals_optimizer_for_sgd_at_one_substep_with_shared_noise():
    H = torch.diag(torch.tensor([1.0, 3.0], dtype=torch.float64))
    kw = dict(sigma=0.5, paths=16, x0=torch.tensor([1.0, 1.0]), seed=0)
    a = dy.simulate_sde("sgd", H, 0.1, 30, weight_decay=0.2, **kw)
    b = dy.run_discrete("sgd", H, 0.1, 30, weight_decay=0.2, **kw)
    torch.testing.assert_close(a["x"], b["x"])


def test_noise_models():
    f = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64)
    ls = dy.LossScaled(2.0)
    assert torch.equal(ls.variance(f, 2)[:, 0], 4 * f)
    z = torch.ones(3, 2, dtype=torch.float64)
    assert torch.equal(ls.sample(z, f)[:, 1], 2 * f.sqrt())
    # a LowRankCov factor is sampled as U z; a dense one through its square root
    U = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    lr = dy.Covariance(LowRankCov(U), sigma=0.5)
    assert lr.width(2) == 1
    torch.testing.assert_close(lr.sample(torch.ones(1, 1, dtype=torch.float64), f[:1]),
                               0.5 * U.T)
    C = U @ U.T + torch.eye(2, dtype=torch.float64)
    dn = dy.Covariance(C)
    zz = torch.randn(20000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    xi = dn.sample(zz, torch.zeros(20000, dtype=torch.float64))
    torch.testing.assert_close(xi.T @ xi / 20000, C, atol=0.08, rtol=0.05)
    # SignSGD's sign correlation at zero mean: (2/pi) arcsin(rho)
    R = dn.correlation @ dn.correlation.T
    rho = C[0, 1] / (C[0, 0] * C[1, 1]).sqrt()
    assert float(R[0, 1]) == pytest.approx(2 / math.pi * math.asin(float(rho)))
    # an isotropic covariance gives the isotropic level
    H = torch.tensor([[1.0]])
    a = dy.stationary_loss("adam", H, 1.5, 0.05, noise=torch.eye(1), betas=(0.9, 0.99))
    b = dy.stationary_loss("adam", H, 1.5, 0.05, betas=(0.9, 0.99), seed=1)
    assert abs(a["loss"] - b["loss"]) < 4 * math.hypot(a["stderr"], b["stderr"])


def test_loss_scaled_sgd_converges_below_threshold():
    # Sigma = sigma^2 f I vanishes at the minimum: for small eta sigma^2 the level is 0
    r = dy.stationary_loss("sgd", torch.tensor([[1.0]]), 0.5, 0.05, noise="loss-scaled",
                           steps=600, burn_in=400, paths=64)
    assert r["loss"] < 1e-6 and math.isnan(r["bound"])


@pytest.mark.parametrize("kwargs,match", [
    (dict(optimizer="rmsprop-w"), "optimizer="),
    (dict(hessian=torch.ones(2, 3)), "hessian must be a square"),
    (dict(hessian=torch.tensor([[1.0, 0.0], [0.0, -1.0]])), "positive definite"),
    (dict(sigma=-1.0), "sigma="),
    (dict(lr=0.0), "lr="),
    (dict(optimizer="adam", weight_decay=0.1), "adam-l2"),
    (dict(method="exact"), "method="),
    (dict(betas=(0.9, 1.0)), r"betas\[1\]"),
    (dict(steps=10, burn_in=10), "burn_in=10 must be below"),
    (dict(noise="gaussian"), "noise="),
])
def test_validation(kwargs, match):
    args = dict(optimizer="adamw", hessian=torch.eye(2), sigma=1.0, lr=0.1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dy.stationary_loss(**args)


def test_measured_minibatch_covariance_as_noise():
    # SGD's SDE with any constant Sigma: H C + C H = eta Sigma, so E f = Tr(H C)/2 = eta Tr(Sigma)/4
    from dualdrop.diagnostics import hessian, sgd_noise_cov

    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3 * torch.randn(
        40, generator=g, dtype=torch.float64)
    model = torch.nn.Linear(3, 1, bias=False).double()

    def loss_fn(out, t):
        return 0.5 * ((out.squeeze(-1) - t) ** 2).mean()

    H = hessian(model, loss_fn, X, y)
    for dense in (True, False):
        S = sgd_noise_cov(model, loss_fn, X, y, batch_size=4, dense=dense)
        trace = float(torch.trace(S)) if dense else S.trace()
        r = dy.stationary_loss("sgd", H, 1.0, 0.02, noise=S, substeps=2, paths=512, seed=5)
        exact = 0.02 * trace / 4
        assert abs(r["loss"] - exact) < 4 * r["stderr"] + 0.02 * exact


def test_rmsprop_levels_against_linearization():
    # v -> sigma^2: x' = x - eta (h x + sigma z) / sigma, variance
    # eta sigma / (h (2 - eta h / sigma)); the SDE's OU level eta sigma / 4
    h, sigma, eta = 1.0, 2.0, 0.05
    H = torch.tensor([[h]])
    disc = dy.stationary_loss("rmsprop", H, sigma, eta, method="discrete", betas=(0.9, 0.99))
    sde = dy.stationary_loss("rmsprop", H, sigma, eta, substeps=2, betas=(0.9, 0.99), seed=4)
    exact_disc = h / 2 * eta * sigma / (h * (2 - eta * h / sigma))
    assert abs(disc["loss"] - exact_disc) < 4 * disc["stderr"] + 0.03 * exact_disc
    assert abs(sde["loss"] - eta * sigma / 4) < 4 * sde["stderr"] + 0.03 * eta * sigma / 4
    assert sde["bound"] == pytest.approx(eta * sigma / 4)
