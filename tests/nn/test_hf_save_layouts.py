"""Every pruned form of a Hugging Face model saves as config + safetensors and loads back with its
outputs: ``model.save_pretrained`` (transformers' own method, routed by dualdrop) where
transformers can load the result, a one-line refusal naming ``dualdrop.nn.save_pretrained``
where it cannot, and ``dualdrop.nn.save_pretrained`` / ``load_pretrained`` for every form."""

import json
import os
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from dualdrop.nn import (CSRLinear, Int8DynamicLinear, export_sparse,  # noqa: E402
                         load_pretrained, quantize_dynamic_int8, save_pretrained)
from hf_tiny_models import (ids, load_in_fresh_process, magnitude_pruned, out,  # noqa: E402
                            tiny_bert, tiny_gpt2, zero_units)

torch.set_num_threads(1)


def pruned(make):
    """A sparsified model (magnitude masks held) with whole units zeroed, after 2 steps."""
    model = make()
    zero_units(model, [range(8), range(20)], [[1], []])
    return magnitude_pruned(model, ids(), 0.5)


def layouts(masked):
    x = {"input_ids": ids()}
    return {
        "masked": masked,
        "dense": export_sparse(masked, "dense"),
        "csr": export_sparse(masked, "csr"),
        "int8": export_sparse(masked, "dense", quantize="dynamic-int8"),
        "compact": export_sparse(masked, "compact", example_inputs=x),
        "compact-int8": export_sparse(masked, "compact", example_inputs=x,
                                      quantize="dynamic-int8"),
    }


NATIVE = {"masked", "dense", "csr"}   # transformers' from_pretrained loads these
KINDS = {"csr": CSRLinear, "int8": Int8DynamicLinear, "compact-int8": Int8DynamicLinear}


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def forms(request):
    with warnings.catch_warnings():   # layers left dense or in float, named: not the point
        warnings.simplefilter("ignore")
        return layouts(pruned({"bert": tiny_bert, "gpt2": tiny_gpt2}[request.param]))


@pytest.mark.parametrize("layout", ["masked", "dense", "csr", "int8", "compact", "compact-int8"])
def test_each_layout_saves_with_save_pretrained_or_refuses_naming_the_function(
        forms, layout, tmp_path):
    model, x = forms[layout], ids(seed=4, n=3, t=9)
    cls = type(forms["dense"])
    want = out(model, x)
    d = tmp_path / "own"
    if layout in NATIVE:
        model.save_pretrained(d)   # transformers' own method
        back = cls.from_pretrained(d).eval()
        torch.testing.assert_close(out(back, x), want, rtol=0, atol=1e-5)
    else:
        with pytest.raises(ValueError, match=r"dualdrop\.nn\.save_pretrained\(model, dir\)") \
                as err:
            model.save_pretrained(d)
        assert "\n" not in str(err.value) and not d.exists()
        if "int8" in layout:
            assert "int8 layers" in str(err.value) and 'export_sparse(model, "dense")' in \
                str(err.value)
    d2 = tmp_path / "dualdrop"
    assert save_pretrained(model, d2) == str(d2)
    back = load_pretrained(d2)
    if layout in KINDS:   # loaded in the layout it was saved in
        assert any(isinstance(m, KINDS[layout]) for m in back.modules())
    if hasattr(back, "lm_head"):   # GPT-2's tied output layer stays tied
        assert back.lm_head.weight is back.transformer.wte.weight
    torch.testing.assert_close(out(back, x), want, rtol=0, atol=1e-6)
    if layout not in NATIVE:
        with pytest.raises(OSError):   # never a silent float or full-width model
            cls.from_pretrained(d2)


def test_the_masked_model_is_left_as_given(forms, tmp_path):
    masked = forms["masked"]
    state = {k: v.clone() for k, v in masked.state_dict().items() if torch.is_tensor(v)}
    masked.save_pretrained(tmp_path)
    assert any(hasattr(m, "parametrizations") for m in masked.modules())
    assert all(torch.equal(v, state[k]) for k, v in masked.state_dict().items() if k in state)


def test_a_trainer_style_save_with_the_training_state_is_refused(forms, tmp_path):
    masked = forms["masked"]
    with pytest.raises(ValueError, match="training state"):
        masked.save_pretrained(tmp_path, state_dict=masked.state_dict())


def test_a_plain_model_exported_or_quantized_routes_too(tmp_path):
    model, x = tiny_gpt2(), ids()   # never sparsified: e.g. pruned once by prune_oneshot
    csr = export_sparse(model, "csr")
    csr.save_pretrained(tmp_path / "csr")
    back = type(model).from_pretrained(tmp_path / "csr")
    torch.testing.assert_close(out(back, x), out(model, x), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="int8"), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the embeddings named as left in float
        quantize_dynamic_int8(model).save_pretrained(tmp_path / "int8")
    model.save_pretrained(tmp_path / "plain")   # a plain model: transformers' method as is
    assert not json.loads((tmp_path / "plain" / "config.json").read_text()).get("dualdrop")


