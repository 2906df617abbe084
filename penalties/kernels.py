"""Compiled scalar kernels: one implementation of every separable penalty, many callers.

Each separable penalty is described to compiled code by ``(code, params)``: an integer that
selects the formula and a float64 vector of its parameters (``Penalty.kernel_spec()``). The
public ``omega_scalar``, ``derivative_scalar``, ``eta_hat_scalar``, ``prox_scalar`` and
``prox_numeric_scalar`` work from both sides: called from Python they check their arguments first
(an unknown code, a parameter vector too short for its code or with a value the penalty refuses,
a truncated table, a NaN or infinite ``w``, a negative step: ``ValueError`` naming it) and then run
the compiled kernel; called from other jitted code (the coordinate-descent solvers of
``dualdrop.linear`` do so) they are the compiled ``numba.njit(cache=True)`` kernels themselves,
inlined, without a check (the callers hold specs of validated penalty objects). :func:`map_kernel`
maps one over an array (checked likewise), in parallel for large inputs.

All functions use the unit convention of docs/theory.md section 1: ``Omega(0) = 0`` and lambda is not part of
the penalty.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from numba import njit, prange
from numba.extending import overload

from ._codes import (L1, LOG2SUM, LOGSUM, LP, MCP, MIXED, SCAD, STANDOUT,  # noqa: F401 (public)
                     T_HEADER, T_M, T_N, T_OMHI, T_OMLO, T_PLO, T_TAIL, T_TAILC, TABLE, TAIL_CAP,
                     TAIL_LOG, TAIL_POW)
from ._kernel_checks import check_scalar, check_spec, check_step, real_array
from ._numba_cache import install as _install_cache

_install_cache()  # compiled kernels go to a per-user cache, never into the installed package

PARALLEL_MIN = 20000  # below this many points the serial loop is faster than spawning threads


# ----------------------------------------------------------------------------------------------
# Piecewise-Chebyshev tables in (log |w|, log Omega)
# ----------------------------------------------------------------------------------------------
@njit(cache=True)
def _clenshaw(p, offset, m, s):
    b1 = 0.0
    b2 = 0.0
    for j in range(m, 0, -1):
        b0 = p[offset + j] + 2.0 * s * b1 - b2
        b2 = b1
        b1 = b0
    return p[offset] + s * b1 - b2


@njit(cache=True)
def _table_y_dy(p, x):
    """log Omega and d log Omega / d log|w| at x = log|w| inside the table range."""
    n = int(p[T_N])
    m = int(p[T_M])
    bp = T_HEADER  # offset of the breakpoints
    lo = 0
    hi = n
    while hi - lo > 1:  # binary search: bp[lo] <= x < bp[hi]
        mid = (lo + hi) // 2
        if x < p[bp + mid]:
            hi = mid
        else:
            lo = mid
    k = lo
    a = p[bp + k]
    b = p[bp + k + 1]
    s = 2.0 * (x - a) / (b - a) - 1.0
    stride = m + 1
    cbase = bp + n + 1
    y = _clenshaw(p, cbase + k * stride, m, s)
    dy = _clenshaw(p, cbase + n * stride + k * stride, m, s)
    return y, dy


@njit(cache=True)
def _table_omega_and_slope(p, a):
    """(Omega(a), Omega'(a)) for a > 0 from a TABLE parameter vector."""
    x = math.log(a)
    xlo = p[T_HEADER]
    xhi = p[T_HEADER + int(p[T_N])]
    if x < xlo:
        plo = p[T_PLO]
        om = p[T_OMLO] * math.exp(plo * (x - xlo))
        return om, plo * om / a
    if x >= xhi:
        kind = int(p[T_TAIL])
        c = p[T_TAILC]
        if kind == TAIL_CAP:
            return p[T_OMHI], 0.0
        if kind == TAIL_LOG:
            return p[T_OMHI] + c * (x - xhi), c / a
        om = p[T_OMHI] * math.exp(c * (x - xhi))
        return om, c * om / a
    y, dy = _table_y_dy(p, x)
    om = math.exp(y)
    return om, om * dy / a


# ----------------------------------------------------------------------------------------------
# Scalar kernels
# ----------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _standout_ratio(p, a):
    """Standout's ``Omega(a) / a`` for ``a > 0``: with ``u = s_a a``, ``ce = c e^{-b}`` and
    ``g(u) = 1 - (1 + u) e^{-u}``, ``Omega = ce g(u) / s_a^2``, so ``Omega / a = (ce / s_a) g(u) / u``
    (for small u, ``ce a g(u) / u^2`` by its series): finite wherever the answer is, whatever the
    scales of ``a`` and ``s_a`` (``u^2 / s_a^2`` under- or overflows)."""
    sa = p[0]
    u = sa * a
    ce = p[2] * math.exp(-p[1])
    if u < 1e-3:
        return (ce * a) * (0.5 - u / 3.0 + u * u / 8.0 - u * u * u / 30.0)
    g = -math.expm1(-u) - u * math.exp(-u) if u < 800.0 else 1.0
    return (ce / sa) * (g / u)


@njit(cache=True, inline="always")
def _omega_ratio(code, p, a):
    """``Omega(a) / a`` for ``a > 0``, formed without the overflow of ``Omega`` itself where a
    closed form allows (Lp, Standout): what the prox's comparison with 0 needs (:func:`_gain`)."""
    if code == LP:
        return a ** (p[0] - 1.0) / p[0]
    if code == STANDOUT:
        return _standout_ratio(p, a)
    return _omega(code, p, a) / a


@njit(cache=True, inline="always")
def _unwrap(code, p):
    """``(code, params)`` of the formulas to evaluate: MIXED's inner penalty, or the penalty
    itself; both views of ``p`` have the same array type, so the formulas inline once."""
    if code == MIXED:
        return int(p[2]), p[3:]
    return code, p[0:]


@njit(cache=True)
def _omega_scalar(code, p, w):
    """Omega(w) for the penalty (code, p). One inlined copy of the formulas serves both a plain
    code and MIXED's inner one (two copies doubled the compile time of every caller)."""
    inner, q = _unwrap(code, p)
    om = _omega(inner, q, w)
    if code == MIXED:
        return p[0] * om + 0.5 * p[1] * w * w
    return om


@njit(cache=True, inline="always")
def _omega(code, p, w):
    a = abs(w)
    if a == 0.0:
        return 0.0
    if code == L1:
        return a
    if code == LP:
        return a ** p[0] / p[0]
    if code == LOGSUM:
        r = a / p[0]
        if r < 1e300:
            return math.log1p(r)
        # a/eps overflows or nearly: log(a + eps) - log eps without forming the quotient
        return math.log(a) - math.log(p[0]) + math.log1p(p[0] / a)
    if code == LOG2SUM:
        r = (a / p[0]) * a if a < 1e150 else math.inf
        if r < 1e300:
            return math.log1p(r)
        # log(a^2 + eps) - log eps = 2 log a - log eps + log1p(eps / a^2)
        return 2.0 * math.log(a) - math.log(p[0]) + math.log1p((p[0] / a) / a)
    if code == SCAD:
        A = p[0]
        lam = p[1]
        if a <= lam:
            return a
        if a <= A * lam:
            return (2.0 * A * lam * a - a * a - lam * lam) / (2.0 * (A - 1.0) * lam)
        return 0.5 * (A + 1.0) * lam
    if code == MCP:
        A = p[0] * p[1]
        if a <= A:
            return a - a * a / (2.0 * A)
        return 0.5 * A
    if code == STANDOUT:
        return _standout_ratio(p, a) * a
    if code == TABLE:
        om, _ = _table_omega_and_slope(p, a)
        return om
    return np.nan


@njit(cache=True)
def _derivative_scalar(code, p, w):
    """Omega'(w) = w / eta_hat(w); 0 at w = 0 (the minimum-norm subgradient)."""
    inner, q = _unwrap(code, p)
    d = _derivative(inner, q, w)
    if code == MIXED:
        return p[0] * d + p[1] * w
    return d


@njit(cache=True, inline="always")
def _derivative(code, p, w):
    a = abs(w)
    if a == 0.0:
        return 0.0
    sgn = 1.0 if w > 0 else -1.0
    if code == L1:
        d = 1.0
    elif code == LP:
        d = a ** (p[0] - 1.0)
    elif code == LOGSUM:
        d = 1.0 / (a + p[0])
    elif code == LOG2SUM:
        # 2a / (a^2 + eps), in the form that neither overflows (large a) nor underflows
        d = 2.0 / (a + p[0] / a) if a * a > p[0] else 2.0 * a / (a * a + p[0])
    elif code == SCAD:
        A = p[0]
        lam = p[1]
        if a <= lam:
            d = 1.0
        elif a <= A * lam:
            d = (A * lam - a) / ((A - 1.0) * lam)
        else:
            d = 0.0
    elif code == MCP:
        A = p[0] * p[1]
        d = 1.0 - a / A if a < A else 0.0
    elif code == STANDOUT:
        # c a e^{-(s a + b)}; past e^-700 in logs, where c a alone can overflow
        ex = p[0] * a + p[1]
        d = (p[2] * a) * math.exp(-ex) if ex < 700.0 else math.exp(
            math.log(p[2]) + math.log(a) - ex)
    elif code == TABLE:
        _, d = _table_omega_and_slope(p, a)
    else:
        d = np.nan
    return sgn * d


@njit(cache=True)
def _eta_hat_scalar(code, p, w):
    """The minimizing dual variable eta_hat(w) (may be +inf)."""
    inner, q = _unwrap(code, p)
    e = _eta_hat(inner, q, w)
    if code == MIXED:  # w / Omega'(w), with Omega'(w) / w = c / eta_inner + r
        den = (p[0] / e if e > 0.0 else (np.inf if p[0] > 0.0 else 0.0)) + p[1]
        return 1.0 / den if den > 0.0 else np.inf
    return e


@njit(cache=True, inline="always")
def _eta_hat(code, p, w):
    a = abs(w)
    if code == L1:
        return a
    if code == LP:
        return a ** (2.0 - p[0])
    if code == LOGSUM:
        return a * (a + p[0])
    if code == LOG2SUM:
        return 0.5 * (a * a + p[0])
    if code == SCAD:
        A = p[0]
        lam = p[1]
        if a <= lam:
            return a
        if a < A * lam:
            return (A - 1.0) * lam * a / (A * lam - a)
        return np.inf
    if code == MCP:
        A = p[0] * p[1]
        if A == np.inf:  # a = inf: the l1 penalty
            return a
        if a < A:
            return A * a / (A - a)
        return np.inf
    if code == STANDOUT:
        return math.exp(p[0] * a + p[1]) / p[2]
    if code == TABLE:
        if a == 0.0:
            plo = p[T_PLO]
            if plo < 2.0:
                return 0.0
            # Omega ~ Om_lo (a / w_lo)^2 near 0: eta_hat(0) = w_lo^2 / (2 Om_lo)
            return math.exp(2.0 * p[T_HEADER]) / (2.0 * p[T_OMLO])
        _, d = _table_omega_and_slope(p, a)
        if d <= 0.0:
            return np.inf
        return a / d
    return np.nan


@njit(cache=True)
def _scaled_objective(code, p, x, a, t):
    """``h(x) / a^2`` for ``h(x) = 1/2 (x - a)^2 + t Omega(x)``, ``a > 0``: the prox objective in
    units of ``a^2``, so that comparing candidates neither overflows for |v| up to the largest
    float (``h`` itself is ``inf`` beyond ~1e154) nor loses the penalty for tiny |v|."""
    d = (x - a) / a
    om = _omega(code, p, x)
    pen = 0.0 if om == 0.0 else (t / a) * (om / a)
    return 0.5 * d * d + pen


@njit(cache=True, inline="always")
def _gain(code, p, x, a, t):
    """``(h(0) - h(x)) / a`` for ``h(x) = 1/2 (x - a)^2 + t Omega(x)`` and ``0 < x <= a``: how much
    ``x`` beats 0 in the prox objective, positive when it does. Written as ``(x/a) ((a - x/2) -
    t Omega(x)/x)``: ``x/a <= 1`` and the bracket is at most ``a``, so it is finite over the whole
    float range (``h`` overflows beyond |v| ~ 1e154, where the answer is about ``v``)."""
    return (x / a) * ((a - 0.5 * x) - t * _omega_ratio(code, p, x))


@njit(cache=True)
def _consider(code, p, a, t, x, best, hbest):
    """Keep x if it beats the incumbent for min 1/2 (x - a)^2 + t Omega(x) (ties: smaller x)."""
    h = _scaled_objective(code, p, x, a, t)
    if h < hbest or (h == hbest and x < best):
        return x, h
    return best, hbest


@njit(cache=True)
def _prox_root(code, p, a, t, lo, hi, flo, fhi):
    """Root of phi(x) = x + t Omega'(x) - a in [lo, hi] with phi(lo) < 0 <= phi(hi) (Illinois;
    the secant point as ``lo + (hi - lo) flo / (flo - fhi)``, which cannot overflow)."""
    side = 0
    x = hi
    for _ in range(200):
        x = lo + (hi - lo) * (flo / (flo - fhi))
        if not (lo < x < hi):
            x = 0.5 * lo + 0.5 * hi
        fx = x + t * _derivative(code, p, x) - a
        if fx == 0.0:
            return x
        if fx < 0.0:
            lo = x
            flo = fx
            if side == -1:
                fhi *= 0.5
            side = -1
        else:
            hi = x
            fhi = fx
            if side == 1:
                flo *= 0.5
            side = 1
        if hi - lo <= 4e-16 * hi:
            break
    return 0.5 * lo + 0.5 * hi


@njit(cache=True)
def _prox_numeric_scalar(code, p, v, t):
    """Generic 1-D prox: every local minimizer of 1/2 (x-|v|)^2 + t Omega(x) on [0, |v|] is found
    as a sign change of its derivative on a 24-cell grid, refined to machine precision, and the
    best one is compared with x = 0 (by :func:`_gain`, finite for any finite v and t). Exact for
    penalties whose Omega' changes convexity at most once per cell (all catalog penalties)."""
    a = abs(v)
    if a == 0.0 or t == 0.0:
        return v
    K = 24
    best = 0.0
    gbest = 0.0
    x_prev = 0.0
    # phi at 0+: t * Omega'(0+) - a
    tiny = a * 1e-14
    f_prev = tiny + t * _derivative(code, p, tiny) - a
    for i in range(1, K + 1):
        # the last grid point is |v| itself (a penalty flat beyond some point, Omega' = 0, has its
        # root there; a rounded grid point just below it would lose it); a * (i / K), not
        # a * i / K, which overflows for |v| near the largest float
        x = a if i == K else a * (i / K)
        fx = x + t * _derivative(code, p, x) - a
        if f_prev < 0.0 and fx >= 0.0:
            r = _prox_root(code, p, a, t, x_prev, x, f_prev, fx)
            if r > 0.0:
                g = _gain(code, p, r, a, t)
                if g > gbest:
                    gbest = g
                    best = r
        x_prev = x
        f_prev = fx
    return best if v > 0 else -best


@njit(cache=True)
def _prox_scalar(code, p, v, t):
    """argmin_x 1/2 (x - v)^2 + t Omega(x) (closed form where one exists).

    MIXED: ``1/2 (x - v)^2 + t c Omega(x) + t r x^2 / 2 = (s/2) (x - v/s)^2 + t c Omega(x) +
    const`` with ``s = 1 + t r``, so the prox is the inner penalty's at ``v / s`` with step
    ``t c / s``."""
    inner, q = _unwrap(code, p)
    if code == MIXED:
        s = 1.0 + t * p[1]
        v, t = v / s, t * p[0] / s
    return _prox(inner, q, v, t)


@njit(cache=True, inline="always")
def _prox_logsum(p, v, t):
    """logsum's prox, :func:`_prox`'s branch on its own (inlined alone: :data:`OWN_PROX`)."""
    a = abs(v)
    if a == 0.0 or t == 0.0:
        return v
    sgn = 1.0 if v > 0 else -1.0
    # stationary points: x^2 + (eps - a) x + t - a eps = 0; the larger root is
    # (a - eps)/2 + sqrt(m^2 - t) with m = (a + eps)/2, formed as m sqrt((1 - q)(1 + q)),
    # q = sqrt(t)/m, so that nothing is squared (no overflow up to the largest float)
    eps = p[0]
    m = 0.5 * a + 0.5 * eps
    q = math.sqrt(t) / m
    if q > 1.0:
        return 0.0
    s = m * math.sqrt((1.0 - q) * (1.0 + q))
    half = 0.5 * a - 0.5 * eps
    if half >= 0.0:
        r = half + s
    elif t / eps < a:
        # a < eps: half + s cancels; the product of the roots is t - a eps (divided by eps
        # above and below: a eps can overflow)
        r = (a - t / eps) / (s / eps + 0.5 - 0.5 * (a / eps))
    else:
        return 0.0
    if r <= 0.0:
        return 0.0
    r = min(r, a)  # the root is below a; rounding can put it an ulp above
    return sgn * r if _gain(LOGSUM, p, r, a, t) > 0.0 else 0.0


@njit(cache=True, inline="always")
def _prox(code, p, v, t):
    if code == LOGSUM:
        return _prox_logsum(p, v, t)
    a = abs(v)
    if a == 0.0 or t == 0.0:
        return v
    sgn = 1.0 if v > 0 else -1.0
    if code == L1:
        return sgn * max(a - t, 0.0)
    if code == LP and p[0] == 1.0:
        return sgn * max(a - t, 0.0)
    if code == MCP:
        A = p[0] * p[1]
        if t < A:  # convex objective: firm thresholding
            if a <= t:
                return 0.0
            if a <= A:  # (a - t) / (1 - t/A) <= a; rounding can put it an ulp above at a = A
                return sgn * min((a - t) / (1.0 - t / A), a)
            return v
        # t >= A: concave on [0, A], so the minimum is 0 or v itself (|v| > A), whichever is
        # lower: v when a^2 > t A (compared as a > (t/a) A: no overflow)
        return v if a > (t / a) * A else 0.0
    if code == SCAD:
        # Piecewise-quadratic objective: the minimum is a clipped stationary point of a piece or a
        # breakpoint; compare them all (scalars only: this runs inside coordinate descent).
        sa = p[0]
        lam = p[1]
        best, hbest = 0.0, 0.5
        best, hbest = _consider(code, p, a, t, min(max(a - t, 0.0), lam), best, hbest)
        best, hbest = _consider(code, p, a, t, lam, best, hbest)
        best, hbest = _consider(code, p, a, t, sa * lam, best, hbest)
        best, hbest = _consider(code, p, a, t, max(a, sa * lam), best, hbest)
        den = 1.0 - t / ((sa - 1.0) * lam)
        if den != 0.0:
            x2 = (a - t * sa / (sa - 1.0)) / den
            best, hbest = _consider(code, p, a, t, min(max(x2, lam), sa * lam), best, hbest)
        return sgn * best
    return _prox_numeric_scalar(code, p, v, t)


# ----------------------------------------------------------------------------------------------
# For kernels compiled for one penalty (``dualdrop.linear.solvers.gram_cd.kernels_for``): with
# ``code`` a compile-time constant of the caller (a closure's free variable), numba prunes the
# other penalties' branches of these inlined functions before typing (an OWN_PROX penalty's
# prox is inlined alone, nothing to prune). MIXED keeps its run-time inner code: the general one.
# ----------------------------------------------------------------------------------------------
OWN_PROX = {LOGSUM: _prox_logsum}


@njit(cache=True, inline="always")
def omega_of(code, p, w):
    """:func:`omega_scalar` for inlining (the comment above)."""
    if code == MIXED:
        return _omega_scalar(code, p, w)
    return _omega(code, p, w)


@njit(cache=True, inline="always")
def prox_of(code, p, v, t):
    """:func:`prox_scalar` for inlining (the comment above)."""
    if code == MIXED:
        return _prox_scalar(code, p, v, t)
    return _prox(code, p, v, t)


# ----------------------------------------------------------------------------------------------
# Array maps (serial and parallel); out-parameters keep allocation in the caller
# ----------------------------------------------------------------------------------------------
@njit(cache=True)
def _apply(which, code, p, x, t):
    if which == 0:
        return _omega_scalar(code, p, x)
    if which == 1:
        return _derivative_scalar(code, p, x)
    if which == 2:
        return _eta_hat_scalar(code, p, x)
    return _prox_scalar(code, p, x, t)


@njit(cache=True)
def _map_serial(which, code, p, x, t, out):
    st = 1 if t.size == x.size else 0  # t is either elementwise or a single (unused) value
    for i in range(x.size):
        out[i] = _apply(which, code, p, x[i], t[i * st])


@njit(cache=True, parallel=True)
def _map_parallel(which, code, p, x, t, out):
    st = 1 if t.size == x.size else 0
    for i in prange(x.size):
        out[i] = _apply(which, code, p, x[i], t[i * st])


_WHICH = {"omega": 0, "derivative": 1, "eta_hat": 2, "prox": 3}
_PARALLEL: bool | None = None


def set_parallel(enabled: bool | None) -> None:
    """Whether large array maps (>= PARALLEL_MIN points) run on numba's thread pool.

    ``None`` (default): yes, unless torch is imported in this process. numba's OpenMP workers keep
    spinning after a parallel region, and next to torch that was measured to slow torch's own
    kernels about 7x (LeNet-300-100 step 3.3 ms -> 22 ms on 2 cores), so torch processes get the
    serial loop unless they ask for ``set_parallel(True)``.
    """
    global _PARALLEL
    if enabled is not None and not isinstance(enabled, bool):
        raise ValueError(f"enabled must be True, False or None, got {enabled!r}")
    _PARALLEL = enabled


def _use_parallel(n: int) -> bool:
    if n < PARALLEL_MIN:
        return False
    if _PARALLEL is None:
        return "torch" not in sys.modules
    return _PARALLEL
_EMPTY = np.zeros(1)


def _map(which: str, code: int, params: np.ndarray, x: np.ndarray, t: np.ndarray | None = None):
    """:func:`map_kernel` without its checks (the penalty objects' own path: their spec and
    their inputs are validated already)."""
    flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
    out = np.empty_like(flat)
    if t is None:
        tflat = _EMPTY
    else:
        tflat = np.ascontiguousarray(np.broadcast_to(t, x.shape), dtype=np.float64).ravel()
    fn = _map_parallel if _use_parallel(flat.size) else _map_serial
    fn(_WHICH[which], int(code), np.ascontiguousarray(params, dtype=np.float64), flat, tflat, out)
    return out.reshape(np.shape(x))


def map_kernel(which: str, code: int, params: np.ndarray, x: np.ndarray, t: np.ndarray | None = None):
    """Apply one scalar kernel (``which``: "omega", "derivative", "eta_hat" or "prox")
    elementwise to a real array ``x`` (any shape; finite values); returns a new float64 array.
    ``t`` (the prox's step, ``>= 0``, broadcast against ``x``) is required by "prox" only.
    Every argument is checked first (``ValueError`` naming it)."""
    if which not in _WHICH:
        raise ValueError(f"which must be one of {sorted(_WHICH)}, got {which!r}")
    code, params = check_spec(code, params)
    arr = real_array(x, "x")
    if which == "prox":
        if t is None:
            raise ValueError("t (the prox step) is required for which='prox'")
        tt = real_array(t, "t")
        if np.any(tt < 0):
            raise ValueError("t (the prox step) must be >= 0")
        try:
            np.broadcast_to(tt, arr.shape)
        except ValueError:
            raise ValueError(f"t of shape {tt.shape} does not broadcast to x of shape "
                             f"{arr.shape}") from None
        return _map(which, code, params, arr, tt)
    if t is not None:
        raise ValueError(f"t is the prox's step; which={which!r} takes none")
    return _map(which, code, params, arr)


# ----------------------------------------------------------------------------------------------
# The checked entries: the public names, for Python callers and (through the overloads, without
# the checks) for jitted ones (the checks: ``_kernel_checks``, without numba)
# ----------------------------------------------------------------------------------------------


def omega_scalar(code, params, w):
    """Omega(w) for the penalty (code, params) (checked; compiled and unchecked from jitted code)."""
    code, p = check_spec(code, params)
    return _omega_scalar(code, p, check_scalar(w, "w"))


def derivative_scalar(code, params, w):
    """Omega'(w) = w / eta_hat(w); 0 at w = 0 (checked; see :func:`omega_scalar`)."""
    code, p = check_spec(code, params)
    return _derivative_scalar(code, p, check_scalar(w, "w"))


def eta_hat_scalar(code, params, w):
    """The minimizing dual variable eta_hat(w), may be +inf (checked; see :func:`omega_scalar`)."""
    code, p = check_spec(code, params)
    return _eta_hat_scalar(code, p, check_scalar(w, "w"))


def prox_scalar(code, params, v, t):
    """argmin_x 1/2 (x - v)^2 + t Omega(x), ``t >= 0`` (checked; see :func:`omega_scalar`)."""
    code, p = check_spec(code, params)
    return _prox_scalar(code, p, check_scalar(v, "v"), check_step(t))


def prox_numeric_scalar(code, params, v, t):
    """The generic grid-and-root prox of any kernel penalty (checked; see :func:`omega_scalar`)."""
    code, p = check_spec(code, params)
    if code == MIXED:
        raise ValueError("prox_numeric_scalar takes a plain kernel code, not MIXED (use prox_scalar)")
    return _prox_numeric_scalar(code, p, check_scalar(v, "v"), check_step(t))


def _overload_as(public, kernel, n_args):
    """From jitted code, ``public(...)`` is ``kernel(...)`` (inlined, unchecked)."""
    if n_args == 3:
        def typer(code, p, w):
            def impl(code, p, w):
                return kernel(code, p, w)
            return impl
    else:
        def typer(code, p, v, t):
            def impl(code, p, v, t):
                return kernel(code, p, v, t)
            return impl
    overload(public, inline="always")(typer)


_overload_as(omega_scalar, _omega_scalar, 3)
_overload_as(derivative_scalar, _derivative_scalar, 3)
_overload_as(eta_hat_scalar, _eta_hat_scalar, 3)
_overload_as(prox_scalar, _prox_scalar, 4)
_overload_as(prox_numeric_scalar, _prox_numeric_scalar, 4)
