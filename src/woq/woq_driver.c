/*
 * woq_driver.c -- blocking and threading around a WoQ micro-kernel.
 * Portable C with OpenMP, baseline flags.
 *
 * Work is cut as a qk_woq_blocking says (qkern/woq.h; the kernel's default
 * unless the caller passes one): tasks of `rows` rows times a chunk of
 * whole nr-panels of about `chunk_bytes` (L2-sized by default); OpenMP
 * spreads tasks over threads.  Within a task the weight chunk is streamed
 * once from memory and reused from L2 by every MR-row step.  Each output
 * element is produced by exactly one micro-kernel call over all of K
 * (K-block kernels, below: by one thread's calls over the K blocks in
 * order), so the bits of y never depend on the number of threads, nor on
 * the blocking.  For a kernel with a widen (int4: dequantize) function,
 * each thread widens its task's chunk once into its own buffer (not again
 * for its next task on the same chunk), which every MR-row step then reads
 * from L2 (an int8 K-block kernel widens each K block there itself, below).
 *
 * A kernel on packed x (pack_x + kblock) runs the GotoBLAS way: the rows of
 * each block of `rows` rows (2048 by default) are packed first (by all
 * threads, a row each) into one shared buffer; a task is then that row
 * block times a chunk of columns (int8: 8 panels, 256 columns, by default;
 * int4: 4 panels; at most a thread's share of the panels: threads split
 * the chunks, never the rows), walked in blocks of `k_block` k (1024): the
 * chunk's B for one K block (widened: 512 KiB for int8, 256 KiB for int4;
 * an int8 kernel widens it during the block's first 32-row step, an int4
 * block is widened before it) stays in L2 while every 32-row step of the
 * row block adds its products
 * into the thread's f32 sums (one K block at a time, in order, so each
 * output is still one sum over K in a fixed order), and the last K block
 * writes y.  An int4 K-block kernel reads its packed int4 panels (or, with
 * a widen function, the block widened) in K blocks of whole groups, and
 * the group sums of each row, computed with the packing (from x converted
 * to f32, a row at a time per thread).
 *
 * A kernel on the unpacked weight with pack_x (packed x^T) has each row
 * block packed the same way, then runs the block's chunks of columns as a
 * task each (threads split the chunks), reading all of K per call.
 *
 * Every thread runs its share under the floating-point environment of
 * qkern/fpenv.h, whatever its caller set.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The most panels a kernel on packed panels runs one row over at once. */
#define ROW_PANELS_AT_ONCE 4

#ifdef _OPENMP
#include <omp.h>
#endif

#include "qkern/fpenv.h"
#include "qkern/woq.h"

#define QK_MAX_MR 32

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

size_t qk_woq_widened_panel_size(const qk_woq_kernel* kern, size_t kc) {
  const size_t groups = kc / kern->kr + (kc % kern->kr != 0);
  const size_t tiles = groups / 16 + (groups % 16 != 0); /* of 16 k-groups */
  size_t bytes;
  if (__builtin_mul_overflow(tiles, (size_t)16 * kern->nr * kern->kr * kern->widened_bytes, &bytes))
    return SIZE_MAX;
  return bytes;
}

/* Bytes of one 32-k chunk of a group of packed x: 2 KiB per plane. */
static size_t packed_x_chunk_size(qk_dtype dt) { return qk_bf16_planes(dt) * 2048; }

size_t qk_woq_packed_x_group_size(size_t k, qk_dtype dt) {
  return ceil_div(k, 32) * packed_x_chunk_size(dt);
}

