/*
 * ukernel_ab.c -- two builds of one WoQ micro-kernel, qk_ab_a and qk_ab_b
 * (benchmarks/ukernel_ab.sh compiles the kernel's file at two revisions,
 * renaming its symbol), called alternately on the same operands in one
 * process: the minimum and median time of each per call, their ratio, and
 * whether they wrote the same bits.  On a shared machine, where two runs
 * of one build differ by more than a kernel change gains, this is the
 * comparison that resolves a few per cent.
 *
 *   ukernel_ab int8 NR KR MR NC KC XDT DT [ROUNDS]
 *   ukernel_ab int4 GROUP MR NC KC DT [ROUNDS]
 *   ukernel_ab kblock WIDENS M NC K DT [ROUNDS]
 *   ukernel_ab int4kblock WIDENED GROUP M NC K DT [ROUNDS]
 *
 * int8: qk_woq_ukernel_fn on packed panels of layout (NR, KR) (KR = 0:
 * the row-major weight), rows of x in XDT (f32 for a kernel that converts
 * x: the driver hands it f32 rows; xt: one group of packed x^T in the bf16
 * planes of DT, for an AMX kernel on the unpacked weight), y in DT.  int4: qk_woq_int4_ukernel_fn
 * on packed int4 panels, f32 rows of x with their group sums, scales and
 * zeros and y in DT.  kblock: a qk_woq_kblock_fn (AMX) walked as the driver
 * walks one chunk of NC columns (a multiple of 32): K in blocks of 1024,
 * each over the M rows of packed x in 32-row steps, y in DT; with WIDENS 1
 * the first row step of a block widens it into the buffer the later steps
 * read (the bf16w kernel), with 0 every step reads the packed block.
 * int4kblock: a qk_woq_int4_kblock_fn (AMX) walked the same way, K blocks
 * of 1024 rounded down to whole groups of GROUP, over packed int4 panels
 * (WIDENED 0) or panels holding bf16 values of q as the driver's widening
 * writes them (WIDENED 1, the tilew kernel), with scales, zeros and x's
 * group sums.  One sample is a whole walk.  Panel kernels on widened or
 * dequantized panels of the driver's own widening are not called here.
 * Operands fit
 * in L2 at the sizes this is meant for (K a few thousand, NC 128): the
 * kernel's own speed, without the memory system's noise.  With AB_COPIES=C
 * in the environment the weight (int4: with its scales and zeros) is held
 * in C copies (1 to 4096, each at the same offset in its pages) and each
 * call reads the next; a sample is a whole number of passes over the
 * copies, in the same order for both kernels.  C copies of a weight larger
 * than the last-level cache over C give the kernel cold weights, as a
 * layer of a model meets them (e.g. NC = KC = 4096, C = 8 on a 32 MiB L3).
 * With AB_W_OFFSET=B (0 to 63; int8 with KR = 0 only) the row-major weight
 * starts B bytes past a 64-byte line, as a caller's array may.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qkern/cpu.h"
#include "qkern/fpenv.h"
#include "qkern/woq.h"
#include "scalar-convert.h"

#if defined(AB_INT4) && defined(AB_KBLOCK)
#define AB_PARAMS                                                                              \
  size_t, size_t, size_t, size_t, const void*, const float*, size_t, qk_dtype, const uint8_t*, \
      size_t, const void*, size_t, float*, int, int, const float*, void*, ptrdiff_t
#elif defined(AB_INT4)
#define AB_PARAMS                                                                             \
  size_t, size_t, size_t, size_t, const float* const*, qk_dtype, const uint8_t*, const void*, \
      size_t, const float*, void*, ptrdiff_t
#elif defined(AB_KBLOCK)
#define AB_PARAMS                                                                                \
  size_t, size_t, size_t, const void*, qk_dtype, const int8_t*, size_t, void*, float*, int, int, \
      const float*, const float*, void*, ptrdiff_t
#else
#define AB_PARAMS                                                                                  \
  size_t, size_t, size_t, const void* const*, qk_dtype, const int8_t*, const float*, const float*, \
      void*, ptrdiff_t
#endif
void qk_ab_a(AB_PARAMS);
void qk_ab_b(AB_PARAMS);

static double thread_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static qk_dtype dtype_of(const char* name) {
  if (!strcmp(name, "f32")) return QK_F32;
  if (!strcmp(name, "f16")) return QK_F16;
  if (!strcmp(name, "bf16")) return QK_BF16;
  fprintf(stderr, "ukernel_ab: dtype %s is not f32, f16 or bf16\n", name);
  exit(2);
}

/* Reads the command line `kind SIZE... DTYPE... [ROUNDS]` (as `usage`
 * shows it): sizes[0 .. n_sizes-1], dtypes[0 .. n_dtypes-1] and the rounds
 * (101 unless given); exits with the usage when argv[1] is not kind or a
 * field is missing. */
