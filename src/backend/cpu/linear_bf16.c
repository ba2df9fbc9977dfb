/* bf16 × bf16 linears with f32 accumulation (spec §5.1: wo_a, compressors, router, LM head).
 *
 * Reduction order (fixed, see cpu_ops.h): 16 interleaved f32 partial sums, lane l owning
 * k ≡ l (mod 16) in ascending k, then the tree (l, l+8), (l, l+4), (l, l+2), (l, l+1), then the
 * K % 16 tail in order. AVX2 holds the 16 lanes in two registers, AVX-512 in one; the scalar path
 * keeps an array. Products are formed with a separate multiply (not FMA): bf16×bf16 is exact in
 * f32 except on underflow, and a separate rounding there keeps all paths identical.
 *
 * Work split: output columns in tiles of 4; each tile sweeps all input rows. */
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "util/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DI_X86 1
#endif

#define BT 4     /* output columns per tile */
#define LANES 16 /* partial sums per dot product */

/* dot products of one input row with BT weight rows; out[c] in f32 */
typedef void (*bdot_fn)(const uint16_t *x, const uint16_t *const *w, int64_t K, float *out);

static float lane_tree(float *a) {
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) a[l] = a[l] + a[l + half];
    return a[0];
}

static void bdot_scalar(const uint16_t *x, const uint16_t *const *w, int64_t K, float *out) {
    int64_t K16 = K - K % LANES;
    for (int c = 0; c < BT; c++) {
        float a[LANES] = {0};
        const uint16_t *wc = w[c];
        for (int64_t k = 0; k < K16; k += LANES)
            for (int l = 0; l < LANES; l++) {
                float p = di_bf16_to_f32(x[k + l]) * di_bf16_to_f32(wc[k + l]);
                a[l] = a[l] + p;
            }
        float s = lane_tree(a);
        for (int64_t k = K16; k < K; k++) {
            float p = di_bf16_to_f32(x[k]) * di_bf16_to_f32(wc[k]);
            s = s + p;
        }
        out[c] = s;
    }
}

#ifdef DI_X86
__attribute__((target("avx2,fma"))) static inline __m256 load8_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* lanes 0..7 in lo, 8..15 in hi → the scalar tree's result */
__attribute__((target("avx2,fma"))) static inline float tree_avx2(__m256 lo, __m256 hi) {
    __m256 v = _mm256_add_ps(lo, hi);                                                  /* l, l+8 */
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));    /* l, l+4 */
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));                                            /* l, l+2 */
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));                                        /* l, l+1 */
    return _mm_cvtss_f32(h);
}

__attribute__((target("avx2,fma"))) static void bdot_avx2(const uint16_t *x, const uint16_t *const *w, int64_t K,
                                                          float *out) {
    int64_t K16 = K - K % LANES;
    __m256 lo[BT], hi[BT];
    for (int c = 0; c < BT; c++) lo[c] = hi[c] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K16; k += LANES) {
        __m256 x0 = load8_bf16(x + k), x1 = load8_bf16(x + k + 8);
        for (int c = 0; c < BT; c++) {
            lo[c] = _mm256_add_ps(lo[c], _mm256_mul_ps(x0, load8_bf16(w[c] + k)));
            hi[c] = _mm256_add_ps(hi[c], _mm256_mul_ps(x1, load8_bf16(w[c] + k + 8)));
        }
    }
    for (int c = 0; c < BT; c++) {
        float s = tree_avx2(lo[c], hi[c]);
        for (int64_t k = K16; k < K; k++) {
            float p = di_bf16_to_f32(x[k]) * di_bf16_to_f32(w[c][k]);
            s = s + p;
        }
        out[c] = s;
    }
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))) static inline __m512 load16_bf16(
    const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))) static void bdot_avx512(
    const uint16_t *x, const uint16_t *const *w, int64_t K, float *out) {
    int64_t K16 = K - K % LANES;
    __m512 a[BT];
    for (int c = 0; c < BT; c++) a[c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K16; k += LANES) {
        __m512 xv = load16_bf16(x + k);
        for (int c = 0; c < BT; c++) a[c] = _mm512_add_ps(a[c], _mm512_mul_ps(xv, load16_bf16(w[c] + k)));
    }
    for (int c = 0; c < BT; c++) {
        float s = tree_avx2(_mm512_castps512_ps256(a[c]), _mm512_extractf32x8_ps(a[c], 1));
        for (int64_t k = K16; k < K; k++) {
            float p = di_bf16_to_f32(x[k]) * di_bf16_to_f32(w[c][k]);
            s = s + p;
        }
        out[c] = s;
    }
}
#endif

