/* The small-N Chebyshev (Jacobi–Anger) action exp(S) V of orthogonal self-attention on the CPU,
 * float32, forward and backward fused per matrix (Zhang & Martens, arXiv 2602.05996; the
 * expansion and its adjoint as in osa_lab/ops/expm/chebyshev.py, docs/design.md §1–§2).
 *
 * The reference beside it is osa_lab.ops.expm.chebyshev._chebyshev_forward / _chebyshev_backward
 * (batched torch products); tests/test_cpu_kernels.py compares the two, and both against float64.
 *
 * Per matrix, for S = c (q kᵀ − k qᵀ), st = Sᵀ = c (P − Pᵀ) with P = k qᵀ (exactly skew),
 * X = S/ρ and Z_k = W_kᵀ (d×N):
 *   prepare   st, and per matrix a bound of ‖S‖₂: min((‖S²‖_F²/2)^{1/4}, ‖S‖_F/√2), with the N×N×N
 *             product S² formed only for the matrices whose ‖S‖_F/√2 could exceed the largest
 *             bound of the batch (the caller takes the batch's largest; see select_squares);
 *   forward   Z_0 = Vᵀ, Z_1 = Z_0 Xᵀ, Z_{k+1} = 2 Z_k Xᵀ + Z_{k−1},  Yᵀ = Σ_k a_k Z_k;
 *   backward  (transposed) Ḡ_mᵀ = a_m Gᵀ, Ḡ_kᵀ = a_k Gᵀ + 2 Ḡ_{k+1}ᵀ X + Ḡ_{k+2}ᵀ (X = −st/ρ),
 *             ∂L/∂V = Ḡ_0, ∂L/∂X = Ḡ_1 W_0ᵀ + 2 Σ_{k=1}^{m−1} Ḡ_{k+1} W_kᵀ (one product of inner
 *             size m·d), ρA = ∂L/∂X − (∂L/∂X)ᵀ, then with cc = c/ρ:
 *             ∂L/∂q = cc A k, ∂L/∂k = −cc A q, ∂L/∂c = ⟨A k, q⟩/ρ.
 * Inputs and outputs of shape (…, N, r) or (…, N, d) are read and written in place in the
 * caller's layout (a view's per-matrix element offsets and its row and column strides), so the
 * head-split views of a layer need no packing pass.
 * A matrix and its m + 1 iterates fit in the first cache levels at the N ≤ 4r where the action is
 * used, so each matrix runs start to finish in one pass over its own data: no N×d intermediate
 * goes to memory between products, and there is one call per batch instead of ~3m library calls.
 *
 * Layout inside, and of st between the calls: rows padded with zeros to a multiple of 8 floats
 * (Np = ⌈N⌉₈, Dp = ⌈d⌉₈; st is written so by prepare and read in place by the others), so the
 * products run on 8-float vectors (GCC/Clang vector extensions; AVX2/AVX-512 with -march=native).
 * The padding is zero and stays zero, so it changes no sum. Built at first use by
 * osa_lab/ops/cpu/build.py; IEEE arithmetic (no -ffast-math), so NaN and Inf propagate.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "threads.h"

typedef float v8 __attribute__((vector_size(32)));

#define LD(p) (*(const v8 *)(p))
#define ST(p, x) (*(v8 *)(p) = (x))

static inline int up8(int n) { return (n + 7) & ~7; }

/* C[M × 8·NV] += alpha · A · B: A's entry (i, k) at A[i·lda + k·sak], read as scalars; B (K rows)
 * and C as 8-float vectors, row strides ldb and ldc (multiples of 8 floats, 32-byte aligned).
 * Register block: MR rows × NR vectors (MR = 8 with AVX-512's 32 vector registers, else 4),
 * summed over k before alpha and C are applied. */
#ifndef MR /* (-D overrides it, for tuning) */
#if defined(__AVX512F__)
#define MR 8
#else
#define MR 4
#endif
#endif
#if MR < 1 || MR > 16
#error "register blocks: MR must be 1-16"
#endif

