"""scikit-learn estimators: :class:`SparseLinearRegression` and :class:`SparseLogisticRegression`.

Objective (``n`` samples, ``lambda = alpha``, ``rho = l1_ratio``)::

    least squares:  (1/2n) ||y - X w - b||^2            + alpha * sum_j Omega_rho(s_j w_j)
    logistic:       (1/n) sum_i log(1 + exp(-y_i z_i))   + alpha * sum_j Omega_rho(s_j w_j)
    Omega_rho(u) = rho * Omega(u) + (1 - rho) / 2 * u^2

with ``Omega`` any separable penalty of the :mod:`penalties` catalog (or the top-k indicator with
the ``adaprox`` solver). ``l1_ratio = 1`` (default) is the penalty alone; below 1 a ridge term is
added: scikit-learn's ``ElasticNet(alpha, l1_ratio)`` exactly for ``penalty="l1"`` and
``scaling="none"``, the Mnet of Huang et al. (2016) for MCP/SCAD (see ``_penalty.WithRidge``).

Sample weights (``fit(X, y, sample_weight=v)``): the average over samples becomes the weighted
average ``(1 / sum_i v_i) sum_i v_i loss_i``, scikit-learn's convention for Lasso/ElasticNet and
the objective of ``LogisticRegression(C, sample_weight=v)`` at ``alpha = 1 / (C sum_i v_i)``:
integer weights are row repetitions, a zero weight removes a row; the column scales ``s_j`` use
the weighted second moments. Least squares becomes the unweighted problem on rows scaled by
``sqrt(v_i n / sum v)`` (:class:`._fitdata.LeastSquaresData`), logistic weighs its datafit.

Column scaling (``scaling``). The dropout/penalty duality is exact for standardized columns
(``c_j = ||x_j||^2 / n = 1``). For other columns, adaptive dropout with keep ratio ``alpha_j``
adds ``1/2 sum_j c_j (1/alpha_j - 1) w_j^2 = lambda/2 sum_j (sqrt(c_j) w_j)^2 / eta_j`` to the loss,
so the penalty it induces is ``lambda Omega(sqrt(c_j) w_j)``: the penalty acts on the coefficient
a standardized column would have. ``scaling="dropout"`` (default) fits exactly that, with
``s_j = sqrt(c_j)`` (``c_j`` of the design as given, not centred: dropout does not touch the
intercept); internally the solvers see ``X_j / s_j`` and the coefficients are mapped back, so
``coef_`` is always on the scale of the data you passed. ``scaling="none"`` uses ``s_j = 1``
(``Omega(w_j)``, the scikit-learn/skglm convention). Both coincide on standardized designs; an
all-zero column gets ``s_j = 1`` and a zero coefficient.

Nested penalty parameters: pass ``penalty="logsum", penalty_params={"eps": 2.0}``;
``get_params()`` also lists ``penalty_params__eps`` and ``set_params(penalty_params__eps=...)``
works, so ``GridSearchCV(est, {"penalty_params__eps": [...], "alpha": [...]})`` searches penalty
parameters. With a penalty object (``penalty=penalties.LogSum(eps=2.0)``) the keys are
``penalty__eps`` (``set_params`` builds a new object). Estimators clone and pickle.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from penalties._checks import as_real_array

from . import _penalty
from ._fitdata import GLMData, LeastSquaresData
from ._groups import GroupProblem, check_groups
from ._scale import plan_scaling
from ._problem import Problem
from ._start import convex_start, needs_convex_start
from ._validation import class_labels, constraints, fit_context, unchanged_on_error, validate_data
from .datafits import Logistic, Quadratic, normalized_sample_weight
from .solvers import UnsupportedProblem, get_solver

__all__ = ["SparseLinearRegression", "SparseLogisticRegression", "expected_failed_checks"]

_NESTED = "penalty_params__"
_NESTED_OBJ = "penalty__"


_SAMPLE_WEIGHT_CHECKS = tuple(f"check_sample_weight_equivalence_on_{kind}_data"
                               for kind in ("dense", "sparse"))


def expected_failed_checks(estimator):
    """scikit-learn's estimator checks that ``estimator`` is expected to fail, with the reason:
    ``{check name: reason}``, the form of ``check_estimator(est, expected_failed_checks=...)``
    and of the callable ``parametrize_with_checks(..., expected_failed_checks=...)``
    (scikit-learn 1.6 removed the ``_xfail_checks`` estimator tag; its tags have no field for
    this since).

    The sample-weight equivalence checks compare a fit with integer weights to a fit on the
    rows repeated that many times. Both minimize the same objective, but the two runs see
    different data (a weighted, centred design against repeated rows), so their iterates differ
    by rounding from the first step on. With a convex penalty both reach the unique minimizer
    (the checks pass, at tight ``tol`` too: ``tests/linear/test_lin_sample_weight.py``); with a
    nonconvex one (MCP, SCAD, log-sum, Lp with p < 1, ...) the objective has several stationary
    points, and two runs that start alike may end at different ones. Cross-validated
    estimators fail them for every penalty, as scikit-learn's ``LassoCV`` does: repeated rows
    move between folds, so the two fits are cross-validated on different splits.
    """
    hook = getattr(estimator, "_sample_weight_equivalence_failure", None)
    reason = hook() if hook is not None else None
    if reason is None:
        return {}
    return {name: reason for name in _SAMPLE_WEIGHT_CHECKS}


class SparseLinearBase(BaseEstimator):
    """What the single-output (here), multi-output (:mod:`.multitask`) and cross-validated
    (:mod:`.cv`) estimators share: parameters and their constraints, nested penalty
    parameters, the column scales, and the one resolve -> solve -> warn path
    (:meth:`_solve_problem`)."""

    _datafit = None

    # checked by scikit-learn's validation on every fit (``fit_context``): a wrong type or value
    # raises ``InvalidParameterError`` (a ``ValueError``) naming the parameter and what it
    # accepts; the entries come from the one table of ``_validation.PARAMETERS``
    _parameter_constraints: dict = constraints(
        "penalty", "penalty_params", "alpha", "solver", "tol", "max_iter", "fit_intercept",
        "warm_start", "scaling", "solver_params", "verbose", "positive", "penalty_weights",
        "l1_ratio", "groups", "group_l1_ratio", "start")

    def __init__(self, penalty="l1", penalty_params=None, alpha=1.0, *, l1_ratio=1.0,
                 solver="auto", tol=1e-5, max_iter=None, fit_intercept=True, warm_start=False,
                 scaling="dropout", solver_params=None, verbose=False, positive=False,
                 penalty_weights=None, groups=None, group_l1_ratio=0.0, start="best"):
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
        self.positive = positive
        self.penalty_weights = penalty_weights
        self.groups = groups
        self.group_l1_ratio = group_l1_ratio
        self.start = start

    # ---- nested penalty parameters ----------------------------------------------------------
    def get_params(self, deep=True):
        params = super().get_params(deep=False)
        if deep and isinstance(self.penalty_params, dict):
            for k, v in self.penalty_params.items():
                params[_NESTED + str(k)] = v
        if deep and not isinstance(self.penalty, str) and hasattr(self.penalty, "get_params"):
            for k, v in self.penalty.get_params().items():
                params[_NESTED_OBJ + str(k)] = v
        return params

    def set_params(self, **params):
        """scikit-learn's ``set_params`` with nested penalty parameters; a refused call (an
        unknown name, a bad nested value) leaves the estimator as it was."""
        with unchanged_on_error(self):
            return self._set_params(dict(params))

    def _set_params(self, params):
        nested = {k[len(_NESTED):]: params.pop(k) for k in list(params) if k.startswith(_NESTED)}
        nested_obj = {k[len(_NESTED_OBJ):]: params.pop(k) for k in list(params)
                      if k.startswith(_NESTED_OBJ)}
        for key in ("penalty", "penalty_params"):
            if key in params:
                super().set_params(**{key: params.pop(key)})
        if params:
            super().set_params(**params)
        if nested_obj:
            P = self.penalty
            if isinstance(P, str) or not hasattr(P, "get_params"):
                raise ValueError("penalty__<name> needs a penalty object; with a penalty name use "
                                 "penalty_params__<name>")
            # a new object (never mutate one that a clone may share)
            self.penalty = type(P)(**{**P.get_params(), **nested_obj})
        if nested:
            base = self.penalty_params
            if base is not None and not isinstance(base, dict):
                raise TypeError("penalty_params must be a dict to set penalty_params__<name>")
            new = dict(base or {})
            new.update(nested)
            self.penalty_params = new
        return self

    def __sklearn_clone__(self):
        # Penalty objects carry their own ``get_params`` (without sklearn's ``deep`` argument), so
        # sklearn's clone would treat them as estimators: copy them instead.
        params = super().get_params(deep=False)
        new = {}
        for k, v in params.items():
            if k == "penalty" and not isinstance(v, str):
                new[k] = copy.deepcopy(v)
            else:
                new[k] = clone(v, safe=False)
        return type(self)(**new)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _sample_weight_equivalence_failure(self):
        """Why the sample-weight equivalence checks fail, or ``None`` (see
        :func:`expected_failed_checks`)."""
        try:
            convex = self._check_params().is_convex
        except Exception:  # an invalid penalty: the checks report it themselves
            return None
        return None if convex else ("nonconvex penalty: the weighted fit and the fit on "
                                    "repeated rows may stop at different stationary points")

    # ---- checks -----------------------------------------------------------------------------
    def _check_params(self):
        """The penalty object (its parameters are checked by the catalog), with the ridge term
        when ``l1_ratio < 1``."""
        P = _penalty.resolve_penalty(self.penalty, self.penalty_params, alpha=self.alpha)
        return _penalty.with_ridge(P, self.l1_ratio)

    def _scaling(self, X, sw=None, y=None):
        """How the solvers see this fit (:mod:`._scale`): column divisors ``t`` (``scaling=
        "dropout"``: ``s_j = sqrt(sum_i sw_i x_ij^2 / n)``, 1 for a zero column; ``"none"``:
        ones, or one power of two for columns of extreme scale), and for least squares (``y``
        given) the target's divisor."""
        return plan_scaling(X, sw, self.scaling, y)

    def _group_structure(self, p):
        """``groups`` checked against ``p`` features (``None`` without groups); see
        :mod:`._groups`."""
        groups = getattr(self, "groups", None)  # the multi-output estimator has none
        if groups is None:
            if getattr(self, "group_l1_ratio", 0.0):
                raise ValueError(f"group_l1_ratio={self.group_l1_ratio!r} mixes an l1 term into "
                                 "a group penalty: it needs groups= (or leave it at 0)")
            return None
        return check_groups(groups, p)

    def _penalty_weights(self, p):
        """``penalty_weights`` as a checked array (``None``: all ones): one per feature, or one
        per group with ``groups``."""
        grp = self._group_structure(p)
        if self.penalty_weights is None:
            return None
        pw = as_real_array(self.penalty_weights, "penalty_weights", allow_inf=True)
        if grp is not None and pw.shape != (grp.n_groups,):
            raise ValueError(f"penalty_weights must have one entry per group ({grp.n_groups}) "
                             f"with groups=, got shape {pw.shape}")
        if grp is None and pw.shape != (p,):
            raise ValueError(f"penalty_weights must have one entry per feature ({p}), got shape "
                             f"{pw.shape}")
        if np.any(pw < 0):
            raise ValueError("penalty_weights must be >= 0 (0: unpenalized, inf: excluded), got "
                             f"{float(pw[pw < 0][0])!r}")
        return pw

    def _fit_prepared(self, prep, P=None):
        """The single-output fit from prepared data ``(data, dtype)`` (``_prepare``); the
        classifiers fit one problem per class instead."""
        data, dtype = prep
        P = self._check_params() if P is None else P
        w0 = b0 = None
        if self.warm_start and hasattr(self, "coef_") and np.shape(self.coef_) == data.s.shape:
            w0, b0 = data.to_solver(self.coef_, self.intercept_)
        res, name = self._solve_one(data, data.y, P, w0, b0)
        coef, intercept = data.from_solver(res.coef, res.intercept)
        # the objective in the user's units (the solver's is divided by cy^2; beyond ~1e154 the
        # objective itself is not a float: inf)
        with np.errstate(over="ignore"):
            objective = (res.objective if data.cy == 1.0
                         else np.asarray(res.objective) * data.cy * data.cy)
        return self._store(res, name, coef.astype(dtype, copy=False), dtype.type(intercept),
                           objective)

    def _store(self, res, name, coef, intercept, objective):
        """The fitted attributes of one solver result."""
        self.coef_ = coef
        self.intercept_ = intercept
        self.n_iter_ = int(res.n_iter)
        self.objective_ = objective
        self.criterion_ = float(res.criterion)
        self.solver_ = name
        return self

    def _problem(self, data, y, P, alpha):
        """The problem the solvers receive: a :class:`~._problem.Problem`, or with ``groups`` a
        :class:`~._groups.GroupProblem` (``P`` then split into the penalty of the group norms
        and the ridge share ``l1_ratio``; the intercept column of sparse weighted least squares
        a group of its own, unpenalized)."""
        P, alpha = data.scaling.solver_penalty(P, float(alpha))
        p = data.s.shape[0]
        grp = self._group_structure(p)
        weights = data.penalty_weights
        if data.extra and weights is None:  # the intercept column, unpenalized
            weights = np.append(np.ones(p if grp is None else grp.n_groups), 0.0)
        if grp is None:
            return Problem(data.design, y, data.datafit, P, float(alpha), data.fit_intercept,
                           weights=weights, positive=self.positive)
        if data.extra:
            grp = grp.with_extra_feature()
        ridged = isinstance(P, _penalty.WithRidge)
        return GroupProblem(data.design, y, data.datafit, P.penalty if ridged else P,
                            float(alpha), grp, data.fit_intercept, weights=weights,
                            positive=self.positive, l1_ratio=P.l1_ratio if ridged else 1.0,
                            group_l1_ratio=self.group_l1_ratio,
                            ridge_scale=P.ridge_scale if ridged else 1.0)

    def _solve_one(self, data, y, P, w0, b0):
        return self._solve_problem(self._problem(data, y, P, self.alpha), self.solver, w0, b0)

    def _solve_problem(self, problem, name, w0, b0):
        """Resolve the solver, solve, warn: the one path of every estimator (single- and
        multi-output). The solver checks the problem and the options once
        (``BaseSolver.solve``); ``"auto"`` is ``cd``, or ``adaprox`` when ``cd`` cannot handle
        the problem. Without a warm start and with a nonconvex penalty, ``start`` says where
        the solver starts (:mod:`._start`): ``"best"`` (default) runs it from the convex
        problem's solution and from 0 and keeps the lower objective, ``"convex"`` from the
        former, ``"zero"`` from the latter. Returns ``(result, solver name)``."""
        kwargs = dict(self.solver_params or {})
        if "max_iter" in kwargs or "tol" in kwargs or "verbose" in kwargs:
            get_solver("cd" if name == "auto" else name).check_options(kwargs)  # names them
        if self.max_iter is not None:
            kwargs["max_iter"] = int(self.max_iter)
        start = getattr(self, "start", "zero")
        starts = [(w0, b0, {})]
        if w0 is None and start != "zero" and needs_convex_start(problem) \
                and problem.spec is not None:
            cw, cb, info = convex_start(problem, float(self.tol), b0)
            if cw is not None:
                starts = [(cw, cb, info)] + (starts if start == "best" else [])
        res = cand = None
        for sw0, sb0, info in starts:
            r, c = self._run_solver(problem, name, sw0, sb0, kwargs)
            r.info.update(info or {"start": "zero" if sw0 is None else "given"})
            if res is None or r.final_objective < res.final_objective:
                res, cand = r, c
        if not res.converged:
            self._warn_unconverged(cand, res.n_iter, res.criterion, res.info.get("stop"),
                                   res.info.get("max_iter"))
        else:
            self._warn_biased(cand, res)
        return res, cand

    def _warn_biased(self, name, res):
        """A solver that stops on its own residual (``adaprox`` with ``eta_at="gradient_step"``,
        the paper's method: a fixed point ``O(step)`` away from a stationary point) reports the
        objective's optimality criterion in ``info["optimality"]``: a fit whose criterion
        exceeds ``tol`` there is not a solution of the objective, whatever the solver's own
        residual says. ``criterion_`` becomes that criterion, and a warning says so."""
        opt = res.info.get("optimality")
        if opt is None or not opt > float(self.tol):
            return
        res.info["residual"], res.criterion = res.criterion, float(opt)
        warnings.warn(
            f"{type(self).__name__} (solver={name!r}) stopped at a fixed point of its iteration "
            f"that is not a stationary point of the objective: optimality criterion {opt:.3e} > "
            f"tol={self.tol:g} (eta is taken at the gradient-step point, which biases the fixed "
            "points). Use solver_params={'eta_at': 'iterate'} (the same iteration on the "
            "objective's majorizer, whose fixed points are stationary) or solver='cd'.",
            ConvergenceWarning, stacklevel=4)

    def _run_solver(self, problem, name, w0, b0, kwargs):
        for cand in (("cd", "adaprox") if name == "auto" else (name,)):
            opts = kwargs
            if name == "auto" and cand == "adaprox" and _penalty.is_separable(problem.penalty):
                # the fallback for penalties without a compiled prox (built from callables):
                # eta at the iterate, whose fixed points are the stationary points (at the
                # gradient-step point they are not: criteria of 5e-3 against tol 1e-5, silently)
                opts = {"eta_at": "iterate", **kwargs}
            try:
                return get_solver(cand).solve(problem, w0, b0, tol=float(self.tol),
                                              verbose=bool(self.verbose), **opts), cand
            except UnsupportedProblem as err:
                if name == "auto" and cand == "cd":
                    continue
                from .solvers import capable_solvers

                raise ValueError(
                    f"solver={cand!r} cannot handle penalty {problem.penalty!r} with the "
                    f"{problem.datafit.name} datafit: {err.reason}. Solvers that can: "
                    f"{capable_solvers(problem)}") from None

    def _warn_unconverged(self, name, n_iter, criterion, stop=None, max_iter=None):
        crit = f"final optimality criterion {criterion:.3e} > tol={self.tol:g}"
        if stop == "max_iter":
            why = (f"{crit}: it stopped at max_iter={max_iter}. Increase max_iter, loosen tol, "
                   "or try another solver")
        elif stop == "stalled":
            why = (f"{crit}: it stalled after {n_iter} iterations (no step lowered the "
                   "objective any more). Loosen tol, or try another solver ('cd' reaches exact "
                   "zeros)")
        else:
            why = (f"{crit} after {n_iter} iterations. Increase max_iter, loosen tol, or try "
                   "another solver")
        warnings.warn(f"{type(self).__name__} (solver={name!r}) did not converge: {why}.",
                      ConvergenceWarning, stacklevel=4)


