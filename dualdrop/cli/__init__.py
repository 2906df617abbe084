"""The ``dualdrop`` command line: one module per subcommand, one error boundary for all of them.

Subcommands. Each module in ``_SUBCOMMANDS`` exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (a callable taking the parsed namespace and returning an exit code).
Modules are imported lazily so that ``dualdrop penalties`` never imports torch.

Errors: a subcommand never prints a traceback nor catches a user's error to report it; it
raises, and :func:`main` reports

- a user error as ONE line ``dualdrop CMD: error: MESSAGE`` on stderr, exit status 2:
  :class:`UsageError` (raise it with the option: ``UsageError("must be > 0", option="--k")``),
  any ``ValueError`` or ``TypeError`` (a bad value, a corrupt file: their messages name the
  argument), an ``OSError`` (a missing file, an ``--out`` that is a file, a permission denied, a
  full disk: named by the option whose value holds the path), ``EOFError`` /
  ``zipfile.BadZipFile`` / ``pickle.UnpicklingError`` (a truncated or corrupt file), and an
  ``ImportError`` (an optional extra not installed);
- Ctrl-C (``KeyboardInterrupt``) as one line ``dualdrop CMD: interrupted; HINT``, exit 130, where
  HINT says what is saved and how to continue: the subcommand's ``interrupt_hint`` (a string, or
  a callable of the exception; set with ``parser.set_defaults(interrupt_hint=...)`` or on the
  namespace while it runs), else the exception's own text if it has one, else "nothing was
  saved; run the same command again";
- argparse's own refusals (an unknown option, a value its ``type`` refuses) as one line, exit 2
  (``main`` returns 2 for every refusal; only ``--help`` and ``--version`` raise ``SystemExit``).

``DUALDROP_TRACEBACK=1`` re-raises instead (a traceback, for a bug report). The argument types
below (:func:`positive_int`, :func:`nonneg_int`, :func:`int_at_least`, :func:`positive_float`,
:func:`nonneg_float`, :func:`fraction`) refuse bad numbers with the option named, and
:func:`out_dir` creates an output folder or says why it cannot.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import pickle
import re
import sys
import zipfile
from pathlib import Path

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
    "heal": "heal_cmd",
}

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: exceptions that are the user's doing, reported as one line (see the module docstring)
USER_ERRORS = (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile,
               pickle.UnpicklingError, ImportError)


class UsageError(ValueError):
    """A user error on the command line: one line naming the option, exit status 2.

    ``option`` (e.g. ``"--out"``) is put in front of the message unless the message names it.
    """

    def __init__(self, message: str, option: str | None = None):
        self.option = option
        if option and option not in message:
            message = f"{option}: {message}"
        super().__init__(message)


# ------------------------------------------------------------------------------------------------
# argument types: bad numbers refused by argparse with the option named (one line, exit 2)
# ------------------------------------------------------------------------------------------------
def _number(kind, text):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_at_least(low: int):
    """An argparse type: an integer ``>= low``."""
    def parse(text):
        value = _number(int, text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    parse.__name__ = f"int_at_least_{low}"
    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)


def positive_float(text):
    """An argparse type: a finite number ``> 0``."""
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def nonneg_float(text):
    """An argparse type: a finite number ``>= 0``."""
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def fraction(text):
    """An argparse type: a fraction in ``(0, 1]`` (a density, a share)."""
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text!r}")
    return value


def doc_summary(obj) -> str:
    """The first sentence of ``obj``'s docstring, without reST markup (``--list-methods``)."""
    para = " ".join((getattr(obj, "__doc__", None) or "").strip().split("\n\n")[0].split())
    para = para.replace("``", "").replace(" (module docstring)", "")
    return para[:re.search(r"(?<=[.!?])\s+(?=[A-Z(])|$", para).start()]


def method_list(title: str, rows, footer: str = "") -> str:
    """``--list-methods``' text: ``title``, then one ``name  summary`` block per row of
    ``(name, summary, detail)`` (``detail`` on its own line when not empty), then ``footer``."""
    import textwrap

    rows = list(rows)
    w = max(len(r[0]) for r in rows) + 2
    lines = [title]
    for name, summary, detail in rows:  # whole sentences, wrapped between words at 100 columns
        lines += textwrap.wrap(summary, 100, initial_indent=f"  {name:<{w}}",
                               subsequent_indent=" " * (w + 2), break_long_words=False,
                               break_on_hyphens=False) or [f"  {name}"]
        if detail:
            lines.append(f"  {'':<{w}}{detail}")
    return "\n".join(lines + ([footer] if footer else []))


