"""Torch evaluation of the tabulated penalties (VarDrop, VarDropExact, HardConcrete).

These penalties have no closed form: ``penalties`` tabulates ``y = log Omega`` against
``x = log |w|`` as piecewise Chebyshev interpolants (kernel code ``TABLE``, layout in
``penalties.kernels``) and evaluates them in a serial numba loop. On a network's weights that
loop, plus the copy to float64 and back, made a training step 7-16x slower than the dense step.

Here the same functions are resampled once per process on a uniform grid of ``GRID + 1`` points
in ``x`` over the table's range ``[x_lo, x_hi]`` and evaluated in torch by linear interpolation,
in the weight's own precision (float32 for bfloat16/half), on the weight's device, with no host
round trip:

- the derivative through ``z = log Omega'(|w|)``: ``Omega'(w) = sign(w) exp(z(x))``;
- the value through ``y``: ``Omega(w) = exp(y(x))``.

Linear interpolation with spacing ``h`` has error ``h^2/8 |z''|``; with ``GRID = 65536``
(``h ~ 6.5e-4``, tables of 512 KiB per dtype) the interpolation itself is within 2e-7 relative of
the Chebyshev tables (values and derivatives, float64 arithmetic); float32 results are within
5e-6 (the rounding of ``log|w|`` in float32). HardConcrete's derivative has a square-root fold at
its cap ``x_hi`` (the end of the envelope ``w(theta)``): within 0.1 of it the error grows to 1e-5,
and to 6e-5 within 0.01 (tests/nn/test_user_api_checks.py). All of it is far below the gradient
noise of training. Outside the range the tables' own asymptotes hold exactly and are linear in
``x`` in log space: below ``x_lo`` ``Omega = Omega_lo e^{p (x - x_lo)}`` (slope ``p`` for ``y``,
``p - 1`` for ``z``); above ``x_hi`` a cap (``Omega' = 0``), a logarithm
(``Omega = Omega_hi + c (x - x_hi)``, ``z`` slope -1) or a power law (slope ``c``, ``c - 1``).
The grid's last node takes the left limit at ``x_hi`` (HardConcrete's derivative jumps to 0 at its
cap ``w = e^{x_hi}``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from penalties import kernels as K

#: intervals of the uniform resampling grid (see the module docstring for the error it gives)
GRID = 65536

_CACHE: dict = {}
_BY_ARRAY: dict = {}  # id(params) -> (params, table); the array is kept so its id stays its own


class TorchTable:
    """One tabulated penalty on a uniform grid in ``log |w|`` (see the module docstring)."""

    def __init__(self, penalty, params: np.ndarray):
        p = np.asarray(params, dtype=np.float64)
        n = int(p[K.T_N])
        self.x_lo, self.x_hi = float(p[K.T_HEADER]), float(p[K.T_HEADER + n])
        self.p_lo = float(p[K.T_PLO])
        self.tail, self.c = int(p[K.T_TAIL]), float(p[K.T_TAILC])
        if self.tail not in (K.TAIL_CAP, K.TAIL_LOG, K.TAIL_POW):
            raise ValueError(f"unknown table tail kind {self.tail}")
        self.cap, self.log_tail = self.tail == K.TAIL_CAP, self.tail == K.TAIL_LOG
        x = np.linspace(self.x_lo, self.x_hi, GRID + 1)
        x[-1] = np.nextafter(self.x_hi, -np.inf)          # the left limit at x_hi
        w = np.exp(x)
        with np.errstate(divide="ignore"):
            self._y = np.log(np.asarray(penalty.omega(w), dtype=np.float64))
            self._z = np.log(np.asarray(penalty.derivative(w), dtype=np.float64))
        if not (np.all(np.isfinite(self._y)) and np.all(np.isfinite(self._z))):
            raise ValueError(f"{type(penalty).__name__}: Omega or Omega' is not positive on its "
                             "table's range; it cannot be interpolated in log space")
        self.inv_h = GRID / (self.x_hi - self.x_lo)
        self.y_slope_hi = 0.0 if self.cap or self.log_tail else self.c
        self.z_slope_hi = 0.0 if self.cap else (-1.0 if self.log_tail else self.c - 1.0)
        self.omega_hi = float(p[K.T_OMHI])
        self._on: dict = {}

    def _grids(self, dtype, device):
        key = (dtype, device)
        if key not in self._on:
            self._on[key] = (torch.as_tensor(self._y, dtype=dtype, device=device),
                             torch.as_tensor(self._z, dtype=dtype, device=device))
        return self._on[key]

    def _locate(self, w):
        """(x, index, fraction) of |w| on the grid (clamped to the table's range)."""
        dt = w.dtype if w.dtype in (torch.float32, torch.float64) else torch.float32
        a = w.detach().to(dt).abs()
        x = a.clamp_min(torch.finfo(dt).tiny).log_()        # w = 0: finite; sign(0) zeroes it
        t = (x - self.x_lo).mul_(self.inv_h).clamp_(0.0, float(GRID))
        i = t.floor().clamp_(max=GRID - 1)
        frac = t.sub_(i)
        return x, i.long(), frac

    @staticmethod
    def _lerp(grid, i, frac):
        lo = grid.take(i)
        return lo.add_(grid.take(i + 1).sub_(lo).mul_(frac))

    def derivative(self, w: torch.Tensor, *, with_omega: bool = False):
        """``Omega'(w)`` (0 at ``w = 0``) in float32/float64 (float32 for other dtypes); with
        ``with_omega`` the pair ``(Omega(w), Omega'(w))`` from one location pass."""
        x, i, frac = self._locate(w)
        gy, gz = self._grids(x.dtype, x.device)
        below = (x - self.x_lo).clamp_(max=0.0)
        above = (x - self.x_hi).clamp_(min=0.0)
        z = self._lerp(gz, i, frac).add_(below, alpha=self.p_lo - 1.0)
        if self.z_slope_hi:
            z.add_(above, alpha=self.z_slope_hi)
        d = z.exp_().mul_(torch.sign(w.detach()).to(x.dtype))
        if self.cap:
            d.masked_fill_(above > 0, 0.0)
        if not with_omega:
            return d
        y = self._lerp(gy, i, frac).add_(below, alpha=self.p_lo)
        if self.y_slope_hi:
            y.add_(above, alpha=self.y_slope_hi)
        om = y.exp_()
        if self.log_tail:
            om.add_(above, alpha=self.c)
        if self.cap:
            om.masked_fill_(above > 0, self.omega_hi)
        return om.masked_fill_(w.detach() == 0, 0.0), d

    def omega(self, w: torch.Tensor) -> torch.Tensor:
        """``Omega(w)`` elementwise (0 at ``w = 0``)."""
        return self.derivative(w, with_omega=True)[0]


def torch_table(penalty, params: np.ndarray) -> TorchTable:
    """The (cached, one per distinct table) :class:`TorchTable` of a ``TABLE`` kernel.

    Looked up every training step: by the identity of the parameter array first (a state keeps
    its array), by its content only the first time an array is seen."""
    hit = _BY_ARRAY.get(id(params))
    if hit is not None and hit[0] is params:
        return hit[1]
    key = (type(penalty).__name__, params.tobytes())
    table = _CACHE.get(key)
    if table is None:
        table = _CACHE[key] = TorchTable(penalty, params)
    if len(_BY_ARRAY) >= 256:  # states come and go: keep the memo small
        _BY_ARRAY.clear()
    _BY_ARRAY[id(params)] = (params, table)
    return table


def of_kernel(penalty, kernel, w: torch.Tensor) -> TorchTable | None:
    """The :class:`TorchTable` for weights ``w`` of a penalty whose kernel ``(code, params)`` is a
    ``TABLE``, else None: closed forms keep their own paths, and float64 CPU weights keep the
    exact Chebyshev kernel (the precision float64 was chosen for; no dtype copy is needed)."""
    if kernel is None or (w.dtype == torch.float64 and w.device.type == "cpu"):
        return None
    code, params = kernel
    return torch_table(penalty, params) if code == K.TABLE else None
