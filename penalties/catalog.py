"""Classical sparsity-inducing penalties with closed forms (docs/theory.md section 3).

All are expressed in the unit convention ``Omega(w) = 1/2 min_eta [w^2/eta + f(eta)]`` with
``Omega(0) = 0``; lambda multiplies the penalty outside.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import kernels as K
from ._checks import check_param
from .base import KernelPenalty


class L1(KernelPenalty):
    """Lasso penalty ``Omega = |w|``, ``eta_hat = |w|``, ``f(eta) = eta`` (Tibshirani 1996)."""

    name = "l1"
    is_convex = True
    _code = K.L1

    def rescaled(self, c):
        return self, 1.0

    def _f(self, eta):
        return eta.copy()


class Lp(KernelPenalty):
    """Bridge penalty ``Omega = |w|^p / p`` for 0 < p < 2 (Frank & Friedman 1993).

    ``eta_hat = |w|^(2-p)``, ``f(eta) = eta^q / q`` with ``q = p / (2 - p)``. Convex for p >= 1.
    """

    name = "lp"
    _param_names = ("p",)
    _code = K.LP

    def __init__(self, p=0.5):
        self.p = check_param(p, "p", low=0.0, high=2.0)
        self.is_convex = self.p >= 1.0

    def _kernel_params(self):
        return np.array([self.p])

    def rescaled(self, c):
        return self, self.p

    def _f(self, eta):
        q = self.p / (2.0 - self.p)
        return eta**q / q


class _EpsPenalty(KernelPenalty):
    """Shared constructor of the penalties with one smoothing parameter ``eps > 0``."""

    _param_names = ("eps",)

    def __init__(self, eps=1.0):
        self.eps = check_param(eps, "eps", low=0.0)

    def _kernel_params(self):
        return np.array([self.eps])


class LogSum(_EpsPenalty):
    """Log-sum penalty ``Omega = log(|w| + eps) - log(eps)`` (Candes, Wakin & Boyd 2008).

    Shifted by ``log eps`` so that ``Omega(0) = 0`` (the classical form is unshifted).
    ``eta_hat = |w| (|w| + eps)`` and, with ``s = sqrt(eps^2 + 4 eta)``,
    ``f(eta) = 2 log((s + eps) / (2 eps)) - (s - eps)^2 / (4 eta)`` (the paper's f minus 2 log eps, so that Omega(0) = 0).
    """

    name = "logsum"
    _code = K.LOGSUM

    def rescaled(self, c):  # log(1 + c u / eps) = log(1 + u / (eps / c))
        return self._rescaled_with(0.0, eps=self.eps / c)

    def _f(self, eta):
        eps = self.eps
        s = np.sqrt(eps * eps + 4.0 * eta)
        # (s - eps) = 4 eta / (s + eps): no cancellation for small eta
        return 2.0 * np.log1p(2.0 * eta / (eps * (s + eps))) - 4.0 * eta / (s + eps) ** 2


class Log2Sum(_EpsPenalty):
    """Log-of-squares penalty ``Omega = log(w^2 + eps) - log(eps)``; ``eta_hat = (w^2 + eps)/2``.

    ``f(eta) = 0`` for ``eta <= eps/2`` and ``2 log(2 eta / eps) - 2 + eps / eta`` beyond. Smooth
    at 0 (it shrinks but does not zero out small weights).
    """

    name = "log2sum"
    _code = K.LOG2SUM

    def rescaled(self, c):  # log(1 + c^2 u^2 / eps) = log(1 + u^2 / (eps / c^2))
        return self._rescaled_with(0.0, eps=self.eps / c / c)

    def _f(self, eta):
        eps = self.eps
        r = np.maximum(2.0 * eta / eps, 1.0)
        return np.where(2.0 * eta > eps, 2.0 * np.log(r) - 2.0 + 2.0 / r, 0.0)


class SCAD(KernelPenalty):
    """Smoothly clipped absolute deviation (Fan & Li 2001), divided by ``lam``:

    ``|w|`` up to ``lam``, ``(2 a lam |w| - w^2 - lam^2) / (2 (a-1) lam)`` up to ``a lam``, then the
    constant ``(a+1) lam / 2``. ``eta_hat = |w|`` below lam, ``(a-1) lam |w| / (a lam - |w|)`` up to
    ``a lam``, infinite beyond. Requires ``a > 1`` (``a > 2`` is the classical choice).
    """

    name = "scad"
    _param_names = ("a", "lam")
    _code = K.SCAD

    def __init__(self, a=3.7, lam=1.0):
        self.a = check_param(a, "a", low=1.0)
        self.lam = check_param(lam, "lam", low=0.0)

    def _kernel_params(self):
        return np.array([self.a, self.lam])

    def rescaled(self, c):  # every piece is c times the penalty with lam / c
        return self._rescaled_with(1.0, lam=self.lam / c)

    def _f(self, eta):
        a, lam = self.a, self.lam
        s = a * lam * eta / ((a - 1.0) * lam + eta)
        mid = (2.0 * a * lam * s - s * s - lam * lam) / ((a - 1.0) * lam) - s * s / eta
        return np.where(eta <= lam, eta, mid)


class MCP(KernelPenalty):
    """Minimax concave penalty (Zhang 2010), divided by ``lam``; with ``A = a lam``:

    ``Omega = |w| - w^2 / (2A)`` for ``|w| <= A``, ``A/2`` beyond; ``eta_hat = A|w| / (A - |w|)``
    (infinite beyond A); ``f(eta) = A eta / (eta + A)``. As ``a -> inf`` it tends to the l1
    penalty (``Omega = |w|``, ``eta_hat = |w|``, ``f(eta) = eta``); ``a = inf`` itself is refused,
    naming :class:`L1`, the penalty it would be.
    """

    name = "mcp"
    _param_names = ("a", "lam")
    _code = K.MCP

    def __init__(self, a=3.0, lam=1.0):
        if isinstance(a, numbers.Real) and not isinstance(a, bool) and a == float("inf"):
            raise ValueError("a must be finite, got inf: MCP with a = inf is the l1 penalty; use "
                             "penalty 'l1' (penalties.L1()) instead")
        self.a = check_param(a, "a", low=0.0)
        self.lam = check_param(lam, "lam", low=0.0)

    def _kernel_params(self):
        return np.array([self.a, self.lam])

    def rescaled(self, c):  # c|u| - c^2 u^2 / (2A) = c (|u| - u^2 / (2 A / c)), A = a lam
        return self._rescaled_with(1.0, lam=self.lam / c)

    def _f(self, eta):
        A = self.a * self.lam
        return A * eta / (eta + A)
