"""compact(model, example_inputs, groups=...): the unit groups a structured one-shot prune found,
handed to the compact export instead of found again from a traced dependency graph; the same
network as without them."""

import copy
import sys

import pytest
import torch

pytest.importorskip("torch_pruning")
pytest.importorskip("transformers")

from dualdrop.nn import compact, compact_report  # noqa: E402
from dualdrop.nn.oneshot import prune_structured  # noqa: E402
from dualdrop.nn.oneshot.calibration import default_forward  # noqa: E402
from dualdrop.nn.oneshot.units import find_units  # noqa: E402
from test_compact import mlp  # noqa: E402
from test_structured_api import MHANet, bert_calib, small_cnn, tiny_bert  # noqa: E402

torch.set_num_threads(1)


def assert_identical(a, b):
    """The same module tree (sizes in the repr) and the same tensors, bit for bit."""
    assert repr(a) == repr(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]), k


def _pruned(model, calib, granularity):
    return prune_structured(model, calib, "osscar", granularity=granularity,
                            target_density=0.5, allocation="uniform", progress=False)


def _calib(shape, n=3):
    return [torch.randn(*shape, generator=torch.Generator().manual_seed(i)) for i in range(n)]


@pytest.mark.parametrize("case", ["cnn", "mlp", "mha"])
def test_handed_groups_give_the_model_the_graph_gives(case, monkeypatch):
    model, calib, gran = {
        "cnn": (small_cnn(), _calib((8, 3, 16, 16)), "channel"),
        "mlp": (mlp(), _calib((16, 6)), "neuron"),
        "mha": (MHANet().eval(), _calib((4, 6, 16)), ("head", "neuron")),
    }[case]
    res = _pruned(model, calib, gran)
    x = calib[0][:2]
    without = compact(model, x)
    removed = sum(t - k for k, t in compact_report(model, without).values())
    assert removed > 0   # the prune left units to remove
    assert_identical(compact(model, x, groups=res.groups), without)
    assert_identical(res.compact(), without)   # the result hands its groups over
    # handed groups need no dependency graph: torch-pruning is not even imported
    monkeypatch.setitem(sys.modules, "torch_pruning", None)
    assert_identical(compact(model, x, groups=res.groups), without)
    with pytest.raises(ImportError, match="dualdrop\\[structured\\]"):
        compact(model, x)


def test_tiny_bert_groups_compact_the_blocks_they_name():
    model, calib = tiny_bert(), bert_calib()
    res = _pruned(model, calib, ("head", "neuron"))
    x = calib[0]
    without = compact(model, x)
    assert_identical(compact(model, x, groups=res.groups), without)
    assert_identical(res.compact(), without)
    # only the heads handed over: the FFNs keep their width, the heads go as without
    small = compact(model, x, groups=[g for g in res.groups if g.kind == "head"])
    rows, full = compact_report(model, small), compact_report(model, without)
    width = model.config.intermediate_size
    for i in range(2):
        att, ffn = f"encoder.layer.{i}.attention.self", f"encoder.layer.{i}.intermediate.dense"
        assert rows[att] == full[att] and rows[att][0] < 4
        assert rows[ffn] == (width, width) and full[ffn][0] < width


def test_dead_producer_still_read_folds_its_constant_like_the_graph():
    """Producer rows zero but consumer columns not (what training's neuron pruning leaves): the
    unit's constant relu(b) moves into the consumer's bias, as the graph-based export does."""
    m = mlp()
    with torch.no_grad():
        m[0].weight[[1, 3, 6]] = 0
        m[0].bias[[1, 3, 6]] = torch.tensor([0.7, -0.4, 1.3])
        m[2].weight[[0, 2]] = 0
        m[2].bias[[0, 2]] = torch.tensor([0.9, 0.2])
    x = torch.randn(7, 6)
    groups, _ = find_units(m, x, default_forward, "neuron")
    assert [g.name for g in groups] == ["2", "4"]
    without = compact(m, x)
    assert compact_report(m, without) == {"0": (5, 8), "2": (3, 5), "4": (3, 3)}
    assert_identical(compact(m, x, groups=groups), without)


def test_bad_groups_are_refused_naming_the_argument():
    m = mlp()
    x = torch.randn(4, 6)
    with pytest.raises(TypeError, match="groups must be the list of unit groups"):
        compact(m, x, groups="all")
    other, _ = find_units(mlp(), x, default_forward, "neuron")
    with pytest.raises(ValueError, match="groups: .* is not a module of model"):
        compact(m, x, groups=other)
    bert = tiny_bert()
    cnn_groups, _ = find_units(small_cnn(), torch.randn(2, 3, 16, 16), default_forward, "neuron")
    with pytest.raises(ValueError, match="groups: .* is not a module of model"):
        compact(bert, bert_calib(1)[0], groups=cnn_groups)


def test_a_classifier_reading_the_pooler_keeps_its_units_as_without_groups():
    """BertForSequenceClassification: the classifier reads the pooler's units, a group outside
    the blocks; its units stay, as the compaction by blocks leaves them without groups."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=48,
                                  max_position_embeddings=40, num_labels=3)
    model = transformers.BertForSequenceClassification(cfg).eval()
    res = _pruned(model, bert_calib(), "neuron")
    assert "classifier" in [g.name for g in res.groups]
    x = bert_calib()[0]
    assert_identical(res.compact(), compact(model, x))


@pytest.mark.parametrize("case", ["cnn", "mha"])
def test_producers_zeroed_alone_give_the_same_model(case):
    """What the measured speed-up compacts: the removed units' producer rows and BatchNorm
    entries zeroed (``UnitGroup.zero_parts``), their consumer columns left; with the groups
    the constants fold as the graph-based export folds them."""
    import copy
    model, x = {"cnn": (small_cnn(), torch.randn(2, 3, 16, 16)),
                "mha": (MHANet().eval(), torch.randn(2, 6, 16))}[case]
    groups, _ = find_units(model, x, default_forward, ("head", "neuron"))
    for g in groups:
        g.zero_parts(range(g.n_units // 2, g.n_units))
    without = compact(copy.deepcopy(model), x)
    assert sum(p.numel() for p in without.parameters()) < sum(
        p.numel() for p in model.parameters())
    assert_identical(compact(model, x, groups=groups), without)
