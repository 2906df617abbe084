"""Cross-validated choice of ``alpha``: :class:`SparseLinearRegressionCV` and
:class:`SparseLogisticRegressionCV`.

One grid of ``alpha`` for all folds, computed on the whole data: ``alphas`` values from
``alpha_max`` (the smallest ``alpha`` giving ``w = 0``, see :func:`.path.alpha_max`) down to
``eps * alpha_max`` on a log scale, as scikit-learn's ``LassoCV`` does. On each fold the path is
fitted from the largest ``alpha`` down, each fit warm-started at the previous one (the solution
moves little between neighbouring alphas, so each fit takes a few iterations), and every fit is
scored on the held-out samples: the (sample-weighted) mean squared error for regression, a
scikit-learn scorer for classification. ``alpha_`` maximizes the mean score over the folds (ties:
the largest alpha, the sparsest model) and the final model is refitted on all the data.
Folds run in parallel with ``n_jobs`` (joblib).
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
from joblib import Parallel, delayed
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.metrics import check_scoring
from sklearn.model_selection import check_cv
from sklearn.utils._param_validation import HasMethods, StrOptions
from sklearn.utils.validation import check_is_fitted

from .datafits import normalized_sample_weight, real_sample_weight
from ._validation import class_labels, constraints, fit_context, validate_data
from .estimators import SparseLinearRegression, SparseLogisticRegression
from .glm import GLM_DATAFITS, SparseGLM
from .multinomial import SparseMultinomialRegression
from .path import alpha_grid, check_alphas, fit_path_chunk, warn_unconverged

__all__ = ["SparseLinearRegressionCV", "SparseLogisticRegressionCV", "SparseGLMCV",
           "SparseMultinomialRegressionCV"]

# the single-fit estimator's parameters that the CV estimators share (alpha is what they choose)
_SHARED = ("penalty", "penalty_params", "l1_ratio", "solver", "tol", "max_iter",
           "fit_intercept", "scaling", "solver_params", "verbose", "positive", "penalty_weights",
           "groups", "group_l1_ratio")


def _fold(est, X, y, sw, train, test, alphas, score):
    """Scores on ``test`` of the warm-started path fitted on ``train``."""
    scores = []
    sw_test = None if sw is None else sw[test]
    X_test, y_test = X[test], y[test]
    _, msgs = fit_path_chunk(est, X[train], y[train], alphas,
                             None if sw is None else sw[train],
                             callback=lambda e: scores.append(score(e, X_test, y_test, sw_test)))
    return np.asarray(scores), msgs


def _check_folds(folds, sw):
    """``ValueError`` naming ``sample_weight`` (and ``cv``) when a fold's training or test
    samples all weigh 0: the fit would have no data, the test score no samples."""
    if sw is None:
        return
    for k, (train, test) in enumerate(folds):
        for part, idx in (("training", train), ("test", test)):
            if idx.size and not np.any(sw[idx] > 0):
                task = "fit" if part == "training" else "score"
                raise ValueError(
                    f"sample_weight is 0 on every {part} sample of cross-validation fold {k + 1} "
                    f"of {len(folds)}: that fold has nothing to {task}. Shuffle the folds "
                    "(cv=KFold(n_splits, shuffle=True, random_state=0)) or drop the samples of "
                    "weight 0")


def _check_scoring_classes(scoring, scorer, X, y):
    """``ValueError`` naming ``scoring`` when the scorer cannot score these classes (a binary
    scorer such as ``"roc_auc"`` with 3 classes), found before any fold runs: the scorer is
    tried on a constant model that predicts the class frequencies (named scorers only: a
    callable may need the attributes of a real fit)."""
    import warnings

    from sklearn.dummy import DummyClassifier

    if not isinstance(scoring, str):
        return
    dummy = DummyClassifier(strategy="prior").fit(np.zeros((len(y), 1)), y)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scorer.scorer(dummy, np.zeros((len(y), 1)), y, sample_weight=None)
    except (ValueError, TypeError) as exc:
        n = np.unique(y).size
        raise ValueError(
            f"scoring={scoring!r} cannot score this {n}-class problem ({exc}); use a scorer for "
            f"{'several classes' if n > 2 else 'these labels'}, e.g. 'neg_log_loss' (default), "
            "'accuracy', 'roc_auc_ovr' or 'f1_macro'") from None


class _SparseLinearCVBase(BaseEstimator):
    _single = None  # the single-fit estimator class

    _parameter_constraints: dict = constraints(*_SHARED, "alphas", "eps", "cv", "n_jobs")

    def __init__(self, penalty="l1", penalty_params=None, *, l1_ratio=1.0, alphas=100, eps=1e-3,
                 cv=None, n_jobs=None, solver="auto", tol=1e-5, max_iter=None,
                 fit_intercept=True, scaling="dropout", solver_params=None, verbose=False,
                 positive=False, penalty_weights=None, groups=None, group_l1_ratio=0.0):
        self.groups = groups
        self.group_l1_ratio = group_l1_ratio
        self.penalty = penalty
        self.penalty_params = penalty_params
        self.l1_ratio = l1_ratio
        self.alphas = alphas
        self.eps = eps
        self.cv = cv
        self.n_jobs = n_jobs
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.fit_intercept = fit_intercept
        self.scaling = scaling
        self.solver_params = solver_params
        self.verbose = verbose
        self.positive = positive
        self.penalty_weights = penalty_weights

    def _sample_weight_equivalence_failure(self):
        """Why the sample-weight equivalence checks fail (see
        :func:`~dualdrop.linear.estimators.expected_failed_checks`)."""
        return ("cross-validation: repeated rows move between folds, so the two fits are "
                "cross-validated on different splits (as for scikit-learn's LassoCV)")

    _shared = _SHARED

    def _single_estimator(self):
        return self._single(**{k: getattr(self, k) for k in self._shared})

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _cv_path(self, X, y, sw, datafit, score):
        """Grid, per-fold scores ``(n_folds, n_alphas)`` (``score(est, X, y, sw)``: higher is
        better) and the refitted estimator."""
        single = self._single_estimator()
        single._check_params()  # penalty errors before any fold runs
        if isinstance(self.alphas, Integral):
            alphas = alpha_grid(X, y, int(self.alphas), float(self.eps), estimator=single,
                                sample_weight=sw, names=("alphas", "eps"))
        else:
            alphas = check_alphas(self.alphas)
        cv = check_cv(self.cv, y, classifier=datafit in ("logistic", "multinomial"))
        folds = list(cv.split(X, y))
        _check_folds(folds, sw)
        out = Parallel(n_jobs=self.n_jobs)(
            delayed(_fold)(single, X, y, sw, train, test, alphas, score)
            for train, test in folds)
        scores = np.vstack([s for s, _ in out])
        warn_unconverged([m for _, ms in out for m in ms], alphas.size * len(folds),
                          "cross-validation paths")
        best = int(np.argmax(scores.mean(axis=0)))  # first maximum: the largest alpha
        self.alphas_ = alphas
        self.alpha_ = float(alphas[best])
        final = clone(single).set_params(alpha=self.alpha_).fit(X, y, sample_weight=sw)
        names = getattr(self, "feature_names_in_", None)
        if names is not None:  # X reached the refit as an array: the names are this fit's
            final.feature_names_in_ = names
        self.estimator_ = final
        for attr in ("coef_", "intercept_", "n_iter_", "criterion_", "solver_"):
            setattr(self, attr, getattr(final, attr))
        self.n_features_in_ = final.n_features_in_
        return scores

    def _validated(self, X, y, sample_weight, **kw):
        """Checked ``X`` (CSR when sparse: folds index rows), ``y`` and ``sample_weight``."""
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=[np.float64, np.float32],
                              **kw)
        if not isinstance(self.alphas, Integral) and np.ndim(self.alphas) != 1:
            raise ValueError(f"alphas must be an integer (the number of alphas) or a 1-D array "
                             f"of alphas, got {self.alphas!r}")
        sw = None
        if sample_weight is not None:
            normalized_sample_weight(sample_weight, X.shape[0])  # the checks, naming it
            sw = np.broadcast_to(real_sample_weight(sample_weight), (X.shape[0],))
        return X, y, sw


def _neg_mse(est, X, y, sw):
    pred = np.asarray(X @ est.coef_).ravel() + est.intercept_  # X is checked already
    return -float(np.average((y - pred) ** 2, weights=sw))


class _Scorer:
    """A scikit-learn scorer called as ``score(est, X, y, sw)`` (picklable for joblib)."""

    def __init__(self, scorer):
        self.scorer = scorer

    def __call__(self, est, X, y, sw):
        return float(self.scorer(est, X, y, sample_weight=sw))


class SparseLinearRegressionCV(RegressorMixin, _SparseLinearCVBase):
    """:class:`~dualdrop.linear.SparseLinearRegression` with ``alpha`` chosen by
    cross-validation along warm-started regularization paths (see the module docstring).

    Parameters
    ----------
    penalty, penalty_params, l1_ratio, solver, tol, max_iter, fit_intercept, scaling,
    solver_params, verbose, positive, penalty_weights
        As in :class:`~dualdrop.linear.SparseLinearRegression`.
    alphas : int or array-like, default=100
        The number of alphas on the grid from ``alpha_max`` down to ``eps * alpha_max``, or the
        grid itself (sorted decreasing).
    eps : float in (0, 1), default=1e-3
        ``alpha_min / alpha_max`` of the grid.
    cv : int, cross-validation splitter or iterable, default=None
        scikit-learn's ``cv``: ``None`` is 5-fold ``KFold`` (no shuffling), an int the number of
        folds.
    n_jobs : int or None
        Folds fitted in parallel (joblib).

    Attributes
    ----------
    alpha_ : the chosen alpha; alphas_ : the grid (decreasing); mse_path_ : array of shape
    (n_alphas, n_folds), the test mean squared error (sample-weighted when ``sample_weight`` is
    given) of each fit; coef_, intercept_, n_iter_, criterion_, solver_ : of the model refitted
    on all the data at ``alpha_`` (``estimator_``).
    """

    _single = SparseLinearRegression

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Choose ``alpha`` by cross-validation and refit; ``sample_weight`` enters the fits and
        the test errors."""
        X, y, sw = self._validated(X, y, sample_weight, y_numeric=True)
        y = np.asarray(y, dtype=np.float64)
        self.mse_path_ = -self._cv_path(X, y, sw, "quadratic", _neg_mse).T
        return self

    def predict(self, X):
        check_is_fitted(self)
        return self.estimator_.predict(X)


