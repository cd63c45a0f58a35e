"""qkern._lru.LruCache: eviction order, counters, and a missing key built
once however many threads ask for it first."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from qkern._lru import CacheInfo, LruCache


def test_the_least_recently_used_key_goes_first():
    cache = LruCache(maxsize=3)
    for key in "abc":
        cache.get(key, lambda key=key: key.upper())
    assert cache.get("a", lambda: "rebuilt") == "A"        # a is now the most recent
    cache.get("d", lambda: "D")                            # evicts b
    assert list(cache._entries) == ["c", "a", "d"]
    assert cache.get("c", lambda: "rebuilt") == "C"        # hit: c moves last
    cache.get("e", lambda: "E")                            # evicts a
    assert list(cache._entries) == ["d", "c", "e"]
    assert cache.get("b", lambda: "B2") == "B2"            # rebuilt after eviction
    assert cache.info() == CacheInfo(hits=2, misses=6, maxsize=3, currsize=3)


def test_clear_keeps_the_bound_and_a_bound_below_one_is_refused():
    cache = LruCache(maxsize=1)
    cache.get(1, lambda: 1)
    cache.get(1, lambda: 1)
    cache.clear()
    assert cache.info() == (0, 0, 1, 0)
    with pytest.raises(ValueError, match="maxsize"):
        LruCache(maxsize=0)


def test_eight_threads_missing_one_key_build_it_once():
    cache = LruCache(maxsize=4)
    start = threading.Barrier(8)
    builds = []

    def build():
        builds.append(threading.get_ident())
        time.sleep(0.05)                   # the others arrive while this builds
        return object()

    def first_use(_):
        start.wait()
        return cache.get("key", build)

    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(first_use, range(8)))
    assert len(builds) == 1
    assert all(v is values[0] for v in values)
    info = cache.info()
    assert info.hits + info.misses == 8 and info.currsize == 1


def test_other_keys_are_served_while_one_builds():
    cache = LruCache(maxsize=4)
    release, building = threading.Event(), threading.Event()

    def slow():
        building.set()
        release.wait(5)
        return "slow"

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(cache.get, "slow", slow)
        assert building.wait(5)
        assert cache.get("fast", lambda: "fast") == "fast" and not pending.done()
        release.set()
        assert pending.result() == "slow"


def test_a_failed_build_caches_nothing():
    cache = LruCache(maxsize=2)

    def fail():
        raise KeyError("no plan")

    with pytest.raises(KeyError):
        cache.get("k", fail)
    assert cache.info().currsize == 0
    assert cache.get("k", lambda: "built") == "built"
