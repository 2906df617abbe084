"""The penalty and eta-trick methods fused: ``lam Omega'(w)`` and the eta-trick's gradients in
one numba loop, added into ``w.grad`` by a gradient hook (``dualdrop.nn._gradhook``).

``PenaltyGradHook(w, kind, lam, params).term()`` / ``penalty_grad_term`` / ``add_penalty_grad_``
    the penalty methods' ``lam Omega'(w)`` for the closed forms ``l1``, ``logsum``, ``mcp``,
    ``scad`` (docs/theory.md section 3): a scalar 0 in the loss that makes a post-accumulate-grad
    hook add ``g lam Omega'(w)`` into ``w.grad`` in place (one pass over hot memory); or the
    in-place add itself. Profiled cause of logsum's 1.44x (torch.profiler): ``sign``, ``abs``,
    ``add``, ``div_``, ``mul_`` and the autograd accumulation, 0.9 ms per step of a 2-3 ms step;
    the loop does the same in ~0.1 ms. The slopes and ``eta_hat`` are ``penalties.kernels``'
    scalar kernels, numbered by ``penalties.kernels.CLOSED_FORM_KINDS``.
``adaptive_prox_(w, exp_avg_sq, kind, params, lr_lam, bc2, eps)``
    AdaProx's prox ``w <- w eta_hat(w) / (eta_hat(w) + rho lam)`` with Adam's own step ``rho``,
    one loop.
``eta_trick_objective(w, p, lam, eps, c, quadratic)``
    the eta-trick's regularizer (``eta = lam e^p``): one exp pass forward, one loop backward.
``EtaTrickGradHook(w, p, lam, eps, c, quadratic).term()`` / ``eta_trick_grad_term``
    its gradients alone, as the penalty methods' hook: ``g dJ/dw`` added into ``w.grad`` and
    ``g dJ/dp`` written into ``p.grad`` in place by ``w``'s post-accumulate-grad hook.

On other devices each falls back to the torch forms (``torch_forms``) of the same formulas.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from dualdrop.nn._gradhook import GradHook, hook_term
from dualdrop.nn._numba import NP_TYPES, NUMBA, check_inputs, check_same_shape, flat, np_type
from dualdrop.nn import _numba
from dualdrop.nn.methods.penalty.torch_forms import TORCH_FORMS, logsum_dual
from penalties.kernels import L1, LOGSUM, MCP, SCAD

# ---- penalty methods: lam Omega'(w) in one loop ------------------------------------------------

#: the closed forms with a loop here, numbered as ``penalties.kernels`` numbers its kernels
PENALTY_KINDS = {"l1": L1, "logsum": LOGSUM, "mcp": MCP, "scad": SCAD}


@njit(inline="always", **NUMBA)
def _slope(kind, wi, p0, p1):
    """``Omega'(w)`` of the closed forms (0 at w = 0): l1 ``sign w``; logsum(eps = p0) ``sign w /
    (|w| + eps)``; mcp(a = p0, lam = p1) ``sign w max(0, 1 - |w|/(a lam))``; scad(a, lam)
    ``sign w`` for ``|w| <= lam``, ``sign w (a lam - |w|)/((a - 1) lam)`` up to ``a lam``, 0."""
    T = type(wi)
    a = abs(wi)
    sgn = T(1.0) if wi > T(0.0) else (T(-1.0) if wi < T(0.0) else T(0.0))
    if kind == L1:
        return sgn
    if kind == LOGSUM:
        return sgn / (a + p0)
    if kind == MCP:
        return sgn * max(T(0.0), T(1.0) - a / (p0 * p1))
    if a <= p1:
        return sgn
    return sgn * max(T(0.0), (p0 * p1 - a) / ((p0 - T(1.0)) * p1))


@njit(**NUMBA)
def _penalty_slope(w, kind, scale, p0, p1, out):
    """``out = scale Omega'(w)`` (one loop per kind: the branch on ``kind`` is outside)."""
    if kind == L1:
        for i in range(w.size):
            out[i] = scale * _slope(L1, w[i], p0, p1)
    elif kind == LOGSUM:
        for i in range(w.size):
            out[i] = scale * _slope(LOGSUM, w[i], p0, p1)
    elif kind == MCP:
        for i in range(w.size):
            out[i] = scale * _slope(MCP, w[i], p0, p1)
    else:
        for i in range(w.size):
            out[i] = scale * _slope(SCAD, w[i], p0, p1)


