/*
 * woq_pack.c -- packs an N x K int8 weight into the panel layout (nr, kr)
 * drawn in include/qkern/woq.h.  Portable C, baseline flags.
 */
#include <string.h>

#include "qkern/woq.h"

static size_t round_up(size_t v, size_t q) { return (v + q - 1) / q * q; }

size_t qk_woq_packed_size(size_t n, size_t k, uint32_t nr, uint32_t kr) {
  return round_up(n, nr) * round_up(k, kr);
}

void qk_woq_pack(const int8_t* w, size_t ldw, size_t n, size_t k, uint32_t nr,
                 uint32_t kr, int8_t* out) {
  const size_t kp = round_up(k, kr);
  const size_t np = round_up(n, nr);
  for (size_t p = 0; p < np; p += nr) {
    int8_t* panel = out + p * kp;
    for (size_t j = 0; j < nr; j++) {
      const size_t col = p + j;
      for (size_t kk = 0; kk < kp; kk++) {
        const int8_t v = (col < n && kk < k) ? w[col * ldw + kk] : 0;
        panel[(kk / kr) * nr * kr + j * kr + kk % kr] = v;
      }
    }
  }
}