/* The shape of one call, cut into tasks (see the top of this file). */
typedef struct plan {
  const qk_woq_kernel* kern;
  size_t m, n, k, nr, esize;
  size_t panel_bytes;  /* bytes from one panel to the next in `packed` */
  size_t k_bytes;      /* packed bytes per k of a panel (int8: nr, int4: 16) */
  size_t sizing_bytes; /* packed bytes of a panel, which chunk_bytes counts */
  size_t panels_per_chunk;
  int widened;                               /* `packed` holds the widened copy: nothing to widen */
  size_t rows, k_block;                      /* from the blocking (qkern/woq.h) */
  size_t full_panels, full_chunks, n_chunks; /* n_chunks: + 1 for a partial panel */
  size_t x_group_bytes;                      /* packed x: bytes per group of MR rows; 0: x as is */
  qk_dtype dt;
  const int8_t* packed;     /* or the widened copy (see widened) */
  const int8_t* last_panel; /* the partial last panel, padded (see qk_woq_gemm) */
  const float *scale, *bias;
  /* int4 groupwise: k per group, scales_and_zeros (bytes per group) */
  size_t group_size, sz_stride;
  const char* sz;
  int sums_groups;  /* int4 kernels that read the group sums of x (all but a
                       dequantizing one) */
  size_t row_bytes; /* from one row of x_rows to the next: k values (+ their
                       group sums), rounded up to a 64-byte line */
  float* xs;        /* int4 K-block kernels: the group sums of the packed
                       row block, k / group_size per row */
  char* y;
  int64_t y_stride;
} plan;

/* Chunk nb: its first column (*n0), its number of columns (*nc) and its
 * first panel.  Whole panels come panels_per_chunk to a chunk; a partial
 * last panel is a chunk of its own, and the first one: a static schedule
 * gives the first thread the one extra task where tasks do not divide
 * evenly, so the small one lands there and the threads stay balanced. */
static const int8_t* chunk_panels(const plan* p, size_t nb, size_t* n0, size_t* nc) {
  if (p->n_chunks > p->full_chunks) {
    if (nb == 0) {
      *n0 = p->full_panels * p->nr;
      *nc = p->n - *n0;
      return p->last_panel;
    }
    nb--;
  }
  const size_t chunk_cols = p->panels_per_chunk * p->nr;
  /* int4 panels and widened copies are whole, the last panel read only
   * up to column n */
  const size_t full_cols = p->full_panels * p->nr < p->n ? p->full_panels * p->nr : p->n;
  *n0 = nb * chunk_cols;
  *nc = full_cols - *n0 < chunk_cols ? full_cols - *n0 : chunk_cols;
  return p->packed + nb * p->panels_per_chunk * p->panel_bytes;
}

/* Rows of x as the kernel reads them, a thread's own (or, when one row
 * block holds every row, all of them, in one buffer the threads share and
 * fill a share each before any task runs): converted to f32 by the
 * kernel's convert_x (x not f32, or an int4 kernel that sums groups), or,
 * for a kernel with QK_TRAIT_LINE_ALIGNED_X given rows off a 64-byte
 * line, converted or copied as they are onto lines: rows first .. first +
 * count - 1, row_bytes apart (k values, then such a kernel's group sums
 * in f32), converted when a task needs rows it does not hold. */
typedef struct x_rows {
  char* data;
  size_t first, count;
} x_rows;

/* Row r of x: at x + x_offsets[r], or x + r * x_stride without offsets. */
static const char* x_row(const char* x, int64_t x_stride, const int64_t* x_offsets, size_t r) {
  return x + (x_offsets ? x_offsets[r] : (int64_t)r * x_stride);
}

/* Row r of x into row, as the kernel reads it (see x_rows). */
static void convert_row(const plan* p, const char* x, int64_t x_stride, const int64_t* x_offsets,
                        size_t r, char* row) {
  const char* from = x_row(x, x_stride, x_offsets, r);
  if (!p->kern->convert_x) {
    memcpy(row, from, p->k * p->esize);
    return;
  }
  p->kern->convert_x(from, p->dt, p->k, (float*)row);
  if (p->sums_groups) qk_woq_group_sums((const float*)row, p->k, p->group_size, (float*)row + p->k);
}

