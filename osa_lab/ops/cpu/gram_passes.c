/* The token passes of the Gram engine of orthogonal self-attention on the CPU, float32
 * (Zhang & Martens, arXiv 2602.05996; exp(S) V = V + U C with U = [q k], the engine of
 * osa_lab/ops/expm/gram.py, docs/design.md §1–§2).
 *
 * Two kinds of pass, each one call per batch with the work split over threads:
 *   osa_gram_tn   out_a = X_aᵀ [X_lo_a … X_{n−1}] summed over the N tokens, for a = 0 … nA−1:
 *                 the Gram matrix G = UᵀU and P = UᵀV in one pass over q, k, v (X = (q, k, v),
 *                 out_0 = qᵀ[q k v], out_1 = kᵀ[k v]), or gC = Uᵀ gY in the backward; of a
 *                 symmetric block X_aᵀX_a the tiles on and above the diagonal are computed and
 *                 the lower triangle copied from the upper (exactly symmetric);
 *   osa_gram_nn   Y = X + Σ_s A_s C_s over up to four token views A_s (N × w_s) and small
 *                 per-matrix C_s (w_s × d): the output Y = V + q C_q + k C_k (and ‖V‖_F², which
 *                 the output check needs, from the same read of V), and the backward's ∂L/∂V,
 *                 ∂L/∂q and ∂L/∂k.
 * The references beside them are the batched torch products of osa_lab/ops/expm/gram.py
 * (block_gram, gram_output and _GramAction.backward); tests/ops/test_cpu_gram_kernels.py compares
 * them, and both against float64.
 *
 * Token views are read and written in the caller's layout (per-matrix element offsets and a row
 * stride; columns contiguous), so a layer's head-split views need no packing pass. Every width
 * (r, d) is a multiple of 16, so rows are whole vectors. Register blocks: the transposed
 * product keeps TN_ROWS columns of X_a × TN_VECS vectors of the other side in registers while it
 * runs over a chunk of TN_CHUNK tokens (the chunk of every view stays in the second cache level);
 * the plain product keeps NN_ROWS tokens × up to NN_VECS vectors of Y. Accumulation is in float32
 * like the library products they replace. Built at first use by osa_lab/ops/cpu/build.py; IEEE
 * arithmetic (no -ffast-math), so NaN and Inf propagate.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "threads.h"

/* Register blocks per build (-D overrides them, for tuning): 32 vector registers with AVX-512,
 * 16 with AVX2. */
#if defined(__AVX512F__)
#define VW 16
#define TN_ROWS_BUILD 8
#define TN_VECS_BUILD 3
#define NN_ROWS_BUILD 5
#define NN_VECS_BUILD 4
#else
#define VW 8
#define TN_ROWS_BUILD 4
#define TN_VECS_BUILD 3
#define NN_ROWS_BUILD 4
#define NN_VECS_BUILD 3
#endif
#ifndef TN_ROWS
#define TN_ROWS TN_ROWS_BUILD
#endif
#ifndef TN_VECS
#define TN_VECS TN_VECS_BUILD
#endif
#ifndef NN_ROWS
#define NN_ROWS NN_ROWS_BUILD
#endif
#ifndef NN_VECS
#define NN_VECS NN_VECS_BUILD
#endif
/* Widths are multiples of 16, and the transposed product has no remainder loop over its rows. */
#if TN_ROWS < 1 || 16 % TN_ROWS || TN_VECS < 1 || TN_VECS > 8 || NN_ROWS < 1 || NN_ROWS > 16 || NN_VECS < 1 || NN_VECS > 8
#error "register blocks: TN_ROWS must divide 16; TN_VECS and NN_VECS 1-8; NN_ROWS 1-16"
#endif
#define TN_CHUNK 256

typedef float vec __attribute__((vector_size(4 * VW)));
typedef float vecu __attribute__((vector_size(4 * VW), aligned(4)));
#define LDU(p) (*(const vecu *)(p))
#define STU(p, x) (*(vecu *)(p) = (x))

/* A token view: matrix b's row i starts at base + offs[b] + i·rs (columns contiguous). */
typedef struct {
    float *base;
    const int64_t *offs;
    int64_t rs;
} tview_t;

static inline float *row_of(const tview_t *t, int b, int64_t i) { return t->base + t->offs[b] + i * t->rs; }

/* out[ROWS × NV vectors] += Σ_{k<K} a[k][0..ROWS) ⊗ b_n[k][0..VW) (out row stride ldo): a's rows at
 * stride lda (ROWS consecutive floats broadcast), the NV vector columns each from its own pointer
 * (a vector never straddles two views) with row stride ldb[n]. */
