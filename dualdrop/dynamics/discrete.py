"""The discrete optimizers themselves, run on many paths with injected gradient noise.

``run_discrete`` drives ``torch.optim.SGD``, ``Adam`` (``weight_decay = gamma``: the L2 term
``gamma x`` added to the gradient, i.e. Adam on ``f + gamma ||x||^2 / 2``), ``AdamW``
(decoupled decay ``x <- x (1 - eta gamma)``), ``RMSprop`` and :class:`SignSGD`
(``x <- x - eta sign(g)``; torch has no SignSGD) on a ``(P, d)`` parameter.  Each step the
exact gradient of the objective gets ``xi ~ N(0, Sigma(x))`` added before ``optimizer.step()``.
All these updates act coordinate-wise, so the rows of the one parameter are ``P`` independent
runs of the optimizer.
"""

from __future__ import annotations

import torch

from dualdrop.dynamics._core import TimeAverage, check_optimizer, check_positive, setup_run


class SignSGD(torch.optim.Optimizer):
    """``x <- x - lr * sign(grad)`` (Bernstein et al.'s signSGD without momentum).

    ``weight_decay`` adds ``weight_decay * x`` to the gradient before the sign.
    """

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.0):
        check_positive("lr", lr)
        check_positive("weight_decay", weight_decay, allow_zero=True)
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"]:
                    g = g + group["weight_decay"] * p
                p.add_(torch.sign(g), alpha=-group["lr"])
        return loss


def make_optimizer(optimizer: str, params, lr: float, weight_decay: float = 0.0,
                   betas=(0.9, 0.999), eps: float = 1e-8) -> torch.optim.Optimizer:
    """The torch optimizer behind each name (``"adam"`` and ``"adam-l2"`` are both ``Adam``;
    ``"rmsprop"`` is ``RMSprop`` with ``alpha = betas[1]``)."""
    check_optimizer(optimizer, weight_decay)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "signsgd":
        return SignSGD(params, lr=lr)
    if optimizer in ("adam", "adam-l2"):
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if optimizer == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=betas[1], eps=eps,
                                   weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def run_discrete(optimizer: str, loss, lr: float, steps: int, *, noise="isotropic",
                 sigma: float = 1.0, weight_decay: float = 0.0, betas=(0.9, 0.999),
                 eps: float = 1e-8, paths: int = 512, burn_in: int = 0, x0=None,
                 f_star: float = 0.0, seed: int = 0, dtype=torch.float64,
                 record_every: int = 0, z_source=None) -> dict:
    """Run ``paths`` copies of the torch optimizer for ``steps`` steps; same arguments and
    result keys as :func:`dualdrop.dynamics.simulate_sde` (the loss is averaged over the
    iterates ``x_k`` with ``k > burn_in``).  ``z_source(k) -> (P, width)``: the standard normals
    of step ``k`` (default: a generator seeded with ``seed``)."""
    obj, nz, lr, betas, eps, x0 = setup_run(optimizer, loss, lr, steps, paths, burn_in, betas,
                                            eps, weight_decay, noise, sigma, x0, f_star, dtype)
    x = torch.nn.Parameter(x0)
    d = x.shape[1]
    opt = make_optimizer(optimizer, [x], lr, weight_decay, betas, eps)
    width = nz.width(d)
    gen = torch.Generator().manual_seed(seed)
    avg = TimeAverage(paths, dtype)
    times, trace = [], []
    f, g = obj.value_and_grad(x.detach())
    for k in range(steps):
        z = z_source(k) if z_source is not None else torch.randn(paths, width, generator=gen,
                                                                  dtype=dtype)
        x.grad = g + nz.sample(z, f)
        opt.step()
        f, g = obj.value_and_grad(x.detach())
        if k >= burn_in:
            avg.add(f)
        if record_every and (k + 1) % record_every == 0:
            times.append((k + 1) * lr)
            trace.append(float(f.mean()))
    out = {"x": x.detach().clone(), "final_loss": f}
    if avg.count:
        out.update(avg.result())
    if record_every:
        out["times"], out["trace"] = times, trace
    return out