class SparseLogisticRegressionCV(ClassifierMixin, _SparseLinearCVBase):
    """:class:`~dualdrop.linear.SparseLogisticRegression` with ``alpha`` chosen by
    cross-validation along warm-started regularization paths (see the module docstring).

    Parameters as :class:`SparseLinearRegressionCV`, plus ``scoring`` (a scikit-learn scorer
    name or callable, default ``"neg_log_loss"``; scikit-learn's ``LogisticRegressionCV`` uses
    accuracy until its version 1.11 and then the log loss too). ``cv=None`` is 5-fold
    ``StratifiedKFold``.

    Attributes
    ----------
    alpha_, alphas_ as in :class:`SparseLinearRegressionCV`; scores_ : array of shape
    (n_folds, n_alphas), the test score of each fit (higher is better, the layout of
    ``LogisticRegressionCV.scores_`` per class); classes_, coef_, intercept_, n_iter_,
    criterion_, solver_ of the model refitted on all the data (``estimator_``).
    """

    _single = SparseLogisticRegression

    _parameter_constraints: dict = {**_SparseLinearCVBase._parameter_constraints,
                                    "scoring": [str, callable]}

    def __init__(self, penalty="l1", penalty_params=None, *, l1_ratio=1.0, alphas=100, eps=1e-3,
                 cv=None, n_jobs=None, scoring="neg_log_loss", solver="auto", tol=1e-5,
                 max_iter=None, fit_intercept=True, scaling="dropout", solver_params=None,
                 verbose=False, positive=False, penalty_weights=None, groups=None,
                 group_l1_ratio=0.0):
        super().__init__(penalty, penalty_params, l1_ratio=l1_ratio, alphas=alphas, eps=eps,
                         cv=cv, n_jobs=n_jobs, solver=solver, tol=tol, max_iter=max_iter,
                         fit_intercept=fit_intercept, scaling=scaling,
                         solver_params=solver_params, verbose=verbose, positive=positive,
                         penalty_weights=penalty_weights, groups=groups,
                         group_l1_ratio=group_l1_ratio)
        self.scoring = scoring

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Choose ``alpha`` by cross-validation and refit; ``sample_weight`` enters the fits and
        the test scores."""
        X, y, sw = self._validated(X, y, sample_weight)
        self.classes_ = class_labels(y, sample_weight=sw)
        scorer = _Scorer(check_scoring(self._single_estimator(), scoring=self.scoring))
        _check_scoring_classes(self.scoring, scorer, X, y)
        self.scores_ = self._cv_path(X, y, sw, "logistic", scorer)
        return self

    def decision_function(self, X):
        check_is_fitted(self)
        return self.estimator_.decision_function(X)

    def predict_proba(self, X):
        check_is_fitted(self)
        return self.estimator_.predict_proba(X)

    def predict_log_proba(self, X):
        check_is_fitted(self)
        return self.estimator_.predict_log_proba(X)

    def predict(self, X):
        check_is_fitted(self)
        return self.estimator_.predict(X)


def _neg_mean_loss(est, X, y, sw):
    """The negative mean datafit loss of a fitted GLM estimator on held-out data (the half
    deviance for Poisson and Gamma, the held-out partial likelihood for Cox)."""
    from .families.cox import survival_target

    df = est._make_datafit(None if sw is None else normalized_sample_weight(sw, X.shape[0]))
    y = survival_target(y) if df.name == "cox" else np.asarray(y, dtype=np.float64)
    z = np.asarray(X @ est.coef_).ravel() + est.intercept_
    return -float(df.value(y, z))


class SparseGLMCV(RegressorMixin, _SparseLinearCVBase):
    """:class:`~dualdrop.linear.SparseGLM` (Poisson, Gamma, Huber, quantile, Cox) with ``alpha``
    chosen by cross-validation along warm-started paths (see the module docstring).

    Parameters as :class:`SparseLinearRegressionCV`, plus ``datafit`` and ``datafit_params``
    (as in ``SparseGLM``; for ``"quantile"`` the ``delta`` of ``datafit_params`` is the smoothing
    of every fit, default 1e-3 in the units of ``y``) and ``scoring``: ``None`` (default) scores
    a fit by the negative mean loss of its datafit on the held-out fold (the half deviance for
    Poisson and Gamma, the partial likelihood of the held-out samples for Cox), or a
    scikit-learn scorer name or callable.

    Attributes: ``alpha_``, ``alphas_``, ``scores_`` (``n_folds x n_alphas``, higher is
    better), and ``coef_``, ``intercept_``, ``n_iter_``, ``criterion_``, ``solver_`` of the
    model refitted on all the data (``estimator_``).
    """

    _parameter_constraints: dict = {
        **_SparseLinearCVBase._parameter_constraints,
        **constraints("datafit_params"),
        "datafit": [StrOptions(set(GLM_DATAFITS)), HasMethods(["value", "raw_grad", "raw_hess"])],
        "scoring": [str, callable, None],
    }
    _shared = _SHARED + ("datafit", "datafit_params")

    def __init__(self, datafit="poisson", datafit_params=None, penalty="l1", penalty_params=None,
                 *, l1_ratio=1.0, alphas=100, eps=1e-3, cv=None, n_jobs=None, scoring=None,
                 solver="auto", tol=1e-5, max_iter=None, fit_intercept=True, scaling="dropout",
                 solver_params=None, verbose=False, positive=False, penalty_weights=None,
                 groups=None, group_l1_ratio=0.0):
        super().__init__(penalty, penalty_params, l1_ratio=l1_ratio, alphas=alphas, eps=eps,
                         cv=cv, n_jobs=n_jobs, solver=solver, tol=tol, max_iter=max_iter,
                         fit_intercept=fit_intercept, scaling=scaling,
                         solver_params=solver_params, verbose=verbose, positive=positive,
                         penalty_weights=penalty_weights, groups=groups,
                         group_l1_ratio=group_l1_ratio)
        self.datafit = datafit
        self.datafit_params = datafit_params
        self.scoring = scoring

    _single = SparseGLM

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Choose ``alpha`` by cross-validation and refit; ``sample_weight`` enters the fits and
        the held-out scores."""
        X, y, sw = self._validated(X, y, sample_weight, multi_output=True)
        self._single_estimator()._check_target(y)  # the datafit's target errors, once
        score = (_neg_mean_loss if self.scoring is None else
                 _Scorer(check_scoring(self._single_estimator(), scoring=self.scoring)))
        name = self.datafit if isinstance(self.datafit, str) else self.datafit.name
        self.scores_ = self._cv_path(X, y, sw, name, score)
        return self

    def predict(self, X):
        check_is_fitted(self)
        return self.estimator_.predict(X)

    def score(self, X, y, sample_weight=None):
        check_is_fitted(self)
        return self.estimator_.score(X, y, sample_weight)


