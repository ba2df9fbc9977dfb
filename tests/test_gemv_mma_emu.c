/* Host emulation of the tensor-core MXFP4 GEMV (src/backend/cuda/cuda_gemv_mma.cu), no GPU needed.
 *
 * The kernel's arithmetic is its lane functions (cuda_gemv_mma.cuh, compiled here as C: the prmt weight
 * expansion, the x digit planes through the kernel's 256-entry table, the slot map, the shuffle
 * combination, the block value) plus three warp primitives emulated from their PTX definitions:
 * mma.sync m16n8k32 s8·s8 → s32 (A / B / C fragment layouts as the PTX ISA gives them; the one input
 * this test takes on trust, checked by the GPU test tests/cuda/test_cuda_gemv_mma.c), __shfl_xor_sync,
 * and the per-lane weight / scale loads. The walk is the kernel's: row groups of MT, tiles of NC columns,
 * units of block pairs, n8 tiles of slots, then the ordered f32 sum of each output.
 *
 * Checked, bit for bit:
 *  1. every exact block sum S (each (row, column, block) written exactly once) against Σ X·W formed from
 *     the decoded values in f64, on all 256 e4m3 codes × all 16 E2M1 codes, and at the real shapes;
 *  2. the bf16 outputs against di_cpu_linear_fp4 (the CPU op, from bf16 x) at the V4.1 expert shapes
 *     2304×5120 (w1/w3) and 5120×2304 (w2), M = 1 … 5, both column tiles, and on special inputs: zero
 *     rows, rows at the e4m3 limit (codes ±448), NaN and ±inf x (NaN groups: scale byte 255, codes 0x7F),
 *     weight scales 2^−127 / 2^127 / NaN, every E2M1 code, an edge shape (N = 37, K = 384, M = 3).
 * NaN outputs are compared as NaN (the GPU's canonical NaN and x86's payloads differ in bits; the
 * current kernel's rows in test_cuda_ops compare the same way); every other output bit for bit.
 * The grouped expert GEMM of cuda_moe_mm.cu (its lane functions gvm_s8x8 / gvm_mm_a_frag / gvm_mm_sum, its
 * walk emulated by emu_mm: ldmatrix's fragment, three MMAs per n8 tile, the in-register f32 sums) is
 * checked the same way on the same inputs (1 and 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemv_mma.cuh"
#include "io/formats.h"
#include "testutil.h"
#include "util/threadpool.h"

static di_threadpool *tp;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static double gauss(void) {
    double u = ((double)(rnd() >> 11) + 0.5) * 0x1p-53, v = (double)(rnd() >> 11) * 0x1p-53;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* ---- the warp primitives ---- */

/* d[lane] += A·B of one mma.m16n8k32.row.col.s32.s8.s8.s32 (PTX fragment layouts; g = lane / 4, q = lane % 4):
 * A register 0 byte i = A[g][4q+i], 1 = A[g+8][4q+i], 2 = A[g][16+4q+i], 3 = A[g+8][16+4q+i];
 * B register 0 byte i = B[4q+i][g], 1 = B[16+4q+i][g]; C: c0 = C[g][2q], c1 = C[g][2q+1], c2 = C[g+8][2q],
 * c3 = C[g+8][2q+1]. Products and sums in int64, then checked to fit int32 (the exactness claim). */
static void emu_mma(int32_t d[32][4], uint32_t a[32][4], uint32_t b[32][2]) {
    int8_t A[16][32], B[32][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, q = l & 3;
        for (int i = 0; i < 4; i++) {
            A[g][4 * q + i] = (int8_t)(a[l][0] >> (8 * i));
            A[g + 8][4 * q + i] = (int8_t)(a[l][1] >> (8 * i));
            A[g][16 + 4 * q + i] = (int8_t)(a[l][2] >> (8 * i));
            A[g + 8][16 + 4 * q + i] = (int8_t)(a[l][3] >> (8 * i));
            B[4 * q + i][g] = (int8_t)(b[l][0] >> (8 * i));
            B[16 + 4 * q + i][g] = (int8_t)(b[l][1] >> (8 * i));
        }
    }
    int64_t D[16][8];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) {
            int64_t s = 0;
            for (int k = 0; k < 32; k++) s += (int64_t)A[r][k] * B[k][c];
            D[r][c] = s;
        }
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, q = l & 3;
        int64_t v[4] = {d[l][0] + D[g][2 * q], d[l][1] + D[g][2 * q + 1], d[l][2] + D[g + 8][2 * q],
                        d[l][3] + D[g + 8][2 * q + 1]};
        for (int r = 0; r < 4; r++) {
            assert_true(v[r] >= INT32_MIN && v[r] <= INT32_MAX);
            d[l][r] = (int32_t)v[r];
        }
    }
}

