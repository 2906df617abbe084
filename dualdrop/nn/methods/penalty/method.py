"""Penalty methods of the eta-trick duality (LeJeune, Javadi, Baraniuk 2021) on network weights.

All of them hold a separable ``penalties`` object ``P`` (LogSum(eps) for the four named
methods) and a strength ``lam``; the penalty is ``lam * sum_j Omega(w_j)`` over the weights of the
sparsified weight tensors (biases excluded), added to the mean-over-batch data loss as is (not
divided by ``n_train``: the paper's convention, ``lam = 1e-3``). Every method only transforms
the weight (its test-time mask), so it acts on any weight tensor.

``logsum`` / ``penalty:<name>`` (``algorithm="gradient"``)
    gradient descent on ``L + lam sum Omega(w)``. ``Omega`` and ``Omega'`` come from ``P`` through
    a custom autograd function: forward returns ``lam sum Omega(w)``, backward
    ``lam Omega'(w) = lam w / eta_hat(w)``. The tabulated penalties (``vardrop``,
    ``vardrop_exact``, ``hardconcrete``) are interpolated in torch on the weight's device
    (``dualdrop.nn._table``), except float64 CPU weights, which keep the exact kernel. Otherwise
    evaluation runs on the CPU (numba loop over
    ``penalties.kernels`` when ``P.kernel_spec()`` exists, else ``P.omega``/``P.derivative`` in
    numpy); CUDA weights are copied to the host and back each step. For the closed forms
    ``l1``, ``logsum``, ``mcp`` and ``scad``, when only the gradient is asked (``value=False``,
    as the training loop does), ``lam Omega'(w)`` is added into ``w.grad`` in place by one loop
    (``fused.penalty_grad_term``); ``adaprox``'s prox is one loop as well.
``adatikhonov`` (``algorithm="adatikhonov"``)
    gradient descent on ``L + lam/2 sum w^2 / eta`` with ``eta = eta_hat(w)`` recomputed from
    the current weights at every forward and held fixed (no state is needed: the weights only
    change at optimizer steps). Its gradient equals LogSum's, ``lam w / eta_hat(w)``; the value
    differs (``1/2 w Omega'(w)`` instead of ``Omega(w)``).
``adaprox`` (``algorithm="adaprox"``)
    no regularizer in the loss; after every optimizer step the prox of the adaptive Tikhonov
    term, ``w <- w eta / (eta + rho lam)`` with ``eta = eta_hat(w)`` and the optimizer's actual
    per-coordinate step ``rho = lr / (sqrt(v_hat) + eps)`` for Adam/AdamW (``rho = lr`` for
    optimizers without second moments, e.g. SGD).
``eta-trick`` (the paper's released code: its parametrization, init and decay; its dual is
``dual="released"``)
    learnable ``p = log(eta/lam)`` per weight, ``eta = lam exp(p)``, joint gradient descent on

        J = L + lam/2 [sum w^2/eta + sum f(eta) + eta_weight_decay sum p]

    with the LogSum dual ``f(eta) = 2 log((s + eps)/(2 eps)) - 4 eta/(s + eps)^2``,
    ``s = sqrt(eps^2 + 4 eta)`` (shifted so that f(0+) = 0; ``min_eta`` of the first two sums is
    ``2 sum log(1 + |w|/eps)``), ``p`` initialised at 5, ``eta_weight_decay = 1e-3``. The last
    term is linear in ``p``: its gradient is the constant ``lam eta_weight_decay / 2``, a steady
    push of every eta down. The keep ratio is ``alpha = eta/(eta + lam) = sigmoid(p)`` and a weight
    is pruned when ``alpha < tol`` (``prune_rule="eta"``).

    ``dual="released"`` uses the dual exactly as the released code's ``LogSumDualPenalty``
    computes it, ``2 [log((s + eps)/2) - (s - eps)^2/(4 eta)]``: the factor 2 also multiplies the
    second term, so (with ``(s - eps)^2/(4 eta) = 4 eta/(s + eps)^2``) it is ``f(eta) - 4
    eta/(s + eps)^2`` up to a constant; its ``eta f'`` is ``16 eta^2/((s + eps)^3 s)``. That is not
    LogSum's dual: ``min_eta [w^2/eta + f(eta)]`` grows like ``|w|^{3/2}`` near 0 instead of
    ``2 log(1 + |w|/eps)`` (0.013 instead of 0.049 at ``|w| = 0.05``, minimizer eta 0.30 instead of
    0.10), so the surviving weights are shrunk about 3x less and the sparsity comes from the
    decay term alone. ``dual="logsum"`` (default) is the exact dual above. On MNIST
    (benchmarks/RESULTS.md) the released dual reproduces the paper's eta-trick row (2.16% test
    error at 0.0513 nonzero): 2.23% +- 0.08 at 0.049 over three seeds (seed 0: 2.17% at 0.0513);
    the exact dual ends at 2.52% +- 0.05 at 0.049.

    ``decay="quadratic"`` is the earlier dualdrop form ``lam/2 [sum w^2/eta + sum f(eta)] +
    eta_weight_decay/2 sum (log eta)^2`` (with ``eta_init="eta_hat"``: start at
    ``eta = eta_hat(w)``). What that decay does (derived, and seen on MNIST,
    benchmarks/RESULTS.md): for a weight at 0, ``dJ/dlog eta = lam/2 eta f'(eta) + decay log eta``
    with ``eta f'(eta) = 4 eta/s^2``, so with ``lam = decay = 1e-3, eps = 2`` eta settles at the
    root ``eta = 0.922`` instead of following ``eta_hat(w) -> 0``: near 0 the effective penalty is a
    ridge, no sparsity-inducing pull (25% of the weights survive 200 epochs).

Groups (``granularity="neuron"`` / ``"head"``, docs/theory.md section 6): every formula above
with the group norm ``n_g = ||w_g||_2`` for ``|w|``: ``lam sum_g Omega(n_g)`` (its gradient
``lam Omega'(n_g) w_g / n_g``, 0 at a zero group) and ``lam/2 sum_g n_g^2/eta_hat(n_g)`` through
torch autograd on the norms (``_penalty_value_and_grad`` on ``n``; not the fused per-weight
loops), AdaProx's prox on each group's norm (:func:`block_prox_`), the eta-trick with one ``p``
per group, and the test-time rule on ``n_g``.

Test time (all of them): the keep ratio ``alpha = eta_hat(w)/(eta_hat(w) + lam)``; a weight is
pruned when ``alpha < tol``, i.e. ``eta_hat(|w|) < lam tol/(1 - tol)``. For penalties whose
``eta_hat`` is nondecreasing in ``|w|`` (all catalog ones) this is ``|w| < t*`` with ``t*`` found
once by bisection on ``P.eta_hat``; otherwise ``P.keep_ratio`` is evaluated on every call.
``eta-trick`` prunes on its learned ``eta`` by default (``prune_rule="eta"``,
``alpha = sigmoid(p)``); ``prune_rule="eta_hat"`` uses the weight's ``eta_hat`` as the other
methods do.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from dualdrop.nn._base import Method, WeightState, check_choice, check_float, check_lam, check_tol
from dualdrop.nn import _numba, _table
from dualdrop.nn.methods.penalty import catalog_loops as _kernels, fused
from dualdrop.nn.methods.penalty.torch_forms import (  # noqa: F401 (logsum_dual: public here)
    TORCH_FORMS, abs_threshold, logsum_dual, torch_form)

_ALGORITHMS = ("gradient", "adatikhonov", "adaprox")
_HELP = {
    "lr": "Adam learning rate",
    "lam": "penalty strength lam on the mean data loss (the paper: 1e-3)",
    "eps": "LogSum's eps in log(1 + |w|/eps)",
    "tol": "test time: prune a weight whose keep ratio alpha = eta/(eta + lam) is below tol",
    "eta_weight_decay": "strength of the decay term on p = log(eta/lam) (see decay)",
    "decay": "'linear': lam/2 eta_weight_decay sum p (released code); 'quadratic': "
             "eta_weight_decay/2 sum (log eta)^2",
    "init_log_ratio": "initial p = log(eta/lam) (eta_init='constant')",
    "eta_init": "'constant': p = init_log_ratio everywhere (released); 'eta_hat': eta = eta_hat(w)",
    "prune_rule": "'eta': alpha = sigmoid(p) (learned eta); 'eta_hat': alpha from eta_hat(w)",
    "dual": "'logsum': LogSum's exact dual f; 'released': the released code's expression "
            "(twice the -(s - eps)^2/(4 eta) term; not LogSum's dual)",
    "penalty_params": "constructor arguments of the catalog penalty (a dict)",
    "algorithm": "'gradient' (penalty in the loss), 'adatikhonov' or 'adaprox'",
}


def _import_penalties():
    try:
        import penalties
    except ImportError as exc:  # pragma: no cover - penalties ships with dualdrop
        raise ImportError("the penalty methods need the 'penalties' package (part of dualdrop); "
                          "install dualdrop with pip install -e .") from exc
    return penalties


def make_penalty(name: str, params: dict):
    """``penalties.get(name, **params)`` with errors that name the argument to fix."""
    penalties = _import_penalties()
    if not isinstance(params, dict):
        raise TypeError(f"penalty_params must be a dict of the penalty's constructor arguments, "
                        f"got {type(params).__name__}")
    try:
        P = penalties.get(name, **params)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"cannot build penalty {name!r} with penalty_params={params!r}: {exc}") \
            from exc
    if not getattr(P, "is_separable", True):
        raise ValueError(f"penalty {name!r} is not separable (e.g. hard_threshold, an l0 ball); "
                         "use method 'magnitude' (gradual magnitude pruning) instead")
    return P



# ---- differentiable penalty from the numpy/numba penalties object ------------------------------

def _penalty_value_and_grad(layer, w: torch.Tensor, tikhonov: bool, need_value: bool = True):
    """(value, Omega'(w)) of ``sum Omega(w)`` (or the Tikhonov value); value 0.0 when not
    ``need_value`` (the gradient alone is much cheaper: no log/table evaluation per weight)."""
    form = getattr(layer, "_torch_form", None)
    if form is not None:
        wd = w.detach()
        a = wd.abs()
        prm = layer.penalty.params
        d = TORCH_FORMS[form].deriv(wd, a, prm)
        if not need_value:
            value = 0.0
        elif tikhonov:
            value = 0.5 * (wd * d).sum()
        else:
            value = TORCH_FORMS[form].omega(wd, a, prm).sum()
        return value, d
    table = _table.of_kernel(layer.penalty, layer._kernel, w)
    if table is not None:  # tabulated penalty: torch interpolation, no host round trip
        wd = w.detach()
        if need_value and not tikhonov:
            om, d = table.derivative(wd, with_omega=True)
            value = om.sum()
        else:
            d = table.derivative(wd)
            value = 0.5 * (wd.to(d.dtype) * d).sum() if need_value else 0.0
        return value, d.to(w.dtype)
    wc = w.detach()
    if wc.device.type != "cpu":
        wc = wc.cpu()
    if wc.dtype not in (torch.float32, torch.float64):  # bfloat16 / half: no NumPy type
        wc = wc.to(torch.float32)
    wc = wc.contiguous()
    if layer._kernel is not None:
        code, params = layer._kernel
        grad = torch.empty_like(wc)
        mode = (_kernels.VALUE_NONE if not need_value else
                _kernels.VALUE_TIKHONOV if tikhonov else _kernels.VALUE_OMEGA)
        value = _kernels.value_and_derivative(code, params, wc.view(-1).numpy(),
                                              grad.view(-1).numpy(), mode)
    else:
        w64 = wc.to(torch.float64).numpy()
        d = np.asarray(layer.penalty.derivative(w64), dtype=np.float64)
        if not need_value:
            value = 0.0
        elif tikhonov:
            value = float(0.5 * np.sum(w64 * d))
        else:
            value = float(np.sum(layer.penalty.omega(w64)))
        grad = torch.from_numpy(d).to(wc.dtype)
    return value, grad.to(device=w.device, dtype=w.dtype)


class _PenaltyFunction(torch.autograd.Function):
    """``lam * sum Omega(w)`` (or ``lam/2 sum w^2/eta_hat(w)``) with gradient ``lam Omega'(w)``;
    the forward value is 0 when ``need_value`` is False (gradient only)."""

    @staticmethod
    def forward(ctx, w, layer, tikhonov, need_value=True):
        value, grad = _penalty_value_and_grad(layer, w, tikhonov, need_value)
        ctx.save_for_backward(grad.mul_(layer.lam_eff))  # lam Omega'(w), in place: a fresh tensor
        if isinstance(value, torch.Tensor):
            return (value * layer.lam_eff).to(w.dtype)
        return w.new_tensor(layer.lam_eff * value)

    @staticmethod
    def backward(ctx, g):
        (lam_grad,) = ctx.saved_tensors
        return lam_grad * g, None, None, None


def penalty_value(layer, w: torch.Tensor, tikhonov: bool = False,
                  need_value: bool = True) -> torch.Tensor:
    """Differentiable ``lam * sum Omega(w)`` of a penalty layer (public for tests/gradcheck);
    with ``need_value=False`` the same gradient and a 0 value."""
    return _PenaltyFunction.apply(w, layer, tikhonov, need_value)



class _EtaTrickObjective(torch.autograd.Function):
    """The eta-trick regularizer and its hand-derived gradients in one pass. With
    ``eta = lam e^p``, ``s = sqrt(eps^2 + 4 eta) + eps``, ``f'(eta) = 4/s^2``:
    ``dJ/dw = lam w/eta`` and ``dJ/dp = lam/2 (4 eta/s^2 - w^2/eta) + D'(p)`` with the decay term
    ``D = lam c/2 sum p`` (linear, ``D' = lam c/2``) or ``c/2 sum (p + log lam)^2`` (quadratic).
    ``released``: the released code's dual ``f - 4 eta/s^2``, whose ``eta f'`` is
    ``4 eta/s^2 * 4 eta/(s (s - eps))``."""

    @staticmethod
    def forward(ctx, w, p, lam, eps, c, quadratic, need_value=True, released=False):
        eta = torch.exp(p).mul_(lam)
        inv = torch.exp(-p).mul_(1.0 / lam)
        s = torch.sqrt(eta.mul(4.0).add_(eps * eps)).add_(eps)
        # released dual: eta f' = r * q, q = 4 eta/(s (s - eps)) (no cancellation: s - eps >= eps)
        q = eta.mul(4.0).div_(s * (s - eps)) if released else None
        r = eta.mul_(4.0).div_(s * s)                      # 4 eta / s^2
        wi = w * inv                                       # w / eta
        w2i = wi * w                                       # w^2 / eta
        log_eta = p + math.log(lam) if quadratic else None
        if need_value:
            f = torch.log(s.mul_(0.5 / eps)).mul_(2.0).sub_(r)  # f(eta), f(0+) = 0
            if released:
                f.sub_(r)
            value = 0.5 * lam * (w2i.sum() + f.sum())
            if quadratic:
                value = value + 0.5 * c * (log_eta * log_eta).sum()
            else:
                value = value + 0.5 * lam * c * p.sum()
        else:
            value = w.new_zeros(())
        grad_w = wi.mul_(lam)
        grad_p = (r.mul_(q) if released else r).sub_(w2i).mul_(0.5 * lam)
        if c:
            if quadratic:
                grad_p.add_(log_eta, alpha=c)
            else:
                grad_p.add_(0.5 * lam * c)
        ctx.save_for_backward(grad_w, grad_p)
        return value

    @staticmethod
    def backward(ctx, g):
        grad_w, grad_p = ctx.saved_tensors
        return g * grad_w, g * grad_p, None, None, None, None, None, None


# ---- the per-weight state ------------------------------------------------------------------------

class PenaltyState(WeightState):
    """A separable penalty ``P`` on one weight tensor (and the eta-trick's ``log_ratio`` p)."""

    # the eta-trick once learned log(eta) itself: p = log(eta) - log(lam)
    legacy_names = {"log_eta": ("log_ratio", lambda st, v: v - math.log(st.lam))}

    def __init__(self, method, weight, *, lam, tol, penalty, algorithm, eps=None,
                 eta_weight_decay=0.0, decay="linear", init_log_ratio=5.0, eta_init="constant",
                 prune_rule="eta_hat", dual="logsum",
                 penalty_params=None, use_torch_form=True, groups=None):
        super().__init__(method)
        self.groups = groups
        self.lam, self.algorithm, self.penalty = lam, algorithm, penalty
        self.eps, self.eta_weight_decay, self.decay = eps, eta_weight_decay, decay
        self.prune_rule, self.dual = prune_rule, dual
        self._kernel = None
        spec = penalty.kernel_spec() if hasattr(penalty, "kernel_spec") else None
        if _kernels.AVAILABLE and spec is not None:
            code, params = spec
            self._kernel = (int(code), np.ascontiguousarray(params, dtype=np.float64))
        self._torch_form = torch_form(penalty) if use_torch_form else None
        self.set_tol(tol)
        if algorithm == "eta":
            w = weight.detach()
            if groups is not None:  # one p per group, of the group's norm
                w = groups.norm(w)
            if eta_init == "eta_hat":
                le = np.log(self._eta_hat(w) / lam)
                p = torch.from_numpy(np.clip(le, -20.0, 20.0)).to(w)
            else:
                p = torch.full_like(w, init_log_ratio)
            self.log_ratio = nn.Parameter(p)

    @torch.no_grad()
    def _eta_hat(self, w):
        w64 = np.ascontiguousarray(w.cpu().to(torch.float64).numpy())
        if self._kernel is not None:  # serial: see dualdrop.nn._kernels
            eta = np.empty(w64.size)
            _kernels.eta_hat_map(self._kernel[0], self._kernel[1], w64.ravel(), eta)
            return eta.reshape(w64.shape)
        return np.asarray(self.penalty.eta_hat(w64), dtype=np.float64)

    @property
    def lam_eff(self) -> float:
        """The strength in use: ``lam`` times the multiplier ``strength`` (1 unless a target
        density drives it, ``dualdrop.nn.density``)."""
        return self.lam * self.strength

    def set_tol(self, tol: float) -> None:
        """Test-time pruning tolerance on the keep ratio (``alpha < tol`` is pruned)."""
        self.tol = check_tol(tol)
        # eta_hat(|w|) < c  <=>  alpha < tol
        self._eta_cut = self.lam_eff * self.tol / (1.0 - self.tol)
        self._abs_cut = abs_threshold(self.penalty, self._eta_cut)

    def keep_mask(self, w) -> torch.Tensor:
        if self.groups is not None:  # the rule on the group norms, for every weight of a group
            return self.groups.expand(self._unit_keep(self.groups.norm(w.detach())), w)
        return self._unit_keep(w)

    def _unit_keep(self, w) -> torch.Tensor:
        """The test-time rule on the units: weights, or group norms (same shape as ``p``)."""
        if self.algorithm == "eta" and self.prune_rule == "eta":
            # alpha = sigmoid(p) >= tol
            return self.log_ratio >= math.log(self.tol / (1.0 - self.tol))
        if self._abs_cut is not None:
            return w.abs() >= self._abs_cut
        w64 = w.detach().cpu().to(torch.float64).numpy()
        alpha = np.asarray(self.penalty.keep_ratio(w64, self.lam_eff))
        return torch.from_numpy(alpha >= self.tol).to(w.device)

    def keep_score(self, w) -> torch.Tensor:
        # the keep ratio is monotone in |w| or ||w_g|| (eta_hat grows with it), or p = logit(alpha)
        if self.algorithm == "eta" and self.prune_rule == "eta":
            return self.log_ratio.detach()
        return self.unit_magnitude(w)

    def _fused_kind(self, w):
        """The closed form of ``dualdrop.nn.methods.<family>.fused`` for ``w``, or None."""

        kind = self._torch_form
        if kind in fused.PENALTY_KINDS and _numba.active(w) and w.is_leaf and w.requires_grad:
            return kind
        return None

    def regularizer_term(self, w, n_train, value=True):
        if self.groups is not None:
            return self._group_term(w, value)
        if self.algorithm in ("gradient", "adatikhonov"):
            kind = None if value else self._fused_kind(w)
            if kind is not None:  # the gradient alone, added in place into w.grad (one loop)

                return fused.penalty_grad_term(w, kind, self.lam_eff, self.penalty.params)
            return penalty_value(self, w, self.algorithm == "adatikhonov", value)
        if self.algorithm == "eta":

            # the fused loop has the exact LogSum dual only; dual="released" takes the torch path
            if (self.dual == "logsum" and _numba.active(w, self.log_ratio)
                    and w.dtype == self.log_ratio.dtype):
                if not value:  # the gradients alone, added in place into w.grad and p.grad
                    return fused.eta_trick_grad_term(w, self.log_ratio, self.lam_eff, self.eps,
                                                      self.eta_weight_decay,
                                                      self.decay == "quadratic")
                return fused.eta_trick_objective(w, self.log_ratio, self.lam_eff, self.eps,
                                                  self.eta_weight_decay,
                                                  self.decay == "quadratic", value)
            return _EtaTrickObjective.apply(w, self.log_ratio, self.lam_eff, self.eps,
                                            self.eta_weight_decay, self.decay == "quadratic",
                                            value, self.dual == "released")
        return w.new_zeros(())  # adaprox: the penalty acts through the prox

    def _group_term(self, w, value):
        """The same regularizers of the group norms ``n_g = ||w_g||_2`` (torch autograd through
        the norm; the fused per-weight loops do not apply): ``lam sum_g Omega(n_g)``,
        ``lam/2 sum_g n_g^2/eta_hat(n_g)``, or the eta-trick's objective with ``n_g`` for ``w``
        and one ``p`` per group."""
        if self.algorithm in ("gradient", "adatikhonov"):
            return penalty_value(self, self.groups.norm(w), self.algorithm == "adatikhonov", value)
        if self.algorithm == "eta":
            return _EtaTrickObjective.apply(self.groups.norm(w), self.log_ratio, self.lam_eff,
                                            self.eps, self.eta_weight_decay,
                                            self.decay == "quadratic", value,
                                            self.dual == "released")
        return w.new_zeros(())


def _param_groups(optimizer):
    return {id(p): g for g in optimizer.param_groups for p in g["params"]}


@torch.no_grad()
def adaprox_step(pairs, optimizer) -> None:
    """Adaptive Tikhonov prox with the optimizer's per-coordinate step size on every
    ``(weight, PenaltyState)`` pair; a frozen weight (``requires_grad=False``) is left as it is:
    the prox is the second half of an update the optimizer does not make to it."""
    if optimizer is None:
        raise ValueError("adaprox needs the optimizer in after_step(optimizer, step, total_steps)")
    groups = _param_groups(optimizer)
    for w, layer in pairs:
        if not w.requires_grad:
            continue
        group = groups.get(id(w))
        if group is None:
            raise ValueError("adaprox: a sparsified weight is not in the optimizer; build the "
                             "optimizer after sparsify(model, ...) from model.parameters()")
        lr = float(group["lr"])
        if lr * layer.lam_eff == 0.0:  # a zero step: the prox is the identity (and 0/0 at w = 0)
            continue
        state = optimizer.state.get(w, {})
        v = state.get("max_exp_avg_sq") if group.get("amsgrad") else None
        if v is None:
            v = state.get("exp_avg_sq")
        if v is not None and "step" in state:
            step = state["step"]
            beta2 = float(group["betas"][1])
            if not _numba.is_cpu(w) and isinstance(step, torch.Tensor):
                # on the device: no host read; in w's dtype (Adam keeps step in float32)
                sqrt_bc2 = (1.0 - beta2 ** step.to(w.dtype)).sqrt()
            else:
                bc2 = 1.0 - beta2 ** float(step)
                sqrt_bc2 = math.sqrt(bc2)
                kind = (layer._fused_kind(w) if w.is_contiguous() and layer.groups is None
                        else None)
                if kind is not None:  # one loop over w and v
                    fused.adaptive_prox_(w, v, kind, layer.penalty.params, lr * layer.lam_eff,
                                          bc2, float(group["eps"]))
                    continue
            # rho lam = lr lam / (sqrt(v)/sqrt(bc2) + eps): Adam's own denominator, in place
            rho_lam = torch.sqrt(v).div_(sqrt_bc2).add_(float(group["eps"]))
            rho_lam = rho_lam.reciprocal_().mul_(lr * layer.lam_eff)
        else:
            rho_lam = torch.full_like(w, lr * layer.lam_eff)
        if layer.groups is not None:
            block_prox_(w, layer, rho_lam)
            continue
        if layer._torch_form is not None:
            form = TORCH_FORMS[layer._torch_form]
            eta = form.eta(w, w.abs(), layer.penalty.params)
            factor = eta / rho_lam.add_(eta)       # eta / (eta + rho lam)
            if form.infinite_eta:
                factor.nan_to_num_(nan=1.0)         # eta = inf: inf/inf, no shrinkage
            w.mul_(factor)
        elif layer._kernel is not None:
            wc = w.detach().cpu().contiguous()
            code, params = layer._kernel
            _kernels.tikhonov_prox(code, params, wc.view(-1).numpy(),
                                   rho_lam.detach().cpu().contiguous().view(-1).numpy())
            if wc.data_ptr() != w.data_ptr():
                w.copy_(wc)
        else:
            w64 = w.detach().cpu().to(torch.float64).numpy()
            eta = np.asarray(layer.penalty.eta_hat(w64), dtype=np.float64)
            r = rho_lam.detach().cpu().to(torch.float64).numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                factor = np.where(np.isinf(eta), 1.0, eta / (eta + r))
            factor = np.where(np.isnan(factor), 0.0, factor)
            w.mul_(torch.from_numpy(factor).to(w))


@torch.no_grad()
def block_prox_(w, layer, rho_lam) -> None:
    """AdaProx on groups: the same scalar map on each group's norm, ``n <- n eta/(eta + rho
    lam)`` with ``eta = eta_hat(n)``, applied as ``w_g <- w_g eta_hat(n_g)/(eta_hat(n_g) +
    rho_g lam)``; ``rho_g lam`` is the mean over the group of the per-coordinate ``rho lam``
    (one step per group: the prox scales the whole group and keeps its direction)."""
    groups = layer.groups
    n = groups.norm(w)
    if layer._torch_form is not None:
        eta = TORCH_FORMS[layer._torch_form].eta(n, n, layer.penalty.params)
    else:
        eta = torch.from_numpy(layer._eta_hat(n)).to(n)
    factor = eta / (eta + groups.mean(rho_lam))
    factor = torch.where(torch.isinf(eta), torch.ones_like(factor), factor)  # no shrinkage
    w.copy_(groups.scale(w, factor.nan_to_num_(nan=0.0)))


# ---- the method records --------------------------------------------------------------------------

class _PenaltyMethod(Method):
    family = "penalty"
    algorithm = "gradient"
    penalty_name = "logsum"
    has_tol = True
    torch_forms = tuple(TORCH_FORMS)
    defaults = {"lr": 1e-4, "lam": 1e-3, "eps": 2.0, "tol": 0.05}
    help = _HELP
    # grad += lam Omega'(w) (or the prox): one fused pass, no transcendental
    floor = {"pass": 1}
    floor_target = 1.15

    def validate(self, hp):
        out = dict(hp)
        out["lam"] = check_lam(hp["lam"])
        out["tol"] = check_tol(hp["tol"])
        if "eps" in hp:
            out["eps"] = check_float("eps", hp["eps"], low=0.0, low_open=True)
        out["algorithm"] = self.algorithm
        out["penalty"] = make_penalty(self.penalty_name, {"eps": out["eps"]})
        return out

    def make_state(self, target):
        return PenaltyState(self.name, target.param, groups=self.groups_of(target),
                            **self.state_hparams())


class LogSum(_PenaltyMethod):
    """Gradient descent on ``L + lam sum log(1 + |w|/eps)``."""
    name = "logsum"
    compare_rank = 6
    dataset_defaults = {"digits": {"lam": 3e-3}}
    paper = ("LogSum", 0.0293, 0.0190)


class AdaTikhonov(_PenaltyMethod):
    """Gradient descent on ``L + lam/2 sum w^2/eta_hat(w)`` (eta held fixed)."""
    name = "adatikhonov"
    compare_rank = 5
    dataset_defaults = {"digits": {"lam": 3e-3}}
    algorithm = "adatikhonov"
    paper = ("AdaTikhonov", 0.0288, 0.0183)


class AdaProx(_PenaltyMethod):
    """Adaptive Tikhonov prox after every optimizer step."""
    name = "adaprox"
    loss_term = False  # the prox after the optimizer step
    compare_rank = 4
    dataset_defaults = {"digits": {"lam": 3e-3}}
    algorithm = "adaprox"
    paper = ("AdaProx", 0.0294, 0.0276)

    def after_step(self, sp, optimizer, step, total_steps):
        adaprox_step([(t.param, st) for t, st in sp.states()], optimizer)


class EtaTrick(_PenaltyMethod):
    """Learnable eta per weight, the paper's released form by default: the regularizer is
    ``lam/2 [sum w^2/eta + sum f(eta) + eta_weight_decay sum p]`` with ``eta = lam exp(p)``,
    ``p = 5`` at the start, LogSum's dual ``f`` (eps = 2), keep ratio ``alpha = sigmoid(p)``
    (module docstring; ``decay="quadratic"`` for the earlier form)."""
    name = "eta-trick"
    compare_rank = 3
    floor = {"pass": 1, "trans": 1, "adam": 1}  # w/eta and f'(eta) with eta = lam e^p
    algorithm = "eta"
    defaults = {"lr": 1e-3, "lam": 1e-3, "eps": 2.0, "tol": 0.05, "eta_weight_decay": 1e-3,
                "decay": "linear", "init_log_ratio": 5.0, "eta_init": "constant",
                "prune_rule": "eta", "dual": "logsum"}
    paper = ("eta-Trick", 0.0216, 0.0513)

    def validate(self, hp):
        out = super().validate(hp)
        out["eta_weight_decay"] = check_float("eta_weight_decay", hp["eta_weight_decay"],
                                              low=0.0)
        out["decay"] = check_choice("decay", hp["decay"], {"linear", "quadratic"})
        out["init_log_ratio"] = check_float("init_log_ratio", hp["init_log_ratio"])
        out["eta_init"] = check_choice("eta_init", hp["eta_init"], {"constant", "eta_hat"})
        out["prune_rule"] = check_choice("prune_rule", hp["prune_rule"], {"eta_hat", "eta"})
        out["dual"] = check_choice("dual", hp["dual"], {"logsum", "released"})
        return out


class CatalogPenalty(_PenaltyMethod):
    """``penalty:<name>``: any separable penalty of the ``penalties`` catalog."""
    name = "penalty"
    defaults = {"lr": 1e-4, "lam": 1e-3, "tol": 0.05, "penalty_params": {},
                "algorithm": "gradient"}

    def validate(self, hp):
        out = dict(hp)
        out["lam"] = check_lam(hp["lam"])
        out["tol"] = check_tol(hp["tol"])
        out["algorithm"] = check_choice("algorithm", hp["algorithm"], set(_ALGORITHMS))
        out["penalty"] = make_penalty(self.penalty_name, hp["penalty_params"])
        out["penalty_params"] = dict(hp["penalty_params"])
        return out

    def state_hparams(self):
        hp = super().state_hparams()
        hp.pop("penalty_params")
        return hp

    def after_step(self, sp, optimizer, step, total_steps):
        if self.hparams["algorithm"] == "adaprox":
            adaprox_step([(t.param, st) for t, st in sp.states()], optimizer)

    def __reduce__(self):
        # the class is made per catalog name at run time: pickle the name and hyperparameters
        hp = {k: v for k, v in self.hparams.items() if k != "penalty"}
        return _catalog_record, (self.penalty_name, hp)

    @classmethod
    def for_catalog(cls, catalog_name: str) -> type:
        """The record of ``penalty:<catalog_name>`` (checked against the catalog)."""
        available = _import_penalties().available()
        if catalog_name.strip().lower().replace("-", "_") not in available:
            raise ValueError(f"unknown penalty in method 'penalty:{catalog_name}'; catalog "
                             f"names are {available}")
        return type(f"CatalogPenalty_{catalog_name}", (cls,),
                    {"name": f"penalty:{catalog_name}", "penalty_name": catalog_name})


def _catalog_record(catalog_name: str, hparams: dict) -> CatalogPenalty:
    """Unpickle a ``penalty:<name>`` record (see ``CatalogPenalty.__reduce__``)."""
    return CatalogPenalty.for_catalog(catalog_name)(**hparams)