@pytest.mark.slow
def test_saved_layouts_load_in_a_fresh_process(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forms = layouts(pruned(tiny_gpt2))
    x, cases = ids(seed=6, n=2, t=10), []
    for layout in ("masked", "csr", "int8", "compact-int8"):
        d = tmp_path / layout
        save_pretrained(forms[layout], d)
        loader = "transformers" if layout in NATIVE else "dualdrop"
        cases.append((d, loader, "GPT2LMHeadModel", x, out(forms[layout], x)))
    for d, (diff, clean) in load_in_fresh_process(cases, tmp_path).items():
        assert diff < 1e-5 and clean, d


# ---- the folder: earlier weights replaced, other files kept, nothing half-written ------------

def test_a_save_replaces_earlier_weights_and_keeps_other_files(forms, tmp_path):
    forms["dense"].save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    save_pretrained(forms["int8"], tmp_path)
    names = set(os.listdir(tmp_path))
    assert "model.safetensors" not in names   # transformers would have loaded it instead
    assert {"tokenizer.json", "dualdrop_model.safetensors", "config.json"} <= names
    save_pretrained(forms["dense"], tmp_path)
    assert "dualdrop_model.safetensors" not in os.listdir(tmp_path)
    assert not [n for n in os.listdir(tmp_path.parent) if ".tmp-" in n]


def test_an_interrupted_save_leaves_the_folder_as_it_was(forms, tmp_path, monkeypatch):
    import safetensors.torch
    save_pretrained(forms["int8"], tmp_path / "m")
    before = {f: (tmp_path / "m" / f).read_bytes() for f in os.listdir(tmp_path / "m")}

    def dies(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", dies)
    with pytest.raises(KeyboardInterrupt):
        save_pretrained(forms["compact-int8"], tmp_path / "m")
    assert {f: (tmp_path / "m" / f).read_bytes() for f in os.listdir(tmp_path / "m")} == before
    assert os.listdir(tmp_path) == ["m"]


# ---- bad input: one line, nothing changed ------------------------------------------------------

def test_bad_arguments_are_refused(forms, tmp_path):
    with pytest.raises(TypeError, match="PreTrainedModel"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        save_pretrained(forms["dense"], tmp_path / "f")
    with pytest.raises(ValueError, match="push_to_hub"):
        save_pretrained(forms["dense"], tmp_path / "d", push_to_hub=True)
    with pytest.raises(ValueError, match="max_shard_size.*drop them"):
        save_pretrained(forms["int8"], tmp_path / "d", max_shard_size="1GB")
    with pytest.raises(ValueError, match="not a directory"):
        load_pretrained(tmp_path / "missing")
    assert sorted(os.listdir(tmp_path)) == ["f"]


def _break(d, how):
    cfg = json.loads((d / "config.json").read_text())
    if how == "config not json":
        (d / "config.json").write_text("{not json")
        return
    if how == "truncated weights":
        data = (d / "dualdrop_model.safetensors").read_bytes()
        (d / "dualdrop_model.safetensors").write_bytes(data[: len(data) // 3])
        return
    if how == "weights of another model":
        w = d / "dualdrop_model.safetensors"
        from safetensors.torch import load_file, save_file
        sd = load_file(str(w))
        k = next(k for k in sd if k.endswith("intermediate.dense.bias") or
                 k.endswith("mlp.c_fc.bias"))
        sd[k] = torch.zeros(sd[k].shape[0] + 1)
        save_file(sd, str(w), metadata={"format": "pt"})
        return
    if how == "malformed entry":
        cfg["dualdrop"]["int8"] = "all"
    elif how == "widths beyond the config":
        cfg["dualdrop"]["layers"][0]["intermediate_size"] = 10 ** 9
    elif how == "no class":
        cfg["architectures"] = None
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("how", ["config not json", "truncated weights",
                                 "weights of another model", "malformed entry",
                                 "widths beyond the config", "no class"])
def test_a_malformed_folder_gives_one_line(forms, how, tmp_path):
    save_pretrained(forms["compact-int8"], tmp_path)
    _break(tmp_path, how)
    with pytest.raises(ValueError) as err:
        load_pretrained(tmp_path)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_a_compact_model_of_an_unknown_layout_is_refused_naming_save_compact(tmp_path):
    pytest.importorskip("torch_pruning")
    from transformers import ViTConfig, ViTModel

    from dualdrop.nn import compact, load_compact, save_compact
    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                    intermediate_size=64, image_size=16, patch_size=8)
    model, x = ViTModel(cfg).eval(), torch.randn(2, 3, 16, 16)
    fc1 = next(m for n, m in model.named_modules() if n.endswith("fc1") or
               n.endswith("intermediate.dense"))
    with torch.no_grad():
        fc1.weight[:20] = 0
        fc1.bias[:20] = 0
    small = compact(model, x)   # the generic path: the FFN narrower than the config says
    for save in (small.save_pretrained, lambda d: save_pretrained(small, d)):
        with pytest.raises(ValueError, match=r"save_compact\(model, path\)"):
            save(tmp_path / "d")
    assert not (tmp_path / "d").exists()
    save_compact(small, tmp_path / "small.pt")
    back = load_compact(tmp_path / "small.pt", ViTModel(cfg))
    with torch.no_grad():
        torch.testing.assert_close(back(x)[0], small(x)[0], rtol=0, atol=0)


def test_sharded_saves_and_their_stale_shards(forms, tmp_path):
    model, x = forms["masked"], ids()
    save_pretrained(model, tmp_path, max_shard_size="40KB")   # transformers' own option
    shards = [n for n in os.listdir(tmp_path) if n.startswith("model-")]
    assert len(shards) > 1 and "model.safetensors.index.json" in os.listdir(tmp_path)
    back = type(forms["dense"]).from_pretrained(tmp_path)
    torch.testing.assert_close(out(back, x), out(model, x), rtol=0, atol=1e-5)
    save_pretrained(forms["compact-int8"], tmp_path)   # no shard left to be loaded instead
    assert not [n for n in os.listdir(tmp_path) if n.startswith("model")]
    torch.testing.assert_close(out(load_pretrained(tmp_path), x), out(forms["compact-int8"], x),
                               rtol=0, atol=1e-6)
