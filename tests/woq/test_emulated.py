"""AVX-512, AVX-512-BF16 and AMX kernels on any AVX2 machine, compiled
over SIMDe and C tiles (tests/emulated_kernels.py). Each int4 kernel must
give the bits of the reference of its compute (include/qkern/woq.h, "Order
of the sums") on every mr, column count, dtype and group size, into
poisoned outputs; each AMX K-block kernel, run block by block as the
driver runs it, must stay within the bound of its result and give the
same bits whatever the K blocks. This checks the kernels' logic
(indexing, masks, tails, tile shapes, the order of the sums) where the CPU
cannot run them; their instructions run natively in tests/woq/test_int4.py
and tests/woq/test_kernels.py on those machines. (The single-call int8
kernels of these levels run emulated through the sweeps of
tests/woq/test_ukernels.py.)"""

import ctypes
import itertools
from dataclasses import replace

import numpy as np
import pytest

import emulated_kernels as emu
import qkern
from qkern import _woq
from qkern._dtypes import bfloat16, dtype_code
from qkern.dispatch import INT4
from reference import assert_int4_close, assert_woq_close, int4_dequantized_model
from ukernel_tester import packed_panels

# The emulated library is not capped by QKERN_ISA, and the native kernels
# checked here are those of the CPU's level and below: make test runs this
# module once, in its uncapped pass (and make sanitize in its pass at the
# CPU's level, under ASan).
pytestmark = pytest.mark.skipif(
    qkern.dispatch.ISA_CAP != qkern.dispatch.CPU_ISA,
    reason="the emulated kernels are not capped by QKERN_ISA; the uncapped pass runs them")

# the int4 kernels called directly on packed panels; a kernel on
# dequantized panels runs through the driver (below)
EMULATED = [k for k in emu.emulated_kernels(INT4) if not k.dequantizes]
DEQUANTIZING = [k for k in emu.emulated_kernels(INT4) if k.dequantizes]
DTYPES = (np.float32, np.float16, bfloat16)


@pytest.fixture(scope="module")
def library():
    """The emulated kernels and the reference ones (tests/emulated_kernels.py)."""
    return emu.library()


def _run(fn, rows, nc, kc, group_size, x_rows, dtype, panels, sz, bias, c):
    """One micro-kernel call on ``rows`` of ``x_rows`` (f32 with group sums)."""
    ptrs = (ctypes.c_void_p * len(rows))(*(x_rows[r].ctypes.data for r in rows))
    fn(len(rows), nc, kc, group_size, ptrs, dtype_code(dtype), panels.ctypes.data,
       sz.ctypes.data, sz.strides[0], bias.ctypes.data if bias is not None else None,
       c.ctypes.data, c.strides[0])


