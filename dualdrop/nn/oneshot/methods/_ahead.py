"""The polish's numba kernels compiled ahead, in a second process, on their first use.

A one-shot call on an empty numba cache compiles two families of kernels, one after the other:
the penalty path's coordinate descent (``dualdrop.linear.solvers.gram_cd`` with the penalty
kernels it inlines), which the call needs at once, and the support polish's exact moves
(``_moves``, ``_row_kernels``), which it needs only once the first layer's path has run. Each
costs about as much compile time as the other (benchmarks/RESULTS.md, "Cold and warm first
call"). So when the polish's kernels are neither compiled nor cached and the machine has a
second core, :func:`start` launches a second Python process that compiles them into the
shared numba cache (``penalties._numba_cache``) for the argument types a real layer gives them
(``_ahead_job``: numpy and numba alone, no torch, nothing run); the calling process goes on
compiling and running the path meanwhile, and :func:`wait` (called before the first polish)
waits for that process, after which the kernels load from the cache in well under a second.
The results are those of compiling in-process: the same kernels, the same machine code.

``DUALDROP_COMPILE_AHEAD=0`` turns this off (the kernels then compile in the calling process
as before); on one core it is off anyway. If the second process fails, nothing is lost: the
kernels compile in the calling process when first called.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from penalties._numba_cache import is_compiled

#: the script the second process runs (by path: run as a module it would import the packages
#: above it, torch with them)
JOB = str(Path(__file__).with_name("_ahead_job.py"))
_PENDING: subprocess.Popen | None = None
#: the most seconds :func:`wait` waits for the second process (then compiles in-process)
WAIT_LIMIT = 900.0
#: seconds between two looks at the cache while :func:`wait` waits for some kernels
POLL = 0.02


def enabled() -> bool:
    """Whether compiling ahead may run here (the environment switch, a second core)."""
    if os.environ.get("DUALDROP_COMPILE_AHEAD", "1") == "0":
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores >= 2


def start(kernels) -> bool:
    """Launch the second process when ``kernels`` (the polish's dispatchers) are neither
    compiled nor cached; True when one was launched (or is still running)."""
    global _PENDING
    if _PENDING is not None and _PENDING.poll() is None:
        return True
    if not kernels or not enabled() or is_compiled(*kernels):
        return False
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        _PENDING = subprocess.Popen(
            [sys.executable, JOB], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
    except OSError:
        _PENDING = None
        return False
    return True


def wait(kernels=None) -> None:
    """Wait for the second process, if one runs (a no-op otherwise): until the dispatchers
    ``kernels`` are in the cache (it compiles them in the order a polish needs them, so that
    the swaps need not wait for the size ladder's step), or until it ends."""
    global _PENDING
    proc = _PENDING
    if proc is None:
        return
    deadline = time.monotonic() + WAIT_LIMIT
    if kernels:
        while proc.poll() is None and time.monotonic() < deadline:
            if is_compiled(*kernels):
                return
            time.sleep(POLL)
    _PENDING = None
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # compile in-process instead; leave it to finish
        pass