#define DEFINE_TN(NAME, ROWS, NV)                                                                  \
    static inline void NAME(int K, const float *a, int64_t lda, const float *const *bp,           \
                            const int64_t *ldb, float *out, int ldo)                              \
    {                                                                                              \
        vec acc[ROWS][NV];                                                                         \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r)                                     \
            _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) acc[r][n] = (vec){0};             \
        const float *b[NV];                                                                        \
        _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) b[n] = bp[n];                        \
        for (int k = 0; k < K; ++k, a += lda) {                                                    \
            vec x[NV];                                                                             \
            _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) { x[n] = LDU(b[n]); b[n] += ldb[n]; } \
            _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r) {                               \
                const float s = a[r];                                                              \
                _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) acc[r][n] += s * x[n];        \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r)                                     \
            _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) {                                 \
                float *o = out + (int64_t)r * ldo + VW * n;                                        \
                STU(o, LDU(o) + acc[r][n]);                                                        \
            }                                                                                      \
    }

DEFINE_TN(tn_full, TN_ROWS, TN_VECS)
DEFINE_TN(tn_2, TN_ROWS, 2)
DEFINE_TN(tn_1, TN_ROWS, 1)

typedef struct {
    int N, nx, na;
    int w[3], lo[2];
    tview_t x[3];
    float *out[2];      /* out_a: B × w_a × W_a, contiguous */
    int width_out[2];   /* W_a = Σ_{s ≥ lo_a} w_s */
    int splits;         /* token ranges per matrix (1, or more when B < threads) */
    float *partial;     /* splits > 1: one out_0|out_1 block per (matrix, range) */
} tn_job_t;

typedef struct {
    void *job;
    int first, last;
} range_t;

static inline int64_t tn_size(const tn_job_t *job)
{
    return (int64_t)job->w[0] * job->width_out[0] + (job->na > 1 ? (int64_t)job->w[1] * job->width_out[1] : 0);
}

/* The tokens [n0, n1) of matrix b added into outs[a] (B-independent blocks w_a × W_a). */
static void tn_tokens(const tn_job_t *job, int b, int n0, int n1, float *const *outs)
{
    int nvmax = 0;
    for (int s = 0; s < job->nx; ++s) nvmax += job->w[s] / VW;
    const float *col[nvmax];
    int64_t ld[nvmax];
    for (int c0 = n0; c0 < n1; c0 += TN_CHUNK) {
        const int K = n1 - c0 < TN_CHUNK ? n1 - c0 : TN_CHUNK;
        for (int a = 0; a < job->na; ++a) {
            const tview_t *xa = &job->x[a];
            const float *abase = row_of(xa, b, c0);
            const int W = job->width_out[a];
            int nv = 0;  /* the vector columns of [X_lo … X_{n−1}], each with its pointer and row stride */
            for (int s = job->lo[a]; s < job->nx; ++s)
                for (int j = 0; j < job->w[s]; j += VW) {
                    col[nv] = row_of(&job->x[s], b, c0) + j;
                    ld[nv++] = job->x[s].rs;
                }
            for (int i = 0; i + TN_ROWS <= job->w[a]; i += TN_ROWS) {
                float *o = outs[a] + (int64_t)i * W;
                /* X_aᵀX_a (lo_a = a) is symmetric: only its vectors that reach the diagonal or above */
                int v = job->lo[a] == a ? i / VW : 0;
                for (; v + TN_VECS <= nv; v += TN_VECS) tn_full(K, abase + i, xa->rs, col + v, ld + v, o + VW * v, W);
                if (v + 2 <= nv) { tn_2(K, abase + i, xa->rs, col + v, ld + v, o + VW * v, W); v += 2; }
                if (v < nv) tn_1(K, abase + i, xa->rs, col + v, ld + v, o + VW * v, W);
            }
        }
    }
}

/* The symmetric blocks X_aᵀX_a (lo_a = a) of matrix b's outs: the lower triangle from the upper. */
static void tn_mirror(const tn_job_t *job, float *const *outs)
{
    for (int a = 0; a < job->na; ++a) {
        if (job->lo[a] != a) continue;
        float *o = outs[a];
        const int W = job->width_out[a];
        for (int i = 1; i < job->w[a]; ++i)
            for (int j = 0; j < i; ++j) o[(int64_t)i * W + j] = o[(int64_t)j * W + i];
    }
}