/* Rows m0 .. m_end-1 times chunk nb of the panels; wide: NULL, or the
 * thread's buffer of widened panels, which holds chunk *wide_chunk (widened
 * here first if it holds another); xf: NULL, or the thread's rows of x
 * (converted here first if it holds others; shared rows always hold every
 * task's, so they are never written here).  For a kernel with pack_x
 * (packed x^T), x is the packed row block, from row m0. */
static void run_task(const plan* p, size_t nb, size_t m0, size_t m_end, const char* x,
                     int64_t x_stride, const int64_t* x_offsets, char* wide, size_t* wide_chunk,
                     x_rows* xf) {
  size_t n0, nc;
  const int8_t* w = chunk_panels(p, nb, &n0, &nc);
  if (wide) {
    if (*wide_chunk != nb) {
      if (p->kern->dequantize)
        p->kern->dequantize((const uint8_t*)w, ceil_div(nc, p->nr), p->k, p->group_size,
                            p->sz + n0 * 2 * p->esize, p->sz_stride, p->dt, nc, (float*)wide);
      else
        p->kern->widen(w, ceil_div(nc, p->nr), p->k, wide);
      *wide_chunk = nb;
    }
    w = (const int8_t*)wide;
  }
  if (xf && (xf->first != m0 || xf->count != m_end - m0)) {
    for (size_t r = m0; r < m_end; r++)
      convert_row(p, x, x_stride, x_offsets, r, xf->data + (r - m0) * p->row_bytes);
    xf->first = m0;
    xf->count = m_end - m0;
  }
  const void* rows[QK_MAX_MR];
  const size_t block_m0 = m0;
  for (; m0 < m_end; m0 += p->kern->mr) {
    const size_t mr = m_end - m0 < p->kern->mr ? m_end - m0 : p->kern->mr;
    if (p->kern->pack_x)
      rows[0] = x + (m0 - block_m0) / p->kern->mr * p->x_group_bytes;
    else
      for (size_t i = 0; i < mr; i++)
        rows[i] = xf ? (const void*)(xf->data + (m0 + i - xf->first) * p->row_bytes)
                     : x_row(x, x_stride, x_offsets, m0 + i);
    const float* bias = p->bias ? p->bias + n0 : NULL;
    char* c = p->y + (int64_t)m0 * p->y_stride + n0 * p->esize;
    if (p->group_size)
      p->kern->int4_fn(mr, nc, p->k, p->group_size, (const float* const*)rows, p->dt,
                       (const uint8_t*)w, p->sz + n0 * 2 * p->esize, p->sz_stride, bias, c,
                       (ptrdiff_t)p->y_stride);
    else
      p->kern->fn(mr, nc, p->k, rows, p->dt, w, p->scale + n0, bias, c, (ptrdiff_t)p->y_stride);
  }
}

/* A kernel on packed x: rows m0 .. m_end-1 (packed in x_block from row m0,
 * a multiple of 32 rows) times chunk nb, K block by K block; acc holds the
 * thread's f32 sums, roundup(nc, 32) per row. */
