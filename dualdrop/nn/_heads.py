"""Attention heads in one place: where a model's heads are (:func:`hf_attention`), which features
each head is (:func:`head_index`, :func:`zero_heads`), and removing dead ones (the head part of the
compact export, ``dualdrop.nn.compact``). Structured one-shot pruning (``dualdrop.nn.oneshot.units``)
and the Hugging Face compaction (``dualdrop.nn.hf.compact``) read heads through these.

**Geometry.** Head ``h`` of width ``d`` is the features ``[h d, (h + 1) d)`` of a projection's
output (query, key, value) and of the output projection's input; in a fused or packed
projection (GPT-2's ``c_attn``, ``nn.MultiheadAttention``'s ``in_proj_weight``) the same span
at the offset of each of q, k, v.

``nn.MultiheadAttention`` with ``H`` heads of width ``d = E / H`` computes, for head ``h``,
``o_h = softmax(q_h k_h^T / sqrt(d) + mask) v_h`` with ``q_h = x W_q[h] + b_q[h]`` (and ``k_h``,
``v_h`` alike), then ``y = sum_h o_h W_o[:, h]^T + b_o``. A head is *dead* when either

- its output columns are zero, ``W_o[:, h] = 0``: it contributes nothing, whatever ``o_h``; or
- its value rows are zero, ``W_v[h] = 0``: every value is the constant ``b_v[h]``, and since the
  attention weights of a query sum to one, ``o_h = b_v[h]`` for every query; its contribution
  ``W_o[:, h] b_v[h]`` is a constant that moves into ``b_o`` (what a ``granularity="head"`` group
  of ``in_proj_weight``, the rows of q, k and v of the head together, leaves).

Either way removing the head is exact. ``nn.MultiheadAttention`` cannot hold fewer heads than
``E / d`` (it ties ``H d`` to the embedding width, the residual stream's), so the heads that stay
go into :class:`HeadPrunedAttention`: the same computation with separate q/k/v projections to
``H' d`` features and ``out_proj`` from ``H' d`` back to ``E``; masks (``attn_mask`` of shape
``(L, S)`` or ``(batch * H, L, S)``, ``key_padding_mask``, boolean or additive) mean what they
mean for the original module, a per-head mask is read at the kept heads. The returned attention
weights (``need_weights=True``) are those of the kept heads. Modules with ``add_bias_kv`` or
``add_zero_attn`` keep all their heads (an extra key makes ``o_h`` depend on the input).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.nn._graph import layer_kind
from dualdrop.nn._layers import n_out

#: attributes an attention module keeps its head count / head width in, by library
HEADS_ATTRS = ("num_attention_heads", "num_heads", "n_head")
WIDTH_ATTRS = ("attention_head_size", "head_dim")
#: names of the separate query/key/value projections, and of a fused one
QKV_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q", "k", "v"))
FUSED_NAMES = ("c_attn", "qkv_proj", "Wqkv", "qkv")


def head_index(heads, d: int, offsets=(0,)) -> np.ndarray:
    """The features of the heads ``heads`` (of width ``d``), at each of ``offsets`` in turn (the
    first feature of q, k, v in a fused projection), as int64 indices."""
    return np.concatenate([off + np.arange(h * d, (h + 1) * d, dtype=np.int64)
                           for off in offsets for h in heads])


def zero_heads(w: torch.Tensor, n: int, d: int, dim: int) -> list[bool]:
    """Per head ``h < n``: whether its span of ``w``'s rows (``dim=0``, a projection's
    ``(out, in)`` weight) or columns (``dim=1``, an output projection's) is all zero."""
    return [bool((w.narrow(dim, h * d, d) == 0).all()) for h in range(n)]


def _first_attr(m, names):
    for n in names:
        v = getattr(m, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def hf_attention(m: nn.Module):
    """``(H, d, projections)`` of a Hugging Face style attention module (``H`` heads of width
    ``d`` read from :data:`HEADS_ATTRS` / :data:`WIDTH_ATTRS`; ``projections``: ``[(name,
    module, offset)]`` of the query, key and value projections, ``offset`` the first output
    feature of each in a fused projection), or None."""
    if isinstance(m, nn.MultiheadAttention):
        return None
    H = _first_attr(m, HEADS_ATTRS)
    d = _first_attr(m, WIDTH_ATTRS)
    if H is None:
        return None
    children = dict(m.named_children())
    for names in QKV_NAMES:
        mods = [children.get(n) for n in names]
        if all(x is not None and layer_kind(x) == "linear" for x in mods):
            d = d or n_out(mods[0]) // H
            if all(n_out(x) == H * d for x in mods):
                return H, d, [(n, x, 0) for n, x in zip(names, mods)]
            return None
    for n in FUSED_NAMES:
        x = children.get(n)
        if x is not None and layer_kind(x) == "linear" and n_out(x) % 3 == 0:
            E = n_out(x) // 3
            d = d or E // H
            if H * d == E:
                return H, d, [(n, x, 0), (n, x, E), (n, x, 2 * E)]
    return None


def kv_heads_differ(m) -> bool:
    """Whether an attention module has fewer key/value heads than query heads (grouped-query
    attention)."""
    kv = getattr(m, "num_key_value_heads", None) or getattr(getattr(m, "config", None),
                                                          "num_key_value_heads", None)
    H = _first_attr(m, HEADS_ATTRS)
    return isinstance(kv, int) and H is not None and kv != H


class HeadPrunedAttention(nn.Module):
    """Multi-head attention with ``num_heads`` heads of width ``head_dim`` on an embedding of
    width ``embed_dim`` (``num_heads * head_dim`` may be smaller than ``embed_dim``): the
    heads an ``nn.MultiheadAttention`` kept after its dead heads were removed (module
    docstring). Called like ``nn.MultiheadAttention``; ``head_index`` (a buffer) holds the
    original indices of the kept heads, ``orig_heads`` their original number."""

    def __init__(self, embed_dim: int, num_heads: int, head_dim: int, orig_heads: int, *,
                 kdim: int | None = None, vdim: int | None = None, bias: bool = True,
                 out_bias: bool = True, batch_first: bool = False, dropout: float = 0.0):
        super().__init__()
        inner = num_heads * head_dim
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.orig_heads, self.batch_first, self.dropout = orig_heads, batch_first, dropout
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.q_proj = nn.Linear(embed_dim, inner, bias=bias)
        self.k_proj = nn.Linear(self.kdim, inner, bias=bias)
        self.v_proj = nn.Linear(self.vdim, inner, bias=bias)
        self.out_proj = nn.Linear(inner, embed_dim, bias=out_bias)
        self.register_buffer("head_index", torch.arange(num_heads))
        # read by nn.TransformerEncoderLayer: its fused fast path needs the packed weights of
        # nn.MultiheadAttention, so it takes the plain path (which calls this module)
        self._qkv_same_embed_dim = False
        self.in_proj_weight = self.in_proj_bias = None

    @classmethod
    def from_attention(cls, mha: nn.MultiheadAttention, keep: list[int]) -> "HeadPrunedAttention":
        """The heads ``keep`` of ``mha`` (weights copied; the dead heads' constant output folded
        into ``out_proj.bias`` by the caller)."""
        E, H = mha.embed_dim, mha.num_heads
        d = E // H
        bias = mha.in_proj_bias is not None
        out_bias = mha.out_proj.bias is not None
        new = cls(E, len(keep), d, H, kdim=mha.kdim, vdim=mha.vdim, bias=bias,
                  out_bias=out_bias, batch_first=mha.batch_first, dropout=mha.dropout)
        rows = torch.as_tensor(head_index(keep, d))
        with torch.no_grad():
            for i, (proj, w) in enumerate(zip((new.q_proj, new.k_proj, new.v_proj),
                                              _qkv_weights(mha))):
                proj.weight.copy_(w[rows])
                if bias:
                    proj.bias.copy_(mha.in_proj_bias[i * E:(i + 1) * E][rows])
            new.out_proj.weight.copy_(mha.out_proj.weight[:, rows])
            if out_bias:
                new.out_proj.bias.copy_(mha.out_proj.bias)
            new.head_index.copy_(torch.tensor(keep))
        return new.to(mha.out_proj.weight.device, mha.out_proj.weight.dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        if is_causal and attn_mask is None:
            raise RuntimeError("is_causal=True is a hint: pass the causal attn_mask too, as "
                               "for nn.MultiheadAttention")
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        B, L, _ = query.shape
        S = key.shape[1]
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(key))
        v = self._heads(self.v_proj(value))
        mask = self._mask(attn_mask, key_padding_mask, B, L, S, q.dtype)
        p = self.dropout if self.training else 0.0
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores + mask
            w = scores.softmax(-1)
            o = F.dropout(w, p) @ v if p else w @ v
        else:
            o, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p), None
        y = self.out_proj(o.transpose(1, 2).reshape(B, L, -1))
        if w is not None and average_attn_weights:
            w = w.mean(1)
        if not batched:
            return y.squeeze(0), (w.squeeze(0) if w is not None else None)
        if not self.batch_first:
            y = y.transpose(0, 1)
        return y, w

    def _heads(self, t):
        B, N, _ = t.shape
        return t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)

    def _mask(self, attn_mask, key_padding_mask, B, L, S, dtype):
        """Both masks as one additive ``(B | 1, H' | 1, L | 1, S)`` tensor (None if none)."""
        out = None
        if attn_mask is not None:
            m = _additive(attn_mask, dtype)
            if m.dim() == 3:  # (batch * orig_heads, L, S): read at the kept heads
                m = m.reshape(-1, self.orig_heads, L, S)[:, self.head_index]
            out = m
        if key_padding_mask is not None:
            kp = _additive(key_padding_mask, dtype).reshape(B, 1, 1, S)
            out = kp if out is None else out + kp
        return out

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads} of {self.orig_heads}, "
                f"head_dim={self.head_dim}, batch_first={self.batch_first}")