static void *tn_range(void *arg)
{
    range_t *range = arg;
    tn_job_t *job = range->job;
    const int64_t size0 = (int64_t)job->w[0] * job->width_out[0], size = tn_size(job);
    for (int u = range->first; u < range->last; ++u) {
        const int b = u / job->splits, part = u % job->splits;
        const int n0 = (int)((int64_t)job->N * part / job->splits);
        const int n1 = (int)((int64_t)job->N * (part + 1) / job->splits);
        float *outs[2];
        if (job->splits > 1) {  /* this range's partial sums, added in order after the join */
            outs[0] = job->partial + (int64_t)u * size;
            outs[1] = outs[0] + size0;
            memset(outs[0], 0, sizeof(float) * size);
        } else {
            for (int a = 0; a < job->na; ++a) {
                const int64_t sz = (int64_t)job->w[a] * job->width_out[a];
                outs[a] = job->out[a] + (int64_t)b * sz;
                memset(outs[a], 0, sizeof(float) * sz);
            }
        }
        tn_tokens(job, b, n0, n1, outs);
        if (job->splits == 1) tn_mirror(job, outs);
    }
    return NULL;
}

/* Y's ROWS tokens × NV vectors from column j: X's (or 0) + Σ_s A_s C_s; a[s][r] is A_s's row r. */
#define DEFINE_NN(NAME, ROWS, NV)                                                                  \
    static inline void NAME(int ns, const int *w, const float *const (*a)[NN_ROWS],               \
                            const float *const *c, int d, const float *const *x, float *const *y,  \
                            double *x_sq)                                                          \
    {                                                                                              \
        vec acc[ROWS][NV];                                                                         \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r)                                     \
            _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n)                                   \
                acc[r][n] = x ? LDU(x[r] + VW * n) : (vec){0};                                     \
        if (x && x_sq) {                                                                           \
            vec sq = {0};                                                                          \
            _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r)                                 \
                _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) sq += acc[r][n] * acc[r][n];  \
            double total = 0.0;                                                                    \
            for (int l = 0; l < VW; ++l) total += sq[l];                                           \
            *x_sq += total;                                                                        \
        }                                                                                          \
        for (int s = 0; s < ns; ++s) {                                                             \
            const float *cs = c[s];                                                                \
            for (int i = 0; i < w[s]; ++i, cs += d) {                                              \
                vec cv[NV];                                                                        \
                _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) cv[n] = LDU(cs + VW * n);     \
                _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r) {                           \
                    const float t = a[s][r][i];                                                    \
                    _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) acc[r][n] += t * cv[n];   \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; ++r)                                     \
            _Pragma("GCC unroll 16") for (int n = 0; n < NV; ++n) STU(y[r] + VW * n, acc[r][n]);    \
    }

DEFINE_NN(nn_full, NN_ROWS, NN_VECS)
DEFINE_NN(nn_2, NN_ROWS, 2)
DEFINE_NN(nn_1, NN_ROWS, 1)
DEFINE_NN(nn_row_full, 1, NN_VECS)
DEFINE_NN(nn_row_2, 1, 2)
DEFINE_NN(nn_row_1, 1, 1)

typedef struct {
    int N, d, ns, splits;
    int w[4];
    tview_t a[4], x, y;
    const float *c[4];  /* C_s: rows [Σ_{t<s} w_t, …) of the contiguous B × W × d stack */
    int64_t c_stride;   /* W·d */
    double *x_sq;       /* NULL, or one Σ X² per work unit (matrix, token range) */
} nn_job_t;

