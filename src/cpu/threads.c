/*
 * threads.c -- the thread count a qkern call may start
 * (include/qkern/threads.h).  Portable C with OpenMP and POSIX threads,
 * baseline flags.
 *
 * libgomp keeps a pool of threads per calling ("master") thread, grown to
 * the largest team that thread has run.  Two of its failure modes cannot be
 * caught after the fact, so they are avoided before a region starts:
 *
 * - After fork(), the child's copy of the pool names threads that do not
 *   exist, and a team of two or more waits for them forever.  A handler
 *   registered with pthread_atfork marks such a child; it then runs every
 *   region on its calling thread (a team of one never touches the pool).
 * - When pthread_create fails (an address-space limit, a thread limit),
 *   libgomp prints "Thread creation failed" and exits.  So the first time a
 *   calling thread asks for a team larger than its pool, the extra threads
 *   are started here, all at once, with the stack size libgomp will give
 *   them (OMP_STACKSIZE or GOMP_STACKSIZE, else the default), and joined;
 *   the team is cut to as many as started (and that calling thread keeps
 *   to that many), and an empty parallel region of that size then grows
 *   the pool at once, on the stacks just freed (glibc keeps them in its
 *   cache): later regions of the calling thread, up to that size, start no
 *   thread, so none can fail.
 */
#include "qkern/threads.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static atomic_int team_ran;      /* a team of two or more ran in this process */
static atomic_int pool_lost;     /* this process is a child forked after that */
static atomic_int notices_given; /* QK_THREADS_* bits reported so far */
static atomic_int notices_pending;
static _Thread_local int largest_team = 1; /* the calling thread's pool holds it */
static _Thread_local int os_limit;         /* threads the OS started when it refused */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static volatile int pool_sink;

static void leave_notice(int bit) {
  if (!(atomic_fetch_or(&notices_given, bit) & bit)) atomic_fetch_or(&notices_pending, bit);
}

int qk_threads_take_notice(void) { return atomic_exchange(&notices_pending, 0); }

static void mark_child(void) {
  if (atomic_load(&team_ran)) atomic_store(&pool_lost, 1);
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, mark_child); }

/* Bytes of one libgomp thread's stack as its environment sets it ("64M",
 * "512k", "1G", a bare number in KiB), or 0 for the pthread default. */
static size_t env_stack_size(const char* name) {
  const char* s = getenv(name);
  if (!s) return 0;
  char* end;
  const unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return 0;
  while (isspace((unsigned char)*end)) end++;
  unsigned long long unit = 1024;
  switch (tolower((unsigned char)*end)) {
    case 'b': unit = 1, end++; break;
    case 'k': end++; break;
    case 'm': unit = 1024ull * 1024, end++; break;
    case 'g': unit = 1024ull * 1024 * 1024, end++; break;
  }
  while (isspace((unsigned char)*end)) end++;
  return *end ? 0 : (size_t)(v * unit);
}

static void* do_nothing(void* arg) { return arg; }

/* Starts up to `extra` threads at once, joins them; returns how many started. */
static int start_and_join(int extra) {
  pthread_t* ids = malloc((size_t)extra * sizeof *ids);
  pthread_attr_t attr;
  if (!ids || pthread_attr_init(&attr)) {
    free(ids);
    return 0;
  }
  size_t stack = env_stack_size("OMP_STACKSIZE");
  if (!stack) stack = env_stack_size("GOMP_STACKSIZE");
  if (stack) pthread_attr_setstacksize(&attr, stack);
  int started = 0;
  while (started < extra && pthread_create(&ids[started], &attr, do_nothing, NULL) == 0) started++;
  for (int i = 0; i < started; i++) pthread_join(ids[i], NULL);
  pthread_attr_destroy(&attr);
  free(ids);
  return started;
}

int qk_threads_for_call(int requested) {
#ifdef _OPENMP
  int threads = requested > 0 ? requested : omp_get_max_threads();
  const int procs = omp_get_num_procs();
  if (threads > procs) threads = procs;
  if (threads < 2) return 1;
  if (atomic_load(&pool_lost)) {
    leave_notice(QK_THREADS_FORKED);
    return 1;
  }
  if (os_limit && threads > os_limit) threads = os_limit;
  if (threads > largest_team) {
    pthread_once(&atfork_once, register_atfork);
    atomic_store(&team_ran, 1); /* the pool grows below: a child must not use it */
    const int started = 1 + start_and_join(threads - 1);
    if (started < threads) {
      leave_notice(QK_THREADS_OS_REFUSED);
      os_limit = threads = started;
    }
    if (threads > largest_team) {
      /* Grow the pool now, while the OS has just started as many threads:
       * a later region of this size, whatever its work, starts none.  (An
       * empty region would be compiled away.) */
#pragma omp parallel num_threads(threads)
      pool_sink = omp_get_thread_num();
      largest_team = threads;
    }
  }
  return threads;
#else
  (void)requested;
  return 1;
#endif
}
