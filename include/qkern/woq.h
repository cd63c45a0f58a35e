/*
 * qkern/woq.h -- the C contract of the int8 weight-only-quantized GEMM.
 *
 *   y[m, n] = round_to_dtype( (sum_k f32(x[m, k]) * w[n, k]) * scale[n] + bias[n] )
 *
 * x: M x K activations (f32, f16 or bf16), rows addressed by pointer.
 * w: N x K int8 weights, packed once by qk_woq_pack() into the layout of a
 *    kernel (nr, kr).  scale/bias: f32, padded with zeros to a multiple of nr.
 * y: M x N, the dtype of x, rows c_stride bytes apart.
 *
 * Packed layout (nr, kr): Kp = roundup(K, kr); floor(N / nr) whole panels,
 * then the N mod nr columns of a partial last panel as plain rows.
 *
 *   panel p (columns p*nr .. p*nr+nr-1), Kp*nr bytes, panels back to back:
 *
 *     for kb in 0 .. Kp/kr-1:          one "k-group" of kr consecutive k
 *       for j in 0 .. nr-1:            nr columns
 *         for r in 0 .. kr-1:          kr values of one column
 *           byte = w[p*nr + j, kb*kr + r]     (0 beyond K)
 *
 *   then, at floor(N / nr) * nr * Kp, the last N mod nr rows of w as they
 *   are (K bytes each), so that a small N costs no padding to nr columns.
 *   qk_woq_gemm() pads them to one panel (zero columns beyond N) for the
 *   length of a call: kernels only ever read whole panels.
 *
 *   e.g. nr = 4, kr = 2 (the kernels use nr = 16 or 32):
 *
 *     k-group 0: w[0,0] w[0,1] | w[1,0] w[1,1] | w[2,0] w[2,1] | w[3,0] w[3,1]
 *     k-group 1: w[0,2] w[0,3] | w[1,2] w[1,3] | ...
 *
 *   kr = 2 is the "VNNI" order of vdpbf16ps and AMX-BF16 B tiles once each
 *   byte is widened to bf16.  kr = 0 means one group of all K: with nr = 1
 *   that is w's own row-major order (packing is a copy, or none at all).
 *
 * Widened layout (kernels with a widen function): the same values widened
 * to bf16 (the AMX and bf16w kernels) or f32 (the f32w kernels),
 * widened_bytes each, in the same order, the k-groups of each panel
 * padded with zeros to a multiple of 16 (one AMX tile of k-groups): a
 * panel is
 * roundup(Kp/kr, 16) * nr * kr * widened_bytes bytes.  The driver widens a
 * chunk at a time into a per-thread buffer; a caller may instead widen the
 * whole weight once (qk_woq_widen_weight(): every panel, the partial last
 * one padded) and run on that copy (qk_woq_gemm_widened()).  The int4
 * K-block kernels' widened panels (packed int4 layout, below) are the
 * same AMX B-tile rows: per pair of k (k, k + 1), the 16 (q[k], q[k+1])
 * bf16 pairs of columns 0..15, then of columns 16..31, 128 bytes a pair,
 * 64 bytes per k; the driver widens them K block by K block.
 *
 * Packed x (for kernels with a pack_x function: the K-block kernels, int8
 * and int4; MR = 32): x as bf16 planes
 * (P = 1 for bf16 x, 2 for f16, 3 for f32, summing to x exactly), in groups
 * of 32 rows, each group roundup(K, 32) / 32 * P * 2048 bytes:
 *
 *   for c in 0 .. roundup(K, 32)/32 - 1:   chunk of 32 k (one AMX A tile wide)
 *     for p in 0 .. P-1:                   plane
 *       for i in 0 .. 31:                  row of the group
 *         32 bf16: plane p of x[i, 32c .. 32c+31]    (0 beyond K)
 *
 *   so the A tile of rows 0..15 (16..31) of chunk c, plane p, is 1 KiB
 *   contiguous at (c * P + p) * 2048 (+ 1024).  Rows past the last row of x
 *   are not written and never loaded.
 *
 * Packed x^T (for an unpacked-weight kernel with a pack_x function): the
 * same chunks, planes and sizes, in groups of the kernel's MR (32 or 8)
 * rows, each 2 KiB of a chunk and plane holding AMX B tiles instead, x
 * transposed by pairs of k, the group's rows in the tiles' columns:
 *
 *   for h in 0 .. 1:                       columns 16h .. 16h+15
 *     for r in 0 .. 15:                    pair of k: 32c + 2r, 32c + 2r + 1
 *       for j in 0 .. 15:                  column 16h + j
 *         2 bf16: x[i, 32c+2r], x[i, 32c+2r+1] of the row i and plane there
 *
 *   so the B tile of columns 0..15 (16..31) of chunk c is 1 KiB contiguous
 *   at the start (+ 1024) of a 2 KiB.  Plain (qk_woq_pack_xt__avx512, MR
 *   = 32): column i holds row i of plane p in the 2 KiB at (c * P + p) *
 *   2048.  Stacked (qk_woq_pack_xt_stacked__avx512, MR = 8): the planes
 *   share the chunk's first 2 KiB, column i * P + p holding row i of plane
 *   p (24 columns at most, one B tile per 16 of them rather than one per
 *   plane); the chunk's other (P - 1) * 2 KiB are not used.  Columns past the
 *   group's are not written and never read into a result.
 */