@njit(**NUMBA)
def _penalty_slope_add(w, kind, scale, p0, p1, grad):
    """``grad += scale Omega'(w)``."""
    if kind == L1:
        for i in range(w.size):
            grad[i] += scale * _slope(L1, w[i], p0, p1)
    elif kind == LOGSUM:
        for i in range(w.size):
            grad[i] += scale * _slope(LOGSUM, w[i], p0, p1)
    elif kind == MCP:
        for i in range(w.size):
            grad[i] += scale * _slope(MCP, w[i], p0, p1)
    else:
        for i in range(w.size):
            grad[i] += scale * _slope(SCAD, w[i], p0, p1)


def _penalty_args(kind: str, params: dict):
    if kind not in PENALTY_KINDS:
        raise ValueError(f"kind must be one of {sorted(PENALTY_KINDS)}, got {kind!r}; other "
                         "penalties go through dualdrop.nn.methods.penalty.method's generic path")
    names = {"l1": (), "logsum": ("eps",), "mcp": ("a", "lam"), "scad": ("a", "lam")}[kind]
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params of {kind!r} need {list(names)}, missing {missing}")
    vals = [float(params[n]) for n in names] + [0.0, 0.0]
    return PENALTY_KINDS[kind], vals[0], vals[1]


def _penalty_dense(w, kind, lam, params) -> torch.Tensor:
    """``lam Omega'(w)`` as torch expressions (other devices): the closed forms of
    ``dualdrop.nn.methods.penalty.method.TORCH_FORMS``."""
    wd = w.detach()
    return TORCH_FORMS[kind].deriv(wd, wd.abs(), params) * lam


def _penalty_torch(w, kind, lam, params):
    d = _penalty_dense(w, kind, lam, params)
    return (w * d).sum() - (w.detach() * d).sum()



class PenaltyGradHook(GradHook):
    """``lam Omega'(w)`` of a closed form added to ``w.grad`` in place (:class:`GradHook`).

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
        if not _numba.is_cpu(w):
            return (_penalty_dense(w, self.kind, self.lam, self.params).mul_(g),)
        T = np_type(w)
        out = torch.empty_like(w)
        _penalty_slope(flat(w), code, T(self.lam * float(g)), T(p0), T(p1),
                       out.view(-1).numpy())
        return (out,)

    def _add(self, w, g):
        grad = w.grad
        if _numba.is_cpu(w) and grad.is_contiguous() and grad.dtype == w.dtype in NP_TYPES:
            # the loop itself: this runs for every weight tensor at every step
            T = NP_TYPES[w.dtype]
            code, p0, p1 = self._args
            _penalty_slope_add(flat(w), code, T(self.lam * float(g)), T(p0), T(p1),
                               grad.view(-1).numpy())
        elif _numba.is_cpu(w):
            add_penalty_grad_(grad, w.detach(), self.kind, self.lam * float(g), self.params)
        else:
            with torch.no_grad():
                w.grad.add_(_penalty_dense(w, self.kind, self.lam, self.params) * g)


# id(w) -> its hook (a WeakKeyDictionary would compare tensors with == on a hash match)


def penalty_grad_term(w: torch.Tensor, kind: str, lam: float, params: dict) -> torch.Tensor:
    """``PenaltyGradHook(w, kind, lam, params).term()`` with one hook per tensor
    (:func:`hook_term`)."""
    return hook_term(w, ("penalty", kind, float(lam), dict(params)),
                      lambda: PenaltyGradHook(w, kind, lam, params))


@torch.no_grad()
def add_penalty_grad_(grad: torch.Tensor, w: torch.Tensor, kind: str, lam: float,
                      params: dict) -> torch.Tensor:
    """In place ``grad += lam Omega'(w)`` in one pass (e.g. from a post-accumulate-grad hook)."""
    code, p0, p1 = _penalty_args(kind, params)
    check_inputs(grad=grad, w=w)
    if grad.shape != w.shape:
        raise ValueError(f"grad {tuple(grad.shape)} and w {tuple(w.shape)} must have one shape")
    if not (_numba.is_cpu(grad, w) and grad.is_contiguous()):
        return grad.add_(_penalty_dense(w, kind, lam, params))
    T = np_type(w)
    _penalty_slope_add(flat(w), code, T(lam), T(p0), T(p1), grad.view(-1).numpy())
    return grad