def _additive(mask, dtype):
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf"))
    return mask.to(dtype)


def _qkv_weights(mha):
    if mha._qkv_same_embed_dim:
        return mha.in_proj_weight.chunk(3)
    return mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight


def dead_heads(mha: nn.MultiheadAttention) -> tuple[list[int], torch.Tensor | None]:
    """``(dead, fold)``: the heads of ``mha`` that may go (module docstring) and the constant
    their value biases add to ``out_proj``'s output (None when there is none to add)."""
    if mha.bias_k is not None or mha.add_zero_attn:
        return [], None
    E, H = mha.embed_dim, mha.num_heads
    d = E // H
    _, _, wv = _qkv_weights(mha)
    wo = mha.out_proj.weight
    bv = mha.in_proj_bias[2 * E:] if mha.in_proj_bias is not None else None
    out_dead, v_dead = zero_heads(wo, H, d, 1), zero_heads(wv, H, d, 0)
    dead = [h for h in range(H) if out_dead[h] or v_dead[h]]
    if len(dead) == H:
        dead = dead[1:]  # an attention keeps one head (an empty one is not a module)
    fold = torch.zeros(E, dtype=torch.float64, device=wo.device)
    for h in dead:
        if not out_dead[h] and bv is not None:
            cols = slice(h * d, (h + 1) * d)
            fold += wo[:, cols].double() @ bv[cols].double()
    return dead, (fold if bool(torch.any(fold != 0)) else None)


