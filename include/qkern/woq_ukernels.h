/*
 * qkern/woq_ukernels.h -- every WoQ micro-kernel, declared once.
 * Name: qk_woq_<compute>_<gemm|gemv>_<ukernel|kblock>_<MR>x<NR>c<KR>__<isa>
 * ("kblock": a K-block kernel on packed x, qk_woq_kblock_fn), defined in
 * src/woq/<compute>-<gemm|gemv>-x<NR>c<KR>-<isa>.c (or -ref.c); compute
 * "bf16w" / "f32w" reads widened panels and lives beside its "bf16" / "f32"
 * twin.
 */
#ifndef QKERN_WOQ_UKERNELS_H
#define QKERN_WOQ_UKERNELS_H

#include "qkern/woq.h"

#define QK_DECLARE_UKERNEL(NAME)                                                                 \
  void NAME(size_t mr, size_t nc, size_t kc, const void* const* a, qk_dtype dt, const int8_t* w, \
            const float* scale, const float* bias, void* c, ptrdiff_t c_stride);

QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_4x16c1__ref)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_4x32c2__ref)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_4x1c0__ref)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_1x16c1__avx2)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_4x16c1__avx2)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_6x16c1__avx2)
QK_DECLARE_UKERNEL(qk_woq_f32w_gemm_ukernel_6x16c1__avx2)
QK_DECLARE_UKERNEL(qk_woq_f32_gemv_ukernel_8x1c0__avx2)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_1x32c2__avx512)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_4x32c2__avx512)
QK_DECLARE_UKERNEL(qk_woq_f32_gemm_ukernel_6x32c2__avx512)
QK_DECLARE_UKERNEL(qk_woq_f32w_gemm_ukernel_6x32c2__avx512)
QK_DECLARE_UKERNEL(qk_woq_f32_gemv_ukernel_8x1c0__avx512)
QK_DECLARE_UKERNEL(qk_woq_bf16_gemm_ukernel_1x32c2__avx512bf16)
QK_DECLARE_UKERNEL(qk_woq_bf16_gemm_ukernel_8x32c2__avx512bf16)
QK_DECLARE_UKERNEL(qk_woq_bf16w_gemm_ukernel_8x32c2__avx512bf16)
QK_DECLARE_UKERNEL(qk_woq_bf16_gemv_ukernel_8x1c0__avx512bf16)

/* K-block kernels on packed x (qk_woq_kblock_fn). */
#define QK_DECLARE_KBLOCK(NAME)                                                           \
  void NAME(size_t mr, size_t nc, size_t kc, const void* a, qk_dtype dt, const int8_t* w, \
            size_t w_panel_stride, void* widen_to, float* acc, int first, int last,       \
            const float* scale, const float* bias, void* c, ptrdiff_t c_stride);

QK_DECLARE_KBLOCK(qk_woq_bf16_gemm_kblock_32x32c2__amx)
QK_DECLARE_KBLOCK(qk_woq_bf16w_gemm_kblock_32x32c2__amx)

/* AMX kernels on the unpacked weight (qk_woq_ukernel_fn over packed x^T). */
QK_DECLARE_UKERNEL(qk_woq_bf16_gemv_ukernel_8x1c0__amx)
QK_DECLARE_UKERNEL(qk_woq_bf16_gemv_ukernel_32x1c0__amx)

/* Kernels on int4 groupwise weights (qk_woq_int4_ukernel_fn); compute
 * "f32_qb4w": f32 FMAs over 4-bit blockwise-scaled weights, "bf16_qb4w":
 * bf16 pair dot products (vdpbf16ps) over them. */
#define QK_DECLARE_INT4_UKERNEL(NAME)                                                           \
  void NAME(size_t mr, size_t nc, size_t kc, size_t group_size, const float* const* a,          \
            qk_dtype dt, const uint8_t* w, const void* sz, size_t sz_stride, const float* bias, \
            void* c, ptrdiff_t c_stride);