/* ---- the kernel's walk ---- */

typedef struct {
    int64_t N, K;
    const uint8_t *xq, *xs; /* e4m3 [M, K], E8M0 [M, K/32] */
    const uint8_t *w, *ws;  /* E2M1 [N, K/2], E8M0 [N, K/32] */
} problem;

/* One launch: rows r0 … r0+mt−1 with the MT / NC instantiation. sums (optional) int64 [M][N][K/32]
 * receives each S (and counts writes in hits). */
static void emu_launch(const problem *p, int MT, int NC, int64_t r0, int mt, uint16_t *y, int64_t *sums,
                       uint8_t *hits) {
    const int64_t K = p->K, N = p->N, KB = K / 32, NU = KB / (2 * GVM_UP), ps = K + GVM_PAD, rowb = K / 2;
    const int NT = MT; /* n8 tiles per block pair */
    uint8_t *xd = xmalloc((size_t)(MT * 3 * ps)); /* s8 [MT][3][ps] */
    float *sxs = xmalloc(sizeof(float) * (size_t)(MT * KB));
    float *pb = xmalloc(sizeof(float) * (size_t)(MT * NC * KB));
    uint32_t tab[256]; /* the kernel's table of code → digits */
    for (uint32_t c = 0; c < 256; c++) tab[c] = gvm_x_digits_entry(c);
    for (int m = 0; m < mt; m++) {
        for (int64_t c = 0; c < K / 4; c++) {
            uint32_t codes, dig[3];
            memcpy(&codes, p->xq + (r0 + m) * K + 4 * c, 4);
            gvm_x_digits_tab(tab, codes, dig);
            for (int d = 0; d < 3; d++) memcpy(xd + (m * 3 + d) * ps + 4 * c, &dig[d], 4);
        }
        for (int64_t kb = 0; kb < KB; kb++) sxs[m * KB + kb] = gvm_x_scale(p->xs[(r0 + m) * KB + kb]);
    }
    const int64_t ntiles = (N + NC - 1) / NC;
    for (int64_t tile = 0; tile < ntiles; tile++) {
        const int64_t n0 = tile * NC;
        for (size_t i = 0; i < (size_t)(MT * NC * KB); i++) pb[i] = NAN; /* unwritten → visible */
        for (int64_t u = 0; u < NU; u++)
            for (int i = 0; i < GVM_UP; i++) {
                const int64_t kb0 = 2 * (u * GVM_UP + i);
                uint32_t apos[2][32][4], aneg[2][32][4], sw[32];
                for (int l = 0; l < 32; l++) { /* gvm_load, then gvm_a_frag */
                    const int g = l >> 2, q = l & 3;
                    uint32_t wv[2][2];
                    for (int j = 0; j < 2; j++)
                        for (int r = 0; r < 2; r++) {
                            const int64_t row = n0 + g + 8 * r;
                            wv[j][r] = 0;
                            if ((NC == 16 || r == 0) && row < N) memcpy(&wv[j][r], p->w + row * rowb + (kb0 + j) * 16 + 4 * q, 4);
                        }
                    const int64_t orow = n0 + g + 8 * (q & 1);
                    sw[l] = (NC == 16 || (q & 1) == 0) && orow < N
                                ? (uint32_t)p->ws[orow * KB + kb0] | (uint32_t)p->ws[orow * KB + kb0 + 1] << 8
                                : 0u;
                    for (int j = 0; j < 2; j++) gvm_a_frag(wv[j][0], wv[j][1], apos[j][l], aneg[j][l]);
                }
                for (int t = 0; t < NT; t++) {
                    int32_t cp[32][4] = {{0}}, cn[32][4] = {{0}};
                    for (int j = 0; j < 2; j++) {
                        if (MT != 1 && j != (2 * t) / MT) continue;
                        uint32_t b[32][2];
                        for (int l = 0; l < 32; l++) {
                            const int g = l >> 2, q = l & 3, bh = g >> 2, bd = g & 3;
                            int bj, bm;
                            gvm_slot(MT, 2 * t + bh, &bj, &bm);
                            b[l][0] = b[l][1] = 0;
                            if (bj == j && bd < 3 && bm < mt)
                                memcpy(b[l], xd + (bm * 3 + bd) * ps + (kb0 + j) * 32 + 8 * q, 8);
                        }
                        emu_mma(cp, apos[j], b);
                        emu_mma(cn, aneg[j], b);
                    }
                    int32_t c[32][4], send[32];
                    for (int l = 0; l < 32; l++) {
                        for (int r = 0; r < 4; r++) c[l][r] = cp[l][r] - cn[l][r];
                        send[l] = gvm_send(l & 1, c[l]);
                    }
                    for (int l = 0; l < 32; l++) {
                        const int g = l >> 2, q = l & 3, odd = q & 1;
                        const int32_t s = gvm_block_sum(odd, c[l], send[l ^ 1]); /* __shfl_xor_sync(…, 1) */
                        int oj, om;
                        gvm_slot(MT, 2 * t + (q >> 1), &oj, &om);
                        const int orow = g + 8 * odd;
                        if (om < mt && orow < NC && n0 + orow < N) {
                            const int64_t kb = kb0 + oj;
                            pb[((int64_t)om * NC + orow) * KB + kb] = gvm_block_value(s, sxs[om * KB + kb], (sw[l] >> (8 * oj)) & 0xffu);
                            if (sums) {
                                const int64_t at = ((r0 + om) * N + n0 + orow) * KB + kb;
                                sums[at] = s;
                                hits[at]++;
                            }
                        }
                    }
                }
            }
        const int ncol = (int)(N - n0 < NC ? N - n0 : NC);
        for (int m = 0; m < mt; m++)
            for (int cc = 0; cc < ncol; cc++) {
                float acc = 0.0f;
                for (int64_t kb = 0; kb < KB; kb++) acc = acc + pb[((int64_t)m * NC + cc) * KB + kb];
                y[(r0 + m) * N + n0 + cc] = di_f32_to_bf16(acc);
            }
    }
    free(xd), free(sxs), free(pb);
}

