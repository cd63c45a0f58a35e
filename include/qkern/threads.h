/*
 * qkern/threads.h -- how many OpenMP threads a qkern call may start.
 *
 * Every thread count that comes from a user (num_threads, the OpenMP
 * default) passes through qk_threads_for_call() before a parallel region
 * starts; the region may then start fewer, as its work needs.  It applies,
 * in order:
 *
 *   1. the request: requested <= 0 means the OpenMP default of the calling
 *      thread (omp_get_max_threads(): OMP_NUM_THREADS, threadpoolctl);
 *   2. the processors this process may run on (omp_get_num_procs(), which
 *      follows the affinity mask): threads beyond them only wait for a core;
 *   3. fork: libgomp's thread pool does not survive fork(), and a region of
 *      two or more threads in a child forked after its parent ran one never
 *      returns; such a child runs every region on its calling thread alone;
 *   4. the OS: libgomp ends the whole process when it cannot start a thread,
 *      so before a calling thread's pool grows, the extra threads are
 *      started here (with the stack size libgomp gives its threads) and
 *      joined, and the pool is grown at once; the team is cut to as many as
 *      started, and that calling thread keeps to that many.
 *
 * The result is at least 1.  Limits 3 and 4 leave a notice, taken once per
 * process by qk_threads_take_notice(), so that the caller can warn.
 *
 * The state behind this (which teams ran, whether this is a forked child)
 * is one per copy of threads.c: every extension that links it has its own.
 * Only qkern._cpu calls it; the other extensions get their counts from
 * there.
 */
#ifndef QKERN_THREADS_H
#define QKERN_THREADS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Bits of qk_threads_take_notice(). */
enum {
  QK_THREADS_FORKED = 1,    /* a call ran on one thread in a forked child */
  QK_THREADS_OS_REFUSED = 2 /* the OS could not start all threads asked for */
};

/* The threads a call asking for `requested` may start (see above);
 * thread-safe. */
int qk_threads_for_call(int requested);

/* The notices left since the last call (each bit reported once per
 * process), or 0; thread-safe. */
int qk_threads_take_notice(void);

#ifdef __cplusplus
}
#endif

#endif /* QKERN_THREADS_H */
