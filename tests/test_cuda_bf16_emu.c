/* di-test: asan
 * Host replica of the per-thread arithmetic of src/backend/cuda/cuda_gemm_bf16.cu, checked bit for bit
 * against the CPU op (di_cpu_linear_bf16_f32) without a GPU. The replica walks the kernels' own index
 * math — which thread owns which lane, the stage / chunk loops, the xor-shuffle tree, who adds the
 * tail — so a wrong lane mapping or tree pairing shows up here before a device run:
 *  - tiled kernel: 64 × 32 blocks, lane pair (j, j + 8) per thread, 32-k stages of two 16-chunks, the
 *    (l, l+8) add in the thread then xor 4, 2, 1 over the 8 lane-pair threads, thread j's row; the FMA
 *    fast path per block from the row range flags (fmaf, which C requires to round once);
 *  - GEMV kernel: lane t % 16 of column t / 16, 1024-k chunks, xor 8, 4, 2, 1, thread l's row, rows
 *    split over blocks by rb.
 * Inputs: Gaussian rows plus rows holding bf16 subnormals, 1e±30/1e37 values, ±inf, NaN and -0, so some
 * blocks take the FMA path and some the multiply-add path; a control asserts that FMA forced onto the
 * flagged blocks does differ from the CPU on these inputs (the range check is not vacuous). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "util/threadpool.h"

#define LANES 16
#define TBM 64
#define TBN 32
#define TKC 64
#define GCOLS 16
#define GKCH 1024

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static double gauss(void) {
    double u = (double)(rnd() >> 11) * 0x1p-53, v = (double)(rnd() >> 11) * 0x1p-53;
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static float bf(uint16_t h) { return di_bf16_to_f32(h); }

/* the kernel's fma_safe: zero, inf/NaN, or a finite magnitude in [2^-63, 2^63) */
static int fma_safe(uint16_t h) {
    uint32_t a = h & 0x7fffu;
    return a == 0 || a >= 0x7f80u || a - 0x2000u < 0x3f00u;
}
static int row_safe(const uint16_t *r, int64_t k) {
    for (int64_t i = 0; i < k; i++)
        if (!fma_safe(r[i])) return 0;
    return 1;
}

/* rows: Gaussian (sd); row `special` (if in range) gets the special values, row special + 1 the FMA
 * probe: zeros except k = 0 and k = 16 (both lane 0). With the x probe 2^-75, 2^-75 and the w probe
 * (is_w) 2^-74, 2^-75 the products are 2^-149 (one subnormal ulp, exact) and 2^-150 (half an ulp: the
 * separate multiply rounds it to 0 by ties-to-even, an FMA adds it to 2^-149 and rounds to 2^-148), so
 * the probe output tells the two paths apart. */
static uint16_t *make_rows(int64_t rows, int64_t k, double sd, int64_t special, int is_w) {
    uint16_t *p = malloc(sizeof *p * (size_t)(rows * k + 1));
    assert_non_null(p);
    for (int64_t i = 0; i < rows * k; i++) p[i] = di_f32_to_bf16((float)(gauss() * sd));
    if (special >= 0 && special < rows && k >= 24) {
        uint16_t *r = p + special * k;
        r[0] = 0x8000;                                           /* -0 */
        r[1] = 0x0001, r[2] = 0x807f, r[3] = 0x0040;             /* bf16 subnormals */
        r[4] = di_f32_to_bf16(1e-30f), r[5] = di_f32_to_bf16(-3e-30f);
        r[6] = di_f32_to_bf16(1e37f), r[7] = di_f32_to_bf16(-2e37f);
        r[8] = di_f32_to_bf16(5e-20f);                           /* below 2^-63 */
        r[9] = di_f32_to_bf16(1e19f);                            /* above 2^63 */
        if (k >= 64) r[40] = 0x7f80, r[41] = 0xff80;             /* ±inf (and inf − inf → NaN) */
        if (k >= 200) r[150] = 0x7fc1;                           /* NaN */
        if (special + 1 < rows) {
            r += k;
            memset(r, 0, sizeof *r * (size_t)k);
            r[0] = di_f32_to_bf16(is_w ? 0x1p-74f : 0x1p-75f), r[16] = di_f32_to_bf16(0x1p-75f);
        }
    }
    return p;
}

/* ---------------- tiled kernel replica ---------------- */
/* force: 0 = the kernel's rule (flags), 1 = FMA on every block (control), -1 = never FMA.
 * Returns the number of blocks that took the FMA path. */
