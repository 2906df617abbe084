"""``dualdrop sparsify``: train LeNet-300-100 with one sparsification method.

Examples::

    dualdrop sparsify --method vardrop-lr --epochs 200 --data-dir data/mnist --out runs/vdlr
    dualdrop sparsify --method logsum --out runs/digits-logsum     # embedded digits, seconds
    dualdrop sparsify --method logsum --epochs 200 --out runs/ls --resume     # continue a run
    torchrun --standalone --nproc_per_node 2 -m dualdrop sparsify --method logsum ...
"""

from __future__ import annotations

import argparse
import json
import re

from dualdrop.cli import (UsageError, doc_summary, fraction, int_at_least, method_list,
                          nonneg_float, nonneg_int, positive_int)


def parse_hparams(items, flag: str = "--hp", example: str = "lam=1e-3") -> dict:
    """``["lam=1e-3", "eps=2"]`` -> ``{"lam": "1e-3", "eps": "2"}`` (typed later by the method);
    ``flag`` and ``example`` name the option in messages."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected NAME=VALUE, e.g. {flag} {example}")
        if key in out:
            raise ValueError(f"{flag} {key} given twice")
        out[key] = value
    return out


_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _friendly(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Let ``p`` read negative numbers in any notation as values (``--lr -1e-3`` is then a
    value, refused with a clear message by the validation, instead of an unknown option), and
    hint at ``--opt=VALUE`` when an option still misses its value."""
    p._negative_number_matcher = _NUMBER
    plain_error = p.error

    def error(message: str):
        if "expected one argument" in message:
            message += " (a value that starts with '-' can be attached: e.g. --lr=-1e-3)"
        plain_error(message)

    p.error = error
    return p


def add_common(p: argparse.ArgumentParser) -> None:
    """Options shared by ``sparsify`` and ``compare``."""
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="epochs; the learning rate decays linearly to 0 over all of them "
                   "(default: 200 on MNIST, the paper's protocol; 30 on the embedded digits)")
    p.add_argument("--data-dir", default=None,
                   help="folder with the MNIST IDX files (gzip or not; also DIR/MNIST/raw). "
                   "Default: scikit-learn's embedded 8x8 digits (64 input features)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of the initialization, the train/validation split, the data order "
                   "and the noise (default 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=nonneg_int, default=None,
                   help="torch CPU threads per process (default: half the cores, shared among "
                   "torchrun processes, 1 to 4; 0: torch's own choice, one per core). More "
                   "threads than free cores can make training tens of times slower")
    p.add_argument("--stop-after", type=positive_int, default=None, metavar="EPOCH",
                   help="stop (checkpointed) after this epoch; continue later with --resume")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--init-from", default=None, metavar="RUN",
                   help="warm start: initialize the weights from the test-time network of the "
                   "run in folder RUN (e.g. a dense run: --method none), then sparsify")
    p.add_argument("--select-tol-margin", type=nonneg_float, default=None, metavar="M",
                   help="after training, also report the sparsest test-time keep-ratio "
                   "tolerance whose validation error is at most M (absolute, e.g. 0.001) above "
                   "the trained one, with its test error (final.json 'selected_tol'; methods "
                   "with a tol only)")
    p.add_argument("--keep-denormals", action="store_true",
                   help="do not flush subnormal floats to zero while training (flushing is the "
                   "default: shrinking weights otherwise slow CPU training by orders of magnitude)")


