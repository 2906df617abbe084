"""Test-only Functions of the fused paths: ``local_reparam_linear`` (local reparameterization of a
Linear layer in one Function, the reference the per-layer ``add_lr_noise`` path is checked
against) and ``penalty_grad`` (the penalty gradient as a plain Function, the reference of the
gradient hook)."""

import torch
import torch.nn.functional as F

from dualdrop.nn._noise import check_key, normal
from dualdrop.nn import _numba
from dualdrop.nn._numba import check_inputs, np_type, flat
from dualdrop.nn.methods.penalty.fused import _penalty_args, _penalty_slope, _penalty_torch

_VAR_EPS = 1e-8


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



def local_reparam_linear(x, w, b, var_w, key: int) -> torch.Tensor:
    """Pre-activations ``x w^T + b + sqrt(x^2 var_w^T + 1e-8) e``, ``e`` the counter-based normals
    of ``key`` in the output's shape (leading dimensions of ``x`` flattened, row-major)."""
    k = int(check_key(key))
    check_inputs(x=x, w=w, var_w=var_w)
    if w.dim() != 2 or var_w.shape != w.shape or x.shape[-1] != w.shape[1]:
        raise ValueError(f"need w and var_w of one shape (out, in) and x (..., in), got x "
                         f"{tuple(x.shape)}, w {tuple(w.shape)}, var_w {tuple(var_w.shape)}")
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1])
    if not _numba.is_cpu(x, w, var_w):
        e = normal((x2d.shape[0], w.shape[0]), k, dtype=x.dtype, device=x.device)
        out = F.linear(x2d, w, b) + torch.sqrt(F.linear(x2d * x2d, var_w) + _VAR_EPS) * e
    else:
        out = _LocalReparamLinear.apply(x2d.contiguous(), w, b, var_w, k)
    return out.view(*lead, w.shape[0])


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
        T = np_type(w)
        out = torch.empty_like(w)
        _penalty_slope(flat(w), kind, T(lam * float(g)), T(p0), T(p1), out.view(-1).numpy())
        return out, None, None, None, None


def penalty_grad(w, kind: str, lam: float, params: dict) -> torch.Tensor:
    """A scalar 0 whose gradient in ``w`` is ``lam Omega'(w)`` (closed form ``kind``): add it to
    the loss when the penalty's value is not needed (CPU; elsewhere the torch expression)."""
    code, p0, p1 = _penalty_args(kind, params)
    check_inputs(w=w)
    if not _numba.is_cpu(w):
        return _penalty_torch(w, kind, lam, params)
    return _PenaltyGrad.apply(w.contiguous(), code, float(lam), p0, p1)
