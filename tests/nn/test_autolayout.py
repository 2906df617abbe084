"""layout="auto": dense or CSR per layer by timing both at export (dualdrop.nn._autolayout)."""

import copy

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import CSRLinear, export_sparse
from dualdrop.nn import _autolayout

torch.set_num_threads(1)


def sparse_mlp(density=0.05, seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(40, 30), nn.ReLU(), nn.Linear(30, 20), nn.ReLU(),
                      nn.Linear(20, 5))
    with torch.no_grad():
        for layer in m:
            if isinstance(layer, nn.Linear):
                layer.weight.mul_((torch.rand_like(layer.weight) < density).float())
    return m.eval()


def fake_timer(monkeypatch, seconds):
    """``_fastest`` returns ``seconds[layer index]`` = (dense, csr) in call order, then the
    whole-network timings (a dict) if given."""
    calls = iter(seconds)

    def fastest(fns):
        t = next(calls)
        if isinstance(t, dict):
            return {k: t[k] for k in fns}
        for f in fns.values():  # the candidates still run
            f()
        return {"dense": t[0], "csr": t[1]}

    monkeypatch.setattr(_autolayout, "_fastest", fastest)


def kinds(net):
    return [type(m).__name__ for m in net if not isinstance(m, nn.ReLU)]


def test_each_layer_takes_the_faster_layout_beyond_the_margin(monkeypatch):
    m = sparse_mlp()
    # layer 0: CSR 50% faster; layer 2: CSR 5% faster (inside the 10% margin); layer 4: slower
    fake_timer(monkeypatch, [(1.0, 0.5), (1.0, 0.95), (1.0, 2.0)])
    out = export_sparse(m, "auto", auto_batch_size=64)
    assert kinds(out) == ["CSRLinear", "Linear", "Linear"]
    rec = out.dualdrop_auto_layout
    assert [rec[k]["layout"] for k in ("0", "2", "4")] == ["csr", "dense", "dense"]
    assert rec["0"]["dense_s"] == 1.0 and rec["0"]["csr_s"] == 0.5
    x = torch.randn(9, 40)
    with torch.no_grad():
        torch.testing.assert_close(out(x), m(x), rtol=1e-5, atol=1e-6)


def test_dense_layers_are_not_timed(monkeypatch):
    m = sparse_mlp()
    with torch.no_grad():
        m[2].weight.fill_(1.0)  # density 1 > csr_max_density
    fake_timer(monkeypatch, [(1.0, 0.5), (1.0, 0.5)])  # only layers 0 and 4 ask
    out = export_sparse(m, "auto")
    assert kinds(out) == ["CSRLinear", "Linear", "CSRLinear"]
    assert out.dualdrop_auto_layout["2"] == {"layout": "dense", "density": 1.0,
                                             "dense_s": None, "csr_s": None}


def test_random_inputs_have_the_rows_asked_and_feature_major_after_a_csr_layer(monkeypatch):
    seen = []

    def spy(fns):  # the candidates close over their input x
        x = [c.cell_contents for c in fns["dense"].__closure__
             if isinstance(c.cell_contents, torch.Tensor)][0]
        seen.append((tuple(x.shape), x.is_contiguous()))
        return {"dense": 1.0, "csr": 0.1}

    monkeypatch.setattr(_autolayout, "_fastest", spy)
    export_sparse(sparse_mlp(), "auto", auto_batch_size=17)
    # the first layer gets batch-major rows, the next ones the transposed view CSR hands on
    assert seen == [((17, 40), True), ((17, 30), False), ((17, 20), False)]


def test_example_inputs_time_the_whole_network_and_keep_dense_unless_faster(monkeypatch):
    m = sparse_mlp()
    x = torch.randn(8, 40)
    # every layer faster as CSR alone, but the whole CSR network is not faster than dense
    fake_timer(monkeypatch, [(1.0, 0.1)] * 3 + [{"dense": 1.0, "per layer": 0.95}])
    out = export_sparse(m, "auto", example_inputs=x)
    assert kinds(out) == ["Linear"] * 3
    assert all(r["layout"] == "dense" for r in out.dualdrop_auto_layout.values())
    # two layers alone; all three together are the fastest
    fake_timer(monkeypatch, [(1.0, 0.1), (1.0, 1.0), (1.0, 0.1)]
               + [{"dense": 1.0, "per layer": 0.7, "all CSR": 0.5}])
    out = export_sparse(m, "auto", example_inputs=x)
    assert kinds(out) == ["CSRLinear"] * 3
    with torch.no_grad():
        torch.testing.assert_close(out(x), m(x), rtol=1e-5, atol=1e-6)


def test_auto_on_real_timings_matches_outputs_and_leaves_model_alone():
    m = sparse_mlp(0.02)
    before = copy.deepcopy(m.state_dict())
    x = torch.randn(64, 40)
    for kw in ({}, {"auto_batch_size": 128}, {"example_inputs": x}):
        out = export_sparse(m, "auto", **kw)
        assert set(out.dualdrop_auto_layout) == {"0", "2", "4"}
        with torch.no_grad():
            torch.testing.assert_close(out(x), m(x), rtol=1e-5, atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    single = export_sparse(m[0], "auto", auto_batch_size=4)  # the model is one layer
    assert isinstance(single, (nn.Linear, CSRLinear))


@pytest.mark.parametrize("kw, match", [
    ({"layout": "dense", "auto_batch_size": 4}, "only used by layout='auto'"),
    ({"layout": "auto", "auto_batch_size": 0}, "auto_batch_size must be >= 1"),
    ({"layout": "auto", "auto_batch_size": 4, "example_inputs": torch.randn(2, 40)}, "not both"),
    ({"layout": "csr", "example_inputs": torch.randn(2, 40)}, "only used by layout"),
    ({"layout": "auto", "example_inputs": torch.randn(2, 7)}, "model\\(example_inputs\\) failed"),
])
def test_bad_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        export_sparse(sparse_mlp(), **kw)


def test_auto_batch_size_must_be_an_integer():
    with pytest.raises(TypeError, match="auto_batch_size must be an integer"):
        export_sparse(sparse_mlp(), "auto", auto_batch_size=2.5)
