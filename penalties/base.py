"""The separable-penalty interface every solver and wrapper in dualdrop consumes.

A penalty holds Omega in the unit convention of docs/theory.md section 1 (lambda outside, ``Omega(0) = 0``) and
exposes, elementwise on numpy arrays (scalars accepted):

``omega(w)``, ``f(eta)``, ``eta_hat(w)``, ``derivative(w)``, ``prox(v, t)``, ``keep_ratio(w, lam)``.

Penalties with a compiled kernel report it through ``kernel_spec()`` so that jitted solvers can
call ``penalties.kernels.*_scalar(code, params, ...)`` directly.
"""

from __future__ import annotations

import numpy as np

from . import kernels as K
from ._checks import as_positive_array, as_real_array, check_param, finish


class Penalty:
    """Base class of separable penalties ``sum_j Omega(w_j)``."""

    name: str = "penalty"
    is_convex: bool = False
    is_separable: bool = True
    #: constructor parameter names, in order (used by get_params / repr / pickling)
    _param_names: tuple = ()

    # ---- compiled description -------------------------------------------------------------
    def kernel_spec(self):
        """(code, params) for ``penalties.kernels``; ``None`` if the penalty has no kernel."""
        return None

    # ---- overridable numerics on validated float64 arrays -----------------------------------
    def _kernel(self, which, x, t=None):
        spec = self.kernel_spec()
        if spec is None:
            raise NotImplementedError(f"{type(self).__name__} has no compiled kernel for {which}")
        code, params = spec
        return K._map(which, code, params, x, t)

    def _omega(self, w):
        return self._kernel("omega", w)

    def _derivative(self, w):
        return self._kernel("derivative", w)

    def _eta_hat(self, w):
        return self._kernel("eta_hat", w)

    def _prox(self, v, t):
        return self._kernel("prox", v, t)

    def _f(self, eta):  # pragma: no cover - every concrete penalty defines it
        raise NotImplementedError

    # ---- public API -------------------------------------------------------------------------
    def omega(self, w):
        """Omega(w), elementwise; ``Omega(0) = 0``."""
        arr = as_real_array(w, "w")
        return finish(self._omega(arr), arr)

    def derivative(self, w):
        """Omega'(w) = w / eta_hat(w), elementwise (0 at w = 0: the minimum-norm subgradient)."""
        arr = as_real_array(w, "w")
        return finish(self._derivative(arr), arr)

    def eta_hat(self, w):
        """The optimal dual variable ``argmin_eta w^2/eta + f(eta)``, elementwise (may be inf)."""
        arr = as_real_array(w, "w")
        return finish(self._eta_hat(arr), arr)

    def f(self, eta):
        """The dual function f(eta) for eta > 0, elementwise."""
        arr = as_positive_array(eta, "eta")
        return finish(self._f(arr), arr)

    def prox(self, v, t=1.0):
        """``argmin_x 1/2 (x - v)^2 + t Omega(x)``, elementwise; ``t`` > 0 broadcasts against v."""
        arr = as_real_array(v, "v")
        tt = as_real_array(t, "t")
        if (tt < 0).any():
            raise ValueError("t (the prox step) must be >= 0")
        try:
            tb = np.broadcast_to(tt, arr.shape)
        except ValueError:
            raise ValueError(f"t of shape {tt.shape} does not broadcast to v of shape {arr.shape}") from None
        return finish(self._prox(arr, tb), arr)

    def keep_ratio(self, w, lam=1.0):
        """Dropout keep ratio ``alpha = eta_hat / (eta_hat + lam)`` implied by the penalty."""
        lam = check_param(lam, "lam", low=0.0)
        eta = np.asarray(self.eta_hat(w), dtype=float)
        # 1 / (1 + lam/eta), not eta / (eta + lam): the sum overflows for eta and lam near the
        # largest float; eta = 0 gives 0 and eta = inf gives 1 without a special case
        with np.errstate(divide="ignore", over="ignore"):
            alpha = 1.0 / (1.0 + lam / eta)
        return finish(alpha, eta)

    def value(self, w):
        """Sum of Omega over a vector (the penalty term of an objective, lambda excluded)."""
        return float(np.sum(self.omega(w)))

    def rescaled(self, c):
        """``(P, k)`` with ``Omega(c u) = c^k P.Omega(u)`` for every ``u`` (``c > 0``): the same
        family at another scale of its argument (L1: itself, ``k = 1``; LogSum: ``eps / c``,
        ``k = 0``; ...). A scale-free problem in extreme units can then be computed at unit scale
        (``dualdrop.linear`` does). ``None`` for a penalty without a scale parameter (the tabulated
        dropout penalties, penalties built from callables) or when the rescaled parameter would
        leave the floats."""
        return None

    def _rescaled_with(self, k, **params):
        """``(type(self)(**changed params), k)``, or ``None`` if a changed parameter is refused
        (e.g. it underflowed to 0)."""
        try:
            return type(self)(**{**self.get_params(), **params}), k
        except (ValueError, OverflowError, ZeroDivisionError):
            return None

    # ---- parameters, equality, pickling ---------------------------------------------------
    def get_params(self, deep=True) -> dict:
        """Constructor parameters (scikit-learn style, so estimators can clone and grid-search)."""
        return {k: getattr(self, k) for k in self._param_names}

    def set_params(self, **params):
        """Change constructor parameters, validated by the constructor; returns self."""
        unknown = set(params) - set(self._param_names)
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no parameter(s) {sorted(unknown)}; valid: {list(self._param_names)}"
            )
        fresh = type(self)(**{**self.get_params(), **params})
        self.__dict__.update(fresh.__dict__)
        return self

    @property
    def params(self) -> dict:
        return self.get_params()

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_params() == other.get_params()

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.get_params().items()))))

    def __reduce__(self):
        return (_rebuild, (type(self), self.get_params()))


def _rebuild(cls, params):
    return cls(**params)


class KernelPenalty(Penalty):
    """A penalty whose numerics all live in ``penalties.kernels``: subclasses set ``_code`` and
    return the parameter vector from ``_kernel_params``."""

    _code: int = 0

    def _kernel_params(self) -> np.ndarray:
        return np.zeros(1)

    def kernel_spec(self):
        return self._code, np.ascontiguousarray(self._kernel_params(), dtype=np.float64)
