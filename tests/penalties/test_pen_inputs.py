"""Bad inputs give clear ValueErrors that name the argument."""

import numpy as np
import pytest

import penalties as P


@pytest.mark.parametrize("bad,match", [(np.nan, "NaN"), (np.inf, "inf"), ([1.0, np.nan], "NaN"), (1 + 2j, "dtype"),
                                       ("3", "real number"), (np.array([True]), "dtype"),
                                       ([[1], [2, 3]], "rectangular array")])
def test_bad_w(bad, match):
    with pytest.raises(ValueError, match=match):
        P.LogSum(1.0).omega(bad)


@pytest.mark.parametrize("ctor,match", [
    (lambda: P.LogSum(0.0), "eps must be > 0"), (lambda: P.LogSum(-1), "eps"), (lambda: P.Log2Sum(0), "eps"),
    (lambda: P.Lp(0.0), "p must be > 0"), (lambda: P.Lp(2.0), "p must be < 2"), (lambda: P.Lp(np.nan), "finite"),
    (lambda: P.MCP(a=-1), "a must be > 0"), (lambda: P.SCAD(a=1.0), "a must be > 1"), (lambda: P.SCAD(lam=0), "lam"),
    (lambda: P.HardThreshold(-1), "k must be >= 0"), (lambda: P.HardThreshold(2.5), "integer"),
    (lambda: P.get("nope"), "unknown penalty"), (lambda: P.get("logsum", epsilon=1), "unknown .epsilon. .did you mean .eps.*parameters are: eps"),
    (lambda: P.get("mcp", a=3, lamda=1), "did you mean .lam.*parameters are: a, lam"),
    (lambda: P.LogSum("2"), "real number"),
])
def test_bad_parameters(ctor, match):
    with pytest.raises(ValueError, match=match):
        ctor()


def test_bad_eta_lambda_and_prox_step():
    pen = P.MCP(3.0, 1.0)
    with pytest.raises(ValueError, match="eta must be > 0"):
        pen.f(-1.0)
    with pytest.raises(ValueError, match="lam must be > 0"):
        pen.keep_ratio(1.0, lam=-0.5)
    with pytest.raises(ValueError, match="t .the prox step. must be >= 0"):
        pen.prox(1.0, -1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        pen.prox(np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="1-D vector"):
        P.HardThreshold(2).prox(np.ones((2, 2)))


def test_non_monotone_rules_are_rejected_with_location():
    with pytest.raises(ValueError, match="nondecreasing.*decreases between w = 0.9"):
        P.from_eta_hat(lambda w: np.abs(w) * np.exp(-np.abs(w)), w_range=(1e-6, 1e3))
    with pytest.raises(ValueError, match="keep-ratio rule .alpha_hat. must be nondecreasing"):
        P.from_keep_ratio(lambda w: 1 / (1 + np.abs(w)), lam=1.0)
    with pytest.raises(ValueError, match="must lie in .0, 1."):
        P.from_keep_ratio(lambda w: 0 * w + 1.5, lam=1.0).omega(1.0)
    with pytest.raises(ValueError, match="concave in z"):
        P.from_penalty(lambda w: np.abs(w) ** 3)
    with pytest.raises(ValueError, match="nondecreasing"):
        P.from_penalty(lambda w: np.sin(np.abs(w)))
    with pytest.raises(ValueError, match="omega.0. must be 0"):
        P.from_penalty(lambda w: np.log(np.abs(w) + 2.0))
    with pytest.raises(ValueError, match="must accept numpy arrays"):
        P.from_dual(lambda eta: 1.0 if eta > 0 else 0.0)
    with pytest.raises(ValueError, match="must be vectorized"):
        P.from_dual(lambda eta: np.ones(2))
    with pytest.raises(ValueError, match="must decrease"):
        P.from_mask_moments(lambda t: 0.5 + 0 * t, lambda t: 0.3 + 0.01 * t, lambda t: t, theta_range=(0.0, 5.0))


def test_from_dual_warns_when_range_too_narrow():
    with pytest.warns(RuntimeWarning, match="widen eta_range"):
        P.from_dual(P.L1().f, eta_range=(1e-2, 1e2)).omega(1e-5)


def test_parallel_switch_gives_identical_results():
    from penalties import kernels

    w = np.linspace(-5, 5, kernels.PARALLEL_MIN + 17)
    pen = P.VarDropExact()
    try:
        kernels.set_parallel(True)
        par = pen.omega(w)
        kernels.set_parallel(False)
        ser = pen.omega(w)
    finally:
        kernels.set_parallel(None)
    np.testing.assert_array_equal(par, ser)
    with pytest.raises(ValueError, match="True, False or None"):
        kernels.set_parallel("yes")


def test_get_and_set_params_sklearn_style():
    from sklearn.base import clone

    pen = P.LogSum(2.0)
    assert pen.get_params(deep=False) == {"eps": 2.0}
    assert pen.set_params(eps=3.0) is pen and pen.eps == 3.0 and pen.omega(3.0) == pytest.approx(np.log(2.0))
    with pytest.raises(ValueError, match="eps must be > 0"):
        pen.set_params(eps=-1.0)
    with pytest.raises(ValueError, match="no parameter"):
        pen.set_params(p=1.0)
    assert clone(P.MCP(3.0, 0.5)) == P.MCP(3.0, 0.5)
    assert P.HardThreshold(3).set_params(k=5).k == 5