static bdot_fn pick_bdot(void) {
#ifdef DI_X86
    switch (di_cpu_isa_active()) {
    case DI_ISA_AVX512: return bdot_avx512;
    case DI_ISA_AVX2: return bdot_avx2;
    default: break;
    }
#endif
    return bdot_scalar;
}

typedef struct {
    int64_t M, N, K;
    const uint16_t *x;
    int64_t ldx;
    const uint16_t *w;
    int64_t ldw;
    uint16_t *y16; /* exactly one of y16 / y32 is set */
    float *y32;
    int64_t ldy;
    bdot_fn dot;
} bgemm_job;

static void bgemm_tile(void *ctx, int64_t tile, int thread) {
    (void)thread;
    const bgemm_job *j = ctx;
    int64_t n0 = tile * BT;
    int nt = j->N - n0 < BT ? (int)(j->N - n0) : BT;
    const uint16_t *w[BT]; /* BT weight rows, bf16 [K] each */
    /* a short last tile repeats its last row; the extra results are dropped */
    for (int c = 0; c < BT; c++) w[c] = j->w + (n0 + (c < nt ? c : nt - 1)) * j->ldw;
    for (int64_t m = 0; m < j->M; m++) {
        float out[BT]; /* f32 dot products of row m with the tile's columns */
        j->dot(j->x + m * j->ldx, w, j->K, out);
        if (j->y16) {
            uint16_t *y = j->y16 + m * j->ldy + n0;
            for (int c = 0; c < nt; c++) y[c] = di_f32_to_bf16(out[c]);
        } else {
            memcpy(j->y32 + m * j->ldy + n0, out, (size_t)nt * sizeof(float));
        }
    }
}

static void bgemm(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                  const uint16_t *w, int64_t ldw, uint16_t *y16, float *y32, int64_t ldy) {
    if (M <= 0 || N <= 0) return;
    bgemm_job j = {M, N, K, x, ldx, w, ldw, y16, y32, ldy, pick_bdot()};
    di_threadpool_run(tp, (N + BT - 1) / BT, bgemm_tile, &j);
}

void di_cpu_linear_bf16(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx,
                        const uint16_t *w, int64_t ldw, uint16_t *y, int64_t ldy) {
    bgemm(tp, M, N, K, x, ldx, w, ldw, y, NULL, ldy);
}

void di_cpu_linear_bf16_f32(di_threadpool *tp, int64_t M, int64_t N, int64_t K, const uint16_t *x,
                            int64_t ldx, const uint16_t *w, int64_t ldw, float *y, int64_t ldy) {
    bgemm(tp, M, N, K, x, ldx, w, ldw, NULL, y, ldy);
}

void di_cpu_wo_a_grouped(di_threadpool *tp, int64_t M, int n_groups, int64_t in_per_group, int64_t rank,
                         const uint16_t *o, const uint16_t *wo_a, uint16_t *out) {
    /* einsum("bsgd,grd->bsgr"): group g reads its own slice of o and its own rows of wo_a */
    for (int g = 0; g < n_groups; g++)
        bgemm(tp, M, rank, in_per_group, o + g * in_per_group, n_groups * in_per_group,
              wo_a + g * rank * in_per_group, in_per_group, out + g * rank, NULL, n_groups * rank);
}

void di_cpu_dequant_fp8_bf16(int64_t rows, int64_t cols, const uint8_t *w, const uint8_t *scale, uint16_t *out) {
    int64_t sb = (cols + DI_QBLOCK - 1) / DI_QBLOCK; /* scale blocks per row */
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *s = scale + (r / DI_QBLOCK) * sb;
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = di_f32_to_bf16(di_e4m3_to_f32(w[r * cols + c]) * di_e8m0_to_f32(s[c / DI_QBLOCK]));
    }
}
