"""Sparse variational dropout (Molchanov, Ashukha, Vetrov 2017) for Linear and Conv2d layers.

Gaussian multiplicative noise ``w * (1 + sqrt(a) e)``, ``e ~ N(0, 1)``, per weight, with the
log-uniform prior's KL divergence as the regularizer. Three variants:

``vardrop``
    no reparameterization: learn ``(theta, log a)``; one weight sample per minibatch (high
    gradient variance, the seed's plain "VarDrop").
``vardrop-lr``
    local reparameterization: learn ``(theta, log a)``; sample pre-activations with mean
    ``x theta^T + b`` and variance ``x^2 (a theta^2)^T`` (independent noise per example).
``vardrop-lr-ar``
    local + additive reparameterization: learn ``(theta, log sigma^2)``, ``a = sigma^2/theta^2``;
    variance ``x^2 (sigma^2)^T``.

The noise variance never includes the bias. ``log a`` is clipped to ``[-clip, clip]`` wherever it
is used (for ``vardrop-lr-ar`` the variance uses ``sigma^2`` itself, as in the paper; the clip acts
on the KL term and on the pruning rule). KL approximation (Molchanov et al. 2017, eq. 14):
``-KL ~= k1 sigmoid(k2 + k3 log a) - 1/2 log(1 + 1/a) - k1``; the regularizer is
``lam * sum KL / n_train`` (``lam = 1``: the evidence lower bound divided by ``n_train``).

Initialization: ``log a = init_log_alpha`` (-4) for the two ``(theta, log a)`` variants;
``log sigma^2 = init_log_sigma2`` (-10, Molchanov et al.'s value) for ``vardrop-lr-ar``, so that
small weights start with a large ``a``. Hyperparameters: ``lam``, ``tol``, ``clip`` (8) and the
initialization; ``default_hparams`` lists them.

Cost notes: the KL term, the LR weight variance and their gradients are fused autograd functions
(one pass each over the weights instead of a chain of small ops), since they run over every
weight at every step.

Test time: a weight is pruned when its keep ratio ``1/(1+a)`` is below ``tol`` (default 0.05,
i.e. ``log a > log 19 ~ 2.944``; the official code's ``log a >= 3`` is ``tol ~ 0.0474``); the
eval network uses ``theta * mask`` without noise.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dualdrop.nn._base import SparseLayerMixin, check_float

K1, K2, K3 = 0.63576, 1.87320, 1.48695
_LOG_EPS = 1e-8  # inside log(theta^2 + eps) and sqrt(var + eps)

_COMMON = {
    "lam": 1.0,            # multiplier of KL / n_train (1 = ELBO)
    "tol": 0.05,           # prune when keep ratio 1/(1+a) < tol
    "clip": 8.0,           # log a clipped to [-clip, clip]
}
# (theta, log a) variants start from a constant log a; the additive variant from a constant
# log sigma^2 (Molchanov et al.'s initialization), so small weights start with a large a.
HPARAMS = {
    "vardrop": {**_COMMON, "init_log_alpha": -4.0},
    "vardrop-lr": {**_COMMON, "init_log_alpha": -4.0},
    "vardrop-lr-ar": {**_COMMON, "init_log_sigma2": -10.0},
}


def kl_approx(log_alpha: torch.Tensor) -> torch.Tensor:
    """Elementwise KL(q || log-uniform prior) approximation of Molchanov et al. (2017).

    Normalized so that KL -> 0 as ``log a -> +inf``; ``KL = k1 - k1 sigmoid(k2 + k3 log a)
    + 1/2 log(1 + exp(-log a))`` (``softplus`` for stability).
    """
    return K1 - K1 * torch.sigmoid(K2 + K3 * log_alpha) + 0.5 * nn.functional.softplus(-log_alpha)


class _KLSum(torch.autograd.Function):
    """``sum kl_approx(clamp(x, -clip, clip))`` with a hand-fused backward (one pass, no softplus).

    With ``s1 = sigmoid(k2 + k3 la)`` and ``s2 = sigmoid(la)``: ``KL = k1 - k1 s1 - 1/2 log s2`` and
    ``dKL/dla = -k1 k3 s1 (1 - s1) - 1/2 (1 - s2)``; zero gradient where the clip is active.
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


