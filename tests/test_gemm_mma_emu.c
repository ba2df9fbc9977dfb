/* Host emulation of the tensor-core FP8 / MXFP4 GEMM (src/backend/cuda/cuda_gemm_mma.cu), no GPU needed.
 * di-test: asan
 *
 * The kernel's arithmetic is its lane functions (cuda_gemm_mma.cuh, compiled here as C: the x digit
 * pre-pass layout gmm_xd_off, the stage copy map gmm_x_chunk, the weight conversions gmm_stage_thread
 * (the FP8 table gmm_w8_entry), the shared-memory layout gmm_off_*, the warp map gmm_warp, the sums
 * gmm_sum_fp4 / gmm_sum_fp8, the block value gmm_block_value / gmm_add_block, the output map gmm_c_pos,
 * split-K's gmm_split_* and gmm_reduce_one) plus the one warp primitive emulated from its PTX
 * definition: mma.sync m16n8k32 s8·s8 → s32 (A / B / C fragment layouts as the PTX ISA gives them; the
 * input this test takes on trust, checked by tests/cuda/test_cuda_gemm_mma.c on the GPU). The walk is the
 * kernel's: CTA tiles of BM x rows × 128 weight rows, stages of 2 blocks through two buffers, per warp and
 * block the MMAs of every (A tile, n8 tile), the f32 accumulators.
 *
 * Checked, bit for bit:
 *  1. every e4m3 x code × every E2M1 / e4m3 weight code: every exact block sum S (each (row, column, block)
 *     written exactly once) against Σ X·W from the decoded values in f64, and the outputs against the
 *     contract evaluated from the codes, with x scales 2^−127 … and NaN, FP8 weight NaN codes;
 *  2. the bf16 outputs against the CPU ops di_cpu_linear_fp4 / di_cpu_linear_fp8 from bf16 x: at V4.1
 *     shapes (expert w1/w3 2304×5120, the FP8 k5120 n512 projection) and on special inputs (zero rows,
 *     rows at the e4m3 limit whose P_b overflow, NaN / ±inf x, weight scales 2^−127 / 2^127 / NaN, FP8
 *     weight NaN codes, partial tiles N = 37 / M = 19, three x-row tiles M = 150), every x-row tile
 *     (32, 64, 128);
 *  3. split-K (the kernel's SPLIT instantiation: per split its stages only, split 0's accumulators and the
 *     other splits' block values P_b into f32 planes, then gmm_reduce_one) against the unsplit walk of
 *     part 2's cases, every f32 accumulator and bf16 output, 2 / 3 / 4 splits; every scratch entry written;
 *     on the real shapes two wrong reduce orders are shown to change accumulators (split_check).
 * NaN outputs are compared as NaN (the GPU's canonical NaN and x86's payloads differ in bits); every
 * other output bit for bit. Every MMA partial sum is checked to fit int32 (the exactness claim).
 *  4. The int8 wgmma GEMM's Horner schedule over the same planes (test_igmma_horner). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemm_mma.cuh"
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

/* d[lane] = A·B + c[lane] of one mma.m16n8k32.row.col.s32.s8.s8.s32 (PTX fragment layouts; g = lane / 4,
 * q = lane % 4): A register 0 byte i = A[g][4q+i], 1 = A[g+8][4q+i], 2 = A[g][16+4q+i], 3 = A[g+8][16+4q+i];
 * B register 0 byte i = B[4q+i][g], 1 = B[16+4q+i][g]; C: c0 = C[g][2q], c1 = C[g][2q+1], c2 = C[g+8][2q],
 * c3 = C[g+8][2q+1]. In int64, then checked to fit int32. d may be c. */
static void emu_mma(int32_t d[32][4], const uint32_t a[32][4], const uint32_t b[32][2], const int32_t c[32][4]) {
    int8_t A[16][32], Bt[8][32]; /* B transposed: k contiguous */
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, q = l & 3;
        for (int i = 0; i < 4; i++) {
            A[g][4 * q + i] = (int8_t)(a[l][0] >> (8 * i));
            A[g + 8][4 * q + i] = (int8_t)(a[l][1] >> (8 * i));
            A[g][16 + 4 * q + i] = (int8_t)(a[l][2] >> (8 * i));
            A[g + 8][16 + 4 * q + i] = (int8_t)(a[l][3] >> (8 * i));
            Bt[g][4 * q + i] = (int8_t)(b[l][0] >> (8 * i));
            Bt[g][16 + 4 * q + i] = (int8_t)(b[l][1] >> (8 * i));
        }
    }
    int32_t D[16][8];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            /* |Σ| ≤ 32·128² = 2^19: exact in 32 bits; unsigned (mod 2^32) arithmetic, then the signed value */
            uint32_t s = 0;
            for (int k = 0; k < 32; k++) s += (uint32_t)(int32_t)A[r][k] * (uint32_t)(int32_t)Bt[n][k];
            D[r][n] = (int32_t)s;
        }
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, q = l & 3;
        const int64_t v[4] = {(int64_t)c[l][0] + D[g][2 * q], (int64_t)c[l][1] + D[g][2 * q + 1],
                              (int64_t)c[l][2] + D[g + 8][2 * q], (int64_t)c[l][3] + D[g + 8][2 * q + 1]};
        for (int r = 0; r < 4; r++) {
            assert_true(v[r] >= INT32_MIN && v[r] <= INT32_MAX);
            d[l][r] = (int32_t)v[r];
        }
    }
}

