"""``dualdrop.nn.save_pretrained`` then ``load_pretrained`` gives back exactly the saved model:
the same module tree (a submodule left out at construction stays out: BERT built without its
pooler, as sentence encoders are loaded), the same weights and the same outputs, for BERT with
and without its pooler, GPT-2 and Llama, in the transformers form (dense) and in dualdrop's
form (compact, each block at its own widths)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dualdrop.nn import compact, load_pretrained, save_pretrained  # noqa: E402
from hf_tiny_models import ids, tiny_bert, tiny_gpt2, tiny_llama, zero_units  # noqa: E402


def _bert_without_pooler(seed=0):
    from transformers import BertModel
    torch.manual_seed(seed)
    full = tiny_bert(seed)
    model = BertModel(full.config, add_pooling_layer=False)
    model.load_state_dict({k: v for k, v in full.state_dict().items()
                           if not k.startswith("pooler.")})
    return model.eval()


MODELS = {"bert": tiny_bert, "bert-no-pooler": _bert_without_pooler, "gpt2": tiny_gpt2,
          "llama": tiny_llama}


def _outputs(model, x):
    with torch.no_grad():
        out = model(input_ids=x)
    return [t for t in out.values() if isinstance(t, torch.Tensor)]


def _same(a, b, x):
    assert [n for n, _ in a.named_modules()] == [n for n, _ in b.named_modules()]
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    for u, v in zip(_outputs(a, x), _outputs(b, x), strict=True):
        assert torch.allclose(u, v, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_dense_model_round_trips_exactly(name, tmp_path):
    model, x = MODELS[name](), ids()
    save_pretrained(model, tmp_path / "m")
    back = load_pretrained(tmp_path / "m")
    _same(model, back, x)
    meta = json.loads((tmp_path / "m" / "config.json").read_text()).get("dualdrop")
    if name == "bert-no-pooler":  # what the config cannot say, recorded
        assert meta["left_out"] == ["pooler"] and back.pooler is None
    else:
        assert meta is None  # a plain transformers checkpoint, nothing added


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_compact_model_with_widths_per_block_round_trips_exactly(name, tmp_path):
    model, x = MODELS[name](), ids()
    zero_units(model, neurons=[[0, 1, 2], [5]], heads=[[], [1]])
    small = compact(model, example_inputs={"input_ids": x})
    save_pretrained(small, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())["dualdrop"]
    assert meta["layers"] is not None  # dualdrop's form: the blocks' own widths
    back = load_pretrained(tmp_path / "m")
    _same(small, back, x)
    if name == "bert-no-pooler":
        assert meta["left_out"] == ["pooler"] and back.pooler is None
