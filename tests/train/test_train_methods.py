"""Every sparsification method of dualdrop.nn through the training loop (tiny data)."""

from __future__ import annotations

import json

import pytest
import torch

from dualdrop.train import TrainConfig, train
from dualdrop.train.compare import run_comparison

dnn = pytest.importorskip("dualdrop.nn")
if not hasattr(dnn, "METHODS"):  # pragma: no cover - while dualdrop.nn is being written
    pytest.skip("dualdrop.nn does not export METHODS yet", allow_module_level=True)

ALL = [m for m in dnn.METHODS]


def _cfg(tmp_path, method, name=None, **kw):
    base = dict(method=method, epochs=2, out=str(tmp_path / (name or method.replace(":", "_"))),
                seed=0, progress=False, threads=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("method", ALL)
def test_every_method_trains(tmp_path, tiny_data, method):
    rep = train(_cfg(tmp_path, method), data=tiny_data)
    hist = json.loads((tmp_path / method / "history.json").read_text())
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in hist)
    assert 0.0 <= rep["nonzero_total"] <= 1.0
    assert set(rep["nonzero"]) == {"fc1", "fc2", "fc3"}
    assert "export_error" not in rep, rep.get("export_error")
    # the exported plain module computes the same test-time network
    assert rep["exported_test_error"] == pytest.approx(rep["test_error"], abs=1e-12)


@pytest.mark.parametrize("method", [m for m in ("vardrop-lr", "hardconcrete", "adaprox",
                                                "magnitude") if m in ALL])
def test_resume_is_bit_exact_for_method(tmp_path, tiny_data, method, assert_resume_exact):
    assert_resume_exact(tmp_path, tiny_data, method=method)


def test_method_hyperparameter_override_and_check(tmp_path, tiny_data):
    method = "logsum" if "logsum" in ALL else ALL[0]
    defaults = dnn.default_hparams(method)
    key = next(k for k, v in defaults.items() if k != "lr" and isinstance(v, float))
    rep = train(_cfg(tmp_path, method, epochs=1, hparams={key: str(defaults[key] * 2)}),
                data=tiny_data)
    assert rep["hparams"][key] == pytest.approx(defaults[key] * 2)
    assert rep["lr"] == defaults["lr"]
    with pytest.raises(ValueError, match=key):
        train(_cfg(tmp_path, method, name="bad", epochs=1, hparams={key: "abc"}), data=tiny_data)


def test_compare_two_methods(tmp_path, tiny_data):
    methods = ["none", "logsum" if "logsum" in ALL else ALL[0]]
    out = tmp_path / "cmp"
    reps = run_comparison(methods, epochs=1, out=out, progress=False, threads=1, data=tiny_data)
    assert set(reps) == set(methods)
    for f in ("figure2.png", "figure2.pdf", "table.md", "table.csv"):
        assert (out / f).stat().st_size > 0
    md = (out / "table.md").read_text()
    assert "dense" in md and "LogSum" in md and "2.93%" in md  # seed's number beside ours
    # rerun: finished runs are skipped (their checkpoints are untouched)
    stamp = (out / "runs" / methods[1] / "checkpoint.pt").stat().st_mtime_ns
    run_comparison(methods, epochs=1, out=out, progress=False, threads=1, data=tiny_data)
    assert (out / "runs" / methods[1] / "checkpoint.pt").stat().st_mtime_ns == stamp


def test_cli_penalty_method_with_json_params(tmp_path, tiny_mnist, capsys):
    from dualdrop.cli import main as cli_main

    folder, _ = tiny_mnist
    base = ["sparsify", "--epochs", "1", "--data-dir", str(folder), "--no-verify",
            "--no-progress", "--threads", "1"]
    assert cli_main(base + ["--method", "penalty:logsum", "--hp", 'penalty_params={"eps": 2.0}',
                            "--out", str(tmp_path / "p")]) == 0
    final = json.loads((tmp_path / "p" / "final.json").read_text())
    assert final["hparams"]["penalty_params"] == {"eps": 2.0}
    capsys.readouterr()
    for extra, match in [
        (["--method", "penalty:logsum", "--hp", "penalty_params=[1"], "expected JSON"),
        (["--method", "penalty:nosuch"], "nosuch"),
        (["--method", "vardrop", "--hp", "tol=2"], "tol"),
        (["--method", "vardrop", "--hp", "tol=abc"], "tol"),
    ]:
        assert cli_main(base + extra + ["--out", str(tmp_path / "bad")]) == 2
        assert match in capsys.readouterr().err


@pytest.mark.skipif("adaprox" not in ALL, reason="adaprox not available")
def test_adaprox_last_step_keeps_weights_finite(tmp_path, tiny_data):
    # Regression: the prox ran after the scheduler had set the learning rate of the NEXT step,
    # which is 0 after the last step; a zero step size made 0/0 = NaN of every pruned weight and
    # the final network classified at chance. The loop now proxes with the step's own rate and
    # refuses non-finite weights.
    rep = train(_cfg(tmp_path, "adaprox", epochs=3, lr=1e-3), data=tiny_data)
    ck = torch.load(tmp_path / "adaprox" / "checkpoint.pt", map_location="cpu",
                    weights_only=False)
    assert all(bool(torch.isfinite(v).all()) for v in ck["model"].values()
               if isinstance(v, torch.Tensor) and v.is_floating_point())
    assert rep["nonzero_total"] < 1.0 and rep["test_error"] < 0.5
