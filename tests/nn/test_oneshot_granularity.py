"""prune_oneshot(granularity=...): the same pruning as prune_structured, and the arguments of
the other kind refused with the model left as given."""

import copy

import pytest
import torch

from dualdrop.nn import prune_oneshot
from dualdrop.nn.oneshot.registry import get_method
from dualdrop.nn.oneshot import StructuredResult, prune_structured

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch_pruning")

from test_structured_api import bert_calib, outputs, tiny_bert  # noqa: E402


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("kw", [
    dict(method="osscar", granularity=("head", "neuron"), target_density=0.5),
    dict(method="flap", granularity="neuron", target_params=15000, allocation="penalty",
         bias_compensation=False, refit=True),
])
def test_granularity_is_prune_structured(kw):
    kw = dict(kw)
    a, b = tiny_bert(), tiny_bert()
    res_a = prune_oneshot(a, bert_calib(), progress=False, **kw)
    refit = kw.pop("refit", None)
    method = kw.pop("method")
    res_b = prune_structured(b, bert_calib(), method, progress=False,
                             options={} if refit is None else {"refit": refit}, **kw)
    assert isinstance(res_a, StructuredResult)
    assert res_a.units == res_b.units
    assert _same_state(a, b)
    assert res_a.report.params_after == res_b.report.params_after
    assert res_a.report.params_after < res_a.report.params_before
    small = res_a.compact()
    x = bert_calib(1, seed=3)[0]
    assert torch.allclose(outputs(small, x), outputs(a, x), atol=1e-5, rtol=1e-4)


def test_default_method_of_units_is_osscar_and_weight_is_unchanged():
    a, b = tiny_bert(), tiny_bert()
    res = prune_oneshot(a, bert_calib(), granularity="neuron", target_density=0.5,
                        progress=False)
    assert "OSSCAR" in res.report.method or "osscar" in res.report.method.lower()
    assert res.units == prune_structured(b, bert_calib(), "osscar", granularity="neuron",
                                         target_density=0.5, progress=False).units
    # granularity="weight" is the single-weight path (its default method SparseGPT)
    a, b = tiny_bert(), tiny_bert()
    r1 = prune_oneshot(a, bert_calib(), granularity="weight", target_density=0.5,
                       progress=False)
    r2 = prune_oneshot(b, bert_calib(), "sparsegpt", target_density=0.5, progress=False)
    assert "SparseGPT" in r1.report.method and _same_state(a, b)
    assert abs(r2.report.density - 0.5) < 0.01


@pytest.mark.parametrize("kw, exc, match", [
    (dict(granularity="neuron", pattern="2:4"), ValueError, "pattern="),
    (dict(granularity="neuron", method="sparsegpt", target_density=0.5), ValueError,
     "method='sparsegpt' prunes single weights"),
    (dict(granularity="neuron", method="wanda", target_density=0.5), ValueError,
     "wanda-sp"),
    (dict(granularity="head", method=get_method("magnitude"), target_density=0.5),
     ValueError, "single weights"),
    (dict(granularity="neuron", target_density=0.5, checkpoint_dir="ck"), ValueError,
     "checkpoint_dir="),
    (dict(granularity="neuron", target_density=0.5, offload_dir="off"), ValueError,
     "offload_dir="),
    (dict(granularity="neuron", target_density=0.5, distributed=True), ValueError,
     "distributed=True"),
    (dict(granularity="neuron", target_density=0.5, allocation="owl"), ValueError,
     "allocation"),
    (dict(granularity="neuron", target_density=0.5, refit="yes"), TypeError, "refit"),
    (dict(granularity="neuron"), ValueError, "exactly one budget"),
    (dict(granularity="row", target_density=0.5), ValueError, "granularity"),
    (dict(granularity="neuron", target_speedup=0.5), ValueError, "target_speedup"),
    (dict(target_speedup=1.5), ValueError, "target_speedup= is for structured pruning"),
    (dict(target_density=0.5, target_params=1000), ValueError, "target_params= is for"),
    (dict(target_density=0.5, bias_compensation=True), ValueError, "bias_compensation="),
    (dict(pattern="2:4", latency_options={"rounds": 2}), ValueError, "latency_options="),
])
def test_refusals_name_the_argument_and_leave_the_model(kw, exc, match):
    model = tiny_bert()
    before = copy.deepcopy(model)
    with pytest.raises(exc, match=match):
        prune_oneshot(model, bert_calib(), progress=False, **kw)
    assert _same_state(model, before)


def test_structured_result_exports_to_onnx_and_times(tmp_path):
    """The compact model of a structured prune exports to ONNX with dynamic axes (outputs equal
    at another batch and length) and enters the latency report smaller than the dense model."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import warnings

    from dualdrop.nn import OnnxModel, export_onnx, latency

    model = tiny_bert()
    res = prune_oneshot(model, bert_calib(), granularity=("head", "neuron"),
                        target_density=0.5, progress=False)
    small = res.compact()
    x = {"input_ids": torch.randint(0, 60, (2, 10))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx(small, x, tmp_path / "small.onnx")
    g = torch.Generator().manual_seed(1)
    longer = {"input_ids": torch.randint(0, 60, (3, 16), generator=g)}
    got = OnnxModel(tmp_path / "small.onnx")(**longer)
    got = torch.as_tensor(got[0] if isinstance(got, (tuple, list)) else got)
    torch.testing.assert_close(got, outputs(model, longer), rtol=0, atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = latency(model, x, layouts=["dense", "compact"], batch_sizes=(2,), rounds=2,
                      progress=False)
    rows = {r["layout"]: r for r in rep.rows}
    assert rows["compact"]["params"] < rows["dense"]["params"]
