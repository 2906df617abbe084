"""The process's memory: glibc's allocator settings and the peak resident set.

**Training: keep freed tensor memory.** Measured on the project machine (torch 2.13 CPU, one
thread): ``sign(w) / (|w| + 2) * lam`` on a 235k-float tensor takes ~0.1 ms in a fresh
process, and ~0.8-1.0 ms after *any* numba function has been compiled or loaded in the same
process (a trivial ``@njit`` of ``x + 1`` is enough).
Compiling with LLVM changes glibc malloc's dynamic mmap/trim thresholds, after which every new
megabyte-sized tensor is fresh memory from the kernel and pays page faults on first touch. Every
penalty method calls ``penalties``' numba kernels at setup, so every sparsified training process
was in the slow state. Fixing the two thresholds with ``mallopt`` (mmap above 32 MiB only; trim
only when 256 MiB are free at the heap top) restores the fresh-process speed (measured: 1060 ->
112 us for the expression above after a numba call).

:func:`tune_allocator` is called by ``sparsify`` and by ``dualdrop.train``; set the environment
variable ``DUALDROP_MALLOC_TUNING=0`` to leave the allocator alone. It does nothing on other C
libraries (macOS, musl, Windows).

**Pruning from disk: give freed memory back.** The opposite setting (every tensor of a megabyte
or more in its own mapping, the heap's free pages trimmed after each block) keeps the peak of
``prune_oneshot_from_disk`` independent of depth; :func:`set_malloc` and :func:`trim_heap` are its
calls (``oneshot.sources`` says why).

**Peak memory.** :func:`reset_peak_memory` and :func:`peak_rss_mb` measure the peak resident set
of a piece of work (the one-shot reports' ``peak_mb``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

try:
    import resource
except ImportError:  # not on Windows
    resource = None

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
    _state["tuned"] = set_malloc(MMAP_THRESHOLD, TRIM_THRESHOLD)
    return _state["tuned"]


@functools.lru_cache(maxsize=1)
def _libc():
    """glibc, or None (another C library: nothing here applies)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def set_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Fix glibc's mmap threshold (allocations from this many bytes get their own mapping,
    unmapped when freed) and trim threshold (free memory above this at the heap's top is given
    back at once); True if both are set, False off glibc or when ``mallopt`` refuses."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)) == 1
    return (mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)) == 1) and ok


def trim_heap() -> None:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim(0)``)."""
    libc = _libc()
    if getattr(libc, "malloc_trim", None) is not None:
        libc.malloc_trim(0)


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak_memory() -> float:
    """Start a peak-memory measurement; returns the resident memory now, in MB.

    On Linux the kernel's high-water mark of the process is reset to its current resident set
    (``/proc/self/clear_refs``), so :func:`peak_rss_mb` then reads the peak since this call;
    elsewhere it stays the process's peak so far."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    now = _status_mb("VmRSS")
    return now if now is not None else peak_rss_mb()


def peak_rss_mb() -> float:
    """The process's peak resident memory since :func:`reset_peak_memory` (Linux), or so far,
    in MB."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    if resource is None:
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
