"""Objectives, gradient-noise models and argument checks shared by the SDE and discrete runners.

Both runners move ``P`` independent paths at once: the state is a ``(P, d)`` tensor, the
objective maps it to ``(P,)`` values and ``(P, d)`` gradients, and the noise model draws
``(P, d)`` gradient perturbations ``xi`` with ``Cov(xi) = Sigma(x)``.  Three noise models:

* :class:`Isotropic` -- ``Sigma = sigma^2 I``;
* :class:`LossScaled` -- ``Sigma(x) = sigma^2 (f(x) - f_*) I``, the model under which
  Compagnoni et al. write SignSGD's SDE with ``Y = grad f / (sqrt(2 (f - f_*)) sigma)``;
* :class:`Covariance` -- ``Sigma = sigma^2 C`` for a fixed PSD ``C``, e.g. a minibatch- or
  dropout-noise covariance measured by :func:`dualdrop.diagnostics.sgd_noise_cov` /
  :func:`~dualdrop.diagnostics.dropout_noise_cov` (a dense tensor or a ``LowRankCov`` factor).

SignSGD needs the covariance of ``sign(g)``, ``g ~ N(grad f, Sigma)``.  Its diagonal is exact,
``1 - Erf(m_i)^2`` with ``m_i = d_i f / sqrt(2 Sigma_ii)``.  For a correlated ``Sigma`` the
off-diagonal entries have no closed form when the mean is nonzero; :class:`Covariance` uses the
arcsine law of the zero-mean case, ``(2/pi) arcsin(rho_ij)``, scaled by the exact marginal
standard deviations, which is exact at ``grad f = 0`` (the stationary regime near a minimum) and
for uncorrelated noise.
"""

from __future__ import annotations

import math
import numbers

import torch

#: the optimizers whose SDE and discrete versions this package provides
OPTIMIZERS = ("sgd", "signsgd", "adam", "adam-l2", "adamw", "rmsprop")


# --------------------------------------------------------------------------- argument checks
def check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}; expected a finite real number")
    if value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name}={value!r}; expected a {kind} number")
    return float(value)


def check_count(name: str, value, *, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name}={value!r}; expected an int >= {low}")
    return int(value)


def check_optimizer(optimizer: str, weight_decay: float) -> str:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    weight_decay = check_positive("weight_decay", weight_decay, allow_zero=True)
    if weight_decay and optimizer in ("adam", "signsgd"):
        hint = ("'adam-l2' (decay in the gradient) or 'adamw' (decoupled)" if optimizer == "adam"
                else "0 (SignSGD is simulated without decay)")
        raise ValueError(f"weight_decay={weight_decay} with optimizer={optimizer!r}; use {hint}")
    return optimizer


def check_betas(betas) -> tuple[float, float]:
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"betas={betas!r}; expected a pair (beta1, beta2)")
    for i, b in enumerate(betas):
        if isinstance(b, bool) or not isinstance(b, numbers.Real) or not 0 <= b < 1:
            raise ValueError(f"betas[{i}]={b!r}; expected a number in [0, 1)")
    return float(betas[0]), float(betas[1])


def check_hessian(hessian) -> torch.Tensor:
    """A symmetric positive-definite ``(d, d)`` tensor (a 0-d tensor or a float is ``d = 1``)."""
    if isinstance(hessian, numbers.Real) and not isinstance(hessian, bool):
        hessian = torch.tensor(float(hessian))
    if not isinstance(hessian, torch.Tensor):
        raise TypeError(f"hessian must be a torch.Tensor (d, d), got {type(hessian).__name__}")
    H = hessian.detach().to(torch.float64)
    if H.ndim == 0:
        H = H.reshape(1, 1)
    if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape[0] < 1:
        raise ValueError(f"hessian must be a square matrix (d, d), got shape {tuple(H.shape)}")
    if not torch.isfinite(H).all():
        raise ValueError("hessian has non-finite entries")
    if not torch.allclose(H, H.T, rtol=1e-8, atol=1e-10 * float(H.abs().max())):
        raise ValueError("hessian must be symmetric; pass (H + H.T) / 2")
    mu = float(torch.linalg.eigvalsh(H)[0])
    if mu <= 0:
        raise ValueError(f"hessian must be positive definite (smallest eigenvalue {mu:.3g}); "
                         "a stationary loss level needs a strict minimum")
    return H


