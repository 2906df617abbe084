"""Every penalty over the whole float range, and the checks of the duality constructors and of
the dropout penalties' helper functions (bad input refused, never a silent wrong number)."""

import math

import numpy as np
import pytest

import penalties as P

CATALOG = [P.L1(), P.Lp(0.5), P.Lp(1.5), P.LogSum(1.0), P.LogSum(1e-300), P.LogSum(1e300),
           P.Log2Sum(1.0), P.Log2Sum(1e-300), P.SCAD(3.7, 1.0), P.MCP(3.0, 1.0), P.VarDrop(),
           P.VarDropExact(), P.HardConcrete(), P.Standout(), P.Standout(a=1e-300),
           P.Standout(a=1e300)]
HUGE = np.array([1e150, 1e155, 1e170, 1e200, 1e250, 1e300, 1.7e308])


@pytest.mark.parametrize("pen", [p for p in CATALOG if getattr(p, "a", 1.0) != 1e-300], ids=repr)
def test_prox_of_huge_values_is_about_the_value(pen):
    """For |v| far above the step the penalty barely moves v (it was 0 above ~1e154; Standout
    with a = 1e-300 is quadratic up to |h| ~ 1e297, so it is left out)."""
    for v in (HUGE, -HUGE):
        x = pen.prox(v, 1.0)
        np.testing.assert_allclose(x, v, rtol=1e-12)


@pytest.mark.parametrize("pen", CATALOG, ids=repr)
@pytest.mark.parametrize("t", [1e-300, 1e-10, 1.0, 1e10, 1e300])
def test_prox_shrinks_and_keeps_the_sign_at_every_scale(pen, t):
    v = np.concatenate([-np.logspace(-300, 308, 60), np.logspace(-300, 308, 60)])
    x = pen.prox(v, t)
    assert np.all(np.isfinite(x))
    assert np.all(np.abs(x) <= np.abs(v)) and np.all(np.sign(x) * np.sign(v) >= 0)


@pytest.mark.parametrize("pen", CATALOG, ids=repr)
def test_omega_and_derivative_are_numbers_at_every_scale(pen):
    w = np.logspace(-320, 308, 400)
    om, d = pen.omega(w), pen.derivative(w)
    assert not np.any(np.isnan(om)) and np.all(om >= 0)
    assert not np.any(np.isnan(d)) and np.all(d >= 0)
    assert np.all(om[1:] >= om[:-1] * (1 - 1e-12))  # nondecreasing in |w| (inf past the floats)


def test_log_penalties_stay_finite_and_exact_beyond_1e154():
    w = np.array([1e100, 1e155, 1e200, 1e300, 1.7e308])
    np.testing.assert_allclose(P.Log2Sum(2.0).omega(w), 2 * np.log(w) - np.log(2.0), rtol=1e-15)
    np.testing.assert_allclose(P.Log2Sum(2.0).derivative(w), 2.0 / w, rtol=1e-15)
    np.testing.assert_allclose(P.LogSum(1e-300).omega(w), np.log(w) + 300 * np.log(10), rtol=1e-14)
    # tiny eps: log(1 + w/eps) with w/eps far beyond the largest float
    assert P.LogSum(1e-300).omega(1e10) == pytest.approx(310 * math.log(10), rel=1e-14)


def test_standout_over_the_range_of_its_slope():
    # Omega(h) = v^2/lam e^-b g(a h)/a^2, g(u) ~ u^2/2: a h tiny -> h^2/2 whatever a is
    assert P.Standout(a=1e-300).omega(1e100) == pytest.approx(0.5e200, rel=1e-12)
    assert P.Standout(a=1e-300).prox(1e150, 1.0) == pytest.approx(0.5e150, rel=1e-12)
    assert P.Standout(a=1e300).omega(1e100) == 0.0  # 1e-600: not a float
    assert not np.isnan(P.Standout(a=1e300).omega(np.array([1.0, 1e200]))).any()