static void run_kblock_task(const plan* p, size_t nb, size_t m0, size_t m_end, const char* x_block,
                            char* wide, float* acc) {
  size_t n0, nc;
  const int8_t* chunk = chunk_panels(p, nb, &n0, &nc);
  const size_t panels = ceil_div(nc, p->nr), ld = panels * p->nr;
  const size_t x_chunk = packed_x_chunk_size(p->dt);
  for (size_t k0 = 0; k0 == 0 || k0 < p->k; k0 += p->k_block) {
    const size_t kc = p->k - k0 < p->k_block ? p->k - k0 : p->k_block;
    const int8_t* packed = chunk + k0 * p->k_bytes; /* the block's first k in the first panel */
    const size_t wide_stride = wide ? qk_woq_widened_panel_size(p->kern, kc) : 0;
    if (wide && p->group_size) /* int4: the block widened before its row steps */
      for (size_t q = 0; q < panels; q++)
        p->kern->widen(packed + q * p->panel_bytes, 1, kc, wide + q * wide_stride);
    const int first = k0 == 0, last = k0 + kc >= p->k;
    for (size_t r = m0; r < m_end; r += 32) {
      const size_t mr = m_end - r < 32 ? m_end - r : 32;
      const char* a = x_block + (r - m0) / 32 * p->x_group_bytes + k0 / 32 * x_chunk;
      const float* bias = p->bias ? p->bias + n0 : NULL;
      char* c = p->y + (int64_t)r * p->y_stride + n0 * p->esize;
      /* the packed block, or its widened copy once there is one */
      const int read_wide = wide && (p->group_size || r > m0);
      const int8_t* w = read_wide ? (const int8_t*)wide : packed;
      const size_t w_stride = read_wide ? wide_stride : p->panel_bytes;
      if (p->group_size) {
        const size_t groups = p->k / p->group_size, g0 = k0 / p->group_size;
        p->kern->int4_kblock(mr, nc, kc, p->group_size, a, p->xs + (r - m0) * groups + g0, groups,
                             p->dt, (const uint8_t*)w, w_stride,
                             p->sz + g0 * p->sz_stride + n0 * 2 * p->esize, p->sz_stride,
                             acc + (r - m0) * ld, first, last, bias, c, (ptrdiff_t)p->y_stride);
      } else {
        /* int8: the first row step widens the block as it reads it */
        p->kern->kblock(mr, nc, kc, a, p->dt, w, w_stride, wide && r == m0 ? wide : NULL,
                        acc + (r - m0) * ld, first, last, p->scale + n0, bias, c,
                        (ptrdiff_t)p->y_stride);
      }
    }
  }
}

/* Whether rows 0 .. m-1 of x all start on a 64-byte line. */
static int x_rows_aligned(const char* x, int64_t x_stride, const int64_t* x_offsets, size_t m) {
  for (size_t r = 0; r < m; r++)
    if ((uintptr_t)x_row(x, x_stride, x_offsets, r) % 64 != 0) return 0;
  return 1;
}

/* Whether blocking b follows the rules of qkern/woq.h for a kernel of
 * this kind (kblock: a K-block kernel; packs_x: one with pack_x). */
static int blocking_valid(const qk_woq_blocking* b, int kblock, int packs_x) {
  if (b->rows == 0 || b->chunk_bytes == 0 || b->min_macs_per_thread == 0) return 0;
  if (packs_x && b->rows % 32 != 0) return 0;
  return kblock ? b->k_block >= 32 && b->k_block % 32 == 0 && b->split == QK_WOQ_SPLIT_N
                : b->k_block == 0 && (b->split == QK_WOQ_SPLIT_M || b->split == QK_WOQ_SPLIT_N);
}

void qk_woq_group_sums(const float* row, size_t kc, size_t group_size, float* sums) {
  for (size_t k0 = 0; k0 < kc; k0 += group_size) {
    float sum = 0.0f;
    for (size_t k = k0; k < k0 + group_size; k++) sum += row[k];
    sums[k0 / group_size] = sum;
  }
}

/* Runs the plan's kernel over the whole problem (p: the shape, the weight
 * and its panel geometry filled in; the rest is set here). */
