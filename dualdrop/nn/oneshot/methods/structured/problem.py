"""The consumer-layer problem of structured one-shot pruning: its refit and its objective.

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

This module holds the problem, its refit and objective and the linear algebra every method
shares; ``base`` holds the methods' base class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import lapack

#: a swap is applied when it lowers the error by more than this fraction of the layer's energy
SWAP_TOL = 1e-9
#: an addition is scored only for a unit whose Schur complement is above this fraction of its
#: inputs' own variance: one nearly in the span of the kept inputs (always so when the
#: calibration tokens are fewer than the inputs) has its gain scored by rounding
SWAP_FLOOR = 1e-5


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


def inverse_psd(M: np.ndarray) -> np.ndarray:
    """``M^-1`` of a symmetric positive definite ``M`` (LAPACK ``potrf`` / ``potri``), by
    :func:`solve_psd` if that fails."""
    if M.shape[0] == 0:
        return np.zeros((0, 0))
    L, info = lapack.dpotrf(M, lower=1)
    if info == 0:
        Hi, info = lapack.dpotri(L, lower=1)
        if info == 0:
            return np.tril(Hi) + np.tril(Hi, -1).T
    return solve_psd(M, np.eye(M.shape[0]))


def unit_matrix(columns) -> np.ndarray | None:
    """The units' columns as an ``(n, m)`` array when every unit has ``m`` columns, else None."""
    sizes = {len(c) for c in columns}
    if len(sizes) != 1:
        return None
    return np.stack([np.asarray(c, np.int64) for c in columns])


def as_mask(kept, n):
    m = np.zeros(n, bool)
    m[np.asarray(kept, np.int64)] = True
    return m
