"""This machine's roofline, measured: DRAM read bandwidth and the peak rate
of each instruction the kernels do their work with.

Every figure comes from timing small C loops (src/roofline/) in this process,
so a benchmark can state its results as a share of what this machine, in
this run, can do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from qkern import _cpu, _roofline
from qkern.dispatch import ISA_CAP, ISA_LEVELS

__all__ = ["Roofline", "last_level_cache_bytes", "read_bandwidth", "peak_gflops", "measure"]


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (sysfs, else sysconf; 32 MiB if neither says).

    Returns
    -------
    int
        Bytes.
    """
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as fh:
                    text = fh.read().strip()
            except OSError:
                continue
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
    except OSError:
        pass
    if not best and hasattr(os, "sysconf"):
        try:
            best = max(0, os.sysconf("SC_LEVEL3_CACHE_SIZE"))
        except (ValueError, OSError):
            best = 0
    return best or 32 << 20


def _aligned_buffer(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    buf = raw[start:start + nbytes]
    buf.fill(1)  # touch every page before timing
    return buf


def _check_threads(threads: int) -> None:
    """A measurement on ``threads`` threads must run on that many: refuse
    more than the processors, a forked child's threads, or threads the OS
    cannot start (``qk_threads_for_call``, docs: "Threads")."""
    if threads < 1 or _cpu.threads_for_call(threads) < threads:
        raise ValueError(f"threads={threads}: this process can run "
                         f"{_cpu.threads_for_call(threads)} thread(s) here")


def read_bandwidth(threads: int, nbytes: int | None = None, reps: int = 5) -> list:
    """DRAM read bandwidth with ``threads`` threads, in GB/s, one figure per repetition.

    Parameters
    ----------
    threads : int
        OpenMP threads sharing the read.
    nbytes : int, optional
        Buffer size; default four times the last-level cache (at least 1 GiB),
        so the reads come from DRAM.
    reps : int
        Timed passes over the buffer (after one untimed pass).

    Returns
    -------
    list of float
    """
    _check_threads(threads)
    nbytes = nbytes or max(4 * last_level_cache_bytes(), 1 << 30)
    nbytes -= nbytes % 64
    buf = _aligned_buffer(nbytes)
    _roofline.read_run(buf, threads)
    return [nbytes / _roofline.read_run(buf, threads) / 1e9 for _ in range(reps)]


def _runnable_loops() -> list:
    cap = ISA_LEVELS.index(ISA_CAP)
    return [(i, name, flops) for i, (name, isa, flops) in enumerate(_roofline.peak_loops())
            if isa <= cap]


def peak_gflops(index: int, threads: int, seconds: float = 0.1, reps: int = 3) -> list:
    """GFLOP/s of peak loop ``index`` on ``threads`` threads, one figure per repetition.

    The iteration count is grown until the faster of two runs lasts
    ``seconds / 4``: one run slowed down by another process would otherwise
    stop the growth early, and the timed runs would then be too short to
    measure more than the cost of starting the threads.
    """
    _check_threads(threads)
    flops = _roofline.peak_loops()[index][2]
    iters = 1 << 12
    while min(_roofline.peak_run(index, iters, threads) for _ in range(2)) < seconds / 4:
        iters *= 4
    return [flops * iters * threads / _roofline.peak_run(index, iters, threads) / 1e9
            for _ in range(reps)]


@dataclass
class Roofline:
    """Measured ceilings: ``bandwidth[threads]`` and ``peaks[instruction][threads]``,
    each a list of per-repetition figures (GB/s, GFLOP/s)."""

    bandwidth: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)

    def median_bandwidth(self, threads: int) -> float:
        """Median GB/s with ``threads`` threads."""
        return float(np.median(self.bandwidth[threads]))

    def median_peak(self, instruction: str, threads: int) -> float:
        """Median GFLOP/s of ``instruction`` with ``threads`` threads."""
        return float(np.median(self.peaks[instruction][threads]))


def measure(thread_counts=(1, 2)) -> Roofline:
    """Measure bandwidth and every runnable peak loop for each thread count.

    Returns
    -------
    Roofline
    """
    roof = Roofline()
    for t in thread_counts:
        roof.bandwidth[t] = read_bandwidth(t)
    for index, name, _ in _runnable_loops():
        roof.peaks[name] = {t: peak_gflops(index, t) for t in thread_counts}
    return roof