#define DEFINE_BLOCK(NAME, ROWS, NR)                                                               \
    static inline void NAME(int K, const float *A, int lda, int sak, float alpha,  \
                                           const float *B, int ldb, float *C, int ldc)              \
    {                                                                                              \
        v8 acc[ROWS][NR];                                                                          \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r)                                     \
            _Pragma("GCC unroll 3") for (int n = 0; n < NR; ++n) acc[r][n] = (v8){0};              \
        for (int k = 0; k < K; ++k, B += ldb) {                                                   \
            v8 b[NR];                                                                              \
            _Pragma("GCC unroll 3") for (int n = 0; n < NR; ++n) b[n] = LD(B + 8 * n);             \
            _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r) {                               \
                float s = A[(int64_t)r * lda + (int64_t)k * sak];                                  \
                _Pragma("GCC unroll 3") for (int n = 0; n < NR; ++n) acc[r][n] += s * b[n];       \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r)                                     \
            _Pragma("GCC unroll 3") for (int n = 0; n < NR; ++n) {                                 \
                float *cp = C + (int64_t)r * ldc + 8 * n;                                          \
                ST(cp, LD(cp) + alpha * acc[r][n]);                                                \
            }                                                                                      \
    }

DEFINE_BLOCK(block_mr_3, MR, 3)
DEFINE_BLOCK(block_mr_2, MR, 2)
DEFINE_BLOCK(block_mr_1, MR, 1)
DEFINE_BLOCK(block_1x3, 1, 3)
DEFINE_BLOCK(block_1x2, 1, 2)
DEFINE_BLOCK(block_1x1, 1, 1)


/* One panel of rows starting at row i: blocks of 3, then 2, then 1 vectors across its columns. */
#define ROW_PANEL(BLOCK3, BLOCK2, BLOCK1)                                                          \
    do {                                                                                           \
        const float *a = A + (int64_t)i * lda;                                                     \
        float *c = C + (int64_t)i * ldc;                                                           \
        int v = 0;                                                                                 \
        for (; v + 3 <= NV; v += 3) BLOCK3(K, a, lda, sak, alpha, B + 8 * v, ldb, c + 8 * v, ldc);  \
        if (v + 2 <= NV) { BLOCK2(K, a, lda, sak, alpha, B + 8 * v, ldb, c + 8 * v, ldc); v += 2; } \
        if (v < NV) BLOCK1(K, a, lda, sak, alpha, B + 8 * v, ldb, c + 8 * v, ldc);                 \
    } while (0)

static void gemm_bcast(int M, int K, int NV, const float *A, int lda, int sak, float alpha,
                       const float *B, int ldb, float *C, int ldc)
{
    int i = 0;
    for (; i + MR <= M; i += MR) ROW_PANEL(block_mr_3, block_mr_2, block_mr_1);
    for (; i < M; ++i) ROW_PANEL(block_1x3, block_1x2, block_1x1);
}

/* A strided (B, rows, cols) view: element (b, i, j) at base[offs[b] + i·rs + j·cs]. */
typedef struct {
    float *base;
    const int64_t *offs;
    int64_t rs, cs;
} view_t;

