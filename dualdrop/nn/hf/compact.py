"""The physically smaller Hugging Face transformer: dead FFN neurons and attention heads removed.

A structured pruning (``prune_oneshot(..., granularity="neuron" | "head")``, or training with
``granularity="neuron"``) leaves whole units at zero; this removes them from the layers, block
by block (the layouts of :mod:`dualdrop.nn.hf.families`), so that each block may end up with its
own FFN width and head count, and computes what the zeroed model computes (eval mode).

**FFN neuron** ``i`` (``h_i = act(p_i . x + b_i)``, or ``act(g_i . x + bg_i) (u_i . x + bu_i)``
for Llama's gated FFN; read by the consumer's column ``W[:, i]``):

- *unread*: ``W[:, i] = 0``; it goes, nothing to fold;
- *constant*: its producer rows are zero, so ``h_i = c_i`` whatever the input:
  ``c_i = act(b_i)``; gated: ``act(bg_i) bu_i`` with both rows zero, ``0`` with the gate row
  zero and ``act(bg_i) = 0`` or the up row zero and ``bu_i = 0``. Its contribution
  ``W[:, i] c_i`` moves into the consumer's bias (the unit stays when that is nonzero and the
  consumer has no bias).

**Attention head** ``h`` (query rows ``q_h``, key/value head ``j``, output columns
``W_o[:, h]``):

- its output columns are zero: it contributes nothing;
- its value rows are zero: every value is the constant ``b_v[j]``, and since a query's attention
  weights sum to one its output is ``b_v[j]`` at every position; ``W_o[:, h] b_v[j]`` moves into
  the output projection's bias.

Grouped-query attention (Llama with fewer key/value heads) needs the same number of query heads
on every kept key/value head: a key/value head goes when all its query heads are dead, and each
kept group keeps its live query heads plus, if another group has more, some of its dead ones
(exact: they contribute zero or their constant, which then is not folded). Every block keeps at
least one neuron and one head. A dead head found by ``granularity="head"`` one-shot pruning has
both: zero rows of q, k, v and zero output columns.

The widths per block then differ from the config's one value per key: :func:`compact_pretrained`
updates the config where it can express the result (the same widths in every block; fewer heads
only where the config has ``head_dim``, i.e. Llama), checked by building the model from the
updated config; otherwise the model keeps its original config and is saved with
``dualdrop.nn.save_pretrained`` (the widths per block go into config.json).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from dualdrop.nn._graph import call, first_line, output_diff
from dualdrop.nn._heads import head_index, zero_heads
from dualdrop.nn._layers import is_conv1d, out_in
from dualdrop.nn._save_route import route_save_pretrained
from dualdrop.nn.export import CSRLinear, export_sparse
from dualdrop.nn.hf import families as fam_
from dualdrop.nn.hf.families import Block
from dualdrop.nn.quantize import Int8DynamicLinear


def compact_pretrained(model: nn.Module, example_inputs=None, *, verify: bool = True,
                       groups=None):
    """A new Hugging Face model computing what ``model`` computes in eval mode, its dead FFN
    neurons and attention heads removed (module docstring). ``model``: a sparsified model (masks
    folded first, as by ``export_sparse(model, "dense")``) or a plain one with zeroed units; it
    is not changed. ``example_inputs``: one forward run's inputs (a dict is passed as keywords,
    e.g. ``{"input_ids": ids}``), on which both models are compared when ``verify``.
    ``groups``: the unit groups of a structured one-shot prune (``prune_structured(...)
    .groups``): only the FFNs and attentions of the blocks they name are compacted (the units
    of a group read by a layer outside the blocks, such as a classifier reading the pooler,
    stay, as they do without groups); None: every block's. ``dualdrop.nn.compact`` calls this
    for Hugging Face models."""
    fam = fam_.family(model)
    if fam is None:
        raise TypeError(f"{type(model).__name__} is not a Hugging Face model with BERT-, GPT-2- "
                        "or Llama-shaped blocks; use dualdrop.nn.compact(model, example_inputs)")
    bad = [n for n, m in model.named_modules() if isinstance(m, (CSRLinear, Int8DynamicLinear))]
    if bad:
        raise ValueError(f"model holds CSR or int8 layers ({bad[0]}, ...): compact the sparsified "
                         'model or its export_sparse(model, "dense"), then export that')
    chosen = None if groups is None else _named_blocks(model, fam, groups)
    want = _outputs(model, example_inputs) if verify and example_inputs is not None else None
    dense = export_sparse(model, "dense")
    kept_by_bias = []
    with torch.no_grad():
        for b in fam_.blocks(dense, fam):
            if chosen is None or (b.index, "neuron") in chosen:
                kept_by_bias += _compact_ffn(b)
            if chosen is None or (b.index, "head") in chosen:
                kept_by_bias += _compact_heads(b)
    if kept_by_bias:
        warnings.warn("compact: units with a constant output kept because the layer reading "
                      f"them has no bias to take it: {', '.join(kept_by_bias[:6])}"
                      + (" ..." if len(kept_by_bias) > 6 else ""), UserWarning, stacklevel=2)
    express_in_config(dense, fam)
    if want is not None and output_diff(want, _outputs(dense, example_inputs)) > 1e-4:
        raise RuntimeError("compact export changed the model's outputs on example_inputs; this "
                           'is a bug, please report it; use layout="dense" meanwhile')
    return route_save_pretrained(dense.eval())


def _named_blocks(model, fam, groups) -> set:
    """``{(block index, "neuron" | "head")}`` of the unit groups ``groups``: a group read by a
    block's FFN output layer is its neurons, one read by its attention's output projection its
    heads (a group read by any other layer names none)."""
    where = {}
    for b in fam_.blocks(model, fam):
        where[id(b.consumer)], where[id(b.o)] = (b.index, "neuron"), (b.index, "head")
    return {where[id(g.consumer)] for g in groups if id(g.consumer) in where}


def _rows_zero(m) -> torch.Tensor:
    w = out_in(m)
    return (w == 0).all(1)


def _take(m, rows=None, cols=None) -> None:
    """Keep the output units ``rows`` and input units ``cols`` of a Linear / Conv1D (in place)."""
    w = out_in(m).detach()
    if rows is not None:
        w = w[rows]
        if m.bias is not None:
            m.bias = nn.Parameter(m.bias.detach()[rows].clone(),
                                  requires_grad=m.bias.requires_grad)
    if cols is not None:
        w = w[:, cols]
    w = (w.t() if is_conv1d(m) else w).contiguous().clone()
    m.weight = nn.Parameter(w, requires_grad=m.weight.requires_grad)
    fam_.sync_sizes(m)


def _fold(m, cols, const) -> bool:
    """Add ``W[:, cols] const`` to ``m``'s bias; False if that is nonzero and there is no bias."""
    if not len(cols):
        return True
    delta = out_in(m).double()[:, cols] @ const.double()
    if not bool(torch.any(delta != 0)):
        return True
    if m.bias is None:
        return False
    m.bias.add_(delta.to(m.bias.dtype))
    return True


