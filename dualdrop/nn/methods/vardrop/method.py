"""Sparse variational dropout (Molchanov, Ashukha, Vetrov 2017).

Gaussian multiplicative noise ``w * (1 + sqrt(a) e)``, ``e ~ N(0, 1)``, per weight, with the
log-uniform prior's KL divergence as the regularizer. Three variants:

``vardrop``
    no reparameterization: learn ``(theta, log a)``; one weight sample per forward call of the
    layer (high gradient variance, the paper's plain "VarDrop"). It only transforms the weight,
    so it acts on every weight tensor (Embedding, recurrent and attention weights included).
``vardrop-lr``
    local reparameterization (needs a linear map: Linear, transformers' Conv1D, Conv*,
    ConvTranspose*; other weights are skipped with a warning): learn ``(theta, log a)``; sample
    pre-activations with mean ``x theta^T + b`` and variance ``x^2 (a theta^2)^T`` (independent
    noise per example).
``vardrop-lr-ar``
    local + additive reparameterization: learn ``(theta, log sigma^2)``, ``a = sigma^2/theta^2``;
    variance ``x^2 (sigma^2)^T``.

The noise variance never includes the bias. ``log a`` is clipped to ``[-clip, clip]`` wherever it
is used (for ``vardrop-lr-ar`` the variance uses ``sigma^2`` itself, as in the paper; the clip acts
on the KL term and on the pruning rule). KL approximation (Molchanov et al. 2017, eq. 14):
``-KL ~= k1 sigmoid(k2 + k3 log a) - 1/2 log(1 + 1/a) - k1``; the regularizer is
``lam * sum KL``, by default ``lam = 1/n_train`` (the evidence lower bound per example; see
``dualdrop.nn.sparsifier`` for the convention shared by all methods).

Initialization: ``log a = init_log_alpha`` (-4) for the two ``(theta, log a)`` variants;
``log sigma^2 = init_log_sigma2`` (-10, Molchanov et al.'s value) for ``vardrop-lr-ar``, so that
small weights start with a large ``a``. Hyperparameters: ``lam``, ``tol``, ``clip`` (8) and the
initialization; ``default_hparams`` lists them.

Cost notes: the noise, the KL term, the LR weight variance and their gradients run through the
fused autograd Functions of ``dualdrop.nn.methods.<family>.fused`` (one loop each way over the weights instead of a
chain of small ops, counter-based normals keyed by the state's seed and forward count, see
``dualdrop.nn._base.NoiseState``), since they run over every weight at every step; the KL's
gradient comes out of the forward's Function and its value, when asked, is computed apart.

Groups (``granularity="neuron"`` / ``"head"``, docs/theory.md section 6): one ``log a`` per
group (shape ``groups.shape``, broadcast over the group), the regularizer ``lam sum_g |g|
KL(a_g)`` (every weight of a group carries its KL), the noise drawn per weight with the group's
``a``; ``vardrop-lr-ar`` learns one ``log sigma^2`` per group with ``a_g = sigma_g^2 /
(||w_g||^2/|g|)``. These run the reference torch forms (the fused loops assume one value per
weight), with the counter-based noise where the fused paths would run.

Test time: a weight is pruned when its keep ratio ``1/(1+a)`` is below ``tol`` (default 0.05,
i.e. ``log a > log 19 ~ 2.944``; the official code's ``log a >= 3`` is ``tol ~ 0.0474``); the
eval network uses ``theta * mask`` without noise.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dualdrop.nn._base import Method, NoiseState, check_float, check_lam, check_tol, original_of
from dualdrop.nn._layers import linear_op
from dualdrop.nn import _numba
from dualdrop.nn._noise import normal
from dualdrop.nn.methods.vardrop import fused
from penalties.dropout import VD_K1, VD_K2, VD_K3

K1, K2, K3 = VD_K1, VD_K2, VD_K3  # the KL fit of Molchanov et al. (2017), one copy
_LOG_EPS = 1e-8  # inside log(theta^2 + eps) and sqrt(var + eps)
#: log sigma^2 of a weight held at zero by a target density: no noise left (sigma ~ 5e-10)
_HELD_LOG_SIGMA2 = -43.0

_COMMON = {"lam": None, "tol": 0.05, "clip": 8.0}
_HELP = {
    "lr": "Adam learning rate",
    "lam": "per-example multiplier of sum KL; None: 1/n_train (the evidence lower bound)",
    "tol": "test time: prune a weight whose keep ratio 1/(1+a) is below tol",
    "clip": "log a is clipped to [-clip, clip]",
    "init_log_alpha": "initial log a of every weight",
    "init_log_sigma2": "initial log sigma^2 of every weight (small weights start with large a)",
}


def kl_approx(log_alpha: torch.Tensor) -> torch.Tensor:
    """Elementwise KL(q || log-uniform prior) approximation of Molchanov et al. (2017).

    Normalized so that KL -> 0 as ``log a -> +inf``; ``KL = k1 - k1 sigmoid(k2 + k3 log a)
    + 1/2 log(1 + exp(-log a))`` (``softplus`` for stability).
    """
    return K1 - K1 * torch.sigmoid(K2 + K3 * log_alpha) + 0.5 * nn.functional.softplus(-log_alpha)


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



class VarDropState(NoiseState):
    """``log_alpha`` (or ``log_sigma2`` for the additive variant) of one weight tensor."""

    def __init__(self, method, weight, *, variant, lam, tol, clip, lam_per_dataset,
                 init_log_alpha=None, init_log_sigma2=None, groups=None):
        super().__init__(method)
        self.variant, self.lam, self.tol, self.clip = variant, lam, tol, clip
        self.lam_per_dataset = lam_per_dataset
        self.groups = groups
        w = weight.detach()
        if groups is not None:  # one value per group, broadcasting against the weight
            w = w.new_empty(groups.shape)
        if variant == "lr-ar":
            self.log_sigma2 = nn.Parameter(torch.full_like(w, init_log_sigma2))
        else:
            self.log_alpha = nn.Parameter(torch.full_like(w, init_log_alpha))
        self.init_noise()

    def _own(self):
        return self.log_sigma2 if self.variant == "lr-ar" else self.log_alpha

    def _use_fused(self, *tensors) -> bool:

        own = self._own()
        return _numba.active(own, *tensors) and all(t.dtype == own.dtype for t in tensors)

    def raw_log_alpha(self, w) -> torch.Tensor:
        if self.variant == "lr-ar":
            if self.groups is not None:  # a = sigma^2 / (the group's mean square weight)
                ms = self.groups.sq_norm(w) / self.groups.size
                return self.log_sigma2 - torch.log(ms + _LOG_EPS)
            return self.log_sigma2 - torch.log(w * w + _LOG_EPS)
        return self.log_alpha

    def clipped_log_alpha(self, w) -> torch.Tensor:
        return self.raw_log_alpha(w).clamp(-self.clip, self.clip)

    def set_tol(self, tol: float) -> None:
        """Test-time pruning tolerance on the keep ratio ``1/(1+a)`` (``< tol`` is pruned)."""
        self.tol = _check(self.lam, tol, self.clip)[1]

    def log_alpha_threshold(self) -> float:
        """Prune when clipped ``log a`` exceeds this value (``log((1 - tol)/tol)``)."""
        return math.log((1.0 - self.tol) / self.tol)

    def keep_mask(self, w) -> torch.Tensor:
        keep = self.clipped_log_alpha(w) <= self.log_alpha_threshold()
        return keep if self.groups is None else self.groups.expand(keep, w)

    def keep_score(self, w) -> torch.Tensor:
        return -self.clipped_log_alpha(w).detach()

    @torch.no_grad()
    def hold_pruned(self, w, mask) -> None:
        w.mul_(mask)
        if hasattr(self, "log_sigma2"):  # the additive noise sigma * e survives theta = 0
            if self.groups is not None:
                mask = self.groups.any(mask)
            self.log_sigma2.masked_fill_(~mask, _HELD_LOG_SIGMA2)

    def _normals(self, t):
        """Standard normals in ``t``'s shape: counter-based where the fused paths run."""
        if _numba.active(t):
            return normal(t.shape, self.next_key(), dtype=t.dtype, device=t.device)
        return torch.randn_like(t)

    def train_weight(self, w):
        if self.variant != "none":
            self.note_read()
            return w  # the noise is sampled on the pre-activations (lr_hook)
        if self.groups is not None:  # the reference form with one alpha per group
            std = self.groups.scale(w, torch.exp(0.5 * self.clipped_log_alpha(w)))
            return w + std * self._normals(w)
        if self._use_fused(w):  # one loop each way, counter-based normals; the KL's gradient too

            out, kl = fused.vardrop_noise(w, self.log_alpha, self.next_key(), self.clip, False)
            self.keep_term(kl, exact_value=False)
            return out
        std = torch.exp(0.5 * self.clipped_log_alpha(w)) * w
        return w + std * torch.randn_like(w)

    def lr_hook(self, module, args, kwargs, out):
        """Local reparameterization: add ``sqrt(x^2 var_w) e`` to the layer's mean output."""
        if not self.training:
            return None
        self.note_hook()
        w = original_of(module, "weight")
        x = args[0]
        if self.groups is not None:  # the reference form with one alpha (sigma^2) per group
            if self.variant == "lr":
                var_w = self.groups.scale(w * w, torch.exp(self.clipped_log_alpha(w)))
            else:
                var_w = self.groups.expand(torch.exp(self.log_sigma2), w)
            var = linear_op(module, x * x, var_w, args, kwargs)
            if self._use_fused(x, out):
                return fused.add_lr_noise(out, var, self.next_key())
            return out + torch.sqrt(var + _LOG_EPS) * torch.randn_like(out)
        if self._use_fused(w, x, out):

            fn = fused.lr_variance_kl if self.variant == "lr" else fused.ar_variance_kl
            var_w, kl = fn(w, self._own(), self.clip, False)
            self.keep_term(kl, exact_value=False)
            var = linear_op(module, x * x, var_w, args, kwargs)
            return fused.add_lr_noise(out, var, self.next_key())
        if self.variant == "lr":
            var_w = _LRVariance.apply(w, self.log_alpha, self.clip)
        else:
            var_w = torch.exp(self.log_sigma2)
        x = args[0]
        var = linear_op(module, x * x, var_w, args, kwargs)  # no bias in the variance
        return out + torch.sqrt(var + _LOG_EPS) * torch.randn_like(out)

    def regularizer_term(self, w, n_train, value=True):
        scale = (self.lam_per_dataset / n_train if self.lam is None else self.lam) * self.strength
        if self.groups is not None:  # every weight of a group has the group's KL
            return (scale * self.groups.size) * fused.kl_sum(self.raw_log_alpha(w), self.clip,
                                                             value)
        kept = self.take_term()  # the KL's gradient from the forward's fused Function, if any
        if kept is None:
            return scale * fused.kl_sum(self.raw_log_alpha(w), self.clip, value)
        kl = kept[0]
        if value:  # the kept term's value is 0: add the value without a second gradient
            with torch.no_grad():
                v = fused.kl_sum(self.raw_log_alpha(w), self.clip, True)
            kl = kl + v
        return scale * kl


