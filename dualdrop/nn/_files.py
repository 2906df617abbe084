"""Files written whole or not at all: :func:`writable_file` checks a target before any work,
:func:`atomic_target` gives a temporary name beside it that is moved into place (``os.replace``,
atomic on POSIX) only when the writing, and any check after it, succeeded.

The one home of the rule "write to a temporary name, check, then move into place": a reader
sees the old file or the new one, never half of one, and a refused or interrupted write leaves
the old file as it was and no debris (``dualdrop.train.checkpoint``'s writers, the ONNX export).
Below ``dualdrop.nn`` and ``dualdrop.train`` alike: no torch import.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def writable_file(path, what: str = "path") -> Path:
    """``path`` as a file to write: refused now (one line naming ``what``) when it is a folder,
    its folder does not exist or cannot be written (a file is created there and removed, as the
    save will), not after the work that produces it."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"{what} must be a file path (str or os.PathLike), got {path!r}")
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{what} {str(p)!r} is a folder; give a file name inside it, "
                                f"e.g. {str(p / 'model.pt')!r}")
    if not p.parent.is_dir():
        raise FileNotFoundError(f"{what} {str(p)!r}: no such folder {str(p.parent)!r}; create "
                                "it first")
    probe = p.with_name(f".{p.name}.{os.getpid()}.probe")
    try:
        with open(probe, "xb"):
            pass
    except OSError as exc:
        raise PermissionError(f"{what} {str(p)!r}: its folder {str(p.parent)!r} cannot be "
                              f"written ({exc.strerror}); choose a writable folder") from None
    probe.unlink(missing_ok=True)
    return p


@contextlib.contextmanager
def atomic_target(path):
    """``with atomic_target(path) as tmp:`` write ``tmp`` (and check it); on leaving the block
    without an exception ``tmp`` replaces ``path``, otherwise it is removed and ``path`` stays
    as it was (Ctrl-C and a full disk included)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


__all__ = ["writable_file", "atomic_target"]
