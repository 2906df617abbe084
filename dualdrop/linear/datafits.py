"""Datafits: the smooth loss ``L(w, b)`` of a linear model, as a function of ``z = X w + b``.

Two datafits, both averaged over the ``n`` samples so that ``lambda`` (``alpha``) means the same
thing at every sample size:

- :class:`Quadratic` -- least squares ``L = (1/2n) ||y - X w - b||^2``;
- :class:`Logistic` -- binary logistic ``L = (1/n) sum_i log(1 + exp(-y_i z_i))`` with ``y_i`` in
  ``{-1, +1}``.

A datafit only sees the linear predictor ``z``; the design enters through :mod:`._design` (dense
numpy or ``scipy.sparse`` CSC). Every solver uses these objects, and the compiled solvers use the
integer ``code`` to select the same formulas in numba (see ``_jit.py``).
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, log_expit

__all__ = ["Datafit", "Quadratic", "Logistic", "get_datafit"]


class Datafit:
    """Base class: smooth loss of the linear predictor ``z``.

    Subclasses define ``value(y, z)``, ``raw_grad(y, z)`` (``dL/dz``, already divided by ``n``),
    ``raw_hess(y, z)`` (diagonal of ``d2L/dz2``), ``curvature`` (an upper bound of ``raw_hess * n``)
    and ``code`` (the integer the numba kernels use).
    """

    code = -1
    name = "datafit"
    curvature = 1.0

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

    def lipschitz(self, col_norms2, n):
        """Per-coordinate Lipschitz constants of the gradient: ``curvature * ||x_j||^2 / n``."""
        return self.curvature * col_norms2 / n

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
    """Binary logistic loss ``(1/n) sum log(1 + exp(-y z))``, labels ``y`` in ``{-1, +1}``."""

    code = 1
    name = "logistic"
    curvature = 0.25

    def value(self, y, z):
        return -float(np.sum(log_expit(y * z))) / y.shape[0]

    def raw_grad(self, y, z):
        return -y * expit(-y * z) / y.shape[0]

    def raw_hess(self, y, z):
        s = expit(y * z)
        return s * (1.0 - s) / y.shape[0]

    def intercept_init(self, y):
        p = np.clip(np.mean(y > 0), 1e-12, 1 - 1e-12)
        return float(np.log(p / (1 - p)))


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
