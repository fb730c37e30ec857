/* Batched float64 products of small square matrices on the CPU: the 2r × 2r core of the low-rank
 * engines of orthogonal self-attention (Zhang & Martens, arXiv 2602.05996; the exponential of the
 * skew-symmetric core by scaling and squaring, osa_lab/ops/expm/core.py, docs/design.md §2).
 *
 *   osa_core_bmm   C = alpha · A B (+ X), for B matrices of n × n, contiguous, row-major.
 *
 * The reference beside it is torch.baddbmm / torch.matmul (tests/ops/test_cpu_core_products.py
 * compares them, and both against exact float64 sums of small integers). Per matrix, a panel of
 * CORE_ROWS rows of A is packed k-major (CORE_ROWS consecutive doubles per k, broadcast), and a
 * register block of CORE_ROWS rows × CORE_VECS vectors of C is summed over k in registers; the
 * batch is split over threads (threads.h). Built at first use by osa_lab/ops/cpu/build.py; IEEE arithmetic.
 */
#include <stdint.h>
#include <stdlib.h>

#include "threads.h"

/* Register block per build (-D overrides it, for tuning). */
#if defined(__AVX512F__)
#define DW 8
#define CORE_ROWS_BUILD 8
#define CORE_VECS_BUILD 3
#else
#define DW 4
#define CORE_ROWS_BUILD 4
#define CORE_VECS_BUILD 3
#endif
#ifndef CORE_ROWS
#define CORE_ROWS CORE_ROWS_BUILD
#endif
#ifndef CORE_VECS
#define CORE_VECS CORE_VECS_BUILD
#endif
/* The Python side passes sizes that are multiples of 8 (core_kernels.SIZE_MULTIPLE). */
#if CORE_ROWS < 1 || 8 % CORE_ROWS || CORE_VECS < 1 || CORE_VECS > 8
#error "register blocks: CORE_ROWS must divide 8; CORE_VECS 1-8"
#endif

typedef double dvec __attribute__((vector_size(8 * DW)));
typedef double dvecu __attribute__((vector_size(8 * DW), aligned(8)));
#define DLD(p) (*(const dvecu *)(p))
#define DST(p, x) (*(dvecu *)(p) = (x))

#define DEFINE_CORE_BLOCK(NAME, NV)                                                                \
    static inline void NAME(int n, const double *at, const double *b, double *c, double alpha,    \
                            const double *x)                                                       \
    {                                                                                              \
        dvec acc[CORE_ROWS][NV];                                                                   \
        _Pragma("GCC unroll 8") for (int r = 0; r < CORE_ROWS; ++r)                                \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) acc[r][v] = (dvec){0};            \
        for (int k = 0; k < n; ++k, at += CORE_ROWS, b += n) {                                     \
            dvec bv[NV];                                                                           \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) bv[v] = DLD(b + DW * v);          \
            _Pragma("GCC unroll 8") for (int r = 0; r < CORE_ROWS; ++r) {                          \
                const double s = at[r];                                                            \
                _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) acc[r][v] += s * bv[v];       \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int r = 0; r < CORE_ROWS; ++r)                                \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) {                                 \
                dvec o = alpha * acc[r][v];                                                        \
                if (x) o += DLD(x + (int64_t)r * n + DW * v);                                      \
                DST(c + (int64_t)r * n + DW * v, o);                                               \
            }                                                                                      \
    }

DEFINE_CORE_BLOCK(core_block_full, CORE_VECS)
DEFINE_CORE_BLOCK(core_block_2, 2)
DEFINE_CORE_BLOCK(core_block_1, 1)

typedef struct {
    int n, first, last;
    const double *a, *b, *x;
    double *c, alpha;
    int failed;
} core_job_t;

/* One matrix: C = alpha A B (+ X); at is a CORE_ROWS × n workspace. */
static void core_one(const core_job_t *job, int64_t off, double *at)
{
    const int n = job->n, nv = n / DW;
    const double *a = job->a + off, *b = job->b + off, *x = job->x ? job->x + off : NULL;
    double *c = job->c + off;
    for (int i = 0; i < n; i += CORE_ROWS) {
        for (int k = 0; k < n; ++k)
            for (int r = 0; r < CORE_ROWS; ++r) at[k * CORE_ROWS + r] = a[(int64_t)(i + r) * n + k];
        const double *xi = x ? x + (int64_t)i * n : NULL;
        double *ci = c + (int64_t)i * n;
        int v = 0;
        for (; v + CORE_VECS <= nv; v += CORE_VECS)
            core_block_full(n, at, b + DW * v, ci + DW * v, job->alpha, xi ? xi + DW * v : NULL);
        if (v + 2 <= nv) { core_block_2(n, at, b + DW * v, ci + DW * v, job->alpha, xi ? xi + DW * v : NULL); v += 2; }
        if (v < nv) core_block_1(n, at, b + DW * v, ci + DW * v, job->alpha, xi ? xi + DW * v : NULL);
    }
}

static void *core_range(void *arg)
{
    core_job_t *job = arg;
    double *at = malloc(sizeof(double) * CORE_ROWS * job->n);
    if (!at) {
        job->failed = 1;
        return NULL;
    }
    for (int m = job->first; m < job->last; ++m) core_one(job, (int64_t)m * job->n * job->n, at);
    free(at);
    return NULL;
}

/* C = alpha · A B (+ X) for `batch` contiguous row-major n × n float64 matrices; n a multiple of
 * CORE_ROWS and of the vector width; C must not overlap A or B (X may be C itself). Returns 0, 1
 * when a thread found no memory for its workspace, or 2 on bad arguments. */
int osa_core_bmm(int batch, int n, const double *a, const double *b, const double *x, double *c, double alpha,
                 int nthreads)
{
    if (batch < 0 || n < CORE_ROWS || n % CORE_ROWS || n % DW || !a || !b || !c) return 2;
    if (batch == 0) return 0;
    const int nt = clamp_threads(nthreads, batch);
    core_job_t jobs[OSA_MAX_THREADS];
    for (int t = 0; t < nt; ++t) {
        core_job_t job = {n, (int)((int64_t)batch * t / nt), (int)((int64_t)batch * (t + 1) / nt), a, b, x, c, alpha, 0};
        jobs[t] = job;
    }
    run_threads(core_range, jobs, sizeof(core_job_t), nt);
    int failed = 0;
    for (int t = 0; t < nt; ++t) failed |= jobs[t].failed;
    return failed ? 1 : 0;
}

/* Doubles per hardware vector of this build: 8 with AVX-512, 4 with AVX2 and FMA; 0 for a build
 * without either (the Python side keeps torch's products there). */
int osa_core_vector_doubles(void)
{
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    return DW;
#else
    return 0;
#endif
}
