"""Hard-concrete L0 gates (Louizos, Welling, Kingma 2018), per weight or per neuron.

Gate with location ``log a`` (the learnable ``gate_logits``), temperature ``beta``, stretch
``(gamma, zeta)``::

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log a) / beta),
    z = min(1, max(0, s (zeta - gamma) + gamma))          (training: stochastic)
    z_hat = min(1, max(0, sigmoid(log a) (zeta - gamma) + gamma))   (test time: deterministic)

The weight used is ``w * z``. Regularizer: ``lam * E[L0] / n_train`` with
``P(z != 0) = sigmoid(log a - beta log(-gamma / zeta))``.

``hardconcrete`` (per weight)
    one gate per weight, one gate sample per minibatch.
``hardconcrete-neuron`` (group sparsity, Louizos et al.'s architecture pruning)
    ``nn.Linear``: one gate per *input* unit (a column of ``W``), sampled per example, applied to
    the input; ``nn.Conv2d``: one gate per *output* channel (a filter and its bias), sampled per
    example, applied to the feature map. The expected L0 counts the *weights* a gate controls
    (gate probability times group size), not the gates.

Test time: the effective weight is ``w * z_hat`` (``z_hat`` in [0, 1], exactly 0 for closed
gates); a weight counts as nonzero when ``w * z_hat != 0``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dualdrop.nn._base import SparseLayerMixin, check_float

HPARAMS = {
    "lam": 0.1,            # multiplier of E[L0] / n_train (Louizos et al.: 0.1 for LeNet-300-100)
    "beta": 2.0 / 3.0,     # temperature
    "gamma": -0.1,         # stretch interval (gamma, zeta), gamma < 0 < 1 < zeta
    "zeta": 1.1,
    "droprate_init": 0.2,  # initial gate logits: log((1 - p)/p) + N(0, 0.01^2)
}
_U_EPS = 1e-6


class _HardConcreteSample(torch.autograd.Function):
    """Gate sample ``z = clamp(sigmoid((logit u + log a)/beta) (zeta - gamma) + gamma, 0, 1)``
    for given uniforms ``u``, with the fused gradient
    ``dz/dlog a = (zeta - gamma)/beta s (1 - s)`` where the clamp is inactive, 0 where it is."""

    @staticmethod
    def forward(ctx, logits, u, beta, gamma, zeta):
        s = torch.logit(u).add_(logits).mul_(1.0 / beta).sigmoid_()
        z = s * (zeta - gamma) + gamma
        active = (z > 0.0) & (z < 1.0)
        z.clamp_(0.0, 1.0)
        grad = torch.addcmul(s, s, s, value=-1.0).mul_((zeta - gamma) / beta)
        grad.mul_(active)
        ctx.save_for_backward(grad)
        ctx.shape = logits.shape
        return z

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        gl = g * grad
        if gl.shape != ctx.shape:  # gates broadcast over a batch dimension
            gl = gl.sum_to_size(ctx.shape)
        return gl, None, None, None, None


def validate(hp: dict) -> dict:
    out = dict(hp)
    out["lam"] = check_float("lam", hp["lam"], low=0.0)
    out["beta"] = check_float("beta", hp["beta"], low=0.0, low_open=True)
    out["gamma"] = check_float("gamma", hp["gamma"], high=0.0, high_open=True)
    out["zeta"] = check_float("zeta", hp["zeta"], low=1.0, low_open=True)
    out["droprate_init"] = check_float("droprate_init", hp["droprate_init"], low=0.0, high=1.0,
                                       low_open=True, high_open=True)
    return out


class HardConcreteMixin(SparseLayerMixin):
    """L0 gates; ``self.per_neuron`` selects weight gates or neuron (group) gates."""

    per_neuron = False

    def _setup(self, *, lam, beta, gamma, zeta, droprate_init):
        self.lam, self.beta, self.gamma, self.zeta = lam, beta, gamma, zeta
        w = self.weight.detach()
        if not self.per_neuron:
            shape = w.shape
        elif isinstance(self, nn.Conv2d):
            shape = (self.out_channels,)
        else:
            shape = (self.in_features,)
        mean = math.log(1.0 - droprate_init) - math.log(droprate_init)
        logits = torch.empty(shape, dtype=w.dtype, device=w.device).normal_(mean, 1e-2)
        self.gate_logits = nn.Parameter(logits)

    # number of weights each gate controls
    def group_size(self) -> int:
        if not self.per_neuron:
            return 1
        return self.weight.numel() // self.gate_logits.numel()

    def sample_gates(self, shape) -> torch.Tensor:
        u = torch.rand(shape, dtype=self.gate_logits.dtype, device=self.gate_logits.device)
        u.clamp_(_U_EPS, 1.0 - _U_EPS)
        return _HardConcreteSample.apply(self.gate_logits, u, self.beta, self.gamma, self.zeta)

    def test_gates(self) -> torch.Tensor:
        s = torch.sigmoid(self.gate_logits)
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def prob_nonzero(self) -> torch.Tensor:
        """``P(z != 0)`` per gate."""
        return torch.sigmoid(self.gate_logits - self.beta * math.log(-self.gamma / self.zeta))

    def train_forward(self, x):
        if not self.per_neuron:
            return self._op(x, self.weight * self.sample_gates(self.weight.shape), self.bias)
        if isinstance(self, nn.Conv2d):
            z = self.sample_gates((x.shape[0], self.out_channels))
            return self._op(x, self.weight, self.bias) * z[:, :, None, None]
        z = self.sample_gates(x.shape[:-1] + (self.in_features,))
        return self._op(x * z, self.weight, self.bias)

    def eval_weight_bias(self):
        z = self.test_gates()
        if not self.per_neuron:
            return self.weight * z, self.bias
        if isinstance(self, nn.Conv2d):
            bias = None if self.bias is None else self.bias * z
            return self.weight * z[:, None, None, None], bias
        return self.weight * z[None, :], self.bias

    def regularizer_term(self, n_train, value=True):
        return self.lam * self.group_size() * self.prob_nonzero().sum() / n_train


class HardConcreteLinear(HardConcreteMixin, nn.Linear):
    per_neuron = False


class HardConcreteConv2d(HardConcreteMixin, nn.Conv2d):
    per_neuron = False


class HardConcreteNeuronLinear(HardConcreteMixin, nn.Linear):
    per_neuron = True


class HardConcreteNeuronConv2d(HardConcreteMixin, nn.Conv2d):
    per_neuron = True


LAYER_CLASSES = {
    "hardconcrete": (HardConcreteLinear, HardConcreteConv2d),
    "hardconcrete-neuron": (HardConcreteNeuronLinear, HardConcreteNeuronConv2d),
}
