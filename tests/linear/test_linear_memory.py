"""Peak memory of a fit above its input: a C-ordered float64 ``X`` makes one copy (the
reordering to Fortran order; two before: the reordering, then the division by the columns'
RMS), with sample weights too; a Fortran-ordered float64 ``X`` is used as given, with the default
``scaling="dropout"`` too (the column scales are multipliers in the kernels, not a scaled copy)
and for every estimator that scales columns. Measured with ``tracemalloc``, which traces numpy's
allocations (benchmarks/linear/bench_memory.py: the same at 763 MiB)."""

import tracemalloc

import numpy as np
import pytest

from dualdrop.linear import (SparseLinearRegression, SparseLogisticRegression,
                             SparseMultiTaskRegression, SparsePoissonRegression)


def _peak_copies(X, y, cls=SparseLinearRegression, **kw):
    small = np.array(X[:60, :20], order="F" if X.flags.f_contiguous else "C")
    cls(**kw).fit(small, y[:60])  # compile and load first
    tracemalloc.start()
    try:
        cls(**kw).fit(X, y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / X.nbytes


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 400))  # 9.2 MiB, C-ordered
    return X, X[:, :5].sum(axis=1) + rng.standard_normal(3000)


def test_default_scaling_on_c_ordered_x_makes_one_copy(data):
    X, y = data
    assert X.flags.c_contiguous
    assert _peak_copies(X, y) < 1.25
    sw = np.random.default_rng(1).uniform(0.5, 2.0, size=y.size)
    SparseLinearRegression(alpha=0.1).fit(X[:60, :20], y[:60], sample_weight=sw[:60])
    tracemalloc.start()
    try:
        SparseLinearRegression(alpha=0.1).fit(X, y, sample_weight=sw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak / X.nbytes < 1.25


def test_fortran_ordered_x_is_not_copied(data):
    X, y = data
    Xf = np.asfortranarray(X * np.linspace(0.01, 100.0, X.shape[1]))  # scales far from 1
    assert _peak_copies(Xf, y, alpha=0.1, scaling="none") < 0.25
    assert _peak_copies(Xf, y, alpha=0.1) < 0.25  # the default scaling="dropout"
    assert _peak_copies(Xf, y, SparseLinearRegression, alpha=0.1, penalty="logsum") < 0.25


@pytest.mark.parametrize("cls, target", [
    (SparseLogisticRegression, lambda y: (y > 0).astype(int)),
    (SparsePoissonRegression, lambda y: np.round(np.exp(np.clip(y, -3, 3) / 3))),
    (SparseMultiTaskRegression, lambda y: np.column_stack([y, -y])),
])
def test_fortran_ordered_x_is_not_copied_by_the_other_estimators(data, cls, target):
    X, y = data
    Xf = np.asfortranarray(X * np.linspace(0.01, 100.0, X.shape[1]))
    assert _peak_copies(Xf, target(y), cls, alpha=0.05) < 0.25
