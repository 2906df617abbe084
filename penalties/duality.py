"""Build a penalty from any one description of it (docs/theory.md section 2).

==========================  =================================================================
constructor                 numerics
==========================  =================================================================
``from_dual(f)``            ``Omega(w) = 1/2 min_eta [w^2/eta + f(eta)]``: grid scan in log eta,
                            then golden-section refinement (robust to several local minima)
``from_penalty(omega)``     ``f(eta) = max_w [2 Omega(w) - w^2/eta]`` the same way in log w;
                            ``eta_hat = w / Omega'(w)`` with Richardson-extrapolated differences
``from_eta_hat(eta_hat)``   ``Omega(w) = int_0^|w| t / eta_hat(t) dt`` (Corollary 2) by composite
                            10-point Gauss-Legendre in log t, with an exact power-law head
``from_keep_ratio(a, lam)`` ``eta_hat = lam a / (1 - a)``, then as above
``from_mask_moments(...)``  biased masks: ``alpha~ = mu^2 / m2``, ``rho = 1/eta~ = m2/mu^2 - 1``,
                            ``Omega(w~) = 1/2 min_theta [w~^2 rho(theta) + penalty(theta)]``
==========================  =================================================================

Each takes vectorized callables (numpy arrays in, arrays out) and verifies what the duality needs
on a grid at construction: a rule that is not monotone, a dual ``f`` that decreases (or falls
below ``f0``, which would make Omega negative), an Omega whose ``Omega(sqrt z)`` is not concave
and nondecreasing, or a callable that is not elementwise (a scalar for an array, an output that
depends on the other entries) raises ``ValueError`` naming where it fails. The returned objects are
:class:`penalties.Penalty` instances (omega, f, eta_hat, derivative, prox, keep_ratio).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ._checks import as_real_array, check_param, finish
from ._numerics import (  # noqa: F401 (grid_golden_min, richardson_derivative, numeric_prox: public here)
    W_MAX, NumericPenalty, call_checked, check_elementwise, check_range, chunked,
    grid_golden_min, log_grid, numeric_prox, richardson_derivative)
from .base import Penalty

_CHUNK = 1 << 15
_GL10 = np.polynomial.legendre.leggauss(10)




# ----------------------------------------------------------------------------------------------
# a. From the dual function f
# ----------------------------------------------------------------------------------------------
class DualPenalty(NumericPenalty):
    """``Omega(w) = 1/2 min_eta [w^2/eta + f(eta)] - 1/2 inf f`` (so that Omega(0) = 0)."""

    def __init__(self, f, eta_range=(1e-12, 1e12), f0=0.0, name="from_dual"):
        if not callable(f):
            raise ValueError("f must be a vectorized callable eta -> f(eta)")
        self._fn = f
        self.eta_range = check_range(eta_range, "eta_range")
        self.description = getattr(f, "__name__", "f")
        self.name = name
        lo, hi = self.eta_range
        grid = log_grid(lo, hi)
        vals = call_checked(f, grid, "f")
        if not np.all(np.isfinite(vals)):
            raise ValueError(f"f is not finite at eta = {grid[~np.isfinite(vals)][0]:.6g}")
        check_elementwise(f, grid, vals, "f", "eta")
        # f' = (w / eta_hat)^2 >= 0 at every optimal eta: a decreasing f has no minimizer but
        # eta = inf (Omega = -inf, or whatever the end of eta_range makes of it)
        scale = max(1.0, float(np.max(np.abs(vals))))
        down = np.diff(vals) < -1e-12 * scale
        if np.any(down):
            i = int(np.argmax(down))
            raise ValueError(
                f"f must be nondecreasing in eta (f'(eta_hat) = (w/eta_hat)^2 >= 0); it decreases "
                f"between eta = {grid[i]:.6g} and eta = {grid[i + 1]:.6g}, so it is the dual of "
                "no penalty")
        # Omega(0) = 1/2 f(0+): 0 in the unit convention, or estimated as inf f over the range
        f_zero = float(np.min(vals)) if f0 is None else check_param(f0, "f0")
        if vals[0] < f_zero - 1e-9 * scale:
            raise ValueError(
                f"f(eta) = {vals[0]:.6g} at eta = {lo:.6g} is below f0 = {f_zero:.6g} (f(0+)), so "
                "Omega would be negative near 0; pass f0=None to take f's infimum over eta_range, "
                "or shift f so that f(0+) = f0")
        self._offset = 0.5 * f_zero
        self._llo, self._lhi = math.log(lo), math.log(hi)
        # capped (MCP, SCAD, standout: Omega bounded, eta_hat = inf beyond some |w|) when f is
        # flat over the last two decades of eta_range: a minimizer at its upper end is then
        # eta = inf and Omega = f(hi)/2 - offset; otherwise it is a minimizer beyond the range
        i100 = int(np.searchsorted(grid, hi / 100.0))
        self._f_hi = float(vals[-1])
        self._capped = (vals[-1] - vals[min(i100, grid.size - 1)]
                        <= 1e-6 * max(abs(vals[-1] - f_zero), 1e-300))

    def _f(self, eta):
        return call_checked(self._fn, eta, "f")

    def _solve(self, a):
        # beyond |w| ~ 1.3e154, w^2 is not a float: no eta of the range attains the minimum
        # (w^2 / eta overflows for every one of them), which the upper-end rules below settle
        with np.errstate(over="ignore"):
            w2_all = a * a
        fits = np.isfinite(w2_all)
        le, val = np.full(a.shape, self._lhi), np.full(a.shape, np.inf)
        w2 = w2_all[fits][:, None]

        def obj(le):
            eta = np.exp(le)
            return w2 / eta + call_checked(self._fn, eta, "f")

        if np.any(fits):
            le[fits], val[fits] = grid_golden_min(obj, int(fits.sum()), self._llo, self._lhi)
        if np.any((le <= self._llo + 1e-6) & (a > 0)):
            warnings.warn(
                f"from_dual: the minimizing eta is at the lower end of eta_range={self.eta_range} for some "
                f"w (smallest such |w| = {a[(le <= self._llo + 1e-6) & (a > 0)].min():.3g}); Omega is "
                "inaccurate there: widen eta_range",
                RuntimeWarning,
                stacklevel=4,
            )
        top = (le >= self._lhi - 1e-6) & (a > 0)
        om = 0.5 * val - self._offset
        if np.any(top) and self._capped:  # the infimum at eta = inf: f's flat top
            om = np.where(top, np.minimum(om, 0.5 * self._f_hi - self._offset), om)
        elif np.any(top):
            # the minimizer is at the upper end of eta_range. As f is nondecreasing, the true
            # minimum over eta >= hi is at least f(hi): Omega lies within w^2 / (2 hi) below the
            # value found; beyond rounding, the minimizer lies beyond the range
            with np.errstate(over="ignore", invalid="ignore"):
                width = w2_all / (2.0 * math.exp(self._lhi))
                bad = top & ~((width <= 1e-7 * np.abs(om)) & np.isfinite(w2_all))
            if np.any(bad):
                w_bad = float(a[bad].min())
                need = w_bad * w_bad * 1e3
                fix = (f"build the penalty with a larger eta_range, e.g. from_dual(f, eta_range="
                       f"({self.eta_range[0]:g}, {max(self.eta_range[1], need):g}))"
                       if math.isfinite(need) else
                       "no eta_range reaches it (w^2 is beyond the float64 range): rescale w")
                raise ValueError(
                    f"Omega at |w| = {w_bad:.6g} needs eta beyond eta_range[1] = "
                    f"{self.eta_range[1]:.6g} (the minimizer of w^2/eta + f(eta) is at its upper "
                    f"end, and f still grows there: not a capped penalty); {fix}")
        eta = np.where(top, np.inf, np.exp(le))  # minimizer at eta -> inf
        return eta, om

    def _omega(self, w):
        a = np.abs(w)
        return np.where(a == 0, 0.0, chunked(self._solve, a)[1])

    def _eta_hat(self, w):
        a = np.abs(w)
        eta = chunked(self._solve, a)[0]
        return np.where(a == 0, 0.0, eta)


def from_dual(f, eta_range=(1e-12, 1e12), f0=0.0) -> Penalty:
    """Penalty from its dual function f (vectorized callable of eta > 0).

    ``eta_range`` bounds the search; a minimizer at its upper end is reported as eta_hat = inf.
    ``Omega(0) = 1/2 f(0+)`` is subtracted: ``f0`` is f(0+) (0 in the unit convention); pass
    ``f0=None`` to estimate it as the infimum of f over ``eta_range``.
    """
    return DualPenalty(f, eta_range, f0)


# ----------------------------------------------------------------------------------------------
# b. From the penalty Omega
# ----------------------------------------------------------------------------------------------
def _verify_subquadratic(omega_fn, w_range, name="omega"):
    """Omega(sqrt z) must be nondecreasing and concave in z: check on a log grid of w."""
    lo, hi = w_range
    w = log_grid(lo, hi, 1601)
    om = call_checked(omega_fn, w, name)
    if not np.all(np.isfinite(om)):
        raise ValueError(f"{name} is not finite at w = {w[~np.isfinite(om)][0]:.6g}")
    check_elementwise(omega_fn, w, om, name, "w")
    z = w * w
    scale = max(1.0, float(np.max(np.abs(om))))
    dom = np.diff(om)
    if np.any(dom < -1e-12 * scale):
        i = int(np.argmax(dom < -1e-12 * scale))
        raise ValueError(f"{name} must be nondecreasing in |w|; it decreases near w = {w[i]:.6g}")
    slopes = dom / np.diff(z)
    # concavity in z: slopes nonincreasing (relative tolerance for rounding)
    ds = np.diff(slopes)
    tol = 1e-7 * np.abs(slopes[:-1]) + 1e-12
    if np.any(ds > tol):
        i = int(np.argmax(ds > tol))
        raise ValueError(
            f"{name}(sqrt(z)) must be concave in z = w^2 (a subquadratic penalty); "
            f"it is convex near w = {w[i + 1]:.6g}, so no dropout rule has it as effective penalty"
        )


class PrimalPenalty(NumericPenalty):
    """A penalty given by Omega itself; f is its concave conjugate in z = w^2."""

    def __init__(self, omega, w_range=(1e-9, 1e6), verify=True, name="from_penalty"):
        if not callable(omega):
            raise ValueError("omega must be a vectorized callable w -> Omega(w)")
        self._fn = omega
        self.w_range = check_range(w_range, "w_range", high_max=W_MAX)
        self.description = getattr(omega, "__name__", "omega")
        self.name = name
        om0 = float(call_checked(omega, np.zeros(1), "omega")[0])
        if abs(om0) > 1e-12:
            raise ValueError(f"omega(0) must be 0 (got {om0:.6g}); subtract omega(0) from your function")
        if verify:
            _verify_subquadratic(omega, self.w_range)

    def _omega(self, w):
        return call_checked(self._fn, np.abs(w), "omega")

    def _derivative(self, w):
        a = np.abs(w)
        safe = np.where(a == 0, 1.0, a)
        d = richardson_derivative(self._fn, safe, "omega")
        return np.sign(w) * np.where(a == 0, 0.0, d)

    def _eta_hat(self, w):
        a = np.abs(w)
        d = np.abs(self._derivative(a))
        with np.errstate(divide="ignore"):
            eta = np.where(d <= 1e-300, np.inf, a / np.where(d == 0, 1.0, d))
        return np.where(a == 0, 0.0, eta)

    def _f(self, eta):
        lo, hi = self.w_range
        # f(eta) is attained where eta_hat(w) = eta: for eta above eta_hat(w_range[1]) beyond the
        # range (Omega(sqrt z) concave: the objective in z grows past hi exactly then)
        if not hasattr(self, "_top"):
            self._top = float(self._eta_hat(np.array([hi]))[0])
        if math.isfinite(self._top) and eta.size and np.max(eta) > self._top * (1 + 1e-9):
            raise ValueError(
                f"f at eta = {np.max(eta):.6g} (above eta_hat(w_range[1]) = {self._top:.6g}) is "
                f"attained at a w beyond w_range[1] = {hi:.6g}, where from_penalty searches; "
                "build the penalty with a larger w_range")

        def solve(e):
            def obj(lw):
                w = np.exp(lw)
                return -(2.0 * call_checked(self._fn, w, "omega") - w * w / e[:, None])

            _, val = grid_golden_min(obj, e.size, math.log(lo), math.log(hi))
            return (np.maximum(-val, 0.0),)

        flat = eta.ravel()
        parts = [solve(flat[s : s + _CHUNK])[0] for s in range(0, flat.size, _CHUNK)]
        return np.concatenate(parts).reshape(eta.shape) if parts else np.empty(eta.shape)


def from_penalty(omega, w_range=(1e-9, 1e6), verify=True) -> Penalty:
    """Penalty from Omega (vectorized, even, Omega(0) = 0); ``f(eta) = max_w 2 Omega(w) - w^2/eta``.

    With ``verify`` (default) Omega(sqrt z) is checked to be concave and nondecreasing on
    ``w_range``; otherwise no dropout rule can have it as effective penalty and ValueError says
    where it fails.
    """
    return PrimalPenalty(omega, w_range, verify)


# ----------------------------------------------------------------------------------------------
# c. From an update rule eta_hat(w)  (Corollary 2)
# ----------------------------------------------------------------------------------------------
class RulePenalty(NumericPenalty):
    """``Omega(w) = int_0^|w| t / eta_hat(t) dt`` for a rule nondecreasing in |w|.

    At ``w = 0`` every penalty of this package reports ``eta_hat = 0`` (the smallest minimizer of
    ``0/eta + f(eta)``; so ``keep_ratio(0) = 0``), whatever the rule gives there: the rule itself
    is only called at ``|w| > 0``. Below ``w_range[0]`` Omega is the exact power-law head of the
    quadrature and f its closed form; beyond ``w_range[1]`` Omega and f (for ``eta`` above
    ``eta_hat(w_range[1])``) are refused with a ``ValueError`` naming ``w_range``, and a rule that
    returns what it may not (NaN, a negative value) outside ``w_range``, where it was not
    checked, is refused naming ``w_range`` too.
    """

    PANEL = 0.25  # width of the log-t quadrature panels
    _what = "eta_hat"  # how errors call the user's callable

    def __init__(self, eta_hat, w_range=(1e-12, 1e8), name="from_eta_hat", verify=True):
        if not callable(eta_hat):
            raise ValueError(f"{self._what} must be a vectorized callable of w")
        self._fn = eta_hat
        self.w_range = check_range(w_range, "w_range", high_max=W_MAX)
        self.description = getattr(eta_hat, "__name__", self._what)
        self.name = name
        lo, hi = self.w_range
        grid = log_grid(lo, hi, 2001)
        eta = self._grid_rule(grid)
        if np.any(np.isnan(eta)) or np.any(eta < 0):
            i = int(np.argmax(np.isnan(eta) | (eta < 0)))
            raise ValueError(f"eta_hat must be >= 0 (or +inf); got {float(eta[i])!r} at "
                             f"w = {grid[i]:.6g}")
        with np.errstate(invalid="ignore"):
            de = np.diff(eta)
            bad = de < -1e-12 * np.maximum(np.abs(eta[:-1]), 1e-300)
        bad &= ~(np.isinf(eta[:-1]) & np.isinf(eta[1:]))
        if verify and np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(
                f"eta_hat must be nondecreasing in |w| (Corollary 2); it decreases between "
                f"w = {grid[i]:.6g} and w = {grid[i + 1]:.6g}, so the rule has no effective penalty"
            )
        if np.any(eta == 0):
            i = int(np.argmax(eta == 0))
            raise ValueError(
                f"eta_hat must be > 0 for w > 0; it is 0 at w = {grid[i]:.6g} (inside "
                f"w_range={self.w_range}), so the penalty would be infinite there (a rule that "
                "underflows near 0: raise w_range[0])")
        self._top = float(eta[-1])  # eta_hat(w_range[1]): f beyond it needs w beyond the range
        # cumulative integral at the panel knots of [lo, hi] in s = log t
        s_lo, s_hi = math.log(lo), math.log(hi)
        n = int(math.ceil((s_hi - s_lo) / self.PANEL))
        self._knots = np.linspace(s_lo, s_hi, n + 1)
        panel = self._panels(self._knots[:-1], self._knots[1:])
        # head [0, lo]: integrand ~ C e^{p s}  ->  integral = integrand(lo) / p
        g0, g1 = self._integrand(np.array([s_lo, s_lo + self.PANEL]))
        if g0 > 0 and g1 > 0:
            p = (math.log(g1) - math.log(g0)) / self.PANEL
            head = g0 / p if p > 0 else 0.0
        else:
            head = 0.0
        self._head = head
        # Omega = head (|w| / lo)^p below lo (p = 2: a quadratic head, or no head at all)
        self._p_head = g0 / head if head > 0 else 2.0
        self._cum = head + np.concatenate([[0.0], np.cumsum(panel)])

    # ---- the user's rule ------------------------------------------------------------------
    def _grid_rule(self, grid):
        """The rule on the construction grid, checked to act elementwise."""
        eta = call_checked(self._fn, grid, self._what)
        check_elementwise(self._fn, grid, eta, self._what, "w")
        return eta

    def _rule(self, t):
        """eta_hat at ``t > 0`` inside ``w_range`` (where it was checked)."""
        return call_checked(self._fn, t, self._what)

    def _rule_anywhere(self, a):
        """eta_hat at ``a > 0`` anywhere: outside ``w_range`` the rule was never checked, so
        what it may not return (NaN, a negative value) is refused naming ``w_range``."""
        eta = self._rule(a)
        bad = np.isnan(eta) | (eta < 0)
        if np.any(bad):
            self._refuse_outside(a[bad][0], eta[bad][0], "eta_hat must be >= 0 (or +inf)")
        return eta

    def _refuse_outside(self, w, value, rule):
        lo, hi = self.w_range
        where = (f"outside w_range={self.w_range}, where {self.name} checked it" if not
                 lo <= w <= hi else f"inside w_range={self.w_range}")
        raise ValueError(
            f"{self._what} returned {value!r} at w = {w:.6g} ({where}); {rule}. Make the rule "
            f"valid there or build the penalty with a w_range that covers the w you evaluate")

    # ---- quadrature -----------------------------------------------------------------------
    def _gl(self, left, right):
        """10-point Gauss-Legendre over [left, right] in s = log t; a panel in which eta_hat
        switches to +inf (capped penalties such as MCP) is cut at the switch (bisection)."""
        x, wts = _GL10
        h = right - left
        s = left[:, None] + 0.5 * h[:, None] * (x[None, :] + 1.0)
        eta = self._rule(np.exp(s))
        cut = np.isinf(eta).any(axis=1) & np.isfinite(eta).any(axis=1)
        if np.any(cut):
            lo, hi = left[cut].copy(), right[cut].copy()
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                fin = np.isfinite(self._rule(np.exp(mid)))
                lo = np.where(fin, mid, lo)
                hi = np.where(fin, hi, mid)
            right = right.copy()
            right[cut] = lo
            h = right - left
            s = left[:, None] + 0.5 * h[:, None] * (x[None, :] + 1.0)
        return 0.5 * h * np.sum(wts * self._integrand(s), axis=1)

    def _panels(self, left, right, whole=None, prev_err=None, depth=0):
        """Adaptive integral over panels [left, right]: a panel whose halves disagree with it
        (a kink inside, e.g. SCAD at lam) is bisected recursively, as long as the disagreement
        keeps shrinking (so rounding noise in a user's rule cannot trigger endless refinement)."""
        if whole is None:
            whole = self._gl(left, right)
        if prev_err is None:
            prev_err = np.full(left.shape, np.inf)
        mid = 0.5 * (left + right)
        lh, rh = self._gl(left, mid), self._gl(mid, right)
        halves = lh + rh
        err = np.abs(halves - whole)
        bad = (err > 1e-13 * np.abs(halves) + 1e-300) & (err < 0.5 * prev_err)
        if depth < 40 and np.any(bad):
            e = err[bad] / 2.0
            halves[bad] = self._panels(left[bad], mid[bad], lh[bad], e, depth + 1) + self._panels(
                mid[bad], right[bad], rh[bad], e, depth + 1
            )
        return halves

    def _integrand(self, s):
        t = np.exp(s)
        eta = self._rule(t)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(np.isinf(eta), 0.0, t * t / eta)

    def _beyond(self, what, w=None):
        lo, hi = self.w_range
        wider = (f", e.g. {self.name}(..., w_range=({lo:g}, {10.0 ** math.ceil(math.log10(w) + 1):g}))"
                 if w is not None else "")
        if w is not None and w > W_MAX / 10:  # no w_range reaches it
            wider = f" (w_range[1] <= {W_MAX:g}: w^2 must be a float64 number), or rescale w"
        raise ValueError(
            f"{what} beyond w_range[1] = {hi:.6g}, the end of the range {self.name} integrated "
            f"the rule over; build the penalty with a larger w_range{wider}")

    def _omega(self, w):
        a = np.abs(w).ravel()
        lo, hi = self.w_range
        if np.any(a > hi * (1 + 1e-12)):
            w_big = float(a.max())
            self._beyond(f"Omega at |w| = {w_big:.6g} is", w_big)
        out = np.zeros_like(a)
        pos = a > 0
        sa = np.log(a[pos])
        small = sa < self._knots[0]
        # below the first knot: power-law head scaled
        res = np.empty_like(sa)
        if np.any(small):
            res[small] = self._head * np.exp(self._p_head * (sa[small] - self._knots[0]))
        big = ~small
        if np.any(big):
            sb = sa[big]
            k = np.minimum(((sb - self._knots[0]) / self.PANEL).astype(int), self._knots.size - 2)
            res[big] = self._cum[k] + self._panels(self._knots[k], sb)
        out[pos] = res
        return out.reshape(np.shape(w))

    def _eta_hat(self, w):
        a = np.abs(w)
        out = np.zeros_like(a)
        pos = a > 0  # eta_hat(0) = 0: the rule is not called there (see the class docstring)
        if np.any(pos):
            out[pos] = self._rule_anywhere(a[pos])
        return out

    def _f(self, eta):
        # max_w 2 Omega(w) - w^2/eta is attained where eta_hat(w) = eta (bisection in log w)
        lo, hi = self.w_range
        e = eta.ravel()
        if math.isfinite(self._top) and e.size and np.max(e) > self._top * (1 + 1e-12):
            self._beyond(f"f at eta = {np.max(e):.6g} (above eta_hat(w_range[1]) = "
                         f"{self._top:.6g}) is attained at a w")
        llo = np.full_like(e, math.log(lo))
        lhi = np.full_like(e, math.log(hi))
        for _ in range(70):
            mid = 0.5 * (llo + lhi)
            below = self._rule(np.exp(mid)) < e
            llo = np.where(below, mid, llo)
            lhi = np.where(below, lhi, mid)
        w = np.exp(0.5 * (llo + lhi))
        val = 2.0 * self._omega(w) - w * w / e
        # eta below eta_hat(lo): the maximizer lies in the head, Omega = H (w/lo)^p, where
        # d/dw [2 H (w/lo)^p - w^2/eta] = 0 gives (w/lo)^(2-p) = p H eta / lo^2 and the
        # value H (2 - p) (w/lo)^p (0 for a quadratic head, p >= 2)
        head = self._rule(np.full(1, lo))[0] >= e
        if np.any(head):
            H, p = self._head, self._p_head
            if p < 2.0 and H > 0:
                r = np.minimum((p * H * e[head] / (lo * lo)) ** (1.0 / (2.0 - p)), 1.0)
                val[head] = H * (2.0 - p) * r ** p
            else:
                val[head] = 0.0
        return np.maximum(val, 0.0).reshape(eta.shape)


def from_eta_hat(eta_hat, w_range=(1e-12, 1e8)) -> Penalty:
    """Penalty from an eta-trick update rule eta_hat(w), nondecreasing in |w| (Corollary 2).

    ``Omega(w) = int_0^|w| t / eta_hat(t) dt`` by composite Gauss-Legendre quadrature in log t over
    ``w_range`` (panels of width 0.25, 10 nodes each) with an exact power-law head below it. The
    rule is called at ``|w| > 0`` only (``eta_hat(0) = 0`` by convention, as for every penalty);
    Omega beyond ``w_range[1]`` is refused with a ``ValueError`` naming ``w_range``.
    """
    return RulePenalty(eta_hat, w_range)


# ----------------------------------------------------------------------------------------------
# d. From an adaptive keep-ratio rule
# ----------------------------------------------------------------------------------------------
class KeepRatioPenalty(RulePenalty):
    """The penalty of a keep-ratio rule ``alpha(w)`` in ``[0, 1]`` at strength ``lam``:
    ``eta_hat = lam alpha / (1 - alpha)`` (``alpha = 1``: never dropped, ``eta = inf``), then as
    :class:`RulePenalty`. ``alpha(0)`` is not needed (``eta_hat(0) = 0``, keep ratio 0)."""

    _what = "the keep-ratio rule"

    def __init__(self, keep, lam, w_range=(1e-12, 1e8)):
        if not callable(keep):
            raise ValueError("the keep-ratio rule (alpha_hat) must be a vectorized callable w -> "
                             "keep ratio in [0, 1]")
        self.lam = check_param(lam, "lam", low=0.0)
        self._keep = keep
        super().__init__(self._eta_of_keep, w_range, name="from_keep_ratio", verify=False)
        self.description = (f"keep_ratio[{getattr(keep, '__name__', 'alpha_hat')}, "
                            f"lam={self.lam:g}]")

    def _alpha(self, t):
        return call_checked(self._keep, t, self._what)

    def _eta_of_keep(self, t, al=None):
        al = self._alpha(t) if al is None else al
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(al >= 1.0, np.inf, self.lam * al / (1.0 - al))

    def _grid_rule(self, grid):
        al = self._alpha(grid)
        check_elementwise(self._keep, grid, al, self._what, "w")
        bad = np.isnan(al) | (al <= 0) | (al > 1)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(
                f"the keep-ratio rule (alpha_hat) must lie in (0, 1] for w > 0 inside "
                f"w_range={self.w_range}; it returned {al[i]!r} at w = {grid[i]:.6g} (a keep "
                "ratio of 0 drops the weight always: its penalty would be infinite)")
        # monotonicity is checked on alpha itself: lam alpha/(1-alpha) amplifies rounding near 1
        dal = np.diff(al)
        if np.any(dal < -1e-12):
            i = int(np.argmax(dal < -1e-12))
            raise ValueError(
                f"the keep-ratio rule (alpha_hat) must be nondecreasing in |w| (the dropout rate "
                f"must fall as |w| grows); it decreases between w = {grid[i]:.6g} and "
                f"w = {grid[i + 1]:.6g}, so the rule has no effective penalty")
        return self._eta_of_keep(grid, al)

    def _rule(self, t):
        return self._eta_of_keep(t)

    def _rule_anywhere(self, a):
        al = self._alpha(a)
        bad = np.isnan(al) | (al < 0) | (al > 1)
        if np.any(bad):
            self._refuse_outside(a[bad][0], al[bad][0], "a keep ratio must lie in [0, 1]")
        return self._eta_of_keep(a, al)


def from_keep_ratio(alpha_hat, lam, w_range=(1e-12, 1e8)) -> Penalty:
    """Penalty of an adaptive dropout rule with keep ratio alpha_hat(w) in [0, 1] and strength lam.

    ``eta_hat = lam alpha / (1 - alpha)`` (``alpha = 1`` means never dropped: eta = inf). The rule
    is checked on ``w_range`` (in ``(0, 1]`` there, nondecreasing in |w|) and called at ``|w| > 0``
    only: at ``w = 0`` the penalty reports ``eta_hat = 0`` and keep ratio 0, as every penalty does.
    """
    return KeepRatioPenalty(alpha_hat, lam, w_range)


# ----------------------------------------------------------------------------------------------
# e. From the moments of a biased mask
# ----------------------------------------------------------------------------------------------
class MaskPenalty(NumericPenalty):
    """Penalty on ``w~ = E[s] w`` of a biased mask with moments mu(theta), m2(theta)."""

    def __init__(self, mean, second_moment, penalty, theta_range, f0=0.0, name="from_mask_moments"):
        for nm, fn in (("mean", mean), ("second_moment", second_moment), ("penalty", penalty)):
            if not callable(fn):
                raise ValueError(f"{nm} must be a vectorized callable of the mask parameter")
        self._mean, self._m2, self._pen = mean, second_moment, penalty
        self.theta_range = self._check_theta(theta_range)
        self.name = name
        self.description = getattr(penalty, "__name__", "penalty")
        lo, hi = self.theta_range
        th = np.linspace(lo, hi, 2001)
        for nm, fn in (("mean", mean), ("second_moment", second_moment), ("penalty", penalty)):
            check_elementwise(fn, th, call_checked(fn, th, nm), nm, "theta")
        rho = self.rho(th)
        if np.any(rho <= 0) or not np.all(np.isfinite(rho)):
            bad = th[(rho <= 0) | ~np.isfinite(rho)][0]
            raise ValueError(f"mask moments need m2 > mean^2 > 0; violated at theta = {bad:.6g}")
        if np.any(np.diff(rho) >= 0):
            i = int(np.argmax(np.diff(rho) >= 0))
            raise ValueError(
                f"1/eta~ = m2/mean^2 - 1 must decrease as the mask parameter grows; it does not near "
                f"theta = {th[i]:.6g} (reorder or restrict theta_range)"
            )
        pv = call_checked(penalty, th, "penalty")
        if np.any(np.diff(pv) < -1e-12 * np.max(np.abs(pv))):
            i = int(np.argmax(np.diff(pv) < 0))
            raise ValueError(f"penalty(theta) must be nondecreasing; it decreases near theta = {th[i]:.6g}")
        self._offset = 0.5 * (float(pv[0]) if f0 is None else check_param(f0, "f0"))

    @staticmethod
    def _check_theta(rng):
        if not (isinstance(rng, (tuple, list)) and len(rng) == 2):
            raise ValueError(f"theta_range must be a (low, high) pair, got {rng!r}")
        lo = check_param(rng[0], "theta_range[0]")
        hi = check_param(rng[1], "theta_range[1]", low=lo)
        return lo, hi

    def rho(self, theta):
        """1/eta~ = m2/mu^2 - 1 (lambda = 1)."""
        mu = call_checked(self._mean, theta, "mean")
        m2 = call_checked(self._m2, theta, "second_moment")
        return m2 / (mu * mu) - 1.0

    def _solve(self, a):
        w2 = (a * a)[:, None]

        def obj(th):
            return w2 * self.rho(th) + call_checked(self._pen, th, "penalty")

        return grid_golden_min(obj, a.size, *self.theta_range, n_grid=193)

    def theta_hat(self, w):
        """Optimal mask parameter for the effective weight w~ (finite real values only)."""
        arr = as_real_array(w, "w")
        return finish(chunked(self._solve, np.abs(arr))[0], arr)

    def _omega(self, w):
        a = np.abs(w)
        return np.where(a == 0, 0.0, 0.5 * chunked(self._solve, a)[1] - self._offset)

    def _eta_hat(self, w):
        a = np.abs(w)
        th = chunked(self._solve, a)[0]
        eta = 1.0 / self.rho(th)
        eta = np.where(th >= self.theta_range[1] - 1e-9 * max(1.0, abs(self.theta_range[1])), np.inf, eta)
        return np.where(a == 0, 0.0, eta)

    def _f(self, eta):
        lo, hi = self.theta_range
        e = eta.ravel()
        tlo = np.full_like(e, lo)
        thi = np.full_like(e, hi)
        for _ in range(80):
            mid = 0.5 * (tlo + thi)
            below = 1.0 / self.rho(mid) < e
            tlo = np.where(below, mid, tlo)
            thi = np.where(below, thi, mid)
        return (call_checked(self._pen, 0.5 * (tlo + thi), "penalty") - 2.0 * self._offset).reshape(eta.shape)


def from_mask_moments(mean, second_moment, penalty, theta_range=(-30.0, 30.0), f0=0.0) -> Penalty:
    """Effective penalty of a biased mask s (E[s] != 1) on ``w~ = E[s] w`` (docs/theory.md section 2, item 5).

    ``mean(theta) = E[s]``, ``second_moment(theta) = E[s^2]`` and ``penalty(theta)`` (the method's
    own regularizer, which becomes f in the unit convention) are vectorized callables of the mask
    parameter theta over ``theta_range``; ``1/eta~ = E[s^2]/E[s]^2 - 1`` must decrease in theta.
    ``f0`` is the penalty's limit as the mask closes (0 for an L0 count; None: its value at the
    lower end of theta_range), subtracted so that Omega(0) = 0.
    """
    return MaskPenalty(mean, second_moment, penalty, theta_range, f0)
