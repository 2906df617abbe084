"""The test set of the frontier: read once per selected point, cached, then reported.

Only the Pareto set chosen on validation (:func:`~dualdrop.train.experiments.frontier.search.
pareto_front`) is evaluated on the test set, once per point, from the trial's checkpoint at the
point's tolerance (:func:`test_error`, the one place where the frontier reads the test set); the
results are cached in ``OUT/test_errors.json`` against the checkpoint's modification time, so a
report drawn again reads nothing twice.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dualdrop.train.checkpoint import atomic_write_json
from dualdrop.train.experiments.frontier.search import pareto_front
from dualdrop.train.experiments.frontier.storage import (
    JOURNAL,
    STUDY_PREFIX,
    open_storage,
    optuna_module,
)
from dualdrop.train.report.figures import plot_frontier
from dualdrop.train.report.tables import frontier_table

#: the test errors of the selected points, keyed by folder and tolerance, with the checkpoint's mtime
TEST_CACHE = "test_errors.json"


def test_error(run_dir: Path, tol: float | None, data) -> dict:
    """Test error and density of a finished run's network at tolerance ``tol``: the one place
    where the frontier reads the test set."""
    import torch

    from dualdrop.train import error_rate
    from dualdrop.train.checkpoint import read_checkpoint
    from dualdrop.train.export import training_network

    ck = read_checkpoint(run_dir / "checkpoint.pt", fix="rerun the trial (delete its folder)")
    conf = ck["config"]
    if ck["epoch"] < conf["epochs"]:
        raise ValueError(f"{run_dir}: unfinished run (epoch {ck['epoch']} of {conf['epochs']})")
    if conf.get("data_fingerprint") != data.fingerprint():
        raise ValueError(f"{run_dir} was trained on other data than the data loaded now")
    model, sp = training_network(ck)  # trials are never dense
    if tol is not None:
        sp.set_tol(tol)
    nonzero = float(sp.density()["total"])
    X, y = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
    return {"test_error": float(error_rate(model, X, y)), "nonzero_total": nonzero}


def collect(out: str | os.PathLike) -> dict:
    """``{method: {"plan", "points", "failed", "n_complete", "n_running", "n_waiting"}}`` from
    the studies in ``out``; ``points`` are all candidates of the finished trials, each with its
    ``trial``, ``run_dir``, ``hparams``, ``warm``, ``tol``, ``val_error`` and ``nonzero_total``."""
    optuna = optuna_module()
    S = optuna.trial.TrialState
    storage = open_storage(out, create=False)
    res = {}
    for name in optuna.get_all_study_names(storage):
        if not name.startswith(STUDY_PREFIX):
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        method = name[len(STUDY_PREFIX):]
        trials = study.get_trials(deepcopy=False)
        points, seen = [], set()
        for t in trials:
            if t.state != S.COMPLETE or t.user_attrs["run_dir"] in seen:
                continue  # a duplicate of the same folder is the same network
            seen.add(t.user_attrs["run_dir"])
            for p in t.user_attrs["points"]:
                points.append({"trial": t.number, "run_dir": t.user_attrs["run_dir"],
                               "hparams": t.user_attrs["hparams"], "warm": t.user_attrs["warm"],
                               **p})
        requeued = {t.user_attrs.get("requeued_from") for t in trials}
        failed = [{"trial": t.number, "run_dir": t.user_attrs.get("run_dir"),
                   "requeued": t.number in requeued,
                   "error": t.user_attrs.get("error", "process gone")}
                  for t in trials if t.state == S.FAIL]
        res[method] = {"plan": study.user_attrs.get("plan", {}), "points": points,
                       "failed": failed, "n_complete": sum(t.state == S.COMPLETE for t in trials),
                       "n_running": sum(t.state == S.RUNNING for t in trials),
                       "n_waiting": sum(t.state == S.WAITING for t in trials)}
    return res


def _cache_key(p: dict) -> str:
    return f"{p['run_dir']}|tol={p['tol']}"


def _cached(cache: dict, p: dict, out: Path) -> dict | None:
    """The cached evaluation of ``p``, unless its checkpoint was written again since."""
    ev = cache.get(_cache_key(p))
    ck = out / p["run_dir"] / "checkpoint.pt"
    if ev is None or not ck.exists() or ev.get("checkpoint_mtime_ns") != ck.stat().st_mtime_ns:
        return None
    return ev


def frontier_report(out: str | os.PathLike, data_dir: str | None = None, progress: bool = True,
                    verify_data: bool = True, data=None) -> dict:
    """Select each method's validation Pareto set, evaluate its points on the test set (once:
    cached in ``OUT/test_errors.json``), write ``frontier.png/.pdf/.md/.csv``.

    Returns ``{"methods": {method: {"frontier": [...], "n_complete", "failed", ...}},
    "files": [...], "dataset": name}``.
    """
    out = Path(out)
    runs = collect(out)
    if not runs:
        raise FileNotFoundError(f"{out / JOURNAL} holds no frontier study")
    plan0 = next(iter(runs.values()))["plan"]
    if data is None:
        from dualdrop.data import load_dataset

        data = load_dataset(data_dir if data_dir is not None else plan0.get("data_dir"),
                            seed=plan0.get("seed", 0), val_fraction=plan0.get("val_fraction", 0.2),
                            verify=verify_data)
    for m, r in runs.items():
        if r["plan"].get("data_fingerprint") != data.fingerprint():
            raise ValueError(f"the study of {m!r} was run on other data ({r['plan'].get('data')}) "
                             f"than the data loaded now ({data.name}); pass its --data-dir")
    cache_path = out / TEST_CACHE
    try:
        cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        cache = {}  # a cache is only a cache: recompute
    selected = {m: pareto_front(r["points"]) for m, r in runs.items()}
    todo = [p for f in selected.values() for p in f if _cached(cache, p, out) is None]
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="frontier: test error of the selected points",
                   unit="point", file=sys.stderr, dynamic_ncols=True)
    for p in todo:
        mtime = (out / p["run_dir"] / "checkpoint.pt").stat().st_mtime_ns
        cache[_cache_key(p)] = {**test_error(out / p["run_dir"], p["tol"], data),
                                "checkpoint_mtime_ns": mtime}
        atomic_write_json(cache_path, cache)  # a kill loses no evaluation
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    result = {"dataset": data.name, "methods": {}}
    for m, front in selected.items():
        rows = []
        for p in front:
            ev = cache[_cache_key(p)]
            rows.append({**{k: v for k, v in p.items() if k != "tie"},
                         "test_error": ev["test_error"],
                         "test_nonzero_total": ev["nonzero_total"]})
        result["methods"][m] = {**{k: v for k, v in runs[m].items() if k != "points"},
                                "n_candidates": len(runs[m]["points"]), "frontier": rows}
    mnist = data.name == "mnist"
    result["files"] = [str(p) for p in plot_frontier(result, out, mnist=mnist)]
    md = frontier_table(result, out, mnist=mnist)
    result["files"] += [str(out / "frontier.md"), str(out / "frontier.csv")]
    result["markdown"] = md
    return result


__all__ = ["TEST_CACHE", "collect", "frontier_report", "test_error"]