#ifndef QKERN_WOQ_H
#define QKERN_WOQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of x and y. */
typedef enum qk_dtype { QK_F32 = 0, QK_F16 = 1, QK_BF16 = 2 } qk_dtype;

/* Bytes of one element of dtype dt. */
static inline __attribute__((always_inline)) size_t qk_dtype_size(qk_dtype dt) {
  return dt == QK_F32 ? 4 : 2;
}

/* How many bf16 planes sum exactly to a value of dtype dt (the AMX
 * kernels' split of x: bf16 1, float16 2, float32 3). */
static inline __attribute__((always_inline)) size_t qk_bf16_planes(qk_dtype dt) {
  return dt == QK_F32 ? 3 : dt == QK_F16 ? 2 : 1;
}

/* ISA levels, ordered: a cap admits every level at or below it. */
typedef enum qk_isa {
  QK_ISA_REF = 0,
  QK_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C */
  QK_ISA_AVX512 = 2,      /* AVX-512 F/BW/VL + FMA + F16C */
  QK_ISA_AVX512_BF16 = 3, /* the above + AVX512_BF16 and AVX512_VBMI */
  QK_ISA_AMX = 4          /* the above + AMX-TILE/BF16 */
} qk_isa;

/* Return codes of the C entry points. */
enum { QK_OK = 0, QK_ERR_ARG = 1, QK_ERR_NOMEM = 2 };

/*
 * A micro-kernel computes y for mr <= MR rows and nc columns, walking the
 * nc columns panel by panel (the last panel may be partial):
 *
 *   mr      rows to compute, 1 <= mr <= MR
 *   nc      columns to compute, >= 1; w, scale, bias start at column 0
 *   kc      K (>= 0); the packed panels hold roundup(kc, kr) k-values
 *   a       mr row pointers to x, each kc elements of dtype dt (unit stride)
 *   w       packed panels (layout above) starting at the first column
 *   scale   nc (rounded up to nr) f32 scales;  bias: same, or NULL
 *   c       first output row; rows c_stride bytes apart; dtype dt
 */
typedef void (*qk_woq_ukernel_fn)(size_t mr, size_t nc, size_t kc, const void* const* a,
                                  qk_dtype dt, const int8_t* w, const float* scale,
                                  const float* bias, void* c, ptrdiff_t c_stride);

/*
 * A K-block micro-kernel (a kernel on packed x) computes one block of K for
 * mr <= 32 rows and nc columns, carrying f32 partial sums from block to
 * block in acc; blocks come in order of k, so every output is one fp32 sum
 * over all of K in the same order whatever the blocking around it:
 *
 *   kc      k values in this block (all but the last block: a multiple of 32)
 *   a       the rows' group of packed x, at the block's first chunk
 *   w       the block of the first panel (packed, or widened for a kernel
 *           with a widen function unless widen_to is given: kc k-values
 *           each), panels w_panel_stride bytes apart
 *   widen_to  NULL, or (a kernel with a widen function) where the block's
 *           panels go widened, qk_woq_widened_panel_size(kc) bytes apart:
 *           w is then the packed block, and the kernel widens each piece
 *           there as it first reads it (the driver's first row step of a
 *           block; the later ones read the widened block)
 *   acc     mr rows of roundup(nc, 32) f32 (64-byte aligned): the sums of
 *           the blocks before (not read when first), this block's added in
 *   last    the block ends K: y = round(acc * scale + bias) written to c
 *           (scale, bias, c as for qk_woq_ukernel_fn)
 */