def _x_with_group_sums(x, group_size):
    """Rows of f32 x followed by their group sums, each summed in increasing
    k from 0 in f32 (qk_woq_group_sums)."""
    m, k = x.shape
    sums = np.add.accumulate(x.reshape(m, k // group_size, group_size), axis=2)[:, :, -1]
    return np.ascontiguousarray(np.concatenate([x, sums], axis=1), dtype=np.float32)


def test_every_kernel_of_the_emulated_isa_is_emulated(library):
    """The registry has kernels of every emulated level to check, and the
    emulated library holds each one under the symbol its name gives."""
    kernels = [k for fmt in (INT4, qkern.dispatch.INT8) for kblock in (False, True)
               for k in emu.emulated_kernels(fmt, kblock)]
    assert {k.isa for k in kernels} == set(emu.EMULATED_ISAS), kernels
    for kern in kernels:
        assert hasattr(library, emu.symbol(kern)), kern.name


def _int4_cases(rng, dtype, rows):
    """Problems for ``rows`` rows of x: nine groups of 32 (four side by
    side, two, one) and two of 64, one to seven panels; x spread over
    2**-8 .. 2**8 (so that sums of bf16 products round, and a change of
    order shows in the bits) or near fp32's smallest normal (so that
    products and sums cross the subnormal range, where vdpbf16ps flushes).
    Yields (group_size, nc, q, packed panels, scales_and_zeros, padded
    bias, x in f32)."""
    for scale in ("spread", "tiny"):
        for group_size, groups in ((32, 9), (64, 2)):
            kc = group_size * groups
            for nc in ((1, 16, 17, 32, 45, 64, 96, 100, 129, 160, 200) if scale == "spread"
                       else (17, 100)):
                q = rng.integers(0, 16, (nc, kc), dtype=np.uint8)
                sz = rng.standard_normal((groups, nc, 2)).astype(dtype)
                bias = qkern.woq._padded_f32(rng.standard_normal(nc).astype(np.float32), 32)
                x = rng.standard_normal((rows, kc)) * (
                    2.0 ** rng.integers(-8, 9, (rows, kc)) if scale == "spread" else 2.0**-125)
                yield (group_size, nc, q, qkern.pack_int4(q).reshape(-1), sz, bias,
                       x.astype(dtype).astype(np.float32))


def _long_group_cases(rng, dtype, rows):
    """Two groups of 128 and of 256 k (4 and 8 chunks of 32 a group) on 45
    columns, x spread, as :func:`_int4_cases` yields them."""
    for group_size in (128, 256):
        nc, kc = 45, 2 * group_size
        q = rng.integers(0, 16, (nc, kc), dtype=np.uint8)
        sz = rng.standard_normal((2, nc, 2)).astype(dtype)
        bias = qkern.woq._padded_f32(rng.standard_normal(nc).astype(np.float32), 32)
        x = rng.standard_normal((rows, kc)) * 2.0 ** rng.integers(-8, 9, (rows, kc))
        yield (group_size, nc, q, qkern.pack_int4(q).reshape(-1), sz, bias,
               x.astype(dtype).astype(np.float32))


def _reference_bits(reference, kern, dtype, group_size, nc, q, panels, sz, bias, x, x_rows):
    """The reference's results for every row of x (x_rows: with its group
    sums) with bias (key False) and without (True), checked within the
    bound."""
    want = {}
    for b in (bias, None):
        want[b is None] = np.empty((len(x), nc), dtype)
        for r in range(len(x)):  # the references take one row at a time
            _run(reference, [r], nc, x.shape[1], group_size, x_rows, dtype, panels, sz, b,
                 want[b is None][r:r + 1])
    assert_int4_close(want[True], x.astype(dtype), q, sz, group_size,
                      daz=kern.flushes_subnormals)
    return want


@pytest.mark.parametrize("kern", EMULATED, ids=lambda k: k.name)
def test_emulated_int4_kernel_gives_the_reference_bits(library, kern):
    name, mr_max = emu.symbol(kern), kern.mr
    kernel, reference = getattr(library, name), getattr(library, emu.int4_reference(kern.name))
    rng = np.random.default_rng(11)
    for dtype in (d for d in DTYPES if np.dtype(d).name in kern.dtypes):
        bits = np.uint32 if dtype == np.float32 else np.uint16
        for group_size, nc, q, panels, sz, bias, x in _int4_cases(rng, dtype, mr_max):
            x_rows = _x_with_group_sums(x, group_size)
            want = _reference_bits(reference, kern, dtype, group_size, nc, q, panels, sz, bias, x,
                                   x_rows)
            for mr in range(1, mr_max + 1):
                for b in (bias, None):
                    big = np.full((mr + 2, nc + 11), np.nan, dtype)
                    c = big[1:1 + mr, 3:3 + nc]
                    _run(kernel, range(mr), nc, x.shape[1], group_size, x_rows, dtype, panels,
                         sz, b, c)
                    outside = big.astype(np.float64)
                    outside[1:1 + mr, 3:3 + nc] = np.nan
                    assert np.isnan(outside).all(), f"{name} wrote outside its output"
                    assert np.array_equal(c.view(bits), want[b is None][:mr].view(bits)), (
                        np.dtype(dtype).name, group_size, nc, mr, b is not None)


def test_native_vdpbf16ps_kernels_give_the_model_bits(library):
    """Where this process runs the bf16_qb4w kernels, the CPU's vdpbf16ps
    must sum as include/qkern/woq.h says (the Intel SDM's order, modelled in
    tests/emulation/bf16-qb4w-model.c): each kernel, called alone on every
    mr, gives the model's bits."""
    native = [k for k in EMULATED if emu.int4_reference(k.name) == emu.INT4_REFERENCES[
        "bf16_qb4w"] and k.available]
    if not native:
        pytest.skip("no bf16_qb4w kernel runs here (the CPU or QKERN_ISA caps it)")
    model = getattr(library, emu.INT4_REFERENCES["bf16_qb4w"])
    rng = np.random.default_rng(13)
    for kern in native:
        for group_size, nc, q, panels, sz, bias, x in _int4_cases(rng, bfloat16, kern.mr):
            want = _reference_bits(model, kern, bfloat16, group_size, nc, q, panels, sz, bias, x,
                                   _x_with_group_sums(x, group_size))
            for mr in range(1, kern.mr + 1):
                c = np.empty((mr, nc), bfloat16)
                _woq.ukernel_int4(kern.index, mr, nc, x.shape[1], group_size, x[:mr],
                                  dtype_code(bfloat16), panels, sz, bias, c, c.strides[0])
                assert np.array_equal(c.view(np.uint16), want[False][:mr].view(np.uint16)), (
                    kern.name, group_size, nc, mr)


def test_emulated_int8_kernels_of_one_layout_give_a_row_the_same_bits(library):
    """The int8 kernels of one emulated level on one packed layout differ
    only in MR and in reading the panels widened or not (docs/semantics.rst,
    "Determinism"): each row of a problem gets the same bits from every one
    of them, called on rows one MR at a time."""
    kernels = [k for k in emu.emulated_kernels(qkern.dispatch.INT8) if k.kind == "panels"]
    families = {(k.isa, k.layout) for k in kernels}
    assert {isa for isa, _ in families} == {"avx512", "avx512_bf16"}, families
    rng = np.random.default_rng(17)
    m, n, k = 13, 70, 37
    for isa, layout in families:
        group = [kern for kern in kernels if (kern.isa, kern.layout) == (isa, layout)]
        assert len(group) > 1, group
        nr, kr = layout
        n_padded = -(-n // nr) * nr
        panels = packed_panels(rng.integers(-128, 128, (n, k), dtype=np.int8), nr, kr)
        scale = np.zeros(n_padded, np.float32)
        scale[:n] = rng.uniform(1e-3, 1e-2, n)
        bias = np.zeros(n_padded, np.float32)
        bias[:n] = rng.standard_normal(n)
        for dtype in (d for d in DTYPES if np.dtype(d).name in group[0].dtypes):
            x_dtype = rng.standard_normal((m, k)).astype(dtype)
            outs = []
            for kern in group:
                x = x_dtype.astype(np.float32) if kern.converts_x else x_dtype
                call, y = emu.ukernel_call(kern), np.empty((m, n), dtype)
                w = emu.widened_weight(kern)(panels, n_padded, k) if kern.widened else panels
                for r in range(0, m, kern.mr):
                    rows = min(kern.mr, m - r)
                    call(rows, n, k, x[r:r + rows], dtype_code(dtype), w, scale, bias,
                         y[r:r + rows], y.strides[0])
                outs.append(y.view(np.uint8))
            for kern, y in zip(group[1:], outs[1:]):
                assert np.array_equal(y, outs[0]), (kern.name, group[0].name, dtype)


KBLOCK = emu.emulated_kernels(qkern.dispatch.INT8, kblock=True)


@pytest.mark.parametrize("kern", KBLOCK, ids=lambda k: k.name)
def test_emulated_amx_kernel_is_within_the_bound_whatever_the_k_blocks(library, kern):
    """Each AMX kernel on one group of 1 to 32 rows (one or both halves of
    its A and C tiles), one to three panels (whole and partial), K below,
    at and past one 32-k chunk and over several sub-blocks of chunks: the
    result of its calls block by block is within the bound of
    tests/reference.py (x in bf16 planes, subnormals flushed), only rows
    < mr and columns < nc are written, and K blocks of 32, 64 or all of K
    give the same bits (each output one sum over K in a fixed order)."""
    rng = np.random.default_rng(19)
    for dtype in DTYPES:
        bits = np.uint32 if dtype == np.float32 else np.uint16
        for mr, nc, k in ((1, 1, 1), (5, 45, 31), (16, 32, 33), (17, 70, 100), (32, 96, 64),
                          (32, 17, 16 * 32 + 7)):
            x = (rng.standard_normal((mr, k)) * 4).astype(dtype)
            w = rng.integers(-128, 128, (nc, k), dtype=np.int8)
            panels = packed_panels(w, 32, 2)
            scale = qkern.woq._padded_f32(rng.uniform(1e-3, 2e-2, nc).astype(np.float32), 32)
            bias = qkern.woq._padded_f32(rng.standard_normal(nc).astype(np.float32), 32)
            results = []
            for k_block in (32, 64, max(k, 32)):
                big = np.full((mr + 2, nc + 11), np.nan, dtype)
                c = big[1:1 + mr, 3:3 + nc]
                emu.kblock_run(getattr(library, emu.symbol(kern)), kern, x, dtype, panels, nc, c,
                               k_block, scale, bias)
                outside = big.astype(np.float64)
                outside[1:1 + mr, 3:3 + nc] = np.nan
                assert np.isnan(outside).all(), f"{kern.name} wrote outside its output"
                results.append(c.view(bits).copy())
            assert_woq_close(c, x, w, scale[:nc], bias[:nc], daz=True, planes=kern.planes(dtype))
            for k_block, y in zip((64, k), results[1:]):
                assert np.array_equal(y, results[0]), (np.dtype(dtype).name, mr, nc, k, k_block)


INT4_KBLOCK = emu.emulated_kernels(INT4, kblock=True)


@pytest.mark.parametrize("kern", INT4_KBLOCK, ids=lambda k: k.name)
def test_emulated_int4_amx_kernel_gives_the_model_bits(library, kern):
    """Each int4 AMX kernel, run block by block as the driver runs it, gives
    the bits of the scalar model of its order (tdpbf16ps as the SDM sums,
    tests/emulation/tile-qb4w-model.c), itself within the bound (x in bf16
    planes, subnormals flushed): 32 rows and 1, 5, 16 and 17 (one or both
    halves of the A and C tiles), one to seven panels, nine groups of 32
    and two of 64 (and two of 128 and 256, several chunks a group), x
    spread or near fp32's smallest normal, with and without bias, every
    dtype, into poisoned outputs and sums; K blocks of one group, two
    groups or all of K give the same bits."""
    fn, model = getattr(library, emu.symbol(kern)), getattr(library, emu.int4_reference(kern.name))
    packed_kern = replace(kern, widened=False)  # the model reads packed panels
    rng = np.random.default_rng(23)
    for dtype in DTYPES:
        bits = np.uint32 if dtype == np.float32 else np.uint16
        for case, (group_size, nc, q, panels, sz, bias, x32) in enumerate(
                [*_int4_cases(rng, dtype, 32), *_long_group_cases(rng, dtype, 32)]):
            x, k = x32.astype(dtype), x32.shape[1]
            want = {}  # the model's results, rows independent, with bias or without
            for b in (bias, None):
                want[b is None] = np.empty((32, nc), dtype)
                emu.kblock_run(model, packed_kern, x, dtype, panels, nc, want[b is None], k,
                               bias=b, group_size=group_size, sz=sz)
            assert_int4_close(want[False], x, q, sz, group_size, bias[:nc], daz=True,
                              planes=kern.planes(dtype))
            for mr in (32, 1, 5, 16, 17) if case % 4 == 0 else (32,):
                for k_block, b in ((group_size, None), (2 * group_size, bias), (k, bias)):
                    big = np.full((mr + 2, nc + 11), np.nan, dtype)
                    c = big[1:1 + mr, 3:3 + nc]
                    emu.kblock_run(fn, kern, x[:mr], dtype, panels, nc, c, k_block, bias=b,
                                   group_size=group_size, sz=sz)
                    outside = big.astype(np.float64)
                    outside[1:1 + mr, 3:3 + nc] = np.nan
                    assert np.isnan(outside).all(), f"{kern.name} wrote outside its output"
                    assert np.array_equal(c.view(bits), want[b is None][:mr].view(bits)), (
                        np.dtype(dtype).name, group_size, nc, mr, k_block)


def _driver_cuts(kern):
    """The default blocking (None) and cuts that move every boundary of a
    K-block kernel: 32-row blocks, one panel per chunk and K blocks of 32
    (for int4, rounded up to one group); 64-row blocks and K blocks of 96
    (int4 in groups of 64: one group); one chunk of every panel and K in
    one block."""
    d = kern.blocking
    return [None, replace(d, rows=32, chunk_bytes=1, k_block=32, min_macs_per_thread=1),
            replace(d, rows=64, k_block=96), replace(d, chunk_bytes=1 << 30, k_block=2048)]


@pytest.mark.parametrize("kern", KBLOCK + INT4_KBLOCK, ids=lambda k: k.name)
def test_emulated_amx_kernel_through_the_driver(library, kern):
    """The driver (src/woq/woq_driver.c, compiled into the emulated library
    with the registry) runs each AMX kernel over rows in several 32-row
    groups and a partial one, columns over whole and partial panels, on 1
    and 2 threads and every cut: the same bits each time, the same as the
    kernel's calls block by block on each group of rows (int4: the
    model's), refusing a split of the rows."""
    rng = np.random.default_rng(29)
    m, n = 70, 100
    int4 = kern.weight_format == INT4
    for dtype in DTYPES:
        for group_size in ((32, 64) if int4 else (0,)):
            k = 4 * 64 if int4 else 3 * 32 + 5
            x = (rng.standard_normal((m, k)) * 4).astype(dtype)
            bias = qkern.woq._padded_f32(rng.standard_normal(n).astype(np.float32), 32)
            want = np.empty((m, n), dtype)
            if int4:
                q = rng.integers(0, 16, (n, k), dtype=np.uint8)
                packed = qkern.pack_int4(q).reshape(-1)
                sz = rng.standard_normal((k // group_size, n, 2)).astype(dtype)
                for r in range(0, m, 32):  # the model reads packed panels
                    emu.kblock_run(getattr(library, emu.int4_reference(kern.name)),
                                   replace(kern, widened=False), x[r:r + 32], dtype, packed, n,
                                   want[r:r + 32], k, bias=bias, group_size=group_size, sz=sz)
            else:
                w = rng.integers(-128, 128, (n, k), dtype=np.int8)
                # the driver reads the layout's partial last panel as rows
                packed = qkern.packing.PackedWeight(w, (32, 2)).data
                scale = qkern.woq._padded_f32(rng.uniform(1e-3, 2e-2, n).astype(np.float32), 32)
                for r in range(0, m, 32):
                    emu.kblock_run(getattr(library, emu.symbol(kern)), kern, x[r:r + 32], dtype,
                                   packed_panels(w, 32, 2), n, want[r:r + 32], 64, scale, bias)
                assert_woq_close(want, x, w, scale[:n], bias[:n], daz=True,
                                 planes=kern.planes(dtype))
            for cut, threads in itertools.product(_driver_cuts(kern), (1, 2)):
                y = np.full((m, n), np.nan, dtype)
                status = (emu.gemm_int4(kern, x, packed, group_size, sz, bias, y, threads, cut)
                          if int4 else emu.gemm(kern, x, packed, scale, bias, y, threads, cut))
                assert status == 0, (cut, threads)
                assert np.array_equal(y.view(np.uint8), want.view(np.uint8)), (
                    np.dtype(dtype).name, group_size, cut, threads)
            refused = replace(kern.blocking, split="m")
            y = np.full((m, n), np.nan, dtype)
            status = (emu.gemm_int4(kern, x, packed, group_size, sz, bias, y, 1, refused)
                      if int4 else emu.gemm(kern, x, packed, scale, bias, y, 1, refused))
            assert status == 1 and np.isnan(y.astype(np.float64)).all()


ON_PACKED_XT = [k for k in emu.emulated_kernels(qkern.dispatch.INT8)
                if k.kind == "unpacked" and k.packs_x]


@pytest.mark.parametrize("kern", ON_PACKED_XT, ids=lambda k: k.name)
def test_emulated_gemv_on_packed_xt_is_within_the_bound_at_every_row_count(library, kern):
    """Each AMX kernel on the row-major weight, called on each count of
    rows of its group, 1 to MR (8x1c0: float16 and float32 planes stacked
    in one B tile to 16 columns, two above; 32x1c0: a B tile per plane and
    16 rows), on 40 columns (a partial group of 32 rows of W) and K = 300
    (two blocks of 128 k and a partial one) or 24 (where the bound misses
    no plane: float32's third, at most 2^-15 of x, weighs more there than
    the rounding it allows for): within the bound of tests/reference.py,
    nothing written outside its rows and columns."""
    rng = np.random.default_rng(31)
    n = 40
    call = emu.ukernel_call(kern)
    for dtype, k in itertools.product(DTYPES, (300, 24)):
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        scale = rng.uniform(1e-3, 2e-2, n).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        for mr in range(1, kern.mr + 1):
            x = (rng.standard_normal((mr, k)) * 4).astype(dtype)
            big = np.full((mr + 2, n + 5), np.nan, dtype)
            c = big[1:1 + mr, 2:2 + n]
            call(mr, n, k, x, dtype_code(dtype), w, scale, bias, c, c.strides[0])
            outside = big.astype(np.float64)
            outside[1:1 + mr, 2:2 + n] = np.nan
            assert np.isnan(outside).all(), (np.dtype(dtype).name, mr)
            assert_woq_close(c, x, w, scale, bias, daz=True, planes=kern.planes(dtype))


@pytest.mark.parametrize("kern", ON_PACKED_XT, ids=lambda k: k.name)
def test_emulated_gemv_on_packed_xt_gives_a_row_its_bits_in_any_call(library, kern):
    """Through the driver, which cuts the rows into groups of the kernel's
    MR, each row of a call gets the bits it gets alone, whatever the call's
    M (1 to MR + 1, and 2 MR + 3 or 41: whole groups and a partial one,
    over two blocks), the threads and the cut (blocks of 32 rows, a column
    of W a task): a row's
    planes are summed the same way in every group (a fuzzed call of 40
    float32 rows once summed its first 32 rows' planes in one order and
    its last 8's in another)."""
    rng = np.random.default_rng(41)
    n, k = 45, 100
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = rng.uniform(1e-3, 2e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    for dtype in DTYPES:
        x = (rng.standard_normal((max(2 * kern.mr + 3, 41), k)) * 4).astype(dtype)
        alone = []
        for r in range(len(x)):
            y = np.full((1, n), np.nan, dtype)
            assert emu.gemm(kern, x[r:r + 1], w, scale, bias, y, 1) == 0
            alone.append(y.view(np.uint8))
        cuts = (None, replace(kern.blocking, rows=32, chunk_bytes=1, min_macs_per_thread=1))
        for m, threads, cut in itertools.product([*range(2, kern.mr + 2), len(x)], (1, 2),
                                                 cuts):
            y = np.full((m, n), np.nan, dtype)
            assert emu.gemm(kern, x[:m], w, scale, bias, y, threads, cut) == 0
            for r in range(m):
                assert np.array_equal(y[r:r + 1].view(np.uint8), alone[r]), (
                    np.dtype(dtype).name, m, threads, cut, r)


def test_emulated_gemvs_on_packed_xt_agree_on_bfloat16(library):
    """bfloat16 x has one plane, which the 8-row kernel stacks as the
    32-row one lays it out: both give a row the same bits."""
    by_mr = {k.mr: k for k in ON_PACKED_XT}
    assert set(by_mr) == {8, 32}, ON_PACKED_XT
    rng = np.random.default_rng(43)
    n, k, m = 70, 300, 8
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = rng.uniform(1e-3, 2e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    x = (rng.standard_normal((m, k)) * 4).astype(bfloat16)
    ys = []
    for kern in by_mr.values():
        y = np.full((m, n), np.nan, bfloat16)
        assert emu.gemm(kern, x, w, scale, bias, y, 1) == 0
        ys.append(y.view(np.uint8))
    assert np.array_equal(ys[0], ys[1])


WIDENED_PANELS = [k for k in emu.emulated_kernels(qkern.dispatch.INT8)
                  if k.kind == "panels" and k.widened]


@pytest.mark.parametrize("kern", WIDENED_PANELS, ids=lambda k: k.name)
def test_emulated_widened_kernel_through_the_driver(library, kern):
    """The driver widens each task's chunk for an emulated kernel on
    widened panels (f32w) and gives the bits of its twin on packed panels,
    through the same driver, at every cut (chunks of one panel to all of
    them, rows one at a time) and on 1 and 2 threads."""
    twin = next(k for k in emu.emulated_kernels(qkern.dispatch.INT8)
                if k.isa == kern.isa and k.layout == kern.layout and k.mr == kern.mr
                and not k.widened)
    rng = np.random.default_rng(31)
    m, n, k = 15, 100, 3 * 32 + 5
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    packed = qkern.packing.PackedWeight(w, kern.layout).data
    scale = qkern.woq._padded_f32(rng.uniform(1e-3, 2e-2, n).astype(np.float32), 32)
    bias = qkern.woq._padded_f32(rng.standard_normal(n).astype(np.float32), 32)
    d = kern.blocking
    cuts = [None, replace(d, rows=1, chunk_bytes=1, min_macs_per_thread=1),
            replace(d, chunk_bytes=1 << 30)]
    for dtype in [d for d in DTYPES if np.dtype(d).name in kern.dtypes]:
        x = (rng.standard_normal((m, k)) * 4).astype(dtype)
        want = np.full((m, n), np.nan, dtype)
        assert emu.gemm(twin, x, packed, scale, bias, want, 1) == 0
        assert_woq_close(want, x, w, scale[:n], bias[:n])
        for cut, threads in itertools.product(cuts, (1, 2)):
            y = np.full((m, n), np.nan, dtype)
            assert emu.gemm(kern, x, packed, scale, bias, y, threads, cut) == 0
            assert np.array_equal(y.view(np.uint8), want.view(np.uint8)), (
                np.dtype(dtype).name, cut, threads)


@pytest.mark.parametrize("kern", DEQUANTIZING, ids=lambda k: k.name)
def test_emulated_dequantizing_kernel_gives_the_model_bits(library, kern):
    """A kernel on int4 weights the driver dequantizes (compute f32dq_qb4w)
    through the emulated library's driver, which dequantizes each task's
    chunk with the kernel's own function: bit for bit the order in exact
    rationals (tests/reference.py), as the AVX2 kernel of the compute
    gives it, for every row count up to MR + 5 (row blocks and a partial
    one), last panels with a partial first or second half, groups of 32
    and 64, with and without bias, every dtype; and at every cut on 1 and
    2 threads."""
    rng = np.random.default_rng(37)
    m = kern.mr + 5
    d = kern.blocking
    cuts = [None, replace(d, rows=1, chunk_bytes=1, min_macs_per_thread=1),
            replace(d, chunk_bytes=1 << 30)]
    for dtype, (n, group_size, with_bias) in itertools.product(
            DTYPES, ((35, 32, False), (50, 64, True), (100, 32, True))):
        k = 2 * group_size
        w = rng.standard_normal((n, k)).astype(np.float32)
        q, sz = qkern.quantize_int4(w.astype(dtype), group_size)
        x = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-4, 5, (m, k))).astype(dtype)
        b = rng.standard_normal(n).astype(dtype) if with_bias else None
        want = int4_dequantized_model(x, q, sz, group_size, b)
        packed = qkern.pack_int4(q).reshape(-1)
        bias = qkern.woq._padded_f32(b.astype(np.float32), 32) if with_bias else None
        runs = [(rows, None, 1) for rows in range(1, m)] + [
            (m, cut, threads) for cut, threads in itertools.product(cuts, (1, 2))]
        for rows, cut, threads in runs:
            y = np.full((rows, n), np.nan, dtype)
            assert emu.gemm_int4(kern, x[:rows], packed, group_size, sz, bias, y, threads,
                                 cut) == 0
            assert np.array_equal(y.view(np.uint8), want[:rows].view(np.uint8)), (
                np.dtype(dtype).name, n, rows, cut, threads)
