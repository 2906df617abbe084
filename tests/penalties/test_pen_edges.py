"""The duality constructors at w = 0 and at the ends of their ranges, the checked entries of
``penalties.kernels``, and the comparison figure with a user's own penalty. Each case failed
(an error at w = 0, a silent wrong number beyond the range, NaN from a bad kernel argument) before
the fix; the right values come from closed forms (the rule |w| / (|w| + 1) at lam = 1 is the l1
penalty; the rule |w| has f(eta) = eta)."""

import csv

import numpy as np
import pytest

import penalties as P
from penalties import curves
from penalties import kernels as K

W7 = np.linspace(-3, 3, 7)  # docs/penalties.md's example grid, with w = 0 in it


def _l1_keep(w):
    return np.abs(w) / (np.abs(w) + 1.0)


# ------------------------------------------------------------------------------------------------
# from_keep_ratio / from_eta_hat at w = 0 and beyond w_range
# ------------------------------------------------------------------------------------------------
def test_keep_ratio_rule_at_zero_matches_the_builtin_l1():
    pen = P.from_keep_ratio(_l1_keep, lam=1.0)
    l1 = P.L1()
    assert pen.eta_hat(0.0) == 0.0 and pen.keep_ratio(0.0) == 0.0
    np.testing.assert_allclose(pen.eta_hat(W7), l1.eta_hat(W7), rtol=1e-12)
    np.testing.assert_allclose(pen.keep_ratio(W7), _l1_keep(W7), rtol=1e-12)
    np.testing.assert_allclose(pen.keep_ratio(W7, lam=2.0), l1.keep_ratio(W7, lam=2.0), rtol=1e-12)
    np.testing.assert_allclose(pen.omega(W7), np.abs(W7), rtol=1e-9)
    np.testing.assert_allclose(pen.derivative(W7), np.sign(W7), rtol=1e-9)
    np.testing.assert_allclose(pen.prox(W7, 0.5), l1.prox(W7, 0.5), atol=1e-9)


def test_a_rule_that_fails_at_zero_is_never_called_there():
    def rule(w):  # 0/0 at w = 0, as many hand-written rules are
        w = np.abs(w)
        return w * w / (w * w + w)

    pen = P.from_keep_ratio(rule, lam=1.0)
    with np.errstate(invalid="raise", divide="raise"):
        assert pen.eta_hat(0.0) == 0.0 and pen.keep_ratio(0.0) == 0.0
        np.testing.assert_allclose(pen.omega(W7), np.abs(W7), rtol=1e-9)
    assert P.from_eta_hat(lambda w: 1.0 / (1.0 / np.abs(w))).eta_hat(0.0) == 0.0


def test_keep_ratio_refusals_name_the_rule_and_w_range():
    with pytest.raises(ValueError, match=r"keep-ratio rule .alpha_hat. must lie in \(0, 1\]"):
        P.from_keep_ratio(lambda w: 0 * w + 1.5, lam=1.0)
    # valid on w_range, 1.5 beyond it: refused there, naming w_range
    pen = P.from_keep_ratio(lambda w: np.where(np.abs(w) < 1e9, _l1_keep(w), 1.5), lam=1.0)
    with pytest.raises(ValueError, match=r"outside w_range.*keep ratio must lie in \[0, 1\]"):
        pen.eta_hat(1e10)
    for bad in (-5.0, 0.0, np.nan, "1"):
        with pytest.raises(ValueError, match="lam"):
            P.from_keep_ratio(_l1_keep, lam=bad)
    with pytest.raises(ValueError, match="lam"):
        pen.keep_ratio(1.0, lam=-5)


def test_eta_hat_rule_beyond_its_range_is_refused_naming_w_range():
    pen = P.from_eta_hat(np.abs)  # f(eta) = eta, Omega = |w|
    with pytest.raises(ValueError, match=r"w_range\[1\] = 1e\+08.*larger w_range"):
        pen.f(1e20)  # was 2.0e8, silently
    with pytest.raises(ValueError, match=r"w_range\[1\] = 1e\+08.*w_range=\(1e-12, 1e\+21\)"):
        pen.omega(1e20)
    wide = P.from_eta_hat(np.abs, w_range=(1e-12, 1e21))
    assert wide.f(1e20) == pytest.approx(1e20, rel=1e-9)
    assert pen.eta_hat(1e20) == 1e20  # the rule itself is defined there


