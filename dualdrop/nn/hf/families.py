"""Where a Hugging Face transformer keeps its feed-forward neurons and attention heads.

Three layouts of a transformer block are known, found by the modules a block holds (so the
models that share a layout, e.g. RoBERTa with BERT or Mistral / Qwen2 with Llama, are found
too):

- ``bert``: ``encoder.layer[i]`` with ``attention.self.{query,key,value}`` (Linear),
  ``attention.output.dense`` (the heads' consumer), ``intermediate.dense`` ->
  ``intermediate_act_fn`` -> ``output.dense``; the attention reads ``num_attention_heads`` and
  ``all_head_size``; its width per head is ``hidden_size / num_attention_heads``.
- ``gpt2``: ``h[i]`` with ``attn.c_attn`` (a fused ``Conv1D``: outputs ``[q | k | v]``),
  ``attn.c_proj``, ``mlp.c_fc`` -> ``mlp.act`` -> ``mlp.c_proj``; the attention reads
  ``num_heads`` and ``split_size`` (the width of each of q, k, v).
- ``llama``: ``layers[i]`` with ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``
  (``down(act(gate x) * up x)``); grouped-query attention: query head ``h`` reads key/value head
  ``h // num_key_value_groups``, the attribute the attention reads; ``head_dim`` is its own
  config key.

Per block a :class:`Block` names these modules; :func:`widths` reads the block's widths from
the weights' shapes (the one source of truth: a compact model's layers are narrower than its
config says), :func:`resize` gives a freshly built model the widths of a saved one (weights left
uninitialized, to be loaded), and :func:`set_heads` the attributes its attention reads.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from dualdrop.nn._layers import is_conv1d, is_pretrained

# the per-layer widths recorded for a compact model, in this order
WIDTH_KEYS = ("intermediate_size", "num_attention_heads", "num_key_value_heads")


@dataclass
class Block:
    """One transformer block: its feed-forward and self-attention modules (and their names)."""

    index: int
    prefix: str
    producers: list            # the FFN layers whose output units are the neurons
    consumer: nn.Module        # the FFN layer that reads them
    act: object                # the activation between (called on a tensor)
    gated: bool                # llama: act(gate x) * (up x)
    attention: nn.Module       # holds the head-count attributes
    q: nn.Module | None
    k: nn.Module | None
    v: nn.Module | None
    fused: nn.Module | None    # GPT-2's c_attn: outputs [q | k | v]
    o: nn.Module
    head_dim: int
    names: dict = field(default_factory=dict)   # role -> module name in the model


def family(model) -> str | None:
    """``"bert"``, ``"gpt2"`` or ``"llama"``: the block layout of a Hugging Face model, or None
    (not a Hugging Face model, or a layout not listed in the module docstring)."""
    if not is_pretrained(model):
        return None
    base = getattr(model, "base_model", model)
    enc = getattr(base, "encoder", None)
    layers = getattr(enc, "layer", None) if enc is not None else None
    if isinstance(layers, nn.ModuleList) and len(layers) and _has(
            layers[0], "attention.self.query", "attention.self.key", "attention.self.value",
            "attention.output.dense", "intermediate.dense", "output.dense"):
        return "bert"
    layers = getattr(base, "h", None)
    if isinstance(layers, nn.ModuleList) and len(layers) and _has(
            layers[0], "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj") and \
            hasattr(layers[0].attn, "split_size"):
        return "gpt2"
    layers = getattr(base, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers) and _has(
            layers[0], "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        return "llama"
    return None


def _has(module, *paths) -> bool:
    for p in paths:
        try:
            module.get_submodule(p)
        except AttributeError:
            return False
    return True


def _layers(model, fam):
    base = getattr(model, "base_model", model)
    layers = {"bert": lambda: base.encoder.layer, "gpt2": lambda: base.h,
              "llama": lambda: base.layers}[fam]()
    names = {id(m): n for n, m in model.named_modules()}
    return [(names[id(layer)], layer) for layer in layers]


def blocks(model, fam: str | None = None) -> list[Block]:
    """The blocks of a Hugging Face model of a known layout (``fam``: :func:`family`)."""
    fam = fam or family(model)
    if fam is None:
        raise TypeError(f"{type(model).__name__} is not a Hugging Face model of a known layout "
                        "(BERT-, GPT-2- or Llama-shaped blocks)")
    out = []
    for i, (prefix, layer) in enumerate(_layers(model, fam)):
        if fam == "bert":
            att = layer.attention.self
            roles = {"q": "attention.self.query", "k": "attention.self.key",
                     "v": "attention.self.value", "o": "attention.output.dense",
                     "up": "intermediate.dense", "down": "output.dense",
                     "attention": "attention.self"}
            b = Block(i, prefix, [layer.intermediate.dense], layer.output.dense,
                      layer.intermediate.intermediate_act_fn, False, att, att.query, att.key,
                      att.value, None, layer.attention.output.dense,
                      int(att.attention_head_size))
        elif fam == "gpt2":
            att = layer.attn
            roles = {"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc",
                     "down": "mlp.c_proj", "attention": "attn"}
            b = Block(i, prefix, [layer.mlp.c_fc], layer.mlp.c_proj, layer.mlp.act, False, att,
                      None, None, None, att.c_attn, att.c_proj, int(att.head_dim))
        else:
            att, mlp = layer.self_attn, layer.mlp
            roles = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                     "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                     "down": "mlp.down_proj", "attention": "self_attn"}
            b = Block(i, prefix, [mlp.gate_proj, mlp.up_proj], mlp.down_proj, mlp.act_fn, True,
                      att, att.q_proj, att.k_proj, att.v_proj, None, att.o_proj,
                      int(att.head_dim))
        b.names = {r: f"{prefix}.{p}" for r, p in roles.items()}
        out.append(b)
    return out


def n_out(m) -> int:
    """Output units of a dense layer (Linear, Conv1D, or their CSR / int8 exports)."""
    return m.nf if is_conv1d(m) else m.out_features


def n_in(m) -> int:
    """Input units of a dense layer (Linear, Conv1D, or their CSR / int8 exports)."""
    return m.nx if is_conv1d(m) else m.in_features


def widths(b: Block) -> dict:
    """``{"intermediate_size", "num_attention_heads", "num_key_value_heads"}`` of a block, read
    from its weights' shapes."""
    d = b.head_dim
    if b.fused is not None:
        heads = kv = n_out(b.fused) // (3 * d)
    else:
        heads, kv = n_out(b.q) // d, n_out(b.k) // d
    return {"intermediate_size": n_out(b.producers[0]), "num_attention_heads": heads,
            "num_key_value_heads": kv}


