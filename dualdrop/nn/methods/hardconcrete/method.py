"""Hard-concrete L0 gates (Louizos, Welling, Kingma 2018), per weight or per neuron.

Gate with location ``log a`` (the learnable ``gate_logits``), temperature ``beta``, stretch
``(gamma, zeta)``::

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log a) / beta),
    z = min(1, max(0, s (zeta - gamma) + gamma))          (training: stochastic)
    z_hat = min(1, max(0, sigmoid(log a) (zeta - gamma) + gamma))   (test time: deterministic)

The weight used is ``w * z``. Regularizer: ``lam * E[L0]`` (default ``lam = 0.1/n_train``,
Louizos et al.'s LeNet-300-100 value per example) with
``P(z != 0) = sigmoid(log a - beta log(-gamma / zeta))``.

``hardconcrete`` (per weight)
    one gate per weight, one gate sample per forward call; acts on any weight tensor.
``hardconcrete-neuron`` (group sparsity, Louizos et al.'s architecture pruning)
    ``Linear`` (and transformers' ``Conv1D``): one gate per *input* unit (a column of a Linear
    ``W``, a row of a ``Conv1D`` ``W``), sampled per example, applied to the input;
    ``Conv1d/2d/3d``: one gate per *output* channel (a filter and its bias), sampled per
    example, applied to the feature map. Other weights are skipped with a warning. The
    expected L0 counts the *weights* a gate controls (gate probability times group size), not
    the gates.

``hardconcrete`` with ``granularity="neuron"`` / ``"head"`` (docs/theory.md section 6)
    one gate per output unit (a Linear row, a convolution's output channel) or attention head,
    one sample per forward broadcast over the group, in the weight's parametrization (any layer
    that reads its weight; no hook); the expected L0 counts the group's weights. The reference
    torch form, with counter-based uniforms where the fused paths would run.
    ``hardconcrete-neuron`` keeps its own groups and takes only ``granularity="weight"``.

Training draws: the gates' uniforms come from the counter-based generator (a function of the
state's seed and forward count, ``dualdrop.nn._base.NoiseState``) and the gate, its gradient and
the expected L0 of the sampled gates run in one loop each way (``dualdrop.nn.methods.<family>.fused``).

Test time: the effective weight is ``w * z_hat`` (``z_hat`` in [0, 1], exactly 0 for closed
gates); a weight counts as nonzero when ``w * z_hat != 0``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dualdrop.nn._base import Method, NoiseState, check_float, check_lam
from dualdrop.nn._layers import is_conv1d, is_dense, linear_map_reason
from dualdrop.nn import _numba
from dualdrop.nn._noise import uniform
from dualdrop.nn.methods.hardconcrete import fused
from penalties.dropout import HC_BETA, HC_GAMMA, HC_ZETA, hc_l0_shift

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


class HardConcreteState(NoiseState):
    """Gate logits ``log a`` of one weight tensor: per weight, or per group (``axis``: 1 = the
    input units of a Linear weight, 0 = those of a ``Conv1D`` weight ``(in, out)`` or the output
    channels of a convolution kernel)."""

    def __init__(self, method, weight, *, lam, beta, gamma, zeta, droprate_init,
                 lam_per_dataset, axis=None, groups=None):
        super().__init__(method)
        self.lam, self.beta, self.gamma, self.zeta = lam, beta, gamma, zeta
        self.lam_per_dataset = lam_per_dataset
        self.axis = axis
        self.groups = groups
        w = weight.detach()
        shape = w.shape if axis is None else (w.shape[axis],)
        if groups is not None:  # one gate per group (granularity), broadcast over the group
            shape = groups.shape
        mean = math.log(1.0 - droprate_init) - math.log(droprate_init)
        logits = torch.empty(shape, dtype=w.dtype, device=w.device).normal_(mean, 1e-2)
        self.gate_logits = nn.Parameter(logits)
        self.numel = w.numel()
        self.init_noise()

    def group_size(self) -> int:
        """Number of weights each gate controls."""
        return self.numel // self.gate_logits.numel()

    def _fused_gate(self, x):
        """``x * z`` from ``fused.hard_concrete_gate`` (one loop forward and
        backward, counter-based uniforms); its expected-L0 output is kept for the regularizer."""

        out, l0 = fused.hard_concrete_gate(x, self.gate_logits, self.next_key(), self.beta,
                                            self.gamma, self.zeta)
        self.keep_term(l0, exact_value=True)
        return out

    def _use_fused(self, x) -> bool:

        return _numba.active(x, self.gate_logits) and x.dtype == self.gate_logits.dtype

    def sample_gates(self, shape) -> torch.Tensor:
        u = torch.rand(shape, dtype=self.gate_logits.dtype, device=self.gate_logits.device)
        u.clamp_(_U_EPS, 1.0 - _U_EPS)
        return _HardConcreteSample.apply(self.gate_logits, u, self.beta, self.gamma, self.zeta)

    def test_gates(self) -> torch.Tensor:
        s = torch.sigmoid(self.gate_logits)
        return (s * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)

    def prob_nonzero(self) -> torch.Tensor:
        """``P(z != 0)`` per gate."""
        return torch.sigmoid(self.gate_logits - hc_l0_shift(self.beta, self.gamma, self.zeta))

    def _broadcast(self, z, t):
        if self.axis is None:
            return z
        if t.dim() == 1:  # a convolution's bias, gated with its output channel
            return z
        shape = [1] * t.dim()
        shape[self.axis] = -1
        return z.view(shape)

    def train_weight(self, w):
        if self.groups is not None:  # one gate sample per group and forward (reference form)
            shape = self.gate_logits.shape
            if _numba.active(self.gate_logits):
                u = uniform(shape, self.next_key(), self.gate_logits.dtype,
                            self.gate_logits.device)
            else:
                u = torch.rand(shape, dtype=self.gate_logits.dtype,
                               device=self.gate_logits.device)
            u.clamp_(_U_EPS, 1.0 - _U_EPS)
            z = _HardConcreteSample.apply(self.gate_logits, u, self.beta, self.gamma, self.zeta)
            return self.groups.scale(w, z)
        if self.axis is not None:
            self.note_read()
            return w  # neuron gates are sampled per example in the hooks
        if self._use_fused(w):
            return self._fused_gate(w)
        return w * self.sample_gates(w.shape)

    def eval_weight(self, w):
        if self.groups is not None:
            return self.groups.scale(w, self.test_gates())
        return w * self._broadcast(self.test_gates(), w)

    def keep_mask(self, w):
        return self.eval_weight(w) != 0

    def keep_score(self, w) -> torch.Tensor:
        return self.gate_logits.detach()  # the test gate is monotone in its logit

    def unit_mask(self, mask, w) -> torch.Tensor:
        if self.axis is None:
            return super().unit_mask(mask, w)  # per weight, or per group (granularity)
        return self._broadcast(mask, w).expand_as(w)

    def unit_magnitude(self, w) -> torch.Tensor:
        if self.axis is None:
            return super().unit_magnitude(w)
        dims = [d for d in range(w.dim()) if d != self.axis]
        return w.detach().pow(2).sum(dim=dims).sqrt()  # the norm of each gate's slice

    def input_gate_hook(self, module, args):
        """Linear, Conv1D: gate the input units, one sample per example."""
        if not self.training:
            return None
        self.note_hook()
        x = args[0]
        if self._use_fused(x):
            return (self._fused_gate(x),) + args[1:]
        return (x * self.sample_gates(x.shape[:-1] + (self.gate_logits.numel(),)),) + args[1:]

    def output_gate_hook(self, module, args, out):
        """Convolution: gate the output channels (bias included), one sample per example."""
        if not self.training:
            return None
        self.note_hook()
        shape = (out.shape[0], self.gate_logits.numel())
        if self._use_fused(out):  # the gates themselves: the fused gate of a tensor of ones
            z = self._fused_gate(out.new_ones(shape))
        else:
            z = self.sample_gates(shape)
        return out * z.view(z.shape + (1,) * (out.dim() - 2))

    def regularizer_term(self, w, n_train, value=True):
        kept = self.take_term()  # the expected L0 from the forward's gates, if any
        l0 = kept[0] if kept is not None else self.prob_nonzero().sum()
        # one scalar multiplication per layer and step (the scale as a Python float)
        lam = (self.lam_per_dataset / n_train if self.lam is None else self.lam) * self.strength
        return l0 * (lam * self.group_size())


class HardConcrete(Method):
    """L0 hard-concrete gates, one per weight (any weight tensor)."""

    name = "hardconcrete"
    stochastic = True
    label = "HardConcrete"
    compare_rank = 7
    dataset_defaults = {"digits": {"lam": 1.0 / 1150, "lr": 3e-2}}
    floor = {"rand_cb": 1, "trans": 2, "pass": 3, "adam": 1}
    floor_target = 1.5
    family = "hardconcrete"
    defaults = {"lr": 1e-3, "lam": None, "beta": HC_BETA, "gamma": HC_GAMMA, "zeta": HC_ZETA,
                "droprate_init": 0.2}
    help = {
        "lr": "Adam learning rate (Louizos et al. 2018)",
        "lam": "per-example multiplier of E[L0]; None: 0.1/n_train (Louizos et al.)",
        "beta": "gate temperature",
        "gamma": "stretch interval lower end (gamma < 0)",
        "zeta": "stretch interval upper end (zeta > 1)",
        "droprate_init": "initial gate logits log((1 - p)/p) + N(0, 0.01^2)",
    }
    lam_per_dataset = 0.1  # Louizos et al. 2018: lam = 0.1 / n_train for LeNet-300-100

    def validate(self, hp):
        out = dict(hp)
        out["lam"] = check_lam(hp["lam"], none_ok=True)
        out["beta"] = check_float("beta", hp["beta"], low=0.0, low_open=True)
        out["gamma"] = check_float("gamma", hp["gamma"], high=0.0, high_open=True)
        out["zeta"] = check_float("zeta", hp["zeta"], low=1.0, low_open=True)
        out["droprate_init"] = check_float("droprate_init", hp["droprate_init"], low=0.0,
                                           high=1.0, low_open=True, high_open=True)
        return out

    def make_state(self, target):
        return HardConcreteState(self.name, target.param, lam_per_dataset=self.lam_per_dataset,
                                 groups=self.groups_of(target), **self.state_hparams())


class HardConcreteNeuron(HardConcrete):
    """Group gates: Linear input units, convolution output channels."""

    name = "hardconcrete-neuron"
    label = "HardConcrete (neuron)"
    compare_rank = None
    dataset_defaults = {}
    # a gate per input unit (Linear) or output channel (conv) and example: r gates per weight,
    # each a random number, two transcendental passes (sample, derivative), three passes
    floor = {"rand_cb": "r", "trans": "2r", "pass": "3r"}
    acts_on = ("Linear and transformers Conv1D weights (input units), Conv1d/2d/3d kernels "
               "(output channels)")
    needs_linear_map = True
    granularities = ("weight",)  # its own groups; granularity="neuron" is hardconcrete's

    @classmethod
    def check_granularity(cls, value):
        if value in ("neuron", "channel", "head"):
            raise ValueError(f"granularity={value!r}: hardconcrete-neuron already gates groups "
                             "(Linear input units, convolution output channels) and takes only "
                             "granularity='weight' (its default); for one gate per output unit "
                             "use method 'hardconcrete' with granularity='neuron'")
        return super().check_granularity(value)

    def skip_reason(self, target):
        reason = super().skip_reason(target)
        if reason is None and len(target.sites) > 1:
            reason = "a tied weight: neuron gates act in each layer's forward"
        for site in target.sites:
            if reason is None:
                r = linear_map_reason(site.module, site.parent, transposed_ok=False)
                if r is not None:
                    reason = f"{self.name} gates neurons in the forward and {r}"
        return reason

    def make_state(self, target):
        module = target.sites[0].module
        # the weight's axis of input units (dense layers) or output channels (convolutions)
        axis = (0 if is_conv1d(module) else 1) if is_dense(module) else 0
        return HardConcreteState(self.name, target.param, axis=axis,
                                 lam_per_dataset=self.lam_per_dataset, **self.state_hparams())

    def attach(self, target, state):
        site = target.sites[0]
        if is_dense(site.module):
            site.module.register_forward_pre_hook(state.input_gate_hook)
        else:
            site.module.register_forward_hook(state.output_gate_hook)

    def extra_tensors(self, target):
        """Convolution biases are gated with their output channel."""
        site = target.sites[0]
        if not is_dense(site.module) and site.module.bias is not None:
            return [(site.module, "bias")]
        return []
