"""Datafits: the smooth loss ``L(w, b)`` of a linear model, as a function of ``z = X w + b``.

Two datafits, both averaged over the ``n`` samples so that ``lambda`` (``alpha``) means the same
thing at every sample size:

- :class:`Quadratic` -- least squares ``L = (1/2n) ||y - X w - b||^2``;
- :class:`Logistic` -- binary logistic ``L = (1/n) sum_i log(1 + exp(-y_i z_i))`` with ``y_i`` in
  ``{-1, +1}``; with sample weights ``v_i >= 0`` the weighted average
  ``L = (1 / sum_i v_i) sum_i v_i log(1 + exp(-y_i z_i))`` (scikit-learn's convention for Lasso
  and ElasticNet: integer weights are row repetitions, a zero weight removes the row, and
  ``alpha`` keeps its meaning). Stored normalized to mean 1, ``sw = v n / sum v``, so that
  ``L = (1/n) sum_i sw_i loss_i``: the weights multiply ``dL/dz``, ``d2L/dz2`` and the
  coordinate Lipschitz constants ``curvature * sum_i sw_i x_ij^2 / n``.

Weighted least squares needs no datafit of its own: it is the unweighted problem on the rows
scaled by ``sqrt(sw_i)`` (see ``estimators._LeastSquaresData``), so every solver, the compiled
ones included, handles it unchanged.

A datafit only sees the linear predictor ``z``; the design enters through :mod:`._design` (dense
numpy or ``scipy.sparse`` CSC). Every solver uses these objects, and the compiled solvers use the
integer ``code`` to select the same formulas in numba (see ``_jit.py``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.special import expit, log_expit

__all__ = ["Datafit", "Quadratic", "Logistic", "get_datafit", "normalized_sample_weight",
           "weighted_col_norms2"]


def normalized_sample_weight(sample_weight, n):
    """Checked sample weights normalized to mean 1 (``sw = v n / sum v``), or ``None`` when
    ``sample_weight`` is ``None`` or constant (the unweighted problem, computed as such).

    Raises ``ValueError`` naming ``sample_weight`` for a wrong shape, a negative, NaN or infinite
    entry, or an all-zero vector."""
    if sample_weight is None:
        return None
    v = np.asarray(sample_weight, dtype=np.float64)
    if v.ndim == 0:
        v = np.full(n, float(v))
    if v.shape != (n,):
        raise ValueError(f"sample_weight must have one entry per sample ({n}), got shape "
                         f"{v.shape}")
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError("sample_weight must hold finite numbers >= 0 (0 removes a sample)")
    if not np.any(v > 0):
        raise ValueError("sample_weight must not be all zero (its sum must be positive)")
    if np.all(v == v[0]):
        return None
    with np.errstate(over="ignore"):
        total = float(v.sum())
        factor = n / total
    if not np.isfinite(factor) or not np.isfinite(total):
        # the sum overflows (weights near the largest float) or n / sum does (subnormal
        # weights): the same normalization on v / max(v), whose sum is between 1 and n
        v = v / float(v.max())
        factor = n / float(v.sum())
    return v * factor


def weighted_col_norms2(X, sw=None):
    """``sum_i sw_i x_ij^2`` for every column (``sw=None``: unweighted), dense or sparse ``X``."""
    if sp.issparse(X):
        sq = X.multiply(X)
        return np.asarray(sq.sum(axis=0)).ravel() if sw is None else np.asarray(sq.T @ sw).ravel()
    if sw is None:
        return np.einsum("ij,ij->j", X, X)
    return np.einsum("ij,ij,i->j", X, X, sw)


class Datafit:
    """Base class: smooth loss of the linear predictor ``z``.

    Subclasses define ``value(y, z)``, ``raw_grad(y, z)`` (``dL/dz``, already divided by ``n``),
    ``raw_hess(y, z)`` (diagonal of ``d2L/dz2``), ``curvature`` (an upper bound of ``raw_hess * n``)
    and ``code`` (the integer the numba kernels use).
    """

    code = -1
    name = "datafit"
    curvature = 1.0
    sample_weight = None  # normalized weights (mean 1) or None

    def value(self, y, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def raw_grad(self, y, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def raw_hess(self, y, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def gradient(self, X, y, z):
        """Gradient in ``w``: ``X^T dL/dz`` (and in ``b``: ``sum dL/dz``)."""
        g = self.raw_grad(y, z)
        return np.asarray(X.T @ g).ravel(), float(g.sum())

    def lipschitz(self, design):
        """Per-coordinate Lipschitz constants of the gradient: ``curvature * ||x_j||^2 / n``
        (``curvature * sum_i sw_i x_ij^2 / n`` with sample weights)."""
        if self.sample_weight is None:
            return self.curvature * design.col_norms2 / design.n
        return self.curvature * weighted_col_norms2(design.X, self.sample_weight) / design.n

    @property
    def global_curvature(self):
        """An upper bound of ``n d2L/dz_i^2`` over all samples (``curvature * max sw``)."""
        if self.sample_weight is None:
            return self.curvature
        return self.curvature * float(np.max(self.sample_weight))

    def __repr__(self):
        return f"{type(self).__name__}()"


class Quadratic(Datafit):
    """Least squares ``(1/2n) ||y - z||^2`` with ``z = X w + b``."""

    code = 0
    name = "quadratic"
    curvature = 1.0

    def value(self, y, z):
        r = y - z
        return 0.5 * float(r @ r) / y.shape[0]

    def raw_grad(self, y, z):
        return (z - y) / y.shape[0]

    def raw_hess(self, y, z):
        return np.full(y.shape[0], 1.0 / y.shape[0])

    def intercept_init(self, y):
        return float(np.mean(y))


class Logistic(Datafit):
    """Binary logistic loss ``(1/n) sum sw_i log(1 + exp(-y_i z_i))``, labels ``y`` in
    ``{-1, +1}``; ``sample_weight`` (any nonnegative weights, normalized here to mean 1) or
    ``None`` (``sw_i = 1``)."""

    code = 1
    name = "logistic"
    curvature = 0.25

    def __init__(self, sample_weight=None):
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, dtype=np.float64)
            sample_weight = normalized_sample_weight(sample_weight, sample_weight.shape[0])
        self.sample_weight = sample_weight

    def _weigh(self, v):
        return v if self.sample_weight is None else v * self.sample_weight

    def value(self, y, z):
        return -float(np.sum(self._weigh(log_expit(y * z)))) / y.shape[0]

    def raw_grad(self, y, z):
        return self._weigh(-y * expit(-y * z)) / y.shape[0]

    def raw_hess(self, y, z):
        s = expit(y * z)
        return self._weigh(s * (1.0 - s)) / y.shape[0]

    def intercept_init(self, y):
        p = np.clip(np.mean(self._weigh(y > 0)), 1e-12, 1 - 1e-12)
        return float(np.log(p / (1 - p)))

    def __repr__(self):
        return "Logistic(sample_weight=...)" if self.sample_weight is not None else "Logistic()"


_DATAFITS = {"quadratic": Quadratic, "logistic": Logistic}


def get_datafit(datafit) -> Datafit:
    """Return a datafit object from a name (``"quadratic"``, ``"logistic"``) or an instance."""
    if isinstance(datafit, Datafit):
        return datafit
    if isinstance(datafit, str) and datafit in _DATAFITS:
        return _DATAFITS[datafit]()
    raise ValueError(
        f"datafit={datafit!r} is not supported; use one of {sorted(_DATAFITS)} or a Datafit instance"
    )
