"""Property-based checks of every public function of ``penalties`` over shapes, dtypes, the
whole float range and special values: a bad input is a ``ValueError`` naming the argument; a
good one gives a result meeting the invariants (|prox(v)| <= |v| with v's sign, 0 <= keep ratio
<= 1, Omega even and >= 0, no NaN), and the input is left unchanged. Profiles: tests/conftest.py
(``DUALDROP_HYPOTHESIS_PROFILE=thorough`` for many examples)."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import penalties as P


def log_uniform(lo, hi):
    return st.floats(lo, hi).map(lambda e: 10.0 ** e)


PENALTY = st.one_of(
    st.just(P.L1()),
    st.floats(0.05, 1.95).map(P.Lp),
    log_uniform(-8, 8).map(P.LogSum),
    log_uniform(-8, 8).map(P.Log2Sum),
    st.builds(P.SCAD, a=st.floats(1.1, 10.0), lam=log_uniform(-3, 3)),
    st.builds(P.MCP, a=st.floats(0.1, 10.0), lam=log_uniform(-3, 3)),
    st.sampled_from([P.VarDrop(), P.VarDropExact(), P.HardConcrete()]),
    st.builds(P.Standout, a=log_uniform(-3, 3), b=st.floats(-5, 5), v_norm=log_uniform(-1, 1),
              lam=log_uniform(-1, 1)),
)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
ANY_FLOAT = st.floats(allow_nan=False, allow_infinity=False)  # subnormals and 1e308 included


def real_arrays(elements=ANY_FLOAT):
    """Arrays of every real dtype the functions accept (floats of any width, integers)."""
    return st.one_of(
        hnp.arrays(np.float64, SHAPES, elements=elements),
        hnp.arrays(np.float32, SHAPES, elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
        hnp.arrays(np.float16, SHAPES, elements=st.floats(width=16, allow_nan=False, allow_infinity=False)),
        hnp.arrays(st.sampled_from([np.int8, np.int32, np.int64, np.uint16]), SHAPES),
        ANY_FLOAT,  # a Python scalar
        st.lists(st.floats(-1e6, 1e6), max_size=6),  # a list
    )


def _frozen(x):
    return np.array(x, copy=True) if isinstance(x, np.ndarray) else x


def _unchanged(before, after):
    if isinstance(before, np.ndarray):
        np.testing.assert_array_equal(before, after)
        assert before.dtype == after.dtype


@given(PENALTY, real_arrays())
def test_elementwise_functions_meet_their_invariants(pen, w):
    before = _frozen(w)
    wf = np.asarray(w, dtype=np.float64)
    om, d, eta = (np.asarray(f(w)) for f in (pen.omega, pen.derivative, pen.eta_hat))
    kr = np.asarray(pen.keep_ratio(w, lam=1.0))
    _unchanged(before, w)
    for out in (om, d, eta, kr):
        assert out.shape == wf.shape and not np.isnan(out).any()
    assert np.all(om >= 0) and np.all(eta >= 0) and np.all(d * np.sign(wf) >= 0)
    assert np.all((kr >= 0) & (kr <= 1))
    np.testing.assert_array_equal(pen.omega(-wf), om)  # even
    assert np.all(np.isfinite(om) | (np.abs(wf) > 1e100))  # inf only where the value overflows


@given(PENALTY, real_arrays(), st.one_of(log_uniform(-300, 300), st.just(0.0)))
def test_prox_shrinks_toward_zero_and_keeps_the_sign(pen, v, t):
    before = _frozen(v)
    x = np.asarray(pen.prox(v, t))
    _unchanged(before, v)
    vf = np.asarray(v, dtype=np.float64)
    assert x.shape == vf.shape and np.all(np.isfinite(x))
    assert np.all(np.abs(x) <= np.abs(vf)) and np.all(np.sign(x) * np.sign(vf) >= 0)
    if t == 0.0:
        np.testing.assert_array_equal(x, vf)


@given(PENALTY, hnp.arrays(np.float64, st.integers(1, 6), elements=log_uniform(150, 308)))
def test_prox_of_values_far_above_the_step_is_the_value(pen, v):
    """|v| >= 1e150 with t = 1: the prox is the root of x + Omega'(x) = |v| near v, so the step
    is at most the slope there (it returned 0 beyond ~1e154)."""
    assume(not (isinstance(pen, P.Standout) and pen.a * 1e150 < 50))  # still quadratic there
    for s in (v, -v):
        x = pen.prox(s, 1.0)
        slope = np.maximum(np.abs(pen.derivative(s)), np.abs(pen.derivative(x)))
        assert np.all(np.abs(x - s) <= 1.01 * slope + 1e-12 * np.abs(s))
        np.testing.assert_allclose(x, s, rtol=1e-6)


@given(PENALTY, hnp.arrays(np.float64, st.integers(1, 8), elements=log_uniform(-300, 300)))
def test_dual_function_is_nonnegative_and_nondecreasing(pen, eta):
    f = np.asarray(pen.f(np.sort(eta)))
    assert not np.isnan(f).any() and np.all(f >= -1e-12)
    prev = f[:-1]
    slack = np.where(np.isfinite(prev), 1e-9 * np.maximum(1.0, np.abs(prev)), 0.0)
    assert np.all(f[1:] >= prev - slack)  # inf where eta^q / q overflows (Lp)


BAD = st.one_of(
    st.sampled_from([np.nan, np.inf, -np.inf]).map(lambda x: np.array([1.0, x])),
    st.just(np.array([1 + 2j])), st.just(np.array([True, False])), st.just("1.0"), st.just(None),
    st.just(np.array(["a"], dtype=object)), st.just([[1.0], [2.0, 3.0]]),
)


@given(PENALTY, st.sampled_from(["omega", "derivative", "eta_hat", "prox", "f"]), BAD)
def test_bad_input_is_refused_naming_the_argument(pen, method, bad):
    arg = {"omega": "w", "derivative": "w", "eta_hat": "w", "prox": "v", "f": "eta"}[method]
    with pytest.raises(ValueError, match=rf"\b{arg}\b"):
        getattr(pen, method)(bad)


@given(PENALTY, st.one_of(st.floats(max_value=-1e-300), st.just(np.nan), st.just(np.inf)))
def test_bad_prox_step_and_strength_are_refused(pen, bad):
    with pytest.raises(ValueError, match=r"\bt\b"):
        pen.prox(np.ones(3), bad)
    with pytest.raises(ValueError, match=r"\blam\b"):
        pen.keep_ratio(np.ones(3), lam=bad)


@given(PENALTY)
def test_a_refused_set_params_leaves_the_penalty_as_it_was(pen):
    before = pen.get_params()
    names = list(before) or ["eps"]
    with pytest.raises(ValueError):
        pen.set_params(**{names[0]: -1.0}, bogus=1.0)
    assert pen.get_params() == before


@given(PENALTY, log_uniform(-100, 100), hnp.arrays(np.float64, st.integers(1, 6),
                                                     elements=log_uniform(-50, 50)))
def test_rescaled_penalties_agree_with_the_original(pen, c, u):
    got = pen.rescaled(c)
    assume(got is not None)
    other, k = got
    with np.errstate(over="ignore", under="ignore"):
        lhs, rhs = pen.omega(c * u), c**k * other.omega(u)
    ok = np.isfinite(lhs) & np.isfinite(rhs) & (np.abs(lhs) > 1e-250)
    np.testing.assert_allclose(lhs[ok], rhs[ok], rtol=1e-9)


# ------------------------------------------------------------------------------------------------
# vector penalties and the duality constructors
# ------------------------------------------------------------------------------------------------
@given(hnp.arrays(np.float64, st.integers(0, 12), elements=ANY_FLOAT), st.integers(0, 14),
       st.one_of(log_uniform(-300, 300), st.just(0.0)))
def test_hard_threshold_keeps_the_k_largest(v, k, t):
    before = v.copy()
    x = P.HardThreshold(k).prox(v, t)
    np.testing.assert_array_equal(v, before)
    assert np.count_nonzero(x) <= k and np.all((x == 0) | (x == v))
    kept, dropped = np.abs(v[x != 0]), np.abs(v[(x == 0) & (v != 0)])
    if kept.size and dropped.size:
        assert kept.min() >= dropped.max()


@given(st.integers(0, 2 ** 32 - 1), st.integers(2, 6), st.integers(1, 5),
       st.lists(st.sampled_from([0.0, 1e-150, 1.0, 1e150]), min_size=5, max_size=5))
@settings(max_examples=10)
def test_ard_over_column_scales(seed, n, p, scales):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * np.array(scales[:p])
    w = rng.standard_normal(p)
    before = X.copy()
    ard = P.ARD(X)
    om, eta = ard.omega(w), ard.eta_hat(w)
    np.testing.assert_array_equal(X, before)
    assert np.isfinite(om) and om >= 0 and not np.isnan(eta).any() and np.all(eta >= 0)
    live = np.array(scales[:p]) > 0
    assert np.all(np.isinf(eta[~live]) | (w[~live] == 0))  # a zero column: eta = inf


@given(st.floats(0.1, 10.0))
@settings(max_examples=5)
def test_from_dual_accepts_an_increasing_dual_and_refuses_its_mirror(c):
    pen = P.from_dual(lambda e: c * e)
    assert pen.omega(1.0) == pytest.approx(np.sqrt(c), rel=1e-6)  # c eta: Omega = sqrt(c) |w|
    with pytest.raises(ValueError, match="nondecreasing"):
        P.from_dual(lambda e: -c * e)
    with pytest.raises(ValueError, match="elementwise|vectorized"):
        P.from_dual(lambda e: c * e / e.max())


# ------------------------------------------------------------------------------------------------
# catalog lookup, specs, curves, the compiled kernels themselves
# ------------------------------------------------------------------------------------------------
SPEC_TEXT = st.one_of(
    st.text(max_size=30),
    st.builds(lambda n, k, v, lam: f"{n}:{k}={v}" + (f"@{lam}" if lam is not None else ""),
              st.sampled_from(P.available() + ["nope", ""]),
              st.sampled_from(["eps", "a", "lam", "p", "k", "b", "bogus"]),
              st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3)),
              st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))),
)


@given(SPEC_TEXT)
def test_a_spec_is_parsed_or_refused_with_a_value_error(text):
    from penalties.curves import parse_spec

    try:
        spec = parse_spec(text)
    except ValueError as exc:
        assert str(exc)
        return
    key = spec.name.strip().lower().replace("-", "_")  # get() reads names so
    assert np.isfinite(spec.lam) and spec.lam > 0 and key in P.available()
    spec.build()


@given(st.sampled_from(P.available()), st.dictionaries(
    st.sampled_from(["eps", "a", "lam", "p", "k", "b", "v_norm", "zz"]),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 40),
              st.booleans(), st.text(max_size=2)), max_size=2))
def test_get_builds_a_penalty_or_names_the_bad_parameter(name, params):
    try:
        pen = P.get(name, **params)
    except ValueError as exc:
        assert any(k in str(exc) for k in params) or "parameter" in str(exc)
        return
    for k, v in params.items():  # accepted: exactly the value given (nothing coerced)
        assert pen.get_params()[k] == v and not isinstance(v, (bool, str))
    w = np.linspace(-3, 3, 7)
    assert np.all(np.asarray(pen.omega(w)) >= 0)


@given(PENALTY.filter(lambda p: p.kernel_spec() is not None),
       st.floats(allow_nan=False, allow_infinity=False), st.floats(0, 1e300))
def test_the_scalar_kernels_are_what_the_penalty_returns(pen, w, t):
    from penalties import kernels as K

    code, params = pen.kernel_spec()
    assert K.omega_scalar(code, params, w) == pen.omega(w)
    assert K.derivative_scalar(code, params, w) == pen.derivative(w)
    assert K.eta_hat_scalar(code, params, w) == pen.eta_hat(w)
    assert K.prox_scalar(code, params, w, t) == pen.prox(w, t)


@given(st.sampled_from([None, ["logsum:eps=2@2", "l1"], ["mcp:a=3,lam=1", "hard_threshold:k=3"]]),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 5)),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 5)),
       st.one_of(st.integers(-2, 50), st.floats(0, 10), st.booleans()))
@settings(max_examples=15)
def test_curves_refuse_bad_ranges_naming_them(specs, w_min, w_max, n):
    from penalties.curves import scalar_curves

    try:
        out = scalar_curves(specs, w_min=w_min, w_max=w_max, n=n)
    except ValueError as exc:
        assert any(name in str(exc) for name in ("w_min", "w_max", "n"))
        return
    assert out["w"].shape == (n,) and all(np.all(np.isfinite(v)) for v in out.values())
