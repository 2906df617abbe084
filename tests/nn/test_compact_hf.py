"""Compact Hugging Face transformers: dead FFN neurons and attention heads removed block by block
(BERT, GPT-2's fused c_attn, Llama's gated FFN and grouped-query attention), outputs equal to the
zeroed model's, widths per block, saved as config + safetensors and loaded in a fresh process."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from dualdrop.nn import (compact, compact_report, export_sparse, load_compact,  # noqa: E402
                         load_pretrained, save_compact, save_pretrained)
from dualdrop.nn.hf import families  # noqa: E402
from hf_tiny_models import (ids, load_in_fresh_process, magnitude_pruned, out,  # noqa: E402
                            tiny_bert, tiny_gpt2, tiny_llama, zero_units)

torch.set_num_threads(1)


def widths(model):
    return [families.widths(b) for b in families.blocks(model)]


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def w(ffn, heads, kv=None):
    return {"intermediate_size": ffn, "num_attention_heads": heads,
            "num_key_value_heads": heads if kv is None else kv}


def assert_same(small, model, x, atol=1e-5):
    torch.testing.assert_close(out(small, x), out(model, x), rtol=0, atol=atol)


# ---- every layout: per-block widths, constants folded, outputs equal ---------------------------

@pytest.mark.parametrize("fold", [False, True])
def test_bert_neurons_and_heads_removed_per_block(fold):
    model, x = tiny_bert(), ids()
    # block 0: 24 neurons and heads 1, 3 dead; block 1: 40 neurons and head 0
    zero_units(model, [range(24), range(10, 50)], [[1, 3], [0]], keep_bias=fold,
               values_only=fold)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    small = compact(model, {"input_ids": x})
    assert widths(small) == [w(40, 2), w(24, 3)]
    att = small.encoder.layer[0].attention.self
    assert (att.num_attention_heads, att.all_head_size) == (2, 16)
    assert n_params(small) < n_params(model) - 2 * 16 * 32
    if fold:  # the constants moved into biases: the zeroed units were not silent
        assert not torch.equal(small.encoder.layer[0].output.dense.bias,
                               model.encoder.layer[0].output.dense.bias)
    assert_same(small, model, x)
    assert_same(small, model, ids(seed=7, n=3, t=11))   # other inputs, another length
    assert compact_report(model, small)["encoder.layer.1.attention.self"] == (3, 4)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_input_model_unchanged_and_sparsified_model_compacts():
    model, x = tiny_bert(), ids()
    zero_units(model, [range(8), range(16)], [[2], []])
    magnitude_pruned(model, x, 0.3)
    want = out(model, x)
    state = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    small = compact(model, {"input_ids": x})
    assert widths(small)[0]["num_attention_heads"] == 3
    assert widths(small)[0]["intermediate_size"] <= 56
    torch.testing.assert_close(out(small, x), want, rtol=0, atol=1e-5)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items() if k in state)
    assert not any(hasattr(m, "parametrizations") for m in small.modules())


@pytest.mark.parametrize("fold", [False, True])
def test_gpt2_fused_attention_heads_and_mlp(fold):
    model, x = tiny_gpt2(), ids()
    zero_units(model, [range(0, 128, 2), range(100)], [[0], [1, 2, 3]], keep_bias=fold,
               values_only=fold)
    small = compact(model, {"input_ids": x})
    assert widths(small) == [w(64, 3), w(28, 1)]
    att = small.transformer.h[1].attn
    assert (att.num_heads, att.split_size, att.c_attn.nf, att.c_proj.nx) == (1, 8, 24, 8)
    assert_same(small, model, x)
    assert_same(small, model, ids(seed=3, n=1, t=20))


def test_llama_grouped_query_heads_and_gated_ffn_constants():
    model = tiny_llama(attention_bias=True, mlp_bias=True)
    x = ids()
    # block 0: both query heads of key/value head 0 dead -> that group goes; block 1: only
    # query head 1 dead -> group 1 keeps 2 live heads, so group 0 keeps its dead one too
    zero_units(model, [range(12), range(20, 48)], [[0, 1], [1]], keep_bias=True)
    small = compact(model, {"input_ids": x})
    assert widths(small) == [w(36, 2, 1), w(20, 4, 2)]
    att = small.model.layers[0].self_attn
    assert att.num_key_value_groups == 2 and att.k_proj.out_features == 8
    assert_same(small, model, x)
    for cache in ("dynamic", "static"):   # the key/value caches take each block's heads
        kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, cache_implementation=cache)
        assert torch.equal(small.generate(x, **kw), model.generate(x, **kw))


def test_llama_gate_or_up_row_alone_makes_a_neuron_dead_without_biases():
    model, x = tiny_llama(), ids()
    with torch.no_grad():
        for layer in model.model.layers:   # SiLU(0) = 0 and (0 * up) = 0: both are dead
            layer.mlp.gate_proj.weight[:10] = 0
            layer.mlp.up_proj.weight[10:16] = 0
    small = compact(model, {"input_ids": x})
    assert [v["intermediate_size"] for v in widths(small)] == [32, 32]
    assert_same(small, model, x)


def test_a_constant_unit_stays_when_its_consumer_has_no_bias():
    model, x = tiny_llama(mlp_bias=True), ids()
    zero_units(model, [range(8), range(8)], [[], []], keep_bias=True)
    with torch.no_grad():
        model.model.layers[0].mlp.gate_proj.bias[:8] = 1.0   # act(1) * bu != 0
    model.model.layers[0].mlp.down_proj.bias = None
    with pytest.warns(UserWarning, match="model.layers.0.mlp.down_proj"):
        small = compact(model, {"input_ids": x})
    assert [v["intermediate_size"] for v in widths(small)] == [48, 40]
    assert_same(small, model, x)


def test_every_head_dead_keeps_one():
    model, x = tiny_bert(), ids()
    zero_units(model, [range(64), []], [range(4), []])
    small = compact(model, {"input_ids": x})
    assert widths(small)[0] == w(1, 1)
    assert_same(small, model, x)


def test_a_wrong_compaction_is_caught_on_example_inputs(monkeypatch):
    from dualdrop.nn.hf import compact as hf_compact
    model, x = tiny_bert(), ids()
    zero_units(model, [range(24), []], [[], []], keep_bias=True)   # constants to fold
    monkeypatch.setattr(hf_compact, "_fold", lambda m, cols, const: True)   # a fold forgotten
    with pytest.raises(RuntimeError, match="changed the model's outputs"):
        compact(model, {"input_ids": x})
    with pytest.raises(ValueError, match=r"model\(example_inputs\) failed"):
        compact(model, {"input_idz": x})
    monkeypatch.undo()
    model.train()
    compact(model, {"input_ids": x})   # compared in eval mode; the model's own mode restored
    assert model.training and model.encoder.layer[0].output.dropout.training


def test_csr_export_is_refused():
    model = tiny_bert()
    with pytest.raises(ValueError, match="compact the sparsified model"):
        compact(export_sparse(model, "csr"), {"input_ids": ids()})


# ---- saved, loaded back (a fresh process), and the transformers config where it can -----------

def test_uniform_widths_go_into_the_config():
    bert, x = tiny_bert(), ids()
    zero_units(bert, [range(16), range(16, 32)], [[], []])
    small = compact(bert, {"input_ids": x})
    assert small.config.intermediate_size == 48 and bert.config.intermediate_size == 64
    llama = tiny_llama()
    zero_units(llama, [range(8), range(8)], [[2, 3], [2, 3]])   # key/value head 1 in both
    small = compact(llama, {"input_ids": x})
    c = small.config
    assert (c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (40, 2, 1, 8)


@pytest.mark.parametrize("make", [tiny_bert, tiny_gpt2])
def test_the_same_heads_fewer_in_every_block_stay_out_of_a_bert_or_gpt2_config(make, tmp_path):
    # 2 heads of width 8 have the shapes of 1 head of width 16: the widths alone would pass
    model, x = make(), ids()
    zero_units(model, [range(16), range(16)], [[0, 1], [2, 3]])
    small = compact(model, {"input_ids": x})
    assert small.config.to_dict() == model.config.to_dict()
    with pytest.raises(ValueError, match="cannot express"):
        small.save_pretrained(tmp_path / "d")
    save_pretrained(small, tmp_path / "d")
    assert_same(load_pretrained(tmp_path / "d"), model, x)


@pytest.mark.slow
def test_compact_models_load_in_a_fresh_process(tmp_path):
    cases, x = [], ids(seed=5, n=3, t=9)
    for name, make, neurons, heads in [
            ("bert-uniform", tiny_bert, [range(16), range(16, 32)], [[], []]),
            ("bert-per-block", tiny_bert, [range(24), range(40)], [[1, 3], [0]]),
            ("gpt2-per-block", tiny_gpt2, [range(64), range(100)], [[0], [1, 2, 3]]),
            ("llama-uniform", tiny_llama, [range(8), range(8)], [[2, 3], [2, 3]]),
            ("llama-per-block", tiny_llama, [range(12), range(20)], [[0, 1], [1]])]:
        model = make()
        zero_units(model, neurons, heads, keep_bias=True)
        small = compact(model, {"input_ids": x})
        d = tmp_path / name
        native = "uniform" in name
        if native:
            small.save_pretrained(d)   # transformers' own method: a transformers checkpoint
        else:
            with pytest.raises(ValueError, match="dualdrop.nn.save_pretrained"):
                small.save_pretrained(d)
            assert not d.exists()
            save_pretrained(small, d)
            with pytest.raises(OSError):   # transformers refuses instead of loading wrongly
                type(model).from_pretrained(d)
        expected = out(model, x)
        back = load_pretrained(d)
        assert widths(back) == widths(small)
        torch.testing.assert_close(out(back, x), expected, rtol=0, atol=1e-5)
        cases.append((d, "transformers" if native else "dualdrop", type(model).__name__, x,
                      expected))
    for d, (diff, clean) in load_in_fresh_process(cases, tmp_path).items():
        assert diff < 1e-5 and clean, d


def test_save_compact_round_trip_of_a_transformer_with_heads_removed(tmp_path):
    model, x = tiny_gpt2(), ids()
    zero_units(model, [range(64), range(100)], [[0], [1, 2, 3]])
    small = compact(model, {"input_ids": x})
    save_compact(small, tmp_path / "small.pt")
    back = load_compact(tmp_path / "small.pt", tiny_gpt2(seed=3))
    assert widths(back) == widths(small)
    assert back.transformer.h[1].attn.split_size == 8
    assert_same(back, small, x, atol=0)


def test_load_compact_refuses_a_file_that_does_not_fit_and_leaves_the_model(tmp_path):
    model, x = tiny_gpt2(), ids()
    zero_units(model, [range(64), range(100)], [[0], [1, 2, 3]])
    save_compact(compact(model, {"input_ids": x}), tmp_path / "small.pt")
    fresh = tiny_gpt2(n_layer=3, seed=4)   # one block more: the widths do not fit
    state = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match="widths list 2 layers, the model has 3"):
        load_compact(tmp_path / "small.pt", fresh)
    assert {k: tuple(v.shape) for k, v in fresh.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in state.items()}
    assert fresh.transformer.h[1].attn.num_heads == 4


def test_save_compact_to_a_folder_is_refused_in_one_line(tmp_path):
    small = compact(tiny_bert(), {"input_ids": ids()})
    with pytest.raises(IsADirectoryError, match="is a folder") as err:
        save_compact(small, tmp_path)
    assert "\n" not in str(err.value) and list(tmp_path.iterdir()) == []


# ---- ONNX and the latency report of the compact model -----------------------------------------

@pytest.mark.slow
def test_onnx_export_and_latency_of_a_compact_transformer(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from dualdrop.nn import OnnxModel, export_onnx, latency
    model, x = tiny_gpt2(), ids()
    zero_units(model, [range(64), range(100)], [[0], [1, 2, 3]])
    small = compact(model, {"input_ids": x})
    small.config.use_cache = False   # the key/value cache is not a tensor output
    info = export_onnx(small, {"input_ids": x}, tmp_path / "small.onnx")
    assert info["dynamic_axes"]["input_ids"] == {0: "batch", 1: "sequence"}
    longer = ids(seed=2, n=3, t=15)
    got = OnnxModel(tmp_path / "small.onnx")(input_ids=longer)
    got = torch.as_tensor(got[0] if isinstance(got, (tuple, list)) else got)
    torch.testing.assert_close(got, out(small, longer), rtol=0, atol=1e-4)
    bert = tiny_bert()
    zero_units(bert, [range(32), range(32)], [[0, 1], [0, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = latency(bert, {"input_ids": x}, layouts=["dense", "compact"], batch_sizes=(2,),
                      rounds=2, progress=False)
    rows = {r["layout"]: r for r in rep.rows}
    assert rows["compact"]["params"] < rows["dense"]["params"]
    assert rows["compact"]["flop_ratio"] > 1.3