static size_t read_args(int argc, char** argv, const char* kind, const char* usage, size_t n_sizes,
                        size_t* sizes, size_t n_dtypes, qk_dtype* dtypes) {
  const int fields = 2 + (int)(n_sizes + n_dtypes);
  if (argc < fields || strcmp(argv[1], kind)) {
    fprintf(stderr, "usage: %s %s %s\n", argv[0], kind, usage);
    exit(2);
  }
  for (size_t i = 0; i < n_sizes; i++) sizes[i] = strtoul(argv[2 + i], NULL, 10);
  for (size_t i = 0; i < n_dtypes; i++) dtypes[i] = dtype_of(argv[2 + n_sizes + i]);
  return argc > fields ? strtoul(argv[fields], NULL, 10) : 101;
}

/* AB_COPIES: how many copies of the weight the calls rotate through (1 to
 * 4096). */
static size_t weight_copies(void) {
  const char* v = getenv("AB_COPIES");
  if (!v) return 1;
  char* end = NULL;
  const unsigned long copies = v[0] >= '0' && v[0] <= '9' ? strtoul(v, &end, 10) : 0;
  if (!end || *end || copies < 1 || copies > 4096) {
    fprintf(stderr, "ukernel_ab: AB_COPIES must be at least 1 and at most 4096\n");
    exit(2);
  }
  return copies;
}

/* The distance between copies of bytes: whole 4 KiB pages, so that every
 * copy sits at the same offset in its pages. */
static size_t copy_stride(size_t bytes, size_t copies) {
  const size_t stride = (bytes + 4095) / 4096 * 4096;
  if (stride < bytes || stride > (SIZE_MAX / 2) / copies) {
    fprintf(stderr, "ukernel_ab: %zu copies of %zu bytes do not fit in memory\n", copies, bytes);
    exit(2);
  }
  return stride;
}

/* Copies 1.. of the first bytes at p, stride bytes apart. */
static void replicate(void* p, size_t bytes, size_t stride, size_t copies) {
  for (size_t i = 1; i < copies; i++) memcpy((char*)p + i * stride, p, bytes);
}

static void* buffer(size_t bytes) {
  void* p = aligned_alloc(64, (bytes + 64) / 64 * 64 + 64);
  if (!p) {
    fprintf(stderr, "ukernel_ab: out of memory\n");
    exit(2);
  }
  memset(p, 0, (bytes + 64) / 64 * 64 + 64);
  return p;
}

/* Exits unless this process runs AMX-BF16 kernels (qk_cpu_detect also asks
 * Linux for the process's tile state); what: the mode that needs them. */
static inline void require_amx(const char* what) {
  qk_cpu_features cpu;
  qk_cpu_detect(&cpu);
  if (!cpu.amx_bf16) {
    fprintf(stderr, "ukernel_ab: %s runs AMX kernels: no AMX-BF16 here, or no tile state\n", what);
    exit(2);
  }
}

/* `bytes` of packed x (or x^T) as the driver packs it, each plane holding
 * small bf16 values of both signs. */