typedef void (*qk_woq_kblock_fn)(size_t mr, size_t nc, size_t kc, const void* a, qk_dtype dt,
                                 const int8_t* w, size_t w_panel_stride, void* widen_to, float* acc,
                                 int first, int last, const float* scale, const float* bias,
                                 void* c, ptrdiff_t c_stride);

/* Widens `panels` packed panels of kc k-values into the widened layout. */
typedef void (*qk_woq_widen_fn)(const int8_t* packed, size_t panels, size_t kc, void* out);

/* Dequantizes `panels` packed int4 panels of kc k-values (whole groups of
 * group_size, so kc is a multiple of 32; scales_and_zeros sz at their
 * group 0 and first column, groups sz_stride bytes apart, pairs of dtype
 * dt, nothing read at or beyond column nc) into kc * 128 bytes of f32 per
 * int4 panel, w = fma(q, s, fma(-8, s, z)), 0 beyond column nc, in the
 * layout its kernel reads: on AVX2 two panels of 16 columns, each kc * 64
 * bytes (the widened f32 layout of nr = 16; a second one wholly beyond nc
 * left unwritten), on AVX-512 one of 32 columns, each k's 32 values in
 * column order. */
typedef void (*qk_woq_dequantize_fn)(const uint8_t* packed, size_t panels, size_t kc,
                                     size_t group_size, const void* sz, size_t sz_stride,
                                     qk_dtype dt, size_t nc, float* out);

/* Packs one row of kc activations, row i (0..MR-1) of the MR-row group at
 * group, into packed x or packed x^T (layouts above, the kernel's):
 * chunks chunk_stride = P * 2048 bytes apart, zeros past kc. */
typedef void (*qk_woq_pack_x_fn)(const void* row, qk_dtype dt, size_t kc, size_t i, void* group,
                                 size_t chunk_stride);

/* Converts one row of kc activations of dtype dt (f16 or bf16; f32 too for
 * an int4 kernel's) to f32, exactly, into out (for kernels that read x in
 * f32 whatever its dtype). */
typedef void (*qk_woq_convert_x_fn)(const void* row, qk_dtype dt, size_t kc, float* out);

/* How the driver runs a kernel, and what it reads. */
typedef enum qk_woq_kind {
  QK_WOQ_PANELS = 0,   /* fn, over packed panels (nr, kr >= 1), or widened ones */
  QK_WOQ_UNPACKED = 1, /* fn, over the row-major weight itself (nr = 1, kr = 0);
                          with pack_x, over packed x^T: a[0] is the group
                          of its rows (MR = 32, or 8 with the planes
                          stacked) */
  QK_WOQ_KBLOCK = 2    /* kblock (int8: packed or widened panels, kr = 2) or
                          int4_kblock (packed int4 panels), one K block per
                          call, over packed x (pack_x); MR = nr = 32 */
} qk_woq_kind;

/* How the weight's values are stored and scaled. */
typedef enum qk_woq_format {
  QK_WOQ_INT8_PER_CHANNEL = 0, /* int8, one scale per output column */
  QK_WOQ_INT4_GROUPWISE = 1    /* 4-bit q in 0..15, a scale and a zero per
                                  group of k and column (layout below) */
} qk_woq_format;

