"""Datafits: the smooth loss ``L(w, b)`` of a linear model, as a function of ``z = X w + b``.

The two classical datafits live here; the other families (Poisson, Gamma, Huber, quantile, Cox,
multinomial) are one module each in :mod:`dualdrop.linear.families`, registered by name below
(``get_datafit("poisson")``). All are averaged over the ``n`` samples so that ``lambda``
(``alpha``) means the same thing at every sample size:

- :class:`Quadratic` -- least squares ``L = (1/2n) ||y - X w - b||^2``;
- :class:`Logistic` -- binary logistic ``L = (1/n) sum_i log(1 + exp(-y_i z_i))`` with ``y_i`` in
  ``{-1, +1}``; with sample weights ``v_i >= 0`` the weighted average
  ``L = (1 / sum_i v_i) sum_i v_i log(1 + exp(-y_i z_i))`` (scikit-learn's convention for Lasso
  and ElasticNet: integer weights are row repetitions, a zero weight removes the row, and
  ``alpha`` keeps its meaning). Stored normalized to mean 1, ``sw = v n / sum v``, so that
  ``L = (1/n) sum_i sw_i loss_i``: the weights multiply ``dL/dz``, ``d2L/dz2`` and the
  coordinate Lipschitz constants ``curvature * sum_i sw_i x_ij^2 / n``.

Weighted least squares needs no datafit of its own: it is the unweighted problem on the rows
scaled by ``sqrt(sw_i)`` (see ``_fitdata.LeastSquaresData``), so every solver, the compiled
ones included, handles it unchanged.

A datafit only sees the linear predictor ``z``; the design enters through :mod:`._design` (dense
numpy or ``scipy.sparse`` CSC). Every solver uses these objects, and the compiled solvers use the
integer ``code`` to select the same formulas in numba (see ``_jit.py``).
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from scipy.special import expit, log_expit


__all__ = ["Datafit", "WeightedDatafit", "Quadratic", "Logistic", "get_datafit",
           "available_datafits", "normalized_sample_weight", "weighted_col_norms2"]


def real_sample_weight(sample_weight) -> np.ndarray:
    """``sample_weight`` as float64, refusing what a cast would change or cannot read: text
    (numbers stored as text included), complex numbers (the cast drops the imaginary part), bools
    and objects that are not real numbers; ``ValueError`` naming ``sample_weight`` and the fix."""
    fix = "pass an array of real numbers >= 0 (e.g. np.asarray(w, dtype=float))"
    if isinstance(sample_weight, (str, bytes)):
        raise ValueError(f"sample_weight must be numeric, got the text {sample_weight!r}; {fix}")
    try:
        arr = np.asarray(sample_weight)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"sample_weight must be a 1-D array of numbers ({exc}); {fix}") from None
    kind = arr.dtype.kind
    if kind in "OUSV":
        for v in arr.ravel():
            if isinstance(v, (str, bytes, np.str_, np.bytes_)):
                raise ValueError(f"sample_weight must be numeric, got text such as {str(v)!r}; "
                                 f"{fix} (numbers stored as text included: they are not read "
                                 "silently)")
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.number)) \
                    or isinstance(v, (complex, np.complexfloating)):
                raise ValueError(f"sample_weight must be real numbers, got {type(v).__name__} "
                                 f"entries such as {v!r}; {fix}")
        arr = arr.astype(np.float64)
    elif kind == "c":
        raise ValueError(f"sample_weight must be real, got complex numbers (dtype {arr.dtype}); "
                         "casting would drop their imaginary parts: pass sample_weight.real "
                         "if those are 0")
    elif kind == "b":
        raise ValueError(f"sample_weight must be numbers, got booleans; {fix} (True is 1.0, "
                         "False removes a sample)")
    elif kind not in "iuf":
        raise ValueError(f"sample_weight must be numeric, got dtype {arr.dtype}; {fix}")
    return np.asarray(arr, dtype=np.float64)


def normalized_sample_weight(sample_weight, n):
    """Checked sample weights normalized to mean 1 (``sw = v n / sum v``), or ``None`` when
    ``sample_weight`` is ``None`` or constant (the unweighted problem, computed as such).

    Raises ``ValueError`` naming ``sample_weight`` for a wrong shape, a negative, NaN or infinite
    entry, or an all-zero vector."""
    if sample_weight is None:
        return None
    v = real_sample_weight(sample_weight)
    if v.ndim == 0:
        v = np.full(n, float(v))
    if v.shape != (n,):
        raise ValueError(f"sample_weight must have one entry per sample ({n}), got shape "
                         f"{v.shape}")
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError("sample_weight must hold finite numbers >= 0 (0 removes a sample)")
    if not np.any(v > 0):
        raise ValueError("sample_weight must not be all zero (its sum must be positive)")
    if np.all(v == v[0]):
        return None
    with np.errstate(over="ignore"):
        total = float(v.sum())
        factor = n / total
    if not np.isfinite(factor) or not np.isfinite(total):
        # the sum overflows (weights near the largest float) or n / sum does (subnormal
        # weights): the same normalization on v / max(v), whose sum is between 1 and n
        v = v / float(v.max())
        factor = n / float(v.sum())
    return v * factor


def weighted_col_norms2(X, sw=None):
    """``sum_i sw_i x_ij^2`` for every column (``sw=None``: unweighted), dense or sparse ``X``
    (CSC: one pass over its stored values, ~4x faster than ``X.multiply(X)``, which builds a
    second matrix)."""
    if sp.issparse(X) and X.format == "csc":
        sq = X.data * X.data
        if sw is not None:
            sq *= np.asarray(sw, dtype=np.float64)[X.indices]
        out = np.zeros(X.shape[1])
        starts = X.indptr[:-1]
        filled = np.flatnonzero(X.indptr[1:] > starts)
        if filled.size:
            out[filled] = np.add.reduceat(sq, starts[filled])
        return out
    if sp.issparse(X):
        sq = X.multiply(X)
        return np.asarray(sq.sum(axis=0)).ravel() if sw is None else np.asarray(sq.T @ sw).ravel()
    if sw is None:
        return np.einsum("ij,ij->j", X, X)
    return np.einsum("ij,ij,i->j", X, X, sw)


class Datafit:
    """Base class: smooth loss of the linear predictor ``z``.

    Subclasses define ``value(y, z)``, ``raw_grad(y, z)`` (``dL/dz``, already divided by ``n``),
    ``raw_hess(y, z)`` (diagonal of ``d2L/dz2``), ``curvature`` (an upper bound of ``raw_hess * n``)
    and ``code`` (the integer the numba kernels use).
    """

    code = -1
    name = "datafit"
    curvature = 1.0
    sample_weight = None  # normalized weights (mean 1) or None
    #: the solvers' treatment: ``"residual"`` (least squares: coordinate descent on the
    #: residual), ``"newton"`` (proximal Newton on the model ``G, H`` of ``raw_grad`` /
    #: ``raw_hess``, with a line search on ``value``)
    kind = "newton"
    #: whether the model has an intercept at all (Cox's partial likelihood does not: a shift of
    #: ``z`` leaves it unchanged)
    has_intercept = True
    #: a bound on the per-sample slope ``|dL/dz_i| n / sw_i`` where the loss has one (Huber,
    #: quantile: linear beyond a threshold), else ``None``; it caps the stopping criterion's
    #: scale (``Problem.criterion_scale``)
    slope_bound = None

    def value(self, y, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def raw_grad(self, y, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def raw_hess(self, y, z):  # pragma: no cover - abstract
        raise NotImplementedError

    def grad_hess(self, y, z):
        """``(raw_grad, raw_hess)`` at once (a datafit whose two share work overrides it)."""
        return self.raw_grad(y, z), self.raw_hess(y, z)

    def gradient(self, design, y, z):
        """Gradient in ``w``: ``X^T dL/dz`` (and in ``b``: ``sum dL/dz``); ``design`` a
        :class:`._design.Design`."""
        g = self.raw_grad(y, z)
        return design.rmatvec(g), float(g.sum())

    def lipschitz(self, design, y=None):
        """Per-coordinate Lipschitz constants of the gradient: ``curvature * ||x_j||^2 / n``
        (``curvature * sum_i sw_i x_ij^2 / n`` with sample weights). Datafits without a global
        constant (Poisson, Gamma, Cox) return the curvatures at the null model of ``y``."""
        if self.sample_weight is None:
            return self.curvature * design.col_norms2 / design.n
        return self.curvature * design.col_wnorms2(self.sample_weight) / design.n

    @property
    def global_curvature(self):
        """An upper bound of ``n d2L/dz_i^2`` over all samples (``curvature * max sw``)."""
        if self.sample_weight is None:
            return self.curvature
        return self.curvature * float(np.max(self.sample_weight))

    def __repr__(self):
        return f"{type(self).__name__}()"


class WeightedDatafit(Datafit):
    """A datafit whose per-sample terms carry the sample weights: ``L = (1/n) sum_i sw_i
    loss_i`` with ``sw`` normalized to mean 1 (``None``: unweighted). Subclasses write their
    per-sample formulas and pass them through :meth:`_weigh`."""

    def __init__(self, sample_weight=None):
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, dtype=np.float64)
            sample_weight = normalized_sample_weight(sample_weight, sample_weight.shape[0])
        self.sample_weight = sample_weight

    def _weigh(self, v):
        return v if self.sample_weight is None else v * self.sample_weight

    def _weighted_mean(self, v):
        return float(np.mean(self._weigh(v)))

    def lipschitz_at(self, design, h):
        """``sum_i h_i x_ij^2`` for every column: the coordinate curvatures of the datafit at a
        point whose ``raw_hess`` is ``h`` (already weighted and divided by ``n``)."""
        h = np.asarray(h, dtype=np.float64)
        if np.all(h == h[0]):  # a constant: the design's own column norms
            return design.col_norms2 * float(h[0])
        return design.col_wnorms2(h)

    def __repr__(self):
        extra = "sample_weight=..." if self.sample_weight is not None else ""
        params = ", ".join([*(f"{k}={v!r}" for k, v in self._repr_params().items()),
                            *([extra] if extra else [])])
        return f"{type(self).__name__}({params})"

    def _repr_params(self):
        return {}

    def params(self):
        """The constructor's parameters but ``sample_weight``."""
        return dict(self._repr_params())

    def with_sample_weight(self, sample_weight):
        """A new datafit of the same kind and parameters with these sample weights."""
        return type(self)(**self.params(), sample_weight=sample_weight)


