/* The block-scaled FP8 / MXFP4 GEMM (M > 16 rows; FP8 also 5–16, cuda_gemm.cu qlinear_v) with exact
 * block sums on the int8 tensor cores: lane-level arithmetic shared by the kernel (cuda_gemm_mma.cu) and
 * its host emulation (tests/test_gemm_mma_emu.c). Compiles as C11 (host) and as CUDA C++ (device); every function here is
 * the one both run. The weight / x conversions reuse cuda_gemv_mma.cuh's lane functions.
 *
 * Contract (linear_q.c): per 32-wide K block b the exact value of Σ q_x·q_w is rounded once to f32,
 * multiplied by s_x then s_w, and the block values P_b are added to an f32 accumulator in ascending b;
 * one bf16 rounding at the end. Only the exact block sum is formed differently here, so the results are
 * qgemm_kernel's (cuda_gemm.cu) bit for bit by construction:
 *
 *   X = x·2^9 ∈ ℤ, |X| ≤ 15·2^14 (the e4m3 NaN codes counted as 15·2^14; see below), split into signed
 *   base-128 digits X = x0 + 2^7·x1 + 2^14·x2 (|x0|, |x1| ≤ 127, |x2| ≤ 15: s8).
 *   MXFP4 weights: W = 2·w ∈ {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12} is one s8 plane. Per block
 *     S = Σ_32 X·W = S0 + 2^7·S1 + 2^14·S2,  S_d = Σ_32 x_d·W,  |S_d| ≤ 32·127·12 < 2^17,
 *     |S| ≤ 32·15·2^14·12 < 2^27: the combination is exact in int32; S·2^−10 = Σ x·w.
 *   FP8 weights: W = w·2^9 has the same three digit planes w0, w1, w2, so nine MMAs, gathered by the
 *   weight of their product in five accumulators T_s = Σ_{i+j=s} Σ_32 x_i·w_j (the tensor core adds the
 *   MMAs of one T_s; every partial sum is an exact int32):
 *     |T0| ≤ 32·127² < 2^19, |T1| ≤ 2·32·127² < 2^20, |T2| ≤ 32·(127² + 2·127·15) < 2^20,
 *     |T3| ≤ 2·32·127·15 < 2^17, |T4| ≤ 32·15² < 2^13;
 *     S = lo + 2^14·hi with lo = T0 + 2^7·T1 (|lo| < 2^28) and hi = T2 + 2^7·T3 + 2^14·T4 (|hi| < 2^28),
 *     both exact int32; S itself (|S| < 2^41) is formed in int64 and rounded once to f32
 *     (__ll2float_rn / the C conversion, both round to nearest even); S·2^−18 = Σ x·w.
 *   Every nonzero |f32(S)| ≥ 1, so f32(S)·2^−10 (2^−18) is exact, and (f32(S)·2^−10)·s_x equals
 *   f32(S)·(s_x·2^−10) — one rounding of the same real number (s_x·2^−18 ≥ 2^−145 is still exact). The
 *   kernel multiplies by the pre-scaled s_x once per (x row, block), then by s_w: the CPU's two
 *   roundings.
 *
 * Special values. An act-quantized group holding NaN or ±inf has scale byte 255 (NaN) and codes 0x7F
 * (formats.c): its finite stand-in X = ±15·2^14 does not matter, P_b = f32(S)·NaN·s_w is NaN like the
 * CPU's. FP8 weight codes 0x7F / 0xFF are NaN on the CPU (every product with them, so the block sum):
 * the staging sees them while it converts the block and stores NaN as that (row, block)'s s_w, which
 * makes P_b NaN the same way. E8M0 byte 255 is NaN, byte 0 is 2^−127 (di_e8m0_to_f32). NaN outputs
 * carry the GPU's canonical NaN like qgemm_kernel's (the CPU's x86 payloads differ: compare NaN as NaN).
 *
 * MMA operands (mma.m16n8k32.row.col.s32.s8.s8.s32; g = lane / 4, q = lane % 4): A = 16 weight rows ×
 * one block's 32 values, B = 8 x rows. A lane takes bytes 8q … 8q+7 of a 32-byte row: bytes 8q … 8q+3
 * play k 4q … 4q+3 (A register 0 / 1, B register 0) and 8q+4 … 8q+7 play k 16+4q … (A register 2 / 3,
 * B register 1); A and B use the same map, and a block sum does not depend on which k a value plays.
 * C: c0 = (weight row g, x row 2q), c1 = (g, 2q+1), c2 = (g+8, 2q), c3 = (g+8, 2q+1). */
