"""``dualdrop prune``: a run folder load_run reads; every refusal before a file is written."""

import json

import pytest
import torch

from dualdrop.cli import main as cli_main
from dualdrop.train import load_run


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "dense"
    assert cli_main(["sparsify", "--method", "none", "--epochs", "2", "--out", str(out),
                     "--no-progress", "--threads", "1"]) == 0
    return out


def run_cli(argv, capsys):
    """``(exit code, message)``, whether the CLI boundary turns an error into exit code 2 or
    lets it through."""
    try:
        rc = cli_main(argv)
    except (ValueError, TypeError, FileExistsError, FileNotFoundError) as exc:
        return 2, str(exc)
    cap = capsys.readouterr()
    return rc, cap.err + cap.out


def test_prune_writes_a_run_folder(dense_run, tmp_path, capsys):
    out = tmp_path / "sgpt"
    rc, text = run_cli(["prune", "--from", str(dense_run), "--method", "sparsegpt", "--density",
                        "0.3", "--finetune-epochs", "1", "--out", str(out), "--no-progress",
                        "--calib", "256"], capsys)
    assert rc == 0, text
    assert "load_run" in text
    final = json.loads((out / "final.json").read_text())
    net = load_run(out)
    weights = [net.fc1.weight, net.fc2.weight, net.fc3.weight]
    kept = sum(int((w != 0).sum()) for w in weights)
    assert kept == round(0.3 * sum(w.numel() for w in weights))
    assert final["nonzero_total"] == pytest.approx(0.3, abs=1e-4)
    assert set(final["objective"]) == {"fc1", "fc2", "fc3"}
    assert 0 <= final["test_error"] <= 1 and 0 <= final["test_error_oneshot"] <= 1
    report = json.loads((out / "report.json").read_text())
    assert [r["layer"] for r in report["layers"]] == ["fc1", "fc2", "fc3"]
    # a pattern, refit, option through --hp
    out2 = tmp_path / "wanda24"
    rc, text = run_cli(["prune", "--from", str(dense_run), "--method", "wanda", "--pattern",
                        "2:4", "--hp", "group=layer", "--refit", "--out", str(out2),
                        "--no-progress"], capsys)
    assert rc == 0, text
    net = load_run(out2)
    assert bool(((net.fc2.weight != 0).reshape(100, -1, 4).sum(-1) == 2).all())
    out3 = tmp_path / "owl"
    rc, text = run_cli(["prune", "--from", str(dense_run), "--method", "magnitude", "--density",
                        "0.2", "--allocation", "owl", "--allocation-hp", "owl_lambda=0.05",
                        "--out", str(out3), "--no-progress"], capsys)
    assert rc == 0, text
    assert json.loads((out3 / "final.json").read_text())["allocation_options"] == {
        "owl_lambda": 0.05}


@pytest.mark.parametrize("extra, match", [
    (["--method", "nope", "--density", "0.5"], "nope"),
    (["--density", "0.5", "--pattern", "2:4"], "exactly one"),
    ([], "exactly one"),
    (["--pattern", "3"], "pattern"),
    (["--density", "0.5", "--hp", "blocksize=0"], "blocksize"),
    (["--density", "0.5", "--hp", "nonsense"], "NAME=VALUE"),
    (["--density", "0.5", "--allocation", "best"], "allocation"),
    (["--density", "0.5", "--calib", "0"], "--calib"),
    (["--density", "0.5", "--lr", "0"], "--lr"),
    (["--density", "1.5"], "--density must be a fraction in (0, 1]"),
    (["--density", "0.5", "--allocation", "owl", "--allocation-hp", "owl_q=1"], "owl_q"),
])
def test_prune_refusals_write_nothing(dense_run, tmp_path, capsys, extra, match):
    out = tmp_path / "never"
    rc, text = run_cli(["prune", "--from", str(dense_run), "--out", str(out), "--no-progress"]
                       + extra, capsys)
    assert rc == 2 and match in text, text
    assert not out.exists()


def test_prune_refuses_other_data_and_finished_out(dense_run, tmp_path, capsys):
    from tests.train.conftest import make_tiny_mnist

    folder, _ = make_tiny_mnist(tmp_path / "mnist")
    rc, text = run_cli(["prune", "--from", str(dense_run), "--density", "0.5", "--data-dir",
                        str(folder), "--no-verify", "--out", str(tmp_path / "x"),
                        "--no-progress"], capsys)
    assert rc == 2 and "not the data" in text and not (tmp_path / "x").exists()
    rc, text = run_cli(["prune", "--from", str(dense_run), "--density", "0.5", "--out",
                        str(dense_run), "--no-progress"], capsys)
    assert rc == 2 and "already holds" in text
    rc, text = run_cli(["prune", "--from", str(tmp_path / "missing"), "--density", "0.5",
                        "--out", str(tmp_path / "y"), "--no-progress"], capsys)
    assert rc == 2 and "missing" in text
    before = {k: v.clone() for k, v in torch.load(dense_run / "model.pt",
                                                   weights_only=True).items()}
    after = torch.load(dense_run / "model.pt", weights_only=True)
    assert all(torch.equal(before[k], after[k]) for k in before)
