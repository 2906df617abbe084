"""The codes of the compiled penalty kernels and the layout of a TABLE parameter vector: the
numbers shared by :mod:`penalties.kernels` (which computes with them) and
:mod:`penalties._kernel_checks` (which checks a ``(code, params)`` spec against them before a
kernel runs). No numba here, so the checks import it without the compiled kernels.
"""

from __future__ import annotations

L1 = 1
LP = 2
LOGSUM = 3
LOG2SUM = 4
SCAD = 5
MCP = 6
STANDOUT = 7
TABLE = 8
# MIXED wraps another kernel penalty: Omega = c Omega_inner + (r / 2) w^2 (an added ridge term:
# the elastic net for Omega_inner = |w|, the Mnet of MCP/SCAD); parameter vector
# [c, r, inner_code, inner_params...] (an inner MIXED is not allowed). The public scalar kernels
# dispatch it to the plain ones, which are inlined (no call layer, no recursion: numba's cache
# does not handle recursive functions safely).
MIXED = 9

# Layout of a TABLE parameter vector (see ``penalties._table``): a header, then n+1 breakpoints in
# x = log|w|, then n*(m+1) Chebyshev coefficients of y = log Omega, then those of dy/dx.
T_N, T_M, T_PLO, T_TAIL, T_TAILC, T_OMLO, T_OMHI = range(7)
T_HEADER = 7
TAIL_CAP = 0  # Omega constant beyond x_hi (eta_hat = inf)
TAIL_LOG = 1  # Omega = Omega(w_hi) + c log(|w|/w_hi)
TAIL_POW = 2  # Omega = Omega(w_hi) (|w|/w_hi)^c
