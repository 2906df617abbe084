"""Tiny Hugging Face transformers (BERT, GPT-2, Llama from configs), structured zeroing of their
FFN neurons and attention heads as structured one-shot pruning leaves them, and a fresh Python
process that loads saved folders (shared by test_compact_hf and test_hf_save_layouts)."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import save_file

from dualdrop.nn._layers import out_in
from dualdrop.nn.hf import families

VOCAB = 50


@torch.no_grad()
def _biased(model):
    """Random biases (transformers initializes them to 0, which would hide a missing fold)."""
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.normal_(0.0, 0.5)
    return model.eval()


def tiny_bert(seed=0, **kw):
    from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=32)
    return _biased(BertModel(BertConfig(**{**cfg, **kw})))


def tiny_gpt2(seed=0, **kw):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32)
    return _biased(GPT2LMHeadModel(GPT2Config(**{**cfg, **kw})))


def tiny_llama(seed=0, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return _biased(LlamaForCausalLM(LlamaConfig(**{**cfg, **kw})))


def ids(seed=1, n=2, t=7):
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def zero_units(model, neurons, heads, *, keep_bias=False, values_only=False):
    """Zero FFN neurons ``neurons[i]`` and attention heads ``heads[i]`` of block ``i``.

    A neuron: its producer rows (and, unless ``keep_bias``, their biases: then it emits the
    constant act(b), which the compact export must fold) and its consumer column (unless
    ``keep_bias``). A head: its q/k/v rows and output columns (grouped-query attention: the
    shared key/value rows only with every query head of the group), or with ``values_only`` its
    value rows only (it then emits its value bias, which must be folded)."""
    for b, gone_n, gone_h in zip(families.blocks(model), neurons, heads):
        d = b.head_dim
        for i in gone_n:
            for p in b.producers:
                out_in(p)[i] = 0
                if p.bias is not None and not keep_bias:
                    p.bias[i] = 0
            if not keep_bias:
                out_in(b.consumer)[:, i] = 0
        w = families.widths(b)
        group = w["num_attention_heads"] // w["num_key_value_heads"]
        for h in gone_h:
            rows = slice(h * d, (h + 1) * d)
            kv = slice((h // group) * d, (h // group + 1) * d)
            if b.fused is not None:
                n = out_in(b.fused).shape[0] // 3
                parts = [(out_in(b.fused), b.fused.bias, off) for off in (0, n, 2 * n)]
                if values_only:
                    parts = parts[2:]
                for wt, bias, off in parts:
                    wt[off + h * d: off + (h + 1) * d] = 0
                    if bias is not None and not values_only:
                        bias[off + h * d: off + (h + 1) * d] = 0
            else:   # a shared key/value head goes only with every query head of its group
                whole = all(g in gone_h for g in range((h // group) * group,
                                                       (h // group + 1) * group))
                layers = [(b.v, kv)] if values_only else [(b.q, rows)] + (
                    [(b.k, kv), (b.v, kv)] if whole else [])
                for m, r in layers:
                    out_in(m)[r] = 0
                    if m.bias is not None and not values_only:
                        m.bias[r] = 0
            if not values_only:
                out_in(b.o)[:, rows] = 0


def magnitude_pruned(model, x, sparsity):
    """``model`` sparsified by magnitude (masks held) after 2 SGD steps on ``x``, in eval mode."""
    from dualdrop.nn import sparsify
    sp = sparsify(model, "magnitude", sparsity=sparsity, prune_every=1, end=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for s in (1, 2):
        opt.zero_grad()
        model(input_ids=x)[0].pow(2).mean().backward()
        opt.step()
        sp.after_step(opt, s, 2)
    return model.eval()


def out(model, x):
    with torch.no_grad():
        return model(input_ids=x)[0]


_LOADER = r"""
import json, sys, torch
from safetensors.torch import load_file
cases, results = json.loads(sys.argv[1]), {}
for c in sorted(cases, key=lambda c: c["loader"] != "transformers"):
    data = load_file(c["data"])
    if c["loader"] == "transformers":
        import transformers
        transformers.logging.set_verbosity_error()
        model = getattr(transformers, c["cls"]).from_pretrained(c["dir"])
        clean = "dualdrop" not in sys.modules
    else:
        from dualdrop.nn import load_pretrained
        model, clean = load_pretrained(c["dir"]), True
    with torch.no_grad():
        y = model.eval()(input_ids=data["input_ids"])[0]
    results[c["dir"]] = [float((y - data["expected"]).abs().max()), clean]
print(json.dumps(results))
"""


def load_in_fresh_process(cases, tmp_path):
    """``{dir: (max |difference|, loaded without importing dualdrop)}``: each case ``(dir,
    loader, class name, input_ids, expected output)`` loaded in one new Python process, by
    ``transformers``' ``from_pretrained`` (before anything imports dualdrop) or by
    ``dualdrop.nn.load_pretrained``."""
    spec = []
    for k, (d, loader, cls, x, expected) in enumerate(cases):
        data = str(tmp_path / f"case{k}.safetensors")
        save_file({"input_ids": x.contiguous(), "expected": expected.contiguous()}, data)
        spec.append({"dir": str(d), "loader": loader, "cls": cls, "data": data})
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", _LOADER, json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return {d: tuple(v) for d, v in json.loads(run.stdout.strip().splitlines()[-1]).items()}
