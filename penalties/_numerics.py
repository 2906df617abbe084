"""Shared vectorized numerics of the duality constructors (``penalties.duality``).

Grid scan plus golden-section refinement of a 1-D minimum per point (robust to several local
minima), Richardson-extrapolated central differences, a numeric proximal operator by bracketing
and bisection, and :class:`NumericPenalty`, the base of every penalty built from a callable.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import check_param
from .base import Penalty

_GOLD = (math.sqrt(5.0) - 1.0) / 2.0
_CHUNK = 1 << 15


def call_checked(fn, x, name):
    """Call a user callable on an array and insist on a same-shape float result (nothing is
    broadcast: a scalar returned for an array is a function that is not vectorized)."""
    try:
        out = np.asarray(fn(x), dtype=float)
    except Exception as exc:  # surface the user's error with context
        raise ValueError(f"{name} raised {type(exc).__name__}: {exc} (it must accept numpy arrays)") from exc
    if out.shape != np.shape(x):
        raise ValueError(
            f"{name} must be vectorized: for an input of shape {np.shape(x)} it returned shape "
            f"{out.shape}; write it with numpy's elementwise functions (e.g. np.log, np.where), or "
            "wrap a scalar function in np.vectorize")
    return out


def check_elementwise(fn, grid, vals, name, arg):
    """``ValueError`` unless ``fn`` maps arrays elementwise: its values on every 7th point of
    ``grid``, on ``grid`` reversed and on its first and last thirds must be ``vals`` (its values
    on the whole grid). A function of the whole array (``x / x.max()``, ``np.sort``,
    ``x - x.min()``, ``x.mean()``) defines no penalty."""
    third = max(1, len(grid) // 3)
    for idx in (slice(None, None, 7), slice(None, None, -1), slice(None, third),
                slice(-third, None)):
        got = call_checked(fn, grid[idx], name)
        want = vals[idx]
        same = (got == want) | np.isclose(got, want, rtol=1e-9, atol=0.0, equal_nan=True)
        if not np.all(same):
            i = int(np.argmax(~same))
            raise ValueError(
                f"{name} must act elementwise (each output depends on its own input only): at "
                f"{arg} = {grid[idx][i]:.6g} it returned {want[i]:.6g} within one array and "
                f"{got[i]:.6g} within another; write it with numpy's elementwise functions")


def grid_golden_min(obj, n_points, lo, hi, n_grid=97, iters=64):
    """Minimize obj(i, P) over a scalar parameter in [lo, hi] for each of n_points rows.

    ``obj(P)`` receives an (n, k) array of parameters (row i belongs to point i) and returns (n, k)
    values. A grid scan locates the best cell (several local minima are handled), golden-section
    search refines within its two neighbouring cells. Returns (argmin, min) arrays of length n.
    """
    grid = np.linspace(lo, hi, n_grid)
    vals = obj(np.broadcast_to(grid, (n_points, n_grid)))
    vals = np.where(np.isnan(vals), np.inf, vals)
    i = np.argmin(vals, axis=1)
    a = grid[np.maximum(i - 1, 0)]
    b = grid[np.minimum(i + 1, n_grid - 1)]
    c = b - _GOLD * (b - a)
    d = a + _GOLD * (b - a)
    fc = obj(c[:, None])[:, 0]
    fd = obj(d[:, None])[:, 0]
    for _ in range(iters):
        left = fc <= fd
        a_n = np.where(left, a, c)
        b_n = np.where(left, d, b)
        c_n = np.where(left, b_n - _GOLD * (b_n - a_n), d)
        d_n = np.where(left, c, a_n + _GOLD * (b_n - a_n))
        f_new = obj(np.where(left, c_n, d_n)[:, None])[:, 0]
        fc, fd = np.where(left, f_new, fd), np.where(left, fc, f_new)
        a, b, c, d = a_n, b_n, c_n, d_n
    x = 0.5 * (a + b)
    # one parabolic step on a fixed stencil: golden section leaves x at ~sqrt(machine eps)
    h = 1e-4 * max(1.0, abs(hi - lo) / 50.0)
    f3 = obj(np.stack([x - h, x, x + h], axis=1))
    curv = f3[:, 0] - 2.0 * f3[:, 1] + f3[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        step = 0.5 * h * (f3[:, 0] - f3[:, 2]) / curv
    ok = np.isfinite(step) & (curv > 0) & (np.abs(step) < h)
    xp = x + np.where(ok, step, 0.0)
    fp = obj(xp[:, None])[:, 0]
    better = ok & (fp <= f3[:, 1])  # keep the step only where it does not make things worse
    x = np.where(better, xp, x)
    fx = np.where(better, fp, f3[:, 1])
    gmin = vals[np.arange(n_points), i]
    use_grid = gmin < fx
    x = np.where(use_grid, grid[i], x)
    fx = np.where(use_grid, gmin, fx)
    return x, fx


def chunked(fn, arr, *extra):
    """Apply fn to 1-D chunks of arr (bounding the memory of grid scans)."""
    flat = arr.ravel()
    outs = [fn(flat[s : s + _CHUNK], *extra) for s in range(0, flat.size, _CHUNK)]
    if not outs:
        return tuple(np.empty(0) for _ in range(2))
    return tuple(np.concatenate(parts).reshape(arr.shape) for parts in zip(*outs))


def richardson_derivative(fn, x, name):
    """d fn / dx at x > 0 by central differences in log x with one Richardson step (~1e-10)."""
    h = 1e-3
    def d(hh):
        return (call_checked(fn, x * math.exp(hh), name) - call_checked(fn, x * math.exp(-hh), name)) / (2.0 * hh)
    dlog = (4.0 * d(h / 2.0) - d(h)) / 3.0  # d fn / d log x
    return dlog / x


def numeric_prox(omega, derivative, v, t, n_cells=24, iters=70):
    """Vectorized 1-D prox ``argmin_x 1/2 (x-v)^2 + t Omega(x)`` for even, nondecreasing Omega.

    Every sign change (- to +) of ``phi(x) = x + t Omega'(x) - |v|`` on a grid of [0, |v|] is a
    local minimizer; each is refined by bisection and the best is compared with x = 0.
    """
    a = np.abs(v).ravel()
    tt = np.broadcast_to(t, np.shape(v)).ravel()
    grid = np.linspace(0.0, 1.0, n_cells + 1)
    grid[0] = 1e-14
    xs = a[:, None] * grid[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        phi = xs + tt[:, None] * derivative(xs) - a[:, None]
    brk = (phi[:, :-1] < 0.0) & (phi[:, 1:] >= 0.0)
    rows, cols = np.nonzero(brk)
    best = np.zeros_like(a)
    if rows.size:
        lo = xs[rows, cols].copy()
        hi = xs[rows, cols + 1].copy()
        ar, tr = a[rows], tt[rows]
        for _ in range(iters):
            mid = 0.5 * lo + 0.5 * hi
            with np.errstate(over="ignore", invalid="ignore"):
                neg = mid + tr * derivative(mid) - ar < 0.0
            lo = np.where(neg, mid, lo)
            hi = np.where(neg, hi, mid)
        r = 0.5 * lo + 0.5 * hi
        # (h(0) - h(r)) / a, h(x) = 1/2 (x - a)^2 + t Omega(x): finite for any finite v, unlike h
        # (which overflows beyond |v| ~ 1e154); the kernels' _gain in numpy
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            gain = (r / ar) * ((ar - 0.5 * r) - tr * (omega(r) / r))
        gain = np.where((r > 0) & ~np.isnan(gain), gain, -np.inf)
        order = np.lexsort((-gain, rows))  # per row, largest gain first
        first = np.ones(order.size, dtype=bool)
        first[1:] = rows[order][1:] != rows[order][:-1]
        sel = order[first]
        improve = gain[sel] > 0.0
        best[rows[sel][improve]] = r[sel][improve]
    return (np.sign(v).ravel() * best).reshape(np.shape(v))


class NumericPenalty(Penalty):
    """A penalty defined by vectorized callables, with generic numerics for the rest."""

    name = "numeric"

    def _omega(self, w):
        raise NotImplementedError

    def _derivative(self, w):
        a = np.abs(w)
        eta = self._eta_hat(a)
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(a == 0, 0.0, np.where(np.isinf(eta), 0.0, a / eta))
        return np.sign(w) * d

    def _prox(self, v, t):
        return numeric_prox(self._omega, self._derivative, v, t)

    def get_params(self, deep=True):
        return {}

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    def __reduce__(self):  # callables may be lambdas: pickle by value is not possible in general
        return object.__reduce__(self)

    def __repr__(self):
        return f"{type(self).__name__}({self.description})"

    description = ""


def log_grid(lo, hi, n=801):
    return np.exp(np.linspace(math.log(lo), math.log(hi), n))


#: The largest magnitude whose square is a float64 with room to spare (``w^2``, ``t^2 / eta``):
#: the end of every range of ``w`` the numeric penalties integrate or scan, and the largest
#: ``|w|`` (times a column norm, for ARD) their formulas take.
W_MAX = 1e153


def check_range(rng, name, *, high_max=None):
    """A ``(low, high)`` range with ``0 < low < high`` (``high <= high_max`` when given)."""
    if not (isinstance(rng, (tuple, list)) and len(rng) == 2):
        raise ValueError(f"{name} must be a (low, high) pair, got {rng!r}")
    lo = check_param(rng[0], f"{name}[0]", low=0.0)
    hi = check_param(rng[1], f"{name}[1]", low=lo)
    if high_max is not None and hi > high_max:
        raise ValueError(f"{name}[1] must be <= {high_max:g}, got {hi:g}: beyond it w^2 is not a "
                         "float64 number (it overflows at ~1.3e154); rescale the weights instead")
    return lo, hi
