"""``dualdrop latency``: a run folder or a saved model file, table and files written."""

from __future__ import annotations

import json

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


@pytest.mark.parametrize("extra, err, match", [
    (["--model-class", "x:Y"], ValueError, "for a saved model file"),
    (["--rounds", "0"], ValueError, "rounds must be >= 1"),
])
def test_bad_options_on_a_run_folder(digits_run, extra, err, match):
    with pytest.raises(err, match=match):
        main(["latency", str(digits_run), *extra, "--no-progress"])


def test_bad_model_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such run folder or model file"):
        main(["latency", str(tmp_path / "none.pt")])
    (tmp_path / "m.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="pass --model-class"):
        main(["latency", str(tmp_path / "m.pt")])
    base = ["latency", str(tmp_path / "m.pt"), "--input-shape", "64", "--model-class"]
    with pytest.raises(ValueError, match="cannot be imported"):
        main(base + ["nowhere.mod:Net"])
    with pytest.raises(ValueError, match="expected MODULE:CLASS"):
        main(base + ["LeNet300100"])
    with pytest.raises(ValueError, match="cannot be read as a saved model"):
        main(base + ["dualdrop.train.models:LeNet300100", "--model-args", '{"n_features": 64}'])
    with pytest.raises(ValueError, match="--input-shape"):
        main(["latency", str(tmp_path / "m.pt"), "--input-shape", "0,3", "--model-class",
              "dualdrop.train.models:LeNet300100"])
    with pytest.raises(ValueError, match="--model-args is not JSON"):
        main(base + ["dualdrop.train.models:LeNet300100", "--model-args", "{n: 1"])
