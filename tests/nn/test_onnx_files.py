"""ONNX files that serve every batch size and sequence length, written only once checked
(dualdrop.nn.export_onnx), and OnnxModel's inputs checked (dualdrop.nn.onnx)."""

import numpy as np
import pytest
import torch
import torch.nn as nn

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
import onnx  # noqa: E402

from dualdrop.nn import onnx as donnx  # noqa: E402
from dualdrop.nn.onnx import OnnxModel, export_onnx  # noqa: E402

torch.set_num_threads(1)


def run_ort(path, **feed):
    """onnxruntime on its own (not through the module under test)."""
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {k: v.numpy() for k, v in feed.items()})


def input_dims(path):
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in onnx.load(str(path)).graph.input}


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3)).eval()


class Encoder(nn.Module):
    """A plain Transformer on (batch, length, features) inputs."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.enc(x))


@pytest.mark.slow
def test_a_transformer_file_runs_at_any_length(tmp_path):
    torch.manual_seed(0)
    model = Encoder().eval()
    rec = export_onnx(model, torch.randn(2, 8, 16), tmp_path / "enc.onnx")
    assert rec["dynamic_axes"] == {"x": {0: "batch", 1: "sequence"}}
    assert input_dims(tmp_path / "enc.onnx")["x"] == ["batch", "sequence", 16]
    for n, length in ((3, 32), (1, 5)):                  # exported at 8 tokens
        x = torch.randn(n, length, 16)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(run_ort(tmp_path / "enc.onnx", x=x)[0], want, atol=1e-5)


@pytest.mark.slow
def test_a_tiny_bert_file_runs_at_any_length(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=160)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 60, (2, 32))
    rec = export_onnx(bert, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                      tmp_path / "bert.onnx")
    assert rec["dynamic_axes"]["input_ids"] == {0: "batch", 1: "sequence"}
    assert rec["dynamic_axes"]["attention_mask"] == {0: "batch", 1: "sequence"}
    for n, length in ((3, 128), (1, 7)):                 # exported at 32 tokens
        ids = torch.randint(0, 60, (n, length))
        mask = torch.ones_like(ids)
        mask[0, length // 2:] = 0                        # padding
        with torch.no_grad():
            want = bert(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        got = run_ort(tmp_path / "bert.onnx", input_ids=ids, attention_mask=mask)[0]
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_features_and_channels_stay_fixed(tmp_path):
    rec = export_onnx(mlp(), torch.randn(4, 12), tmp_path / "m.onnx")
    assert rec["dynamic_axes"] == {"input": {0: "batch"}}
    with pytest.raises(ValueError, match="dynamic_sequence=True: no sequence axis"):
        export_onnx(mlp(), torch.randn(4, 12), tmp_path / "n.onnx", dynamic_sequence=True)
    rec = export_onnx(Encoder().eval(), torch.randn(2, 6, 16), tmp_path / "e.onnx",
                      dynamic_sequence=False, check=False)
    assert rec["dynamic_axes"] == {"x": {0: "batch"}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.onnx", "m.onnx"]


def test_a_refused_export_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    export_onnx(mlp(), torch.randn(4, 12), path)
    good = path.read_bytes()
    cases = [
        ({"example_inputs": torch.randn(0, 12)}, ValueError, "no rows"),
        ({"example_inputs": torch.randint(0, 3, (4, 12))}, ValueError, "does not run on them"),
        ({"opset_version": 5}, ValueError, "opset_version must be"),
        ({"opset_version": 7}, ValueError, "wrote opset"),           # the exporter's floor
        ({"dynamic_sequence": "yes"}, TypeError, "dynamic_sequence"),
    ]
    for kw, exc, match in cases:
        kw = {"example_inputs": torch.randn(4, 12), **kw}
        with pytest.raises(exc, match=match):
            export_onnx(mlp(), path=path, **kw)
        assert path.read_bytes() == good, kw
        assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"], kw   # no debris
    # a file whose check fails is not moved into place either
    monkeypatch.setattr(donnx, "output_diff", lambda ref, got: 1.0)
    with pytest.raises(RuntimeError, match="nothing was written"):
        export_onnx(nn.Sequential(nn.Linear(12, 2)), torch.randn(4, 12), path)
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    with pytest.raises(IsADirectoryError, match="is a folder"):
        export_onnx(mlp(), torch.randn(4, 12), tmp_path)


def test_the_opset_asked_for_is_the_opset_written(tmp_path):
    rec = export_onnx(mlp(), torch.randn(4, 12), tmp_path / "m.onnx", opset_version=18)
    assert rec["opset"] == 18
    assert onnx.load(str(tmp_path / "m.onnx")).opset_import[0].version == 18


def test_onnx_model_takes_exactly_the_files_inputs(tmp_path):
    export_onnx(mlp(), torch.randn(4, 12), tmp_path / "m.onnx")
    model, x = OnnxModel(tmp_path / "m.onnx"), torch.randn(2, 12)
    assert model(x).shape == (2, 3) and model(input=x).shape == (2, 3)
    with pytest.raises(TypeError, match=r"takes 1 input\(s\) \['input'\], got 2"):
        model(x, x)                                  # the second input was dropped silently
    with pytest.raises(TypeError, match="unknown input"):
        model(x, mask=x)
    with pytest.raises(TypeError, match="given twice"):
        model(x, input=x)
    with pytest.raises(TypeError, match="missing input"):
        model()
    with pytest.raises(ValueError, match="refused its inputs"):
        model(torch.randn(2, 5))


@pytest.mark.slow
def test_a_hugging_face_decoder_exports_with_its_cache_on(tmp_path):
    """GPT-2 returns its key/value cache by default (config.use_cache): the export runs without
    it and puts the setting back."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, n_positions=32, vocab_size=50, bos_token_id=0,
        eos_token_id=0)).eval()
    assert model.config.use_cache
    rec = export_onnx(model, {"input_ids": torch.randint(0, 50, (2, 8))}, tmp_path / "g.onnx")
    assert rec["max_abs_diff"] < 1e-4
    assert rec["dynamic_axes"]["input_ids"] == {0: "batch", 1: "sequence"}
    assert model.config.use_cache