static int execute(plan* p, const qk_woq_blocking* blocking, const char* x, int64_t x_stride,
                   const int64_t* x_offsets, int num_threads) {
  const qk_woq_kernel* kern = p->kern;
  const int kblock = kern->kind == QK_WOQ_KBLOCK, packs_x = kern->pack_x != NULL;
  const size_t m = p->m, n = p->n, k = p->k;
  const qk_dtype dt = p->dt;
  p->esize = qk_dtype_size(dt);
  p->x_group_bytes = packs_x ? qk_woq_packed_x_group_size(k, dt) : 0;
  p->rows = blocking->rows;
  p->k_block = blocking->k_block;
  if (kblock && p->group_size) /* whole groups, one at least */
    p->k_block =
        p->k_block < p->group_size ? p->group_size : p->k_block / p->group_size * p->group_size;
  int threads = num_threads;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
#endif
  if (threads < 1) threads = 1;
  const double macs = (double)m * (double)n * (double)(k ? k : 1);
  if ((double)threads * blocking->min_macs_per_thread > macs)
    threads = (int)(macs / blocking->min_macs_per_thread) + 1;

  if (kblock)
    p->panels_per_chunk = blocking->chunk_bytes / (p->k_block * p->k_bytes);
  else
    p->panels_per_chunk =
        p->sizing_bytes ? blocking->chunk_bytes / p->sizing_bytes : p->full_panels;
  /* When one micro-kernel call takes every row, nothing reads a chunk
   * twice, so its size need not fit L2; and the kernels run one row on up
   * to ROW_PANELS_AT_ONCE panels at once (their independent FMA chains):
   * a chunk of fewer, as 256 KiB holds at K = 11008, leaves them
   * latency-bound (int4, one row, 4096 x 11008: 4.3-5.0 ms against
   * 2.5-2.9 ms with four panels a chunk). */
  if (!kblock && m <= kern->mr && p->panels_per_chunk < ROW_PANELS_AT_ONCE)
    p->panels_per_chunk = ROW_PANELS_AT_ONCE;
  /* The threads of a K-block kernel share the chunks only: a chunk holds
   * at most a thread's share of the panels.  At least one panel, and no
   * more than there are: the per-thread buffers are sized from it. */
  if (kblock && p->panels_per_chunk > ceil_div(p->full_panels, (size_t)threads))
    p->panels_per_chunk = ceil_div(p->full_panels, (size_t)threads);
  if (p->panels_per_chunk > p->full_panels) p->panels_per_chunk = p->full_panels;
  if (p->panels_per_chunk == 0) p->panels_per_chunk = 1;
  p->full_chunks = ceil_div(p->full_panels, p->panels_per_chunk);
  /* a partial last panel (packed int8: its columns held as plain rows) */
  const int partial = !p->group_size && !p->widened && n % p->nr != 0;
  p->n_chunks = p->full_chunks + partial;
  const size_t mc = p->rows;
  const size_t m_blocks = ceil_div(m, mc);
  const size_t tasks = p->n_chunks * m_blocks;
  const int split_m = blocking->split == QK_WOQ_SPLIT_M;

  const size_t most_parallel = packs_x ? p->n_chunks : tasks;
  if ((size_t)threads > most_parallel) threads = (int)most_parallel;

  /* Buffers (the partial last panel padded, widened panels and f32 sums per
   * thread, packed x of one row block) are allocated before any output is
   * written.  The packed weight holds a partial last panel as plain rows
   * (include/qkern/woq.h); the kernels read it padded to a whole panel. */
  const int widening = (kern->widen || kern->dequantize) && !p->widened && k > 0;
  const size_t wide_k = kblock && k > p->k_block ? p->k_block : k;
  const size_t wide_stride =
      widening ? (p->panels_per_chunk * qk_woq_widened_panel_size(kern, wide_k) + 63) / 64 * 64 : 0;
  const size_t block_rows = ceil_div(m < mc ? m : mc, 32) * 32;
  const size_t x_block_bytes = ceil_div(m < mc ? m : mc, kern->mr) * p->x_group_bytes;
  const size_t acc_stride = kblock ? block_rows * p->panels_per_chunk * p->nr * sizeof(float) : 0;
  /* Rows of x (x_rows): per thread a task's rows (at most mc), or all m
   * rows in one shared buffer (below); for an int4 K-block kernel one row
   * per thread, whose group sums go to xs (a row block's, shared).  A GEMV
   * loads vectors of each row again for every few columns: rows off a
   * 64-byte line are copied, so that no load splits a line (AVX2, float32,
   * 5-6 rows at 16 bytes off a line took 1.35-1.39x the time). */
  p->sums_groups = p->group_size && !kern->dequantize;
  const int realigning = (kern->traits & QK_TRAIT_LINE_ALIGNED_X) && k > 0 &&
                         !x_rows_aligned(x, x_stride, x_offsets, m);
  const int converting =
      kern->convert_x ? dt != QK_F32 || p->sums_groups || realigning : realigning;
  const size_t x_bytes = kern->convert_x ? sizeof(float) : p->esize;
  const size_t sums_bytes = p->sums_groups ? k / p->group_size * sizeof(float) : 0;
  size_t row_bytes = 0;
  if (__builtin_mul_overflow(k, x_bytes, &row_bytes) ||
      __builtin_add_overflow(row_bytes, sums_bytes + 63, &row_bytes))
    return QK_ERR_NOMEM;
  p->row_bytes = row_bytes / 64 * 64;
  const size_t xf_rows = kblock ? 1 : m < mc ? m : mc;
  size_t xf_stride = 0;
  if (converting && __builtin_mul_overflow(xf_rows, p->row_bytes, &xf_stride)) return QK_ERR_NOMEM;
  xf_stride = xf_stride / 64 * 64 + 64;
  const int summing = kblock && p->group_size;
  size_t xs_bytes = 0;
  if (summing && __builtin_mul_overflow(block_rows, (k / p->group_size) * sizeof(float), &xs_bytes))
    return QK_ERR_NOMEM;
  int8_t* last_panel = partial ? aligned_alloc(64, (p->panel_bytes + 64) / 64 * 64) : NULL;
  char* wide_all = widening ? aligned_alloc(64, (size_t)threads * wide_stride) : NULL;
  char* x_block = packs_x ? aligned_alloc(64, x_block_bytes + 64) : NULL;
  char* acc_all = kblock ? aligned_alloc(64, (size_t)threads * acc_stride) : NULL;
  float* xs = summing ? malloc(xs_bytes + 64) : NULL;
  /* One row block on a kernel that reads x as it is given: every thread
   * runs all the rows, so they are converted once, a share by each thread,
   * into one buffer the threads read, not once per thread (two threads'
   * copies of 256 rows of K = 11008 with their group sums, 11 MiB each,
   * crowd the last-level cache that the weight streams through). */
  const int shared_rows = converting && !packs_x && m_blocks == 1;
  size_t xf_bytes = 0;
  const int xf_fits =
      !__builtin_mul_overflow(shared_rows ? (size_t)1 : (size_t)threads, xf_stride, &xf_bytes);
  char* xf_all = converting && xf_fits ? aligned_alloc(64, xf_bytes) : NULL;
  int status = QK_OK;
  if ((partial && !last_panel) || (widening && !wide_all) || (packs_x && !x_block) ||
      (kblock && !acc_all) || (converting && !xf_all) || (summing && !xs)) {
    status = QK_ERR_NOMEM;
    goto release;
  }
  p->xs = xs;
  if (partial) {
    qk_woq_pad_last_panel(p->packed, n, k, kern->nr, kern->kr, last_panel);
    p->last_panel = last_panel;
  }

#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    const size_t thread = (size_t)omp_get_thread_num();
#else
    const size_t thread = 0;
#endif
    const qk_fpenv caller_env = qk_fpenv_enter();
    char* wide = wide_all ? wide_all + thread * wide_stride : NULL;
    size_t wide_chunk = SIZE_MAX; /* the chunk in wide: none yet */
    float* acc = acc_all ? (float*)(acc_all + thread * acc_stride) : NULL;
    x_rows xf = {xf_all ? xf_all + (shared_rows ? 0 : thread * xf_stride) : NULL, 0, 0};
    if (!packs_x) {
      if (shared_rows) {
#pragma omp for schedule(static)
        for (size_t r = 0; r < m; r++)
          convert_row(p, x, x_stride, x_offsets, r, xf.data + r * p->row_bytes);
        xf.count = m; /* rows 0 .. m-1: every task's, whole once the loop's barrier is passed */
      }
#pragma omp for schedule(static)
      for (size_t t = 0; t < tasks; t++) {
        const size_t mb = split_m ? t / p->n_chunks : t % m_blocks;
        const size_t nb = split_m ? t % p->n_chunks : t / m_blocks;
        const size_t m_end = (mb + 1) * mc < m ? (mb + 1) * mc : m;
        run_task(p, nb, mb * mc, m_end, x, x_stride, x_offsets, wide, &wide_chunk,
                 xf.data ? &xf : NULL);
      }
    } else {
      /* Row blocks in turn: pack the block's rows, then run its chunks; the
       * implicit barriers keep the packed rows intact while they are read. */
      for (size_t mb = 0; mb < m_blocks; mb++) {
        const size_t m0 = mb * mc, m_end = m0 + mc < m ? m0 + mc : m;
#pragma omp for schedule(static)
        for (size_t r = m0; r < m_end; r++) {
          const char* row = x_row(x, x_stride, x_offsets, r);
          kern->pack_x(row, dt, k, (r - m0) % kern->mr,
                       x_block + (r - m0) / kern->mr * p->x_group_bytes, packed_x_chunk_size(dt));
          if (summing) {
            kern->convert_x(row, dt, k, (float*)xf.data);
            qk_woq_group_sums((const float*)xf.data, k, p->group_size,
                              xs + (r - m0) * (k / p->group_size));
          }
        }
#pragma omp for schedule(static)
        for (size_t nb = 0; nb < p->n_chunks; nb++) {
          if (kblock)
            run_kblock_task(p, nb, m0, m_end, x_block, wide, acc);
          else
            run_task(p, nb, m0, m_end, x_block, 0, NULL, wide, &wide_chunk, NULL);
        }
      }
    }
    qk_fpenv_leave(caller_env);
  }
