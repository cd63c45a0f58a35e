/*
 * bf16-gemm-x32c2-amx.c -- WoQ GEMM micro-kernels 32x32c2 (packed int8
 * weights, widened here) and bf16w 32x32c2 (widened weights, which it
 * widens itself into the driver's buffer on a K block's first row step),
 * AMX-TILE + AMX-BF16 (tdpbf16ps); AVX-512 F/BW build the A and B tiles
 * and run the epilogue.
 *
 * Contract: qk_woq_kblock_fn (include/qkern/woq.h), one K block per call,
 * layout nr = 32, kr = 2 (packed, or widened for bf16w), mr <= 32, x packed
 * by the driver (qk_woq_pack_x__avx512, "Packed x" in include/qkern/woq.h):
 * bf16 as is, f16 and f32 split into 2 or 3 bf16 planes whose sum is x
 * exactly, each plane one more tdpbf16ps per tile.
 *
 *   C  tmm0..tmm3  rows 0..15 / 16..31 x columns 0..15 / 16..31, f32
 *   A  tmm4, tmm5  rows 0..15 / 16..31 x 32 bf16 of one chunk of 32 k and
 *                  one plane: 1 KiB contiguous in packed x
 *   B  tmm6, tmm7  16 k-groups x 16 columns x (k, k+1) bf16: a k-group's
 *                  64 int8, widened to bf16 (exact: |w| <= 128), are one row
 *                  of each, built in a buffer (rows past the last k-group
 *                  zero; for bf16w with widen_to, in the block's widened
 *                  panels there) -- or, for bf16w without, loaded straight
 *                  from the widened panel, whose zero padding covers the
 *                  last chunk; each B tile serves both row halves
 *
 * Loops: the block's K in sub-blocks of 16 (chunk, plane) pairs of 2 KiB
 * (16, 8 or 5 chunks for 1, 2 or 3 planes, 30-32 KiB of packed x), each
 * sub-block over every panel, so a
 * sub-block of A is read from L1 by every panel after the first; between
 * sub-blocks (and blocks) a panel's C tiles are parked in acc (exact, so the
 * sum is the one a single pass over K would give).  Widened B tiles, read
 * once per call from L2, are loaded with the non-temporal hint
 * (tileloaddt1) so that they do not evict the sub-block of A from L1, and
 * each sub-block prefetches the next one's A into L2 a few lines per step.
 * Each chunk's B tiles are built and loaded right behind the previous
 * chunk's products, a panel's first ones before the previous panel's C
 * tiles are parked, so that their widening and loads overlap the wait for
 * the last products.
 *
 * tdpbf16ps accumulates in f32, like vdpbf16ps treating bf16 subnormal inputs
 * as zero and flushing subnormal results (DAZ/FTZ), in its own summation
 * order.  Epilogue (last block): scale (multiply), bias (add), one rounding
 * to the dtype of x (exact RNE, subnormals kept); only rows < mr and columns
 * < nc are written.  The tile configuration is loaded on entry and released
 * before the epilogue.
 */
#include <string.h>

#include "io-avx512.h"
#include "tiles-amx.h"
#include "ukernel-define.h"

/* `groups` (<= 16) k-groups of 64 int8 -> the 16 rows of one chunk in the
 * widened layout at dst (row g: B0's 64 bytes, then B1's; rows past the
 * last k-group zero). */
QK_INLINE void widen_b(const int8_t* wp, size_t groups, char* dst) {
  const __m512i idx = _mm512_load_si512(qk512_high_halves);
  QK_ASAN_CHECK(dst, 2048, 1);
  for (size_t g = 0; g < groups; g++, wp += 64, dst += 128) qk512_widen_group(2, wp, idx, dst, 0);
  qk512_zero_lines(dst, 2 * (16 - groups));
}