/*
 * int4 groupwise weights (QK_WOQ_INT4_GROUPWISE):
 *
 *   y[m, n] = round_to_dtype( sum_k x[m, k] * ((q[n, k] - 8) * s[g, n] + z[g, n]) + bias[n] )
 *
 * with g = k / group_size, s and z from scales_and_zeros (K / group_size,
 * N, 2) in the dtype of x: [g, n, 0] = s, [g, n, 1] = z.
 *
 * Packed int4 layout (one for every kernel and CPU): roundup(N, 32) / 32
 * panels of 32 columns, K * 16 bytes each, panels back to back:
 *
 *   panel p (columns 32p .. 32p + 31):
 *     for k in 0 .. K-1:            16 bytes per k
 *       for j in 0 .. 15:
 *         byte = q[32p + j, k] | q[32p + 16 + j, k] << 4     (0 beyond N)
 *
 *     k = 0:  [q0|q16] [q1|q17] ... [q15|q31]     (low nibble | high nibble)
 *     k = 1:  [q0|q16] [q1|q17] ... [q15|q31]
 *
 *   so one 16-byte row widens to 32 columns with a zero-extension, an AND
 *   (columns 0..15; on AVX-512 a table lookup that reads the low bits)
 *   and a shift (columns 16..31).
 *
 * Order of the sums (bit for bit; every int4 kernel of one compute, named
 * by its prefix, a "w" after its first part marking the same compute on
 * widened panels): per group g, p = sum x[k] * q[k] from 0 (the steps
 * below, in increasing k), and xs = sum x[k] (fp32 adds from 0 in
 * increasing k, computed by the driver, qk_woq_group_sums); then, g by g,
 * acc = fma(p, s, acc), acc = fma(xs, z', acc) from acc = 0, where
 * z' = fma(-8, s, z) (f32, one rounding); y = acc + bias.  p is
 *   f32_qb4w   an fp32 FMA chain, one k per step, for the low nibbles
 *              (columns 0..15 of a panel); for a high nibble (column j +
 *              16), p = (pb - plo) * 2^-4, pb the FMA chain of x[k] *
 *              byte[k] (the whole packed byte, 16 q + the low nibble, 0..255,
 *              exact in f32) and plo column j's p, the subtraction one
 *              rounding, the product by 2^-4 exact but in the subnormal
 *              range (so widening a byte costs one conversion, no shift);
 *   bf16_qb4w  (bf16 x) a vdpbf16ps chain, one pair k, k + 1 (k even) per
 *              step: p += x[k+1] q[k+1], then p += x[k] q[k], each product
 *              exact, each add rounded to nearest even with bf16 inputs
 *              and fp32 results that are subnormal taken as zero;
 *   tile_qb4w  (packed x: 1, 2 or 3 bf16 planes of x) AMX tdpbf16ps, chunk
 *              by chunk of 32 k in increasing k, plane by plane within a
 *              chunk, each tdpbf16ps adding its 16 pairs in the tile's own
 *              order (Intel's SDM gives k then k + 1, pair by pair; the
 *              silicon's order is its own), with the same flushes.
 * One compute has no group sums:
 *   f32dq_qb4w each weight dequantized once, w = fma(q, s, z') (f32, one
 *              rounding, by the driver: qk_woq_dequantize_fn); acc = sum
 *              x[k] * w[k], an fp32 FMA chain over all of K from 0 in
 *              increasing k; y = acc + bias.
 */

/* A kernel on int4 groupwise panels (QK_WOQ_INT4_GROUPWISE) computes y for
 * mr <= MR rows and nc columns, panel by panel (the last may be partial):
 *
 *   group_size  k per group (> 0); kc >= 0 is a multiple of it
 *   a       mr row pointers, each to kc f32 values of x followed (for a
 *           kernel without a dequantize function) by their kc / group_size
 *           group sums (qk_woq_group_sums)
 *   dt      the dtype of y and of scales_and_zeros
 *   w       packed int4 panels (layout above) from the first column; for
 *           a kernel with a dequantize function, the panels it wrote
 *   sz      scales_and_zeros at group 0, column 0 of this call: nc (s, z)
 *           pairs of dtype dt per group, groups sz_stride bytes apart
 *           (nothing beyond column nc is read)
 *   bias    roundup(nc, NR) f32, or NULL;  c, c_stride as for qk_woq_ukernel_fn
 */
typedef void (*qk_woq_int4_ukernel_fn)(size_t mr, size_t nc, size_t kc, size_t group_size,
                                       const float* const* a, qk_dtype dt, const uint8_t* w,
                                       const void* sz, size_t sz_stride, const float* bias, void* c,
                                       ptrdiff_t c_stride);

/* A K-block kernel on int4 groupwise panels (kind QK_WOQ_KBLOCK, format
 * QK_WOQ_INT4_GROUPWISE) adds one block of K -- whole groups -- for mr <=
 * 32 rows and nc columns into the f32 sums acc, group by group in the
 * order of sums above, as qk_woq_kblock_fn carries them from block to
 * block:
 *
 *   kc         k values in this block, a multiple of group_size
 *   a          the rows' group of packed x, at the block's first chunk
 *   xs         the group sums of row 0 (qk_woq_group_sums of f32(x)) from
 *              the block's first group; row i's xs_stride floats further
 *   w          packed int4 panels from the block's first k-row of the
 *              first panel (for a kernel with a widen function: the
 *              block's panels widened, 64 bytes per k), panels
 *              w_panel_stride bytes apart
 *   sz         scales_and_zeros at the block's first group and column 0 of
 *              this call, groups sz_stride bytes apart (as for
 *              qk_woq_int4_ukernel_fn)
 *   acc, first, last, c, c_stride   as for qk_woq_kblock_fn; the last block
 *              writes y = round(acc + bias); bias as for qk_woq_int4_ukernel_fn
 */
