"""Compare sparsification methods: train several, draw the paper's Figure 2, tabulate.

The paper (LeJeune, Javadi, Baraniuk, "The Flip Side of the Reweighted Coin: Duality of Adaptive
Dropout and Regularization", NeurIPS 2021) compares seven methods on LeNet-300-100 / MNIST: its
Figure 2 draws the fraction of nonzero weights and the validation error against the epoch, its
table the end-of-training test error and fraction of nonzero weights. :func:`run_comparison`
trains every method into ``out/runs/<method>/`` with :func:`~dualdrop.train.train` and
``resume=True``, so that an interrupted comparison continues where it stopped and finished runs
are skipped. :func:`plot_comparison` draws the figure (PNG and PDF), :func:`comparison_table`
writes the table as Markdown and CSV, beside the paper's numbers when, and only when, every run
is on all of MNIST (the paper's data).

Several seeds (``seeds=[0, 1, 2]``) put each method's runs in ``out/runs/<method>/seed<k>/``
(the seed drives the initialization, the train/validation split, the data order and the noise);
the table then reports the mean and the sample standard deviation over the finished seeds, and
the figure draws the mean curve with the band between the smallest and largest seed.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from dualdrop.nn.registry import compare_defaults
from dualdrop.train.checkpoint import RunLockedError, read_json
from dualdrop.train.config import DENSE, TrainConfig, check_method
from dualdrop.train.loop import train
from dualdrop.train.report.figures import plot_comparison
from dualdrop.train.report.references import PAPER_TABLE, method_label
from dualdrop.train.report.tables import comparison_table

# The comparison: the paper's seven methods plus hard-concrete and magnitude pruning.
# (each method's record: Method.compare_rank)
DEFAULT_METHODS = compare_defaults()


def run_dir(out: str | os.PathLike, method: str, seed: int | None = None) -> Path:
    """Folder of one method's run inside a comparison folder (``seed``: a multi-seed comparison's
    run of that seed)."""
    d = Path(out) / "runs" / method.replace(":", "_").replace("/", "_")
    return d if seed is None else d / f"seed{seed}"


def check_seeds(seeds) -> list[int] | None:
    """``seeds`` as a list of distinct non-negative ints (None: a single-seed comparison)."""
    if seeds is None:
        return None
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty; give at least one seed, e.g. seeds=[0, 1, 2]")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise TypeError(f"seeds={seeds!r}: every seed must be a non-negative int")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={seeds!r} lists a seed twice")
    return seeds


def run_comparison(
    methods=DEFAULT_METHODS,
    epochs: int | None = None,
    out: str | os.PathLike = "runs/compare",
    data_dir: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    data=None,
    flush_denormal: bool = True,
    select_tol_margin: float | None = None,
    init_from: str | None = None,
    seeds=None,
    target_density: float | None = None,
) -> dict:
    """Train each method (resumable), then write the figure and the table.

    Returns ``{method: report}`` (the final report, a ``"stopped"`` record when ``stop_after`` <
    ``epochs``, or a ``"locked"`` record when another process is training that method into the
    same folder: several processes may thus share one comparison). Unknown methods are refused
    before any training starts. ``epochs`` None: the dataset's default (200 on MNIST).
    ``select_tol_margin``: see :class:`TrainConfig` (the table then also shows the
    validation-selected tolerance's test error and density); ``init_from``: every method
    warm-starts from that run's test-time network. ``seeds``: train every method once per seed
    (method by method, so that each method's error bars are complete before the next starts)
    into ``out/runs/<method>/seed<k>``; the result is then ``{method: {seed: report}}`` and
    ``seed`` is ignored. ``target_density``: every method's finished network keeps this fraction
    of its weights (``dualdrop.nn.density``), a comparison at matched density.
    """
    seeds = check_seeds(seeds)
    methods = [check_method(m) for m in methods]
    if not methods:
        raise ValueError("methods is empty; name at least one method, e.g. vardrop-lr logsum")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods={methods!r} lists a method twice")
    out = Path(out)
    if seeds is not None and data is not None:
        raise ValueError("data= is one seed's split; with seeds= every seed loads its own split "
                         "from data_dir (drop data=)")
    base = TrainConfig(epochs=epochs, data_dir=data_dir, seed=seed, device=device,
                       threads=threads, progress=progress, stop_after=stop_after, resume=True,
                       flush_denormal=flush_denormal, select_tol_margin=select_tol_margin,
                       init_from=init_from, target_density=target_density)
    datasets = {}

    def dataset(s):
        if data is not None:
            return data
        if s not in datasets:
            from dualdrop.data import load_dataset

            datasets.clear()  # one split in memory at a time
            datasets[s] = load_dataset(data_dir, seed=s)
        return datasets[s]

    def one(m, s, folder):
        cfg = dataclasses.replace(base, method=m, seed=s, out=str(folder))
        try:
            return train(cfg, data=dataset(s))
        except RunLockedError as exc:  # another process trains it right now: go on with the rest
            print(f"skipping {folder}: {exc}", file=sys.stderr)
            return {"status": "locked", "method": m, "message": str(exc)}

    reports = {}
    for m in methods:
        if seeds is None:
            reports[m] = one(m, seed, run_dir(out, m))
        else:
            reports[m] = {s: one(m, s, run_dir(out, m, s)) for s in seeds}
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        runs = load_runs(out, methods)
        plot_comparison(runs, out)
        comparison_table(runs, out)
    return reports


def _load_run(d: Path) -> dict | None:
    hist = d / "history.json"
    if not hist.exists():
        return None
    fix = f"rerun that method (or delete {d})"
    final = read_json(d / "final.json", fix) if (d / "final.json").exists() else None
    data = (final or {}).get("data")
    if data is None and (d / "config.json").exists():
        data = read_json(d / "config.json", fix).get("data_summary")
    return {"history": read_json(hist, fix, kind=list), "final": final, "data": data}


def load_runs(out: str | os.PathLike, methods) -> dict:
    """``{method: {"history": [...], "final": {...} or None, "data": summary or None}}`` for the
    runs present in ``out``.

    A method whose folder holds ``seed<k>/`` runs (a multi-seed comparison) gets the same keys
    for its lowest seed plus ``"seeds": {k: run}`` with every seed's run.
    """
    runs = {}
    for m in methods:
        d = run_dir(out, m)
        run = _load_run(d)
        if run is None:
            per_seed = {}
            for sd in sorted(d.glob("seed*"), key=lambda p: p.name):
                if sd.name[4:].isdigit() and (r := _load_run(sd)) is not None:
                    per_seed[int(sd.name[4:])] = r
            if per_seed:
                run = dict(per_seed[min(per_seed)], seeds=dict(sorted(per_seed.items())))
        if run is not None:
            runs[m] = run
    return runs


__all__ = ["DEFAULT_METHODS", "DENSE", "PAPER_TABLE", "check_seeds", "comparison_table",
           "load_runs", "method_label", "plot_comparison", "run_comparison", "run_dir"]