class Quadratic(Datafit):
    """Least squares ``(1/2n) ||y - z||^2`` with ``z = X w + b``."""

    code = 0
    name = "quadratic"
    curvature = 1.0
    kind = "residual"

    def value(self, y, z):
        r = y - z
        return 0.5 * float(r @ r) / y.shape[0]

    def raw_grad(self, y, z):
        return (z - y) / y.shape[0]

    def raw_hess(self, y, z):
        return np.full(y.shape[0], 1.0 / y.shape[0])

    def intercept_init(self, y):
        return float(np.mean(y))


class Logistic(WeightedDatafit):
    """Binary logistic loss ``(1/n) sum sw_i log(1 + exp(-y_i z_i))``, labels ``y`` in
    ``{-1, +1}``; ``sample_weight`` (any nonnegative weights, normalized here to mean 1) or
    ``None`` (``sw_i = 1``)."""

    code = 1
    name = "logistic"
    curvature = 0.25

    def value(self, y, z):
        return -float(np.sum(self._weigh(log_expit(y * z)))) / y.shape[0]

    def raw_grad(self, y, z):
        return self._weigh(-y * expit(-y * z)) / y.shape[0]

    def raw_hess(self, y, z):
        s = expit(y * z)
        return self._weigh(s * (1.0 - s)) / y.shape[0]

    def intercept_init(self, y):
        p = np.clip(np.mean(self._weigh(y > 0)), 1e-12, 1 - 1e-12)
        return float(np.log(p / (1 - p)))


