"""Which tensors of a model are sparsified: discovery of weights, aliases and the selection API.

A *target* is one weight Parameter together with every place it is reachable from: the
``(module, tensor name)`` sites that hold it and every qualified name (``"enc.weight"``,
``"dec.weight"`` for a tied weight). Methods keep one state per target, so a tied weight is
transformed, regularized and counted once.

Default selection: the weight matrices / kernels of the weight-bearing layers, by module type
(subclasses included):

- ``Linear``, ``Bilinear``, ``Conv1d/2d/3d``, ``ConvTranspose1d/2d/3d``, ``Embedding``,
  ``EmbeddingBag`` and Hugging Face's ``Conv1D`` (GPT-2's Linear layer, ``dualdrop.nn._layers``):
  ``weight``;
- ``RNN``, ``LSTM``, ``GRU``: every ``weight_ih_l*``, ``weight_hh_l*`` (and ``weight_hr_l*``);
- ``MultiheadAttention``: ``in_proj_weight`` or ``q_proj_weight``/``k_proj_weight``/
  ``v_proj_weight`` (``out_proj`` is a ``Linear``).

Biases, normalization parameters and parameters of other modules are left alone unless selected
explicitly; a module of another type holding a ``weight`` of two or more dimensions is named by
:func:`unknown_weights`, so that ``sparsify`` can say it leaves it dense. ``include`` /
``exclude`` take a pattern (``fnmatch`` on qualified parameter names, e.g. ``"encoder.*"``,
``"*.weight_hh_*"``; a module name such as ``"fc1"`` means that module's default weights), a
module type (its default weights), or a list of those; a module of a type without default
weights is selected by name or type through its ``weight`` (2-D or more).
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field

import torch.nn as nn
from torch.nn.utils import parametrize, prune

from dualdrop.nn._base import WeightState
from dualdrop.nn._layers import is_conv1d

_WEIGHT_TYPES = (nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
                 nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Embedding, nn.EmbeddingBag)
_MHA_WEIGHTS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")


def default_weight_names(module: nn.Module) -> list[str]:
    """Names of the weight tensors of ``module`` that are sparsified by default."""
    params = _tensors(module)
    own = getattr(module, "sparsify_weights", None)
    if own is not None:
        names = list(own)
    elif isinstance(module, _WEIGHT_TYPES) or is_conv1d(module):
        names = ["weight"]
    elif isinstance(module, nn.RNNBase):
        names = [n for n in params if n.startswith(("weight_ih_l", "weight_hh_l", "weight_hr_l"))]
    elif isinstance(module, nn.MultiheadAttention):
        names = list(_MHA_WEIGHTS)
    else:
        names = []
    return [n for n in names if params.get(n) is not None]


@dataclass
class Site:
    """One place a target's tensor lives: ``module.<tensor_name>`` (``module_name`` is its first
    qualified name; ``parent`` the module that owns it, for MultiheadAttention's out_proj;
    ``default``: selected by default; ``named``: selected when its module is named in
    ``include``/``exclude`` by name or type, the default weights or, for a module type without
    any, its ``weight`` of two or more dimensions)."""
    module_name: str
    module: nn.Module
    tensor_name: str
    parent: nn.Module | None
    default: bool
    named: bool = False


@dataclass
class Target:
    """One weight Parameter and everywhere it is reachable from."""
    name: str                        # first qualified name
    param: nn.Parameter
    aliases: list = field(default_factory=list)   # every qualified name
    sites: list = field(default_factory=list)     # distinct (module, tensor name)

    @property
    def key(self) -> str:
        """Name used in densities and reports: a layer's ``weight`` by the layer's name."""
        if self.name.endswith(".weight") and any(s.default for s in self.sites):
            return self.name[:-len(".weight")]
        return self.name

    @property
    def kinds(self) -> str:
        """The owning modules' (plain) class names."""
        return "+".join(dict.fromkeys(plain_class(s.module).__name__ for s in self.sites))


def plain_class(module: nn.Module) -> type:
    """The module's class before ``torch.nn.utils.parametrize`` generated a subclass for it."""
    cls = type(module)
    return cls.__bases__[0] if parametrize.is_parametrized(module) else cls


