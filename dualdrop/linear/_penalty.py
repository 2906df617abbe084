"""Resolving the ``penalty`` argument and asking what a penalty object can do.

The penalty objects themselves live in the top-level :mod:`penalties` package (the numeric core);
this module only turns a name plus parameters into an object and answers capability questions
the solvers need (does it have a compiled prox? is it separable? is it concave in ``|w|``?).

It also holds :class:`WithRidge`, a penalty plus a ridge term,
``rho Omega(w) + (1 - rho)/2 w^2`` with ``rho = l1_ratio``: scikit-learn's ElasticNet
parametrization for ``Omega = |w|`` (Zou & Hastie 2005), the Mnet of Huang et al. (2016) for MCP,
and the same added ridge for any penalty of the catalog. Its prox is the penalty's own prox with
rescaled arguments, ``prox_{t(rho Omega + (1-rho)/2 x^2)}(v) = prox_{t rho Omega / s}(v / s)`` with
``s = 1 + t (1 - rho)``; that formula lives in one place, the compiled kernel ``MIXED`` of
``penalties.kernels``, which every solver and the object's own ``prox`` call.
"""

from __future__ import annotations

import numpy as np

import penalties
from penalties import kernels as _K
from penalties.base import KernelPenalty

__all__ = [
    "resolve_penalty",
    "kernel_spec",
    "is_separable",
    "right_derivative_at_zero",
    "is_concave_in_abs",
    "smallest_zero_alpha",
    "WithRidge",
    "with_ridge",
]


FOLLOW_ALPHA = "alpha"


def follows_alpha(penalty_params) -> bool:
    """Whether ``penalty_params`` asks for the concavity scale to follow alpha
    (``{"lam": "alpha"}``)."""
    return isinstance(penalty_params, dict) and penalty_params.get("lam") == FOLLOW_ALPHA


def resolve_penalty(penalty, penalty_params=None, alpha=None):
    """Return a penalty object from a name (with ``penalty_params``) or an object.

    ``penalty_params={"lam": "alpha"}`` (MCP, SCAD) sets ``lam = alpha``: with the catalog's
    ``Omega = MCP(w; lam, a) / lam`` the fitted penalty ``alpha Omega`` is then the classical
    ``MCP(w; alpha, a)`` of ncvreg, glmnet-style paths and skglm (threshold and concavity region
    both scale with alpha); MCP then requires ``a > 1`` (see the estimators' docstring).
    Raises ``ValueError`` for an unknown name or bad parameters, ``TypeError`` for a wrong type.
    """
    params = {} if penalty_params is None else penalty_params
    if not isinstance(params, dict):
        raise TypeError(
            f"penalty_params must be a dict of the penalty's parameters or None, got "
            f"{type(penalty_params).__name__}"
        )
    if follows_alpha(params):
        if alpha is None:
            raise ValueError('penalty_params={"lam": "alpha"} needs the value of alpha')
        params = {**params, "lam": float(alpha) if alpha > 0 else 1.0}
        if penalty == "mcp" and float(params.get("a", 3.0)) <= 1.0:
            raise ValueError(
                f"penalty='mcp' with lam following alpha needs a > 1 (got a={params['a']!r}): "
                "on unit-norm columns the coordinate problem is then strictly convex, as in "
                "ncvreg and skglm; use a > 1 or a fixed lam")
    if isinstance(penalty, str):
        try:
            return penalties.get(penalty, **params)
        except TypeError as exc:
            raise ValueError(
                f"penalty={penalty!r} does not accept penalty_params={params!r}: {exc}"
            ) from exc
    if hasattr(penalty, "omega") and hasattr(penalty, "prox"):
        if params:
            raise ValueError(
                "penalty_params is only used with a penalty name; pass the parameters to the "
                "penalty object's constructor instead"
            )
        return penalty
    raise TypeError(
        "penalty must be a penalty name such as 'l1', 'logsum', 'mcp' or a penalty object from "
        f"the `penalties` package, got {type(penalty).__name__}"
    )


def penalty_name(P) -> str:
    return str(getattr(P, "name", type(P).__name__))


def kernel_spec(P):
    """``(code, params)`` for the numba kernels, or ``None`` if the penalty has none."""
    spec = getattr(P, "kernel_spec", None)
    if spec is None:
        return None
    try:
        code, params = spec()
    except (NotImplementedError, TypeError, ValueError):
        return None
    return int(code), np.ascontiguousarray(params, dtype=np.float64)


def is_separable(P) -> bool:
    """Separable penalties act coordinate by coordinate; the top-k indicator does not."""
    sep = getattr(P, "is_separable", None)
    if sep is not None:
        return bool(sep)
    return penalty_name(P) not in ("hard_threshold", "hardthreshold", "top_k")


def right_derivative_at_zero(P) -> float:
    """``Omega'(0+)`` (``inf`` for Lp with p < 1, ``0`` for penalties smooth at 0)."""
    tiny = 1e-150
    d = float(np.asarray(P.derivative(np.array([tiny]))).ravel()[0])
    return abs(d) if np.isfinite(d) else np.inf


