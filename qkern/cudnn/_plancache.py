"""A bounded, thread-safe LRU cache of execution plans."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict, namedtuple

__all__ = ["CacheInfo", "PlanCache", "clear_plan_cache", "plan_cache", "plan_cache_info"]

CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize"])

DEFAULT_MAXSIZE = 128


class PlanCache:
    """Key -> plan, least recently used evicted beyond ``maxsize``.

    Lookups take one lock briefly.  A miss builds outside that lock, under a
    lock of its key, so that two threads missing on one key build it once
    while other keys stay available.
    """

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE):
        if maxsize < 1:
            raise ValueError(f"maxsize: expected >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()
        self._building: dict = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key, build):
        """The plan for ``key``, calling ``build()`` on a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
            self.misses += 1
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._entries:
                    return self._entries[key]
            value = build()
            with self._lock:
                self._entries[key] = value
                self._entries.move_to_end(key)
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
                self._building.pop(key, None)
        return value

    def info(self) -> CacheInfo:
        """Hits, misses, bound and current size."""
        with self._lock:
            return CacheInfo(self.hits, self.misses, self.maxsize, len(self._entries))

    def clear(self) -> None:
        """Drop every plan (their descriptors are destroyed) and zero the counters."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


plan_cache = PlanCache(int(os.environ.get("QKERN_CUDNN_PLAN_CACHE_SIZE", DEFAULT_MAXSIZE)))


def plan_cache_info() -> CacheInfo:
    """Statistics of the process-wide plan cache: ``(hits, misses, maxsize, currsize)``.

    The bound is 128 plans, or ``QKERN_CUDNN_PLAN_CACHE_SIZE`` read at import.
    """
    return plan_cache.info()


def clear_plan_cache() -> None:
    """Empty the process-wide plan cache and reset its counters."""
    plan_cache.clear()
