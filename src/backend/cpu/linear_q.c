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
 * Work split: tasks own column ranges (≤ TC columns). A task walks K in chunks of KC; per chunk it
 * decodes QT weight rows at a time into an f32 tile (values exact in f32) and sweeps every input
 * row over it, keeping per-(m, n) f32 accumulators in its scratch. The weight decode is amortised
 * over the batch and each (m, n) sees the same arithmetic sequence whatever M, the thread count or
 * the task split. */
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "util/cpu_features.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DI_X86 1
#endif

#define QT 4    /* output columns per tile (one lane each in the SIMD combine) */
#define KC 512  /* K chunk: a decoded QT×KC weight tile (8 KiB) stays in L1 */
#define TC 64   /* most output columns per task; their f32 accumulators persist across K chunks */

/* ---- weight decoding ----
 * e4m3 by bit assembly instead of a table so the scalar and SIMD decoders share one definition
 * (and produce identical bits): a normal code s eeee mmm becomes the f32 with exponent eeee + 120
 * and mantissa mmm·2^20; a subnormal (eeee = 0) is mmm·2^−9, an exact int → float conversion and
 * power-of-two multiply (no subnormal f32 arithmetic, which is slow on some cores). The NaN codes
 * (0x7F, 0xFF) become the all-ones NaN. Values are exact in f32, so the block products are too. */
static inline float e4m3_value(uint8_t c) {
    uint32_t mag = c & 0x7fu, sign = (uint32_t)(c & 0x80u) << 24, bits;
    if (mag == 0x7fu) {
        bits = 0xffffffffu;
    } else if (mag < 8) {
        float sub = (float)mag * 0x1p-9f;
        memcpy(&bits, &sub, 4);
        bits |= sign;
    } else {
        bits = sign | ((mag + (120u << 3)) << 20);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void decode_e4m3_scalar(const uint8_t *c, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = e4m3_value(c[i]);
}

/* n logical values from n/2 packed bytes */
static void decode_e2m1_scalar(const uint8_t *b, int64_t n, float *out) {
    for (int64_t i = 0; i < n / 2; i++) {
        out[2 * i] = di_e2m1_values[di_fp4_even(b[i])];
        out[2 * i + 1] = di_e2m1_values[di_fp4_odd(b[i])];
    }
}

#ifdef DI_X86
__attribute__((target("avx2,fma"))) static void decode_e4m3_avx2(const uint8_t *c, int64_t n, float *out) {
    int64_t i = 0;
    const __m256i m7f = _mm256_set1_epi32(0x7f), m80 = _mm256_set1_epi32(0x80), m8 = _mm256_set1_epi32(8);
    const __m256i bias = _mm256_set1_epi32(120 << 3);
    const __m256 two_m9 = _mm256_set1_ps(0x1p-9f);
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i)));
        __m256i mag = _mm256_and_si256(v, m7f);
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, m80), 24);
        __m256 normal = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(mag, bias), 20));
        __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), two_m9);
        __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(m8, mag));
        __m256 f = _mm256_or_ps(_mm256_blendv_ps(normal, sub, is_sub), _mm256_castsi256_ps(sign));
        __m256i nan = _mm256_cmpeq_epi32(mag, m7f); /* all-ones lanes: the NaN of e4m3_value */
        _mm256_storeu_ps(out + i, _mm256_or_ps(f, _mm256_castsi256_ps(nan)));
    }
    for (; i < n; i++) out[i] = e4m3_value(c[i]);
}

__attribute__((target("avx2,fma"))) static void decode_e2m1_avx2(const uint8_t *b, int64_t n, float *out) {
    int64_t i = 0;
    const __m256 mags = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    const __m256i m15 = _mm256_set1_epi32(15), m7 = _mm256_set1_epi32(7), m8 = _mm256_set1_epi32(8);
    for (; i + 8 <= n; i += 8) { /* 4 bytes → 8 codes: even value in the low nibble */
        int32_t w4;
        memcpy(&w4, b + i / 2, 4);
        __m256i v = _mm256_cvtepu8_epi32(_mm_cvtsi32_si128(w4));
        __m256i code = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(v, dup), shift), m15);
        __m256 mag = _mm256_permutevar8x32_ps(mags, _mm256_and_si256(code, m7));
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, m8), 28);
        _mm256_storeu_ps(out + i, _mm256_or_ps(mag, _mm256_castsi256_ps(sign)));
    }
    decode_e2m1_scalar(b + i / 2, n - i, out + i);
}
#endif

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Per-thread scratch: wt f32 [QT][KC] (decoded weight chunk), sw f32 [KC/32][QT] (its scales,
 * column fastest so a SIMD kernel loads the QT scales of one block at once), acc f32 [M][TC]. */
static size_t thread_bytes(int64_t M) {
    return align64((size_t)QT * KC * sizeof(float)) + align64((size_t)(KC / DI_QBLOCK) * QT * sizeof(float)) +
           align64((size_t)M * TC * sizeof(float));
}