/* Tokens [t0, t0 + rows) of matrix b, rows ≤ NN_ROWS, through column blocks of NN_VECS, 2, 1 vectors. */
static void nn_block(const nn_job_t *job, int b, int t0, int rows, double *x_sq)
{
    const float *arow[4][NN_ROWS];
    const float *c[4], *x[NN_ROWS];
    float *y[NN_ROWS];
    for (int s = 0; s < job->ns; ++s) {
        c[s] = job->c[s] + (int64_t)b * job->c_stride;
        for (int r = 0; r < rows; ++r) arow[s][r] = row_of(&job->a[s], b, t0 + r);
    }
    for (int r = 0; r < rows; ++r) {
        x[r] = job->x.base ? row_of(&job->x, b, t0 + r) : NULL;
        y[r] = row_of(&job->y, b, t0 + r);
    }
    const float *const *xs = job->x.base ? x : NULL;
    const int nv = job->d / VW;
    for (int v = 0; v < nv;) {
        const float *cv[4], *xv[NN_ROWS];
        float *yv[NN_ROWS];
        for (int s = 0; s < job->ns; ++s) cv[s] = c[s] + VW * v;
        for (int r = 0; r < rows; ++r) {
            xv[r] = xs ? x[r] + VW * v : NULL;
            yv[r] = y[r] + VW * v;
        }
        const float *const *xp = xs ? xv : NULL;
        const int left = nv - v;
        if (rows == NN_ROWS) {
            if (left >= NN_VECS) { nn_full(job->ns, job->w, arow, cv, job->d, xp, yv, x_sq); v += NN_VECS; }
            else if (left >= 2) { nn_2(job->ns, job->w, arow, cv, job->d, xp, yv, x_sq); v += 2; }
            else { nn_1(job->ns, job->w, arow, cv, job->d, xp, yv, x_sq); v += 1; }
        } else {
            for (int r = 0; r < rows; ++r) {
                const float *ar[4][NN_ROWS];
                for (int s = 0; s < job->ns; ++s) ar[s][0] = arow[s][r];
                const float *xr[1] = {xp ? xp[r] : NULL};
                float *yr[1] = {yv[r]};
                if (left >= NN_VECS) nn_row_full(job->ns, job->w, ar, cv, job->d, xp ? xr : NULL, yr, x_sq);
                else if (left >= 2) nn_row_2(job->ns, job->w, ar, cv, job->d, xp ? xr : NULL, yr, x_sq);
                else nn_row_1(job->ns, job->w, ar, cv, job->d, xp ? xr : NULL, yr, x_sq);
            }
            v += left >= NN_VECS ? NN_VECS : left >= 2 ? 2 : 1;
        }
    }
}

static void *nn_range(void *arg)
{
    range_t *range = arg;
    nn_job_t *job = range->job;
    for (int u = range->first; u < range->last; ++u) {
        const int b = u / job->splits, part = u % job->splits;
        const int n0 = (int)((int64_t)job->N * part / job->splits);
        const int n1 = (int)((int64_t)job->N * (part + 1) / job->splits);
        double *x_sq = job->x_sq ? job->x_sq + u : NULL;
        if (x_sq) *x_sq = 0.0;
        for (int t = n0; t < n1; t += NN_ROWS) nn_block(job, b, t, n1 - t < NN_ROWS ? n1 - t : NN_ROWS, x_sq);
    }
    return NULL;
}

/* Run fn over units [0, units) split into contiguous ranges over up to nthreads threads (threads.h). */
static void launch(void *job, int units, int nthreads, void *(*fn)(void *))
{
    const int nt = clamp_threads(nthreads, units);
    range_t ranges[OSA_MAX_THREADS];
    for (int t = 0; t < nt; ++t) {
        ranges[t].job = job;
        ranges[t].first = (int)((int64_t)units * t / nt);
        ranges[t].last = (int)((int64_t)units * (t + 1) / nt);
    }
    run_threads(fn, ranges, sizeof(range_t), nt);
}

/* Ranges of tokens per matrix: 1 when the batch alone gives every thread work, else enough for
 * the threads while each range keeps at least `least` tokens. */
static int token_splits(int B, int N, int nthreads, int least)
{
    if (B >= nthreads) return 1;
    int splits = (nthreads + B - 1) / B, most = N / least;
    if (splits > most) splits = most;
    return splits < 1 ? 1 : splits;
}

static tview_t tview(float *base, const int64_t *offs, int64_t rs)
{
    tview_t t = {base, offs, rs};
    return t;
}

/* out_a (B × w_a × Σ_{s≥lo_a} w_s, contiguous) = X_aᵀ [X_lo_a … X_{nx−1}] for a < na, over the N
 * tokens of the views X_s (B, N, w_s); every w_s a multiple of 16. Returns 0, 1 when memory for the
 * partial sums could not be had, 2 on bad arguments. When B < nthreads the tokens of a matrix are
 * split over threads and the partial sums added in a fixed order after the join. */
