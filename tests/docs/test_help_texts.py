"""The command line describes itself correctly: no reference to a README section, every model
sparsify trains named, and `fit --tol`'s default is the estimators' default."""

from __future__ import annotations

import pytest

from dualdrop.cli import build_parser
from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression


def _help(capsys, *argv):
    with pytest.raises(SystemExit):
        build_parser(argv[0]).parse_args([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_demo_help_does_not_point_to_the_readme(capsys):
    text = _help(capsys, "demo")
    assert "README" not in text and "penalties.png" in text


def test_sparsify_description_names_every_model(capsys):
    text = _help(capsys, "sparsify")
    desc = text.split("options:")[0]
    for model in ("LeNet-300-100", "LeNet-5", "ResNet", "Transformer"):
        assert model in desc, model


def test_fit_tol_default_is_the_estimators(capsys):
    tol = SparseLinearRegression().get_params()["tol"]
    assert SparseLogisticRegression().get_params()["tol"] == tol
    sub = build_parser("fit")._subparsers._group_actions[0].choices["fit"]
    assert sub.get_default("tol") == tol
    assert f"default {tol:g}" in _help(capsys, "fit")


def test_frontier_help_lists_lr_and_batch_size(capsys):
    text = _help(capsys, "frontier")
    assert "--lr LR" in text and "--batch-size" in text and "30 on the embedded digits" in text