size_t di_cpu_qlinear_workspace(int64_t M, int64_t K, const di_threadpool *tp) {
    int64_t KB = K / DI_QBLOCK;
    return align64((size_t)M * (size_t)K * sizeof(float)) + align64((size_t)M * (size_t)KB * sizeof(float)) +
           (size_t)di_threadpool_size(tp) * thread_bytes(M);
}

/* ---- act_quant of the input rows into f32 code values + f32 scales ---- */
typedef struct {
    int64_t K;
    const uint16_t *x; /* bf16 [M, ldx] */
    int64_t ldx;
    float *xq;         /* f32 [M, K] e4m3 values, unscaled */
    float *sx;         /* f32 [M, K/32] */
} quant_job;

static void quant_row(void *ctx, int64_t m, int thread) {
    (void)thread;
    const quant_job *j = ctx;
    enum { CH = 1024 };                 /* chunk of the row; a multiple of the block */
    uint8_t q[CH], s[CH / DI_QBLOCK];   /* e4m3 codes, E8M0 scale bytes */
    const uint16_t *x = j->x + m * j->ldx;
    float *xq = j->xq + m * j->K;
    float *sx = j->sx + m * (j->K / DI_QBLOCK);
    for (int64_t k0 = 0; k0 < j->K; k0 += CH) {
        int64_t n = j->K - k0 < CH ? j->K - k0 : CH;
        di_act_quant_fp8(x + k0, n, DI_QBLOCK, q, s);
        decode_e4m3_scalar(q, n, xq + k0);
        for (int64_t b = 0; b < n / DI_QBLOCK; b++) sx[k0 / DI_QBLOCK + b] = di_e8m0_to_f32(s[b]);
    }
}

/* ---- inner kernels: acc[c] += blocks of one K chunk, QT columns, one input row ----
 *   x f32 [nb·32], sx f32 [nb], wt f32 [QT][KC], sw f32 [nb][QT] */
typedef void (*qdot_fn)(const float *x, const float *sx, const float *wt, const float *sw, int64_t nb, float *acc);

static void qdot_scalar(const float *x, const float *sx, const float *wt, const float *sw, int64_t nb, float *acc) {
    for (int64_t kb = 0; kb < nb; kb++) {
        const float *xb = x + kb * DI_QBLOCK;
        for (int c = 0; c < QT; c++) {
            const float *wb = wt + c * KC + kb * DI_QBLOCK;
            double s = 0; /* exact: see the file comment */
            for (int i = 0; i < DI_QBLOCK; i++) s += (double)(xb[i] * wb[i]);
            float p = (float)s * sx[kb];
            p = p * sw[kb * QT + c];
            acc[c] = acc[c] + p;
        }
    }
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

/* 8 exact f32 products → f64, summed pairwise (exact) */
__attribute__((target("avx2,fma"))) static inline __m256d widen8(__m256 p) {
    return _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(p)), _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
}

__attribute__((target("avx2,fma"))) static void qdot_avx2(const float *x, const float *sx, const float *wt,
                                                          const float *sw, int64_t nb, float *acc) {
    __m128 a = _mm_loadu_ps(acc);
    for (int64_t kb = 0; kb < nb; kb++) {
        const float *xb = x + kb * DI_QBLOCK;
        __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        __m256d s[QT];
        for (int c = 0; c < QT; c++) {
            const float *wb = wt + c * KC + kb * DI_QBLOCK;
            __m256d u = _mm256_add_pd(widen8(_mm256_mul_ps(x0, _mm256_loadu_ps(wb))),
                                      widen8(_mm256_mul_ps(x1, _mm256_loadu_ps(wb + 8))));
            __m256d v = _mm256_add_pd(widen8(_mm256_mul_ps(x2, _mm256_loadu_ps(wb + 16))),
                                      widen8(_mm256_mul_ps(x3, _mm256_loadu_ps(wb + 24))));
            s[c] = _mm256_add_pd(u, v);
        }
        __m128 p = combine4(s[0], s[1], s[2], s[3]);
        p = _mm_mul_ps(p, _mm_set1_ps(sx[kb]));
        p = _mm_mul_ps(p, _mm_loadu_ps(sw + kb * QT));
        a = _mm_add_ps(a, p);
    }
    _mm_storeu_ps(acc, a);
}

#define AVX512_TARGET "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"
__attribute__((target(AVX512_TARGET))) static inline __m512d widen16(__m512 p) {
    return _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(p)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(p, 1)));
}

