"""Dynamic int8 on the dense / compact export (dualdrop.nn.quantize)."""

import warnings

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import export_sparse, sparsify
from dualdrop.nn.quantize import Int8DynamicLinear, int8_report, quantize_dynamic_int8

torch.set_num_threads(1)


def pruned_mlp(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(30, 20), nn.ReLU(), nn.Linear(20, 6))
    with torch.no_grad():
        m[0].weight.mul_((torch.rand_like(m[0].weight) < 0.3).float())
        m[0].weight[[2, 7]] = 0          # dead units
        m[2].weight[:, 5] = 0
        m[0].weight[0, 0] = 1e-4         # far below its row's step: rounds to zero
        m[0].weight[0, 1] = 3.0
    return m.eval()


def reference(x, W, b):
    """The int8 formula in float64, from its definition: symmetric per-row input scale t,
    per-unit weight scale s, y = t s (q_x . Q) + b."""
    x, W = x.double(), W.double()
    s = W.abs().amax(1) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    Q = torch.round(W / s[:, None])
    t = x.abs().amax(1, keepdim=True) / 127
    t = torch.where(t > 0, t, torch.ones_like(t))
    q = torch.round(x / t)
    return (q @ Q.t()) * t * s + b.double()


def test_int8_layer_is_the_formula_exactly_and_keeps_zeros():
    m = pruned_mlp()
    layer = Int8DynamicLinear.from_linear(m[0])
    x = torch.randn(11, 30)
    x[3] = 0                                   # an all-zero row
    with torch.no_grad():
        got = layer(x)
    torch.testing.assert_close(got.double(), reference(x, m[0].weight, m[0].bias),
                               rtol=1e-6, atol=1e-6)
    w = m[0].weight
    assert torch.all(layer.weight[w == 0] == 0)                 # pruned zeros stay zero
    assert torch.all(layer.weight[[2, 7]] == 0)                 # dead units stay dead
    assert layer.weight[0, 0] == 0 and layer.rounded_to_zero >= 1
    assert layer.weight.dtype == torch.int8 and layer.weight.abs().max() <= 127
    # close to the float layer: one quantization step of the row and of the unit
    with torch.no_grad():
        err = (got - m[0](x)).abs().max()
    assert err < 0.02 * (x.abs().max() * w.abs().sum(1).max())
    # batched (..., features) inputs
    with torch.no_grad():
        torch.testing.assert_close(layer(x.reshape(11, 1, 30)).reshape(11, 20), got)


def test_quantized_export_of_dense_and_compact():
    m = pruned_mlp()
    x = torch.randn(64, 30)
    q = export_sparse(m, "dense", quantize="dynamic-int8")
    assert [type(l).__name__ for l in q] == ["Int8DynamicLinear", "ReLU", "Int8DynamicLinear"]
    rep = int8_report(q)
    nnz = int(torch.count_nonzero(m[0].weight))
    assert rep["0"]["total"] == 600 and rep["0"]["nonzero"] == nnz - rep["0"]["rounded_to_zero"]
    with torch.no_grad():
        assert (q(x).argmax(1) == m(x).argmax(1)).float().mean() > 0.95
    sd = q.state_dict()
    assert sd["0.weight"].dtype == torch.int8 and set(sd) == {
        "0.weight", "0.weight_scale", "0.bias", "2.weight", "2.weight_scale", "2.bias"}
    pytest.importorskip("torch_pruning")
    small = export_sparse(m, "compact", example_inputs=x, quantize="dynamic-int8")
    assert small[0].out_features == 17 and isinstance(small[0], Int8DynamicLinear)  # 2, 5, 7 go
    with torch.no_grad():  # not q(x) exactly: the second layer's rows lose the removed units
        assert (small(x) - m(x)).abs().max() <= 2 * (q(x) - m(x)).abs().max() + 1e-3


def test_sparsified_model_quantizes_through_the_export_and_layers_left_float_are_named():
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 3))
    sp = sparsify(cnn, "magnitude", sparsity=0.5, prune_every=1, end=0.5)
    opt = torch.optim.SGD(cnn.parameters(), lr=0.1)
    for s in range(1, 5):
        loss = cnn(torch.randn(4, 1, 8, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, s, 4)
    cnn.eval()
    with pytest.raises(ValueError, match="still sparsified"):
        quantize_dynamic_int8(cnn)
    with pytest.warns(UserWarning, match="left in float: 0"):
        q = export_sparse(cnn, "dense", quantize="dynamic-int8")
    assert isinstance(q[3], Int8DynamicLinear) and isinstance(q[0], nn.Conv2d)
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        ref = export_sparse(cnn, "dense")(x)
        assert (q(x) - ref).abs().max() < 0.05 * (1 + ref.abs().max())


def test_transformer_encoder_int8_takes_the_plain_path():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    net = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=True),
                        nn.Linear(16, 4)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = export_sparse(net, "dense", quantize="dynamic-int8")
    assert type(q[0].layers[0].linear1) is Int8DynamicLinear
    x = torch.randn(3, 5, 16)
    with torch.no_grad():  # the no-grad fused path would read a float linear1.weight
        assert (q(x) - net(x)).abs().max() < 0.05


@pytest.mark.parametrize("kw, err, match", [
    ({"layout": "csr", "quantize": "dynamic-int8"}, ValueError, "dense or compact export"),
    ({"layout": "auto", "quantize": "dynamic-int8"}, ValueError, "dense or compact export"),
    ({"layout": "dense", "quantize": "int4"}, ValueError, "quantize must be None or one of"),
])
def test_bad_quantize_is_refused(kw, err, match):
    with pytest.raises(err, match=match):
        export_sparse(pruned_mlp(), **kw)


def test_int8_layer_checks_its_input():
    layer = Int8DynamicLinear.from_linear(nn.Linear(4, 2))
    with pytest.raises(ValueError, match="expected inputs with 4 features"):
        layer(torch.randn(3, 5))
    with pytest.raises(TypeError, match="2-D int8 weight"):
        Int8DynamicLinear(torch.zeros(2, 4), torch.ones(2), None)


def test_hugging_face_conv1d_is_quantized_with_its_weight_transposed():
    Conv1D = pytest.importorskip("transformers.pytorch_utils").Conv1D
    torch.manual_seed(0)
    net = nn.Sequential(Conv1D(8, 12), nn.ReLU(), nn.Linear(8, 3)).eval()   # Conv1D(out, in)
    with torch.no_grad():
        net[0].weight[:, 2] = 0                        # (in, out): output unit 2 dead
    q = quantize_dynamic_int8(net)
    assert isinstance(q[0], Int8DynamicLinear) and q[0].weight.shape == (8, 12)
    assert torch.all(q[0].weight[2] == 0)
    x = torch.randn(5, 12)
    with torch.no_grad():
        torch.testing.assert_close(q[0](x).double(), reference(x, net[0].weight.t(), net[0].bias),
                                   rtol=1e-6, atol=1e-6)
        assert (q(x) - net(x)).abs().max() < 0.05