release:
  free(last_panel);
  free(wide_all);
  free(x_block);
  free(acc_all);
  free(xf_all);
  free(xs);
  return status;
}

/* Whether qk_woq_gemm() may run int8 kernel kern on dt with blocking b
 * (NULL: the default). */
static int int8_call_valid(const qk_woq_kernel* kern, const qk_woq_blocking* b, qk_dtype dt) {
  if (!kern) return 0;
  const int kblock = kern->kind == QK_WOQ_KBLOCK;
  return kern->mr > 0 && kern->mr <= QK_MAX_MR && kern->nr > 0 &&
         kern->format == QK_WOQ_INT8_PER_CHANNEL && (kern->dtypes & (1u << dt)) &&
         (kblock ? kern->pack_x && kern->kblock && !kern->convert_x && kern->mr == 32 &&
                       kern->nr == 32 && kern->kr == 2
                 : kern->fn != NULL && (!kern->pack_x || (kern->kind == QK_WOQ_UNPACKED &&
                                                          !kern->convert_x && !kern->widen))) &&
         (!kern->widen || kern->widened_bytes > 0) && !kern->dequantize &&
         blocking_valid(b ? b : &kern->blocking, kblock, kern->pack_x != NULL);
}

/* The plan of an int8 call on the packed weight (widened: 0) or on its
 * widened copy (1). */