/* di_cuda_gemv_mma_run's row grouping */
static void emu_gemv(const problem *p, int64_t M, int NC, uint16_t *y, int64_t *sums, uint8_t *hits) {
    for (int64_t r0 = 0; r0 < M;) {
        const int64_t left = M - r0;
        const int mt = left == 1 ? 1 : left == 2 ? 2 : 4, used = (int)(left < mt ? left : mt);
        emu_launch(p, mt, NC, r0, used, y, sums, hits);
        r0 += used;
    }
}

/* ---- the grouped expert GEMM's walk (cuda_moe_mm.cu) ----
 * Passes of up to MOE_MM_ROWS (16) rows; per 16 output columns (one warp) and block, ascending: each lane's
 * code words of rows g and g+8 as ldmatrix hands them (bytes 4q..4q+3 of the row's 16-byte block),
 * gvm_mm_a_frag, per n8 tile of rows three MMAs (B = bytes 8q..8q+7 of plane d of row 8t+g), then per
 * accumulator element gvm_mm_sum and gvm_block_value added to that (row, column)'s f32 sum. Rows past the
 * pass compute on a copy of its first row and are dropped, as in the kernel. */
static void emu_mm(const problem *p, int64_t M, uint16_t *y, int64_t *sums, uint8_t *hits) {
    const int64_t K = p->K, N = p->N, KB = K / 32, rowb = K / 2;
    for (int64_t r0 = 0; r0 < M; r0 += 16) {
        const int rows = (int)(M - r0 < 16 ? M - r0 : 16);
        uint8_t *xd = xmalloc((size_t)(16 * 3 * K)); /* [row][plane][K] */
        float *sx = xmalloc(sizeof(float) * (size_t)(16 * KB));
        for (int rr = 0; rr < 16; rr++) {
            const int64_t src = r0 + (rr < rows ? rr : 0);
            for (int64_t c = 0; c < K / 4; c++) {
                uint32_t codes, dig[3];
                memcpy(&codes, p->xq + src * K + 4 * c, 4);
                gvm_x_digits(codes, dig);
                for (int d = 0; d < 3; d++) memcpy(xd + (rr * 3 + d) * K + 4 * c, &dig[d], 4);
            }
            for (int64_t kb = 0; kb < KB; kb++) sx[rr * KB + kb] = gvm_x_scale(p->xs[src * KB + kb]);
        }
        const int nt = (rows + 7) / 8;
        for (int64_t n0 = 0; n0 < N; n0 += 16) {
            float acc[32][2][4] = {{{0}}};
            for (int64_t kb = 0; kb < KB; kb++) {
                uint32_t a[32][4];
                for (int l = 0; l < 32; l++) {
                    const int g = l >> 2, q = l & 3;
                    uint32_t wv[2];
                    for (int r = 0; r < 2; r++) { /* rows past N: the kernel reads row N − 1 */
                        const int64_t row = n0 + g + 8 * r < N ? n0 + g + 8 * r : N - 1;
                        memcpy(&wv[r], p->w + row * rowb + kb * 16 + 4 * q, 4);
                    }
                    gvm_mm_a_frag(wv[0], wv[1], a[l]);
                }
                for (int t = 0; t < nt; t++) {
                    int32_t c[3][32][4] = {{{0}}};
                    for (int d = 0; d < 3; d++) {
                        uint32_t b[32][2];
                        for (int l = 0; l < 32; l++)
                            memcpy(b[l], xd + ((8 * t + (l >> 2)) * 3 + d) * K + kb * 32 + 8 * (l & 3), 8);
                        emu_mma(c[d], a, b);
                    }
                    for (int l = 0; l < 32; l++) {
                        const int g = l >> 2, q = l & 3;
                        for (int e = 0; e < 4; e++) {
                            const int xr = 8 * t + 2 * q + (e & 1);
                            const int64_t n = n0 + g + 8 * (e >> 1), nr = n < N ? n : N - 1;
                            const int32_t S = gvm_mm_sum(c[0][l][e], c[1][l][e], c[2][l][e]);
                            acc[l][t][e] = acc[l][t][e] + gvm_block_value(S, sx[xr * KB + kb], p->ws[nr * KB + kb]);
                            if (sums && xr < rows && n < N) {
                                const int64_t at = ((r0 + xr) * N + n) * KB + kb;
                                sums[at] = S;
                                hits[at]++;
                            }
                        }
                    }
                }
            }
            for (int l = 0; l < 32; l++)
                for (int t = 0; t < nt; t++)
                    for (int e = 0; e < 4; e++) {
                        const int xr = 8 * t + 2 * (l & 3) + (e & 1);
                        const int64_t n = n0 + (l >> 2) + 8 * (e >> 1);
                        if (xr < rows && n < N) y[(r0 + xr) * N + n] = di_f32_to_bf16(acc[l][t][e]);
                    }
        }
        free(xd), free(sx);
    }
}

