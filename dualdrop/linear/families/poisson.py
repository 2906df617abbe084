"""Poisson regression with the log link: counts ``y_i >= 0`` with mean ``mu_i = exp(z_i)``.

The loss is the half Poisson deviance (scikit-learn's ``PoissonRegressor`` minimizes its mean,
plus ``alpha/2 ||w||^2``)::

    L(z) = (1/n) sum_i sw_i [exp(z_i) - y_i z_i + y_i log y_i - y_i]     (0 log 0 = 0)

which is the negative log-likelihood up to a constant chosen so that ``L >= 0`` with equality
for a perfect fit (the stopping criterion divides by ``L``). ``dL/dz_i = sw_i (e^z_i - y_i) / n``
and ``d2L/dz_i^2 = sw_i e^z_i / n``: convex, but without a global Lipschitz constant (the
curvature grows with ``e^z``), so the solver is proximal Newton with a line search (Lee, Sun &
Saunders, "Proximal Newton-type methods", 2014), skglm's choice too. The best constant is
``log(mean y)`` (weighted); an all-zero ``y`` has none (``ValueError``).
"""

from __future__ import annotations

import numpy as np
from scipy.special import xlogy

from ..datafits import WeightedDatafit
from ._common import real_target


class Poisson(WeightedDatafit):
    """Half Poisson deviance with the log link (module docstring)."""

    code = 2
    name = "poisson"

    def check_target(self, y):
        y = real_target(y)
        if np.any(y < 0):
            raise ValueError(f"y must be >= 0 for the Poisson datafit (counts or rates), got "
                             f"{float(y.min())!r}")
        if not np.any(y > 0):
            raise ValueError("y must not be all zero for the Poisson datafit: the best "
                             "intercept would be -inf")
        return y

    def value(self, y, z):
        with np.errstate(over="ignore"):
            d = np.exp(z) - y * z + xlogy(y, y) - y
        return self._weighted_mean(d)

    def raw_grad(self, y, z):
        with np.errstate(over="ignore"):
            return self._weigh(np.exp(z) - y) / y.shape[0]

    def raw_hess(self, y, z):
        with np.errstate(over="ignore"):
            return self._weigh(np.exp(z)) / y.shape[0]

    def grad_hess(self, y, z):
        with np.errstate(over="ignore"):
            h = self._weigh(np.exp(z)) / y.shape[0]
        return h - self._weigh(y) / y.shape[0], h

    def intercept_init(self, y):
        return float(np.log(max(self._weighted_mean(y), 1e-300)))

    def lipschitz(self, design, y=None):
        """Curvatures at the null model (``e^z = mean y``): ``mean(y) sum_i sw_i x_ij^2 / n``."""
        m = 1.0 if y is None else max(self._weighted_mean(y), 1e-300)
        return self.lipschitz_at(design, self._weigh(np.full(design.n, m)) / design.n)

    @staticmethod
    def mean(z):
        """The predicted mean ``exp(z)``."""
        return np.exp(z)

    def deviance(self, y, mu):
        """Mean (weighted) Poisson deviance ``2 [y log(y/mu) - y + mu]`` of predicted means."""
        return 2.0 * self._weighted_mean(xlogy(y, y) - xlogy(y, mu) - y + mu)