# --------------------------------------------------------------------------- objectives
class Objective:
    """``f`` on a batch of paths: ``value_and_grad(x (P, d)) -> (f - f_* (P,), grad (P, d))``.

    ``Objective.quadratic(H)`` is ``f(x) = x^T H x / 2`` (``f_* = 0`` at ``x_* = 0``) with its
    gradient in closed form; ``Objective(loss, f_star)`` takes any differentiable
    ``loss(x (P, d)) -> (P,)`` (each row must depend on its own path only) and differentiates it
    with autograd.
    """

    def __init__(self, loss, f_star: float = 0.0, dim: int | None = None):
        if not callable(loss):
            raise TypeError("loss must be a Hessian tensor or a callable loss(x (P, d)) -> (P,)")
        self.loss, self.H = loss, None
        self.f_star = float(f_star)
        self.dim = dim

    @classmethod
    def quadratic(cls, hessian) -> "Objective":
        H = check_hessian(hessian)
        obj = cls(lambda x: 0.5 * ((x @ H.to(x.dtype)) * x).sum(-1), 0.0, H.shape[0])
        obj.H = H
        return obj

    def value_and_grad(self, x: torch.Tensor):
        if self.H is not None:
            g = x @ self.H.to(x.dtype)
            return 0.5 * (g * x).sum(-1), g
        with torch.enable_grad():
            xr = x.detach().requires_grad_(True)
            f = self.loss(xr)
            if not isinstance(f, torch.Tensor) or f.shape != x.shape[:1]:
                raise ValueError(f"loss(x) must return a tensor of shape ({x.shape[0]},) for x of "
                                 f"shape {tuple(x.shape)}, got "
                                 f"{getattr(f, 'shape', type(f).__name__)}")
            (g,) = torch.autograd.grad(f.sum(), xr)
        return f.detach() - self.f_star, g.detach()


def as_objective(loss, f_star: float = 0.0) -> Objective:
    if isinstance(loss, Objective):
        return loss
    if isinstance(loss, (torch.Tensor, numbers.Real)) and not isinstance(loss, bool):
        return Objective.quadratic(loss)
    return Objective(loss, f_star)


