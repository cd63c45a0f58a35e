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
 * into its own buffer, which every MR-row step then reads from L2.
 */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "qkern/woq.h"

#define QK_MAX_MR 32
#define QK_MC 256                      /* rows per task */
#define QK_CHUNK_BYTES (256u * 1024u)  /* packed weight bytes per task */
/* Multiply-adds below which one more thread costs more (waking it, the
 * barrier; on a loaded machine a scheduler tick) than it saves. */
#define QK_MIN_MACS_PER_THREAD (1u << 20)

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

size_t qk_woq_widened_panel_size(size_t k, uint32_t nr, uint32_t kr) {
  return ceil_div(ceil_div(k, kr), 16) * 16 * (size_t)nr * kr * 2;
}

size_t qk_woq_split_plane_size(size_t k) { return ceil_div(k, 32) * 32; }

/* The shape of one call, cut into tasks (see the top of this file). */
typedef struct plan {
  const qk_woq_kernel* kern;
  size_t m, n, k, nr, panel_bytes, panels_per_chunk, n_chunks, esize;
  qk_dtype dt;
  const int8_t* packed;
  const float *scale, *bias;
  char* y;
  int64_t y_stride;
} plan;

/* Rows m0 .. m_end-1 times chunk nb of the panels.  Row r of x is at
 * x + x_offsets[r], or x + (r - row0) * x_stride without offsets. */
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
  plan p = {kern, m, n, k, kern->nr, ceil_div(k, kr) * kr * kern->nr, 0, 0,
            dt == QK_F32 ? 4 : 2, dt, packed, scale, bias, y, y_stride};
  const size_t panels = ceil_div(n, p.nr);
  p.panels_per_chunk = p.panel_bytes ? QK_CHUNK_BYTES / p.panel_bytes : panels;
  if (p.panels_per_chunk == 0) p.panels_per_chunk = 1;
  p.n_chunks = ceil_div(panels, p.panels_per_chunk);
  const size_t m_blocks = ceil_div(m, QK_MC);
  const size_t tasks = p.n_chunks * m_blocks;
  const int splitting = kern->split && dt != QK_BF16;

  int threads = num_threads;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
#endif
  if (threads < 1) threads = 1;
  const size_t most_parallel = splitting ? (p.n_chunks > QK_MC ? p.n_chunks : QK_MC) : tasks;
  if ((size_t)threads > most_parallel) threads = (int)most_parallel;
  const double macs = (double)m * (double)n * (double)(k ? k : 1);
  if ((double)threads * QK_MIN_MACS_PER_THREAD > macs)
    threads = (int)(macs / QK_MIN_MACS_PER_THREAD) + 1;

  /* Buffers (widened panels per thread, split rows of one row block) are
   * allocated before any output is written. */
  const int widening = kern->widen && k > 0;
  const size_t wide_stride =
      widening ? (p.panels_per_chunk * qk_woq_widened_panel_size(k, p.nr, kern->kr) + 63) / 64 * 64
               : 0;
  const size_t split_row = splitting ? (dt == QK_F32 ? 3 : 2) * qk_woq_split_plane_size(k) * 2 : 0;
  char* wide_all = widening ? aligned_alloc(64, (size_t)threads * wide_stride) : NULL;
  char* split_rows = splitting ? aligned_alloc(64, (m < QK_MC ? m : QK_MC) * split_row + 64) : NULL;
  if ((widening && !wide_all) || (splitting && !split_rows)) {
    free(wide_all);
    free(split_rows);
    return QK_ERR_NOMEM;
  }

#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    char* wide = wide_all ? wide_all + (size_t)omp_get_thread_num() * wide_stride : NULL;
#else
    char* wide = wide_all;
#endif
    if (!splitting) {
#pragma omp for schedule(static)
      for (size_t t = 0; t < tasks; t++) {
        const size_t mb = t / p.n_chunks;
        const size_t m_end = (mb + 1) * QK_MC < m ? (mb + 1) * QK_MC : m;
        run_task(&p, t % p.n_chunks, mb * QK_MC, m_end, x, 0, x_stride, x_offsets, wide);
      }
    } else {
      /* Row blocks in turn: split the block's rows, then its chunks; the
       * implicit barriers keep the split rows intact while they are read. */
      for (size_t mb = 0; mb < m_blocks; mb++) {
        const size_t m0 = mb * QK_MC, m_end = m0 + QK_MC < m ? m0 + QK_MC : m;
#pragma omp for schedule(static)
        for (size_t r = m0; r < m_end; r++)
          kern->split(x + (x_offsets ? x_offsets[r] : (int64_t)r * x_stride), dt, k,
                      split_rows + (r - m0) * split_row);
#pragma omp for schedule(static)
        for (size_t nb = 0; nb < p.n_chunks; nb++)
          run_task(&p, nb, m0, m_end, split_rows, m0, (int64_t)split_row, NULL, wide);
      }
    }
  }
  free(wide_all);
  free(split_rows);
  return QK_OK;
}
