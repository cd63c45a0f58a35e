"""Thin Cython layer over the WoQ GEMM C API (include/qkern/woq.h).

No policy lives here: arguments arrive validated by :mod:`qkern.woq`;
this module turns arrays into pointers, releases the GIL and calls C.
"""
cimport numpy as cnp
from libc.stdint cimport int8_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from qkern._clib cimport (QK_ERR_ARG, QK_ERR_NOMEM, QK_OK, QK_TRAIT_FLUSHES_SUBNORMALS,
                          QK_TRAIT_SPLITS_X, QK_TRAIT_SUMS_BYTES, QK_WOQ_INT4_GROUPWISE, QK_WOQ_INT8_PER_CHANNEL,
                          QK_WOQ_KBLOCK, QK_WOQ_PANELS, QK_WOQ_UNPACKED, qk_dtype,
                          qk_woq_blocking, qk_woq_gemm, qk_woq_gemm_int4, qk_woq_gemm_widened,
                          qk_woq_group_sums,
                          qk_woq_int4_pack, qk_woq_int4_packed_size, qk_woq_int4_unpack,
                          qk_woq_kernel, qk_woq_kernels, qk_woq_num_kernels, qk_woq_pack,
                          qk_woq_packed_size, qk_woq_packed_x_group_size, qk_woq_unpack,
                          qk_woq_widen_weight,
                          qk_woq_widened_panel_size, qk_woq_widened_size,
                          qk_fpenv, qk_fpenv_enter, qk_fpenv_leave)

cnp.import_array()


_KINDS = {QK_WOQ_PANELS: "panels", QK_WOQ_UNPACKED: "unpacked", QK_WOQ_KBLOCK: "kblock"}
_FORMATS = {QK_WOQ_INT8_PER_CHANNEL: "int8_per_channel", QK_WOQ_INT4_GROUPWISE: "int4_groupwise"}


def registry():
    """The C kernel registry, one dict of named fields per entry, in order."""
    cdef size_t i
    out = []
    for i in range(qk_woq_num_kernels):
        e = &qk_woq_kernels[i]
        out.append({
            "name": e.name.decode(), "kind": _KINDS[e.kind], "isa": <int>e.isa,
            "mr": e.mr, "nr": e.nr, "kr": e.kr, "dtype_mask": e.dtypes,
            "weight_format": _FORMATS[e.format], "group_size": e.group_size,
            "flushes_subnormals": bool(e.traits & QK_TRAIT_FLUSHES_SUBNORMALS),
            "splits_x": bool(e.traits & QK_TRAIT_SPLITS_X),
            "sums_bytes": bool(e.traits & QK_TRAIT_SUMS_BYTES),
            "widened": e.widen != NULL, "widened_bytes": e.widened_bytes,
            "dequantizes": e.dequantize != NULL,
            "converts_x": e.convert_x != NULL,
            "packs_x": e.pack_x != NULL,
            "bound_by": e.bound_by.decode(),
            "blocking": (e.blocking.rows, e.blocking.chunk_bytes, e.blocking.k_block,
                         e.blocking.min_macs_per_thread, e.blocking.split),
        })
    return out


cdef _check_nr(uint32_t nr):
    if nr == 0:
        raise ValueError("layout: nr must be at least 1")


def packed_size(size_t n, size_t k, uint32_t nr, uint32_t kr):
    """Bytes of an (n, k) weight packed in layout (nr, kr) (SIZE_MAX: too many)."""
    _check_nr(nr)
    return qk_woq_packed_size(n, k, nr, kr)


def pack(const int8_t[:, ::1] w, uint32_t nr, uint32_t kr, int8_t[::1] out):
    """Pack a C-contiguous (N, K) int8 weight into ``out`` (packed_size bytes)."""
    cdef size_t n = w.shape[0], k = w.shape[1]
    _check_nr(nr)
    if <size_t>out.shape[0] != qk_woq_packed_size(n, k, nr, kr):
        raise ValueError("packed buffer has the wrong size")
    cdef const int8_t* src = &w[0, 0] if n * k else NULL
    cdef int8_t* dst = &out[0] if out.shape[0] else NULL
    with nogil:
        if dst != NULL:
            qk_woq_pack(src, k, n, k, nr, kr, dst)