def register(subparsers) -> None:
    from dualdrop.nn.registry import METHODS
    from dualdrop.train.models import MODELS

    p = _friendly(subparsers.add_parser(
        "sparsify",
        help="train LeNet-300-100 (or LeNet-5, a ResNet, a Transformer) with one "
        "sparsification method",
        description="Train a network (--model: LeNet-300-100 by default, LeNet-5-Caffe, a small "
        "ResNet or a Transformer; Adam, linear learning-rate decay to 0) with one "
        "sparsification method of dualdrop.nn; write per-epoch history (JSON, CSV), a "
        "checkpoint every epoch, the trained network (model.pt) and the end-of-training test "
        "error (final.json) to --out. Defaults follow the data: the paper's protocol on MNIST, "
        "a short schedule chosen on the validation split for the embedded digits.",
    ))
    p.add_argument("--method", default=None,
                   help=", ".join(METHODS) + ", penalty:<name>, or none (dense baseline); "
                   "required unless --list-hparams")
    p.add_argument("--model", default="lenet300", choices=tuple(MODELS),
                   help="network: lenet300 (LeNet-300-100, default), lenet5 (LeNet-5-Caffe, "
                   "conv 20-50 5x5, fc 800-500-10), resnet (a small ResNet with BatchNorm, "
                   "16-32-64 channels) or transformer (2 encoder layers, 4 heads, reading an "
                   "image row by row); all but lenet300 need square images")
    p.add_argument("--out", default=None, help="output folder (default runs/sparsify/<method>)")
    p.add_argument("--resume", action="store_true",
                   help="continue from --out/checkpoint.pt (exactly); start fresh if absent")
    p.add_argument("--lr", type=float, default=None,
                   help="initial learning rate (default: the method's own, the paper's, on "
                   "MNIST; on the embedded digits see --list-hparams). Negative values are "
                   "refused")
    p.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE",
                   help="override a method hyperparameter (repeatable); see --list-hparams")
    p.add_argument("--granularity", default=None, choices=("weight", "neuron", "channel", "head"),
                   help="what the method prunes together: single weights (weight, the "
                   "default), output units of Linear/Conv layers (neuron, alias channel), "
                   "attention heads (head); the same as --hp granularity=...")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="global batch size (default: 128 on MNIST, 32 on the embedded digits)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the MD5 check of the MNIST files (for custom IDX files)")
    p.add_argument("--list-methods", action="store_true",
                   help="print the methods with what each does, and exit")
    p.add_argument("--list-hparams", action="store_true",
                   help="print the default hyperparameters of --method (of every method without "
                   "it) for the data of --data-dir, and exit")
    p.add_argument("--diagnose-every", type=positive_int, default=None, metavar="K",
                   help="every K epochs and after the last, measure SGD and dropout noise "
                   "against the Hessian (top eigenvalues, Tr(H Sigma) and its isotropic ratio, "
                   "cosine with its null p-value, top-k overlap) and write them as diag_* "
                   "columns of the history (docs/diagnostics.md; off by default; ~40 s per "
                   "measurement on LeNet-300-100 at 256 samples, one thread)")
    p.add_argument("--diagnose-samples", type=int_at_least(2), default=512, metavar="N",
                   help="size of the fixed validation subset of --diagnose-every, drawn from "
                   "--seed (default 512)")
    p.add_argument("--exclude", action="append", default=None, metavar="PATTERN",
                   help="leave these weights alone: a parameter name pattern (fnmatch, e.g. "
                   "'embed.*' or 'encoder.*.linear2.weight'); repeat for more")
    p.add_argument("--target-density", type=fraction, default=None, metavar="D",
                   help="fraction of nonzero weights the finished network keeps (0 < D <= 1), "
                   "for any method: its strength is adjusted during training against the "
                   "measured density (dualdrop.nn.density). Default: the method's own strength")
    p.add_argument("--lam-warmup", type=nonneg_int, default=None, metavar="E",
                   help="ramp the regularizer strength lam linearly over the first E epochs "
                   "(epoch e uses lam * e/E; the paper's released code has such a per-epoch "
                   "schedule); for methods whose strength is lam (penalty methods, eta-trick; "
                   "hardconcrete/vardrop with --hp lam=...). Default: off")
    p.add_argument("--lam-layer", action="append", default=[], metavar="LAYER=FACTOR",
                   help="per-layer strength (repeatable): LAYER's lam is lam * FACTOR, e.g. "
                   "--lam-layer fc1=2 --lam-layer fc3=0.25 (layers as in the density report); "
                   "same methods as --lam-warmup")
    add_common(p)
    p.set_defaults(func=run, parser=p, interrupt_hint="no epoch had finished; run the same "
                   "command again")


def list_hparams(method: str | None, dataset: str) -> str:
    """The defaults (and, where dualdrop.nn describes them, what each does) of ``method``, or of
    every method, for ``dataset``; one block per method."""
    from dualdrop.train import available_methods, resolve_hparams
    from dualdrop.train.config import _nn

    try:
        describe = getattr(_nn(), "describe", None)
    except ImportError:
        describe = None
    blocks = []
    for m in [method] if method else available_methods():
        lr, hp = resolve_hparams(m, None, None, dataset)
        notes = {}
        if describe is not None and m != "none":
            try:
                notes = {k: v[1] for k, v in describe(m).items()}
            except (KeyError, ValueError, TypeError, IndexError):
                notes = {}
        lines = [f"{m} ({dataset}):"]
        for key, value in {"lr": lr, **hp}.items():
            note = notes.get(key) or ("initial learning rate (Adam, decayed linearly to 0)"
                                      if key == "lr" else "")
            lines.append(f"  {key} = {json.dumps(value, default=repr)}" +
                         (f"    # {note}" if note else ""))
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def list_methods() -> str:
    """``--list-methods``: every method with its one-line description."""
    from dualdrop.nn.registry import REGISTRY

    rows = [(name, doc_summary(cls), "") for name, cls in REGISTRY.items()]
    rows.append(("penalty:<name>", "gradient descent on L + lam sum Omega(w) for any separable "
                 "penalty of the penalties catalog (dualdrop penalties)", ""))
    rows.append(("none", "the dense baseline (no sparsification)", ""))
    return method_list("methods (--method NAME):", rows,
                       "defaults and hyperparameters: dualdrop sparsify --list-hparams "
                       "[--method NAME]; one-shot pruning of a trained network: dualdrop prune "
                       "--list-methods")


