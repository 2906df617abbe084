"""The ``dualdrop sparsify`` command rebuilt from a run's configuration parses back to it."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

from dualdrop.cli import build_parser
from dualdrop.cli.sparsify_cmd import _parse_lam_layers, parse_hparams
from dualdrop.train.command import sparsify_command
from dualdrop.train.config import TrainConfig


def _parse(cmd: str) -> argparse.Namespace:
    argv = shlex.split(cmd.split("  #", 1)[0])
    assert argv[:2] == ["dualdrop", "sparsify"]
    return build_parser("sparsify").parse_args(argv[1:])


def _config_of(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig that ``dualdrop sparsify`` builds from ``args`` (its own mapping)."""
    return TrainConfig(
        method=args.method, epochs=args.epochs, out=args.out, data_dir=args.data_dir,
        seed=args.seed, device=args.device, lr=args.lr, hparams=parse_hparams(args.hp),
        batch_size=args.batch_size, resume=args.resume, stop_after=args.stop_after,
        progress=not args.no_progress, threads=args.threads, verify_data=not args.no_verify,
        flush_denormal=not args.keep_denormals, select_tol_margin=args.select_tol_margin,
        init_from=args.init_from, model=args.model, diagnose_every=args.diagnose_every,
        diagnose_samples=args.diagnose_samples, lam_warmup=args.lam_warmup,
        lam_layers=_parse_lam_layers(args.lam_layer), target_density=args.target_density,
        exclude=args.exclude)


def test_every_option_round_trips():
    cfg = TrainConfig(
        method="logsum", epochs=7, out="runs/a b", data_dir="data/mnist", seed=3,
        device="cuda:1", lr=-1e-3, hparams={"lam": "2e-3", "tol": "0.5"}, batch_size=64,
        resume=True, stop_after=2, progress=False, threads=2, verify_data=False,
        flush_denormal=False, select_tol_margin=0.001, init_from="runs/dense", model="lenet5",
        diagnose_every=3, diagnose_samples=128, lam_warmup=2, lam_layers={"fc1": 2.0},
        target_density=0.05, exclude=["fc1.weight", "-odd*"])
    plain = TrainConfig()
    same = [f.name for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) == getattr(plain, f.name)]
    assert same == ["val_fraction", "eval_batch_size"]  # every field with an option is set here
    back = _config_of(_parse(sparsify_command(cfg)))
    assert back == cfg
    # the fields without an option are named in a comment
    text = sparsify_command(dataclasses.replace(cfg, val_fraction=0.1, eval_batch_size=99))
    assert "val_fraction=0.1" in text and "eval_batch_size=99" in text


def test_defaults_are_left_out_and_stop_after_dropped_to_the_end():
    cfg = TrainConfig(method="magnitude", out="runs/m", stop_after=1)
    assert sparsify_command(cfg) == ("dualdrop sparsify --method magnitude --stop-after 1 "
                                     "--out runs/m --resume")
    assert "--stop-after" not in sparsify_command(cfg, to_the_end=True)
    assert _config_of(_parse(sparsify_command(cfg))) == dataclasses.replace(cfg, resume=True)
