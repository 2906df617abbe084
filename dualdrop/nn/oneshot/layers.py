"""How each layer type gives its one-shot problem: the weight as ``(out, in)`` and the rows of its
input matrix ``X`` (``n x in``), from which the calibration pass accumulates ``G = X^T X / n``.

- ``nn.Linear`` (and subclasses): ``W = weight``; ``X`` = the input with every leading dimension
  (batch, tokens) flattened into rows.
- ``nn.Conv1d`` / ``nn.Conv2d`` (``groups=1``): a convolution is a Linear map on image patches
  (im2col): ``W = weight.reshape(out, in * kh * kw)`` and ``X`` = every patch the kernel sees
  (``F.unfold`` with the layer's stride, padding, dilation; a non-zero ``padding_mode`` pads
  first), one row per output position. ``G`` is ``(in*kh*kw)^2`` whatever the image size.
- ``transformers.pytorch_utils.Conv1D`` (GPT-2's Linear): ``y = x W + b`` with ``weight`` of
  shape ``(in, out)``: ``W = weight.T``, written back transposed.
- ``nn.MultiheadAttention``: the query, key and value projections are three problems (rows of
  ``in_proj_weight``, or ``q/k/v_proj_weight``), each on its own input (for self-attention the
  three inputs, hence Grams, are one); the output projection's input is the attention context
  (the heads concatenated), which the module never exposes: the calibration hook recomputes it from the
  layer's inputs with the (already pruned) projections and an identity output projection.

Anything else holding a weight of two or more dimensions (Embedding, recurrent layers,
ConvTranspose, Conv3d, grouped convolutions, user layers) is left dense and named in a warning,
as is a weight another tool transforms (a parametrization, ``torch.nn.utils.prune``) or one
shared with another module (GPT-2's ``lm_head`` is tied to its token embedding).
"""

from __future__ import annotations

import fnmatch
import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from dualdrop.nn._layers import is_conv1d
from dualdrop.nn.targets import check_patterns, foreign_reason

KINDS = ("linear", "conv", "hf_conv1d", "mha_in", "mha_out")


