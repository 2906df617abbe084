"""The duality's structured pruner: adaptive dropout on a consumer's input units.

By the eta-trick duality (LeJeune, Javadi & Baraniuk, NeurIPS 2021), adaptive dropout on a
consumer's *input units* (one rate per neuron, head or channel, shared by its columns and by
every output row) while the layer reconstructs its trained output is least squares plus the
dropout's effective penalty on each unit's group norm::

    min_U  1/2 tr((U - U0) Gs (U - U0)^T) + alpha sum_g Omega(||U[:, c_g]||_F)

in scale-free coordinates (``Gs = D^-1 A D^-1`` the unit-diagonal Gram, ``u_rj = d_j w_rj / s``,
``s`` making the group norms of ``U0`` of RMS 1, so one parameter of ``Omega`` means the same on
every layer). Read the other way, the eta-trick writes ``Omega(t) = min_eta t^2 / (2 eta) +
f(eta) / 2``: at fixed ``eta`` the problem is a ridge with one weight ``alpha / eta_g`` per
unit, the same for every output row, so one reweighting step is one ``p x p`` solve for the
whole layer::

    (Gs + alpha diag(1 / eta)) U^T = Gs U0^T,        eta_g = eta_hat(||U[:, c_g]||)

(``eta_hat`` the penalty's optimal dual variable; a unit at ``eta_g = 0`` has dropped out). The
method runs these steps along a geometric path of ``alpha`` (from ``alpha0``, times ``grow``
per step), each step on the units still alive: a unit whose norm falls below ``thr`` times the
RMS of the alive ones leaves the system, so the solves shrink as the path goes (float32
Cholesky: the path only ranks the units, it never gives the final weights). The path stops when
at most ``over * n_keep`` units are alive, and those (the ``over * n_keep`` largest norms of the
last step) are the start of the exact part: the backward greedy of Optimal Brain Surgeon moves
(``_kept.backward_greedy``: each removal the one that raises the refit error least) down to
``n_keep``, then exact swaps while one lowers the refit error (``polish``, on by default, as
OSSCAR's local search), then the refit. On all-MiniLM-L6-v2 with at most a third of a layer's
units kept this costs less CPU than OSSCAR's greedy from every unit and ends at or below
its objective (benchmarks/RESULTS.md, "Structured one-shot"). Where the path has nothing to cut
(half the units or more kept, or fewer than :data:`PATH_MIN_UNITS` units) the greedy starts
from every unit on OSSCAR's own damped Gram: OSSCAR's result at OSSCAR's cost.

:class:`UnitPath` gives a layer's kept units along ``alpha`` by the Gram-form block coordinate
descent of ``dualdrop.linear`` (exact zeros, warm starts): the ``"penalty"`` allocation with a
catalog penalty shares one level across layers with it (``alpha_l = level * energy_l``, the unit
prices as the groups' weights).
"""

from __future__ import annotations

import math

import numpy as np

import penalties
from dualdrop.linear.solvers.gram_bcd import gram_group_alpha_max, gram_group_cd
from penalties.checks import check_float, check_int

from scipy.linalg import LinAlgError, cho_factor, cho_solve

from ._kept import backward_greedy
from .base import UnitMethod, UnitProblem, quad, refit
from .osscar import OSSCAR

#: parameters of the penalties on RMS-1 group norms for the allocation's block-CD path (what a
#: user passes overrides them)
DEFAULT_PARAMS = {"logsum": {"eps": 1.0}, "mcp": {"a": 1.0, "lam": 1.0}}
#: the same for the method's reweighted path: a sharper log-sum (``eps`` a tenth of the RMS
#: group norm) ranks the units closer to the exact greedy's order (benchmarks/RESULTS.md)
PATH_PARAMS = {"logsum": {"eps": 0.1}, "mcp": {"a": 1.0, "lam": 1.0}}


#: below this many units (a layer's heads) the exact greedy from every unit costs less than the
#: path's solves: the path starts only from this many
PATH_MIN_UNITS = 64


def resolve(name: str, params: dict | None, defaults: dict | None = None):
    base = (DEFAULT_PARAMS if defaults is None else defaults).get(name, {})
    P = penalties.get(name, **{**base, **(params or {})})
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


def path_size(n: int, n_keep: int, over: float, share: float):
    """How many units the path stops at (:func:`dropout_path`), or ``None`` where it does not
    run: that many would be every unit, or the layer has fewer than :data:`PATH_MIN_UNITS`."""
    size = min(n, max(n_keep, min(math.ceil(over * n_keep),
                                  n_keep + math.ceil(share * (n - n_keep)))))
    return None if size >= n or n < PATH_MIN_UNITS else size