/* 32-k chunks per sub-block, over the planes: a sub-block's A tiles
 * (CHUNKS_PER_SUB_BLOCK * 2 KiB) stay in L1 while every panel uses them
 * (8 and 32 ran slower). */
#define CHUNKS_PER_SUB_BLOCK 16

/* Prefetches into L2 the lines of the next sub-block's A (`lines` 64-byte
 * lines from `next`, 32 per chunk and plane: line i holds row i) that step
 * `step` of `steps` (panel, chunk) steps of this sub-block owns, rows < mr
 * only, so that no panel waits for them from the last-level cache. */
QK_INLINE void prefetch_next_a(const char* next, size_t lines, size_t mr, size_t step,
                               size_t steps) {
  const size_t per_step = (lines + steps - 1) / steps;
  for (size_t l = step * per_step; l < (step + 1) * per_step && l < lines; l++)
    if (l % 32 < mr) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
}

/* Loads the B tiles of chunk ch of panel pn: from the widened panel
 * (WIDENED, with the non-temporal hint: read once per 32-row step, from
 * L2, they do not evict the sub-block of A from L1), else widened first
 * from the packed panel into widen_to (the block's widened panels, kept
 * for the next row steps) or bbuf. */
QK_INLINE void load_b(const int WIDENED, const int8_t* w, size_t w_panel_stride, char* widen_to,
                      size_t chunks, size_t groups, size_t pn, size_t ch, char* bbuf) {
  const int8_t* wp = w + pn * w_panel_stride;
  if (WIDENED) {
    QK_ASAN_CHECK(wp + 2048 * ch, 2048, 0);
    _tile_stream_loadd(QK_TILE_B0, wp + 2048 * ch, 128);
    _tile_stream_loadd(QK_TILE_B1, wp + 2048 * ch + 64, 128);
    return;
  }
  char* b = widen_to ? widen_to + pn * 2048 * chunks + 2048 * ch : bbuf;
  widen_b(wp + 1024 * ch, groups - 16 * ch < 16 ? groups - 16 * ch : 16, b);
  QK_MEMORY_BARRIER();
  _tile_loadd(QK_TILE_B0, b, 128);
  _tile_loadd(QK_TILE_B1, b + 64, 128);
  QK_MEMORY_BARRIER(); /* the next chunk's stores stay after these loads */
}

/* PREWIDENED and no widen_to: w holds widened panels (include/qkern/woq.h),
 * read straight into the B tiles; else packed int8 panels, widened here
 * chunk by chunk, into widen_to (the block's widened panels, kept for the
 * next row steps) or a buffer of one chunk.  Rows 16..31 (when mr > 16)
 * reuse each B tile loaded for rows 0..15. */
