"""Closed forms of the catalog against independent derivations and the dual constructions."""

import math

import numpy as np
import pytest
from scipy import integrate, optimize

import penalties as P

CLOSED = [
    P.L1(),
    P.Lp(0.5),
    P.Lp(1.5),
    P.Lp(0.2),
    P.LogSum(2.0),
    P.LogSum(0.01),
    P.Log2Sum(0.5),
    P.SCAD(3.7, 1.0),
    P.MCP(3.0, 0.5),
    P.MCP(0.5, math.sqrt(2)),
    P.Standout(1.0, 0.0),
    P.Standout(2.0, -1.0, v_norm=1.5, lam=0.7),
]
W = np.array([1e-9, 1e-4, 0.03, 0.5, 1.0, 2.2, 7.0, 300.0])
ETA = np.array([1e-9, 1e-4, 0.02, 0.7, 3.0, 50.0, 1e4])


def test_hand_values():
    assert P.L1().omega(-2.5) == 2.5
    assert P.Lp(0.5).omega(4.0) == pytest.approx(4.0)  # 4^0.5 / 0.5
    assert P.LogSum(2.0).omega(2.0) == pytest.approx(math.log(2.0))
    assert P.Log2Sum(1.0).omega(1.0) == pytest.approx(math.log(2.0))
    A = 1.5
    assert P.MCP(3.0, 0.5).omega(1.0) == pytest.approx(1.0 - 1.0 / (2 * A))
    assert P.MCP(3.0, 0.5).omega(10.0) == pytest.approx(A / 2)
    # SCAD / lam: middle piece at w = 2 with a = 3.7, lam = 1
    assert P.SCAD(3.7, 1.0).omega(2.0) == pytest.approx((2 * 3.7 * 2 - 4 - 1) / (2 * 2.7))
    assert P.SCAD(3.7, 1.0).omega(9.0) == pytest.approx(4.7 / 2)


