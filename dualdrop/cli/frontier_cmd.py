"""``dualdrop frontier``: sweep each method's sparsity knob on validation, draw the frontier.

Examples::

    dualdrop frontier --methods logsum magnitude --n-trials 6 --epochs 20 --out runs/frontier
    dualdrop frontier --methods vardrop-lr-ar --n-trials 12 --epochs 200 --data-dir data/mnist \
        --init-from runs/dense --hp vardrop-lr-ar:lr=1e-3 --workers 2 --out runs/frontier
    dualdrop frontier --out runs/frontier --report-only      # redraw from the study
    dualdrop frontier --from-runs runs/compare/runs --data-dir data/mnist   # finished runs,
                                 # over seeds, the test-time tolerance as the knob; no training

Resumable and shareable: run the same command again (here or on another machine sharing the
folder) to continue or to add processes; ``--n-trials`` larger than before adds trials.
"""

from __future__ import annotations

from dualdrop.cli import UsageError, fraction, nonneg_int, positive_float, positive_int


def _parse_ranges(items) -> dict:
    """``["logsum:lam=1e-4:1e-2"]`` -> ``{"logsum": Knob("lam", 1e-4, 1e-2)}``."""
    from dualdrop.train.experiments.frontier import Knob

    out = {}
    for item in items or []:
        head, sep, rng = item.partition("=")
        method, sep2, name = head.rpartition(":")
        lo, sep3, hi = rng.partition(":")
        if not (sep and sep2 and sep3 and method and name):
            raise ValueError(f"--range {item!r}: expected METHOD:NAME=LOW:HIGH, e.g. "
                             "--range logsum:lam=1e-4:1e-2")
        try:
            low, high = float(lo), float(hi)
        except ValueError:
            raise ValueError(f"--range {item!r}: LOW and HIGH must be numbers") from None
        if method in out:
            raise ValueError(f"--range names {method!r} twice (one knob per method)")
        complement = name == "sparsity"  # a target sparsity is searched as a log density
        out[method] = Knob(name, low, high, log=True, complement=complement)
    return out


def _knobs(args) -> dict:
    """``--range`` knobs, and the target density for every other method with
    ``--target-density``."""
    from dualdrop.train.experiments.compare import DEFAULT_METHODS
    from dualdrop.train.experiments.frontier import target_density_knob

    knobs = _parse_ranges(args.range)
    if args.target_density is not None:
        lo, sep, hi = args.target_density.partition(":")
        try:
            if not sep:
                raise ValueError
            low, high = float(lo), float(hi)
        except ValueError:
            raise ValueError(f"--target-density {args.target_density!r}: expected LOW:HIGH, "
                             "e.g. --target-density 0.005:0.2") from None
        for m in args.methods or DEFAULT_METHODS:
            knobs.setdefault(m, target_density_knob(low, high))
    return knobs