QK_INLINE void amx_body(const int PREWIDENED, const qk_dtype DT, size_t mr, size_t nc, size_t kc,
                        const char* at, const int8_t* w, size_t w_panel_stride, char* widen_to,
                        float* acc, int first, int last, const float* scale, const float* bias,
                        void* c, ptrdiff_t c_stride) {
  const size_t planes = qk_bf16_planes(DT);
  const size_t sub = CHUNKS_PER_SUB_BLOCK / planes;
  const int widened = PREWIDENED && !widen_to;
  char bbuf[2048] __attribute__((aligned(64)));
  const int two = mr > 16;
  const size_t groups = (kc + 1) / 2, chunks = (groups + 15) / 16;
  const size_t panels = (nc + 31) / 32, ld = 32 * panels; /* acc: rows ld floats apart */

  qk_tile_config_32x32(mr);
  if (chunks) load_b(widened, w, w_panel_stride, widen_to, chunks, groups, 0, 0, bbuf);
  /* Sub-blocks in order, each over every panel; with kc = 0 one empty
   * sub-block stores the zeroed tiles. */
  for (size_t c0 = 0; c0 == 0 || c0 < chunks; c0 += sub) {
    const size_t c_end = c0 + sub < chunks ? c0 + sub : chunks;
    const size_t steps = panels * (c_end - c0);
    const size_t next_lines = (chunks - c_end < sub ? chunks - c_end : sub) * planes * 32;
    for (size_t pn = 0; pn < panels; pn++) {
      float* cp = acc + 32 * pn;
      if (first && c0 == 0) {
        _tile_zero(QK_TILE_C00);
        _tile_zero(QK_TILE_C01);
        _tile_zero(QK_TILE_C10);
        _tile_zero(QK_TILE_C11);
      } else {
        _tile_loadd(QK_TILE_C00, cp, 4 * ld);
        _tile_loadd(QK_TILE_C01, cp + 16, 4 * ld);
        if (two) {
          _tile_loadd(QK_TILE_C10, cp + 16 * ld, 4 * ld);
          _tile_loadd(QK_TILE_C11, cp + 16 * ld + 16, 4 * ld);
        }
      }
      for (size_t ch = c0; ch < c_end; ch++) {
        prefetch_next_a(at + c_end * planes * 2048, next_lines, mr, pn * (c_end - c0) + ch - c0,
                        steps);
        qk_tile_dpbf16ps_chunk(0, at + ch * planes * 2048, planes, mr);
        /* the next chunk's B, the next panel's (or sub-block's) first one
         * loaded before these C tiles are parked */
        const int panel_ends = ch + 1 == c_end, more_panels = pn + 1 < panels;
        const size_t next_pn = !panel_ends ? pn : more_panels ? pn + 1 : 0;
        const size_t next_ch = !panel_ends ? ch + 1 : more_panels ? c0 : c_end;
        if (next_ch < chunks)
          load_b(widened, w, w_panel_stride, widen_to, chunks, groups, next_pn, next_ch, bbuf);
      }
      QK_ASAN_CHECK(cp, 4 * (ld * (mr - 1) + 32), 1);
      _tile_stored(QK_TILE_C00, cp, 4 * ld);
      _tile_stored(QK_TILE_C01, cp + 16, 4 * ld);
      if (two) {
        _tile_stored(QK_TILE_C10, cp + 16 * ld, 4 * ld);
        _tile_stored(QK_TILE_C11, cp + 16 * ld + 16, 4 * ld);
      }
    }
  }
  _tile_release();
  QK_MEMORY_BARRIER();
  if (!last) return;

  for (size_t pn = 0; pn < panels; pn++) {
    for (size_t h = 0; h < 2; h++) {
      const size_t col = 32 * pn + 16 * h;
      if (col >= nc) break;
      const __mmask16 mask = qk512_mask(nc - col);
      const __m512 s = _mm512_loadu_ps(scale + col);
      const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
      for (size_t i = 0; i < mr; i++) {
        qk512_epilogue((char*)c + (ptrdiff_t)i * c_stride, col, DT,
                       _mm512_load_ps(acc + i * ld + col), s, b, bias != NULL, mask);
      }
    }
  }
}

/* The two kernels differ only in where B comes from. */
#define AMX_BODY(PREWIDENED, DT)                                                                \
  amx_body(PREWIDENED, DT, mr, nc, kc, (const char*)a, w, w_panel_stride, (char*)widen_to, acc, \
           first, last, scale, bias, c, c_stride)
#define AMX_KBLOCK(NAME, PREWIDENED)                                                      \
  void NAME(size_t mr, size_t nc, size_t kc, const void* a, qk_dtype dt, const int8_t* w, \
            size_t w_panel_stride, void* widen_to, float* acc, int first, int last,       \
            const float* scale, const float* bias, void* c, ptrdiff_t c_stride) {         \
    QK_DTYPE_SWITCH(AMX_BODY, PREWIDENED)                                                 \
  }

AMX_KBLOCK(qk_woq_bf16_gemm_kblock_32x32c2__amx, 0)
AMX_KBLOCK(qk_woq_bf16w_gemm_kblock_32x32c2__amx, 1)
