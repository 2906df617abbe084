"""``sparsify`` and the ``Sparsifier`` handle it returns.

Regularizer scale (one convention for every method): ``Sparsifier.regularizer(n_train)`` is
added to the *mean* data loss and equals ``lam * sum_j r(theta_j)`` over the sparsified weights,
where ``r`` is the method's per-weight penalty (variational dropout: the KL divergence per weight;
hard-concrete: the probability that a weight's gate is nonzero, i.e. the expected L0 norm;
LogSum / ``penalty:<name>``: ``Omega(w)``; AdaTikhonov: ``w^2/(2 eta_hat(w))``; eta-trick: its
joint objective). So an explicit ``lam`` means the same per-weight strength for every method and
does not depend on the dataset size. The Bayesian methods' default ``lam=None`` is the evidence
lower bound per example, ``lam = c / n_train`` (variational dropout ``c = 1``; hard-concrete
``c = 0.1``, Louizos et al. 2018), which does scale with ``n_train``: on a small dataset it is a
strong prior. ``Sparsifier.check_balance`` warns when the regularizer dominates the data loss.
"""

from __future__ import annotations

import itertools
import math
import warnings
import weakref

import torch
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from dualdrop.nn import density as _density
from dualdrop.nn import registry as _methods
from dualdrop.nn._memory import tune_allocator
from dualdrop.nn._coupling import coupled_units, head_ties, hold_norms, unit_ties
from dualdrop.nn._base import check_choice, check_float, check_int, register_state, state_of
from dualdrop.nn._graph import check_inputs
from dualdrop.nn._groups import Groups, groups_of
from dualdrop.nn._undo import undo_on_error
from dualdrop.nn.export import export_sparse, fold, sparsity_report
from dualdrop.nn._save_route import route_save_pretrained
from dualdrop.nn.targets import all_targets, plain_class, select, unknown_weights

METHODS = _methods.METHODS

# An optimizer built before ``sparsify`` holds the weights but not the method's new parameters
# (log-alpha, gates, p); it is refused before its first step, through one global step pre-hook
# that looks at each optimizer once. States are watched weakly (they live as long as the model).
_LIVE: "weakref.WeakSet" = weakref.WeakSet()
_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_STEP_HOOK = []


def _check_before_first_step(optimizer, args, kwargs):
    if optimizer in _CHECKED:
        return
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    missing = []
    for st in list(_LIVE):
        weight = st.watched_weight()
        if weight is not None and id(weight) in held:
            missing += [f"{n} {tuple(p.shape)}" for n, p in st.named_parameters()
                        if id(p) not in held]
    if missing:
        raise ValueError(
            f"the optimizer holds sparsified weights but not {len(missing)} parameter(s) the "
            f"method added ({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}); "
            "build the optimizer after sparsify(model, ...) from model.parameters()")
    _CHECKED[optimizer] = True


def _watch_optimizers(pairs) -> None:
    for t, st in pairs:
        if any(True for _ in st.parameters()):
            st.watch_weight(t.param, [(s.module, s.tensor_name) for s in t.sites])
            _LIVE.add(st)
    if _LIVE and not _STEP_HOOK:
        _STEP_HOOK.append(register_optimizer_step_pre_hook(_check_before_first_step))


def default_hparams(method: str) -> dict:
    """The default hyperparameters of ``method`` (a fresh dict; ``lr`` is for the optimizer).

    Defaults are the paper's: ``tol = 0.05``; LogSum ``eps = 2``, ``lam = 1e-3`` for
    logsum/adatikhonov/adaprox/eta-trick (and the released eta-trick's ``eta_weight_decay = 1e-3``,
    ``init_log_ratio = 5``); learning rates 1e-4 (vardrop-lr-ar, logsum, adatikhonov, adaprox) and
    1e-3 (vardrop-lr, vardrop, eta-trick). Other methods use their papers' values.
    """
    return _methods.default_hparams(method)


