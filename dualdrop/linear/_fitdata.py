"""What a fit hands to the solvers: the data in the solvers' units and the maps back.

The estimators validate ``X``, ``y`` and ``sample_weight``, plan the scales (:mod:`._scale`) and
build one of these: :class:`LeastSquaresData` (weighted least squares as the unweighted problem
the solvers see, with its centring) or :class:`GLMData` (a datafit that carries its own sample
weights: logistic, multinomial, the families of :mod:`.families`). Both give the column-scaled
:class:`._design.Design`, the datafit, the target and penalty weights, and ``to_solver`` /
``from_solver`` between ``(coef, intercept)`` and the solver's variables.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._design import Design, divide_columns, scaled_design
from ._scale import check_unscaled_target
from .datafits import Quadratic

__all__ = ["GLMData", "LeastSquaresData"]


class GLMData:
    """What a fit whose datafit carries its own sample weights (logistic, and the families of
    :mod:`.families`) hands to the solvers: the column-scaled design, the datafit, the target,
    the penalty weights, and the maps between ``(coef, intercept)`` and the solver's variables
    ``(u = s w, b)``; ``scaling`` (:class:`._scale.Scaling`) says how the solver's problem
    relates to the user's (``s = scaling.t``)."""

    extra = False  # see LeastSquaresData
    cy = 1.0  # these datafits' targets are not rescaled

    def __init__(self, X, scaling, datafit, fit_intercept, penalty_weights, y=None):
        if y is not None:
            check_unscaled_target(y, getattr(datafit, "name", "this"))
        self.scaling = scaling
        self.s = scaling.t
        self.design = scaled_design(X, self.s)
        self.datafit = datafit
        self.y = y
        self.fit_intercept = bool(fit_intercept) and datafit.has_intercept
        self.penalty_weights = penalty_weights

    def to_solver(self, coef, intercept):
        return coef * self.s, (intercept if self.fit_intercept else None)

    def from_solver(self, u, b):
        return u / self.s, b


_DENSE_CENTRING = 2_000_000  # entries (16 MB in float64)


class LeastSquaresData:
    """Weighted least squares as the unweighted problem the solvers see.

    With weights ``sw`` of mean 1 and ``d_i = sqrt(sw_i)``,
    ``(1/2n) sum_i sw_i (y_i - x_i w - b)^2 = (1/2n) ||D y - D X w - b d||^2``, so

    - without intercept the solvers get the design ``D X`` and the target ``D y``;
    - with an intercept and dense ``X``, the intercept's minimizer ``b = ybar - xbar . w``
      (weighted means) leaves ``(1/2n) ||D (y - ybar) - D (X - xbar) w||^2``: the design
      ``D (X - 1 xbar^T)`` and the target ``D (y - ybar)`` without intercept (scikit-learn's
      weighted centring);
    - with an intercept and sparse ``X`` (centring would densify it) the intercept is one more,
      unpenalized, column ``d`` of the design. Coordinate descent converges slowly when that
      column is nearly collinear with the others (raw columns with large means stored sparse:
      raw diabetes as CSC took 250 outer iterations instead of 9), so a sparse ``X`` of at most
      ``_DENSE_CENTRING`` entries is centred densely instead (same problem, same optimum).

    Without weights the data pass through unchanged (the solvers' own intercept handling). The
    column divisors ``s = scaling.t`` and the target divisor ``cy = scaling.cy``
    (:mod:`._scale`) apply first: everything here is computed on ``X / s`` and ``y / cy``, and
    :meth:`from_solver` maps back to the user's units (the logistic and GLM fits:
    :class:`GLMData`).
    """

    def __init__(self, X, y, scaling, sw, fit_intercept, penalty_weights, positive):
        self.scaling = scaling
        self.s = s = scaling.t
        self.cy = scaling.cy
        self.datafit = Quadratic()
        self.extra = False  # the intercept is the last column
        self.offset = None  # (xbar, ybar) of the weighted centring, in the solver's units
        self.penalty_weights = penalty_weights
        self.fit_intercept = bool(fit_intercept) and sw is None
        y = y / self.cy if self.cy != 1.0 else y
        if sw is None:
            self.design, self.y = scaled_design(X, s), y
            return
        n, p = X.shape
        d = np.sqrt(sw)
        if sp.issparse(X) and fit_intercept and n * p <= _DENSE_CENTRING:
            X = X.toarray()
        Xs = divide_columns(X, s)
        if sp.issparse(Xs):
            Xt = sp.diags(d) @ Xs
            if fit_intercept:
                if positive:
                    raise ValueError(
                        "positive=True with sparse X, sample_weight and fit_intercept=True is not "
                        "supported (the intercept would be constrained too); pass X dense, or "
                        "centre y and X yourself and use fit_intercept=False")
                Xt = sp.hstack([Xt, sp.csc_matrix(d[:, None])], format="csc")
                if penalty_weights is not None:  # None: see SparseLinearBase._problem
                    self.penalty_weights = np.append(penalty_weights, 0.0)
                self.extra = True
            self.design, self.y = Design(Xt), d * y
        else:  # Xs is this fit's own Fortran-ordered copy: centred and weighted in place
            if fit_intercept:
                xbar, ybar = sw @ Xs / n, float(sw @ y) / n
                self.offset = (xbar, ybar)
                Xs -= xbar
                y = y - ybar
            Xs *= d[:, None]
            self.design = Design(Xs)
            self.y = d * y

    def to_solver(self, coef, intercept):
        cy = self.cy
        u = coef * self.s if cy == 1.0 else coef * (self.s / cy)
        if intercept is not None:
            intercept = intercept / cy
        if self.extra:
            return np.append(u, intercept), None
        return u, (intercept if self.fit_intercept else None)

    def from_solver(self, u, b):
        cy = self.cy
        n = -1 if self.extra else len(u)
        w = u[:n] / self.s if cy == 1.0 else u[:n] * (cy / self.s)
        if self.extra:
            return w, float(u[-1]) * cy
        if self.offset is not None:
            return w, (self.offset[1] - float(self.offset[0] @ u)) * cy
        return w, (b * cy if b is not None else b)