typedef void (*qk_woq_int4_kblock_fn)(size_t mr, size_t nc, size_t kc, size_t group_size,
                                      const void* a, const float* xs, size_t xs_stride, qk_dtype dt,
                                      const uint8_t* w, size_t w_panel_stride, const void* sz,
                                      size_t sz_stride, float* acc, int first, int last,
                                      const float* bias, void* c, ptrdiff_t c_stride);

/* Writes the kc / group_size sums of a row of kc f32 values to sums: each
 * the fp32 sum of its group in increasing k, from 0. */
void qk_woq_group_sums(const float* row, size_t kc, size_t group_size, float* sums);

/* Bytes of the packed int4 weight for (N, K); SIZE_MAX if too many. */
size_t qk_woq_int4_packed_size(size_t n, size_t k);

/* Packs q (N x K uint8 values 0..15, rows ldq bytes apart; only the low
 * nibble of each byte is read) into out (qk_woq_int4_packed_size bytes). */
void qk_woq_int4_pack(const uint8_t* q, size_t ldq, size_t n, size_t k, uint8_t* out);

/* The inverse of qk_woq_int4_pack(): q gets values 0..15. */
void qk_woq_int4_unpack(const uint8_t* packed, size_t n, size_t k, uint8_t* q, size_t ldq);

/* Traits, bits of qk_woq_kernel.traits: the numerical ones
 * (docs/semantics.rst), then how x reaches the kernel. */
enum {
  /* Products summed by vdpbf16ps or tdpbf16ps, which treat subnormal bf16
   * inputs as zero and flush subnormal sums, whatever MXCSR says. */
  QK_TRAIT_FLUSHES_SUBNORMALS = 1u << 0,
  /* float16 / float32 x reaches the kernel as 2 / 3 bf16 planes whose sum
   * is exact (packed x), one product per plane. */
  QK_TRAIT_SPLITS_X = 1u << 1,
  /* The kernel loads vectors of each row of x again and again (a GEMV):
   * the driver hands it rows that start on a 64-byte line (when one of a
   * call's rows does not, it copies, or converts, the rows into its buffer
   * of rows), so that no load splits a line. */
  QK_TRAIT_LINE_ALIGNED_X = 1u << 2,
  /* int4: the sums of the high nibbles come from sums of whole packed
   * bytes less the low nibbles' (compute f32_qb4w, above). */
  QK_TRAIT_SUMS_BYTES = 1u << 3
};

/*
 * How qk_woq_gemm() cuts a problem into tasks (woq_driver.c).  Every valid
 * blocking gives the same bits (each output is one sum over K in a fixed
 * order whatever the blocking), so a tuner may choose one per shape; each
 * registry entry carries its default.
 *
 *   rows         rows of x per task; for a K-block kernel, rows packed at
 *                once (a multiple of 32)
 *   chunk_bytes  packed-weight bytes per chunk of columns: as many whole
 *                panels as fit, at least one; for a K-block kernel, the
 *                packed bytes of one K block of the chunk (k_block * nr per
 *                panel; int4: k_block * 16), and at most a thread's share
 *                of the panels
 *   k_block      K-block kernels: k per K block (a multiple of 32; for an
 *                int4 kernel, rounded down to whole groups, one at least);
 *                other kernels take all of K in one call: 0
 *   min_macs_per_thread
 *                multiply-adds below which one more thread costs more than
 *                it saves: a call starts at most 1 + M*N*K / this threads
 *   split        how the threads share the tasks (each thread takes one
 *                run of consecutive tasks):
 *                QK_WOQ_SPLIT_M  tasks ordered row block by row block: the
 *                                threads divide the rows first, each
 *                                reading all of the weight for its rows
 *                                (the columns, when there is one row block)
 *                QK_WOQ_SPLIT_N  tasks ordered chunk by chunk: the threads
 *                                divide the columns first, each reading only
 *                                its share of the weight, for every row;
 *                                the only split of a K-block kernel
 */