static int emu_tiled(int64_t M, int64_t N, int64_t K, const uint16_t *x, const uint16_t *w, float *y, int force) {
    const int64_t K16 = K - K % LANES;
    int fast_blocks = 0;
    for (int64_t m0 = 0; m0 < M; m0 += TBM)
        for (int64_t n0 = 0; n0 < N; n0 += TBN) {
            int fast = force >= 0;
            if (force == 0) {
                for (int64_t r = m0; r < m0 + TBM && r < M; r++) fast &= row_safe(x + r * K, K);
                for (int64_t r = n0; r < n0 + TBN && r < N; r++) fast &= row_safe(w + r * K, K);
            }
            fast_blocks += fast;
            for (int sm = 0; sm < TBM / 8; sm++)
                for (int sn = 0; sn < TBN / 8; sn++) {
                    static float acc[8][2][8][8]; /* [thread j][lane j, j+8][row][col] */
                    memset(acc, 0, sizeof acc);
                    for (int64_t k0 = 0; k0 < K16; k0 += TKC) {
                        const int chunks = K16 - k0 >= TKC ? TKC / LANES : (int)((K16 - k0) / LANES);
                        for (int c = 0; c < chunks; c++)
                            for (int j = 0; j < 8; j++)
                                for (int h = 0; h < 2; h++) {
                                    const int64_t k = k0 + c * LANES + j + 8 * h;
                                    float xv[8], wv[8]; /* rows / cols past M / N are zero-filled */
                                    for (int i = 0; i < 8; i++) {
                                        int64_t m = m0 + sm * 8 + i, n = n0 + sn * 8 + i;
                                        xv[i] = m < M ? bf(x[m * K + k]) : 0.0f;
                                        wv[i] = n < N ? bf(w[n * K + k]) : 0.0f;
                                    }
                                    for (int i = 0; i < 8; i++)
                                        for (int q = 0; q < 8; q++) {
                                            float *a = &acc[j][h][i][q];
                                            if (fast) *a = fmaf(xv[i], wv[q], *a);
                                            else {
                                                float p = xv[i] * wv[q];
                                                *a = *a + p;
                                            }
                                        }
                                }
                    }
                    for (int i = 0; i < 8; i++)
                        for (int q = 0; q < 8; q++) {
                            float s[8], t[8];
                            for (int j = 0; j < 8; j++) s[j] = acc[j][0][i][q] + acc[j][1][i][q];
                            for (int off = 4; off >= 1; off /= 2) { /* __shfl_xor_sync: every thread adds its partner */
                                for (int j = 0; j < 8; j++) t[j] = s[j] + s[j ^ off];
                                memcpy(s, t, sizeof s);
                            }
                            for (int j = 0; j < 8; j++) acc[j][0][i][q] = s[j];
                        }
                    for (int j = 0; j < 8; j++) { /* thread j stores row j of the sub-tile */
                        const int64_t m = m0 + sm * 8 + j;
                        if (m >= M) continue;
                        for (int q = 0; q < 8; q++) {
                            const int64_t n = n0 + sn * 8 + q;
                            if (n >= N) break;
                            float s = acc[j][0][j][q];
                            for (int64_t k = K16; k < K; k++) {
                                float p = bf(x[m * K + k]) * bf(w[n * K + k]);
                                s = s + p;
                            }
                            y[m * N + n] = s;
                        }
                    }
                }
        }
    return fast_blocks;
}

/* ---------------- GEMV replica ---------------- */
static void emu_gemv(int64_t M, int64_t N, int64_t K, const uint16_t *x, const uint16_t *w, float *y, int rb) {
    const int64_t K16 = K - K % LANES;
    for (int64_t m0 = 0; m0 < M; m0 += rb) {
        const int mb = (int)(M - m0 < rb ? M - m0 : rb);
        for (int64_t n = 0; n < N; n++) {
            float acc[LANES][16] = {{0}}; /* [thread l][row] */
            for (int64_t k0 = 0; k0 < K16; k0 += GKCH) {
                const int steps = (int)((K16 - k0 < GKCH ? K16 - k0 : GKCH) / LANES);
                for (int s = 0; s < steps; s++)
                    for (int l = 0; l < LANES; l++) {
                        const int64_t k = k0 + s * LANES + l;
                        const float wf = bf(w[n * K + k]);
                        for (int r = 0; r < mb; r++) {
                            float p = bf(x[(m0 + r) * K + k]) * wf;
                            acc[l][r] = acc[l][r] + p;
                        }
                    }
            }
            for (int r = 0; r < mb; r++) {
                float s[LANES], t[LANES];
                for (int l = 0; l < LANES; l++) s[l] = acc[l][r];
                for (int off = 8; off >= 1; off /= 2) {
                    for (int l = 0; l < LANES; l++) t[l] = s[l] + s[l ^ off];
                    memcpy(s, t, sizeof s);
                }
                float v = s[r]; /* thread l = r stores row r */
                for (int64_t k = K16; k < K; k++) {
                    float p = bf(x[(m0 + r) * K + k]) * bf(w[n * K + k]);
                    v = v + p;
                }
                y[(m0 + r) * N + n] = v;
            }
        }
    }
}

/* ---------------- checks ---------------- */
static int64_t mismatches(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4) && !(isnan(a[i]) && isnan(b[i]))) d++;
    return d;
}

