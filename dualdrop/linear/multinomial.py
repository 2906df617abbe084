"""Multinomial logistic regression with any penalty: :class:`SparseMultinomialRegression`.

Objective (``K`` classes, ``W`` of shape ``p x K``, one intercept per class, ``z_i = x_i W + b``)::

    (1/n) sum_i [log sum_k exp(z_ik) - z_{i, y_i}] + alpha * sum_j Omega_rho(s_j ||W_j||_2)

with ``grouped=True`` (default): a feature is kept or dropped for every class at once, the
penalty acting on the norm of its row of ``K`` coefficients (glmnet's
``type.multinomial="grouped"``; any penalty of the catalog on the row norms: group MCP, group
log-sum, ...). ``grouped=False`` penalizes each coefficient, ``alpha * sum_jk Omega_rho(s_j
W_jk)``: with ``penalty="l1"`` and ``scaling="none"`` scikit-learn's ``LogisticRegression(C,
l1_ratio=1, solver="saga")`` on more than two classes at ``alpha = 1 / (C n)``. Unlike
:class:`~dualdrop.linear.SparseLogisticRegression`'s one-vs-rest, the classes share one
likelihood, so ``predict_proba`` is the model's own (not renormalized) softmax.

The datafit is ``dualdrop.linear.families.multinomial``; the solver the working-set proximal
Newton of ``solvers._cd_multinomial`` (``solver="cd"``, ``"auto"``).
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax
from sklearn.base import ClassifierMixin
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils.validation import check_is_fitted

from ._problem import Problem
from ._validation import class_labels, constraints, fit_context, validate_data
from .datafits import normalized_sample_weight
from ._fitdata import GLMData
from .estimators import SparseLinearBase
from .families.multinomial import Multinomial

__all__ = ["MultinomialProblem", "SparseMultinomialRegression"]


class MultinomialProblem(Problem):
    """``min_{W, b} L(Y, X W + 1 b^T) + sum_j lam_j Omega(||W_j||)`` (``grouped_rows``) or
    ``+ sum_jk lam_j Omega(W_jk)``; ``Y`` one-hot ``n x K``, ``W`` ``p x K``, ``b`` ``K``."""

    multinomial = True

    def __init__(self, X, Y, datafit, penalty, alpha, fit_intercept=True, weights=None,
                 positive=False, grouped=True):
        super().__init__(X, Y, datafit, penalty, alpha, fit_intercept, weights, positive)
        if self.spec is None:
            raise ValueError(f"the multinomial model needs a penalty with a compiled kernel "
                             f"(every name of penalties.available() but 'hard_threshold'), got "
                             f"{penalty!r}")
        self.n_outputs = self.y.shape[1]
        self.grouped_rows = bool(grouped)
        if positive and grouped:
            raise ValueError("positive=True constrains each coefficient, the grouped multinomial "
                             "penalizes rows: use grouped=False with positive=True")
        # the criterion's constants: Boehning's bound for a row (grouped), a coefficient's
        # curvature bound 1/4 otherwise
        if not grouped:
            self.lips = self.lips * 0.5

    def zeros(self):
        return np.zeros((self.p, self.n_outputs))

    def z(self, W, b):
        if not np.any(W):
            return np.tile(np.asarray(b, dtype=np.float64).reshape(1, -1), (self.n, 1)) \
                if np.ndim(b) else np.full((self.n, self.n_outputs), float(b))
        return self.design.matvec(W) + b

    def penalty_value(self, W):
        from .solvers._cd_multinomial import row_penalty

        return float(row_penalty(self, np.ascontiguousarray(W, dtype=np.float64),
                                 self.all_feats))

    def raw_criterion(self, W, b, z):
        from .solvers._cd_multinomial import multinomial_scores

        G = self.datafit.raw_grad(self.y, z)
        grad = np.ascontiguousarray(self.design.rmatvec(G))
        m = multinomial_scores(self, np.ascontiguousarray(W, dtype=np.float64), grad,
                               np.empty(self.p))
        gb = float(np.max(np.abs(G.sum(axis=0)))) if self.fit_intercept else 0.0
        return max(float(m), gb)

    def initial_intercept(self):
        if not self.fit_intercept:
            return np.zeros(self.n_outputs)
        return self.datafit.intercept_init(self.y)

    def start_point(self, W0=None, b0=None):
        """Copies of the start point; ``W0=None``: zeros, ``b0=None``: the best intercepts."""
        shape = (self.p, self.n_outputs)
        W = np.zeros(shape) if W0 is None else np.array(W0, dtype=np.float64, copy=True)
        if W.shape != shape:
            raise ValueError(f"W0 has shape {W.shape}, expected {shape} (features x classes)")
        if not self.fit_intercept:
            return W, np.zeros(self.n_outputs)
        if b0 is not None:
            return W, np.array(b0, dtype=np.float64, copy=True).reshape(self.n_outputs)
        return W, (self.initial_intercept() if not np.any(W) else np.zeros(self.n_outputs))


class SparseMultinomialRegression(ClassifierMixin, SparseLinearBase):
    """Multinomial logistic regression with any penalty (module docstring).

    Parameters as :class:`~dualdrop.linear.SparseLogisticRegression` (``alpha`` defaults to
    0.01), plus ``grouped`` (default ``True``: the penalty on each feature's row of ``K``
    coefficients, a feature kept or dropped for every class; ``False``: on each coefficient).
    ``groups=`` is not available here (the rows are the groups).

    Attributes
    ----------
    classes_, coef_ (``K x p``, scikit-learn's layout; for two classes too), intercept_ (``K``,
    centred: the softmax ignores a common shift), n_iter_, objective_, criterion_, solver_,
    n_features_in_.
    """

    _parameter_constraints: dict = {
        **{k: v for k, v in SparseLinearBase._parameter_constraints.items()
           if k not in ("groups", "group_l1_ratio")},
        **constraints("grouped"),
    }

    def __init__(self, penalty="l1", penalty_params=None, alpha=0.01, *, grouped=True,
                 l1_ratio=1.0, solver="auto", tol=1e-5, max_iter=None, fit_intercept=True,
                 warm_start=False, scaling="dropout", solver_params=None, verbose=False,
                 positive=False, penalty_weights=None, start="best"):
        self.penalty = penalty
        self.penalty_params = penalty_params
        self.alpha = alpha
        self.grouped = grouped
        self.l1_ratio = l1_ratio
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.fit_intercept = fit_intercept
        self.warm_start = warm_start
        self.scaling = scaling
        self.solver_params = solver_params
        self.verbose = verbose
        self.positive = positive
        self.penalty_weights = penalty_weights
        self.start = start

    def _prepare(self, X, y, sample_weight):
        """Checked data, classes and what the solver receives, ``(data, dtype)``."""
        X, y = validate_data(self, X, y, accept_sparse="csc", dtype=[np.float64, np.float32])
        dtype = X.dtype
        X = X.astype(np.float64, copy=False)
        sw = normalized_sample_weight(sample_weight, X.shape[0])
        self.classes_ = class_labels(y, sample_weight=sw)
        Y = LabelBinarizer().fit(self.classes_).transform(y).astype(np.float64)
        if Y.shape[1] == 1:  # two classes: LabelBinarizer gives one column
            Y = np.column_stack([1.0 - Y[:, 0], Y[:, 0]])
        data = GLMData(X, self._scaling(X, sw), Multinomial(sw), self.fit_intercept,
                       self._penalty_weights(X.shape[1]), y=Y)
        return data, dtype

    def _problem(self, data, y, P, alpha):
        P, alpha = data.scaling.solver_penalty(P, float(alpha))
        return MultinomialProblem(data.design, y, data.datafit, P, float(alpha),
                                  data.fit_intercept, weights=data.penalty_weights,
                                  positive=self.positive, grouped=self.grouped)

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Fit on ``X`` (dense or sparse) and class labels ``y``; ``sample_weight``:
        nonnegative weights of the samples or ``None``."""
        return self._fit_prepared(self._prepare(X, y, sample_weight))

    def _fit_prepared(self, prep, P=None):
        data, dtype = prep
        P = self._check_params() if P is None else P
        K, p = data.y.shape[1], data.s.shape[0]
        w0 = b0 = None
        if self.warm_start and np.shape(getattr(self, "coef_", None)) == (K, p):
            w0 = (np.asarray(self.coef_, dtype=np.float64) * data.s).T
            b0 = np.asarray(self.intercept_, dtype=np.float64) if data.fit_intercept else None
        res, name = self._solve_one(data, data.y, P, w0, b0)
        b = np.asarray(res.intercept, dtype=np.float64)
        return self._store(res, name, (res.coef / data.s[:, None]).T.astype(dtype, copy=False),
                           (b - b.mean() if data.fit_intercept else b).astype(dtype),
                           res.objective)

    def _null_gradient(self, X, y, sample_weight=None):
        """``(g, L, scaling)`` at the null model: row norms (grouped) or entries of the
        gradient."""
        data, _ = self._prepare(X, y, sample_weight)
        pr = self._problem(data, data.y, self._check_params(), 1.0)
        G = pr.datafit.raw_grad(pr.y, pr.z(pr.zeros(), pr.initial_intercept()))
        grad = data.design.rmatvec(G)
        keep = pr.lips > 0
        if self.grouped:
            return np.linalg.norm(grad, axis=1)[keep], pr.lips[keep], data.scaling
        K = grad.shape[1]
        return np.abs(grad[keep]).ravel(), np.repeat(pr.lips[keep], K), data.scaling

    def decision_function(self, X):
        """The class scores ``X W + b`` (``n x K``; for two classes the difference of the two,
        as scikit-learn's binary classifiers)."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32],
                          reset=False)
        d = np.asarray(X @ self.coef_.T) + self.intercept_
        return d[:, 1] - d[:, 0] if d.shape[1] == 2 else d

    def predict_proba(self, X):
        """The softmax of the class scores: ``n x K``."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32],
                          reset=False)
        return softmax(np.asarray(X @ self.coef_.T) + self.intercept_, axis=1)

    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))

    def predict(self, X):
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]