/* Software prefetch of the first cache line of each row of matrix b + PREFETCH_AHEAD of a strided
 * view (the whole row at a head width of 16 floats), while matrix b is computed: a head-split
 * view's rows are a few hundred bytes apart and each matrix takes every heads-th cache line.
 * Timed against a build without it, the gain was not resolved (BENCHMARKS.md, the small-N
 * action's prefetch). write = 1 for an output's rows. -DPREFETCH_AHEAD=0 leaves it out. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2
#endif
#if PREFETCH_AHEAD < 0 || PREFETCH_AHEAD > 8
#error "PREFETCH_AHEAD must be 0-8"
#endif

static inline void prefetch_rows(const view_t *t, int b, int last, int rows, int write)
{
    if (PREFETCH_AHEAD == 0 || !t->base || b + PREFETCH_AHEAD >= last) return;
    for (int i = 0; i < rows; ++i) {
        const float *row = t->base + t->offs[b + PREFETCH_AHEAD] + (int64_t)i * t->rs;
        if (write) __builtin_prefetch(row, 1, 3);
        else __builtin_prefetch(row, 0, 3);
    }
}

static inline float vget(const view_t *t, int b, int i, int j) { return t->base[t->offs[b] + i * t->rs + j * t->cs]; }
static inline void vset(const view_t *t, int b, int i, int j, float x) { t->base[t->offs[b] + i * t->rs + j * t->cs] = x; }

enum { PREPARE, SQUARES, FORWARD, BACKWARD };

typedef struct {
    int kind, B, N, d, r, m, nthreads;
    view_t q, k, v, g, y, gq, gk, gv;
    const float *c;       /* per-matrix c (prepare) or c/ρ (backward) */
    const double *coef;   /* a_0 … a_m */
    float rinv;           /* 1/ρ */
    float *st, *zs, *gc;
    double *bound, *y_sq, *v_sq;
    double small;         /* prepare: below this (‖S²‖_F²/2)^{1/4} loses its digits; ‖S‖_F/√2 is taken */
    const int *order;     /* prepare's second phase: the matrices to square, by position */
    int failed;
} job_t;

typedef struct {
    job_t *job;
    int first, last;
} range_t;

static size_t workspace_floats(const job_t *job)
{
    const size_t N = job->N, Np = up8(job->N), sz = (size_t)up8(job->d) * Np, Rp = up8(2 * job->r);
    switch (job->kind) {
    case PREPARE: return (size_t)job->r * Np + N * Np;
    case SQUARES: return N * Np;
    case FORWARD: return 2 * sz;
    default: return 2 * N * Np + sz + (size_t)(job->m + 1) * sz + 2 * N * Rp;
    }
}

/* First phase: st = c (P − Pᵀ), P = k qᵀ, in rows of Np floats (zero beyond column N), and
   ‖st‖_F² (float64); bound = ‖S‖_F/√2 for now. */
static void prepare_range(job_t *job, int first, int last, float *work)
{
    const int N = job->N, r = job->r, Np = up8(N);
    float *qt = work, *p = qt + (int64_t)r * Np;
    for (int b = first; b < last; ++b) {
        prefetch_rows(&job->q, b, last, N, 0);
        prefetch_rows(&job->k, b, last, N, 0);
        for (int l = 0; l < r; ++l) {
            for (int j = 0; j < N; ++j) qt[(int64_t)l * Np + j] = vget(&job->q, b, j, l);
            memset(qt + (int64_t)l * Np + N, 0, sizeof(float) * (Np - N));
        }
        memset(p, 0, sizeof(float) * N * Np);  /* P = k qᵀ, read from k's layout in place */
        gemm_bcast(N, r, Np / 8, job->k.base + job->k.offs[b], (int)job->k.rs, (int)job->k.cs, 1.0f, qt, Np, p, Np);
        const float cb = job->c[b];
        float *st = job->st + (int64_t)b * N * Np;
        double fro[4] = {0.0, 0.0, 0.0, 0.0};  /* four partial sums: no one chain of dependent adds */
        for (int i = 0; i < N; ++i) {
            for (int j = 0; j < N; ++j) {
                float x = cb * (p[(int64_t)i * Np + j] - p[(int64_t)j * Np + i]);
                st[(int64_t)i * Np + j] = x;
                fro[j & 3] += (double)x * x;
            }
            memset(st + (int64_t)i * Np + N, 0, sizeof(float) * (Np - N));
        }
        job->bound[b] = sqrt(((fro[0] + fro[1]) + (fro[2] + fro[3])) * 0.5);
    }
}

/* Second phase, for the matrices order[first … last): S² in float32 like the reference, and the
   bound min((‖S²‖_F²/2)^{1/4}, ‖S‖_F/√2), or ‖S‖_F/√2 where the first is below job->small. */