def _parse_fixed(items) -> dict:
    """``["vardrop-lr-ar:lr=1e-3"]`` -> ``{"vardrop-lr-ar": {"lr": "1e-3"}}``."""
    out: dict = {}
    for item in items or []:
        head, sep, value = item.partition("=")
        method, sep2, name = head.rpartition(":")
        if not (sep and sep2 and method and name):
            raise ValueError(f"--hp {item!r}: expected METHOD:NAME=VALUE, e.g. "
                             "--hp vardrop-lr-ar:lr=1e-3")
        if name in out.setdefault(method, {}):
            raise ValueError(f"--hp {method}:{name} given twice")
        if name == "lr":
            try:
                out[method][name] = float(value)
            except ValueError:
                raise ValueError(f"--hp {item!r}: lr must be a number") from None
        else:
            out[method][name] = value
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "frontier",
        help="sweep each method's sparsity knob on validation; draw test error vs density",
        description="Sweep each method's sparsity knob (lam / KL weight / target sparsity, the "
        "test-time tolerance, and with --init-from a warm start or not) on the validation split "
        "through an Optuna study in OUT/study.journal (several processes or machines may share "
        "it); every trial is a sparsify run in OUT/trials/<method>/<trial-id>. Then select each "
        "method's Pareto set on (validation error, fraction nonzero), read the test error once "
        "per selected point, and write OUT/frontier.png/.pdf/.md/.csv.",
    )
    p.add_argument("--methods", nargs="+", default=None,
                   help="methods to sweep (default: the paper's seven plus hardconcrete and "
                   "magnitude)")
    p.add_argument("--out", "--study", dest="out", default=None,
                   help="frontier folder holding the study and the trials (default "
                   "runs/frontier; with --from-runs: DIR/frontier of the first DIR)")
    p.add_argument("--from-runs", nargs="+", default=None, metavar="DIR",
                   help="train nothing: the frontier of the finished runs under DIR (e.g. "
                   "OUT/runs of 'compare --seeds'), the test-time tolerance swept on validation, "
                   "seeds of one configuration averaged (mean ± std); needs the --data-dir the "
                   "runs were trained on")
    p.add_argument("--by", choices=("config", "method"), default=None,
                   help="with --from-runs: one line per configuration (runs differing only in "
                   "--seed; default) or one Pareto set per method over its configurations")
    p.add_argument("--tols", nargs="+", type=fraction, default=None, metavar="TOL",
                   help="with --from-runs: the tolerances swept on validation (default 0.01 "
                   "0.02 0.05 0.1 ... 0.9 0.95)")
    p.add_argument("--n-trials", type=positive_int, default=8,
                   help="trials per method in the study; a larger number later adds trials "
                   "(default 8)")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="processes started by this command (default 1); running the command "
                   "again elsewhere adds more")
    p.add_argument("--range", action="append", default=[], metavar="METHOD:NAME=LOW:HIGH",
                   help="the knob of a method and its range (log scale), e.g. "
                   "logsum:lam=1e-4:1e-2 or magnitude:sparsity=0.8:0.995 (default: a decade "
                   "either side of the default lam; magnitude: sparsity 0.8..0.995)")
    p.add_argument("--target-density", nargs="?", const="0.005:0.2", default=None,
                   metavar="LOW:HIGH",
                   help="make the finished network's density the knob of every method "
                   "(sparsify --target-density), searched in log scale on LOW:HIGH (default "
                   "0.005:0.2); --range METHOD:target_density=LOW:HIGH does it for one method")
    p.add_argument("--hp", action="append", default=[], metavar="METHOD:NAME=VALUE",
                   help="a hyperparameter fixed for every trial of a method (repeatable), e.g. "
                   "vardrop-lr-ar:lr=1e-3")
    p.add_argument("--sampler", default="qmc", choices=("qmc", "tpe", "random"),
                   help="Optuna sampler (default qmc: a scrambled Sobol sequence, even coverage)")
    p.add_argument("--stale-after", type=positive_float, default=900.0, metavar="S",
                   help="re-queue a running trial of another machine after S seconds without "
                   "heartbeat (default 900; on this machine a dead process is seen at once)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: select, evaluate and draw from the study in --out")
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="epochs of every trial (default: the data's, as for sparsify: 200, the "
                   "paper's protocol, on MNIST; 30 on the embedded digits)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="learning rate of every method (default: each method's own on this "
                   "data, as for sparsify; --hp METHOD:lr=VALUE sets one method's)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="batch size of every trial (default: the data's, as for sparsify: 128 "
                   "on MNIST, 32 on the embedded digits)")
    p.add_argument("--data-dir", default=None,
                   help="MNIST IDX folder (default: scikit-learn's embedded 8x8 digits)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of every trial (default 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch CPU threads per worker (default 1)")
    p.add_argument("--init-from", default=None, metavar="RUN",
                   help="a finished dense run (dualdrop sparsify --method none); each trial then "
                   "also chooses between a random start and a warm start from it")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the MD5 check of the MNIST files (for custom IDX files)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run, parser=p, interrupt_hint="finished trials are in the study; "
                   "continue with the same command (an interrupted trial resumes from its last "
                   "epoch)")


def _from_runs(args) -> dict:
    from pathlib import Path

    from dualdrop.train.experiments.frontier.runs import RUN_TOLS, frontier_of_runs

    parser = args.parser  # every training option set away from its default is refused
    ignored = [f"--{n.replace('_', '-')}" for n in
               ("methods", "init_from", "report_only", "range", "hp", "n_trials", "workers",
                "sampler", "stale_after", "epochs", "lr", "batch_size", "seed", "device",
                "threads")
               if getattr(args, n) != parser.get_default(n)]
    if ignored:
        raise ValueError(f"--from-runs draws finished runs and trains nothing; drop "
                         f"{', '.join(ignored)}")
    out = args.out if args.out is not None else Path(args.from_runs[0]) / "frontier"
    return frontier_of_runs(args.from_runs, out, data_dir=args.data_dir,
                            tols=args.tols if args.tols else RUN_TOLS, by=args.by or "config",
                            progress=not args.no_progress, verify_data=not args.no_verify)


def run(args) -> int:
    from dualdrop.train.experiments.frontier import DEFAULT_METHODS, run_frontier

    if args.from_runs:
        result = _from_runs(args)
        print(result["markdown"])
        print("files: " + ", ".join(result["files"]))
        return 0
    if args.tols or args.by:
        option = "--tols" if args.tols else "--by"
        raise UsageError(f"{option} goes with --from-runs (a study sweeps the tolerances of the "
                         "training loop, per method)", option)
    result = run_frontier(
        methods=args.methods or DEFAULT_METHODS,
        out=args.out if args.out is not None else "runs/frontier", n_trials=args.n_trials,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        data_dir=args.data_dir, seed=args.seed, device=args.device,
        threads=args.threads, workers=args.workers, init_from=args.init_from,
        knobs=_knobs(args), fixed=_parse_fixed(args.hp), sampler=args.sampler,
        verify_data=not args.no_verify, stale_after=args.stale_after,
        progress=not args.no_progress, report_only=args.report_only)
    print(result["markdown"])
    print("files: " + ", ".join(result["files"]))
    return 0
