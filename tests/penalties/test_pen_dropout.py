"""Dropout-derived penalties checked against independent high-precision numerics (scipy quad)."""

import math

import numpy as np
import pytest
from scipy import integrate, optimize, special

import penalties as P

GAMMA_E = 0.5772156649015329


def kl_exact_quad(a):
    """KL(a) = -1/2 log a + E log|1 + sqrt(a) e| + (gamma + log 2)/2 by adaptive quadrature,
    with the logarithmic singularity at e = -1/sqrt(a) given to quad as a breakpoint."""
    s = math.sqrt(a)
    sing = -1.0 / s
    g = lambda e: math.log(abs(1.0 + s * e)) * math.exp(-0.5 * e * e) / math.sqrt(2 * math.pi)  # noqa: E731
    parts = [(-40.0, sing), (sing, 40.0)]
    val = sum(integrate.quad(g, lo, hi, limit=400, epsabs=1e-14, epsrel=1e-13)[0] for lo, hi in parts)
    return -0.5 * math.log(a) + val + 0.5 * (GAMMA_E + math.log(2.0))


@pytest.mark.parametrize("eta", [1e-3, 0.05, 0.7, 4.0, 60.0])
def test_vardrop_exact_f_is_twice_the_kl(eta):
    assert P.VarDropExact().f(eta) == pytest.approx(2.0 * kl_exact_quad(1.0 / eta), rel=1e-8, abs=1e-12)


def test_vardrop_exact_f_prime_is_dawson_ratio():
    pen = P.VarDropExact()
    for eta in [0.01, 0.5, 3.0, 40.0]:
        h = 1e-5 * eta
        fd = (pen.f(eta + h) - pen.f(eta - h)) / (2 * h)
        u = math.sqrt(eta / 2)
        assert fd == pytest.approx(special.dawsn(u) / u, rel=1e-7)


def test_vardrop_exact_kl_vanishes_for_large_alpha_and_matches_seed_approx_roughly():
    la = np.array([-4.0, 0.0, 2.0, 6.0])
    exact = P.VarDropExact.kl(la)
    approx = P.VarDrop.kl(la)
    assert P.VarDropExact.kl(20.0) < 1e-6
    # Molchanov et al. report the approximation to be within ~0.01 of the true KL
    np.testing.assert_allclose(exact, approx, atol=0.02)


def _omega_by_minimization(f, w, lo=-40, hi=40):
    res = optimize.minimize_scalar(
        lambda le: 0.5 * (w * w / math.exp(le) + f(math.exp(le))), bounds=(lo, hi), method="bounded",
        options={"xatol": 1e-13, "maxiter": 2000},
    )
    return res.fun, math.exp(res.x)


@pytest.mark.parametrize("w", [1e-6, 1e-3, 0.2, 1.0, 3.0, 25.0])
def test_vardrop_exact_omega_against_quadrature_kl(w):
    f = lambda eta: 2.0 * kl_exact_quad(1.0 / eta)  # noqa: E731
    lo, hi = math.log(w * w) - 8, math.log(w) + 8  # eta_hat lies between w^2-ish and w-ish
    val, eta = _omega_by_minimization(f, w, min(lo, math.log(w) - 8), max(hi, 2 * math.log(w) + 8))
    pen = P.VarDropExact()
    assert pen.omega(w) == pytest.approx(val, rel=1e-8)
    assert pen.eta_hat(w) == pytest.approx(eta, rel=1e-4)


@pytest.mark.parametrize("w", [1e-7, 1e-3, 0.3, 1.0, 4.0, 80.0])
def test_vardrop_approx_against_scipy_minimization(w):
    k1, k2, k3 = 0.63576, 1.87320, 1.48695
    f = lambda eta: 2 * k1 * special.expit(k3 * math.log(eta) - k2) + math.log1p(eta)  # noqa: E731
    val, eta = _omega_by_minimization(f, w, -60, 60)
    assert P.VarDrop().omega(w) == pytest.approx(val, rel=1e-9)
    assert P.VarDrop().eta_hat(w) == pytest.approx(eta, rel=1e-4)


def test_vardrop_asymptotes():
    big = 1e9
    assert P.VarDropExact().omega(big) == pytest.approx(math.log(big) + 0.5 * (1 + GAMMA_E + math.log(2)), rel=1e-12)
    assert P.VarDropExact().omega(1e-14) == pytest.approx(1e-14, rel=1e-9)  # L1-like at 0


# ---------------------------------------------------------------------------------------------
# Hard-concrete: moments by quad in the uniform variable u, no shared code with the package
# ---------------------------------------------------------------------------------------------
BETA, GAM, ZETA = 2 / 3, -0.1, 1.1


def hc_moments_quad(theta):
    def z(u):
        s = special.expit((math.log(u) - math.log1p(-u) + theta) / BETA)
        return min(1.0, max(0.0, s * (ZETA - GAM) + GAM))

    # breakpoints where z leaves 0 and reaches 1
    s0, s1 = -GAM / (ZETA - GAM), (1 - GAM) / (ZETA - GAM)
    u0 = special.expit(BETA * special.logit(s0) - theta)
    u1 = special.expit(BETA * special.logit(s1) - theta)
    m1 = integrate.quad(z, u0, u1, epsabs=1e-15, epsrel=1e-13, limit=200)[0] + (1 - u1)
    m2 = integrate.quad(lambda u: z(u) ** 2, u0, u1, epsabs=1e-15, epsrel=1e-13, limit=200)[0] + (1 - u1)
    return m1, m2


