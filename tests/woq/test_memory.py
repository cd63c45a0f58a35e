"""Memory: repeated calls do not grow the process, packed weights go away
with their layer, and no call allocates more than its problem needs.

Resident memory is read from /proc/self/statm (Linux).  Why the bounds
below are what they are:

* Every call of `_small_calls` allocates its result (4 x 256 float32,
  4 KiB) unless ``out`` is given, and the functional form also packs a
  256 x 64 weight (16 KiB) and widens scales and bias.  Leaking any of these
  once per call grows the process by at least 40 MB over `CALLS` calls.
* What does move without a leak is allocator state: glibc's and Python's
  free lists and arenas, which the warm-up calls fill first.  Free memory
  glibc kept from earlier tests (resident, so a leak could reuse it unseen)
  is handed back with ``malloc_trim`` before the first reading.  Measured here
  it stays at 0 MiB on the CI machine (with one exception, a one-time step:
  see `test_rss_flat_over_10000_small_calls`); `RSS_BOUND` allows 4 MiB, a tenth of the smallest
  leak above.
* A leaked *reference* to an argument costs no memory when the same array
  is passed every time, so reference counts are checked too: one leaked
  reference per call would add `CALLS` to them.

`test_rss_sees_a_leak_of_one_result_per_call` shows that the measurement
does see the smallest of those leaks.

Under AddressSanitizer (``make sanitize``) the resident size measures its
allocator (freed blocks wait in a quarantine of up to 256 MiB), not qkern;
the tests that read it are skipped there, and run in every other pass.
"""

import ctypes
import ctypes.util
import gc
import os
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

import qkern
from process_support import asan_loaded
from reference import BF16, woq_reference

CALLS = 10_000
WARMUP = 1_000
RSS_BOUND = 4 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                                reason="needs Linux /proc/self/statm")


reads_rss = pytest.mark.skipif(
    asan_loaded(), reason="under AddressSanitizer the resident size measures its "
                           "quarantine of freed blocks, not qkern")


_MALLOC_TRIM = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)


