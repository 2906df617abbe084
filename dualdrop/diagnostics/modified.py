"""The modified loss of dropout: the dropout loss averaged over its masks, in closed form.

Stochastic modified equations (Zhang, Xu et al., "Stochastic Modified Equations and Dynamics of
Dropout Algorithm", ICLR 2024): dropout-SGD with learning rate ``lr`` follows, to first (weak)
order in ``lr``, the SDE ``d theta = -grad L_S dt + sqrt(lr) S^{1/2} dW`` where ``L_S`` is the
expected dropout loss and ``S`` the covariance of the dropout gradient.  For the square loss and
inverted dropout (keep probability ``p``, kept units scaled by ``1/p``) the average is exact:
a unit multiplied by ``eta/p`` with ``eta ~ Bernoulli(p)`` has mean 1 and variance ``(1-p)/p``, so
``E (sum_r c_r eta_r / p - y)^2 = (sum_r c_r - y)^2 + (1-p)/p sum_r c_r^2``.

* **linear regression**, ``L = (1/2n) ||X w - y||^2`` with dropout on the inputs:
  ``L_S = L + (1-p)/(2 n p) sum_i sum_j x_ij^2 w_j^2`` -- the data-weighted Tikhonov term, i.e. the
  eta-trick's quadratic penalty at fixed ``eta`` (see ``docs/theory.md``);
* **two-layer network** ``f(x) = sum_r a_r sigma(w_r . x)`` with dropout on the hidden units:
  ``L_S = L + (1-p)/(2 n p) sum_i sum_r a_r^2 sigma(w_r . x_i)^2``.

Parameters are passed explicitly (``w`` of shape ``(d,)``; or ``(W, a)`` with ``W`` of shape
``(m, d)`` and ``a`` of shape ``(m,)``), and may carry a leading batch of independent runs
(``(R, d)``; ``(R, m, d)`` and ``(R, m)``) so that simulations vectorize over runs.
"""

from __future__ import annotations

import torch


def _check(X, y, p):
    if not isinstance(X, torch.Tensor) or X.ndim != 2:
        raise ValueError("X must be a 2-D tensor (n, d)")
    if not isinstance(y, torch.Tensor) or y.shape != (X.shape[0],):
        raise ValueError(f"y must be a tensor of shape ({X.shape[0]},)")
    if not (isinstance(p, (int, float)) and 0 < p <= 1) or isinstance(p, bool):
        raise ValueError(f"p={p!r} is the keep probability; expected a float in (0, 1]")


def _unpack(params, kind):
    if kind == "linear":
        if not isinstance(params, torch.Tensor):
            raise TypeError("kind='linear' takes params=w, a tensor of shape (d,) or (R, d)")
        return params
    if kind == "two_layer":
        if not (isinstance(params, (tuple, list)) and len(params) == 2):
            raise TypeError("kind='two_layer' takes params=(W, a) with W (m, d) and a (m,)")
        return params
    raise ValueError(f"kind={kind!r}; choose 'linear' or 'two_layer'")


def _units(params, X, kind, activation):
    """Per-sample unit contributions ``c[..., i, r]`` whose sum is the prediction."""
    if kind == "linear":
        return X * params.unsqueeze(-2)                                   # (..., n, d)
    W, a = params
    return activation(torch.einsum("nd,...md->...nm", X, W)) * a.unsqueeze(-2)   # (..., n, m)


def modified_loss(params, X, y, p: float, *, kind: str = "linear", activation=torch.tanh):
    """``L_S = E_masks[dropout loss]`` in closed form (see the module docstring); shape ``(...)``.

    ``L`` is the half mean squared error ``(1/2n) sum_i (f(x_i) - y_i)^2``; ``p`` the keep
    probability.  Differentiable in ``params`` (use autograd for ``grad L_S``).
    """
    _check(X, y, p)
    c = _units(_unpack(params, kind), X, kind, activation)
    n = X.shape[0]
    resid = c.sum(-1) - y
    return 0.5 * (resid ** 2).mean(-1) + (1 - p) / (2 * n * p) * (c ** 2).sum((-2, -1))


def plain_loss(params, X, y, *, kind: str = "linear", activation=torch.tanh):
    """The noiseless loss ``L = (1/2n) sum_i (f(x_i) - y_i)^2`` (the naive SDE's potential)."""
    c = _units(_unpack(params, kind), X, kind, activation)
    return 0.5 * ((c.sum(-1) - y) ** 2).mean(-1)


def dropout_loss(params, X, y, p: float, mask, *, kind: str = "linear", activation=torch.tanh,
                 per_sample: bool = False):
    """The dropout loss for one draw: units multiplied by ``mask / p``.

    ``mask`` has the unit axis last (``(..., d)`` for linear, ``(..., m)`` for two-layer) and is
    shared by all samples (one mask per step, as in the SDE analysis); with ``per_sample=True`` it
    has a sample axis, ``(..., n, units)``, and drops units independently per sample.  Leading axes
    broadcast against the parameters' run axis.
    """
    _check(X, y, p)
    c = _units(_unpack(params, kind), X, kind, activation)
    if not per_sample:
        mask = mask.unsqueeze(-2)
    return 0.5 * (((c * mask / p).sum(-1) - y) ** 2).mean(-1)
