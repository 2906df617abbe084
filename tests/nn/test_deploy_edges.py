"""Deployment edges: int8 refuses non-finite weights, the auto layout's density cutoff to one
weight, the latency report's default layouts."""

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import _autolayout, export_sparse, quantize_dynamic_int8
from dualdrop.nn.inference import LAYOUTS, _check_layouts
from dualdrop.nn.quantize import Int8DynamicLinear

torch.set_num_threads(1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_int8_refuses_non_finite_weights(bad):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 2)).eval()
    with torch.no_grad():
        model[2].weight[1, 3] = bad
        ref = model(torch.randn(3, 8))
    assert not torch.isfinite(ref).all()                 # float shows the broken layer
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"non-finite weights .* 2: weight has 1 non-finite"):
        quantize_dynamic_int8(model)                      # it returned finite outputs
    with pytest.raises(ValueError, match="non-finite"):
        export_sparse(model, "dense", quantize="dynamic-int8")
    with pytest.raises(ValueError, match="non-finite"):
        Int8DynamicLinear.from_linear(model[2])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]) or (torch.isnan(v) == torch.isnan(before[k])).all()


def test_int8_onnx_refuses_non_finite_weights(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from dualdrop.nn.onnx import export_onnx

    model = nn.Sequential(nn.Linear(8, 4)).eval()
    with torch.no_grad():
        model[0].bias[0] = float("nan")
    with pytest.raises(ValueError, match="0: bias has 1 non-finite"):
        export_onnx(model, torch.randn(2, 8), tmp_path / "q.onnx", quantize="dynamic-int8")
    assert not list(tmp_path.iterdir())


def test_a_layer_pruned_to_the_cutoff_is_a_csr_candidate(monkeypatch):
    """384 x 384 kept at round(0.3 n) = 44,237 weights (density 0.3000014): timed, not
    skipped as above csr_max_density=0.3 (0.3 n = 44,236.8); 44,238, more than one weight
    above, is skipped."""
    timed = []

    def fastest(fns):
        timed.append(len(timed))
        return {"dense": 1.0, "csr": 0.5}

    monkeypatch.setattr(_autolayout, "_fastest", fastest)
    n = 384 * 384
    for extra, expect in ((0, "csr"), (1, "dense")):
        torch.manual_seed(0)
        layer = nn.Linear(384, 384)
        keep = round(0.3 * n) + extra
        mask = torch.zeros(n)
        mask[torch.randperm(n)[:keep]] = 1
        with torch.no_grad():
            layer.weight.mul_(mask.reshape(384, 384))
        net = nn.Sequential(layer).eval()
        out = export_sparse(net, "auto", csr_max_density=0.3, auto_batch_size=8)
        rec = out.dualdrop_auto_layout["0"]
        assert rec["layout"] == expect, (extra, rec)
        assert (rec["dense_s"] is None) == (expect == "dense")
    assert _autolayout.above(torch.ones(10), 0.8) and not _autolayout.above(torch.ones(10), 0.9)


def test_the_default_latency_layouts_are_every_installed_one(monkeypatch):
    from dualdrop.nn import inference

    chosen, notes = _check_layouts(None)
    assert "dense-int8" in chosen and "compact-int8" in chosen
    monkeypatch.setattr(inference, "onnxruntime_available", lambda: False)
    monkeypatch.setattr(inference, "_torch_pruning_available", lambda: False)
    chosen, notes = _check_layouts(None)
    assert chosen == ["dense", "csr", "auto", "dense-int8"]
    assert len(notes) == 2 and all("left out" in n for n in notes)
    assert set(LAYOUTS) >= set(chosen)