def _compact_ffn(b: Block) -> list:
    """Remove the dead neurons of a block's FFN (module docstring); the names of units kept
    for want of a bias."""
    width = out_in(b.producers[0]).shape[0]
    unread = (out_in(b.consumer) == 0).all(0)
    zero = [_rows_zero(p) for p in b.producers]
    biases = [p.bias.detach() if p.bias is not None else
              torch.zeros(width, dtype=out_in(p).dtype, device=out_in(p).device)
              for p in b.producers]
    if b.gated:
        (gz, uz), (bg, bu) = zero, biases
        ag = b.act(bg)
        const_mask = (gz & uz) | (gz & (ag == 0)) | (uz & (bu == 0))
        const = torch.where(gz & uz, ag * bu, torch.zeros_like(bu))
    else:
        const_mask = zero[0]
        const = b.act(biases[0])
    dead = unread | const_mask
    gone = [i for i in range(width) if dead[i]]
    if len(gone) == width:
        gone = gone[1:]
    folds = [i for i in gone if not unread[i]]
    kept = []
    if folds and not _fold(b.consumer, folds, const[folds]):
        gone = [i for i in gone if unread[i] or const[i] == 0]
        kept.append(b.names["down"])
    if not gone:
        return kept
    keep = torch.tensor([i for i in range(width) if i not in set(gone)], dtype=torch.long)
    for p in b.producers:
        _take(p, rows=keep)
    _take(b.consumer, cols=keep)
    return kept


