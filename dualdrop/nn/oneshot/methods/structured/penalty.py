"""The duality's structured pruner: a penalty on the norms of the units' consumer columns.

By the eta-trick duality (LeJeune, Javadi & Baraniuk, NeurIPS 2021), adaptive dropout on a
consumer's *input units* (one rate per neuron, head or channel, shared by its columns) while the
layer reconstructs its trained output is least squares plus the dropout's effective penalty on
each unit's group norm::

    min_U  1/2 tr((U - U0) Gs (U - U0)^T) + alpha sum_g v_g Omega(||U[:, c_g]||_F)

in scale-free coordinates (``Gs = D^-1 A D^-1`` the unit-diagonal Gram, ``u_rj = d_j w_rj / s``,
``s`` making the group norms of ``U0`` of RMS 1, so one parameter of ``Omega`` means the same on
every layer). It is solved by the Gram-form block coordinate descent of ``dualdrop.linear``
(``solvers.gram_bcd``: the group prox of ``dualdrop.linear._groups``), ``alpha`` running down a
geometric path from ``alpha_max`` (no unit kept), each fit warm-started at the previous one (the
continuation that lets a nonconvex penalty find a good set), until at least ``n_keep`` units
are nonzero; the last bracket is bisected in ``log alpha`` to a fit within ``slack`` of the
budget. Exact greedy moves then land on ``n_keep`` units (``_kept.fix_count``), the kept set is
polished by exact swaps (``polish``, on by default) and the kept weights are refit.

:func:`unit_path_counts` gives a layer's kept units along ``alpha``: the ``"penalty"``
allocation shares one level across layers (``alpha_l = level * energy_l``, the unit prices as
``v_g``).
"""

from __future__ import annotations

import math

import numpy as np

import penalties
from dualdrop.linear.solvers.gram_bcd import gram_group_alpha_max, gram_group_cd
from penalties.checks import check_float, check_int

from ._kept import fix_count
from .base import UnitMethod, UnitProblem, quad, refit

#: parameters of the penalties on RMS-1 group norms (what a user passes overrides them)
DEFAULT_PARAMS = {"logsum": {"eps": 1.0}, "mcp": {"a": 1.0, "lam": 1.0}}


def resolve(name: str, params: dict | None):
    P = penalties.get(name, **{**DEFAULT_PARAMS.get(name, {}), **(params or {})})
    if getattr(P, "kernel_spec", lambda: None)() is None:
        raise ValueError(f"penalty={name!r} has no compiled kernel; use a separable catalog "
                         "penalty (every name of penalties.available() but 'hard_threshold')")
    return P


class Scaled:
    """One consumer in the coordinates of the module docstring, its groups as ``check_groups``
    index arrays (the units, then each free column as an unpenalized group)."""

    def __init__(self, problem: UnitProblem, weights=None):
        A = problem.A
        d = np.sqrt(np.clip(np.diag(A), 0.0, None))
        self.live = d > 0
        d = np.where(self.live, d, 1.0)
        self.Gs = A / np.outer(d, d)
        # the unconstrained optimum (W0 itself unless the target is the dense model's)
        W = problem.W0 if problem.cross is None else refit(problem, np.arange(problem.n_units))
        U0 = W * d
        n = problem.n_units
        norms2 = np.array([float((U0[:, c] ** 2).sum()) for c in problem.columns])
        rms = math.sqrt(float(norms2.mean())) if n and norms2.mean() > 0 else 1.0
        self.U0 = U0 / rms
        self.groups = [np.asarray(c, np.int64) for c in problem.columns] + [
            np.array([j]) for j in problem.free]
        w = np.ones(n) if weights is None else np.asarray(weights, np.float64)
        self.weights = np.concatenate([w, np.zeros(len(self.groups) - n)])
        self.n = n
        self.energy = quad(self.U0, self.Gs)

    def kept(self, U) -> np.ndarray:
        return np.array([g for g in range(self.n) if np.any(U[:, self.groups[g]] != 0)],
                        dtype=np.int64)


