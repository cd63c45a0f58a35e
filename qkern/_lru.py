"""A bounded, thread-safe least-recently-used cache that builds each missing value once.

Unlike :func:`functools.lru_cache`, each lookup brings the function that
builds its value (so a value may be built from state the key leaves out, a
cuDNN handle or a stream), and threads that miss on one key at the same time
call that function once between them. The cuDNN plan cache
(:mod:`qkern.cudnn._plancache`) is one; a kernel tuner's table is another.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, namedtuple

__all__ = ["CacheInfo", "LruCache"]

CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize"])


class LruCache:
    """Key -> value, the least recently used evicted beyond ``maxsize``.

    Lookups take one lock briefly. A miss builds outside that lock, under a
    lock of its key, so that threads missing on one key build it once while
    other keys stay available. A build that raises caches nothing: the
    exception reaches its caller and the next lookup builds again.

    Parameters
    ----------
    maxsize : int
        The most values held, at least 1.

    Examples
    --------
    >>> cache = LruCache(maxsize=2)
    >>> cache.get("a", lambda: 1), cache.get("b", lambda: 2), cache.get("a", lambda: 0)
    (1, 2, 1)
    >>> cache.get("c", lambda: 3)       # evicts "b", the least recently used
    3
    >>> cache.info()
    CacheInfo(hits=1, misses=3, maxsize=2, currsize=2)
    """

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"maxsize: expected >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()
        self._building: dict = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key, build):
        """The value of ``key``, from ``build()`` on a miss.

        Parameters
        ----------
        key : hashable
            What the value is cached under.
        build : callable
            Called with no arguments, at most once per miss, to make the value.

        Returns
        -------
        object
            The cached or newly built value.
        """
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
        """Hits, misses, the bound and the current size.

        Returns
        -------
        CacheInfo
            ``(hits, misses, maxsize, currsize)``.
        """
        with self._lock:
            return CacheInfo(self.hits, self.misses, self.maxsize, len(self._entries))

    def clear(self) -> None:
        """Drop every value and zero the counters."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0
