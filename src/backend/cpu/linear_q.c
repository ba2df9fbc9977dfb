/* Block-scaled FP8 and MXFP4 linears (spec §3.1 Linear, §5.2).
 *
 * y[m, n] = bf16( Σ_kb  f32(Σ_{k ∈ kb} q_x[m,k]·q_w[n,k]) · s_x[m,kb] · s_w[n,kb] ),  blocks kb of 32.
 *
 * Why f64 for the inner block sum: e4m3 values are multiples of 2^−9 below 2^9 with 4 significant
 * bits, E2M1 values multiples of 2^−1 with 2; so every product is exact in f64 and any sum of 32 of
 * them needs at most 41 bits — also exact. The block sum therefore does not depend on the order of
 * its terms, which lets the scalar, AVX2 and AVX-512 paths (and any thread count or batch size)
 * agree bit for bit while vectorising along K. The one rounding to f32 then matches a reference
 * whose f32 block sum happened to be exact; the scaled blocks are added in ascending K order.
 *
 * Work split: output columns in tiles of QT. A task decodes its QT weight rows once into an f64
 * tile (per-thread workspace) and sweeps every input row over it, so the weight decode is
 * amortised over the batch while each (m, n) keeps one fixed arithmetic sequence. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "util/cpu_features.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DI_X86 1
#endif

#define QT 4 /* output columns per tile (one f64 lane group each in the SIMD combine) */

/* ---- decode tables (values exact in f64) ---- */
static double g_e4m3[256];  /* e4m3 code → value */
static double g_e2m1[16];   /* E2M1 code → value */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    for (int i = 0; i < 256; i++) g_e4m3[i] = di_e4m3_to_f32((uint8_t)i);
    for (int i = 0; i < 16; i++) g_e2m1[i] = di_e2m1_to_f32((uint8_t)i);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Per-thread tile: wt f64 [QT][K] (decoded weight rows), sw f32 [KB][QT] (weight scales, column
 * fastest so a SIMD kernel loads the QT scales of one block at once). */
static size_t tile_bytes(int64_t K) {
    return align64((size_t)QT * (size_t)K * sizeof(double)) + align64((size_t)(K / DI_QBLOCK) * QT * sizeof(float));
}

size_t di_cpu_qlinear_workspace(int64_t M, int64_t K, const di_threadpool *tp) {
    int64_t KB = K / DI_QBLOCK;
    return align64((size_t)M * (size_t)K * sizeof(double)) + align64((size_t)M * (size_t)KB * sizeof(float)) +
           (size_t)di_threadpool_size(tp) * tile_bytes(K);
}

/* ---- act_quant of the input rows into f64 code values + f32 scales ---- */
typedef struct {
    int64_t K;
    const uint16_t *x; /* bf16 [M, ldx] */
    int64_t ldx;
    double *xq;        /* f64 [M, K] e4m3 values, unscaled */
    float *sx;         /* f32 [M, K/32] */
} quant_job;

static void quant_row(void *ctx, int64_t m, int thread) {
    (void)thread;
    const quant_job *j = ctx;
    enum { CH = 1024 };                 /* chunk of the row; a multiple of the block */
    uint8_t q[CH], s[CH / DI_QBLOCK];   /* e4m3 codes, E8M0 scale bytes */
    const uint16_t *x = j->x + m * j->ldx;
    double *xq = j->xq + m * j->K;
    float *sx = j->sx + m * (j->K / DI_QBLOCK);
    for (int64_t k0 = 0; k0 < j->K; k0 += CH) {
        int64_t n = j->K - k0 < CH ? j->K - k0 : CH;
        di_act_quant_fp8(x + k0, n, DI_QBLOCK, q, s);
        for (int64_t i = 0; i < n; i++) xq[k0 + i] = g_e4m3[q[i]];
        for (int64_t b = 0; b < n / DI_QBLOCK; b++) sx[k0 / DI_QBLOCK + b] = di_e8m0_to_f32(s[b]);
    }
}

/* ---- inner kernels: acc[c] for the QT columns of a tile against one input row ---- */
typedef void (*qdot_fn)(const double *x, const float *sx, const double *wt, const float *sw, int64_t K,
                        float *acc);

static void qdot_scalar(const double *x, const float *sx, const double *wt, const float *sw, int64_t K,
                        float *acc) {
    int64_t KB = K / DI_QBLOCK;
    float a[QT] = {0};
    for (int64_t kb = 0; kb < KB; kb++) {
        const double *xb = x + kb * DI_QBLOCK;
        for (int c = 0; c < QT; c++) {
            const double *wb = wt + c * K + kb * DI_QBLOCK;
            double s = 0; /* exact: see the file comment */
            for (int i = 0; i < DI_QBLOCK; i++) s += xb[i] * wb[i];
            float p = (float)s * sx[kb];
            p = p * sw[kb * QT + c];
            a[c] = a[c] + p;
        }
    }
    memcpy(acc, a, sizeof a);
}

