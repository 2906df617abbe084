"""``dualdrop sparsify``: train LeNet-300-100 with one sparsification method.

Examples::

    dualdrop sparsify --method vardrop-lr --epochs 200 --data-dir ../shared/mnist --out runs/vdlr
    dualdrop sparsify --method logsum --epochs 5 --out runs/digits-logsum     # embedded digits
    dualdrop sparsify --method logsum --epochs 200 --out runs/ls --resume     # continue a run
    torchrun --standalone --nproc_per_node 2 -m dualdrop sparsify --method logsum ...
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_hparams(items) -> dict:
    """``["lam=1e-3", "eps=2"]`` -> ``{"lam": "1e-3", "eps": "2"}`` (typed later by the method)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--hp {item!r}: expected NAME=VALUE, e.g. --hp lam=1e-3")
        if key in out:
            raise ValueError(f"--hp {key} given twice")
        out[key] = value
    return out


def add_common(p: argparse.ArgumentParser) -> None:
    """Options shared by ``sparsify`` and ``compare``."""
    p.add_argument("--epochs", type=int, default=200,
                   help="epochs; the learning rate decays linearly to 0 over all of them "
                   "(default 200, the seed's protocol)")
    p.add_argument("--data-dir", default=None,
                   help="folder with the MNIST IDX files (gzip or not; also DIR/MNIST/raw). "
                   "Default: scikit-learn's embedded 8x8 digits (64 input features)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initialization, the train/validation split, the data order "
                   "and the noise (default 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per process (default: torch's choice)")
    p.add_argument("--stop-after", type=int, default=None, metavar="EPOCH",
                   help="stop (checkpointed) after this epoch; continue later with --resume")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--init-from", default=None, metavar="RUN",
                   help="warm start: initialize the weights from the test-time network of the "
                   "run in folder RUN (e.g. a dense run: --method none), then sparsify")
    p.add_argument("--select-tol-margin", type=float, default=None, metavar="M",
                   help="after training, also report the sparsest test-time keep-ratio "
                   "tolerance whose validation error is at most M (absolute, e.g. 0.001) above "
                   "the trained one, with its test error (final.json 'selected_tol'; methods "
                   "with a tol only)")
    p.add_argument("--keep-denormals", action="store_true",
                   help="do not flush subnormal floats to zero while training (flushing is the "
                   "default: shrinking weights otherwise slow CPU training by orders of magnitude)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sparsify",
        help="train LeNet-300-100 with one sparsification method",
        description="Train LeNet-300-100 (Adam, batch 128, linear learning-rate decay to 0) with "
        "one sparsification method of dualdrop.nn; write per-epoch history (JSON, CSV), a "
        "checkpoint every epoch and the end-of-training test error to --out.",
    )
    p.add_argument("--method", required=True,
                   help="vardrop, vardrop-lr, vardrop-lr-ar, hardconcrete, hardconcrete-neuron, "
                   "magnitude, eta-trick, adaprox, adatikhonov, logsum, penalty:<name>, or none "
                   "(dense baseline)")
    p.add_argument("--out", default=None, help="output folder (default runs/sparsify/<method>)")
    p.add_argument("--resume", action="store_true",
                   help="continue from --out/checkpoint.pt (exactly); start fresh if absent")
    p.add_argument("--lr", type=float, default=None,
                   help="initial learning rate (default: the method's seed default)")
    p.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE",
                   help="override a method hyperparameter (repeatable); see --list-hparams")
    p.add_argument("--batch-size", type=int, default=128, help="global batch size (default 128)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the MD5 check of the MNIST files (for custom IDX files)")
    p.add_argument("--list-hparams", action="store_true",
                   help="print the method's default hyperparameters and exit")
    add_common(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from dualdrop.train import TrainConfig, check_method, resolve_hparams, train

    try:
        method = check_method(args.method)
        overrides = parse_hparams(args.hp)
        lr, hp = resolve_hparams(method, args.lr, overrides)
        if args.list_hparams:
            print(json.dumps({"lr": lr, **hp}, indent=1, default=repr))
            return 0
        cfg = TrainConfig(
            method=method, epochs=args.epochs,
            out=args.out or f"runs/sparsify/{method.replace(':', '_')}",
            data_dir=args.data_dir, seed=args.seed, device=args.device, lr=args.lr,
            hparams=overrides, batch_size=args.batch_size, resume=args.resume,
            stop_after=args.stop_after, progress=not args.no_progress, threads=args.threads,
            verify_data=not args.no_verify, flush_denormal=not args.keep_denormals,
            select_tol_margin=args.select_tol_margin, init_from=args.init_from,
        )
        report = train(cfg)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, ImportError) as exc:
        print(f"dualdrop sparsify: error: {exc}", file=sys.stderr)
        return 2
    if report.get("status") == "stopped":
        print(f"stopped after epoch {report['epoch']}; continue with --resume "
              f"(outputs in {report['out']})")
        return 0
    import os

    if os.environ.get("RANK", "0") == "0":
        print(f"{report['method']}: test error {100 * report['test_error']:.2f}% at "
              f"{report['nonzero_total']:.4f} nonzero weights after {report['epochs']} epochs "
              f"(validation error {100 * report['val_error']:.2f}%); outputs in {cfg.out}")
        sel = report.get("selected_tol") or {}
        if "test_error" in sel:
            print(f"  selected on validation: tol={sel['tol']:g}: test error "
                  f"{100 * sel['test_error']:.2f}% at {sel['nonzero_total']:.4f} nonzero weights "
                  f"(validation error {100 * sel['val_error']:.2f}%)")
    return 0
