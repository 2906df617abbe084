"""Fused per-weight work of the sparsification methods: autograd Functions with hand-written
backward passes over the weights, and the counter-based noise of ``dualdrop.nn._noise``.

Why: beyond the matmuls, a method's training step is elementwise work over every weight (draw
noise, evaluate a gate or a penalty slope, mask, add a regularizer's gradient). Written as torch
expressions it becomes a chain of passes, each reading and writing weight-sized tensors and most
allocating one; on one CPU thread a pass over LeNet-300-100's 266k weights costs ~0.05 ms, a
transcendental pass 0.06-0.2 ms, torch's generator 0.7 ms, and the chains made hard-concrete
3.1x and variational dropout 3.5x a dense step (benchmarks/RESULTS.md). Here each method's
per-weight work is one numba loop forward and one backward (plus at most a vectorized torch
``exp`` where a transcendental is unavoidable: numba's scalar ``exp``/``log`` do not vectorize on
this CPU, torch's do). Loops compute in the tensor's dtype (float32 arithmetic vectorizes twice as
wide as float64) and use ``error_model="numpy"`` (Python's division checks block vectorization).

Functions (plain tensors in, so a parametrization's or a layer's forward can call them):

``hard_concrete_gate(w, log_alpha, key, beta, gamma, zeta)`` -> ``(w * z, sum P(z != 0))``
    Louizos, Welling, Kingma, "Learning sparse neural networks through L0 regularization" (2018).
    ``z = min(1, max(0, sigmoid((logit u + log a)/beta)(zeta - gamma) + gamma))`` with ``u`` the
    counter-based uniform of index ``i`` under ``key``. The sigmoid is evaluated without a log:
    ``exp(-(logit u + log a)/beta) = v^(1/beta)`` with ``v = (1 - u)/(u a)`` and ``a = exp(log
    a)`` (one torch exp pass, nothing else weight-sized before the loop); for ``beta = 2/3`` (the
    paper's value) the power is ``v sqrt(v)``, otherwise a scalar ``pow`` (~10x slower, still
    correct). The expected L0 is a *second output* from the same ``a``, ``P = sigmoid(log a -
    beta log(-gamma/zeta)) = a / (a + (-gamma/zeta)^beta)`` (no transcendental); its gradient
    ``P (1 - P)`` joins ``log a``'s in the backward (inside the backward loop for per-weight
    gates), weighted by whatever the caller multiplied the sum by.
    Decided this way (not a hidden fused regularizer) so that autograd stays the only bookkeeper:
    if the caller does not use the L0 output it contributes nothing, used twice it counts twice.
    The forward keeps ``z`` for the backward, which recovers ``dz/dlog a`` from it with
    multiplications (recomputing the gate from the key there was measured slower: two divisions
    and a sqrt per gate cost more than a kept tensor).
    ``x`` with gates per column (``hardconcrete-neuron``: one gate per input unit and example) is
    the same loop over a ``(rows, cols)`` view with ``log_alpha`` of length ``cols``.
``vardrop_noise(w, log_alpha, key, clip)`` -> ``(w (1 + sqrt(a) e), sum KL)``
    Molchanov, Ashukha, Vetrov, "Variational dropout sparsifies deep neural networks" (2017):
    ``a = exp(clamp(log a, -clip, clip))``, ``e`` standard normal (Box-Muller over the
    counter-based uniforms). Second output: the KL approximation's sum (its eq. 14), value
    computed only when ``need_kl_value`` (it needs a log pass), gradient always exact.
``kl_sum(log_alpha, clip, need_value)``
    the same KL alone, for ``log a`` a parameter.
``ar_variance_kl(w, log_sigma2, clip)`` -> ``(sigma^2, sum KL)``
    vardrop-lr-ar's weight variance ``exp(log sigma^2)`` and the KL at ``log a = log sigma^2 -
    log(w^2 + 1e-8)``, the chain rule to ``w`` and ``log sigma^2`` fused into the backward.
``lr_variance_kl(w, log_alpha, clip)`` -> ``(exp(clamp(log a)) w^2, sum KL)``
    the weight variance of local reparameterization and the KL from one ``exp`` pass.
``local_reparam_linear(x, w, b, var_w, key)``
    ``x w^T + b + sqrt(x^2 var_w^T + 1e-8) e`` with ``e`` per pre-activation (Kingma, Salimans,
    Welling, "Variational dropout and the local reparameterization trick", 2015), the noise from
    the counter-based generator; backward as autograd would do it, one temporary fewer.
``add_lr_noise(out, var, key)``
    ``out + sqrt(var + 1e-8) e`` with counter-based ``e``: the local reparameterization's noise
    on a layer's output whose variance the caller computed (any linear map).
``PenaltyGradHook(w, kind, lam, params).term()`` / ``penalty_grad`` / ``add_penalty_grad_``
    the penalty methods' ``lam Omega'(w)`` for the closed forms ``l1``, ``logsum``, ``mcp``,
    ``scad`` (docs/theory.md section 3): best, a scalar 0 in the loss that makes a
    post-accumulate-grad hook add ``g lam Omega'(w)`` into ``w.grad`` in place (one pass over hot
    memory); or a scalar 0 whose backward returns a fresh ``lam g Omega'(w)`` (simpler, ~0.45 ms
    slower per LeNet step); or the in-place add itself.
    Profiled cause of logsum's 1.44x (torch.profiler, current step): ``sign``, ``abs``, ``add``,
    ``div_``, ``mul_`` and the autograd accumulation, 0.9 ms per step of a 2-3 ms step; the loop
    below does the same in ~0.1 ms.
``adaptive_prox_(w, exp_avg_sq, kind, params, lr_lam, bc2, eps)``
    AdaProx's prox ``w <- w eta_hat(w) / (eta_hat(w) + rho lam)`` with Adam's own step ``rho``,
    one loop.
``eta_trick_objective(w, p, lam, eps, c, quadratic)``
    the eta-trick's regularizer of ``dualdrop.nn.penalty`` (``eta = lam e^p``): one exp pass
    forward, one loop backward.
``EtaTrickGradHook(w, p, lam, eps, c, quadratic).term()`` / ``eta_trick_grad_term``
    its gradients alone, as the penalty methods' hook: ``g dJ/dw`` added into ``w.grad`` and
    ``g dJ/dp`` written into ``p.grad`` in place by ``w``'s post-accumulate-grad hook (one exp
    pass into a kept buffer and one loop; no fresh weight gradient for autograd to add).

All loops run on CPU tensors; on another device every Function falls back to the torch
expression of the same formula (untested on GPUs: none is available to the project's tests).

How the methods use them (``ENABLED``, default on, or ``DUALDROP_FUSED=0``; off, every method
runs its earlier torch expressions with torch's generator):

=====================  =====================================================================
method                 fused path
=====================  =====================================================================
hardconcrete           the parametrization's training weight is ``hard_concrete_gate(w, log
                       a)``; its expected-L0 output is the regularizer of that forward
hardconcrete-neuron    the same on the layer's input (Linear) or on the gates of a
                       convolution's output channels
vardrop                ``vardrop_noise``; its KL output carries the KL's gradient (the value,
                       when asked, is added without a gradient)
vardrop-lr(-ar)        the forward hook's weight variance from ``lr_variance_kl`` /
                       ``ar_variance_kl`` (KL output as above), the noise per pre-activation
                       from ``add_lr_noise`` (any Linear/Conv layer)
logsum, adatikhonov,   ``penalty_grad_term`` (the post-accumulate-grad hook) when the
penalty:l1/mcp/scad    regularizer's value is not asked (``value=False``, the training loop)
adaprox                ``adaptive_prox_`` after Adam's step (one loop)
eta-trick              ``eta_trick_grad_term`` (the hook) when the value is not asked, else
                       ``eta_trick_objective``
magnitude              (not a Function) masks are applied to the stored weights only when they
                       change; between updates the masked forward keeps pruned weights at 0
=====================  =====================================================================

Keys and exact resume: every draw is a pure function of ``make_key(seed, rank, counter)``
(``dualdrop.nn._base.NoiseState``): each stochastic state draws its seed from torch's generator
when built and counts its training forwards; both are host integers in the state dict, so a
checkpoint resumes the exact noise sequence, and making a key reads nothing from a device. A
per-forward counter rather than the optimizer step keeps micro-batches of one step (gradient
accumulation) on fresh noise; the rank of ``torch.distributed`` separates the processes of a
data-parallel run. A parametrization must return one tensor, so the second output (expected L0
or KL) is kept on the state for ``regularizer_term`` to take (once, only under autograd).
"""