def unpack(const int8_t[::1] packed, uint32_t nr, uint32_t kr, int8_t[:, ::1] out):
    """Unpack ``packed`` (layout (nr, kr)) into the C-contiguous (N, K) ``out``."""
    cdef size_t n = out.shape[0], k = out.shape[1]
    _check_nr(nr)
    if <size_t>packed.shape[0] != qk_woq_packed_size(n, k, nr, kr):
        raise ValueError("packed buffer has the wrong size")
    cdef int8_t* dst = &out[0, 0] if n * k else NULL
    with nogil:
        if dst != NULL:
            qk_woq_unpack(&packed[0], n, k, nr, kr, dst, k)


cdef _check_holds(str name, size_t got, size_t needed):
    if got < needed:
        raise ValueError(f"{name}: holds {got} values, the problem needs {needed}")


cdef int _check_dtype(const qk_woq_kernel* kern, int dtype) except -1:
    if not 0 <= dtype <= 2 or not kern.dtypes & (1u << dtype):
        raise ValueError(f"{kern.name.decode()}: does not take dtype code {dtype}")
    return 0


cdef int _check_vectors(const qk_woq_kernel* kern, size_t n, const float[::1] scale,
                        const float[::1] bias) except -1:
    """``scale`` and ``bias`` (if any) must hold n columns padded to whole panels."""
    cdef size_t n_padded = (n + kern.nr - 1) // kern.nr * kern.nr
    _check_holds("scale", scale.shape[0], n_padded)
    if bias is not None:
        _check_holds("bias", bias.shape[0], n_padded)
    return 0


def widened_size(size_t index, size_t n, size_t k):
    """Bytes of an (n, k) weight widened for registry kernel ``index`` (0:
    the kernel reads no widened copy; SIZE_MAX: too many)."""
    return qk_woq_widened_size(_kernel(index, 0), n, k)


def widen_weight(size_t index, const int8_t[::1] packed, size_t n, size_t k, uint8_t[::1] out):
    """Widen the whole packed (n, k) weight for kernel ``index`` into
    ``out`` (:func:`widened_size` bytes, 64-byte aligned)."""
    cdef const qk_woq_kernel* kern = _kernel(index, 0)
    cdef size_t size = qk_woq_widened_size(kern, n, k)
    if kern.widen == NULL or kern.kind != QK_WOQ_PANELS:
        raise ValueError(f"{kern.name.decode()}: reads no widened copy of the weight")
    if <size_t>out.shape[0] != size or (size and <size_t>&out[0] % 64):
        raise ValueError("widened buffer: wrong size or not 64-byte aligned")
    _check_holds("packed weight", packed.shape[0], qk_woq_packed_size(n, k, kern.nr, kern.kr))
    if size == 0:
        return
    cdef int status
    with nogil:
        status = qk_woq_widen_weight(kern, &packed[0], n, k, &out[0])
    _check_status("qk_woq_widen_weight", kern, status, None)


