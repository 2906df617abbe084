"""Every sparsification method of dualdrop.nn through the training loop (tiny data)."""

from __future__ import annotations

import json

import pytest
import torch

from dualdrop.train import TrainConfig, train
from dualdrop.train.experiments.compare import run_comparison

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
    assert "dense" in md and "LogSum" in md
    # the tiny files are not all of MNIST: the paper's numbers are not printed beside them
    assert "2.93%" not in md and "not shown beside runs on other data" in md
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
                    weights_only=True)
    assert all(bool(torch.isfinite(v).all()) for v in ck["model"].values()
               if isinstance(v, torch.Tensor) and v.is_floating_point())
    assert rep["nonzero_total"] < 1.0 and rep["test_error"] < 0.5


def _load(out, method):
    """The trained model from the run's checkpoint, sparsified the same way."""
    from dualdrop.train import lenet_300_100

    ck = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)
    model = lenet_300_100(784)
    sp = dnn.sparsify(model, method)
    model.load_state_dict(ck["model"])
    model.eval()
    return model, sp


@pytest.mark.parametrize("method,lr", [("vardrop-lr-ar", 1e-3), ("logsum", 3e-3)])
def test_tol_sweep_and_selection(tmp_path, tiny_data, method, lr):
    """Sweep and selection recomputed independently from the checkpoint: each sweep point's
    density and validation error; the choice is the sparsest point within the margin."""
    margin = 0.02
    rep = train(_cfg(tmp_path, method, epochs=3, lr=lr, select_tol_margin=margin),
                data=tiny_data)
    model, sp = _load(tmp_path / method.replace(":", "_"), method)
    Xva, yva = torch.from_numpy(tiny_data.X_val), torch.from_numpy(tiny_data.y_val)
    Xte, yte = torch.from_numpy(tiny_data.X_test), torch.from_numpy(tiny_data.y_test)
    sweep = rep["val_tol_sweep"]
    assert [r["tol"] for r in sweep] == sorted(r["tol"] for r in sweep) and len(sweep) >= 5
    for r in sweep:
        for _, state in sp.named_states():
            state.set_tol(r["tol"])
        with torch.no_grad():
            err = float((model(Xva).argmax(1) != yva).double().mean())
            w = [state.eval_weight(t.param) for t, state in sp.states()]
        assert r["error"] == pytest.approx(err, abs=1e-12)
        assert r["nonzero_total"] == pytest.approx(
            sum(int((x != 0).sum()) for x in w) / sum(x.numel() for x in w), abs=1e-12)
    # density never increases with tol, and the sweep does change it here
    dens = [r["nonzero_total"] for r in sweep]
    assert all(a >= b for a, b in zip(dens, dens[1:])) and dens[-1] < dens[0]
    sel = rep["selected_tol"]
    ok = [r for r in sweep if r["error"] <= rep["val_error"] + margin + 1e-12]
    assert sel["nonzero_total"] == min(r["nonzero_total"] for r in ok)
    assert sel["val_error"] <= rep["val_error"] + margin + 1e-12
    sp.set_tol(sel["tol"])
    with torch.no_grad():
        assert sel["test_error"] == pytest.approx(
            float((model(Xte).argmax(1) != yte).double().mean()), abs=1e-12)
    # the headline numbers stay those of the trained tol
    sp.set_tol(0.05)
    with torch.no_grad():
        assert rep["test_error"] == pytest.approx(
            float((model(Xte).argmax(1) != yte).double().mean()), abs=1e-12)
    # history's regularizer is the value of the final weights (logged once per epoch)
    hist = json.loads((tmp_path / method.replace(":", "_") / "history.json").read_text())
    with torch.no_grad():
        assert hist[-1]["train_reg"] == pytest.approx(float(sp.regularizer(len(tiny_data.y_train))),
                                                      rel=1e-6)


