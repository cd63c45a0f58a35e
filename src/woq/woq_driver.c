/*
 * woq_driver.c -- blocking and threading around a WoQ micro-kernel.
 * Portable C with OpenMP, baseline flags.
 *
 * Work is cut into tasks of (MC rows) x (a chunk of whole nr-panels sized to
 * stay in L2); OpenMP spreads tasks over threads.  Within a task the weight
 * chunk is streamed once from memory and reused from L2 by every MR-row step.
 * Each output element is produced by exactly one micro-kernel call over all
 * of K, so the bits of y never depend on the number of threads.  For a
 * kernel with a widen function, each thread widens its task's chunk once
 * into its own buffer, which every MR-row step then reads from L2.  For a
 * kernel with a pack_x function, the rows of each row block are first
 * packed (by all threads, a row each) into one shared buffer of packed x,
 * which its tasks then read.
 */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "qkern/woq.h"

#define QK_MAX_MR 32
#define QK_MC 256                      /* rows per task */
/* Rows per task for a kernel on packed x: each task widens its chunk once
 * and reuses it over this many rows, packed ahead by all threads. */
#define QK_MC_PACKED_X 2048
#define QK_CHUNK_BYTES (256u * 1024u)  /* packed weight bytes per task */
/* From this many rows, a kernel on widened panels takes chunks twice as
 * wide (1 MiB widened, still in L2): each MR-row step then reuses its rows
 * of x over twice the columns.  Measured with the AMX kernel, one thread,
 * 4096 x 4096 bf16: 7-18 % faster at M = 512 and 1024, slower below. */
#define QK_WIDE_CHUNK_MIN_M 512
/* Multiply-adds below which one more thread costs more (waking it, the
 * barrier; on a loaded machine a scheduler tick) than it saves. */
#define QK_MIN_MACS_PER_THREAD (1u << 20)

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

size_t qk_woq_widened_panel_size(size_t k, uint32_t nr, uint32_t kr) {
  return ceil_div(ceil_div(k, kr), 16) * 16 * (size_t)nr * kr * 2;
}

/* Bytes of one 32-k chunk of a 32-row group of packed x: 2 KiB per plane. */
static size_t packed_x_chunk_size(qk_dtype dt) {
  return (dt == QK_F32 ? 3 : dt == QK_F16 ? 2 : 1) * 2048;
}

size_t qk_woq_packed_x_group_size(size_t k, qk_dtype dt) {
  return ceil_div(k, 32) * packed_x_chunk_size(dt);
}

/* The shape of one call, cut into tasks (see the top of this file). */
typedef struct plan {
  const qk_woq_kernel* kern;
  size_t m, n, k, nr, panel_bytes, panels_per_chunk, n_chunks, esize;
  size_t x_group_bytes; /* packed x: bytes per 32-row group; 0: x as is */
  qk_dtype dt;
  const int8_t* packed;
  const float *scale, *bias;
  char* y;
  int64_t y_stride;
} plan;

/* Rows m0 .. m_end-1 times chunk nb of the panels.  Row r of x is at
 * x + x_offsets[r], or x + (r - row0) * x_stride without offsets; for packed
 * x, x holds the row block starting at row0 (m0 - row0 a multiple of 32). */
static void run_task(const plan* p, size_t nb, size_t m0, size_t m_end, const char* x,
                     size_t row0, int64_t x_stride, const int64_t* x_offsets, char* wide) {
  const size_t p0 = nb * p->panels_per_chunk, n0 = p0 * p->nr;
  const size_t chunk_cols = p->panels_per_chunk * p->nr;
  const size_t nc = p->n - n0 < chunk_cols ? p->n - n0 : chunk_cols;
  const int8_t* w = p->packed + p0 * p->panel_bytes;
  if (wide) {
    p->kern->widen(w, ceil_div(nc, p->nr), p->k, wide);
    w = (const int8_t*)wide;
  }
  const void* rows[QK_MAX_MR];
  for (; m0 < m_end; m0 += p->kern->mr) {
    const size_t mr = m_end - m0 < p->kern->mr ? m_end - m0 : p->kern->mr;
    if (p->x_group_bytes)
      rows[0] = x + (m0 - row0) / 32 * p->x_group_bytes;
    else
      for (size_t i = 0; i < mr; i++)
        rows[i] = x + (x_offsets ? x_offsets[m0 + i] : (int64_t)(m0 + i - row0) * x_stride);
    p->kern->fn(mr, nc, p->k, rows, p->dt, w, p->scale + n0, p->bias ? p->bias + n0 : NULL,
                p->y + (int64_t)m0 * p->y_stride + n0 * p->esize, (ptrdiff_t)p->y_stride);
  }
}

