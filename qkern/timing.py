"""Wall-clock timing of one call: untimed warm-up calls, then timed calls
until a time budget is spent.

Knows nothing of kernels: ``python -m qkern bench`` (:mod:`qkern.bench`),
the benchmarks in ``benchmarks/`` and a kernel tuner time their calls with
:func:`time_call`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

__all__ = ["WARMUP", "Timing", "time_call"]

WARMUP = 2
"""Untimed calls before the timed ones, unless :func:`time_call` is told otherwise."""


@dataclass(frozen=True)
class Timing:
    """Seconds per call over the timed calls (warm-up excluded).

    Attributes
    ----------
    median, min, max : float
        Seconds per call.
    reps : int
        Calls timed.
    """

    median: float
    min: float
    max: float
    reps: int


def time_call(fn, *, warmup: int = WARMUP, budget: float = 0.3, min_reps: int = 5,
              slow_reps: int = 3) -> Timing:
    """Time ``fn()`` with :func:`time.perf_counter`.

    Parameters
    ----------
    fn : callable
        Called with no arguments.
    warmup : int
        Untimed calls first; the last of them estimates the cost of a call.
    budget : float
        Seconds of timed calls to aim for: calls repeat until ``budget``
        seconds have passed and at least ``min_reps`` calls were made.
    min_reps : int
        Fewest timed calls for a fast ``fn``.
    slow_reps : int
        Timed calls for a slow ``fn``, one whose last warm-up call alone
        took longer than ``budget``.

    Returns
    -------
    Timing
        Median, min and max seconds per call and the number of calls timed.

    Examples
    --------
    >>> from qkern.timing import time_call
    >>> t = time_call(lambda: sum(range(1000)), budget=0.01)
    >>> t.reps >= 5 and 0 < t.min <= t.median <= t.max
    True
    """
    estimate = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        estimate = time.perf_counter() - t0
    slow = estimate > budget
    times = []
    while True:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if slow and len(times) >= slow_reps:
            break
        if not slow and len(times) >= min_reps and sum(times) >= budget:
            break
    return Timing(statistics.median(times), min(times), max(times), len(times))
