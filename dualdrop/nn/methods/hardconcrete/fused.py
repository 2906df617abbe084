"""Hard-concrete gates fused: one numba loop forward and one backward (CPU), torch elsewhere.

``hard_concrete_gate(x, log_alpha, key, beta, gamma, zeta)`` -> ``(x * z, sum P(z != 0))``
    Louizos, Welling, Kingma, "Learning sparse neural networks through L0 regularization" (2018).
    ``z = min(1, max(0, sigmoid((logit u + log a)/beta)(zeta - gamma) + gamma))`` with ``u`` the
    counter-based uniform of index ``i`` under ``key``. The sigmoid is evaluated without a log:
    ``exp(-(logit u + log a)/beta) = v^(1/beta)`` with ``v = (1 - u)/(u a)`` and ``a = exp(log
    a)`` (one torch exp pass, nothing else weight-sized before the loop); for ``beta = 2/3`` (the
    paper's value) the power is ``v sqrt(v)``, otherwise a scalar ``pow`` (~10x slower, still
    correct). The expected L0 is a *second output* from the same ``a``, ``P = sigmoid(log a -
    beta log(-gamma/zeta)) = a / (a + (-gamma/zeta)^beta)`` (no transcendental); its gradient
    ``P (1 - P)`` joins ``log a``'s in the backward, weighted by whatever the caller multiplied
    the sum by. Decided this way (not a hidden fused regularizer) so that autograd stays the only
    bookkeeper: if the caller does not use the L0 output it contributes nothing, used twice it
    counts twice. The forward keeps ``z`` for the backward, which recovers ``dz/dlog a`` from it
    with multiplications (recomputing the gate from the key there was measured slower).
    ``x`` with gates per column (``hardconcrete-neuron``: one gate per input unit and example) is
    the same loop over a ``(rows, cols)`` view with ``log_alpha`` of length ``cols``.
"""

from __future__ import annotations


import numpy as np
import torch
from numba import njit

from dualdrop.nn import _numba
from dualdrop.nn._noise import check_key, u01_f32, uniform
from dualdrop.nn._numba import NUMBA, NUMBA_SUM, check_inputs, flat, np_type
from penalties.dropout import hc_l0_shift

def _pow_mode(beta: float) -> int:
    """1 for the paper's beta = 2/3 (``v^1.5 = v sqrt(v)``), else 0 (a scalar ``pow``)."""
    return 1 if beta == 2.0 / 3.0 else 0


@njit(inline="always", **NUMBA)
def _gate_u(u, ei, mode, inv_beta, gamma, span):
    """``(z, dz/dlog a)`` of one gate for its uniform ``u`` and ``ei = exp(log a)``."""
    T = type(ei)
    v = (T(1.0) - u) / (u * ei)                         # exp(-(logit u + log a))
    if mode == 1:
        t = v * np.sqrt(v)
    else:
        t = v ** inv_beta
    s = T(1.0) / (T(1.0) + t)
    zb = s * span + gamma
    z = min(max(zb, T(0.0)), T(1.0))
    # selects, not early returns: the loop stays vectorizable
    dz = span * inv_beta * s * (T(1.0) - s) if (zb > T(0.0)) & (zb < T(1.0)) else T(0.0)
    return z, dz


@njit(inline="always", **NUMBA)
def _gate(key, i, ei, mode, inv_beta, gamma, span):
    """``(z, dz/dlog a)`` of gate ``i`` (its counter-based uniform under ``key``)."""
    return _gate_u(type(ei)(u01_f32(key, i)), ei, mode, inv_beta, gamma, span)


@njit(inline="always", **NUMBA)
def _p_nonzero(ei, c_l0):
    """``P(z != 0) = a / (a + c_l0)`` with ``ei = a = exp(log a)`` (one division; 1 at ``a =
    inf``)."""
    T = type(c_l0)
    return T(1.0) if ei == T(np.inf) else ei / (ei + c_l0)  # a NaN stays NaN


