"""Multi-output (multi-task) least squares with a row penalty: :class:`SparseMultiTaskRegression`.

Objective (``Y`` of shape ``n x T``, ``W`` of shape ``p x T``, one intercept per output)::

    (1/2n) ||Y - X W - 1 b^T||_F^2 + alpha * sum_j Omega(s_j ||W_j||_2)

(with ``l1_ratio < 1``: ``alpha * sum_j [l1_ratio Omega(.) + (1 - l1_ratio)/2 (.)^2]``, the
elastic-net form).

A feature is kept or dropped for all outputs at once: the penalty acts on the norm of its row
of coefficients. With ``Omega = |.|`` this is the L2,1 norm of scikit-learn's ``MultiTaskLasso``
(same objective, same ``alpha``); any separable penalty of the catalog with a compiled prox gives
its group version (group MCP, group log-sum, ...), through the block prox of
``_jit.block_prox`` (the scalar prox applied to the row norm). The solver is block coordinate
descent (:mod:`.solvers.bcd`). ``s_j`` is the column scaling of the single-output estimators
(``scaling="dropout"``: ``s_j = sqrt(||x_j||^2 / n)``; ``"none"``: 1, the scikit-learn
convention).

``multitask_alpha_max`` is the smallest ``alpha`` giving ``W = 0``: ``max_j ||x_j^T (Y - Ybar)||
/ (n s_j)`` for the l1 penalty (``Ybar`` the column means with an intercept), the same bracketing
as :func:`dualdrop.linear.path.alpha_max` for the others.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import MultiOutputMixin, RegressorMixin
from sklearn.utils._param_validation import StrOptions, validate_params
from sklearn.utils.validation import check_is_fitted

from ._jit import block_scores, penalty_sum, row_norms
from ._problem import Problem
from .datafits import Quadratic
from ._validation import constraints, fit_context, validate_data
from ._design import scaled_design
from .estimators import SparseLinearBase
from .path import alpha_max_from_gradient

__all__ = ["MultiTaskProblem", "SparseMultiTaskRegression", "multitask_alpha_max"]


class MultiTaskProblem(Problem):
    """``min_{W, b} (1/2n) ||Y - X W - 1 b^T||_F^2 + sum_j lam_j Omega(||W_j||_2)``; the same
    interface as :class:`~dualdrop.linear._problem.Problem` (objective, relative criterion) with
    ``W`` of shape ``p x T`` and ``b`` of shape ``T``."""

    multitask = True

    def __init__(self, X, Y, penalty, alpha, fit_intercept=True, weights=None):
        Y = np.asarray(Y, dtype=np.float64)
        if Y.ndim != 2:
            raise ValueError(f"Y must be 2-D (n_samples, n_outputs), got shape {Y.shape}")
        super().__init__(X, Y, Quadratic(), penalty, alpha, fit_intercept, weights)
        if self.y.shape[0] != self.n:
            raise ValueError(f"X has {self.n} samples but Y has {self.y.shape[0]}")
        self.n_outputs = self.y.shape[1]

    def zeros(self):
        return np.zeros((self.p, self.n_outputs))

    def z(self, W, b):
        return self.design.matvec(W) + b

    def penalty_value(self, W):
        norms = np.empty(self.p)
        row_norms(np.ascontiguousarray(W, dtype=np.float64), norms)
        if self.spec is not None:
            return float(penalty_sum(norms, self.all_feats, self.lam_w, *self.spec))
        return float(np.sum(self.lam_w * self.penalty.omega(norms)))

    def objective(self, W, b, z=None):
        if z is None:
            z = self.z(W, b)
        r = self.y - z
        return 0.5 * float(np.vdot(r, r)) / self.n + self.penalty_value(W)

    def raw_criterion(self, W, b, z):
        G = (z - self.y) / self.n
        grad = np.ascontiguousarray(self.design.rmatvec(G))
        out = np.empty(self.p)
        m = block_scores(grad, np.ascontiguousarray(W, dtype=np.float64), self.lips,
                         self.lam_w, *self.spec, out)
        gb = float(np.linalg.norm(G.sum(axis=0))) if self.fit_intercept else 0.0
        return max(float(m), gb)

    def initial_intercept(self):
        if not self.fit_intercept:
            return np.zeros(self.n_outputs)
        return self.y.mean(axis=0)

    def start_point(self, W0=None, b0=None):
        """Copies of the start point; ``W0=None``: zeros, ``b0=None``: the best intercepts."""
        shape = (self.p, self.n_outputs)
        if W0 is None:
            W = np.zeros(shape)
        else:
            W = np.array(W0, dtype=np.float64, copy=True)
            if W.shape != shape:
                raise ValueError(f"W0 has shape {W.shape}, expected {shape} (features x outputs)")
        if not self.fit_intercept:
            return W, np.zeros(self.n_outputs)
        if b0 is not None:
            b = np.array(b0, dtype=np.float64, copy=True).reshape(-1)
            if b.shape != (self.n_outputs,):
                raise ValueError(f"b0 has {b.size} entries, expected {self.n_outputs}")
            return W, b
        return W, (self.y - self.z(W, 0.0)).mean(axis=0)


def _gradient_rows_at_zero(design, Y, fit_intercept):
    """``(||x_j^T (Y - 1 b0^T)||_2 / n, L_j)`` over the features with ``L_j > 0``."""
    R = Y - Y.mean(axis=0) if fit_intercept else Y
    G = design.rmatvec(R) / design.n
    L = design.col_norms2 / design.n
    keep = L > 0
    return np.linalg.norm(G, axis=1)[keep], L[keep]


@validate_params(constraints("X", "Y", "penalty", "penalty_params", "fit_intercept", "scaling",
                             "l1_ratio"), prefer_skip_nested_validation=True)
def multitask_alpha_max(X, Y, penalty="l1", penalty_params=None, fit_intercept=True,
                        scaling="dropout", *, l1_ratio=1.0):
    """Smallest ``alpha`` for which :class:`SparseMultiTaskRegression` returns ``W = 0`` (see the
    module docstring; ``l1_ratio < 1`` divides the convex value by ``l1_ratio``)."""
    est = SparseMultiTaskRegression(penalty=penalty, penalty_params=penalty_params,
                                    fit_intercept=fit_intercept, scaling=scaling,
                                    l1_ratio=l1_ratio)
    est._validate_params()
    X, Y = est._check_data(X, Y, reset=True)
    scaling = est._scaling(X, None, Y)
    g, L = _gradient_rows_at_zero(scaled_design(X, scaling.t), Y / scaling.cy, fit_intercept)
    return alpha_max_from_gradient(g, L, penalty, penalty_params, l1_ratio=l1_ratio,
                                   scaling=scaling)


class SparseMultiTaskRegression(MultiOutputMixin, RegressorMixin, SparseLinearBase):
    """Multi-output least squares with a row penalty:
    ``(1/2n) ||Y - X W - 1 b^T||_F^2 + alpha sum_j Omega(s_j ||W_j||_2)``.

    ``penalty="l1"`` with ``scaling="none"`` is scikit-learn's ``MultiTaskLasso`` (same
    ``alpha``); with ``l1_ratio < 1`` (an added ridge term ``alpha (1 - l1_ratio)/2 ||W||_F^2``,
    the penalty scaled by ``l1_ratio``) its ``MultiTaskElasticNet``. Parameters as :class:`~dualdrop.linear.SparseLinearRegression` (``penalty``,
    ``penalty_params``, ``alpha``, ``tol``, ``max_iter``, ``fit_intercept``, ``warm_start``,
    ``scaling``, ``penalty_weights``, ``solver_params``, ``verbose``); ``solver`` is ``"bcd"``
    (block coordinate descent, :mod:`dualdrop.linear.solvers.bcd`) or ``"auto"`` (the same).
    Dense or sparse ``X``; ``Y`` of shape ``(n_samples, n_outputs)``.

    Attributes: ``coef_`` of shape ``(n_outputs, n_features)`` (scikit-learn's layout),
    ``intercept_`` of shape ``(n_outputs,)``, ``n_iter_``, ``objective_``, ``criterion_``,
    ``n_features_in_``.
    """

    _parameter_constraints: dict = {
        **{k: v for k, v in SparseLinearBase._parameter_constraints.items() if k != "positive"},
        "solver": [StrOptions({"auto", "bcd"})],  # its own solvers: block coordinate descent
    }

    def __init__(self, penalty="l1", penalty_params=None, alpha=1.0, *, l1_ratio=1.0,
                 solver="auto", tol=1e-5, max_iter=None, fit_intercept=True, warm_start=False,
                 scaling="dropout", solver_params=None, verbose=False, penalty_weights=None):
        self.penalty = penalty
        self.l1_ratio = l1_ratio
        self.penalty_params = penalty_params
        self.alpha = alpha
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.fit_intercept = fit_intercept
        self.warm_start = warm_start
        self.scaling = scaling
        self.solver_params = solver_params
        self.verbose = verbose
        self.penalty_weights = penalty_weights

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.single_output = False  # as scikit-learn's MultiTaskLasso: y is 2-D
        tags.target_tags.multi_output = True
        return tags

    def _check_data(self, X, Y, reset):
        X, Y = validate_data(self, X, Y, accept_sparse="csc", dtype=[np.float64, np.float32],
                              y_numeric=True, multi_output=True, reset=reset)
        if Y.ndim != 2:
            raise ValueError(
                f"y must be 2-D (n_samples, n_outputs), got shape {Y.shape}; for a single output "
                "use SparseLinearRegression, or pass y.reshape(-1, 1)")
        return X, Y

    @fit_context
    def fit(self, X, y):
        P = self._check_params()
        X, Y = self._check_data(X, y, reset=True)
        dtype = X.dtype
        X, Y = X.astype(np.float64, copy=False), Y.astype(np.float64, copy=False)
        scaling = self._scaling(X, None, Y)  # extreme scales: see ._scale
        s, cy = scaling.t, scaling.cy
        design = scaled_design(X, s)
        P, alpha = scaling.solver_penalty(P, float(self.alpha))
        problem = MultiTaskProblem(design, Y / cy, P, alpha, self.fit_intercept,
                                   weights=self._penalty_weights(design.p))
        W0 = b0 = None
        if self.warm_start and np.shape(getattr(self, "coef_", None)) == (Y.shape[1], X.shape[1]):
            W0 = (self.coef_ * (s / cy)).T
            b0 = self.intercept_ / cy if self.fit_intercept else None
        res, _ = self._solve_problem(problem, "bcd", W0, b0)
        coef = res.coef / s[:, None] if cy == 1.0 else res.coef * (cy / s)[:, None]
        self.coef_ = coef.T.astype(dtype, copy=False)
        self.intercept_ = np.asarray(res.intercept * cy, dtype=dtype)
        self.n_iter_ = int(res.n_iter)
        with np.errstate(over="ignore"):
            self.objective_ = (res.objective if cy == 1.0
                               else np.asarray(res.objective) * cy * cy)
        self.criterion_ = float(res.criterion)
        self.solver_ = "bcd"
        return self

    def predict(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32],
                           reset=False)
        return np.asarray(X @ self.coef_.T) + self.intercept_
