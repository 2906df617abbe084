"""``dualdrop penalties``: effective-penalty curves as CSV and the paper's two-panel figure."""

from __future__ import annotations

from dualdrop.cli import UsageError, int_at_least, out_dir, positive_float, positive_int


def register(sub):
    p = sub.add_parser(
        "penalties",
        help="compute and plot effective penalties (CSV + PNG/PDF)",
        description="Write penalties.csv (column w and one per penalty), nnz_curve.csv and the "
        "two-panel figure penalties.png/.pdf. Specs: name[:key=value,...][@lambda], e.g. "
        "'logsum:eps=2@2', 'mcp:a=0.5,lam=1.41421356@1.41421356', 'hard_threshold:k=16'. "
        "Without --penalties: the five penalties of the paper's figure plus HardThresh(16).",
    )
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--penalties", nargs="+", metavar="SPEC", default=None, help="penalty specs to draw")
    p.add_argument("--w-min", type=positive_float, default=0.01,
                   help="smallest |w| of the left panel (default 0.01)")
    p.add_argument("--w-max", type=positive_float, default=5.0,
                   help="largest |w| of the left panel (default 5)")
    p.add_argument("--points", type=int_at_least(2), default=500,
                   help="number of w values (default 500)")
    p.add_argument("--dim", type=positive_int, default=32,
                   help="vector dimension d of the right panel (default 32)")
    p.set_defaults(func=run)


def run(args) -> int:
    from penalties import curves

    specs = None if args.penalties is None else [curves.parse_spec(s) for s in args.penalties]
    if args.w_min >= args.w_max:
        raise UsageError(f"--w-min {args.w_min:g} must be below --w-max {args.w_max:g}")
    out_dir(args.out)
    res = curves.penalty_figure(args.out, specs, w_min=args.w_min, w_max=args.w_max, n=args.points, d=args.dim)
    print(curves.format_table(curves.comparison_table(specs)))
    for f in res["files"]:
        print(f"wrote {f}")
    return 0