static void squares_range(job_t *job, int first, int last, float *work)
{
    const int N = job->N, Np = up8(N);
    float *s2 = work;
    for (int o = first; o < last; ++o) {
        const int b = job->order[o];
        const float *st = job->st + (int64_t)b * N * Np;
        memset(s2, 0, sizeof(float) * N * Np);
        gemm_bcast(N, N, Np / 8, st, Np, 1, 1.0f, st, Np, s2, Np);
        double d2[4] = {0.0, 0.0, 0.0, 0.0};
        for (int i = 0; i < N; ++i)
            for (int j = 0; j < N; ++j) {
                double x = s2[(int64_t)i * Np + j];
                d2[j & 3] += x * x;
            }
        const double fourth = sqrt(sqrt(((d2[0] + d2[1]) + (d2[2] + d2[3])) * 0.5));
        if (!(fourth < job->small) && fourth < job->bound[b]) job->bound[b] = fourth;
    }
}

static void forward_range(job_t *job, int first, int last, float *work)
{
    const int N = job->N, d = job->d, m = job->m, Np = up8(N), Dp = up8(d), sz = Dp * Np;
    float *acc = work, *spare = acc + sz;
    for (int b = first; b < last; ++b) {
        const float *xw = job->st + (int64_t)b * N * Np;  /* padded rows: read in place */
        prefetch_rows(&job->v, b, last, N, 0);
        prefetch_rows(&job->y, b, last, N, 1);
        float *z = job->zs + (int64_t)b * m * sz;
        memset(z, 0, sizeof(float) * sz);
        double vs[4] = {0.0, 0.0, 0.0, 0.0};  /* four partial sums, as in prepare */
        for (int i = 0; i < N; ++i)
            for (int c = 0; c < d; ++c) {
                float t = vget(&job->v, b, i, c);
                z[(int64_t)c * Np + i] = t;
                vs[c & 3] += (double)t * t;
            }
        const float a0 = (float)job->coef[0];
        for (int i = 0; i < sz; ++i) acc[i] = a0 * z[i];
        for (int k = 0; k < m; ++k) {
            const float *cur = z + (int64_t)k * sz;
            float *nxt = k + 1 < m ? z + (int64_t)(k + 1) * sz : spare;
            if (k) memcpy(nxt, z + (int64_t)(k - 1) * sz, sizeof(float) * sz);
            else memset(nxt, 0, sizeof(float) * sz);
            gemm_bcast(Dp, N, Np / 8, cur, Np, 1, k ? 2.0f * job->rinv : job->rinv, xw, Np, nxt, Np);
            const float ck = (float)job->coef[k + 1];
            for (int i = 0; i < sz; ++i) acc[i] += ck * nxt[i];
        }
        double ys[4] = {0.0, 0.0, 0.0, 0.0};
        for (int i = 0; i < N; ++i)
            for (int c = 0; c < d; ++c) {
                float t = acc[(int64_t)c * Np + i];
                vset(&job->y, b, i, c, t);
                ys[c & 3] += (double)t * t;
            }
        job->y_sq[b] = (ys[0] + ys[1]) + (ys[2] + ys[3]);
        job->v_sq[b] = (vs[0] + vs[1]) + (vs[2] + vs[3]);
    }
}

