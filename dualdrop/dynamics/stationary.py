"""``stationary_loss``: the stationary loss level of an optimizer on a quadratic, by SDE or by
running the optimizer, next to its closed-form bound.

The level is ``lim_t E[f(X_t) - f_*]``, estimated as the time average of ``f - f_*`` after a
burn-in, per path, then averaged over independent paths (standard error from the spread of the
per-path averages).  Default run lengths come from the slowest relaxation time ``tau`` (in SDE
time, units of ``eta`` per step) of the linearized dynamics at the minimum:

* SGD: ``1 / (mu + gamma)``;
* SignSGD: ``sqrt(pi/2) s / mu`` (``Erf(g / (sqrt 2 s)) ~ sqrt(2/pi) g / s`` near the minimum);
* Adam family: ``s / mu + 1/rho_1 + 1/rho_2`` (``X`` relaxes at ``mu / sqrt(V) ~ mu / s``,
  ``M`` and ``V`` at ``rho_1``, ``rho_2``), capped by ``1/gamma`` for AdamW;

with ``s`` the per-coordinate noise scale; the burn-in is ``5 tau`` and the average ``10 tau``.
"""

from __future__ import annotations

import math

import torch

from dualdrop.dynamics._core import (as_noise, check_betas, check_count, check_optimizer,
                                     check_positive, check_hessian)
from dualdrop.dynamics.bounds import curvature, stationary_bound
from dualdrop.dynamics.discrete import run_discrete
from dualdrop.dynamics.sde import simulate_sde


def relaxation_time(optimizer: str, mu: float, scale: float, lr: float, weight_decay: float = 0.0,
                    betas=(0.9, 0.999)) -> float:
    """``tau`` of the module docstring (SDE time)."""
    gam = float(weight_decay)
    if optimizer == "sgd":
        return 1.0 / (mu + gam)
    if optimizer == "signsgd":
        return math.sqrt(math.pi / 2) * scale / mu + lr
    b1, b2 = betas
    tau_x = scale / mu
    if optimizer == "adamw" and gam > 0:
        tau_x = min(tau_x, 1.0 / gam)
    if optimizer in ("adam-l2", "rmsprop"):
        tau_x = scale / (mu + gam)
    return tau_x + lr / (1 - b1) + lr / (1 - b2)


def stationary_loss(optimizer: str, hessian, sigma: float, lr: float, method: str = "sde",
                    weight_decay: float = 0.0, *, noise="isotropic", betas=(0.9, 0.999),
                    eps: float = 1e-8, paths: int = 512, steps: int | None = None,
                    burn_in: int | None = None, substeps: int = 1, x0=None,
                    seed: int = 0, max_steps: int = 2_000_000) -> dict:
    """Stationary ``E[f - f_*]`` of ``optimizer`` on ``f(x) = x^T H x / 2``.

    ``optimizer``: ``"sgd"``, ``"signsgd"``, ``"adam"``, ``"adam-l2"`` (``torch.optim.Adam`` with
    ``weight_decay``: Adam on ``f + weight_decay ||x||^2 / 2``), ``"adamw"`` or ``"rmsprop"``
    (``alpha = betas[1]``, L2 ``weight_decay``).  ``hessian``: a
    symmetric positive-definite ``(d, d)`` tensor.  ``sigma``: standard deviation of the gradient
    noise -- ``N(0, sigma^2 I)`` by default; ``noise="loss-scaled"`` takes ``sigma^2 f(x) I``; a
    covariance ``C`` (tensor or ``dualdrop.diagnostics.LowRankCov``) takes ``sigma^2 C``.
    ``method="sde"`` simulates the optimizer's SDE (``dualdrop.dynamics.simulate_sde``, with
    ``substeps`` Euler--Maruyama steps per optimizer step); ``method="discrete"`` runs the torch
    optimizer with that noise added to every gradient (``run_discrete``).  ``steps``/``burn_in``
    default to ``15 tau / lr`` and ``5 tau / lr`` (module docstring); ``x0`` defaults to the
    minimum (to ``1/sqrt(d)`` per coordinate with loss-scaled noise, which vanishes there).

    Returns a dict: ``loss`` (the level), ``stderr``, ``bound`` (:func:`stationary_bound`; ``nan``
    unless the noise is isotropic), ``steps``, ``burn_in``, ``paths``, and the arguments.
    """
    check_optimizer(optimizer, weight_decay)
    if method not in ("sde", "discrete"):
        raise ValueError(f"method={method!r}; choose 'sde' or 'discrete'")
    sigma = check_positive("sigma", sigma, allow_zero=True)
    lr = check_positive("lr", lr)
    betas = check_betas(betas)
    H = check_hessian(hessian)
    nz = as_noise(noise, sigma)
    d = H.shape[0]
    c = curvature(H)
    if steps is None or burn_in is None:
        tau = relaxation_time(optimizer, c["mu"], max(nz.scale_hint(), 1e-12), lr,
                              weight_decay, betas)
        auto_burn = max(50, math.ceil(5 * tau / lr))
        auto_steps = auto_burn + max(100, math.ceil(10 * tau / lr))
        if steps is None:
            steps = auto_steps if burn_in is None else burn_in + auto_steps - auto_burn
        if burn_in is None:
            burn_in = min(auto_burn, steps // 3)
    steps = check_count("steps", steps)
    burn_in = check_count("burn_in", burn_in, low=0)
    if steps > max_steps:
        raise ValueError(f"steps={steps} exceeds max_steps={max_steps} (a slow relaxation: noise "
                         "scale large against mu, or beta2 close to 1); pass steps= and burn_in= "
                         "explicitly or raise max_steps")
    if burn_in >= steps:
        raise ValueError(f"burn_in={burn_in} must be below steps={steps}")
    named = noise if isinstance(noise, str) else None
    if x0 is None and named == "loss-scaled":
        x0 = torch.full((d,), 1 / math.sqrt(d), dtype=torch.float64)
    common = dict(noise=nz, weight_decay=weight_decay, betas=betas, eps=eps, paths=paths,
                  burn_in=burn_in, x0=x0, seed=seed)
    if method == "sde":
        res = simulate_sde(optimizer, H, lr, steps, substeps=substeps, **common)
    else:
        res = run_discrete(optimizer, H, lr, steps, **common)
    bound = (stationary_bound(optimizer, H, sigma, lr, weight_decay)
             if named == "isotropic" else float("nan"))
    return {"loss": res["loss"], "stderr": res["stderr"], "bound": bound, "steps": steps,
            "burn_in": burn_in, "paths": paths, "optimizer": optimizer, "method": method,
            "sigma": sigma, "lr": lr, "weight_decay": float(weight_decay)}
