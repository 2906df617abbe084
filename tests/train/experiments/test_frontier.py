"""The accuracy–sparsity frontier: a resumable Optuna study of ordinary training runs, the
validation Pareto set, the test set read once per selected point, figure and table, bad input."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from dualdrop.data import load_dataset  # noqa: E402
from dualdrop.train import TrainConfig, train  # noqa: E402
from dualdrop.train.experiments import frontier as fr  # noqa: E402
from dualdrop.train.experiments.frontier import evaluation, search  # noqa: E402
from dualdrop.train.experiments.frontier.storage import Plan  # noqa: E402

FAST = dict(epochs=2, threads=1, progress=False)


@pytest.fixture(scope="module")
def digits():
    return load_dataset(None, seed=0)


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """A finished study of two methods, one with a tolerance (logsum), one without (magnitude)."""
    out = tmp_path_factory.mktemp("frontier")
    fr.run_frontier(["logsum", "magnitude"], out=out, n_trials=3, **FAST)
    return out


def brute_force_front(points):
    """Points no other point dominates (values, as a set; quadratic and independent)."""
    keep = set()
    for p in points:
        a = (p["val_error"], p["nonzero_total"])
        if not any(q["val_error"] <= a[0] and q["nonzero_total"] <= a[1]
                   and (q["val_error"], q["nonzero_total"]) != a for q in points):
            keep.add(a)
    return keep


def test_pareto_front_matches_brute_force_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(200):  # small integer grids: many ties and duplicates
        n = int(rng.integers(1, 30))
        pts = [{"val_error": float(e), "nonzero_total": float(d)}
               for e, d in rng.integers(0, 6, (n, 2))]
        front = fr.pareto_front(pts)
        got = [(p["val_error"], p["nonzero_total"]) for p in front]
        assert len(got) == len(set(got)), "a duplicate point kept twice"
        assert set(got) == brute_force_front(pts)
        assert [d for _, d in got] == sorted(d for _, d in got)


def test_pareto_front_tie_prefers_trained_tol():
    pts = [{"val_error": 0.1, "nonzero_total": 0.2, "tie": 1.0, "tol": 0.3},
           {"val_error": 0.1, "nonzero_total": 0.2, "tie": 0.0, "tol": 0.05}]
    assert fr.pareto_front(pts) == [pts[1]]


def test_study_selection_against_brute_force(study_dir):
    runs = fr.collect(study_dir)
    assert set(runs) == {"logsum", "magnitude"}
    for m, r in runs.items():
        assert r["n_complete"] == 3 and not r["failed"]
        pts = r["points"]
        # recompute the candidates from the trials' own final.json files (validation numbers)
        again = []
        for d in sorted({p["run_dir"] for p in pts}):
            again += fr.validation_points(json.loads((study_dir / d / "final.json").read_text()))
        assert sorted((p["val_error"], p["nonzero_total"]) for p in pts) == \
            sorted((p["val_error"], p["nonzero_total"]) for p in again)
        if m == "logsum":  # the tolerance sweep: several candidates per trial
            assert len(pts) > 3
        else:
            assert len(pts) == 3 and all(p["tol"] is None for p in pts)
        rep_rows = list(csv.DictReader(open(study_dir / "frontier.csv")))
        sel = {(float(x["val_error"]), float(x["nonzero_total"])) for x in rep_rows
               if x["method"] == m}
        assert sel == brute_force_front(pts)
    # trials record no test error: selection cannot have used it
    storage = fr.open_storage(study_dir, create=False)
    for name in optuna.get_all_study_names(storage):
        for t in optuna.load_study(study_name=name, storage=storage).trials:
            assert "test" not in json.dumps(t.user_attrs)


def test_test_set_read_once_per_selected_point(study_dir, digits, monkeypatch):
    (study_dir / fr.TEST_CACHE).unlink()
    calls = []
    real = evaluation.test_error

    def counting(run_dir, tol, data):
        calls.append((run_dir.relative_to(study_dir).as_posix(), tol))
        return real(run_dir, tol, data)

    monkeypatch.setattr(evaluation, "test_error", counting)
    res = fr.frontier_report(study_dir, progress=False, data=digits)
    selected = [(p["run_dir"], p["tol"]) for r in res["methods"].values() for p in r["frontier"]]
    assert sorted(calls, key=str) == sorted(selected, key=str)
    assert len(set(calls)) == len(calls)
    n_candidates = sum(r["n_candidates"] for r in res["methods"].values())
    assert len(calls) < n_candidates  # not every candidate was evaluated
    calls.clear()
    res2 = fr.run_frontier(out=study_dir, report_only=True, progress=False)
    assert calls == []  # cached: the test set is not read again
    assert res2["methods"]["logsum"]["frontier"] == res["methods"]["logsum"]["frontier"]


def test_test_error_of_a_point_matches_the_trained_run(study_dir, digits):
    """At the trained tolerance the frontier's evaluation equals train()'s own test error, and
    the density at another tolerance equals the validation sweep's (same network)."""
    d = next((study_dir / "trials" / "logsum").iterdir())
    final = json.loads((d / "final.json").read_text())
    ev = evaluation.test_error(d, final["hparams"]["tol"], digits)
    assert ev["test_error"] == final["test_error"]
    assert ev["nonzero_total"] == pytest.approx(final["nonzero_total"])
    row = final["val_tol_sweep"][-1]
    assert evaluation.test_error(d, row["tol"], digits)["nonzero_total"] == \
        pytest.approx(row["nonzero_total"])