def _tensors(module: nn.Module) -> dict:
    """The module's own parameters, parametrized ones by their original tensor.

    A parametrization with several originals (``weight_norm``'s ``original0``/``original1``)
    lists them under their state-dict names (``parametrizations.weight.original0``)."""
    out = {}
    if parametrize.is_parametrized(module):  # the weights (parametrized first: before biases)
        for name, plist in module.parametrizations.items():
            if hasattr(plist, "original"):
                out[name] = plist.original
            else:
                for i in itertools.count():
                    if not hasattr(plist, f"original{i}"):
                        break
                    out[f"parametrizations.{name}.original{i}"] = getattr(plist, f"original{i}")
    out.update(module._parameters)
    return out


def foreign_reason(module: nn.Module, tensor_name: str) -> str | None:
    """Why ``module.<tensor_name>`` is another tool's to transform, or None.

    ``sparsify`` acts on plain tensors: a tensor already parametrized by something else
    (``weight_norm``, ``orthogonal``, a user's parametrization) or pruned with
    ``torch.nn.utils.prune`` is left alone and named."""
    if parametrize.is_parametrized(module, tensor_name):
        plist = module.parametrizations[tensor_name]
        if not any(isinstance(p, WeightState) for p in plist):
            kinds = ", ".join(type(p).__name__ for p in plist)
            return (f"already parametrized ({kinds}); remove it with torch.nn.utils.parametrize."
                    "remove_parametrizations(module, name) first, or exclude the tensor")
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, prune.BasePruningMethod) and hook._tensor_name == tensor_name:
            return (f"pruned with torch.nn.utils.prune ({type(hook).__name__}); call "
                    "torch.nn.utils.prune.remove(module, name) first, or exclude it")
    return None


