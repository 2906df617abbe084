"""Timing forward passes fairly: interleaved rounds, calibrated repeats, medians with spread.

One home for how dualdrop times inference (the latency report, ``dualdrop.nn.latency``, and the
measured ``layout="auto"`` of ``export_sparse``). On a machine shared with other work a timing
taken while a neighbour runs can be several times one taken a second later; timing the
candidates one after another lets such a change fall on one of them only. So every round times
every candidate once, in an order that rotates from round to round, and each candidate's figure
is the median over rounds (its spread: the quartiles). Within a round a candidate is called
``number`` times in a row (chosen at warm-up so that one measurement lasts at least
``min_time``), which keeps the timer's resolution and call overhead out of fast forwards. Keep
``min_time`` short (1 ms): under load the scheduler hands a process slices of a few
milliseconds, so a longer measurement is almost always interrupted by a neighbour's slice, and
a short one usually is not; the median over many short rounds is then an uninterrupted figure.

``clock="cpu"`` times with the process's CPU time instead of the wall clock: with one thread,
the time the forward computes, whatever the neighbours do (they still share the caches and the
memory bus). On a machine loaded beyond its cores that is the figure to compare; the wall
clock is what a user waits for on an idle one.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

import torch


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block with ``torch.set_num_threads(n)`` (None: leave it), then restore."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def calibrate(fn: Callable[[], object], min_time: float, max_number: int = 100_000,
              clock: str = "wall") -> int:
    """Calls of ``fn`` per measurement: the smallest power of two whose calls last at least
    ``min_time`` seconds (as ``timeit.Timer.autorange``), at most ``max_number``."""
    now = CLOCKS[clock]
    number = 1
    while True:
        t0 = now()
        for _ in range(number):
            fn()
        if now() - t0 >= min_time or number >= max_number:
            return number
        number *= 2


def interleaved(fns: dict[str, Callable[[], object]], *, rounds: int = 7, warmup: int = 3,
                min_time: float = 1e-3, on_round: Callable[[], None] | None = None,
                clock: str = "wall") -> dict[str, list[float]]:
    """Seconds per call of each ``fns[name]()``, one value per round (module docstring).

    ``warmup`` calls of each first (lazy initialization, caches, allocator), then the repeat
    count of each (:func:`calibrate`), then ``rounds`` rounds timing every candidate once, the
    order rotated by one each round. ``on_round()`` is called after each round (a progress bar).
    ``clock``: ``"wall"`` or ``"cpu"`` (module docstring).
    """
    now = CLOCKS[clock]
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    number = {name: calibrate(fns[name], min_time, clock=clock) for name in names}
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            fn, n = fns[name], number[name]
            t0 = now()
            for _ in range(n):
                fn()
            out[name].append((now() - t0) / n)
        if on_round is not None:
            on_round()
    return out


def summary(times: list[float]) -> dict:
    """``{"median", "q1", "q3", "min", "rounds"}`` of per-call seconds (quartiles: the spread)."""
    if len(times) >= 2:
        q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    else:
        q1 = q3 = times[0]
    return {"median": statistics.median(times), "q1": q1, "q3": q3, "min": min(times),
            "rounds": len(times)}
