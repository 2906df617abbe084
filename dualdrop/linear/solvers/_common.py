"""Helpers shared by the solver modules (argument checks, start point, progress bar)."""

from __future__ import annotations

import contextlib
import numbers

import numpy as np
from tqdm.auto import tqdm

from .._problem import Problem


def check_tol_iter(tol, max_iter):
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not np.isfinite(tol) or tol <= 0:
        raise ValueError(f"tol must be a positive finite number, got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    return float(tol), int(max_iter)


def start_point(problem: Problem, w0=None, b0=None):
    """Copy of the start point; ``w0=None`` means zeros, ``b0=None`` the best constant fit."""
    if w0 is None:
        w = np.zeros(problem.p)
    else:
        w = np.array(w0, dtype=np.float64, copy=True).ravel()
        if w.shape[0] != problem.p:
            raise ValueError(f"w0 has {w.shape[0]} entries, the design has {problem.p} features")
    if not problem.fit_intercept:
        b = 0.0
    elif b0 is not None:
        b = float(b0)
    elif problem.datafit.code == 0:
        b = float(np.mean(problem.y - problem.design.matvec(w)))
    else:
        b = problem.initial_intercept() if not np.any(w) else 0.0
    return w, b


_CONTROLLER = None


def single_thread_blas():
    """Context limiting BLAS to one thread. The solvers' BLAS calls are memory-bound
    matrix-vector products; on a busy machine multithreaded OpenBLAS oversubscribes the cores and
    runs several times slower than one thread (measured in benchmarks/bench_linear.py)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


class _NoBar:
    def update(self, *a, **k):
        pass

    def set_postfix(self, *a, **k):
        pass


@contextlib.contextmanager
def progress(total, verbose, desc):
    """A tqdm bar when ``verbose``, a no-op otherwise."""
    if not verbose:
        yield _NoBar()
        return
    bar = tqdm(total=total, desc=desc, leave=False)
    try:
        yield bar
    finally:
        bar.close()
