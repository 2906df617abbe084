"""The ``dualdrop`` command line: one module per subcommand.

Each module in ``_SUBCOMMANDS`` exposes ``register(subparsers)`` which adds its parser and sets
``func`` (a callable taking the parsed namespace and returning an exit code). Modules are imported
lazily so that ``dualdrop penalties`` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> module (relative to dualdrop.cli)
_SUBCOMMANDS = {
    "penalties": "penalties_cmd",
    "demo": "demo_cmd",
    "fit": "fit_cmd",
    "sparsify": "sparsify_cmd",
    "compare": "compare_cmd",
    "frontier": "frontier_cmd",
    "diagnose": "diagnose_cmd",
    "latency": "latency_cmd",
    "prune": "prune_cmd",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dualdrop",
        description="Adaptive dropout as regularized ERM: penalties, sparse linear models, "
        "network sparsification.",
    )
    from dualdrop import __version__

    parser.add_argument("--version", action="version", version=f"dualdrop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in _SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            mod = importlib.import_module(f"dualdrop.cli.{modname}")
        except ModuleNotFoundError as exc:  # subcommand not shipped yet
            if exc.name == f"dualdrop.cli.{modname}":
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in _SUBCOMMANDS else None
    parser = build_parser(only)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code = int(args.func(args) or 0)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "torch.distributed" in sys.modules:
        _leave_process(code)
    return code


def _leave_process(code: int) -> None:
    """End a ``torchrun`` worker once its work is saved and its process group destroyed.

    Gloo keeps C++ worker threads whose last references can be released during interpreter
    finalization; on a loaded machine this occasionally aborts a worker that has finished
    correctly (``terminate called without an active exception``, SIGABRT), which ``torchrun``
    reports as a failed run. Every output is already written (atomically) and the process group
    destroyed when the subcommand returns, so the worker flushes its streams and leaves without
    finalization.
    """
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