class SparseLinearRegression(RegressorMixin, SparseLinearBase):
    """Least squares with any effective penalty: ``(1/2n)||y - Xw - b||^2 + alpha sum Omega(s_j w_j)``.

    ``fit(X, y, sample_weight=None)``: with weights ``v`` the datafit is
    ``(1 / (2 sum v)) sum_i v_i (y_i - x_i w - b)^2`` (scikit-learn's Lasso/ElasticNet
    convention; see the module docstring).

    Parameters
    ----------
    penalty : str or penalty object, default="l1"
        A name of ``penalties.available()`` (``"l1"``, ``"logsum"``, ``"mcp"``, ``"scad"``, ``"lp"``,
        ``"log2sum"``, ``"vardrop"``, ``"hardconcrete"``, ... ) or a penalty object.
    penalty_params : dict or None
        Parameters of a named penalty, e.g. ``{"eps": 2.0}`` for LogSum. MCP and SCAD take
        ``lam``, the scale of their concave part: a number keeps it fixed while ``alpha`` varies
        (the default, ``lam=1``: ``alpha`` then only multiplies the penalty); ``"lam": "alpha"``
        makes it follow ``alpha``, so that ``alpha Omega`` is the classical
        ``MCP(w; lambda=alpha, gamma=a)`` of ncvreg/skglm (threshold ``alpha``, flat beyond
        ``a alpha``), the convention to use for a grid over ``alpha``. MCP with
        ``"lam": "alpha"`` requires ``a > 1``, as those packages do: on unit-norm columns
        (``scaling="dropout"``) each coordinate problem is then strictly convex. With a fixed
        ``lam`` any ``a > 0`` is accepted: the coordinate prox is the exact minimizer of the 1-D
        problem, which is hard thresholding when ``alpha / L_j >= a lam``.
    alpha : float, default=1.0
        The penalty strength lambda (>= 0).
    l1_ratio : float in [0, 1], default=1.0
        Share of ``alpha`` on the penalty; the rest is a ridge term:
        ``alpha * (l1_ratio * Omega(u) + (1 - l1_ratio) / 2 * u^2)`` per (scaled) coefficient
        ``u``. With ``penalty="l1"`` and ``scaling="none"`` this is scikit-learn's
        ``ElasticNet(alpha, l1_ratio)``; with MCP/SCAD the Mnet/Snet of Huang et al. (2016).
        Needs a penalty with a compiled kernel (all of the catalog but ``hard_threshold``) and
        a solver that takes it (``"cd"``, ``"irls"``, ``"adaprox"``, ``"adatikhonov"``,
        ``"dropout_sgd"``); ``"cvxpy"`` raises.
    solver : str, default="auto"
        ``"cd"`` (working-set coordinate descent, the default for separable penalties),
        ``"irls"``, ``"adaprox"``, ``"adatikhonov"``, ``"eta_trick"``, ``"reweighted_l1"``,
        ``"cvxpy"`` (convex penalties), ``"dropout_sgd"`` (adaptive dropout itself).
    tol : float, default=1e-5
        Tolerance on the optimality criterion: the largest coordinate-wise gradient mapping
        relative to the data's scale (``Problem.criterion``; unchanged when ``X`` or ``y`` is
        multiplied by a constant). The default gives an objective within 1e-6 relative of the
        optimum on the convex problems of the test suite and benchmarks.
    max_iter : int or None
        Solver iterations (``None``: the solver's default).
    fit_intercept, warm_start : bool (``True``/``False`` only)
    scaling : {"dropout", "none"}, default="dropout"
        How unstandardized columns are penalized (see the module docstring).
    positive : bool, default=False
        Constrain the coefficients to ``w >= 0`` (solvers ``"cd"`` and ``"cvxpy"``).
    penalty_weights : array of shape (n_features,) or None
        Per-feature multipliers of the penalty, ``lam_j = alpha * penalty_weights[j]`` (glmnet's
        ``penalty.factor``, skglm's ``weights``): 0 leaves a feature unpenalized, ``inf`` keeps
        it at 0. ``alpha_max`` and the path functions assume unit weights.
    solver_params : dict or None
        Options of the solver (e.g. ``{"inner": "cvxpy"}`` for reweighted l1); an unknown key
        raises ``ValueError`` listing the solver's options (``get_solver(name).options``).
    verbose : bool
        Progress bar.
    groups : int, list of sizes, list of index arrays, or None
        Penalize groups of features through their norms (``dualdrop.linear._groups``): the
        group lasso for ``penalty="l1"``, any penalty of the catalog on the group norms (group
        MCP, group log-sum, ...). An integer is the size of equal consecutive groups, a list
        of integers the sizes of consecutive groups, a list of index arrays the groups
        themselves (disjoint, covering every feature). ``penalty_weights`` then has one entry
        per group (``np.sqrt(sizes)`` gives Yuan & Lin's weighting).
    group_l1_ratio : float in [0, 1], default=0.0
        With ``groups``, the share of the penalty on the l1 norm of the coefficients: the sparse
        group lasso (``alpha ((1 - r) sum_g Omega(||u_g||) + r ||u||_1)``, scaled by
        ``l1_ratio`` when a ridge term is added).
    start : {"best", "convex", "zero"}, default="best"
        Where a fit with a nonconvex penalty starts without a warm start
        (``dualdrop.linear._start``): from the solution of the convex problem with the
        penalty's l1 majorant at 0 (``"convex"``), from 0 (``"zero"``), or from both, keeping
        the lower objective (``"best"``). Convex penalties start from 0.

    Attributes
    ----------
    coef_, intercept_, n_iter_, objective_ (objective history), criterion_ (final criterion),
    solver_ (the solver used), n_features_in_. ``coef_`` and ``intercept_`` have the dtype of
    ``X`` (float32 stays float32; the solvers compute in float64).
    """

    _datafit = Quadratic

    def _fit_data(self, X, y, sw):
        return LeastSquaresData(X, y, self._scaling(X, sw, y), sw, self.fit_intercept,
                                 self._penalty_weights(X.shape[1]), self.positive)

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Fit on ``X`` (dense or sparse), ``y``; ``sample_weight``: nonnegative weights of the
        samples (see the module docstring) or ``None``."""
        return self._fit_prepared(self._prepare(X, y, sample_weight))

    def _prepare(self, X, y, sample_weight):
        """Checked data and what the solvers receive, ``(data, dtype)``: the fits along a path
        reuse it (only ``alpha`` changes, see ``path.fit_path_chunk``)."""
        X, y = validate_data(self, X, y, accept_sparse="csc", dtype=[np.float64, np.float32],
                              y_numeric=True)
        dtype = X.dtype
        X, y = X.astype(np.float64, copy=False), np.asarray(y, dtype=np.float64)
        return self._fit_data(X, y, normalized_sample_weight(sample_weight, X.shape[0])), dtype


    def _path_prepared(self, prep, P, alphas, callback=None):
        """The fits at every ``alpha`` of ``alphas`` (decreasing, warm-started along the grid) in
        one compiled call of the ``cd`` solver (:func:`.solvers.cd.quadratic_path`), or ``None``
        when this configuration is not one it runs (another solver, a callback among the
        solver options): the caller then fits alpha by alpha. The estimator ends fitted at the
        last alpha; ``callback(self)`` runs after each fit is set on it (the path's scoring)."""
        from .solvers import cd

        if self.solver not in ("auto", "cd") or not set(self.solver_params or {}) <= set(
                cd.SOLVER.options) - {"callback"} or self.groups is not None:
            return None
        data, dtype = prep
        solver_alphas = alphas
        if not data.scaling.trivial:
            k = data.scaling.rescale(P)[1]
            solver_alphas = np.array([data.scaling.to_solver_alpha(float(a), k) for a in alphas])
        problem = self._problem(data, data.y, P, float(alphas[0]))
        try:
            W, B, n_iter, crit, conv = cd.quadratic_path(
                problem, solver_alphas, tol=float(self.tol), max_iter=self.max_iter,
                **(self.solver_params or {}))
        except UnsupportedProblem:
            return None
        fits = []
        for k, a in enumerate(alphas):
            coef, intercept = data.from_solver(W[k], float(B[k]))
            self.alpha = float(a)
            self.coef_ = coef.astype(dtype, copy=False)
            self.intercept_ = dtype.type(intercept)
            self.n_iter_ = int(n_iter[k])
            self.objective_ = None  # not recorded along a compiled path
            self.criterion_ = float(crit[k])
            self.solver_ = "cd"
            if not conv[k]:
                self._warn_unconverged("cd", self.n_iter_, self.criterion_, "max_iter",
                                       self.max_iter or cd.SOLVER.default_max_iter)
            fits.append((np.array(self.coef_, copy=True), np.copy(self.intercept_),
                         self.n_iter_, self.criterion_))
            if callback is not None:
                callback(self)
        return fits

    def predict(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32],
                           reset=False)
        return np.asarray(X @ self.coef_).ravel() + self.intercept_