#ifndef DI_BACKEND_CUDA_CUDA_GEMM_MMA_CUH
#define DI_BACKEND_CUDA_CUDA_GEMM_MMA_CUH

#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_gemv_mma.cuh"

#define GMM_FN GVM_FN
#define GMM_BN 128    /* weight rows (output columns) per CTA */
#define GMM_KS 2      /* K blocks per pipeline stage: K % (32·GMM_KS) == 0 */
#define GMM_WARPS 8   /* warps per CTA */
#define GMM_WX 32     /* x rows per warp (4 n8 tiles) */

/* ---- the tile geometry: BM (32, 64, 128) x rows per CTA; the 8 warps as BM/32 along x × 256/BM along
 * the weight rows, so a warp holds 32 x rows (4 n8 tiles) × BM/2 weight rows (BM/32 A tiles) ---- */

/* A tiles (16 weight rows) per warp */
GMM_FN int gmm_af(int bm) { return bm / 32; }
/* warp w → its x-row offset (wm·32) and weight-row offset (wn·16·AF) inside the CTA tile */
GMM_FN void gmm_warp(int bm, int w, int *x0, int *n0) {
    const int wmx = bm / GMM_WX; /* warps along x */
    *x0 = (w % wmx) * GMM_WX, *n0 = (w / wmx) * 16 * gmm_af(bm);
}

/* Weight planes: 1 (MXFP4, W = 2w as s8) or 3 (FP8, the base-128 digits of W = w·2^9) */
GMM_FN int gmm_planes(int fp8) { return fp8 ? 3 : 1; }

/* One stage buffer (bytes; 16-aligned parts): x digit planes s8 [KS][3][BM][32], weight planes
 * s8 [KS][P][BN][32], s_x·2^−10 (2^−18) f32 [KS][BM], s_w f32 [KS][BN] (NaN where an FP8 block holds a
 * NaN code). Rows of 32 bytes back to back: the 8-byte fragment loads of a half warp (4 rows × 4
 * lanes) cover 128 consecutive bytes, no bank conflicts. */
GMM_FN uint32_t gmm_off_x(int bm, int kb, int d, int row) { return (uint32_t)(((kb * 3 + d) * bm + row) * 32); }
GMM_FN uint32_t gmm_off_w(int fp8, int bm, int kb, int p, int row) {
    return (uint32_t)(GMM_KS * 3 * bm * 32 + ((kb * gmm_planes(fp8) + p) * GMM_BN + row) * 32);
}
GMM_FN uint32_t gmm_off_sx(int fp8, int bm, int kb) {
    return (uint32_t)(GMM_KS * 3 * bm * 32 + GMM_KS * gmm_planes(fp8) * GMM_BN * 32 + kb * bm * 4);
}
GMM_FN uint32_t gmm_off_sw(int fp8, int bm, int kb) { return gmm_off_sx(fp8, bm, GMM_KS) + (uint32_t)(kb * GMM_BN * 4); }
GMM_FN uint32_t gmm_stage_bytes(int fp8, int bm) { return gmm_off_sw(fp8, bm, GMM_KS); }

/* ---- staging (global → shared), the conversions ---- */

/* 4 packed E2M1 codes (nibble i = value i) → 2·w as s8 (byte i = value i): |2w| from the magnitude
 * table, −|2w| from the negated table, picked by the sign bit (cuda_gemv.cuh's gv_e2m1x4_s8, here on the
 * host too) */