def test_no_tol_methods(tmp_path, tiny_data):
    rep = train(_cfg(tmp_path, "magnitude", epochs=1, select_tol_margin=0.01), data=tiny_data)
    assert rep["val_tol_sweep"] == [] and "selected_tol" not in rep
    import torch.nn as nn

    sp = dnn.sparsify(nn.Sequential(nn.Linear(3, 2)), "hardconcrete")
    with pytest.raises(ValueError, match="no keep-ratio tolerance"):
        sp.set_tol(0.1)
    with pytest.raises(ValueError, match="select_tol_margin"):
        train(_cfg(tmp_path, "logsum", name="bad", select_tol_margin=-0.1), data=tiny_data)


def test_select_tol_rule():
    """The rule on a hand-made sweep: sparsest point within the margin; density ties go to the
    tolerance closest to the trained one; nothing admissible keeps the trained tol."""
    import torch.nn as nn

    from dualdrop.train.evaluate import select_tol

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    sp = dnn.sparsify(model, "logsum")
    X, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    sweep = [{"tol": 0.05, "nonzero_total": 0.5, "error": 0.10},
             {"tol": 0.1, "nonzero_total": 0.4, "error": 0.11},
             {"tol": 0.2, "nonzero_total": 0.3, "error": 0.115},
             {"tol": 0.3, "nonzero_total": 0.3, "error": 0.112},
             {"tol": 0.5, "nonzero_total": 0.1, "error": 0.2}]
    assert select_tol(sp, model, sweep, 0.10, 0.015, X, y)["tol"] == 0.2
    assert select_tol(sp, model, sweep, 0.10, 0.011, X, y)["tol"] == 0.1
    assert select_tol(sp, model, sweep, 0.10, 0.0, X, y)["tol"] == 0.05
    none = select_tol(sp, model, sweep, 0.05, 0.0, X, y)
    assert none["tol"] == 0.05 and "test_error" not in none
    assert sp.hparams["tol"] == 0.05  # restored


def test_init_from_dense_and_sparse_runs(tmp_path, tiny_data, assert_resume_exact):
    from dualdrop.train.export import init_weights

    train(_cfg(tmp_path, "none", name="dense", epochs=2), data=tiny_data)
    dense_ck = torch.load(tmp_path / "dense" / "checkpoint.pt", weights_only=True)
    sd, info = init_weights(tmp_path / "dense", 784, 10)
    assert info["method"] == "none" and info["epoch"] == 2
    assert all(torch.equal(sd[k], dense_ck["model"][k]) for k in dense_ck["model"])
    # a warm-started run at a negligible learning rate ends where it started
    rep = train(_cfg(tmp_path, "logsum", name="warm", epochs=1, lr=1e-12,
                     init_from=str(tmp_path / "dense")), data=tiny_data)
    assert rep["init_from"]["path"].endswith("checkpoint.pt")
    warm = torch.load(tmp_path / "warm" / "checkpoint.pt", weights_only=True)["model"]
    for k in ("fc1.weight", "fc2.weight", "fc3.bias"):  # a sparsified weight is parametrized
        w = warm.get(k, warm.get(k.replace(".weight", ".parametrizations.weight.original")))
        torch.testing.assert_close(w, dense_ck["model"][k], atol=1e-9, rtol=0)
    # from a sparsified run: its test-time network, pruned weights exactly 0
    train(_cfg(tmp_path, "vardrop-lr-ar", name="ar", epochs=2, lr=1e-3), data=tiny_data)
    model, sp = _load(tmp_path / "ar", "vardrop-lr-ar")
    sd, info = init_weights(tmp_path / "ar" / "checkpoint.pt", 784, 10)
    model.eval()
    for name in ("fc1", "fc2", "fc3"):
        layer = getattr(model, name)  # eval(): the test-time weight, masks folded in
        assert torch.equal(sd[f"{name}.weight"], layer.weight.detach())
        assert torch.equal(sd[f"{name}.bias"], layer.bias.detach())
    assert info["nonzero_total"] == pytest.approx(sp.density()["total"])
    # resume stays exact with a warm start
    assert_resume_exact(tmp_path / "res", tiny_data, method="logsum", lr=1e-3,
                        init_from=str(tmp_path / "dense"))
    with pytest.raises(FileNotFoundError, match="init_from"):
        train(_cfg(tmp_path, "logsum", name="bad", init_from=str(tmp_path / "nope")),
              data=tiny_data)