def set_heads(b: Block, heads: int, kv_heads: int) -> None:
    """Set the attributes the block's attention reads for ``heads`` query heads on
    ``kv_heads`` key/value heads (its Linear layers are resized by the caller)."""
    att, d = b.attention, b.head_dim
    if b.fused is not None:   # gpt2
        att.num_heads, att.split_size = heads, heads * d
    elif hasattr(att, "all_head_size"):   # bert
        att.num_attention_heads, att.all_head_size = heads, heads * d
    else:   # llama
        att.num_key_value_groups = heads // kv_heads
        for attr, value in (("num_heads", heads), ("num_key_value_heads", kv_heads)):
            if hasattr(att, attr):
                setattr(att, attr, value)


def layer_shape(m, n_out_: int, n_in_: int) -> None:
    """Give a Linear or Conv1D layer ``n_out_`` outputs and ``n_in_`` inputs, its weights
    uninitialized (a freshly built model that a saved state then fills)."""
    w = m.weight
    shape = (n_in_, n_out_) if is_conv1d(m) else (n_out_, n_in_)
    if tuple(w.shape) != shape:
        m.weight = nn.Parameter(torch.empty(shape, dtype=w.dtype, device=w.device),
                                requires_grad=w.requires_grad)
    if m.bias is not None and m.bias.shape[0] != n_out_:
        m.bias = nn.Parameter(torch.empty(n_out_, dtype=m.bias.dtype, device=m.bias.device),
                              requires_grad=m.bias.requires_grad)
    sync_sizes(m)


def sync_sizes(m) -> None:
    """A dense layer's size attributes follow its weight (what ``extra_repr`` shows)."""
    if is_conv1d(m):
        m.nx, m.nf = m.weight.shape
    else:
        m.out_features, m.in_features = m.weight.shape


