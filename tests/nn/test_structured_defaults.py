"""The structured allocation's defaults (the best measured setting of benchmarks/RESULTS.md,
"Structured one-shot") and the warning for a budget spent on one kind of unit."""

import inspect

import pytest
import torch

from dualdrop.nn.oneshot import prune_structured, structured
from dualdrop.nn.oneshot.allocation.units import EMPTIED, lopsided

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch_pruning")


def test_lopsided_names_the_starved_layers():
    sizes = {"h0": 12, "h1": 12, "f0": 1536, "f1": 1536}
    kinds = {"h0": "head", "h1": "head", "f0": "neuron", "f1": "neuron"}
    note = lopsided({"h0": 12, "h1": 12, "f0": 48, "f1": 900}, sizes, kinds)
    assert note is not None and "every head" in note and "f0 keeps 48/1536" in note
    assert "f1" not in note
    # one head pruned somewhere, or no layer below the floor: no warning
    assert lopsided({"h0": 11, "h1": 12, "f0": 48, "f1": 900}, sizes, kinds) is None
    assert lopsided({"h0": 12, "h1": 12, "f0": int(EMPTIED * 1536) + 1, "f1": 900}, sizes,
                    kinds) is None
    # the MiniLM case of the tables: every head kept, 167 of 1,536 neurons left
    assert lopsided({"h0": 12, "h1": 12, "f0": 167, "f1": 900}, sizes, kinds) is not None
    # every neuron kept while a head layer keeps 1 of 12: the same warning the other way
    note = lopsided({"h0": 1, "h1": 12, "f0": 1536, "f1": 1536}, sizes, kinds)
    assert note is not None and "every neuron" in note and "h0 keeps 1/12" in note


def test_prune_structured_warns_on_a_lopsided_allocation(monkeypatch):
    """The allocation's counts reach the warning: every head kept, one FFN left one neuron."""
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=48,
                                  max_position_embeddings=40)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    calib = [{"input_ids": torch.randint(0, 60, (4, 8))} for _ in range(2)]
    real = structured.allocate_units

    def skewed(kind, cost, budget, *a, **k):
        counts = real(kind, cost, budget, *a, **k)
        return {n: (cost.sizes[n] if cost.sizes[n] == 4 else 1) for n in counts}

    monkeypatch.setattr(structured, "allocate_units", skewed)
    with pytest.warns(UserWarning, match="kept every head"):
        prune_structured(model, calib, "ziplm", granularity=("head", "neuron"),
                                    target_density=0.5, progress=False)


def test_the_default_allocation_is_the_best_measured():
    """``allocation="penalty"`` with ``normalize="none"`` (RESULTS "Structured one-shot": on
    all-MiniLM-L6-v2 at 1.5x, cosine on held-apart text 0.936 against 0.905 for uniform and
    0.909 for ``normalize="energy"``) is what a call without an allocation gets, through
    ``prune_structured``, ``prune_oneshot`` and the CLI; single weights keep ``"uniform"``."""
    from dualdrop.nn.oneshot import prune_oneshot
    from dualdrop.nn.oneshot.allocation.units import (ALLOCATION_DEFAULTS, DEFAULT_ALLOCATION,
                                                     check_allocation)

    assert DEFAULT_ALLOCATION == "penalty"
    assert ALLOCATION_DEFAULTS["penalty"]["normalize"] == "none"
    assert check_allocation("penalty", None)["normalize"] == "none"
    assert inspect.signature(prune_structured).parameters["allocation"].default \
        is None
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=48,
                                  max_position_embeddings=40)
    calib = [{"input_ids": torch.randint(0, 60, (4, 8))} for _ in range(2)]
    torch.manual_seed(0)
    res = prune_structured(transformers.BertModel(cfg).eval(), calib, "ziplm",
                                      granularity="neuron", target_density=0.5, progress=False)
    assert res.report.allocation == "penalty"
    res = prune_oneshot(transformers.BertModel(cfg).eval(), calib, "ziplm",
                        granularity="neuron", target_density=0.5, progress=False)
    assert res.report.allocation == "penalty"
    res = prune_oneshot(transformers.BertModel(cfg).eval(), calib, "magnitude",
                        target_density=0.5, progress=False)
    assert res.report.allocation == "uniform"
