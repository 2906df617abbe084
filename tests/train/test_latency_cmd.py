"""``dualdrop latency``: a run folder or a saved model file, table and files written."""

from __future__ import annotations

import json
import re

import pytest
import torch

from dualdrop.cli import main

pytest.importorskip("torch_pruning")
FAST = ["--batch-sizes", "1", "4", "--rounds", "2", "--no-progress"]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "neuron"
    assert main(["sparsify", "--method", "magnitude", "--granularity", "neuron",
                 "--target-density", "0.2", "--epochs", "1", "--out", str(run),
                 "--no-progress", "--threads", "1"]) == 0
    return run


def test_a_run_folder_is_timed_on_its_test_split(digits_run, capsys, tmp_path):
    out = tmp_path / "lat"
    assert main(["latency", str(digits_run), "--layouts", "dense", "csr", "auto", "compact",
                 "--out", str(out), *FAST]) == 0
    text = capsys.readouterr().out
    assert "compact" in text and "error" in text and "interleaved rounds" in text
    blob = json.loads((out / "latency.json").read_text())
    rows = {(r["layout"], r["batch"]): r for r in blob["rows"]}
    assert set(rows) == {(lay, b) for lay in ("dense", "csr", "auto", "compact") for b in (1, 4)}
    final = json.loads((digits_run / "final.json").read_text())
    assert rows["dense", 1]["error"] == pytest.approx(final["test_error"])   # the test split
    assert rows["compact", 4]["params"] < rows["dense", 4]["params"]
    assert (out / "latency.csv").is_file() and (out / "latency.png").is_file()


def test_a_saved_model_file_with_its_class(digits_run, tmp_path, capsys):
    from dualdrop.nn import compact, save_compact
    from dualdrop.train import load_run

    net = load_run(digits_run)
    torch.save(net.state_dict(), tmp_path / "plain.pt")
    save_compact(compact(net, torch.randn(4, 64)), tmp_path / "small.pt")
    for name in ("plain.pt", "small.pt"):
        assert main(["latency", str(tmp_path / name), "--model-class",
                     "dualdrop.train.models:LeNet300100", "--model-args",
                     '{"n_features": 64}', "--input-shape", "64", "--layouts", "dense", "csr",
                     *FAST]) == 0
        assert (tmp_path / (name[:-3] + "_latency") / "latency.json").is_file()
    capsys.readouterr()


def _refused(capsys, argv, match):
    """The CLI's error boundary: one line on stderr naming the problem, exit status 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("dualdrop latency: error:"), err
    assert re.search(match, err), err


@pytest.mark.parametrize("extra, match", [
    (["--model-class", "x:Y"], "for a saved model file"),
    (["--rounds", "0"], "rounds must be >= 1"),
])
def test_bad_options_on_a_run_folder(digits_run, extra, match, capsys):
    _refused(capsys, ["latency", str(digits_run), *extra, "--no-progress"], match)


def test_bad_model_files(tmp_path, capsys):
    _refused(capsys, ["latency", str(tmp_path / "none.pt")], "no such run folder or model file")
    (tmp_path / "m.pt").write_bytes(b"not a model")
    _refused(capsys, ["latency", str(tmp_path / "m.pt")], "pass --model-class")
    base = ["latency", str(tmp_path / "m.pt"), "--input-shape", "64", "--model-class"]
    _refused(capsys, base + ["nowhere.mod:Net"], "cannot be imported")
    _refused(capsys, base + ["LeNet300100"], "expected MODULE:CLASS")
    _refused(capsys, base + ["dualdrop.train.models:LeNet300100", "--model-args",
                             '{"n_features": 64}'], "cannot be read as a saved model")
    _refused(capsys, ["latency", str(tmp_path / "m.pt"), "--input-shape", "0,3", "--model-class",
                      "dualdrop.train.models:LeNet300100"], "--input-shape")