# The loops below are flat and only *assign* to their outputs: with a read-modify-write
# ``gla[c] += ...``, or nested row/column loops, LLVM's vectorized code was not used (measured
# 5-7 ms instead of 0.6 ms for 235k gates). Per-column gates therefore get ``exp(log a)``
# expanded to ``x``'s shape, and sums over rows and the L0 term are separate passes; per-weight
# gates take the L0 term's gradient inside the backward loop (one pass fewer).

@njit(**NUMBA)
def _hc_forward(x, e, key, mode, inv_beta, gamma, span, out, z):
    """``out[i] = x[i] z_i``, gate ``i`` with ``e[i] = exp(log a_i)``; keeps ``z`` for the
    backward."""
    for i in range(x.size):
        zi, _ = _gate(key, i, e[i], mode, inv_beta, gamma, span)
        out[i] = x[i] * zi
        z[i] = zi


@njit(inline="always", **NUMBA)
def _dz_of_z(zi, inv_beta, gamma, span, inv_span):
    """``dz/dlog a = (zeta - gamma)/beta s (1 - s)`` recovered from ``z`` itself: ``s = (z -
    gamma)/(zeta - gamma)`` where ``0 < z < 1``, 0 where the clamp holds ``z`` at 0 or 1 (one
    tensor fewer to keep than storing the derivative)."""
    T = type(span)
    s = (zi - gamma) * inv_span
    return span * inv_beta * s * (T(1.0) - s) if (zi > T(0.0)) & (zi < T(1.0)) else T(0.0)


@njit(**NUMBA)
def _hc_backward(g, x, z, inv_beta, gamma, span, gx, gxdz):
    """``gx = g z`` and ``gxdz = g x dz/dlog a`` (summed over rows by the caller)."""
    T = type(span)
    inv_span = T(1.0) / span  # hoisted: no division in the loop
    for i in range(x.size):
        zi = z[i]
        gx[i] = g[i] * zi
        gxdz[i] = g[i] * x[i] * _dz_of_z(zi, inv_beta, gamma, span, inv_span)


@njit(**NUMBA)
def _hc_backward_l0(g, x, z, e, inv_beta, gamma, span, c_l0, g_l0, gx, gla):
    """Per-weight gates: ``gx = g z`` and ``gla = g x dz/dlog a + g_l0 P (1 - P)`` in one pass."""
    T = type(span)
    inv_span = T(1.0) / span
    for i in range(x.size):
        zi = z[i]
        p = _p_nonzero(e[i], c_l0)
        gx[i] = g[i] * zi
        gla[i] = g[i] * x[i] * _dz_of_z(zi, inv_beta, gamma, span, inv_span) + g_l0 * p * (
            T(1.0) - p)


@njit(**NUMBA_SUM)
def _l0_sum(e, c_l0):
    """``sum_c P_c``, ``P_c = e_c / (e_c + c_l0)``."""
    total = 0.0
    for c in range(e.size):
        total += _p_nonzero(e[c], c_l0)
    return total


@njit(**NUMBA)
def _l0_grad_add(e, c_l0, g_l0, gla):
    """``gla += g_l0 P (1 - P)``."""
    T = type(c_l0)
    for c in range(e.size):
        p = _p_nonzero(e[c], c_l0)
        gla[c] += g_l0 * p * (T(1.0) - p)


