"""Closed-form stationary loss levels ``E[f(X) - f_*]`` on a quadratic with isotropic noise.

Setting: ``f`` with Hessian eigenvalues in ``[mu, L]``, ``L_tau`` a bound on ``Tr(Hessian)``
(for the quadratic ``x^T H x / 2``: ``mu = lambda_min``, ``L = lambda_max``, ``L_tau = Tr H``),
gradient noise ``N(0, sigma^2 I)``, learning rate ``eta``, decay ``gamma``.  Bounds of Compagnoni
et al. ("SDEs for adaptive methods: the role of noise") for the limits ``t -> infinity`` of the
SDEs in ``dualdrop.dynamics.sde``:

* SGD: ``eta L_tau sigma^2 / (4 mu)`` -- Ito on ``f``: ``d E f = -E|grad f|^2 + (eta/2) sigma^2
  Tr H <= -2 mu E f + (eta/2) sigma^2 L_tau``; quadratic in ``sigma``;
* SignSGD: ``(eta/2) (L_tau / (2 mu)) / Delta`` with ``1/Delta = pi sigma^2 / (sqrt(2 pi) sigma
  + eta mu)``: quadratic for ``sigma << eta mu``, linear, ``(eta/4) sqrt(pi/2) sigma L_tau/mu``,
  once ``sigma`` dominates;
* Adam on ``f + gamma ||x||^2 / 2`` (Adam itself at ``gamma = 0``): ``(eta L_tau sigma / 2)
  L / (2 mu L + gamma (L + mu))`` -- linear in ``sigma`` whatever ``gamma``;
* AdamW: ``(eta L_tau sigma / 2) L / (2 mu L + sigma gamma (L + mu))`` -- tends to
  ``eta L_tau L / (2 gamma (L + mu))`` as ``sigma -> infinity``: decoupled decay bounds the level.

RMSprop is given the Adam + L2 expression: linearized at the minimum (``V -> sigma^2``) its SDE
is the Ornstein--Uhlenbeck process ``dX = -(H + gamma I) X / sigma dt - sqrt(eta) dW``, whose level
``(eta sigma / 4) sum_i h_i / (h_i + gamma)`` is the one Adam + L2's linearization has (this
extension is ours, not the paper's).

In one dimension (``mu = L = L_tau = h``) the Adam, Adam + L2 and AdamW expressions are the
exact stationary levels of the SDEs linearized at the minimum (``V -> sigma^2``, ``rho_1 >>
gamma``): ``eta h sigma / (4 (h + gamma))`` and ``eta h sigma / (4 (h + gamma sigma))``.

For SGD the quadratic's levels are known exactly (:func:`sgd_stationary_loss`): the SDE is an
Ornstein--Uhlenbeck process with stationary covariance ``(eta sigma^2 / 2) (H + gamma I)^{-1}``,
and the discrete recursion ``x <- (I - eta (H + gamma I)) x - eta xi`` has, per eigenvalue
``a = h + gamma``, stationary variance ``eta sigma^2 / (a (2 - eta a))`` (``eta a < 2``).
"""

from __future__ import annotations

import math

import torch

from dualdrop.dynamics._core import check_hessian, check_optimizer, check_positive


def curvature(hessian) -> dict:
    """``mu``, ``L``, ``L_tau`` (trace) and the eigenvalues of a positive-definite Hessian."""
    H = check_hessian(hessian)
    w = torch.linalg.eigvalsh(H)
    return {"mu": float(w[0]), "L": float(w[-1]), "L_tau": float(w.sum()), "eigenvalues": w}


def stationary_bound(optimizer: str, hessian, sigma: float, lr: float,
                     weight_decay: float = 0.0) -> float:
    """The bound on ``lim E[f - f_*]`` listed in the module docstring for ``optimizer``."""
    check_optimizer(optimizer, weight_decay)
    sigma = check_positive("sigma", sigma, allow_zero=True)
    eta = check_positive("lr", lr)
    c = curvature(hessian)
    mu, L, Lt, gam = c["mu"], c["L"], c["L_tau"], float(weight_decay)
    if optimizer == "sgd":
        return eta * Lt * sigma ** 2 / (4 * (mu + gam))
    if optimizer == "signsgd":
        inv_delta = math.pi * sigma ** 2 / (math.sqrt(2 * math.pi) * sigma + eta * mu)
        return eta / 2 * Lt / (2 * mu) * inv_delta
    if optimizer in ("adam", "adam-l2", "rmsprop"):
        return eta * Lt * sigma / 2 * L / (2 * mu * L + gam * (L + mu))
    return eta * Lt * sigma / 2 * L / (2 * mu * L + sigma * gam * (L + mu))


def sgd_stationary_loss(hessian, sigma: float, lr: float, weight_decay: float = 0.0, *,
                        discrete: bool = False) -> float:
    """Exact stationary ``E f`` of SGD's SDE (``discrete=False``) or of SGD itself on
    ``x^T H x / 2`` with noise ``N(0, sigma^2 I)`` and L2 decay ``weight_decay``."""
    sigma = check_positive("sigma", sigma, allow_zero=True)
    eta = check_positive("lr", lr)
    gam = check_positive("weight_decay", weight_decay, allow_zero=True)
    h = curvature(hessian)["eigenvalues"].double()
    a = h + gam
    if discrete:
        if float(eta * a.max()) >= 2:
            raise ValueError(f"lr={lr}: SGD diverges (lr * (lambda_max + weight_decay) = "
                             f"{float(eta * a.max()):.3g} >= 2)")
        var = eta * sigma ** 2 / (a * (2 - eta * a))
    else:
        var = eta * sigma ** 2 / (2 * a)
    return float((h / 2 * var).sum())
