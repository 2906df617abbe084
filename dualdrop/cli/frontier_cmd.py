"""``dualdrop frontier``: sweep each method's sparsity knob on validation, draw the frontier.

Examples::

    dualdrop frontier --methods logsum magnitude --n-trials 6 --epochs 20 --out runs/frontier
    dualdrop frontier --methods vardrop-lr-ar --n-trials 12 --epochs 200 --data-dir data/mnist \
        --init-from runs/dense --hp vardrop-lr-ar:lr=1e-3 --workers 2 --out runs/frontier
    dualdrop frontier --out runs/frontier --report-only      # redraw from the study

Resumable and shareable: run the same command again (here or on another machine sharing the
folder) to continue or to add processes; ``--n-trials`` larger than before adds trials.
"""

from __future__ import annotations

import sys


def _parse_ranges(items) -> dict:
    """``["logsum:lam=1e-4:1e-2"]`` -> ``{"logsum": Knob("lam", 1e-4, 1e-2)}``."""
    from dualdrop.train.frontier import Knob

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
    p.add_argument("--out", "--study", dest="out", default="runs/frontier",
                   help="frontier folder holding the study and the trials (default runs/frontier)")
    p.add_argument("--n-trials", type=int, default=8,
                   help="trials per method in the study; a larger number later adds trials "
                   "(default 8)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes started by this command (default 1); running the command "
                   "again elsewhere adds more")
    p.add_argument("--range", action="append", default=[], metavar="METHOD:NAME=LOW:HIGH",
                   help="the knob of a method and its range (log scale), e.g. "
                   "logsum:lam=1e-4:1e-2 or magnitude:sparsity=0.8:0.995 (default: a decade "
                   "either side of the default lam; magnitude: sparsity 0.8..0.995)")
    p.add_argument("--hp", action="append", default=[], metavar="METHOD:NAME=VALUE",
                   help="a hyperparameter fixed for every trial of a method (repeatable), e.g. "
                   "vardrop-lr-ar:lr=1e-3")
    p.add_argument("--sampler", default="qmc", choices=("qmc", "tpe", "random"),
                   help="Optuna sampler (default qmc: a scrambled Sobol sequence, even coverage)")
    p.add_argument("--stale-after", type=float, default=900.0, metavar="S",
                   help="re-queue a running trial of another machine after S seconds without "
                   "heartbeat (default 900; on this machine a dead process is seen at once)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: select, evaluate and draw from the study in --out")
    p.add_argument("--epochs", type=int, default=200,
                   help="epochs of every trial (default 200, the paper's protocol)")
    p.add_argument("--data-dir", default=None,
                   help="MNIST IDX folder (default: scikit-learn's embedded 8x8 digits)")
    p.add_argument("--seed", type=int, default=0, help="seed of every trial (default 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads per worker (default 1)")
    p.add_argument("--init-from", default=None, metavar="RUN",
                   help="a finished dense run (dualdrop sparsify --method none); each trial then "
                   "also chooses between a random start and a warm start from it")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the MD5 check of the MNIST files (for custom IDX files)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    from dualdrop.train.frontier import DEFAULT_METHODS, run_frontier

    try:
        result = run_frontier(
            methods=args.methods or DEFAULT_METHODS, out=args.out, n_trials=args.n_trials,
            epochs=args.epochs, data_dir=args.data_dir, seed=args.seed, device=args.device,
            threads=args.threads, workers=args.workers, init_from=args.init_from,
            knobs=_parse_ranges(args.range), fixed=_parse_fixed(args.hp), sampler=args.sampler,
            verify_data=not args.no_verify, stale_after=args.stale_after,
            progress=not args.no_progress, report_only=args.report_only)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, ImportError) as exc:
        print(f"dualdrop frontier: error: {exc}", file=sys.stderr)
        return 2
    print(result["markdown"])
    print("files: " + ", ".join(result["files"]))
    return 0