static plan int8_plan(const qk_woq_kernel* kern, size_t m, size_t n, size_t k, qk_dtype dt,
                      const void* weight, int widened, const float* scale, const float* bias,
                      char* y, int64_t y_stride) {
  const size_t kr = qk_woq_group_len(k, kern->kr);
  const size_t packed_panel = ceil_div(k, kr) * kr * kern->nr;
  return (plan){.kern = kern,
                .m = m,
                .n = n,
                .k = k,
                .nr = kern->nr,
                .panel_bytes = widened ? qk_woq_widened_panel_size(kern, k) : packed_panel,
                .k_bytes = kern->nr,
                .sizing_bytes = packed_panel,
                .widened = widened,
                .full_panels = widened ? ceil_div(n, kern->nr) : n / kern->nr,
                .dt = dt,
                .packed = (const int8_t*)weight,
                .scale = scale,
                .bias = bias,
                .y = y,
                .y_stride = y_stride};
}

int qk_woq_gemm(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m, size_t n,
                size_t k, qk_dtype dt, const char* x, int64_t x_stride, const int64_t* x_offsets,
                const int8_t* packed, const float* scale, const float* bias, char* y,
                int64_t y_stride, int num_threads) {
  if (!int8_call_valid(kern, blocking, dt)) return QK_ERR_ARG;
  if (m == 0 || n == 0) return QK_OK;
  plan p = int8_plan(kern, m, n, k, dt, packed, 0, scale, bias, y, y_stride);
  return execute(&p, blocking ? blocking : &kern->blocking, x, x_stride, x_offsets, num_threads);
}