def foreign_weights(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """``(qualified name, module, reason)`` of every tensor of ``model`` another tool
    transforms (see :func:`foreign_reason`)."""
    out = []
    for mname, mod in _model_modules(model):
        names = list(mod.parametrizations.keys()) if parametrize.is_parametrized(mod) else []
        names += [h._tensor_name for h in mod._forward_pre_hooks.values()
                  if isinstance(h, prune.BasePruningMethod)]
        for name in dict.fromkeys(names):
            reason = foreign_reason(mod, name)
            if reason is not None:
                qual = f"{mname}.{name}" if mname else name
                out.append((qual, mod, reason))
    return out


def _model_modules(model: nn.Module):
    """``named_modules`` with duplicates, without the parametrization machinery inside."""
    for mname, mod in model.named_modules(remove_duplicate=False):
        if isinstance(mod, WeightState) or ".parametrizations" in f".{mname}":
            continue
        yield mname, mod


def all_targets(model: nn.Module) -> list[Target]:
    """Every model Parameter (method state excluded) with its aliases and sites."""
    by_id: dict[int, Target] = {}
    seen_sites = set()
    parents = {}
    for mname, mod in _model_modules(model):
        for cname, child in mod._modules.items():
            if child is not None:
                parents.setdefault(id(child), mod)
    for mname, mod in _model_modules(model):
        defaults = default_weight_names(mod)
        for pname, p in _tensors(mod).items():
            if p is None:
                continue
            named = pname in defaults or (not defaults and pname == "weight" and p.dim() >= 2)
            qual = f"{mname}.{pname}" if mname else pname
            t = by_id.get(id(p))
            if t is None:
                t = by_id[id(p)] = Target(qual, p)
            t.aliases.append(qual)
            if (id(mod), pname) not in seen_sites:
                seen_sites.add((id(mod), pname))
                t.sites.append(Site(mname, mod, pname, parents.get(id(mod)), pname in defaults,
                                    named))
    return list(by_id.values())


def _as_list(spec, arg):
    if spec is None:
        return None
    if isinstance(spec, (str, type)):
        spec = [spec]
    try:
        items = list(spec)
    except TypeError:
        raise TypeError(f"{arg} must be a name pattern, a module type or a list of those, got "
                        f"{type(spec).__name__}") from None
    for it in items:
        if not isinstance(it, (str, type)):
            raise TypeError(f"{arg}: entries must be name patterns (str) or module types, got "
                            f"{type(it).__name__} {it!r}")
        if isinstance(it, type) and not issubclass(it, nn.Module):
            raise TypeError(f"{arg}: {it.__name__} is not a torch.nn.Module subclass")
    return items


#: the check of an ``include`` / ``exclude`` argument (a pattern, a module type or a list of
#: those; None stays None), for the other selection APIs (one-shot pruning's layers)
check_patterns = _as_list


def _matches(target: Target, item) -> bool:
    if isinstance(item, type):
        return any(s.named and isinstance(s.module, item) for s in target.sites)
    if any(fnmatch.fnmatchcase(a, item) for a in target.aliases):
        return True
    # a module name (pattern) selects that module's default weights
    defaults = {s.tensor_name for s in target.sites if s.named}
    return any(a.rpartition(".")[2] in defaults and fnmatch.fnmatchcase(a.rpartition(".")[0], item)
               for a in target.aliases)


def _matches_foreign(qual: str, module: nn.Module, item) -> bool:
    if isinstance(item, type):
        return isinstance(module, item)
    return (fnmatch.fnmatchcase(qual, item)
            or fnmatch.fnmatchcase(qual.rpartition(".")[0], item))


def select(model: nn.Module, include=None, exclude=None, *,
           foreign: list | None = None) -> tuple[list[Target], list[Target]]:
    """``(selected, others)``: the targets to sparsify and every other parameter of the model.

    Tensors another tool transforms (:func:`foreign_weights`) are never selected; pass a list
    as ``foreign`` to receive ``(qualified name, module, reason)`` of those that the selection
    would otherwise have taken (``exclude`` may name them, which keeps them out of the list)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inc, exc = _as_list(include, "include"), _as_list(exclude, "exclude")
    targets = all_targets(model)
    others_foreign = foreign_weights(model)
    foreign_ids = {id(t.param) for t in targets for st in t.sites
                   if foreign_reason(st.module, st.tensor_name) is not None}
    if inc is None:
        chosen = [t for t in targets if any(s.default for s in t.sites)]
    else:
        if not inc:
            raise ValueError("include is empty; pass None to take every weight-bearing layer")
        for item in inc:
            if not any(_matches(t, item) for t in targets):
                names = [a for t in targets for a in t.aliases]
                raise ValueError(f"include: {getattr(item, '__name__', item)!r} matches no "
                                 f"parameter of the model; parameter names are {names}")
        chosen = [t for t in targets if any(_matches(t, it) for it in inc)]
    if exc is not None and not exc:
        raise ValueError("exclude is empty; pass None to exclude nothing")
    for item in exc or ():
        if not any(_matches(t, item) for t in targets) and not any(
                _matches_foreign(q, m, item) for q, m, _ in others_foreign):
            names = [a for t in targets for a in t.aliases]
            raise ValueError(f"exclude: {getattr(item, '__name__', item)!r} matches no "
                             f"parameter of the model; parameter names are {names}")
    if exc:
        chosen = [t for t in chosen if not any(_matches(t, it) for it in exc)]
    if foreign is not None:
        foreign.extend((q, m, r) for q, m, r in others_foreign
                       if not any(_matches_foreign(q, m, it) for it in exc or ())
                       and (inc is None or any(_matches_foreign(q, m, it) for it in inc)))
    chosen = [t for t in chosen if id(t.param) not in foreign_ids]
    if not chosen:
        raise ValueError("nothing to sparsify: the model has no weight of a known layer type "
                         "(Linear, transformers Conv1D, Conv*, ConvTranspose*, Embedding, "
                         "RNN/LSTM/GRU, MultiheadAttention) left after include/exclude; name its "
                         "tensors with include=[...]")
    ids = {id(t.param) for t in chosen}
    return chosen, [t for t in targets if id(t.param) not in ids]


def unknown_weights(model: nn.Module, exclude=None) -> list[tuple[str, str]]:
    """``(qualified name, module type)`` of every ``weight`` Parameter of two or more dimensions
    held by a module type the default selection does not know (a user's layer, a library's
    custom projection), a tied one once, leaving out what ``exclude`` names and what another tool
    transforms: weight-like tensors that ``sparsify`` would otherwise leave dense without a
    word. Select them with ``include=[...]`` (methods acting through the weight take any tensor)."""
    exc = _as_list(exclude, "exclude") or []
    out = []
    for t in all_targets(model):
        sites = [s for s in t.sites if s.named and not s.default
                 and foreign_reason(s.module, s.tensor_name) is None]
        if not sites or any(s.default for s in t.sites) or any(_matches(t, it) for it in exc):
            continue
        out.append((t.name, "+".join(dict.fromkeys(plain_class(s.module).__name__
                                                   for s in sites))))
    return out