class Sparsifier:
    """Handle on a sparsified model: regularizer, post-step hook, densities, export.

    It holds the method record (``record``, with the validated ``hparams``), the acted-on
    targets and a reference to the model; all numeric state lives in the model (parameters and
    buffers of the weights' parametrizations), so ``model.state_dict()`` plus the optimizer's
    state dict describe a run completely. ``Sparsifier.attach(model, method, ...)`` re-creates a
    handle for a model that is already sparsified (e.g. a deep copy) from what ``sparsify``
    recorded on its states (:func:`sparsified_with`); only the handle holds the target-density
    controller's progress and the units coupled through ``example_inputs``, so keep it (and pass
    it to ``dualdrop.train.fit``) to continue a run.
    """

    def __init__(self, model: nn.Module, record, pairs, skipped=()):
        self.model = model
        self.record = record
        self.method = record.name
        self.hparams = record.hparams
        self._pairs = list(pairs)
        self.skipped = list(skipped)   # [(target name, reason)]
        #: coupled units ([(pair index, unit indices, root indices)] per set,
        #: ``dualdrop.nn._coupling``), pruned together: an attention's heads in its q/k/v and
        #: output projections, and with ``example_inputs`` the output units tied by the graph
        self.ties: list = []
        #: BatchNorm entries held at zero with the units that write them (same module)
        self.norm_holds: list = []
        self._checked_opt = None
        self._removed = False
        #: weights whose layer's forward hook never ran although they were read in training
        #: (used through ``F.linear(x, layer.weight)`` or similar): the method's noise or gates
        #: do not act on them, only its regularizer does; each is named in a warning
        self.bypassed: list[str] = []
        self._watch = [(t, st) for t, st in self._pairs if record.needs_linear_map]
        _watch_optimizers(self._pairs)
        #: the ``dualdrop.nn.density.DensityController`` of ``sparsify(..., target_density=D)``
        self.controller = None
        # model.save_pretrained of a Hugging Face model saves the pruned weights (dualdrop.nn.hf)
        route_save_pretrained(model)

    @classmethod
    def attach(cls, model: nn.Module, method: str, **hparams) -> "Sparsifier":
        """A new handle on ``model``, already sparsified with ``method``: the hyperparameters
        ``sparsify`` recorded on the states (:func:`sparsified_with`; the test-time ``tol``
        as the states hold it now), ``hparams`` given here replacing them, and the heads of an
        attention tied as ``sparsify`` ties them. It has no target-density controller (set
        ``sp.controller = dualdrop.nn.density.DensityController(sp, D)``, or keep the handle
        of ``sparsify``) and knows no units coupled through ``example_inputs``."""
        pairs = cls.check_attach(model, method)
        made = _made_with(pairs)
        if made is not None:
            hparams = {**made["hparams"], **hparams}
        else:
            kinds = {st.groups.kind for _, st in pairs if st.groups is not None}
            if kinds and "granularity" not in hparams:  # the states' groups, not the default
                hparams = {**hparams, "granularity": "head" if "head" in kinds else "neuron"}
        sp = cls(model, _methods.get(method, **hparams), pairs)
        sp.ties, sp.norm_holds = unit_ties(pairs, [])
        return sp

    @staticmethod
    def check_attach(model: nn.Module, method: str) -> list:
        """ValueError unless ``model``'s sparsified weights all use ``method`` (what
        :meth:`attach` needs); returns their ``(Target, WeightState)`` pairs."""
        pairs = _find_states(model)
        found = {st.method for _, st in pairs}
        if found != {method}:
            raise ValueError(f"model's sparsified weights use methods {sorted(found)}, not "
                             f"{method!r}")
        return pairs

    def check_model(self, model: nn.Module) -> None:
        """ValueError unless this handle is live on ``model``'s sparsified weights (not
        removed, made for ``model``, the states it holds are the model's)."""
        if self._removed:
            raise ValueError("this Sparsifier was removed (remove/finalize): the model is plain "
                             "again; sparsify it anew")
        if self.model is not model:
            raise ValueError("this Sparsifier is the handle of another model (sp.model is not "
                             "model); use it with the model it was made for")
        if [id(st) for _, st in _find_states(model)] != [id(st) for _, st in self._pairs]:
            raise ValueError("the model's sparsified weights are no longer those of this "
                             "Sparsifier (sparsified again since?); use the handle of the "
                             "sparsify call that made them")

    def states(self) -> list:
        """``(Target, WeightState)`` of every sparsified weight (a tied weight once)."""
        self._check_live()
        return self._pairs

    @property
    def targets(self) -> list[str]:
        """Names of the sparsified weights (a layer's ``weight`` by the layer's name)."""
        return [t.key for t, _ in self._pairs]

    @property
    def layers(self) -> list:
        """Deprecated name of :meth:`named_states` (it yielded layer modules before 0.2)."""
        warnings.warn("Sparsifier.layers is deprecated: it yields (name, WeightState) pairs, no "
                      "longer layer modules; use sp.named_states() (or sp.targets for the names "
                      "and dualdrop.nn.state_of(module, 'weight') for one layer's state)",
                      DeprecationWarning, stacklevel=2)
        return self.named_states()

    def named_states(self) -> list:
        """``(name, WeightState)`` of every sparsified weight (names as in ``targets``)."""
        return [(t.key, st) for t, st in self.states()]

    def _check_live(self):
        if self._removed:
            raise ValueError("this Sparsifier's parametrizations were removed (finalize/remove); "
                             "sparsify the model again to continue")

    def regularizer(self, n_train: int, *, value: bool = True) -> torch.Tensor:
        """Scalar to add to the mean-over-batch data loss (see the module docstring).

        ``value=False`` is for training loops that do not log the regularizer: the returned
        scalar is exactly 0 but its gradient is the regularizer's, and the per-weight work that
        only the value needs (the logs of LogSum, the KL, the eta-trick dual, table lookups) is
        skipped. Log the value when needed with ``regularizer(n_train)`` under ``torch.no_grad()``.
        """
        n_train = check_int("n_train", n_train, low=1)
        if not isinstance(value, bool):
            raise TypeError(f"value must be True or False, got {type(value).__name__}")
        self._check_bypass()
        terms = [st.regularizer_term(t.param, n_train, value) for t, st in self.states()]
        total = torch.stack(terms).sum()
        return total if value else total - total.detach()

    def _check_bypass(self) -> None:
        """Warn once per weight used in training without its layer's forward (see ``bypassed``).

        Runs until every watched weight's hook has been seen (the first step of a normal run),
        then costs nothing."""
        if not self._watch:
            return
        keep = []
        for t, st in self._watch:
            if st.hook_seen:
                continue
            if st.read_seen:
                self.bypassed.append(t.key)
                warnings.warn(
                    f"sparsify: {t.key} was used in training without calling its layer's forward "
                    f"(e.g. F.linear(x, layer.weight) in a parent module), so {self.method}'s "
                    "noise/gates, which act in the layer's forward hook, do not apply to it and "
                    "only the regularizer does; call the layer itself, exclude the weight, or "
                    "use a method that acts through the weight (vardrop, hardconcrete, the "
                    "penalty methods)", RuntimeWarning, stacklevel=3)
                continue
            keep.append((t, st))
        self._watch = keep

    def check_balance(self, data_loss, n_train: int, ratio: float = 10.0) -> float:
        """``regularizer / data loss`` now; warns when it exceeds ``ratio`` (call it at the
        start of training: a regularizer that dominates the data loss collapses the network).

        The default 10 stays quiet for the paper's settings on MNIST (LogSum ``lam = 1e-3``:
        ~1.7x the initial loss of LeNet-5, variational dropout's ELBO from scratch: ~6x on
        LeNet-300-100) and warns for the ELBO on small data (~150x at 2048 samples) and when
        warm-starting from a trained network, whose data loss is near 0."""
        with torch.no_grad():
            reg = float(self.regularizer(n_train))
        loss = float(data_loss)
        if not math.isfinite(loss) or loss < 0:
            raise ValueError(f"data_loss must be a finite number >= 0 (the data term of the "
                             f"loss), got {loss!r}: a NaN or infinite loss means the training "
                             "diverged (lower the learning rate) or the data hold NaN")
        r = reg / loss if loss > 0 else float("inf")
        if r > ratio:
            warnings.warn(
                f"{self.method}: the regularizer ({reg:.4g}) is {r:.3g}x the data loss "
                f"({loss:.4g}) at n_train={n_train}; it will dominate training and may prune the "
                "network to nothing. Lower lam (an explicit lam is per weight and per example, "
                "the default None of variational dropout / hard-concrete is c/n_train).",
                RuntimeWarning, stacklevel=2)
        return r

    def method_parameters(self) -> dict:
        """``{qualified name: Parameter}`` the training needs: the weights and method state."""
        named = dict(self.model.named_parameters())
        want = {id(t.param) for t, _ in self.states()}
        for _, st in self._pairs:
            want.update(id(p) for p in st.parameters())
        return {n: p for n, p in named.items() if id(p) in want and p.requires_grad}

    def check_optimizer(self, optimizer) -> None:
        """Raise ``ValueError`` naming every method parameter ``optimizer`` does not hold."""
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in self.method_parameters().items() if id(p) not in held]
        if missing:
            raise ValueError(
                f"the optimizer does not hold {len(missing)} parameter(s) of the sparsified "
                f"model: {missing[:8]}{' ...' if len(missing) > 8 else ''}; build the optimizer "
                "after sparsify(model, ...) from model.parameters()")

    def after_step(self, optimizer, step: int, total_steps: int) -> None:
        """Call after every ``optimizer.step()``; ``step`` counts the steps taken (1-based).

        On the first call with an optimizer it checks that the optimizer holds every weight and
        every new parameter of the method (``check_optimizer``)."""
        total_steps = check_int("total_steps", total_steps, low=1)
        step = check_int("step", step, low=0)
        if step > total_steps:
            raise ValueError(f"step ({step}) must not exceed total_steps ({total_steps})")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self._check_bypass()
        if optimizer is not None and self._checked_opt is not optimizer:
            self.check_optimizer(optimizer)
            self._checked_opt = optimizer
        self.record.after_step(self, optimizer, step, total_steps)
        if self.controller is not None:
            self.controller.update(step, total_steps, optimizer)
        if self.norm_holds:
            hold_norms(self.norm_holds, self._units_alive(), optimizer)

    def _units_alive(self) -> list:
        """Per weight: a flat bool mask over its units that the schedule keeps (the
        target-density masks, else the method's own, ``WeightState.kept_units``)."""
        masks = getattr(self.controller, "masks", None)
        if masks is not None:
            return [m.flatten() for m in masks]
        return [st.kept_units() for _, st in self._pairs]

    @property
    def has_strength(self) -> bool:
        """Whether the method has a strength ``lam`` (every method but magnitude pruning)."""
        return "lam" in self.hparams

    def set_strength(self, multiplier: float) -> None:
        """Multiply every method's strength ``lam`` by ``multiplier`` (> 0; 1 = as given): the
        regularizer and its gradient, adaprox's prox and the penalty methods' keep-ratio cut
        follow. The one entry point of the target-density controller (``dualdrop.nn.density``);
        magnitude pruning has no strength and refuses it."""
        if not self.has_strength:
            raise ValueError(f"{self.method} has no strength lam to multiply (magnitude pruning: "
                             "set its sparsity)")
        m = check_float("multiplier", multiplier, low=0.0, low_open=True)
        for _, st in self.states():
            st.strength = m
            if self.has_tol:
                st.set_tol(st.tol)  # the penalty methods' cut depends on lam * strength

    def method_param_groups(self, lr: float, total_steps: int) -> list[dict]:
        """Optimizer param groups with budget-aware rates for the method's own parameters
        (``dualdrop.nn.density.method_param_groups``)."""
        return _density.method_param_groups(self, lr, total_steps)

    def state_dict(self) -> dict:
        """State kept outside the model: the target-density controller's (empty without one)."""
        return {} if self.controller is None else {"controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (TypeError/ValueError, nothing changed, when it
        does not fit this handle)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict (Sparsifier.state_dict()), got "
                            f"{type(state).__name__}")
        unknown = sorted(map(str, set(state) - {"controller"}))
        if unknown:
            raise ValueError(f"state has unknown entries {unknown}: not a Sparsifier.state_dict()")
        if "controller" in state:
            if self.controller is None:
                raise ValueError("the state has a target-density controller but this Sparsifier "
                                 "was made without target_density")
            self.controller.load_state_dict(state["controller"])
        elif self.controller is not None:
            raise ValueError("the state has no target-density controller but this Sparsifier "
                             "was made with target_density; load the state of a run with one")

    @property
    def has_tol(self) -> bool:
        """Whether the method's test-time rule is a keep-ratio tolerance (see ``set_tol``)."""
        return self.record.has_tol

    def set_tol(self, tol: float) -> None:
        """Change the test-time pruning tolerance ``tol`` of every weight (keep ratio < tol is
        pruned) without retraining: the density/accuracy trade-off of a trained network.
        ``hparams["tol"]`` follows. Choose it on validation data, never on the test set."""
        if not self.has_tol:
            raise ValueError(f"method {self.method!r} has no keep-ratio tolerance: hard-concrete "
                             "uses its deterministic test gate and magnitude its masks")
        for _, st in self.states():
            st.set_tol(tol)
        self.hparams["tol"] = self._pairs[0][1].tol

    @torch.no_grad()
    def density(self) -> dict:
        """``{weight name: fraction of nonzero test-time weights, ..., "total": fraction}``
        over the sparsified weights (a tied weight once; biases are not counted). A NaN or
        infinite weight counts as nonzero, and a ``RuntimeWarning`` names the weights holding
        one (a diverged training is not a dense network)."""
        out, nnz, tot, bad = {}, 0, 0, []
        for t, st in self.states():
            value = st.eval_weight(t.param)
            k, n = int(torch.count_nonzero(value)), t.param.numel()
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                bad.append(f"{t.key} ({int((~torch.isfinite(value)).sum())} of {n})")
            out[t.key] = k / n
            nnz += k
            tot += n
        out["total"] = nnz / tot
        if bad:
            warnings.warn(f"density: {len(bad)} sparsified weight(s) hold NaN or inf entries, "
                          f"counted as nonzero: {', '.join(bad[:6])}"
                          f"{' ...' if len(bad) > 6 else ''}; the training diverged (lower the "
                          "learning rate or the method's strength)", RuntimeWarning,
                          stacklevel=2)
        return out

    def report(self) -> list[dict]:
        return sparsity_report(self.model)

    def export(self, layout: str = "auto", **kwargs) -> nn.Module:
        return export_sparse(self.model, layout, **kwargs)

    def remove(self, leave_sparse: bool = True) -> nn.Module:
        """Undo ``sparsify`` in place (like ``parametrize.remove_parametrizations``): every
        weight becomes a plain Parameter again (the same Parameter objects, so an optimizer
        still holds them) holding its test-time value (``leave_sparse=True``: masks and gates
        folded in) or its trained original (``False``); method state and hooks are removed.
        Returns the model; this handle cannot be used afterwards."""
        self._check_live()
        fold(self.model, leave_sparse=leave_sparse)
        self._removed = True
        return self.model

    def finalize(self) -> nn.Module:
        """``remove(leave_sparse=True)``: make the pruning permanent in place."""
        return self.remove(leave_sparse=True)

    def __repr__(self):
        hp = {k: v for k, v in self.hparams.items() if k != "penalty"}
        return f"Sparsifier(method={self.method!r}, weights={len(self._pairs)}, hparams={hp})"


