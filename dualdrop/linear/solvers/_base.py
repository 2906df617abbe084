"""One base for every solver: what it needs from the problem, checked in one place.

A solver declares ``requires`` (names from :data:`REQUIREMENTS`: what it needs from the penalty
and the datafit), its default ``tol`` and ``max_iter``, and implements ``_solve(problem, w, b,
*, tol, max_iter, verbose, **options)`` from a checked start point. :meth:`BaseSolver.solve` does
the rest once for all: the capability check (``ValueError`` with the reason), the option names
(``ValueError`` listing the valid ones), ``tol``/``max_iter``, the start point, the timing and the
:class:`~dualdrop.linear._problem.SolverResult` (the model of skglm's ``BaseSolver.solve`` with
``check_attrs``).
"""

from __future__ import annotations

import inspect

import numpy as np

from .. import _penalty
from .._problem import Problem, SolverResult, Timer
from ._common import check_tol_iter, start_point


def _has_dual_f(P):
    try:
        P.f(np.array([1.0]))
    except (NotImplementedError, AttributeError):
        return False
    return True


def _convex_l1_lp(P):
    name = getattr(P, "name", "")
    return name == "l1" or (name == "lp" and float(P.params.get("p", 0)) >= 1.0)


# name -> (predicate(problem), what is missing when it fails)
REQUIREMENTS = {
    "kernel": (lambda pr: pr.spec is not None,
               "a separable penalty with a compiled prox (kernel_spec)"),
    "separable": (lambda pr: _penalty.is_separable(pr.penalty),
                  "a separable penalty (with eta_hat)"),
    "dual_f": (lambda pr: _has_dual_f(pr.penalty), "a penalty with a dual function f"),
    "concave_in_abs": (lambda pr: _penalty.is_concave_in_abs(pr.penalty),
                       "a penalty concave in |w| (Omega' nonincreasing)"),
    "convex_l1_lp": (lambda pr: _convex_l1_lp(pr.penalty),
                     "a convex penalty: l1 or lp with p >= 1"),
    "quadratic": (lambda pr: pr.datafit.code == 0, "the least-squares datafit"),
    "classical": (lambda pr: pr.datafit.code in (0, 1),
                  "the least-squares or logistic datafit (the other families: 'cd', "
                  "'reweighted_l1')"),
}


class UnsupportedProblem(ValueError):
    """Raised by :meth:`BaseSolver.solve` for a problem the solver cannot handle; ``reason``
    says why (the estimators add the solvers that can)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class BaseSolver:
    """Subclasses set ``name``, ``requires``, ``default_tol``, ``default_max_iter`` and define
    ``_solve``; the keyword-only parameters of ``_solve`` beyond ``tol``, ``max_iter`` and
    ``verbose`` are the solver's options."""

    name = "solver"
    requires: tuple = ()
    default_tol = 1e-5
    default_max_iter = 100
    supports_positive = False  # the constraint w >= 0 (Problem.positive)
    multitask = False  # multi-output problems (dualdrop.linear.multitask.MultiTaskProblem)
    grouped = False  # penalties on groups of features (dualdrop.linear._groups.GroupProblem)
    multinomial = False  # dualdrop.linear.multinomial.MultinomialProblem
    _COMMON = ("tol", "max_iter", "verbose")

    def supports(self, problem: Problem):
        """``None`` if the solver can handle ``problem``, else the reason it cannot."""
        if getattr(problem, "multitask", False) != self.multitask:
            return (f"{self.name} solves {'multi' if self.multitask else 'single'}-output "
                    "problems only" + ("" if self.multitask else "; use 'bcd'"))
        if getattr(problem, "grouped", False) and not self.grouped:
            return f"{self.name} does not handle groups= (use 'cd')"
        if getattr(problem, "multinomial", False) and not self.multinomial:
            return f"{self.name} does not fit the multinomial model (use 'cd')"
        if problem.positive and not self.supports_positive:
            return f"{self.name} does not handle positive=True (use 'cd' or 'cvxpy')"
        for req in self.requires:
            ok, what = REQUIREMENTS[req]
            if not ok(problem):
                return f"{self.name} needs {what}; {problem.penalty!r} with the " \
                       f"{problem.datafit.name} datafit does not qualify"
        return None

    @property
    def options(self):
        """Names of the solver-specific keyword arguments (``solver_params`` keys)."""
        cls = type(self)
        if "_options" not in cls.__dict__:  # once per class: inspect costs ~0.1 ms per call
            sig = inspect.signature(self._solve)
            cls._options = tuple(k for k, p in sig.parameters.items()
                                 if p.kind is p.KEYWORD_ONLY and k not in self._COMMON)
        return cls._options

    def check_options(self, opts):
        unknown = sorted(set(opts) - set(self.options))
        if unknown:
            common = [k for k in unknown if k in self._COMMON]
            hint = (f" ({', '.join(common)} are estimator parameters, not solver_params)"
                    if common else "")
            raise ValueError(f"solver {self.name!r} has no option(s) {unknown}{hint}; valid "
                             f"solver_params keys: {list(self.options)}")

    def solve(self, problem: Problem, w0=None, b0=None, *, tol=None, max_iter=None,
              verbose=False, **opts) -> SolverResult:
        """Solve ``problem`` from ``(w0, b0)`` (``None``: zeros and the best intercept).
        ``result.info["stop"]`` says why the solver stopped: ``"converged"``, ``"max_iter"`` or
        ``"stalled"`` (no acceptable step, or no progress, before ``max_iter``)."""
        reason = self.supports(problem)
        if reason:
            raise UnsupportedProblem(reason)
        self.check_options(opts)
        tol, max_iter = check_tol_iter(self.default_tol if tol is None else tol,
                                       self.default_max_iter if max_iter is None else max_iter)
        w, b = self._start(problem, w0, b0)
        with Timer() as timer:
            out = self._solve(problem, w, b, tol=tol, max_iter=max_iter, verbose=verbose, **opts)
        w, b, n_iter, history, crit, converged = out[:6]
        info = dict(out[6]) if len(out) > 6 else {}
        info.setdefault("stop", "converged" if converged else
                        ("max_iter" if n_iter >= max_iter else "stalled"))
        info["max_iter"] = max_iter
        return SolverResult(coef=w, intercept=b if np.ndim(b) else float(b), n_iter=int(n_iter),
                            objective=np.asarray(history, dtype=np.float64),
                            criterion=float(crit), converged=bool(converged), solver=self.name,
                            time=timer.elapsed, info=info)

    def _start(self, problem, w0, b0):
        """The checked start point (a copy); problems with coefficient matrices have their
        own (``start_point``)."""
        if hasattr(problem, "start_point"):
            return problem.start_point(w0, b0)
        return start_point(problem, w0, b0)

    def _solve(self, problem, w, b, *, tol, max_iter, verbose):  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self):
        return f"<solver {self.name!r}>"