/* ---- references ---- */

/* Σ X·W of one block from the decoded values (exact in f64), X = x·2^9, W = 2·w: S·2^−10 = Σ x·w. The NaN
 * codes 0x7F / 0xFF count as ±480 (the kernel's finite X = ±15·2^14: they only occur in groups whose
 * scale is NaN) */
static double ref_block(const problem *p, int64_t m, int64_t n, int64_t kb) {
    double s = 0;
    for (int k = 0; k < 32; k++) {
        const int64_t kk = kb * 32 + k;
        const uint8_t b = p->w[n * (p->K / 2) + kk / 2];
        const double wv = di_e2m1_to_f32(kk & 1 ? di_fp4_odd(b) : di_fp4_even(b));
        const uint8_t xc = p->xq[m * p->K + kk];
        const double xv = (xc & 0x7f) == 0x7f ? (xc & 0x80 ? -480.0 : 480.0) : (double)di_e4m3_to_f32(xc);
        s += xv * wv;
    }
    return s * 1024.0;
}

/* sums of every (row, column, block) written once and equal to ref_block */
static int64_t check_sums(const problem *p, int64_t M, const int64_t *sums, const uint8_t *hits, int64_t *checked) {
    int64_t bad = 0, KB = p->K / 32;
    *checked = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < p->N; n++)
            for (int64_t kb = 0; kb < KB; kb++) {
                const int64_t at = (m * p->N + n) * KB + kb;
                if (hits[at] != 1) {
                    if (bad++ < 5) fprintf(stderr, "block (%lld, %lld, %lld) written %d times\n", (long long)m, (long long)n, (long long)kb, hits[at]);
                    continue;
                }
                const double r = ref_block(p, m, n, kb);
                (*checked)++;
                if ((double)sums[at] != r && bad++ < 5)
                    fprintf(stderr, "S (%lld, %lld, %lld) = %lld, exact %.1f\n", (long long)m, (long long)n, (long long)kb,
                            (long long)sums[at], r);
            }
    return bad;
}

/* y bf16 [M, N] from the codes by linear_q.c's contract: the block sum of the decoded values in f64 (NaN
 * codes decode to NaN), rounded to f32, times s_x, times s_w, added in ascending block order */
