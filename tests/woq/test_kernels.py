"""Kernel tester: every registry kernel against the float64 reference.

For each kernel this process may run, sweep the edges of its tile
(k < kr, k == kr, k > kr, k % kr != 0, partial m and n tiles, M = N = K = 1),
every dtype it accepts, strided x and strided (sub-view) output, with the
output poisoned before every call and checked to be fully written (and
nothing outside it touched).  The bound is derived in tests/reference.py.
"""

import itertools
from dataclasses import replace

import numpy as np
import pytest

import qkern
from conftest import kernel_params
from qkern import _woq
from qkern._dtypes import dtype_code
from qkern.dispatch import INT8
from reference import DTYPES, assert_woq_close, first_dtype

POISON = np.nan


def _data(rng, m, n, k, dtype, bias=True):
    x = (rng.standard_normal((m, k)) * 4).astype(dtype)
    w = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    if w.size:
        w.flat[0] = -128
        w.flat[-1] = 127
    s = rng.uniform(0.001, 0.02, n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if bias else None
    return x, w, s, b


def _sweep(kern):
    ks = sorted({1, max(kern.kr - 1, 1), kern.kr, kern.kr + 1, 2 * kern.kr + 1, 17, 64, 255})
    ms = sorted({1, max(kern.mr - 1, 1), kern.mr, kern.mr + 1, 2 * kern.mr + 3})
    ns = sorted({1, max(kern.nr - 1, 1), kern.nr, kern.nr + 1, 2 * kern.nr + 5})
    return ks, ms, ns


def _run_poisoned(layer, x, n, reverse_rows=False, **kwargs):
    """Run into a poisoned sub-view of a larger buffer; check fill and margins.

    ``out`` has the leading shape of x; its rows are one stride apart inside
    the buffer, in reverse order (a negative stride) when asked.  ``kwargs``
    go to the call.
    """
    lead = x.shape[:-1]
    m = int(np.prod(lead))
    big = np.full((m + 2, n + 7), POISON, dtype=x.dtype)
    rows = big[1:1 + m, 3:3 + n]
    out = (rows[::-1] if reverse_rows else rows).reshape(lead + (n,))
    assert np.shares_memory(out, big)
    res = layer(x, out=out, **kwargs)
    assert res is out
    margin = big.copy()
    margin[1:1 + m, 3:3 + n] = 0
    assert np.isnan(margin.astype(np.float64)).sum() == big.size - m * n, "wrote outside out"
    assert not np.isnan(out.astype(np.float64)).any(), "left an output element unwritten"
    return out


@pytest.mark.parametrize("kern", kernel_params())
def test_kernel_tile_edges(kern):
    rng = np.random.default_rng(1)
    ks, ms, ns = _sweep(kern)
    daz = kern.flushes_subnormals
    for dtype in DTYPES:
        if dtype.name not in kern.dtypes:
            continue
        for m, n, k in itertools.product(ms, ns, ks):
            x, w, s, b = _data(rng, m, n, k, dtype, bias=(m + n + k) % 2 == 0)
            layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
            y = _run_poisoned(layer, x, n)
            assert_woq_close(y, x, w, s, b, daz=daz, planes=kern.planes(dtype))


@pytest.mark.parametrize("kern", kernel_params())
def test_kernel_k_zero(kern):
    """K = 0: the product is empty, y = bias (or +0)."""
    for dtype in DTYPES:
        if dtype.name not in kern.dtypes:
            continue
        w = np.zeros((kern.nr + 3, 0), dtype=np.int8)
        s = np.ones(kern.nr + 3, dtype=dtype)
        b = np.arange(kern.nr + 3).astype(dtype)
        x = np.zeros((kern.mr + 1, 0), dtype=dtype)
        y = _run_poisoned(qkern.WoqLinear(w, s, b, kernel=kern.name), x, kern.nr + 3)
        assert np.array_equal(y.astype(np.float64), np.broadcast_to(b.astype(np.float64), y.shape))
        y = _run_poisoned(qkern.WoqLinear(w, s, kernel=kern.name), x, kern.nr + 3)
        assert np.array_equal(y.astype(np.float64), np.zeros(y.shape))


@pytest.mark.parametrize("kern", kernel_params())
def test_kernel_strided_x(kern):
    """Rows one stride apart, rows through an offset table, and a copied x,
    each into a poisoned out (rows forward, or reversed: a negative stride),
    in every dtype the kernel takes (float32 rows off a 64-byte line take
    the GEMVs' copy)."""
    for dtype in map(np.dtype, kern.dtypes):
        _check_strided_x(kern, dtype, np.random.default_rng(2))


def _check_strided_x(kern, dtype, rng):
    m, n, k = 2 * kern.mr + 1, kern.nr + 3, 2 * kern.kr + 37
    x, w, s, b = _data(rng, m, n, k, dtype)
    layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
    expect = _run_poisoned(layer, np.ascontiguousarray(x), n)
    wide = np.full((m, k + 9), np.inf, dtype=dtype)  # inf around x: any over-read shows
    wide[:, 5:5 + k] = x
    assert np.array_equal(_run_poisoned(layer, wide[:, 5:5 + k], n, reverse_rows=True), expect)
    reversed_rows = np.ascontiguousarray(x[::-1])[::-1]
    assert np.array_equal(_run_poisoned(layer, reversed_rows, n), expect)
    cube = np.full((3, m, k + 4), np.inf, dtype=dtype)  # leading axes that do not collapse
    cube[:, :, 2:2 + k] = x
    y3 = _run_poisoned(layer, cube.transpose(1, 0, 2)[:, :, 2:2 + k], n, reverse_rows=True)
    assert y3.shape == (m, 3, n)
    for j in range(3):
        assert np.array_equal(y3[:, j], expect)
    col_strided = np.repeat(x, 2, axis=1)[:, ::2]  # last axis not unit-stride: copied
    assert np.array_equal(_run_poisoned(layer, col_strided, n), expect)


def _off_a_line(shape, dtype, offset, row_pad=0):
    """A 2-D array whose first element lies `offset` bytes past a 64-byte
    line, its rows `row_pad` bytes (a multiple of the itemsize) more than
    their length apart."""
    dtype = np.dtype(dtype)
    m, k = shape
    stride = k * dtype.itemsize + row_pad
    raw = np.zeros(m * stride + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    base = raw[start:start + m * stride].view(dtype)
    return np.lib.stride_tricks.as_strided(base, shape, (stride, dtype.itemsize))


def _unaligned(shape, dtype, fill):
    """An array of `shape` one byte past an aligned address (NumPy allows it)."""
    a = _off_a_line(shape, dtype, 1)
    a[...] = fill
    assert not a.flags.aligned
    return a


@pytest.mark.parametrize("kern", kernel_params())
def test_kernel_unaligned_x_and_out(kern):
    """x and out not aligned to their element size: same bits as aligned arrays.

    Regression: the reference kernels read and wrote elements through typed
    pointers, undefined behaviour on a misaligned row (UBSan reported it).
    """
    rng = np.random.default_rng(5)
    for dtype in DTYPES:
        if dtype.name not in kern.dtypes:
            continue
        m, n, k = kern.mr + 1, kern.nr + 3, 2 * kern.kr + 37
        x, w, s, b = _data(rng, m, n, k, dtype)
        layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
        expect = layer(x)
        out = _unaligned((m, n), dtype, POISON)
        assert layer(_unaligned((m, k), dtype, x), out=out) is out
        assert np.array_equal(out.view(np.uint8), expect.view(np.uint8))


@pytest.mark.parametrize("m", [1, 8, 32])
def test_functional_op_reads_a_weight_off_a_line_to_the_same_bits(m):
    """weight_int8pack_mm reads the caller's row-major array where it lies
    (with this CPU's kernel on the unpacked weight where the rule takes one,
    as it does at M = 1 and 8 on every level): rows starting 1, 16 or 48
    bytes past a 64-byte line (a NumPy array of a few MiB often starts 16
    bytes past one) give the bits of a weight on a line, K past two of the
    AMX GEMV's 128-k blocks and into a partial one."""
    rng = np.random.default_rng(23)
    n, k = 70, 300
    for dtype in DTYPES:
        x, w, s, _ = _data(rng, m, n, k, dtype)
        outs = []
        for offset in (0, 1, 16, 48):
            placed = _off_a_line((n, k), np.int8, offset)
            placed[...] = w
            outs.append(qkern.weight_int8pack_mm(x, placed, s).view(np.uint8))
        for offset, y in zip((1, 16, 48), outs[1:]):
            assert np.array_equal(y, outs[0]), (dtype, m, offset)


@pytest.mark.parametrize("kern", kernel_params())
def test_kernel_thread_count_invariant(kern):
    """Bitwise identical for 1 and 2 threads and for repeated runs."""
    rng = np.random.default_rng(3)
    dtype = np.dtype(kern.dtypes[-1])
    m = 3 * kern.mr + 1
    n = 37 * kern.nr + 5
    k = 515
    x, w, s, b = _data(rng, m, n, k, dtype)
    layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
    y1 = _run_poisoned(layer, x, n, num_threads=1)
    for threads in (2, 2, 1, 3):
        yt = _run_poisoned(layer, x, n, num_threads=threads)
        assert np.array_equal(y1.view(np.uint8), yt.view(np.uint8)), threads


@pytest.mark.parametrize("kern", kernel_params())
def test_kernel_rows_agree_across_mr(kern):
    """A row's result does not depend on how many rows share its kernel call:
    every row count from 1 to MR + 1 gives each row the bits it has alone,
    in every dtype (a kernel that split float32 or float16 rows into bf16
    planes once summed them in an order that depended on its group's
    rows)."""
    rng = np.random.default_rng(4)
    for dtype in (d for d in DTYPES if d.name in kern.dtypes):
        x, w, s, b = _data(rng, kern.mr + 1, kern.nr + 1, 99, dtype)
        layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
        alone = [layer(x[i:i + 1]).view(np.uint8) for i in range(x.shape[0])]
        for m in range(2, x.shape[0] + 1):
            rows = layer(x[:m])
            for i in range(m):
                assert np.array_equal(rows[i:i + 1].view(np.uint8), alone[i]), (dtype, m, i)


@pytest.mark.parametrize("kern", [p for p in kernel_params() if p.values[0].packs_x
                                  and p.values[0].kind == "unpacked"])
def test_kernel_on_packed_xt_is_within_the_bound_at_every_row_count(kern):
    """The kernel on packed x^T at each count of rows of its group, 1 to
    MR (8x1c0: float16 and float32 planes stacked in one B tile to 16
    columns, two above; 32x1c0: a B tile per plane and 16 rows); every row
    within the bound. K = 300 spans two of its 128-k blocks and a partial
    one; at K = 24 the bound is tight enough to miss no plane (float32's
    third, at most 2^-15 of x, weighs more there than the rounding the
    bound allows for)."""
    rng = np.random.default_rng(37)
    n = 40
    for dtype, k in itertools.product(DTYPES, (300, 24)):
        x, w, s, b = _data(rng, kern.mr, n, k, dtype)
        layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
        for m in range(1, kern.mr + 1):
            y = _run_poisoned(layer, x[:m], n)
            assert_woq_close(y, x[:m], w, s, b, daz=kern.flushes_subnormals,
                             planes=kern.planes(dtype))


@pytest.mark.parametrize("kern", [p for p in kernel_params() if p.values[0].kind == "unpacked"])
def test_gemv_x_on_and_off_a_line_agree(kern):
    """The GEMVs read rows of x on 64-byte lines, the driver copying them when
    one is off a line: rows all on a line (no copy), all 16 bytes off, every
    other one off (a row stride of a line and a half), and rows through an
    offset table (leading axes that do not collapse; rows 16 bytes further
    off a line each) give the same bits."""
    rng = np.random.default_rng(12)
    for dtype in map(np.dtype, kern.dtypes):
        m, n, k = kern.mr + 5, 7, 64
        x, w, s, b = _data(rng, m, n, k, dtype)
        layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
        forms = []
        for offset, row_pad in ((0, 0), (16, 0), (0, 32)):
            form = _off_a_line((m, k), dtype, offset, row_pad)
            form[...] = x
            forms.append(form)
        assert forms[0].ctypes.data % 64 == 0 and forms[1].ctypes.data % 64 == 16
        expect = layer(forms[0]).view(np.uint8)
        for form in forms[1:]:
            assert np.array_equal(layer(form).view(np.uint8), expect), dtype
        rows = _off_a_line((2 * m, k), dtype, 0, 16)
        rows[:m] = x
        rows[m:] = x
        cube = np.lib.stride_tricks.as_strided(
            rows, (m, 2, k), (rows.strides[0], m * rows.strides[0], dtype.itemsize))
        y = layer(cube)
        for j in range(2):
            assert np.array_equal(np.ascontiguousarray(y[:, j]).view(np.uint8), expect), dtype


@pytest.mark.parametrize("kern", [p for p in kernel_params() if p.values[0].splits_x])
def test_split_planes_sum_exactly(kern):
    """K = 1, w = 1, scale = 1: y must be x itself, every bit of it, which holds
    only if the kernel's bf16 planes of a float16/float32 x sum to x exactly."""
    rng = np.random.default_rng(10)
    for dtype in (np.dtype(np.float32), np.dtype(np.float16)):
        mant = rng.uniform(1, 2, 200) * 2.0 ** rng.integers(-60 if dtype == np.float32 else -14,
                                                            60 if dtype == np.float32 else 15, 200)
        x = (mant * rng.choice([-1, 1], 200)).astype(dtype).reshape(200, 1)
        w = np.ones((3, 1), np.int8)
        y = qkern.WoqLinear(w, np.ones(3, dtype), kernel=kern.name)(x)
        assert np.array_equal(y, np.repeat(x, 3, axis=1)), dtype


@pytest.mark.parametrize("kern", [p for p in kernel_params() if p.values[0].kind == "kblock"])
def test_packed_x_blocks(kern):
    """Kernels on packed x (the AMX kernels): M over one 2048-row block of
    packed x, N over one 256-column chunk, K over several sub-blocks and over
    1024-k blocks (also both at once, and K = 1024 and 1025); against the
    reference, bitwise the same on 1 and 2 threads, and row for row the same
    as a call of fewer rows."""
    rng = np.random.default_rng(11)
    for (m, n, k), dtype in itertools.product(
            [(2048 + 37, 9 * kern.nr + 3, 19 * 32 + 5), (70, 2 * kern.nr + 5, 2 * 1024 + 37),
             (2048 + 37, 2 * kern.nr + 1, 1024 + 3), (33, 3 * kern.nr, 1024), (5, 7, 1025)],
            DTYPES):
        x, w, s, b = _data(rng, m, n, k, dtype)
        layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
        y = _run_poisoned(layer, x, n, num_threads=2)
        assert_woq_close(y, x, w, s, b, daz=kern.flushes_subnormals, planes=kern.planes(dtype))
        assert np.array_equal(y.view(np.uint8), layer(x, num_threads=1).view(np.uint8))
        assert np.array_equal(y[-37:].view(np.uint8), layer(x[-37:]).view(np.uint8))


def _blockings(kern) -> list:
    """Cuts that move every boundary: one row or one 32-row group per task,
    one panel per chunk (chunk_bytes = 1), all panels in one chunk, the
    smallest K block, a thread for every multiply-add, and both splits."""
    d = kern.blocking
    if kern.kind == "kblock":
        return [replace(d, rows=32, k_block=32), replace(d, rows=64, k_block=64, chunk_bytes=1),
                replace(d, k_block=2048, chunk_bytes=1 << 30, min_macs_per_thread=1)]
    group = 32 if kern.packs_x else 1  # rows packed in blocks of 32 (groups of MR)
    return [replace(d, rows=group, chunk_bytes=1, split=split) for split in ("m", "n")] + [
        replace(d, rows=(kern.mr // group + 1) * group, min_macs_per_thread=1, split="n"),
        replace(d, rows=1 << 20, chunk_bytes=1 << 30)]


@pytest.mark.parametrize("kern", kernel_params())
def test_every_blocking_gives_the_same_bits(kern):
    """Blocking is data (include/qkern/woq.h): a tuner may cut a call in any
    valid way, and no cut changes a bit of the result, whatever the threads."""
    rng = np.random.default_rng(12)
    for dtype in (d for d in DTYPES if d.name in kern.dtypes):
        x, w, s, b = _data(rng, 2 * kern.mr + 35, 3 * kern.nr + 5, 2 * 32 + 7, dtype)
        layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
        want = layer(x, num_threads=1).view(np.uint8)
        for blocking, threads in itertools.product(_blockings(kern), (1, 2)):
            y = _run_poisoned(layer, x, w.shape[0], num_threads=threads, blocking=blocking)
            assert np.array_equal(y.view(np.uint8), want), (blocking, threads)


@pytest.mark.parametrize("kern", kernel_params())
def test_blocking_the_kernel_cannot_take_is_refused(kern):
    d = kern.blocking
    bad = [replace(d, rows=0), replace(d, chunk_bytes=0), replace(d, min_macs_per_thread=0),
           replace(d, rows=-1), replace(d, chunk_bytes=2**32)]
    bad += [replace(d, split="k"), replace(d, split=1)]
    bad += ([replace(d, rows=33), replace(d, k_block=48), replace(d, k_block=0),
             replace(d, split="m")]
            if kern.kind == "kblock" else [replace(d, k_block=32)])
    bad += [replace(d, rows=48)] if kern.packs_x and kern.kind != "kblock" else []
    dtype = first_dtype(kern)
    layer = qkern.WoqLinear(np.ones((3, 5), np.int8), np.ones(3, dtype), kernel=kern.name)
    x = np.ones((2, 5), dtype)
    for blocking in bad:
        with pytest.raises(ValueError, match="blocking"):
            layer(x, blocking=blocking)
    with pytest.raises(TypeError, match="blocking"):
        layer(x, blocking=(256, 1, 0, 1))
    # the driver itself refuses what Python would (the thin layer checks nothing)
    y = np.empty((2, 3), np.float32)
    with pytest.raises(ValueError, match="refused"):
        _woq.gemm(kern.index, x, 2, 3, 5, dtype_code(dtype), x.strides[0], None,
                  layer.packed_weight.data, layer._scale_f32, None,
                  y, 12, 1, (33, 1, 48, 1, 1) if kern.kind == "kblock" else (1, 1, 32, 1, 0))
    with pytest.raises(ValueError, match="refused"):  # an unknown split; a kblock kernel's "m"
        _woq.gemm(kern.index, x, 2, 3, 5, dtype_code(dtype), x.strides[0], None,
                  layer.packed_weight.data, layer._scale_f32, None, y, 12, 1,
                  kern.blocking.to_driver()[:4] + (0 if kern.kind == "kblock" else 2,))


@pytest.mark.parametrize("level", qkern.dispatch.ISA_LEVELS)
def test_kernels_of_one_level_give_a_row_the_same_bits(level):
    """docs/semantics.rst, "Determinism": the kernels of one ISA level on
    packed panels differ only in MR, so a row's result does not depend on
    the kernel that M selects, nor on the rows passed with it."""
    kernels = [k for k in qkern.kernels()
               if k.isa == level and k.kind != "unpacked" and k.weight_format == INT8]
    if not kernels or not kernels[0].available:
        pytest.skip(f"no kernel of level {level} may run here")
    rng = np.random.default_rng(13)
    for dtype in DTYPES:
        group = [k for k in kernels if dtype.name in k.dtypes]
        if len(group) < 2:
            continue
        x, w, s, b = _data(rng, 37, 3 * 32 + 5, 131, dtype)
        want = None
        for kern in group:
            y = qkern.WoqLinear(w, s, b, kernel=kern.name)(x).view(np.uint8)
            want = y if want is None else want
            assert np.array_equal(y, want), (kern.name, group[0].name, dtype)


def _reads_widened_copy():
    return [p for p in kernel_params() if p.values[0].reads_widened_copy]


@pytest.mark.parametrize("kern", _reads_widened_copy())
def test_widened_copy_gives_the_bits_of_the_packed_weight(kern):
    """A weight widened beforehand (include/qkern/woq.h) runs through the
    same driver without widening: every blocking and thread count gives the
    bits of the packed weight, the partial last panel included."""
    from qkern.woq import _run

    rng = np.random.default_rng(14)
    for dtype in (d for d in DTYPES if d.name in kern.dtypes):
        x, w, s, b = _data(rng, 2 * kern.mr + 5, 3 * kern.nr + 5, 2 * 32 + 7, dtype)
        layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
        want = layer(x, num_threads=1).view(np.uint8)
        wide = layer.packed_weight.widened(kern)
        assert wide.nbytes == qkern.dispatch.widened_nbytes(kern, *w.shape) > 0
        assert wide.ctypes.data % 64 == 0 and not wide.flags.writeable
        for blocking, threads in itertools.product([None] + _blockings(kern), (1, 2)):
            y = _run(kern, x, layer.packed_weight.data, layer.layout, *w.shape, layer._scale_f32,
                     layer._bias_f32, None, threads, (), blocking, wide)
            assert np.array_equal(y.view(np.uint8), want), (blocking, threads)


def test_a_widened_copy_is_refused_where_it_does_not_fit():
    """The thin layer checks the copy's size and that the kernel reads one."""
    x, y = np.ones((2, 5), np.float32), np.empty((2, 3), np.float32)
    plain = next(k for k in qkern.kernels() if k.available and not k.widened)
    layer = qkern.WoqLinear(np.ones((3, 5), np.int8), np.ones(3, np.float32), kernel=plain.name)
    assert qkern.dispatch.widened_nbytes(plain, 3, 5) == 0
    with pytest.raises(ValueError, match="reads no widened copy"):
        _woq.gemm(plain.index, x, 2, 3, 5, 0, 20, None, layer.packed_weight.data,
                  layer._scale_f32, None, y, 12, 1, None, True)
    with pytest.raises(ValueError, match="reads no widened copy"):
        layer.packed_weight.widened(plain)
    for param in _reads_widened_copy():
        kern = param.values[0]
        if not kern.available:
            continue
        dt = first_dtype(kern)
        layer = qkern.WoqLinear(np.ones((3, 5), np.int8), np.ones(3, dt), kernel=kern.name)
        short = layer.packed_weight.widened(kern)[:-1]
        with pytest.raises(ValueError, match="widened weight: holds"):
            _woq.gemm(kern.index, x.astype(dt), 2, 3, 5, dtype_code(dt), 5 * dt.itemsize, None,
                      short, layer._scale_f32, None, y.astype(dt), 3 * dt.itemsize, 1, None, True)


@pytest.mark.parametrize("kern", _reads_widened_copy())
def test_widened_copy_size_edges(kern):
    """Sizes that overflow a size_t say so (SIZE_MAX), and do not fit any
    budget; a weight of no k has no copy to make."""
    size_max = 2**64 - 1
    assert _woq.widened_size(kern.index, 16, 2**58) == size_max
    assert _woq.widened_size(kern.index, 16, 2**58 + 16) == size_max
    assert _woq.widened_size(kern.index, size_max, 16) == size_max
    assert not qkern.dispatch.widened_copy_fits(kern, 16, 2**58, 2**70)
    assert not qkern.dispatch.widened_copy_fits(kern, 16, 0, 1 << 30)
    assert qkern.dispatch.widened_copy_fits(kern, 17, 5, qkern.dispatch.widened_nbytes(kern, 17, 5))


@pytest.mark.parametrize("kern", _reads_widened_copy())
def test_a_misaligned_widened_copy_gives_the_same_bits(kern):
    from qkern.woq import _run

    rng = np.random.default_rng(15)
    x, w, s, b = _data(rng, 7, kern.nr + 3, 37, first_dtype(kern))
    layer = qkern.WoqLinear(w, s, b, kernel=kern.name)
    wide = layer.packed_weight.widened(kern)
    shifted = qkern.packing.aligned_empty(wide.nbytes + 16)[16:]
    shifted[:] = wide
    y = _run(kern, x, layer.packed_weight.data, layer.layout, *w.shape, layer._scale_f32,
             layer._bias_f32, None, 1, (), None, shifted)
    assert np.array_equal(y.view(np.uint8), layer(x).view(np.uint8))
