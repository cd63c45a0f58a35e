/*
 * woq_pack.c -- packs an N x K int8 weight into the panel layout (nr, kr)
 * drawn in include/qkern/woq.h.  Portable C, baseline flags.
 */
#include <stdint.h>
#include <string.h>

#include "qkern/woq.h"

static size_t round_up(size_t v, size_t q) { return (v + q - 1) / q * q; }

size_t qk_woq_group_len(size_t k, uint32_t kr) { return kr ? kr : (k ? k : 1); }

size_t qk_woq_packed_size(size_t n, size_t k, uint32_t nr, uint32_t kr) {
  size_t whole, rows, total;
  const size_t kp = round_up(k, qk_woq_group_len(k, kr));
  if (kp < k || __builtin_mul_overflow(n / nr * nr, kp, &whole) ||
      __builtin_mul_overflow(n % nr, k, &rows) || __builtin_add_overflow(whole, rows, &total))
    return SIZE_MAX;
  return total;
}

/* Copies kr bytes; kr is 1 or 2 for every kernel, so those are inlined. */
static inline void copy_run(int8_t* dst, const int8_t* src, size_t kr) {
  if (kr == 1)
    dst[0] = src[0];
  else if (kr == 2)
    memcpy(dst, src, 2);
  else
    memcpy(dst, src, kr);
}

/* Moves n rows of w (rows ldw bytes apart) into roundup(n, nr) / nr whole
 * panels, padded with zeros (to_panels), or the panels' values back into
 * the rows (w is written only then). */
static void move_panels(int8_t* w, size_t ldw, size_t n, size_t k, uint32_t nr, uint32_t kr_tag,
                        int8_t* panels, int to_panels) {
  const size_t kr = qk_woq_group_len(k, kr_tag);
  const size_t kp = round_up(k, kr), full_groups = k / kr, tail = k % kr;
  if (to_panels) memset(panels, 0, round_up(n, nr) * kp);
  /* Panel by panel, through the panels sequentially; the nr rows are nr
   * sequential streams. */
  for (size_t p0 = 0; p0 < n; p0 += nr) {
    const size_t cols = n - p0 < nr ? n - p0 : nr;
    int8_t* group = panels + p0 * kp;
    for (size_t g = 0; g < full_groups + (tail != 0); g++, group += nr * kr) {
      const size_t run = g < full_groups ? kr : tail;
      for (size_t j = 0; j < cols; j++) {
        int8_t* row = w + (p0 + j) * ldw + g * kr;
        if (to_panels)
          copy_run(group + j * kr, row, run);
        else
          copy_run(row, group + j * kr, run);
      }
    }
  }
}

void qk_woq_pack(const int8_t* w, size_t ldw, size_t n, size_t k, uint32_t nr, uint32_t kr,
                 int8_t* out) {
  const size_t whole = n / nr * nr;
  move_panels((int8_t*)w, ldw, whole, k, nr, kr, out, 1);
  int8_t* rows = out + qk_woq_packed_size(whole, k, nr, kr);
  for (size_t j = whole; j < n; j++) memcpy(rows + (j - whole) * k, w + j * ldw, k);
}

void qk_woq_unpack(const int8_t* packed, size_t n, size_t k, uint32_t nr, uint32_t kr, int8_t* w,
                   size_t ldw) {
  const size_t whole = n / nr * nr;
  move_panels(w, ldw, whole, k, nr, kr, (int8_t*)packed, 0);
  const int8_t* rows = packed + qk_woq_packed_size(whole, k, nr, kr);
  for (size_t j = whole; j < n; j++) memcpy(w + j * ldw, rows + (j - whole) * k, k);
}

void qk_woq_pad_last_panel(const int8_t* packed, size_t n, size_t k, uint32_t nr, uint32_t kr,
                           int8_t* out) {
  const size_t whole = n / nr * nr;
  move_panels((int8_t*)packed + qk_woq_packed_size(whole, k, nr, kr), k, n - whole, k, nr, kr, out,
              1);
}