static void ref_outputs(const problem *p, int64_t M, uint16_t *y) {
    const int64_t KB = p->K / 32;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < p->N; n++) {
            float acc = 0.0f;
            for (int64_t kb = 0; kb < KB; kb++) {
                double s = 0;
                for (int k = 0; k < 32; k++) {
                    const int64_t kk = kb * 32 + k;
                    const uint8_t b = p->w[n * (p->K / 2) + kk / 2];
                    s += (double)di_e4m3_to_f32(p->xq[m * p->K + kk]) *
                         (double)di_e2m1_to_f32(kk & 1 ? di_fp4_odd(b) : di_fp4_even(b));
                }
                float v = (float)s * di_e8m0_to_f32(p->xs[m * KB + kb]);
                v = v * di_e8m0_to_f32(p->ws[n * KB + kb]);
                acc = acc + v;
            }
            y[m * p->N + n] = di_f32_to_bf16(acc);
        }
}

static int bf16_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* outputs that differ (NaN = NaN); *nans counts the NaN outputs */
static int64_t diff_bf16(const uint16_t *a, const uint16_t *b, int64_t n, int64_t *nans) {
    int64_t bad = 0;
    *nans = 0;
    for (int64_t i = 0; i < n; i++) {
        if (bf16_nan(a[i]) || bf16_nan(b[i])) {
            *nans += 1;
            bad += !(bf16_nan(a[i]) && bf16_nan(b[i]));
        } else {
            bad += a[i] != b[i];
        }
    }
    return bad;
}

/* ---- 1. every e4m3 code × every E2M1 code ---- */

/* x row m: codes (m·37 + k) mod 256 (each block a run of 32 consecutive codes, 8 blocks cover all 256
 * codes, rows shifted; the NaN codes in row 0 only); weight row n: code (n + k·(1 + n mod 5)) mod 16,
 * rows 0–15 one constant code each. Checked: every block sum, and every output against the contract
 * evaluated from the codes (ref_outputs), with x scales down to 2^−127 and NaN */
static void test_all_codes(void **state) {
    (void)state;
    enum { M = 4, N = 53, K = 1024 };
    problem p = {N, K, NULL, NULL, NULL, NULL};
    uint8_t *xq = xmalloc(M * K), *xs = xmalloc(M * K / 32), *w = xmalloc(N * K / 2), *ws = xmalloc(N * K / 32);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) { /* rows past 0 without the NaN codes: their outputs stay finite */
            uint8_t c = (uint8_t)(m * 37 + k);
            xq[m * K + k] = m > 0 && (c & 0x7f) == 0x7f ? c ^ 1 : c;
        }
    for (int m = 0; m < M; m++) /* x scales: 2^−127 and 2^−118 (s_x·2^−10 subnormal), ordinary ones; the NaN
                                 * byte where the block holds a NaN code (as act-quant pairs them) */
        for (int kb = 0; kb < K / 32; kb++) {
            int nan = 0;
            for (int k = 0; k < 32; k++) nan |= (xq[m * K + kb * 32 + k] & 0x7f) == 0x7f;
            xs[m * (K / 32) + kb] = nan ? 255 : kb % 8 == 0 ? (kb % 16 ? 9 : 0) : (uint8_t)(118 + (m + kb) % 12);
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k += 2) {
            int c0 = n < 16 ? n : (n + k * (1 + n % 5)) & 15, c1 = n < 16 ? n : (n + (k + 1) * (1 + n % 5)) & 15;
            w[n * K / 2 + k / 2] = di_fp4_pack((uint8_t)c0, (uint8_t)c1);
        }
    for (int i = 0; i < N * K / 32; i++) ws[i] = (uint8_t)(118 + i % 19);
    p.xq = xq, p.xs = xs, p.w = w, p.ws = ws;
    int64_t *sums = xmalloc(sizeof(int64_t) * M * N * (K / 32));
    uint8_t *hits = xmalloc(M * N * (K / 32));
    uint16_t *y = xmalloc(2 * M * N);
    uint16_t *y_ref = xmalloc(2 * M * N);
    ref_outputs(&p, M, y_ref);
    int64_t total = 0;
    for (int nc = 8; nc <= 16; nc += 8)
        for (int64_t mm = 1; mm <= M; mm++) {
            memset(hits, 0, M * N * (K / 32));
            emu_gemv(&p, mm, nc, y, sums, hits);
            int64_t checked, nans;
            assert_int_equal(check_sums(&p, mm, sums, hits, &checked), 0);
            total += checked;
            assert_int_equal(diff_bf16(y, y_ref, mm * N, &nans), 0);
            assert_true(nans >= N && (mm == 1 || nans < mm * N)); /* row 0 NaN, the others finite */
        }
    for (int64_t mm = 1; mm <= M; mm += 3) { /* the grouped GEMM's walk */
        memset(hits, 0, M * N * (K / 32));
        emu_mm(&p, mm, y, sums, hits);
        int64_t checked, nans;
        assert_int_equal(check_sums(&p, mm, sums, hits, &checked), 0);
        total += checked;
        assert_int_equal(diff_bf16(y, y_ref, mm * N, &nans), 0);
        assert_true(nans >= N && (mm == 1 || nans < mm * N));
    }
    tu_report("all-codes block sums exact: %lld (256 e4m3 x 16 E2M1 codes, M 1-4, tiles 8 and 16, grouped GEMM M 1 and 4)",
              (long long)total);
    tu_report("all-codes outputs equal to the reference from codes: %d x %d, M 1-4, tiles 8 and 16", M, N);
    free(xq), free(xs), free(w), free(ws), free(sums), free(hits), free(y), free(y_ref);
}

