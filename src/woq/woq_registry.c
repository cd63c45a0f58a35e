/*
 * woq_registry.c -- the WoQ kernel registry (baseline flags).
 *
 * One entry per kernel, with its traits (include/qkern/woq.h); code reads
 * the traits, never the name.  QKERN_HAVE_<ISA> is defined by setup.py when the
 * compiler built that ISA's library; kernels it could not build are absent.
 * Order: within one ISA and weight format, smaller MR first.  Whether this CPU may run an entry
 * is decided in qkern/dispatch.py from qkern.cpu_features() and QKERN_ISA.
 */
#include "qkern/woq.h"
#include "qkern/woq_ukernels.h"

#define ALL ((1u << QK_F32) | (1u << QK_F16) | (1u << QK_BF16))
#define BF16 (1u << QK_BF16)
#define INT8 QK_WOQ_INT8_PER_CHANNEL, 0 /* format, group size (all of K) */
#define INT4 QK_WOQ_INT4_GROUPWISE, 32  /* format, groups of any multiple of 32 */
#define FLUSHES QK_TRAIT_FLUSHES_SUBNORMALS
#define SPLITS QK_TRAIT_SPLITS_X
#define LINE_ALIGNED_X QK_TRAIT_LINE_ALIGNED_X
#define SUMS_BYTES QK_TRAIT_SUMS_BYTES
/* Default blockings (include/qkern/woq.h): a task of 256 rows times 256 KiB
 * of packed panels, L2-sized; the K-block kernels pack 2048 rows at once
 * and walk K in blocks of 1024 over chunks of 8 panels (256 KiB of int8,
 * 512 KiB widened); a thread per 2^20 multiply-adds at most. */
#define PANELS_BLOCKING {256, 256u << 10, 0, 1u << 20, QK_WOQ_SPLIT_M}
/* The AVX2 1x16 kernel runs four panels at a time (its FMA chains): chunks
 * of 1 MiB hold four panels up to K = 16384 (at K = 11008, one thread,
 * M = 1: 2.4 ms against 3.8 ms with 256 KiB chunks of one panel). */
#define ONE_ROW_BLOCKING {256, 1u << 20, 0, 1u << 20, QK_WOQ_SPLIT_M}
/* Chunks of 64 KiB of int8 widen to 256 KiB of f32, half the L2 of the
 * smallest AVX2 core measured (512 KiB; AVX-512 cores have 1-2 MiB). */
#define WIDENED_F32_BLOCKING {256, 64u << 10, 0, 1u << 20, QK_WOQ_SPLIT_M}
/* Chunks of 32 KiB of int4 dequantize to 256 KiB of f32 (one panel at
 * least: 512 KiB at K = 4096, which the kernel streams from L3 as fast). */
#define DEQUANTIZED_F32_BLOCKING {256, 32u << 10, 0, 1u << 20, QK_WOQ_SPLIT_M}
/* Chunks of 128 KiB of int8 widen to 256 KiB of bf16, as the f32 ones. */
#define WIDENED_BF16_BLOCKING {256, 128u << 10, 0, 1u << 20, QK_WOQ_SPLIT_M}
#define KBLOCK_BLOCKING {2048, 256u << 10, 1024, 1u << 20, QK_WOQ_SPLIT_N}
/* The int4 K-block kernels: 128 columns of a 1024-k block per chunk (64
 * KiB of int4, 256 KiB widened), so that a 32-row step's f32 sums over the
 * chunk (16 KiB), which every group re-reads, stay in L1 beside the
 * group's A tiles. */
#define INT4_KBLOCK_BLOCKING {2048, 64u << 10, 1024, 1u << 20, QK_WOQ_SPLIT_N}

/* The portable kernels are held to the AVX2 FMA peak, the least a machine
 * that measures a roofline has. */
