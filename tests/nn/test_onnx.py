"""ONNX export run by onnxruntime (dualdrop.nn.export_onnx): dense and compact, int8."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("torch_pruning")
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from dualdrop.nn import HeadPrunedAttention, export_sparse  # noqa: E402
from dualdrop.nn.onnx import OnnxModel, export_onnx  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.slow


def run_ort(path, x):
    """onnxruntime on its own (not through the module under test)."""
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]


def mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        m[0].weight[[1, 4, 9]] = 0                # dead units: relu(b) folds into m[2].bias
        m[2].weight[[0, 5]] = 0
        m[2].weight.mul_((torch.rand_like(m[2].weight) < 0.5).float())
    return m.eval()


class ResCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 6, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(6)
        self.conv_a = nn.Conv2d(6, 8, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(8)
        self.conv_b = nn.Conv2d(8, 6, 3, padding=1, bias=False)
        self.bn_b = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        h = F.relu(self.bn0(self.stem(x)))
        r = F.relu(self.bn_a(self.conv_a(h)))
        h = F.relu(h + self.bn_b(self.conv_b(r)))
        return self.fc(h.mean((2, 3)))


def res_cnn():
    torch.manual_seed(0)
    m = ResCNN()
    with torch.no_grad():
        for bn in (m.bn0, m.bn_a, m.bn_b):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
        m.conv_a.weight[[2, 5, 6]] = 0           # dead inner channels emitting 0
        m.bn_a.bias[[2, 5, 6]] = 0
        m.bn_a.running_mean[[2, 5, 6]] = 0
    return m.eval()


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.enc(self.embed(x)).mean(1))


def encoder():
    torch.manual_seed(0)
    m = Encoder()
    E, d = 16, 4
    with torch.no_grad():
        for i, layer in enumerate(m.enc.layers):
            attn = layer.self_attn
            attn.in_proj_weight[2 * E + d:2 * E + 2 * d] = 0   # head 1: value rows zero,
            attn.in_proj_bias[2 * E + d:2 * E + 2 * d] = 0.3  # its value bias folds into out
            attn.out_proj.weight[:, 3 * d:] = 0               # head 3: output columns zero
            layer.linear1.weight[[0, 7, 11 + i]] = 0          # hidden units: relu(b) folds
    return m.eval()


CASES = {"mlp": (mlp, lambda n: torch.randn(n, 12)),
         "res_cnn": (res_cnn, lambda n: torch.randn(n, 1, 6, 6)),
         "encoder": (encoder, lambda n: torch.randn(n, 5, 8))}


@pytest.mark.parametrize("layout", ["dense", "compact"])
@pytest.mark.parametrize("case", list(CASES))
def test_onnxruntime_computes_what_torch_computes(tmp_path, case, layout):
    make, inputs = CASES[case]
    model = make()
    x = inputs(4)
    rec = export_onnx(model, x, tmp_path / "m.onnx", layout=layout)
    assert rec["exporter"] == "dynamo" and rec["max_abs_diff"] <= 1e-5
    assert rec["bytes"] == (tmp_path / "m.onnx").stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # one file, no temp left
    net = export_sparse(model, "compact", example_inputs=x) if layout == "compact" else model
    if layout == "compact":  # units, channels and heads went
        assert sum(p.numel() for p in net.parameters()) < sum(
            p.numel() for p in model.parameters())
    if case == "encoder" and layout == "compact":
        attn = [m for m in net.modules() if isinstance(m, HeadPrunedAttention)]
        assert [a.num_heads for a in attn] == [2, 2]
    if case == "res_cnn" and layout == "compact":
        assert net.conv_a.out_channels == 5
    for n in (1, 7):                                     # the batch dimension is dynamic
        xb = inputs(n)
        with torch.no_grad():
            want = model(xb).numpy()
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", xb), want, rtol=0, atol=1e-5)


def test_compact_file_is_smaller_and_int8_keeps_pruned_zeros(tmp_path):
    model, x = mlp(), torch.randn(8, 12)
    dense = export_onnx(model, x, tmp_path / "d.onnx")
    small = export_onnx(model, x, tmp_path / "c.onnx", layout="compact")
    q = export_onnx(model, x, tmp_path / "q.onnx", quantize="dynamic-int8")
    assert small["bytes"] < dense["bytes"] and q["bytes"] < dense["bytes"]
    assert 0 < q["max_abs_diff"] < 0.05
    graph = onnx.load(tmp_path / "q.onnx").graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    int8 = [a for a in inits.values() if a.dtype == np.int8 and a.ndim == 2]
    ws = [model[0].weight, model[2].weight, model[4].weight]
    assert len(int8) == 3
    for w in ws:                 # each float weight's zero pattern survives in its int8 form
        match = [a for a in int8 if a.shape in (tuple(w.shape), tuple(w.shape)[::-1])]
        zero = (w == 0).numpy()
        assert any(np.all((a if a.shape == zero.shape else a.T)[zero] == 0) for a in match)
    with torch.no_grad():
        ref = model(x)
    got = OnnxModel(tmp_path / "q.onnx")(x)
    assert (got.argmax(1) == ref.argmax(1)).all() and (got - ref).abs().max() < 0.05


def test_bad_arguments_are_refused(tmp_path):
    model, x = mlp(), torch.randn(2, 12)
    with pytest.raises(ValueError, match="'dense' or 'compact'"):
        export_onnx(model, x, tmp_path / "m.onnx", layout="csr")
    with pytest.raises(ValueError, match="must end in .onnx"):
        export_onnx(model, x, tmp_path / "m.pt")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        export_onnx(model, x, tmp_path / "nope" / "m.onnx")
    with pytest.raises(TypeError, match="example_inputs"):
        export_onnx(model, None, tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="quantize must be"):
        export_onnx(model, x, tmp_path / "m.onnx", quantize="int4")
    assert not list(tmp_path.iterdir())
    with pytest.raises(FileNotFoundError):
        OnnxModel(tmp_path / "m.onnx")
