"""int4 groupwise WoQ GEMM: quantizing, the packed layout, every int4
kernel against the float64 reference within the derived bound
(tests/reference.py), the fixed order of sums (every kernel of one compute,
thread count and blocking gives the same bits), and the errors of the
public API."""

import pickle
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import qkern
from conftest import int4_bound_traits, kernel_params
from qkern import _woq
from qkern._dtypes import dtype_code
from qkern.dispatch import INT4, Blocking
from reference import (
    BF16,
    DTYPES,
    assert_int4_close,
    int4_bound,
    int4_byte_sums_model,
    int4_dequantize,
    int4_dequantized_model,
    int4_may_overflow,
    int4_reference,
)

DTYPE_IDS = [d.name for d in DTYPES]
INT4_KERNELS = kernel_params(INT4)
# every kernel with each dtype it takes
INT4_KERNEL_DTYPES = [pytest.param(p.values[0], d, id=f"{p.id}-{d.name}", marks=p.marks)
                      for p in INT4_KERNELS for d in DTYPES if d.name in p.values[0].dtypes]
REFERENCE = "f32_qb4w_gemm_4x32c1__ref"


def _compute(kern):
    """The compute of an int4 kernel, its name up to ``_gemm``, without the
    ``w`` of a kernel on widened panels (``tilew_qb4w`` is ``tile_qb4w``):
    kernels of one compute sum in one order (include/qkern/woq.h)."""
    head, _, tail = kern.name.split("_gemm_")[0].partition("_")
    return f"{head[:-1] if kern.widened else head}_{tail}"