def abs_derivative(P, w):
    """``Omega'(|w|) >= 0`` with the right derivative at 0 (reweighted-l1 weights)."""
    a = np.maximum(np.abs(w), 1e-300)
    d = np.abs(np.asarray(P.derivative(a), dtype=np.float64))
    d[np.isnan(d)] = np.inf
    return d


def smallest_zero_alpha(all_zero, guess, fallback=None):
    """The smallest ``alpha`` with ``all_zero(alpha)`` (a condition that holds from some
    threshold on: every coordinate's or group's prox-gradient step from 0 stays at 0): bracket
    ``[lo, hi]`` by factors of 10 from ``guess``, then bisect on a log scale to 1e-13 relative.
    ``0.0`` when every ``alpha > 0`` qualifies; ``fallback`` (default ``guess``) when none
    does."""
    fallback = guess if fallback is None else fallback
    lo = hi = guess
    if all_zero(hi):
        for _ in range(700):
            lo = hi / 10.0
            if lo == 0.0 or not all_zero(lo):
                break
            hi = lo
        else:
            return 0.0
    else:
        for _ in range(700):
            lo, hi = hi, 10.0 * hi
            if not np.isfinite(hi):
                return fallback  # no alpha gives exact zeros
            if all_zero(hi):
                break
        else:
            return fallback
    for _ in range(200):
        mid = np.sqrt(lo) * np.sqrt(hi) if lo > 0 else 0.5 * hi  # lo * hi can overflow
        if all_zero(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-13 * hi:
            break
    return float(hi)


def is_concave_in_abs(P, scale=1.0) -> bool:
    """Numerical check that ``Omega'(t)`` is nonincreasing on ``t > 0`` (so ``Omega`` is concave
    in ``|w|`` and reweighted l1 is a majorization-minimization scheme)."""
    t = scale * np.logspace(-8, 4, 400)
    d = abs_derivative(P, t)
    d = np.where(np.isfinite(d), d, np.finfo(float).max)
    return bool(np.all(np.diff(d) <= 1e-10 * (1.0 + np.abs(d[:-1]))))


class WithRidge(KernelPenalty):
    """``Omega_mixed(w) = l1_ratio * Omega(w) + ridge_scale (1 - l1_ratio) / 2 * w^2`` for a
    penalty ``Omega`` with a compiled kernel (see the module docstring). ``l1_ratio = 1`` is
    ``Omega`` itself, ``l1_ratio = 0`` pure ridge; ``ridge_scale`` (default 1) is what a
    rescaling leaves of the ridge's weight (:meth:`rescaled`)."""

    _param_names = ("penalty", "l1_ratio", "ridge_scale")
    _code = _K.MIXED

    def __init__(self, penalty, l1_ratio=0.5, ridge_scale=1.0):
        spec = kernel_spec(penalty) if hasattr(penalty, "omega") else None
        if spec is None or spec[0] == _K.MIXED:
            raise ValueError(
                f"an added ridge term (l1_ratio < 1) needs a separable penalty with a compiled "
                f"kernel (every name of penalties.available() but 'hard_threshold'), got "
                f"{penalty!r}")
        l1_ratio = float(l1_ratio)
        if not 0.0 <= l1_ratio <= 1.0:
            raise ValueError(f"l1_ratio must be in [0, 1], got {l1_ratio!r}")
        ridge_scale = float(ridge_scale)
        if not (np.isfinite(ridge_scale) and ridge_scale > 0.0):
            raise ValueError(f"ridge_scale must be a finite number > 0, got {ridge_scale!r}")
        self.penalty = penalty
        self.l1_ratio = l1_ratio
        self.ridge_scale = ridge_scale
        self._inner = spec
        self.is_convex = bool(getattr(penalty, "is_convex", False)) or l1_ratio == 0.0
        self.name = f"{penalty_name(penalty)}+ridge"

    def _kernel_params(self):
        code, params = self._inner
        return np.concatenate([[self.l1_ratio, (1.0 - self.l1_ratio) * self.ridge_scale,
                                float(code)], params])

    def rescaled(self, c):
        """``rho Omega(c u) + s (1 - rho)/2 c^2 u^2 = c^k [rho Omega'(u) + s c^(2-k) (1 - rho)/2
        u^2]`` with ``(Omega', k)`` the inner penalty's rescaling."""
        inner = getattr(self.penalty, "rescaled", None)
        out = inner(c) if inner is not None else None
        if out is None:
            return None
        P, k = out
        try:
            return WithRidge(P, self.l1_ratio, self.ridge_scale * float(c) ** (2.0 - k)), k
        except (ValueError, OverflowError):
            return None

    def _f(self, eta):  # the dual function of the mixture is not needed by any solver here
        raise NotImplementedError("WithRidge has no closed-form dual function f")


def with_ridge(P, l1_ratio):
    """``P`` itself when ``l1_ratio == 1``, else :class:`WithRidge` ``(P, l1_ratio)``."""
    return P if float(l1_ratio) == 1.0 else WithRidge(P, l1_ratio)