# --------------------------------------------------------------------------- noise models
class GradientNoise:
    """Base class: ``variance(f)`` is ``diag Sigma`` per path, ``sample(z, f)`` ``Sigma^{1/2} z``.

    ``f`` is the excess loss ``f - f_*`` per path, shape ``(P,)``; ``z`` is standard normal of
    shape ``(P, width(d))``.
    """

    correlation = None   # (d, d) correlation factor for SignSGD's diffusion; None: independent

    def width(self, d: int) -> int:
        return d

    def variance(self, f: torch.Tensor, d: int) -> torch.Tensor:
        raise NotImplementedError

    def sample(self, z: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def scale_hint(self) -> float:
        """A typical per-coordinate noise standard deviation (for default run lengths)."""
        raise NotImplementedError


class Isotropic(GradientNoise):
    """``Sigma = sigma^2 I``."""

    def __init__(self, sigma: float):
        self.sigma = check_positive("sigma", sigma, allow_zero=True)

    def variance(self, f, d):
        return torch.full((f.shape[0], d), self.sigma ** 2, dtype=f.dtype)

    def sample(self, z, f):
        return self.sigma * z

    def scale_hint(self):
        return self.sigma

    def __repr__(self):
        return f"Isotropic(sigma={self.sigma:g})"


class LossScaled(GradientNoise):
    """``Sigma(x) = sigma^2 (f(x) - f_*) I``: noise that vanishes at the minimum."""

    def __init__(self, sigma: float):
        self.sigma = check_positive("sigma", sigma, allow_zero=True)

    def variance(self, f, d):
        return (self.sigma ** 2 * f.clamp_min(0.0)).unsqueeze(-1).expand(-1, d)

    def sample(self, z, f):
        return self.sigma * f.clamp_min(0.0).sqrt().unsqueeze(-1) * z

    def scale_hint(self):
        return self.sigma

    def __repr__(self):
        return f"LossScaled(sigma={self.sigma:g})"


class Covariance(GradientNoise):
    """``Sigma = sigma^2 C`` for a fixed PSD ``C``: a dense ``(d, d)`` tensor or a ``LowRankCov``.

    A ``LowRankCov`` ``C = U U^T`` is sampled as ``U z`` with ``z`` of width ``rank``; a dense
    ``C`` through its symmetric square root (eigenvalues below zero from round-off clipped).
    """

    def __init__(self, cov, sigma: float = 1.0):
        from dualdrop.diagnostics import LowRankCov

        self.sigma = check_positive("sigma", sigma, allow_zero=True)
        if isinstance(cov, LowRankCov):
            U = cov.U.detach().to(torch.float64)
        elif isinstance(cov, torch.Tensor):
            C = cov.detach().to(torch.float64)
            if C.ndim != 2 or C.shape[0] != C.shape[1]:
                raise ValueError(f"cov must be a square (d, d) matrix, got shape {tuple(C.shape)}")
            if not torch.allclose(C, C.T, atol=1e-10 * float(C.abs().max()) + 1e-300):
                raise ValueError("cov must be symmetric")
            w, Q = torch.linalg.eigh(C)
            if float(w[0]) < -1e-8 * max(float(w[-1]), 0.0):
                raise ValueError("cov must be positive semi-definite (eigenvalue "
                                 f"{float(w[0]):.3g})")
            U = Q * w.clamp_min(0).sqrt()
        else:
            raise TypeError("cov must be a torch.Tensor (d, d) or a "
                            f"dualdrop.diagnostics.LowRankCov, got {type(cov).__name__}")
        self.U = U
        self.diag = (U ** 2).sum(1)
        sd = self.diag.sqrt()
        if float(sd.min()) <= 0:
            raise ValueError("cov has a zero variance on some coordinate; restrict the problem to "
                             "the coordinates that carry noise")
        rho = ((U @ U.T) / (sd[:, None] * sd[None, :])).clamp(-1, 1)
        R = (2 / math.pi) * torch.arcsin(rho)
        w, Q = torch.linalg.eigh(0.5 * (R + R.T))
        self.correlation = Q * w.clamp_min(0).sqrt()

    def width(self, d):
        if d != self.U.shape[0]:
            raise ValueError(f"cov is {self.U.shape[0]} x {self.U.shape[0]} but the problem has "
                             f"d={d} coordinates")
        return self.U.shape[1]

    def variance(self, f, d):
        return (self.sigma ** 2 * self.diag.to(f.dtype)).expand(f.shape[0], d)

    def sample(self, z, f):
        return self.sigma * z @ self.U.T.to(z.dtype)

    def scale_hint(self):
        return self.sigma * float(self.diag.max().sqrt())

    def __repr__(self):
        return f"Covariance(d={self.U.shape[0]}, rank<={self.U.shape[1]}, sigma={self.sigma:g})"


def as_noise(noise, sigma: float) -> GradientNoise:
    """``noise`` is ``"isotropic"``, ``"loss-scaled"``, a covariance (tensor / ``LowRankCov``,
    scaled by ``sigma^2``) or a :class:`GradientNoise`."""
    if isinstance(noise, GradientNoise):
        return noise
    if noise == "isotropic":
        return Isotropic(sigma)
    if noise == "loss-scaled":
        return LossScaled(sigma)
    if isinstance(noise, torch.Tensor) or type(noise).__name__ == "LowRankCov":
        return Covariance(noise, sigma)
    raise ValueError(f"noise={noise!r}; expected 'isotropic', 'loss-scaled', a covariance "
                     "(torch.Tensor or LowRankCov) or a GradientNoise")


def start(x0, dim: int, paths: int, dtype) -> torch.Tensor:
    """The ``(P, d)`` start: ``x0`` of shape ``(d,)`` copied to every path, or ``(P, d)``."""
    if x0 is None:
        return torch.zeros(paths, dim, dtype=dtype)
    x0 = torch.as_tensor(x0, dtype=dtype)
    if x0.shape == (dim,):
        return x0.expand(paths, dim).clone()
    if x0.shape == (paths, dim):
        return x0.clone()
    raise ValueError(f"x0 must have shape ({dim},) or (paths={paths}, {dim}), got "
                     f"{tuple(x0.shape)}")


def setup_run(optimizer, loss, lr, steps, paths, burn_in, betas, eps, weight_decay, noise,
              sigma, x0, f_star, dtype):
    """Checks shared by the SDE and discrete runners; returns ``(objective, noise model, lr,
    betas, eps, start (P, d))``."""
    check_optimizer(optimizer, weight_decay)
    lr = check_positive("lr", lr)
    check_count("steps", steps)
    paths = check_count("paths", paths)
    check_count("burn_in", burn_in, low=0)
    betas = check_betas(betas)
    eps = check_positive("eps", eps, allow_zero=True)
    obj = as_objective(loss, f_star)
    nz = as_noise(noise, sigma)
    d = obj.dim if obj.dim is not None else (torch.as_tensor(x0).shape[-1] if x0 is not None
                                            else None)
    if d is None:
        raise ValueError("x0 is required with a callable loss (it gives the dimension)")
    nz.width(d)                                            # checks a covariance's size
    return obj, nz, lr, betas, eps, start(x0, d, paths, dtype)


class TimeAverage:
    """Per-path running mean of the excess loss over the steps after burn-in."""

    def __init__(self, paths: int, dtype):
        self.sum = torch.zeros(paths, dtype=dtype)
        self.count = 0

    def add(self, f: torch.Tensor, weight: float = 1.0):
        self.sum += weight * f
        self.count += weight

    def result(self) -> dict:
        if self.count == 0:
            raise ValueError("no step after burn_in: raise steps or lower burn_in")
        per_path = self.sum / self.count
        P = per_path.shape[0]
        se = float(per_path.std() / math.sqrt(P)) if P > 1 else float("nan")
        return {"loss": float(per_path.mean()), "stderr": se, "per_path": per_path}
