"""``dualdrop diagnose``: noise-vs-curvature measurements of trained runs, from their checkpoints.

Example::

    dualdrop sparsify --method vardrop-lr --epochs 2 --data-dir data/mnist --out runs/vdlr
    dualdrop diagnose runs/vdlr runs/logsum --data-dir data/mnist --out runs/diag

For each run folder the LeNet-300-100 network and its method are rebuilt from the configuration
stored in the checkpoint, the weights are loaded, and ``dualdrop.diagnostics.measure`` runs on a
fixed subset of the training split (the first ``--n-samples`` points of a seed-0 permutation, the
same for every run; the SGD noise is that of minibatches of the run's batch size drawn from the
whole training split).  Writes ``OUT/diagnostics.json`` (one record per run) and
``OUT/diagnostics.png``.  See ``docs/diagnostics.md`` for what the numbers mean.
"""

from __future__ import annotations

import json
from pathlib import Path

from dualdrop.cli import UsageError, int_at_least, out_dir, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="measure SGD and dropout noise against the Hessian for trained runs",
        description="Rebuild each run's network from its checkpoint and measure, on a fixed data "
        "subset: the Hessian's top eigenvalues, Tr(H Sigma) and its ratio to isotropic noise, and "
        "the Hessian-noise cosine, for the minibatch (SGD) noise and for the method's dropout "
        "noise. Writes OUT/diagnostics.json and OUT/diagnostics.png.",
    )
    p.add_argument("runs", nargs="+", help="run folders written by dualdrop sparsify")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--data-dir", default=None,
                   help="MNIST folder, required for runs trained on MNIST (runs on the embedded "
                   "digits need none)")
    p.add_argument("--n-samples", type=int_at_least(2), default=512,
                   help="size of the fixed subset (512)")
    p.add_argument("--k", type=positive_int, default=5, help="top Hessian eigenpairs (5)")
    p.add_argument("--noise-samples", type=int_at_least(2), default=64,
                   help="dropout-noise draws for its covariance (64; at least 2)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="minibatch size of the SGD noise (default: the run's own)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (1)")
    p.set_defaults(func=run, interrupt_hint=lambda exc: "diagnostics.json holds the runs "
                   "measured so far; run the same command again to measure them all")


def load_training_network(folder: str | Path):
    """``(model, sparsifier, config, epoch)``: the *training-time* sparsified network (with its
    noise layers, unlike the exported test-time network) rebuilt from ``folder/checkpoint.pt``."""
    from dualdrop.train.checkpoint import read_checkpoint
    from dualdrop.train.export import training_network

    ck = read_checkpoint(Path(folder) / "checkpoint.pt",
                         fix="pass a run folder written by dualdrop sparsify")
    model, sp = training_network(ck)
    return model, sp, ck["config"], int(ck.get("epoch", -1))


def run(args) -> int:
    import numpy as np
    import torch

    from dualdrop.data import load_dataset
    from dualdrop.diagnostics import measure

    torch.set_num_threads(args.threads)
    out = out_dir(args.out)
    loaded = []
    for folder in args.runs:  # every run checked before anything is measured
        model, sp, cfg, epoch = load_training_network(folder)
        if cfg.get("data", "digits") != "digits" and args.data_dir is None:
            raise UsageError(f"{folder} was trained on {cfg.get('data')!r}; pass --data-dir "
                             "with the MNIST folder", "--data-dir")
        loaded.append((folder, model, sp, cfg, epoch))
    records, cache = [], {}
    for folder, model, sp, cfg, epoch in loaded:
        key = (args.data_dir if cfg.get("data") != "digits" else None, cfg.get("seed", 0),
               cfg.get("val_fraction", 0.2))
        if key not in cache:
            ds = load_dataset(key[0], seed=key[1], val_fraction=key[2])
            idx = np.random.default_rng(0).permutation(len(ds.y_train))[: args.n_samples]
            cache[key] = (torch.tensor(ds.X_train[idx]), torch.tensor(ds.y_train[idx]),
                          len(ds.y_train))
        X, y, n_train = cache[key]
        bs = args.batch_size or int(cfg.get("batch_size", 128))
        res = measure(model, torch.nn.functional.cross_entropy, X, y, sp, k=args.k,
                      batch_size=bs, n_samples=args.noise_samples, population=n_train)
        res.update(run=str(folder), method=cfg["method"], epoch=epoch, batch_size=bs)
        records.append(res)
        print(f"{folder} ({cfg['method']}, epoch {epoch}): lambda_1={res['lambda_1']:.3g} "
              f"SGD Tr(H S)/iso={res['sgd_ratio']:.1f} cos={res['sgd_cosine']:.3f} | dropout "
              f"Tr(H S)/iso={res['drop_ratio']:.1f} cos={res['drop_cosine']:.3f}", flush=True)
        tmp = out / ".diagnostics.json.tmp"  # whole or not at all
        tmp.write_text(json.dumps(records, indent=1))
        tmp.replace(out / "diagnostics.json")
    from dualdrop.train.report.figures import plot_diagnostics

    plot_diagnostics(records, out / "diagnostics.png")
    print(f"wrote {out / 'diagnostics.json'} and {out / 'diagnostics.png'}")
    return 0
