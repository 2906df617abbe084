"""The datafits of dualdrop.linear.families against closed forms (written out here from their
definitions), brute force (Cox's risk sets by double loops) and finite differences: value,
gradient, the Hessian model the solver uses, the best constant, the target checks."""

import numpy as np
import pytest
from scipy.special import logsumexp

from dualdrop.linear.datafits import available_datafits, get_datafit
from dualdrop.linear.families.cox import survival_target

RNG = np.random.default_rng(0)
N = 40


def _targets(name):
    rng = np.random.default_rng(1)
    if name == "poisson":
        y = rng.poisson(2.0, N).astype(float)
        y[:3] = 0.0  # zeros: 0 log 0 = 0
        return y
    if name == "gamma":
        return rng.gamma(2.0, 1.5, N)
    if name in ("huber", "quantile"):
        return rng.standard_t(2, N) * 3.0
    if name == "cox":
        t = np.round(rng.exponential(1.0, N), 1)  # rounding: tied times
        return np.column_stack([t, (rng.random(N) < 0.7).astype(float)])
    if name == "multinomial":
        return np.eye(3)[rng.integers(0, 3, N)]
    raise AssertionError(name)


def _params(name):
    return {"huber": {"delta": 1.3}, "quantile": {"quantile": 0.3, "delta": 0.4}}.get(name, {})


def _z(name, seed=2):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, 3)) if name == "multinomial" else rng.standard_normal(N)


def _reference_value(name, y, z, sw, params):
    """The loss from its definition, one sample at a time."""
    n = y.shape[0]
    if name == "poisson":
        terms = [np.exp(zi) - yi * zi + (yi * np.log(yi) if yi > 0 else 0.0) - yi
                 for yi, zi in zip(y, z)]
    elif name == "gamma":
        terms = [zi + yi * np.exp(-zi) - np.log(yi) - 1 for yi, zi in zip(y, z)]
    elif name == "huber":
        d = params["delta"]
        terms = [0.5 * r * r if abs(r) <= d else d * abs(r) - 0.5 * d * d for r in y - z]
    elif name == "quantile":
        t, d = params["quantile"], params["delta"]

        def rho(r):
            if r > d:
                return t * (r - d / 2)
            if r >= 0:
                return t * r * r / (2 * d)
            if r >= -d:
                return (1 - t) * r * r / (2 * d)
            return (1 - t) * (-r - d / 2)
        terms = [rho(r) for r in y - z]
    elif name == "cox":  # Breslow, risk sets by brute force, weights inside the sums
        terms = []
        for i in range(n):
            if y[i, 1] == 1 and sw[i] > 0:  # a zero weight removes the sample
                risk = [sw[j] * np.exp(z[j]) for j in range(n) if y[j, 0] >= y[i, 0]]
                terms.append(-z[i] + np.log(np.sum(risk)) - np.log(sw[i]))
            else:
                terms.append(0.0)
    elif name == "multinomial":
        terms = [logsumexp(z[i]) - z[i] @ y[i] for i in range(n)]
    return float(np.sum(sw * np.asarray(terms))) / float(np.sum(sw))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name", ["poisson", "gamma", "huber", "quantile", "cox", "multinomial"])