def gemm(size_t index, cnp.ndarray x, size_t m, size_t n, size_t k, int dtype,
         int64_t x_stride, const int64_t[::1] x_offsets, const int8_t[::1] packed,
         const float[::1] scale, const float[::1] bias, cnp.ndarray y, int64_t y_stride,
         int num_threads, tuple blocking, bint widened=False):
    """Run registry kernel ``index`` over the whole problem.

    ``x`` and ``y`` point at element (0, 0); row m of x is at byte offset
    ``x_offsets[m]`` (or ``m * x_stride`` when ``x_offsets`` is None); row m
    of y at ``m * y_stride``.  ``bias`` may be None.  What the kernel reads
    whole is checked against (m, n, k), ValueError if short: ``packed``
    (1-D, as packed by :func:`pack`), ``scale`` and ``bias`` (padded to whole
    panels), ``x_offsets``; ``x`` and ``y`` are not.  ``blocking`` is
    ``(rows, chunk_bytes, k_block, min_macs_per_thread, split)``
    (include/qkern/woq.h; split 0 = QK_WOQ_SPLIT_M, 1 = QK_WOQ_SPLIT_N) or None for the kernel's default; ValueError if the driver refuses it.
    With ``widened``, ``packed`` is the weight widened by :func:`widen_weight`
    for this kernel (1-D int8 view of its bytes).
    """
    cdef const qk_woq_kernel* kern = _kernel(index, 0)
    _check_dtype(kern, dtype)
    if widened:
        if kern.widen == NULL or kern.kind != QK_WOQ_PANELS:
            raise ValueError(f"{kern.name.decode()}: reads no widened copy of the weight")
        _check_holds("widened weight", packed.shape[0], qk_woq_widened_size(kern, n, k))
    else:
        _check_holds("packed weight", packed.shape[0],
                     qk_woq_packed_size(n, k, kern.nr, kern.kr))
    _check_vectors(kern, n, scale, bias)
    cdef const float* bp = &bias[0] if bias is not None else NULL
    cdef const int64_t* offs = _offsets(x_offsets, m)
    cdef const char* xp = <const char*>cnp.PyArray_DATA(x)
    cdef const float* sp = &scale[0]
    cdef const int8_t* wp = &packed[0] if packed.shape[0] else NULL
    cdef char* yp = <char*>cnp.PyArray_DATA(y)
    cdef qk_woq_blocking b
    cdef const qk_woq_blocking* bptr = _blocking(blocking, &b)
    cdef int status
    with nogil:
        if widened:
            status = qk_woq_gemm_widened(kern, bptr, m, n, k, <qk_dtype>dtype, xp, x_stride,
                                         offs, wp, sp, bp, yp, y_stride, num_threads)
        else:
            status = qk_woq_gemm(kern, bptr, m, n, k, <qk_dtype>dtype, xp, x_stride, offs, wp,
                                 sp, bp, yp, y_stride, num_threads)
    _check_status("qk_woq_gemm_widened" if widened else "qk_woq_gemm", kern, status, blocking)


cdef const int64_t* _offsets(const int64_t[::1] x_offsets, size_t m) except? NULL:
    """The row offsets of x (NULL for None), checked to hold ``m`` rows."""
    if x_offsets is None:
        return NULL
    _check_holds("x_offsets", x_offsets.shape[0], m)
    return &x_offsets[0]


cdef const qk_woq_blocking* _blocking(tuple blocking, qk_woq_blocking* b) except? NULL:
    """``b`` filled from the tuple (see :func:`gemm`), or NULL for None."""
    if blocking is None:
        return NULL
    b.rows, b.chunk_bytes, b.k_block, b.min_macs_per_thread, b.split = blocking
    return b


cdef _check_status(str entry, const qk_woq_kernel* kern, int status, tuple blocking):
    name = kern.name.decode()
    if status == QK_ERR_NOMEM:
        raise MemoryError(f"{entry}({name}): no memory for its buffers")
    if status == QK_ERR_ARG:
        raise ValueError(f"{entry}({name}) refused the kernel, dtype, group size or "
                         f"blocking {blocking}")
    if status != QK_OK:
        raise RuntimeError(f"{entry}({name}) failed with status {status}")


cdef const qk_woq_kernel* _kernel(size_t index, int int4) except NULL:
    if index >= qk_woq_num_kernels:
        raise IndexError("no such kernel")
    cdef const qk_woq_kernel* kern = &qk_woq_kernels[index]
    if (kern.format == QK_WOQ_INT4_GROUPWISE) != bool(int4):
        raise ValueError(f"{kern.name.decode()}: reads weights of format "
                         f"{_FORMATS[kern.format]}")
    return kern


def int4_packed_size(size_t n, size_t k):
    """Bytes of an (n, k) int4 weight in the packed int4 layout (SIZE_MAX: too many)."""
    return qk_woq_int4_packed_size(n, k)