class UnitPath:
    """Warm-started fits of one consumer along decreasing ``alpha``."""

    def __init__(self, sc: Scaled, P, tol: float, max_epochs: int):
        self.sc, self.P, self.tol, self.max_epochs = sc, P, tol, max_epochs
        self.alpha_max = gram_group_alpha_max(sc.Gs, sc.U0, P, sc.groups, sc.weights)
        self.fits = 0

    def fit(self, alpha, start):
        self.fits += 1
        return gram_group_cd(self.sc.Gs, self.sc.U0, alpha, self.P, self.sc.groups,
                             weights=self.sc.weights, start=start, tol=self.tol,
                             max_epochs=self.max_epochs).coef

    def to_count(self, target: int, ratio: float, slack: float, max_refine: int):
        """The fit with at least ``target`` kept units closest to it (module docstring):
        ``(U, alpha)``."""
        sc = self.sc
        a_hi, U_hi, n_hi = self.alpha_max, np.zeros_like(sc.U0), 0
        a_lo = U_lo = None
        a = self.alpha_max
        for _ in range(200):
            a *= ratio
            U = self.fit(a, U_hi)
            n = sc.kept(U).size
            if n >= target:
                a_lo, U_lo, n_lo = a, U, n
                break
            a_hi, U_hi, n_hi = a, U, n
        if U_lo is None:
            return U_hi, a_hi
        for _ in range(max_refine):
            if n_lo <= target * (1 + slack) or a_hi <= a_lo * (1 + 1e-9):
                break
            mid = math.sqrt(a_hi * a_lo)
            U = self.fit(mid, U_hi)
            n = sc.kept(U).size
            if n >= target:
                a_lo, U_lo, n_lo = mid, U, n
            else:
                a_hi, U_hi, n_hi = mid, U, n
        return U_lo, a_lo


class GroupPenalty(UnitMethod):
    """``penalty:<name>``: the module docstring's method. Options: ``penalty`` (a catalog name,
    default ``"logsum"``) and its parameters (on RMS-1 group norms; defaults
    :data:`DEFAULT_PARAMS`), ``tol`` (of the block CD along the path, 1e-3), ``ratio``
    (``alpha`` factor between path fits, 0.6), ``slack`` (how far above the budget the path may
    stop before the exact moves, 0.05), ``max_refine`` (bisection steps, 12), ``max_epochs``
    (passes per fit, 200)."""

    name = "penalty"
    penalty_name = "logsum"
    common = {"polish": True}
    defaults = {"penalty": None, "penalty_params": None, "tol": 1e-3, "ratio": 0.6,
                "slack": 0.05, "max_refine": 12, "max_epochs": 200}

    def __init__(self, **options):
        own = set(self.defaults) | {"refit", "polish", "max_swaps", "refit_damp"}
        params = {k: options.pop(k) for k in list(options) if k not in own}
        if params:
            if options.get("penalty_params"):
                raise ValueError(f"give the penalty's parameters either as options "
                                 f"{sorted(params)} or in penalty_params, not both")
            options["penalty_params"] = params
        super().__init__(**options)

    def _validate(self, opts):
        if opts["penalty"] is None:
            opts["penalty"] = self.penalty_name
        if not isinstance(opts["penalty"], str):
            raise TypeError(f"penalty must be a catalog name, got {type(opts['penalty']).__name__}")
        if opts["penalty_params"] is not None and not isinstance(opts["penalty_params"], dict):
            raise TypeError("penalty_params must be a dict of the penalty's parameters")
        self.P = resolve(opts["penalty"], opts["penalty_params"])
        opts["tol"] = check_float("tol", opts["tol"], low=0.0, low_open=True)
        opts["ratio"] = check_float("ratio", opts["ratio"], low=0.0, high=1.0, low_open=True,
                                    high_open=True)
        opts["slack"] = check_float("slack", opts["slack"], low=0.0)
        opts["max_refine"] = check_int("max_refine", opts["max_refine"], low=0)
        opts["max_epochs"] = check_int("max_epochs", opts["max_epochs"], low=1)
        if not opts["refit"]:
            raise ValueError(f"structured {self.name!r} lands on the budget by exact moves "
                             "scored with the refit; refit=False is not available")
        return opts

    def _select(self, problem: UnitProblem, n_keep: int) -> np.ndarray:
        o = self.options
        sc = Scaled(problem)
        path = UnitPath(sc, self.P, o["tol"], o["max_epochs"])
        U, alpha = path.to_count(n_keep, o["ratio"], o["slack"], o["max_refine"])
        kept = sc.kept(U)
        self.info = {"alpha": float(alpha), "fits": path.fits, "path_kept": int(kept.size)}
        return fix_count(problem, kept, n_keep, o["refit_damp"])


class GroupLogSum(GroupPenalty):
    """``logsum``: the group log-sum penalty (the eta-trick's LogSum dual on unit norms)."""

    name = "logsum"
    penalty_name = "logsum"


class GroupMCP(GroupPenalty):
    """``mcp``: MCP on unit norms (the group MCP of Breheny & Huang 2015)."""

    name = "mcp"
    penalty_name = "mcp"
