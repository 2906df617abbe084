"""The one-shot front door: one Job from the library and the CLI, one run, one report, and the bad
inputs refused before the model is touched."""

import os
import sys
import warnings

import pytest
import torch
from torch import nn

from dualdrop.cli import build_parser
from dualdrop.cli.prune_cmd import _check_args
from dualdrop.nn import latency
from dualdrop.nn.oneshot import (Job, OneShotReport, Report, StructuredReport, make_job,
                                 prune_oneshot, prune_structured)
from dualdrop.nn.oneshot import run as run_module


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _captured(monkeypatch):
    jobs = []

    def capture(job, model, calib):
        jobs.append(job)
        raise KeyboardInterrupt   # stop before any work

    monkeypatch.setattr(run_module, "run", capture)
    return jobs


def _cli_job(tmp_path, argv):
    args = build_parser().parse_args(["prune", "--from", str(tmp_path / "run"), "--out",
                                      str(tmp_path / "out"), *argv])
    return _check_args(args)["job"]


def test_the_cli_and_prune_oneshot_build_one_job(monkeypatch, tmp_path):
    jobs = _captured(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        prune_oneshot(_mlp(), torch.randn(16, 8), "wanda", target_density=0.3,
                      allocation="owl", allocation_options={"owl_lambda": 0.05},
                      options={"refit": True}, exclude=["2"])
    cli = _cli_job(tmp_path, ["--method", "wanda", "--density", "0.3", "--allocation", "owl",
                              "--allocation-hp", "owl_lambda=0.05", "--refit",
                              "--exclude", "2"])
    assert isinstance(cli, Job) and cli == jobs[0]
    assert cli.allocation_options == {"owl_m": 5.0, "owl_lambda": 0.05}   # defaults filled in
    # a different setting is a different job
    assert cli != make_job("wanda", 0.3, allocation="owl", options={"refit": True},
                           exclude=["2"])


def test_the_cli_and_prune_oneshot_build_one_units_job(monkeypatch, tmp_path):
    jobs = _captured(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        prune_oneshot(_mlp(), torch.randn(16, 8), "osscar", granularity="neuron",
                      target_speedup=1.5, allocation="penalty")
    cli = _cli_job(tmp_path, ["--granularity", "neuron", "--target-speedup", "1.5",
                              "--allocation", "penalty"])
    assert cli.what == "units" and cli == jobs[0]
    with pytest.raises(KeyboardInterrupt):   # prune_structured: the same job
        prune_structured(_mlp(), torch.randn(16, 8), "osscar", granularity="neuron",
                         target_speedup=1.5, allocation="penalty")
    assert jobs[1] == jobs[0]


def test_structured_and_oneshot_neuron_keep_the_same_fraction_of_prunable_weights():
    x = torch.randn(64, 8)
    a = prune_structured(_mlp(), x, "magnitude", granularity="neuron", target_density=0.5,
                         progress=False)
    b = prune_oneshot(_mlp(), x, "magnitude", granularity="neuron", target_density=0.5,
                      progress=False)
    # the prunable weights of the one unit group: the 16 rows (and biases) of the first layer
    # and the 16 columns of the second; every unit costs the same, so the fraction kept is the
    # fraction of hidden units kept
    kept = int((a.model[0].weight.abs().sum(1) > 0).sum())
    assert a.report.density == pytest.approx(kept / 16)
    assert b.report.density == pytest.approx(a.report.density)
    assert abs(a.report.density - 0.5) <= 1 / 16
    assert a.units == b.units
    assert type(a.report) is type(b.report) is Report
    assert OneShotReport is StructuredReport is Report


def test_units_and_weights_turn_a_density_into_counts_by_one_rule():
    # a hidden unit of _mlp owns 13 prunable weights (its row of 8 and bias, its column of 4):
    # P = 208. d P = 103.5 rounds to 104 = 8 units, the count single weights would keep; a
    # ceiling at d P itself (the rule before) keeps 7 units (91 weights)
    from dualdrop.nn.oneshot.allocation.weights import kept_total

    d = 103.5 / 208
    x = torch.randn(64, 8)
    res = prune_structured(_mlp(), x, "magnitude", granularity="neuron", target_density=d,
                           allocation="uniform", progress=False)
    assert res.report.prunable == 208
    assert kept_total(d, 208) == 104
    assert [len(u) for u in res.units.values()] == [8]
    assert res.report.density == pytest.approx(104 / 208)
    w = prune_oneshot(_mlp(), x, "magnitude", target_density=d, progress=False)
    total = 8 * 16 + 16 * 4
    assert sum(int((m.weight != 0).sum()) for m in w.model if isinstance(m, nn.Linear)) \
        == kept_total(d, total)


def test_one_report_type_for_weights_and_units():
    x = torch.randn(64, 8)
    w = prune_oneshot(_mlp(), x, "magnitude", target_density=0.5, progress=False).report
    u = prune_oneshot(_mlp(), x, "magnitude", granularity="neuron", target_density=0.5,
                      progress=False).report
    assert (w.what, u.what) == ("weights", "units")
    assert w.to_dict()["density"] == pytest.approx(0.5)
    assert u.to_dict()["what"] == "units" and "neuron" in u.format()


def test_structured_refuses_non_finite_calibration_and_restores_on_cpu():
    net = _mlp()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(64, 8)
    x[3, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite values .batch 0"):
        prune_structured(net, x, "magnitude", granularity="neuron", target_density=0.5,
                         progress=False)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


BAD = [
    ("wrong width", lambda: torch.randn(32, 5), ValueError, "reads 8 features"),
    ("empty batch", lambda: [torch.randn(0, 8)], ValueError, "empty batch"),
    ("integer dtype", lambda: torch.randint(0, 3, (32, 8)), ValueError, "int64 but the model"),
    ("dict for a Sequential", lambda: [{"x": torch.randn(32, 8)}], ValueError,
     "the batch is a dict"),
    ("(inputs, targets) tuple", lambda: (torch.randn(32, 8), torch.randint(0, 4, (32,))),
     TypeError, "read as 2 batches"),
]


@pytest.mark.parametrize("granularity", [None, "neuron"])
@pytest.mark.parametrize("case,calib,exc,match", BAD, ids=[b[0] for b in BAD])
def test_bad_calibration_is_named_and_leaves_the_model(case, calib, exc, match, granularity):
    net = _mlp()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(exc, match=match):
        prune_oneshot(net, calib(), "magnitude", target_density=0.5, granularity=granularity,
                      progress=False)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_a_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        net = _mlp()
    with pytest.raises(ValueError, match="meta device"):
        prune_oneshot(net, torch.randn(32, 8), "magnitude", target_density=0.5, progress=False)


def test_a_density_that_keeps_no_weight_is_said_from_memory_and_from_disk(tmp_path):
    transformers = pytest.importorskip("transformers")
    from dualdrop.nn import prune_oneshot_from_disk

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=16, intermediate_size=32,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   vocab_size=50)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "src")
    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(0, 50, (2, 8), generator=g)}]
    with pytest.warns(UserWarning, match="no weight at all"):
        prune_oneshot(model, calib, "magnitude", target_density=1e-9, progress=False)
    # from disk: the same density-to-count rule (one rounded total split over the layers, a
    # layer rounded to nothing raised to one weight per row, said); silent before
    with pytest.warns(UserWarning, match="no weight at all"):
        report = prune_oneshot_from_disk(tmp_path / "src", calib, "magnitude", tmp_path / "out",
                                         target_density=1e-9, progress=False)
    assert all(r["kept"] == r["shape"][0] for r in report.layers)


