"""What the second process of ``_ahead`` runs: every kernel the polish calls from Python,
compiled (and cached) for the argument types a real layer gives them, nothing run.

Run as a script (``python _ahead_job.py``, :data:`_ahead.JOB`), it imports numpy, numba and
the two kernel modules alone: the packages above them stand in as empty packages (their
``__init__`` files, which import torch and the rest of dualdrop, ~2 s of a first call, are not
read), and the cache's locator (``penalties._numba_cache``) is installed as the packages would
install it. The cache entries are those of a compile in the calling process: numba keys them by
source file, function and argument types. Imported (the tests), it uses the real packages."""

from __future__ import annotations

import sys
import types
from pathlib import Path

#: the folder holding the ``penalties`` and ``dualdrop`` packages
ROOT = Path(__file__).resolve().parents[4]


def signatures():
    """``(dispatcher, argument types)`` of each kernel the polish (``polish.py``, ``_moves``)
    calls from Python, in the order a first polish needs them: float64 C-ordered arrays,
    int64 positions, bool masks, Python ints, floats and bools (numba's ``int64``, ``float64``
    and ``boolean``). A kernel called with other types would compile once more in the calling
    process: the tests check that a real polish after :func:`compile_polish` adds none."""
    import numba
    import numpy as np

    from dualdrop.nn.oneshot.methods import _moves as K

    F2, F1 = numba.typeof(np.zeros((1, 1))), numba.typeof(np.zeros(1))
    I1, B1 = numba.typeof(np.zeros(1, np.int64)), numba.typeof(np.zeros(1, np.bool_))
    f, i, b = numba.float64, numba.int64, numba.boolean
    row = (F2, I1, i, F2, F1, F1, F1, B1, F2)  # Gd, S, s, H, u, g, c, inS, MT
    return [  # K.SWAP_KERNELS first (what every polish waits for), the ladder's step last
        (K._build, (F2, F1, f, I1, i, F2, F1, F1, F1, B1, F2, b, b)),
        (K._fill_mt, (F2, I1, i, F2, F2, F1, B1)),
        (K._add, (*row, b, i, f)),
        (K._remove, (*row, b, i)),
        (K._swap_loop, (F2, F1, f, *row[1:], f, b, I1, b, I1, b, f, f, i, i)),
        (K._step, (*row, b, f)),
    ]


def compile_polish() -> None:
    """Compile (or load from the cache) each kernel of :func:`signatures`."""
    for dispatcher, sig in signatures():
        dispatcher.compile(sig)


def _bare_packages() -> None:
    """The packages above the kernel modules as empty packages of the same folders (the
    module docstring), then the project's cache locator."""
    for name in ("penalties", "dualdrop", "dualdrop.nn", "dualdrop.nn.oneshot",
                 "dualdrop.nn.oneshot.methods"):
        mod = types.ModuleType(name)
        mod.__path__ = [str(ROOT.joinpath(*name.split(".")))]
        sys.modules[name] = mod
    from penalties._numba_cache import install

    install()


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # the script's folder: its modules are this package's, not top-level
    _bare_packages()
    compile_polish()