@torch.no_grad()
def remove_dead_heads(net: nn.Module, only=None) -> dict:
    """Replace every ``nn.MultiheadAttention`` of ``net`` (or those whose ``id`` is in
    ``only``) that has dead heads by a :class:`HeadPrunedAttention` of its live heads (in
    place); ``{name: (kept, total)}``."""
    done = {}
    for name, m in list(net.named_modules()):
        if type(m) is not nn.MultiheadAttention or (only is not None and id(m) not in only):
            continue
        dead, fold = dead_heads(m)
        if not dead:
            continue
        if fold is not None and m.out_proj.bias is None:
            continue  # nowhere to put the constant: the heads stay
        keep = [h for h in range(m.num_heads) if h not in set(dead)]
        new = HeadPrunedAttention.from_attention(m, keep)
        if fold is not None:
            new.out_proj.bias.add_(fold.to(new.out_proj.bias.dtype))
        new.train(m.training)
        parent_name, _, attr = name.rpartition(".")
        setattr(net.get_submodule(parent_name) if parent_name else net, attr, new)
        done[name] = (len(keep), m.num_heads)
    return done


def attention_spec(net: nn.Module) -> dict:
    """``{name: [num_heads, head_dim, orig_heads, kdim, vdim, bias, out_bias, batch_first]}``
    of the :class:`HeadPrunedAttention` modules of ``net`` (ints only: a safe save)."""
    return {n: [m.num_heads, m.head_dim, m.orig_heads, m.kdim, m.vdim,
                int(m.q_proj.bias is not None), int(m.out_proj.bias is not None),
                int(m.batch_first)]
            for n, m in net.named_modules() if isinstance(m, HeadPrunedAttention)}


def restore_attention(model: nn.Module, spec: dict, where: str) -> None:
    """Put empty :class:`HeadPrunedAttention` modules where ``spec`` (:func:`attention_spec`)
    says, in a fresh instance of the original architecture; ValueError if they do not fit."""
    modules = dict(model.named_modules())
    for name, s in spec.items():
        m = modules.get(name)
        if type(m) is not nn.MultiheadAttention or not isinstance(s, list) or len(s) != 8 \
                or not all(isinstance(v, int) for v in s):
            raise ValueError(f"{where}: no nn.MultiheadAttention {name!r} to hold the kept heads")
        heads, d, orig, kdim, vdim, bias, out_bias, batch_first = s
        if orig != m.num_heads or d * orig != m.embed_dim or not 1 <= heads <= orig:
            raise ValueError(f"{where}: {name!r} has {m.num_heads} heads of width "
                             f"{m.embed_dim // m.num_heads}, the file {orig} of width {d}")
        new = HeadPrunedAttention(m.embed_dim, heads, d, orig, kdim=kdim, vdim=vdim,
                                  bias=bool(bias), out_bias=bool(out_bias),
                                  batch_first=bool(batch_first), dropout=m.dropout)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