def add_model_options(p: argparse.ArgumentParser, when: str, shape_help: str) -> None:
    """``--model-class``, ``--model-args`` and ``--input-shape``: a network of the user's own,
    rebuilt from a file (``dualdrop.train.user_model`` reads them); ``when``: the words that
    start each help (e.g. ``"with --model"``)."""
    p.add_argument("--model-class", default=None, metavar="MODULE:CLASS",
                   help=f"{when}: the class (or a function) that builds the network, importable "
                   "from here, e.g. mypkg.nets:Net or dualdrop.train.models:LeNet5")
    p.add_argument("--model-args", default="{}", metavar="JSON",
                   help=f"{when}: keyword arguments of --model-class as JSON (default {{}})")
    p.add_argument("--input-shape", default=None, metavar="D1,D2,...",
                   help=f"{when}: the shape of one input sample, e.g. 784 or 1,28,28 "
                   f"({shape_help})")


def out_dir(path, option: str = "--out", create: bool = True) -> Path:
    """``path`` as an output folder (created with its parents when ``create``), or a
    :class:`UsageError` naming ``option``: a file in the way, a folder that cannot be created
    or written to."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder; pass a folder (created if "
                         "missing)", option)
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{option} {path}: cannot create the folder "
                             f"({exc.strerror or exc})", option) from None
    probe = p if p.exists() else next((q for q in p.parents if q.exists()), Path("."))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: the folder {probe} is not writable (permission "
                         "denied)", option)
    return p


# ------------------------------------------------------------------------------------------------
# the parser and the boundary
# ------------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse's parser with one-line refusals: ``dualdrop CMD: error: ... (see dualdrop CMD
    --help)``, exit status 2; a value refused by its type reads ``--opt must be ...``."""

    def error(self, message):
        message = re.sub(r"^argument ([^:\s/]+)(?:/\S+)?: (must be )", r"\1 \2", message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dualdrop",
        description="Adaptive dropout as regularized ERM: penalties, sparse linear models, "
        "network sparsification.",
    )
    from dualdrop import __version__

    parser.add_argument("--version", action="version", version=f"dualdrop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
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


def cwd_on_path() -> None:
    """Put the current folder on ``sys.path``, as ``python -m`` does: an installed console
    script has its own folder there instead, and ``--model-class mynets:MLP`` (``prune``,
    ``latency``, a run rebuilt on its class) must find the ``mynets.py`` of the folder the
    command runs in. Unlike ``python -m``, last: a file or folder there (a checkout of this
    project, a ``torch.py``) never hides an installed package or the ``PYTHONPATH``."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.append(cwd)


def main(argv: list[str] | None = None) -> int:
    argv_given = argv
    cwd_on_path()
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in _SUBCOMMANDS else None
    try:  # importing torch and the subcommand takes seconds: a Ctrl-C there is one line too
        parser = build_parser(only)
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a refusal (printed) returns its status; --help / --version exit
        return _refused(exc)
    except KeyboardInterrupt:
        if _debug():
            raise
        print(f"dualdrop{' ' + only if only else ''}: interrupted while starting; nothing was "
              "saved; run the same command again", file=sys.stderr)
        if argv_given is None:
            _leave_process(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    code = _run(args, _subparser(parser, args.command))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "torch.distributed" in sys.modules:
        _leave_process(code)
    if code == EXIT_INTERRUPTED and argv_given is None:
        _leave_process(code)
    return code


def _subparser(parser, command):
    for action in parser._subparsers._group_actions:  # argparse keeps them there
        if command in getattr(action, "choices", {}):
            return action.choices[command]
    return parser


def _run(args, subparser) -> int:
    """Run the subcommand inside the error boundary (see the module docstring)."""
    prog = f"dualdrop {args.command}"
    try:
        with _interrupts_outside_llvm():
            return int(args.func(args) or 0)
    except SystemExit as exc:  # parser.error() called by the subcommand
        return _refused(exc)
    except KeyboardInterrupt as exc:
        if _debug():
            raise
        print(f"{prog}: interrupted; {_interrupt_hint(args, exc)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as exc:
        if _debug():
            raise
        print(f"{prog}: error: {_one_line(_describe(exc, args, subparser))}", file=sys.stderr)
        return EXIT_USAGE


def _refused(exc: SystemExit) -> int:
    """The status of argparse's exit: returned for a refusal (so that ``main`` returns 2 for
    every user error), raised again for ``--help`` / ``--version`` (status 0)."""
    if exc.code in (0, None):
        raise exc
    return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _debug() -> bool:
    return os.environ.get("DUALDROP_TRACEBACK", "") not in ("", "0")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _interrupt_hint(args, exc) -> str:
    hint = getattr(args, "interrupt_hint", None)
    if callable(hint):
        hint = hint(exc)
    if not hint:
        hint = str(exc) or "nothing was saved; run the same command again"
    return _one_line(hint)


def _describe(exc, args, subparser) -> str:
    """The message of a user error; an ``OSError`` with the option whose value holds its path."""
    if isinstance(exc, OSError) and not isinstance(exc, UsageError) and exc.filename:
        what = exc.strerror or type(exc).__name__
        option = _option_of(args, subparser, exc.filename)
        where = f"{option} {exc.filename}" if option else str(exc.filename)
        return f"{where}: {what}"
    if isinstance(exc, (zipfile.BadZipFile, pickle.UnpicklingError, EOFError)):
        return f"a file is corrupt or truncated ({type(exc).__name__}: {exc})"
    if isinstance(exc, ImportError) and not str(exc):
        return f"a module is missing ({exc.name})"
    return with_option_names(str(exc) or type(exc).__name__,
                             option_names(args.command, subparser))


#: the Python parameters whose option has another name, per command ("*": every command). An
#: option names its own destination without an entry (``--allocation-hp`` for
#: ``allocation_hp``): see :func:`option_names`.
PARAMETER_OPTIONS = {
    "*": {"hparams": "--hp", "options": "--hp", "allocation_options": "--allocation-hp"},
    "prune": {"target_density": "--density", "example_inputs": "--input-shape"},
    "latency": {"example_inputs": "--input-shape"},
}


def option_names(command: str, subparser=None) -> dict:
    """``{python parameter: option}`` of ``command``: each ``--option``'s destination, then
    :data:`PARAMETER_OPTIONS` (the one table, for every command)."""
    names = {}
    for action in getattr(subparser, "_actions", ()):
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in ("help", "version"):
            names[action.dest] = longs[0]
    names.update(PARAMETER_OPTIONS["*"])
    names.update(PARAMETER_OPTIONS.get(command, {}))
    return names


def with_option_names(message: str, names: dict) -> str:
    """``message`` with the Python parameters it names written as the options that set them
    (``target_density must be <= 1.0`` -> ``--density must be <= 1.0``): a name with an
    underscore wherever it stands as a word, a plain word only as ``word=...`` or ``word must``
    (not inside quotes, paths or options)."""
    if not names:
        return message
    edge_l, edge_r = r"(?<![\w./'\"-])", r"(?![\w./'\"-])"
    snake = sorted((n for n in names if "_" in n), key=len, reverse=True)
    plain = sorted((n for n in names if "_" not in n), key=len, reverse=True)
    if snake:
        message = re.sub(edge_l + "(" + "|".join(map(re.escape, snake)) + ")" + edge_r,
                         lambda m: names[m.group(1)], message)
    if plain:
        message = re.sub(edge_l + "(" + "|".join(map(re.escape, plain)) + r")(?=(?:=|\s+must\b))",
                         lambda m: names[m.group(1)], message)
    return message


def _option_of(args, subparser, filename) -> str | None:
    """The option (``--out``, or a positional's name) whose value is ``filename`` or a folder
    that holds it."""
    target = Path(os.fsdecode(filename)).absolute()
    for action in getattr(subparser, "_actions", ()):
        values = getattr(args, action.dest, None)
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if not isinstance(value, (str, os.PathLike)) or not str(value):
                continue
            given = Path(value).absolute()
            if target == given or given in target.parents:
                longs = [o for o in action.option_strings if o.startswith("--")]
                return (longs or action.option_strings or [action.dest.upper()])[0]
    return None


class _interrupts_outside_llvm:
    """Deliver Ctrl-C as ``KeyboardInterrupt`` only outside llvmlite's Python code.

    numba compiles lazily, so a long command can be interrupted while llvmlite runs Python code
    inside a ctypes callback (where the interrupt is printed and swallowed: the command went on
    and exited 0) or between building an LLVM object and recording its handle. While any frame
    of the stack is llvmlite's, the interrupt is re-sent 20 ms later instead of raised. So it is
    while the innermost frame is a finalizer (``__del__``, a weakref callback such as numba's
    ``on_disposal``, run by the garbage collector at any point): Python prints an exception
    raised there as "Exception ignored" and goes on.
    """

    RETRY_S = 0.02

    def __enter__(self):
        import signal
        import threading

        self._previous = None
        self._timers = []
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, exc_type, exc, tb):
        import signal

        pending = False
        for timer in self._timers:  # an interrupt deferred at the very end still counts
            pending = pending or not timer.finished.is_set()
            timer.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if pending and exc_type is None:
            raise KeyboardInterrupt
        return False

    def _handle(self, signum, frame):
        import _thread
        import threading

        inner = frame.f_code if frame is not None else None
        finalizer = inner is not None and (
            inner.co_name in ("__del__", "on_disposal")
            or inner.co_filename.endswith(("weakref.py", "_weakrefset.py")))
        while frame is not None:
            if finalizer or "llvmlite" in frame.f_code.co_filename:
                timer = threading.Timer(self.RETRY_S, _thread.interrupt_main)
                self._timers.append(timer)
                timer.start()
                return
            frame = frame.f_back
        raise KeyboardInterrupt


def _leave_process(code: int) -> None:
    """End the process once its work is saved, without interpreter finalization.

    Used for ``torchrun`` workers and for a command-line run interrupted by Ctrl-C. An
    interrupt that lands inside numba's compiler leaves llvmlite objects half built, whose
    destructors print "Exception ignored" tracebacks during finalization, after the one-line
    message.

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