typedef struct {
    int fp8;
    int64_t M, N, K;
    const uint8_t *xq, *xs; /* e4m3 [M, K], E8M0 [M, K/32] */
    const uint8_t *w, *ws;  /* FP8: e4m3 [N, K] + E8M0 [ceil(N/32), K/32]; MXFP4: E2M1 [N, K/2] + E8M0 [N, K/32] */
} problem;

static uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the pre-pass gmm_xprep: x digit planes s8 [M][K/32][3][32] */
static uint8_t *emu_xprep(const problem *p) {
    uint8_t *xd = xmalloc((size_t)gmm_xd_bytes(p->M, p->K));
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t c = 0; c < p->K / 4; c++) {
            uint32_t dig[3];
            gvm_x_digits(ld32(p->xq + m * p->K + 4 * c), dig);
            for (int d = 0; d < 3; d++) memcpy(xd + gmm_xd_off(p->K, m, c / 8, d) + 4 * (c % 8), &dig[d], 4);
        }
    return xd;
}

/* One stage at block kb0 into sb: the x chunk copies (gmm_copy_x, zeros past M), then every thread's
 * gmm_load and gmm_stage_thread */
static void emu_stage(const problem *p, const uint8_t *xd, const uint32_t *tab, int bm, int64_t m0, int64_t n0,
                      int64_t kb0, unsigned char *sb) {
    const int64_t KB = p->K / 32;
    for (int i = 0; i < 12 * bm; i++) {
        int row, gb;
        uint32_t so;
        gmm_x_chunk(bm, i, &row, &gb, &so);
        if (m0 + row < p->M) memcpy(sb + so, xd + gmm_xd_off(p->K, m0 + row, kb0, 0) + gb, 16);
        else memset(sb + so, 0, 16);
    }
    for (int t = 0; t < GMM_WARPS * 32; t++) {
        uint32_t w[8] = {0}, xs = 0, ws = 0;
        const int64_t mx = m0 + t / 2;
        if (t < 2 * bm && mx < p->M) xs = p->xs[mx * KB + kb0 + t % 2];
        const int64_t n = n0 + t / 2, kb = kb0 + t % 2;
        if (n < p->N) {
            for (int i = 0; i < (p->fp8 ? 8 : 4); i++)
                w[i] = ld32(p->w + (p->fp8 ? n * p->K + kb * 32 : n * (p->K / 2) + kb * 16) + 4 * i);
            ws = p->ws[(p->fp8 ? n / 32 : n) * KB + kb];
        }
        gmm_stage_thread(p->fp8, bm, t, xs, w, ws, tab, sb);
    }
}