GMM_FN uint32_t gmm_e2m1x4_s8(uint32_t nib16) {
    const uint32_t mag = nib16 & 0x7777u;
    const uint32_t pos = gvm_prmt(GVM_MAG_LO, GVM_MAG_HI, mag);       /* 0 1 2 3 4 6 8 12 */
    const uint32_t neg = gvm_prmt(0xFDFEFF00u, 0xF4F8FAFCu, mag);      /* 0 −1 −2 −3 −4 −6 −8 −12 */
    const uint32_t sgn = gvm_prmt(0x0000FF00u, 0u, (nib16 >> 3) & 0x1111u); /* 0xFF where the sign is set */
    return (pos & ~sgn) | (neg & sgn);
}
/* 8 codes → the bytes of values 0..3 (*lo) and 4..7 (*hi) */
GMM_FN void gmm_e2m1x8_s8(uint32_t w, uint32_t *lo, uint32_t *hi) {
    *lo = gmm_e2m1x4_s8(w & 0xffffu), *hi = gmm_e2m1x4_s8(w >> 16);
}

/* FP8 weight codes → digit planes through a 256-entry table (built once per CTA in shared memory): entry
 * of code c = its three digit bytes (gvm_x_digits: the same e4m3 → integer map as x) and 0x80 in byte 3
 * for the NaN codes 0x7F / 0xFF. Per 4 codes: 4 lookups and 8 byte permutes instead of the ~80 integer
 * instructions of the arithmetic split. */
GMM_FN uint32_t gmm_w8_entry(uint32_t code) {
    uint32_t dig[3];
    gvm_x_digits(code & 0xffu, dig);
    return (dig[0] & 0xffu) | (dig[1] & 0xffu) << 8 | (dig[2] & 0xffu) << 16 | ((code & 0x7fu) == 0x7fu ? 0x80u << 24 : 0u);
}
/* 4 codes (byte i = value i) → the 3 planes (byte i = value i); returns nonzero when one is a NaN code */
GMM_FN uint32_t gmm_w8_digits(uint32_t codes, const uint32_t *tab, uint32_t dig[3]) {
    const uint32_t e0 = tab[codes & 0xffu], e1 = tab[(codes >> 8) & 0xffu], e2 = tab[(codes >> 16) & 0xffu],
                   e3 = tab[codes >> 24];
    const uint32_t a = gvm_prmt(e0, e1, 0x5140u), b = gvm_prmt(e2, e3, 0x5140u); /* planes 0, 1 of values 0 1 | 2 3 */
    const uint32_t c = gvm_prmt(e0, e1, 0x7362u), d = gvm_prmt(e2, e3, 0x7362u); /* plane 2, NaN byte */
    dig[0] = gvm_prmt(a, b, 0x5410u), dig[1] = gvm_prmt(a, b, 0x7632u), dig[2] = gvm_prmt(c, d, 0x5410u);
    return gvm_prmt(c, d, 0x7632u) & 0x80808080u;
}

/* ---- x digit planes in global memory (the pre-pass gmm_xprep, once per call): s8 [M][K/32][3][32], so
 * a stage's x of one row (2 blocks × 3 planes × 32 bytes) is 192 contiguous bytes ---- */
GMM_FN uint64_t gmm_xd_bytes(int64_t m, int64_t k) { return (uint64_t)m * (uint64_t)k * 3; }
/* byte offset of plane d of block kb of row m */
GMM_FN int64_t gmm_xd_off(int64_t k, int64_t m, int64_t kb, int d) { return (m * (k / 32) + kb) * 96 + d * 32; }
/* Chunk i (0 … 12·BM − 1) of a stage's x copy: 16 bytes of row i / 12 at byte 16·(i mod 12) of the row's
 * 192 (block (i mod 12) / 6, plane (i mod 6) / 2, half i mod 2) → its offset in the stage buffer */
GMM_FN void gmm_x_chunk(int bm, int i, int *row, int *gbyte, uint32_t *soff) {
    const int r = i % 12;
    *row = i / 12, *gbyte = 16 * r;
    *soff = gmm_off_x(bm, r / 6, (r % 6) / 2, i / 12) + 16 * (uint32_t)(r % 2);
}

