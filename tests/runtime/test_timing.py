"""qkern.timing.time_call: how many calls it makes and what it reports."""

import time

from qkern.timing import Timing, time_call


def counted(seconds: float = 0.0):
    """A function that sleeps ``seconds`` per call, and its call count."""
    calls = []

    def fn():
        calls.append(None)
        if seconds:
            time.sleep(seconds)
    return fn, calls


def test_a_fast_call_repeats_until_the_budget_and_min_reps():
    fn, calls = counted()
    t = time_call(fn, warmup=3, budget=0.02, min_reps=7)
    assert isinstance(t, Timing) and t.reps >= 7 and len(calls) == 3 + t.reps
    assert 0 < t.min <= t.median <= t.max and t.reps * t.max >= 0.02


def test_a_slow_call_is_timed_slow_reps_times():
    fn, calls = counted(0.02)
    t = time_call(fn, warmup=1, budget=0.01, min_reps=50, slow_reps=2)
    assert t.reps == 2 and len(calls) == 3
    assert 0.02 <= t.min <= t.median <= t.max


def test_without_warm_up_a_call_counts_as_fast():
    fn, calls = counted()
    t = time_call(fn, warmup=0, budget=0.0, min_reps=4, slow_reps=1)
    assert t.reps == len(calls) == 4
