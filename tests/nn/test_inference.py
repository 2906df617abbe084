"""The latency report (dualdrop.nn.latency): checked layouts, counted costs, written files."""

import json

import pytest
import torch
import torch.nn as nn

from dualdrop.nn import export_sparse
from dualdrop.nn import inference as latency_mod
from dualdrop.nn.inference import LatencyReport, batch_of, count_flops, latency

pytest.importorskip("torch_pruning")
torch.set_num_threads(1)

FAST = dict(rounds=2, warmup=1, min_time=1e-4, progress=False)


def neuron_pruned_mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        m[0].weight[[1, 4, 9, 10]] = 0
        m[2].weight[[0, 5]] = 0
        m[2].weight.mul_((torch.rand_like(m[2].weight) < 0.5).float())
    return m.eval()


def test_rows_costs_and_flops_of_every_torch_layout(tmp_path):
    m = neuron_pruned_mlp()
    x = torch.randn(6, 12)
    X, y = torch.randn(50, 12), torch.randint(0, 3, (50,))
    rep = latency(m, x, layouts=("csr", "auto", "compact", "dense-int8", "compact-int8"),
                  batch_sizes=(1, 5), threads=1, eval_data=(X, y), **FAST)
    assert [(r["layout"], r["batch"]) for r in rep.rows] == [
        (lay, b) for b in (1, 5)
        for lay in ("dense", "csr", "auto", "compact", "dense-int8", "compact-int8")]
    nnz = sum(int(torch.count_nonzero(m[i].weight)) for i in (0, 2, 4))
    biases = 16 + 8 + 3
    shapes = [tuple(lay.weight.shape) for lay in export_sparse(m, "compact", example_inputs=x)
              if isinstance(lay, nn.Linear)]
    assert shapes[0][0] < 16 and shapes[1][0] < 8
    for b in (1, 5):
        dense, csr, small = rep.row("dense", b), rep.row("csr", b), rep.row("compact", b)
        # FLOPs from the shapes: 2 x multiply-adds of the three products
        assert dense["flops"] == 2 * b * (12 * 16 + 16 * 8 + 8 * 3)
        assert dense["flops_nonzero"] == 2 * b * nnz
        assert csr["flops"] == csr["flops_nonzero"] == 2 * b * nnz
        assert small["flops"] == 2 * b * sum(o * i for o, i in shapes)
        assert small["flop_ratio"] == pytest.approx(dense["flops"] / small["flops"])
        assert rep.row("compact-int8", b)["flops"] == small["flops"]
        assert dense["params"] == 12 * 16 + 16 * 8 + 8 * 3 + biases
        assert dense["nonzero"] == nnz + int(sum(torch.count_nonzero(m[i].bias)
                                                 for i in (0, 2, 4)))
        assert small["params"] == sum(o * i + o for o, i in shapes)
        assert dense["speedup"] == 1.0 and dense["max_abs_diff"] == 0.0
        for r in (csr, small, rep.row("auto", b)):
            assert r["max_abs_diff"] <= 1e-5 and r["error"] == dense["error"]
        assert 0 < rep.row("compact-int8", b)["max_abs_diff"] < 0.05
        assert all(r["median_s"] > 0 and r["q1_s"] <= r["median_s"] <= r["q3_s"]
                   for r in rep.rows)
    assert rep.row("compact", 1)["bytes"] < rep.row("dense", 1)["bytes"]
    assert rep.meta["threads"] == 1 and rep.meta["rounds"] == 2
    text = rep.table()
    assert "compact-int8" in text and "ideal" in text
    paths = rep.save(tmp_path / "out")
    blob = json.loads(paths["json"].read_text())
    assert len(blob["rows"]) == 12 and paths["figure"].stat().st_size > 0
    assert paths["csv"].read_text().splitlines()[0].startswith("layout,batch,median_s")


def test_an_auto_export_that_stays_dense_shares_the_dense_row(monkeypatch):
    m = neuron_pruned_mlp()
    rep = latency(m, torch.randn(4, 12), layouts=("auto",), batch_sizes=(1,), clock="cpu",
                  **FAST)
    assert rep.meta["clock"] == "cpu" and "cpu time" in rep.table()
    auto = rep.row("auto", 1)
    if "every layer dense" in auto["note"]:
        assert auto["median_s"] == rep.row("dense", 1)["median_s"]
    else:
        assert auto["note"].startswith("CSR: ")


