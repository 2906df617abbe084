"""The base of the structured one-shot methods (the consumer-layer problem they solve:
``problem``).

A method (one module of this package, one line in its registry) implements ``_select(problem,
n_keep) -> kept units``; :meth:`UnitMethod.solve` then refits (``refit``: default per method),
polishes the kept set by exact swaps (``polish``, ``_kept.swap_search``) and compensates the
bias. Scoring methods also give ``scores(problem)`` (higher = keep), which the ``"flap"``
allocation standardizes and compares across layers.
"""

from __future__ import annotations

import numpy as np

from penalties.checks import check_float, check_int

from ._kept import swap_search
# the problem's names are re-exported here for the methods and their callers
from .problem import UnitProblem, UnitSolution, objective, quad, refit, solve_psd  # noqa: F401

#: options every structured method takes
COMMON_DEFAULTS = {"refit": True, "polish": False, "max_swaps": 50, "refit_damp": 1e-6}


class UnitMethod:
    """Base of every structured one-shot method: ``name``, ``defaults`` (its options; the
    common ones of :data:`COMMON_DEFAULTS` are added, each method may change their default in
    ``common``), ``_select(problem, n_keep)``, and ``scores(problem)`` for scoring methods."""

    name: str = ""
    defaults: dict = {}
    common: dict = {}
    scoring: bool = False

    def __init__(self, **options):
        known = {**COMMON_DEFAULTS, **self.common, **self.defaults}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for structured method "
                             f"{self.name!r}; its options: {sorted(known)}")
        opts = {**known, **options}
        for k in ("refit", "polish"):
            if not isinstance(opts[k], bool):
                raise TypeError(f"{k} must be True or False, got {opts[k]!r}")
        if opts["polish"] and not opts["refit"]:
            raise ValueError("polish=True scores swaps by the refit objective; it needs "
                             "refit=True")
        opts["max_swaps"] = check_int("max_swaps", opts["max_swaps"], low=0)
        opts["refit_damp"] = check_float("refit_damp", opts["refit_damp"], low=0.0)
        self.options = self._validate(opts)

    def _validate(self, opts: dict) -> dict:
        return opts

    def __repr__(self):
        ref = {**COMMON_DEFAULTS, **self.common, **self.defaults}
        inner = ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v != ref.get(k))
        return f"{type(self).__name__}({inner})"

    def scores(self, problem: UnitProblem) -> np.ndarray:
        raise NotImplementedError(f"{self.name} has no unit scores")

    def _select(self, problem: UnitProblem, n_keep: int) -> np.ndarray:
        if self.scoring:
            return top_units(self.scores(problem), n_keep)
        raise NotImplementedError

    def solve(self, problem: UnitProblem, n_keep: int) -> UnitSolution:
        """Keep ``n_keep`` units of ``problem`` (module docstring)."""
        n_keep = check_int("n_keep", n_keep, low=0, high=problem.n_units)
        info: dict = {}
        if n_keep == problem.n_units:
            kept = np.arange(problem.n_units)
        else:
            kept = np.sort(np.asarray(self._select(problem, n_keep), dtype=np.int64))
            if kept.size != n_keep or np.unique(kept).size != n_keep:
                raise RuntimeError(f"structured method {self.name!r} kept {kept.size} units "
                                   f"instead of {n_keep}: a bug in the method")
            info.update(getattr(self, "info", {}))
            if self.options["polish"] and 0 < n_keep < problem.n_units:
                kept, info["swaps"] = swap_search(problem, kept, self.options["max_swaps"],
                                                  self.options["refit_damp"])
        if self.options["refit"]:
            W = refit(problem, kept, self.options["refit_damp"])
        else:
            W = np.zeros_like(problem.W0)
            S = problem.kept_columns(kept)
            W[:, S] = problem.W0[:, S]
        b = problem.b0
        if problem.centered and b is not None:
            b = b + problem.W0 @ problem.mu_target - W @ problem.mu
        return UnitSolution(kept, W, b, objective(problem, W), info)


def top_units(scores, n_keep: int) -> np.ndarray:
    """The ``n_keep`` units of highest score (ties to the lower index)."""
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    return np.sort(order[:n_keep])


def column_sums(values: np.ndarray, columns) -> np.ndarray:
    """``sum_{j in c_g} values[j]`` for every unit ``g``."""
    return np.array([float(values[c].sum()) for c in columns])