class SparseLogisticRegression(ClassifierMixin, SparseLinearBase):
    """Logistic regression with any effective penalty:
    ``(1/n) sum log(1 + exp(-y_i z_i)) + alpha sum Omega(s_j w_j)``.

    ``fit(X, y, sample_weight=None)``: with weights ``v`` the datafit is
    ``(1 / sum v) sum_i v_i log(1 + exp(-y_i z_i))``, i.e. scikit-learn's
    ``LogisticRegression(C).fit(X, y, sample_weight=v)`` at ``alpha = 1 / (C sum v)``.

    Binary problems fit one model (``coef_`` of shape ``(1, p)``); with more classes, one-vs-rest
    (``coef_`` of shape ``(K, p)``). Same parameters as :class:`SparseLinearRegression` (but
    ``alpha`` defaults to 0.01: the logistic gradient at 0 is at most 1/2 per standardized column,
    so ``alpha = 1`` would give the empty model); the
    default solver is proximal Newton with coordinate descent (``"cd"``). ``n_iter_``,
    ``criterion_`` are arrays (one entry per binary problem), ``objective_`` a list of histories.
    """

    _datafit = Logistic

    def __init__(self, penalty="l1", penalty_params=None, alpha=0.01, *, l1_ratio=1.0,
                 solver="auto", tol=1e-5, max_iter=None, fit_intercept=True, warm_start=False,
                 scaling="dropout", solver_params=None, verbose=False, positive=False,
                 penalty_weights=None, groups=None, group_l1_ratio=0.0, start="best"):
        super().__init__(penalty, penalty_params, alpha, l1_ratio=l1_ratio, solver=solver,
                         tol=tol, max_iter=max_iter,
                         fit_intercept=fit_intercept, warm_start=warm_start, scaling=scaling,
                         solver_params=solver_params, verbose=verbose, positive=positive,
                         penalty_weights=penalty_weights, groups=groups,
                         group_l1_ratio=group_l1_ratio, start=start)

    def _fit_data(self, X, y, sw):
        return GLMData(X, self._scaling(X, sw), Logistic(sw), self.fit_intercept,
                       self._penalty_weights(X.shape[1]))

    @fit_context
    def fit(self, X, y, sample_weight=None):
        """Fit on ``X`` (dense or sparse) and class labels ``y``; ``sample_weight``:
        nonnegative weights of the samples (see the module docstring) or ``None``."""
        return self._fit_prepared(self._prepare(X, y, sample_weight))

    def _prepare(self, X, y, sample_weight):
        """Checked data, classes and what the solvers receive (see the regressor's)."""
        X, y = validate_data(self, X, y, accept_sparse="csc", dtype=[np.float64, np.float32])
        dtype = X.dtype
        X = X.astype(np.float64, copy=False)
        sw = normalized_sample_weight(sample_weight, X.shape[0])
        classes = class_labels(y, sample_weight=sw)
        data = self._fit_data(X, y, sw)
        targets = [classes[1]] if classes.size == 2 else list(classes)
        ys = [np.where(y == cls, 1.0, -1.0) for cls in targets]
        return data, dtype, ys, classes

    def _fit_prepared(self, prep, P=None):
        data, dtype, ys, classes = prep
        P = self._check_params() if P is None else P
        p = data.s.shape[0]
        old = getattr(self, "coef_", None)
        warm = (self.warm_start and old is not None and old.shape == (len(ys), p))
        coefs, icpts, iters, objs, crits = [], [], [], [], []
        for k, yk in enumerate(ys):
            w0, b0 = data.to_solver(old[k], self.intercept_[k]) if warm else (None, None)
            res, name = self._solve_one(data, yk, P, w0, b0)
            coef, intercept = data.from_solver(res.coef, res.intercept)
            coefs.append(coef)
            icpts.append(intercept)
            iters.append(res.n_iter)
            objs.append(res.objective)
            crits.append(res.criterion)
        self.classes_ = classes
        self.coef_ = np.vstack(coefs).astype(dtype, copy=False)
        self.intercept_ = np.asarray(icpts, dtype=dtype)
        self.n_iter_ = np.asarray(iters)
        self.objective_ = objs
        self.criterion_ = np.asarray(crits)
        self.solver_ = name
        return self

    def decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32],
                           reset=False)
        d = np.asarray(X @ self.coef_.T) + self.intercept_
        return d.ravel() if d.shape[1] == 1 else d

    def predict_proba(self, X):
        from scipy.special import expit

        d = self.decision_function(X)
        if d.ndim == 1:
            p1 = expit(d)
            return np.column_stack([1.0 - p1, p1])
        p = expit(d)
        return p / p.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))

    def predict(self, X):
        d = self.decision_function(X)
        if d.ndim == 1:
            return self.classes_[(d > 0).astype(int)]
        return self.classes_[np.argmax(d, axis=1)]