def _problem(rng, m, n, k, group_size, dtype, bias=True):
    """x, q, scales_and_zeros, bias: weights as quantize_int4 makes them."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    q, sz = qkern.quantize_int4(w.astype(dtype), group_size)
    x = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if bias else None
    return x, q, sz, b


def _run_kernel(kern, x, q, sz, group_size, b, **kw):
    layer = qkern.Int4Linear(qkern.pack_int4(q), group_size, sz, b, kernel=kern.name)
    return layer(x, **kw)


def test_packed_layout_is_the_documented_one():
    """docs/kernels.rst: column n of panel n // 32 is nibble (n % 32 >= 16)
    of byte n % 16 of the panel's 16-byte row k; columns past N are 0."""
    n, k = 40, 3
    q = (np.arange(n * k).reshape(n, k) * 7 % 16).astype(np.uint8)
    p = qkern.pack_int4(q)
    assert p.shape == (2, k, 16) and p.dtype == np.uint8 and p.flags.c_contiguous
    assert p.ctypes.data % 64 == 0
    for col in range(64):
        for kk in range(k):
            byte = p[col // 32, kk, col % 16]
            nibble = byte >> 4 if col % 32 >= 16 else byte & 15
            assert nibble == (q[col, kk] if col < n else 0), (col, kk)


@given(n=st.integers(0, 70), k=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_pack_unpack_round_trip(n, k, seed):
    q = np.random.default_rng(seed).integers(0, 16, (n, k)).astype(np.uint8)
    p = qkern.pack_int4(q)
    assert p.shape == (-(-n // 32), k, 16)
    assert np.array_equal(qkern.unpack_int4(p, n), q)


def test_pack_int4_takes_any_integer_dtype_and_refuses_values_out_of_range():
    q = np.arange(16, dtype=np.int32).reshape(1, 16)
    assert np.array_equal(qkern.unpack_int4(qkern.pack_int4(q), 1), q)
    with pytest.raises(ValueError, match="values 0..15"):
        qkern.pack_int4(np.full((2, 4), 16, np.int32))
    with pytest.raises(ValueError, match="values 0..15"):
        qkern.pack_int4(np.full((2, 4), -1, np.int8))
    with pytest.raises(TypeError, match="integer dtype"):
        qkern.pack_int4(np.zeros((2, 4), np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("group_size", qkern.woq_int4.GROUP_SIZES)
def test_quantize_int4_is_within_half_a_step(dtype, group_size):
    rng = np.random.default_rng(group_size)
    w = (rng.standard_normal((5, 2 * group_size)) * 3).astype(dtype)
    w[0, :group_size] = 0.25  # a constant group: scale from the 1e-6 floor
    q, sz = qkern.quantize_int4(w, group_size)
    assert q.dtype == np.uint8 and q.shape == w.shape and q.max() <= 15
    assert sz.dtype == dtype and sz.shape == (2, 5, 2) and sz.flags.c_contiguous
    # before s and z are rounded to the dtype: within half a step
    wf = w.astype(np.float32).reshape(5, 2, group_size)
    lo, hi = wf.min(-1), wf.max(-1)
    step = np.maximum(hi - lo, np.float32(1e-6)) / np.float32(15)
    dq = (q.reshape(5, 2, group_size) * step[..., None].astype(np.float64) + lo[..., None])
    assert (np.abs(dq - wf) <= step[..., None] * (0.5 + 1e-5)).all()
    # with them rounded: the rounding of s (times up to 8 steps) and of z more
    u = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, BF16: 2.0**-8}[
        np.dtype(dtype)]
    s64, z64 = sz[..., 0].astype(np.float64), sz[..., 1].astype(np.float64)
    slack = (0.5 + 9 * u) * s64.T + u * np.abs(z64.T) + 8 * u * s64.T + 1e-7
    err = np.abs(int4_dequantize(q, sz, group_size) - w.astype(np.float64))
    assert (err.reshape(5, 2, group_size) <= slack[..., None]).all()


def test_quantize_int4_refuses_what_it_cannot_quantize():
    with pytest.raises(ValueError, match="NaN or infinity"):
        qkern.quantize_int4(np.full((2, 32), np.inf, np.float32), 32)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        qkern.quantize_int4(np.zeros((2, 48), np.float32), 32)
    with pytest.raises(ValueError, match="group_size: expected one of"):
        qkern.quantize_int4(np.zeros((2, 48), np.float32), 48)
    with pytest.raises(TypeError, match="w: expected dtype"):
        qkern.quantize_int4(np.zeros((2, 32), np.float64), 32)
    finite_but_too_wide = np.zeros((1, 32), np.float32)
    finite_but_too_wide[0, :2] = -3e38, 3e38  # max - min overflows float32
    with pytest.raises(ValueError, match="spans more than float32's range"):
        qkern.quantize_int4(finite_but_too_wide, 32)


@pytest.mark.parametrize("kern, dtype", INT4_KERNEL_DTYPES)
def test_kernel_is_within_the_bound(kern, dtype):
    """Every int4 kernel against the float64 reference, over M around its
    MR, N around a panel, every group size, with and without bias."""
    rng = np.random.default_rng(kern.index)
    for group_size in qkern.woq_int4.GROUP_SIZES:
        for m, n in [(1, 1), (kern.mr, 31), (kern.mr + 1, 33), (2 * kern.mr + 1, 64), (3, 100)]:
            x, q, sz, b = _problem(rng, m, n, 2 * group_size, group_size, dtype,
                                   bias=m % 2 == 1)
            assert_int4_close(_run_kernel(kern, x, q, sz, group_size, b), x, q, sz, group_size, b,
                              daz=kern.flushes_subnormals, planes=kern.planes(dtype),
                              dequantized=kern.dequantizes, byte_sums=kern.sums_bytes)


def test_the_bound_can_fail():
    """Control: a NaN or an infinity where no intermediate nears overflow,
    a result off by 1e-3 (more than the bound here; 1e-2 for the larger
    bound of a kernel on dequantized weights), or one computed without the
    zeros, is rejected."""
    rng = np.random.default_rng(1)
    x, q, sz, b = _problem(rng, 3, 40, 64, 32, np.float32)
    y = qkern.Int4Linear(qkern.pack_int4(q), 32, sz, b)(x)
    assert_int4_close(y, x, q, sz, 32, b, byte_sums=True)
    assert (int4_bound(x, q, sz, 32, b, np.float32, byte_sums=True) < 1e-3).all()
    assert (int4_bound(x, q, sz, 32, b, np.float32, dequantized=True) < 1e-2).all()
    assert not int4_may_overflow(x, q, sz, 32, b, byte_sums=True).any()
    for bad in (np.nan, np.inf):  # no intermediate near overflow: neither passes
        y_bad = y.copy()
        y_bad[0, 3] = bad
        with pytest.raises(AssertionError, match="NaN where no|inf where the exact"):
            assert_int4_close(y_bad, x, q, sz, 32, b, byte_sums=True)
    y[1, 7] += 1e-3
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_int4_close(y, x, q, sz, 32, b, byte_sums=True)
    y[1, 7] += 1e-2  # and the bound of a kernel on dequantized weights
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_int4_close(y, x, q, sz, 32, b, dequantized=True)
    with pytest.raises(AssertionError, match="outside the bound"):  # the zeros ignored
        no_zeros = x @ ((q - 8.0) * np.repeat(sz[..., 0].T, 32, axis=1)).T + b
        assert_int4_close(no_zeros.astype(np.float32), x, q, sz, 32, b)


@pytest.mark.parametrize("kern", [p for p in INT4_KERNELS if p.values[0].dequantizes])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_a_dequantizing_kernel_gives_the_bits_of_its_order(kern, dtype):
    """f32dq_qb4w bit for bit against its order in exact rationals
    (tests/reference.py): every row count up to MR + 1; a last panel with a
    partial first half (N = 35, its second half never written) or a
    partial second half (N = 50); x spread over 2**+-4 (float16 holds every
    sum); with and without bias."""
    rng = np.random.default_rng(23)
    for n, with_bias in ((35, False), (50, True)):
        x, q, sz, b = _problem(rng, kern.mr + 1, n, 64, 32, dtype, bias=with_bias)
        x = (x.astype(np.float32) * 2.0 ** rng.integers(-4, 5, x.shape)).astype(dtype)
        want = int4_dequantized_model(x, q, sz, 32, b)  # row by row
        for rows in range(1, kern.mr + 2):
            y = _run_kernel(kern, x[:rows], q, sz, 32, b)
            assert np.array_equal(y.view(np.uint8), want[:rows].view(np.uint8)), (n, rows)


@pytest.mark.parametrize("kern", [p for p in INT4_KERNELS if p.values[0].sums_bytes])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_a_byte_summing_kernel_gives_the_bits_of_its_order(kern, dtype):
    """f32_qb4w bit for bit against its order in exact rationals
    (tests/reference.py), the high nibbles from byte sums: 1, 2, MR and
    MR + 1 rows; N = 50, a last panel whose high nibbles (columns 48, 49)
    pair with columns 32, 33; x spread over 2**+-4; with and without
    bias."""
    rng = np.random.default_rng(29)
    for with_bias in (False, True):
        x, q, sz, b = _problem(rng, kern.mr + 1, 50, 64, 32, dtype, bias=with_bias)
        x = (x.astype(np.float32) * 2.0 ** rng.integers(-4, 5, x.shape)).astype(dtype)
        want = int4_byte_sums_model(x, q, sz, 32, b)  # row by row
        for rows in (1, 2, kern.mr, kern.mr + 1):
            y = _run_kernel(kern, x[:rows], q, sz, 32, b)
            assert np.array_equal(y.view(np.uint8), want[:rows].view(np.uint8)), (rows, with_bias)


def test_the_byte_sums_need_their_term_of_the_bound():
    """Control for byte_sums: high nibbles of 0 but at k = 0 (x_0 in
    0.1 .. 0.9) against low nibbles of 15, x of about 1e3 elsewhere, give
    f32_qb4w results whose error (the byte chain's roundings, which the low
    nibbles' chain does not cancel once k = 0 set them apart by 16 x_0, no
    multiple of their spacing) the bound without the q'/8 term would not
    admit: there T is |x_0| alone.  The bound with it does."""
    rng = np.random.default_rng(31)
    k, n = 256, 32
    q = np.zeros((n, k), np.uint8)
    q[:16] = 15  # the low nibbles; the high nibbles (columns 16..31) 0 ...
    q[16:, 0] = 1  # ... but at k = 0
    sz = np.zeros((k // 256, n, 2), np.float32)
    sz[..., 0] = 1.0
    sz[..., 1] = 8.0  # z' = 0: T is the products' part alone
    kern = qkern.dispatch.get_kernel(REFERENCE)
    x = rng.standard_normal((64, k)).astype(np.float32) * np.float32(1e3)
    x[:, 0] = rng.uniform(0.1, 0.9, len(x))
    y = _run_kernel(kern, x, q, sz, 256, None)
    assert_int4_close(y, x, q, sz, 256, byte_sums=True)
    err = np.abs(y.astype(np.float64) - int4_reference(x, q, sz, 256))[:, 16:]
    assert (err > int4_bound(x, q, sz, 256, None, np.float32)[:, 16:]).any()


def test_the_static_choice_either_side_of_the_dequantized_edge():
    """Either side of DEQUANTIZED_FROM_M rows of the level the static rule
    runs a dtype on, the rule switches from f32_qb4w to f32dq_qb4w there,
    and the functional op gives the bits of the kernel it picks, within the
    bound for them."""
    rng = np.random.default_rng(11)
    checked = 0
    for dtype in DTYPES:
        level = qkern.dispatch.choose_kernel(dtype, 4096, weight_format=INT4).isa
        edge = qkern.dispatch.DEQUANTIZED_FROM_M.get(level)
        if edge is None:  # this level keeps its kernel on packed int4
            continue
        x, q, sz, b = _problem(rng, edge, 70, 128, 32, dtype)
        for rows in (edge - 1, edge):
            y = qkern.weight_int4pack_mm(x[:rows], qkern.pack_int4(q), 32, sz, bias=b)
            static = qkern.dispatch.choose_kernel(dtype, rows, weight_format=INT4, n=len(q))
            assert static.dequantizes == (rows >= edge), (dtype, rows, static.name)
            want = _run_kernel(static, x[:rows], q, sz, 32, b)
            assert np.array_equal(y.view(np.uint8), want.view(np.uint8)), (dtype, rows)
            assert_int4_close(y, x[:rows], q, sz, 32, b, **int4_bound_traits(x[:rows], len(q)))
        checked += 1
    if not checked:
        pytest.skip(f"no dtype runs a level of DEQUANTIZED_FROM_M here "
                    f"({sorted(qkern.dispatch.DEQUANTIZED_FROM_M)})")


@pytest.mark.parametrize("kern, dtype", INT4_KERNEL_DTYPES)
def test_an_infinite_x_as_each_compute_documents(kern, dtype):
    """docs/semantics.rst, "Special values": an infinite x_k against q_k = 0
    is NaN in the computes with group sums (x_k q_k = inf * 0), and against
    its dequantized weight w_k = (0 - 8) * 1 + 0 = -8 is -inf in the kernel
    on dequantized weights, as in the definition."""
    q = np.zeros((3, 64), np.uint8)
    sz = np.zeros((2, 3, 2), dtype)
    sz[..., 0] = 1
    x = np.zeros((2, 64), dtype)
    x[0, 5] = np.inf
    x[1, 40] = -np.inf
    y = _run_kernel(kern, x, q, sz, 32, None).astype(np.float32)
    if kern.dequantizes:
        assert (y[0] == -np.inf).all() and (y[1] == np.inf).all(), y
    else:
        assert np.isnan(y).all(), y


@pytest.mark.parametrize("kern, dtype", [p for p in INT4_KERNEL_DTYPES
                                         if p.values[1] != np.float16])
@pytest.mark.parametrize("case", ["p", "s p", "whole bytes", "groups of opposite signs"])
def test_an_intermediate_that_overflows_as_each_compute_documents(kern, dtype, case):
    """docs/int4.rst, "Error bound": finite inputs whose y* is finite
    overflow fp32 in the computes with group sums, column by column as the
    order of the sums says: p (a small scale against a large x: +inf, and
    NaN in f32_qb4w's high nibbles, whose whole bytes' sum less the
    overflowed low nibbles' is inf - inf), s p (a large scale: +inf), the
    whole bytes' sums alone (f32_qb4w's high nibbles: +inf; the other
    computes finite), or two groups with opposite signs (NaN, where y* is
    0); the kernel on dequantized weights stays finite.  int4_may_overflow
    marks the columns where a compute with group sums overflows.  (float16
    cannot hold such x.)"""
    n, x0, q0, s, z = 32, 1e37, 15, 2.0**-20, 8 * 2.0**-20
    if case == "s p":  # p, and a byte-summing kernel's whole bytes, finite
        x0, q0, s, z = 5e34, 8, 1e3, 1e-3
    elif case == "whole bytes":
        x0 = 1e35
    x = np.full((1, 32), x0, np.float32)
    if case == "groups of opposite signs":
        x = np.concatenate([x, -x], axis=1)
    q = np.full((n, x.shape[1]), q0, np.uint8)
    sz = np.empty((x.shape[1] // 32, n, 2), np.float32)
    sz[..., 0], sz[..., 1] = s, z
    x, sz = x.astype(dtype), sz.astype(dtype)
    assert np.isfinite(int4_reference(x, q, sz, 32)).all()
    traits = {"planes": kern.planes(dtype), "byte_sums": kern.sums_bytes}
    high = np.arange(n) % 32 >= 16
    overflows = high if case == "whole bytes" else np.ones(n, bool)
    if case == "whole bytes" and not kern.sums_bytes:
        overflows = np.zeros(n, bool)
    assert (int4_may_overflow(x, q, sz, 32, **traits)[0] == overflows).all()
    y = _run_kernel(kern, x, q, sz, 32, None).astype(np.float32)[0]
    if kern.dequantizes:
        assert np.isfinite(y).all(), y
    else:
        nan = (high & kern.sums_bytes if case == "p"
               else overflows if case == "groups of opposite signs" else np.zeros(n, bool))
        assert (np.isnan(y) == nan).all(), y
        assert (y[overflows & ~nan] == np.inf).all(), y
        assert np.isfinite(y[~overflows]).all(), y
    assert_int4_close(y.astype(dtype)[None], x, q, sz, 32, daz=kern.flushes_subnormals,
                      dequantized=kern.dequantizes, **traits)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_kernel_thread_count_and_blocking_gives_the_same_bits(dtype):
    """docs/semantics.rst, "int4": the order of the sums is fixed for the
    kernels of one compute, so among them the kernel M selects, the rows
    passed with a row, the threads and the blocking change no bit; the
    functional op gives the bits of its static choice's compute."""
    kernels = [p.values[0] for p in INT4_KERNELS
               if p.values[0].available and dtype.name in p.values[0].dtypes]
    assert kernels and kernels[0].name == REFERENCE
    rng = np.random.default_rng(7)
    x, q, sz, b = _problem(rng, 37, 3 * 32 + 5, 256, 64, dtype)
    wants = {}
    for kern in kernels:
        if _compute(kern) not in wants:
            wants[_compute(kern)] = _run_kernel(kern, x, q, sz, 64, b).view(np.uint8)
        want = wants[_compute(kern)]
        for threads in (1, 2, 3):
            got = _run_kernel(kern, x, q, sz, 64, b, num_threads=threads).view(np.uint8)
            assert np.array_equal(got, want), (kern.name, threads)
        for row, rows in ((0, 1), (5, 1), (36, 1), (3, 2), (10, 3)):  # another mr, another
            got = _run_kernel(kern, x[row:row + rows], q, sz, 64, b).view(np.uint8)  # loop
            assert np.array_equal(got, want[row:row + rows]), (kern.name, row, rows)
    static = qkern.dispatch.choose_kernel(dtype, 37, weight_format=INT4, n=len(q))
    functional = qkern.weight_int4pack_mm(x, qkern.pack_int4(q), 64, sz, bias=b)
    assert np.array_equal(functional.view(np.uint8), wants[_compute(static)])
    packed = qkern.pack_int4(q)
    for kern in kernels:
        want = wants[_compute(kern)]
        kblock = kern.kind == "kblock"  # K blocks of 32 and 96 hold whole groups of 64 only
        cuts = ([Blocking(32, 1, 32, 1, "n"), Blocking(64, 40000, 96, 1, "n"),
                 Blocking(2048, 1 << 30, 2048, 1 << 20, "n")] if kblock else
                [Blocking(5, 1, 0, 1, "m"), Blocking(7, 40000, 0, 1, "n"),
                 Blocking(1000, 1 << 30, 0, 1 << 20, "m")])
        for cut in cuts:
            y = np.empty((37, 101), dtype)
            _woq.gemm_int4(kern.index, x, 37, 101, 256, 64, dtype_code(dtype), x.strides[0],
                           None, packed.reshape(-1), sz, qkern.woq._padded_f32(b, 32), y,
                           y.strides[0], 2, cut.to_driver())
            assert np.array_equal(y.view(np.uint8), want), (kern.name, cut)
        # one row, chunks of one panel: the groups side by side
        for rows in (1, 2, 3):
            y = np.empty((rows, 101), dtype)
            _woq.gemm_int4(kern.index, x, rows, 101, 256, 64, dtype_code(dtype), x.strides[0],
                           None, packed.reshape(-1), sz, qkern.woq._padded_f32(b, 32), y,
                           y.strides[0], 1,
                           Blocking(32 if kblock else 8, 1, 64 if kblock else 0, 1,
                                    "n").to_driver())
            assert np.array_equal(y.view(np.uint8), want[:rows]), (kern.name, rows)


@pytest.mark.parametrize("kern", [p for p in INT4_KERNELS if p.values[0].kind != "kblock"])
def test_micro_kernel_alone_writes_only_its_output(kern):
    """One micro-kernel call, no driver: nc not a multiple of the panel,
    every mr, rows of c apart with poison around; agrees with the driver."""
    rng = np.random.default_rng(3)
    for dtype in (d for d in DTYPES if d.name in kern.dtypes):
        for mr in range(1, kern.mr + 1):
            for nc in (1, 8, 17, 32, 45, 64, 70, 129):
                x, q, sz, b = _problem(rng, mr, nc, 96, 32, dtype)
                x32 = x.astype(np.float32)
                bias = qkern.woq._padded_f32(b, 32)
                big = np.full((mr + 2, nc + 11), np.nan, dtype)
                c = big[1:1 + mr, 3:3 + nc]
                _woq.ukernel_int4(kern.index, mr, nc, 96, 32, x32, dtype_code(dtype),
                                  qkern.pack_int4(q).reshape(-1), sz, bias, c, c.strides[0])
                outside = big.astype(np.float64)
                outside[1:1 + mr, 3:3 + nc] = np.nan
                assert np.isnan(outside).all(), f"{kern.name} wrote outside its output"
                want = _run_kernel(kern, x, q, sz, 32, b)
                assert np.array_equal(c.view(np.uint8), want.view(np.uint8)), (mr, nc)


@given(m=st.integers(0, 9), n=st.integers(0, 70), groups=st.integers(0, 3),
       group_size=st.sampled_from([32, 64]), dtype=st.sampled_from(DTYPES),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_weight_int4pack_mm_on_random_problems(m, n, groups, group_size, dtype, bias, seed):
    rng = np.random.default_rng(seed)
    k = groups * group_size
    x, q, sz, b = _problem(rng, m, n, k, group_size, dtype, bias)
    y = qkern.weight_int4pack_mm(x, qkern.pack_int4(q), group_size, sz, bias=b)
    assert y.shape == (m, n) and y.dtype == dtype
    if k == 0:
        assert np.array_equal(y, np.broadcast_to(b if bias else np.zeros(n, dtype), (m, n)))
    assert_int4_close(y, x, q, sz, group_size, b, **int4_bound_traits(x, len(q)))


def test_strided_x_batches_and_out():
    rng = np.random.default_rng(5)
    x, q, sz, b = _problem(rng, 24, 50, 128, 64, np.float32)
    p = qkern.pack_int4(q)
    want = qkern.weight_int4pack_mm(x, p, 64, sz, bias=b)
    batched = x.reshape(2, 3, 4, 128)
    assert np.array_equal(qkern.weight_int4pack_mm(batched, p, 64, sz, bias=b),
                          want.reshape(2, 3, 4, 50))
    wide = np.zeros((24, 256), np.float32)
    wide[:, ::2] = x  # last axis not unit-stride: copied
    assert np.array_equal(qkern.weight_int4pack_mm(wide[:, ::2], p, 64, sz, bias=b), want)
    out = np.full((24, 50), np.nan, np.float32)
    assert qkern.weight_int4pack_mm(x, p, 64, sz, bias=b, out=out) is out
    assert np.array_equal(out, want)
    sz_f = np.asfortranarray(sz)  # copied to C order
    assert np.array_equal(qkern.weight_int4pack_mm(x, p, 64, sz_f, bias=b), want)


def test_errors_name_the_argument_and_write_nothing():
    rng = np.random.default_rng(2)
    x, q, sz, b = _problem(rng, 2, 40, 64, 32, np.float32)
    p = qkern.pack_int4(q)
    out = np.full((2, 40), 7.0, np.float32)
    cases = [
        (TypeError, "group_size: expected an int", dict(group_size=32.0)),
        (ValueError, "group_size: expected one of", dict(group_size=16)),
        (ValueError, "not a multiple of group_size", dict(group_size=128)),
        (TypeError, "w_packed: expected dtype uint8", dict(w_packed=p.view(np.int8))),
        (ValueError, r"w_packed: expected 3 dimension", dict(w_packed=q)),
        (ValueError, "w_packed: holds 3 panels", dict(w_packed=qkern.pack_int4(
            np.zeros((70, 64), np.uint8)))),
        (TypeError, "scales_and_zeros: expected dtype float32", dict(
            scales_and_zeros=sz.astype(np.float16))),
        (ValueError, r"scales_and_zeros: expected shape \(K // group_size, N, 2\)", dict(
            scales_and_zeros=sz[:1])),
        (ValueError, "x: expected last dimension K=64", dict(x=x[:, :32])),
        (TypeError, "x: expected dtype float32, float16 or bfloat16", dict(
            x=x.astype(np.float64))),
        (ValueError, r"bias: expected shape \(40,\)", dict(bias=b[:3])),
        (ValueError, "out: expected shape", dict(out=out[:1])),
        (ValueError, "num_threads: expected 1", dict(num_threads=0)),
    ]
    for error, match, change in cases:
        args = dict(x=x, w_packed=p, group_size=32, scales_and_zeros=sz, bias=b, out=out)
        args.update(change)
        with pytest.raises(error, match=match):
            qkern.weight_int4pack_mm(**args)
        assert (out == 7.0).all(), match


def test_out_overlapping_strided_scales_and_zeros_is_refused():
    """The overlap check reads the caller's scales_and_zeros, not the
    contiguous copy a strided one is given for the kernels."""
    x = np.ones((2, 64), np.float32)
    p = qkern.pack_int4(np.zeros((32, 64), np.uint8))
    memory = np.ones((2, 32, 2), np.float32)
    for sz in (memory, memory[::-1]):  # contiguous, then a strided view of it
        out = memory.reshape(-1)[:64].reshape(2, 32)
        with pytest.raises(ValueError, match="out: overlaps scales_and_zeros"):
            qkern.weight_int4pack_mm(x, p, 32, sz, out=out)
        assert (memory == 1.0).all()


def test_k_block_kernels_have_no_single_call():
    """The int4 K-block kernels (AMX) run only through the driver, which
    packs x; the single-call entry refuses them before any call, whatever
    the CPU (the registry holds them wherever the compiler built them)."""
    kblock = [k for k in qkern.kernels() if k.weight_format == INT4 and k.kind == "kblock"]
    if not kblock:
        pytest.skip("this build has no int4 K-block kernel (the compiler lacks AMX)")
    x, c = np.zeros((1, 32), np.float32), np.zeros((1, 32), np.float32)
    for kern in kblock:
        with pytest.raises(ValueError, match="no single-call micro-kernel"):
            _woq.ukernel_int4(kern.index, 1, 32, 32, 32, x, 0, np.zeros(512, np.uint8),
                              np.zeros((1, 32, 2), np.float32), None, c, c.strides[0])


def test_int4_linear_holds_one_packed_copy_pickles_and_refuses_int8_kernels():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((70, 256)).astype(BF16)
    bias = rng.standard_normal(70).astype(BF16)
    layer = qkern.Int4Linear.from_float(w, 128, bias)
    q, sz = qkern.quantize_int4(w, 128)
    assert np.array_equal(layer.weight(), q) and layer.shape == (70, 256)
    assert layer.nbytes == 3 * 256 * 16 + sz.nbytes + 70 * 2 + 96 * 4
    for view in (layer.packed_weight, layer.scales_and_zeros, layer.bias):
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):  # nor can it be made so
            view.flags.writeable = True
    x = rng.standard_normal((5, 256)).astype(BF16)
    y = layer(x)
    assert_int4_close(y, x, q, sz, 128, bias, **int4_bound_traits(x, len(q)))
    clone = pickle.loads(pickle.dumps(layer))
    assert clone(x).tobytes() == y.tobytes() and repr(clone) == repr(layer)
    with pytest.raises(TypeError, match="x: expected dtype bfloat16"):
        layer(x.astype(np.float32))
    int8 = next(k for k in qkern.kernels() if k.available and k.weight_format != INT4)
    with pytest.raises(ValueError, match="does not read int4 weights"):
        qkern.Int4Linear(qkern.pack_int4(q), 128, sz, kernel=int8.name)
    with pytest.raises(ValueError, match="reads int4_groupwise weights"):
        qkern.WoqLinear(np.zeros((2, 4), np.int8), np.ones(2, np.float32), kernel=REFERENCE)
    with pytest.raises(TypeError, match="Int4Linear state"):
        qkern.Int4Linear.__new__(qkern.Int4Linear).__setstate__({"w_packed": None})


def test_threads_calling_one_layer_at_once_agree():
    rng = np.random.default_rng(6)
    layer = qkern.Int4Linear.from_float(rng.standard_normal((64, 512)).astype(np.float32), 64)
    xs = [rng.standard_normal((3, 512)).astype(np.float32) for _ in range(8)]
    want = [layer(x).tobytes() for x in xs]
    got = [None] * len(xs)

    def work(i):
        for _ in range(20):
            got[i] = layer(xs[i], num_threads=2).tobytes()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_the_bound_covers_roundings_in_the_subnormal_range():
    """Each group's FMAs may round where fp32 is subnormal (absolute 2**-150
    each): x = 2**-149 at one k of each group, q = 9, s = 0.5, z = 4 (so
    z' = 0) gives 4.5 then 8.5 units of 2**-149, rounded to even, 8 units
    against the exact 9.  The kernels that flush subnormals (docs/int4.rst)
    give 0."""
    tiny = np.float32(2.0**-149)
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = x[0, 32] = tiny
    q = np.zeros((1, 64), np.uint8)
    q[0, 0] = q[0, 32] = 9
    sz = np.array([[[0.5, 4.0]], [[0.5, 4.0]]], np.float32)
    for kern in (p.values[0] for p in INT4_KERNELS if p.values[0].available
                 and "float32" in p.values[0].dtypes):
        y = _run_kernel(kern, x, q, sz, 32, None)
        assert y[0, 0] == (0 if kern.flushes_subnormals else 8 * tiny), (kern.name, y[0, 0] / tiny)
        assert_int4_close(y, x, q, sz, 32, dequantized=kern.dequantizes,
                          daz=kern.flushes_subnormals, planes=kern.planes(np.float32),
                          byte_sums=kern.sums_bytes)