def is_sparsified(model: nn.Module) -> bool:
    """Whether ``model`` already carries dualdrop states (then ``Sparsifier.attach`` re-creates
    its handle and ``sparsify`` refuses it)."""
    return bool(_find_states(model))


#: the attribute of a weight's state that holds what ``sparsify`` made it with
_MADE_WITH = "made_with"


def sparsified_with(model: nn.Module) -> dict | None:
    """What ``sparsify`` recorded on ``model``'s states: ``{"method", "hparams" (every
    hyperparameter, as ``sparsify(model, method, **hparams)`` takes them; ``tol`` as the states
    hold it now), "target_density" (None without one), "coupled" (whether ``example_inputs``
    tied units across layers)}``; None for a plain model or states made another way. A deep copy
    carries it; a handle's controller and coupled units it does not (they live in the
    ``Sparsifier``)."""
    return _made_with(_find_states(model))


def _made_with(pairs) -> dict | None:
    made = [getattr(st, _MADE_WITH, None) for _, st in pairs]
    if not made or any(m is None for m in made):
        return None
    out = {**made[0], "hparams": dict(made[0]["hparams"])}
    if "tol" in out["hparams"] and hasattr(pairs[0][1], "tol"):
        out["hparams"]["tol"] = pairs[0][1].tol  # set_tol and the controller's last step move it
    return out