def test_logsum_f_matches_duality_md_form():
    eps = 2.0
    eta = ETA
    s = np.sqrt(eps**2 + 4 * eta)
    seed = 2 * np.log((s + eps) / 2) - (s - eps) ** 2 / (4 * eta)
    np.testing.assert_allclose(P.LogSum(eps).f(eta), seed - 2 * math.log(eps), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pen", CLOSED, ids=repr)
def test_omega_is_min_over_eta_of_dual(pen):
    """Omega(w) = 1/2 min_eta [w^2/eta + f(eta)], the minimum found by scipy per point."""
    for w in W:
        res = optimize.minimize_scalar(
            lambda le: 0.5 * (w * w / math.exp(le) + float(pen.f(math.exp(le)))),
            bounds=(-60, 60),
            method="bounded",
            options={"xatol": 1e-12},
        )
        expect = res.fun
        # capped penalties: the infimum is the limit eta -> inf
        expect = min(expect, 0.5 * float(pen.f(1e25)))
        assert pen.omega(w) == pytest.approx(expect, rel=1e-6, abs=1e-12 * max(1.0, w * w))


@pytest.mark.parametrize("pen", CLOSED, ids=repr)
def test_derivative_is_w_over_eta_hat_and_matches_finite_difference(pen):
    for w in W[1:-1]:
        h = 1e-6 * w
        fd = (pen.omega(w + h) - pen.omega(w - h)) / (2 * h)
        eta = pen.eta_hat(w)
        expect = 0.0 if np.isinf(eta) else w / eta
        assert pen.derivative(w) == pytest.approx(expect, rel=1e-12, abs=1e-300)
        if isinstance(pen, (P.SCAD, P.MCP)) and abs(w - pen.lam) < 1e-3:
            continue
        assert pen.derivative(w) == pytest.approx(fd, rel=1e-5, abs=1e-9)
    np.testing.assert_allclose(pen.derivative(-W[2:5]), -pen.derivative(W[2:5]))


@pytest.mark.parametrize("pen", CLOSED, ids=repr)
def test_omega_is_integral_of_t_over_eta_hat(pen):
    """Corollary 2 by adaptive quadrature (scipy.integrate.quad), independent of the code's quadrature."""
    for w in [0.03, 0.8, 2.2, 6.0]:
        val, _ = integrate.quad(
            lambda t: 0.0 if np.isinf(pen.eta_hat(t)) else t / pen.eta_hat(t), 0.0, w, limit=200, epsabs=1e-13, epsrel=1e-12,
            points=[p for p in (getattr(pen, "lam", None), getattr(pen, "a", 0) * getattr(pen, "lam", 0)) if p and 0 < p < w] or None,
        )
        assert pen.omega(w) == pytest.approx(val, rel=1e-7, abs=1e-12)


@pytest.mark.parametrize("pen", CLOSED, ids=repr)
def test_round_trips_through_dual_constructions(pen):
    """a <-> b <-> c: from_dual(f), from_penalty(omega), from_eta_hat(eta_hat) agree with the closed form."""
    a = P.from_dual(pen.f, eta_range=(1e-24, 1e14))
    c = P.from_eta_hat(pen.eta_hat, w_range=(1e-12, 1e4))
    w = W[W < 1e3]
    np.testing.assert_allclose(a.omega(w), pen.omega(w), rtol=1e-6, atol=1e-13)
    np.testing.assert_allclose(c.omega(w), pen.omega(w), rtol=1e-6, atol=1e-13)
    finite = pen.eta_hat(w) < 1e12  # beyond eta_range from_dual reports inf
    kinks = [getattr(pen, "lam", None)] if isinstance(pen, P.SCAD) else []
    finite &= ~np.isin(w, kinks)  # eta_hat is continuous there but f is not twice differentiable
    np.testing.assert_allclose(a.eta_hat(w)[finite], pen.eta_hat(w)[finite], rtol=1e-6)
    if not isinstance(pen, P.Standout):  # standout f needs |h| beyond w_range for small eta
        b = P.from_penalty(pen.omega, w_range=(1e-10, 1e5))
        np.testing.assert_allclose(b.f(ETA[1:-1]), pen.f(ETA[1:-1]), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(b.eta_hat(w)[finite], pen.eta_hat(w)[finite], rtol=1e-6)


def test_keep_ratio_round_trip():
    pen = P.LogSum(2.0)
    lam = 0.7
    k = P.from_keep_ratio(lambda w: pen.keep_ratio(w, lam), lam, w_range=(1e-12, 1e4))
    np.testing.assert_allclose(k.omega(W[:-1]), pen.omega(W[:-1]), rtol=1e-8)
    alpha = pen.keep_ratio(W, lam)
    np.testing.assert_allclose(alpha, pen.eta_hat(W) / (pen.eta_hat(W) + lam))
    assert P.MCP(3, 0.5).keep_ratio(5.0, 1.0) == 1.0


def test_prox_closed_forms_against_brute_force():
    rng = np.random.default_rng(0)
    for pen in CLOSED:
        for _ in range(30):
            v = rng.normal(scale=3)
            t = rng.uniform(0.05, 3)
            x = pen.prox(v, t)
            grid = np.linspace(-abs(v) - 1, abs(v) + 1, 200001)
            hmin = np.min(0.5 * (grid - v) ** 2 + t * pen.omega(grid))
            hx = 0.5 * (x - v) ** 2 + t * pen.omega(x)
            assert hx <= hmin + 1e-9, (pen, v, t, x)


def test_soft_threshold_and_firm_threshold_exact():
    assert P.L1().prox(3.0, 1.0) == 2.0
    assert P.L1().prox(-0.5, 1.0) == 0.0
    # MCP firm threshold with t < A: (|v| - t) / (1 - t/A) in the middle zone
    pen = P.MCP(3.0, 1.0)
    assert pen.prox(2.0, 1.0) == pytest.approx((2.0 - 1.0) / (1 - 1 / 3))
    assert pen.prox(5.0, 1.0) == 5.0
    np.testing.assert_allclose(pen.prox(np.array([[0.5, -2.0]]), np.array([1.0, 1.0])), [[0.0, -1.5]])