int osa_gram_tn(int B, int N, int nx, const int *w, float *x0, const int64_t *o0, int64_t rs0, float *x1,
                const int64_t *o1, int64_t rs1, float *x2, const int64_t *o2, int64_t rs2, int na,
                const int *lo, float *out0, float *out1, int nthreads)
{
    if (B < 0 || N < 1 || nx < 1 || nx > 3 || na < 1 || na > 2 || na > nx) return 2;
    if (B == 0) return 0;  /* (an empty tensor's data pointer may be NULL) */
    tn_job_t job = {0};
    job.N = N; job.nx = nx; job.na = na;
    job.x[0] = tview(x0, o0, rs0); job.x[1] = tview(x1, o1, rs1); job.x[2] = tview(x2, o2, rs2);
    job.out[0] = out0; job.out[1] = out1;
    for (int s = 0; s < nx; ++s) {
        if (w[s] < VW || w[s] % 16 || !job.x[s].base) return 2;
        job.w[s] = w[s];
    }
    for (int a = 0; a < na; ++a) {
        if (lo[a] < 0 || lo[a] >= nx || !job.out[a]) return 2;
        job.lo[a] = lo[a];
        for (int s = lo[a]; s < nx; ++s) job.width_out[a] += w[s];
    }
    job.splits = token_splits(B, N, nthreads, TN_CHUNK);
    const int units = B * job.splits;
    const int64_t size = tn_size(&job);
    if (job.splits > 1 && !(job.partial = malloc(sizeof(float) * size * units))) return 1;
    launch(&job, units, nthreads, tn_range);
    if (job.splits > 1) {
        for (int b = 0; b < B; ++b) {
            float *sum = job.partial + (int64_t)b * job.splits * size;
            for (int part = 1; part < job.splits; ++part)
                for (int64_t i = 0; i < size; ++i) sum[i] += sum[part * size + i];
            float *parts[2] = {sum, sum + (int64_t)w[0] * job.width_out[0]};
            tn_mirror(&job, parts);
            memcpy(out0 + (int64_t)b * w[0] * job.width_out[0], sum, sizeof(float) * w[0] * job.width_out[0]);
            if (na > 1)
                memcpy(out1 + (int64_t)b * w[1] * job.width_out[1], sum + (int64_t)w[0] * job.width_out[0],
                       sizeof(float) * w[1] * job.width_out[1]);
        }
        free(job.partial);
    }
    return 0;
}

/* Y = X + Σ_{s<ns} A_s C_s for token views A_s (B, N, w_s), X and Y (B, N, d) (X NULL: no term) and
 * C = [C_0; …; C_{ns−1}] (B × Σw_s × d, contiguous); d a multiple of 16, 1 ≤ ns ≤ 4; Y must not
 * overlap an input. x_sq (B doubles, or NULL): Σ X² per matrix, from the same read of X. Returns
 * 0, 1 when memory for the partial sums could not be had, or 2 on bad arguments. */
int osa_gram_nn(int B, int N, int d, int ns, const int *w, float *a0, const int64_t *ao0, int64_t ars0,
                float *a1, const int64_t *ao1, int64_t ars1, float *a2, const int64_t *ao2, int64_t ars2,
                float *a3, const int64_t *ao3, int64_t ars3, const float *c, float *x, const int64_t *xo, int64_t xrs, float *y,
                const int64_t *yo, int64_t yrs, double *x_sq, int nthreads)
{
    if (B < 0 || N < 1 || d < VW || d % 16 || ns < 1 || ns > 4) return 2;
    if (B == 0) return 0;
    if (!y) return 2;
    nn_job_t job = {0};
    job.N = N; job.d = d; job.ns = ns;
    job.a[0] = tview(a0, ao0, ars0); job.a[1] = tview(a1, ao1, ars1);
    job.a[2] = tview(a2, ao2, ars2); job.a[3] = tview(a3, ao3, ars3);
    if (!c) return 2;
    int64_t rows = 0;
    for (int s = 0; s < ns; ++s) {
        if (w[s] < 1 || !job.a[s].base) return 2;
        job.w[s] = w[s];
        job.c[s] = c + rows * d;
        rows += w[s];
    }
    job.c_stride = rows * d;
    job.x = tview(x, xo, xrs); job.y = tview(y, yo, yrs);
    job.splits = token_splits(B, N, nthreads, 4 * NN_ROWS);
    const int units = B * job.splits;
    if (x_sq && x) {
        job.x_sq = job.splits > 1 ? malloc(sizeof(double) * units) : x_sq;
        if (!job.x_sq) return 1;
    }
    launch(&job, units, nthreads, nn_range);
    if (job.x_sq && job.splits > 1) {  /* the ranges' sums, added in order */
        for (int b = 0; b < B; ++b) {
            double total = 0.0;
            for (int part = 0; part < job.splits; ++part) total += job.x_sq[b * job.splits + part];
            x_sq[b] = total;
        }
        free(job.x_sq);
    }
    return 0;
}

/* Floats per hardware vector of this build: 16 with AVX-512, 8 with AVX2 and FMA; 0 for a build
 * without either (its vectors emulated: the Python side keeps the torch products there). */
int osa_gram_vector_floats(void)
{
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    return VW;
#else
    return 0;
#endif
}