/* s_x·2^−10 (MXFP4) or s_x·2^−18 (FP8) of an x scale byte: exact (≥ 2^−145; NaN stays NaN) */
GMM_FN float gmm_x_scale(int fp8, uint32_t e) { return gvm_mul(gvm_e8m0(e), fp8 ? 0x1p-18f : 0x1p-10f); }

/* 16 bytes to shared memory (16-aligned) */
GMM_FN void gmm_st16(unsigned char *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
#ifdef __CUDA_ARCH__
    *(uint4 *)p = make_uint4(a, b, c, d);
#else
    const uint32_t v[4] = {a, b, c, d};
    memcpy(p, v, 16);
#endif
}
GMM_FN void gmm_st4(unsigned char *p, uint32_t a) {
#ifdef __CUDA_ARCH__
    *(uint32_t *)p = a;
#else
    memcpy(p, &a, 4);
#endif
}

/* What thread t (0 … 255) of the CTA converts into stage buffer sb from its global loads of the stage
 * (x itself comes as digit planes, copied: gmm_x_chunk): xs = the x scale byte of (row t/2, block t % 2)
 * for t < 2·BM; w = the weight words of (row t/2, block t % 2) — MXFP4 w[0 … 3] (32 codes), FP8
 * w[0 … 7] (32 codes, tab = the gmm_w8_entry table) — and ws its scale byte. */
GMM_FN void gmm_stage_thread(int fp8, int bm, int t, uint32_t xs, const uint32_t *w, uint32_t ws, const uint32_t *tab,
                             unsigned char *sb) {
    if (t < 2 * bm) {
        const float v = gmm_x_scale(fp8, xs);
        uint32_t u;
        memcpy(&u, &v, 4);
        gmm_st4(sb + gmm_off_sx(fp8, bm, t % 2) + 4 * (t / 2), u);
    }
    const int row = t / 2, kb = t % 2;
    float sw = gvm_e8m0(ws);
    if (fp8) {
        uint32_t dig[8][3], nan = 0;
        for (int i = 0; i < 8; i++) nan |= gmm_w8_digits(w[i], tab, dig[i]);
        for (int p = 0; p < 3; p++) {
            unsigned char *dst = sb + gmm_off_w(fp8, bm, kb, p, row);
            gmm_st16(dst, dig[0][p], dig[1][p], dig[2][p], dig[3][p]);
            gmm_st16(dst + 16, dig[4][p], dig[5][p], dig[6][p], dig[7][p]);
        }
        if (nan) sw = gvm_e8m0(255); /* a NaN code: the CPU's block sum is NaN, so P_b */
    } else {
        uint32_t v[8];
        for (int i = 0; i < 4; i++) gmm_e2m1x8_s8(w[i], &v[2 * i], &v[2 * i + 1]);
        unsigned char *dst = sb + gmm_off_w(fp8, bm, kb, 0, row);
        gmm_st16(dst, v[0], v[1], v[2], v[3]);
        gmm_st16(dst + 16, v[4], v[5], v[6], v[7]);
    }
    uint32_t u;
    memcpy(&u, &sw, 4);
    gmm_st4(sb + gmm_off_sw(fp8, bm, kb) + 4 * row, u);
}

/* Output of C register r (0 … 3) of a lane (g, q) in the n8 tile j of A tile i of a warp at (wx0, wn0):
 * x row and weight row inside the CTA tile */
GMM_FN void gmm_c_pos(int wx0, int wn0, int i, int j, int r, int g, int q, int *xr, int *nr) {
    *xr = wx0 + 8 * j + 2 * q + (r & 1), *nr = wn0 + 16 * i + g + 8 * (r >> 1);
}

/* ---- the block sums and values ---- */

/* S of one C register from the three plane results (MXFP4) */
GMM_FN int32_t gmm_sum_fp4(int32_t s0, int32_t s1, int32_t s2) { return s0 + s1 * 128 + s2 * 16384; }