typedef enum qk_woq_split { QK_WOQ_SPLIT_M = 0, QK_WOQ_SPLIT_N = 1 } qk_woq_split;

typedef struct qk_woq_blocking {
  uint32_t rows, chunk_bytes, k_block, min_macs_per_thread;
  uint32_t split; /* a qk_woq_split */
} qk_woq_blocking;

/* One registry entry: the single source of truth for dispatch, tests,
 * qkern.kernels(), the benchmark's roofline and the docs.  Every kernel of
 * one (nr, kr) reads the same packed bytes, so qk_woq_pack() serves them
 * all.  A kernel with a widen function reads widened panels instead: the
 * driver widens each chunk of packed panels (for a K-block kernel, each K
 * block of a chunk; int8: the kernel itself, through widen_to, on the
 * block's first row step) once into a per-thread buffer and reuses it for
 * every row step of its task (and of the thread's next task on that
 * chunk). */
typedef struct qk_woq_kernel {
  const char* name;
  qk_woq_kind kind;
  qk_isa isa; /* the lowest ISA level with every feature it uses */
  uint32_t mr, nr, kr;
  uint32_t dtypes; /* bit (1 << qk_dtype) set for each x dtype accepted */
  qk_woq_format format;
  uint32_t group_size;      /* 0: one scale per column (all of K); int4
                               groupwise: the groups it takes are multiples */
  uint32_t traits;          /* QK_TRAIT_* bits */
  const char* bound_by;     /* the instruction whose peak bounds its compute:
                               a qk_peak_loops name (qkern/roofline.h) */
  qk_woq_blocking blocking; /* the default */
  qk_woq_ukernel_fn fn;     /* QK_WOQ_PANELS, QK_WOQ_UNPACKED */
  qk_woq_widen_fn widen;    /* NULL: the kernel reads the packed int8 panels */
  uint32_t widened_bytes;   /* with widen or dequantize: bytes per widened
                               value (2, 4) */
  qk_woq_pack_x_fn pack_x;  /* QK_WOQ_KBLOCK: writes packed x; QK_WOQ_UNPACKED:
                               NULL, or writes packed x^T (layouts above) */
  /* QK_WOQ_PANELS: NULL, or the kernel reads f32 rows of x whatever dt (dt
   * is then y's dtype only); the driver converts f16 / bf16 rows with it,
   * once per call into a buffer the threads share when one row block holds
   * every row, else once per row block and thread into a thread's own */
  qk_woq_convert_x_fn convert_x;
  qk_woq_kblock_fn kblock; /* QK_WOQ_KBLOCK */
  /* QK_WOQ_INT4_GROUPWISE (nr = 32, kr = 1, with convert_x, which then
   * also takes f32 rows): int4_fn for kind QK_WOQ_PANELS, int4_kblock
   * (with pack_x, and a widen function or none) for QK_WOQ_KBLOCK */
  qk_woq_int4_ukernel_fn int4_fn;
  qk_woq_int4_kblock_fn int4_kblock;
  /* QK_WOQ_INT4_GROUPWISE, kind QK_WOQ_PANELS: NULL, or int4_fn reads f32
   * panels (widened_bytes = 4) that the driver dequantizes with it chunk
   * by chunk, as it widens for `widen` */
  qk_woq_dequantize_fn dequantize;
} qk_woq_kernel;

/* Bytes of one group of packed x or x^T (32 rows, or a kernel's MR): K
 * values, dtype dt. */
size_t qk_woq_packed_x_group_size(size_t k, qk_dtype dt);

/* Bytes of one widened panel of kc k-values for kernel kern (with widen
 * or dequantize, kr >= 1); SIZE_MAX if that does not fit in a size_t. */
size_t qk_woq_widened_panel_size(const qk_woq_kernel* kern, size_t kc);

/* Bytes of the whole (N, K) weight widened for kern (every panel, the last
 * one padded); 0 if kern has no widen function or is not a QK_WOQ_PANELS
 * kernel, SIZE_MAX if that does not fit in a size_t. */
size_t qk_woq_widened_size(const qk_woq_kernel* kern, size_t n, size_t k);

/* Widens the whole packed (N, K) weight (kern's layout) into out
 * (qk_woq_widened_size bytes; 64-byte aligned is fastest, not required).  QK_ERR_ARG if kern has no
 * widen function, is not a QK_WOQ_PANELS kernel or the size overflows,
 * QK_ERR_NOMEM if the padded last panel cannot be allocated; else QK_OK. */
