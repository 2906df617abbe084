"""Huber regression: least squares for residuals up to ``delta``, least absolute deviations
beyond (Huber, "Robust estimation of a location parameter", 1964)::

    L(z) = (1/n) sum_i sw_i h(y_i - z_i),   h(r) = r^2 / 2 if |r| <= delta, else
                                                   delta |r| - delta^2 / 2

skglm's ``Huber(delta)`` (the same ``delta``, in the units of ``y``). scikit-learn's
``HuberRegressor`` instead estimates a scale ``sigma`` jointly with ``epsilon = delta / sigma``;
at its fitted ``sigma`` its coefficients minimize this loss with ``delta = epsilon sigma`` and
``alpha_ours = alpha_sklearn sigma / n`` on a ridge (``l1_ratio=0``) penalty (the test suite
checks this). A common choice is ``delta = 1.345 sigma`` (95% efficiency under Gaussian noise),
with ``sigma`` a robust scale of the residuals, e.g. ``1.4826 * MAD``.

``dL/dz_i = -sw_i clip(y_i - z_i, -delta, delta) / n`` is Lipschitz (constant 1), and its
generalized Jacobian is ``1{|r_i| <= delta}``: the solver is the semismooth Newton of Yi & Huang
("Semismooth Newton coordinate descent algorithm for elastic-net penalized Huber loss regression
and quantile regression", 2017): its model is exact around the current set of inliers, so the
steps stop changing once that set is found. Outliers' curvature is floored at ``FLOOR`` of the
inliers' (a column touching only outliers still gets a finite step; the line search keeps it a
descent step).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..datafits import WeightedDatafit
from ._common import best_constant, real_target

FLOOR = 1e-3


class Huber(WeightedDatafit):
    """Huber loss with threshold ``delta > 0`` (module docstring)."""

    code = 4
    name = "huber"
    curvature = 1.0

    @property
    def slope_bound(self):
        return self.delta

    def __init__(self, delta=1.35, sample_weight=None):
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) \
                or not np.isfinite(delta) or delta <= 0:
            raise ValueError(f"delta must be a positive finite number (the residual beyond "
                             f"which the loss is linear, in the units of y), got {delta!r}")
        self.delta = float(delta)
        super().__init__(sample_weight)

    def _repr_params(self):
        return {"delta": self.delta}

    def check_target(self, y):
        return real_target(y)

    def value(self, y, z):
        r = np.abs(y - z)
        d = self.delta
        return self._weighted_mean(np.where(r <= d, 0.5 * r * r, d * r - 0.5 * d * d))

    def raw_grad(self, y, z):
        return -self._weigh(np.clip(y - z, -self.delta, self.delta)) / y.shape[0]

    def raw_hess(self, y, z):
        return self._weigh(np.where(np.abs(y - z) <= self.delta, 1.0, FLOOR)) / y.shape[0]

    def intercept_init(self, y):
        return best_constant(self.raw_grad, y)
