"""Keep glibc's allocator from returning torch's freed tensor memory to the kernel.

Measured on the project machine (torch 2.13 CPU, one thread): ``sign(w) / (|w| + 2) * lam`` on a
235k-float tensor takes ~0.1 ms in a fresh process, and ~0.8-1.0 ms after *any* numba function
has been compiled or loaded in the same process (a trivial ``@njit`` of ``x + 1`` is enough).
Compiling with LLVM changes glibc malloc's dynamic mmap/trim thresholds, after which every new
megabyte-sized tensor is fresh memory from the kernel and pays page faults on first touch. Every
penalty method calls ``penalties``' numba kernels at setup, so every sparsified training process
was in the slow state. Fixing the two thresholds with ``mallopt`` (mmap above 32 MiB only; trim
only when 256 MiB are free at the heap top) restores the fresh-process speed (measured: 1060 ->
112 us for the expression above after a numba call).

:func:`tune_allocator` is called by ``sparsify`` and by ``dualdrop.train``; set the environment
variable ``DUALDROP_MALLOC_TUNING=0`` to leave the allocator alone. It does nothing on other C
libraries (macOS, musl, Windows).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20

_state: dict = {"done": False, "tuned": False}


def tune_allocator(force: bool = False) -> bool:
    """Fix glibc malloc's mmap and trim thresholds (once per process); True if they are set.

    Returns False without changing anything when the C library is not glibc, when ``mallopt``
    refuses, or when ``DUALDROP_MALLOC_TUNING`` is ``0`` (``force=True`` ignores the variable).
    """
    if _state["done"] and not force:
        return _state["tuned"]
    _state["done"] = True
    _state["tuned"] = False
    if not force and os.environ.get("DUALDROP_MALLOC_TUNING", "1").strip() == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = (mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1) and ok
    _state["tuned"] = ok
    return ok
