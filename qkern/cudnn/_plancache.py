"""The process-wide cache of cuDNN execution plans: a bounded, thread-safe
LRU (:class:`qkern._lru.LruCache`) of 128 plans, or
``QKERN_CUDNN_PLAN_CACHE_SIZE`` read at import. A plan dropped from it
destroys its descriptors."""

from __future__ import annotations

import os

from qkern._lru import CacheInfo
from qkern._lru import LruCache as PlanCache

__all__ = ["CacheInfo", "PlanCache", "clear_plan_cache", "plan_cache", "plan_cache_info"]

DEFAULT_MAXSIZE = 128

plan_cache = PlanCache(int(os.environ.get("QKERN_CUDNN_PLAN_CACHE_SIZE", DEFAULT_MAXSIZE)))


def plan_cache_info() -> CacheInfo:
    """Statistics of the process-wide plan cache: ``(hits, misses, maxsize, currsize)``.

    The bound is 128 plans, or ``QKERN_CUDNN_PLAN_CACHE_SIZE`` read at import.
    """
    return plan_cache.info()


def clear_plan_cache() -> None:
    """Empty the process-wide plan cache and reset its counters."""
    plan_cache.clear()
