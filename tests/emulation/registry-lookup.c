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
