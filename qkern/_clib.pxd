# Declarations of the C contract (include/qkern/*.h) used by the Cython layer.
from libc.stdint cimport int8_t, int64_t, uint8_t, uint32_t, uint64_t


cdef extern from "qkern/cpu.h":
    ctypedef struct qk_cpu_features:
        int avx2
        int fma
        int f16c
        int avx512f
        int avx512bw
        int avx512vl
        int avx512_bf16
        int avx512_vbmi
        int avx512_fp16
        int avx512_vnni
        int amx_tile
        int amx_bf16
        int amx_int8
        char vendor[13]

    void qk_cpu_detect(qk_cpu_features* out) nogil


cdef extern from "qkern/threads.h":
    enum:
        QK_THREADS_FORKED
        QK_THREADS_OS_REFUSED

    int qk_threads_for_call(int requested) nogil
    int qk_threads_take_notice() nogil


cdef extern from "qkern/fpenv.h":
    ctypedef unsigned int qk_fpenv

    qk_fpenv qk_fpenv_enter() nogil
    void qk_fpenv_leave(qk_fpenv saved) nogil


cdef extern from "qkern/woq.h":
    ctypedef enum qk_dtype:
        QK_F32
        QK_F16
        QK_BF16

    ctypedef enum qk_isa:
        pass

    enum:
        QK_OK
        QK_ERR_ARG
        QK_ERR_NOMEM

    ctypedef void (*qk_woq_ukernel_fn)(size_t, size_t, size_t, const void* const*, qk_dtype,
                                       const int8_t*, const float*, const float*, void*,
                                       Py_ssize_t) noexcept nogil

    ctypedef void (*qk_woq_widen_fn)(const int8_t*, size_t, size_t, void*) noexcept nogil
    ctypedef void (*qk_woq_pack_x_fn)(const void*, qk_dtype, size_t, size_t, void*,
                                     size_t) noexcept nogil
    ctypedef void (*qk_woq_convert_x_fn)(const void*, qk_dtype, size_t, float*) noexcept nogil
    ctypedef void (*qk_woq_int4_ukernel_fn)(size_t, size_t, size_t, size_t, const float* const*,
                                            qk_dtype, const uint8_t*, const void*, size_t,
                                            const float*, void*, Py_ssize_t) noexcept nogil
    ctypedef void (*qk_woq_dequantize_fn)(const uint8_t*, size_t, size_t, size_t, const void*,
                                          size_t, qk_dtype, size_t, float*) noexcept nogil

    ctypedef enum qk_woq_kind:
        QK_WOQ_PANELS
        QK_WOQ_UNPACKED
        QK_WOQ_KBLOCK

    ctypedef enum qk_woq_format:
        QK_WOQ_INT8_PER_CHANNEL
        QK_WOQ_INT4_GROUPWISE

    enum:
        QK_TRAIT_FLUSHES_SUBNORMALS
        QK_TRAIT_SPLITS_X
        QK_TRAIT_SUMS_BYTES

    ctypedef struct qk_woq_blocking:
        uint32_t rows
        uint32_t chunk_bytes
        uint32_t k_block
        uint32_t min_macs_per_thread
        uint32_t split

    ctypedef struct qk_woq_kernel:
        const char* name
        qk_woq_kind kind
        qk_isa isa
        uint32_t mr
        uint32_t nr
        uint32_t kr
        uint32_t dtypes
        qk_woq_format format
        uint32_t group_size
        uint32_t traits
        const char* bound_by
        qk_woq_blocking blocking
        qk_woq_ukernel_fn fn
        qk_woq_widen_fn widen
        uint32_t widened_bytes
        qk_woq_pack_x_fn pack_x
        qk_woq_convert_x_fn convert_x
        qk_woq_int4_ukernel_fn int4_fn
        qk_woq_dequantize_fn dequantize

    const qk_woq_kernel qk_woq_kernels[]
    const size_t qk_woq_num_kernels

    size_t qk_woq_packed_size(size_t n, size_t k, uint32_t nr, uint32_t kr) nogil
    size_t qk_woq_packed_x_group_size(size_t k, qk_dtype dt) nogil
    void qk_woq_pack(const int8_t* w, size_t ldw, size_t n, size_t k, uint32_t nr,
                     uint32_t kr, int8_t* out) nogil
    void qk_woq_unpack(const int8_t* packed, size_t n, size_t k, uint32_t nr, uint32_t kr,
                       int8_t* w, size_t ldw) nogil
    void qk_woq_group_sums(const float* row, size_t kc, size_t group_size, float* sums) nogil
    size_t qk_woq_int4_packed_size(size_t n, size_t k) nogil
    void qk_woq_int4_pack(const uint8_t* q, size_t ldq, size_t n, size_t k, uint8_t* out) nogil
    void qk_woq_int4_unpack(const uint8_t* packed, size_t n, size_t k, uint8_t* q,
                            size_t ldq) nogil
    int qk_woq_gemm_int4(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m,
                         size_t n, size_t k, size_t group_size, qk_dtype dt, const char* x,
                         int64_t x_stride, const int64_t* x_offsets, const uint8_t* packed,
                         const void* sz, const float* bias, char* y, int64_t y_stride,
                         int num_threads) nogil
    int qk_woq_gemm(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m,
                    size_t n, size_t k, qk_dtype dt, const char* x, int64_t x_stride,
                    const int64_t* x_offsets, const int8_t* packed, const float* scale,
                    const float* bias, char* y, int64_t y_stride, int num_threads) nogil
    size_t qk_woq_widened_panel_size(const qk_woq_kernel* kern, size_t kc) nogil
    size_t qk_woq_widened_size(const qk_woq_kernel* kern, size_t n, size_t k) nogil
    int qk_woq_widen_weight(const qk_woq_kernel* kern, const int8_t* packed, size_t n, size_t k,
                            void* out) nogil
    int qk_woq_gemm_widened(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m,
                            size_t n, size_t k, qk_dtype dt, const char* x, int64_t x_stride,
                            const int64_t* x_offsets, const void* widened, const float* scale,
                            const float* bias, char* y, int64_t y_stride, int num_threads) nogil


cdef extern from "qkern/roofline.h":
    ctypedef float (*qk_peak_loop_fn)(size_t) noexcept nogil

    ctypedef struct qk_peak_entry:
        const char* name
        qk_peak_loop_fn fn
        qk_isa isa
        double flops_per_iter

    const qk_peak_entry qk_peak_loops[]
    const size_t qk_num_peak_loops

    double qk_peak_run(size_t index, size_t iters, int threads) nogil
    double qk_read_run(const void* buf, size_t bytes, int threads, uint64_t* checksum) nogil