static di_threadpool *tp;

static float *cpu_ref(int64_t M, int64_t N, int64_t K, const uint16_t *x, const uint16_t *w) {
    float *y = malloc(sizeof *y * (size_t)(M * N + 1));
    assert_non_null(y);
    di_cpu_linear_bf16_f32(tp, M, N, K, x, K, w, K, y, N);
    return y;
}

static void tiled_case(int64_t M, int64_t N, int64_t K, int64_t xspecial, int64_t wspecial, int want_mixed) {
    uint16_t *x = make_rows(M, K, 1.0, xspecial, 0), *w = make_rows(N, K, 0.02, wspecial, 1);
    float *ref = cpu_ref(M, N, K, x, w), *y = malloc(sizeof *y * (size_t)(M * N + 1));
    assert_non_null(y);
    const int blocks = (int)(((M + TBM - 1) / TBM) * ((N + TBN - 1) / TBN));
    int fast = emu_tiled(M, N, K, x, w, y, 0);
    int64_t d = mismatches(y, ref, M * N);
    tu_report("tiled emu M%lld N%lld K%lld: %d of %d blocks FMA, %lld mismatches", (long long)M, (long long)N,
              (long long)K, fast, blocks, (long long)d);
    assert_int_equal(d, 0);
    assert_int_equal(emu_tiled(M, N, K, x, w, y, -1), 0);
    assert_int_equal(mismatches(y, ref, M * N), 0);
    if (want_mixed) { /* both paths were taken, and FMA where the flags forbid it would be wrong */
        assert_true(fast > 0 && fast < blocks);
        assert_true(ref[(xspecial + 1) * N + wspecial + 1] == 0x1p-149f); /* the probe, multiply-then-add */
        emu_tiled(M, N, K, x, w, y, 1);
        int64_t forced = mismatches(y, ref, M * N);
        tu_report("tiled emu M%lld N%lld K%lld: FMA forced on every block: %lld mismatches", (long long)M, (long long)N,
                  (long long)K, (long long)forced);
        assert_true(forced > 0);
    }
    free(x), free(w), free(ref), free(y);
}

static void test_tiled_edges(void **state) {
    (void)state;
    tiled_case(130, 70, 200, 70, 40, 1); /* specials in block row 1 and block column 1 */
    tiled_case(66, 34, 1000, 64, 32, 1); /* K % 16 = 8; row / column 64, 32 start the last tiles */
    tiled_case(3, 37, 100, -1, -1, 0);   /* K % 16 = 4 */
    tiled_case(17, 5, 16, -1, -1, 0);    /* one 16-chunk: a half stage */
    tiled_case(20, 9, 48, -1, -1, 0);    /* a full stage then a half stage */
    tiled_case(4, 3, 7, -1, -1, 0);      /* tail only */
    tiled_case(66, 40, 0, -1, -1, 0);    /* K = 0: +0 */
}

static void test_tiled_real_k(void **state) {
    (void)state;
    tiled_case(70, 35, 5120, 1, 33, 1); /* router / compressor K */
    tiled_case(65, 33, 4096, -1, -1, 0); /* wo_a group K */
}

static void gemv_case(int64_t M, int64_t N, int64_t K, int rb, int64_t special) {
    uint16_t *x = make_rows(M, K, 1.0, special, 0), *w = make_rows(N, K, 0.02, special >= 0 ? N - 2 : -1, 1);
    float *ref = cpu_ref(M, N, K, x, w), *y = malloc(sizeof *y * (size_t)(M * N + 1));
    assert_non_null(y);
    emu_gemv(M, N, K, x, w, y, rb);
    int64_t d = mismatches(y, ref, M * N);
    tu_report("gemv emu M%lld N%lld K%lld rb %d: mismatches %lld", (long long)M, (long long)N, (long long)K, rb, (long long)d);
    assert_int_equal(d, 0);
    free(x), free(w), free(ref), free(y);
}

static void test_gemv(void **state) {
    (void)state;
    gemv_case(1, 40, 5120, 1, -1);   /* weights_proj-like */
    gemv_case(8, 24, 5120, 8, 3);    /* router-like, specials */
    gemv_case(8, 24, 5120, 1, 3);    /* rows split over blocks */
    gemv_case(3, 33, 2100, 4, 1);    /* K % 16 = 4, a partial 1024-chunk, 3 rows of a 4-row block */
    gemv_case(16, 20, 1030, 16, 15); /* 16 rows: every lane thread stores */
    gemv_case(17, 9, 300, 16, 16);   /* a 16-row block and a 1-row block */
    gemv_case(5, 7, 9, 5, -1);       /* tail only */
}

int main(void) {
    di_error err;
    if (di_threadpool_create(2, &tp, &err) != DI_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiled_edges),
        cmocka_unit_test(test_tiled_real_k),
        cmocka_unit_test(test_gemv),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    di_threadpool_destroy(tp);
    return rc;
}
