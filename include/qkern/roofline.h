/*
 * qkern/roofline.h -- measured ceilings of this machine: DRAM read bandwidth
 * and the peak rate of each instruction a kernel does its work with.
 * Used by the benchmark to state every figure as a share of the roofline.
 */
#ifndef QKERN_ROOFLINE_H
#define QKERN_ROOFLINE_H

#include <stddef.h>
#include <stdint.h>

#include "qkern/woq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One throughput loop: `iters` iterations of independent instructions that
 * never wait on each other's results; returns a value derived from them so
 * the work cannot be optimised away.  flops_per_iter counts 2 per
 * multiply-add lane. */
typedef float (*qk_peak_loop_fn)(size_t iters);

typedef struct qk_peak_entry {
  const char* name; /* the instruction, e.g. "vdpbf16ps" */
  qk_peak_loop_fn fn;
  qk_isa isa;
  double flops_per_iter;
} qk_peak_entry;

extern const qk_peak_entry qk_peak_loops[];
extern const size_t qk_num_peak_loops;

/* Runs loop `index` for `iters` iterations on each of `threads` OpenMP
 * threads at once; returns the wall seconds of the slowest. */
double qk_peak_run(size_t index, size_t iters, int threads);

/* Reads `bytes` (a multiple of 64) at buf (64-byte aligned) split over
 * `threads` OpenMP threads; returns wall seconds.  *checksum receives a sum
 * of what was read. */
double qk_read_run(const void* buf, size_t bytes, int threads, uint64_t* checksum);

#ifdef __cplusplus
}
#endif

#endif /* QKERN_ROOFLINE_H */