static float ldf(const unsigned char *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* split-K (cuda_gemm_mma.cuh): split z of stages zs each; part f32 [planes][M][N] */
typedef struct {
    int64_t z, zs;
    float *part;
} split;

/* the kernel on one CTA tile; y bf16 [M, N]; yf (optional) f32 [M, N] the accumulators before the bf16
 * rounding; sums (optional) int64 [M][N][K/32] receives each exact block sum S, hits counts the writes.
 * sp (optional): split-K's CTA z — its stages only; z = 0 stores its accumulators to plane 0, z ≥ 1 each
 * block's P_b to its plane (the kernel's SPLIT instantiation) */
static void emu_cta(const problem *p, const uint8_t *xd, int bm, int64_t m0, int64_t n0, uint16_t *y, float *yf,
                    int64_t *sums, uint8_t *hits, const split *sp) {
    const int fp8 = p->fp8, AF = gmm_af(bm), P = gmm_planes(fp8);
    const int64_t NS = p->K / (32 * GMM_KS), s0 = sp ? sp->z * sp->zs : 0;
    const int64_t s1 = sp && s0 + sp->zs < NS ? s0 + sp->zs : NS;
    const uint32_t SB = gmm_stage_bytes(fp8, bm);
    unsigned char *sm = xmalloc(2 * (size_t)SB);
    memset(sm, 0x5A, 2 * (size_t)SB); /* every byte read is written first (else the results show it) */
    float(*acc)[32][4][4][4] = xmalloc(sizeof(float) * GMM_WARPS * 32 * 4 * 4 * 4); /* [warp][lane][i][j][r] */
    for (size_t i = 0; i < (size_t)GMM_WARPS * 32 * 64; i++) ((float *)acc)[i] = 0.0f;
    static const int32_t zero[32][4];
    uint32_t tab[256]; /* the kernel's shared table (FP8) */
    for (uint32_t c = 0; c < 256; c++) tab[c] = gmm_w8_entry(c);
    emu_stage(p, xd, tab, bm, m0, n0, s0 * GMM_KS, sm);
    for (int64_t s = s0; s < s1; s++) {
        const unsigned char *sb = sm + ((s - s0) & 1) * SB;
        for (int warp = 0; warp < GMM_WARPS; warp++) {
            int wx0, wn0;
            gmm_warp(bm, warp, &wx0, &wn0);
            for (int kb = 0; kb < GMM_KS; kb++) {
                uint32_t b[4][3][32][2];
                float sx[4][32][2], sw[4][32][2];
                for (int l = 0; l < 32; l++) {
                    const int g = l >> 2, q = l & 3;
                    for (int j = 0; j < 4; j++) {
                        for (int d = 0; d < 3; d++) {
                            const unsigned char *at = sb + gmm_off_x(bm, kb, d, wx0 + 8 * j + g) + 8 * q;
                            b[j][d][l][0] = ld32(at), b[j][d][l][1] = ld32(at + 4);
                        }
                        for (int h = 0; h < 2; h++)
                            sx[j][l][h] = ldf(sb + gmm_off_sx(fp8, bm, kb) + 4 * (wx0 + 8 * j + 2 * q + h));
                    }
                    for (int i = 0; i < AF; i++)
                        for (int h = 0; h < 2; h++)
                            sw[i][l][h] = ldf(sb + gmm_off_sw(fp8, bm, kb) + 4 * (wn0 + 16 * i + g + 8 * h));
                }
                for (int i = 0; i < AF; i++) {
                    uint32_t A[3][32][4];
                    for (int pl = 0; pl < P; pl++)
                        for (int l = 0; l < 32; l++) {
                            const int g = l >> 2, q = l & 3;
                            const unsigned char *wp = sb + gmm_off_w(fp8, bm, kb, pl, wn0 + 16 * i);
                            A[pl][l][0] = ld32(wp + g * 32 + 8 * q), A[pl][l][2] = ld32(wp + g * 32 + 8 * q + 4);
                            A[pl][l][1] = ld32(wp + (g + 8) * 32 + 8 * q), A[pl][l][3] = ld32(wp + (g + 8) * 32 + 8 * q + 4);
                        }
                    for (int j = 0; j < 4; j++) {
                        int64_t S[32][4];
                        if (fp8) { /* the kernel's chain: T_s = Σ_{p+d=s} A_p·B_d */
                            int32_t t0[32][4], t1[32][4], t2[32][4], t3[32][4], t4[32][4];
                            emu_mma(t0, A[0], b[j][0], zero);
                            emu_mma(t1, A[0], b[j][1], zero);
                            emu_mma(t1, A[1], b[j][0], t1);
                            emu_mma(t2, A[0], b[j][2], zero);
                            emu_mma(t2, A[1], b[j][1], t2);
                            emu_mma(t2, A[2], b[j][0], t2);
                            emu_mma(t3, A[1], b[j][2], zero);
                            emu_mma(t3, A[2], b[j][1], t3);
                            emu_mma(t4, A[2], b[j][2], zero);
                            for (int l = 0; l < 32; l++)
                                for (int r = 0; r < 4; r++)
                                    S[l][r] = gmm_sum_fp8(t0[l][r], t1[l][r], t2[l][r], t3[l][r], t4[l][r]);
                        } else {
                            int32_t c0[32][4], c1[32][4], c2[32][4];
                            emu_mma(c0, A[0], b[j][0], zero);
                            emu_mma(c1, A[0], b[j][1], zero);
                            emu_mma(c2, A[0], b[j][2], zero);
                            for (int l = 0; l < 32; l++)
                                for (int r = 0; r < 4; r++) S[l][r] = gmm_sum_fp4(c0[l][r], c1[l][r], c2[l][r]);
                        }
                        for (int l = 0; l < 32; l++)
                            for (int r = 0; r < 4; r++) {
                                float *a = &acc[warp][l][i][j][r];
                                const float fs = fp8 ? gmm_l2f(S[l][r]) : gmm_i2f((int32_t)S[l][r]);
                                int xr, nr;
                                gmm_c_pos(wx0, wn0, i, j, r, l >> 2, l & 3, &xr, &nr);
                                if (sp && sp->z > 0) {
                                    if (m0 + xr < p->M && n0 + nr < p->N) {
                                        const int64_t pl = gmm_split_plane(s * GMM_KS + kb, sp->zs);
                                        sp->part[(pl * p->M + m0 + xr) * p->N + n0 + nr] =
                                            gmm_block_value(fs, sx[j][l][r & 1], sw[i][l][r >> 1]);
                                    }
                                } else {
                                    *a = gmm_add_block(*a, fs, sx[j][l][r & 1], sw[i][l][r >> 1]);
                                }
                                if (sums && m0 + xr < p->M && n0 + nr < p->N) {
                                    const int64_t at = ((m0 + xr) * p->N + n0 + nr) * (p->K / 32) + s * GMM_KS + kb;
                                    sums[at] = S[l][r];
                                    hits[at]++;
                                }
                            }
                    }
                }
            }
        }
        if (s + 1 < s1) emu_stage(p, xd, tab, bm, m0, n0, (s + 1) * GMM_KS, sm + ((s + 1 - s0) & 1) * SB);
    }
    for (int warp = 0; warp < GMM_WARPS; warp++) {
        int wx0, wn0;
        gmm_warp(bm, warp, &wx0, &wn0);
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < AF; i++)
                for (int j = 0; j < 4; j++)
                    for (int r = 0; r < 4; r++) {
                        int xr, nr;
                        gmm_c_pos(wx0, wn0, i, j, r, l >> 2, l & 3, &xr, &nr);
                        const int64_t m = m0 + xr, n = n0 + nr;
                        if (m >= p->M || n >= p->N || (sp && sp->z > 0)) continue;
                        if (sp) sp->part[m * p->N + n] = acc[warp][l][i][j][r];
                        else y[m * p->N + n] = di_f32_to_bf16(acc[warp][l][i][j][r]);
                        if (yf) yf[m * p->N + n] = acc[warp][l][i][j][r];
                    }
    }
    free(sm), free(acc);
}

static void emu_gemm(const problem *p, int bm, uint16_t *y, float *yf, int64_t *sums, uint8_t *hits) {
    uint8_t *xd = emu_xprep(p);
    for (int64_t m0 = 0; m0 < p->M; m0 += bm)
        for (int64_t n0 = 0; n0 < p->N; n0 += GMM_BN) emu_cta(p, xd, bm, m0, n0, y, yf, sums, hits, NULL);
    free(xd);
}

/* How the split-K planes are combined: the kernel's gmm_reduce, and two wrong orders the check must see
 * fail — planes 1 and 2 (P_B1, P_B1+1) added swapped, and the usual split-K (each split z ≥ 1's own f32
 * sum of its P_b from 0, the sums then added to split 0's) */