def dropout_path(sc: Scaled, P, n_keep: int, *, alpha0: float, grow: float, over: float,
                 thr: float, max_steps: int, share: float = 1.0):
    """The reweighted ridge path of the module docstring on ``sc``: ``(start, steps, alpha)``,
    ``start`` the units the exact part begins from: ``min(ceil(over * n_keep), n_keep +
    ceil(share * (n - n_keep)))`` of them (at least ``n_keep``)."""
    n = sc.n
    size = path_size(n, n_keep, over, share)
    if size is None:
        return np.arange(n), 0, 0.0
    cols = [sc.groups[g] for g in range(n)]
    free = np.concatenate([np.zeros(0, np.int64)] + sc.groups[n:])
    G32 = sc.Gs.astype(np.float32)
    RHS = (sc.Gs @ sc.U0.T).astype(np.float32)
    unit_sq = np.array([float((sc.U0[:, c] ** 2).sum()) for c in cols])
    t = np.sqrt(unit_sq)
    alive = np.flatnonzero(sc.live[[c[0] for c in cols]] & (t > 0))
    if alive.size <= size:                       # dead inputs: the rest by norm
        return np.sort(np.argsort(-t, kind="stable")[:size]), 0, 0.0
    alpha = alpha0
    for step in range(1, max_steps + 1):
        idx = np.concatenate([cols[g] for g in alive] + [free])
        sizes = np.array([cols[g].size for g in alive])
        eta = np.asarray(P.eta_hat(t[alive]), np.float64)
        # a unit at eta ~ 0 has all but dropped out: a ridge of 1e20 holds it at 0 in float32
        weight = np.minimum(alpha / np.maximum(eta, 1e-300), 1e20)
        ridge = np.concatenate([np.repeat(weight, sizes), np.zeros(free.size)])
        UT = _ridge_solve(G32[np.ix_(idx, idx)], ridge, RHS[idx])
        sq = (UT.astype(np.float64) ** 2).sum(1)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        ta = np.sqrt(np.add.reduceat(sq[:sizes.sum()], starts[:-1]))
        t[alive] = ta
        survive = ta > thr * math.sqrt(float(np.mean(ta ** 2)))
        if survive.sum() <= size or step == max_steps:
            order = np.argsort(-ta, kind="stable")[:size]
            return np.sort(alive[order]), step, alpha
        alive = alive[survive]
        alpha *= grow
    raise AssertionError("unreachable")


def _ridge_solve(M, ridge, rhs):
    """``(M + diag(ridge))^-1 rhs`` in float32 by Cholesky (a relative jitter for inputs that
    no unit penalizes; float64 with a larger one if that fails)."""
    n = M.shape[0]
    jitter = 1e-6 * max(float(np.trace(M)) / max(n, 1), 1e-30)
    for dtype, j in ((np.float32, jitter), (np.float64, 1e3 * jitter)):
        A = M.astype(dtype, copy=True)
        A[np.diag_indices(n)] += (ridge + j).astype(dtype)
        try:
            c = cho_factor(A, lower=True, overwrite_a=True, check_finite=False)
            out = cho_solve(c, rhs.astype(dtype), check_finite=False)
            if np.isfinite(out).all():
                return out
        except LinAlgError:
            pass
    return np.linalg.lstsq(M.astype(np.float64) + np.diag(ridge), rhs.astype(np.float64),
                           rcond=None)[0]


class GroupPenalty(UnitMethod):
    """``penalty:<name>``: the module docstring's method. Options: ``penalty`` (a catalog name,
    default ``"logsum"``) and its parameters (on RMS-1 group norms; defaults
    :data:`PATH_PARAMS`), ``alpha0`` (the path's first level, 0.05), ``grow`` (its factor per
    step, 2), ``over`` (the path stops at ``over * n_keep`` alive units, 2: the exact greedy
    takes it from there), ``share`` (or earlier, at ``n_keep`` plus this share of the units to
    remove, 1: off), ``thr`` (a unit leaves the path below this fraction of the alive
    units' RMS norm, 0.01), ``max_steps`` (100)."""

    name = "penalty"
    penalty_name = "logsum"
    common = {"polish": True}
    defaults = {"penalty": None, "penalty_params": None, "alpha0": 0.05, "grow": 2.0,
                "over": 2.0, "share": 1.0, "thr": 1e-2, "max_steps": 100}

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
        self.P = resolve(opts["penalty"], opts["penalty_params"], PATH_PARAMS)
        opts["alpha0"] = check_float("alpha0", opts["alpha0"], low=0.0, low_open=True)
        opts["grow"] = check_float("grow", opts["grow"], low=1.0, low_open=True)
        opts["over"] = check_float("over", opts["over"], low=1.0)
        opts["share"] = check_float("share", opts["share"], low=0.0, high=1.0)
        opts["thr"] = check_float("thr", opts["thr"], low=0.0, high=1.0, high_open=True)
        opts["max_steps"] = check_int("max_steps", opts["max_steps"], low=1)
        if not opts["refit"]:
            raise ValueError(f"structured {self.name!r} lands on the budget by exact moves "
                             "scored with the refit; refit=False is not available")
        return opts

    def _select(self, problem: UnitProblem, n_keep: int) -> np.ndarray:
        o = self.options
        if path_size(problem.n_units, n_keep, o["over"], o["share"]) is None:
            # nothing for the path to cut (at least half the units kept, or a layer's heads):
            # OSSCAR's own start, the greedy from every unit with its ridge (the same
            # objective as osscar at its cost: the scaled problem is not even built)
            self.info = {"alpha": 0.0, "steps": 0, "path_kept": problem.n_units}
            return backward_greedy(problem, n_keep, OSSCAR.defaults["damp"])
        sc = Scaled(problem)
        start, steps, alpha = dropout_path(sc, self.P, n_keep, alpha0=o["alpha0"],
                                           grow=o["grow"], over=o["over"], thr=o["thr"],
                                           max_steps=o["max_steps"], share=o["share"])
        self.info = {"alpha": float(alpha), "steps": steps, "path_kept": int(start.size)}
        return backward_greedy(problem, n_keep, o["refit_damp"], start=start)


class GroupLogSum(GroupPenalty):
    """``logsum``: the group log-sum penalty (the eta-trick's LogSum dual on unit norms)."""

    name = "logsum"
    penalty_name = "logsum"


class GroupMCP(GroupPenalty):
    """``mcp``: MCP on unit norms (the group MCP of Breheny & Huang 2015)."""

    name = "mcp"
    penalty_name = "mcp"