from __future__ import annotations

import math
import os
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from dualdrop.nn._base import compiling
from dualdrop.nn._noise import _check_key, normal, u01_f32, uniform
from dualdrop.nn.penalty import TORCH_FORMS, logsum_dual
from dualdrop.nn.vardrop import K1, K2, K3

_NUMBA = dict(cache=True, error_model="numpy")
# reassociation only (for the vectorized sums): no nnan/ninf, the loops meet inf on purpose
_NUMBA_SUM = dict(cache=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract"})

_VAR_EPS = 1e-8  # inside sqrt(var + eps) of the local reparameterization
_AR_EPS = 1e-8   # inside log(w^2 + eps) of the additive reparameterization


_NP_TYPES = {torch.float32: np.float32, torch.float64: np.float64}

#: whether the methods use these Functions (``DUALDROP_FUSED=0`` in the environment, or False
#: here, restores the earlier torch expressions and torch's generator: the benchmark's "before")
ENABLED = os.environ.get("DUALDROP_FUSED", "1") != "0"


def active(*tensors) -> bool:
    """Whether the methods take the fused path for ``tensors`` (enabled, float32/float64, not
    under ``torch.compile``)."""
    if not ENABLED or compiling():
        return False
    for t in tensors:
        if t.dtype not in _NP_TYPES:
            return False
    return True


def _np_type(t: torch.Tensor):
    """The numpy scalar type of ``t`` (the loops' arithmetic type)."""
    return _NP_TYPES[t.dtype]


def _check_inputs(**tensors) -> None:
    """Tensors of one floating dtype the loops support, with a clear error otherwise."""
    dtypes = set()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _NP_TYPES:
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
        dtypes.add(t.dtype)
    if len(dtypes) > 1:
        raise TypeError(f"{', '.join(tensors)} must share one dtype, got "
                        f"{sorted(map(str, dtypes))}")


def _check_same_shape(w: torch.Tensor, other: torch.Tensor, name: str) -> None:
    if w.shape != other.shape:
        raise ValueError(f"{name} must have w's shape {tuple(w.shape)}, got "
                         f"{tuple(other.shape)}")


def _flat(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(-1).numpy()


def _is_cpu(*ts) -> bool:
    return all(t.device.type == "cpu" for t in ts)


# ---- hard-concrete gates -----------------------------------------------------------------------

def _pow_mode(beta: float) -> int:
    """1 for the paper's beta = 2/3 (``v^1.5 = v sqrt(v)``), else 0 (a scalar ``pow``)."""
    return 1 if beta == 2.0 / 3.0 else 0


@njit(inline="always", **_NUMBA)
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


@njit(inline="always", **_NUMBA)
def _gate(key, i, ei, mode, inv_beta, gamma, span):
    """``(z, dz/dlog a)`` of gate ``i`` (its counter-based uniform under ``key``)."""
    return _gate_u(type(ei)(u01_f32(key, i)), ei, mode, inv_beta, gamma, span)


@njit(inline="always", **_NUMBA)
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

@njit(**_NUMBA)
def _hc_forward(x, e, key, mode, inv_beta, gamma, span, out, z):
    """``out[i] = x[i] z_i``, gate ``i`` with ``e[i] = exp(log a_i)``; keeps ``z`` for the
    backward."""
    for i in range(x.size):
        zi, _ = _gate(key, i, e[i], mode, inv_beta, gamma, span)
        out[i] = x[i] * zi
        z[i] = zi


@njit(inline="always", **_NUMBA)
def _dz_of_z(zi, inv_beta, gamma, span, inv_span):
    """``dz/dlog a = (zeta - gamma)/beta s (1 - s)`` recovered from ``z`` itself: ``s = (z -
    gamma)/(zeta - gamma)`` where ``0 < z < 1``, 0 where the clamp holds ``z`` at 0 or 1 (one
    tensor fewer to keep than storing the derivative)."""
    T = type(span)
    s = (zi - gamma) * inv_span
    return span * inv_beta * s * (T(1.0) - s) if (zi > T(0.0)) & (zi < T(1.0)) else T(0.0)


@njit(**_NUMBA)
def _hc_backward(g, x, z, inv_beta, gamma, span, gx, gxdz):
    """``gx = g z`` and ``gxdz = g x dz/dlog a`` (summed over rows by the caller)."""
    T = type(span)
    inv_span = T(1.0) / span  # hoisted: no division in the loop
    for i in range(x.size):
        zi = z[i]
        gx[i] = g[i] * zi
        gxdz[i] = g[i] * x[i] * _dz_of_z(zi, inv_beta, gamma, span, inv_span)


@njit(**_NUMBA)
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


@njit(**_NUMBA_SUM)
def _l0_sum(e, c_l0):
    """``sum_c P_c``, ``P_c = e_c / (e_c + c_l0)``."""
    total = 0.0
    for c in range(e.size):
        total += _p_nonzero(e[c], c_l0)
    return total


@njit(**_NUMBA)
def _l0_grad_add(e, c_l0, g_l0, gla):
    """``gla += g_l0 P (1 - P)``."""
    T = type(c_l0)
    for c in range(e.size):
        p = _p_nonzero(e[c], c_l0)
        gla[c] += g_l0 * p * (T(1.0) - p)


class _HardConcreteGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, log_alpha, key, beta, gamma, zeta):
        T = _np_type(x2d)
        e = torch.exp(log_alpha.detach())               # the only transcendental pass
        prm = (_pow_mode(beta), T(1.0 / beta), T(gamma), T(zeta - gamma))
        c_l0 = T((-gamma / zeta) ** beta)
        out, z = torch.empty_like(x2d), torch.empty_like(x2d)
        ex = e.expand_as(x2d).contiguous() if x2d.shape[0] > 1 else e
        _hc_forward(_flat(x2d), _flat(ex), key, *prm, out.view(-1).numpy(), z.view(-1).numpy())
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
            _hc_backward_l0(_flat(g), _flat(x2d), z.view(-1).numpy(), e.view(-1).numpy(),
                            *ctx.prm[1:], c_l0, T(float(g_l0)), gx.view(-1).numpy(),
                            gla.view(-1).numpy())
            return gx, gla, None, None, None, None
        gxdz = torch.empty_like(x2d)
        _hc_backward(_flat(g), _flat(x2d), z.view(-1).numpy(), *ctx.prm[1:],
                     gx.view(-1).numpy(), gxdz.view(-1).numpy())
        gla = gxdz.view(-1) if x2d.shape[0] == 1 else gxdz.sum(0)
        if g_l0 is not None:
            _l0_grad_add(e.view(-1).numpy(), c_l0, T(float(g_l0)), gla.numpy())
        return gx, gla, None, None, None, None


def _hc_torch(x2d, log_alpha, u, beta, gamma, zeta):
    """The same gate in torch expressions (other devices; and the reference in the tests)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / beta)
    z = (s * (zeta - gamma) + gamma).clamp(0.0, 1.0)
    l0 = torch.sigmoid(log_alpha - beta * math.log(-gamma / zeta)).sum()
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
    k = _check_key(key)
    _check_inputs(x=x, log_alpha=log_alpha)
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
    if not _is_cpu(x, log_alpha):
        u = uniform(x2d.shape, int(k), device=x.device).to(x.dtype)  # float32 draws, as the loop
        out, l0 = _hc_torch(x2d, la, u, beta, gamma, zeta)
    else:
        out, l0 = _HardConcreteGate.apply(x2d.contiguous(), la.contiguous(), k, float(beta),
                                          float(gamma), float(zeta))
    return out.view(x.shape), l0


# ---- variational dropout: KL and noise ---------------------------------------------------------

@njit(inline="always", **_NUMBA)
def _kl_slope(n2, d1, e_k3):
    """``dKL/dlog a = -k1 k3 s1 (1 - s1) - (1 - s2)/2`` with ``s1 = sigmoid(k2 + k3 log a) =
    1/d2``, ``d2 = 1 + exp(-k2) e_k3``, ``e_k3 = exp(-k3 log a)``, and ``1 - s2 = 1 - sigmoid(log
    a) = n2/d1`` (``n2 = exp(-log a), d1 = 1 + n2``, or ``n2 = 1, d1 = 1 + a``); one division
    for both sigmoids (divisions bound these loops). Finite for ``|log a| <= 30``."""
    T = type(d1)
    ce = T(math.exp(-K2)) * e_k3
    d2 = T(1.0) + ce
    r = T(1.0) / (d1 * d2)
    s1 = d1 * r
    return T(-K1 * K3) * s1 * (ce * s1) - T(0.5) * n2 * d2 * r


@njit(**_NUMBA)
def _kl_backward(la, ex, clip, g_kl, gla):
    """``gla = g_kl dKL/dla`` inside ``[-clip, clip]``, 0 outside; ``ex = exp((-1, -k3) la)``."""
    T = type(clip)
    for i in range(la.size):
        d = g_kl * _kl_slope(ex[0, i], T(1.0) + ex[0, i], ex[1, i])
        gla[i] = d if -clip <= la[i] <= clip else T(0.0)


def _exp_scaled(la: torch.Tensor, coefs) -> torch.Tensor:
    """``exp(c la)`` for each ``c`` in ``coefs``, stacked as rows, in one exp pass."""
    flat = la.detach().reshape(1, -1)
    if len(coefs) == 1:  # two torch calls (this runs per layer and step: fixed costs count)
        return torch.mul(flat, coefs[0]).exp_()
    out = torch.empty((len(coefs), flat.shape[1]), dtype=la.dtype)
    for i, c in enumerate(coefs):
        torch.mul(flat[0], c, out=out[i])
    return out.exp_()


def _kl_value(la: torch.Tensor, clip: float) -> torch.Tensor:
    lac = la.clamp(-clip, clip)
    return (K1 - K1 * torch.sigmoid(K2 + K3 * lac) + 0.5 * F.softplus(-lac)).sum()


class _KLSum(torch.autograd.Function):
    """``sum KL(clamp(la))`` (value only when asked), gradient in one loop."""

    @staticmethod
    def forward(ctx, la, clip, need_value):
        ctx.save_for_backward(la)
        ctx.clip = clip
        with torch.no_grad():
            return _kl_value(la, clip) if need_value else la.new_zeros(())

    @staticmethod
    def backward(ctx, g):
        (la,) = ctx.saved_tensors
        return _kl_grad(la, ctx.clip, g), None, None


def _kl_grad(la: torch.Tensor, clip: float, g) -> torch.Tensor:
    T = _np_type(la)
    gla = torch.empty_like(la)
    ex = _exp_scaled(la, (-1.0, -K3))
    _kl_backward(_flat(la), ex.numpy(), T(clip), T(float(g)), gla.view(-1).numpy())
    return gla


def _check_clip(clip) -> float:
    clip = float(clip)
    if not clip > 0.0:
        raise ValueError(f"clip must be > 0, got {clip}")
    return clip


def kl_sum(log_alpha: torch.Tensor, clip: float, need_value: bool = True) -> torch.Tensor:
    """``sum KL(clamp(log_alpha, -clip, clip))`` of the log-uniform prior (Molchanov et al. 2017,
    eq. 14); with ``need_value=False`` the value is 0 and the gradient exact."""
    clip = _check_clip(clip)
    _check_inputs(log_alpha=log_alpha)
    if not _is_cpu(log_alpha):
        v = _kl_value(log_alpha, clip)
        return v if need_value else v - v.detach()
    return _KLSum.apply(log_alpha.contiguous(), clip, bool(need_value))


@njit(**_NUMBA)
def _ar_log_arg(w, out):
    """``out = w^2 + 1e-8`` (the argument of the additive reparameterization's log)."""
    T = type(w[0])
    for i in range(w.size):
        out[i] = w[i] * w[i] + T(_AR_EPS)


@njit(**_NUMBA)
def _ar_log_alpha(ls2, log_t, mk3):
    """In place ``log_t <- log a = ls2 - log_t`` and ``mk3 = -k3 log a`` (exponentiated next)."""
    T = type(ls2[0])
    for i in range(ls2.size):
        la = ls2[i] - log_t[i]
        log_t[i] = la
        mk3[i] = T(-K3) * la


@njit(**_NUMBA)
def _ar_backward(g_var, w, var_w, la, e_k3, clip, g_kl, gw, gls):
    """``gls = g_var var_w + d``, ``gw = -d 2 w / (w^2 + eps)`` with ``d = g_kl dKL/dla`` inside
    the clip (0 outside); ``exp(-log a) = (w^2 + eps) / sigma^2`` needs no transcendental."""
    T = type(clip)
    for i in range(w.size):
        t = w[i] * w[i] + T(_AR_EPS)
        e_neg = t / var_w[i]
        k = g_kl * _kl_slope(e_neg, T(1.0) + e_neg, e_k3[i])
        d = k if -clip <= la[i] <= clip else T(0.0)
        gls[i] = g_var[i] * var_w[i] + d
        gw[i] = -d * T(2.0) * w[i] / t


class _ARVarianceKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, ls2, clip, need_value):
        var_w = torch.exp(ls2.detach())
        ctx.save_for_backward(w, ls2, var_w)
        ctx.clip = clip
        with torch.no_grad():
            kl = (_kl_value(ls2 - torch.log(w * w + _AR_EPS), clip) if need_value
                  else ls2.new_zeros(()))
        return var_w, kl

    @staticmethod
    def backward(ctx, g_var, g_kl):
        w, ls2, var_w = ctx.saved_tensors
        if g_kl is None:
            return None, (g_var * var_w if g_var is not None else None), None, None
        if g_var is None:
            g_var = torch.zeros_like(var_w)
        T = _np_type(w)
        la, e_k3 = torch.empty_like(w), torch.empty_like(w)
        _ar_log_arg(_flat(w), la.view(-1).numpy())
        _ar_log_alpha(_flat(ls2), la.log_().view(-1).numpy(), e_k3.view(-1).numpy())
        gw, gls = torch.empty_like(w), torch.empty_like(ls2)
        _ar_backward(_flat(g_var), _flat(w), _flat(var_w), la.view(-1).numpy(),
                     e_k3.exp_().view(-1).numpy(), T(ctx.clip), T(float(g_kl)),
                     gw.view(-1).numpy(), gls.view(-1).numpy())
        return gw, gls, None, None


def ar_variance_kl(w, log_sigma2, clip: float, need_kl_value: bool = True):
    """``(sigma^2, sum KL)`` of the additive reparameterization: ``sigma^2 = exp(log_sigma2)``
    (vardrop-lr-ar's weight variance) and the KL of :func:`kl_sum` at ``log a = log_sigma2 -
    log(w^2 + 1e-8)``, differentiable in ``w`` and ``log_sigma2``. The forward is one exp pass;
    the KL's gradient costs one log and one exp pass and three loops in the backward (the
    KL's value, a further log pass, only when ``need_kl_value``)."""
    clip = _check_clip(clip)
    _check_inputs(w=w, log_sigma2=log_sigma2)
    _check_same_shape(w, log_sigma2, "log_sigma2")
    if not _is_cpu(w, log_sigma2):
        v = _kl_value(log_sigma2 - torch.log(w * w + _AR_EPS), clip)
        return torch.exp(log_sigma2), (v if need_kl_value else v - v.detach())
    return _ARVarianceKL.apply(w.contiguous(), log_sigma2.contiguous(), clip,
                               bool(need_kl_value))


@njit(**_NUMBA)
def _vd_forward(w, h, eps, lo, hi, out):
    for i in range(w.size):
        sd = min(max(h[i], lo), hi)
        out[i] = w[i] + sd * w[i] * eps[i]


@njit(**_NUMBA)
def _vd_backward(g, w, la, h, eps, ex, clip, lo, hi, g_kl, gw, gla):
    """``gw = g (1 + sd e)``; ``gla = g sd w e / 2 + g_kl dKL/dla`` inside the clip, else 0."""
    T = type(clip)
    for i in range(w.size):
        sd = min(max(h[i], lo), hi)
        gw[i] = g[i] * (T(1.0) + sd * eps[i])
        if -clip <= la[i] <= clip:
            kl = _kl_slope(T(1.0), T(1.0) + sd * sd, ex[0, i])
            gla[i] = T(0.5) * g[i] * sd * w[i] * eps[i] + g_kl * kl
        else:
            gla[i] = T(0.0)


class _VarDropNoise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, la, key, clip, need_value):
        T = _np_type(w)
        h = torch.mul(la.detach(), 0.5).exp_()           # sqrt(a) before the clip
        eps = normal(w.shape, int(key), dtype=w.dtype)
        out = torch.empty_like(w)
        lo, hi = T(math.exp(-0.5 * clip)), T(math.exp(0.5 * clip))
        _vd_forward(_flat(w), _flat(h), _flat(eps), lo, hi, out.view(-1).numpy())
        ctx.save_for_backward(w, la, h, eps)
        ctx.clip, ctx.lo, ctx.hi = T(clip), lo, hi
        with torch.no_grad():
            kl = _kl_value(la, clip) if need_value else la.new_zeros(())
        return out, kl

    @staticmethod
    def backward(ctx, g, g_kl):
        w, la, h, eps = ctx.saved_tensors
        T = type(ctx.clip)
        if g is None:  # only the KL output was used
            g = torch.zeros_like(w)
        gw, gla = torch.empty_like(w), torch.empty_like(la)
        if g_kl is None:
            gkl, ex = T(0.0), np.ones((1, la.numel()), dtype=T)
        else:
            gkl, ex = T(float(g_kl)), _exp_scaled(la, (-K3,)).numpy()
        _vd_backward(g.contiguous().view(-1).numpy(), _flat(w), _flat(la), _flat(h), _flat(eps),
                     ex, ctx.clip, ctx.lo, ctx.hi, gkl, gw.view(-1).numpy(),
                     gla.view(-1).numpy())
        return gw, gla, None, None, None