def test_trial_folder_is_a_sparsify_run(study_dir, capsys):
    """The command written beside each trial is accepted by ``dualdrop sparsify --resume``
    (same run configuration) and finds the run finished."""
    import shlex

    from dualdrop.cli import main

    d = next((study_dir / "trials" / "magnitude").iterdir())
    before = (d / "checkpoint.pt").stat().st_mtime_ns
    argv = shlex.split((d / "sparsify_command.txt").read_text())
    assert argv[:2] == ["dualdrop", "sparsify"] and "--resume" in argv
    assert main(argv[1:] + ["--no-progress"]) == 0
    assert "magnitude: test error" in capsys.readouterr().out
    assert (d / "checkpoint.pt").stat().st_mtime_ns == before


def test_files_written(study_dir):
    for name in ("frontier.png", "frontier.pdf", "frontier.md", "frontier.csv"):
        assert (study_dir / name).stat().st_size > 0, name
    md = (study_dir / "frontier.md").read_text()
    assert "LogSum" in md and "Magnitude" in md
    assert "paper:" not in md and "goal" not in md  # digits: no MNIST reference numbers


def test_mnist_reference_points_only_on_mnist(tmp_path):
    row = {"trial": 0, "run_dir": "trials/logsum/lam=0.001", "hparams": {"lam": 0.001},
           "warm": False, "tol": 0.05, "val_error": 0.02, "nonzero_total": 0.03,
           "test_error": 0.021, "test_nonzero_total": 0.03}
    result = {"dataset": "mnist", "methods": {"logsum": {
        "plan": {"knob": {"name": "lam", "low": 1e-4, "high": 1e-2}, "epochs": 1},
        "frontier": [row], "failed": [], "n_complete": 1, "n_running": 0, "n_waiting": 0,
        "n_candidates": 1}}}
    md = fr.frontier_table(result, tmp_path, mnist=True)
    assert "published: sparse VD" in md and "goal 1" in md and "paper: LogSum" in md
    assert "REDUCED budget" in md and "1 epochs per trial" in md  # shorter than the paper's
    assert all(p.exists() for p in fr.plot_frontier(result, tmp_path, mnist=True))
    result["methods"]["logsum"]["plan"]["epochs"] = 200
    assert "REDUCED" not in fr.frontier_table(result, tmp_path, mnist=True)


