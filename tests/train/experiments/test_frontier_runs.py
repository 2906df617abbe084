"""The frontier of finished runs over seeds (``dualdrop frontier --from-runs``): the Pareto set
of the seed-mean validation curve over the test-time tolerance, test errors read per seed at the
chosen tolerances, checked against evaluations made here independently; bad input."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys

import pytest
import torch

from dualdrop.data import load_dataset
from dualdrop.train import TrainConfig, error_rate, train
from dualdrop.train.checkpoint import read_checkpoint
from dualdrop.train.experiments.compare import run_comparison, run_dir
from dualdrop.train.export import training_network
from dualdrop.train.experiments.frontier.runs import find_runs, frontier_of_runs

TOLS = (0.02, 0.05, 0.2, 0.5, 0.9)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """compare --seeds layout: logsum over seeds 0 and 1, magnitude over seed 0, plus a
    logsum run with another lam (a second configuration of the same method) and an unfinished
    run."""
    out = tmp_path_factory.mktemp("seeds")
    run_comparison(["logsum", "magnitude"], epochs=1, out=out, progress=False, threads=1,
                   seeds=[0, 1])
    train(TrainConfig(method="logsum", epochs=1, out=str(out / "runs" / "logsum-lam" / "seed0"),
                      hparams={"lam": 1e-2}, progress=False, threads=1))
    train(TrainConfig(method="logsum", epochs=2, stop_after=1, progress=False, threads=1,
                      out=str(out / "runs" / "unfinished" / "seed0")))
    return out


def _curve(run, tols, split):
    """Independent evaluation of one run: (error, density) at each tolerance on ``split``."""
    ck = read_checkpoint(run / "checkpoint.pt", fix="-")
    data = load_dataset(None, seed=ck["config"]["seed"])
    net, sp = training_network(ck)
    X, y = getattr(data, f"X_{split}"), getattr(data, f"y_{split}")
    res = {}
    for t in tols:
        if t is not None:
            sp.set_tol(t)
        res[t] = (error_rate(net.eval(), torch.from_numpy(X), torch.from_numpy(y)),
                  float(sp.density()["total"]))
    return res


def test_frontier_of_runs_against_independent_evaluation(runs, tmp_path, capsys):
    res = frontier_of_runs([runs / "runs"], tmp_path, tols=TOLS, progress=False)
    assert "unfinished" in capsys.readouterr().err  # named, not silently dropped
    names = set(res["methods"])
    assert names == {"logsum [lam=0.003]", "logsum [lam=0.01]", "magnitude"}
    ls = res["methods"]["logsum [lam=0.003]"]
    assert ls["n_seeds"] == 2 and ls["seeds"] == [0, 1]
    seeds = [run_dir(runs, "logsum", s) for s in (0, 1)]
    val = [_curve(r, TOLS, "val") for r in seeds]
    mean = {t: (statistics.fmean(v[t][0] for v in val), statistics.fmean(v[t][1] for v in val))
            for t in TOLS}
    # brute force: a tolerance is kept iff no other has a mean no worse in both and better in one
    keep = {t for t in TOLS if not any(
        mean[u][0] <= mean[t][0] and mean[u][1] <= mean[t][1] and mean[u] != mean[t]
        for u in TOLS)}
    got = {p["tol"] for p in ls["frontier"]}
    assert {mean[t] for t in got} == {mean[t] for t in keep}
    test = [_curve(r, got, "test") for r in seeds]
    for p in ls["frontier"]:
        errs = [c[p["tol"]][0] for c in test]
        assert p["val_error"] == pytest.approx(mean[p["tol"]][0])
        assert p["test_error"] == pytest.approx(statistics.fmean(errs))
        assert p["test_error_std"] == pytest.approx(statistics.stdev(errs))
        assert p["test_nonzero_total"] == pytest.approx(
            statistics.fmean(c[p["tol"]][1] for c in test))
    mag = res["methods"]["magnitude"]  # no tolerance: the trained network, one point
    assert len(mag["frontier"]) == 1 and mag["frontier"][0]["tol"] is None
    assert mag["frontier"][0]["test_error_std"] is not None  # two seeds
    md = (tmp_path / "frontier.md").read_text()
    assert "± " in md and "paper:" not in md  # the paper's numbers only beside full MNIST
    with open(tmp_path / "frontier.csv") as fh:
        assert len(list(csv.DictReader(fh))) == sum(len(r["frontier"])
                                                    for r in res["methods"].values())
    assert (tmp_path / "frontier.png").stat().st_size > 0


def test_by_method_pools_configurations(runs, tmp_path):
    res = frontier_of_runs([runs / "runs"], tmp_path, tols=TOLS, by="method", progress=False)
    assert set(res["methods"]) == {"logsum", "magnitude"}
    ls = res["methods"]["logsum"]
    assert sorted(ls["configs"]) == ["logsum [lam=0.003]", "logsum [lam=0.01]"]
    # brute force over the union of both configurations' seed-mean validation curves
    dirs = {"logsum [lam=0.003]": [run_dir(runs, "logsum", s) for s in (0, 1)],
            "logsum [lam=0.01]": [runs / "runs" / "logsum-lam" / "seed0"]}
    pts = []
    for cfg, ds in dirs.items():
        curves = [_curve(d, TOLS, "val") for d in ds]
        pts += [(cfg, t, statistics.fmean(c[t][0] for c in curves),
                 statistics.fmean(c[t][1] for c in curves)) for t in TOLS]
    keep = {(e, d) for _, _, e, d in pts
            if not any(e2 <= e and d2 <= d and (e2, d2) != (e, d) for _, _, e2, d2 in pts)}
    got = {(p["val_error"], p["val_nonzero_total"]) for p in ls["frontier"]}
    assert got == keep  # the same numbers, averaged in the same order
    for p in ls["frontier"]:  # each point is still one configuration's seed mean
        assert p["n_seeds"] == len(dirs[p["config"]])
    with pytest.raises(ValueError, match="--by"):
        frontier_of_runs([runs / "runs"], tmp_path, by="seed", progress=False)


def test_evaluations_are_cached_and_redone_when_a_checkpoint_changes(runs, tmp_path,
                                                                     monkeypatch):
    only = [run_dir(runs, "logsum", 0)]
    frontier_of_runs(only, tmp_path, tols=TOLS, progress=False)
    calls = []
    import dualdrop.train.evaluate as ev

    real = ev.error_rate
    monkeypatch.setattr(ev, "error_rate", lambda *a, **k: calls.append(1) or real(*a, **k))
    frontier_of_runs(only, tmp_path, tols=TOLS, progress=False)
    assert calls == []  # validation and test numbers both from the cache
    ck = only[0] / "checkpoint.pt"
    ck.touch()  # a rewritten checkpoint (e.g. resumed for more epochs): evaluate again
    frontier_of_runs(only, tmp_path, tols=TOLS, progress=False)
    assert calls


def test_other_data_refused(runs, tmp_path):
    cfg = json.loads((run_dir(runs, "logsum", 0) / "config.json").read_text())
    assert cfg["data"] == "digits"
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(FileNotFoundError, match="no finished run"):
        frontier_of_runs([bad], tmp_path / "o", progress=False)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        find_runs([tmp_path / "missing"])
    forged = tmp_path / "forged"  # a run whose checkpoint says it saw other data
    forged.mkdir()
    src = run_dir(runs, "logsum", 0)
    for f in ("config.json", "final.json"):
        (forged / f).write_text((src / f).read_text())
    ck = read_checkpoint(src / "checkpoint.pt", fix="-")
    ck["config"]["data_fingerprint"] = "0" * 16
    torch.save(ck, forged / "checkpoint.pt")
    with pytest.raises(ValueError, match="--data-dir"):
        frontier_of_runs([forged], tmp_path / "o", progress=False)
    with pytest.raises(ValueError, match="--tols"):
        frontier_of_runs([runs / "runs"], tmp_path / "o", tols=(0.5, 1.5), progress=False)


def test_cli_from_runs(runs, tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dualdrop", "frontier", *args],
                              capture_output=True, text=True)

    p = cli("--from-runs", str(run_dir(runs, "magnitude", 0)), "--out", str(tmp_path / "f"),
            "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "Magnitude" in p.stdout and (tmp_path / "f" / "frontier.png").exists()
    p = cli("--from-runs", str(runs / "runs"), "--methods", "logsum")
    assert p.returncode == 2 and "drop --methods" in p.stderr
    p = cli("--from-runs", str(runs / "runs"), "--epochs", "5")  # a training option: refused
    assert p.returncode == 2 and "drop --epochs" in p.stderr
    p = cli("--tols", "0.5", "--report-only", "--out", str(tmp_path / "none"))
    assert p.returncode == 2 and "--tols goes with --from-runs" in p.stderr
