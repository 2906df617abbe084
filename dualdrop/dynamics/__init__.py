"""SDEs of SGD, SignSGD, Adam, Adam + L2, AdamW and RMSprop, their stationary loss levels, and
the optimizers themselves under injected gradient noise.

Near a minimum an optimizer with learning rate ``eta`` and gradient noise ``xi ~ N(0, Sigma)``
does not converge: its iterates settle into a stationary distribution whose loss level
``E[f - f_*]`` depends on how the update transforms the noise.  Compagnoni et al. ("SDEs for
adaptive methods: the role of noise") derive weak first-order SDEs for the adaptive methods
(``dualdrop.dynamics.sde``) and bound the level on a quadratic with Hessian spectrum in
``[mu, L]`` and noise ``sigma^2 I`` (``dualdrop.dynamics.bounds``):

* SGD passes the noise through unchanged: level ``~ eta sigma^2`` (exactly ``eta sigma^2 d / 4``
  for the SDE on a quadratic, an Ornstein--Uhlenbeck process);
* SignSGD and Adam normalize the gradient by the noise's scale: level ``~ eta sigma``;
* an L2 term ``gamma ||x||^2 / 2`` inside Adam is normalized too and leaves the level linear in
  ``sigma``; AdamW's decoupled decay is not, and bounds the level as ``sigma`` grows.

``stationary_loss(optimizer, hessian, sigma, lr, method="sde" | "discrete", weight_decay=...)``
measures the level either way; ``simulate_sde`` and ``run_discrete`` take any differentiable
loss on a batch of paths and any of the noise models (``Isotropic``, ``LossScaled``: ``sigma^2
f(x) I``, ``Covariance``: a matrix measured by ``dualdrop.diagnostics``).  The math and the
measured checks are in ``docs/dynamics.md``.
"""

from dualdrop.dynamics._core import (OPTIMIZERS, Covariance, GradientNoise, Isotropic,
                                     LossScaled, Objective)
from dualdrop.dynamics.bounds import curvature, sgd_stationary_loss, stationary_bound
from dualdrop.dynamics.discrete import SignSGD, make_optimizer, run_discrete
from dualdrop.dynamics.sde import simulate_sde
from dualdrop.dynamics.stationary import relaxation_time, stationary_loss

__all__ = ["stationary_loss", "simulate_sde", "run_discrete", "stationary_bound",
           "sgd_stationary_loss", "curvature", "relaxation_time", "SignSGD", "make_optimizer",
           "Isotropic", "LossScaled", "Covariance", "GradientNoise", "Objective", "OPTIMIZERS"]
