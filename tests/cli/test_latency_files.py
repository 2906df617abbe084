"""``dualdrop latency`` on files: every bad model file or class is one line (exit 2), and the
run folder of ``dualdrop prune --model`` is timed on its calibration inputs."""

import json

import numpy as np
import torch
import torch.nn as nn

from dualdrop.cli import main

FAST = ["--batch-sizes", "1", "2", "--rounds", "1", "--no-progress", "--layouts", "dense", "csr"]
CLS = "dualdrop.train.models:LeNet300100"


def refused(capsys, argv, match):
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("dualdrop latency: error:"), err
    assert match in err, err


def test_bad_model_files_and_classes(tmp_path, capsys):
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "lin.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save({"weights": [1, 2]}, tmp_path / "other.pt")
    base = ["--input-shape", "64", "--model-class", CLS, "--model-args", '{"n_features": 64}']
    refused(capsys, ["latency", tmp_path / "empty.pt", *base], "empty (0 bytes)")
    refused(capsys, ["latency", tmp_path / "other.pt", *base], "neither a state_dict")
    refused(capsys, ["latency", tmp_path / "lin.pt", *base], "does not fit")
    refused(capsys, ["latency", tmp_path / "lin.pt", "--input-shape", "2", "--model-class",
                     "os:getcwd"], "returned a str, not a torch.nn.Module")
    refused(capsys, ["latency", tmp_path / "lin.pt", "--input-shape", "2", "--model-class",
                     "math:pi"], "not a class or a function")
    refused(capsys, ["latency", tmp_path / "lin.pt", "--input-shape", "2", "--model-class",
                     "torch.nn:Linear", "--model-args", '{"in_features": 2}'],
            "missing 1 required positional argument")


def test_a_module_saved_whole(tmp_path, capsys):
    from dualdrop.train.models import LeNet300100

    torch.save(LeNet300100(n_features=64), tmp_path / "whole.pt")
    assert main(["latency", str(tmp_path / "whole.pt"), "--model-class", CLS, "--model-args",
                 '{"n_features": 64}', "--input-shape", "64", *FAST]) == 0
    assert (tmp_path / "whole_latency" / "latency.json").is_file()
    capsys.readouterr()


def test_a_pruned_users_network_is_timed_on_its_calibration_inputs(tmp_path, capsys):
    from dualdrop.train.models import LeNet300100

    torch.manual_seed(0)
    torch.save(LeNet300100(n_features=64).state_dict(), tmp_path / "net.pt")
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).normal(size=(40, 64)))
    run = tmp_path / "run"
    assert main(["prune", "--model", str(tmp_path / "net.pt"), "--model-class", CLS,
                 "--model-args", '{"n_features": 64}', "--calib", str(tmp_path / "calib.npy"),
                 "--method", "magnitude", "--density", "0.2", "--out", str(run),
                 "--no-progress"]) == 0
    assert main(["latency", str(run), *FAST]) == 0
    out = capsys.readouterr().out
    assert "calibration inputs" in out
    rows = json.loads((run / "latency" / "latency.json").read_text())["rows"]
    assert {r["layout"] for r in rows} == {"dense", "csr"}
    assert all(r["nonzero"] < r["params"] for r in rows)


def test_library_messages_name_the_options():
    """One table from Python parameters to options, for every command."""
    from dualdrop.cli import build_parser, option_names, with_option_names

    parser = build_parser("latency")
    sub = parser._subparsers._group_actions[0].choices["latency"]
    names = option_names("latency", sub)
    assert names["batch_sizes"] == "--batch-sizes" and names["rounds"] == "--rounds"
    assert with_option_names("batch_sizes must be distinct, got [1, 1]", names) == (
        "--batch-sizes must be distinct, got [1, 1]")
    prune = option_names("prune", build_parser("prune")._subparsers._group_actions[0]
                         .choices["prune"])
    assert prune["target_density"] == "--density" and prune["allocation_options"] == \
        "--allocation-hp"
    text = "target_density must be <= 1.0; see runs/target_density/x and 'target_density'"
    assert with_option_names(text, prune) == (
        "--density must be <= 1.0; see runs/target_density/x and 'target_density'")
    # a plain word only where it names a parameter (``word=`` or ``word must``)
    assert with_option_names("the method is wanda; method must be known", prune) == (
        "the method is wanda; --method must be known")
