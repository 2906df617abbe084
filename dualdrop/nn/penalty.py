"""Penalty methods of the eta-trick duality (DUALITY.md sections 2-4) on network weights.

All of them hold a separable ``penalties`` object ``P`` (LogSum(eps) for the four named
methods) and a strength ``lam``; the penalty is ``lam * sum_j Omega(w_j)`` over the weights of the
sparsified layers (biases excluded), added to the mean-over-batch data loss as is (not divided by
``n_train``: the seed's convention, ``lam = 1e-3``).

``logsum`` / ``penalty:<name>`` (``algorithm="gradient"``)
    gradient descent on ``L + lam sum Omega(w)``. ``Omega`` and ``Omega'`` come from ``P`` through
    a custom autograd function: forward returns ``lam sum Omega(w)``, backward
    ``lam Omega'(w) = lam w / eta_hat(w)``. Evaluation runs on the CPU (numba loop over
    ``penalties.kernels`` when ``P.kernel_spec()`` exists, else ``P.omega``/``P.derivative`` in
    numpy); CUDA weights are copied to the host and back each step.
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
``eta-trick``
    learnable ``log_eta`` per weight, joint gradient descent on
    ``J = L + lam sum 1/2 [w^2/eta + f(eta)] + eta_decay/2 sum (log eta)^2`` with the LogSum dual
    ``f(eta) = 2 log((s + eps)/(2 eps)) - 4 eta/(s + eps)^2``, ``s = sqrt(eps^2 + 4 eta)`` (equal to
    DUALITY.md's form, shifted so that f(0+) = 0; ``min_eta J`` gives ``lam log(1 + |w|/eps)``).
    The decay term is the coupled L2 weight decay of log eta (``eta_decay = 1e-3``).

    What that decay does (derived, and seen on MNIST, benchmarks/RESULTS.md): for a weight at 0,
    ``dJ/dlog eta = lam/2 eta f'(eta) + eta_decay log eta`` with ``eta f'(eta) = 4 eta/s^2``,
    so with ``lam = eta_decay = 1e-3, eps = 2`` eta settles at the root ``eta = 0.922`` (Brent's
    method on that expression) instead of following ``eta_hat(w) -> 0``. Near 0 the effective
    penalty is then a ridge ``lam w^2 / (2 * 0.922)``: no sparsity-inducing pull, pruning only
    comes from Adam's shrinking step as the learning rate decays (25% of the weights survive
    200 epochs). ``eta_decay = 0`` keeps the eta-trick's own fixed point ``eta = eta_hat(w)``
    (the LogSum penalty): 7% survive, and at the same validation error a larger ``tol``
    prunes further (see ``Sparsifier.set_tol``).

Test time (all of them): the keep ratio ``alpha = eta_hat(w)/(eta_hat(w) + lam)``; a weight is
pruned when ``alpha < tol``, i.e. ``eta_hat(|w|) < lam tol/(1 - tol)``. For penalties whose
``eta_hat`` is nondecreasing in ``|w|`` (all catalog ones) this is ``|w| < t*`` with ``t*`` found
once by bisection on ``P.eta_hat``; otherwise ``P.keep_ratio`` is evaluated on every call.
``eta-trick`` can instead prune on its learned ``eta`` (``prune_rule="eta"``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from dualdrop.nn import _kernels
from dualdrop.nn._base import SparseLayerMixin, check_choice, check_float

_ALGORITHMS = ("gradient", "adatikhonov", "adaprox")

HPARAMS = {
    "logsum": {"lam": 1e-3, "eps": 2.0, "tol": 0.05},
    "adatikhonov": {"lam": 1e-3, "eps": 2.0, "tol": 0.05},
    "adaprox": {"lam": 1e-3, "eps": 2.0, "tol": 0.05},
    "eta-trick": {"lam": 1e-3, "eps": 2.0, "tol": 0.05, "eta_decay": 1e-3,
                  "prune_rule": "eta_hat"},
    "penalty": {"lam": 1e-3, "tol": 0.05, "penalty_params": {}, "algorithm": "gradient"},
}
_ALGO_OF = {"logsum": "gradient", "adatikhonov": "adatikhonov", "adaprox": "adaprox",
            "eta-trick": "eta"}


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


def validate(method: str, hp: dict) -> dict:
    out = dict(hp)
    out["lam"] = check_float("lam", hp["lam"], low=0.0, low_open=True)
    out["tol"] = check_float("tol", hp["tol"], low=0.0, high=1.0, low_open=True, high_open=True)
    if "eps" in hp:
        out["eps"] = check_float("eps", hp["eps"], low=0.0, low_open=True)
    if "eta_decay" in hp:
        out["eta_decay"] = check_float("eta_decay", hp["eta_decay"], low=0.0)
    if "prune_rule" in hp:
        out["prune_rule"] = check_choice("prune_rule", hp["prune_rule"], {"eta_hat", "eta"})
    if method.startswith("penalty:"):
        out["algorithm"] = check_choice("algorithm", hp["algorithm"], set(_ALGORITHMS))
        out["penalty"] = make_penalty(method.split(":", 1)[1], hp["penalty_params"])
        out["penalty_params"] = dict(hp["penalty_params"])
    else:
        out["algorithm"] = _ALGO_OF[method]
        out["penalty"] = make_penalty("logsum", {"eps": out["eps"]})
    return out


# ---- pruning threshold -------------------------------------------------------------------------

def abs_threshold(P, c: float):
    """``t*`` with ``eta_hat(t) < c  <=>  t < t*`` for ``t >= 0``, or None if eta_hat is not
    monotone on a wide grid (then the rule must be evaluated pointwise)."""
    grid = np.concatenate([[0.0], np.logspace(-12, 4, 1601)])
    with np.errstate(all="ignore"):
        e = np.asarray(P.eta_hat(grid), dtype=np.float64)
    if np.any(np.isnan(e)):
        return None
    finite = np.where(np.isinf(e), np.finfo(np.float64).max, e)
    if np.any(np.diff(finite) < -1e-12 * np.abs(finite[:-1])):
        return None
    if e[0] >= c:
        return 0.0
    above = np.nonzero(e >= c)[0]
    if above.size == 0:
        return math.inf
    lo, hi = grid[above[0] - 1], grid[above[0]]
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if float(P.eta_hat(mid)) < c:
            lo = mid
        else:
            hi = mid
    return float(hi)


def logsum_dual(eta: torch.Tensor, eps: float) -> torch.Tensor:
    """LogSum dual ``f(eta)`` (normalized f(0+) = 0), differentiable in torch."""
    sp = torch.sqrt(eps * eps + 4.0 * eta) + eps
    return 2.0 * torch.log(sp / (2.0 * eps)) - 4.0 * eta / (sp * sp)


# ---- torch forms of the closed-form catalog penalties ------------------------------------------
# Speed path. The formulas are the catalog's (DUALITY.md section 3) and each one is checked
# against the penalties object (P.omega, P.derivative, P.eta_hat) in tests/nn/test_nn_layers.py.
# Measured reason (benchmarks/RESULTS.md): the generic numba loop over penalties.kernels costs
# ~40 ns per weight (a 266k-weight LeNet step grows from ~3 ms to ~14 ms), the vectorized torch
# form ~2 ns; it also runs on CUDA without copying weights to the host.

class _Form:
    """Elementwise torch closed form: ``omega``, ``deriv`` (Omega') and ``eta`` (eta_hat), each
    ``f(w, a, params)`` with ``a = |w|``; each is computed only when asked for."""

    def __init__(self, omega, deriv, eta, infinite_eta=False):
        self.omega, self.deriv, self.eta, self.infinite_eta = omega, deriv, eta, infinite_eta

    def __call__(self, w, a, prm):
        return self.omega(w, a, prm), self.deriv(w, a, prm), self.eta(w, a, prm)


_TINY = {torch.float32: torch.finfo(torch.float32).tiny, torch.float64: 2.2250738585072014e-308}


def _tiny(a):
    return _TINY.get(a.dtype, torch.finfo(a.dtype).tiny)


def _lp_deriv(w, a, prm):
    p = prm["p"]
    d = torch.where(a > 0, a.clamp_min(_tiny(a)) ** (p - 1.0), a.new_zeros(()))
    return torch.sign(w) * d


def _mcp_omega(w, a, prm):
    A = prm["a"] * prm["lam"]
    return torch.where(a <= A, a - a * a / (2.0 * A), a.new_tensor(0.5 * A))


def _mcp_eta(w, a, prm):
    A = prm["a"] * prm["lam"]
    return torch.where(a < A, A * a / (A - a).clamp_min(_tiny(a)), a.new_tensor(math.inf))


def _scad_omega(w, a, prm):
    A, lam = prm["a"], prm["lam"]
    mid = (2.0 * A * lam * a - a * a - lam * lam) / (2.0 * (A - 1.0) * lam)
    return torch.where(a <= lam, a, torch.where(a <= A * lam, mid,
                                                a.new_tensor(0.5 * (A + 1) * lam)))


def _scad_deriv(w, a, prm):
    A, lam = prm["a"], prm["lam"]
    dm = ((A * lam - a) / ((A - 1.0) * lam)).clamp_min(0.0)
    return torch.sign(w) * torch.where(a <= lam, torch.ones_like(a), dm)


def _scad_eta(w, a, prm):
    A, lam = prm["a"], prm["lam"]
    em = (A - 1.0) * lam * a / (A * lam - a).clamp_min(_tiny(a))
    return torch.where(a <= lam, a, torch.where(a < A * lam, em, a.new_tensor(math.inf)))


TORCH_FORMS = {
    "l1": _Form(lambda w, a, p: a, lambda w, a, p: torch.sign(w), lambda w, a, p: a),
    "lp": _Form(lambda w, a, p: a ** p["p"] / p["p"], _lp_deriv,
                lambda w, a, p: a ** (2.0 - p["p"])),
    "logsum": _Form(lambda w, a, p: torch.log1p(a / p["eps"]),
                    lambda w, a, p: torch.sign(w).div_(a + p["eps"]),
                    lambda w, a, p: a * (a + p["eps"])),
    "log2sum": _Form(lambda w, a, p: torch.log1p(a * a / p["eps"]),
                     lambda w, a, p: 2.0 * w / (a * a + p["eps"]),
                     lambda w, a, p: 0.5 * (a * a + p["eps"])),
    "mcp": _Form(_mcp_omega,
                 lambda w, a, p: torch.sign(w) * (1.0 - a / (p["a"] * p["lam"])).clamp_min(0.0),
                 _mcp_eta, infinite_eta=True),
    "scad": _Form(_scad_omega, _scad_deriv, _scad_eta, infinite_eta=True),
}


def torch_form(P):
    """The torch closed form of ``P`` (omega, derivative, eta_hat), or None."""
    name = getattr(P, "name", None)
    if name in TORCH_FORMS and type(P).__module__.startswith("penalties"):
        return name
    return None


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
    wc = w.detach()
    if wc.device.type != "cpu":
        wc = wc.cpu()
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
    return value, grad.to(w.device)


class _PenaltyFunction(torch.autograd.Function):
    """``lam * sum Omega(w)`` (or ``lam/2 sum w^2/eta_hat(w)``) with gradient ``lam Omega'(w)``;
    the forward value is 0 when ``need_value`` is False (gradient only)."""

    @staticmethod
    def forward(ctx, w, layer, tikhonov, need_value=True):
        value, grad = _penalty_value_and_grad(layer, w, tikhonov, need_value)
        ctx.save_for_backward(grad.mul_(layer.lam))  # lam Omega'(w), in place: a fresh tensor
        if isinstance(value, torch.Tensor):
            return (value * layer.lam).to(w.dtype)
        return w.new_tensor(layer.lam * value)

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
    """``lam sum 1/2 (w^2/eta + f(eta)) + decay/2 sum (log eta)^2`` with the LogSum dual f,
    forward and hand-derived gradients in one pass: with ``s = sqrt(eps^2 + 4 eta) + eps``,
    ``f'(eta) = 4/s^2``, so ``dJ/dw = lam w/eta`` and
    ``dJ/dlog eta = lam/2 (4 eta/s^2 - w^2/eta) + decay log eta``."""

    @staticmethod
    def forward(ctx, w, log_eta, lam, eps, decay, need_value=True):
        inv = torch.exp(-log_eta)
        eta = torch.exp(log_eta)
        s = torch.sqrt(eta.mul(4.0).add_(eps * eps)).add_(eps)
        r = eta.mul_(4.0).div_(s * s)                      # 4 eta / s^2
        wi = w * inv                                       # w / eta
        w2i = wi * w                                       # w^2 / eta
        if need_value:
            f = torch.log(s.mul_(0.5 / eps)).mul_(2.0).sub_(r)  # f(eta), f(0+) = 0
            value = 0.5 * lam * (w2i.sum() + f.sum()) + 0.5 * decay * (log_eta * log_eta).sum()
        else:
            value = w.new_zeros(())
        grad_w = wi.mul_(lam)
        grad_le = r.sub_(w2i).mul_(0.5 * lam)
        if decay:
            grad_le.add_(log_eta, alpha=decay)
        ctx.save_for_backward(grad_w, grad_le)
        return value

    @staticmethod
    def backward(ctx, g):
        grad_w, grad_le = ctx.saved_tensors
        return g * grad_w, g * grad_le, None, None, None, None


# ---- the layers --------------------------------------------------------------------------------

class PenaltyMixin(SparseLayerMixin):
    def _setup(self, *, lam, tol, penalty, algorithm, eps=None, eta_decay=0.0,
               prune_rule="eta_hat", penalty_params=None, use_torch_form=True):
        self.lam, self.tol, self.algorithm = lam, tol, algorithm
        self.penalty = penalty
        self.eta_decay, self.prune_rule = eta_decay, prune_rule
        self.eps = eps
        self._kernel = None
        spec = penalty.kernel_spec() if hasattr(penalty, "kernel_spec") else None
        if _kernels.AVAILABLE and spec is not None:
            code, params = spec
            self._kernel = (int(code), np.ascontiguousarray(params, dtype=np.float64))
        self._torch_form = torch_form(penalty) if use_torch_form else None
        self.set_tol(tol)
        if algorithm == "eta":
            with torch.no_grad():
                w64 = np.ascontiguousarray(self.weight.detach().cpu().to(torch.float64).numpy())
                if self._kernel is not None:  # serial: see dualdrop.nn._kernels
                    eta = np.empty(w64.size)
                    _kernels.eta_hat_map(self._kernel[0], self._kernel[1], w64.ravel(), eta)
                    eta = eta.reshape(w64.shape)
                else:
                    eta = np.asarray(penalty.eta_hat(w64), dtype=np.float64)
                with np.errstate(divide="ignore"):
                    le = np.clip(np.log(eta), -20.0, 20.0)
            self.log_eta = nn.Parameter(torch.from_numpy(le).to(self.weight))

    def set_tol(self, tol: float) -> None:
        """Test-time pruning tolerance on the keep ratio (``alpha < tol`` is pruned)."""
        self.tol = check_float("tol", tol, low=0.0, high=1.0, low_open=True, high_open=True)
        # eta_hat(|w|) < c  <=>  alpha < tol
        self._eta_cut = self.lam * self.tol / (1.0 - self.tol)
        self._abs_cut = abs_threshold(self.penalty, self._eta_cut)

    def keep_mask(self) -> torch.Tensor:
        if self.algorithm == "eta" and self.prune_rule == "eta":
            return self.log_eta >= math.log(self._eta_cut)
        if self._abs_cut is not None:
            return self.weight.abs() >= self._abs_cut
        w64 = self.weight.detach().cpu().to(torch.float64).numpy()
        alpha = np.asarray(self.penalty.keep_ratio(w64, self.lam))
        return torch.from_numpy(alpha >= self.tol).to(self.weight.device)

    def train_forward(self, x):
        return self._op(x, self.weight, self.bias)

    def eval_weight_bias(self):
        return self.weight * self.keep_mask(), self.bias

    def regularizer_term(self, n_train, value=True):
        if self.algorithm == "gradient":
            return penalty_value(self, self.weight, False, value)
        if self.algorithm == "adatikhonov":
            return penalty_value(self, self.weight, True, value)
        if self.algorithm == "eta":
            return _EtaTrickObjective.apply(self.weight, self.log_eta, self.lam, self.eps,
                                            self.eta_decay, value)
        return self.weight.new_zeros(())  # adaprox: the penalty acts through the prox


class PenaltyLinear(PenaltyMixin, nn.Linear):
    pass


class PenaltyConv2d(PenaltyMixin, nn.Conv2d):
    pass


# ---- AdaProx step ------------------------------------------------------------------------------

def _param_groups(optimizer):
    return {id(p): g for g in optimizer.param_groups for p in g["params"]}


@torch.no_grad()
def adaprox_step(layers, optimizer) -> None:
    """Adaptive Tikhonov prox with the optimizer's per-coordinate step size."""
    if optimizer is None:
        raise ValueError("adaprox needs the optimizer in after_step(optimizer, step, total_steps)")
    groups = _param_groups(optimizer)
    for layer in layers:
        w = layer.weight
        group = groups.get(id(w))
        if group is None:
            raise ValueError("adaprox: a sparsified weight is not in the optimizer; build the "
                             "optimizer after sparsify(model, ...) from model.parameters()")
        lr = float(group["lr"])
        if lr * layer.lam == 0.0:  # a zero step: the prox is the identity (and 0/0 at w = 0)
            continue
        state = optimizer.state.get(w, {})
        v = state.get("max_exp_avg_sq") if group.get("amsgrad") else None
        if v is None:
            v = state.get("exp_avg_sq")
        if v is not None and "step" in state:
            step = float(state["step"])
            beta2 = float(group["betas"][1])
            bc2 = 1.0 - beta2 ** step
            # rho lam = lr lam / (sqrt(v)/sqrt(bc2) + eps): Adam's own denominator, in place
            rho_lam = torch.sqrt(v).div_(math.sqrt(bc2)).add_(float(group["eps"]))
            rho_lam = rho_lam.reciprocal_().mul_(lr * layer.lam)
        else:
            rho_lam = torch.full_like(w, lr * layer.lam)
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


def after_step(sp, optimizer, step: int, total_steps: int) -> None:
    if sp.hparams["algorithm"] == "adaprox":
        adaprox_step([layer for _, layer in sp.layers], optimizer)


LAYER_CLASSES = (PenaltyLinear, PenaltyConv2d)