# name -> class here, or "module:Class" of dualdrop.linear.families (imported when first asked)
_DATAFITS = {
    "quadratic": Quadratic,
    "logistic": Logistic,
    "poisson": "poisson:Poisson",
    "gamma": "gamma:Gamma",
    "huber": "huber:Huber",
    "quantile": "quantile:Quantile",
    "cox": "cox:Cox",
    "multinomial": "multinomial:Multinomial",
}


def datafit_class(name):
    """The datafit class registered under ``name``."""
    if not isinstance(name, str) or name not in _DATAFITS:
        raise ValueError(f"datafit={name!r} is unknown; use one of {available_datafits()} or a "
                         "Datafit instance")
    cls = _DATAFITS[name]
    if isinstance(cls, str):
        import importlib

        module, attr = cls.split(":")
        cls = getattr(importlib.import_module(f"dualdrop.linear.families.{module}"), attr)
    return cls


def available_datafits():
    """The registered datafit names."""
    return sorted(_DATAFITS)


def get_datafit(datafit, **params) -> Datafit:
    """Return a datafit object from a name (``"quadratic"``, ``"logistic"``, ``"poisson"``, ...;
    ``params`` go to its constructor) or an instance (returned as is)."""
    if isinstance(datafit, Datafit):
        if params:
            raise ValueError("datafit parameters are only used with a datafit name; pass them to "
                             "the datafit object's constructor instead")
        return datafit
    cls = datafit_class(datafit)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"datafit={datafit!r} does not accept parameters {params!r}: {exc}") \
            from None
