/*
 * sanitize.h -- AddressSanitizer checks for the accesses it cannot see.
 * Portable (no ISA instructions).
 *
 * GCC's AddressSanitizer instruments plain loads and stores, including
 * unmasked vector ones, but not AVX-512 masked loads and stores nor AMX tile
 * loads: an out-of-bounds access through them goes unreported (or, at best,
 * faults much later).  In a sanitizer build (QKERN_SANITIZE=1, which defines
 * __SANITIZE_ADDRESS__), QK_ASAN_CHECK(p, bytes, is_write) reports an access
 * of `bytes` bytes at p that touches memory the program may not use, as an
 * instrumented access would; in every other build it is empty.
 */
#ifndef QKERN_SANITIZE_H
#define QKERN_SANITIZE_H

#include <stddef.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>

static inline __attribute__((always_inline)) void qk_asan_check(const void* p, size_t bytes,
                                                                int is_write) {
  void* bad = __asan_region_is_poisoned((void*)p, bytes);
  if (bad)
    __asan_report_error(__builtin_return_address(0), __builtin_frame_address(0),
                        __builtin_frame_address(0), bad, is_write, bytes);
}
#define QK_ASAN_CHECK(p, bytes, is_write) qk_asan_check((p), (bytes), (is_write))
#else
#define QK_ASAN_CHECK(p, bytes, is_write) ((void)0)
#endif

#endif /* QKERN_SANITIZE_H */