@pytest.mark.parametrize("theta", [-6.0, -1.0, 0.0, 0.5, 3.0])
def test_hardconcrete_moments(theta):
    mo = P.HardConcrete.moments.all(np.array([theta]))
    m1, m2 = hc_moments_quad(theta)
    assert mo["mean"][0] == pytest.approx(m1, rel=1e-10)
    assert mo["second_moment"][0] == pytest.approx(m2, rel=1e-10)
    l0 = special.expit(theta - BETA * math.log(-GAM / ZETA))
    assert float(P.HardConcrete.moments.l0(theta)) == pytest.approx(l0, rel=1e-14)


@pytest.mark.parametrize("w", [1e-5, 0.05, 0.2, 0.4, 0.5, 0.53, 0.545, 0.8])
def test_hardconcrete_omega_by_direct_minimization(w):
    """Omega(w~) = 1/2 min_theta [w~^2 (m2/m1^2 - 1) + P(z != 0)] with quad moments; the cap 1/2."""

    def obj(theta):
        m1, m2 = hc_moments_quad(theta)
        return 0.5 * (w * w * (m2 / (m1 * m1) - 1.0) + special.expit(theta - BETA * math.log(-GAM / ZETA)))

    best = min(
        optimize.minimize_scalar(obj, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}).fun
        for lo, hi in [(-40, -5), (-6, 0.0), (-0.5, 1.5), (1.0, 8.0)]
    )
    best = min(best, 0.5)  # theta -> inf: no dropout, penalty P(z != 0) -> 1
    assert P.HardConcrete().omega(w) == pytest.approx(best, rel=1e-7)


def test_hardconcrete_cap_and_kink():
    pen = P.HardConcrete()
    wc = pen.w_cap
    assert 0.5 < wc < 0.56
    assert pen.omega(wc * 1.0001) == 0.5
    assert pen.eta_hat(wc * 1.0001) == np.inf
    # kink: left derivative at the cap is bounded away from 0
    assert pen.derivative(wc * 0.9999) > 0.1
    assert pen.omega(wc * 0.999) < 0.5


def test_hardconcrete_from_mask_moments_agrees_with_table():
    """The generic biased-mask constructor, fed with independent u-space Gauss-Legendre moments."""
    x, wts = np.polynomial.legendre.leggauss(400)

    def moments(theta):
        theta = np.asarray(theta, dtype=float)
        s0, s1 = -GAM / (ZETA - GAM), (1 - GAM) / (ZETA - GAM)
        u0 = special.expit(BETA * special.logit(s0) - theta)[..., None]
        u1 = special.expit(BETA * special.logit(s1) - theta)[..., None]
        u = u0 + 0.5 * (u1 - u0) * (x + 1)
        z = np.clip(special.expit((np.log(u) - np.log1p(-u) + theta[..., None]) / BETA) * (ZETA - GAM) + GAM, 0, 1)
        half = 0.5 * (u1 - u0)[..., 0]
        tail = (1 - u1)[..., 0]
        return half * np.sum(wts * z, -1) + tail, half * np.sum(wts * z * z, -1) + tail

    pen = P.from_mask_moments(
        lambda t: moments(t)[0],
        lambda t: moments(t)[1],
        lambda t: special.expit(np.asarray(t) - BETA * math.log(-GAM / ZETA)),
        theta_range=(-25.0, 25.0),
    )
    w = np.array([0.01, 0.1, 0.3, 0.5, 0.7])
    np.testing.assert_allclose(pen.omega(w), P.HardConcrete().omega(w), rtol=1e-6)


def test_standout_omega_integrates_its_derivative():
    pen = P.Standout(a=1.3, b=0.4, v_norm=2.0, lam=0.5)
    for h in [0.1, 1.0, 5.0]:
        expect = integrate.quad(lambda t: 4.0 * t * math.exp(-(1.3 * t + 0.4)) / 0.5, 0, h, epsabs=1e-14)[0]
        assert pen.omega(h) == pytest.approx(expect, rel=1e-10)
    with pytest.raises(ValueError, match="a must be > 0"):
        P.Standout(a=-1.0)


@pytest.mark.parametrize("pen", [P.VarDrop(), P.VarDropExact(), P.HardConcrete()], ids=repr)
def test_tables_are_audited_accurate(pen):
    assert pen.table_error < 1e-10


def test_kernels_callable_from_numba():
    from numba import njit

    from penalties.kernels import derivative_scalar, omega_scalar, prox_scalar

    @njit
    def total(code, params, w):
        s = 0.0
        for x in w:
            s += omega_scalar(code, params, x) + 0.0 * derivative_scalar(code, params, x) + 0.0 * prox_scalar(code, params, x, 0.1)
        return s

    w = np.linspace(-3, 3, 101)
    for pen in [P.LogSum(2.0), P.VarDropExact(), P.HardConcrete(), P.MCP(3, 1)]:
        code, params = pen.kernel_spec()
        assert total(code, params, w) == pytest.approx(np.sum(pen.omega(w)), rel=1e-13)