def test_f_below_the_range_is_the_closed_form_head():
    """f(eta) for eta below eta_hat(w_range[0]) is attained in the power-law head (was 0)."""
    e = np.array([1e-30, 1e-15, 1e-12, 1e-3, 1.0])
    np.testing.assert_allclose(P.from_eta_hat(np.abs).f(e), e, rtol=1e-9)
    ls = P.LogSum(2.0)
    np.testing.assert_allclose(P.from_eta_hat(ls.eta_hat).f(e), ls.f(e), rtol=1e-7)


def test_from_dual_beyond_eta_range_refuses_unless_capped():
    l1 = P.from_dual(P.L1().f)  # eta_range (1e-12, 1e12): eta_hat(w) = |w|
    assert l1.omega(1e5) == pytest.approx(1e5, rel=1e-9)
    with pytest.raises(ValueError, match=r"eta_range\[1\] = 1e\+12.*larger eta_range"):
        l1.omega(1e13)  # was 5.05e13 for the true 1e13
    mcp = P.MCP(3.0, 0.5)  # capped: eta_hat = inf beyond a lam, Omega = a lam / 2
    d = P.from_dual(mcp.f)
    w = np.array([1.0, 1e2, 1e4, 1e6])
    np.testing.assert_allclose(d.omega(w), mcp.omega(w), rtol=1e-10)
    assert np.all(np.isinf(d.eta_hat(w[1:])))


def test_from_penalty_f_beyond_w_range_is_refused():
    pen = P.from_penalty(lambda w: np.log1p(np.abs(w)))  # LogSum(1)
    e = np.array([1e-3, 1.0, 1e6])
    np.testing.assert_allclose(pen.f(e), P.LogSum(1.0).f(e), rtol=1e-7)
    with pytest.raises(ValueError, match=r"w_range\[1\] = 1e\+06"):
        pen.f(1e20)


def test_mask_moments_theta_hat_checks_its_input():
    def sig(t):
        return 1.0 / (1.0 + np.exp(-t))

    pen = P.from_mask_moments(sig, sig, sig)
    for bad in (np.nan, np.inf, "1", [1.0, np.nan]):
        with pytest.raises(ValueError, match="w "):
            pen.theta_hat(bad)  # NaN gave -29.7
    assert np.shape(pen.theta_hat(np.ones((2, 3)))) == (2, 3)
    assert isinstance(pen.theta_hat(0.5), float)


def test_hard_threshold_keep_ratio_checks_lam():
    ht = P.HardThreshold(2)
    np.testing.assert_array_equal(ht.keep_ratio(np.array([3.0, -1.0, 2.0])), [1.0, 0.0, 1.0])
    for bad in (-5, 0.0, np.nan):
        with pytest.raises(ValueError, match="lam"):
            ht.keep_ratio(np.ones(3), lam=bad)


# ------------------------------------------------------------------------------------------------
# the comparison figure takes any penalty
# ------------------------------------------------------------------------------------------------
def test_penalty_figure_takes_a_users_penalty(tmp_path):
    def my_rule(w):
        return 1.0 - np.exp(-np.abs(w))

    mine = P.from_keep_ratio(my_rule, lam=1.0)
    anon = P.from_keep_ratio(lambda w: np.abs(w) / (np.abs(w) + 1.0), lam=1.0)  # no name
    specs = curves.paper_specs() + [mine, anon, P.LogSum(1.0)]
    out = curves.penalty_figure(tmp_path, specs, w_max=3.0, n=31)
    for f in out["files"]:
        assert (tmp_path / f.split("/")[-1]).stat().st_size > 0
    with open(tmp_path / "penalties.csv") as fh:
        header = next(csv.reader(fh))
    assert "from_keep_ratio: keep_ratio[my_rule, lam=1]" in header
    assert "from_keep_ratio" in header and "LogSum(eps=1.0)" in header
    w = out["scalar"]["w"]
    np.testing.assert_allclose(out["scalar"]["from_keep_ratio"], w, rtol=1e-9)  # the l1 rule
    k = out["nnz"]["k"]
    np.testing.assert_allclose(out["nnz"]["from_keep_ratio"], np.sqrt(k), rtol=1e-9)
    labelled = curves.Spec.of(mine, lam=2.0, label="mine @ 2")
    assert curves.scalar_curves([labelled], w=np.array([1.0]))["mine @ 2"] == \
        pytest.approx(2.0 * mine.omega(1.0))
    with pytest.raises(ValueError, match="expected a penalty.*got int"):
        curves.penalty_figure(tmp_path, specs + [3])