class _HardConcreteGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, log_alpha, key, beta, gamma, zeta):
        T = np_type(x2d)
        e = torch.exp(log_alpha.detach())               # the only transcendental pass
        prm = (_pow_mode(beta), T(1.0 / beta), T(gamma), T(zeta - gamma))
        c_l0 = T((-gamma / zeta) ** beta)
        out, z = torch.empty_like(x2d), torch.empty_like(x2d)
        ex = e.expand_as(x2d).contiguous() if x2d.shape[0] > 1 else e
        _hc_forward(flat(x2d), flat(ex), key, *prm, out.view(-1).numpy(), z.view(-1).numpy())
        ctx.save_for_backward(x2d, e, z)
        ctx.c_l0, ctx.prm = c_l0, prm
        return out, torch.tensor(_l0_sum(e.view(-1).numpy(), c_l0), dtype=x2d.dtype)

    @staticmethod
    def backward(ctx, g, g_l0):
        x2d, e, z = ctx.saved_tensors
        if g is None:  # only the L0 output was used
            g = torch.zeros_like(x2d)
        c_l0 = ctx.c_l0
        T = type(c_l0)
        gx = torch.empty_like(x2d)
        if x2d.shape[0] == 1 and g_l0 is not None:  # per weight: the L0 gradient in the loop
            gla = torch.empty_like(e)
            _hc_backward_l0(flat(g), flat(x2d), z.view(-1).numpy(), e.view(-1).numpy(),
                            *ctx.prm[1:], c_l0, T(float(g_l0)), gx.view(-1).numpy(),
                            gla.view(-1).numpy())
            return gx, gla, None, None, None, None
        gxdz = torch.empty_like(x2d)
        _hc_backward(flat(g), flat(x2d), z.view(-1).numpy(), *ctx.prm[1:],
                     gx.view(-1).numpy(), gxdz.view(-1).numpy())
        gla = gxdz.view(-1) if x2d.shape[0] == 1 else gxdz.sum(0)
        if g_l0 is not None:
            _l0_grad_add(e.view(-1).numpy(), c_l0, T(float(g_l0)), gla.numpy())
        return gx, gla, None, None, None, None


def _hc_torch(x2d, log_alpha, u, beta, gamma, zeta):
    """The same gate in torch expressions (other devices; and the reference in the tests)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / beta)
    z = (s * (zeta - gamma) + gamma).clamp(0.0, 1.0)
    l0 = torch.sigmoid(log_alpha - hc_l0_shift(beta, gamma, zeta)).sum()
    return x2d * z, l0


def hard_concrete_gate(x, log_alpha, key: int, beta: float, gamma: float, zeta: float):
    """``(x * z, sum_gates P(z != 0))``: hard-concrete gates with logits ``log_alpha``.

    ``log_alpha`` has the shape of ``x`` (one gate per weight) or of ``x``'s last dimension (one
    gate per column, sampled independently for every row: per-example input gates). Gate ``i``
    (row-major over ``x``) uses the float32 counter-based uniform ``i`` under ``key``
    (:func:`dualdrop.nn._noise.uniform` gives the same numbers). The second output is
    differentiable in ``log_alpha``; multiply it by ``lam * group_size / n_train`` for the
    expected-L0 regularizer.
    """
    k = check_key(key)
    check_inputs(x=x, log_alpha=log_alpha)
    if not 0.0 < beta or not gamma < 0.0 or not zeta > 1.0:
        raise ValueError(f"need beta > 0, gamma < 0 < 1 < zeta, got beta={beta}, gamma={gamma}, "
                         f"zeta={zeta}")
    if log_alpha.shape == x.shape:
        x2d, la = x.reshape(1, -1), log_alpha.reshape(-1)
    elif log_alpha.dim() == 1 and x.shape[-1] == log_alpha.numel():
        x2d, la = x.reshape(-1, log_alpha.numel()), log_alpha
    else:
        raise ValueError(f"log_alpha must have x's shape {tuple(x.shape)} or its last dimension "
                         f"({x.shape[-1]},), got {tuple(log_alpha.shape)}")
    if not _numba.is_cpu(x, log_alpha):
        u = uniform(x2d.shape, int(k), device=x.device).to(x.dtype)  # float32 draws, as the loop
        out, l0 = _hc_torch(x2d, la, u, beta, gamma, zeta)
    else:
        out, l0 = _HardConcreteGate.apply(x2d.contiguous(), la.contiguous(), k, float(beta),
                                          float(gamma), float(zeta))
    return out.view(x.shape), l0
