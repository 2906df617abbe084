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
        b = float(np.mean(problem.y - problem.z(w, 0.0)))
    else:
        b = problem.initial_intercept() if not np.any(w) else 0.0
    return w, b


_CONTROLLER = None


def single_thread_blas(design=None):
    """Context limiting BLAS to one thread. The solvers' BLAS calls are memory-bound
    matrix-vector products; on a busy machine multithreaded OpenBLAS oversubscribes the cores and
    runs several times slower than one thread (measured in benchmarks/bench_linear.py). A sparse
    ``design`` makes no BLAS calls: no limit (setting one costs ~0.2 ms)."""
    global _CONTROLLER
    if design is not None and design.is_sparse:
        return contextlib.nullcontext()
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


def descent_loop(problem: Problem, state, step, *, tol, max_iter, verbose, name, stall_rtol,
                 record=None):
    """The outer loop every iterative solver without its own compiled loop shares (IRLS,
    reweighted l1, AdaTikhonov, eta-trick).

    ``state`` is a tuple ``(w, b, z, value, ...)``: the iterate, its linear predictor and the value
    the steps decrease (the objective ``F``, or the eta-trick's joint ``J``). ``step(state)``
    returns the next state, or ``None`` when no acceptable step exists. The loop stops when
    ``Problem.criterion`` reaches ``tol`` (checked before each step), when a step moves the value
    by at most ``stall_rtol`` relative (``|v_old - v_new| <= stall_rtol max(1, |v_new|)``), when
    no step is accepted, or at ``max_iter``. ``record(state)`` gives the history entry of a state
    (default: its value). Returns ``(state, n_iter, history, criterion, converged)``, the
    criterion evaluated at the returned point.
    """
    record = (lambda st: st[3]) if record is None else record
    history = [record(state)]
    crit, it, done = np.inf, 0, False
    with progress(max_iter, verbose, name) as bar:
        for it in range(1, max_iter + 1):
            crit = problem.criterion(*state[:3])
            if crit <= tol:
                done = True
                break
            new = step(state)
            if new is None:
                break
            stalled = abs(state[3] - new[3]) <= stall_rtol * max(1.0, abs(new[3]))
            state = new
            history.append(record(state))
            bar.update(1)
            bar.set_postfix(value=f"{state[3]:.6g}")
            if stalled:
                break
    if not done:
        crit = problem.criterion(*state[:3])
    return state, it, np.asarray(history), float(crit), crit <= tol


def mm_loop(problem: Problem, w, b, update, *, tol, max_iter, verbose, name, stall_rtol):
    """:func:`descent_loop` for majorization-minimization (IRLS, reweighted l1): ``update(w, b)
    -> (w, b)`` is one MM step, the monitored value the objective. Returns ``(w, b, n_iter,
    history, criterion, converged)``."""

    def step(st):
        w, b = update(st[0], st[1])
        z = problem.z(w, b)
        return w, b, z, problem.objective(w, b, z)

    z = problem.z(w, b)
    state, it, history, crit, converged = descent_loop(
        problem, (w, b, z, problem.objective(w, b, z)), step, tol=tol, max_iter=max_iter,
        verbose=verbose, name=name, stall_rtol=stall_rtol)
    return state[0], state[1], it, history, crit, converged


def armijo_step(trial, value, gn2, rho, *, c=1e-4, max_halvings=60):
    """Backtracking line search shared by the gradient solvers (AdaTikhonov, eta-trick).

    ``trial(rho) -> (candidate, value)`` evaluates a step of size rho. The step first doubles,
    then halves until ``value_new <= value - c rho gn2``. Returns ``(candidate, value_new, rho)``,
    or ``None`` when no step within ``max_halvings`` is accepted.
    """
    rho = rho * 2.0
    for _ in range(max_halvings):
        cand, v_new = trial(rho)
        if v_new <= value - c * rho * gn2:
            return cand, v_new, rho
        rho *= 0.5
    return None