int qk_woq_widen_weight(const qk_woq_kernel* kern, const int8_t* packed, size_t n, size_t k,
                        void* out);

extern const qk_woq_kernel qk_woq_kernels[];
extern const size_t qk_woq_num_kernels;

/* k values per group of layout kr (kr, or all of k when kr == 0). */
size_t qk_woq_group_len(size_t k, uint32_t kr);

/* Bytes of the packed weight for (N, K) in layout (nr, kr); SIZE_MAX if
 * that does not fit in a size_t. */
size_t qk_woq_packed_size(size_t n, size_t k, uint32_t nr, uint32_t kr);

/* Packs w (N x K int8, rows ldw bytes apart) into out (packed_size bytes). */
void qk_woq_pack(const int8_t* w, size_t ldw, size_t n, size_t k, uint32_t nr, uint32_t kr,
                 int8_t* out);

/* Unpacks `packed` (layout nr, kr) into w (N x K int8, rows ldw bytes
 * apart): the inverse of qk_woq_pack(). */
void qk_woq_unpack(const int8_t* packed, size_t n, size_t k, uint32_t nr, uint32_t kr, int8_t* w,
                   size_t ldw);

/* Writes the partial last panel of `packed` (N mod nr != 0) as one whole
 * panel, Kp * nr bytes, zero beyond N, into out. */
void qk_woq_pad_last_panel(const int8_t* packed, size_t n, size_t k, uint32_t nr, uint32_t kr,
                           int8_t* out);

/*
 * Runs kernel `kern` over the whole problem, cut as `blocking` says (NULL:
 * the kernel's default; QK_ERR_ARG if it breaks a rule above), with OpenMP
 * threads (returns QK_ERR_NOMEM if a buffer -- widened panels, packed x,
 * f32 sums -- cannot be allocated; nothing is written then).
 * Row m of x is at x + (x_offsets ? x_offsets[m] : m * x_stride) bytes.
 * Threads split N (and, except for K-block kernels, M for large M); every
 * output element is computed by one thread, in one kernel call over the
 * whole of K (or, for a K-block kernel, its calls over the K blocks in
 * order), so the result does not depend on num_threads (<= 0: the OpenMP
 * default; a count from a user should come through qk_threads_for_call(),
 * qkern/threads.h, first).  Each thread runs under the floating-point
 * environment of qkern/fpenv.h.  Returns QK_OK or an error code.
 */
int qk_woq_gemm(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m, size_t n,
                size_t k, qk_dtype dt, const char* x, int64_t x_stride, const int64_t* x_offsets,
                const int8_t* packed, const float* scale, const float* bias, char* y,
                int64_t y_stride, int num_threads);

/*
 * qk_woq_gemm() on the weight widened beforehand by qk_woq_widen_weight()
 * for the same kernel (a QK_WOQ_PANELS kernel with a widen function):
 * nothing is widened during the call, and the bits of y are those of
 * qk_woq_gemm() on the packed weight.  The same guarantees and return
 * codes as qk_woq_gemm().
 */
int qk_woq_gemm_widened(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m,
                        size_t n, size_t k, qk_dtype dt, const char* x, int64_t x_stride,
                        const int64_t* x_offsets, const void* widened, const float* scale,
                        const float* bias, char* y, int64_t y_stride, int num_threads);

/*
 * qk_woq_gemm() for an int4 groupwise kernel (format QK_WOQ_INT4_GROUPWISE):
 * `packed` in the packed int4 layout, group_size > 0 dividing k, sz the
 * (k / group_size, n, 2) scales_and_zeros in dtype dt, C-contiguous, bias
 * roundup(n, 32) f32 or NULL.  The driver converts each row of x to f32
 * with its group sums (per row block and thread) before the kernel reads
 * it (for a kernel with a dequantize function: f16 / bf16 rows only, no
 * sums; it dequantizes the weight instead); for a K-block kernel it packs
 * x and computes the group sums of each row block once instead.  The same guarantees and return
 * codes as qk_woq_gemm().
 */
int qk_woq_gemm_int4(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m, size_t n,
                     size_t k, size_t group_size, qk_dtype dt, const char* x, int64_t x_stride,
                     const int64_t* x_offsets, const uint8_t* packed, const void* sz,
                     const float* bias, char* y, int64_t y_stride, int num_threads);

#ifdef __cplusplus
}
#endif

#endif /* QKERN_WOQ_H */