def pack_int4(const uint8_t[:, ::1] q, uint8_t[::1] out):
    """Pack a C-contiguous (N, K) array of values 0..15 into ``out``
    (int4_packed_size bytes; only each byte's low nibble is read)."""
    cdef size_t n = q.shape[0], k = q.shape[1]
    if <size_t>out.shape[0] != qk_woq_int4_packed_size(n, k):
        raise ValueError("packed buffer has the wrong size")
    if out.shape[0] == 0:
        return
    with nogil:
        qk_woq_int4_pack(&q[0, 0], k, n, k, &out[0])


def unpack_int4(const uint8_t[::1] packed, uint8_t[:, ::1] out):
    """Unpack ``packed`` into the C-contiguous (N, K) ``out`` (values 0..15)."""
    cdef size_t n = out.shape[0], k = out.shape[1]
    if <size_t>packed.shape[0] != qk_woq_int4_packed_size(n, k):
        raise ValueError("packed buffer has the wrong size")
    if n * k == 0:
        return
    with nogil:
        qk_woq_int4_unpack(&packed[0], n, k, &out[0, 0], k)


def gemm_int4(size_t index, cnp.ndarray x, size_t m, size_t n, size_t k, size_t group_size,
              int dtype, int64_t x_stride, const int64_t[::1] x_offsets,
              const uint8_t[::1] packed, cnp.ndarray sz, const float[::1] bias, cnp.ndarray y,
              int64_t y_stride, int num_threads, tuple blocking):
    """Run int4 registry kernel ``index`` over the whole problem, as
    :func:`gemm` does, on ``packed`` (the packed int4 layout) with ``sz``,
    the C-contiguous ``(k / group_size, n, 2)`` scales_and_zeros of dtype
    code ``dtype``; ``bias`` f32 padded to a multiple of 32, or None.
    ValueError if an array is short or the driver refuses the call.
    """
    cdef const qk_woq_kernel* kern = _kernel(index, 1)
    _check_dtype(kern, dtype)
    if group_size == 0 or k % group_size:
        raise ValueError(f"group_size {group_size} does not divide K = {k}")
    _check_holds("packed weight", packed.shape[0], qk_woq_int4_packed_size(n, k))
    if (not sz.flags.c_contiguous or sz.itemsize != (4 if dtype == 0 else 2)
            or <size_t>sz.size < k // group_size * n * 2):
        raise ValueError("scales_and_zeros: expected C-contiguous (K / group_size, N, 2) "
                         "values of x's dtype")
    if bias is not None:
        _check_holds("bias", bias.shape[0], (n + 31) // 32 * 32)
    cdef const float* bp = &bias[0] if bias is not None else NULL
    cdef const int64_t* offs = _offsets(x_offsets, m)
    cdef const char* xp = <const char*>cnp.PyArray_DATA(x)
    cdef const uint8_t* wp = &packed[0] if packed.shape[0] else NULL
    cdef const void* szp = cnp.PyArray_DATA(sz)
    cdef char* yp = <char*>cnp.PyArray_DATA(y)
    cdef qk_woq_blocking b
    cdef const qk_woq_blocking* bptr = _blocking(blocking, &b)
    cdef int status
    with nogil:
        status = qk_woq_gemm_int4(kern, bptr, m, n, k, group_size, <qk_dtype>dtype, xp,
                                  x_stride, offs, wp, szp, bp, yp, y_stride, num_threads)
    _check_status("qk_woq_gemm_int4", kern, status, blocking)


def ukernel(size_t index, size_t mr, size_t nc, size_t kc, cnp.ndarray x, int dtype,
            const int8_t[::1] panels, const float[::1] scale, const float[::1] bias,
            cnp.ndarray c, int64_t c_stride):
    """Call the micro-kernel of registry entry ``index`` once, as the driver
    would: rows 0 .. mr-1 of the 2-D ``x`` (unit stride along K, any row
    stride; f32 for a kernel that converts x, whatever ``dtype``, which is
    then ``c``'s) times ``nc`` columns of whole packed ``panels``, into ``c``
    (rows ``c_stride`` bytes apart), under the kernels' floating-point
    environment.  The kernel tester's entry point: no driver in between.

    ``panels``, ``scale`` and ``bias`` must hold ``nc`` columns of whole
    panels (widened by :func:`widen_weight` for a kernel that reads widened
    panels), ``1 <= mr <= MR`` and ``nc >= 1`` (ValueError otherwise); ``c``
    is not checked.  For a kernel with its own packing of x (packed x^T),
    the rows are packed first, as the driver packs them.  A K-block kernel
    has no single-call micro-kernel
    (ValueError): it runs through :func:`gemm`, whose blockings cut its
    calls.
    """
    cdef const qk_woq_kernel* kern = _kernel(index, 0)
    name = kern.name.decode()
    if kern.fn == NULL or kern.kind == QK_WOQ_KBLOCK:
        raise ValueError(f"{name}: no single-call micro-kernel on packed panels; use gemm")
    if mr < 1 or mr > kern.mr or mr > 32:
        raise ValueError(f"{name}: expected 1 <= mr <= {kern.mr}, got mr = {mr}")
    if nc == 0:
        raise ValueError(f"{name}: expected nc >= 1 columns, got nc = 0")
    _check_dtype(kern, dtype)
    # a kernel that converts x reads it in f32 whatever the output's dtype
    cdef int x_dtype = 0 if kern.convert_x != NULL else dtype
    if (x.ndim != 2 or <size_t>x.shape[0] < mr or <size_t>x.shape[1] < kc
            or x.itemsize != (4 if x_dtype == 0 else 2)
            or (kc > 1 and x.strides[1] != x.itemsize)):
        raise ValueError(f"x: expected {mr} rows of {kc} unit-stride elements of dtype code "
                         f"{x_dtype}, got {(<object>x).dtype}, shape {(<object>x).shape}, "
                         f"strides {(<object>x).strides}")
    cdef size_t n_padded = (nc + kern.nr - 1) // kern.nr * kern.nr
    _check_holds("panels", panels.shape[0],
                 qk_woq_widened_size(kern, n_padded, kc) if kern.widen != NULL
                 else qk_woq_packed_size(n_padded, kc, kern.nr, kern.kr))
    _check_vectors(kern, nc, scale, bias)
    cdef const float* bp = &bias[0] if bias is not None else NULL
    cdef const void* rows[32]
    cdef size_t i
    for i in range(mr):
        rows[i] = <const char*>cnp.PyArray_DATA(x) + i * x.strides[0]
    # a kernel with pack_x reads its rows packed (transposed), as the driver
    # packs them: a[0] is the group
    cdef size_t chunk = qk_woq_packed_x_group_size(32, <qk_dtype>dtype)  # one chunk of 32 k
    cdef char* packed_x = NULL
    cdef char* group = NULL
    if kern.pack_x != NULL:
        packed_x = <char*>malloc(qk_woq_packed_x_group_size(kc, <qk_dtype>dtype) + 64)
        if packed_x == NULL:
            raise MemoryError()
        group = packed_x + (64 - <size_t>packed_x % 64) % 64
        for i in range(mr):
            kern.pack_x(rows[i], <qk_dtype>dtype, kc, i, group, chunk)
        rows[0] = group
    cdef void* cp = cnp.PyArray_DATA(c)
    cdef qk_fpenv saved
    try:
        with nogil:
            saved = qk_fpenv_enter()
            kern.fn(mr, nc, kc, rows, <qk_dtype>dtype, &panels[0], &scale[0], bp, cp, c_stride)
            qk_fpenv_leave(saved)
    finally:
        free(packed_x)


def ukernel_int4(size_t index, size_t mr, size_t nc, size_t kc, size_t group_size,
                 const float[:, ::1] x, int dtype, const uint8_t[::1] panels, cnp.ndarray sz,
                 const float[::1] bias, cnp.ndarray c, int64_t c_stride):
    """Call the micro-kernel of int4 registry entry ``index`` once, as the
    driver would: rows 0 .. mr-1 of the f32 ``x`` (copied, with their group
    sums after them, which a dequantizing kernel does not read) times ``nc``
    columns of whole packed
    int4 ``panels``, with ``sz`` (C-contiguous ``(kc / group_size, nc, 2)``,
    dtype code ``dtype``, also ``c``'s) into ``c`` (rows ``c_stride`` bytes
    apart), under the kernels' floating-point environment; for a kernel
    that reads dequantized panels, ``panels`` are dequantized first, as the
    driver dequantizes a chunk.  ValueError for
    a short array, ``mr`` outside 1..MR, ``nc`` = 0, a group size the
    kernel does not take, or a K-block kernel (which has no single call);
    ``c`` is not checked.
    """
    cdef const qk_woq_kernel* kern = _kernel(index, 1)
    name = kern.name.decode()
    if kern.int4_fn == NULL:
        raise ValueError(f"{name}: no single-call micro-kernel (a K-block kernel); use gemm_int4")
    if mr < 1 or mr > kern.mr or mr > 32:
        raise ValueError(f"{name}: expected 1 <= mr <= {kern.mr}, got mr = {mr}")
    if nc == 0:
        raise ValueError(f"{name}: expected nc >= 1 columns, got nc = 0")
    if group_size == 0 or kc % group_size or group_size % kern.group_size:
        raise ValueError(f"{name}: group size {group_size} does not divide kc = {kc} "
                         f"or is not a multiple of {kern.group_size}")
    _check_dtype(kern, dtype)
    if <size_t>x.shape[0] < mr or <size_t>x.shape[1] < kc:
        raise ValueError(f"x: expected {mr} rows of {kc} f32 values")
    _check_holds("panels", panels.shape[0], qk_woq_int4_packed_size(nc, kc))
    if (not sz.flags.c_contiguous or sz.itemsize != (4 if dtype == 0 else 2)
            or <size_t>sz.size < kc // group_size * nc * 2):
        raise ValueError("sz: expected C-contiguous (kc / group_size, nc, 2) values of dtype")
    if bias is not None:
        _check_holds("bias", bias.shape[0], (nc + 31) // 32 * 32)
    cdef const float* bp = &bias[0] if bias is not None else NULL
    cdef size_t row_floats = kc + kc // group_size, i
    cdef float* rows_f32 = <float*>malloc((mr * row_floats + 1) * sizeof(float))
    if rows_f32 == NULL:
        raise MemoryError()
    cdef const float* rows[32]
    cdef void* cp = cnp.PyArray_DATA(c)
    cdef const void* szp = cnp.PyArray_DATA(sz)
    cdef size_t sz_stride = nc * 2 * sz.itemsize
    cdef const uint8_t* wp = &panels[0] if panels.shape[0] else NULL
    # a dequantizing kernel reads the f32 panels the driver would write
    cdef size_t panel_count = (nc + 31) // 32, wide_bytes = 0
    cdef float* wide = NULL
    if kern.dequantize != NULL:
        wide_bytes = panel_count * qk_woq_widened_panel_size(kern, kc)
        wide = <float*>malloc(wide_bytes + 64)
        if wide == NULL:
            free(rows_f32)
            raise MemoryError()
    cdef qk_fpenv saved
    try:
        with nogil:
            saved = qk_fpenv_enter()
            if wide != NULL:
                kern.dequantize(wp, panel_count, kc, group_size, szp, sz_stride, <qk_dtype>dtype,
                                nc, wide)
                wp = <const uint8_t*>wide
            for i in range(mr):
                if kc:
                    memcpy(rows_f32 + i * row_floats, &x[i, 0], kc * sizeof(float))
                qk_woq_group_sums(rows_f32 + i * row_floats, kc, group_size,
                                  rows_f32 + i * row_floats + kc)
                rows[i] = rows_f32 + i * row_floats
            kern.int4_fn(mr, nc, kc, group_size, rows, <qk_dtype>dtype, wp, szp, sz_stride, bp,
                         cp, c_stride)
            qk_fpenv_leave(saved)
    finally:
        free(rows_f32)
        free(wide)