def _record_made_with(pairs, record, target_density, coupled: bool) -> None:
    """Record on every state the call that made it (:func:`sparsified_with`)."""
    keys = _methods.default_hparams(record.name)
    made = {"method": record.name, "target_density": target_density, "coupled": coupled,
            "hparams": {k: v for k, v in record.hparams.items() if k in keys}}
    for _, st in pairs:
        setattr(st, _MADE_WITH, made)


def _find_states(model):
    pairs = []
    for t in all_targets(model):
        st = state_of(t.sites[0].module, t.sites[0].tensor_name)
        if st is not None:
            pairs.append((t, st))
    return pairs


def sparsify(model: nn.Module, method: str, *, include=None, exclude=None,
             on_unsupported: str = "warn", target_density: float | None = None,
             example_inputs=None, **hparams) -> Sparsifier:
    """Sparsify ``model`` in place with ``method``; returns the ``Sparsifier`` handle.

    Every selected weight tensor gets the method's state as its ``torch.nn.utils.parametrize``
    parametrization (methods that change the forward also hook the layer). By default the
    weights of every weight-bearing layer are selected (``dualdrop.nn.targets``: Linear and
    subclasses, Hugging Face's Conv1D, Conv*/ConvTranspose*, Embedding, RNN/LSTM/GRU,
    MultiheadAttention); biases and normalization parameters are not, and the ``weight`` (2-D
    or more) of a module of any other type is named in a warning. ``include`` / ``exclude``:
    name patterns (``fnmatch`` on parameter names; a module name means its weights) and/or
    module types. A weight the method cannot act on (e.g. local reparameterization on an LSTM
    weight or a tied embedding) is skipped with a warning naming it and why
    (``on_unsupported="error"``: raise instead). A weight tied to several modules gets one
    state. Arguments are checked before the model is touched, and a call that fails while
    acting (``example_inputs`` the model cannot run) puts the model back as it was given.

    ``target_density=D`` (in (0, 1]): the finished network keeps a fraction ``D`` of the
    sparsified weights, whatever the method; its strength becomes a multiplier adjusted during
    training by ``after_step`` (schedule per method: ``dualdrop.nn.density``; magnitude pruning
    gets ``sparsity = 1 - D``). Pass the full budget as ``total_steps`` to ``after_step``.

    ``example_inputs`` (with ``granularity="neuron"``/``"channel"``/``"head"``; needs
    torch-pruning): inputs of one forward run, ``model(example_inputs)``, from which the output
    units that only leave the network together are found (the channels of a residual stream,
    written by every layer added into it: ``dualdrop.nn._coupling``); the target-density
    schedule and magnitude pruning then prune them together, which the compact export needs to
    remove them. Without it, units are pruned layer by layer.

    New learnable tensors become parameters of the model, so build the optimizer *after* this
    call (``after_step`` checks it). Hyperparameters not given take ``default_hparams(method)``;
    unknown names raise ``TypeError``. The global torch RNG initializes stochastic parameters
    (hard-concrete gate logits): seed it first for reproducibility. On glibc it also fixes
    malloc's mmap/trim thresholds once per process (``dualdrop.nn._memory``;
    ``DUALDROP_MALLOC_TUNING=0`` opts out).

    Training loop::

        sp = sparsify(model, "vardrop-lr")
        opt = torch.optim.Adam(model.parameters(), lr=sp.hparams["lr"])
        for step, (x, y) in enumerate(batches, 1):
            loss = F.cross_entropy(model(x), y) + sp.regularizer(n_train)
            opt.zero_grad(); loss.backward(); opt.step()
            sp.after_step(opt, step, total_steps)
        sp.density()          # deterministic test-time densities
        plain = export_sparse(model, layout="dense")
    """
    if "layers" in hparams:
        raise TypeError("sparsify(..., layers=...) was replaced by include=[...] (module names, "
                        "parameter name patterns or module types) and exclude=[...]")
    if target_density is not None:
        target_density = _density.check_density(target_density)
        if "lam" not in _methods.default_hparams(method):  # no strength: its final sparsity
            if "sparsity" in hparams:
                raise TypeError(f"give {method} either sparsity or target_density, not both")
            hparams["sparsity"] = 1.0 - target_density
            if "min_layer_density" in _methods.default_hparams(method):
                # the schedule's floor, not a per-layer 1% that binds every layer at D <= 1%
                hparams.setdefault("min_layer_density", _density.MIN_LAYER_DENSITY)
    record = _methods.get(method, **hparams)
    check_choice("on_unsupported", on_unsupported, {"warn", "error"})
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_materialized(model)
    if _find_states(model):
        raise ValueError("model is already sparsified; call sparsify once per model (or "
                         "export_sparse(model) / Sparsifier.remove() first to get a plain model)")
    granularity = record.hparams.get("granularity", "weight")
    if example_inputs is not None:
        if granularity == "weight":
            raise ValueError("example_inputs couples whole units (channels of a residual "
                             "stream): give granularity='neuron', 'channel' or 'head' too, or "
                             "leave example_inputs out")
        check_inputs(example_inputs)
    foreign = []
    chosen, _ = select(model, include, exclude, foreign=foreign)
    if granularity == "head":
        _check_heads(chosen)
    acted, skipped = [], []
    for t in chosen:
        reason = record.skip_reason(t)
        (skipped.append((t, reason)) if reason else acted.append(t))
    lines = "\n".join(f"  {t.name} ({t.kinds}): {r}" for t, r in skipped)
    if skipped and (on_unsupported == "error" or not acted):
        raise ValueError(f"method {record.name!r} cannot act on {len(skipped)} selected "
                         f"weight(s):\n{lines}\nexclude them (exclude=[...]) or choose a "
                         "method that only transforms the weight")
    unknown = unknown_weights(model, exclude) if include is None else []
    # act: a failure from here on (a forward run the trace needs, a state that cannot be made)
    # puts the model back as it was given
    with undo_on_error(model, values=None if example_inputs is None else "buffers", rng=True):
        coupled = [] if example_inputs is None else coupled_units(model, example_inputs)
        tune_allocator()  # see dualdrop.nn._memory: numba in this process would slow torch ~8x
        pairs = []
        for t in acted:
            state = record.make_state(t)
            for site in t.sites:
                register_state(site.module, site.tensor_name, state)
            for mod, name in record.extra_tensors(t):
                register_state(mod, name, state)
            record.attach(t, state)
            pairs.append((t, state))
        sp = Sparsifier(model, record, pairs, [(t.name, r) for t, r in skipped])
        sp.ties, sp.norm_holds = unit_ties(pairs, coupled)
        if target_density is not None:
            sp.controller = _density.DensityController(sp, target_density)
        # units tied through example_inputs, beyond the heads attach finds again
        traced = len(sp.ties) > len(head_ties(pairs)) or bool(sp.norm_holds)
        _record_made_with(pairs, record, target_density, traced)
    if foreign:
        flines = "\n".join(f"  {q} ({plain_class(m).__name__}): {r}" for q, m, r in foreign)
        warnings.warn(f"sparsify: {len(foreign)} tensor(s) transformed by another tool are left "
                      f"as they are:\n{flines}", UserWarning, stacklevel=2)
    if skipped:
        warnings.warn(f"sparsify: method {record.name!r} skips {len(skipped)} weight(s), "
                      f"left dense:\n{lines}", UserWarning, stacklevel=2)
    if unknown:
        ulines = "\n".join(f"  {q} ({kind})" for q, kind in unknown)
        warnings.warn(f"sparsify: {len(unknown)} weight(s) of layer types dualdrop does not "
                      f"know are left dense:\n{ulines}\nselect them with include=[...] (the "
                      "methods acting through the weight take any tensor; include replaces the "
                      "default selection) or name them in exclude=[...] to silence this",
                      UserWarning, stacklevel=2)
    return sp


def check_materialized(model: nn.Module) -> None:
    """ValueError when ``model`` holds tensors on the ``meta`` device (shapes without data)."""
    meta = [n for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
            if t.is_meta]
    if meta:
        raise ValueError(f"model has {len(meta)} tensor(s) on the meta device ({meta[0]}, ...): "
                         "shapes without data, as a model built under torch.device('meta') or "
                         "an unloaded checkpoint leaves them; materialize it first (e.g. "
                         "model.to_empty(device='cpu') then load its weights)")


def _check_heads(chosen) -> None:
    """ValueError when ``granularity="head"`` finds no attention heads among the weights."""
    if any(isinstance(g, Groups) and g.kind == "head"
           for g in (groups_of(t, "head") for t in chosen)):
        return
    raise ValueError("granularity='head' prunes the heads of torch.nn.MultiheadAttention and no "
                     "selected weight belongs to one (attention written with plain Linear or "
                     "Conv1D projections, such as Hugging Face's GPT2Attention, is not read as "
                     "heads); use granularity='neuron' (= 'channel': the output units of "
                     "Linear/Conv layers) or 'weight'")