@njit(inline="always", **NUMBA)
def _eta_hat(kind, a, p0, p1):
    """``eta_hat(|w|)`` of the closed forms (``inf`` where ``Omega`` is flat)."""
    T = type(a)
    if kind == L1:
        return a
    if kind == LOGSUM:
        return a * (a + p0)
    if kind == MCP:
        A = p0 * p1
        return A * a / (A - a) if a < A else T(np.inf)
    if a <= p1:
        return a
    return (p0 - T(1.0)) * p1 * a / (p0 * p1 - a) if a < p0 * p1 else T(np.inf)


@njit(**NUMBA)
def _prox_loop(w, v, kind, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps):
    T = type(lr_lam)
    for i in range(w.size):
        e = _eta_hat(kind, abs(w[i]), p0, p1)
        r = lr_lam / (np.sqrt(v[i]) * inv_sqrt_bc2 + adam_eps)
        w[i] = w[i] * (e / (e + r)) if e < T(np.inf) else w[i]


@njit(**NUMBA)
def _adaptive_prox(w, v, kind, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps):
    """In place ``w <- w eta_hat(w) / (eta_hat(w) + rho lam)``, ``rho = lr/(sqrt(v/bc2) + eps)``;
    one loop per kind (the branch on ``kind`` stays outside the loops)."""
    if kind == L1:
        _prox_loop(w, v, L1, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)
    elif kind == LOGSUM:
        _prox_loop(w, v, LOGSUM, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)
    elif kind == MCP:
        _prox_loop(w, v, MCP, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)
    else:
        _prox_loop(w, v, SCAD, p0, p1, lr_lam, inv_sqrt_bc2, adam_eps)


@torch.no_grad()
def adaptive_prox_(w: torch.Tensor, exp_avg_sq: torch.Tensor, kind: str, params: dict,
                   lr_lam: float, bias_correction2: float, adam_eps: float) -> torch.Tensor:
    """AdaProx's step after Adam's, in one pass over the weights (CPU, contiguous ``w``):
    ``w <- w eta / (eta + rho lam)`` with ``eta = eta_hat(w)`` of the closed form ``kind`` and
    Adam's own per-coordinate step ``rho = lr / (sqrt(v / bc2) + eps)``; ``lr_lam = lr * lam``
    must be > 0. Other devices: the same formula as torch expressions."""
    code, p0, p1 = _penalty_args(kind, params)
    check_inputs(w=w, exp_avg_sq=exp_avg_sq)
    if not lr_lam > 0.0:
        raise ValueError(f"lr_lam must be > 0 (a zero step is the identity), got {lr_lam}")
    if w.shape != exp_avg_sq.shape:
        raise ValueError(f"exp_avg_sq {tuple(exp_avg_sq.shape)} must have w's shape "
                         f"{tuple(w.shape)}")
    inv = 1.0 / math.sqrt(bias_correction2)
    if not (_numba.is_cpu(w, exp_avg_sq) and w.is_contiguous()):
        rho_lam = lr_lam / (exp_avg_sq.sqrt() * inv + adam_eps)
        eta = TORCH_FORMS[kind].eta(w, w.abs(), params)
        return w.mul_(torch.where(torch.isinf(eta), torch.ones_like(eta), eta / (eta + rho_lam)))
    T = np_type(w)
    _adaptive_prox(w.view(-1).numpy(), flat(exp_avg_sq), code, T(p0), T(p1), T(lr_lam), T(inv),
                   T(adam_eps))
    return w


