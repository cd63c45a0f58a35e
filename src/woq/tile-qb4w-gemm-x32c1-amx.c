/*
 * tile-qb4w-gemm-x32c1-amx.c -- the WoQ GEMM K-block micro-kernels 32x32c1
 * on int4 groupwise weights, tile (packed int4 panels, widened here) and
 * tilew (panels the driver widened to bf16 B-tile rows,
 * qk_woq_widen_x32c1__avx512), AMX-TILE + AMX-BF16 (tdpbf16ps); AVX-512
 * F/BW/VL widen the weights into B tiles and run the group epilogue.
 *
 * Contract: qk_woq_int4_kblock_fn (include/qkern/woq.h), packed int4
 * layout (nr = 32), one K block of whole groups per call, mr <= 32, x
 * packed by the driver (qk_woq_pack_x__avx512: bf16 as is, f16 and f32
 * as 2 or 3 bf16 planes whose sum is x exactly), the order of sums of the
 * "tile_qb4w" kernels in the header.
 *
 *   C  tmm0..tmm3  rows 0..15 / 16..31 x columns 0..15 / 16..31: the
 *                  partial sums p of one group, f32
 *   A  tmm4, tmm5  rows 0..15 / 16..31 x one 32-k chunk of one plane,
 *                  1 KiB contiguous in packed x
 *   B  tmm6, tmm7  16 pairs (k, k + 1) x columns 0..15 / 16..31 of
 *                  bf16(q), exact: a pair of the panel's 16-byte rows
 *                  widens to one row of each (qk512_qb4w_widen_rows, as
 *                  the vdpbf16ps kernel widens a pair), into a 2 KiB
 *                  buffer in the widened layout -- or, for tilew, loaded
 *                  straight from the widened panel, the same 2 KiB per
 *                  32 k; each B tile serves every plane and both row
 *                  halves
 *
 * Loops: group by group, and within a group panel by panel, so that the
 * group's A tiles (group_size / 32 chunks of 1 to 3 planes, 2 KiB each)
 * are read from L1 by every panel after the first.  Per group and panel:
 * C = 0; chunk by chunk, plane by plane tdpbf16ps of A and B into C, the
 * next chunk's B built and loaded behind them (the next panel's first B
 * before C leaves the tiles, so that its load and widening overlap the
 * wait for the last products); C stored to a buffer, each C tile zeroed
 * as soon as it is stored; then, for rows < mr and columns < nc,
 * acc = fma(p, s, acc), acc = fma(xs, z', acc) with z' = fma(-8, s, z)
 * (qk512_qb4w_params16: nothing read beyond column nc).  acc starts at 0
 * in the first block and carries the sums from block to block; the last
 * block writes y = acc (+ bias), one rounding to the dtype of x.
 * tdpbf16ps treats subnormal bf16 inputs as zero and flushes subnormal
 * results (DAZ/FTZ).  The tile configuration is loaded on entry and
 * released before the last block's stores.
 */
#include <string.h>

#include "qb4w-avx512.h"
#include "qkern/woq_ukernels.h"
#include "tiles-amx.h"

/* The partial sums of one group and panel (p: 32 rows of 32 f32, of which
 * rows < mr are set) applied to the panel's sums in acc (rows ld floats
 * apart), columns col0 .. col0 + 31 below nc; sz_row: the group's (s, z)
 * pairs from column 0 of the call, xs: its sum of each row, xs_stride
 * apart. */
QK_INLINE void apply_group(const qk_dtype DT, size_t mr, size_t nc, size_t col0, size_t ld,
                           const float p[32][32], const char* sz_row, const float* xs,
                           size_t xs_stride, float* acc) {
  const size_t pair = 2 * qk_dtype_size(DT);
  for (size_t h = 0; h < 2; h++) {
    const size_t col = col0 + 16 * h;
    if (col >= nc) break;
    __m512 s, zp;
    qk512_qb4w_params16(sz_row + col * pair, nc - col < 16 ? nc - col : 16, DT, &s, &zp);
    for (size_t i = 0; i < mr; i++) {
      float* a = acc + i * ld + col;
      __m512 v = _mm512_fmadd_ps(_mm512_load_ps(p[i] + 16 * h), s, _mm512_load_ps(a));
      v = _mm512_fmadd_ps(_mm512_set1_ps(xs[i * xs_stride]), zp, v);
      _mm512_store_ps(a, v);
    }
  }
}

/* The first k-row of the group and panel of step `step` (group-major:
 * group step / panels, panel step % panels) in w, group_bytes per group. */
QK_INLINE const uint8_t* step_weights(const uint8_t* w, size_t step, size_t panels,
                                      size_t w_panel_stride, size_t group_bytes) {
  return w + step % panels * w_panel_stride + step / panels * group_bytes;
}

/* Loads the B tiles of chunk ch of the group and panel whose first k-row
 * is at wg: straight from a widened panel (PREWIDENED), else widened first
 * into bbuf. */