int qk_woq_gemm_widened(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m,
                        size_t n, size_t k, qk_dtype dt, const char* x, int64_t x_stride,
                        const int64_t* x_offsets, const void* widened, const float* scale,
                        const float* bias, char* y, int64_t y_stride, int num_threads) {
  if (!int8_call_valid(kern, blocking, dt) || !kern->widen || kern->kind != QK_WOQ_PANELS)
    return QK_ERR_ARG;
  if (m == 0 || n == 0) return QK_OK;
  plan p = int8_plan(kern, m, n, k, dt, widened, 1, scale, bias, y, y_stride);
  return execute(&p, blocking ? blocking : &kern->blocking, x, x_stride, x_offsets, num_threads);
}

int qk_woq_gemm_int4(const qk_woq_kernel* kern, const qk_woq_blocking* blocking, size_t m, size_t n,
                     size_t k, size_t group_size, qk_dtype dt, const char* x, int64_t x_stride,
                     const int64_t* x_offsets, const uint8_t* packed, const void* sz,
                     const float* bias, char* y, int64_t y_stride, int num_threads) {
  if (kern && !blocking) blocking = &kern->blocking;
  const int packing_x = kern && kern->kind == QK_WOQ_KBLOCK;
  if (!kern || kern->format != QK_WOQ_INT4_GROUPWISE ||
      !(packing_x ? kern->int4_kblock && kern->pack_x && kern->mr == 32
                  : kern->kind == QK_WOQ_PANELS && kern->int4_fn && !kern->pack_x) ||
      !kern->convert_x || (kern->widen && (!packing_x || !kern->widened_bytes)) ||
      (kern->dequantize && (packing_x || kern->widen || kern->widened_bytes != 4)) ||
      kern->mr == 0 || kern->mr > QK_MAX_MR || kern->nr != 32 || kern->kr != 1 ||
      !(kern->dtypes & (1u << dt)) || group_size == 0 ||
      (kern->group_size && group_size % kern->group_size) || k % group_size ||
      !blocking_valid(blocking, packing_x, packing_x))
    return QK_ERR_ARG;
  if (m == 0 || n == 0) return QK_OK;
  plan p = {.kern = kern,
            .m = m,
            .n = n,
            .k = k,
            .nr = 32,
            .panel_bytes = k * 16,
            .k_bytes = 16,
            .sizing_bytes = k * 16,
            .full_panels = ceil_div(n, 32),
            .dt = dt,
            .packed = (const int8_t*)packed,
            .bias = bias,
            .group_size = group_size,
            .sz = (const char*)sz,
            .sz_stride = n * 2 * qk_dtype_size(dt),
            .y = y,
            .y_stride = y_stride};
  return execute(&p, blocking, x, x_stride, x_offsets, num_threads);
}