/* S of one C register from the five accumulators T0 … T4 (FP8): lo + 2^14·hi, exact in int64 */
GMM_FN int64_t gmm_sum_fp8(int32_t t0, int32_t t1, int32_t t2, int32_t t3, int32_t t4) {
    const int32_t lo = t0 + t1 * 128, hi = t2 + t3 * 128 + t4 * 16384;
    return (int64_t)lo + (int64_t)hi * 16384;
}
/* f32(S), S from gmm_sum_fp8 or gmm_sum_fp4: one rounding to nearest even */
GMM_FN float gmm_l2f(int64_t s) {
#ifdef __CUDA_ARCH__
    return __ll2float_rn(s);
#else
    return (float)s;
#endif
}
GMM_FN float gmm_i2f(int32_t s) {
#ifdef __CUDA_ARCH__
    return __int2float_rn(s);
#else
    return (float)s;
#endif
}

/* P_b = (f32(S)·sx)·sw: the CPU's two roundings, never fused */
GMM_FN float gmm_block_value(float fs, float sx, float sw) { return gvm_mul(gvm_mul(fs, sx), sw); }
/* acc + p rounded once to f32 */
GMM_FN float gmm_add(float acc, float p) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(acc, p);
#else
    return acc + p;
#endif
}
/* the accumulator step: acc + P_b */
GMM_FN float gmm_add_block(float acc, float fs, float sx, float sw) { return gmm_add(acc, gmm_block_value(fs, sx, sw)); }

/* ---- split-K (grids far smaller than the GPU; the rule: cuda_gemm_mma.cu gmm_plan_of): the NS = K/64
 * stages of a tile over S CTAs (grid z), the same bits as unsplit. Split z runs stages
 * [z·ZS, min((z+1)·ZS, NS)), ZS = gmm_split_stages. Split 0 accumulates exactly as unsplit and stores its f32 accumulator — the ascending
 * sum of P_b over the blocks b < B1 = ZS·GMM_KS, the first block of split 1 — as plane 0 of the f32
 * scratch [planes][M][N]; a split z ≥ 1 keeps no accumulator and stores each block's P_b
 * (gmm_block_value, the same roundings) as plane gmm_split_plane(b). gmm_reduce_one then continues split
 * 0's accumulator over the planes in ascending b with gmm_add: per output the unsplit sequence of f32
 * roundings, in its order, so the same f32 and the same bf16. (The usual split-K — each split's own f32
 * sum, the sums added — rounds differently and is not exact.) ---- */

/* stages per split of s splits over ns stages; the splits that then hold stages */
GMM_FN int64_t gmm_split_stages(int64_t ns, int64_t s) { return (ns + s - 1) / s; }
GMM_FN int64_t gmm_split_count(int64_t ns, int64_t zs) { return (ns + zs - 1) / zs; }
/* the scratch plane of block b ≥ B1's P_b (plane 0: split 0's accumulator); gmm_split_plane(K/32, zs) is the
 * number of planes */
GMM_FN int64_t gmm_split_plane(int64_t b, int64_t zs) { return 1 + b - zs * GMM_KS; }
/* output i (= m·N + n) from the scratch part f32 [planes][M·N] (mn = M·N): split 0's accumulator, then
 * + P_b for b = B1, B1 + 1, … */
GMM_FN float gmm_reduce_one(const float *part, int64_t mn, int64_t planes, int64_t i) {
    float acc = part[i];
    for (int64_t p = 1; p < planes; p++) acc = gmm_add(acc, part[p * mn + i]);
    return acc;
}