def test_keep_ratio_near_the_largest_float():
    pen = P.Log2Sum(1.0)
    eta = pen.eta_hat(1.3e154)  # about 0.85e308
    a = pen.keep_ratio(1.3e154, lam=1e308)
    assert a == pytest.approx(1.0 / (1.0 + 1e308 / eta), rel=1e-12) and 0.4 < a < 0.6
    r = P.L1().keep_ratio(np.array([0.0, 1e-300, 1.0, 1.7e308]), lam=1e308)
    assert np.all((0 <= r) & (r <= 1)) and r[0] == 0.0 and r[-1] == pytest.approx(1.7 / 2.7)


@pytest.mark.parametrize("pen, k", [(P.L1(), 1.0), (P.Lp(0.7), 0.7), (P.LogSum(2.0), 0.0),
                                    (P.Log2Sum(3.0), 0.0), (P.SCAD(3.7, 0.5), 1.0),
                                    (P.MCP(2.0, 0.5), 1.0), (P.Standout(2.0, 0.5, 1.5, 2.0), 2.0)],
                         ids=repr)
@pytest.mark.parametrize("c", [1e-150, 1e-3, 7.0, 1e150])
def test_rescaled_is_the_same_family_at_another_scale(pen, k, c):
    got = pen.rescaled(c)
    assert got is not None and got[1] == k
    u = np.logspace(-3, 3, 25) / c
    np.testing.assert_allclose(pen.omega(c * u), c**k * got[0].omega(u), rtol=1e-11)


def test_penalties_without_a_scale_cannot_be_rescaled():
    assert P.VarDrop().rescaled(2.0) is None and P.HardConcrete().rescaled(2.0) is None
    assert P.from_dual(P.L1().f).rescaled(2.0) is None
    assert P.LogSum(1.0).rescaled(1e-310) is None  # eps / c is not a float


# ------------------------------------------------------------------------------------------------
# duality constructors: what they refuse
# ------------------------------------------------------------------------------------------------
def test_from_dual_refuses_a_decreasing_dual():
    with pytest.raises(ValueError, match="f must be nondecreasing"):
        P.from_dual(lambda e: -e)


def test_from_dual_refuses_a_dual_below_f0():
    with pytest.raises(ValueError, match="below f0.*f0=None"):
        P.from_dual(np.log)  # nondecreasing, but -27 at eta = 1e-12: Omega would be negative
    pen = P.from_dual(np.log, f0=None)  # its infimum over eta_range instead
    assert pen.omega(0.0) == 0.0 and pen.omega(0.5) > 0


@pytest.mark.parametrize("make", [
    lambda: P.from_dual(lambda e: float(np.mean(e))),
    lambda: P.from_dual(lambda e: e / e.max()),
    lambda: P.from_penalty(lambda w: np.abs(w) / np.abs(w).max()),
    lambda: P.from_eta_hat(lambda w: np.sort(np.abs(w))[::-1] * 0 + np.abs(w).mean()),
    lambda: P.from_keep_ratio(lambda w: np.full(np.shape(w), 0.5) + 0.4 * (np.abs(w) > np.median(np.abs(w))), 1.0),
    lambda: P.from_mask_moments(lambda t: 0.5 + 0 * t, lambda t: 0.3 + 0 * t,
                                lambda t: t - t.min()),
], ids=["dual-scalar", "dual-whole-array", "penalty", "eta_hat", "keep_ratio", "mask"])
def test_constructors_refuse_callables_that_are_not_elementwise(make):
    with pytest.raises(ValueError, match="vectorized|elementwise"):
        make()


# ------------------------------------------------------------------------------------------------
# the dropout penalties' functions of log alpha and eta
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [P.VarDrop.kl, P.VarDropExact.kl,
                                P.HardConcrete().log_alpha_of_eta], ids=["vd", "vd-exact", "hc"])
def test_nan_is_refused_naming_the_argument(fn):
    with pytest.raises(ValueError, match="NaN"):
        fn(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="log_alpha|eta"):
        fn("a")