class _LRVariance(torch.autograd.Function):
    """``exp(clamp(la, -clip, clip)) * w^2`` (the weight variance of vardrop-lr), fused:
    ``d/dw = 2 w exp(la_c) g``, ``d/dla = exp(la_c) w^2 g`` inside the clip, 0 outside."""

    @staticmethod
    def forward(ctx, w, la, clip):
        lac = la.clamp(-clip, clip)
        e = torch.exp(lac)
        var_w = e * w * w
        ctx.save_for_backward(w, e, var_w, lac != la)
        return var_w

    @staticmethod
    def backward(ctx, g):
        w, e, var_w, clipped = ctx.saved_tensors
        gw = g * e * w * 2.0
        gla = (g * var_w).masked_fill_(clipped, 0.0)
        return gw, gla, None


def validate(hp: dict) -> dict:
    out = dict(hp)
    out["lam"] = check_float("lam", hp["lam"], low=0.0)
    out["tol"] = check_float("tol", hp["tol"], low=0.0, high=1.0, low_open=True, high_open=True)
    out["clip"] = check_float("clip", hp["clip"], low=0.0, low_open=True)
    for key in ("init_log_alpha", "init_log_sigma2"):
        if key in hp:
            out[key] = check_float(key, hp[key])
    thr = math.log((1.0 - out["tol"]) / out["tol"])
    if thr >= out["clip"]:
        raise ValueError(f"tol={out['tol']} needs log a > {thr:.3g} to prune but log a is clipped "
                         f"at clip={out['clip']}: raise clip or raise tol")
    return out


class VarDropMixin(SparseLayerMixin):
    """Variational dropout layer; ``self.variant`` is ``"none"``, ``"lr"`` or ``"lr-ar"``."""

    variant = "none"

    def _setup(self, *, lam, tol, clip, init_log_alpha=None, init_log_sigma2=None):
        self.lam, self.tol, self.clip = lam, tol, clip
        w = self.weight.detach()
        if self.variant == "lr-ar":
            self.log_sigma2 = nn.Parameter(torch.full_like(w, init_log_sigma2))
        else:
            self.log_alpha = nn.Parameter(torch.full_like(w, init_log_alpha))

    def raw_log_alpha(self) -> torch.Tensor:
        if self.variant == "lr-ar":
            return self.log_sigma2 - torch.log(self.weight * self.weight + _LOG_EPS)
        return self.log_alpha

    # log a, clipped
    def clipped_log_alpha(self) -> torch.Tensor:
        return self.raw_log_alpha().clamp(-self.clip, self.clip)

    def set_tol(self, tol: float) -> None:
        """Test-time pruning tolerance on the keep ratio ``1/(1+a)`` (``< tol`` is pruned)."""
        self.tol = validate({"lam": self.lam, "tol": tol, "clip": self.clip})["tol"]

    def log_alpha_threshold(self) -> float:
        """Prune when clipped ``log a`` exceeds this value (``log((1 - tol)/tol)``)."""
        return math.log((1.0 - self.tol) / self.tol)

    def keep_mask(self) -> torch.Tensor:
        return self.clipped_log_alpha() <= self.log_alpha_threshold()

    def train_forward(self, x):
        w, b = self.weight, self.bias
        if self.variant == "none":
            # one weight sample for the whole minibatch
            std = torch.exp(0.5 * self.clipped_log_alpha()) * w
            w_noisy = w + std * torch.randn_like(w)
            return self._op(x, w_noisy, b)
        if self.variant == "lr":
            var_w = _LRVariance.apply(w, self.log_alpha, self.clip)
        else:  # lr-ar
            var_w = torch.exp(self.log_sigma2)
        mean = self._op(x, w, b)
        var = self._op(x * x, var_w, None)  # no bias in the variance
        return mean + torch.sqrt(var + _LOG_EPS) * torch.randn_like(mean)

    def eval_weight_bias(self):
        return self.weight * self.keep_mask(), self.bias

    def regularizer_term(self, n_train, value=True):
        return (self.lam / n_train) * _KLSum.apply(self.raw_log_alpha(), self.clip, value)


class VarDropLinear(VarDropMixin, nn.Linear):
    variant = "none"


class VarDropConv2d(VarDropMixin, nn.Conv2d):
    variant = "none"


class VarDropLRLinear(VarDropMixin, nn.Linear):
    variant = "lr"


class VarDropLRConv2d(VarDropMixin, nn.Conv2d):
    variant = "lr"


class VarDropLRARLinear(VarDropMixin, nn.Linear):
    variant = "lr-ar"


class VarDropLRARConv2d(VarDropMixin, nn.Conv2d):
    variant = "lr-ar"


LAYER_CLASSES = {
    "vardrop": (VarDropLinear, VarDropConv2d),
    "vardrop-lr": (VarDropLRLinear, VarDropLRConv2d),
    "vardrop-lr-ar": (VarDropLRARLinear, VarDropLRARConv2d),
}
