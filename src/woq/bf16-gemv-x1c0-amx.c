/*
 * bf16-gemv-x1c0-amx.c -- WoQ GEMV micro-kernels 32x1c0 and 8x1c0 on the
 * *unpacked* weight, AMX-TILE + AMX-BF16 (tdpbf16ps); AVX-512 F/BW widen
 * the weight and run the epilogue.
 *
 * Contract: qk_woq_ukernel_fn (include/qkern/woq.h) with layout nr = 1,
 * kr = 0: w is the caller's row-major (N, K) int8 matrix itself, and a[0]
 * the group of mr <= MR rows of x the driver packed transposed ("Packed
 * x^T" in include/qkern/woq.h): bf16 as is, f16 and f32 split into 2 or 3
 * bf16 planes whose sum is x exactly.  32x1c0 reads them plain
 * (qk_woq_pack_xt__avx512), each plane one more tdpbf16ps per tile; 8x1c0
 * stacked (qk_woq_pack_xt_stacked__avx512: plane p of row i in column
 * i * P + p, at most 24 columns), so that one tdpbf16ps per tile serves
 * every plane of a few rows.
 *
 * It computes y^T = W x^T, 32 columns of y (rows of W) at a time:
 *
 *   C  tmm0..tmm3  f32, W rows 0..15 / 16..31 x columns 0..15 / 16..31 of B
 *   A  tmm4, tmm5  W rows 0..15 / 16..31 x 32 k, the int8 widened to bf16
 *                  (exact: |w| <= 128) into one of two buffers here, in
 *                  turn, a block of CHUNKS_PER_BLOCK chunks of 32 k at a
 *                  time, row by row, between the tile steps of the block
 *                  before (each row's next block prefetched, its lines
 *                  whatever the row's alignment)
 *   B  tmm6, tmm7  16 pairs of k x columns 0..15 / 16..31 of packed x^T,
 *                  1 KiB each, straight from it; each A tile serves both
 *
 * so every weight is widened once per call whatever mr, and the work does
 * not grow with the rows of x: the functional op runs up to 32 rows in one
 * pass over the weight.  Rows of W past nc repeat the last one, k past kc
 * read as 0 (masked loads; nothing is read past a row of W).
 *
 * tdpbf16ps accumulates in f32, treating bf16 subnormal inputs as zero and
 * flushing subnormal results (DAZ/FTZ), in its own summation order: 32x1c0
 * adds each plane's products of a chunk into the row's one sum, 8x1c0
 * keeps a sum per plane and adds them in plane order at the end.  A row's
 * bits depend on which of the two runs it, not on the rows beside it.
 * Epilogue: scale (multiply), bias (add), one rounding to the dtype of x
 * (exact RNE, subnormals kept); only rows < mr and columns < nc are
 * written.  The tile configuration is loaded for each group of 32 columns
 * and released before its epilogue.
 */

#include "io-avx512.h"
#include "tiles-amx.h"
#include "ukernel-define.h"

/* 32 int8 of a row of W at row (the first `left` of them when left < 32;
 * the rest 0) -> 32 bf16. */
QK_INLINE __m512i widen_w(const int8_t* row, size_t left, __m512i idx) {
  return left >= 32 ? qk512_i8_to_bf16(row, idx)
                    : qk512_i8_to_bf16_masked(row, qk512_mask32(left), idx);
}

/* Chunks of 32 k widened at a time (8 KiB of A tiles): on the AMX Xeon
 * (4096 x 4096, 8 rows, one thread, weights cold, each row prefetching its
 * next block) 4 chunks took 1.65-1.8 ms, 8 1.85-2.1 and 16 2.3-2.6; a
 * prefetch 2 KiB ahead instead of one block, 2.6-2.8. */
#define CHUNKS_PER_BLOCK 4
#define BLOCK_BYTES (32 * CHUNKS_PER_BLOCK)

