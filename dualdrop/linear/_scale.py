"""Extreme but finite scales: every fit is computed at unit scale, whatever the units of X and y.

Why this is possible. The problems of the estimators are scale-free. With ``scaling="dropout"``
the penalty acts on ``s_j w_j``, ``s_j`` the RMS of column ``j``: multiplying a column by ``c``
divides its coefficient by ``c`` and changes nothing else, exactly. Multiplying ``y`` by ``d``
(least squares) multiplies the objective by ``d^2`` and the coefficients by ``d`` as long as the
penalty family has a scale: ``Omega(d u) = d^k Omega'(u)`` with ``Omega'`` of the same family
(``Penalty.rescaled``: L1 and Lp with the same penalty, LogSum with ``eps / d``, MCP and SCAD
with ``lam / d``, ...).

Why it is needed. Computed at the data's own scale, ``||x_j||^2`` overflows beyond
``|x| ~ 1e154`` and underflows below ``1e-162``, and ``||y - X w||^2`` likewise: the solvers then
see infinite or zero curvatures and return all-zero coefficients without a word.

What is done. The solvers receive ``X_j / t_j`` and ``y / c_y`` and return ``v``; the
coefficients are ``w_j = c_y v_j / t_j``, the intercept ``c_y b'``, and the penalty term becomes
``alpha c^k / c_y^2 Omega'(v)`` with ``c = s_j c_y / t_j``:

- ``scaling="dropout"``: ``t_j = s_j`` (columns of unit RMS for the solvers), so ``c = c_y``;
- ``scaling="none"``: ``t_j = c_x``, one power of two for all columns, and ``c = c_y / c_x``;
  ``c_x = 1`` unless a column's RMS lies outside ``[2^-256, 2^256]`` (~1e+-77), and a design
  whose columns span more than that band is refused (``ValueError`` naming ``X``);
- ``c_y = 1`` unless ``max |y|`` lies outside the same band; then a power of two near it
  (least squares; the other datafits' targets are not rescaled, and a target outside the band
  is refused naming ``y``: :func:`check_unscaled_target`).

Powers of two keep the rescaled data exact. Inside the band nothing changes (``c = c_y = 1``,
the fits are those at the data's scale). A penalty without a scale parameter (the tabulated
dropout penalties, penalties built from callables) cannot absorb ``c != 1``: such a fit is
refused with a ``ValueError`` naming ``X`` or ``y`` and the remedy.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from ._design import divide_columns
from .datafits import weighted_col_norms2

__all__ = ["BAND", "Scaling", "check_unscaled_target", "col_rms", "plan_scaling", "pow2_near",
           "surely_in_band"]

BAND = 2.0 ** 256  # magnitudes in [1/BAND, BAND] are computed as given


def pow2_near(x: float) -> float:
    """The power of two nearest ``x > 0`` in log scale (``2^round(log2 x)``, exact)."""
    return math.ldexp(1.0, int(round(math.log2(x))))


def _outside(m) -> bool:
    return bool(np.any((m > 0) & ((m < 1.0 / BAND) | (m > BAND))))


def col_rms(X, sw=None) -> np.ndarray:
    """``sqrt(sum_i sw_i x_ij^2 / n)`` per column (``sw``: weights of mean 1, or ``None``), also
    where ``x_ij^2`` over- or underflows: those columns (a sum that is not finite, or below
    1e-280 where subnormals lose digits) are computed again with ``max_i |x_ij|`` factored out."""
    n = X.shape[0]
    with np.errstate(over="ignore", under="ignore"):
        r2 = weighted_col_norms2(X, sw) / n
    rms = np.sqrt(r2)
    redo = np.flatnonzero(~np.isfinite(r2) | (r2 < 1e-280))
    if redo.size:  # rare: only columns of extreme magnitude (or all-zero ones) get here
        Xr = X[:, redo]
        if sp.issparse(Xr):
            m = np.asarray(abs(Xr).max(axis=0).toarray(), dtype=np.float64).ravel()
        else:
            m = np.max(np.abs(Xr), axis=0) if n else np.zeros(redo.size)
        safe = np.where(m > 0, m, 1.0)
        rms[redo] = m * np.sqrt(weighted_col_norms2(divide_columns(Xr, safe), sw) / n)
    return rms


class Scaling:
    """How the solver's problem relates to the user's (see the module docstring): the design
    divisors ``t``, the target divisor ``cy``, the factor ``c`` of the penalty's argument, and
    which argument a refusal names."""

    def __init__(self, t, cy=1.0, c=1.0, culprit="y"):
        self.t = np.asarray(t, dtype=np.float64)
        self.cy = float(cy)
        self.c = float(c)
        self.culprit = culprit

    @property
    def trivial(self) -> bool:
        """Whether the penalty and ``alpha`` reach the solver unchanged (``c = c_y = 1``)."""
        return self.c == 1.0 and self.cy == 1.0

    def rescale(self, P):
        """``(P', k)``: ``Omega_P(c u) = c^k Omega_P'(u)``; ``ValueError`` naming the culprit
        when the penalty has no scale parameter to absorb ``c``."""
        if self.c == 1.0:
            return P, 0.0
        fn = getattr(P, "rescaled", None)
        out = fn(self.c) if fn is not None else None
        if out is None:
            what = ("y has magnitude" if self.culprit == "y" else
                    "the columns of X have magnitudes")
            raise ValueError(
                f"{what} beyond what float64 computes without overflow or underflow "
                f"(about 1e-77 to 1e77), and penalty {P!r} has no scale parameter to absorb an "
                f"internal rescaling by {self.c:.3g} (its problem is not scale-free); divide "
                f"{self.culprit} by a constant (this changes the problem for such a penalty), "
                "or use a penalty with a scale (l1, lp, logsum, log2sum, mcp, scad, standout)"
                + ("" if self.culprit == "y" else ", or scaling='dropout'"))
        return out

    def _log2_factor(self, k: float) -> float:
        """``log2(c^k / c_y^2)``: the solver's ``alpha`` per unit of the user's, in log2 (the
        factor itself can overflow where both alphas are floats)."""
        return k * math.log2(self.c) - 2.0 * math.log2(self.cy)

    def to_solver_alpha(self, alpha: float, k: float) -> float:
        """The solver's ``alpha`` for the user's (``alpha c^k / c_y^2``; ``inf`` on overflow)."""
        return _times_pow2(alpha, self._log2_factor(k))

    def from_solver_alpha(self, alpha: float, k: float) -> float:
        """The user's ``alpha`` for the solver's."""
        return _times_pow2(alpha, -self._log2_factor(k))

    def solver_penalty(self, P, alpha):
        """``(P', alpha')``: the penalty and strength the solver receives for the user's ``P``
        (resolved at ``alpha``) and ``alpha``."""
        if self.trivial:
            return P, alpha
        P2, k = self.rescale(P)
        a2 = self.to_solver_alpha(alpha, k)
        if not math.isfinite(a2) or (alpha > 0 and a2 == 0.0):
            raise ValueError(
                f"alpha={alpha!r} is out of range at the scale of {self.culprit} (the solver's "
                f"alpha would be {a2!r}); divide {self.culprit} by a constant")
        return P2, a2


def _times_pow2(x: float, e: float) -> float:
    """``x 2^e`` without an intermediate overflow (exact for an integer ``e``)."""
    n = math.floor(e)
    try:
        return math.ldexp(x * 2.0 ** (e - n), int(n))
    except OverflowError:
        return math.inf


def check_unscaled_target(y, datafit_name: str) -> None:
    """``ValueError`` naming ``y`` when a target that is not rescaled inside (every datafit
    but least squares: its losses are not homogeneous in ``y``, e.g. Huber's ``delta``) lies
    outside the band where float64 computes without overflow or underflow: the solvers would
    return all-zero coefficients without a word."""
    m = float(np.max(np.abs(y))) if np.size(y) else 0.0
    if _outside(np.array([m])):
        raise ValueError(
            f"y has magnitude {m:.3g}, beyond what the {datafit_name} datafit computes in float64 "
            "without overflow or underflow (about 1e-77 to 1e77); it is not rescaled inside "
            "(only least squares is): divide y by a constant, and the datafit's own scale "
            "parameters with it (Huber's delta, ...)")


def surely_in_band(X, sw=None) -> bool:
    """Whether every column's RMS lies in ``[1/BAND, BAND]`` or is 0, decided from the extreme
    magnitudes of ``X`` alone: ``RMS_j <= max |x_ij| sqrt(max sw)``, and a column with a
    nonzero entry of positive weight has ``RMS_j >= min |x_ij| sqrt(min sw / n)`` (minimum and
    weights over its nonzero entries and positive weights). Two passes over the stored values
    without a copy when their signs agree (one copy of them otherwise), against the column
    norms' pass and copy: ``False`` means "compute the RMS to know"."""
    data = X.data if sp.issparse(X) else X
    if data.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        dmax, dmin = float(np.max(data)), float(np.min(data))
    if not (math.isfinite(dmax) and math.isfinite(dmin)):
        return False
    hi = max(dmax, -dmin)
    if dmin > 0.0:
        lo = dmin
    elif dmax < 0.0:
        lo = -dmax
    elif sp.issparse(X):
        lo = float(np.min(np.abs(data)))
    else:
        return False  # dense data of both signs: the minimum needs a copy; the norms are cheap
    n = X.shape[0]
    if sw is None:
        w_hi, w_lo = 1.0, 1.0 / n
    else:
        pos = sw[sw > 0]
        w_hi, w_lo = float(np.max(sw)), (float(np.min(pos)) / n if pos.size else 1.0)
    return hi * math.sqrt(w_hi) <= BAND and lo * math.sqrt(w_lo) >= 1.0 / BAND


def _refuse_subnormal(rms) -> None:
    """``ValueError`` naming ``X`` for a column whose RMS is a subnormal number (nonzero, below
    float64's smallest normal ~2.2e-308): its entries carry a few significant digits at most,
    and its coefficient (of order 1 / RMS) overflows; numpy's overflow warning and infinite
    coefficients came back."""
    bad = np.flatnonzero((rms > 0) & (rms < np.finfo(np.float64).tiny))
    if bad.size:
        j = int(bad[0])
        raise ValueError(
            f"X has subnormal columns ({bad.size}; column {j} has RMS {float(rms[j]):.3g}, below "
            f"float64's smallest normal number {np.finfo(np.float64).tiny:.3g}): their entries "
            "keep few significant digits and their coefficients would overflow; multiply X by "
            "a constant (e.g. 2.0**600) before fitting, which divides the coefficients by it")


def plan_scaling(X, sw, scaling: str, y=None) -> Scaling:
    """The :class:`Scaling` of one fit: ``X`` (checked, float64), ``sw`` (weights of mean 1 or
    ``None``), ``scaling`` ("dropout" or "none") and, for least squares, ``y`` (1-D or, for
    several outputs, 2-D). With ``scaling="none"`` the column RMS are computed only when the
    extreme magnitudes of ``X`` do not already place them in the band (:func:`surely_in_band`):
    on a 2000 x 10000 CSC design at 1% that check cost ~2 ms per fit before."""
    cy = 1.0
    if y is not None:
        m = float(np.max(np.abs(y))) if np.size(y) else 0.0
        if _outside(np.array([m])):
            cy = pow2_near(m)
    if scaling == "dropout":
        rms = col_rms(X, sw)
        _refuse_subnormal(rms)
        return Scaling(np.where(rms > 0, rms, 1.0), cy, cy, culprit="y")
    if surely_in_band(X, sw):
        return Scaling(np.ones(X.shape[1]), cy, cy, culprit="y" if cy != 1.0 else "X")
    rms = col_rms(X, sw)
    _refuse_subnormal(rms)
    live = rms[rms > 0]
    cx = 1.0
    if live.size and _outside(live):
        lo, hi = float(live.min()), float(live.max())
        cx = pow2_near(math.sqrt(lo) * math.sqrt(hi))
        if _outside(live / cx):
            raise ValueError(
                f"the columns of X have RMS magnitudes from {lo:.3g} to {hi:.3g}: too wide a span "
                "for scaling='none' in float64; standardize the columns (scaling='dropout' puts "
                "the penalty on the standardized coefficients and handles any column scale)")
    return Scaling(np.full(X.shape[1], cx), cy, cy / cx, culprit="y" if cy != 1.0 else "X")