static inline uint16_t* packed_bf16_x(size_t bytes) {
  uint16_t* x = buffer(bytes);
  for (size_t i = 0; i < bytes / 2; i++)
    x[i] = (uint16_t)(0x3e00 + (i * 7 % 13) * 16 + (i % 3 ? 0x8000 : 0));
  return x;
}

#ifdef AB_INT4
/* `copies` copies of int4 scales and zeros in dt for groups x nc columns,
 * *copy_bytes apart (small s and z of both signs). */
static char* scales_and_zeros(size_t groups, size_t nc, qk_dtype dt, size_t copies,
                              size_t* copy_bytes) {
  const size_t bytes = groups * nc * 2 * qk_dtype_size(dt);
  *copy_bytes = copy_stride(bytes, copies);
  char* sz = buffer(copies * *copy_bytes);
  for (size_t i = 0; i < groups * nc * 2; i++)
    qk_store_from_f32(sz, i, dt,
                      i % 2 ? (float)((int)(i % 7) - 3) / 64.0f : (float)(1 + i % 5) / 64.0f);
  replicate(sz, bytes, *copy_bytes, copies);
  return sz;
}
#endif

#ifdef AB_KBLOCK
#define AB_K_BLOCK 1024 /* the driver's default */

/* The operands of one walk of a K-block kernel over a chunk (int4:
 * group, its x group sums xs and, with widens, panels widened beforehand
 * as the driver widens them for tilew, panel_bytes apart). */
typedef struct {
  size_t m, nc, k, x_group, x_chunk, panel_bytes, group;
  int widens;
  qk_dtype dt;
  const char* x;
  char* wide;
  float *acc, *scale, *xs;
} kblock_walk;

#ifdef AB_INT4
/* The driver's walk of one chunk (woq_driver.c, run_kblock_task) with the
 * int4 kernel fn over weight w (packed, or widened with o->widens) and
 * scales and zeros sz, y to c. */
static void walk(void (*fn)(AB_PARAMS), const kblock_walk* o, const uint8_t* w, const char* sz,
                 char* c) {
  const size_t esize = qk_dtype_size(o->dt), ld = (o->nc + 31) / 32 * 32;
  const size_t groups = o->k / o->group, k_block = AB_K_BLOCK / o->group * o->group;
  for (size_t k0 = 0; k0 < o->k; k0 += k_block) {
    const size_t kc = o->k - k0 < k_block ? o->k - k0 : k_block, g0 = k0 / o->group;
    for (size_t r = 0; r < o->m; r += 32)
      fn(o->m - r < 32 ? o->m - r : 32, o->nc, kc, o->group,
         o->x + r / 32 * o->x_group + k0 / 32 * o->x_chunk, o->xs + r * groups + g0, groups, o->dt,
         w + k0 * (o->widens ? 64 : 16), o->panel_bytes, sz + g0 * o->nc * 2 * esize,
         o->nc * 2 * esize, o->acc + r * ld, k0 == 0, k0 + kc >= o->k, NULL, c + r * o->nc * esize,
         (ptrdiff_t)(o->nc * esize));
  }
}
#else
/* The driver's walk of one chunk (woq_driver.c, run_kblock_task) with kernel
 * fn over packed weight w, y to c. */
static void walk(void (*fn)(AB_PARAMS), const kblock_walk* o, const int8_t* w, char* c) {
  const size_t esize = qk_dtype_size(o->dt), ld = (o->nc + 31) / 32 * 32;
  for (size_t k0 = 0; k0 == 0 || k0 < o->k; k0 += AB_K_BLOCK) {
    const size_t kc = o->k - k0 < AB_K_BLOCK ? o->k - k0 : AB_K_BLOCK;
    const size_t widened_stride = ((kc + 1) / 2 + 15) / 16 * 2048; /* whole 16-group tiles */
    for (size_t r = 0; r < o->m; r += 32) {
      const int read_wide = o->widens && r > 0;
      fn(o->m - r < 32 ? o->m - r : 32, o->nc, kc,
         o->x + r / 32 * o->x_group + k0 / 32 * o->x_chunk, o->dt,
         read_wide ? (const int8_t*)o->wide : w + k0 * 32,
         read_wide ? widened_stride : o->panel_bytes, o->widens && r == 0 ? o->wide : NULL,
         o->acc + r * ld, k0 == 0, k0 + kc >= o->k, o->scale, NULL, c + r * o->nc * esize,
         (ptrdiff_t)(o->nc * esize));
    }
  }
}
#endif
#endif