static void backward_range(job_t *job, int first, int last, float *work)
{
    const int N = job->N, d = job->d, r = job->r, m = job->m, Np = up8(N), Dp = up8(d), sz = Dp * Np;
    const int Rp = up8(2 * r);
    float *xw = work, *gt = xw + (int64_t)N * Np, *gxw = gt + sz, *gb = gxw + (int64_t)N * Np;
    float *up = gb + (int64_t)(m + 1) * sz, *au = up + (int64_t)N * Rp;
    const int need_x = job->gq.base || job->gk.base || job->gc;
    for (int b = first; b < last; ++b) {
        const float *x = job->st + (int64_t)b * N * Np;  /* padded rows: read in place */
        prefetch_rows(&job->g, b, last, N, 0);
        prefetch_rows(&job->gv, b, last, N, 1);
        if (need_x) {
            prefetch_rows(&job->q, b, last, N, 0);
            prefetch_rows(&job->k, b, last, N, 0);
            prefetch_rows(&job->gq, b, last, N, 1);
            prefetch_rows(&job->gk, b, last, N, 1);
        }
        const float *z = job->zs + (int64_t)b * m * sz;
        memset(gt, 0, sizeof(float) * sz);
        for (int i = 0; i < N; ++i)
            for (int c = 0; c < d; ++c) gt[(int64_t)c * Np + i] = vget(&job->g, b, i, c);
        float *top = gb + (int64_t)m * sz;  /* gb[k] = Ḡ_kᵀ, k = 0 … m */
        const float am = (float)job->coef[m];
        for (int i = 0; i < sz; ++i) top[i] = am * gt[i];
        for (int k = m - 1; k >= 0; --k) {
            float *o = gb + (int64_t)k * sz;
            const float ak = (float)job->coef[k];
            if (k + 2 <= m) {
                const float *after = gb + (int64_t)(k + 2) * sz;
                for (int i = 0; i < sz; ++i) o[i] = ak * gt[i] + after[i];
            } else {
                for (int i = 0; i < sz; ++i) o[i] = ak * gt[i];
            }
            /* Ḡ_{k+1}ᵀ X = −Ḡ_{k+1}ᵀ st / ρ */
            gemm_bcast(Dp, N, Np / 8, gb + (int64_t)(k + 1) * sz, Np, 1, k ? -2.0f * job->rinv : -job->rinv, x, Np, o, Np);
        }
        if (job->gv.base)
            for (int i = 0; i < N; ++i)
                for (int c = 0; c < d; ++c) vset(&job->gv, b, i, c, gb[(int64_t)c * Np + i]);
        if (!need_x) continue;
        /* ∂L/∂X = Σ_k w_k Ḡ_{k+1} Z_k: blocks 1 … m of gb against Z_0 … Z_{m−1}, one product of
           inner size m·Dp with weight 2 after halving block 1 (w_0 = 1) */
        for (int i = 0; i < sz; ++i) gb[sz + i] *= 0.5f;
        memset(gxw, 0, sizeof(float) * N * Np);
        gemm_bcast(N, m * Dp, Np / 8, gb + sz, 1, Np, 2.0f, z, Np, gxw, Np);
        /* ρA = gx − gxᵀ */
        for (int i = 0; i < N; ++i)
            for (int j = 0; j < N; ++j) xw[(int64_t)i * Np + j] = gxw[(int64_t)i * Np + j] - gxw[(int64_t)j * Np + i];
        for (int i = 0; i < N; ++i) {  /* U = [k q], padded */
            float *row = up + (int64_t)i * Rp;
            for (int l = 0; l < r; ++l) {
                row[l] = vget(&job->k, b, i, l);
                row[r + l] = vget(&job->q, b, i, l);
            }
            memset(row + 2 * r, 0, sizeof(float) * (Rp - 2 * r));
        }
        memset(au, 0, sizeof(float) * N * Rp);
        gemm_bcast(N, N, Rp / 8, xw, Np, 1, 1.0f, up, Rp, au, Rp);  /* ρ [A k  A q] */
        const float cc = job->c[b];
        double dot = 0.0;
        for (int i = 0; i < N; ++i) {
            const float *row = au + (int64_t)i * Rp, *urow = up + (int64_t)i * Rp;
            for (int l = 0; l < r; ++l) {
                if (job->gq.base) vset(&job->gq, b, i, l, cc * row[l]);
                if (job->gk.base) vset(&job->gk, b, i, l, -cc * row[r + l]);
                dot += (double)row[l] * urow[r + l];
            }
        }
        if (job->gc) job->gc[b] = (float)(dot * job->rinv);
    }
}