def vardrop_noise(w, log_alpha, key: int, clip: float, need_kl_value: bool = True):
    """``(w (1 + sqrt(a) e), sum KL)`` with ``a = exp(clamp(log_alpha, -clip, clip))`` and ``e``
    the counter-based normals of ``key`` (:func:`dualdrop.nn._noise.normal` gives the same
    numbers); the KL output's value is 0 unless ``need_kl_value``, its gradient always exact."""
    k = _check_key(key)
    clip = _check_clip(clip)
    _check_inputs(w=w, log_alpha=log_alpha)
    _check_same_shape(w, log_alpha, "log_alpha")
    if not _is_cpu(w, log_alpha):
        e = normal(w.shape, int(k), dtype=w.dtype, device=w.device)
        out = w + torch.exp(0.5 * log_alpha.clamp(-clip, clip)) * w * e
        return out, kl_sum(log_alpha, clip, need_kl_value)
    return _VarDropNoise.apply(w.contiguous(), log_alpha.contiguous(), k, clip,
                               bool(need_kl_value))


# ---- local reparameterization ------------------------------------------------------------------

@njit(**_NUMBA)
def _lrv_forward(w, e, lo, hi, out):
    for i in range(w.size):
        out[i] = min(max(e[i], lo), hi) * w[i] * w[i]


