"""The last classes of bad input to ``penalties``, each refused on one path with a message that
names the argument, and without numpy's overflow warnings first: an infinite MCP ``a``, text or
complex arrays (a ``TypeError`` that is also the documented ``ValueError``), a ``SumPenalty``
whose ``weights`` do not fit, magnitudes whose square is not a float64 number (``from_dual``,
``from_eta_hat``, ``ARD``)."""

import warnings

import numpy as np
import pytest

import penalties
from penalties.checks import ArgumentTypeError


@pytest.fixture(autouse=True)
def _no_numpy_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an overflow warning fails the test
        yield


def test_an_infinite_mcp_a_is_refused_naming_l1():
    with pytest.raises(ValueError, match="a must be finite, got inf.*'l1'"):
        penalties.get("mcp", a=np.inf)
    with pytest.raises(ValueError, match="a must be finite"):
        penalties.MCP(a=float("inf"), lam=0.5)
    assert penalties.get("mcp", a=1e12).omega(1.0) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("bad", [np.array([1.0 + 2.0j, 1.0]), ["a", "b"], "ab"])
def test_text_and_complex_arrays_are_type_errors_naming_the_argument(bad):
    for call, name in ((lambda: penalties.L1().omega(bad), "w"),
                       (lambda: penalties.SumPenalty(penalties.L1(), weights=bad), "weights")):
        with pytest.raises(TypeError, match=f"^{name} must") as info:
            call()
        assert isinstance(info.value, ValueError) and isinstance(info.value, ArgumentTypeError)


def test_sum_penalty_weights_that_do_not_fit_name_weights():
    sp = penalties.SumPenalty(penalties.L1(), weights=[1.0, 2.0])
    for call in (lambda: sp.omega(np.ones(3)), lambda: sp.prox(np.ones(3), 0.5)):
        with pytest.raises(ValueError, match=r"^weights has 2 entries .* one weight per entry"):
            call()
    np.testing.assert_allclose(sp.prox(np.array([1.0, 1.0]), 0.25), [0.75, 0.5])


def test_from_dual_beyond_float64_says_so_itself():
    P = penalties.from_dual(lambda e: e)  # the l1 penalty's dual, not capped
    for method in (P.omega, P.eta_hat, P.derivative):
        with pytest.raises(ValueError, match="needs eta beyond eta_range.*rescale w"):
            method(1e300)
    capped = penalties.from_dual(lambda e: 3.0 * e / (e + 3.0))  # MCP's dual: Omega capped
    np.testing.assert_allclose(capped.omega(np.array([1e300, 1.0])), [1.5, 5.0 / 6.0], rtol=1e-6)
    assert capped.eta_hat(1e300) == np.inf


def test_from_eta_hat_and_ard_beyond_float64_say_so_themselves():
    with pytest.raises(ValueError, match=r"w_range\[1\] must be <= 1e\+153"):
        penalties.from_eta_hat(abs, w_range=(1e-300, 1e300))
    P = penalties.from_eta_hat(abs)
    with pytest.raises(ValueError, match=r"beyond w_range\[1\].*or rescale w"):
        P.omega(1e300)
    X = np.random.default_rng(0).normal(size=(5, 3))
    ard = penalties.ARD(X)
    for method in (ard.omega, ard.eta_hat):
        with pytest.raises(ValueError, match="beyond 1e\\+153.*rescale w or X"):
            method(np.array([1e300, 1.0, 0.0]))
    with pytest.raises(ValueError, match="rescale w or X"):
        penalties.ARD(X * 1e300).omega(np.ones(3))
    assert ard.omega(np.array([1.0, 0.0, 0.0])) > 0