@dataclass
class Step:
    """One module in flight: the problems one pass over the calibration data gives.

    ``names``: the report names of its problems (one, or three for an attention's q/k/v);
    ``module``: the module whose call carries the inputs; ``kind``: one of :data:`KINDS`."""

    module_name: str
    module: nn.Module
    kind: str
    names: list = field(default_factory=list)

    # ---- weights ---------------------------------------------------------------------------------
    def weights(self) -> list[torch.Tensor]:
        """The ``(out, in)`` float64 weight of each problem (copies)."""
        m = self.module
        if self.kind == "linear":
            return [m.weight.detach().to(torch.float64).clone()]
        if self.kind == "conv":
            return [m.weight.detach().reshape(m.weight.shape[0], -1).to(torch.float64).clone()]
        if self.kind == "hf_conv1d":
            return [m.weight.detach().T.to(torch.float64).clone()]
        if self.kind == "mha_out":
            return [m.out_proj.weight.detach().to(torch.float64).clone()]
        return [w.detach().to(torch.float64).clone() for w in _qkv_weights(m)]

    @torch.no_grad()
    def set_weights(self, Ws: list[torch.Tensor]) -> None:
        """Write the pruned weights back, in the layer's own layout, dtype and device."""
        m = self.module
        if self.kind == "mha_in":
            if m._qkv_same_embed_dim:
                E = m.embed_dim
                for i, W in enumerate(Ws):
                    m.in_proj_weight[i * E:(i + 1) * E].copy_(W)
            else:
                for p, W in zip(_qkv_weights(m), Ws):
                    p.copy_(W)
            return
        (W,) = Ws
        if self.kind == "linear":
            m.weight.copy_(W)
        elif self.kind == "conv":
            m.weight.copy_(W.reshape(m.weight.shape))
        elif self.kind == "hf_conv1d":
            m.weight.copy_(W.T)
        else:
            m.out_proj.weight.copy_(W)

    def parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(qualified name, Parameter)`` of the tensors this step prunes."""
        pre = f"{self.module_name}." if self.module_name else ""
        m = self.module
        if self.kind == "mha_out":
            return [(f"{pre}out_proj.weight", m.out_proj.weight)]
        if self.kind == "mha_in":
            if m._qkv_same_embed_dim:
                return [(f"{pre}in_proj_weight", m.in_proj_weight)]
            return [(f"{pre}{n}_proj_weight", getattr(m, f"{n}_proj_weight")) for n in "qkv"]
        return [(f"{pre}weight", m.weight)]

    # ---- inputs ----------------------------------------------------------------------------------
    def input_rows(self, args: tuple, kwargs: dict, token_mask=None) -> list[torch.Tensor]:
        """The rows of ``X`` of each problem, from the module's call arguments; with a
        ``token_mask`` (bool, ``(batch, tokens)``: the real tokens of a padded batch) only the
        rows of real tokens (:func:`real_rows`)."""
        m = self.module
        if self.kind == "linear" or self.kind == "hf_conv1d":
            x = args[0] if args else next(iter(kwargs.values()))
            return [real_rows(x, token_mask)]
        if self.kind == "conv":
            return [conv_patches(m, args[0] if args else kwargs["input"])]
        bound = _bind_mha(m, args, kwargs)
        if self.kind == "mha_in":
            q, k, v = bound["query"], bound["key"], bound["value"]
            rows = [real_rows(t, token_mask) for t in (q, k, v)]
            if v is k:
                rows[2] = rows[1]
            if k is q:
                rows[1] = rows[0]
            return rows
        ctx = mha_context(m, bound)
        return [real_rows(ctx, token_mask)]

    def input_key(self, args: tuple, kwargs: dict):
        """The tensor a Linear or Conv1D step reads (steps that read the same tensor object in
        one forward are fed by one pass: ``pipeline``), or ``None`` for the other kinds."""
        if self.kind in ("linear", "hf_conv1d"):
            return args[0] if args else next(iter(kwargs.values()))
        return None


def real_rows(x: torch.Tensor, token_mask=None) -> torch.Tensor:
    """``x`` (``(..., features)``) as rows ``(n, features)``, keeping only the real tokens of a
    padded batch when ``token_mask`` (bool ``(batch, tokens)``) matches ``x``'s leading
    dimensions: ``(batch, tokens, ...)``, ``(tokens, batch, ...)`` (sequence-first attention) or
    ``(batch * tokens, features)``. A mask of another shape does not apply to ``x`` (an image
    batch, a cross-attention memory of another length) and ``x`` is kept whole."""
    if token_mask is not None and x.dim() >= 2:
        shape = tuple(token_mask.shape)
        if x.dim() >= 3 and tuple(x.shape[:2]) == shape:
            return x[token_mask].reshape(-1, x.shape[-1])
        if x.dim() >= 3 and tuple(x.shape[:2]) == shape[::-1]:
            return x.transpose(0, 1)[token_mask].reshape(-1, x.shape[-1])
        if x.dim() == 2 and x.shape[0] == token_mask.numel() and token_mask.dim() == 2:
            return x[token_mask.reshape(-1)]
    return x.reshape(-1, x.shape[-1])


def conv_patches(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The im2col rows of a Conv1d/Conv2d input: ``(positions * batch, in * prod(kernel))`` in
    the order of ``weight.reshape(out, -1)``."""
    two_d = isinstance(conv, nn.Conv2d)
    if not two_d:  # Conv1d as a Conv2d of height 1
        x = x.unsqueeze(-2)
    if x.dim() == 3:  # unbatched
        x = x.unsqueeze(0)
    k = conv.kernel_size if two_d else (1, conv.kernel_size[0])
    stride = conv.stride if two_d else (1, conv.stride[0])
    dilation = conv.dilation if two_d else (1, conv.dilation[0])
    padding = conv.padding if two_d else (0, conv.padding[0]) if not isinstance(
        conv.padding, str) else conv.padding
    if isinstance(padding, str):  # "same" / "valid": the explicit amounts F.conv would use
        if padding == "valid":
            padding = (0, 0)
        else:
            total = [d * (kk - 1) for d, kk in zip(dilation, k)]
            x = F.pad(x, (total[1] // 2, total[1] - total[1] // 2,
                          total[0] // 2, total[0] - total[0] // 2))
            padding = (0, 0)
    if conv.padding_mode != "zeros" and any(padding):
        pads = (padding[1], padding[1], padding[0], padding[0])
        x = F.pad(x, pads, mode=conv.padding_mode)
        padding = (0, 0)
    cols = F.unfold(x, k, dilation=dilation, padding=padding, stride=stride)
    return cols.transpose(1, 2).reshape(-1, cols.shape[1])


def _qkv_weights(m: nn.MultiheadAttention) -> list[torch.Tensor]:
    if m._qkv_same_embed_dim:
        return list(m.in_proj_weight.chunk(3, dim=0))
    return [m.q_proj_weight, m.k_proj_weight, m.v_proj_weight]


def _bind_mha(m: nn.MultiheadAttention, args: tuple, kwargs: dict) -> dict:
    sig = inspect.signature(type(m).forward)
    bound = sig.bind(m, *args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop("self", None)
    return out


def mha_context(m: nn.MultiheadAttention, a: dict) -> torch.Tensor:
    """The attention's context (heads concatenated, before ``out_proj``) for the call arguments
    ``a``, in the layout of the module's output: the module's own computation with an identity
    output projection."""
    q, k, v = a["query"], a["key"], a["value"]
    batched = q.dim() == 3
    if m.batch_first and batched:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    eye = torch.eye(m.embed_dim, dtype=q.dtype, device=q.device)
    extra = {}
    if not m._qkv_same_embed_dim:
        extra = {"use_separate_proj_weight": True, "q_proj_weight": m.q_proj_weight,
                 "k_proj_weight": m.k_proj_weight, "v_proj_weight": m.v_proj_weight}
    ctx, _ = F.multi_head_attention_forward(
        q, k, v, m.embed_dim, m.num_heads, m.in_proj_weight, m.in_proj_bias, m.bias_k, m.bias_v,
        m.add_zero_attn, m.dropout, eye, None, training=False,
        key_padding_mask=a.get("key_padding_mask"), need_weights=False,
        attn_mask=a.get("attn_mask"), is_causal=a.get("is_causal", False), **extra)
    return ctx


# ---- discovery -----------------------------------------------------------------------------------

def _matches(name: str, module: nn.Module, item) -> bool:
    if isinstance(item, type):
        return isinstance(module, item)
    return fnmatch.fnmatchcase(name, item)


def discover(model: nn.Module, include=None, exclude=None) -> tuple[list[Step], list[tuple]]:
    """``(steps, skipped)``: the prunable layers of ``model`` as walk steps (in module order;
    the pipeline reorders them by the forward), and ``(name, reason)`` of every weight left dense.

    ``include`` / ``exclude``: layer name patterns (``fnmatch`` on module names, e.g.
    ``"encoder.*"``; an attention's parts are ``<name>.in_proj`` and ``<name>.out_proj``) or
    module types; every prunable layer by default."""
    inc, exc = check_patterns(include, "include"), check_patterns(exclude, "exclude")
    for arg, items in (("include", inc), ("exclude", exc)):
        if items is not None and not items:
            raise ValueError(f"{arg} is empty; pass None instead")
    uses: dict[int, dict[int, str]] = {}  # parameter -> {module holding it: a name of it}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None:
                uses.setdefault(id(p), {}).setdefault(id(mod), f"{mname}.{pname}" if mname
                                                      else pname)
    steps, skipped, seen_modules = [], [], set()
    mha_outs = set()
    for mname, mod in model.named_modules():
        if isinstance(mod, nn.MultiheadAttention):
            mha_outs.add(id(mod.out_proj))
    matched = {id(it): False for it in (inc or []) + (exc or [])}

    def wanted(names, mods):
        """Whether a layer known by ``names`` and ``mods`` (its own; for an attention's parts
        also the attention's) is selected; records which patterns matched something."""
        def hit(it):
            return any(_matches(n, m, it) for n in names for m in mods)

        hit_inc = inc is None
        for it in inc or ():
            if hit(it):
                matched[id(it)] = hit_inc = True
        hit_exc = False
        for it in exc or ():
            if hit(it):
                matched[id(it)] = hit_exc = True
        return hit_inc and not hit_exc

    for mname, mod in model.named_modules():
        if id(mod) in seen_modules or id(mod) in mha_outs:
            continue
        seen_modules.add(id(mod))
        if isinstance(mod, nn.MultiheadAttention):
            parts = [("mha_in", f"{mname}.in_proj", [f"{mname}.in_proj.{c}" for c in "qkv"],
                      [n for n in ("in_proj_weight", "q_proj_weight", "k_proj_weight",
                                   "v_proj_weight") if getattr(mod, n) is not None], mod),
                     ("mha_out", f"{mname}.out_proj", [f"{mname}.out_proj"], ["weight"],
                      mod.out_proj)]
            for kind, name, names, tensors, holder in parts:
                if not wanted([name, mname], [holder, mod]):
                    continue
                reason = _unusable(holder, tensors, uses, name)
                if reason:
                    skipped.append((name, reason))
                else:
                    steps.append(Step(mname, mod, kind, names))
            continue
        kind = _kind(mod)
        if kind is None:
            big = [n for n, p in mod._parameters.items() if p is not None and p.dim() >= 2]
            if big and wanted([mname], [mod]):
                label = mname if big == ["weight"] else ", ".join(
                    f"{mname}.{n}" if mname else n for n in big)
                skipped.append((label, _why_not(mod)))
            continue
        if not wanted([mname], [mod]):
            continue
        reason = _unusable(mod, ["weight"], uses, mname)
        if reason:
            skipped.append((mname, reason))
        else:
            steps.append(Step(mname, mod, kind, [mname]))
    for it in (inc or []) + (exc or []):
        if not matched[id(it)]:
            arg = "include" if inc and any(it is j for j in inc) else "exclude"
            raise ValueError(f"{arg}: {getattr(it, '__name__', it)!r} matches no layer of the "
                             f"model; its layers are {[s.names[0] for s in steps]}")
    return steps, skipped


def _kind(mod: nn.Module) -> str | None:
    if is_conv1d(mod):
        return "hf_conv1d"
    if isinstance(mod, nn.Linear):
        return "linear"
    if isinstance(mod, (nn.Conv1d, nn.Conv2d)) and mod.groups == 1:
        return "conv"
    return None


def _why_not(mod: nn.Module) -> str:
    if isinstance(mod, (nn.Conv1d, nn.Conv2d)):
        return f"a grouped convolution (groups={mod.groups}): one-shot pruning covers groups=1"
    return (f"{type(mod).__name__} is not a layer one-shot pruning covers (Linear, Conv1d/2d, "
            "transformers Conv1D, MultiheadAttention)")


def _unusable(mod: nn.Module, tensors: list[str], uses: dict, name: str) -> str | None:
    for t in tensors:
        reason = foreign_reason(mod, t)
        if reason:
            return f"{t} {reason}"
        if parametrize.is_parametrized(mod, t):
            return (f"{t} is sparsified by dualdrop.sparsify; fold it first (sp.finalize(), or "
                    "export_sparse) to prune the result once")
        p = mod._parameters.get(t)
        if p is None:
            continue
        holders = uses.get(id(p), {})
        if len(holders) > 1:
            others = [u for mid, u in holders.items() if mid != id(mod)]
            return (f"its {t} is shared with {others} (tied weights): pruning it would prune "
                    "them too (untie it to prune it)")
    return None