int qk_woq_gemm(const qk_woq_kernel* kern, size_t m, size_t n, size_t k,
                qk_dtype dt, const char* x, int64_t x_stride,
                const int64_t* x_offsets, const int8_t* packed,
                const float* scale, const float* bias, char* y,
                int64_t y_stride, int num_threads) {
  if (!kern || kern->mr == 0 || kern->mr > QK_MAX_MR || kern->nr == 0 ||
      !(kern->dtypes & (1u << dt)))
    return QK_ERR_ARG;
  if (m == 0 || n == 0) return QK_OK;

  const size_t kr = qk_woq_group_len(k, kern->kr);
  const int packing_x = kern->pack_x != NULL;
  plan p = {kern, m, n, k, kern->nr, ceil_div(k, kr) * kr * kern->nr, 0, 0,
            dt == QK_F32 ? 4 : 2, packing_x ? qk_woq_packed_x_group_size(k, dt) : 0,
            dt, packed, scale, bias, y, y_stride};
  const size_t panels = ceil_div(n, p.nr);
  const size_t chunk_bytes = kern->widen && m >= QK_WIDE_CHUNK_MIN_M ? 2 * QK_CHUNK_BYTES
                                                                    : QK_CHUNK_BYTES;
  p.panels_per_chunk = p.panel_bytes ? chunk_bytes / p.panel_bytes : panels;
  if (p.panels_per_chunk == 0) p.panels_per_chunk = 1;
  p.n_chunks = ceil_div(panels, p.panels_per_chunk);
  const size_t mc = packing_x ? QK_MC_PACKED_X : QK_MC;
  const size_t m_blocks = ceil_div(m, mc);
  const size_t tasks = p.n_chunks * m_blocks;

  int threads = num_threads;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
#endif
  if (threads < 1) threads = 1;
  const size_t most_parallel = packing_x ? (p.n_chunks > mc ? p.n_chunks : mc) : tasks;
  if ((size_t)threads > most_parallel) threads = (int)most_parallel;
  const double macs = (double)m * (double)n * (double)(k ? k : 1);
  if ((double)threads * QK_MIN_MACS_PER_THREAD > macs)
    threads = (int)(macs / QK_MIN_MACS_PER_THREAD) + 1;

  /* Buffers (widened panels per thread, packed x of one row block) are
   * allocated before any output is written. */
  const int widening = kern->widen && k > 0;
  const size_t wide_stride =
      widening ? (p.panels_per_chunk * qk_woq_widened_panel_size(k, p.nr, kern->kr) + 63) / 64 * 64
               : 0;
  const size_t x_block_bytes = ceil_div(m < mc ? m : mc, 32) * p.x_group_bytes;
  char* wide_all = widening ? aligned_alloc(64, (size_t)threads * wide_stride) : NULL;
  char* x_block = packing_x ? aligned_alloc(64, x_block_bytes + 64) : NULL;
  if ((widening && !wide_all) || (packing_x && !x_block)) {
    free(wide_all);
    free(x_block);
    return QK_ERR_NOMEM;
  }

#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    char* wide = wide_all ? wide_all + (size_t)omp_get_thread_num() * wide_stride : NULL;
#else
    char* wide = wide_all;
#endif
    if (!packing_x) {
#pragma omp for schedule(static)
      for (size_t t = 0; t < tasks; t++) {
        const size_t mb = t / p.n_chunks;
        const size_t m_end = (mb + 1) * QK_MC < m ? (mb + 1) * QK_MC : m;
        run_task(&p, t % p.n_chunks, mb * QK_MC, m_end, x, 0, x_stride, x_offsets, wide);
      }
    } else {
      /* Row blocks in turn: pack the block's rows, then run its chunks; the
       * implicit barriers keep the packed rows intact while they are read. */
      for (size_t mb = 0; mb < m_blocks; mb++) {
        const size_t m0 = mb * mc, m_end = m0 + mc < m ? m0 + mc : m;
#pragma omp for schedule(static)
        for (size_t r = m0; r < m_end; r++)
          kern->pack_x(x + (x_offsets ? x_offsets[r] : (int64_t)r * x_stride), dt, k,
                       x_block + (r - m0) / 32 * p.x_group_bytes + (r - m0) % 32 * 64,
                       packed_x_chunk_size(dt));
#pragma omp for schedule(static)
        for (size_t nb = 0; nb < p.n_chunks; nb++)
          run_task(&p, nb, m0, m_end, x_block, m0, 0, NULL, wide);
      }
    }
  }
  free(wide_all);
  free(x_block);
  return QK_OK;
}
