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

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

size_t qk_woq_widened_panel_size(size_t k, uint32_t nr, uint32_t kr) {
  return ceil_div(ceil_div(k, kr), 16) * 16 * (size_t)nr * kr * 2;
}

int qk_woq_gemm(const qk_woq_kernel* kern, size_t m, size_t n, size_t k,
                qk_dtype dt, const char* x, int64_t x_stride,
                const int64_t* x_offsets, const int8_t* packed,
                const float* scale, const float* bias, char* y,
                int64_t y_stride, int num_threads) {
  if (!kern || kern->mr == 0 || kern->mr > QK_MAX_MR || kern->nr == 0 ||
      kern->kr == 0 || !(kern->dtypes & (1u << dt)))
    return QK_ERR_ARG;
  if (m == 0 || n == 0) return QK_OK;

  const size_t mr_max = kern->mr, nr = kern->nr;
  const size_t kp = ceil_div(k, kern->kr) * kern->kr;
  const size_t panel_bytes = kp * nr;
  const size_t panels = ceil_div(n, nr);
  size_t panels_per_chunk = panel_bytes ? QK_CHUNK_BYTES / panel_bytes : panels;
  if (panels_per_chunk == 0) panels_per_chunk = 1;
  const size_t n_chunks = ceil_div(panels, panels_per_chunk);
  const size_t m_blocks = ceil_div(m, QK_MC);
  const size_t tasks = n_chunks * m_blocks;
  const size_t esize = dt == QK_F32 ? 4 : 2;

  int threads = num_threads;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
#endif
  if (threads < 1) threads = 1;
  if ((size_t)threads > tasks) threads = (int)tasks;

  /* Widening buffers, one per thread, allocated before any output is written. */
  const int widening = kern->widen && k > 0;
  const size_t wide_stride =
      widening ? (panels_per_chunk * qk_woq_widened_panel_size(k, nr, kern->kr) + 63) / 64 * 64 : 0;
  char* wide_all = NULL;
  if (widening && !(wide_all = aligned_alloc(64, (size_t)threads * wide_stride)))
    return QK_ERR_NOMEM;

#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    char* wide = wide_all ? wide_all + (size_t)omp_get_thread_num() * wide_stride : NULL;
#else
    char* wide = wide_all;
#endif
    const void* rows[QK_MAX_MR];
#pragma omp for schedule(static)
    for (size_t t = 0; t < tasks; t++) {
      const size_t mb = t / n_chunks, nb = t % n_chunks;
      const size_t p0 = nb * panels_per_chunk;
      const size_t n0 = p0 * nr;
      const size_t nc = (n - n0) < panels_per_chunk * nr ? (n - n0) : panels_per_chunk * nr;
      const size_t m_end = (mb + 1) * QK_MC < m ? (mb + 1) * QK_MC : m;
      const int8_t* w = packed + p0 * panel_bytes;
      if (wide) {
        kern->widen(w, ceil_div(nc, nr), k, wide);
        w = (const int8_t*)wide;
      }
      for (size_t m0 = mb * QK_MC; m0 < m_end; m0 += mr_max) {
        const size_t mr = m_end - m0 < mr_max ? m_end - m0 : mr_max;
        for (size_t i = 0; i < mr; i++) {
          const size_t row = m0 + i;
          rows[i] = x + (x_offsets ? x_offsets[row] : (int64_t)row * x_stride);
        }
        kern->fn(mr, nc, k, rows, dt, w, scale + n0, bias ? bias + n0 : NULL,
                 y + (int64_t)m0 * y_stride + n0 * esize, (ptrdiff_t)y_stride);
      }
    }
  }
  free(wide_all);
  return QK_OK;
}
