"""Vector penalties: sums of separable penalties, the top-k indicator of magnitude pruning, ARD,
and the "penalty against number of nonzeros at fixed l2 norm" curve (docs/theory.md section 3)."""

from __future__ import annotations

import numpy as np

from ._checks import as_real_array, check_param
from ._numerics import W_MAX
from .base import Penalty


def _as_vector(w, name="w"):
    arr = as_real_array(w, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D vector, got shape {arr.shape}; flatten it or apply per row")
    return arr


class HardThreshold:
    """Magnitude pruning as a penalty: the indicator of ``||w||_0 <= k``.

    As an eta-trick rule, ``eta_j = inf`` for the k largest ``|w_j|`` and 0 for the rest; the
    effective penalty is non-separable: 0 with at most k nonzeros, inf otherwise. Its prox (for
    any step) keeps the k largest magnitudes, i.e. hard thresholding / magnitude pruning. Ties at
    the k-th magnitude are broken by position (lower index kept), deterministically.
    """

    name = "hard_threshold"
    is_separable = False
    is_vector_penalty = True
    is_convex = False

    def __init__(self, k=1):
        self.k = check_param(k, "k", low=0, low_open=False, integer=True)

    def get_params(self, deep=True):
        return {"k": self.k}

    def set_params(self, **params):
        unknown = set(params) - {"k"}
        if unknown:
            raise ValueError(f"HardThreshold has no parameter(s) {sorted(unknown)}; valid: ['k']")
        self.k = HardThreshold(**{"k": self.k, **params}).k
        return self

    @property
    def params(self):
        return self.get_params()

    def __repr__(self):
        return f"HardThreshold(k={self.k})"

    def __eq__(self, other):
        return type(other) is HardThreshold and other.k == self.k

    def __hash__(self):
        return hash(("HardThreshold", self.k))

    def support(self, w) -> np.ndarray:
        """Boolean mask of the k largest |w_j| (stable: ties keep the lower index)."""
        arr = _as_vector(w)
        keep = np.zeros(arr.shape, dtype=bool)
        k = min(self.k, arr.size)
        if k > 0:
            order = np.argsort(-np.abs(arr), kind="stable")
            keep[order[:k]] = True
        return keep

    def omega(self, w) -> float:
        arr = _as_vector(w)
        return 0.0 if np.count_nonzero(arr) <= self.k else np.inf

    value = omega

    def eta_hat(self, w) -> np.ndarray:
        return np.where(self.support(w), np.inf, 0.0)

    def keep_ratio(self, w, lam=1.0):
        """1 for the k largest |w_j|, 0 for the rest (eta is 0 or inf: ``lam > 0`` does not
        change it, but is checked as for every penalty)."""
        check_param(lam, "lam", low=0.0)
        return self.support(w).astype(float)

    def prox(self, v, t=1.0) -> np.ndarray:
        """The k largest magnitudes of ``v`` kept, the rest zeroed (any step ``t >= 0``: the
        indicator does not scale)."""
        arr = _as_vector(v, "v")
        tt = as_real_array(t, "t")
        if (tt < 0).any():
            raise ValueError("t (the prox step) must be >= 0")
        return np.where(self.support(arr), arr, 0.0)


class SumPenalty:
    """``sum_j Omega(w_j)`` of a separable penalty, optionally with per-coordinate weights."""

    is_separable = True
    is_vector_penalty = True

    def __init__(self, penalty: Penalty, weights=None):
        if not isinstance(penalty, Penalty):
            raise ValueError(f"penalty must be a separable penalties.Penalty, got {type(penalty).__name__}")
        self.penalty = penalty
        self.weights = None if weights is None else as_real_array(weights, "weights")
        if self.weights is not None and (self.weights < 0).any():
            raise ValueError("weights must be >= 0")

    def _weights_for(self, arr, name):
        """The weights, checked to give one per entry of ``arr`` (named ``name``)."""
        if self.weights is not None and self.weights.shape != arr.shape:
            raise ValueError(f"weights has {self.weights.size} entries (shape "
                             f"{self.weights.shape}) but {name} has shape {arr.shape}: "
                             f"give SumPenalty one weight per entry of {name}")
        return self.weights

    def omega(self, w) -> float:
        arr = _as_vector(w)
        om = self.penalty.omega(arr)
        weights = self._weights_for(arr, "w")
        if weights is not None:
            om = om * weights
        return float(np.sum(om))

    value = omega

    def prox(self, v, t=1.0):
        arr = _as_vector(v, "v")
        weights = self._weights_for(arr, "v")
        tt = t if weights is None else as_real_array(t, "t") * weights
        return self.penalty.prox(arr, tt)

    def __repr__(self):
        return f"SumPenalty({self.penalty!r})"


class ARD:
    """Automatic relevance determination with a design matrix (a non-separable penalty).

    With Gaussian noise variance ``sigma2`` and prior variances ``eta``, type-II maximum likelihood
    is the eta-trick with ``f(eta) = log det(sigma2 I + X diag(eta) X^T)`` (Wipf & Nagarajan 2008):
    ``Omega(w) = 1/2 min_eta [sum_j w_j^2/eta_j + log det(sigma2 I + X diag(eta) X^T)]`` (lambda = 1,
    shifted so Omega(0) = 0). ``omega`` minimizes over eta by the classical fixed-point (MM)
    iterations ``eta_j <- |w_j| / sqrt(x_j^T S^{-1} x_j)``, ``S = sigma2 I + X diag(eta) X^T``.

    Scales. Writing ``x_j = c_j u_j`` with ``||u_j|| = 1`` and ``eta_j = e_j / c_j^2`` leaves
    ``X diag(eta) X^T`` unchanged, so ``Omega_X(w) = Omega_U(c * w)`` and
    ``eta_hat_X(w) = eta_hat_U(c * w) / c^2``: the iterations run on the unit-norm columns, and any
    finite column scale works. A zero column does not enter ``f``: its ``w_j^2 / eta_j`` is
    minimized at ``eta_j = inf`` (0 when ``w_j = 0``), so it adds nothing to Omega.
    """

    name = "ard"
    is_separable = False
    is_vector_penalty = True
    is_convex = False

    def __init__(self, X, sigma2=1.0, max_iter=500, tol=1e-10):
        X = as_real_array(X, "X")
        if X.ndim != 2:
            raise ValueError(f"X must be a 2-D design matrix, got shape {X.shape}")
        self.X = X
        self.sigma2 = check_param(sigma2, "sigma2", low=0.0)
        self.max_iter = check_param(max_iter, "max_iter", low=0, integer=True)
        self.tol = check_param(tol, "tol", low=0.0)
        # column norms without overflow or underflow: max |x_ij| times the norm of x_j / max
        big = np.max(np.abs(X), axis=0) if X.shape[0] else np.zeros(X.shape[1])
        safe = np.where(big > 0, big, 1.0)
        self._c = np.where(big > 0, safe * np.linalg.norm(X / safe, axis=0), 0.0)
        self._live = self._c > 0
        self._U = X[:, self._live] / self._c[self._live]
        n = X.shape[0]
        self._logdet0 = n * np.log(self.sigma2)

    def _objective(self, v, e):
        """``(1/2 [sum v^2 / e + log det S] - logdet0, q)`` over the live columns (``v = c w``),
        ``S = sigma2 I + U diag(e) U^T`` and ``q_j = u_j^T S^-1 u_j``. By the eigenvalues of
        ``S``, each at least ``sigma2`` (so rounding cannot make ``S`` singular, however large
        ``e`` is), and ``q_j = sum_i (v_i . u_j)^2 / lam_i``, a sum of positive terms (no
        cancellation); accuracy degrades only where ``e`` spans more than float64 resolves."""
        nz = e > 0
        S = self.sigma2 * np.eye(self.X.shape[0]) + (self._U[:, nz] * e[nz]) @ self._U[:, nz].T
        lam, V = np.linalg.eigh(S)
        lam = np.maximum(lam, self.sigma2)
        logdet = float(np.sum(np.log(lam)))
        q = np.sum((V.T @ self._U) ** 2 / lam[:, None], axis=0)
        return 0.5 * (np.sum(v[nz] ** 2 / e[nz]) + logdet - self._logdet0), q

    def _check_w(self, w):
        w = _as_vector(w)
        if w.size != self.X.shape[1]:
            raise ValueError(f"w has {w.size} entries but X has {self.X.shape[1]} columns")
        return w

    def _eta_live(self, v):
        """The MM iterations on the live columns, in the units of ``v = c w``."""
        if not np.all(np.abs(v) <= W_MAX):  # v^2 enters the objective: it must be a float
            raise ValueError(f"w times the norms of the columns of X reaches "
                             f"{float(np.max(np.abs(v))):.3g}, beyond {W_MAX:g} (its square "
                             "overflows float64); rescale w or X")
        e = np.abs(v).copy()
        prev = np.inf
        for _ in range(self.max_iter):
            val, q = self._objective(v, e)
            e = np.abs(v) / np.sqrt(q)
            if abs(prev - val) <= self.tol * max(1.0, abs(val)):
                break
            prev = val
        return e

    def eta_hat(self, w) -> np.ndarray:
        w = self._check_w(w)
        c = self._c[self._live]
        eta = np.where(w != 0, np.inf, 0.0)  # the zero columns
        with np.errstate(over="ignore"):
            v = c * w[self._live]
            eta[self._live] = self._eta_live(v) / c / c
        return eta

    def omega(self, w) -> float:
        w = self._check_w(w)
        with np.errstate(over="ignore"):
            v = self._c[self._live] * w[self._live]
        if not np.any(v):
            return 0.0
        return float(self._objective(v, self._eta_live(v))[0])

    value = omega

    def __repr__(self):
        return f"ARD(X.shape={self.X.shape}, sigma2={self.sigma2})"