def test_kl_over_the_whole_range_of_log_alpha():
    la = np.array([-np.inf, -1e4, -1000.0, -462.0, -461.0, -20.0, 0.0, 20.0, 1e4, np.inf])
    for kl in (P.VarDrop.kl, P.VarDropExact.kl):
        v = kl(la)
        assert v[0] == np.inf and v[-1] == 0.0 and np.all(np.isfinite(v[1:-1]))
        assert np.all(np.diff(v) <= 0)  # KL falls as alpha grows
        # for alpha -> 0, KL ~ -1/2 log alpha + const: slope 1/2 per unit of -log alpha
        assert v[1] - v[2] == pytest.approx(0.5 * 9000, rel=1e-12)
        assert v[3] - v[4] == pytest.approx(0.5, rel=1e-9)  # the asymptote joins smoothly


def test_hardconcrete_log_alpha_of_eta_inverts_eta_everywhere():
    hc = P.HardConcrete()
    theta = np.array([-200.0, -70.0, -50.0, -5.0, 0.0, 5.0, 50.0, 80.0, 200.0])
    eta = 1.0 / hc.moments.envelope(np.clip(theta, -70, 100))[0]
    got = hc.log_alpha_of_eta(eta)
    inside = np.abs(theta) <= 70
    np.testing.assert_allclose(got[inside], theta[inside], atol=1e-8)
    # beyond the bisection range: linear in log eta (no silent clip at the range's ends)
    assert np.all(np.diff(hc.log_alpha_of_eta(np.logspace(-300, 300, 50))) > 0)
    # eta = 0 and eta = inf are gates that never open / never close: no number is log alpha
    for bad, match in ((0.0, "eta must be > 0.*never opens"), (np.inf, "eta contains inf"),
                       (-1.0, "eta must be > 0")):
        with pytest.raises(ValueError, match=match):
            hc.log_alpha_of_eta(bad)
    assert hc.f(np.array([1e-300, 1e300])).tolist() == pytest.approx([0.0, 1.0], abs=1e-12)
    # the gate's moments refuse NaN naming theta; +-inf are the closed and open gates
    with pytest.raises(ValueError, match="theta .log alpha. contains NaN"):
        hc.moments.all(np.nan)
    with pytest.raises(ValueError, match="theta .log alpha. contains NaN"):
        hc.moments.envelope([0.0, np.nan])
    assert hc.moments.l0(np.array([-np.inf, np.inf])).tolist() == [0.0, 1.0]


# ------------------------------------------------------------------------------------------------
# vector penalties
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [-1.0, np.nan, "x"])
def test_hard_threshold_prox_refuses_a_bad_step(t):
    with pytest.raises(ValueError, match="t"):
        P.HardThreshold(1).prox([1.0, 2.0], t)


def test_ard_with_a_zero_column_ignores_it():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, 3))
    w = np.array([1.0, -2.0, 0.5])
    X0 = X.copy()
    X0[:, 1] = 0.0
    ard = P.ARD(X0)
    assert ard.omega(w) == pytest.approx(P.ARD(X[:, [0, 2]]).omega(w[[0, 2]]), rel=1e-12)
    eta = ard.eta_hat(w)
    assert eta[1] == np.inf and np.all(np.isfinite(eta[[0, 2]]))
    assert ard.eta_hat(np.array([1.0, 0.0, 0.5]))[1] == 0.0


@pytest.mark.parametrize("c", [1e-200, 1e200])
def test_ard_is_scale_free_in_the_columns(c):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 3))
    w = np.array([1.0, -2.0, 0.5])
    scale = np.array([1.0, c, 1.0])
    base = P.ARD(X)
    big = P.ARD(X * scale)
    assert big.omega(w / scale) == pytest.approx(base.omega(w), rel=1e-9)
    assert P.ARD(X * c).omega(w / c) == pytest.approx(base.omega(w), rel=1e-9)
    s = math.sqrt(c)  # eta scales as 1/s^2: a float for s = 1e+-100
    np.testing.assert_allclose(P.ARD(X * s).eta_hat(w / s) * s * s, base.eta_hat(w), rtol=1e-6)