typedef enum { REDUCE_KERNEL, REDUCE_SWAP12, REDUCE_PER_SPLIT } reduce_order;

/* split-K with s splits (gmm_split_stages / gmm_split_count as the host plan), every CTA of every split,
 * then the reduce: the f32 outputs into yf, bf16 into y; returns the split count. Checks that every scratch
 * entry of a real output was written (poisoned with a NaN payload no arithmetic here makes). */
static int64_t emu_gemm_split(const problem *p, int bm, int64_t s, reduce_order order, uint16_t *y, float *yf) {
    const int64_t NS = p->K / (32 * GMM_KS), zs = gmm_split_stages(NS, s), S = gmm_split_count(NS, zs);
    const int64_t planes = gmm_split_plane(p->K / 32, zs), mn = p->M * p->N;
    const uint32_t poison = 0x7fa5a5a5u;
    float *part = xmalloc(sizeof(float) * (size_t)(planes * mn));
    for (int64_t i = 0; i < planes * mn; i++) memcpy(&part[i], &poison, 4);
    uint8_t *xd = emu_xprep(p);
    for (int64_t z = 0; z < S; z++) {
        const split sp = {z, zs, part};
        for (int64_t m0 = 0; m0 < p->M; m0 += bm)
            for (int64_t n0 = 0; n0 < p->N; n0 += GMM_BN) emu_cta(p, xd, bm, m0, n0, NULL, NULL, NULL, NULL, &sp);
    }
    int64_t unwritten = 0;
    for (int64_t i = 0; i < planes * mn; i++) unwritten += memcmp(&part[i], &poison, 4) == 0;
    assert_int_equal(unwritten, 0);
    for (int64_t i = 0; i < mn; i++) {
        float acc;
        if (order == REDUCE_KERNEL) {
            acc = gmm_reduce_one(part, mn, planes, i);
        } else if (order == REDUCE_SWAP12) {
            acc = part[i];
            for (int64_t pl = 1; pl < planes; pl++) acc = gmm_add(acc, part[(pl == 1 && planes > 2 ? 2 : pl == 2 ? 1 : pl) * mn + i]);
        } else {
            acc = part[i];
            for (int64_t z = 1; z < S; z++) {
                float sum = 0.0f;
                for (int64_t b = z * zs * GMM_KS; b < (z + 1) * zs * GMM_KS && b < p->K / 32; b++)
                    sum = gmm_add(sum, part[gmm_split_plane(b, zs) * mn + i]);
                acc = gmm_add(acc, sum);
            }
        }
        yf[i] = acc;
        y[i] = di_f32_to_bf16(acc);
    }
    free(xd), free(part);
    return S;
}

/* outputs whose bits differ (f32, bf16) */
static int64_t diff_bits(const void *a, const void *b, int64_t n, size_t size) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0;
    return bad;
}

/* split-K against the unsplit walk (y, yf) on the same problem, every f32 accumulator and bf16 output bit
 * for bit (NaN bits too: both on this host, the same operations in the same order), for 2 (not on the
 * real shapes: time), 3 and 4 splits. With mutate (the real shapes), each wrong reduce order must change
 * some f32 accumulator: that the comparison sees an order change. Seen: the swap changes 66 of 39168
 * (MXFP4) and 338 of 10240 (FP8) accumulators, 6 of 4352 and 172 of 5120 under ASan's narrower N, and no
 * bf16 output; the per-split sums change over half the accumulators and 2-4 bf16 outputs. */
static void split_check(const problem *p, int bm, const uint16_t *y, const float *yf, int mutate) {
    const int64_t mn = p->M * p->N;
    uint16_t *ys = xmalloc(2 * (size_t)mn);
    float *yfs = xmalloc(sizeof(float) * (size_t)mn);
    for (int64_t s = mutate ? 3 : 2; s <= 4; s++) {
        const int64_t S = emu_gemm_split(p, bm, s, REDUCE_KERNEL, ys, yfs);
        const int64_t bad = diff_bits(yfs, yf, mn, 4) + diff_bits(ys, y, mn, 2);
        tu_report("  split-K %lld (%lld splits): %lld of %lld f32 / bf16 outputs differ from unsplit", (long long)s,
                  (long long)S, (long long)bad, (long long)mn);
        assert_int_equal(bad, 0);
    }
    if (mutate) {
        for (int o = REDUCE_SWAP12; o <= REDUCE_PER_SPLIT; o++) {
            emu_gemm_split(p, bm, 4, (reduce_order)o, ys, yfs);
            const int64_t bad = diff_bits(yfs, yf, mn, 4);
            tu_report("  split-K 4, %s: %lld of %lld f32 outputs differ (expected some), %lld bf16",
                      o == REDUCE_SWAP12 ? "P_b1, P_b1+1 swapped" : "per-split sums", (long long)bad, (long long)mn,
                      (long long)diff_bits(ys, y, mn, 2));
            assert_true(bad > 0);
        }
    }
    free(ys), free(yfs);
}

/* ---- references ---- */

static float w_value(const problem *p, int64_t n, int64_t k) {
    if (p->fp8) return di_e4m3_to_f32(p->w[n * p->K + k]);
    const uint8_t b = p->w[n * (p->K / 2) + k / 2];
    return di_e2m1_to_f32(k & 1 ? di_fp4_odd(b) : di_fp4_even(b));
}