def test_study_resumes_and_adds_trials(tmp_path):
    out = tmp_path / "f"
    fr.run_frontier(["logsum"], out=out, n_trials=2, **FAST)
    runs = fr.collect(out)["logsum"]
    dirs = sorted({p["run_dir"] for p in runs["points"]})
    mtimes = {d: (out / d / "checkpoint.pt").stat().st_mtime_ns for d in dirs}
    fr.run_frontier(["logsum"], out=out, n_trials=2, **FAST)  # nothing to add
    assert fr.collect(out)["logsum"]["n_complete"] == 2
    fr.run_frontier(["logsum"], out=out, n_trials=3, **FAST)  # one more
    runs = fr.collect(out)["logsum"]
    assert runs["n_complete"] == 3
    assert len({p["run_dir"] for p in runs["points"]}) == 3
    for d, t in mtimes.items():  # the earlier trials were not trained again
        assert (out / d / "checkpoint.pt").stat().st_mtime_ns == t
    with pytest.raises(ValueError, match="other settings"):
        fr.run_frontier(["logsum"], out=out, n_trials=3, epochs=3, threads=1, progress=False)


def test_killed_trial_is_requeued_and_resumes(tmp_path, digits):
    """A RUNNING trial whose process is gone is failed, enqueued again with its parameters, and
    the new trial resumes the checkpoint in the same folder."""
    out = tmp_path / "f"
    fr.run_frontier(["logsum"], out=out, n_trials=1, epochs=3, threads=1, progress=False)
    storage = fr.open_storage(out)
    study = optuna.load_study(study_name="frontier:logsum", storage=storage)
    trial = study.ask({"lam": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    lam = trial.params["lam"]
    hp, _, tid = search.suggest(trial, Plan(**{**study.user_attrs["plan"],
                                        "knob": fr.Knob(**study.user_attrs["plan"]
                                                        ["knob"])}))
    run_dir = out / "trials" / "logsum" / tid
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for k, v in {"run_dir": f"trials/logsum/{tid}", "host": os.uname().nodename,
                 "pid": dead.pid}.items():
        trial.set_user_attr(k, v)
    # the killed process had trained one epoch of three
    plan = study.user_attrs["plan"]
    train(TrainConfig(method="logsum", epochs=3, out=str(run_dir), hparams=hp, lr=plan["lr"],
                      batch_size=plan["batch_size"], stop_after=1, progress=False, threads=1),
          data=digits)
    first = json.loads((run_dir / "history.json").read_text())[0]
    fr.run_frontier(["logsum"], out=out, n_trials=2, epochs=3, threads=1, progress=False)
    runs = fr.collect(out)["logsum"]
    assert runs["n_complete"] == 2
    assert [f["trial"] for f in runs["failed"]] == [trial.number]
    hist = json.loads((run_dir / "history.json").read_text())
    assert [r["epoch"] for r in hist] == [1, 2, 3] and hist[0] == first  # resumed, not restarted
    requeued = [t for t in study.get_trials() if t.user_attrs.get("requeued_from") ==
                trial.number]
    assert len(requeued) == 1 and requeued[0].params["lam"] == lam
    assert requeued[0].state == optuna.trial.TrialState.COMPLETE


def test_two_workers_share_the_study(tmp_path):
    out = tmp_path / "f"
    fr.run_frontier(["magnitude"], out=out, n_trials=2, workers=2, epochs=1, threads=1,
                    progress=False)
    runs = fr.collect(out)["magnitude"]
    assert 2 <= runs["n_complete"] <= 3 and not runs["failed"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(methods=["no-such-method"]), "unknown"),
    (dict(methods=[]), "empty"),
    (dict(methods=["logsum"], n_trials=0), "n_trials"),
    (dict(methods=["logsum"], n_trials=-1), "n_trials"),
    (dict(methods=["none"]), "no default sparsity knob"),
    (dict(methods=["logsum"], knobs={"logsum": fr.Knob("lam", 1e-2, 1e-3)}), "empty"),
    (dict(methods=["logsum"], knobs={"logsum": fr.Knob("eps", 1.0, 1.0)}), "empty"),
    (dict(methods=["logsum"], knobs={"logsum": fr.Knob("nope", 1.0, 2.0)}), "not a hyper"),
    (dict(methods=["logsum"], fixed={"logsum": {"nope": 1}}), "unknown hyperparameter"),
    (dict(methods=["logsum"], knobs={"adaprox": fr.Knob("lam", 1e-4, 1e-2)}), "not swept"),
    (dict(methods=["logsum"], sampler="grid"), "sampler"),
    (dict(methods=["logsum"], workers=0), "workers"),
    (dict(methods=["logsum", "logsum"]), "twice"),
])
def test_bad_input_raises(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fr.run_frontier(out=tmp_path / "f", epochs=1, progress=False, **kwargs)
    assert not (tmp_path / "f" / "trials").exists()


def test_bad_input_other_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        fr.run_frontier(["logsum"], out=tmp_path / "f", init_from=tmp_path / "missing",
                        epochs=1, progress=False)
    with pytest.raises(FileNotFoundError, match="no frontier study"):
        fr.run_frontier(out=tmp_path / "g", report_only=True, progress=False)
    with pytest.raises(TypeError, match="Knob"):
        fr.run_frontier(["logsum"], out=tmp_path / "f", knobs={"logsum": ("lam", 1, 2)},
                        epochs=1, progress=False)


def test_cli(tmp_path, capsys):
    from dualdrop.cli import main

    out = tmp_path / "c"
    assert main(["frontier", "--methods", "magnitude", "--n-trials", "1", "--epochs", "1",
                 "--range", "magnitude:sparsity=0.5:0.9", "--out", str(out),
                 "--no-progress"]) == 0
    assert "Magnitude" in capsys.readouterr().out
    plan = fr.collect(out)["magnitude"]["plan"]
    assert plan["knob"]["low"] == 0.5 and plan["knob"]["complement"]
    assert main(["frontier", "--study", str(out), "--report-only", "--no-progress"]) == 0
    assert main(["frontier", "--methods", "logsum", "--range", "logsum:lam=1e-2",
                 "--out", str(out)]) == 2
    assert "METHOD:NAME=LOW:HIGH" in capsys.readouterr().err
    assert main(["frontier", "--methods", "logsum", "--n-trials", "0", "--out",
                 str(tmp_path / "d")]) == 2


def test_target_density_knob_for_every_method(tmp_path):
    """--target-density: the finished density is the knob of every method (a method with a
    strength and magnitude pruning alike); each trial ends at its knob's density."""
    from dualdrop.cli import main

    out = tmp_path / "td"
    assert main(["frontier", "--methods", "logsum", "magnitude", "--n-trials", "2", "--epochs",
                 "2", "--target-density", "0.05:0.3", "--out", str(out), "--no-progress"]) == 0
    for m in ("logsum", "magnitude"):
        trials = sorted((out / "trials" / m).iterdir())
        assert len(trials) == 2
        for t in trials:
            assert t.name.startswith("target_density=")
            d = float(t.name.split("=")[1])
            assert 0.05 <= d <= 0.3
            final = json.loads((t / "final.json").read_text())
            assert final["nonzero_total"] == pytest.approx(d, rel=0.1)
            assert "--target-density" in (t / "sparsify_command.txt").read_text()
    assert "target_density=" in (out / "frontier.md").read_text()


@pytest.mark.parametrize("value, match", [("abc", "LOW:HIGH"), ("0.1", "LOW:HIGH"),
                                          ("0:0.5", "target density lies in")])
def test_target_density_knob_bad_input(tmp_path, capsys, value, match):
    from dualdrop.cli import main

    assert main(["frontier", "--methods", "logsum", "--epochs", "1", "--target-density", value,
                 "--out", str(tmp_path / "b"), "--no-progress"]) == 2
    assert match in capsys.readouterr().err
