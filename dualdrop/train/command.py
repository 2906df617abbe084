"""The ``dualdrop sparsify`` command of a run, rebuilt from its configuration.

One run is one :class:`~dualdrop.train.config.TrainConfig`; the command line that continues (or
reproduces) it is a function of that record alone, so the message printed after Ctrl-C or
``--stop-after``, the ``sparsify_command.txt`` of every frontier trial and any log that names a
run all show the same words. Every field that differs from its default is spelled as its
option (``--out`` and ``--method`` always), then ``--resume``; the fields that have no option
(``val_fraction``, ``eval_batch_size``: Python API only) follow as a shell comment.
"""

from __future__ import annotations

import json
import shlex

from dualdrop.train.config import TrainConfig

#: TrainConfig field -> option of ``dualdrop sparsify`` that takes its value
_VALUE_FLAGS = (
    ("model", "--model"), ("epochs", "--epochs"), ("data_dir", "--data-dir"), ("seed", "--seed"),
    ("device", "--device"), ("threads", "--threads"), ("lr", "--lr"),
    ("batch_size", "--batch-size"), ("stop_after", "--stop-after"),
    ("init_from", "--init-from"), ("select_tol_margin", "--select-tol-margin"),
    ("diagnose_every", "--diagnose-every"), ("diagnose_samples", "--diagnose-samples"),
    ("lam_warmup", "--lam-warmup"), ("target_density", "--target-density"),
)
#: TrainConfig field -> (value that the switch sets, switch)
_SWITCHES = (("progress", False, "--no-progress"), ("verify_data", False, "--no-verify"),
             ("flush_denormal", False, "--keep-denormals"))
#: fields that no option sets
_API_ONLY = ("val_fraction", "eval_batch_size")


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value) if isinstance(value, (dict, list, tuple)) else str(value)


def _option(flag: str, value) -> list[str]:
    text = _text(value)
    # a value that starts with '-' must be attached, or argparse reads it as an option
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def sparsify_command(cfg: TrainConfig, to_the_end: bool = False,
                     prog: str = "dualdrop sparsify") -> str:
    """The command line that continues the run of ``cfg`` (``--resume``); without
    ``--stop-after`` if ``to_the_end``. See the module docstring."""
    defaults = TrainConfig()
    words = ["--method", cfg.method]
    for field, flag in _VALUE_FLAGS:
        value = getattr(cfg, field)
        if field == "stop_after" and to_the_end:
            continue
        if value is not None and value != getattr(defaults, field):
            words += _option(flag, value)
    for key, value in (cfg.hparams or {}).items():
        words += _option("--hp", f"{key}={_text(value)}")
    for layer, factor in (cfg.lam_layers or {}).items():
        words += _option("--lam-layer", f"{layer}={_text(factor)}")
    for pattern in cfg.exclude or ():
        words += _option("--exclude", pattern)
    for field, value, flag in _SWITCHES:
        if getattr(cfg, field) == value:
            words.append(flag)
    words += ["--out", str(cfg.out), "--resume"]
    api = [f"{f}={getattr(cfg, f)!r}" for f in _API_ONLY
           if getattr(cfg, f) != getattr(defaults, f)]
    extra = f"  # and {', '.join(api)} (Python API)" if api else ""
    return " ".join([prog, shlex.join(words)]) + extra


__all__ = ["sparsify_command"]
