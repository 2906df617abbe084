"""Euler--Maruyama simulation of the SDEs of SGD, SignSGD, Adam, Adam + L2, AdamW and RMSprop.

Time is measured in units of the learning rate ``eta``: optimizer step ``k`` sits at
``t = k eta``, and an SDE step of ``dt = eta / substeps`` is one ``substeps``-th of it.  The
gradient noise is ``xi ~ N(0, Sigma(x))`` (``dualdrop.dynamics._core`` for the models of
``Sigma``).  The SDEs (Compagnoni et al., "SDEs for adaptive methods: the role of noise"; the
SGD one is Li, Tai, E's stochastic modified equation):

SGD (``weight_decay = gamma`` is the L2 term, the same as decoupled decay for SGD)::

    dX = -(grad f + gamma X) dt + sqrt(eta) Sigma^{1/2} dW

SignSGD, with ``m = Erf(grad f / sqrt(2 diag Sigma))`` the mean of ``sign(g)`` coordinate-wise::

    dX = -m dt + sqrt(eta) Sigmabar^{1/2} dW,    Sigmabar = Cov(sign(g)),  diag = 1 - m^2

(with ``Sigma = sigma^2 f I`` this is ``-Erf(Y) dt + sqrt(eta) sqrt(I - diag(Erf(Y))^2) dW``,
``Y = grad f / (sqrt(2 f) sigma)``).

Adam, ``beta_i = 1 - eta rho_i``, ``gamma_i(t) = 1 - exp(-rho_i t)`` (the bias corrections),
``P = diag(sqrt V) + eps sqrt(gamma_2(t)) I``, ``G`` the gradient the optimizer's moments see::

    dX = -sqrt(gamma_2)/gamma_1 P^{-1} (M + eta rho_1 (G - M)) dt  [- gamma X dt for AdamW]
    dM = rho_1 (G - M) dt + sqrt(eta) rho_1 Sigma^{1/2} dW
    dV = rho_2 (G^2 + diag Sigma - V) dt

with ``G = grad f`` for Adam and AdamW and ``G = grad f + gamma X`` for Adam on the L2-regularized
loss ``f + gamma ||x||^2 / 2`` (what ``torch.optim.Adam(weight_decay=gamma)`` does).  AdamW's
decoupled decay ``x <- x (1 - eta gamma)`` per step is the drift ``-gamma X``.

RMSprop (``torch.optim.RMSprop``: ``alpha = beta_2``, no momentum, no bias correction;
``G = grad f + gamma X``), the noise entering the step itself::

    dX = -P^{-1} (G dt + sqrt(eta) Sigma^{1/2} dW),   P = diag(sqrt V) + eps I
    dV = rho_2 (G^2 + diag Sigma - V) dt

The scheme is Euler--Maruyama with one ordering choice: ``V`` and the bias corrections are taken
at the end of the step (``V_{n+1}``, ``t_{n+1}``), as the algorithm does (its update uses
``v_{k+1}`` and ``1 - beta^{k+1}``); at ``t = 0`` the drift of ``X`` is singular (``V = 0``,
``gamma_1 = 0``) and the start-of-step values would divide by ``eps``.  ``V`` carries no noise,
so the choice leaves the scheme's weak order at one.

All paths advance together as one ``(P, d)`` tensor; the excess loss ``f - f_*`` is averaged
over time per path after ``burn_in`` optimizer steps, and the mean over paths is reported with
its standard error (paths are independent).
"""

from __future__ import annotations

import math

import torch

from dualdrop.dynamics._core import TimeAverage, check_count, setup_run