static void *run_range(void *arg)
{
    range_t *rg = (range_t *)arg;
    job_t *job = rg->job;
    size_t bytes = (workspace_floats(job) * sizeof(float) + 63) / 64 * 64;
    float *work = aligned_alloc(64, bytes);
    if (!work) {
        __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    if (job->kind == PREPARE) prepare_range(job, rg->first, rg->last, work);
    else if (job->kind == SQUARES) squares_range(job, rg->first, rg->last, work);
    else if (job->kind == FORWARD) forward_range(job, rg->first, rg->last, work);
    else backward_range(job, rg->first, rg->last, work);
    free(work);
    return NULL;
}

/* Split units first … last over nthreads (threads.h): matrices, or positions in job->order. */
static void run_span(job_t *job, int first, int last)
{
    const int nt = clamp_threads(job->nthreads, last - first);
    range_t ranges[OSA_MAX_THREADS];
    for (int t = 0; t < nt; ++t) {
        ranges[t].job = job;
        ranges[t].first = first + (int)((int64_t)(last - first) * t / nt);
        ranges[t].last = first + (int)((int64_t)(last - first) * (t + 1) / nt);
    }
    run_threads(run_range, ranges, sizeof(range_t), nt);
}

/* The whole batch. 0 on success, 1 when memory for a workspace could not be had, 2 on bad
 * arguments. */
static int run(job_t *job)
{
    if (job->B < 0 || job->N < 1 || job->d < 1 || job->r < 0 || job->m < 0) return 2;
    if (job->B == 0) return 0;
    run_span(job, 0, job->B);
    return job->failed ? 1 : 0;
}

typedef struct {
    double key;
    int index;
} keyed_t;

static int by_key_descending(const void *a, const void *b)
{
    const double x = ((const keyed_t *)a)->key, y = ((const keyed_t *)b)->key;
    return (x < y) - (x > y);
}

/* Tighten job->bound (‖S‖_F/√2 from the first phase) with S² where it can change the batch's
 * largest bound, and nowhere else. Matrices go in decreasing order of ‖S‖_F: one at a time on
 * one thread, else in spans of nthreads, 2·nthreads, … (each span split over the threads).
 * Once the next matrix's ‖S‖_F/√2 is at most the largest bound so far, no later matrix can
 * raise it (each one's bound is at most its ‖S‖_F/√2), so they keep ‖S‖_F/√2: a valid bound
 * of each, and the batch's largest is what squaring every matrix gives. A matrix whose ‖S‖_F is not finite keeps it (NaN or
 * Inf decides the largest anyway). Writes the number squared to *squared. */
static int select_squares(job_t *job, int *squared)
{
    const int B = job->B;
    keyed_t *keyed = malloc(sizeof(keyed_t) * (size_t)(B > 0 ? B : 1));
    int *order = malloc(sizeof(int) * (size_t)(B > 0 ? B : 1));
    if (!keyed || !order) {
        free(keyed);
        free(order);
        return 1;
    }
    int finite = 0;
    for (int b = 0; b < B; ++b)
        if (isfinite(job->bound[b])) keyed[finite].key = job->bound[b], keyed[finite++].index = b;
    qsort(keyed, (size_t)finite, sizeof(keyed_t), by_key_descending);
    for (int o = 0; o < finite; ++o) order[o] = keyed[o].index;
    job->order = order;
    job->kind = SQUARES;
    double largest = -1.0;
    const int nt = clamp_threads(job->nthreads, finite);
    int done = 0, span = nt;
    while (done < finite && keyed[done].key > largest && !job->failed) {
        const int last = done + span < finite ? done + span : finite;
        run_span(job, done, last);
        for (int o = done; o < last; ++o)
            if (job->bound[order[o]] > largest) largest = job->bound[order[o]];
        done = last;
        if (nt > 1) span *= 2;  /* fewer parallel regions; one thread checks after every matrix */
    }
    *squared = done;
    free(keyed);
    free(order);
    return job->failed ? 1 : 0;
}

static view_t view(float *base, const int64_t *offs, int64_t rs, int64_t cs)
{
    view_t t = {base, offs, rs, cs};
    return t;
}

/* st (B×N×Np, rows padded with zeros to Np = ⌈N⌉₈ floats) = c (k qᵀ − q kᵀ) for q, k (B, N, r)
 * views and c (B); bound (B, float64) a bound of
 * each ‖S_b‖₂ before the caller's rounding allowance: min((‖S²‖_F²/2)^{1/4}, ‖S‖_F/√2), or
 * ‖S‖_F/√2 below `small` or where select_squares shows S² cannot change the largest; *squared
 * (when not NULL) is the number of matrices squared. */
int osa_cheb_prepare(int B, int N, int r, float *q, const int64_t *q_offs, int64_t q_rs, int64_t q_cs,
                     float *k, const int64_t *k_offs, int64_t k_rs, int64_t k_cs, const float *c,
                     float *st, double *bound, double small, int *squared, int nthreads)
{
    job_t job = {0};
    job.kind = PREPARE; job.B = B; job.N = N; job.d = 1; job.r = r; job.m = 0; job.nthreads = nthreads;
    job.q = view(q, q_offs, q_rs, q_cs); job.k = view(k, k_offs, k_rs, k_cs);
    job.c = c; job.st = st; job.bound = bound; job.small = small;
    if (r < 1) return 2;
    int code = run(&job), count = 0;
    if (code == 0) code = select_squares(&job, &count);
    if (squared) *squared = count;
    return code;
}

/* y = Σ a_k W_k ≈ exp(S) v for the prepared st and coef = a_0 … a_m, rinv = 1/ρ; v and y (B, N, d)
 * views; zs (B×m×Dp×Np) keeps Z_0 … Z_{m−1} for the backward; y_sq, v_sq = Σ y², Σ v² per matrix. */
int osa_cheb_forward(int B, int N, int d, int m, const float *st, float *v, const int64_t *v_offs,
                     int64_t v_rs, int64_t v_cs, const double *coef, float rinv, float *zs, float *y,
                     const int64_t *y_offs, int64_t y_rs, int64_t y_cs, double *y_sq, double *v_sq,
                     int nthreads)
{
    job_t job = {0};
    job.kind = FORWARD; job.B = B; job.N = N; job.d = d; job.r = 0; job.m = m; job.nthreads = nthreads;
    job.st = (float *)st; job.v = view(v, v_offs, v_rs, v_cs); job.coef = coef; job.rinv = rinv;
    job.zs = zs; job.y = view(y, y_offs, y_rs, y_cs); job.y_sq = y_sq; job.v_sq = v_sq;
    if (m < 1) return 2;
    return run(&job);
}

/* The adjoint for g = ∂L/∂y: writes gv = ∂L/∂v, gq = ∂L/∂q, gk = ∂L/∂k (views; a NULL base skips
 * one) and gc = ∂L/∂c (B floats; NULL skips it); cc = c/ρ per matrix. */
int osa_cheb_backward(int B, int N, int d, int r, int m, const float *st, const float *zs,
                      const double *coef, float rinv, const float *cc,
                      float *g, const int64_t *g_offs, int64_t g_rs, int64_t g_cs,
                      float *q, const int64_t *q_offs, int64_t q_rs, int64_t q_cs,
                      float *k, const int64_t *k_offs, int64_t k_rs, int64_t k_cs,
                      float *gv, const int64_t *gv_offs, int64_t gv_rs, int64_t gv_cs,
                      float *gq, const int64_t *gq_offs, int64_t gq_rs, int64_t gq_cs,
                      float *gk, const int64_t *gk_offs, int64_t gk_rs, int64_t gk_cs,
                      float *gc, int nthreads)
{
    job_t job = {0};
    job.kind = BACKWARD; job.B = B; job.N = N; job.d = d; job.r = r; job.m = m; job.nthreads = nthreads;
    job.st = (float *)st; job.zs = (float *)zs; job.coef = coef; job.rinv = rinv; job.c = cc;
    job.g = view(g, g_offs, g_rs, g_cs); job.q = view(q, q_offs, q_rs, q_cs); job.k = view(k, k_offs, k_rs, k_cs);
    job.gv = view(gv, gv_offs, gv_rs, gv_cs); job.gq = view(gq, gq_offs, gq_rs, gq_cs);
    job.gk = view(gk, gk_offs, gk_rs, gk_cs); job.gc = gc;
    if (m < 1 || r < 1) return 2;
    return run(&job);
}