@njit(**_NUMBA)
def _lrv_backward(g, w, la, e, ex, clip, lo, hi, g_kl, gw, gla):
    """``gw = 2 g a w``; ``gla = g a w^2 + g_kl dKL/dla`` inside the clip, else 0 (``e =
    exp(la)``, ``a`` its clamp, ``ex[0] = exp(-k3 la)``)."""
    T = type(clip)
    for i in range(w.size):
        a = min(max(e[i], lo), hi)
        gw[i] = T(2.0) * g[i] * a * w[i]
        gla[i] = (g[i] * a * w[i] * w[i] + g_kl * _kl_slope(T(1.0), T(1.0) + a, ex[0, i])
                  if -clip <= la[i] <= clip else T(0.0))


class _LRVarianceKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, la, clip, need_value):
        T = _np_type(w)
        e = torch.exp(la.detach())
        lo, hi = T(math.exp(-clip)), T(math.exp(clip))
        out = torch.empty_like(w)
        _lrv_forward(_flat(w), _flat(e), lo, hi, out.view(-1).numpy())
        ctx.save_for_backward(w, la, e)
        ctx.prm = (T(clip), lo, hi)
        with torch.no_grad():
            kl = _kl_value(la, clip) if need_value else la.new_zeros(())
        return out, kl

    @staticmethod
    def backward(ctx, g, g_kl):
        w, la, e = ctx.saved_tensors
        T = type(ctx.prm[0])
        gw, gla = torch.empty_like(w), torch.empty_like(la)
        if g is None:
            g = torch.zeros_like(w)
        if g_kl is None:
            gkl, ex = T(0.0), np.ones((1, la.numel()), dtype=T)
        else:
            gkl, ex = T(float(g_kl)), _exp_scaled(la, (-K3,)).numpy()
        _lrv_backward(_flat(g), _flat(w), _flat(la), _flat(e), ex, *ctx.prm, gkl,
                      gw.view(-1).numpy(), gla.view(-1).numpy())
        return gw, gla, None, None


