"""Saving a pruned Hugging Face model as config + safetensors, and loading it back.

Every form of a pruned ``transformers.PreTrainedModel`` that dualdrop hands out is saved by
:func:`save_pretrained` (``dualdrop.nn.save_pretrained(model, dir)``) and loaded by
:func:`load_pretrained`; the model's own ``model.save_pretrained(dir)`` is routed to it (an
instance attribute set by ``sparsify``, ``export_sparse``, ``quantize_dynamic_int8`` and
``compact``: the class and every other model are untouched). Per form:

==================================  ==========================================================
form                                saved as
==================================  ==========================================================
sparsified (masks held)             the transformers checkpoint of the pruned weights (masks
                                    folded: what ``model.eval()`` computes); the method's
                                    training state is not part of it
dense export, plain model           the transformers checkpoint, unchanged
CSR / auto export                   the transformers checkpoint with the CSR weights dense;
                                    ``config.json`` names the CSR layers, which
                                    :func:`load_pretrained` makes CSR again
compact, one width per config key   the transformers checkpoint with the narrower config
                                    (``intermediate_size``, Llama's head counts)
compact, widths per layer           ``config.json`` with the widths of every block under
                                    ``"dualdrop"`` + ``dualdrop_model.safetensors``
int8 export                         ``config.json`` naming the int8 layers under
                                    ``"dualdrop"`` + ``dualdrop_model.safetensors``
==================================  ==========================================================

The transformers checkpoints load with ``transformers``' own ``from_pretrained`` (in a process
that never imports dualdrop) and give the saved model's outputs. The last two cannot: a config
has one value per key, and ``from_pretrained`` would build float Linear layers and cast the int8
weights into them without their scales. So their weights go into ``dualdrop_model.safetensors``,
a name ``from_pretrained`` does not look for (it raises "no file named model.safetensors")
instead of giving wrong outputs, and ``model.save_pretrained(dir)`` on such a model refuses,
naming :func:`save_pretrained` / :func:`load_pretrained`.

What the config cannot say is recorded under ``"dualdrop"`` in ``config.json``: a submodule
left out at construction (``BertModel(config, add_pooling_layer=False)``, the way sentence
encoders are loaded, has no ``pooler``) is listed as ``left_out``, and :func:`load_pretrained`
builds the class and leaves it out again, so the loaded model is the saved one (transformers'
own ``from_pretrained`` builds it freshly initialized: it reads no such entry).

Every file is written into a temporary folder beside ``dir``, checked (read back), then moved
into ``dir`` (``config.json`` last); the weights of an earlier save there (``model*.safetensors``,
``pytorch_model*.bin``, ``dualdrop_model.safetensors``) are replaced, other files (a tokenizer)
stay. :func:`load_pretrained` reads tensors with safetensors only (no pickle), checks the
config's widths and the file's names and shapes before it reads a weight, and answers a
malformed folder with a one-line ``ValueError``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from dualdrop.nn._graph import first_line
from dualdrop.nn._layers import is_conv1d, is_dense, out_in
from dualdrop.nn._save_route import route_save_pretrained, set_saver
from dualdrop.nn.export import CSRLinear, export_sparse
from dualdrop.nn.hf import families as fam_
from dualdrop.nn.quantize import Int8DynamicLinear
from dualdrop.nn.sparsifier import is_sparsified

FORMAT = "dualdrop-pretrained"
KEY = "dualdrop"                       # the config.json entry
WEIGHTS = "dualdrop_model.safetensors"
# weight files of an earlier save that a new one replaces (a stale one would be loaded instead)
_STALE = re.compile(r"^(model(-\d+-of-\d+)?\.safetensors(\.index\.json)?|"
                    r"pytorch_model(-\d+-of-\d+)?\.bin(\.index\.json)?|"
                    + re.escape(WEIGHTS) + r")$")
_LOADERS = ("save it with dualdrop.nn.save_pretrained(model, dir) and load it with "
            "dualdrop.nn.load_pretrained(dir)")


# ------------------------------------------------------------------------ the routed method

def _routed_save(model, save_directory, args, kwargs):
    """``model.save_pretrained`` of a model dualdrop handed out (``dualdrop.nn._save_route``):
    the transformers method where it is right, :func:`save_pretrained` where the model needs it,
    a ``ValueError`` naming it where transformers could not load the result (module
    docstring)."""
    cls_save = type(model).save_pretrained
    if kwargs.get("state_dict") is not None:
        if _sparsified(model):
            raise ValueError("save_pretrained(state_dict=...) of a sparsified model: its "
                             "state_dict holds the method's training state, which a "
                             "transformers checkpoint cannot; call "
                             "model.save_pretrained(dir) without state_dict to save the "
                             "pruned weights, and torch.save(model.state_dict()) for a "
                             "training checkpoint")
        return cls_save(model, save_directory, *args, **kwargs)
    plan = _plan(model)
    if not plan.native and not plan.unsavable:
        raise ValueError(f"transformers' save_pretrained cannot write this "
                         f"{type(model).__name__}: {plan.why}; {_LOADERS}")
    if plan.native and not (plan.sparsified or plan.csr or plan.left_out
                            or plan.config is not model.config):
        return cls_save(model, save_directory, *args, **kwargs)
    if args:
        raise TypeError("save_pretrained of a pruned model takes its options by name")
    return _save(plan, _check_target(save_directory, kwargs), kwargs)


set_saver(_routed_save)


# ------------------------------------------------------------------------------ the plan

@dataclass
class _Plan:
    plain: nn.Module                 # masks folded (a copy when the model is sparsified)
    config: object                   # the config to write
    fam: str | None = None
    sparsified: bool = False
    csr: list = field(default_factory=list)
    int8: list = field(default_factory=list)
    layers: list | None = None       # widths per block, when the config cannot hold them
    native: bool = True
    why: str = ""                     # why transformers cannot load it
    unsavable: str = ""               # why dualdrop cannot save it either
    left_out: list = field(default_factory=list)   # submodules left out at construction


def _sparsified(model) -> bool:
    return is_sparsified(model)


def _plan(model) -> _Plan:
    sparsified = _sparsified(model)
    plain = export_sparse(model, "dense") if sparsified else model
    plan = _Plan(plain, plain.config, fam_.family(plain), sparsified)
    plan.left_out = _left_out(plain)
    plan.csr = [n for n, m in plain.named_modules() if isinstance(m, CSRLinear)]
    plan.int8 = [n for n, m in plain.named_modules() if isinstance(m, Int8DynamicLinear)]
    skip = plan.csr + plan.int8
    if not fam_.fits(plain, plain.config, plan.fam, skip):
        if plan.fam is None:
            plan.native = False
            plan.why = plan.unsavable = (
                "its layers' shapes differ from what its config builds, and dualdrop knows the "
                "blocks of BERT-, GPT-2- and Llama-shaped models only")
            return plan
        bs = fam_.blocks(plain, plan.fam)
        layer_widths = [fam_.widths(b) for b in bs]
        upd = fam_.config_update(plan.fam, layer_widths, bs[0].head_dim)
        cand = fam_.updated_config(plain.config, upd) if upd is not None else None
        if cand is not None and fam_.fits(plain, cand, plan.fam, skip):
            plan.config = cand
        else:
            plan.layers = layer_widths
            plan.native = False
            plan.why = (f"its blocks have their own widths ({_span(layer_widths)}), which "
                        f"{type(plain.config).__name__} cannot express")
    if plan.int8:
        plan.native = False
        plan.why = ((plan.why + "; ") if plan.why else "") + (
            f"its {len(plan.int8)} int8 layers ({plan.int8[0]}, ...) would load as float "
            "Linear layers without their scales (the float export, export_sparse(model, "
            "\"dense\"), is a transformers checkpoint)")
    return plan


def _left_out(model) -> list[str]:
    """The submodules that ``type(model)(model.config)`` has and ``model`` was built without:
    an attribute left None at construction (``BertModel(config, add_pooling_layer=False)``'s
    ``pooler``), which the config cannot say. Recorded in ``config.json`` so that
    :func:`load_pretrained` rebuilds the model without them."""
    with torch.device("meta"):
        probe = type(model)(model.config)
    have = dict(model.named_modules())
    out = []
    for name, _ in probe.named_modules():
        if not name or name in have or any(name.startswith(o + ".") for o in out):
            continue
        parent, _, attr = name.rpartition(".")
        if parent in have and getattr(have[parent], attr, False) is None:
            out.append(name)
    return out


def _leave_out(model, names, where) -> None:
    """Set the submodules ``names`` of a freshly built model to None, as they were saved."""
    for name in names:
        parent, _, attr = name.rpartition(".")
        try:
            owner = model.get_submodule(parent) if parent else model
        except AttributeError:
            owner = None
        if owner is None or not isinstance(getattr(owner, attr, None), nn.Module):
            raise ValueError(f"{where}/config.json lists {name!r} as left out of the model, "
                             f"and {type(model).__name__} has no such submodule; save the model "
                             "again with dualdrop.nn.save_pretrained")
        setattr(owner, attr, None)


def _span(layer_widths) -> str:
    parts = []
    for k, label in (("intermediate_size", "FFN"), ("num_attention_heads", "heads")):
        vals = [w[k] for w in layer_widths]
        parts.append(f"{label} {min(vals)}..{max(vals)}" if min(vals) != max(vals)
                     else f"{label} {vals[0]}")
    return ", ".join(parts)


# ------------------------------------------------------------------------------ saving

def save_pretrained(model: nn.Module, save_directory: str | os.PathLike, **kwargs) -> str:
    """Save a pruned Hugging Face model as config + safetensors in ``save_directory``, in the
    form its layout needs (module docstring: the transformers checkpoint where ``from_pretrained``
    can load it, else the ``dualdrop_model.safetensors`` form that :func:`load_pretrained`
    reads). ``model``: the sparsified model, any ``export_sparse`` layout, or the compact model;
    it is not changed. ``kwargs`` go to transformers' ``save_pretrained`` (e.g.
    ``max_shard_size``) for a transformers checkpoint. Returns the directory."""
    if not fam_.is_pretrained(model):
        raise TypeError(f"model must be a Hugging Face transformers PreTrainedModel, got "
                        f"{type(model).__name__}; save a plain torch model with "
                        "torch.save(model.state_dict(), path) (a compact one with "
                        "dualdrop.nn.save_compact)")
    target = _check_target(save_directory, kwargs)
    return _save(_plan(model), target, kwargs)


def _check_target(save_directory, kwargs) -> Path:
    if not isinstance(save_directory, (str, os.PathLike)) or not str(save_directory):
        raise TypeError(f"save_directory must be a path, got {save_directory!r}")
    target = Path(save_directory)
    if target.exists() and not target.is_dir():
        raise ValueError(f"save_directory {str(target)!r} is a file; pass a directory (it is "
                         "created if missing)")
    for bad in ("state_dict", "push_to_hub", "save_directory"):
        if bad in kwargs:
            raise ValueError(f"save_pretrained: {bad}= is not taken (the weights are the "
                             "model's pruned weights; push the saved directory afterwards)")
    return target


def _save(plan, target: Path, kwargs) -> str:
    model = plan.plain
    if plan.unsavable:
        raise ValueError(f"dualdrop.nn.save_pretrained cannot save this "
                         f"{type(model).__name__}: {plan.unsavable}; save it with "
                         "dualdrop.nn.save_compact(model, path) and reload it with "
                         "load_compact(path, fresh_model)")
    if not plan.native and kwargs:
        raise ValueError(f"save_pretrained: {sorted(kwargs)} apply to a transformers "
                         f"checkpoint, and this model is saved in dualdrop's form ({plan.why}); "
                         "drop them")
    if plan.layers is not None:   # the loader must rebuild these widths from the config
        with torch.device("meta"):
            probe = type(model)(plan.config)
        fam_.check_widths(probe, plan.layers, "save_pretrained", plan.fam)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        sd = _state_dict(plan)
        meta = {"format": FORMAT, "version": 1, "family": plan.fam, "csr": plan.csr}
        if plan.left_out:
            meta["left_out"] = plan.left_out
        if plan.native:
            _write_native(plan, tmp, sd if plan.csr else None, kwargs)
            if plan.csr or plan.left_out:
                _add_key(tmp / "config.json", meta)
        else:
            meta.update(int8=plan.int8, layers=plan.layers, weights=WEIGHTS)
            meta["tied"] = _write_weights(sd, tmp / WEIGHTS)
            cfg = copy.deepcopy(plan.config)
            cfg.architectures = [_class_name(model)]
            cfg.save_pretrained(tmp)
            gen = getattr(model, "generation_config", None)
            if gen is not None and model.can_generate():
                gen.save_pretrained(tmp)
            _add_key(tmp / "config.json", meta)
        _check_written(tmp)
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _class_name(model) -> str:
    for cls in type(model).__mro__:   # a parametrized model's generated class: its base
        if not cls.__name__.startswith("Parametrized"):
            return cls.__name__
    return type(model).__name__


def _state_dict(plan) -> dict:
    """The plain model's state dict with every CSR weight dense, in its architecture's
    orientation (``(in, out)`` where the architecture has a ``Conv1D``)."""
    sd = plan.plain.state_dict()
    if plan.csr:
        with torch.device("meta"):
            probe = type(plan.plain)(plan.config)
        kinds = dict(probe.named_modules())
        for name in plan.csr:
            w = sd[f"{name}.weight"].to_dense()
            if is_conv1d(kinds.get(name)):
                w = w.t()
            sd[f"{name}.weight"] = w.contiguous()
    return sd


def _write_native(plan, tmp: Path, sd, kwargs) -> None:
    model = plan.plain
    own = model.config
    model.config = plan.config
    try:
        type(model).save_pretrained(model, tmp, state_dict=sd, **kwargs)
    finally:
        model.config = own


def _write_weights(sd: dict, path: Path) -> dict:
    """One safetensors file of ``sd``; a tensor shared by several names (tied weights) stored
    once. Returns ``{alias: stored name}``."""
    from safetensors.torch import save_file
    seen, out, tied = {}, {}, {}
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"save_pretrained: the state entry {k} is a "
                             f"{type(v).__name__}, not a tensor")
        ident = (v.device, v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape),
                 v.stride(), v.dtype) if v.numel() else None
        if ident is not None and ident in seen:
            tied[k] = seen[ident]
            continue
        if ident is not None:
            seen[ident] = k
        out[k] = v.detach().cpu().contiguous()
    save_file(out, str(path), metadata={"format": "pt", KEY: FORMAT})
    return tied


def _add_key(path: Path, meta: dict) -> None:
    cfg = json.loads(path.read_text())
    cfg[KEY] = meta
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _check_written(tmp: Path) -> None:
    """Read back what was written: the config parses, every safetensors header opens."""
    from safetensors import safe_open
    json.loads((tmp / "config.json").read_text())
    for f in tmp.iterdir():
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as h:
                if not list(h.keys()):
                    raise RuntimeError(f"save_pretrained wrote an empty {f.name}")


def _move_into_place(tmp: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    new = {f.name for f in tmp.iterdir()}
    for f in target.iterdir():
        if _STALE.match(f.name) and f.name not in new and f.is_file():
            f.unlink()
    for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
        os.replace(f, target / f.name)


# ------------------------------------------------------------------------------ loading

def load_pretrained(save_directory: str | os.PathLike, *, model_class=None, **kwargs):
    """The model saved by :func:`save_pretrained` (or any transformers checkpoint) in
    ``save_directory``, in eval mode, in the layout it was saved with (CSR layers CSR again,
    int8 layers int8, every block at its saved widths). ``model_class``: the transformers class
    to build (default: the one ``config.json`` names under ``architectures``). ``kwargs`` go to
    ``from_pretrained`` for a transformers checkpoint. A malformed folder: one-line
    ``ValueError``."""
    import transformers

    d = Path(save_directory) if isinstance(save_directory, (str, os.PathLike)) else None
    if d is None or not d.is_dir():
        raise ValueError(f"save_directory {save_directory!r} is not a directory; pass the "
                         "folder save_pretrained wrote")
    where = f"{d}"
    try:
        raw = json.loads((d / "config.json").read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except Exception as exc:
        raise ValueError(f"{where}/config.json cannot be read ({first_line(exc)[:100]}); "
                         "pass a folder written by save_pretrained") from None
    cls = _model_class(raw, model_class, where, transformers)
    meta = _check_meta(raw.get(KEY), where)
    if meta is None or meta.get("weights") is None:
        if meta is not None and meta["left_out"]:
            # transformers builds (and announces as newly initialized) what was left out
            model = _quietly(lambda: cls.from_pretrained(str(d), **kwargs))
            _leave_out(model, meta["left_out"], where)
        else:
            model = cls.from_pretrained(str(d), **kwargs)
        if KEY in getattr(model.config, "__dict__", {}):
            delattr(model.config, KEY)
    else:
        if kwargs:
            raise ValueError(f"load_pretrained: {sorted(kwargs)} apply to a transformers "
                             f"checkpoint; {where} is in dualdrop's form; drop them")
        model = _load_dualdrop(d, cls, meta, where)
    if meta is not None and meta["csr"]:
        _to_csr(model, meta["csr"], where)
    return route_save_pretrained(model.eval())


def _model_class(raw, model_class, where, transformers):
    if model_class is None:
        arch = raw.get("architectures")
        name = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None
        model_class = getattr(transformers, name, None) if name else None
        if model_class is None:
            raise ValueError(f"{where}/config.json names no transformers model class under "
                             f"'architectures' ({arch!r}); pass model_class=, e.g. "
                             "transformers.BertModel")
    if not (isinstance(model_class, type) and issubclass(model_class,
                                                         transformers.PreTrainedModel)):
        raise TypeError(f"model_class must be a transformers PreTrainedModel class, got "
                        f"{model_class!r}")
    return model_class


def _names(v) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) and s for s in v)


def _check_meta(meta, where):
    if meta is None:
        return None
    ok = (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("version") == 1
          and _names(meta.get("csr", [])) and _names(meta.get("int8", []))
          and _names(meta.get("left_out", []))
          and meta.get("weights") in (None, WEIGHTS)
          and isinstance(meta.get("tied", {}), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in
                  meta.get("tied", {}).items()))
    if not ok:
        raise ValueError(f"{where}/config.json has a malformed {KEY!r} entry; save the model "
                         "again with dualdrop.nn.save_pretrained")
    return {"csr": [], "int8": [], "tied": {}, "layers": None, "left_out": [], **meta}


def _load_dualdrop(d: Path, cls, meta, where):
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = d / WEIGHTS
    try:
        with safe_open(str(path), framework="pt") as h:
            header = {k: (tuple(h.get_slice(k).get_shape()), h.get_slice(k).get_dtype())
                      for k in h.keys()}
    except Exception as exc:
        raise ValueError(f"{where}/{WEIGHTS} cannot be read ({first_line(exc)[:100]}); save "
                         "the model again with dualdrop.nn.save_pretrained") from None
    try:
        config = cls.config_class.from_pretrained(str(d))
    except Exception as exc:
        raise ValueError(f"{where}/config.json is not a {cls.config_class.__name__} "
                         f"({first_line(exc)[:100]})") from None
    if KEY in config.__dict__:
        delattr(config, KEY)
    model = _build(cls, config)
    _leave_out(model, meta["left_out"], where)
    fam = fam_.family(model)
    if meta["layers"] is not None:
        if fam is None:
            raise ValueError(f"{where}: per-layer widths for a {cls.__name__}, whose blocks "
                             "dualdrop does not know")
        fam_.check_widths(model, meta["layers"], f"{where}/config.json", fam)
        fam_.resize(model, meta["layers"], fam)
    modules = dict(model.named_modules())
    for name in meta["int8"]:
        m = modules.get(name)
        shape = header.get(f"{name}.weight", (None, None))[0]
        if not is_dense(m) or shape is None or len(shape) != 2:
            raise ValueError(f"{where}: no dense layer {name!r} to hold the int8 weights")
        bias = torch.empty(shape[0]) if f"{name}.bias" in header else None
        new = Int8DynamicLinear(torch.zeros(shape, dtype=torch.int8), torch.ones(shape[0]),
                                bias)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, new)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: s for k, (s, _) in header.items()}
    for alias, stored in meta["tied"].items():
        if stored in have:
            have.setdefault(alias, have[stored])
    if want != have:
        diff = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
        k = diff[0]
        raise ValueError(f"{where}/{WEIGHTS} does not fit {cls.__name__} at its saved widths: "
                         f"{k} is {have.get(k, 'missing')} in the file, {want.get(k, 'absent')} "
                         "in the model; save the model again with dualdrop.nn.save_pretrained")
    sd = load_file(str(path))
    for alias, stored in meta["tied"].items():
        sd[alias] = sd[stored]
    model.load_state_dict(sd, strict=True, assign=True)   # the file's tensors, not copies
    for alias, stored in meta["tied"].items():   # one Parameter again, as saved
        owner, _, attr = alias.rpartition(".")
        src_owner, _, src_attr = stored.rpartition(".")
        src = model.get_submodule(src_owner)
        dst = model.get_submodule(owner)
        if src_attr in src._parameters and attr in dst._parameters:
            dst._parameters[attr] = src._parameters[src_attr]
    gen = d / "generation_config.json"
    if gen.is_file() and model.can_generate():
        from transformers import GenerationConfig
        model.generation_config = GenerationConfig.from_pretrained(str(d))
    return model


def _quietly(fn):
    """``fn()`` with transformers' logging at errors only."""
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return fn()
    finally:
        hf_logging.set_verbosity(level)


def _build(cls, config):
    """``cls(config)`` without initializing the weights the file fills."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:   # transformers 4
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            no_init_weights = None
    if no_init_weights is None:
        return cls(config)
    with no_init_weights():
        return cls(config)


def _to_csr(model, names, where) -> None:
    for name in names:
        try:
            m = model.get_submodule(name)
        except AttributeError:
            m = None
        if not is_dense(m):
            raise ValueError(f"{where}: no dense layer {name!r} to make CSR")
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr,
                CSRLinear.from_dense(out_in(m), m.bias))
