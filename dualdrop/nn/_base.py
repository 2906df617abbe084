"""The two shapes every method is made of: a ``Method`` record and a per-weight ``WeightState``.

How a weight is sparsified (``torch.nn.utils.parametrize``): for every selected weight tensor
``sparsify`` registers the method's ``WeightState`` as the tensor's parametrization. The module
then reads ``module.weight`` as ``state(original)``: in ``train()`` mode the method's training
weight (a noisy sample, gated, masked, or the weight itself), in ``eval()`` mode the deterministic
test-time weight (masks and gates folded in). This works for *any* module that reads its weight
as an attribute (Linear, convolutions, Embedding, the recurrent layers, MultiheadAttention's
projections, user modules), and the original tensor stays one Parameter: a weight tied to
several modules or names is one original and gets one state. Methods that change the forward
itself (local reparameterization samples pre-activations; neuron gates act on inputs or feature
maps) add forward hooks on the owning modules, which must then be linear maps whose forward
is called (see :func:`linear_map_reason`).

``Method`` follows ``torch.nn.utils.prune.BasePruningMethod``: one class per method carrying its
defaults (``lr`` included), a one-line description of each hyperparameter, its validation, what
it can act on, the per-weight state it builds and its post-step hook.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
import weakref

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from dualdrop.nn._groups import GRANULARITIES, check_granularity, groups_of
from dualdrop.nn._layers import linear_map_reason
from dualdrop.nn._noise import make_key
from penalties.checks import check_choice, check_float, check_int  # noqa: F401 (re-exported)

_EXTRA_STATE_VERSION = 2


def compiling() -> bool:
    """Whether ``torch.compile`` (dynamo) is tracing the current code.

    The fused Functions (``dualdrop.nn._fused``) run numba loops on the tensors' host memory,
    which dynamo cannot trace; under compilation every method takes its plain torch form instead
    (as with ``DUALDROP_FUSED=0``: torch's generator draws the noise), so a compiled model never
    crashes. Python-side bookkeeping (the bypass check of the forward hooks) is skipped too."""
    fn = getattr(torch.compiler, "is_compiling", None)
    return bool(fn()) if fn is not None else False


def layer_floor(w, n_units: int, min_density: float) -> int:
    """Units a layer keeps whatever a ranking across layers says: ``min_density`` of them (at
    least one), and for single weights at least one weight per two of the layer's units,
    ``(fan_out + fan_in) / 2``, so that a small layer (a classifier) is never cut to a few
    weights (at 0.5% of LeNet-300-100 a flat 0.5% floor left its 10 classes 5 weights). The one
    floor rule of the target-density schedule and of magnitude pruning."""
    floor = max(1, math.ceil(min_density * n_units))
    if n_units == w.numel() and w.dim() >= 2:
        floor = max(floor, math.ceil((w.shape[0] + w[0].numel()) / 2))
    return min(n_units, floor)


@torch.no_grad()
def mask_first_moments(optimizer, w, mask) -> None:
    """Zero the optimizer's first-moment buffers of ``w`` (Adam's ``exp_avg``, SGD's
    ``momentum_buffer``) outside ``mask``, so that a weight held at zero carries no momentum."""
    state = optimizer.state.get(w, {}) if optimizer is not None else {}
    for key in ("exp_avg", "momentum_buffer"):
        buf = state.get(key)
        if isinstance(buf, torch.Tensor) and buf.shape == w.shape:
            buf.mul_(mask)


# ---- argument checks: clear errors naming the argument and the fix ----------------------------

def check_lam(lam, *, none_ok: bool = False):
    """The one rule for a method's strength ``lam``: a finite real number > 0 (a strength of 0
    sparsifies nothing: use the plain model), or None where the method has a per-dataset
    default (variational dropout, hard-concrete)."""
    if lam is None and none_ok:
        return None
    if lam is None:
        raise TypeError("lam must be a real number > 0, got None")
    try:
        return check_float("lam", lam, low=0.0, low_open=True)
    except ValueError:
        hint = " or None for the per-dataset default c/n_train" if none_ok else ""
        raise ValueError(f"lam must be > 0{hint}, got {lam!r}; a strength of 0 sparsifies "
                         "nothing (train the plain model instead)") from None


def check_tol(tol):
    return check_float("tol", tol, low=0.0, high=1.0, low_open=True, high_open=True)


# ---- the per-weight state ------------------------------------------------------------------------

class WeightState(nn.Module):
    """One method's state for one weight tensor, registered as that tensor's parametrization.

    ``forward(w)`` maps the original tensor to the one the module uses: ``train_weight(w)`` in
    ``train()`` mode, ``eval_weight(w)`` in ``eval()`` mode. New learnable tensors are parameters
    of the state (so ``model.parameters()`` holds them once, even for tied weights), other state
    are buffers, hyperparameters are attributes. ``regularizer_term(w, n_train, value)`` is the
    state's term of ``Sparsifier.regularizer``.
    """

    method: str = ""
    #: the groups the state prunes together (``dualdrop.nn._groups.Groups``), None: single
    #: weights (``granularity="weight"``)
    groups = None
    #: multiplier of the method's strength ``lam`` (the regularizer, the prox, the keep-ratio
    #: cut of the penalty methods); set by ``Sparsifier.set_strength`` only, 1 otherwise
    strength: float = 1.0

    def __init__(self, method: str):
        super().__init__()
        self.method = method

    def forward(self, w):
        return self.train_weight(w) if self.training else self.eval_weight(w)

    def train_weight(self, w):
        return w

    def keep_mask(self, w):  # pragma: no cover - abstract
        raise NotImplementedError

    def eval_weight(self, w):
        """Deterministic test-time tensor (masks and gates folded in)."""
        return w * self.keep_mask(w)

    # ---- ranking and holding, for a target density (``dualdrop.nn.density``) ----
    def keep_score(self, w) -> torch.Tensor:
        """The quantity the test-time rule thresholds, higher = kept, one entry per unit the
        method prunes (a weight, or a gate's group): ``|w|`` (a group's norm ``||w_g||``)
        unless a method says otherwise."""
        return self.unit_magnitude(w)

    def unit_magnitude(self, w) -> torch.Tensor:
        """``|w|`` per weight, ``||w_g||_2`` per group: the size of each unit (the tie-break of
        a ranking)."""
        return w.detach().abs() if self.groups is None else self.groups.norm(w.detach())

    def unit_mask(self, mask, w) -> torch.Tensor:
        """A 0/1 mask over ``keep_score``'s units as a mask over ``w``'s entries."""
        return mask if self.groups is None else self.groups.expand(mask, w)

    def kept_units(self) -> torch.Tensor | None:
        """A flat bool mask over ``keep_score``'s units that the method's own schedule keeps
        (magnitude pruning's masks); None for a method that makes no mask."""
        return None

    @torch.no_grad()
    def hold_pruned(self, w, mask) -> None:
        """Keep the entries outside ``mask`` (a bool tensor shaped like ``w``) pruned in
        training: zero them (methods whose noise survives a zero weight also silence it)."""
        w.mul_(mask)

    def regularizer_term(self, w, n_train: int, value: bool = True):
        return w.new_zeros(())

    # state_dict carries the method name so that a checkpoint of one method cannot be loaded
    # silently into a model sparsified with another one (several share tensor names).
    def get_extra_state(self):
        state = {"version": _EXTRA_STATE_VERSION, "method": self.method}
        if self.groups is not None:  # single weights: no entry (earlier checkpoints' form)
            state["granularity"] = self.groups.kind
        return state

    def set_extra_state(self, state):
        method = state.get("method") if isinstance(state, dict) else None
        if method != self.method:
            raise ValueError(
                f"state_dict was saved from a weight sparsified with method {method!r} but this "
                f"one uses {self.method!r}; call sparsify(model, {method!r}, ...) on the fresh "
                "model before load_state_dict")
        saved = state.get("granularity", "weight")
        own = "weight" if self.groups is None else self.groups.kind
        if saved != own:
            raise ValueError(
                f"state_dict was saved from a weight pruned by {saved} (granularity) but this one "
                f"is pruned by {own}; sparsify the fresh model with granularity={saved!r} before "
                "load_state_dict")

    def extra_repr(self):
        return f"method={self.method}"

    # Methods that act in a forward hook of the layer (local reparameterization, neuron gates)
    # never see a use of the weight that bypasses the layer's forward, e.g.
    # ``F.linear(x, layer.weight)`` in a parent's forward. ``note_read`` (the weight was read in
    # training) and ``note_hook`` (the layer's hook ran) let ``Sparsifier`` detect it.
    hook_seen = False
    read_seen = False

    def note_read(self) -> None:
        if not self.read_seen and not compiling():
            self.read_seen = True

    def note_hook(self) -> None:
        if not self.hook_seen and not compiling():
            self.hook_seen = True

    def watch_weight(self, weight, sites=()) -> None:
        """Remember (weakly) the original weight and the ``(module, tensor name)`` it
        parametrizes, for the optimizer check of ``sparsify``."""
        self.__dict__["_weight_ref"] = weakref.ref(weight)
        self.__dict__["_site_refs"] = [(weakref.ref(m), n) for m, n in sites]

    def __getstate__(self):  # a weak reference is neither pickled nor copied
        state = super().__getstate__()
        state.pop("_weight_ref", None)
        state.pop("_site_refs", None)
        return state

    def watched_weight(self):
        """The watched weight while this state still parametrizes it (not after
        ``Sparsifier.remove``, or a ``sparsify`` that failed and was undone), else None."""
        ref = self.__dict__.get("_weight_ref")
        sites = self.__dict__.get("_site_refs", ())
        if ref is None or not any(state_of(m(), n) is self for m, n in sites
                                  if m() is not None):
            return None
        return ref()

    def release_rnn_cache(self, module, args, output):
        """Forward hook of a recurrent layer: drop the parametrized weights it cached."""
        plain_rnn_cache(module)

    #: renamed state tensors of earlier dualdrop versions: old name -> (new name, convert)
    legacy_names: dict = {}

    def legacy_state_dict_hook(self, state_dict, prefix, local_metadata, strict, missing_keys,
                               unexpected_keys, error_msgs):
        """Load a state dict written before weights were parametrized (dualdrop's earlier
        layer classes: ``fc1.weight``, ``fc1.log_alpha``, ... at the layer's level) by moving its
        keys to where the parametrization keeps them. Model state only: an optimizer state
        dict of that time lists the parameters in another order and cannot be reused."""
        names = [n for n in getattr(self, "tensor_names", ()) if prefix + n in state_dict
                 and prefix + f"parametrizations.{n}.original" not in state_dict]
        if not names:
            return
        own = list(self._parameters) + list(self._buffers)
        moved = {}
        for n in names:
            state_dict[prefix + f"parametrizations.{n}.original"] = state_dict.pop(prefix + n)
            new = prefix + f"parametrizations.{n}.0."
            for key in own + ["_extra_state"] + list(self.legacy_names):
                old = prefix + key
                if old in state_dict or old in moved:
                    value = moved.setdefault(old, state_dict.pop(old, None))
                    target, convert = self.legacy_names.get(key, (key, None))
                    if key == "_extra_state" and isinstance(value, dict):
                        value = {**value, "version": _EXTRA_STATE_VERSION}
                    state_dict[new + target] = convert(self, value) if convert else value


class NoiseState(WeightState):
    """A state that draws noise in its training forward, from the counter-based generator of
    ``dualdrop.nn._noise``: draw number ``noise_count`` of the state's seed is a pure function of
    ``make_key(noise_seed, rank, noise_count)``. Seed and counter are host integers kept in the
    state dict (extra state), so a checkpoint resumes the exact noise sequence and no device value
    is read to make a key. Its seed comes from torch's global generator when the state is built
    (seed it before ``sparsify``); the rank of ``torch.distributed`` (0 without it) separates the
    processes of a data-parallel run, which see different data and need different noise.

    A forward that computes a method's regularizer as a by-product (the expected L0 of the gates
    it sampled, the KL of the variances it used) keeps that scalar with :meth:`keep_term`;
    ``regularizer_term`` takes it with :meth:`take_term` (once; a term made under ``no_grad`` or
    not taken before the next forward is dropped) and computes it afresh otherwise.
    """

    def init_noise(self) -> None:
        self.noise_seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        self.noise_count = 0
        self._term = None

    def next_key(self) -> int:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        key = make_key(self.noise_seed, rank, self.noise_count)
        self.noise_count += 1
        return key

    def keep_term(self, term, exact_value: bool) -> None:
        self._term = (term, exact_value) if term.requires_grad else None

    def take_term(self):
        """``(term, exact_value)`` kept by the last training forward, or None."""
        if not torch.is_grad_enabled():
            return None
        term, self._term = getattr(self, "_term", None), None
        return term

    def get_extra_state(self):
        return {**super().get_extra_state(), "noise": [self.noise_seed, self.noise_count]}

    def set_extra_state(self, state):
        super().set_extra_state(state)
        noise = state.get("noise")
        if noise is not None:  # earlier checkpoints drew from torch's generator: keep this seed
            self.noise_seed, self.noise_count = int(noise[0]), int(noise[1])
        self._term = None

    def __getstate__(self):  # a kept term holds an autograd graph: never pickled or copied
        state = super().__getstate__()
        return {**state, "_term": None}


@contextlib.contextmanager
def preserved_noise(model: nn.Module, seed: int | None = None):
    """Run a block that draws noise without moving the model's noise streams.

    Every :class:`NoiseState` in ``model`` gets its seed and counter back on exit, so a
    measurement that runs training-mode forwards (the noise diagnostics) leaves a training run's
    noise sequence, and thus its weights, exactly as without it. ``seed``: inside the block, state
    ``i`` draws from a fresh stream keyed by ``(seed, i)`` (reproducible whatever the run's
    streams are); None: the block continues the current streams.
    """
    states = [m for m in model.modules() if isinstance(m, NoiseState)]
    saved = [(st.noise_seed, st.noise_count, getattr(st, "_term", None)) for st in states]
    try:
        if seed is not None:
            import numpy as np

            for i, st in enumerate(states):
                st.noise_seed = int(np.random.SeedSequence([int(seed), i]).generate_state(
                    1, np.uint64)[0] >> 2)
                st.noise_count = 0
        yield states
    finally:
        for st, (s, c, t) in zip(states, saved):
            st.noise_seed, st.noise_count, st._term = s, c, t


def original_of(module: nn.Module, tensor_name: str) -> torch.Tensor:
    """The original (unparametrized) tensor ``tensor_name`` of ``module``."""
    if parametrize.is_parametrized(module, tensor_name):
        return module.parametrizations[tensor_name].original
    return getattr(module, tensor_name)


def state_of(module: nn.Module, tensor_name: str = "weight"):
    """The dualdrop ``WeightState`` of ``module.<tensor_name>``, or None."""
    if not parametrize.is_parametrized(module, tensor_name):
        return None
    for p in module.parametrizations[tensor_name]:
        if isinstance(p, WeightState):
            return p
    return None


# ---- parametrized modules stay picklable ---------------------------------------------------------
# torch's parametrize gives the module a generated class whose __getstate__ refuses pickling.
# Pickle them as "the plain class, then the generated class again, then the __dict__".

def _rebuild_parametrized(plain_cls, names):
    obj = plain_cls.__new__(plain_cls)
    parametrize._inject_new_class(obj)
    for name in names:
        parametrize._inject_property(obj, name)
    type(obj).__reduce_ex__ = _reduce_parametrized
    type(obj).__getattr__ = _moved_attribute
    return obj


def _reduce_parametrized(self, protocol):
    plain = type(self).__bases__[0]
    if isinstance(self, nn.RNNBase):
        # RNNBase.__getstate__ would re-read every weight, i.e. run the parametrizations (a
        # noise draw, and a non-leaf tensor that cannot be deep-copied): keep the originals
        plain_rnn_cache(self)
        state = self.__dict__.copy()
        state.pop("_flat_weight_refs", None)
    else:
        state = plain.__getstate__(self)  # the plain class's own
    return _rebuild_parametrized, (plain, list(self.parametrizations.keys())), state


def plain_rnn_cache(module: nn.Module) -> None:
    """Point a recurrent layer's weight cache at the original tensors.

    ``nn.RNNBase`` keeps the weights its last forward read in ``_flat_weights``; for a
    parametrized weight that is the computed (masked, noisy) tensor, a non-leaf of the last
    graph that would keep that graph alive and make the module impossible to deep-copy. The
    originals are leaves; the next forward sees they are not the parametrized weights and
    re-reads them, as it does for any changed weight."""
    if not isinstance(module, nn.RNNBase) or not hasattr(module, "_flat_weights_names"):
        return
    flat = [original_of(module, n) if parametrize.is_parametrized(module, n)
            else module._parameters.get(n) for n in module._flat_weights_names]
    module.__dict__["_flat_weights"] = flat
    module.__dict__["_flat_weight_refs"] = [weakref.ref(w) if w is not None else None
                                            for w in flat]


def _moved_attribute(self, name):
    """``__getattr__`` of a sparsified module: the usual lookup, and for a name that now lives
    on the weight's state (``layer.gate_logits``, ``layer.log_alpha`` of dualdrop's earlier layer
    classes) an AttributeError that names the new access."""
    try:
        return type(self).__bases__[0].__getattr__(self, name)
    except AttributeError:
        if not name.startswith("__") and "parametrizations" in self.__dict__.get("_modules", {}):
            for tname, plist in self._modules["parametrizations"].items():
                for p in plist:
                    if isinstance(p, WeightState) and hasattr(p, name):
                        raise AttributeError(
                            f"{type(self).__name__} has no attribute {name!r}: the method's "
                            f"state moved to the weight's parametrization; use "
                            f"dualdrop.nn.state_of(module, {tname!r}).{name}") from None
        raise


def _hook_owner(fn):
    """The object a registered hook is a bound method of (torch wraps state-dict pre-hooks in an
    object holding the function as ``.hook``)."""
    fn = getattr(fn, "hook", fn)
    return getattr(fn, "__self__", None)


def register_state(module: nn.Module, tensor_name: str, state: WeightState) -> None:
    """Register ``state`` as the parametrization of ``module.<tensor_name>`` (picklable)."""
    if parametrize.is_parametrized(module, tensor_name):
        raise ValueError(f"{type(module).__name__}.{tensor_name} is already parametrized; "
                         "sparsify works on plain tensors (remove the other parametrization or "
                         "exclude this tensor)")
    parametrize.register_parametrization(module, tensor_name, state, unsafe=True)
    type(module).__reduce_ex__ = _reduce_parametrized
    type(module).__getattr__ = _moved_attribute
    if isinstance(module, nn.RNNBase):
        plain_rnn_cache(module)
        if not any(getattr(h, "__self__", None) is state
                   for h in module._forward_hooks.values()):
            module.register_forward_hook(state.release_rnn_cache)
    state.tensor_names = sorted(set(getattr(state, "tensor_names", ())) | {tensor_name})
    hooks = module._load_state_dict_pre_hooks.values()
    if not any(_hook_owner(h) is state for h in hooks):
        module._register_load_state_dict_pre_hook(state.legacy_state_dict_hook)


# ---- the method record --------------------------------------------------------------------------

#: hyperparameters every method takes, with their defaults and descriptions
COMMON_DEFAULTS = {"granularity": "weight"}
COMMON_HELP = {
    "granularity": "what is pruned together: 'weight' (single weights), 'neuron' (= 'channel': "
                   "the output units of Linear/Conv layers), 'head' (MultiheadAttention heads; "
                   "other Linear/Conv layers by neuron)",
}

class Method:
    """One sparsification method (like ``torch.nn.utils.prune.BasePruningMethod``).

    Class attributes are the record: ``name``, ``family``, ``acts_on`` (what it can act on, in
    words), ``needs_linear_map`` (True: forward hooks on Linear/Conv layers, else any weight via
    its parametrization), ``defaults`` (``lr`` included: the optimizer's learning rate),
    ``help`` (one line per hyperparameter), ``has_tol`` (test-time keep-ratio tolerance),
    ``torch_forms`` (closed-form penalties computed in torch), ``granularities`` (the values of
    the common hyperparameter ``granularity`` it accepts, ``dualdrop.nn._groups``), ``paper``
    (the LeNet-300-100
    result reported in the paper: ``(label, test error, fraction nonzero)``, or None) and
    ``lam_per_dataset`` (for the methods whose default ``lam=None`` means
    ``lam_per_dataset / n_train``, the Bayesian choice; else None).
    An instance holds validated hyperparameters (``hparams``).
    """

    name: str = ""
    family: str = ""
    acts_on: str = "any weight tensor"
    needs_linear_map: bool = False
    defaults: dict = {}
    help: dict = {}
    has_tol: bool = False
    torch_forms: tuple = ()
    #: the ``granularity`` values the method accepts (every method: all of them)
    granularities: tuple = GRANULARITIES
    paper: tuple | None = None
    lam_per_dataset: float | None = None
    #: display name (None: the paper's label where it has one, else the method's name)
    label: str | None = None
    #: whether ``regularizer(n_train)`` puts a term in the loss (False: the method acts in
    #: ``after_step`` alone, e.g. magnitude pruning, AdaProx's prox)
    loss_term: bool = True
    #: whether training draws noise (a ``NoiseState``): the runs of a seed differ by method
    stochastic: bool = False
    #: per dataset (``dualdrop.train``'s dataset names): hyperparameters (and ``"lr"``) replacing
    #: the defaults there, chosen on that dataset's validation split
    dataset_defaults: dict = {}
    #: the frontier's sweep knob ``(hparam, low, high, Knob options)``; None: ``lam`` a decade
    #: either side of its default
    knob: tuple | None = None
    #: position in ``dualdrop.train.experiments.compare``'s default list (None: not in it)
    compare_rank: int | None = None
    #: speed floor: the least extra work per step beyond the dense step, in the components of
    #: ``benchmarks/bench_floors.py`` (``r``: neuron gates per step over weights), and the ratio
    #: to that floor the fused step is expected to stay under
    floor: dict = {}
    floor_target: float | None = None

    @classmethod
    def display_label(cls) -> str:
        """The method's display name: ``label``, else the paper's label, else its name."""
        if cls.label is not None:
            return cls.label
        return cls.paper[0] if cls.paper is not None else cls.name

    def __init__(self, **hparams):
        hp = self.default_hparams()
        unknown = sorted(set(hparams) - set(hp))
        if unknown:
            raise TypeError(f"unknown hyperparameter(s) {unknown} for method {self.name!r}; "
                            f"valid ones are {sorted(hp)} (see default_hparams({self.name!r}))")
        hp.update(hparams)
        lr = hp.pop("lr")
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0:
            # the optimizer's rate: ValueError for any bad value (its documented error)
            raise ValueError(f"lr must be a positive number, got {lr!r}")
        granularity = self.check_granularity(hp.pop("granularity"))
        hp = self.validate(hp)
        hp["lr"] = float(lr)
        hp["granularity"] = granularity
        self.hparams = hp

    @classmethod
    def default_hparams(cls) -> dict:
        """A fresh copy of the defaults (``lr`` included, and ``granularity``, common to every
        method)."""
        return {**copy.deepcopy(dict(cls.defaults)), **COMMON_DEFAULTS}

    @classmethod
    def describe(cls) -> dict:
        """``{name: (default, one-line description)}`` of every hyperparameter."""
        help = {**COMMON_HELP, **cls.help}
        return {k: (v, help.get(k, "")) for k, v in cls.default_hparams().items()}

    @classmethod
    def check_granularity(cls, value) -> str:
        """``value`` as a canonical granularity this method accepts (``dualdrop.nn._groups``)."""
        value = check_granularity(value)
        if value not in cls.granularities:
            raise ValueError(f"granularity={value!r} is not available for method {cls.name!r}, "
                             f"which takes {list(cls.granularities)}")
        return value

    def groups_of(self, target):
        """The ``Groups`` of ``target`` for this method's granularity (None: single weights)."""
        groups = groups_of(target, self.hparams.get("granularity", "weight"))
        if isinstance(groups, str):  # skip_reason refuses it before any state is made
            raise ValueError(f"{target.name}: {groups}")
        return groups

    def validate(self, hp: dict) -> dict:
        return dict(hp)

    def state_hparams(self) -> dict:
        """Hyperparameters handed to each weight's state (the groups come from
        :meth:`groups_of`)."""
        return {k: v for k, v in self.hparams.items() if k not in ("lr", "granularity")}

    def skip_reason(self, target) -> str | None:
        """Why this method cannot act on ``target`` (a ``targets.Target``), or None."""
        if target.param.numel() == 0:
            return f"it has no entries (shape {tuple(target.param.shape)}): nothing to prune"
        groups = groups_of(target, self.hparams.get("granularity", "weight"))
        if isinstance(groups, str):
            return groups
        if not self.needs_linear_map:
            return None
        for site in target.sites:
            reason = linear_map_reason(site.module, site.parent)
            if reason is None and site.tensor_name != "weight":
                reason = f"{site.tensor_name} is not the layer's weight"
            if reason is not None:
                return f"{self.name} changes the layer's forward and {reason}"
        return None

    def make_state(self, target) -> WeightState:  # pragma: no cover - abstract
        raise NotImplementedError

    def attach(self, target, state: WeightState) -> None:
        """Register forward hooks (methods that change the forward)."""

    def extra_tensors(self, target) -> list:
        """Other ``(module, tensor name)`` the same state also parametrizes (a bias gated with
        its channel); they are neither counted nor regularized."""
        return []

    def after_step(self, sp, optimizer, step: int, total_steps: int) -> None:
        """Called by ``Sparsifier.after_step`` after every optimizer step."""

    def __repr__(self):
        hp = {k: v for k, v in self.hparams.items() if k != "penalty"}
        return f"{type(self).__name__}({hp})"


def remove_state_hooks(module: nn.Module) -> int:
    """Remove every forward (pre-)hook and state-dict hook of ``module`` that belongs to a
    ``WeightState``."""
    n = 0
    hooks = module._load_state_dict_pre_hooks
    for key in [k for k, fn in hooks.items() if isinstance(_hook_owner(fn), WeightState)]:
        del hooks[key]
    for hooks, extra in ((module._forward_hooks, module._forward_hooks_with_kwargs),
                         (module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs)):
        for key in [k for k, fn in hooks.items()
                    if isinstance(getattr(fn, "__self__", None), WeightState)]:
            del hooks[key]
            extra.pop(key, None)
            module._forward_hooks_always_called.pop(key, None)
            n += 1
    return n
