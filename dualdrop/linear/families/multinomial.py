"""Multinomial logistic regression: ``K`` classes, a coefficient matrix ``W`` of shape
``p x K`` and one intercept per class, ``z_i = x_i W + b`` (a row of ``K`` scores).

The loss is the softmax cross-entropy (the negative log-likelihood of the multinomial model),
averaged over the samples::

    L(Z) = (1/n) sum_i sw_i [ log sum_k exp(z_ik) - z_{i, y_i} ]  >= 0

``dL/dz_ik = sw_i (p_ik - Y_ik) / n`` with ``p_i = softmax(z_i)`` and ``Y`` the one-hot labels.
The Hessian of sample ``i`` is ``sw_i (diag(p_i) - p_i p_i^T) / n``; the solver's model keeps
its diagonal ``sw_i p_ik (1 - p_ik) / n`` (each class's exact curvature along its own
coefficients, the weights of glmnet's per-class Newton steps), and its line search on ``L``
absorbs what the coupling between classes changes. ``y`` is handed to the datafit one-hot
(``n x K``); the estimator (``dualdrop.linear.multinomial``) encodes the labels.
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_softmax, softmax

from ..datafits import WeightedDatafit


class Multinomial(WeightedDatafit):
    """Softmax cross-entropy over ``K`` classes; ``y`` one-hot ``(n, K)``, ``z`` ``(n, K)``."""

    code = 7
    name = "multinomial"
    curvature = 0.5  # Boehning's bound: diag(p) - p p^T <= I / 2

    def value(self, y, z):
        return -self._weighted_mean(np.sum(y * log_softmax(z, axis=1), axis=1))

    def raw_grad(self, y, z):
        g = softmax(z, axis=1) - y
        return (g if self.sample_weight is None else g * self.sample_weight[:, None]) \
            / y.shape[0]

    def raw_hess(self, y, z):
        p = softmax(z, axis=1)
        h = p * (1.0 - p)
        return (h if self.sample_weight is None else h * self.sample_weight[:, None]) \
            / y.shape[0]

    def intercept_init(self, y):
        """The log class frequencies (weighted), centred (the softmax ignores a common shift)."""
        sw = self.sample_weight
        freq = y.mean(axis=0) if sw is None else (sw @ y) / y.shape[0]
        b = np.log(np.clip(freq, 1e-300, None))
        return b - b.mean()

    def lipschitz(self, design, y=None):
        """Boehning's bound ``1/2 sum_i sw_i x_ij^2 / n`` per feature (the same for every
        class): a global Lipschitz constant of each row's gradient."""
        return super().lipschitz(design, y)