@pytest.mark.parametrize("make,why", [
    (lambda: nn.Sequential(nn.Conv2d(4, 4, 3, groups=4)), "grouped convolution"),
    (lambda: _tied(), "tied weights"),
])
def test_nothing_to_prune_names_the_skipped_layers(make, why):
    net = make()
    x = torch.randn(2, 4, 6, 6) if isinstance(net[0], nn.Conv2d) else torch.randn(8, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=f"nothing to prune.*skipped: .*{why}"):
            prune_oneshot(net, x, "magnitude", target_density=0.5, progress=False)


def _tied():
    net = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
    net[1].weight = net[0].weight
    return net


@pytest.mark.parametrize("inputs,match", [
    (torch.randn(4, 5), "reads 8 features"),
    (torch.randn(0, 8), "empty batch"),
    (torch.randint(0, 3, (4, 8)), "int64 but the model"),
    ({"x": torch.randn(4, 8)}, "the batch is a dict"),
])
def test_latency_names_bad_inputs(inputs, match):
    with pytest.raises(ValueError, match=match):
        latency(_mlp(), inputs, layouts=["dense"], batch_sizes=(1,), rounds=1, warmup=0,
                progress=False)


def test_the_cli_names_the_allocation_option_flag(tmp_path):
    with pytest.raises(ValueError, match="--allocation-hp 'owl_m': expected NAME=VALUE"):
        _cli_job(tmp_path, ["--density", "0.5", "--allocation", "owl",
                            "--allocation-hp", "owl_m"])
    with pytest.raises(ValueError, match="unknown option.*for allocation='owl'"):
        _cli_job(tmp_path, ["--density", "0.5", "--allocation", "owl",
                            "--allocation-hp", "m=3"])


@pytest.mark.parametrize("threads,exc", [("a", TypeError), (0, ValueError), (1.5, TypeError)])
def test_onnx_model_names_a_bad_threads(threads, exc, tmp_path):
    from dualdrop.nn.onnx import OnnxModel

    with pytest.raises(exc, match="threads must be"):   # before the file is read
        OnnxModel(tmp_path / "model.onnx", threads=threads)


def test_save_compact_to_an_unwritable_folder_is_named():
    from dualdrop.nn import save_compact

    if not (sys.platform.startswith("linux") and os.path.isdir("/sys")):
        pytest.skip("needs a folder where no file can be made (Linux's /sys)")
    with pytest.raises(PermissionError, match="'/sys' cannot be written"):
        save_compact(_mlp(), "/sys/model.pt")


def test_linear_density_refuses_a_nan_weight():
    from dualdrop.nn import linear_density

    net = _mlp()
    assert linear_density(net) == 1.0
    with torch.no_grad():
        net[2].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"\['2'\] hold NaN"):
        linear_density(net)
