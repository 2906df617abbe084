"""Variational dropout fused: the KL, the weight noise and local reparameterization's
variance in one numba loop each way (CPU), torch elsewhere.

``vardrop_noise(w, log_alpha, key, clip)`` -> ``(w (1 + sqrt(a) e), sum KL)``
    Molchanov, Ashukha, Vetrov, "Variational dropout sparsifies deep neural networks" (2017):
    ``a = exp(clamp(log a, -clip, clip))``, ``e`` standard normal (Box-Muller over the
    counter-based uniforms). Second output: the KL approximation's sum (its eq. 14), value
    computed only when ``need_kl_value`` (it needs a log pass), gradient always exact.
``kl_sum(log_alpha, clip, need_value)``
    the same KL alone, for ``log a`` a parameter (torch, any dtype and device: the gradient
    comes from the sigmoids the value needs; the one home of the summed KL's autograd).
``ar_variance_kl(w, log_sigma2, clip)`` -> ``(sigma^2, sum KL)``
    vardrop-lr-ar's weight variance ``exp(log sigma^2)`` and the KL at ``log a = log sigma^2 -
    log(w^2 + 1e-8)``, the chain rule to ``w`` and ``log sigma^2`` fused into the backward.
``lr_variance_kl(w, log_alpha, clip)`` -> ``(exp(clamp(log a)) w^2, sum KL)``
    the weight variance of local reparameterization and the KL from one ``exp`` pass.
``add_lr_noise(out, var, key)``
    ``out + sqrt(var + 1e-8) e`` with counter-based ``e`` (Kingma, Salimans, Welling,
    "Variational dropout and the local reparameterization trick", 2015): the noise on a layer's
    output whose variance the caller computed (any linear map).

The KL constants are ``penalties.dropout``'s (``VD_K1..VD_K3``), the one copy.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from dualdrop.nn import _numba
from dualdrop.nn._noise import check_key, normal
from dualdrop.nn._numba import NUMBA, check_inputs, check_same_shape, flat, np_type
from penalties.dropout import VD_K1 as K1, VD_K2 as K2, VD_K3 as K3

_VAR_EPS = 1e-8  # inside sqrt(var + eps) of the local reparameterization
_AR_EPS = 1e-8   # inside log(w^2 + eps) of the additive reparameterization

# ---- variational dropout: KL and noise ---------------------------------------------------------

@njit(inline="always", **NUMBA)
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
    """``sum kl(clamp(x, -clip, clip))`` (the value only when asked) with a hand-fused gradient,
    computed in the forward from the two sigmoids the value needs (one pass, no softplus): the
    one home of the summed KL's autograd, for any dtype and device.

    With ``s1 = sigmoid(k2 + k3 la)`` and ``s2 = sigmoid(la)``: ``KL = k1 - k1 s1 - 1/2 log s2``
    and ``dKL/dla = -k1 k3 s1 (1 - s1) - 1/2 (1 - s2)``; zero gradient where the clip is active.
    """

    @staticmethod
    def forward(ctx, x, clip, need_value=True):
        # in-place arithmetic: this runs on every weight at every step (see the benchmark)
        la = x.clamp(-clip, clip)
        s1 = torch.sigmoid_(la.mul(K3).add_(K2))
        s2 = torch.sigmoid(la)
        if need_value:
            value = K1 * (x.numel() - s1.sum()) - 0.5 * torch.log(s2).sum()
        else:  # gradient only: skip the log pass
            value = x.new_zeros(())
        grad = torch.addcmul(s1, s1, s1, value=-1.0).mul_(-K1 * K3)  # -k1 k3 s1 (1 - s1)
        grad.add_(s2, alpha=0.5).sub_(0.5)                           # - 1/2 (1 - s2)
        grad.masked_fill_(la != x, 0.0)                              # clipped: no gradient
        ctx.save_for_backward(grad)
        return value

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return g * grad, None, None


def _check_clip(clip) -> float:
    clip = float(clip)
    if not clip > 0.0:
        raise ValueError(f"clip must be > 0, got {clip}")
    return clip


def kl_sum(log_alpha: torch.Tensor, clip: float, need_value: bool = True) -> torch.Tensor:
    """``sum KL(clamp(log_alpha, -clip, clip))`` of the log-uniform prior (Molchanov et al. 2017,
    eq. 14); with ``need_value=False`` the value is 0 and the gradient exact. Any floating
    dtype and device."""
    clip = _check_clip(clip)
    if not isinstance(log_alpha, torch.Tensor) or not log_alpha.is_floating_point():
        raise TypeError(f"log_alpha must be a floating-point torch.Tensor, got "
                        f"{getattr(log_alpha, 'dtype', type(log_alpha).__name__)}")
    return _KLSum.apply(log_alpha, clip, bool(need_value))


@njit(**NUMBA)
def _ar_log_arg(w, out):
    """``out = w^2 + 1e-8`` (the argument of the additive reparameterization's log)."""
    T = type(w[0])
    for i in range(w.size):
        out[i] = w[i] * w[i] + T(_AR_EPS)


@njit(**NUMBA)
def _ar_log_alpha(ls2, log_t, mk3):
    """In place ``log_t <- log a = ls2 - log_t`` and ``mk3 = -k3 log a`` (exponentiated next)."""
    T = type(ls2[0])
    for i in range(ls2.size):
        la = ls2[i] - log_t[i]
        log_t[i] = la
        mk3[i] = T(-K3) * la


@njit(**NUMBA)
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
        T = np_type(w)
        la, e_k3 = torch.empty_like(w), torch.empty_like(w)
        _ar_log_arg(flat(w), la.view(-1).numpy())
        _ar_log_alpha(flat(ls2), la.log_().view(-1).numpy(), e_k3.view(-1).numpy())
        gw, gls = torch.empty_like(w), torch.empty_like(ls2)
        _ar_backward(flat(g_var), flat(w), flat(var_w), la.view(-1).numpy(),
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
    check_inputs(w=w, log_sigma2=log_sigma2)
    check_same_shape(w, log_sigma2, "log_sigma2")
    if not _numba.is_cpu(w, log_sigma2):
        v = _kl_value(log_sigma2 - torch.log(w * w + _AR_EPS), clip)
        return torch.exp(log_sigma2), (v if need_kl_value else v - v.detach())
    return _ARVarianceKL.apply(w.contiguous(), log_sigma2.contiguous(), clip,
                               bool(need_kl_value))


@njit(**NUMBA)
def _vd_forward(w, h, eps, lo, hi, out):
    for i in range(w.size):
        sd = min(max(h[i], lo), hi)
        out[i] = w[i] + sd * w[i] * eps[i]


@njit(**NUMBA)
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
        T = np_type(w)
        h = torch.mul(la.detach(), 0.5).exp_()           # sqrt(a) before the clip
        eps = normal(w.shape, int(key), dtype=w.dtype)
        out = torch.empty_like(w)
        lo, hi = T(math.exp(-0.5 * clip)), T(math.exp(0.5 * clip))
        _vd_forward(flat(w), flat(h), flat(eps), lo, hi, out.view(-1).numpy())
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
        _vd_backward(g.contiguous().view(-1).numpy(), flat(w), flat(la), flat(h), flat(eps),
                     ex, ctx.clip, ctx.lo, ctx.hi, gkl, gw.view(-1).numpy(),
                     gla.view(-1).numpy())
        return gw, gla, None, None, None


def vardrop_noise(w, log_alpha, key: int, clip: float, need_kl_value: bool = True):
    """``(w (1 + sqrt(a) e), sum KL)`` with ``a = exp(clamp(log_alpha, -clip, clip))`` and ``e``
    the counter-based normals of ``key`` (:func:`dualdrop.nn._noise.normal` gives the same
    numbers); the KL output's value is 0 unless ``need_kl_value``, its gradient always exact."""
    k = check_key(key)
    clip = _check_clip(clip)
    check_inputs(w=w, log_alpha=log_alpha)
    check_same_shape(w, log_alpha, "log_alpha")
    if not _numba.is_cpu(w, log_alpha):
        e = normal(w.shape, int(k), dtype=w.dtype, device=w.device)
        out = w + torch.exp(0.5 * log_alpha.clamp(-clip, clip)) * w * e
        return out, kl_sum(log_alpha, clip, need_kl_value)
    return _VarDropNoise.apply(w.contiguous(), log_alpha.contiguous(), k, clip,
                               bool(need_kl_value))


# ---- local reparameterization ------------------------------------------------------------------

@njit(**NUMBA)
def _lrv_forward(w, e, lo, hi, out):
    for i in range(w.size):
        out[i] = min(max(e[i], lo), hi) * w[i] * w[i]


@njit(**NUMBA)
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
        T = np_type(w)
        e = torch.exp(la.detach())
        lo, hi = T(math.exp(-clip)), T(math.exp(clip))
        out = torch.empty_like(w)
        _lrv_forward(flat(w), flat(e), lo, hi, out.view(-1).numpy())
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
        _lrv_backward(flat(g), flat(w), flat(la), flat(e), ex, *ctx.prm, gkl,
                      gw.view(-1).numpy(), gla.view(-1).numpy())
        return gw, gla, None, None


def lr_variance_kl(w, log_alpha, clip: float, need_kl_value: bool = True):
    """``(exp(clamp(log_alpha, -clip, clip)) w^2, sum KL)``: the weight variance of vardrop-lr
    and its KL term from one ``exp`` pass (the KL's value only when ``need_kl_value``)."""
    clip = _check_clip(clip)
    check_inputs(w=w, log_alpha=log_alpha)
    check_same_shape(w, log_alpha, "log_alpha")
    if not _numba.is_cpu(w, log_alpha):
        return (torch.exp(log_alpha.clamp(-clip, clip)) * w * w,
                kl_sum(log_alpha, clip, need_kl_value))
    return _LRVarianceKL.apply(w.contiguous(), log_alpha.contiguous(), clip, bool(need_kl_value))



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
    k = int(check_key(key))
    if out.shape != var.shape:
        raise ValueError(f"out {tuple(out.shape)} and var {tuple(var.shape)} must have one shape")
    e = normal(out.shape, k, dtype=out.dtype, device=out.device)
    return _AddLRNoise.apply(out, var, e)