def _parse_lam_layers(items) -> dict | None:
    """``["fc1=2", "fc3=0.25"]`` -> ``{"fc1": 2.0, "fc3": 0.25}`` (None when empty)."""
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = None
        if not (sep and name) or factor is None:
            raise ValueError(f"--lam-layer {item!r}: expected LAYER=FACTOR, e.g. --lam-layer "
                             "fc1=2")
        if name in out:
            raise ValueError(f"--lam-layer names {name!r} twice")
        out[name] = factor
    return out or None


def check_tol_margin(margin, methods, option="--select-tol-margin"):
    """The methods of ``methods`` that have no test-time keep-ratio tolerance (for which
    ``--select-tol-margin`` does nothing); ``[]`` when ``margin`` is None."""
    if margin is None:
        return []
    from dualdrop.train.config import DENSE

    try:
        from dualdrop.nn.registry import method_class
    except ImportError:  # pragma: no cover - torch is a dependency
        return []
    return [m for m in methods if m == DENSE or not method_class(m).has_tol]


def run(args) -> int:
    from dualdrop.train import TrainConfig, check_method, train
    from dualdrop.train.command import sparsify_command
    from dualdrop.train.config import dataset_of

    if args.list_methods:
        print(list_methods())
        return 0
    if args.method is None and not args.list_hparams:
        args.parser.error("the following argument is required: --method (or --list-methods, "
                          "--list-hparams)")
    if args.list_hparams:
        method = check_method(args.method) if args.method else None
        print(list_hparams(method, dataset_of(args.data_dir)))
        return 0
    method = check_method(args.method)
    if check_tol_margin(args.select_tol_margin, [method]):
        raise UsageError(f"method {method!r} has no test-time keep-ratio tolerance to select; "
                         "drop --select-tol-margin (it applies to the eta-trick, penalty and "
                         "variational dropout methods)", "--select-tol-margin")
    overrides = parse_hparams(args.hp)
    if args.granularity is not None:
        if "granularity" in overrides:
            raise UsageError("granularity given twice (--granularity and --hp "
                             "granularity=...); give one", "--granularity")
        overrides["granularity"] = args.granularity
    args.out = args.out or f"runs/sparsify/{method.replace(':', '_')}"
    cfg = TrainConfig(
        method=method, epochs=args.epochs,
        out=args.out,
        data_dir=args.data_dir, seed=args.seed, device=args.device, lr=args.lr,
        hparams=overrides, batch_size=args.batch_size, resume=args.resume,
        stop_after=args.stop_after, progress=not args.no_progress, threads=args.threads,
        verify_data=not args.no_verify, flush_denormal=not args.keep_denormals,
        select_tol_margin=args.select_tol_margin, init_from=args.init_from,
        model=args.model, diagnose_every=args.diagnose_every,
        diagnose_samples=args.diagnose_samples, lam_warmup=args.lam_warmup,
        lam_layers=_parse_lam_layers(args.lam_layer),
        target_density=args.target_density, exclude=args.exclude,
    )

    def interrupted(exc):  # the boundary's Ctrl-C line (dualdrop.cli)
        epoch = getattr(exc, "epoch", None)
        saved = (f"epoch {epoch} is checkpointed in {args.out}" if epoch
                 else "no epoch had finished")
        return f"{saved}; continue with: {sparsify_command(cfg)}"

    args.interrupt_hint = interrupted
    report = train(cfg)  # checks every option before loading data or creating --out
    if report.get("status") == "stopped":
        print(f"stopped after epoch {report['epoch']} (outputs in {report['out']}); continue "
              f"with: {sparsify_command(cfg, to_the_end=True)}")
        return 0
    import os

    if os.environ.get("RANK", "0") == "0":
        print(f"{report['method']}: test error {100 * report['test_error']:.2f}% at "
              f"{report['nonzero_total']:.4f} nonzero weights after {report['epochs']} epochs "
              f"(validation error {100 * report['val_error']:.2f}%); outputs in {cfg.out}")
        if report.get("model_files"):
            print(f"  trained network: {cfg.out}/model.pt; in Python: "
                  f"dualdrop.train.load_run({str(cfg.out)!r})")
            if report["model_files"].get("compact"):
                print(f"  dead units removed: {cfg.out}/{report['model_files']['compact']}; "
                      f"load_run({str(cfg.out)!r}, layout='compact')")
        unpruned = report.get("test_error_unpruned")
        if unpruned is not None and unpruned != report["test_error"]:
            print(f"  without test-time pruning (the paper's released-code protocol for its "
                  f"penalty methods): test error {100 * unpruned:.2f}%")
        sel = report.get("selected_tol") or {}
        if "test_error" in sel:
            print(f"  selected on validation: tol={sel['tol']:g}: test error "
                  f"{100 * sel['test_error']:.2f}% at {sel['nonzero_total']:.4f} nonzero weights "
                  f"(validation error {100 * sel['val_error']:.2f}%)")
    return 0
