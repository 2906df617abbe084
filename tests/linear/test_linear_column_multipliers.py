"""The default column scaling as multipliers in the kernels (no scaled copy of a dense ``X``),
checked against an independent derivation: with ``scaling="dropout"`` the penalty acts on
``s_j w_j`` (``s_j`` the RMS of column ``j``), so the fit on ``X`` equals the ``scaling="none"``
fit on the explicitly divided ``X / s`` with its coefficients divided by ``s``. Every solver and
kernel family (coordinate descent, proximal Newton for GLMs, groups, block CD for multitask,
multinomial, the Gram solver, the ridge systems of the eta-trick, dropout SGD) reads the design
through them; raw columns spanning four orders of magnitude and an intercept make an error in a
multiplier visible."""

import numpy as np
import pytest
import scipy.sparse as sp

from dualdrop.linear import (SparseLinearRegression, SparseLogisticRegression,
                             SparseMultinomialRegression, SparseMultiTaskRegression,
                             SparsePoissonRegression)
from dualdrop.linear._design import scaled_design


@pytest.fixture(scope="module")
def raw():
    rng = np.random.default_rng(3)
    n, p = 120, 12
    scales = np.logspace(-2, 2, p)
    X = rng.standard_normal((n, p)) * scales + rng.uniform(-1, 1, p) * scales  # raw, uncentred
    t = (X[:, :4] / scales[:4]).sum(axis=1) + 0.5 * rng.standard_normal(n)
    return np.asfortranarray(X), t, np.sqrt(np.mean(X ** 2, axis=0))


def _both(cls, X, y, s, **kw):
    a = cls(**kw).fit(X, y)
    b = cls(scaling="none", **kw).fit(np.asfortranarray(X / s), y)
    return a, b


CASES = [
    (SparseLinearRegression, lambda t: t, dict(alpha=0.05)),
    (SparseLinearRegression, lambda t: t, dict(alpha=0.05, penalty="logsum")),
    (SparseLinearRegression, lambda t: t, dict(alpha=0.05, solver="gram_cd")),
    (SparseLinearRegression, lambda t: t, dict(alpha=0.02, groups=2)),
    (SparseLogisticRegression, lambda t: (t > 0).astype(int), dict(alpha=0.01)),
    (SparseLogisticRegression, lambda t: (t > 0).astype(int), dict(alpha=0.01, groups=3)),
    (SparsePoissonRegression, lambda t: np.round(np.exp(np.clip(t, -3, 3) / 2)), dict(alpha=0.01)),
    (SparseMultiTaskRegression, lambda t: np.column_stack([t, 0.5 * t]), dict(alpha=0.05)),
    (SparseMultinomialRegression, lambda t: np.digitize(t, [-1.0, 1.0]), dict(alpha=0.01)),
]


@pytest.mark.parametrize("cls, target, kw", CASES,
                         ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_default_scaling_equals_the_fit_on_the_divided_design(raw, cls, target, kw):
    X, t, s = raw
    y = target(t)
    a, b = _both(cls, X, y, s, tol=1e-10, **kw)
    ref = np.asarray(b.coef_) / (s if np.ndim(b.coef_) == 1 else
                                 (s if np.shape(b.coef_)[-1] == s.size else s[:, None]))
    assert np.count_nonzero(a.coef_) > 0
    np.testing.assert_allclose(a.coef_, ref, rtol=1e-6, atol=1e-9 * np.abs(ref).max())
    np.testing.assert_allclose(a.intercept_, b.intercept_, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("cls, target, kw", CASES[::2] + [CASES[-1]],
                         ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_dense_with_multipliers_equals_sparse_divided(raw, cls, target, kw):
    """A CSC ``X`` has its stored values divided in a copy: the other path to the same fit."""
    X, t, _ = raw
    y = target(t)
    a = cls(tol=1e-10, **kw).fit(X, y)
    b = cls(tol=1e-10, **kw).fit(sp.csc_matrix(X), y)
    scale = np.abs(np.asarray(b.coef_)).max()
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-6, atol=1e-9 * scale)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # a fixed budget
@pytest.mark.parametrize("solver, params", [("dropout_sgd", {"random_state": 0}),
                                            ("eta_trick", None)])
def test_fixed_budget_solvers_read_the_scaled_design(raw, solver, params):
    """The eta-trick (ridge systems) and dropout SGD (rows of the design) follow the same
    iterates on ``X`` with multipliers and on ``X / s``: equal after a fixed budget."""
    X, t, s = raw
    kw = dict(alpha=0.05, solver=solver, solver_params=params, max_iter=30)
    a, b = _both(SparseLinearRegression, X, t, s, **kw)
    np.testing.assert_allclose(a.coef_, b.coef_ / s, rtol=1e-7, atol=1e-12)


def test_the_design_is_the_callers_array_and_matches_the_divided_one(raw):
    X, _, s = raw
    d = scaled_design(X, s)
    assert d.matrix is X  # Fortran-ordered float64: used as given
    ref = scaled_design(sp.csc_matrix(X), s)  # sparse: its stored values divided (a copy)
    rng = np.random.default_rng(0)
    w, v = rng.standard_normal(X.shape[1]), rng.standard_normal(X.shape[0])
    W, V = rng.standard_normal((X.shape[1], 3)), rng.standard_normal((X.shape[0], 3))
    np.testing.assert_allclose(d.matvec(w), ref.matvec(w), rtol=1e-12)
    np.testing.assert_allclose(d.rmatvec(v), ref.rmatvec(v), rtol=1e-12)
    np.testing.assert_allclose(d.matvec(W), ref.matvec(W), rtol=1e-12)
    np.testing.assert_allclose(d.rmatvec(V), ref.rmatvec(V), rtol=1e-12)
    cols = np.array([0, 3, 11])
    np.testing.assert_allclose(d.rmatvec(V, cols), ref.rmatvec(V, cols), rtol=1e-12)
    np.testing.assert_allclose(d.rmatvec(V, cols), ref.rmatvec(V)[cols], rtol=1e-12)
    np.testing.assert_allclose(d.col_norms2, ref.col_norms2, rtol=1e-12)
    np.testing.assert_allclose(d.col_sums, ref.col_sums, rtol=1e-12)
    np.testing.assert_allclose(d.gram(), ref.gram(), rtol=1e-12)
    np.testing.assert_allclose(d.columns([1, 5]), ref.columns([1, 5]), rtol=1e-12)
    np.testing.assert_allclose(d.toarray(), (X / s), rtol=1e-15)


def test_extreme_scales_fall_back_to_a_divided_copy():
    X = np.asfortranarray(np.random.default_rng(0).standard_normal((20, 3)))
    s = np.array([1.0, 1e-300, 1e300])  # 1 / s overflows: the divided copy is exact
    d = scaled_design(X, s)
    assert d.matrix is not X
    np.testing.assert_array_equal(d.toarray(), X / s)