def lr_variance_kl(w, log_alpha, clip: float, need_kl_value: bool = True):
    """``(exp(clamp(log_alpha, -clip, clip)) w^2, sum KL)``: the weight variance of vardrop-lr
    and its KL term from one ``exp`` pass (the KL's value only when ``need_kl_value``)."""
    clip = _check_clip(clip)
    _check_inputs(w=w, log_alpha=log_alpha)
    _check_same_shape(w, log_alpha, "log_alpha")
    if not _is_cpu(w, log_alpha):
        return (torch.exp(log_alpha.clamp(-clip, clip)) * w * w,
                kl_sum(log_alpha, clip, need_kl_value))
    return _LRVarianceKL.apply(w.contiguous(), log_alpha.contiguous(), clip, bool(need_kl_value))


class _LocalReparamLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, var_w, key):
        x2 = x * x
        std = torch.mm(x2, var_w.t()).add_(_VAR_EPS).sqrt_()
        e = normal(std.shape, key, dtype=x.dtype)
        out = torch.addcmul(F.linear(x, w, b), std, e)
        ctx.save_for_backward(x, x2, w, var_w, std, e)
        ctx.has_bias = b is not None
        return out

    @staticmethod
    def backward(ctx, g):
        x, x2, w, var_w, std, e = ctx.saved_tensors
        g = g.contiguous()
        gs = torch.mul(g, e).div_(std).mul_(0.5)           # dL/dvar = g e / (2 std)
        gx = gw = gb = gvar = None
        if ctx.needs_input_grad[0]:
            gx = torch.mm(g, w).addcmul_(x, torch.mm(gs, var_w), value=2.0)
        if ctx.needs_input_grad[1]:
            gw = torch.mm(g.t(), x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.sum(0)
        if ctx.needs_input_grad[3]:
            gvar = torch.mm(gs.t(), x2)
        return gx, gw, gb, gvar, None


class _AddLRNoise(torch.autograd.Function):
    """``out + sqrt(var + 1e-8) e`` for given normals ``e``; backward ``g`` to ``out`` and
    ``g e / (2 std)`` to ``var`` (the std and the noise kept, no other temporary)."""

    @staticmethod
    def forward(ctx, out, var, e):
        std = var.detach().add(_VAR_EPS).sqrt_()
        ctx.save_for_backward(std, e)
        return torch.addcmul(out, std, e)

    @staticmethod
    def backward(ctx, g):
        std, e = ctx.saved_tensors
        gvar = torch.mul(g, e).div_(std).mul_(0.5) if ctx.needs_input_grad[1] else None
        return g, gvar, None


def add_lr_noise(out: torch.Tensor, var: torch.Tensor, key: int) -> torch.Tensor:
    """``out + sqrt(var + 1e-8) e``, ``e`` the counter-based normals of ``key`` in ``out``'s
    shape: the local reparameterization's sample of pre-activations with mean ``out`` and
    variance ``var`` (any layer: ``var`` is the layer's linear map of ``x^2`` with the weight
    variances, computed by the caller)."""
    k = int(_check_key(key))
    if out.shape != var.shape:
        raise ValueError(f"out {tuple(out.shape)} and var {tuple(var.shape)} must have one shape")
    e = normal(out.shape, k, dtype=out.dtype, device=out.device)
    return _AddLRNoise.apply(out, var, e)


def local_reparam_linear(x, w, b, var_w, key: int) -> torch.Tensor:
    """Pre-activations ``x w^T + b + sqrt(x^2 var_w^T + 1e-8) e``, ``e`` the counter-based normals
    of ``key`` in the output's shape (leading dimensions of ``x`` flattened, row-major)."""
    k = int(_check_key(key))
    _check_inputs(x=x, w=w, var_w=var_w)
    if w.dim() != 2 or var_w.shape != w.shape or x.shape[-1] != w.shape[1]:
        raise ValueError(f"need w and var_w of one shape (out, in) and x (..., in), got x "
                         f"{tuple(x.shape)}, w {tuple(w.shape)}, var_w {tuple(var_w.shape)}")
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1])
    if not _is_cpu(x, w, var_w):
        e = normal((x2d.shape[0], w.shape[0]), k, dtype=x.dtype, device=x.device)
        out = F.linear(x2d, w, b) + torch.sqrt(F.linear(x2d * x2d, var_w) + _VAR_EPS) * e
    else:
        out = _LocalReparamLinear.apply(x2d.contiguous(), w, b, var_w, k)
    return out.view(*lead, w.shape[0])


# ---- penalty methods: lam Omega'(w) in one loop ------------------------------------------------

PENALTY_KINDS = {"l1": 0, "logsum": 1, "mcp": 2, "scad": 3}


@njit(inline="always", **_NUMBA)
def _slope(kind, wi, p0, p1):
    """``Omega'(w)`` of the closed forms (0 at w = 0): l1 ``sign w``; logsum(eps = p0) ``sign w /
    (|w| + eps)``; mcp(a = p0, lam = p1) ``sign w max(0, 1 - |w|/(a lam))``; scad(a, lam)
    ``sign w`` for ``|w| <= lam``, ``sign w (a lam - |w|)/((a - 1) lam)`` up to ``a lam``, 0."""
    T = type(wi)
    a = abs(wi)
    sgn = T(1.0) if wi > T(0.0) else (T(-1.0) if wi < T(0.0) else T(0.0))
    if kind == 0:
        return sgn
    if kind == 1:
        return sgn / (a + p0)
    if kind == 2:
        return sgn * max(T(0.0), T(1.0) - a / (p0 * p1))
    if a <= p1:
        return sgn
    return sgn * max(T(0.0), (p0 * p1 - a) / ((p0 - T(1.0)) * p1))


@njit(**_NUMBA)
def _penalty_slope(w, kind, scale, p0, p1, out):
    """``out = scale Omega'(w)`` (one loop per kind: the branch on ``kind`` is outside)."""
    if kind == 0:
        for i in range(w.size):
            out[i] = scale * _slope(0, w[i], p0, p1)
    elif kind == 1:
        for i in range(w.size):
            out[i] = scale * _slope(1, w[i], p0, p1)
    elif kind == 2:
        for i in range(w.size):
            out[i] = scale * _slope(2, w[i], p0, p1)
    else:
        for i in range(w.size):
            out[i] = scale * _slope(3, w[i], p0, p1)


