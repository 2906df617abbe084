"""``dualdrop compare``: train several methods, draw the paper's Figure 2 and the table.

Example::

    dualdrop compare --methods vardrop-lr logsum magnitude --epochs 200 \
        --data-dir data/mnist --out runs/compare
    dualdrop compare --methods logsum magnitude --out runs/digits     # embedded digits, seconds
    dualdrop compare --methods logsum magnitude --seeds 0 1 2 --out runs/digits3  # error bars

Resumable: the same command again (``--resume`` says so explicitly) continues; finished runs
are skipped, unfinished ones continue exactly from their last checkpoint.
"""

from __future__ import annotations

import os
import sys

from dualdrop.cli import fraction, nonneg_int


def register(subparsers) -> None:
    from dualdrop.cli.sparsify_cmd import _friendly, add_common

    p = _friendly(subparsers.add_parser(
        "compare",
        help="train several sparsification methods and compare them (the paper's Figure 2 + "
        "table)",
        description="Train each method (each with its defaults for the data: the paper's on "
        "MNIST) into OUT/runs/<method>, resuming unfinished runs and skipping finished ones, "
        "then write OUT/figure2.png/.pdf (fraction of nonzero weights and validation error vs "
        "epoch) and OUT/table.md/.csv (end-of-training test error and fraction nonzero; beside "
        "the paper's table only for runs on all of MNIST).",
    ))
    p.add_argument("--methods", nargs="+", default=None,
                   help="methods to compare (default: the paper's seven plus hardconcrete and "
                   "magnitude)")
    p.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    p.add_argument("--resume", action="store_true",
                   help="continue the comparison in --out: finished runs are skipped, unfinished "
                   "ones continue exactly from their last checkpoint (compare always does this; "
                   "the flag states it)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: draw the figure and table from the runs already in --out "
                   "(finished or not), e.g. while a long comparison is still running")
    add_common(p)
    p.add_argument("--target-density", type=fraction, default=None, metavar="D",
                   help="every method's finished network keeps this fraction of nonzero weights "
                   "(0 < D <= 1; dualdrop.nn.density): a comparison at matched density")
    p.add_argument("--seeds", nargs="+", type=nonneg_int, default=None, metavar="SEED",
                   help="train every method once per seed into OUT/runs/<method>/seed<k> "
                   "(method by method) and report mean ± standard deviation over the finished "
                   "seeds, e.g. --seeds 0 1 2; replaces --seed")
    p.set_defaults(func=run, interrupt_hint=lambda exc: (f"{exc}; " if str(exc) else "")
                   + "every finished epoch is checkpointed; continue with the same command "
                   "(and --resume)")


def run(args) -> int:
    from dualdrop.train.experiments.compare import (
        DEFAULT_METHODS,
        comparison_table,
        load_runs,
        plot_comparison,
        run_comparison,
    )

    methods = args.methods or DEFAULT_METHODS
    if args.report_only:
        runs = load_runs(args.out, methods)
        if not runs:
            raise FileNotFoundError(f"no runs with a history.json under {args.out}/runs")
        plot_comparison(runs, args.out)
        comparison_table(runs, args.out)
    else:
        from dualdrop.cli.sparsify_cmd import check_tol_margin
        from dualdrop.train import check_method

        without = check_tol_margin(args.select_tol_margin, [check_method(m) for m in methods])
        if without:
            print(f"dualdrop compare: warning: --select-tol-margin applies to methods with a "
                  f"test-time keep-ratio tolerance; {', '.join(without)} have none and report "
                  "no selected tolerance", file=sys.stderr)
        run_comparison(
            methods=methods, epochs=args.epochs, out=args.out,
            data_dir=args.data_dir, seed=args.seed, device=args.device,
            threads=args.threads, progress=not args.no_progress,
            stop_after=args.stop_after, flush_denormal=not args.keep_denormals,
            select_tol_margin=args.select_tol_margin, init_from=args.init_from,
            seeds=args.seeds, target_density=args.target_density,
        )
    if os.environ.get("RANK", "0") == "0":
        print((open(os.path.join(args.out, "table.md")).read()))
        print(f"figure: {os.path.join(args.out, 'figure2.png')} (and .pdf)")
    return 0
