"""Effective penalties of adaptive dropout methods (docs/theory.md section 3).

- :class:`VarDrop`: variational dropout (Molchanov, Ashukha & Vetrov 2017) with the paper's
  sigmoid approximation of the KL divergence to the log-uniform prior.
- :class:`VarDropExact`: the same with the exact KL, whose dual derivative is
  ``f'(eta) = D(sqrt(eta/2)) / sqrt(eta/2)`` (D: Dawson's integral).
- :class:`HardConcrete`: hard-concrete L0 gates (Louizos, Welling & Kingma 2018), a biased mask;
  the penalty acts on ``w~ = E[z] w`` and its moments come from deterministic quadrature.
- :class:`Standout`: adaptive dropout of Ba & Frey (2013); a penalty on activations.

The first three have no closed-form Omega; they are tabulated once per process (a fraction of a
second) as piecewise-Chebyshev interpolants of ``log Omega`` in ``log |w|`` and then evaluated by
the compiled kernel. Each table records its audited accuracy in ``table_error``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from . import kernels as K
from ._checks import as_real_array, check_param, finish
from ._table import build_table, check_increasing, gauss_legendre, graded_breakpoints, uniform_breakpoints
from .base import KernelPenalty

EULER_GAMMA = 0.5772156649015329
X_LO = math.log(1e-12)  # tables cover |w| >= 1e-12; below, the exact power-law limit takes over
X_HI = 15.0  # |w| <= e^15 ~ 3.3e6; above, the logarithmic asymptote (error O(1/w^2))


class _TablePenalty(KernelPenalty):
    _code = K.TABLE

    def _table(self):  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def _kernel_params(self):
        return self._table().params

    @property
    def table_error(self) -> float:
        """Largest relative error of the table against direct evaluation at interval midpoints."""
        return self._table().max_rel_error


# ----------------------------------------------------------------------------------------------
# Variational dropout, KL approximation of Molchanov et al. (2017)
# ----------------------------------------------------------------------------------------------
VD_K1, VD_K2, VD_K3 = 0.63576, 1.87320, 1.48695


def _vd_approx_f(eta):
    le = np.log(eta)
    return 2.0 * VD_K1 * special.expit(VD_K3 * le - VD_K2) + np.log1p(eta)


def _vd_approx_fprime(eta):
    le = np.log(eta)
    s = special.expit(VD_K3 * le - VD_K2)
    return 2.0 * VD_K1 * VD_K3 * s * (1.0 - s) / eta + 1.0 / (1.0 + eta)


@functools.lru_cache(maxsize=None)
def _vd_approx_table():
    def x_of(le):  # log w at which eta = e^le is optimal: w^2 = eta^2 f'(eta)
        eta = np.exp(le)
        return 0.5 * np.log(eta * eta * _vd_approx_fprime(eta))

    def omega_at(w, le):
        eta = np.exp(le)
        return 0.5 * (w * w / eta + _vd_approx_f(eta))

    check_increasing(x_of, -40.0, 40.0, "VarDrop: eta^2 f'(eta)")
    bp = uniform_breakpoints(X_LO, X_HI)
    return build_table(x_of, omega_at, -40.0, 40.0, bp, p_lo=1.0, tail_kind=K.TAIL_LOG, tail_c=1.0)


class VarDrop(_TablePenalty):
    """Variational dropout (Molchanov et al. 2017) with the paper's KL approximation.

    Gaussian mask N(1, a) with ``eta = 1/a`` (unit convention, lambda = 1, dataset factor absorbed):
    ``f(eta) = 2 KL(1/eta)`` with ``-KL(a) ~ k1 sigmoid(k2 + k3 log a) - 1/2 log(1 + 1/a) - k1``,
    i.e. ``f(eta) = 2 k1 sigmoid(k3 log eta - k2) + log(1 + eta)``, ``f(0+) = 0``.
    This f is not concave near 0, but ``eta^2 f'(eta)`` is increasing (checked at construction), so
    the minimizer is unique and ``eta_hat`` is monotone. Near 0 Omega ~ |w| (like L1); for large
    |w|, ``Omega ~ log|w| + k1 + 1/2``.
    """

    name = "vardrop"

    def _table(self):
        return _vd_approx_table()

    def _f(self, eta):
        return _vd_approx_f(eta)

    @staticmethod
    def kl(log_alpha):
        """The approximate per-weight KL(q || log-uniform prior) as a function of log alpha
        (any real, +-inf included: KL(+inf) = 0, KL(-inf) = inf; NaN raises ``ValueError``)."""
        la = as_real_array(log_alpha, "log_alpha", allow_inf=True)
        # 1/2 log(1 + e^{-la}) as 1/2 softplus(-la): log1p(exp(-la)) overflows for la < -709
        out = VD_K1 - VD_K1 * special.expit(VD_K2 + VD_K3 * la) + 0.5 * np.logaddexp(0.0, -la)
        return finish(out, la)


# ----------------------------------------------------------------------------------------------
# Variational dropout, exact KL
# ----------------------------------------------------------------------------------------------
_GL48 = gauss_legendre(48)
_GL20 = gauss_legendre(20)


def dawson_integral(u):
    """``I(u) = int_0^u D(t) dt`` for u >= 0 (D: Dawson's function), to ~1e-15 relative.

    [0, min(u, 4)] by 48-point Gauss-Legendre; the rest in ``s = log t`` where ``t D(t) -> 1/2``
    is smooth, by 12 panels of 20-point Gauss-Legendre.
    """
    u = np.asarray(u, dtype=float)
    x, wts = _GL48
    a = np.minimum(u, 4.0)[..., None]
    t = 0.5 * a * (x + 1.0)
    head = 0.5 * a[..., 0] * np.sum(wts * special.dawsn(t), axis=-1)
    big = u > 4.0
    if np.any(big):
        ub = u[big]
        s0 = math.log(4.0)
        s1 = np.log(ub)
        xg, wg = _GL20
        npan = 12
        width = (s1 - s0) / npan
        tail = np.zeros_like(ub)
        for k in range(npan):
            lo = s0 + k * width
            s = lo[..., None] + 0.5 * width[..., None] * (xg + 1.0)
            et = np.exp(s)
            tail += 0.5 * width * np.sum(wg * special.dawsn(et) * et, axis=-1)
        head = np.array(head, copy=True)
        head[big] += tail
    return head


def _vd_exact_f(eta):
    # f(eta) = 4 I(sqrt(eta/2)): integrating f'(eta) = D(u)/u with eta = 2 u^2.
    return 4.0 * dawson_integral(np.sqrt(0.5 * eta))


_LOG_U_BIG = math.log(1e100)  # beyond: I(u) = I(1e100) + 1/2 log(u / 1e100) (error ~1e-201)
_I_BIG = float(dawson_integral(np.array([1e100]))[0])


def _vd_exact_f_of_log(log_eta):
    """``f(eta)`` of :func:`_vd_exact_f` from ``log eta`` (any real, +-inf): eta itself
    overflows for log eta > 709, where ``D(t) = 1/(2t) + O(t^-3)`` makes ``I`` logarithmic."""
    le = np.asarray(log_eta, dtype=float)
    lu = 0.5 * (le - math.log(2.0))  # log u, u = sqrt(eta / 2)
    big = lu > _LOG_U_BIG
    with np.errstate(over="ignore"):
        u = np.exp(np.where(big, 0.0, lu))
    out = 4.0 * np.where(big, _I_BIG + 0.5 * (lu - _LOG_U_BIG), dawson_integral(u))
    return out


@functools.lru_cache(maxsize=None)
def _vd_exact_table():
    # Parameter: log u with eta = 2u^2; optimality f'(eta) eta^2 = w^2 reads 4 u^3 D(u) = w^2.
    def x_of(lu):
        u = np.exp(lu)
        return 0.5 * (math.log(4.0) + 3.0 * lu + np.log(special.dawsn(u)))

    def omega_at(w, lu):
        u = np.exp(lu)
        return 0.5 * (w * w / (2.0 * u * u) + 4.0 * dawson_integral(u))

    check_increasing(x_of, -16.0, 17.0, "VarDropExact: eta^2 f'(eta)")
    bp = uniform_breakpoints(X_LO, X_HI)
    return build_table(x_of, omega_at, -16.0, 17.0, bp, p_lo=1.0, tail_kind=K.TAIL_LOG, tail_c=1.0)


class VarDropExact(_TablePenalty):
    """Variational dropout with the exact KL divergence to the log-uniform prior.

    ``KL(a) = -1/2 log a + E log|1 + sqrt(a) e| + (gamma + log 2)/2`` (e ~ N(0,1); normalized so
    ``KL -> 0`` as ``a -> inf``). With ``eta = 1/a``: ``f(eta) = 2 KL(1/eta) =
    2 (E log|e + sqrt(eta)| - E log|e|)``, ``f'(eta) = D(sqrt(eta/2)) / sqrt(eta/2)`` and
    ``f(eta) = 4 int_0^sqrt(eta/2) D``. Near 0 Omega ~ |w|; for large |w|,
    ``Omega ~ log|w| + (1 + gamma + log 2)/2``.
    """

    name = "vardrop_exact"

    def _table(self):
        return _vd_exact_table()

    def _f(self, eta):
        return _vd_exact_f(eta)

    @staticmethod
    def kl(log_alpha):
        """Exact per-weight KL(q || log-uniform prior) as a function of log alpha (any real,
        +-inf included: KL(+inf) = 0, KL(-inf) = inf; NaN raises ``ValueError``)."""
        la = as_real_array(log_alpha, "log_alpha", allow_inf=True)
        return finish(0.5 * _vd_exact_f_of_log(-la), la)


# ----------------------------------------------------------------------------------------------
# Hard-concrete L0 gates
# ----------------------------------------------------------------------------------------------
HC_BETA, HC_GAMMA, HC_ZETA = 2.0 / 3.0, -0.1, 1.1


def hc_l0_shift(beta: float = HC_BETA, gamma: float = HC_GAMMA, zeta: float = HC_ZETA) -> float:
    """The hard-concrete L0 shift ``beta log(-gamma/zeta)``: ``P(z != 0) = sigmoid(log a -
    shift)`` (Louizos, Welling, Kingma 2018, eq. 12); the one copy for numpy, torch and numba."""
    return beta * math.log(-gamma / zeta)
_GL32 = gauss_legendre(32)


def _logistic_pdf(x):
    e = np.exp(-np.abs(x))
    return e / (1.0 + e) ** 2


def _theta(theta) -> np.ndarray:
    """A gate parameter ``theta = log a`` as a float array: real, may be infinite, never NaN."""
    return as_real_array(theta, "theta (log alpha)", allow_inf=True)


class _HardConcreteMoments:
    """Moments of the hard-concrete gate z as functions of theta = log alpha.

    Writing R = theta + logit(u) (a logistic variable centred at theta), z = clip(gamma +
    (zeta - gamma) sigmoid(R / beta), 0, 1) is 0 below r0 and 1 above r1, so every moment is a
    Gauss-Legendre integral over [r0, r1] plus closed-form tail masses, and d/dtheta E[g(R)] =
    E[g'(R)]. Complementary moments of v = 1 - z avoid cancellation for large theta.
    """

    def __init__(self, beta=HC_BETA, gamma=HC_GAMMA, zeta=HC_ZETA):
        self.beta, self.gamma, self.zeta = beta, gamma, zeta
        s0 = -gamma / (zeta - gamma)
        s1 = (1.0 - gamma) / (zeta - gamma)
        self.r0 = beta * math.log(s0 / (1.0 - s0))
        self.r1 = beta * math.log(s1 / (1.0 - s1))
        x, wts = _GL32
        half = 0.5 * (self.r1 - self.r0)
        self.r = self.r0 + half * (x + 1.0)
        self.wr = half * wts
        sig = special.expit(self.r / beta)
        self.z = gamma + (zeta - gamma) * sig
        self.dz = (zeta - gamma) * sig * (1.0 - sig) / beta
        self.l0_shift = hc_l0_shift(beta, gamma, zeta)

    def all(self, theta):
        """Return dict of E[z], E[z^2], Var(z) and their theta-derivatives (arrays).

        ``theta`` real (``+-inf``: a gate always closed or always open); NaN, text or a complex
        number is refused naming ``theta``."""
        th = _theta(theta)[..., None]
        pw = self.wr * _logistic_pdf(self.r - th)
        z, dz = self.z, self.dz
        th0 = th[..., 0]
        p_one = special.expit(th0 - self.r1)  # P(z = 1)
        p_zero = special.expit(self.r0 - th0)  # P(z = 0)
        ez = np.sum(pw * z, axis=-1) + p_one
        ez2 = np.sum(pw * z * z, axis=-1) + p_one
        ev = np.sum(pw * (1.0 - z), axis=-1) + p_zero
        ev2 = np.sum(pw * (1.0 - z) ** 2, axis=-1) + p_zero
        dez = np.sum(pw * dz, axis=-1)
        dez2 = np.sum(pw * 2.0 * z * dz, axis=-1)
        dev2 = -np.sum(pw * 2.0 * (1.0 - z) * dz, axis=-1)
        low = th0 < 0.0
        var = np.where(low, ez2 - ez * ez, ev2 - ev * ev)
        dvar = np.where(low, dez2 - 2.0 * ez * dez, dev2 + 2.0 * ev * dez)
        return {"mean": ez, "second_moment": ez2, "var": var, "dmean": dez, "dvar": dvar}

    def l0(self, theta):
        """P(z != 0) = sigmoid(theta - beta log(-gamma/zeta))."""
        return special.expit(_theta(theta) - self.l0_shift)

    def envelope(self, theta):
        """(rho = 1/eta~, f = P(z != 0), w~^2 at which theta is optimal)."""
        mo = self.all(theta)
        mu, dmu, var, dvar = mo["mean"], mo["dmean"], mo["var"], mo["dvar"]
        rho = var / (mu * mu)
        drho = dvar / (mu * mu) - 2.0 * var * dmu / mu**3
        x = _theta(theta) - self.l0_shift
        dpi = _logistic_pdf(x)
        return rho, self.l0(theta), -dpi / drho


_HC = _HardConcreteMoments()
HC_THETA_LO, HC_THETA_HI = -32.0, 60.0


def _hc_branch_end():
    """theta* where the interior stationary point stops being the minimizer.

    ``w~(theta)^2 = -pi'/rho'`` rises to a maximum near theta ~ 1 and then falls back towards its
    limit: ``f`` is not "dual-convex" (``eta^2 f'(eta)`` is not monotone), so the envelope has a
    fold. Along the rising branch ``Omega`` increases; it reaches the cap 1/2 (the value as
    theta -> inf) before the fold, at theta*; beyond ``w* = w~(theta*)`` the minimizer jumps to
    eta = inf and Omega = 1/2: a kink, as for a capped L1 penalty.
    """
    grid = np.linspace(HC_THETA_LO, 20.0, 20001)
    w2 = _HC.envelope(grid)[2]
    ipk = int(np.argmax(w2))
    peak = grid[ipk]
    # refine the fold (maximum of w~(theta)) by golden section for the table grading
    a, b = grid[ipk - 1], grid[ipk + 1]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(60):
        c, d = b - g * (b - a), a + g * (b - a)
        if _HC.envelope(np.array([c]))[2][0] > _HC.envelope(np.array([d]))[2][0]:
            b = d
        else:
            a = c
    x_fold = 0.5 * math.log(_HC.envelope(np.array([0.5 * (a + b)]))[2][0])

    def excess(theta):
        rho, pi, w2 = _HC.envelope(theta)
        return w2 * rho + pi - 1.0

    lo, hi = HC_THETA_LO, peak
    if not (excess(np.array([hi]))[0] > 0.0 > excess(np.array([lo]))[0]):
        raise FloatingPointError("hard-concrete envelope: cap crossing not bracketed")
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if excess(np.array([mid]))[0] < 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi), x_fold


@functools.lru_cache(maxsize=None)
def _hc_table():
    def x_of(theta):
        return 0.5 * np.log(_HC.envelope(theta)[2])

    def omega_at(w, theta):
        rho, pi, _ = _HC.envelope(theta)
        return 0.5 * (w * w * rho + pi)

    theta_star, x_fold = _hc_branch_end()
    check_increasing(x_of, HC_THETA_LO, theta_star, "HardConcrete: w~(theta)")
    x_cap = float(x_of(np.array([theta_star]))[0])
    # the fold of the envelope is a square-root branch point of Omega(x) just beyond x_cap:
    # grade the intervals geometrically toward it
    bp = graded_breakpoints(X_LO, x_cap, x_fold)
    table = build_table(x_of, omega_at, HC_THETA_LO, theta_star, bp, p_lo=1.0, tail_kind=K.TAIL_CAP, cap=0.5)
    table.theta_star = theta_star
    return table


class HardConcrete(_TablePenalty):
    """Hard-concrete L0 gates (Louizos, Welling & Kingma 2018) as a penalty on ``w~ = E[z] w``.

    Gate ``z = clip(sigmoid((logit u + log a)/beta) (zeta - gamma) + gamma, 0, 1)`` with
    beta = 2/3, gamma = -0.1, zeta = 1.1. The biased-mask recipe (docs/theory.md section 2, item 5) gives
    ``alpha~ = E[z]^2 / E[z^2]``, ``eta~ = alpha~ / (1 - alpha~)`` and, in the unit convention,
    ``f(eta~) = P(z != 0) = sigmoid(log a - beta log(-gamma/zeta))``. Moments are computed by
    32-point Gauss-Legendre quadrature over the gate's active range. The penalty is L1-like at 0
    and reaches its cap 1/2 at a finite ``|w~| = w_cap``, beyond which eta_hat = inf. Unlike MCP
    it arrives there with a kink: ``eta~^2 f'(eta~)`` is not monotone (the map from gate parameter
    to optimal |w~| folds back near log a ~ 1), so the minimizing gate jumps from a finite log a to
    +inf at w_cap; Omega stays continuous and ``Omega(sqrt z)`` concave, as the duality requires.
    """

    name = "hardconcrete"
    moments = _HC

    def _table(self):
        return _hc_table()

    @property
    def w_cap(self) -> float:
        return float(math.exp(self._table().x_hi))

    def log_alpha_of_eta(self, eta):
        """The gate parameter theta = log a whose eta~ equals ``eta`` (vectorized bisection).

        ``eta`` finite and > 0: ``eta = 0`` is a gate that never opens and ``eta = inf`` one
        that never closes, whose ``log a`` is not a number (``-inf`` / ``+inf``), so both are
        refused naming ``eta``, as are NaN and negative values. Beyond the bisection range both
        ends are exactly linear in log eta up to exponentially small terms (a closed gate: E[z]
        and E[z^2] both ~ e^theta, so 1/eta~ ~ e^-theta; an open one: 1 - E[z] and Var(z) ~
        e^-theta), and are extended so.
        """
        arr = as_real_array(eta, "eta")
        if (arr <= 0).any():
            raise ValueError(f"eta must be > 0, got {arr[arr <= 0].flat[0]!r} (eta = 0 is a gate "
                             "that never opens: log alpha = -inf)")
        return finish(self._log_alpha(arr), arr)

    @staticmethod
    def _log_alpha(arr):
        """:meth:`log_alpha_of_eta` of a checked array, 0 -> -inf and inf -> +inf (for ``f``)."""
        with np.errstate(divide="ignore"):
            log_eta = np.log(arr)
        ends = np.array([HC_THETA_LO - 20.0, HC_THETA_HI + 20.0])
        log_eta_ends = -np.log(_HC.envelope(ends)[0])
        inside = (log_eta > log_eta_ends[0]) & (log_eta < log_eta_ends[1])
        lo = np.full(arr.shape, ends[0])
        hi = np.full(arr.shape, ends[1])
        for _ in range(90):
            mid = 0.5 * (lo + hi)
            below = -np.log(_HC.envelope(mid)[0]) < log_eta
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        theta = np.where(inside, 0.5 * (lo + hi),
                         np.where(log_eta <= log_eta_ends[0], ends[0] + (log_eta - log_eta_ends[0]),
                                  ends[1] + (log_eta - log_eta_ends[1])))
        return theta

    def _f(self, eta):
        return _HC.l0(self._log_alpha(np.asarray(eta, dtype=np.float64)))


# ----------------------------------------------------------------------------------------------
# Standout
# ----------------------------------------------------------------------------------------------
class Standout(KernelPenalty):
    """Standout (Ba & Frey 2013): keep ratio ``sigmoid(a h + b)`` of an activation h feeding
    outgoing weights of norm ``v_norm``; the induced penalty on activations is

    ``Omega(h) = (v_norm^2 / lam) e^{-b} [1 - (1 + a|h|) e^{-a|h|}] / a^2``,
    ``Omega'(h) = v_norm^2 h e^{-(a|h| + b)} / lam``, ``eta_hat = lam e^{a|h| + b} / v_norm^2``.
    ``a > 0`` is required: the dropout rate must fall as |h| grows. Bounded (never reaches its
    supremum), smooth at 0 (quadratic), so it shrinks activations rather than zeroing them.
    """

    name = "standout"
    _param_names = ("a", "b", "v_norm", "lam")
    _code = K.STANDOUT

    def __init__(self, a=1.0, b=0.0, v_norm=1.0, lam=1.0):
        self.a = check_param(a, "a", low=0.0)
        self.b = check_param(b, "b")
        self.v_norm = check_param(v_norm, "v_norm", low=0.0)
        self.lam = check_param(lam, "lam", low=0.0)

    def _kernel_params(self):
        return np.array([self.a, self.b, self.v_norm**2 / self.lam])

    def rescaled(self, c):  # g(a c |h|) / a^2 = c^2 g(a' |h|) / a'^2 with a' = a c
        return self._rescaled_with(2.0, a=self.a * c)

    def _f(self, eta):
        # f(eta) = max_h 2 Omega(h) - h^2/eta, attained where eta_hat(h) = eta.
        c = self.v_norm**2 / self.lam
        h = np.maximum((np.log(eta * c) - self.b) / self.a, 0.0)
        return 2.0 * self.omega(h) - h * h / eta