#ifdef DI_X86
/* Four f64 block sums (one __m256d of partials per column) → f32 [s0, s1, s2, s3]; every add is
 * exact, so this order is as good as the scalar one. */
__attribute__((target("avx2,fma"))) static inline __m128 combine4(__m256d s0, __m256d s1, __m256d s2, __m256d s3) {
    __m256d h01 = _mm256_hadd_pd(s0, s1); /* s0₀+s0₁, s1₀+s1₁, s0₂+s0₃, s1₂+s1₃ */
    __m256d h23 = _mm256_hadd_pd(s2, s3);
    __m256d lo = _mm256_permute2f128_pd(h01, h23, 0x20);
    __m256d hi = _mm256_permute2f128_pd(h01, h23, 0x31);
    return _mm256_cvtpd_ps(_mm256_add_pd(lo, hi));
}

__attribute__((target("avx2,fma"))) static void qdot_avx2(const double *x, const float *sx, const double *wt,
                                                          const float *sw, int64_t K, float *acc) {
    int64_t KB = K / DI_QBLOCK;
    __m128 a = _mm_setzero_ps();
    for (int64_t kb = 0; kb < KB; kb++) {
        const double *xb = x + kb * DI_QBLOCK;
        __m256d s[QT];
        for (int c = 0; c < QT; c++) {
            const double *wb = wt + c * K + kb * DI_QBLOCK;
            __m256d u = _mm256_mul_pd(_mm256_loadu_pd(xb), _mm256_loadu_pd(wb));
            __m256d v = _mm256_mul_pd(_mm256_loadu_pd(xb + 4), _mm256_loadu_pd(wb + 4));
            for (int i = 8; i < DI_QBLOCK; i += 8) {
                u = _mm256_fmadd_pd(_mm256_loadu_pd(xb + i), _mm256_loadu_pd(wb + i), u);
                v = _mm256_fmadd_pd(_mm256_loadu_pd(xb + i + 4), _mm256_loadu_pd(wb + i + 4), v);
            }
            s[c] = _mm256_add_pd(u, v);
        }
        __m128 p = combine4(s[0], s[1], s[2], s[3]);
        p = _mm_mul_ps(p, _mm_set1_ps(sx[kb]));
        p = _mm_mul_ps(p, _mm_loadu_ps(sw + kb * QT));
        a = _mm_add_ps(a, p);
    }
    _mm_storeu_ps(acc, a);
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma"))) static void qdot_avx512(
    const double *x, const float *sx, const double *wt, const float *sw, int64_t K, float *acc) {
    int64_t KB = K / DI_QBLOCK;
    __m128 a = _mm_setzero_ps();
    for (int64_t kb = 0; kb < KB; kb++) {
        const double *xb = x + kb * DI_QBLOCK;
        __m512d x0 = _mm512_loadu_pd(xb), x1 = _mm512_loadu_pd(xb + 8);
        __m512d x2 = _mm512_loadu_pd(xb + 16), x3 = _mm512_loadu_pd(xb + 24);
        __m256d s[QT];
        for (int c = 0; c < QT; c++) {
            const double *wb = wt + c * K + kb * DI_QBLOCK;
            __m512d u = _mm512_mul_pd(x0, _mm512_loadu_pd(wb));
            __m512d v = _mm512_mul_pd(x1, _mm512_loadu_pd(wb + 8));
            u = _mm512_fmadd_pd(x2, _mm512_loadu_pd(wb + 16), u);
            v = _mm512_fmadd_pd(x3, _mm512_loadu_pd(wb + 24), v);
            u = _mm512_add_pd(u, v);
            s[c] = _mm256_add_pd(_mm512_castpd512_pd256(u), _mm512_extractf64x4_pd(u, 1));
        }
        __m128 p = combine4(s[0], s[1], s[2], s[3]);
        p = _mm_mul_ps(p, _mm_set1_ps(sx[kb]));
        p = _mm_mul_ps(p, _mm_loadu_ps(sw + kb * QT));
        a = _mm_add_ps(a, p);
    }
    _mm_storeu_ps(acc, a);
}
#endif

static qdot_fn pick_qdot(void) {
#ifdef DI_X86
    switch (di_cpu_isa_active()) {
    case DI_ISA_AVX512: return qdot_avx512;
    case DI_ISA_AVX2: return qdot_avx2;
    default: break;
    }
#endif
    return qdot_scalar;
}

/* ---- the tiled GEMM over decoded weights ---- */
typedef struct {
    int64_t M, N, K;
    int fp4;
    const double *xq;
    const float *sx;
    const uint8_t *w, *w_scale;
    uint16_t *y;
    int64_t ldy;
    unsigned char *tiles; /* n_threads × tile_bytes(K) */
    qdot_fn dot;
} gemm_job;

