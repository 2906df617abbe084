"""The consumer-layer problem of structured one-shot pruning, and the base of its methods.

A consumer layer ``W0`` (``out x p``, bias ``b0``) reads ``n`` units, unit ``g`` through its
columns ``c_g`` (one column for an MLP neuron, a head's ``d`` context features, a channel's
``kh * kw`` kernel taps). Keeping the units ``S`` and refitting (OSSCAR, Meng et al., ICML 2024;
ZipLM, Kurtic et al., NeurIPS 2023)::

    min_W  E ||(W - W0) x||^2 = tr((W - W0) A (W - W0)^T)     subject to  W[:, c_g] = 0, g not in S

with ``A = E[x x^T]`` the input Gram over the calibration tokens (patches, samples). With
**bias compensation** the bias moves too, ``b = b0 + (W0 - W) mu`` (``mu = E[x]``), which
removes the mean of the error: the problem is the same with the *covariance* ``A = E[x x^T] -
mu mu^T``, and a removed unit's mean contribution ``W0[:, c_g] mu_g`` lands in the bias (the
rule of FLAP, An et al., AAAI 2024, here for every method and with the kept weights refit).

**Dense targets.** The inputs ``x`` come through the units pruned before this layer; the
consumer may instead be asked to reproduce the *dense* model's output, ``W0 x_d + b0`` with
``x_d`` its inputs in the dense model on the same tokens (asymmetric calibration, as GPTAQ, Li
et al., ICML 2025, for quantization): the objective is ``tr(W A W^T) - 2 tr(W B^T) + c0`` with
``B = W0 Cov(x_d, x)`` and ``c0 = tr(W0 Cov(x_d) W0^T)`` (uncentred moments without bias
compensation), and the bias ``b = b0 + W0 mu_d - W mu``. Without them ``B = W0 A`` and ``c0 =
tr(W0 A W0^T)``: everything below is written with ``B`` and ``c0``.

For a kept set ``S`` (its columns, ``S`` below) the refit is ``W_S = (B_S + lambda W0_S)
(A_SS + lambda I)^-1`` (``lambda``: ``refit_damp`` times the mean diagonal, a ridge toward the
trained weights), and the error left is ``c0 - tr(B_S A_SS^-1 B_S^T)``.

A method (one module of this package, one line in its registry) implements ``_select(problem,
n_keep) -> kept units``; :meth:`UnitMethod.solve` then refits (``refit``: default per method),
polishes the kept set by exact swaps (``polish``, ``_kept.swap_search``) and compensates the
bias. Scoring methods also give ``scores(problem)`` (higher = keep), which the ``"flap"``
allocation standardizes and compares across layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from penalties.checks import check_float, check_int

#: options every structured method takes
COMMON_DEFAULTS = {"refit": True, "polish": False, "max_swaps": 50, "refit_damp": 1e-6}


@dataclass
class UnitProblem:
    """One consumer's problem (module docstring), numpy float64: ``W0`` ``(out, p)``, ``G``
    ``(p, p)`` the uncentred Gram ``E[x x^T]``, ``mu`` ``(p,)`` the input mean, ``columns[g]``
    unit ``g``'s columns, ``b0`` the bias (or None), ``centered`` (bias compensation: the
    methods then work on the covariance), ``part_sq[g]`` the squared norm of unit ``g``'s
    producer weights (for the group-norm magnitude), ``cost[g]`` its price (parameters or
    latency; the allocations use it). A dense target (module docstring) comes as
    ``cross`` ``(p, p)``, ``E[x_d x^T]``, ``dense_gram`` ``E[x_d x_d^T]`` and ``mu_dense``."""

    name: str
    W0: np.ndarray
    G: np.ndarray
    mu: np.ndarray
    columns: list
    b0: np.ndarray | None = None
    centered: bool = True
    part_sq: np.ndarray | None = None
    cost: np.ndarray | None = None
    cross: np.ndarray | None = None
    dense_gram: np.ndarray | None = None
    mu_dense: np.ndarray | None = None
    _A: np.ndarray | None = field(default=None, repr=False)
    _terms: dict = field(default_factory=dict, repr=False)

    @property
    def n_units(self) -> int:
        return len(self.columns)

    @property
    def A(self) -> np.ndarray:
        """The Gram the methods minimize on: the covariance with bias compensation."""
        if self._A is None:
            A = self.G - np.outer(self.mu, self.mu) if self.centered else self.G.copy()
            self._A = 0.5 * (A + A.T)
        return self._A

    @property
    def mu_target(self) -> np.ndarray:
        return self.mu if self.mu_dense is None else self.mu_dense

    def terms(self, damp: float = 0.0):
        """``(A, B, c0)`` (module docstring) with the ridge ``lambda = damp * mean diag(A)``
        toward ``W0`` added: ``A + lambda I``, ``B + lambda W0``, ``c0 + lambda ||W0||^2``."""
        if damp not in self._terms:
            A = self.A
            if self.cross is None:
                B = self.W0 @ A
                c0 = quad(self.W0, A)
            else:
                mt = self.mu_target
                C = self.cross - np.outer(mt, self.mu) if self.centered else self.cross
                D = self.dense_gram - np.outer(mt, mt) if self.centered else self.dense_gram
                B = self.W0 @ C
                c0 = quad(self.W0, D)
            lam = damp * max(float(np.mean(np.diag(A))), 1e-300) if damp else 0.0
            if lam:
                A = A + lam * np.eye(A.shape[0])
                B = B + lam * self.W0
                c0 = c0 + lam * float(np.sum(self.W0 ** 2))
            self._terms[damp] = (A, B, c0)
        return self._terms[damp]

    @property
    def free(self) -> np.ndarray:
        """Columns in no unit: always kept."""
        used = np.zeros(self.W0.shape[1], bool)
        for c in self.columns:
            used[c] = True
        return np.flatnonzero(~used)

    def kept_columns(self, kept) -> np.ndarray:
        parts = [self.free] + [self.columns[g] for g in kept]
        return np.sort(np.concatenate(parts)).astype(np.int64)

    def energy(self) -> float:
        """``c0``: the error of keeping nothing (the target's energy)."""
        return self.terms()[2]


def quad(W: np.ndarray, A: np.ndarray) -> float:
    """``tr(W A W^T)``."""
    return float(np.sum((W @ A) * W))


def refit(problem: UnitProblem, kept, damp: float = 1e-6) -> np.ndarray:
    """The refit ``W`` ``(out, p)`` of the kept units (module docstring); removed columns 0."""
    W0, A = problem.W0, problem.A
    S = problem.kept_columns(kept)
    W = np.zeros_like(W0)
    if S.size == 0:
        return W
    ASS = A[np.ix_(S, S)]
    lam = damp * max(float(np.mean(np.diag(ASS))), 1e-300)
    if problem.cross is None:                     # B_S = W0 A_{., S}: solve for W_S - W0_S
        Sc = np.setdiff1d(np.arange(W0.shape[1]), S)
        W[:, S] = W0[:, S]
        if Sc.size:
            W[:, S] += solve_psd(ASS, A[np.ix_(S, Sc)] @ W0[:, Sc].T, lam).T
        return W
    B = problem.terms()[1]
    W[:, S] = solve_psd(ASS, (B[:, S] + lam * W0[:, S]).T, lam).T
    return W


def solve_psd(M: np.ndarray, rhs: np.ndarray, lam: float = 0.0) -> np.ndarray:
    """``(M + lam I)^-1 rhs`` for a symmetric positive semidefinite ``M`` (Cholesky; a larger
    ridge, then least squares, if it fails)."""
    n = M.shape[0]
    for extra in (lam, max(lam, 1e-10 * max(float(np.trace(M)) / max(n, 1), 1e-300)) * 100):
        try:
            L = np.linalg.cholesky(M + extra * np.eye(n))
            y = np.linalg.solve(L, rhs)
            return np.linalg.solve(L.T, y)
        except np.linalg.LinAlgError:
            continue
    return np.linalg.lstsq(M + lam * np.eye(n), rhs, rcond=None)[0]


def objective(problem: UnitProblem, W: np.ndarray) -> float:
    """The error relative to the target's energy, ``(tr(W A W^T) - 2 tr(W B^T) + c0) / c0``
    (``tr((W - W0) A (W - W0)^T) / tr(W0 A W0^T)`` without a dense target; 0 when the target
    does not vary)."""
    A, B, c0 = problem.terms()
    if problem.cross is None:
        num = quad(W - problem.W0, A)
    else:
        num = max(quad(W, A) - 2.0 * float(np.sum(W * B)) + c0, 0.0)
    return num / c0 if c0 > 0 else 0.0


@dataclass
class UnitSolution:
    """A method's answer for one consumer: the kept units (sorted), the consumer weight ``W``
    ``(out, p)`` and bias ``b`` (None without one), the objective (``objective``), and the
    method's own numbers (``info``)."""

    kept: np.ndarray
    W: np.ndarray
    b: np.ndarray | None
    objective: float
    info: dict = field(default_factory=dict)


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
                from ._kept import swap_search
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