/* ---- 2. against the CPU op ---- */

typedef enum { X_GAUSS, X_ZERO_ROWS, X_LIMIT, X_NAN_INF } xkind;
typedef enum { W_RANDOM, W_EXTREME_SCALES } wkind;

/* one case: y of the CPU op from bf16 x vs the emulated kernel on the act-quantized rows */
static void run_case(const char *name, int64_t M, int64_t N, int64_t K, xkind xk, wkind wk, int check_s) {
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = di_f32_to_bf16((float)(gauss() * (i % 7 == 0 ? 8.0 : 1.0)));
    if (xk == X_ZERO_ROWS) /* row 0 zero, row 1 (if any) half zero blocks */
        for (int64_t i = 0; i < K; i++) {
            x[i] = 0;
            if (M > 1 && (i / 32) % 2) x[K + i] = 0x8000; /* -0 */
        }
    if (xk == X_LIMIT) { /* blocks at ±448 (every code the group max), blocks of the smallest codes (subnormals);
                          * the last row's first block near the bf16 maximum: its P_b overflow to ±inf */
        for (int64_t i = 0; i < M * K; i++) {
            if ((i / 32) % 3 == 0) x[i] = di_f32_to_bf16((i & 1 ? -1.0f : 1.0f) * 1.0e4f);
            else if ((i / 32) % 3 == 1) x[i] = di_f32_to_bf16(i % 32 == 0 ? 448.0f : (float)((i % 5) * 0x1p-9));
        }
        for (int64_t i = 0; i < 32; i++) x[(M - 1) * K + i] = di_f32_to_bf16((i & 1 ? -1.0f : 1.0f) * 3.0e38f);
    }
    if (xk == X_NAN_INF)
        for (int64_t m = 0; m < M; m++) {
            x[m * K + 5 + 64 * m] = 0x7fc0;                /* NaN in one block */
            x[m * K + 300 + 32 * m] = m & 1 ? 0xff80 : 0x7f80; /* ±inf in another */
        }
    uint8_t *w = xmalloc((size_t)(N * K / 2)), *ws = xmalloc((size_t)(N * K / 32));
    for (int64_t i = 0; i < N * K / 2; i++) w[i] = (uint8_t)rnd(); /* every E2M1 code, both signs of 0 */
    for (int64_t i = 0; i < N * K / 32; i++) ws[i] = (uint8_t)(127 - 10 + (int)(rnd() % 7));
    if (wk == W_EXTREME_SCALES) { /* every 7th block 2^−127 (subnormal products) or 2^103; row n ≡ 0 mod 8 one
                                   * NaN scale, row n ≡ 1 mod 8 one 2^127 (its output overflows) */
        const int64_t KB = K / 32;
        for (int64_t i = 0; i < N * KB; i += 7) ws[i] = i % 2 ? 0 : 230;
        for (int64_t n = 0; n < N; n++)
            if (n % 8 < 2) ws[n * KB + (n * 5) % KB] = n % 8 ? 254 : 255;
    }

    /* the CPU op */
    uint16_t *y_cpu = xmalloc(2 * (size_t)(M * N)), *y_emu = xmalloc(2 * (size_t)(M * N));
    size_t wsb = di_cpu_qlinear_workspace(M, K, tp);
    void *wsp = xmalloc(wsb);
    di_error err = {0};
    assert_int_equal(di_cpu_linear_fp4(tp, M, N, K, x, K, w, ws, y_cpu, N, wsp, wsb, &err), DI_OK);

    /* the kernel on the act-quantized rows (the CUDA act-quant is bit-identical to this one) */
    uint8_t *xq = xmalloc((size_t)(M * K)), *xs = xmalloc((size_t)(M * K / 32));
    di_act_quant_fp8(x, M * K, 32, xq, xs);
    problem p = {N, K, xq, xs, w, ws};
    int64_t *sums = check_s ? xmalloc(sizeof(int64_t) * (size_t)(M * N * (K / 32))) : NULL;
    uint8_t *hits = check_s ? xmalloc((size_t)(M * N * (K / 32))) : NULL;
    for (int nc = 16; nc >= 8; nc -= 8) {
        if (nc == 8 && !check_s && N > 64 && M > 2) continue; /* the 8-column tile: on the smaller rows only (CI time) */
        if (hits) memset(hits, 0, (size_t)(M * N * (K / 32)));
        memset(y_emu, 0xA5, 2 * (size_t)(M * N));
        emu_gemv(&p, M, nc, y_emu, sums, hits);
        int64_t nans, bad = diff_bf16(y_emu, y_cpu, M * N, &nans);
        tu_report("%s M%lld N%lld K%lld tile %d: %lld of %lld outputs differ (%lld NaN)", name, (long long)M, (long long)N,
                  (long long)K, nc, (long long)bad, (long long)(M * N), (long long)nans);
        assert_int_equal(bad, 0);
        if (xk == X_NAN_INF) assert_true(nans >= M * N); /* every row has a NaN group */
        if (wk == W_EXTREME_SCALES) assert_true(nans > 0 && nans < M * N);
        if (xk == X_LIMIT && wk == W_RANDOM) assert_true(nans <= N); /* the other rows stay finite */
        if (check_s) {
            int64_t checked;
            assert_int_equal(check_sums(&p, M, sums, hits, &checked), 0);
            tu_report("%s M%lld tile %d: %lld block sums exact", name, (long long)M, nc, (long long)checked);
        }
    }
    { /* the grouped GEMM's walk on the same rows */
        if (hits) memset(hits, 0, (size_t)(M * N * (K / 32)));
        memset(y_emu, 0xA5, 2 * (size_t)(M * N));
        emu_mm(&p, M, y_emu, sums, hits);
        int64_t nans, bad = diff_bf16(y_emu, y_cpu, M * N, &nans);
        tu_report("%s M%lld N%lld K%lld grouped GEMM: %lld of %lld outputs differ (%lld NaN)", name, (long long)M,
                  (long long)N, (long long)K, (long long)bad, (long long)(M * N), (long long)nans);
        assert_int_equal(bad, 0);
        if (xk == X_NAN_INF) assert_true(nans >= M * N);
        if (wk == W_EXTREME_SCALES) assert_true(nans > 0 && nans < M * N);
        if (check_s) {
            int64_t checked;
            assert_int_equal(check_sums(&p, M, sums, hits, &checked), 0);
        }
    }
    free(x), free(w), free(ws), free(y_cpu), free(y_emu), free(wsp), free(xq), free(xs), free(sums), free(hits);
}