class SparseMultinomialRegressionCV(ClassifierMixin, _SparseLinearCVBase):
    """:class:`~dualdrop.linear.SparseMultinomialRegression` with ``alpha`` chosen by
    cross-validation (stratified folds, ``scoring="neg_log_loss"`` by default), as
    :class:`SparseLogisticRegressionCV`; plus ``grouped`` (see the estimator)."""

    _parameter_constraints: dict = {
        **{k: v for k, v in _SparseLinearCVBase._parameter_constraints.items()
           if k not in ("groups", "group_l1_ratio")},
        **constraints("grouped"), "scoring": [str, callable]}
    _shared = tuple(k for k in _SHARED if k not in ("groups", "group_l1_ratio")) + ("grouped",)

    def __init__(self, penalty="l1", penalty_params=None, *, grouped=True, l1_ratio=1.0,
                 alphas=100, eps=1e-3, cv=None, n_jobs=None, scoring="neg_log_loss",
                 solver="auto", tol=1e-5, max_iter=None, fit_intercept=True, scaling="dropout",
                 solver_params=None, verbose=False, positive=False, penalty_weights=None):
        self.penalty = penalty
        self.penalty_params = penalty_params
        self.grouped = grouped
        self.l1_ratio = l1_ratio
        self.alphas = alphas
        self.eps = eps
        self.cv = cv
        self.n_jobs = n_jobs
        self.scoring = scoring
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.fit_intercept = fit_intercept
        self.scaling = scaling
        self.solver_params = solver_params
        self.verbose = verbose
        self.positive = positive
        self.penalty_weights = penalty_weights

    _single = SparseMultinomialRegression

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Choose ``alpha`` by cross-validation and refit."""
        X, y, sw = self._validated(X, y, sample_weight)
        self.classes_ = class_labels(y, sample_weight=sw)
        scorer = _Scorer(check_scoring(self._single_estimator(), scoring=self.scoring))
        _check_scoring_classes(self.scoring, scorer, X, y)
        self.scores_ = self._cv_path(X, y, sw, "multinomial", scorer)
        return self

    def predict_proba(self, X):
        check_is_fitted(self)
        return self.estimator_.predict_proba(X)

    def predict(self, X):
        check_is_fitted(self)
        return self.estimator_.predict(X)