/* ---- entry points (cuda_gemm_mma.cu) ---- */
#include "backend/backend.h"
#include "util/error.h"
#ifdef __cplusplus
extern "C" {
#endif
/* On unless DI_CUDA_GEMM=simt is in the environment (read once): linear_fp8 / linear_fp4 take this kernel
 * for M > 16 rows where it fits (FP8 also 5–16 rows for wide weights or where it splits K: cuda_gemm.cu),
 * the exact moe_grouped slot its grouped launches. di_cuda_gemm_mma_set_enabled overrides the environment
 * (tests, bench). */
int di_cuda_gemm_mma_enabled(void);
void di_cuda_gemm_mma_set_enabled(int on);
/* Whether this kernel takes the call: m ≥ 1, k % 64 == 0, w 16-byte aligned */
int di_cuda_gemm_mma_fits(int64_t m, int64_t k, const void *w);
/* y bf16 [m, n] = the block-scaled linear of act-quantized rows xq e4m3 [m, k], xs E8M0 [m, k/32] with
 * w e4m3 [n, k] + ws E8M0 [ceil(n/32), k/32] (fp4 = 0) or w packed E2M1 [n, k/2] + ws E8M0 [n, k/32]
 * (fp4 = 1), device pointers, on stream (a cudaStream_t); xd: di_cuda_gemm_mma_scratch(fp4, m, k, n)
 * bytes of scratch, 16-byte aligned, sized under the same settings (tile, occupancy, split) */
int di_cuda_gemm_mma_run(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                         const uint8_t *ws, int64_t n, uint16_t *y, uint8_t *xd, void *stream, di_error *err);
/* Bytes of the device scratch that di_cuda_gemm_mma_run needs: the x digit planes, and where the call
 * splits K the f32 partial planes (at most 64 MB; cuda_gemm_mma.cu) */
uint64_t di_cuda_gemm_mma_scratch(int fp4, int64_t m, int64_t k, int64_t n);
/* Bench / test: the x-row tile BM (32, 64, 128); 0 = the default rule */
void di_cuda_gemm_mma_set_tile(int bm);
#define GMM_GROUP_EXPERTS 384 /* experts one grouped call takes (its table travels as kernel parameters) */
/* Grouped (the prefill experts): y bf16 [rows, n] where expert e's rows [start_h[e], start_h[e+1]) (HOST
 * array, 0 … rows, nondecreasing) of the act-quantized xq e4m3 [rows, k], xs E8M0 [rows, k/32] take expert
 * e's weight w[e], ws[e] (HOST arrays of device pointers, fp4: E2M1 [n, k/2] + E8M0 [n, k/32], else e4m3
 * [n, k] + E8M0 [ceil(n/32), k/32]); n_exp ≤ 384; xd: di_cuda_gemm_mma_group_scratch(rows, k) bytes, which
 * the call fills with xq's digit planes — or, with xq NULL, already holds from an earlier call on the same rows
 * (and the same stream): a second weight over them skips the pre-pass. Each row's outputs are those of
 * di_cuda_gemm_mma_run on that expert alone, bit for bit; one launch per 2,560 row tiles. */
int di_cuda_gemm_mma_grouped(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t k, int n_exp, const int64_t *start_h,
                             const uint8_t *const *w, const uint8_t *const *ws, int64_t n, uint16_t *y, uint8_t *xd,
                             void *stream, di_error *err);
/* Test: at most n row tiles per grouped launch (0: the table's 2,560), so a test covers several launches */
void di_cuda_gemm_mma_set_group_tiles(int n);
/* Bytes of the grouped call's digit scratch xd (16-byte aligned) */
uint64_t di_cuda_gemm_mma_group_scratch(int64_t rows, int64_t k);
/* Bench / test: CTAs per SM (1, 2) of the 32-row tile and MXFP4's 64-row tile; 0 = the default rule (1);
 * −1 = back to DI_CUDA_GMM_OCC=1|2 from the environment (read at the next call). The results do not
 * depend on it. */
void di_cuda_gemm_mma_set_occ(int occ);
/* Bench / test: split-K — 0 = the rule (M ≤ 256 and fewer tiles than SMs / 2), 1 = never, S ≥ 2 = S
 * splits (fewer where K has fewer stages or the scratch would pass its cap); −1 = back to
 * DI_CUDA_GMM_SPLIT from the environment, else the default (0: the rule; measured on the H200)
 * (read at the next call). The results do not depend on it. */
void di_cuda_gemm_mma_set_split(int s);
/* The number of splits a call (fp4, m, k, n) takes under the current settings */
int di_cuda_gemm_mma_splits(int fp4, int64_t m, int64_t k, int64_t n);
#ifdef __cplusplus
}
#endif

#endif