const qk_woq_kernel qk_woq_kernels[] = {
    {"f32_gemm_4x16c1__ref", QK_WOQ_PANELS, QK_ISA_REF, 4, 16, 1, ALL, INT8, 0, "vfmadd231ps ymm",
     PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_4x16c1__ref},
    {"f32_gemm_4x32c2__ref", QK_WOQ_PANELS, QK_ISA_REF, 4, 32, 2, ALL, INT8, 0, "vfmadd231ps ymm",
     PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_4x32c2__ref},
    {"f32_gemm_4x1c0__ref", QK_WOQ_UNPACKED, QK_ISA_REF, 4, 1, 0, ALL, INT8, 0, "vfmadd231ps ymm",
     PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_4x1c0__ref},
    {"f32_qb4w_gemm_4x32c1__ref", QK_WOQ_PANELS, QK_ISA_REF, 4, 32, 1, ALL, INT4, SUMS_BYTES,
     "vfmadd231ps ymm", PANELS_BLOCKING, .convert_x = qk_woq_convert_x__ref,
     .int4_fn = qk_woq_f32_qb4w_gemm_ukernel_4x32c1__ref},
#ifdef QKERN_HAVE_AVX2
    {"f32_gemm_1x16c1__avx2", QK_WOQ_PANELS, QK_ISA_AVX2, 1, 16, 1, ALL, INT8, 0, "vfmadd231ps ymm",
     ONE_ROW_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_1x16c1__avx2,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32_gemm_4x16c1__avx2", QK_WOQ_PANELS, QK_ISA_AVX2, 4, 16, 1, ALL, INT8, 0, "vfmadd231ps ymm",
     PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_4x16c1__avx2,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32_gemm_6x16c1__avx2", QK_WOQ_PANELS, QK_ISA_AVX2, 6, 16, 1, ALL, INT8, 0, "vfmadd231ps ymm",
     PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_6x16c1__avx2,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32w_gemm_6x16c1__avx2", QK_WOQ_PANELS, QK_ISA_AVX2, 6, 16, 1, ALL, INT8, 0,
     "vfmadd231ps ymm", WIDENED_F32_BLOCKING, .fn = qk_woq_f32w_gemm_ukernel_6x16c1__avx2,
     .widen = qk_woq_widen_x16c1__avx2, .widened_bytes = 4, .convert_x = qk_woq_convert_x__avx2},
    {"f32_gemv_8x1c0__avx2", QK_WOQ_UNPACKED, QK_ISA_AVX2, 8, 1, 0, ALL, INT8, LINE_ALIGNED_X,
     "vfmadd231ps ymm", PANELS_BLOCKING, .fn = qk_woq_f32_gemv_ukernel_8x1c0__avx2,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32_qb4w_gemm_6x32c1__avx2", QK_WOQ_PANELS, QK_ISA_AVX2, 6, 32, 1, ALL, INT4, SUMS_BYTES,
     "vfmadd231ps ymm", PANELS_BLOCKING, .convert_x = qk_woq_convert_x__avx2,
     .int4_fn = qk_woq_f32_qb4w_gemm_ukernel_6x32c1__avx2},
    {"f32dq_qb4w_gemm_6x32c1__avx2", QK_WOQ_PANELS, QK_ISA_AVX2, 6, 32, 1, ALL, INT4, 0,
     "vfmadd231ps ymm", DEQUANTIZED_F32_BLOCKING, .widened_bytes = 4,
     .convert_x = qk_woq_convert_x__avx2, .int4_fn = qk_woq_f32dq_qb4w_gemm_ukernel_6x32c1__avx2,
     .dequantize = qk_woq_dequant_x32c1__avx2},
#endif
#ifdef QKERN_HAVE_AVX512 /* x in f32: the AVX2 conversion (every AVX-512 CPU has AVX2) */
    {"f32_gemm_1x32c2__avx512", QK_WOQ_PANELS, QK_ISA_AVX512, 1, 32, 2, ALL, INT8, 0,
     "vfmadd231ps zmm", PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_1x32c2__avx512,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32_gemm_4x32c2__avx512", QK_WOQ_PANELS, QK_ISA_AVX512, 4, 32, 2, ALL, INT8, 0,
     "vfmadd231ps zmm", PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_4x32c2__avx512,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32_gemm_6x32c2__avx512", QK_WOQ_PANELS, QK_ISA_AVX512, 6, 32, 2, ALL, INT8, 0,
     "vfmadd231ps zmm", PANELS_BLOCKING, .fn = qk_woq_f32_gemm_ukernel_6x32c2__avx512,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32w_gemm_6x32c2__avx512", QK_WOQ_PANELS, QK_ISA_AVX512, 6, 32, 2, ALL, INT8, 0,
     "vfmadd231ps zmm", WIDENED_F32_BLOCKING, .fn = qk_woq_f32w_gemm_ukernel_6x32c2__avx512,
     .widen = qk_woq_widen_f32_x32c2__avx512, .widened_bytes = 4,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32_gemv_8x1c0__avx512", QK_WOQ_UNPACKED, QK_ISA_AVX512, 8, 1, 0, ALL, INT8, LINE_ALIGNED_X,
     "vfmadd231ps zmm", PANELS_BLOCKING, .fn = qk_woq_f32_gemv_ukernel_8x1c0__avx512,
     .convert_x = qk_woq_convert_x__avx2},
    {"f32_qb4w_gemm_8x32c1__avx512", QK_WOQ_PANELS, QK_ISA_AVX512, 8, 32, 1, ALL, INT4, SUMS_BYTES,
     "vfmadd231ps zmm", PANELS_BLOCKING, .convert_x = qk_woq_convert_x__avx2,
     .int4_fn = qk_woq_f32_qb4w_gemm_ukernel_8x32c1__avx512},
    {"f32dq_qb4w_gemm_8x32c1__avx512", QK_WOQ_PANELS, QK_ISA_AVX512, 8, 32, 1, ALL, INT4, 0,
     "vfmadd231ps zmm", DEQUANTIZED_F32_BLOCKING, .widened_bytes = 4,
     .convert_x = qk_woq_convert_x__avx2, .int4_fn = qk_woq_f32dq_qb4w_gemm_ukernel_8x32c1__avx512,
     .dequantize = qk_woq_dequant_x32c1__avx512},
#endif
#ifdef QKERN_HAVE_AVX512_BF16
    {"bf16_gemm_1x32c2__avx512bf16", QK_WOQ_PANELS, QK_ISA_AVX512_BF16, 1, 32, 2, BF16, INT8,
     FLUSHES, "vdpbf16ps zmm", PANELS_BLOCKING, .fn = qk_woq_bf16_gemm_ukernel_1x32c2__avx512bf16},
    {"bf16_gemm_8x32c2__avx512bf16", QK_WOQ_PANELS, QK_ISA_AVX512_BF16, 8, 32, 2, BF16, INT8,
     FLUSHES, "vdpbf16ps zmm", PANELS_BLOCKING, .fn = qk_woq_bf16_gemm_ukernel_8x32c2__avx512bf16},
    {"bf16w_gemm_8x32c2__avx512bf16", QK_WOQ_PANELS, QK_ISA_AVX512_BF16, 8, 32, 2, BF16, INT8,
     FLUSHES, "vdpbf16ps zmm", WIDENED_BF16_BLOCKING,
     .fn = qk_woq_bf16w_gemm_ukernel_8x32c2__avx512bf16, .widen = qk_woq_widen_x32c2__avx512,
     .widened_bytes = 2},
    {"bf16_gemv_8x1c0__avx512bf16", QK_WOQ_UNPACKED, QK_ISA_AVX512_BF16, 8, 1, 0, BF16, INT8,
     FLUSHES | LINE_ALIGNED_X, "vdpbf16ps zmm", PANELS_BLOCKING,
     .fn = qk_woq_bf16_gemv_ukernel_8x1c0__avx512bf16},
    {"bf16_qb4w_gemm_8x32c1__avx512bf16", QK_WOQ_PANELS, QK_ISA_AVX512_BF16, 8, 32, 1, BF16, INT4,
     FLUSHES, "vdpbf16ps zmm", PANELS_BLOCKING, .convert_x = qk_woq_convert_x__avx2,
     .int4_fn = qk_woq_bf16_qb4w_gemm_ukernel_8x32c1__avx512bf16},
#endif
#ifdef QKERN_HAVE_AMX
    {"bf16_gemv_8x1c0__amx", QK_WOQ_UNPACKED, QK_ISA_AMX, 8, 1, 0, ALL, INT8, FLUSHES | SPLITS,
     "tdpbf16ps", PANELS_BLOCKING, .fn = qk_woq_bf16_gemv_ukernel_8x1c0__amx,
     .pack_x = qk_woq_pack_xt_stacked__avx512},
    {"bf16_gemm_32x32c2__amx", QK_WOQ_KBLOCK, QK_ISA_AMX, 32, 32, 2, ALL, INT8, FLUSHES | SPLITS,
     "tdpbf16ps", KBLOCK_BLOCKING, .pack_x = qk_woq_pack_x__avx512,
     .kblock = qk_woq_bf16_gemm_kblock_32x32c2__amx},
    {"bf16w_gemm_32x32c2__amx", QK_WOQ_KBLOCK, QK_ISA_AMX, 32, 32, 2, ALL, INT8, FLUSHES | SPLITS,
     "tdpbf16ps", KBLOCK_BLOCKING, .widen = qk_woq_widen_x32c2__avx512, .widened_bytes = 2,
     .pack_x = qk_woq_pack_x__avx512, .kblock = qk_woq_bf16w_gemm_kblock_32x32c2__amx},
    {"bf16_gemv_32x1c0__amx", QK_WOQ_UNPACKED, QK_ISA_AMX, 32, 1, 0, ALL, INT8, FLUSHES | SPLITS,
     "tdpbf16ps", PANELS_BLOCKING, .fn = qk_woq_bf16_gemv_ukernel_32x1c0__amx,
     .pack_x = qk_woq_pack_xt__avx512},
    {"tile_qb4w_gemm_32x32c1__amx", QK_WOQ_KBLOCK, QK_ISA_AMX, 32, 32, 1, ALL, INT4,
     FLUSHES | SPLITS, "tdpbf16ps", INT4_KBLOCK_BLOCKING, .pack_x = qk_woq_pack_x__avx512,
     .convert_x = qk_woq_convert_x__avx2, .int4_kblock = qk_woq_tile_qb4w_gemm_kblock_32x32c1__amx},
    {"tilew_qb4w_gemm_32x32c1__amx", QK_WOQ_KBLOCK, QK_ISA_AMX, 32, 32, 1, ALL, INT4,
     FLUSHES | SPLITS, "tdpbf16ps", INT4_KBLOCK_BLOCKING, .widen = qk_woq_widen_x32c1__avx512,
     .widened_bytes = 2, .pack_x = qk_woq_pack_x__avx512, .convert_x = qk_woq_convert_x__avx2,
     .int4_kblock = qk_woq_tilew_qb4w_gemm_kblock_32x32c1__amx},
#endif
};

const size_t qk_woq_num_kernels = sizeof(qk_woq_kernels) / sizeof(qk_woq_kernels[0]);
