"""Quantile regression with a smoothed pinball loss (the smoothed form, not a primal-dual
solver: the objective is differentiable, and ``smoothing -> 0`` recovers the exact one).

The pinball (check) loss of the residual ``r = y - z`` at quantile ``tau`` is
``rho(r) = r (tau - 1{r < 0})`` (Koenker & Bassett 1978). Its smoothing on ``[-delta, delta]``
(the infimal convolution with ``q(u) = (tau u_+^2 + (1 - tau) u_-^2) / (2 delta)``; the
"quantile Huber" loss of Yi & Huang 2017)::

    rho_delta(r) = tau (r - delta/2)             r > delta
                   tau r^2 / (2 delta)           0 <= r <= delta
                   (1 - tau) r^2 / (2 delta)     -delta <= r < 0
                   (1 - tau) (-r - delta/2)      r < -delta

    L(z) = (1/n) sum_i sw_i rho_delta(y_i - z_i)

It is below ``rho`` and within ``max(tau, 1 - tau) delta / 2`` of it, so the minimum of the
smoothed objective is within that of the exact one (the estimator reaches small ``delta`` by
continuation; the test suite checks the bound against scikit-learn's exact ``QuantileRegressor``).
As for Huber, the generalized Hessian is ``tau / delta`` or ``(1 - tau) / delta`` on the
quadratic pieces and 0 elsewhere; the solver is semismooth Newton, outliers' curvature
floored at ``FLOOR`` of the smaller quadratic piece's.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..datafits import WeightedDatafit
from ._common import best_constant, real_target

FLOOR = 1e-3


def _check_unit(name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0.0 < v < 1.0:
        raise ValueError(f"{name} must be a number in (0, 1), got {v!r}")
    return float(v)


class Quantile(WeightedDatafit):
    """Smoothed pinball loss at quantile ``quantile`` with smoothing width ``delta`` (module
    docstring)."""

    code = 5
    name = "quantile"

    def __init__(self, quantile=0.5, delta=1e-3, sample_weight=None):
        self.quantile = _check_unit("quantile", quantile)
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) \
                or not np.isfinite(delta) or delta <= 0:
            raise ValueError(f"delta must be a positive finite number (the width of the "
                             f"smoothed region, in the units of y), got {delta!r}")
        self.delta = float(delta)
        super().__init__(sample_weight)

    @property
    def slope_bound(self):
        return max(self.quantile, 1.0 - self.quantile)

    @property
    def curvature(self):
        return max(self.quantile, 1.0 - self.quantile) / self.delta

    def _repr_params(self):
        return {"quantile": self.quantile, "delta": self.delta}

    def check_target(self, y):
        return real_target(y)

    def value(self, y, z):
        r = y - z
        t, d = self.quantile, self.delta
        out = np.where(r > d, t * (r - 0.5 * d),
                       np.where(r >= 0, t * r * r / (2 * d),
                                np.where(r >= -d, (1 - t) * r * r / (2 * d),
                                         (1 - t) * (-r - 0.5 * d))))
        return self._weighted_mean(out)

    def raw_grad(self, y, z):
        r = y - z
        t, d = self.quantile, self.delta
        slope = np.where(r > d, t, np.where(r >= 0, t * r / d,
                                             np.where(r >= -d, (1 - t) * r / d, t - 1.0)))
        return -self._weigh(slope) / y.shape[0]

    def raw_hess(self, y, z):
        r = y - z
        t, d = self.quantile, self.delta
        floor = FLOOR * min(t, 1 - t) / d
        h = np.where((r >= 0) & (r <= d), t / d,
                     np.where((r < 0) & (r >= -d), (1 - t) / d, floor))
        return self._weigh(h) / y.shape[0]

    def intercept_init(self, y):
        return best_constant(self.raw_grad, y)

    def lipschitz(self, design, y=None):
        """``max(tau, 1 - tau) / delta * ||x_j||^2 / n``: the Lipschitz constants of the
        gradient."""
        return super().lipschitz(design, y)

    def pinball(self, y, z):
        """The exact (unsmoothed) mean pinball loss of the predictions ``z``."""
        r = y - z
        return self._weighted_mean(r * (self.quantile - (r < 0)))