def _settle() -> None:
    """Collect garbage and hand glibc's free heap memory back to the OS, so
    that what is resident afterwards is what is live."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _small_calls(kind: str):
    """A small WoQ call of the given kind, and the arrays it passes every time."""
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (256, 64), dtype=np.int8)
    s = rng.uniform(0.01, 0.02, 256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    layer = qkern.WoqLinear(w, s, b)
    if kind == "layer":
        return (lambda: layer(x)), (x,)
    if kind == "layer_out":
        out = np.empty((4, 256), np.float32)
        return (lambda: layer(x, out=out, num_threads=1)), (x, out)
    if kind == "function":
        return (lambda: qkern.weight_int8pack_mm(x, w, s, bias=b)), (x, w, s, b)
    if kind == "row_offsets":  # leading axes that do not collapse: an offset table per call
        x4 = rng.standard_normal((2, 3, 2, 64)).astype(BF16)[:, ::2]
        layer16 = qkern.WoqLinear(w, s.astype(BF16))
        return (lambda: layer16(x4)), (x4,)
    raise ValueError(kind)


def _growth_over_calls(call) -> int:
    """Bytes the resident size grew by over `CALLS` calls of ``call``."""
    before = rss()
    for _ in range(CALLS):
        call()
    gc.collect()
    return rss() - before


@reads_rss
@pytest.mark.parametrize("kind", ["layer", "layer_out", "function", "row_offsets"])
def test_rss_flat_over_10000_small_calls(kind):
    """Over 10000 calls the resident size stays within `RSS_BOUND`.  Inside
    the whole suite, allocator state once moved by 4 MiB + 4 KiB during the
    10000 calls (in one of the seven passes of a CI run on the AMX Xeon):
    a step, not a slope.  So a window past the bound, but within twice
    it, is followed by a second one, which must stay within it: a leak of
    the smallest kind (40 MB per window) grows the process in every
    window, and a larger step in one window fails at once."""
    call, args = _small_calls(kind)
    for _ in range(WARMUP):
        call()
    _settle()
    refs = [sys.getrefcount(a) for a in args]
    growths = [_growth_over_calls(call)]
    if RSS_BOUND <= growths[0] < 2 * RSS_BOUND:
        _settle()
        growths.append(_growth_over_calls(call))
    assert growths[-1] < RSS_BOUND, (
        f"RSS grew by {', then '.join(f'{g / 2**20:.1f}' for g in growths)} MiB over {CALLS} calls")
    assert [sys.getrefcount(a) for a in args] == refs, "a call leaked a reference to an argument"


@reads_rss
def test_rss_sees_a_leak_of_one_result_per_call():
    """The control: keeping every result (the smallest leak above) is seen."""
    call, _ = _small_calls("layer")
    for _ in range(WARMUP):
        call()
    _settle()
    before = rss()
    kept = [call() for _ in range(CALLS)]
    assert rss() - before > 5 * RSS_BOUND
    del kept


def test_packed_weight_freed_with_its_layer():
    """Nothing keeps the packed weight (or the buffer it is a view of) alive."""
    layer = qkern.WoqLinear(np.ones((64, 48), np.int8), np.ones(64, np.float32))
    packed = weakref.ref(layer.packed_weight)
    packed_buffer = weakref.ref(layer.packed_weight.data.base)
    layer(np.ones((3, 48), np.float32))
    del layer
    gc.collect()
    assert packed() is None and packed_buffer() is None, "the packed weight outlived its layer"


@reads_rss
def test_packed_weight_memory_returned_with_its_layer():
    """The packed copy of a 64 MiB weight is returned to the OS with its layer.

    64 MiB is above glibc's largest mmap threshold (32 MiB), so the buffer is
    a mapping of its own and freeing it lowers the resident size at once.
    """
    n = k = 8192
    w = np.ones((n, k), np.int8)
    gc.collect()
    before = rss()
    layer = qkern.WoqLinear(w, np.ones(n, np.float32))
    assert rss() - before > 60 << 20, "packing did not write the packed copy"
    del layer
    gc.collect()
    assert rss() - before < RSS_BOUND


def _peak_traced(fn) -> int:
    """Peak bytes Python and NumPy allocated while ``fn()`` ran (tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_broadcast_x_with_strided_last_axis_copies_distinct_rows_only():
    """Regression (found building the fuzz targets' huge shapes): x broadcast
    over M rows (stride 0) with a stepped last axis was copied whole: for
    M = 2**15 + 1, K = 2**16, 8 GiB for 256 KiB of distinct data.  Only the
    distinct rows are copied now, so M = 4096 rows cost what one row costs
    (the whole copy would be 64 MiB)."""
    k, m = 4096, 4096
    row = np.zeros(2 * k, np.float32)[::2]  # last axis stepped: x must be copied
    row[:] = np.arange(k) % 7 - 3
    x = np.lib.stride_tricks.as_strided(row, (m, k), (0, row.strides[0]))
    w = np.ones((2, k), np.int8)
    w[1, ::2] = -1
    s = np.ones(2, np.float32)
    y = np.empty((m, 2), np.float32)
    one_row = _peak_traced(lambda: qkern.weight_int8pack_mm(x[:1], w, s, out=y[:1]))
    all_rows = _peak_traced(lambda: qkern.weight_int8pack_mm(x, w, s, out=y))
    assert all_rows < one_row + (1 << 20), (all_rows, one_row)
    assert (y == woq_reference(row[None], w, s).astype(np.float32)).all()


@pytest.mark.parametrize("batch", [None, 2], ids=["rows", "broadcast_batch"])
def test_copy_of_overlapping_rows_made_in_bounded_blocks(batch):
    """Regression: x with overlapping rows (a sliding window) and a stepped
    last axis was copied to a full M x K array: 126 MiB here, for an x that
    spans 256 KiB.  The copy is now made in blocks of rows of at most
    max(4 MiB, the bytes x spans), each run before the next is made; a
    leading broadcast axis (here two equal batches) changes nothing."""
    base = np.random.default_rng(3).standard_normal(2**16).astype(np.float32)
    x = np.lib.stride_tricks.sliding_window_view(base, 1024)[:, ::2]  # (64513, 512)
    if batch:
        x = np.broadcast_to(x, (batch,) + x.shape)
    w = np.random.default_rng(4).integers(-128, 128, (2, 512), dtype=np.int8)
    s = np.ones(2, np.float32)
    y = np.empty(x.shape[:-1] + (2,), np.float32)
    peak = _peak_traced(lambda: qkern.weight_int8pack_mm(x, w, s, out=y))
    assert peak < (4 << 20) + (1 << 20), peak  # one block, and its row indices
    want = qkern.weight_int8pack_mm(np.ascontiguousarray(x[(0,) * (x.ndim - 2)]), w, s)
    assert y.reshape(-1, *want.shape).tobytes() == np.stack([want] * (batch or 1)).tobytes()


@pytest.mark.parametrize("shape", [(2**21,), (1, 2**21), (3, 2**21)])
def test_rows_larger_than_a_copy_block(shape):
    """x broadcast along K (stride 0), each row larger than a copy block
    (8 MiB of float32): copied a row at a time, or whole where it is one
    row.  Regression: a 1-D x of this kind failed in the block path."""
    x = np.broadcast_to(np.float32(0.5), shape)
    w = np.ones((3, shape[-1]), np.int8)
    w[1] = -1
    y = qkern.weight_int8pack_mm(x, w, np.ones(3, np.float32))
    assert y.shape == shape[:-1] + (3,)
    assert (y == np.array([2**20, -2**20, 2**20], np.float32)).all()