static void test_expert_w13(void **state) {
    (void)state;
    run_case("w1/w3", 1, 2304, 5120, X_GAUSS, W_RANDOM, 1);
    run_case("w1/w3", 2, 2304, 5120, X_GAUSS, W_RANDOM, 0);
    run_case("w1/w3", 3, 2304, 5120, X_GAUSS, W_RANDOM, 0);
    run_case("w1/w3", 4, 2304, 5120, X_GAUSS, W_RANDOM, 0);
}

static void test_expert_w2(void **state) {
    (void)state;
    run_case("w2", 1, 5120, 2304, X_GAUSS, W_RANDOM, 0);
    run_case("w2", 2, 5120, 2304, X_GAUSS, W_RANDOM, 1);
    run_case("w2", 4, 5120, 2304, X_GAUSS, W_RANDOM, 0);
    run_case("w2", 5, 5120, 2304, X_GAUSS, W_RANDOM, 0); /* a 4-row and a 1-row launch */
}

static void test_special(void **state) {
    (void)state;
    run_case("zero rows", 2, 384, 2304, X_ZERO_ROWS, W_RANDOM, 1);
    run_case("e4m3 limit", 4, 256, 2304, X_LIMIT, W_RANDOM, 1);
    run_case("NaN/inf x", 3, 256, 1024, X_NAN_INF, W_RANDOM, 0);
    run_case("extreme w scales", 2, 256, 2304, X_GAUSS, W_EXTREME_SCALES, 1);
    run_case("edge N37", 3, 37, 384, X_GAUSS, W_RANDOM, 1);
    run_case("edge N9 M1", 1, 9, 128, X_LIMIT, W_EXTREME_SCALES, 1);
    run_case("two GEMM passes", 19, 40, 256, X_GAUSS, W_EXTREME_SCALES, 1); /* rows 0-15, then 16-18 */
}