/* Prefetches the lines of the block after the one at wr in its row of W:
 * two, or three when the row is not aligned to a line (a caller's array
 * often starts 16 bytes past one, and a line missed per block and row made
 * a call 1.2x slower, weights cold). */
QK_INLINE void prefetch_next_block(const int8_t* wr) {
  for (size_t line = 0; line < BLOCK_BYTES; line += 64)
    _mm_prefetch((const char*)wr + BLOCK_BYTES + line, _MM_HINT_T0);
  _mm_prefetch((const char*)wr + 2 * BLOCK_BYTES - 1, _MM_HINT_T0);
}

/* The chunks of 32 k in block b of `chunks`. */
QK_INLINE size_t block_chunks(size_t chunks, size_t b) {
  const size_t c0 = b * CHUNKS_PER_BLOCK;
  return chunks - c0 < CHUNKS_PER_BLOCK ? chunks - c0 : CHUNKS_PER_BLOCK;
}

/* Row j of the 32 rows of W from n0 (the last row of W past nc), block b
 * (chunks 4b .. of 32 k, cn of them), widened into abuf. */
QK_INLINE void widen_row(const int8_t* w, size_t nc, size_t kc, size_t n0, size_t j, size_t b,
                         size_t cn, __m512i idx, uint16_t (*abuf)[2][16][32]) {
  const size_t c0 = b * CHUNKS_PER_BLOCK;
  const int8_t* wr = w + (n0 + j < nc ? n0 + j : nc - 1) * kc + 32 * c0;
  const size_t left = kc - 32 * c0; /* k of this row from wr */
  QK_ASAN_CHECK(wr, left < 32 * cn ? left : 32 * cn, 0);
  prefetch_next_block(wr);
  for (size_t q = 0; q < cn; q++)
    _mm512_store_si512(abuf[q][j / 16][j % 16], widen_w(wr + 32 * q, left - 32 * q, idx));
}

