"""The frontier of finished runs over seeds: the test-time tolerance as the sparsity knob.

A run of a method with a keep-ratio tolerance (the penalty methods, the eta-trick, variational
dropout) is not one point but a curve: pruning the trained network at tolerance ``tol`` gives
``(E(tol), rho(tol))`` without retraining. Over ``S`` seeds of the same configuration (method,
hyperparameters, schedule) the curve of the configuration is the seed mean

    Ebar_val(tol) = 1/S sum_s E_val,s(tol),      rhobar(tol) = 1/S sum_s rho_s(tol),

each seed on its own validation split (the split follows the run's seed). The frontier keeps
the tolerances whose ``(Ebar_val, rhobar)`` is not dominated (:func:`pareto_front`), chosen from
validation numbers only; the test error of each seed's network at a chosen tolerance is read
once (cached in ``OUT/evaluations.json``) and reported as mean ± sample standard deviation over
the seeds, the density likewise. A method without a tolerance (magnitude pruning, hard-concrete
gates: their zeros come from training) contributes its trained network, one point per
configuration.

This is what ``dualdrop frontier --from-runs`` draws from the folders of ``dualdrop compare
--seeds`` (or any ``dualdrop sparsify`` runs): a frontier at the full training budget that costs
evaluations only. The knob it sweeps is the tolerance; the training-time knobs (``lam``, KL
weight, target sparsity) are what the Optuna sweep of :mod:`dualdrop.train.experiments.frontier`
adds.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

from dualdrop.train.checkpoint import atomic_write_json, read_json
from dualdrop.train.experiments.frontier.search import pareto_front
from dualdrop.train.report.figures import plot_frontier
from dualdrop.train.report.tables import mean_std, runs_table

#: tolerances swept on validation: the training loop's grid and the sparser end beyond it
RUN_TOLS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)

#: validation sweeps and test errors, per run, split and tolerance, with the checkpoint's mtime
EVAL_CACHE = "evaluations.json"


def find_runs(paths) -> list[Path]:
    """Folders under ``paths`` (each a run folder or a folder of them, searched recursively)
    holding a finished run: ``final.json`` with status ``finished`` and ``checkpoint.pt``.
    Unfinished runs are skipped with a message on stderr naming them."""
    found = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"--from-runs {p}: no such folder")
        for final in sorted([p / "final.json"] if (p / "final.json").exists()
                            else p.rglob("final.json")):
            d = final.parent
            status = read_json(final, "rerun or delete that run").get("status")
            if status == "finished" and (d / "checkpoint.pt").exists():
                found.append(d)
            else:
                why = "no checkpoint.pt" if status == "finished" else f"status {status!r}"
                print(f"frontier: skipping {d} ({why})", file=sys.stderr)
        for ck in p.rglob("checkpoint.pt"):
            if ck.parent not in found and not (ck.parent / "final.json").exists():
                print(f"frontier: skipping {ck.parent} (not finished)", file=sys.stderr)
    if not found:
        raise FileNotFoundError(f"no finished run under {', '.join(map(str, paths))} (a run "
                                "folder holds final.json and checkpoint.pt)")
    return sorted(set(found))


def _with_defaults(conf: dict) -> dict:
    """``conf`` with the method's hyperparameters completed by their defaults, so that a run
    written before an option existed equals one that sets it to its default."""
    from dualdrop.nn.sparsifier import default_hparams
    from dualdrop.train.checkpoint import with_new_defaults
    from dualdrop.train.config import DENSE

    try:
        base = default_hparams(conf["method"]) if conf["method"] != DENSE else {}
    except ValueError:  # a method this version does not know: compare as recorded
        base = {}
    return {**conf, "hparams": with_new_defaults(conf.get("hparams", {}), base, conf["method"])}


def _config_key(conf: dict) -> str:
    """What makes two runs seeds of one configuration: everything in the config but the seed
    (and the bookkeeping that differs between seeds: the data split's fingerprint)."""
    skip = {"seed", "data_fingerprint", "threads", "device", "world_size", "data_summary"}
    return json.dumps({k: v for k, v in _with_defaults(conf).items() if k not in skip},
                      sort_keys=True, default=str)


def _group_names(groups: dict) -> dict:
    """``{key: name}``: the method, plus the hyperparameters in which configurations of the
    same method differ (e.g. ``eta-trick [dual=released]``)."""
    by_method: dict = {}
    for key, runs in groups.items():
        by_method.setdefault(runs[0]["config"]["method"], []).append(key)
    names = {}
    for m, keys in by_method.items():
        if len(keys) == 1:
            names[keys[0]] = m
            continue
        confs = {k: _with_defaults(groups[k][0]["config"]) for k in keys}
        flat = {k: {**{n: c.get(n) for n in ("epochs", "lr", "batch_size", "init_from", "model",
                                             "lam_warmup", "lam_layers")},
                    **c.get("hparams", {})} for k, c in confs.items()}
        varying = sorted({n for f in flat.values() for n in f
                          if len({json.dumps(g.get(n), default=str) for g in flat.values()}) > 1})
        for k in keys:
            names[k] = m + " [" + ", ".join(f"{n}={_short(flat[k].get(n))}"
                                            for n in varying) + "]"
    return names


def _short(v) -> str:
    """A value as a label shows it: ``{"fc1": 2.0}`` -> ``fc1:2``, None -> ``off``."""
    if v is None:
        return "off"
    if isinstance(v, dict):
        return ",".join(f"{k}:{x:g}" if isinstance(x, float) else f"{k}:{x}"
                        for k, x in v.items())
    return f"{v:g}" if isinstance(v, float) else str(v)


class _Data:
    """MNIST/digits splits loaded once per (seed, validation fraction) and checked against the
    fingerprint each run recorded."""

    def __init__(self, data_dir, verify: bool):
        self.data_dir, self.verify, self._cache = data_dir, verify, {}

    def __call__(self, conf: dict, run: Path):
        from dualdrop.data import load_dataset

        key = (int(conf.get("seed", 0)), float(conf.get("val_fraction", 0.2)))
        if key not in self._cache:
            self._cache[key] = load_dataset(self.data_dir, seed=key[0], val_fraction=key[1],
                                            verify=self.verify)
        data = self._cache[key]
        if conf.get("data_fingerprint") not in (None, data.fingerprint()):
            where = "--data-dir" if self.data_dir is None else f"--data-dir {self.data_dir}"
            raise ValueError(f"{run} was trained on {conf.get('data', 'other data')}, not on the "
                             f"data loaded with {where}; pass the folder it was trained on")
        return data


def _evaluate(run: Path, tols, data_of, cache: dict, cache_path: Path, nets: dict,
              selected=None):
    """Validation sweep of one run (or, with ``selected``, test errors at those tolerances;
    cached per checkpoint version). ``nets`` keeps each run's rebuilt network between the
    validation and the test pass (one checkpoint read per run)."""
    import torch

    from dualdrop.train.checkpoint import read_checkpoint
    from dualdrop.train.evaluate import error_rate
    from dualdrop.train.export import training_network

    ckp = run / "checkpoint.pt"
    mtime = ckp.stat().st_mtime_ns
    split = "val" if selected is None else "test"
    want = list(tols if selected is None else selected)
    keys = {t: f"{run.resolve()}|{split}|tol={t}" for t in want}
    hit = {t: cache.get(k) for t, k in keys.items()}
    if all(h is not None and h.get("mtime") == mtime for h in hit.values()):
        return {t: h for t, h in hit.items()}
    if nets.get(run, (None,))[0] != mtime:
        ck = read_checkpoint(ckp, fix="rerun that run (delete its folder) or leave it out")
        nets[run] = (mtime, data_of(ck["config"], run), *training_network(ck))
    _, data, model, sp = nets[run]
    model.eval()
    X, y = ((data.X_val, data.y_val) if selected is None else (data.X_test, data.y_test))
    X, y = torch.from_numpy(X), torch.from_numpy(y)
    res = {}
    own = sp.hparams["tol"] if sp is not None and sp.has_tol else None
    try:
        for t in want:
            if t is not None:
                try:
                    sp.set_tol(t)
                except ValueError:  # a tolerance the method cannot express: not a candidate
                    continue
            dens = 1.0 if sp is None else float(sp.density()["total"])
            res[t] = {"error": float(error_rate(model, X, y)), "nonzero_total": dens,
                      "mtime": mtime}
            cache[keys[t]] = res[t]
    finally:
        if own is not None:
            sp.set_tol(own)
    atomic_write_json(cache_path, cache)  # a kill loses at most this run's evaluations
    return res


def frontier_of_runs(paths, out: str | os.PathLike, data_dir=None, tols=RUN_TOLS,
                     by: str = "config", progress: bool = True,
                     verify_data: bool = True) -> dict:
    """The validation-selected frontier of finished runs, averaged over seeds (module doc).

    ``paths``: run folders or folders holding them (e.g. ``OUT/runs`` of ``compare --seeds``);
    ``data_dir``: the MNIST folder they were trained on (None: scikit-learn's digits);
    ``tols``: the tolerances swept on validation; ``by``: ``"config"`` draws each configuration
    (runs differing only in their seed) as its own line, ``"method"`` pools the configurations of
    one method (e.g. several ``lam`` or target sparsities) into one Pareto set per method, each
    point still the seed mean of one configuration. Writes ``OUT/frontier.png/.pdf/.md/.csv`` and
    returns ``{"dataset", "methods": {name: {"frontier": [...], "n_seeds", ...}}, "files",
    "markdown"}``.
    """
    if by not in ("config", "method"):
        raise ValueError(f"--by {by!r}: expected 'config' (one line per configuration) or "
                         "'method' (one Pareto set per method)")
    tols = tuple(sorted({float(t) for t in tols}))
    if not tols or not all(0.0 < t < 1.0 for t in tols):
        raise ValueError(f"--tols {tols}: every tolerance must lie in (0, 1), e.g. --tols 0.05 "
                         "0.5 0.9")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = find_runs(paths)
    groups: dict = {}
    for r in runs:
        conf = read_json(r / "config.json", "rerun or delete that run")
        final = read_json(r / "final.json", "rerun or delete that run")
        groups.setdefault(_config_key(conf), []).append({"dir": r, "config": conf,
                                                         "final": final})
    names = _group_names(groups)
    cache_path = out / EVAL_CACHE
    try:
        cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    except json.JSONDecodeError:
        cache = {}  # a cache is only a cache: recompute
    data_of = _Data(data_dir, verify_data)
    nets: dict = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=2 * len(runs), desc="frontier of runs: validation, then test",
                   unit="run", file=sys.stderr, dynamic_ncols=True)
    # 1. validation: each configuration's seed-mean curve over the tolerances
    cands: dict = {}
    for key, members in sorted(groups.items(), key=lambda kv: names[kv[0]]):
        with_tol = "tol" in members[0]["config"].get("hparams", {})
        grid = tols if with_tol else (None,)
        sweeps = []
        for m in members:
            sweeps.append(_evaluate(m["dir"], grid, data_of, cache, cache_path, nets))
            if bar is not None:
                bar.update(1)
        tol0 = members[0]["config"]["hparams"].get("tol")
        cands[key] = [{"key": key, "tol": t,
                       "val_error": statistics.fmean(s[t]["error"] for s in sweeps),
                       "nonzero_total": statistics.fmean(s[t]["nonzero_total"] for s in sweeps),
                       "tie": 0.0 if t is None or tol0 is None else abs(math.log(t / tol0))}
                      for t in grid if all(t in s for s in sweeps)]
    # 2. selection: per configuration, or per method over all its configurations
    lines: dict = {}
    for key in cands:
        line = groups[key][0]["config"]["method"] if by == "method" else names[key]
        lines.setdefault(line, []).append(key)
    result = {"methods": {}, "dataset": None, "by": by}
    for line, keys in lines.items():
        front = pareto_front([c for k in keys for c in cands[k]])
        # 3. test: each seed of a selected configuration at the selected tolerance, once
        rows = []
        for k in keys:
            chosen = [p["tol"] for p in front if p["key"] == k]
            if not chosen:
                continue
            members = groups[k]
            tests = [_evaluate(m["dir"], tols, data_of, cache, cache_path, nets, selected=chosen)
                     for m in members]
            for p in (p for p in front if p["key"] == k):
                te, te_sd = mean_std([t[p["tol"]]["error"] for t in tests])
                nz, nz_sd = mean_std([t[p["tol"]]["nonzero_total"] for t in tests])
                rows.append({"config": names[k], "n_seeds": len(members), "tol": p["tol"],
                             "val_error": p["val_error"], "val_nonzero_total": p["nonzero_total"],
                             "test_error": te, "test_error_std": te_sd,
                             "test_nonzero_total": nz, "nonzero_std": nz_sd,
                             "per_seed": [{"seed": mm["config"].get("seed"),
                                           "test_error": t[p["tol"]]["error"],
                                           "nonzero_total": t[p["tol"]]["nonzero_total"]}
                                          for mm, t in zip(members, tests)]})
        if bar is not None:
            bar.update(sum(len(groups[k]) for k in keys))
        runs_ = [m for k in keys for m in groups[k]]
        conf0 = runs_[0]["config"]
        seeds = sorted({m["config"].get("seed") for m in runs_})
        result["methods"][line] = {
            "method": conf0["method"], "frontier": rows, "configs": [names[k] for k in keys],
            "n_seeds": min(len(groups[k]) for k in keys), "seeds": seeds,
            "runs": [str(m["dir"]) for m in runs_],
            "n_candidates": sum(len(cands[k]) for k in keys),
            "plan": {"epochs": conf0.get("epochs")}, "n_complete": len(runs_),
            "summary": runs_[0]["final"].get("data")}
        result["dataset"] = result["dataset"] or conf0.get("data")
    if bar is not None:
        bar.close()
    from dualdrop.data.datasets import is_full_mnist

    mnist = all(is_full_mnist(r["summary"]) for r in result["methods"].values())
    result["files"] = [str(p) for p in plot_frontier(result, out, mnist=mnist, seeds=True)]
    result["markdown"] = runs_table(result, out, mnist=mnist, tols=tols)
    result["files"] += [str(out / "frontier.md"), str(out / "frontier.csv")]
    return result


__all__ = ["RUN_TOLS", "find_runs", "frontier_of_runs", "runs_table"]