QK_DECLARE_INT4_UKERNEL(qk_woq_f32_qb4w_gemm_ukernel_4x32c1__ref)
QK_DECLARE_INT4_UKERNEL(qk_woq_f32_qb4w_gemm_ukernel_6x32c1__avx2)
QK_DECLARE_INT4_UKERNEL(qk_woq_f32_qb4w_gemm_ukernel_8x32c1__avx512)
QK_DECLARE_INT4_UKERNEL(qk_woq_bf16_qb4w_gemm_ukernel_8x32c1__avx512bf16)
/* compute "f32dq_qb4w": f32 FMAs over weights the driver dequantized */
QK_DECLARE_INT4_UKERNEL(qk_woq_f32dq_qb4w_gemm_ukernel_6x32c1__avx2)
QK_DECLARE_INT4_UKERNEL(qk_woq_f32dq_qb4w_gemm_ukernel_8x32c1__avx512)

/* K-block kernels on int4 groupwise weights and packed x
 * (qk_woq_int4_kblock_fn); compute "tile_qb4w": AMX tile products of the
 * bf16 planes of x and bf16(q) ("tilew_qb4w": the same, on panels widened
 * by the driver). */
#define QK_DECLARE_INT4_KBLOCK(NAME)                                                              \
  void NAME(size_t mr, size_t nc, size_t kc, size_t group_size, const void* a, const float* xs,   \
            size_t xs_stride, qk_dtype dt, const uint8_t* w, size_t w_panel_stride,               \
            const void* sz, size_t sz_stride, float* acc, int first, int last, const float* bias, \
            void* c, ptrdiff_t c_stride);

QK_DECLARE_INT4_KBLOCK(qk_woq_tile_qb4w_gemm_kblock_32x32c1__amx)
QK_DECLARE_INT4_KBLOCK(qk_woq_tilew_qb4w_gemm_kblock_32x32c1__amx)

/* Widening functions (qk_woq_widen_fn), src/woq/widen-x<NR>c<KR>-<isa>.c:
 * to f32 on AVX2 and where named _f32_, to bf16 otherwise. */
void qk_woq_widen_x16c1__avx2(const int8_t* packed, size_t panels, size_t kc, void* out);
void qk_woq_widen_x32c2__avx512(const int8_t* packed, size_t panels, size_t kc, void* out);
void qk_woq_widen_f32_x32c2__avx512(const int8_t* packed, size_t panels, size_t kc, void* out);
void qk_woq_widen_x32c1__avx512(const int8_t* packed, size_t panels, size_t kc, void* out);

/* Dequantizing functions (qk_woq_dequantize_fn),
 * src/woq/dequant-x<NR>c<KR>-<isa>.c. */
void qk_woq_dequant_x32c1__avx2(const uint8_t* packed, size_t panels, size_t kc, size_t group_size,
                                const void* sz, size_t sz_stride, qk_dtype dt, size_t nc,
                                float* out);
void qk_woq_dequant_x32c1__avx512(const uint8_t* packed, size_t panels, size_t kc,
                                  size_t group_size, const void* sz, size_t sz_stride, qk_dtype dt,
                                  size_t nc, float* out);

/* Activation packing (qk_woq_pack_x_fn), src/woq/pack-x-<isa>.c. */
void qk_woq_pack_x__avx512(const void* row, qk_dtype dt, size_t kc, size_t i, void* group,
                           size_t chunk_stride);
void qk_woq_pack_xt__avx512(const void* row, qk_dtype dt, size_t kc, size_t i, void* group,
                            size_t chunk_stride);
void qk_woq_pack_xt_stacked__avx512(const void* row, qk_dtype dt, size_t kc, size_t i, void* group,
                                    size_t chunk_stride);

/* Activation conversion to f32 (qk_woq_convert_x_fn), src/woq/convert-x-<isa>.c. */
void qk_woq_convert_x__ref(const void* row, qk_dtype dt, size_t kc, float* out);
void qk_woq_convert_x__avx2(const void* row, qk_dtype dt, size_t kc, float* out);

#endif /* QKERN_WOQ_UKERNELS_H */
