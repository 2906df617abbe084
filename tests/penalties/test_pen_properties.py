"""Property-based checks (hypothesis) that every catalog penalty satisfies the duality's shape."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import penalties as P

PENS = [
    P.L1(), P.Lp(0.3), P.Lp(1.0), P.Lp(1.7), P.LogSum(0.5), P.LogSum(3.0), P.Log2Sum(1.0), P.SCAD(3.7, 0.8),
    P.MCP(2.5, 1.0), P.MCP(0.5, math.sqrt(2)), P.VarDrop(), P.VarDropExact(), P.HardConcrete(), P.Standout(1.0, 0.0),
]
pen_st = st.sampled_from(PENS)
mag = st.floats(min_value=1e-8, max_value=1e4, allow_nan=False, allow_infinity=False)
SET = settings(max_examples=150, deadline=None)


@given(pen_st)
@SET
def test_omega_zero_at_zero(pen):
    assert pen.omega(0.0) == 0.0
    assert pen.derivative(0.0) == 0.0


@given(pen_st, mag, mag)
@SET
def test_nondecreasing_and_even(pen, a, b):
    lo, hi = min(a, b), max(a, b)
    assert pen.omega(lo) <= pen.omega(hi) * (1 + 1e-12) + 1e-300
    assert pen.omega(-a) == pen.omega(a)
    assert pen.eta_hat(lo) <= pen.eta_hat(hi) * (1 + 1e-9)


@given(pen_st, mag, mag, st.floats(0.05, 0.95))
@SET
def test_omega_of_sqrt_z_is_concave(pen, a, b, lam):
    z1, z2 = a * a, b * b
    zm = lam * z1 + (1 - lam) * z2
    lhs = pen.omega(math.sqrt(zm))
    rhs = lam * pen.omega(a) + (1 - lam) * pen.omega(b)
    assert lhs >= rhs - 1e-10 * max(1.0, abs(rhs))


@given(pen_st, mag, mag)
@SET
def test_fenchel_young_inequality(pen, w, eta):
    """Omega(w) <= 1/2 (w^2/eta + f(eta)) for every eta, with equality at eta_hat(w)."""
    assert pen.omega(w) <= 0.5 * (w * w / eta + pen.f(eta)) * (1 + 1e-9) + 1e-12
    e = pen.eta_hat(w)
    if np.isfinite(e) and 1e-10 < e < 1e10 and not isinstance(pen, P.Log2Sum):
        assert 0.5 * (w * w / e + pen.f(e)) == pytest.approx(pen.omega(w), rel=1e-7, abs=1e-12)


@given(pen_st, st.floats(-20, 20), st.floats(0.01, 5.0), st.floats(-25, 25))
@SET
def test_prox_is_optimal(pen, v, t, x_other):
    x = pen.prox(v, t)
    h = lambda y: 0.5 * (y - v) ** 2 + t * pen.omega(y)  # noqa: E731
    assert h(x) <= h(x_other) + 1e-9 * max(1.0, abs(h(x_other)))
    assert h(x) <= h(0.0) + 1e-12 and h(x) <= h(v) + 1e-12
    assert abs(x) <= abs(v) + 1e-12 and x * v >= 0


@given(st.lists(st.floats(-10, 10), min_size=1, max_size=40), st.integers(0, 40))
@SET
def test_hard_threshold_prox_keeps_k_largest(values, k):
    v = np.array(values)
    ht = P.HardThreshold(k)
    x = ht.prox(v)
    assert np.count_nonzero(x) <= k
    kept = np.abs(v[x != 0])
    dropped = np.abs(v[(x == 0) & (v != 0)])
    if kept.size and dropped.size:
        assert kept.min() >= dropped.max()
    assert ht.omega(x) == 0.0