@njit(**_NUMBA)
def _penalty_slope_add(w, kind, scale, p0, p1, grad):
    """``grad += scale Omega'(w)``."""
    if kind == 0:
        for i in range(w.size):
            grad[i] += scale * _slope(0, w[i], p0, p1)
    elif kind == 1:
        for i in range(w.size):
            grad[i] += scale * _slope(1, w[i], p0, p1)
    elif kind == 2:
        for i in range(w.size):
            grad[i] += scale * _slope(2, w[i], p0, p1)
    else:
        for i in range(w.size):
            grad[i] += scale * _slope(3, w[i], p0, p1)


def _penalty_args(kind: str, params: dict):
    if kind not in PENALTY_KINDS:
        raise ValueError(f"kind must be one of {sorted(PENALTY_KINDS)}, got {kind!r}; other "
                         "penalties go through dualdrop.nn.penalty's generic path")
    names = {"l1": (), "logsum": ("eps",), "mcp": ("a", "lam"), "scad": ("a", "lam")}[kind]
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params of {kind!r} need {list(names)}, missing {missing}")
    vals = [float(params[n]) for n in names] + [0.0, 0.0]
    return PENALTY_KINDS[kind], vals[0], vals[1]


class _PenaltyGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, kind, lam, p0, p1):
        ctx.save_for_backward(w)
        ctx.prm = (kind, lam, p0, p1)
        return w.new_zeros(())

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        kind, lam, p0, p1 = ctx.prm
        T = _np_type(w)
        out = torch.empty_like(w)
        _penalty_slope(_flat(w), kind, T(lam * float(g)), T(p0), T(p1), out.view(-1).numpy())
        return out, None, None, None, None


def penalty_grad(w, kind: str, lam: float, params: dict) -> torch.Tensor:
    """A scalar 0 whose gradient in ``w`` is ``lam Omega'(w)`` (closed form ``kind``): add it to
    the loss when the penalty's value is not needed (CPU; elsewhere the torch expression)."""
    code, p0, p1 = _penalty_args(kind, params)
    _check_inputs(w=w)
    if not _is_cpu(w):
        return _penalty_torch(w, kind, lam, params)
    return _PenaltyGrad.apply(w.contiguous(), code, float(lam), p0, p1)


def _penalty_dense(w, kind, lam, params) -> torch.Tensor:
    """``lam Omega'(w)`` as torch expressions (other devices): the closed forms of
    ``dualdrop.nn.penalty.TORCH_FORMS``."""
    wd = w.detach()
    return TORCH_FORMS[kind].deriv(wd, wd.abs(), params) * lam


def _penalty_torch(w, kind, lam, params):
    d = _penalty_dense(w, kind, lam, params)
    return (w * d).sum() - (w.detach() * d).sum()


class _Arm(torch.autograd.Function):
    """A 0 in the loss whose backward hands the upstream gradient to a :class:`_GradHook` and
    gives its tensors no gradient of their own."""

    @staticmethod
    def forward(ctx, hook, *tensors):
        ctx.hook = hook
        return tensors[0].new_zeros(())

    @staticmethod
    def backward(ctx, g):
        hook = ctx.hook
        nodes = [f[0] for f in ctx.next_functions]  # the tensors' (hook is no tensor)
        try:  # will this backward accumulate into every tensor's .grad?
            accumulates = all(torch._C._will_engine_execute_node(n) for n in nodes)
        except RuntimeError:  # torch.autograd.grad: gradients are returned, not accumulated
            accumulates = False
        if not accumulates or hook._removed:
            return (None,) + (((None,) * len(nodes)) if hook._removed else hook.fresh_grads(g))
        hook.pending.append(g)  # a tensor: no host sync on other devices
        # at the end of this backward: add what the post-accumulate hook did not (w got no
        # data gradient, so its hook never ran)
        torch.autograd.Variable._execution_engine.queue_callback(hook.flush)
        return (None,) * (1 + len(nodes))


class _GradHook:
    """A regularizer's gradient added in place, right after autograd accumulates ``w.grad``.

    ``term()`` returns a scalar 0 to add to the loss; when backward reaches it, the upstream
    gradient ``g`` is recorded, and the post-accumulate-grad hook on ``w`` then calls
    ``_add(w, g)`` (once per backward, with the recorded ``g`` summed; nothing when the term
    was not in the loss), so the result equals autograd's. If ``w`` receives no data gradient
    in that backward (its hook never runs), a callback at the end of the backward adds it
    instead; a backward that does not accumulate into every tensor of the term
    (``torch.autograd.grad``, ``backward(inputs=...)``) gets ``fresh_grads(g)`` returned as a
    plain Function would. ``remove()`` detaches it; the hook is not carried by
    ``copy.deepcopy``, pickling or ``state_dict`` (one is made per tensor when first asked).
    """

    def __init__(self, w: torch.Tensor, *others: torch.Tensor):
        for t in (w,) + others:
            if not (isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad):
                raise TypeError("w must be a leaf tensor that requires grad (a Parameter)")
        self.pending: list = []
        # the tensors hold the hook, not the other way round
        self._refs = [weakref.ref(t) for t in (w,) + others]
        self._removed = False
        self._handle = w.register_post_accumulate_grad_hook(self._apply)

    @property
    def w(self) -> torch.Tensor:
        return self._refs[0]()

    def term(self) -> torch.Tensor:
        return _Arm.apply(self, *(r() for r in self._refs))

    def flush(self) -> None:
        """Add what is still pending (end of a backward in which ``w`` got no data gradient)."""
        w = self.w
        if self.pending and w is not None and not self._removed:
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            self._apply(w)

    def _apply(self, w):
        if w.grad is None:  # the hook also runs when w got no gradient: flush adds it then
            return
        pending, self.pending = self.pending, []
        if pending:
            self._add(w, pending[0] if len(pending) == 1 else sum(pending))

    def remove(self) -> None:
        self._handle.remove()
        self._removed = True
        self.pending = []


class PenaltyGradHook(_GradHook):
    """``lam Omega'(w)`` of a closed form added to ``w.grad`` in place (:class:`_GradHook`).

    Measured on LeNet-300-100 (CPU time per step, 1 thread): a penalty Function whose backward
    returns a fresh ``lam Omega'(w)`` costs ~0.6 ms (the loop, a cold weight-sized buffer, and
    autograd adding it to the data gradient), the same loop adding into the accumulated gradient
    ~0.15 ms.
    """

    def __init__(self, w: torch.Tensor, kind: str, lam: float, params: dict):
        self.kind, self.params, self.lam = kind, dict(params), float(lam)
        self._args = _penalty_args(kind, params)
        super().__init__(w)

    def fresh_grads(self, g) -> tuple:
        """``(g lam Omega'(w),)`` as a new tensor (a backward that does not accumulate)."""
        w = self.w.detach()
        code, p0, p1 = self._args
        if not _is_cpu(w):
            return (_penalty_dense(w, self.kind, self.lam, self.params).mul_(g),)
        T = _np_type(w)
        out = torch.empty_like(w)
        _penalty_slope(_flat(w), code, T(self.lam * float(g)), T(p0), T(p1),
                       out.view(-1).numpy())
        return (out,)

    def _add(self, w, g):
        grad = w.grad
        if _is_cpu(w) and grad.is_contiguous() and grad.dtype == w.dtype in _NP_TYPES:
            # the loop itself: this runs for every weight tensor at every step
            T = _NP_TYPES[w.dtype]
            code, p0, p1 = self._args
            _penalty_slope_add(_flat(w), code, T(self.lam * float(g)), T(p0), T(p1),
                               grad.view(-1).numpy())
        elif _is_cpu(w):
            add_penalty_grad_(grad, w.detach(), self.kind, self.lam * float(g), self.params)
        else:
            with torch.no_grad():
                w.grad.add_(_penalty_dense(w, self.kind, self.lam, self.params) * g)