static void decode_tile(const gemm_job *j, int64_t n0, int nt, double *wt, float *sw) {
    int64_t K = j->K, KB = K / DI_QBLOCK;
    for (int c = 0; c < QT; c++) {
        double *row = wt + c * K;
        if (c >= nt) { /* columns past N: zero weights, results discarded */
            memset(row, 0, (size_t)K * sizeof *row);
            for (int64_t kb = 0; kb < KB; kb++) sw[kb * QT + c] = 0.0f;
            continue;
        }
        int64_t n = n0 + c;
        if (j->fp4) {
            const uint8_t *b = j->w + n * (K / 2);
            for (int64_t i = 0; i < K / 2; i++) {
                row[2 * i] = g_e2m1[di_fp4_even(b[i])];
                row[2 * i + 1] = g_e2m1[di_fp4_odd(b[i])];
            }
            for (int64_t kb = 0; kb < KB; kb++) sw[kb * QT + c] = di_e8m0_to_f32(j->w_scale[n * KB + kb]);
        } else {
            const uint8_t *b = j->w + n * K;
            for (int64_t i = 0; i < K; i++) row[i] = g_e4m3[b[i]];
            const uint8_t *s = j->w_scale + (n / DI_QBLOCK) * KB;
            for (int64_t kb = 0; kb < KB; kb++) sw[kb * QT + c] = di_e8m0_to_f32(s[kb]);
        }
    }
}

static void gemm_tile(void *ctx, int64_t tile, int thread) {
    const gemm_job *j = ctx;
    int64_t n0 = tile * QT;
    int nt = j->N - n0 < QT ? (int)(j->N - n0) : QT;
    unsigned char *base = j->tiles + (size_t)thread * tile_bytes(j->K);
    double *wt = (double *)base;
    float *sw = (float *)(base + align64((size_t)QT * (size_t)j->K * sizeof(double)));
    decode_tile(j, n0, nt, wt, sw);
    int64_t KB = j->K / DI_QBLOCK;
    for (int64_t m = 0; m < j->M; m++) {
        float acc[QT];
        j->dot(j->xq + m * j->K, j->sx + m * KB, wt, sw, j->K, acc);
        uint16_t *y = j->y + m * j->ldy + n0;
        for (int c = 0; c < nt; c++) y[c] = di_f32_to_bf16(acc[c]);
    }
}

static int qlinear(di_threadpool *tp, int fp4, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                   const uint8_t *w, const uint8_t *w_scale, uint16_t *y, int64_t ldy, void *ws, size_t ws_bytes,
                   di_error *err) {
    const char *what = fp4 ? "linear_fp4" : "linear_fp8";
    if (M < 0 || N < 0 || K <= 0 || K % DI_QBLOCK)
        return di_error_set(err, DI_ERR_INVALID, "%s: K = %lld must be a positive multiple of %d (M %lld, N %lld)",
                            what, (long long)K, DI_QBLOCK, (long long)M, (long long)N);
    if (ldx < K || ldy < N)
        return di_error_set(err, DI_ERR_INVALID, "%s: row strides ldx %lld / ldy %lld below K %lld / N %lld", what,
                            (long long)ldx, (long long)ldy, (long long)K, (long long)N);
    size_t need = di_cpu_qlinear_workspace(M, K, tp);
    if (!ws || ws_bytes < need)
        return di_error_set(err, DI_ERR_INVALID, "%s: workspace of %zu bytes, need %zu (M %lld, K %lld, %d threads)",
                            what, ws_bytes, need, (long long)M, (long long)K, di_threadpool_size(tp));
    if (M == 0 || N == 0) return DI_OK;
    pthread_once(&g_once, init_tables);

    unsigned char *p = ws;
    double *xq = (double *)p;
    p += align64((size_t)M * (size_t)K * sizeof(double));
    float *sx = (float *)p;
    p += align64((size_t)M * (size_t)(K / DI_QBLOCK) * sizeof(float));

    quant_job qj = {K, x, ldx, xq, sx};
    di_threadpool_run(tp, M, quant_row, &qj);

    gemm_job gj = {M, N, K, fp4, xq, sx, w, w_scale, y, ldy, p, pick_qdot()};
    di_threadpool_run(tp, (N + QT - 1) / QT, gemm_tile, &gj);
    return DI_OK;
}

int di_cpu_linear_fp8(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                      const uint8_t *w, const uint8_t *w_scale, uint16_t *y, int64_t ldy, void *ws,
                      size_t ws_bytes, di_error *err) {
    return qlinear(tp, 0, M, N, K, x, ldx, w, w_scale, y, ldy, ws, ws_bytes, err);
}

int di_cpu_linear_fp4(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                      const uint8_t *w, const uint8_t *w_scale, uint16_t *y, int64_t ldy, void *ws,
                      size_t ws_bytes, di_error *err) {
    return qlinear(tp, 1, M, N, K, x, ldx, w, w_scale, y, ldy, ws, ws_bytes, err);
}