def simulate_sde(optimizer: str, loss, lr: float, steps: int, *, noise="isotropic",
                 sigma: float = 1.0, weight_decay: float = 0.0, betas=(0.9, 0.999),
                 eps: float = 1e-8, paths: int = 512, substeps: int = 1, burn_in: int = 0,
                 x0=None, f_star: float = 0.0, seed: int = 0, dtype=torch.float64,
                 record_every: int = 0, z_source=None) -> dict:
    """Simulate ``paths`` independent solutions of ``optimizer``'s SDE over ``steps * lr`` time.

    ``loss``: a Hessian tensor ``(d, d)`` (the quadratic ``x^T H x / 2``) or a callable
    ``loss(x (P, d)) -> (P,)`` with minimum value ``f_star``.  ``noise``/``sigma``: see
    :func:`dualdrop.dynamics._core.as_noise`.  ``betas`` give ``rho_i = (1 - beta_i) / lr``.
    ``substeps`` Euler--Maruyama steps per optimizer step.  ``z_source``: optional callable
    ``z_source(n) -> (P, width)`` standard normals for SDE step ``n`` (to couple with the
    discrete runner); by default drawn from a generator seeded with ``seed``.

    Returns a dict: ``x`` (final ``(P, d)``), ``final_loss`` (``(P,)`` excess loss at the end),
    ``loss``/``stderr``/``per_path`` (time average after ``burn_in`` steps; absent when
    ``burn_in >= steps``), ``times``/``trace`` (mean excess loss over paths every
    ``record_every`` optimizer steps, when asked).
    """
    substeps = check_count("substeps", substeps)
    obj, nz, lr, (b1, b2), eps, X = setup_run(optimizer, loss, lr, steps, paths, burn_in, betas,
                                              eps, weight_decay, noise, sigma, x0, f_star, dtype)
    gamma = float(weight_decay)
    d = X.shape[1]
    width = d if optimizer == "signsgd" else nz.width(d)   # sign noise lives in R^d
    gen = torch.Generator().manual_seed(seed)
    dt = lr / substeps
    sq = math.sqrt(lr * dt)                 # sqrt(eta) * sqrt(dt): diffusion per unit z
    rho1, rho2 = (1 - b1) / lr, (1 - b2) / lr
    M = torch.zeros_like(X)
    V = torch.zeros_like(X)
    avg = TimeAverage(paths, dtype)
    times, trace = [], []
    t = 0.0
    n = 0
    f, g = obj.value_and_grad(X)
    for k in range(steps):
        for _ in range(substeps):
            z = z_source(n) if z_source is not None else torch.randn(paths, width, generator=gen,
                                                                      dtype=dtype)
            if optimizer == "sgd":
                X = X - (g + gamma * X) * dt - sq * nz.sample(z, f)   # sign: as -eta (g + xi)
            elif optimizer == "signsgd":
                s = nz.variance(f, d).sqrt()
                m = torch.erf(g / (math.sqrt(2.0) * s.clamp_min(1e-300)))
                w = z if nz.correlation is None else z @ nz.correlation.T.to(dtype)
                X = X - m * dt + sq * (1 - m * m).clamp_min(0).sqrt() * w
            elif optimizer == "rmsprop":
                G = g + gamma * X
                V = V + rho2 * (G * G + nz.variance(f, d) - V) * dt
                X = X - (G * dt + sq * nz.sample(z, f)) / (V.sqrt() + eps)
            else:
                G = g + gamma * X if optimizer == "adam-l2" else g
                t_next = t + dt
                g1, g2 = -math.expm1(-rho1 * t_next), -math.expm1(-rho2 * t_next)
                V = V + rho2 * (G * G + nz.variance(f, d) - V) * dt
                P = V.sqrt() + eps * math.sqrt(g2)
                drift = (math.sqrt(g2) / g1) * (M + lr * rho1 * (G - M)) / P
                M = M + rho1 * (G - M) * dt + sq * rho1 * nz.sample(z, f)
                X = X - drift * dt - (gamma * X * dt if optimizer == "adamw" else 0.0)
            t += dt
            n += 1
            f, g = obj.value_and_grad(X)
            if k >= burn_in:
                avg.add(f, 1.0 / substeps)
        if record_every and (k + 1) % record_every == 0:
            times.append((k + 1) * lr)
            trace.append(float(f.mean()))
    out = {"x": X, "final_loss": f}
    if avg.count:
        out.update(avg.result())
    if record_every:
        out["times"], out["trace"] = times, trace
    return out