def _check(lam, tol, clip):
    lam = check_lam(lam, none_ok=True)
    tol = check_tol(tol)
    clip = check_float("clip", clip, low=0.0, low_open=True)
    thr = math.log((1.0 - tol) / tol)
    if thr >= clip:
        raise ValueError(f"tol={tol} needs log a > {thr:.3g} to prune but log a is clipped "
                         f"at clip={clip}: raise clip or raise tol")
    return lam, tol, clip


class VarDrop(Method):
    """Variational dropout without reparameterization (any weight tensor)."""

    name = "vardrop"
    stochastic = True
    compare_rank = 2
    # w (1 + sqrt(a) e) forward (sqrt(a) = exp(la/2): one transcendental pass); backward the
    # noise's and the KL's slopes (sigmoid(k2 + k3 la) needs a^-k3: a second transcendental pass)
    floor = {"normal_cb": 1, "trans": 2, "pass": 3, "adam": 1}
    floor_target = 1.5
    family = "vardrop"
    variant = "none"
    defaults = {"lr": 1e-3, **_COMMON, "init_log_alpha": -4.0}
    help = _HELP
    has_tol = True
    paper = ("VarDrop", 0.0154, 0.595)
    lam_per_dataset = 1.0  # the evidence lower bound divided by n_train

    def validate(self, hp):
        out = dict(hp)
        out["lam"], out["tol"], out["clip"] = _check(hp["lam"], hp["tol"], hp["clip"])
        for key in ("init_log_alpha", "init_log_sigma2"):
            if key in hp:
                out[key] = check_float(key, hp[key])
        return out

    def make_state(self, target):
        return VarDropState(self.name, target.param, variant=self.variant,
                            lam_per_dataset=self.lam_per_dataset, groups=self.groups_of(target),
                            **self.state_hparams())

    def attach(self, target, state):
        if self.needs_linear_map:
            for site in target.sites:
                site.module.register_forward_hook(state.lr_hook, with_kwargs=True)


class VarDropLR(VarDrop):
    """Variational dropout with local reparameterization (Linear and convolution layers)."""

    name = "vardrop-lr"
    compare_rank = 1
    # the variance a w^2 (one exp pass) and its slopes with the KL's (a second one), the
    # variance path's matmuls and one normal per pre-activation
    floor = {"matmul": 1, "normal_act_cb": 1, "trans": 2, "pass": 2, "adam": 1}
    floor_target = 2.2
    variant = "lr"
    acts_on = ("Linear, transformers Conv1D, Conv1d/2d/3d, ConvTranspose1d/2d/3d weights "
               "(a linear map)")
    needs_linear_map = True
    paper = ("VarDrop+LR", 0.0141, 0.0885)


class VarDropLRAR(VarDropLR):
    """Local + additive reparameterization: learn ``(theta, log sigma^2)``."""

    name = "vardrop-lr-ar"
    compare_rank = 0
    # strength chosen on the digits' validation split (0.1 / n_train)
    dataset_defaults = {"digits": {"lam": 0.1 / 1150}}
    variant = "lr-ar"
    defaults = {"lr": 1e-4, **_COMMON, "init_log_sigma2": -10.0}
    paper = ("VarDrop+LR+AR", 0.0321, 0.0238)