# ---- eta-trick -----------------------------------------------------------------------------------

@njit(inline="always", **NUMBA)
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


@njit(**NUMBA)
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
    T = np_type(w)
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
    _eta_trick_grad_add(flat(w), flat(ep), flat(p), *_eta_grad_args(w, lam, eps, c,
                                                                        quadratic, g),
                        gw.view(-1).numpy(), gp.view(-1).numpy(), False)
    return gw, gp


class EtaTrickGradHook(GradHook):
    """The eta-trick objective's gradients added in place (:class:`GradHook`): ``g dJ/dw`` into
    ``w.grad``, ``g dJ/dp`` into ``p.grad`` (set when None), from one ``exp(p)`` pass into a
    buffer the hook keeps and one loop. Against :func:`eta_trick_objective`'s Function this
    saves the fresh weight gradient and autograd's addition of it to the data gradient (CPU,
    float32/float64, contiguous gradients; the Function is used otherwise)."""

    def __init__(self, w, p, lam: float, eps: float, c: float, quadratic: bool):
        check_same_shape(w, p, "log_ratio")
        self.prm = (float(lam), float(eps), float(c), bool(quadratic))
        T = np_type(w)
        self._loop_args = (T(lam), T(eps), T(c), bool(quadratic), T(math.log(lam)))
        self._ep = None
        super().__init__(w, p)

    @staticmethod
    def usable(w, p) -> bool:
        """Whether the hook applies to ``w`` and ``p`` (else the Function path)."""
        return (_numba.is_cpu(w, p) and w.dtype == p.dtype and w.dtype in NP_TYPES
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
        _eta_trick_grad_add(flat(w), ep.view(-1).numpy(), flat(p), *self._loop_args,
                            self._loop_args[0].__class__(float(g)), w.grad.view(-1).numpy(),
                            p.grad.view(-1).numpy(), add_p)


def eta_trick_grad_term(w, log_ratio, lam: float, eps: float, c: float,
                        quadratic: bool = False) -> torch.Tensor:
    """A scalar 0 whose gradients are the eta-trick objective's (:func:`eta_trick_objective`),
    added in place into ``w.grad`` and ``log_ratio.grad`` by an :class:`EtaTrickGradHook` (one
    per weight tensor) when they are leaves on the CPU; the Function's otherwise."""
    check_inputs(w=w, log_ratio=log_ratio)
    if not lam > 0.0:
        raise ValueError(f"lam must be > 0, got {lam}")
    if not EtaTrickGradHook.usable(w, log_ratio):
        return eta_trick_objective(w, log_ratio, lam, eps, c, quadratic, need_value=False)
    config = ("eta", id(log_ratio), float(lam), float(eps), float(c), bool(quadratic))
    return hook_term(w, config,
                      lambda: EtaTrickGradHook(w, log_ratio, lam, eps, c, quadratic))


def eta_trick_objective(w, log_ratio, lam: float, eps: float, c: float,
                        quadratic: bool = False, need_value: bool = True) -> torch.Tensor:
    """The eta-trick's regularizer as ``dualdrop.nn.methods.penalty.method`` defines it, with
    ``eta = lam e^p`` (``p = log_ratio``): ``lam/2 [sum w^2/eta + sum f(eta)] + D(p)``, ``f`` the LogSum dual
    and the decay ``D = lam c/2 sum p`` (linear) or ``c/2 sum (p + log lam)^2`` (quadratic). The
    gradients cost one torch exp pass forward and one loop backward; the value (log passes) is
    computed only when ``need_value``, else 0 with the same gradient."""
    check_inputs(w=w, log_ratio=log_ratio)
    check_same_shape(w, log_ratio, "log_ratio")
    if not lam > 0.0:
        raise ValueError(f"lam must be > 0, got {lam}")
    if not _numba.is_cpu(w, log_ratio):
        v = _eta_trick_value(w, log_ratio, lam, eps, c, quadratic)
        return v if need_value else v - v.detach()
    return _EtaTrick.apply(w.contiguous(), log_ratio.contiguous(), float(lam), float(eps),
                           float(c), bool(quadratic), bool(need_value))