# ------------------------------------------------------------------------------------------------
# penalties.kernels: checked at the Python entry, unchecked inside jitted code
# ------------------------------------------------------------------------------------------------
LOGSUM = P.LogSum(2.0).kernel_spec()
TABLE = P.VarDrop().kernel_spec()


@pytest.mark.parametrize("fn", [K.omega_scalar, K.derivative_scalar, K.eta_hat_scalar])
@pytest.mark.parametrize("args,match", [
    ((99, LOGSUM[1], 1.0), "code must be one of"),
    ((True, LOGSUM[1], 1.0), "code must be one of"),
    ((K.LOGSUM, np.array([]), 1.0), "needs 1 value"),
    ((K.SCAD, np.array([3.7]), 1.0), "needs 2 value"),
    ((K.LOGSUM, np.array([-1.0]), 1.0), "eps > 0"),
    ((K.LOGSUM, np.array([np.nan]), 1.0), "params contains NaN"),
    ((K.LOGSUM, LOGSUM[1], np.nan), "w must be finite"),
    ((K.LOGSUM, LOGSUM[1], "1"), "w must be a real number"),
    ((K.TABLE, TABLE[1][:-5], 1.0), "truncated"),
    ((K.TABLE, TABLE[1][:5], 1.0), "not a TABLE"),
    ((K.MIXED, np.array([1.0, 0.5]), 1.0), "MIXED must be"),
    ((K.MIXED, np.array([1.0, 0.5, 42.0]), 1.0), "inner code"),
    ((K.MIXED, np.array([1.0, 0.5, K.LOGSUM]), 1.0), "needs 1 value"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_entries_refuse_bad_arguments(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)


def test_prox_kernels_refuse_a_negative_step_and_agree_otherwise():
    code, params = LOGSUM
    for fn in (K.prox_scalar, K.prox_numeric_scalar):
        with pytest.raises(ValueError, match="step"):
            fn(code, params, 1.0, -0.5)
        with pytest.raises(ValueError, match="step"):
            fn(code, params, 1.0, np.nan)
    assert K.prox_scalar(code, params, 3.0, 0.5) == P.LogSum(2.0).prox(3.0, 0.5)
    assert K.prox_numeric_scalar(code, params, 3.0, 0.5) == pytest.approx(
        P.LogSum(2.0).prox(3.0, 0.5), rel=1e-12)
    assert K.omega_scalar(*TABLE, 1.0) == P.VarDrop().omega(1.0)


def test_map_kernel_checks_its_arguments():
    code, params = LOGSUM
    x = np.linspace(-2, 2, 5)
    np.testing.assert_array_equal(K.map_kernel("omega", code, params, x), P.LogSum(2.0).omega(x))
    np.testing.assert_array_equal(K.map_kernel("prox", code, params, x, 0.5),
                                  P.LogSum(2.0).prox(x, 0.5))
    for call, match in [
        (lambda: K.map_kernel("omegaa", code, params, x), "which must be one of"),
        (lambda: K.map_kernel("omega", 0, params, x), "code must be one of"),
        (lambda: K.map_kernel("omega", code, params, np.r_[x, np.nan]), "x contains NaN"),
        (lambda: K.map_kernel("prox", code, params, x), "t .the prox step. is required"),
        (lambda: K.map_kernel("prox", code, params, x, -1.0), "must be >= 0"),
        (lambda: K.map_kernel("prox", code, params, x, np.ones(3)), "does not broadcast"),
        (lambda: K.map_kernel("omega", K.TABLE, TABLE[1][:40], x), "truncated"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