# id(w) -> its hook (a WeakKeyDictionary would compare tensors with == on a hash match)
_HOOKS: dict = {}


def _forget(key: int, hook) -> None:
    if _HOOKS.get(key) is hook:
        del _HOOKS[key]


def _hook_term(w: torch.Tensor, config: tuple, make) -> torch.Tensor:
    """The term of ``w``'s hook: one hook per tensor, made by ``make()`` at the first call and
    replaced when ``config`` changes; the hook lives as long as ``w`` (copies and pickles of
    ``w`` carry no hook and get their own)."""
    hook = _HOOKS.get(id(w))
    if hook is not None and hook.w is not w:
        hook = None
    if hook is None or hook.config != config:
        if hook is not None:
            hook.remove()
        hook = _HOOKS[id(w)] = make()
        hook.config = config
        weakref.finalize(w, _forget, id(w), hook)
    return hook.term()


def penalty_grad_term(w: torch.Tensor, kind: str, lam: float, params: dict) -> torch.Tensor:
    """``PenaltyGradHook(w, kind, lam, params).term()`` with one hook per tensor
    (:func:`_hook_term`)."""
    return _hook_term(w, ("penalty", kind, float(lam), dict(params)),
                      lambda: PenaltyGradHook(w, kind, lam, params))


@torch.no_grad()
def add_penalty_grad_(grad: torch.Tensor, w: torch.Tensor, kind: str, lam: float,
                      params: dict) -> torch.Tensor:
    """In place ``grad += lam Omega'(w)`` in one pass (e.g. from a post-accumulate-grad hook)."""
    code, p0, p1 = _penalty_args(kind, params)
    _check_inputs(grad=grad, w=w)
    if grad.shape != w.shape:
        raise ValueError(f"grad {tuple(grad.shape)} and w {tuple(w.shape)} must have one shape")
    if not (_is_cpu(grad, w) and grad.is_contiguous()):
        return grad.add_(_penalty_dense(w, kind, lam, params))
    T = _np_type(w)
    _penalty_slope_add(_flat(w), code, T(lam), T(p0), T(p1), grad.view(-1).numpy())
    return grad


@njit(inline="always", **_NUMBA)
def _eta_hat(kind, a, p0, p1):
    """``eta_hat(|w|)`` of the closed forms (``inf`` where ``Omega`` is flat)."""
    T = type(a)
    if kind == 0:
        return a
    if kind == 1:
        return a * (a + p0)
    if kind == 2:
        A = p0 * p1
        return A * a / (A - a) if a < A else T(np.inf)
    if a <= p1:
        return a
    return (p0 - T(1.0)) * p1 * a / (p0 * p1 - a) if a < p0 * p1 else T(np.inf)


@njit(**_NUMBA)
def _prox_loop(w, v, kind, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps):
    T = type(lr_lam)
    for i in range(w.size):
        e = _eta_hat(kind, abs(w[i]), p0, p1)
        r = lr_lam / (np.sqrt(v[i]) * inv_sqrt_bc2 + adam_eps)
        w[i] = w[i] * (e / (e + r)) if e < T(np.inf) else w[i]


@njit(**_NUMBA)
def _adaptive_prox(w, v, kind, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps):
    """In place ``w <- w eta_hat(w) / (eta_hat(w) + rho lam)``, ``rho = lr/(sqrt(v/bc2) + eps)``;
    one loop per kind (the branch on ``kind`` stays outside the loops)."""
    if kind == 0:
        _prox_loop(w, v, 0, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)
    elif kind == 1:
        _prox_loop(w, v, 1, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)
    elif kind == 2:
        _prox_loop(w, v, 2, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)
    else:
        _prox_loop(w, v, 3, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)


@torch.no_grad()
def adaptive_prox_(w: torch.Tensor, exp_avg_sq: torch.Tensor, kind: str, params: dict,
                   lr_lam: float, bias_correction2: float, adam_eps: float) -> torch.Tensor:
    """AdaProx's step after Adam's, in one pass over the weights (CPU, contiguous ``w``):
    ``w <- w eta / (eta + rho lam)`` with ``eta = eta_hat(w)`` of the closed form ``kind`` and
    Adam's own per-coordinate step ``rho = lr / (sqrt(v / bc2) + eps)``; ``lr_lam = lr * lam``
    must be > 0. Other devices: the same formula as torch expressions."""
    code, p0, p1 = _penalty_args(kind, params)
    _check_inputs(w=w, exp_avg_sq=exp_avg_sq)
    if not lr_lam > 0.0:
        raise ValueError(f"lr_lam must be > 0 (a zero step is the identity), got {lr_lam}")
    if w.shape != exp_avg_sq.shape:
        raise ValueError(f"exp_avg_sq {tuple(exp_avg_sq.shape)} must have w's shape "
                         f"{tuple(w.shape)}")
    inv = 1.0 / math.sqrt(bias_correction2)
    if not (_is_cpu(w, exp_avg_sq) and w.is_contiguous()):
        rho_lam = lr_lam / (exp_avg_sq.sqrt() * inv + adam_eps)
        eta = TORCH_FORMS[kind].eta(w, w.abs(), params)
        return w.mul_(torch.where(torch.isinf(eta), torch.ones_like(eta), eta / (eta + rho_lam)))
    T = _np_type(w)
    _adaptive_prox(w.view(-1).numpy(), _flat(exp_avg_sq), code, T(p0), T(p1), T(lr_lam), T(inv),
                   T(adam_eps))
    return w


# ---- eta-trick -----------------------------------------------------------------------------------

@njit(inline="always", **_NUMBA)
def _eta_grads(wi, epi, pi, lam, eps, c, quadratic, log_lam, g):
    """``(g w e^-p, g (2 lam eta / s^2 - 1/2 w^2 e^-p + D'(p)))``: the eta-trick's gradients in
    ``w`` (``lam w / eta``) and ``p`` with ``epi = e^p``, ``eta = lam e^p``, ``s = sqrt(eps^2 + 4
    eta) + eps`` (the LogSum dual's ``eta f'(eta) = 4 eta / s^2``) and the decay's slope ``D' =
    lam c / 2`` (linear) or ``c (p + log lam)`` (quadratic: the only use of ``p`` itself)."""
    T = type(lam)
    r = wi / epi
    e = lam * epi
    s = np.sqrt(eps * eps + T(4.0) * e) + eps
    d = c * (pi + log_lam) if quadratic else T(0.5) * lam * c
    return g * r, g * (T(2.0) * lam * e / (s * s) - T(0.5) * wi * r + d)