def _qkv(b: Block):
    """The (out, in) weights and biases of q, k, v (views into GPT-2's fused c_attn)."""
    if b.fused is None:
        return [(out_in(m), m.bias) for m in (b.q, b.k, b.v)]
    w, bias = out_in(b.fused), b.fused.bias
    n = w.shape[0] // 3
    return [(w[i * n:(i + 1) * n], bias[i * n:(i + 1) * n] if bias is not None else None)
            for i in range(3)]


def _compact_heads(b: Block) -> list:
    """Remove the dead heads of a block's self-attention (module docstring); the names of heads
    kept for want of a bias."""
    w = fam_.widths(b)
    H, KV, d = w["num_attention_heads"], w["num_key_value_heads"], b.head_dim
    group = H // KV
    (wq, bq), (wk, bk), (wv, bv) = _qkv(b)
    wo = out_in(b.o)
    out_dead, v_dead = zero_heads(wo, H, d, 1), zero_heads(wv, KV, d, 0)
    dead = [out_dead[h] or v_dead[h // group] for h in range(H)]
    # a key/value head goes with all its query heads; kept groups keep the same count
    live = [[h for h in range(j * group, (j + 1) * group) if not dead[h]] for j in range(KV)]
    kv_keep = [j for j in range(KV) if live[j]] or [0]
    per = max(1, max(len(live[j]) for j in kv_keep))
    q_keep = []
    for j in kv_keep:
        heads = list(live[j])
        heads += [h for h in range(j * group, (j + 1) * group) if h not in heads][:per - len(heads)]
        q_keep += sorted(heads)
    if len(q_keep) == H:
        return []
    # the value-bias constants of removed heads that still write to the output
    gone = [h for h in range(H) if h not in set(q_keep)]
    cols, const = [], []
    for h in gone:
        if not out_dead[h] and bv is not None:
            j = h // group
            cols += head_index([h], d).tolist()
            const.append(bv.narrow(0, j * d, d).detach())
    if cols and not _fold(b.o, cols, torch.cat(const)):
        return [b.names["attention"]]
    rows_q = torch.as_tensor(head_index(q_keep, d))
    rows_kv = torch.as_tensor(head_index(kv_keep, d))
    if b.fused is not None:
        n = out_in(b.fused).shape[0] // 3
        _take(b.fused, rows=torch.cat([rows_q, rows_q + n, rows_q + 2 * n]))
    else:
        _take(b.q, rows=rows_q)
        _take(b.k, rows=rows_kv)
        _take(b.v, rows=rows_kv)
    _take(b.o, cols=rows_q)
    fam_.set_heads(b, len(q_keep), len(kv_keep))
    return []


def express_in_config(model, fam: str | None = None) -> bool:
    """Write the blocks' widths into ``model.config`` when its keys can express them (the same
    widths in every block, checked by building the model from the updated config on the meta
    device); True if they can (then ``from_pretrained`` rebuilds the model)."""
    fam = fam or fam_.family(model)
    if fam_.fits(model, model.config, fam):
        return True
    bs = fam_.blocks(model, fam)
    upd = fam_.config_update(fam, [fam_.widths(b) for b in bs], bs[0].head_dim)
    if upd is None:
        return False
    config = fam_.updated_config(model.config, upd)
    if config is None or not fam_.fits(model, config, fam):
        return False
    for k, v in upd.items():
        setattr(model.config, k, v)
    return True


@torch.no_grad()
def _outputs(model, example_inputs):
    """The eval-mode outputs of ``model`` on ``example_inputs`` (its mode restored after)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        return call(model, example_inputs)
    except Exception as exc:
        raise ValueError(f"model(example_inputs) failed ({type(exc).__name__}: "
                         f"{first_line(exc)}); example_inputs must be valid inputs of the model "
                         "(a dict is passed as keyword arguments)") from None
    finally:
        for m, training in modes:
            m.training = training
