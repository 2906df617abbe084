"""numba loops over weight arrays that call the ``penalties`` scalar kernels.

One kernel, many callers: the formulas of every catalog penalty live in ``penalties.kernels``;
these loops only map them over a flat weight array (a zero-copy numpy view of a CPU tensor).
If ``penalties`` provides no compiled kernels, ``AVAILABLE`` is False and callers fall back to
the penalty object's vectorized numpy methods.

These loops are deliberately serial. ``penalties``' own array maps switch to a numba
``parallel=True`` loop above 20000 elements, which starts numba's OpenMP thread pool; in a process
that also runs torch, those spinning workers were measured to slow torch's own kernels several
fold (dense LeNet-300-100 step 3.3 ms -> 22 ms on the 2-core machine). So large weight arrays go
through the serial loops here, never through ``P.omega``/``P.eta_hat``/... on the hot path.
"""

from __future__ import annotations

import numpy as np

try:  # pragma: no cover - depends on the installed penalties package
    from numba import njit

    from penalties.kernels import derivative_scalar, eta_hat_scalar, omega_scalar

    AVAILABLE = True
except ImportError:  # pragma: no cover
    AVAILABLE = False


#: ``mode`` of :func:`value_and_derivative`: which value to sum beside the derivative
VALUE_OMEGA, VALUE_TIKHONOV, VALUE_NONE = 0, 1, 2

if AVAILABLE:

    @njit(cache=True, error_model="numpy")  # no fastmath: it drops the isinf checks
    def value_and_derivative(code, params, w, grad, mode):
        """Fill ``grad[i] = Omega'(w[i])``; return ``sum Omega(w)`` (``mode`` 0), ``sum 1/2 w
        Omega'(w) = sum 1/2 w^2 / eta_hat(w)`` (1) or 0.0 without evaluating any value (2)."""
        total = 0.0
        for i in range(w.size):
            wi = np.float64(w[i])
            d = derivative_scalar(code, params, wi)
            grad[i] = d
            if mode == 1:
                total += 0.5 * wi * d
            elif mode == 0:
                total += omega_scalar(code, params, wi)
        return total

    @njit(cache=True, error_model="numpy")  # no fastmath: it drops the isinf checks
    def tikhonov_prox(code, params, w, rho_lam):
        """In place ``w[i] <- w[i] eta / (eta + rho_lam[i])``, ``eta = eta_hat(w[i])``."""
        for i in range(w.size):
            wi = np.float64(w[i])
            if wi == 0.0:
                continue
            e = eta_hat_scalar(code, params, wi)
            if np.isinf(e):
                continue
            r = np.float64(rho_lam[i])
            if e + r <= 0.0:
                w[i] = 0.0
            else:
                w[i] = wi * (e / (e + r))

    @njit(cache=True)
    def eta_hat_map(code, params, w, out):
        """``out[i] = eta_hat(w[i])`` (serial)."""
        for i in range(w.size):
            out[i] = eta_hat_scalar(code, params, np.float64(w[i]))
