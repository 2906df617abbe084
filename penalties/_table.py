"""Build piecewise-Chebyshev tables of penalties that have no closed form.

A penalty known only through a parametric envelope (a parameter ``theta`` of the dual variable,
with ``eta(theta)``, ``f(theta)`` and the point ``w(theta)`` at which ``theta`` is optimal) is
tabulated as ``y = log Omega`` against ``x = log |w|`` on ``[x_lo, x_hi]`` in equal intervals, each
holding a degree-``m`` Chebyshev interpolant; the kernel (``penalties.kernels``, code ``TABLE``)
evaluates it and its derivative in a few dozen flops. Outside the range, known asymptotics take
over (power law at 0, cap / logarithm / power law at infinity).

Node values are computed to near machine precision: ``theta`` is found by bisection on the
monotone map ``theta -> log w(theta)`` and ``Omega = 1/2 (w^2 / eta(theta) + f(theta))`` is then
evaluated at the *target* w, which is stationary in ``theta`` so the bisection error enters only
quadratically.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.polynomial import chebyshev as C

from . import kernels as K


@dataclass
class Table:
    params: np.ndarray  # the TABLE kernel parameter vector
    max_rel_error: float  # measured at interval midpoints against direct evaluation
    x_lo: float
    x_hi: float


def _bisect_increasing(fun, target, lo, hi, iters=80):
    """Vectorized bisection for fun(theta) = target with fun increasing on [lo, hi]."""
    lo = np.full_like(target, lo, dtype=float)
    hi = np.full_like(target, hi, dtype=float)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = fun(mid) < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def check_increasing(fun, lo, hi, what, n=4001):
    """Raise ValueError if ``fun`` is not strictly increasing on a grid of [lo, hi]."""
    grid = np.linspace(lo, hi, n)
    vals = fun(grid)
    if not np.all(np.isfinite(vals)):
        bad = grid[~np.isfinite(vals)][0]
        raise ValueError(f"{what}: non-finite value at parameter {bad:.6g}")
    d = np.diff(vals)
    if np.any(d <= 0):
        i = int(np.argmax(d <= 0))
        raise ValueError(f"{what} is not increasing near parameter {grid[i]:.6g}: the rule is not monotone there")
    return grid, vals


def uniform_breakpoints(x_lo, x_hi, interval=0.25):
    n = max(1, int(np.ceil((x_hi - x_lo) / interval)))
    return np.linspace(x_lo, x_hi, n + 1)


def graded_breakpoints(x_lo, x_hi, x_sing, interval=0.25, ratio=0.8):
    """Breakpoints uniform far from a singularity at x_sing > x_hi and geometrically graded toward
    it, so each interval is at least ``ratio/(1-ratio)`` of its width away from x_sing."""
    d_far = interval * ratio / (1.0 - ratio)  # distance beyond which uniform intervals suffice
    x_switch = min(x_hi, x_sing - d_far)
    pts = list(uniform_breakpoints(x_lo, x_switch, interval)) if x_switch > x_lo else [x_lo]
    d = x_sing - pts[-1]
    while True:
        d *= ratio
        nxt = x_sing - d
        if nxt >= x_hi - 1e-12 * max(1.0, abs(x_hi)):
            break
        pts.append(nxt)
    if x_hi - pts[-1] < 0.25 * (pts[-1] - pts[-2]) if len(pts) > 1 else False:
        pts[-1] = x_hi
    else:
        pts.append(x_hi)
    return np.asarray(pts)


def build_table(
    x_of_theta,
    omega_at,
    theta_lo: float,
    theta_hi: float,
    breakpoints,
    *,
    degree: int = 12,
    p_lo: float = 1.0,
    tail_kind: int = K.TAIL_LOG,
    tail_c: float = 1.0,
    cap: float | None = None,
) -> Table:
    """Tabulate Omega from an envelope description on the given breakpoints in x = log|w|.

    x_of_theta(theta) -> log w at which theta is optimal (increasing);
    omega_at(w, theta) -> 1/2 (w^2 / eta(theta) + f(theta)).
    """
    bp = np.asarray(breakpoints, dtype=float)
    n = bp.size - 1
    m = int(degree)
    h = np.diff(bp)
    s = np.cos(np.pi * (np.arange(m + 1) + 0.5) / (m + 1))  # first-kind Chebyshev points
    xs = bp[:-1, None] + 0.5 * h[:, None] * (s[None, :] + 1.0)
    theta = _bisect_increasing(x_of_theta, xs.ravel(), theta_lo, theta_hi).reshape(xs.shape)
    y = np.log(omega_at(np.exp(xs), theta))
    if not np.all(np.isfinite(y)):
        raise FloatingPointError("table construction produced non-finite values")
    vinv = np.linalg.inv(C.chebvander(s, m))
    coef = y @ vinv.T  # (n, m+1)
    dcoef = np.zeros_like(coef)
    for k in range(n):
        d = C.chebder(coef[k]) * (2.0 / h[k])
        dcoef[k, : d.size] = d
    om_lo = float(np.exp(C.chebval(-1.0, coef[0])))
    om_hi = float(np.exp(C.chebval(1.0, coef[-1])))
    if tail_kind == K.TAIL_CAP:
        om_hi = float(cap)
        tail_c = float(cap)
    header = np.zeros(K.T_HEADER)
    header[K.T_N] = n
    header[K.T_M] = m
    header[K.T_PLO] = p_lo
    header[K.T_TAIL] = tail_kind
    header[K.T_TAILC] = tail_c
    header[K.T_OMLO] = om_lo
    header[K.T_OMHI] = om_hi
    params = np.concatenate([header, bp, coef.ravel(), dcoef.ravel()])
    # Accuracy audit at points the interpolant never saw (interval midpoints and quarter points).
    xm = np.concatenate([bp[:-1] + 0.5 * h, bp[:-1] + 0.23 * h, bp[:-1] + 0.91 * h])
    tm = _bisect_increasing(x_of_theta, xm, theta_lo, theta_hi)
    direct = omega_at(np.exp(xm), tm)
    approx = K._map("omega", K.TABLE, params, np.exp(xm))
    err = float(np.max(np.abs(approx / direct - 1.0)))
    return Table(params=params, max_rel_error=err, x_lo=float(bp[0]), x_hi=float(bp[-1]))


# Gauss-Legendre nodes on [-1, 1], reused by the moment integrals.
def gauss_legendre(n: int):
    return np.polynomial.legendre.leggauss(n)