/* mr rows of x, packed x^T at xt, planes stacked (STACKED) or not. */
QK_INLINE void gemv_body(const int STACKED, const qk_dtype DT, size_t mr, size_t nc, size_t kc,
                         const char* xt, const int8_t* w, const float* scale, const float* bias,
                         void* c, ptrdiff_t c_stride) {
  const size_t planes = qk_bf16_planes(DT);
  /* B's columns, and the B tiles of one chunk that hold them */
  const size_t columns = STACKED ? mr * planes : mr, tile_planes = STACKED ? 1 : planes;
  const int two = columns > 16;
  const size_t chunks = (kc + 31) / 32;
  const size_t blocks = (chunks + CHUNKS_PER_BLOCK - 1) / CHUNKS_PER_BLOCK;
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  const __m512i down =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(32));
  /* block b widened into abufs[b % 2] while block b - 1's tiles run */
  uint16_t abufs[2][CHUNKS_PER_BLOCK][2][16][32] __attribute__((aligned(64)));
  float cbuf[32][32] __attribute__((aligned(64)));
  for (size_t n0 = 0; n0 < nc; n0 += 32) {
    qk_tile_config_32x32(32); /* every tile 16 rows of 64 bytes */
    _tile_zero(QK_TILE_C00);
    _tile_zero(QK_TILE_C01);
    _tile_zero(QK_TILE_C10);
    _tile_zero(QK_TILE_C11);
    for (size_t j = 0; j < 32 && blocks; j++)
      widen_row(w, nc, kc, n0, j, 0, block_chunks(chunks, 0), idx, abufs[0]);
    for (size_t b = 0; b < blocks; b++) {
      const size_t c0 = b * CHUNKS_PER_BLOCK, cn = block_chunks(chunks, b);
      const size_t next_cn = b + 1 < blocks ? block_chunks(chunks, b + 1) : 0;
      uint16_t(*abuf)[2][16][32] = abufs[b % 2];
      QK_MEMORY_BARRIER(); /* block b's stores stay before its tile loads */
      /* half of block b's tile steps after each 16 rows of block b + 1's
       * widening, so that the two overlap and the next block's prefetches
       * go out between tile steps (a quarter after each 8 rows: float32
       * weights in L2 took 1.1x as long; all after the 32: cold ones) */
      for (size_t j = 0; j < 32; j++) {
        if (next_cn) widen_row(w, nc, kc, n0, j, b + 1, next_cn, idx, abufs[(b + 1) % 2]);
        if (j % 16 != 15) continue;
        QK_MEMORY_BARRIER();
        const size_t half = CHUNKS_PER_BLOCK / 2;
        for (size_t q = j / 16 * half; q < (j / 16 + 1) * half && q < cn; q++) {
          _tile_loadd(QK_TILE_A0, abuf[q][0], 64);
          _tile_loadd(QK_TILE_A1, abuf[q][1], 64);
          qk_tile_dpbf16ps_chunk(1, xt + (c0 + q) * planes * 2048, tile_planes, columns);
        }
        QK_MEMORY_BARRIER(); /* the stores of block b + 2 stay after these loads */
      }
    }
    _tile_stored(QK_TILE_C00, cbuf[0], 128);
    _tile_stored(QK_TILE_C10, cbuf[16], 128);
    if (two) {
      _tile_stored(QK_TILE_C01, cbuf[0] + 16, 128);
      _tile_stored(QK_TILE_C11, cbuf[16] + 16, 128);
    }
    _tile_release();
    QK_MEMORY_BARRIER();
    /* y[i, n0 + col] = cbuf[col][i]: a column of cbuf per row of y */
    for (size_t h = 0; h < 2; h++) {
      const size_t col = n0 + 16 * h;
      if (col >= nc) break;
      const __mmask16 mask = qk512_mask(nc - col);
      const __m512 s = _mm512_maskz_loadu_ps(mask, scale + col);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
      for (size_t i = 0; i < mr; i++) {
        /* stacked: the row's plane sums, added in plane order */
        __m512 v = _mm512_i32gather_ps(down, &cbuf[16 * h][STACKED ? i * planes : i], 4);
        for (size_t p = 1; STACKED && p < planes; p++)
          v = _mm512_add_ps(v, _mm512_i32gather_ps(down, &cbuf[16 * h][i * planes + p], 4));
        qk512_epilogue((char*)c + (ptrdiff_t)i * c_stride, col, DT, v, s, b, bias != NULL, mask);
      }
    }
  }
}

/* The kernel body for dt, planes stacked or not. */
QK_INLINE void gemv(const int STACKED, size_t mr, size_t nc, size_t kc, const void* const* a,
                    qk_dtype dt, const int8_t* w, const float* scale, const float* bias, void* c,
                    ptrdiff_t c_stride) {
  const char* xt = (const char*)a[0];
#define GEMV_BODY(STACKED, DT) gemv_body(STACKED, DT, mr, nc, kc, xt, w, scale, bias, c, c_stride)
  QK_DTYPE_SWITCH(GEMV_BODY, STACKED)
#undef GEMV_BODY
}

void qk_woq_bf16_gemv_ukernel_8x1c0__amx(size_t mr, size_t nc, size_t kc, const void* const* a,
                                         qk_dtype dt, const int8_t* w, const float* scale,
                                         const float* bias, void* c, ptrdiff_t c_stride) {
  gemv(1, mr, nc, kc, a, dt, w, scale, bias, c, c_stride);
}

void qk_woq_bf16_gemv_ukernel_32x1c0__amx(size_t mr, size_t nc, size_t kc, const void* const* a,
                                          qk_dtype dt, const int8_t* w, const float* scale,
                                          const float* bias, void* c, ptrdiff_t c_stride) {
  gemv(0, mr, nc, kc, a, dt, w, scale, bias, c, c_stride);
}