int main(int argc, char** argv) {
#if defined(AB_INT4) && !defined(AB_KBLOCK)
  size_t sizes[4];
  qk_dtype dt;
  const size_t rounds =
      read_args(argc, argv, "int4", "GROUP MR NC KC DT [ROUNDS]", 4, sizes, 1, &dt);
  const size_t group = sizes[0], mr = sizes[1], nc = sizes[2], kc = sizes[3];
  if (!group || kc % group || !mr || mr > 32 || !nc || !rounds) {
    fprintf(stderr, "ukernel_ab: expected GROUP dividing KC, 1 <= MR <= 32, NC, ROUNDS >= 1\n");
    return 2;
  }
  const size_t row_floats = kc + kc / group, panels = (nc + 31) / 32;
  float* x = buffer(mr * row_floats * 4);
  const float* rows[32];
  for (size_t i = 0; i < mr; i++) {
    float* r = x + i * row_floats;
    for (size_t k = 0; k < kc; k++) r[k] = (float)((int)((i * kc + k) * 7 % 13) - 6) / 8.0f;
    for (size_t g = 0; g < kc / group; g++)
      for (size_t k = g * group; k < (g + 1) * group; k++) r[kc + g] += r[k];
    rows[i] = r;
  }
  const size_t copies = weight_copies(), w_bytes = panels * kc * 16;
  const size_t w_stride = copy_stride(w_bytes, copies);
  uint8_t* w = buffer(copies * w_stride);
  for (size_t i = 0; i < w_bytes; i++) w[i] = (uint8_t)(i * 37 + (i >> 7));
  replicate(w, w_bytes, w_stride, copies);
  size_t sz_copy;
  const char* sz = scales_and_zeros(kc / group, nc, dt, copies, &sz_copy);
#define AB_CALL(FN, C, COPY)                                                    \
  FN(mr, nc, kc, group, rows, dt, w + (COPY) * w_stride, sz + (COPY) * sz_copy, \
     nc * 2 * qk_dtype_size(dt), NULL, C, (ptrdiff_t)(nc * qk_dtype_size(dt)))
  const size_t y_bytes = mr * nc * qk_dtype_size(dt);
#elif defined(AB_KBLOCK)
#ifdef AB_INT4
  size_t sizes[5];
  qk_dtype dt;
  const size_t rounds =
      read_args(argc, argv, "int4kblock", "WIDENED GROUP M NC K DT [ROUNDS]", 5, sizes, 1, &dt);
  const size_t widens = sizes[0], group = sizes[1], m = sizes[2], nc = sizes[3], k = sizes[4];
  if (widens > 1 || !group || group % 32 || group > AB_K_BLOCK || !m || !nc || nc % 32 || !k ||
      k % group || !rounds) {
    fprintf(stderr,
            "ukernel_ab: expected WIDENED 0 or 1, GROUP a multiple of 32 up to %d dividing K, "
            "M >= 1, NC a multiple of 32, ROUNDS >= 1\n",
            AB_K_BLOCK);
    return 2;
  }
  const char* kind = "int4kblock";
#else
  size_t sizes[4];
  qk_dtype dt;
  const size_t rounds =
      read_args(argc, argv, "kblock", "WIDENS M NC K DT [ROUNDS]", 4, sizes, 1, &dt);
  const size_t widens = sizes[0], m = sizes[1], nc = sizes[2], k = sizes[3], group = 0;
  if (widens > 1 || !m || !nc || nc % 32 || !k || !rounds) {
    fprintf(stderr,
            "ukernel_ab: expected WIDENS 0 or 1, M >= 1, NC a multiple of 32, K, "
            "ROUNDS >= 1\n");
    return 2;
  }
  const char* kind = "kblock";
#endif
  require_amx(kind);
  const size_t planes = qk_bf16_planes(dt), panels = nc / 32;
  /* int4: 16 bytes per k and panel packed, 64 widened; int8: 32 per k */
  const size_t panel_bytes = group ? k * (widens ? 64 : 16) : 32 * (k + k % 2);
  kblock_walk o = {m, nc, k, 0, planes * 2048, panel_bytes, group, (int)widens, dt};
  o.x_group = (k + 31) / 32 * o.x_chunk;
  o.x = (const char*)packed_bf16_x((m + 31) / 32 * o.x_group);
  o.acc = buffer((m + 31) / 32 * 32 * nc * sizeof(float));
  const size_t copies = weight_copies(), w_bytes = panels * o.panel_bytes;
  const size_t w_stride = copy_stride(w_bytes, copies);
#ifdef AB_INT4
  o.xs = buffer((m + 31) / 32 * 32 * (k / group) * sizeof(float));
  for (size_t i = 0; i < (m + 31) / 32 * 32 * (k / group); i++) o.xs[i] = (float)(i % 9) / 4.0f;
  uint8_t* w = buffer(copies * w_stride);
  if (widens) /* bf16(q), q = 0..15, as the widening writes them */
    for (size_t i = 0; i < w_bytes / 2; i++)
      qk_store_from_f32(w, i, QK_BF16, (float)((i * 37 + (i >> 7)) % 16));
  else
    for (size_t i = 0; i < w_bytes; i++) w[i] = (uint8_t)(i * 37 + (i >> 7));
  replicate(w, w_bytes, w_stride, copies);
  size_t sz_copy;
  const char* sz = scales_and_zeros(k / group, nc, dt, copies, &sz_copy);
#define AB_CALL(FN, C, COPY) walk(FN, &o, w + (COPY) * w_stride, sz + (COPY) * sz_copy, C)
#else
  o.wide = buffer(panels * (AB_K_BLOCK / 2 / 16) * 2048);
  o.scale = buffer(nc * sizeof(float));
  for (size_t n = 0; n < nc; n++) o.scale[n] = (float)(1 + n % 5) / 64.0f;
  int8_t* w = buffer(copies * w_stride);
  for (size_t i = 0; i < w_bytes; i++) w[i] = (int8_t)(i * 37 + (i >> 7));
  replicate(w, w_bytes, w_stride, copies);
#define AB_CALL(FN, C, COPY) walk(FN, &o, w + (COPY) * w_stride, C)
#endif
  const size_t y_bytes = m * nc * qk_dtype_size(dt);
#else
  size_t sizes[5];
  qk_dtype dts[2];
  /* XDT xt: a[0] is one group of packed x^T in DT's bf16 planes (the
   * kernels on the unpacked weight with pack_x) */
  const int packed_xt = argc > 8 && !strcmp(argv[7], "xt");
  if (packed_xt) argv[7] = argv[8];
  const size_t rounds =
      read_args(argc, argv, "int8", "NR KR MR NC KC XDT DT [ROUNDS]", 5, sizes, 2, dts);
  const size_t nr = sizes[0], kr = sizes[1], mr = sizes[2], nc = sizes[3], kc = sizes[4];
  const qk_dtype xdt = dts[0], dt = dts[1];
  if (!nr || !mr || mr > 32 || !nc || !rounds) {
    fprintf(stderr, "ukernel_ab: expected NR >= 1, 1 <= MR <= 32, NC, ROUNDS >= 1\n");
    return 2;
  }
  const void* rows[32];
  if (packed_xt) { /* one group of packed x^T */
    require_amx("xt");
    const size_t planes = qk_bf16_planes(dt);
    rows[0] = packed_bf16_x((kc + 31) / 32 * planes * 2048);
  } else {
    char* x = buffer(mr * kc * qk_dtype_size(xdt));
    for (size_t i = 0; i < mr; i++) {
      for (size_t k = 0; k < kc; k++)
        qk_store_from_f32(x, i * kc + k, xdt, (float)((int)((i * kc + k) * 7 % 13) - 6) / 8.0f);
      rows[i] = x + i * kc * qk_dtype_size(xdt);
    }
  }
  const size_t cols = (nc + nr - 1) / nr * nr, depth = kr ? (kc + kr - 1) / kr * kr : kc;
  const size_t copies = weight_copies(), w_bytes = cols * depth;
  const size_t w_stride = copy_stride(w_bytes, copies);
  /* AB_W_OFFSET=B (0..63): the weight starts B bytes past a 64-byte line,
   * as a caller's row-major array may (KR = 0) */
  const char* offset = getenv("AB_W_OFFSET");
  const size_t w_offset = offset ? strtoul(offset, NULL, 10) : 0;
  if (w_offset > 63 || (w_offset && kr)) {
    fprintf(stderr, "ukernel_ab: AB_W_OFFSET must be 0..63, and only with KR = 0\n");
    return 2;
  }
  int8_t* w = (int8_t*)buffer(copies * w_stride + 64) + w_offset;
  for (size_t i = 0; i < w_bytes; i++) w[i] = (int8_t)(i * 37 + (i >> 7));
  replicate(w, w_bytes, w_stride, copies);
  float* scale = buffer((cols + 32) * 4);
  for (size_t n = 0; n < cols + 32; n++) scale[n] = (float)(1 + n % 5) / 64.0f;
#define AB_CALL(FN, C, COPY)                                      \
  FN(mr, nc, kc, rows, dt, w + (COPY) * w_stride, scale, NULL, C, \
     (ptrdiff_t)(nc * qk_dtype_size(dt)))
  const size_t y_bytes = mr * nc * qk_dtype_size(dt);
#endif
  char* c[2] = {buffer(y_bytes), buffer(y_bytes)};
  double* t[2] = {buffer(rounds * sizeof(double)), buffer(rounds * sizeof(double))};
  const qk_fpenv saved = qk_fpenv_enter();
  size_t calls = 1; /* per sample: about 100 microseconds of kernel */
  for (;;) {
    const double t0 = thread_seconds();
    for (size_t q = 0; q < calls; q++) AB_CALL(qk_ab_a, c[0], q % copies);
    if (thread_seconds() - t0 > 1e-4 || calls >= (1u << 20)) break;
    calls *= 2;
  }
  calls = (calls + copies - 1) / copies * copies; /* each sample reads every copy once or more */
  for (size_t r = 0; r < rounds; r++)
    for (int v = 0; v < 2; v++) {
      const double t0 = thread_seconds();
      for (size_t q = 0, copy = 0; q < calls; q++, copy = (copy + 1) % copies) {
        if (v)
          AB_CALL(qk_ab_b, c[1], copy);
        else
          AB_CALL(qk_ab_a, c[0], copy);
      }
      t[v][r] = (thread_seconds() - t0) / (double)calls;
    }
  qk_fpenv_leave(saved);
  for (int v = 0; v < 2; v++) qsort(t[v], rounds, sizeof(double), by_value);
  const size_t mid = rounds / 2;
  printf("a: min %.2f us  median %.2f us\n", 1e6 * t[0][0], 1e6 * t[0][mid]);
  printf("b: min %.2f us  median %.2f us\n", 1e6 * t[1][0], 1e6 * t[1][mid]);
  printf("b / a: min %.3f  median %.3f  (%zu rounds of %zu calls each, alternating, %zu %s)\n",
         t[1][0] / t[0][0], t[1][mid] / t[0][mid], rounds, calls, copies,
         copies == 1 ? "weight" : "weight copies in turn");
  const int same = !memcmp(c[0], c[1], y_bytes);
  printf("bits: %s\n", same ? "the same" : "DIFFERENT");
  return 0;
}
