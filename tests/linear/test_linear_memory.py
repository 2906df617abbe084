"""Peak memory of a fit above its input: the default ``scaling="dropout"`` on a C-ordered
float64 ``X`` makes one copy (Fortran-ordered and divided by the columns' RMS, in place; two
before: the reordering, then the division), with sample weights too; a Fortran-ordered float64
``X`` with ``scaling="none"`` is used as given. Measured with ``tracemalloc``, which traces
numpy's allocations (benchmarks/linear/bench_memory.py: the same at 763 MiB)."""

import tracemalloc

import numpy as np
import pytest

from dualdrop.linear import SparseLinearRegression


def _peak_copies(X, y, **kw):
    SparseLinearRegression(alpha=0.1, **kw).fit(X[:60, :20], y[:60])  # compile and load first
    tracemalloc.start()
    try:
        SparseLinearRegression(alpha=0.1, **kw).fit(X, y)
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


def test_fortran_ordered_x_without_scaling_is_not_copied(data):
    X, y = data
    assert _peak_copies(np.asfortranarray(X), y, scaling="none") < 0.25
    assert _peak_copies(np.asfortranarray(X), y) < 1.25
