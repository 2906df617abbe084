"""What the Python entries of :mod:`penalties.kernels` check before a compiled kernel runs.

``(code, params)`` must be what a penalty's ``kernel_spec()`` gives: a known code and a float
vector with the entries that code reads (a TABLE whole, as its header describes it; MIXED with a
plain inner kernel), values the penalty itself would accept; scalars finite; a prox step ``>= 0``.
The compiled kernels read past a short vector or divide by a zero parameter without a word (NaN
or a number came back), so the checks run here, once per call from Python, and never inside the
kernels (jitted callers hold specs of validated penalty objects).
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import as_real_array
from ._codes import (L1, LOG2SUM, LOGSUM, LP, MCP, MIXED, SCAD, STANDOUT, T_HEADER, T_M, T_N,
                     TABLE)

__all__ = ["check_scalar", "check_spec", "check_step", "real_array"]

#: parameters each code needs (MIXED and TABLE: their own layouts, see check_spec)
_N_PARAMS = {L1: 0, LP: 1, LOGSUM: 1, LOG2SUM: 1, SCAD: 2, MCP: 2, STANDOUT: 3}
_NAMES = {L1: "L1", LP: "LP", LOGSUM: "LOGSUM", LOG2SUM: "LOG2SUM", SCAD: "SCAD", MCP: "MCP",
          STANDOUT: "STANDOUT", TABLE: "TABLE", MIXED: "MIXED"}


def real_array(x, name):
    """``x`` as a float64 array of finite values (``ValueError`` naming it)."""
    return as_real_array(x, name)


def _check_code(code, name="code"):
    if isinstance(code, (bool, np.bool_)) or not isinstance(code, (int, np.integer)) \
            or int(code) not in _NAMES:
        known = ", ".join(f"{v}={k}" for k, v in _NAMES.items())
        raise ValueError(f"{name} must be one of the kernel codes ({known}), got {code!r}; take "
                         "(code, params) from a penalty's kernel_spec()")
    return int(code)


def _check_values(code, p, where="params"):
    """The values each formula divides by or takes the log of (the catalog's own bounds)."""
    def need(ok, what):
        if not ok:
            raise ValueError(f"{where} of code {_NAMES[code]} must have {what}, got "
                             f"{[float(v) for v in p[:_N_PARAMS.get(code, p.size)]]}; take (code, params) "
                             "from a penalty's kernel_spec()")

    if code == LP:
        need(0.0 < p[0] <= 2.0, "p in (0, 2]")
    elif code in (LOGSUM, LOG2SUM):
        need(p[0] > 0.0, "eps > 0")
    elif code == SCAD:
        need(p[0] > 1.0 and p[1] > 0.0, "a > 1 and lam > 0")
    elif code == MCP:
        need(p[0] > 0.0 and p[1] > 0.0, "a > 0 (or inf) and lam > 0")
    elif code == STANDOUT:
        need(p[0] > 0.0 and p[2] > 0.0, "a > 0 and v_norm^2 / lam > 0")


def _check_table(p, where="params"):
    """A TABLE vector whole: its header's sizes agree with its length."""
    if p.size < T_HEADER + 2:
        raise ValueError(f"{where} is not a TABLE parameter vector: {p.size} entries, fewer than "
                         f"its {T_HEADER}-entry header and two breakpoints")
    n, m = p[T_N], p[T_M]
    if not (n >= 1 and m >= 0 and n == int(n) and m == int(m)):
        raise ValueError(f"{where}: a TABLE header with n={n!r} pieces and degree m={m!r} "
                         "(positive integers expected); take params from a penalty's kernel_spec()")
    want = T_HEADER + int(n) + 1 + 2 * int(n) * (int(m) + 1)
    if p.size != want:
        raise ValueError(f"{where}: a TABLE of {int(n)} pieces of degree {int(m)} has {want} "
                         f"entries, got {p.size} (truncated or padded); take params from a "
                         "penalty's kernel_spec()")
    bp = p[T_HEADER:T_HEADER + int(n) + 1]
    if np.any(np.diff(bp) <= 0):
        raise ValueError(f"{where}: the TABLE's breakpoints must increase")


def check_spec(code, params):
    """``(code, params)`` checked for the kernels: a known code and a float vector holding what
    that code needs (``ValueError`` naming the argument otherwise). Returns them as
    ``(int, contiguous float64 array)``."""
    code = _check_code(code)
    p = np.ascontiguousarray(real_array(params, "params").ravel() if np.ndim(params)
                             else real_array(np.atleast_1d(params), "params"))
    if code == MIXED:
        if p.size < 3:
            raise ValueError(f"params of code MIXED must be [c, r, inner_code, inner params...], "
                             f"got {p.size} entries")
        if not (p[0] >= 0.0 and p[1] >= 0.0):
            raise ValueError("params of code MIXED must have c >= 0 and r >= 0 (the shares of the "
                             f"penalty and of the ridge term), got {[float(v) for v in p[:2]]}")
        inner = p[2]
        if inner != int(inner) or int(inner) == MIXED:
            raise ValueError(f"params[2] of code MIXED must be the code of a plain kernel, got "
                             f"{inner!r}")
        _check_plain(_check_code(int(inner), "params[2] (the inner code of MIXED)"), p[3:],
                     "params[3:] (the inner penalty's)")
    else:
        _check_plain(code, p, "params")
    return code, p


def _check_plain(code, p, where):
    if code == TABLE:
        _check_table(p, where)
        return
    k = _N_PARAMS[code]
    if p.size < k:
        raise ValueError(f"{where} of code {_NAMES[code]} needs {k} value(s), got {p.size}")
    if k:
        # MCP's a may be inf (the l1 limit); every other parameter is finite
        fin = np.isfinite(p[:k]) | ((code == MCP) & (np.arange(k) == 0) & (p[:k] == np.inf))
        if not np.all(fin):
            raise ValueError(f"{where} of code {_NAMES[code]} must be finite, got "
                             f"{[float(v) for v in p[:k]]}")
        _check_values(code, p, where)


def check_scalar(x, name):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {type(x).__name__}; for arrays use "
                         "map_kernel or the penalty's own methods")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return x


def check_step(t):
    t = check_scalar(t, "t (the prox step)")
    if t < 0.0:
        raise ValueError(f"t (the prox step) must be >= 0, got {t!r}")
    return t