QK_INLINE void load_b(const int PREWIDENED, const uint8_t* wg, size_t ch, char* bbuf) {
  const char* b = (const char*)wg + 2048 * ch;
  if (!PREWIDENED) {
    qk512_qb4w_widen_rows(wg + 512 * ch, 16, bbuf);
    QK_MEMORY_BARRIER();
    b = bbuf;
  }
  QK_ASAN_CHECK(b, 2048, 0);
  _tile_loadd(QK_TILE_B0, b, 128);
  _tile_loadd(QK_TILE_B1, b + 64, 128);
  QK_MEMORY_BARRIER(); /* the next chunk's stores stay after these loads */
}

/* PREWIDENED: w holds widened panels (64 bytes per k), read straight into
 * the B tiles; else packed int4 panels (16 bytes per k), widened here. */
QK_INLINE void tile_body(const int PREWIDENED, const qk_dtype DT, size_t mr, size_t nc, size_t kc,
                         size_t group_size, const char* at, const float* xs, size_t xs_stride,
                         const uint8_t* w, size_t w_panel_stride, const char* sz, size_t sz_stride,
                         float* acc, int first, int last, const float* bias, void* c,
                         ptrdiff_t c_stride) {
  const size_t planes = qk_bf16_planes(DT);
  const size_t groups = kc / group_size, chunks = group_size / 32; /* groups: multiples of 32 */
  const size_t panels = (nc + 31) / 32, ld = 32 * panels;          /* acc: rows ld floats apart */
  const int two = mr > 16;
  char bbuf[2048] __attribute__((aligned(64))); /* one chunk's B rows, widened here */
  float p[32][32] __attribute__((aligned(64)));
  if (first)
    for (size_t i = 0; i < mr; i++) memset(acc + i * ld, 0, ld * sizeof(float));

  qk_tile_config_32x32(mr);
  const size_t steps = groups * panels, group_bytes = group_size * (PREWIDENED ? 64 : 16);
  if (steps) load_b(PREWIDENED, w, 0, bbuf);
  _tile_zero(QK_TILE_C00);
  _tile_zero(QK_TILE_C01);
  _tile_zero(QK_TILE_C10);
  _tile_zero(QK_TILE_C11);
  for (size_t step = 0; step < steps; step++) { /* (group, panel) pairs, group-major */
    const size_t g = step / panels, pn = step % panels;
    const uint8_t* wg = step_weights(w, step, panels, w_panel_stride, group_bytes);
    const uint8_t* next =
        step + 1 < steps ? step_weights(w, step + 1, panels, w_panel_stride, group_bytes) : NULL;
    for (size_t ch = 0; ch < chunks; ch++) {
      qk_tile_dpbf16ps_chunk(0, at + (g * chunks + ch) * planes * 2048, planes, mr);
      if (ch + 1 < chunks)
        load_b(PREWIDENED, wg, ch + 1, bbuf);
      else if (next)
        load_b(PREWIDENED, next, 0, bbuf);
    }
    _tile_stored(QK_TILE_C00, p[0], 128);
    _tile_zero(QK_TILE_C00);
    _tile_stored(QK_TILE_C01, p[0] + 16, 128);
    _tile_zero(QK_TILE_C01);
    if (two) {
      _tile_stored(QK_TILE_C10, p[16], 128);
      _tile_zero(QK_TILE_C10);
      _tile_stored(QK_TILE_C11, p[16] + 16, 128);
      _tile_zero(QK_TILE_C11);
    }
    QK_MEMORY_BARRIER();
    apply_group(DT, mr, nc, 32 * pn, ld, (const float(*)[32])p, sz + g * sz_stride, xs + g,
                xs_stride, acc);
    QK_MEMORY_BARRIER(); /* p is read before the next tilestored */
  }
  _tile_release();
  QK_MEMORY_BARRIER();
  if (!last) return;

  for (size_t col = 0; col < nc; col += 16) {
    const __mmask16 mask = qk512_mask(nc - col);
    const __m512 b = bias ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
    for (size_t i = 0; i < mr; i++) {
      const __m512 y = _mm512_load_ps(acc + i * ld + col);
      qk512_store((char*)c + (ptrdiff_t)i * c_stride, col, DT, bias ? _mm512_add_ps(y, b) : y,
                  mask);
    }
  }
}

/* The two kernels differ only in where B comes from. */
#define TILE_BODY(PREWIDENED, DT)                                                     \
  tile_body(PREWIDENED, DT, mr, nc, kc, group_size, (const char*)a, xs, xs_stride, w, \
            w_panel_stride, (const char*)sz, sz_stride, acc, first, last, bias, c, c_stride)
#define TILE_QB4W_KBLOCK(NAME, PREWIDENED)                                                        \
  void NAME(size_t mr, size_t nc, size_t kc, size_t group_size, const void* a, const float* xs,   \
            size_t xs_stride, qk_dtype dt, const uint8_t* w, size_t w_panel_stride,               \
            const void* sz, size_t sz_stride, float* acc, int first, int last, const float* bias, \
            void* c, ptrdiff_t c_stride) {                                                        \
    QK_DTYPE_SWITCH(TILE_BODY, PREWIDENED)                                                        \
  }

TILE_QB4W_KBLOCK(qk_woq_tile_qb4w_gemm_kblock_32x32c1__amx, 0)
TILE_QB4W_KBLOCK(qk_woq_tilew_qb4w_gemm_kblock_32x32c1__amx, 1)