@njit(**_NUMBA)
def _eta_trick_grad_add(w, ep, p, lam, eps, c, quadratic, log_lam, g, gw, gp, add_p):
    """``gw += g dJ/dw``; ``gp = g dJ/dp`` (``+=`` when ``add_p``), one pass (:func:`_eta_grads`);
    ``p`` is read only for the quadratic decay (one loop per case: the branches stay outside)."""
    T = type(lam)
    if quadratic:
        if add_p:
            for i in range(w.size):
                a, b = _eta_grads(w[i], ep[i], p[i], lam, eps, c, True, log_lam, g)
                gw[i] += a
                gp[i] += b
        else:
            for i in range(w.size):
                a, b = _eta_grads(w[i], ep[i], p[i], lam, eps, c, True, log_lam, g)
                gw[i] += a
                gp[i] = b
    elif add_p:
        for i in range(w.size):
            a, b = _eta_grads(w[i], ep[i], T(0.0), lam, eps, c, False, log_lam, g)
            gw[i] += a
            gp[i] += b
    else:
        for i in range(w.size):
            a, b = _eta_grads(w[i], ep[i], T(0.0), lam, eps, c, False, log_lam, g)
            gw[i] += a
            gp[i] = b


def _eta_grad_args(w, lam, eps, c, quadratic, g):
    T = _np_type(w)
    return T(lam), T(eps), T(c), bool(quadratic), T(math.log(lam)), T(float(g))


def _eta_trick_value(w, p, lam, eps, c, quadratic):
    """The objective's value as torch expressions (``dualdrop.nn.penalty.logsum_dual``)."""
    eta = torch.exp(p) * lam
    value = 0.5 * lam * ((w * w / eta).sum() + logsum_dual(eta, eps).sum())
    if quadratic:
        le = p + math.log(lam)
        return value + 0.5 * c * (le * le).sum()
    return value + 0.5 * lam * c * p.sum()


class _EtaTrick(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, p, lam, eps, c, quadratic, need_value):
        ep = torch.exp(p.detach())                       # e^p: the only transcendental pass
        ctx.save_for_backward(w, p, ep)
        ctx.prm = (lam, eps, c, quadratic)
        if not need_value:
            return w.new_zeros(())
        with torch.no_grad():
            return _eta_trick_value(w, p, lam, eps, c, quadratic)

    @staticmethod
    def backward(ctx, g):
        w, p, ep = ctx.saved_tensors
        return _eta_fresh_grads(w, p, ep, *ctx.prm, g) + (None,) * 5


def _eta_fresh_grads(w, p, ep, lam, eps, c, quadratic, g):
    """``(g dJ/dw, g dJ/dp)`` as new tensors."""
    gw, gp = torch.zeros_like(w), torch.empty_like(p)
    _eta_trick_grad_add(_flat(w), _flat(ep), _flat(p), *_eta_grad_args(w, lam, eps, c,
                                                                        quadratic, g),
                        gw.view(-1).numpy(), gp.view(-1).numpy(), False)
    return gw, gp


class EtaTrickGradHook(_GradHook):
    """The eta-trick objective's gradients added in place (:class:`_GradHook`): ``g dJ/dw`` into
    ``w.grad``, ``g dJ/dp`` into ``p.grad`` (set when None), from one ``exp(p)`` pass into a
    buffer the hook keeps and one loop. Against :func:`eta_trick_objective`'s Function this
    saves the fresh weight gradient and autograd's addition of it to the data gradient (CPU,
    float32/float64, contiguous gradients; the Function is used otherwise)."""

    def __init__(self, w, p, lam: float, eps: float, c: float, quadratic: bool):
        _check_same_shape(w, p, "log_ratio")
        self.prm = (float(lam), float(eps), float(c), bool(quadratic))
        T = _np_type(w)
        self._loop_args = (T(lam), T(eps), T(c), bool(quadratic), T(math.log(lam)))
        self._ep = None
        super().__init__(w, p)

    @staticmethod
    def usable(w, p) -> bool:
        """Whether the hook applies to ``w`` and ``p`` (else the Function path)."""
        return (_is_cpu(w, p) and w.dtype == p.dtype and w.dtype in _NP_TYPES
                and w.is_contiguous() and p.is_contiguous() and w.is_leaf and p.is_leaf
                and w.requires_grad and p.requires_grad)

    def _exp_p(self, p):
        ep = self._ep
        if ep is None or ep.shape != p.shape or ep.dtype != p.dtype:
            ep = self._ep = torch.empty_like(p, memory_format=torch.contiguous_format)
        return torch.exp(p.detach(), out=ep)

    def fresh_grads(self, g) -> tuple:
        w, p = (r() for r in self._refs)
        return _eta_fresh_grads(w.detach(), p.detach(), self._exp_p(p), *self.prm, g)

    def _add(self, w, g):
        p = self._refs[1]()
        if not (w.grad.is_contiguous() and (p.grad is None or p.grad.is_contiguous())):
            gw, gp = self.fresh_grads(g)
            w.grad.add_(gw)
            p.grad = gp if p.grad is None else p.grad.add_(gp)
            return
        add_p = p.grad is not None
        if not add_p:
            p.grad = torch.empty_like(p, memory_format=torch.contiguous_format)
        ep = self._exp_p(p)
        _eta_trick_grad_add(_flat(w), ep.view(-1).numpy(), _flat(p), *self._loop_args,
                            self._loop_args[0].__class__(float(g)), w.grad.view(-1).numpy(),
                            p.grad.view(-1).numpy(), add_p)


def eta_trick_grad_term(w, log_ratio, lam: float, eps: float, c: float,
                        quadratic: bool = False) -> torch.Tensor:
    """A scalar 0 whose gradients are the eta-trick objective's (:func:`eta_trick_objective`),
    added in place into ``w.grad`` and ``log_ratio.grad`` by an :class:`EtaTrickGradHook` (one
    per weight tensor) when they are leaves on the CPU; the Function's otherwise."""
    _check_inputs(w=w, log_ratio=log_ratio)
    if not lam > 0.0:
        raise ValueError(f"lam must be > 0, got {lam}")
    if not EtaTrickGradHook.usable(w, log_ratio):
        return eta_trick_objective(w, log_ratio, lam, eps, c, quadratic, need_value=False)
    config = ("eta", id(log_ratio), float(lam), float(eps), float(c), bool(quadratic))
    return _hook_term(w, config,
                      lambda: EtaTrickGradHook(w, log_ratio, lam, eps, c, quadratic))


def eta_trick_objective(w, log_ratio, lam: float, eps: float, c: float,
                        quadratic: bool = False, need_value: bool = True) -> torch.Tensor:
    """The eta-trick's regularizer as ``dualdrop.nn.penalty`` defines it, with ``eta = lam
    e^p`` (``p = log_ratio``): ``lam/2 [sum w^2/eta + sum f(eta)] + D(p)``, ``f`` the LogSum dual
    and the decay ``D = lam c/2 sum p`` (linear) or ``c/2 sum (p + log lam)^2`` (quadratic). The
    gradients cost one torch exp pass forward and one loop backward; the value (log passes) is
    computed only when ``need_value``, else 0 with the same gradient."""
    _check_inputs(w=w, log_ratio=log_ratio)
    _check_same_shape(w, log_ratio, "log_ratio")
    if not lam > 0.0:
        raise ValueError(f"lam must be > 0, got {lam}")
    if not _is_cpu(w, log_ratio):
        v = _eta_trick_value(w, log_ratio, lam, eps, c, quadratic)
        return v if need_value else v - v.detach()
    return _EtaTrick.apply(w.contiguous(), log_ratio.contiguous(), float(lam), float(eps),
                           float(c), bool(quadratic), bool(need_value))