/* the lane functions' claims on their own: A⁺ − A⁻ = 2·w for every code pair, digits recombine to X */
static void test_lane_functions(void **state) {
    (void)state;
    for (uint32_t c = 0; c < 256; c++) { /* two codes per byte; the word: the byte repeated */
        uint32_t wv = c * 0x01010101u, pl, ph, nl, nh;
        gvm_expand8(wv, &pl, &ph, &nl, &nh);
        for (int i = 0; i < 8; i++) {
            const uint32_t code = (wv >> (4 * i)) & 15u;
            const uint32_t reg = i < 4 ? pl : ph, nreg = i < 4 ? nl : nh;
            const int v = (int)(int8_t)(reg >> (8 * (i & 3))) - (int)(int8_t)(nreg >> (8 * (i & 3)));
            assert_int_equal(v, (int)(2.0f * di_e2m1_to_f32((uint8_t)code)));
        }
    }
    for (uint32_t c = 0; c < 256; c++) { /* gvm_s8x8: the signed bytes 2·w, every code pair in every position */
        for (int sh = 0; sh < 32; sh += 8) {
            const uint32_t wv = (c << sh) | (0x5Au << ((sh + 8) & 31)) | (0xE3u << ((sh + 16) & 31)) | (0x0Fu << ((sh + 24) & 31));
            uint32_t lo, hi;
            gvm_s8x8(wv, &lo, &hi);
            for (int i = 0; i < 8; i++) {
                const uint32_t code = (wv >> (4 * i)) & 15u;
                const int v = (int8_t)((i < 4 ? lo : hi) >> (8 * (i & 3)));
                assert_int_equal(v, (int)(2.0f * di_e2m1_to_f32((uint8_t)code)));
            }
        }
    }
    assert_int_equal(gvm_mm_sum(-127, 127, -15), -127 + 127 * 128 - 15 * 16384);
    for (uint32_t c = 0; c < 256; c++) {
        uint32_t dig[3];
        gvm_x_digits(c * 0x01010101u, dig);
        for (int i = 0; i < 4; i++) {
            const int d0 = (int8_t)(dig[0] >> (8 * i)), d1 = (int8_t)(dig[1] >> (8 * i)), d2 = (int8_t)(dig[2] >> (8 * i));
            assert_true(d0 >= -127 && d0 <= 127 && d1 >= -127 && d1 <= 127 && d2 >= -15 && d2 <= 15);
            const float v = di_e4m3_to_f32((uint8_t)c);
            if (!isnan(v)) assert_true((double)(d0 + 128 * d1 + 16384 * d2) == (double)v * 512.0);
        }
    }
    /* the kernel's x prep: gvm_x_digits through the table, every code in every byte next to other codes, then
     * random words */
    uint32_t tab[256];
    for (uint32_t c = 0; c < 256; c++) tab[c] = gvm_x_digits_entry(c);
    for (uint32_t c = 0; c < 256; c++)
        for (int sh = 0; sh < 32; sh += 8) {
            const uint32_t wv =
                (c << sh) | (0x3Bu << ((sh + 8) & 31)) | (0xC7u << ((sh + 16) & 31)) | (0x7Fu << ((sh + 24) & 31));
            uint32_t want[3], got[3];
            gvm_x_digits(wv, want);
            gvm_x_digits_tab(tab, wv, got);
            assert_memory_equal(want, got, sizeof want);
        }
    for (int i = 0; i < 100000; i++) {
        const uint32_t wv = (uint32_t)rnd();
        uint32_t want[3], got[3];
        gvm_x_digits(wv, want);
        gvm_x_digits_tab(tab, wv, got);
        assert_memory_equal(want, got, sizeof want);
    }
    assert_true(gvm_e8m0(0) == 0x1p-127f && gvm_e8m0(127) == 1.0f && gvm_e8m0(254) == 0x1p127f && isnan(gvm_e8m0(255)));
}

int main(void) {
    di_error err = {0};
    if (di_threadpool_create(2, &tp, &err)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_functions), cmocka_unit_test(test_all_codes), cmocka_unit_test(test_special),
        cmocka_unit_test(test_expert_w13),     cmocka_unit_test(test_expert_w2),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    di_threadpool_destroy(tp);
    return rc;
}
