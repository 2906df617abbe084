"""The design matrix, dense or sparse, seen the same way by every solver.

Dense designs are stored Fortran-ordered (column access is what coordinate descent needs), with
their column scaling as per-column multipliers rather than a scaled copy; sparse designs are
``scipy.sparse`` CSC. The compiled kernels receive both representations with a flag
(``is_sparse``), so that one kernel serves both.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._jit import col_sums, col_wnorms2, csc_rmatvec

__all__ = ["Design", "divide_columns", "scaled_design"]

_DUMMY_2D = np.zeros((2, 2), order="F")
_DUMMY_I = np.zeros(1, dtype=np.int32)


class Design:
    """Dense (Fortran) or CSC design with its kernel arrays, column sums and squared norms.

    ``scale`` (dense designs only): column divisors ``s``; the design the solvers see is then
    ``X[:, j] / s_j``, computed by multiplying each column operation by ``c_j = 1 / s_j``
    (:attr:`mult`) instead of dividing a copy of ``X``: a Fortran-ordered float64 ``X`` is used
    as given (:func:`scaled_design` decides when this is exact enough). ``matrix`` is the stored
    matrix (the user's ``X`` when dense, unscaled), never the solvers' design: read the latter
    through :meth:`matvec`, :meth:`rmatvec`, :meth:`columns`, :meth:`gram` and :meth:`toarray`.
    """

    def __init__(self, X, scale=None):
        if sp.issparse(X):
            if scale is not None:
                raise ValueError("a sparse design takes no column scale: divide a copy of its "
                                 "stored values (divide_columns)")
            if X.format != "csc" or X.dtype != np.float64:
                X = sp.csc_matrix(X, dtype=np.float64)
            if not X.has_sorted_indices:
                X = X.sorted_indices()  # a copy: the caller's matrix is left as it was
            self.is_sparse = True
            self.matrix = X
            self.dense = _DUMMY_2D
            self.data = X.data
            self.indices = X.indices.astype(np.int32, copy=False)
            self.indptr = X.indptr.astype(np.int32, copy=False)
            self.mult = None
        else:
            X = np.asfortranarray(X, dtype=np.float64)
            self.is_sparse = False
            self.matrix = X
            self.dense = X
            # the kernels' ``data`` of a dense design: its column multipliers (see ._jit)
            self.mult = (np.ones(X.shape[1]) if scale is None else
                         1.0 / np.asarray(scale, dtype=np.float64))
            self.data = self.mult
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
        """``X w`` (``w`` of shape ``(p,)`` or ``(p, k)``)."""
        if not self.is_sparse:
            w = w * (self.mult if w.ndim == 1 else self.mult[:, None])
        return np.asarray(self.matrix @ w).ravel() if w.ndim == 1 else np.asarray(self.matrix @ w)

    def rmatvec(self, v, cols=None):
        """``X^T v`` (``v`` of shape ``(n,)`` or ``(n, k)``), or ``X_S^T v`` for the columns
        ``S = cols`` (an index array)."""
        if cols is None and self.is_sparse and v.ndim == 1:
            out = np.empty(self.p)
            csc_rmatvec(self.data, self.indices, self.indptr,
                        np.ascontiguousarray(v, dtype=np.float64), out)
            return out
        M = self.matrix if cols is None else self.matrix[:, cols]
        out = np.asarray(M.T @ v)
        if v.ndim == 1:
            out = out.ravel()
        if not self.is_sparse:
            m = self.mult if cols is None else self.mult[cols]
            out *= m if v.ndim == 1 else m[:, None]
        return out

    def col_wnorms2(self, h):
        """``sum_i h_i x_ij^2`` for every column (``h`` of length ``n``)."""
        out = np.empty(self.p)
        col_wnorms2(*self.arrays, np.ascontiguousarray(h, dtype=np.float64), out)
        return out

    def columns(self, idx):
        """Dense ``n x len(idx)`` copy of some columns."""
        sub = self.matrix[:, idx]
        if self.is_sparse:
            return sub.toarray()
        sub = np.asarray(sub)
        sub *= self.mult[idx]
        return sub

    def gram(self):
        """``X^T X`` as a dense ``p x p`` array."""
        G = self.matrix.T @ self.matrix
        if self.is_sparse:
            return np.asarray(G.toarray())
        G *= self.mult[:, None]
        G *= self.mult[None, :]
        return G

    def toarray(self, order="C"):
        """The design as one matrix (a scaled copy of a dense ``X`` in ``order``; a sparse
        design as it is stored, CSC): for the solvers that need rows or a modelling layer."""
        if self.is_sparse:
            return self.matrix
        return np.multiply(self.matrix, self.mult, order=order)

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


# column divisors inside this band are applied as multipliers: ``1 / s`` is finite and the
# scaled products neither overflow nor lose digits to subnormals (columns of RMS ``s``)
_MULT_BAND = 2.0 ** 256


def scaled_design(X, s):
    """The :class:`Design` of ``X`` with columns divided by ``s`` (the solvers' variables are
    ``u = s w``). A dense ``X`` is not copied for it (only reordered to Fortran order or cast to
    float64 where it is not already): the divisors become the design's column multipliers. A
    sparse ``X`` has its stored values divided in a copy (it costs the nonzeros), as has a dense
    one whose divisors leave ``[2^-256, 2^256]`` (columns of extreme magnitude, where ``1 / s``
    would overflow)."""
    s = np.asarray(s, dtype=np.float64)
    if np.all(np.abs(s - 1.0) <= 1e-12):
        return Design(X)
    if sp.issparse(X) or not np.all((s >= 1.0 / _MULT_BAND) & (s <= _MULT_BAND)):
        return Design(divide_columns(X, s))
    return Design(X, scale=s)
