/*
 * woq_registry.c -- the WoQ kernel registry (baseline flags).
 *
 * One line per kernel.  QKERN_HAVE_<ISA> is defined by setup.py when the
 * compiler built that ISA's library; kernels it could not build are absent.
 * Order: within one ISA, smaller MR first.  Whether this CPU may run an entry
 * is decided in qkern/dispatch.py from qkern.cpu_features() and QKERN_ISA.
 */
#include "qkern/woq.h"
#include "qkern/woq_ukernels.h"

#define ALL ((1u << QK_F32) | (1u << QK_F16) | (1u << QK_BF16))
#define BF16 (1u << QK_BF16)

const qk_woq_kernel qk_woq_kernels[] = {
    {"f32_gemm_4x16c1__ref", qk_woq_f32_gemm_ukernel_4x16c1__ref, QK_ISA_REF, 4, 16, 1, ALL},
    {"f32_gemm_4x32c2__ref", qk_woq_f32_gemm_ukernel_4x32c2__ref, QK_ISA_REF, 4, 32, 2, ALL},
    {"f32_gemm_4x1c0__ref", qk_woq_f32_gemm_ukernel_4x1c0__ref, QK_ISA_REF, 4, 1, 0, ALL},
#ifdef QKERN_HAVE_AVX2
    {"f32_gemm_1x16c1__avx2", qk_woq_f32_gemm_ukernel_1x16c1__avx2, QK_ISA_AVX2, 1, 16, 1, ALL},
    {"f32_gemm_4x16c1__avx2", qk_woq_f32_gemm_ukernel_4x16c1__avx2, QK_ISA_AVX2, 4, 16, 1, ALL},
#endif
#ifdef QKERN_HAVE_AVX512
    {"f32_gemm_1x32c2__avx512", qk_woq_f32_gemm_ukernel_1x32c2__avx512, QK_ISA_AVX512, 1, 32, 2, ALL},
    {"f32_gemm_4x32c2__avx512", qk_woq_f32_gemm_ukernel_4x32c2__avx512, QK_ISA_AVX512, 4, 32, 2, ALL},
    {"f32_gemv_4x1c0__avx512", qk_woq_f32_gemv_ukernel_4x1c0__avx512, QK_ISA_AVX512, 4, 1, 0, ALL},
#endif
#ifdef QKERN_HAVE_AVX512_BF16
    {"bf16_gemm_1x32c2__avx512bf16", qk_woq_bf16_gemm_ukernel_1x32c2__avx512bf16, QK_ISA_AVX512_BF16, 1, 32, 2, BF16},
    {"bf16_gemm_8x32c2__avx512bf16", qk_woq_bf16_gemm_ukernel_8x32c2__avx512bf16, QK_ISA_AVX512_BF16, 8, 32, 2, BF16},
#endif
#ifdef QKERN_HAVE_AMX
    {"bf16_gemm_32x32c2__amx", NULL, QK_ISA_AMX, 32, 32, 2, ALL,
     NULL, qk_woq_pack_x__avx512, qk_woq_bf16_gemm_kblock_32x32c2__amx},
    {"bf16w_gemm_32x32c2__amx", NULL, QK_ISA_AMX, 32, 32, 2, ALL,
     qk_woq_widen_x32c2__avx512, qk_woq_pack_x__avx512, qk_woq_bf16w_gemm_kblock_32x32c2__amx},
#endif
};

const size_t qk_woq_num_kernels = sizeof(qk_woq_kernels) / sizeof(qk_woq_kernels[0]);
