"""The optimization problem every solver receives, and the result every solver returns.

Problem: ``min_{w, b} F(w, b) = L(y, X w + b) + sum_j lam_j Omega(w_j)``, with ``lam_j = alpha *
weights_j`` (``weights`` defaults to ones; reweighted l1 and ``penalty_weights`` use it), ``w >= 0``
when ``positive``, and ``b`` present only when
``fit_intercept``.

Stopping criterion shared by all solvers: the largest coordinate-wise gradient mapping (see
``_jit.scores``), together with ``|dL/db|`` for the intercept, *relative to the data's scale*:
divided by ``sqrt(2 F Lbar)``, with ``F`` the objective at the current point and ``Lbar`` the mean
coordinate Lipschitz constant. Why this scale: near a minimizer, a coordinate with violation
``v_j`` and curvature ``mu_j`` accounts for about ``v_j^2 / (2 mu_j)`` of the objective gap, so
``(v / sqrt(2 F Lbar))^2`` estimates the *relative* objective gap per violating coordinate on a
well-conditioned problem; the criterion does not change when ``y`` or ``X`` is multiplied by a
constant (raw data in any units stop at the same relative accuracy), unlike an absolute
threshold. ``F`` is floored at ``1e-10`` of the null model's objective (an exact fit, ``F = 0``,
stays reachable). A loss whose slope is bounded (Huber, quantile: ``|dL/dz_i| <= b sw_i / n``)
caps the scale at ``b sqrt(Lbar / curvature)``, the largest gradient such a loss can have: where
residuals exceed its threshold, ``F`` grows like ``|r|`` but the gradient does not, and
``sqrt(2 F Lbar)`` would call a point far from the optimum converged (the two agree on the
quadratic piece).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np

from . import _penalty
from ._design import Design
from ._jit import penalty_sum, scores, scores_from_grad
from .datafits import Datafit

__all__ = ["Problem", "SolverResult"]


class Problem:
    """Data, datafit, penalty and regularization strength of one fit."""

    def __init__(self, X, y, datafit: Datafit, penalty, alpha: float, fit_intercept=True,
                 weights=None, positive=False):
        self.design = X if isinstance(X, Design) else Design(X)
        self.y = np.ascontiguousarray(y, dtype=np.float64)
        self.datafit = datafit
        self.penalty = penalty
        self.alpha = float(alpha)
        self.fit_intercept = bool(fit_intercept)
        self.positive = bool(positive)
        p = self.design.p
        self.weights = np.ones(p) if weights is None else np.asarray(weights, dtype=np.float64)
        self.lam_w = self.alpha * self.weights
        self.spec = _penalty.kernel_spec(penalty)
        self.lips = datafit.lipschitz(self.design, self.y)
        self._lglobal = None
        self._f_null = None
        self.all_feats = np.arange(p, dtype=np.int64)
        pos = self.lips[self.lips > 0]
        self._lbar = float(pos.mean()) if pos.size else 1.0

    def with_penalty(self, penalty, scale=1.0):
        """A copy of the problem with another penalty (its strengths multiplied by ``scale``);
        the data, datafit and constants are shared."""
        new = copy.copy(self)
        new.penalty = penalty
        new.spec = _penalty.kernel_spec(penalty)
        new._rescale(scale)
        new._f_null = None
        return new

    def _rescale(self, scale):
        self.weights = self.weights * scale
        self.lam_w = self.alpha * self.weights

    @property
    def n(self):
        return self.design.n

    @property
    def p(self):
        return self.design.p

    def global_lipschitz(self):
        """Lipschitz constant of the datafit gradient in ``(w, b)``."""
        if self._lglobal is None:
            s = self.design.spectral_norm2()
            if self.fit_intercept:  # the ones column adds at most n to ||[X 1]||^2
                s = s + self.n
            self._lglobal = self.datafit.global_curvature * s / self.n
        return self._lglobal

    def z(self, w, b):
        if not np.any(w):  # the null model (start points, the criterion's scale): no product
            return np.full(self.n, float(b))
        return self.design.matvec(w) + b

    def penalty_value(self, w):
        if self.spec is not None:
            return float(penalty_sum(np.ascontiguousarray(w, dtype=np.float64), self.all_feats,
                                     self.lam_w, *self.spec))
        return float(np.sum(self.lam_w * self.penalty.omega(w)))

    def objective(self, w, b, z=None):
        if z is None:
            z = self.z(w, b)
        return self.datafit.value(self.y, z) + self.penalty_value(w)

    def gradient(self, w, b, z=None):
        """``(grad_w, grad_b)`` of the datafit."""
        if z is None:
            z = self.z(w, b)
        return self.datafit.gradient(self.design, self.y, z)

    def criterion_scale(self, F):
        """``sqrt(2 max(F, 1e-10 F_null) Lbar)``: what the raw violation is divided by (see the
        module docstring); ``F`` the objective at the current point."""
        if self._f_null is None:
            self._f_null = self.objective(self.zeros(), self.initial_intercept())
        f = max(float(F), 1e-10 * self._f_null)
        scale = float(np.sqrt(2.0 * f * self._lbar)) if f > 0 else 1.0
        b = getattr(self.datafit, "slope_bound", None)
        if b is not None:  # bounded slope: the gradient cannot exceed this (module docstring)
            scale = min(scale, b * float(np.sqrt(self._lbar / self.datafit.curvature)))
        return scale

    def criterion(self, w, b, z=None):
        """Largest gradient-mapping violation (and ``|dL/db|`` with an intercept), relative to
        :meth:`criterion_scale` at ``(w, b)``."""
        if z is None:
            z = self.z(w, b)
        return self.raw_criterion(w, b, z) / self.criterion_scale(self.objective(w, b, z))

    def criterion_from_gradient(self, w, G, grad, F):
        """:meth:`criterion` at ``w`` from what a caller computed already: ``G`` the datafit's
        ``raw_grad``, ``grad = X^T G`` and ``F`` the objective (no product with ``X``; penalties
        with a compiled kernel)."""
        out = np.zeros(self.p)
        m = scores_from_grad(np.ascontiguousarray(grad, dtype=np.float64),
                             np.ascontiguousarray(w, dtype=np.float64), self.lips, self.lam_w,
                             self.spec[0], self.spec[1], self.positive, np.full(self.p, -1.0),
                             out)
        gb = abs(float(G.sum())) if self.fit_intercept else 0.0
        return max(float(m), gb) / self.criterion_scale(F)

    def raw_criterion(self, w, b, z):
        """The violation itself, in the units of the gradient."""
        G = self.datafit.raw_grad(self.y, z)
        gb = abs(float(G.sum())) if self.fit_intercept else 0.0
        if self.spec is not None:
            out = np.zeros(self.p)
            m = scores(*self.design.arrays, self.all_feats, G, 1.0,
                       np.ascontiguousarray(w, dtype=np.float64), self.lips, self.lam_w,
                       self.spec[0], self.spec[1], self.positive, out)
            return max(float(m), gb)
        g = self.design.rmatvec(G)
        L = np.where(self.lips > 0, self.lips, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            new = self.penalty.prox(w - g / L, self.lam_w / L)
            if self.positive:
                new = np.maximum(new, 0.0)
        viol = np.where(self.lips > 0, L * np.abs(w - new), 0.0)
        return max(float(np.max(viol, initial=0.0)), gb)

    def centred_curvatures(self):
        """``(Lin, means)``: the curvatures ``||x_j||^2 / n - means_j^2`` of the centred columns
        and the column means (with an intercept; without: ``lips`` and zeros). Coordinate
        descent with an intercept moves each coordinate on its centred column (the intercept
        kept at its minimizer), see ``solvers.cd._inner_quadratic``; a constant column gets
        ``Lin = 0`` (the intercept absorbs it)."""
        des = self.design
        if self.fit_intercept:
            means = des.col_sums / des.n
            Lin = self.lips - means * means
            Lin[Lin <= 1e-12 * self.lips] = 0.0
        else:
            means = np.zeros(des.p)
            Lin = self.lips.copy()
        return Lin, means

    def zeros(self):
        """The null coefficients."""
        return np.zeros(self.p)

    def initial_intercept(self):
        return self.datafit.intercept_init(self.y) if self.fit_intercept else 0.0


@dataclass
class SolverResult:
    """What a solver returns: the fit, the objective history and how it stopped."""

    coef: np.ndarray
    intercept: float  # one per output (an array) for multi-output problems
    n_iter: int
    objective: np.ndarray  # objective after each iteration (index 0: at the start)
    criterion: float  # final optimality criterion (see Problem.criterion)
    converged: bool
    solver: str
    time: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def final_objective(self):
        return float(self.objective[-1])


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self.t0