def test_a_layout_with_other_outputs_is_refused_before_timing(monkeypatch):
    real = latency_mod.export_sparse

    def broken(model, layout="auto", **kw):
        out = real(model, layout, **kw)
        if layout == "csr":
            with torch.no_grad():
                out[0].bias.add_(1.0)
        return out

    monkeypatch.setattr(latency_mod, "export_sparse", broken)
    timed = []
    monkeypatch.setattr(latency_mod, "interleaved", lambda *a, **k: timed.append(1))
    with pytest.raises(RuntimeError, match="layout 'csr' computes other outputs"):
        latency(neuron_pruned_mlp(), torch.randn(4, 12), layouts=("csr",), batch_sizes=(2,),
                **FAST)
    assert not timed


def test_conv_and_attention_flops():
    conv = nn.Conv2d(3, 5, 3, padding=1)
    x = torch.randn(2, 3, 7, 7)
    assert count_flops(conv, x) == (2 * (2 * 5 * 7 * 7) * 3 * 9, pytest.approx(2 * 2 * 5 * 49 * 27))
    E, H, L, B = 8, 2, 5, 3
    mha = nn.MultiheadAttention(E, H, batch_first=True).eval()
    q = torch.randn(B, L, E)
    want = 2 * B * L * E * 3 * E + 2 * B * L * E * E + 2 * 2 * B * L * L * E
    for need in (True, False):
        class Wrap(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = mha

            def forward(self, x):
                return self.m(x, x, x, need_weights=need)[0]

        assert count_flops(Wrap(), q)[0] == want
    with torch.no_grad():
        mha.in_proj_weight[:E] = 0                           # q rows: a third of in_proj zero
    flops, nonzero = count_flops(Wrap(), q)             # one packed product, density 2/3
    assert flops == want and nonzero == pytest.approx(want - 2 * B * L * E * E)


def test_batch_of_cycles_rows_of_every_input():
    x = torch.arange(6.0).reshape(3, 2)
    assert batch_of(x, 5)[:, 0].tolist() == [0, 2, 4, 0, 2]
    t = batch_of((x, torch.ones(3)), 1)
    assert isinstance(t, tuple) and t[0].shape == (1, 2) and t[1].shape == (1,)
    assert batch_of({"a": x}, 4)["a"].shape == (4, 2)


@pytest.mark.parametrize("kw, err, match", [
    ({"layouts": ("sparse",)}, ValueError, "layouts must be distinct names"),
    ({"layouts": "csr"}, TypeError, "tuple/list of layout names"),
    ({"batch_sizes": (0,)}, ValueError, "batch_sizes must be >= 1"),
    ({"batch_sizes": (2, 2)}, ValueError, "distinct"),
    ({"threads": 0}, ValueError, "threads must be >= 1"),
    ({"rounds": 0}, ValueError, "rounds must be >= 1"),
    ({"min_time": 0}, ValueError, "min_time"),
    ({"eval_data": torch.randn(3, 12)}, TypeError, "eval_data must be"),
    ({"progress": "no"}, TypeError, "progress must be"),
    ({"clock": "gpu"}, ValueError, "clock must be one of"),
])
def test_bad_arguments_are_refused(kw, err, match):
    with pytest.raises(err, match=match):
        latency(neuron_pruned_mlp(), torch.randn(2, 12), **kw)
    with pytest.raises(TypeError, match="model must be"):
        latency("model", torch.randn(2, 12))


def test_onnxruntime_rows(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    m = neuron_pruned_mlp()
    rep = latency(m, torch.randn(6, 12), layouts=("compact", "onnxruntime",
                                                  "onnxruntime-compact-int8"),
                  batch_sizes=(3,), **FAST)
    ort = rep.row("onnxruntime", 3)
    assert ort["max_abs_diff"] <= 1e-5 and ort["flops"] == rep.row("dense", 3)["flops"]
    assert ort["note"] == "dynamo exporter" and ort["params"] >= rep.row("dense", 3)["params"]
    q = rep.row("onnxruntime-compact-int8", 3)
    assert q["flops"] == rep.row("compact", 3)["flops"] and 0 < q["max_abs_diff"] < 0.05
    assert q["bytes"] > 0 and q["nonzero"] <= q["params"]
    assert isinstance(rep, LatencyReport)
