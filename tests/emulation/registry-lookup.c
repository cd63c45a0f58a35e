/*
 * registry-lookup.c -- the registry entry of a kernel by name, for
 * tests/emulated_kernels.py: its library holds the registry and the driver
 * compiled with the emulated kernels, and runs them through the driver
 * with this.  Portable C, for tests only.
 */
#include <string.h>

#include "qkern/woq.h"

/* The entry named name, or NULL. */
const qk_woq_kernel* qk_test_kernel(const char* name) {
  for (size_t i = 0; i < qk_woq_num_kernels; i++)
    if (strcmp(qk_woq_kernels[i].name, name) == 0) return &qk_woq_kernels[i];
  return NULL;
}

/* Row i of a group packed by kern's own pack_x (qk_woq_pack_x_fn). */
void qk_test_pack_x(const qk_woq_kernel* kern, const void* row, qk_dtype dt, size_t kc, size_t i,
                    void* group, size_t chunk_stride) {
  kern->pack_x(row, dt, kc, i, group, chunk_stride);
}
