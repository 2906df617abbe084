"""``dualdrop prune``: prune the network of a finished run once, from calibration data.

Examples::

    dualdrop sparsify --method none --out runs/dense                      # a trained network
    dualdrop prune --from runs/dense --method sparsegpt --density 0.1 --out runs/dense-sgpt10
    dualdrop prune --from runs/dense --method wanda --pattern 2:4 --finetune-epochs 1 \\
        --out runs/dense-wanda24
    dualdrop prune --from RUN --method sparsegpt --density 0.05 --allocation owl \\
        --data-dir path/to/mnist --out runs/owl5

The output folder is a run folder like ``dualdrop sparsify``'s (``config.json``, ``model.pt``,
``final.json``; ``dualdrop.train.load_run`` reads it) plus ``report.json``, the one-shot report
(per layer: density, layer objective, seconds, memory).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dualdrop.cli import nonneg_int, positive_float, positive_int
from dualdrop.cli.sparsify_cmd import parse_hparams


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "prune",
        help="prune a trained run's network once from calibration data (SparseGPT, Wanda, ...)",
        description="Prune the network of a finished run (dualdrop sparsify, e.g. --method "
        "none) once: every layer in forward order, on its calibration inputs through the "
        "layers already pruned, by a one-shot method (docs/oneshot.md); optionally fine-tune "
        "with the masks held. Writes a run folder that dualdrop.train.load_run reads.",
    )
    p.add_argument("--from", dest="source", required=True, metavar="RUN",
                   help="folder of a finished run whose network is pruned")
    p.add_argument("--method", default="sparsegpt",
                   help="one-shot method: magnitude, wanda, sparsegpt, and the optimization "
                   "methods when installed (default sparsegpt); see --list-methods")
    p.add_argument("--density", type=float, default=None, metavar="D",
                   help="fraction of weights kept over the pruned layers (0 < D <= 1)")
    p.add_argument("--pattern", default=None, metavar="N:M",
                   help="N:M sparsity in every layer instead of --density, e.g. 2:4 or 4:8")
    p.add_argument("--allocation", default="uniform",
                   help="how the density is split over layers: uniform (default), global (one "
                   "magnitude threshold), owl (outlier-weighted), penalty (one penalty level)")
    p.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE",
                   help="a method option (repeatable), e.g. --hp blocksize=64")
    p.add_argument("--allocation-hp", action="append", default=[], metavar="NAME=VALUE",
                   help="an allocation option (repeatable), e.g. --allocation-hp owl_lambda=0.02")
    p.add_argument("--refit", action="store_true",
                   help="refit the kept weights of every row by least squares on the "
                   "calibration data")
    p.add_argument("--calib", type=positive_int, default=1024, metavar="N",
                   help="calibration examples, drawn from the training split with --seed "
                   "(default 1024)")
    p.add_argument("--exclude", action="append", default=None, metavar="PATTERN",
                   help="leave these layers dense (fnmatch on layer names); repeatable")
    p.add_argument("--finetune-epochs", type=nonneg_int, default=0, metavar="E",
                   help="then fine-tune E epochs on the training split with the masks held "
                   "(Adam, linear decay; default 0)")
    p.add_argument("--lr", type=positive_float, default=1e-4,
                   help="fine-tuning learning rate (default 1e-4)")
    p.add_argument("--data-dir", default=None,
                   help="the run's data: the MNIST folder it was trained on (default: the "
                   "embedded digits); checked against the run's data fingerprint")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the MD5 check of the MNIST files (for custom IDX files)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of the calibration draw and the fine-tuning order (default 0)")
    p.add_argument("--out", required=True, help="output folder (must not hold a finished run)")
    p.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch CPU threads (default 1; 0: torch's own choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run, parser=p)


def _typed(value: str):
    """An option value from the command line: int, float, true/false, else the string."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def prune_run(args) -> dict:
    """The work of ``dualdrop prune`` (everything checked before any file is written)."""
    import torch

    from dualdrop.data import load_dataset
    from dualdrop.nn import export_sparse
    from dualdrop.nn.oneshot import get_method, prune_oneshot
    from dualdrop.nn.oneshot.allocation import check_allocation
    from dualdrop.nn.oneshot.methods.base import parse_pattern
    from dualdrop.train import fit, load_run
    from dualdrop.train.checkpoint import atomic_save, atomic_write_json
    from dualdrop.train.evaluate import error_rate

    source, out = Path(args.source), Path(args.out)
    options = {k: _typed(v) for k, v in parse_hparams(args.hp).items()}
    if args.refit:
        options["refit"] = True
    get_method(args.method, **options)                      # the method and its options
    if (args.density is None) == (args.pattern is None):
        raise ValueError("give exactly one of --density D and --pattern N:M")
    if args.pattern is not None:
        parse_pattern(args.pattern)
    alloc_options = {k: _typed(v) for k, v in parse_hparams(args.allocation_hp).items()}
    check_allocation(args.allocation, alloc_options)
    for name, v, low in (("--calib", args.calib, 1), ("--finetune-epochs", args.finetune_epochs, 0),
                         ("--threads", args.threads, 0)):
        if v < low:
            raise ValueError(f"{name} must be >= {low}, got {v}")
    if not args.lr > 0:
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    if (out / "final.json").exists():
        raise FileExistsError(f"--out {out} already holds a finished run; choose another "
                              "folder or remove it")
    if out.resolve() == source.resolve():
        raise ValueError("--out must differ from --from (the source run stays as it is)")
    net = load_run(source)
    src_cfg = json.loads((source / "config.json").read_text())
    src_final = json.loads((source / "final.json").read_text())
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_dataset(args.data_dir, seed=src_cfg.get("seed", 0),
                        val_fraction=src_cfg.get("val_fraction", 0.2), verify=not args.no_verify)
    if src_cfg.get("data_fingerprint") not in (None, data.fingerprint()):
        raise ValueError(f"the data of --data-dir {args.data_dir!r} ({data.name}) is not the "
                         f"data run {source} was trained on ({src_cfg.get('data_summary', '?')});"
                         " pass the same --data-dir")
    Xtr, ytr = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    if args.calib > len(Xtr):
        raise ValueError(f"--calib {args.calib} exceeds the {len(Xtr)} training examples")
    g = torch.Generator().manual_seed(args.seed)
    calib = Xtr[torch.randperm(len(Xtr), generator=g)[:args.calib]]
    Xva, yva = torch.from_numpy(data.X_val), torch.from_numpy(data.y_val)
    Xte, yte = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)

    t0 = time.perf_counter()
    res = prune_oneshot(net, calib, args.method, target_density=args.density,
                        pattern=args.pattern, allocation=args.allocation, options=options,
                        allocation_options=alloc_options,
                        exclude=args.exclude, progress=not args.no_progress)
    oneshot_s = time.perf_counter() - t0
    final = {"status": "finished", "method": f"oneshot:{args.method}", "from": str(source),
             "architecture": src_final.get("architecture"), "data": data.summary(),
             "target": res.report.target, "allocation": args.allocation, "options": options,
             "allocation_options": alloc_options,
             "calib": args.calib, "seed": args.seed, "oneshot_seconds": oneshot_s,
             "val_error_oneshot": error_rate(net, Xva, yva),
             "test_error_oneshot": error_rate(net, Xte, yte),
             "nonzero_total": res.report.density,
             "nonzero": {r["layer"]: r["density"] for r in res.report.layers},
             "objective": res.report.objectives(), "finetune_epochs": args.finetune_epochs}
    out.mkdir(parents=True, exist_ok=True)
    if args.finetune_epochs:
        res.sparsify()
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(Xtr, ytr), batch_size=128, shuffle=True,
            generator=torch.Generator().manual_seed(args.seed))
        t1 = time.perf_counter()
        fit(net, "magnitude", loader,
            lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
            epochs=args.finetune_epochs, lr=args.lr, hparams=res.hparams,
            checkpoint_dir=out / "finetune", progress=not args.no_progress)
        net = export_sparse(net).eval()
        final["finetune_seconds"] = time.perf_counter() - t1
    final["val_error"] = error_rate(net, Xva, yva)
    final["test_error"] = error_rate(net, Xte, yte)
    atomic_write_json(out / "config.json", {
        "method": f"oneshot:{args.method}", "from": str(source), "source_config": src_cfg,
        "density": args.density, "pattern": args.pattern, "allocation": args.allocation,
        "allocation_options": alloc_options,
        "options": options, "calib": args.calib, "seed": args.seed, "exclude": args.exclude,
        "finetune_epochs": args.finetune_epochs, "lr": args.lr,
        "model": src_cfg.get("model"), "n_features": src_cfg.get("n_features"),
        "data_fingerprint": src_cfg.get("data_fingerprint")})
    atomic_write_json(out / "report.json", res.report.to_dict())
    atomic_save(net.state_dict(), out / "model.pt")
    atomic_write_json(out / "final.json", final)
    return final


def run(args) -> int:
    final = prune_run(args)
    tail = (f"; after {final['finetune_epochs']} epoch(s) of fine-tuning "
            f"{100 * final['test_error']:.2f}%" if final["finetune_epochs"] else "")
    print(f"{final['method']} ({final['target']}, allocation {final['allocation']}): "
          f"{final['nonzero_total']:.4f} nonzero, test error "
          f"{100 * final['test_error_oneshot']:.2f}% in {final['oneshot_seconds']:.1f} s{tail}; "
          f"outputs in {args.out}")
    print(f"  in Python: dualdrop.train.load_run({str(args.out)!r})", file=sys.stdout)
    return 0