/* Σ X·W of one block from the decoded values, exact in f64 (X = x·2^9; W = 2w or w·2^9). The NaN codes
 * count as ±15·2^14 (the kernel's finite stand-in; x NaN codes only occur with a NaN scale, FP8 weight
 * NaN codes make the kernel's s_w NaN) */
static double ref_block(const problem *p, int64_t m, int64_t n, int64_t kb) {
    double s = 0;
    for (int k = 0; k < 32; k++) {
        const int64_t kk = kb * 32 + k;
        const uint8_t xc = p->xq[m * p->K + kk];
        const double xv = (xc & 0x7f) == 0x7f ? (xc & 0x80 ? -480.0 : 480.0) : (double)di_e4m3_to_f32(xc);
        double wv = w_value(p, n, kk);
        if (p->fp8 && (p->w[n * p->K + kk] & 0x7f) == 0x7f) wv = p->w[n * p->K + kk] & 0x80 ? -480.0 : 480.0;
        s += xv * wv;
    }
    return s * (p->fp8 ? 0x1p18 : 0x1p10);
}

/* every (row, column, block) sum written once and equal to ref_block */
static int64_t check_sums(const problem *p, const int64_t *sums, const uint8_t *hits) {
    int64_t bad = 0, KB = p->K / 32;
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t n = 0; n < p->N; n++)
            for (int64_t kb = 0; kb < KB; kb++) {
                const int64_t at = (m * p->N + n) * KB + kb;
                const double r = ref_block(p, m, n, kb);
                if ((hits[at] != 1 || (double)sums[at] != r) && bad++ < 5)
                    fprintf(stderr, "S (%lld, %lld, %lld) = %lld (%d writes), exact %.1f\n", (long long)m, (long long)n,
                            (long long)kb, (long long)sums[at], hits[at], r);
            }
    return bad;
}

/* y from the codes by linear_q.c's contract: f64 block sums of the decoded values (NaN codes NaN),
 * rounded to f32, × s_x, × s_w, added in ascending block order */