def test_value_and_gradient_against_definition_and_finite_differences(name, weighted):
    y = _targets(name)
    sw = np.random.default_rng(5).integers(0, 4, N).astype(float) if weighted else np.ones(N)
    df = get_datafit(name, **_params(name), sample_weight=sw if weighted else None)
    z = _z(name)
    ref = _reference_value(name, y, z, sw, _params(name))
    assert df.value(y, z) == pytest.approx(ref, rel=1e-12, abs=1e-14)
    g = df.raw_grad(y, z)
    assert g.shape == z.shape
    h = 1e-6
    fd = np.zeros_like(z)
    for idx in np.ndindex(z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += h
        zm[idx] -= h
        fd[idx] = (df.value(y, zp) - df.value(y, zm)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", ["poisson", "gamma", "multinomial"])
def test_hessian_model_is_the_exact_diagonal(name):
    y = _targets(name)
    df = get_datafit(name)
    z = _z(name)
    H = df.raw_hess(y, z)
    h = 1e-5
    for idx in list(np.ndindex(z.shape))[:12]:
        zp, zm = z.copy(), z.copy()
        zp[idx] += h
        zm[idx] -= h
        fd = (df.raw_grad(y, zp)[idx] - df.raw_grad(y, zm)[idx]) / (2 * h)
        assert H[idx] == pytest.approx(fd, rel=1e-6, abs=1e-10)


def test_cox_hessian_model_is_a_diagonal_upper_bound():
    """diag(raw_hess) - Hessian is positive semidefinite (the Hessian by finite differences of
    the gradient) and they share the diagonal's leading term."""
    y = _targets("cox")
    df = get_datafit("cox")
    z = _z("cox")
    h = 1e-6
    Hfd = np.empty((N, N))
    for k in range(N):
        zp, zm = z.copy(), z.copy()
        zp[k] += h
        zm[k] -= h
        Hfd[:, k] = (df.raw_grad(y, zp) - df.raw_grad(y, zm)) / (2 * h)
    Hfd = 0.5 * (Hfd + Hfd.T)
    gap = np.diag(df.raw_hess(y, z)) - Hfd
    assert np.linalg.eigvalsh(gap).min() >= -1e-8
    assert np.linalg.eigvalsh(Hfd).min() >= -1e-8  # convex


@pytest.mark.parametrize("name", ["huber", "quantile"])
def test_generalized_hessian_on_the_smooth_pieces(name):
    """Where the loss is twice differentiable the model is its curvature (1, or tau/delta and
    (1 - tau)/delta); on the linear pieces it is the floor."""
    from dualdrop.linear.families import huber, quantile

    y = _targets(name)
    p = _params(name)
    df = get_datafit(name, **p)
    z = _z(name)
    H = df.raw_hess(y, z) * N
    r = y - z
    if name == "huber":
        expect = np.where(np.abs(r) <= p["delta"], 1.0, huber.FLOOR)
    else:
        t, d = p["quantile"], p["delta"]
        expect = np.where((r >= 0) & (r <= d), t / d, np.where((r < 0) & (r >= -d), (1 - t) / d,
                                                                quantile.FLOOR * min(t, 1 - t) / d))
    np.testing.assert_allclose(H, expect)
    assert np.any(H > expect.min()) and np.any(H == expect.min())  # both pieces present


@pytest.mark.parametrize("name", ["poisson", "gamma", "huber", "quantile", "multinomial"])
def test_best_constant_zeroes_the_intercept_gradient(name):
    y = _targets(name)
    sw = np.random.default_rng(7).integers(1, 4, N).astype(float)
    df = get_datafit(name, **_params(name), sample_weight=sw)
    b = df.intercept_init(y)
    z = np.tile(b, (N, 1)) if name == "multinomial" else np.full(N, b)
    g = df.raw_grad(y, z).sum(axis=0)
    assert np.max(np.abs(g)) <= 1e-10
    if name != "multinomial":  # and it is the minimum over constants
        for db in (-1e-3, 1e-3):
            assert df.value(y, z + db) >= df.value(y, z)


def test_poisson_gamma_values_are_half_deviances_against_sklearn():
    from sklearn.metrics import mean_gamma_deviance, mean_poisson_deviance

    z = _z("poisson")
    y = _targets("poisson")
    assert get_datafit("poisson").value(y, z) == pytest.approx(
        0.5 * mean_poisson_deviance(y, np.exp(z)), rel=1e-12)
    y = _targets("gamma")
    assert get_datafit("gamma").value(y, z) == pytest.approx(
        0.5 * mean_gamma_deviance(y, np.exp(z)), rel=1e-12)


def test_quantile_smoothing_is_within_its_bound_of_the_pinball_loss():
    y = _targets("quantile")
    z = _z("quantile")
    df = get_datafit("quantile", quantile=0.3, delta=0.4)
    gap = df.pinball(y, z) - df.value(y, z)
    assert 0.0 <= gap <= 0.7 * 0.4 / 2


@pytest.mark.parametrize("name,bad,match", [
    ("poisson", [1.0, -1.0, 2.0], ">= 0"),
    ("poisson", [0.0, 0.0, 0.0], "all zero"),
    ("gamma", [1.0, 0.0, 2.0], "> 0"),
    ("huber", [1.0, np.nan, 2.0], "NaN"),
    ("cox", [[1.0, 1.0], [2.0, 0.5]], "event column"),
    ("cox", [[1.0, 0.0], [2.0, 0.0]], "no event"),
    ("cox", [1.0, 2.0], r"\(n_samples, 2\)"),
])
def test_target_checks_name_y(name, bad, match):
    with pytest.raises(ValueError, match=match) as err:
        get_datafit(name, **_params(name)).check_target(np.asarray(bad))
    assert "y" in str(err.value)


def test_survival_target_accepts_structured_arrays():
    rec = np.array([(True, 2.0), (False, 1.0)], dtype=[("event", "?"), ("time", "f8")])
    np.testing.assert_array_equal(survival_target(rec), [[2.0, 1.0], [1.0, 0.0]])


def test_registry_and_parameters():
    assert {"poisson", "gamma", "huber", "quantile", "cox", "multinomial"} <= set(
        available_datafits())
    with pytest.raises(ValueError, match="delta"):
        get_datafit("huber", delta=-1.0)
    with pytest.raises(ValueError, match="quantile"):
        get_datafit("quantile", quantile=1.0)
    with pytest.raises(ValueError, match="unknown"):
        get_datafit("tweedie")
    df = get_datafit("huber", delta=2.0)
    assert "delta=2.0" in repr(df) and df.with_sample_weight(np.ones(3)).delta == 2.0
