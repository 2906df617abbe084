"""The design matrix, dense or sparse, seen the same way by every solver.

Dense designs are stored Fortran-ordered (column access is what coordinate descent needs);
sparse designs are ``scipy.sparse`` CSC. The compiled kernels receive both representations with
a flag (``is_sparse``), so that one kernel serves both.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._jit import col_sums, csc_rmatvec

__all__ = ["Design", "divide_columns", "scaled_design"]

_DUMMY_2D = np.zeros((2, 2), order="F")
_DUMMY_F = np.zeros(1)
_DUMMY_I = np.zeros(1, dtype=np.int32)


class Design:
    """Dense (Fortran) or CSC design with its kernel arrays, column sums and squared norms."""

    def __init__(self, X):
        if sp.issparse(X):
            if X.format != "csc" or X.dtype != np.float64:
                X = sp.csc_matrix(X, dtype=np.float64)
            if not X.has_sorted_indices:
                X = X.sorted_indices()  # a copy: the caller's matrix is left as it was
            self.is_sparse = True
            self.X = X
            self.dense = _DUMMY_2D
            self.data = X.data
            self.indices = X.indices.astype(np.int32, copy=False)
            self.indptr = X.indptr.astype(np.int32, copy=False)
        else:
            X = np.asfortranarray(X, dtype=np.float64)
            self.is_sparse = False
            self.X = X
            self.dense = X
            self.data = _DUMMY_F
            self.indices = _DUMMY_I
            self.indptr = _DUMMY_I
        self.n, self.p = X.shape
        self.col_sums = np.empty(self.p)
        self.col_norms2 = np.empty(self.p)
        col_sums(*self.arrays, self.p, self.col_sums, self.col_norms2)

    @property
    def arrays(self):
        """``(dense, data, indices, indptr, is_sparse)`` for the numba kernels."""
        return self.dense, self.data, self.indices, self.indptr, self.is_sparse

    def matvec(self, w):
        return np.asarray(self.X @ w).ravel()

    def rmatvec(self, v):
        if self.is_sparse and v.ndim == 1:
            out = np.empty(self.p)
            csc_rmatvec(self.data, self.indices, self.indptr,
                        np.ascontiguousarray(v, dtype=np.float64), out)
            return out
        return np.asarray(self.X.T @ v).ravel()

    def columns(self, idx):
        """Dense ``n x len(idx)`` copy of some columns."""
        sub = self.X[:, idx]
        return sub.toarray() if self.is_sparse else np.asarray(sub)

    def spectral_norm2(self):
        """``||X||_2^2`` (largest eigenvalue of ``X^T X``), by a few power iterations."""
        rng = np.random.default_rng(0)
        v = rng.standard_normal(self.p)
        v /= np.linalg.norm(v)
        s = 0.0
        for _ in range(100):
            u = self.rmatvec(self.matvec(v))
            s_new = float(np.linalg.norm(u))
            if s_new == 0.0:
                return 0.0
            v = u / s_new
            if abs(s_new - s) <= 1e-6 * s_new:
                s = s_new
                break
            s = s_new
        return s * 1.0001  # a hair above: it is used as a Lipschitz bound


def divide_columns(X, s):
    """A copy of ``X`` with column ``j`` divided by ``s_j`` (Fortran-ordered, or CSC when
    sparse): a division, not ``X * (1/s)``, which overflows where ``s`` is subnormal (columns of
    magnitude ~1e-310). One copy, divided in place: the copy is also the reordering of a
    C-ordered ``X`` (``np.asfortranarray(X) / s`` made two, the peak of a default fit)."""
    if sp.issparse(X):
        Xc = sp.csc_matrix(X, dtype=np.float64, copy=True)
        Xc.data /= np.repeat(np.asarray(s, dtype=np.float64), np.diff(Xc.indptr))
        return Xc
    out = np.array(X, dtype=np.float64, order="F", copy=True)
    out /= s
    return out


def scaled_design(X, s):
    """The :class:`Design` of ``X`` with columns divided by ``s`` (the solvers' variables are
    ``u = s w``); ``X`` itself when every scale is 1."""
    if np.all(np.abs(s - 1.0) <= 1e-12):
        return Design(X)
    return Design(divide_columns(X, s))
