"""Timing at matched objective, shared by the linear benchmarks: scan each method's ``tol``,
keep the loosest one within ``rtol`` of the best objective found, then time those
configurations in interleaved rounds (one run of each method per round: a change of load on a
shared machine hits every method alike) and report medians."""

from __future__ import annotations

import time

import numpy as np

TOLS = [1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10]


def fit_time(est, X, y):
    """``(wall, cpu, est)`` of one fit."""
    c0, t0 = time.process_time(), time.perf_counter()
    est.fit(X, y)
    return time.perf_counter() - t0, time.process_time() - c0, est


def matched_row(meths, objective, X, y, *, rtol, repeats, budget, tols=TOLS):
    """``meths``: ``{name: make(tol)}`` (an unfitted estimator); ``objective(est)``: the
    objective at a fitted one. A tol scan stops once a fit takes more than ``budget`` seconds.
    Returns ``{"best": ..., name: {"tol", "wall", "cpu", "gap"}}``."""
    scans = {}
    for name, make in meths.items():
        scan = {}
        for tol in tols:
            t, _, est = fit_time(make(tol), X, y)
            scan[tol] = objective(est)
            if t > budget:
                break
        scans[name] = scan
    best = min(o for s in scans.values() for o in s.values() if np.isfinite(o))
    tol = {}
    for name, scan in scans.items():
        ok = [t for t, o in scan.items() if o - best <= rtol * abs(best)]
        tol[name] = max(ok) if ok else min(scan)
    times = {m: [] for m in meths}
    for _ in range(repeats):
        for m, make in meths.items():
            times[m].append(fit_time(make(tol[m]), X, y)[:2])
    out = {"best": best}
    for m in meths:
        out[m] = {"tol": tol[m], "wall": float(np.median([w for w, _ in times[m]])),
                  "cpu": float(np.median([c for _, c in times[m]])),
                  "gap": (scans[m][tol[m]] - best) / abs(best)}
    return out