static void ref_outputs(const problem *p, uint16_t *y) {
    const int64_t KB = p->K / 32;
    for (int64_t m = 0; m < p->M; m++)
        for (int64_t n = 0; n < p->N; n++) {
            float acc = 0.0f;
            for (int64_t kb = 0; kb < KB; kb++) {
                double s = 0;
                for (int k = 0; k < 32; k++)
                    s += (double)di_e4m3_to_f32(p->xq[m * p->K + kb * 32 + k]) * (double)w_value(p, n, kb * 32 + k);
                float v = (float)s * di_e8m0_to_f32(p->xs[m * KB + kb]);
                v = v * di_e8m0_to_f32(p->ws[(p->fp8 ? n / 32 : n) * KB + kb]);
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

/* ---- 1. every code pair, against the contract from the codes ---- */

/* x row m: codes (m·37 + k) mod 256 (8 blocks cover all 256 codes; the NaN codes in row 0 only, its
 * blocks with them scaled by the NaN byte as act-quant pairs them); weight row n: MXFP4 code
 * (n + k·(1 + n mod 5)) mod 16, FP8 code (n·29 + k·(1 + n mod 3)) mod 256 (the NaN codes in rows
 * n ≡ 0 mod 7 only, elsewhere replaced by their neighbour) */
static void all_codes(int fp8) {
    enum { M = 40, N = 150, K = 512 }; /* M, N past one tile: partial tiles in both directions */
    const int64_t KB = K / 32, wrow = fp8 ? K : K / 2, srows = fp8 ? (N + 31) / 32 : N;
    uint8_t *xq = xmalloc(M * K), *xs = xmalloc(M * KB);
    uint8_t *w = xmalloc((size_t)(N * wrow)), *ws = xmalloc((size_t)(srows * KB));
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            const uint8_t c = (uint8_t)(m * 37 + k);
            xq[m * K + k] = m > 0 && (c & 0x7f) == 0x7f ? c ^ 1 : c;
        }
    for (int m = 0; m < M; m++)
        for (int kb = 0; kb < KB; kb++) {
            int nan = 0;
            for (int k = 0; k < 32; k++) nan |= (xq[m * K + kb * 32 + k] & 0x7f) == 0x7f;
            xs[m * KB + kb] = nan ? 255 : kb % 8 == 0 ? (kb % 16 ? 9 : 0) : (uint8_t)(118 + (m + kb) % 12);
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            if (fp8) {
                uint8_t c = (uint8_t)(n * 29 + k * (1 + n % 3));
                if ((c & 0x7f) == 0x7f && n % 7) c ^= 1;
                w[n * K + k] = c;
            } else if (k % 2 == 0) {
                const int c0 = (n + k * (1 + n % 5)) & 15, c1 = (n + (k + 1) * (1 + n % 5)) & 15;
                w[n * K / 2 + k / 2] = di_fp4_pack((uint8_t)c0, (uint8_t)c1);
            }
        }
    for (int i = 0; i < srows * KB; i++) ws[i] = (uint8_t)(118 + i % 19);
    problem p = {fp8, M, N, K, xq, xs, w, ws};
    uint16_t *y = xmalloc(2 * M * N), *y_ref = xmalloc(2 * M * N);
    ref_outputs(&p, y_ref);
    int64_t *sums = xmalloc(sizeof(int64_t) * M * N * KB);
    uint8_t *hits = xmalloc(M * N * KB);
    for (int bm = 32; bm <= 128; bm *= 2) {
        memset(y, 0xA5, 2 * M * N);
        memset(hits, 0, M * N * KB);
        emu_gemm(&p, bm, y, NULL, sums, hits);
        assert_int_equal(check_sums(&p, sums, hits), 0);
        int64_t nans, bad = diff_bf16(y, y_ref, M * N, &nans);
        tu_report("all codes %s M%d N%d K%d tile %d: %lld of %d outputs differ (%lld NaN)", fp8 ? "fp8" : "fp4", M, N, K,
                  bm, (long long)bad, M * N, (long long)nans);
        assert_int_equal(bad, 0);
        assert_true(nans >= N && nans < M * N); /* row 0 NaN (and FP8 rows ≡ 0 mod 7), the others finite */
    }
    tu_report("all codes %s: %d block sums exact per tile", fp8 ? "fp8" : "fp4", M * N * (int)KB);
    free(xq), free(xs), free(w), free(ws), free(y), free(y_ref), free(sums), free(hits);
}
static void test_all_codes_fp4(void **state) {
    (void)state;
    all_codes(0);
}
static void test_all_codes_fp8(void **state) {
    (void)state;
    all_codes(1);
}

/* ---- 2. against the CPU op ---- */

typedef enum { X_GAUSS, X_ZERO_ROWS, X_LIMIT, X_NAN_INF } xkind;
typedef enum { W_RANDOM, W_EXTREME } wkind;

static void run_case(const char *name, int fp8, int64_t M, int64_t N, int64_t K, xkind xk, wkind wk, int bm,
                     int mutate) {
    const int64_t KB = K / 32, wrow = fp8 ? K : K / 2, srows = fp8 ? (N + 31) / 32 : N;
    uint16_t *x = xmalloc(2 * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) x[i] = di_f32_to_bf16((float)(gauss() * (i % 7 == 0 ? 8.0 : 1.0)));
    if (xk == X_ZERO_ROWS)
        for (int64_t i = 0; i < K; i++) {
            x[i] = 0;
            if (M > 1 && (i / 32) % 2) x[K + i] = 0x8000; /* -0 */
        }
    if (xk == X_LIMIT) { /* blocks at ±448, blocks of subnormal codes; the last row's first block near the
                          * bf16 maximum: its P_b overflow to ±inf */
        for (int64_t i = 0; i < M * K; i++) {
            if ((i / 32) % 3 == 0) x[i] = di_f32_to_bf16((i & 1 ? -1.0f : 1.0f) * 1.0e4f);
            else if ((i / 32) % 3 == 1) x[i] = di_f32_to_bf16(i % 32 == 0 ? 448.0f : (float)((i % 5) * 0x1p-9));
        }
        for (int64_t i = 0; i < 32; i++) x[(M - 1) * K + i] = di_f32_to_bf16((i & 1 ? -1.0f : 1.0f) * 3.0e38f);
    }
    if (xk == X_NAN_INF)
        for (int64_t m = 0; m < M; m += 2) {
            x[m * K + (5 + 64 * m) % K] = 0x7fc0;
            x[m * K + (300 + 32 * m) % K] = m & 2 ? 0xff80 : 0x7f80;
        }
    uint8_t *w = xmalloc((size_t)(N * wrow)), *ws = xmalloc((size_t)(srows * KB));
    for (int64_t i = 0; i < N * wrow; i++) {
        w[i] = (uint8_t)rnd();
        if (fp8 && (w[i] & 0x7f) == 0x7f) w[i] ^= 1; /* NaN codes only where planted below */
    }
    for (int64_t i = 0; i < srows * KB; i++) ws[i] = (uint8_t)(127 - 10 + (int)(rnd() % 7));
    if (wk == W_EXTREME) { /* every 7th scale 2^−127 or 2^103; one NaN and one 2^127 scale; FP8: NaN codes in
                            * rows 3 and 40 */
        for (int64_t i = 0; i < srows * KB; i += 7) ws[i] = i % 2 ? 0 : 230;
        ws[(srows - 1) * KB + KB / 2] = 255;
        ws[KB / 3] = 254;
        if (fp8) {
            w[3 * K + 77] = 0x7f;
            if (N > 40) w[40 * K + K - 1] = 0xff;
        }
    }
    uint16_t *y_cpu = xmalloc(2 * (size_t)(M * N)), *y_emu = xmalloc(2 * (size_t)(M * N));
    size_t wsb = di_cpu_qlinear_workspace(M, K, tp);
    void *wsp = xmalloc(wsb);
    di_error err = {0};
    if (fp8) assert_int_equal(di_cpu_linear_fp8(tp, M, N, K, x, K, w, ws, y_cpu, N, wsp, wsb, &err), DI_OK);
    else assert_int_equal(di_cpu_linear_fp4(tp, M, N, K, x, K, w, ws, y_cpu, N, wsp, wsb, &err), DI_OK);
    uint8_t *xq = xmalloc((size_t)(M * K)), *xs = xmalloc((size_t)(M * KB));
    di_act_quant_fp8(x, M * K, 32, xq, xs); /* the CUDA act-quant is bit-identical to this one */
    problem p = {fp8, M, N, K, xq, xs, w, ws};
    memset(y_emu, 0xA5, 2 * (size_t)(M * N));
    float *yf = xmalloc(sizeof(float) * (size_t)(M * N));
    emu_gemm(&p, bm, y_emu, yf, NULL, NULL);
    int64_t nans, bad = diff_bf16(y_emu, y_cpu, M * N, &nans);
    tu_report("%s %s M%lld N%lld K%lld tile %d: %lld of %lld outputs differ (%lld NaN)", name, fp8 ? "fp8" : "fp4",
              (long long)M, (long long)N, (long long)K, bm, (long long)bad, (long long)(M * N), (long long)nans);
    assert_int_equal(bad, 0);
    if (xk == X_NAN_INF) assert_true(nans >= (M + 1) / 2 * N && nans < M * N); /* the even rows only */
    if (wk == W_EXTREME) assert_true(nans > 0 && nans < M * N);
    if (xk == X_GAUSS && wk == W_RANDOM) assert_int_equal(nans, 0);
    if (xk == X_LIMIT && wk == W_RANDOM) assert_true(nans <= N);
    split_check(&p, bm, y_emu, yf, mutate);
    free(yf), free(x), free(w), free(ws), free(y_cpu), free(y_emu), free(wsp), free(xq), free(xs);
}

/* Under AddressSanitizer (the CI's sanitizer subset, ~10x slower) the weight rows shrink to 256, K stays */
#if defined(__SANITIZE_ADDRESS__)
#define REAL_N(n) 256
#else
#define REAL_N(n) (n)
#endif
static void test_real_shapes(void **state) {
    (void)state;
    run_case("expert w1/w3", 0, 17, REAL_N(2304), 5120, X_GAUSS, W_RANDOM, 32, 1);
    run_case("wo-like", 1, 20, REAL_N(512), 5120, X_GAUSS, W_RANDOM, 32, 1);
}

static void test_special(void **state) {
    (void)state;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        run_case("zero rows", fp8, 19, 256, 1024, X_ZERO_ROWS, W_RANDOM, 32, 0);
        run_case("e4m3 limit", fp8, 33, 128, 640, X_LIMIT, W_RANDOM, 64, 0);
        run_case("NaN/inf x", fp8, 24, 128, 512, X_NAN_INF, W_RANDOM, 32, 0);
        run_case("extreme w", fp8, 70, 200, 768, X_GAUSS, W_EXTREME, 128, 0);
        run_case("edge N37", fp8, 19, 37, 384, X_LIMIT, W_EXTREME, 64, 0);
        run_case("three x tiles", fp8, 150, 140, 256, X_NAN_INF, W_EXTREME, 64, 0); /* partial in both directions */
    }
}

/* the lane functions on their own: 2w bytes for every E2M1 code, FP8 weight digits recombine to w·2^9
 * and flag exactly the NaN codes */
static void test_lane_functions(void **state) {
    (void)state;
    for (uint32_t c = 0; c < 256; c++) {
        uint32_t lo, hi;
        const uint32_t wv = c * 0x01010101u;
        gmm_e2m1x8_s8(wv, &lo, &hi);
        for (int i = 0; i < 8; i++) {
            const uint32_t code = (wv >> (4 * i)) & 15u, reg = i < 4 ? lo : hi;
            assert_int_equal((int)(int8_t)(reg >> (8 * (i & 3))), (int)(2.0f * di_e2m1_to_f32((uint8_t)code)));
        }
        uint32_t dig[3], tab[256];
        for (uint32_t e = 0; e < 256; e++) tab[e] = gmm_w8_entry(e);
        const uint32_t nan = gmm_w8_digits(wv ^ 0x00ff0000u, tab, dig); /* byte 2 the code's complement */
        for (int i = 0; i < 4; i++) {
            const uint8_t code = (uint8_t)((wv ^ 0x00ff0000u) >> (8 * i));
            const int d0 = (int8_t)(dig[0] >> (8 * i)), d1 = (int8_t)(dig[1] >> (8 * i)), d2 = (int8_t)(dig[2] >> (8 * i));
            assert_true(d2 >= -15 && d2 <= 15);
            const float v = di_e4m3_to_f32(code);
            assert_int_equal(((nan >> (8 * i)) & 0x80u) != 0, isnan(v) != 0);
            if (!isnan(v)) assert_true((double)(d0 + 128 * d1 + 16384 * d2) == (double)v * 512.0);
        }
    }
    /* the FP8 combination at its extremes: the five accumulators at their bounds (|S| < 2^41) */
    const int32_t T[5] = {32 * 127 * 127, 2 * 32 * 127 * 127, 32 * (127 * 127 + 2 * 127 * 15), 2 * 32 * 127 * 15,
                          32 * 15 * 15};
    const double exact = T[0] + 0x1p7 * T[1] + 0x1p14 * T[2] + 0x1p21 * T[3] + 0x1p28 * T[4];
    assert_true((double)gmm_sum_fp8(T[0], T[1], T[2], T[3], T[4]) == exact);
    assert_true((double)gmm_sum_fp8(-T[0], -T[1], -T[2], -T[3], -T[4]) == -exact);
    assert_true(gmm_l2f(gmm_sum_fp8(T[0], T[1], T[2], T[3], T[4])) == (float)exact);
    assert_true(gmm_x_scale(1, 0) == 0x1p-145f && gmm_x_scale(0, 0) == 0x1p-137f && isnan(gmm_x_scale(1, 255)));
}

/* The int8 wgmma GEMM (src/backend/cuda/cuda_gemm_igmma.cu) keeps these digit planes but forms each block
 * sum by Horner's rule in its s32 wgmma accumulators (a wgmma with scale-d adds its products to the set, the
 * CUDA cores multiply a set by 2^7 between groups): FP8 X = T4; X·2^7; X += T3; X·2^7; X += T2 (hi) and
 * Y = T1; Y·2^7; Y += T0 (lo), S = lo + 2^14·hi in int64; MXFP4 X = S2; X·2^7; X += S1, Y = S0, S = Y + 2^7·X
 * in int32. A wgmma may add its 32-term products in any order, so a partial sum is bounded by the sum of
 * the magnitudes. Checked: (1) with every plane at its digit bound, each step's bound stays below 2^31; (2) the schedule, run in int64 with every intermediate asserted to fit int32, on
 * random and extreme blocks of codes, gives S = Σ X·W exactly (X = x·2^9, W = w·2^9 or 2w). */
static int64_t ig_fits(int64_t v) {
    assert_true(v > -0x80000000ll && v < 0x80000000ll);
    return v;
}
static void ig_block(const uint8_t *xc, const uint8_t *wc, int fp4, const uint32_t *tab) {
    int64_t d[5] = {0}, exact = 0; /* FP8: the levels T_s; MXFP4: S_p in d[0..2] */
    for (int k = 0; k < 32; k++) {
        uint32_t xd[3], wdig[3];
        gvm_x_digits(xc[k], xd);
        int wv[3] = {0, 0, 0};
        if (fp4) {
            uint32_t lo, hi;
            gmm_e2m1x8_s8(wc[k] & 15u, &lo, &hi);
            wv[0] = (int8_t)(lo & 0xffu);
            exact += (int64_t)gvm_e4m3_int(xc[k]) * wv[0];
        } else {
            gmm_w8_digits(wc[k], tab, wdig);
            for (int j = 0; j < 3; j++) wv[j] = (int8_t)(wdig[j] & 0xffu);
            exact += (int64_t)gvm_e4m3_int(xc[k]) * gvm_e4m3_int(wc[k]);
        }
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < (fp4 ? 1 : 3); j++) d[i + j] += (int64_t)(int8_t)(xd[i] & 0xffu) * wv[j];
    }
    int64_t S;
    if (fp4) {
        const int64_t X = ig_fits(ig_fits(ig_fits(d[2]) * 128) + d[1]);
        S = ig_fits(d[0] + 128 * X);
    } else {
        int64_t X = ig_fits(ig_fits(d[4]) * 128);
        X = ig_fits(ig_fits(X + d[3]) * 128);
        X = ig_fits(X + d[2]);
        const int64_t Y = ig_fits(ig_fits(ig_fits(d[1]) * 128) + d[0]);
        S = Y + X * 16384;
    }
    assert_true(S == exact);
}
static void test_igmma_horner(void **state) {
    (void)state;
    uint32_t tab[256];
    int64_t mx[3] = {0}, mw[3] = {0}, m4 = 0;
    for (uint32_t c = 0; c < 256; c++) {
        tab[c] = gmm_w8_entry(c);
        uint32_t xd[3], lo, hi;
        gvm_x_digits(c, xd);
        for (int p = 0; p < 3; p++) {
            const int64_t a = llabs((int8_t)(xd[p] & 0xffu)), b = llabs((int8_t)((tab[c] >> (8 * p)) & 0xffu));
            mx[p] = a > mx[p] ? a : mx[p], mw[p] = b > mw[p] ? b : mw[p];
        }
        gmm_e2m1x8_s8(c & 15u, &lo, &hi);
        m4 = llabs((int8_t)(lo & 0xffu)) > m4 ? llabs((int8_t)(lo & 0xffu)) : m4;
    }
    /* the digit bounds of cuda_gemm_mma.cuh's argument (|x0|, |x1| ≤ 127, |x2| ≤ 15, |2w| ≤ 12) hold for every
     * code; the worst case below takes them */
    for (int p = 0; p < 3; p++) assert_true(mx[p] <= (p < 2 ? 127 : 15) && mw[p] <= (p < 2 ? 127 : 15));
    assert_true(mx[2] == 15 && m4 == 12);
    mx[0] = mx[1] = mw[0] = mw[1] = 127, mw[2] = 15;
    int64_t t[5] = {0};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) t[i + j] += 32 * mx[i] * mw[j];
    const int64_t hi = (t[4] * 128 + t[3]) * 128 + t[2], lo = t[1] * 128 + t[0];
    assert_true(t[4] * 128 + t[3] < 0x80000000ll && hi < 0x80000000ll && lo < 0x80000000ll);
    const int64_t s4 = (32 * mx[2] * m4 * 128 + 32 * mx[1] * m4) * 128 + 32 * mx[0] * m4;
    assert_true(s4 < 0x80000000ll);
    uint8_t xc[32], wc[32];
    for (int fp4 = 0; fp4 < 2; fp4++) {
        for (int r = 0; r < 4000; r++) {
            for (int k = 0; k < 32; k++) xc[k] = (uint8_t)rnd(), wc[k] = (uint8_t)rnd();
            ig_block(xc, wc, fp4, tab);
        }
        for (int sg = 0; sg < 4; sg++) { /* every term at the largest magnitude, signs all equal or alternating */
            for (int k = 0; k < 32; k++) {
                const int neg_x = sg & 1 ? k & 1 : 0, neg_w = sg & 2 ? 1 : 0;
                xc[k] = (uint8_t)(0x7e | (neg_x ? 0x80 : 0)); /* 448 */
                wc[k] = fp4 ? (uint8_t)(0x7 | (neg_w ? 0x8 : 0)) : (uint8_t)(0x7e | (neg_w ? 0x80 : 0));
            }
            ig_block(xc, wc, fp4, tab);
            for (int k = 0; k < 32; k++) xc[k] |= 0x7f; /* the NaN codes' stand-in 15·2^14 */
            ig_block(xc, wc, fp4, tab);
        }
    }
}

int main(void) {
    di_error err = {0};
    if (di_threadpool_create(2, &tp, &err)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_functions), cmocka_unit_test(test_all_codes_fp4), cmocka_unit_test(test_all_codes_fp8),
        cmocka_unit_test(test_special),        cmocka_unit_test(test_real_shapes),  cmocka_unit_test(test_igmma_horner),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    di_threadpool_destroy(tp);
    return rc;
}