__attribute__((target(AVX512_TARGET))) static void qdot_avx512(const float *x, const float *sx, const float *wt,
                                                              const float *sw, int64_t nb, float *acc) {
    __m128 a = _mm_loadu_ps(acc);
    for (int64_t kb = 0; kb < nb; kb++) {
        const float *xb = x + kb * DI_QBLOCK;
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        __m256d s[QT];
        for (int c = 0; c < QT; c++) {
            const float *wb = wt + c * KC + kb * DI_QBLOCK;
            __m512d u = _mm512_add_pd(widen16(_mm512_mul_ps(x0, _mm512_loadu_ps(wb))),
                                      widen16(_mm512_mul_ps(x1, _mm512_loadu_ps(wb + 16))));
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

typedef void (*decode_fn)(const uint8_t *src, int64_t n, float *out);

typedef struct {
    qdot_fn dot;
    decode_fn e4m3, e2m1;
} qkernels;

static qkernels pick_kernels(void) {
    qkernels k = {qdot_scalar, decode_e4m3_scalar, decode_e2m1_scalar};
#ifdef DI_X86
    di_cpu_isa isa = di_cpu_isa_active();
    if (isa >= DI_ISA_AVX2) k = (qkernels){qdot_avx2, decode_e4m3_avx2, decode_e2m1_avx2};
    if (isa >= DI_ISA_AVX512) k.dot = qdot_avx512;
#endif
    return k;
}

/* ---- the tiled GEMM ---- */
typedef struct {
    int64_t M, N, K;
    int fp4;
    const float *xq, *sx;
    const uint8_t *w, *w_scale;
    uint16_t *y;
    int64_t ldy;
    int64_t task_cols;     /* columns per task, a multiple of QT, ≤ TC */
    unsigned char *scratch; /* n_threads × thread_bytes(M) */
    qkernels k;
} gemm_job;

/* Decode columns [n0, n0+nt) × K range [k0, k0+kc) into wt/sw; columns past nt are zero. */
static void decode_tile(const gemm_job *j, int64_t n0, int nt, int64_t k0, int64_t kc, float *wt, float *sw) {
    int64_t K = j->K, KB = K / DI_QBLOCK, nb = kc / DI_QBLOCK, kb0 = k0 / DI_QBLOCK;
    for (int c = 0; c < QT; c++) {
        float *row = wt + c * KC;
        if (c >= nt) { /* results of these columns are discarded */
            memset(row, 0, (size_t)kc * sizeof *row);
            for (int64_t b = 0; b < nb; b++) sw[b * QT + c] = 0.0f;
            continue;
        }
        int64_t n = n0 + c;
        const uint8_t *s;
        if (j->fp4) {
            j->k.e2m1(j->w + n * (K / 2) + k0 / 2, kc, row);
            s = j->w_scale + n * KB + kb0;
        } else {
            j->k.e4m3(j->w + n * K + k0, kc, row);
            s = j->w_scale + (n / DI_QBLOCK) * KB + kb0;
        }
        for (int64_t b = 0; b < nb; b++) sw[b * QT + c] = di_e8m0_to_f32(s[b]);
    }
}

static void gemm_task(void *ctx, int64_t task, int thread) {
    const gemm_job *j = ctx;
    int64_t c0 = task * j->task_cols;
    int64_t ncols = j->N - c0 < j->task_cols ? j->N - c0 : j->task_cols;
    int64_t KB = j->K / DI_QBLOCK;
    unsigned char *base = j->scratch + (size_t)thread * thread_bytes(j->M);
    float *wt = (float *)base;
    float *sw = (float *)(base + align64((size_t)QT * KC * sizeof(float)));
    float *acc = (float *)(base + align64((size_t)QT * KC * sizeof(float)) +
                           align64((size_t)(KC / DI_QBLOCK) * QT * sizeof(float))); /* [M][TC] */
    memset(acc, 0, (size_t)j->M * TC * sizeof(float));
    /* K chunks outermost: the x chunk of every row stays in cache across this task's tiles, and
     * each (m, n) still sees its blocks in ascending order */
    for (int64_t k0 = 0; k0 < j->K; k0 += KC) {
        int64_t kc = j->K - k0 < KC ? j->K - k0 : KC;
        for (int64_t t0 = 0; t0 < ncols; t0 += QT) {
            int nt = ncols - t0 < QT ? (int)(ncols - t0) : QT;
            decode_tile(j, c0 + t0, nt, k0, kc, wt, sw);
            for (int64_t m = 0; m < j->M; m++)
                j->k.dot(j->xq + m * j->K + k0, j->sx + m * KB + k0 / DI_QBLOCK, wt, sw, kc / DI_QBLOCK,
                         acc + m * TC + t0);
        }
    }
    for (int64_t m = 0; m < j->M; m++)
        for (int64_t c = 0; c < ncols; c++) j->y[m * j->ldy + c0 + c] = di_f32_to_bf16(acc[m * TC + c]);
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

    unsigned char *p = ws;
    float *xq = (float *)p;
    p += align64((size_t)M * (size_t)K * sizeof(float));
    float *sx = (float *)p;
    p += align64((size_t)M * (size_t)(K / DI_QBLOCK) * sizeof(float));

    quant_job qj = {K, x, ldx, xq, sx};
    di_threadpool_run(tp, M, quant_row, &qj);

    /* about four tasks per thread for balance; the split never changes any result */
    int64_t per = (N + 4 * di_threadpool_size(tp) - 1) / (4 * di_threadpool_size(tp));
    per = (per + QT - 1) / QT * QT;
    if (per > TC) per = TC;
    gemm_job gj = {M, N, K, fp4, xq, sx, w, w_scale, y, ldy, per, p, pick_kernels()};
    di_threadpool_run(tp, (N + per - 1) / per, gemm_task, &gj);
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
