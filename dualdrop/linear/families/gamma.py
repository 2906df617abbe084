"""Gamma regression with the log link: positive, right-skewed ``y_i > 0`` with mean
``mu_i = exp(z_i)`` and a constant coefficient of variation.

The loss is the half Gamma deviance (scikit-learn's ``GammaRegressor`` minimizes its mean, plus
``alpha/2 ||w||^2``)::

    L(z) = (1/n) sum_i sw_i [z_i + y_i exp(-z_i) - log y_i - 1]  >= 0

``dL/dz_i = sw_i (1 - y_i e^-z_i) / n``, ``d2L/dz_i^2 = sw_i y_i e^-z_i / n``: convex in ``z``
(the log link makes the Gamma deviance convex; with the canonical inverse link it is not),
unbounded curvature as ``z -> -inf``, hence proximal Newton with a line search. The best
constant is ``log(mean y)``.
"""

from __future__ import annotations

import numpy as np

from ..datafits import WeightedDatafit
from ._common import real_target


class Gamma(WeightedDatafit):
    """Half Gamma deviance with the log link (module docstring)."""

    code = 3
    name = "gamma"

    def check_target(self, y):
        y = real_target(y)
        if np.any(y <= 0):
            raise ValueError(f"y must be > 0 for the Gamma datafit, got {float(y.min())!r} "
                             "(for counts with zeros use the Poisson datafit)")
        return y

    def value(self, y, z):
        with np.errstate(over="ignore"):
            d = z + y * np.exp(-z) - np.log(y) - 1.0
        return self._weighted_mean(d)

    def raw_grad(self, y, z):
        with np.errstate(over="ignore"):
            return self._weigh(1.0 - y * np.exp(-z)) / y.shape[0]

    def raw_hess(self, y, z):
        with np.errstate(over="ignore"):
            return self._weigh(y * np.exp(-z)) / y.shape[0]

    def grad_hess(self, y, z):
        h = self.raw_hess(y, z)
        return self._weigh(np.ones_like(z)) / y.shape[0] - h, h

    def intercept_init(self, y):
        return float(np.log(self._weighted_mean(y)))

    def lipschitz(self, design, y=None):
        """The curvatures of the null model (``e^z = mean y``, Hessian ``sw_i y_i / (n mean
        y)``) averaged over the samples: ``sum_i sw_i x_ij^2 / n`` (the weighted mean of
        ``y_i / mean y`` is 1): the scale of the stopping criterion, one pass over ``X`` fewer
        than the exact ones."""
        return self.lipschitz_at(design, self._weigh(np.full(design.n, 1.0 / design.n)))

    @staticmethod
    def mean(z):
        """The predicted mean ``exp(z)``."""
        return np.exp(z)

    def deviance(self, y, mu):
        """Mean (weighted) Gamma deviance ``2 [log(mu/y) + y/mu - 1]`` of predicted means."""
        return 2.0 * self._weighted_mean(np.log(mu / y) + y / mu - 1.0)