def resize(model, layer_widths: list[dict], fam: str | None = None) -> None:
    """Give the blocks of ``model`` (freshly built from its config) the widths
    ``layer_widths`` (one :func:`widths` dict per block), weights uninitialized."""
    for b, w in zip(blocks(model, fam), layer_widths):
        f, h, kv, d = (w["intermediate_size"], w["num_attention_heads"],
                       w["num_key_value_heads"], b.head_dim)
        for p in b.producers:
            layer_shape(p, f, n_in(p))
        layer_shape(b.consumer, n_out(b.consumer), f)
        if b.fused is not None:
            layer_shape(b.fused, 3 * h * d, n_in(b.fused))
        else:
            layer_shape(b.q, h * d, n_in(b.q))
            layer_shape(b.k, kv * d, n_in(b.k))
            layer_shape(b.v, kv * d, n_in(b.v))
        layer_shape(b.o, n_out(b.o), h * d)
        set_heads(b, h, kv)


def check_widths(model, layer_widths, where: str, fam: str | None = None) -> None:
    """ValueError naming ``where`` unless ``layer_widths`` is one dict of positive ints per block
    of ``model``, no wider than the block (a saved compact model only removes units) and with
    whole groups of query heads per key/value head."""
    bs = blocks(model, fam)
    if not isinstance(layer_widths, list) or len(layer_widths) != len(bs):
        n = len(layer_widths) if isinstance(layer_widths, list) else type(layer_widths).__name__
        raise ValueError(f"{where}: the per-layer widths list {n} layers, the model has "
                         f"{len(bs)}")
    for b, w in zip(bs, layer_widths):
        full = widths(b)
        if not isinstance(w, dict) or set(w) != set(WIDTH_KEYS) or not all(
                type(w[k]) is int and 1 <= w[k] <= full[k] for k in WIDTH_KEYS):
            raise ValueError(f"{where}: the widths of layer {b.index} must be ints "
                             f"1 <= {{{', '.join(WIDTH_KEYS)}}} <= {full}, got {w!r}")
        if w["num_attention_heads"] % w["num_key_value_heads"]:
            raise ValueError(f"{where}: layer {b.index} has {w['num_attention_heads']} query "
                             f"heads on {w['num_key_value_heads']} key/value heads (a multiple "
                             "is needed)")
        if b.fused is not None and w["num_attention_heads"] != w["num_key_value_heads"]:
            raise ValueError(f"{where}: layer {b.index} is GPT-2's fused attention, whose query "
                             "and key/value heads are the same")


# config keys per layout: the FFN width, the head counts (None: derived, not a key)
CONFIG_KEYS = {
    "bert": ("intermediate_size", "num_attention_heads", None),
    "gpt2": ("n_inner", "n_head", None),
    "llama": ("intermediate_size", "num_attention_heads", "num_key_value_heads"),
}


def config_update(fam: str, layer_widths: list[dict], head_dim: int) -> dict | None:
    """The config entries that make the config describe ``layer_widths`` when every block has
    the same widths (None when they differ: the config has one value per key). BERT and GPT-2
    derive a head's width from ``hidden_size / heads``, so fewer heads change only Llama's
    config (which has ``head_dim``); the caller checks the result by building the model."""
    first = layer_widths[0]
    if any(w != first for w in layer_widths):
        return None
    ffn, heads, kv = CONFIG_KEYS[fam]
    upd = {ffn: first["intermediate_size"], heads: first["num_attention_heads"]}
    if kv is not None:
        upd[kv] = first["num_key_value_heads"]
        upd["head_dim"] = head_dim
    return upd


def updated_config(config, upd: dict):
    """A copy of ``config`` with the entries ``upd``, rebuilt through its class (which checks
    it); None if the class refuses it."""
    try:
        cand = copy.deepcopy(config)
        for k, v in upd.items():
            setattr(cand, k, v)
        return type(config).from_dict(cand.to_dict())
    except Exception:
        return None


def fits(model, config, fam: str | None = None, skip=()) -> bool:
    """Whether ``type(model)(config)`` has ``model``'s shapes: every state-dict entry's shape
    except under the modules ``skip`` (CSR / int8 layers, whose stored weights differ), and for
    a known layout each block's widths and head width (which cover the skipped layers). Built
    on the meta device: no memory, no initialization."""
    try:
        with torch.device("meta"):
            probe = type(model)(config)
    except Exception:
        return False
    prefixes = tuple(f"{s}." for s in skip)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()
            if not k.startswith(prefixes)}
    got = {k: tuple(v.shape) for k, v in probe.state_dict().items()
           if not k.startswith(prefixes)}
    if want != got:
        return False
    if fam is None:
        return True
    try:
        return [(widths(b), b.head_dim) for b in blocks(probe, fam)] == \
            [(widths(b), b.head_dim) for b in blocks(model, fam)]
    except Exception:
        return False
