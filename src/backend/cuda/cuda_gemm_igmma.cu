/* Exact block-scaled FP8 / MXFP4 GEMM on Hopper's int8 wgmma (sm_90a): y = x · Wᵀ with the CPU op's
 * contract (linear_q.c, spec §5.2) — per 32-wide K block b the exact Σ q_x·q_w rounded once to f32 (P_b),
 * then (P_b·s_x)·s_w added to an f32 accumulator in ascending b, one bf16 rounding at the end.
 *
 * The block sums are the int8 mma.sync GEMM's (cuda_gemm_mma.cuh, whose comment carries the argument):
 * X = x·2^9 is split into the signed base-128 digits x0 + 2^7·x1 + 2^14·x2 (s8), FP8 weights W = w·2^9 the
 * same way (w0, w1, w2), MXFP4 weights W = 2w are one s8 plane. FP8: the nine digit products fall into five
 * levels T_s = Σ_{i+j=s} Σ_32 x_i·w_j, each an exact int32 sum on the tensor core, and
 *   hi = T2 + 2^7·(T3 + 2^7·T4),  lo = T0 + 2^7·T1  (both |·| < 2^28, int32),  S = lo + 2^14·hi (int64),
 * P_b = f32(S)·2^−18 (one rounding, __ll2float_rn). MXFP4: S = S0 + 2^7·(S1 + 2^7·S2) in int32 (|S| < 2^27),
 * P_b = f32(S)·2^−10. So every output has the int8 mma.sync GEMM's bits, and the CPU's.
 *
 * What changes is how the tensor cores are fed. mma.sync spends ~13 issued instructions per MMA on fragment
 * loads, digit conversions and the int64 combine (bench/NOTES-gpu.md); here one wgmma m64n64k32 s8·s8 → s32
 * covers 64 rows × 64 columns × one block of one digit pair, with both operands read by the tensor core from
 * shared memory:
 *  - x's digit planes come from a pre-pass (ig_xprep, once per call) as s8 [3][M][K] in global memory and
 *    travel by TMA (box 128 rows × 128 bytes = 4 blocks, 128-byte swizzle), one box per plane and stage.
 *  - The weights are read by the producer warpgroup (thread r = weight row r of the tile, one stage ahead in
 *    registers) and converted on the CUDA cores into their digit planes (FP8: the 256-entry table of
 *    cuda_gemm_mma.cuh; MXFP4: the nibble → s8 permutes), written in the same swizzled layout the TMA
 *    gives x. A weight byte is converted once per 128-row x tile.
 *  - CTA tile 128 x rows × 128 weight rows, 384 threads: warpgroup 0 produces, warpgroups 1 and 2 take 64 x
 *    rows each, in two halves of 64 columns; a tile of ≤ 64 x rows gives both the same rows and one half each
 *    (launches of 64-row tiles where they fit in one wave, ig_tile_rows). Per block and half the levels run
 *    as Horner's rule in two s32 register sets: a wgmma with scale-d adds its products to a set, the CUDA cores multiply a set by 2^7
 *    between groups (FP8: X = T4, Y = T1; both ·2^7; X += T3, Y += T0; X ·2^7; X += T2 — nine wgmmas in three
 *    groups; MXFP4: three wgmmas in two); then per output f32(S), ·s_x (pre-scaled by 2^−18 / 2^−10), ·s_w
 *    and the add (ig_promote).
 *  - Two stages of 4 blocks (x 48 KiB + weights 48 KiB + scales), full / empty mbarriers.
 * Registers: ptxas fits both roles in the 168 per thread of a 384-thread CTA (the setmaxnreg split below
 * does not let it use more: measured, a form with two more s32 sets per warpgroup spilled ~750 bytes at
 * any split). So a warpgroup keeps one half in flight at a time; its three groups are a chain (each waits
 * for the previous one and the CUDA-core step between), and the two consumer warpgroups overlap each
 * other's chains. Nsight Compute (H200, FP8 N 25600 K 6144 M 2048): 44 % of issue slots busy, the tensor
 * pipe 29 %, 0.7 eligible warps per scheduler — latency-bound; ~410 issued instructions per warp for each
 * block and half (the promote's conversion, scales and add, and the shifts). Speed (test_cuda_gemm_igmma's
 * bench, H200, session 13): FP8 60–64 TFLOP/s from M 1,024 (1.6x the mma.sync GEMM), MXFP4 ~130 (1.5x);
 * a tile is one CTA over all of K, so small grids lose (the dispatch rule, di_cuda_gemm_igmma_wants).
 * Scales: s_x·2^−18 and s_w are powers of two, so while every scale of a stage lies in [2^−50, 2^50] (or is
 * NaN) f32(S)·s_x and then ·s_w are exact and fma(f32(S)·s_x, s_w, acc) rounds once where the CPU's add
 * does; a stage with a scale outside that range takes the literal __fmul_rn, __fmul_rn, __fadd_rn sequence.
 * NaN: an x block with NaN / inf has scale byte 255 (NaN) and codes whose digits are finite stand-ins; a
 * NaN FP8 weight code makes that (column, block)'s s_w NaN (the table's flag), as in the mma.sync GEMM.
 * Rows past a tile's rows (other planes' rows, TMA zeros, or in a grouped launch other experts' rows) and
 * columns past N are computed, never stored: an output row depends only on its own x row, and their scales
 * are 0. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_igmma.h"
#include "backend/cuda/cuda_gemm_mma.cuh" /* the digit conversions (gvm_x_digits, gmm_w8_*, gmm_e2m1x8_s8) */
#include "backend/cuda/cuda_tma.cuh"

#define IG_QB 32
#define IG_TM 128     /* x rows per CTA at most: two consumer warpgroups × 64 (a launch may take 64, ig_tile_rows) */
#define IG_TN 128     /* weight rows (output columns) per CTA: two halves of 64 per consumer */
#define IG_TKB 4      /* K blocks per stage: 128 bytes per row, one 128-byte swizzle row */
#define IG_ROWB 128
#define IG_TILE (IG_TM * IG_ROWB) /* bytes of one plane's stage tile (= IG_TN · IG_ROWB) */
#define IG_STAGES 2
#define IG_THREADS 384
#define IG_PROD_REGS 88  /* setmaxnreg split of the 168 × 384 pool: 128 · 88 + 256 · 208 = 64,512 */
#define IG_CONS_REGS 208

typedef struct __align__(1024) ig_stage {
    uint8_t x[3][IG_TILE];       /* x digit planes, s8 [128 rows][128 B], 128B-swizzled (TMA) */
    uint8_t w[3][IG_TILE];       /* weight digit planes (MXFP4: plane 0 only), the same layout (producer) */
    float sx[IG_TKB][IG_TM];     /* s_x·2^−18 (FP8) or ·2^−10 (MXFP4); 0 past M or K */
    float sw[IG_TKB][IG_TN];     /* s_w per column; NaN where an FP8 block holds a NaN code; 0 past N or K */
    int unsafe[4];               /* per producer warp: a scale outside [2^−50, 2^50] (and not NaN) */
    uint64_t full, empty;        /* mbarriers: 128 producer arrivals + the TMA bytes; 256 consumer arrivals */
} ig_stage;
#define IG_TAB_BYTES 1024 /* FP8 code → digits table, u32 [256] (gmm_w8_entry) */
#define IG_SMEM (IG_STAGES * sizeof(ig_stage) + IG_TAB_BYTES + 1024)

typedef struct ig_params {
    CUtensorMap tx;            /* x digit planes s8 [3·M rows, K bytes]: box 128 B × 128 rows, 128B swizzle */
    const uint8_t *w, *wsc;    /* e4m3 [N, K] + E8M0 [ceil(N/32), K/32], or E2M1 [N, K/2] + E8M0 [N, K/32] */
    const uint8_t *xs;         /* E8M0 [M, K/32] */
    int M, N, K, KB;
    int literal;               /* test / bench: every stage takes the literal scale sequence */
    int pairs;                 /* N even and y 4-byte aligned: two bf16 per 32-bit store */
    int tm;                    /* x rows per tile of a dense launch: 128, or 64 (one half each, ig_consume) */
    uint16_t *y;               /* bf16 [M, N] */
} ig_params;

/* One CTA's tile: rows r0 … r0 + rows − 1 of x (and y), weight rows n0 … n0 + 127 of w / wsc */
typedef struct ig_tile {
    int r0, rows, n0;
    const uint8_t *w, *wsc;
} ig_tile;

/* Grouped launches (the prefill experts): expert e's rows are a contiguous range of x; a row tile is
 * (first row, expert | rows << 16), at most 128 rows of one expert. ~26 KiB of kernel parameters (CUDA ≥ 12.1). */
#define IG_GROUP_EXPERTS 384
static_assert(IG_GROUP_EXPERTS >= GMM_GROUP_EXPERTS, "the grouped caller caps experts at GMM_GROUP_EXPERTS");
#define IG_GROUP_TILES 2560
typedef struct ig_group {
    const uint8_t *w[IG_GROUP_EXPERTS], *ws[IG_GROUP_EXPERTS];
    uint32_t tile[IG_GROUP_TILES][2];
} ig_group;

/* ---------------- the x pre-pass: e4m3 codes [M, K] → digit planes s8 [3][M][K] ---------------- */
__global__ void ig_xprep(const uint8_t *xq, int64_t words, int64_t plane_bytes, uint8_t *xd) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= words) return;
    uint32_t dig[3];
    gvm_x_digits(__ldg((const uint32_t *)xq + i), dig);
#pragma unroll
    for (int p = 0; p < 3; p++) *(uint32_t *)(xd + p * plane_bytes + 4 * i) = dig[p];
}

/* ---------------- producer ---------------- */
/* E8M0 exponents whose scale lies in [2^-50, 2^50], or NaN: the fused promotion is exact (file comment) */
static __device__ __forceinline__ int ig_scale_unsafe(uint32_t e) { return (e < 127 - 50 || e > 127 + 50) && e != 255; }

/* Weight row n's bytes of stage t (FP8: 8 chunks of 16 codes; MXFP4: 4 chunks of 32 nibbles = one block
 * each); zeros past N or K. */
template <bool FP4>
static __device__ __forceinline__ void ig_load_w(const ig_params *p, const ig_tile &tl, int n, int t, uint4 *v) {
    constexpr int C = FP4 ? 4 : 8;
    const int64_t rowb = FP4 ? p->K / 2 : p->K;
    const uint4 *src = (const uint4 *)(tl.w + (int64_t)n * rowb + (int64_t)t * C * 16);
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int blk = t * IG_TKB + (FP4 ? c : c / 2);
        v[c] = n < p->N && blk < p->KB ? __ldg(src + c) : make_uint4(0, 0, 0, 0);
    }
}

/* Row r of the stage's weight planes from its loaded bytes, at the positions the 128-byte swizzle gives
 * (16-byte chunk c of row r at chunk c ^ (r % 8)); FP8 returns the blocks (bits 0..3) holding a NaN code. */
template <bool FP4>
static __device__ __forceinline__ int ig_convert_w(const uint4 *v, const uint32_t *tab, ig_stage *st, int r) {
    int nan = 0;
    if constexpr (FP4) {
#pragma unroll
        for (int b = 0; b < IG_TKB; b++) { /* one block: 32 nibbles → 32 s8 = logical chunks 2b, 2b + 1 */
            uint32_t o[8];
            gmm_e2m1x8_s8(v[b].x, &o[0], &o[1]);
            gmm_e2m1x8_s8(v[b].y, &o[2], &o[3]);
            gmm_e2m1x8_s8(v[b].z, &o[4], &o[5]);
            gmm_e2m1x8_s8(v[b].w, &o[6], &o[7]);
            *(uint4 *)(st->w[0] + r * IG_ROWB + (((2 * b) ^ (r & 7)) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
            *(uint4 *)(st->w[0] + r * IG_ROWB + (((2 * b + 1) ^ (r & 7)) << 4)) = make_uint4(o[4], o[5], o[6], o[7]);
        }
    } else {
#pragma unroll
    for (int c = 0; c < 8; c++) {
        const uint32_t words[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
        uint32_t d[4][3], flag = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) flag |= gmm_w8_digits(words[i], tab, d[i]);
        nan |= (flag != 0) << (c / 2);
        const uint32_t off = r * IG_ROWB + ((c ^ (r & 7)) << 4);
#pragma unroll
        for (int q = 0; q < 3; q++) *(uint4 *)(st->w[q] + off) = make_uint4(d[0][q], d[1][q], d[2][q], d[3][q]);
    }
    }
    return nan;
}

template <bool FP4>
static __device__ void ig_produce(const ig_params *p, const ig_tile &tl, ig_stage *stages, const uint32_t *tab) {
    const int r = threadIdx.x, lane = r & 31, NT = (p->KB + IG_TKB - 1) / IG_TKB;
    const int n = tl.n0 + r, m = tl.r0 + r;
    const bool row_ok = r < tl.rows;
    constexpr int C = FP4 ? 4 : 8;
    uint4 cur[C]; /* the stage's weight bytes, loaded at the end of the previous iteration */
    ig_load_w<FP4>(p, tl, n, 0, cur);
    for (int t = 0; t < NT; t++) {
        ig_stage *st = &stages[t % IG_STAGES];
        const uint32_t ph = (uint32_t)(t / IG_STAGES) & 1u;
        /* this stage's scale bytes (the loads' latency hides behind the wait for the slot) */
        uint32_t ex[IG_TKB], ew[IG_TKB];
#pragma unroll
        for (int b = 0; b < IG_TKB; b++) {
            const int g = t * IG_TKB + b;
            ex[b] = row_ok && g < p->KB ? __ldg(p->xs + (int64_t)m * p->KB + g) : 256u;
            ew[b] = n < p->N && g < p->KB ? __ldg(tl.wsc + (int64_t)(FP4 ? n : n / 32) * p->KB + g) : 256u;
        }
        mbar_wait(&st->empty, ph ^ 1u); /* the consumers are done with this slot's previous stage */
        if (r == 0) {
            mbar_expect_tx(&st->full, 3 * IG_TILE);
#pragma unroll
            for (int q = 0; q < 3; q++) tma_load(st->x[q], &p->tx, t * IG_TKB * IG_QB, q * p->M + tl.r0, &st->full);
        }
        const int nan = ig_convert_w<FP4>(cur, tab, st, r);
        int unsafe = 0;
#pragma unroll
        for (int b = 0; b < IG_TKB; b++) { /* 256: no such row, column or block */
            st->sx[b][r] = ex[b] < 256u ? gmm_x_scale(!FP4, ex[b]) : 0.0f;
            st->sw[b][r] = ew[b] < 256u ? ((nan >> b) & 1 ? __int_as_float(0x7fc00000) : gvm_e8m0(ew[b])) : 0.0f;
            unsafe |= (ex[b] < 256u && ig_scale_unsafe(ex[b])) | (ew[b] < 256u && ig_scale_unsafe(ew[b]));
        }
        const unsigned any = __any_sync(0xffffffffu, unsafe);
        if (lane == 0) st->unsafe[r >> 5] = (int)any;
        fence_proxy_async(); /* the weight planes are read by wgmma (async proxy) */
        mbar_arrive(&st->full);
        if (t + 1 < NT) ig_load_w<FP4>(p, tl, n, t + 1, cur); /* in flight during the next wait */
    }
}

/* ---------------- consumers ---------------- */
#define IG_R4(d, i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3])
#define IG_R16(d, i) IG_R4(d, i), IG_R4(d, i + 4), IG_R4(d, i + 8), IG_R4(d, i + 12)
#define IG_R32(d) IG_R16(d, 0), IG_R16(d, 16)

/* d[32] (=|+=) A(64 × 32 s8) · B(64 × 32 s8)ᵀ, one block of one digit pair for a 64 × 64 sub-tile.
 * Fragment: d[4j + h] is row (warp%4)·16 + lane/4 + 8·(h/2), column 8j + 2·(lane%4) + h%2. */
template <int ACC>
static __device__ __forceinline__ void ig_mma(int32_t *d, uint32_t a, uint32_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p;\n}\n"
                 : IG_R32(d)
                 : "l"(desc_sw128(a)), "l"(desc_sw128(b)), "n"(ACC));
}
/* Wait for every committed group, naming the sets they wrote so that no access to them moves above it */
static __device__ __forceinline__ void ig_wait0(int32_t *d, int32_t *e) {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" : IG_R32(d), IG_R32(e)::"memory");
}
/* d *= 2^7 on the CUDA cores, between two wgmma groups that accumulate into d (Horner's step) */
static __device__ __forceinline__ void ig_shift7(int32_t *d) {
#pragma unroll
    for (int i = 0; i < 32; i++) d[i] *= 128;
}

/* The wgmma groups of one block and half, Horner's rule with the scaling between them: a wgmma with scale-d
 * adds its products to the set, and every partial sum stays below 2^28 (cuda_gemm_mma.cuh's bounds).
 * a, b: the x and weight plane-0 tiles at the block (plane p IG_TILE bytes further).
 *   MXFP4: group 1 X = S2, Y = S0; X ·= 2^7; group 2 X += S1                     → S = Y + 2^7·X
 *   FP8:   group 1 X = T4, Y = T1; X, Y ·= 2^7; group 2 X += T3, Y += T0 (lo); X ·= 2^7; group 3 X += T2 (hi) */
template <bool FP4>
static __device__ __forceinline__ void ig_group1(int32_t *X, int32_t *Y, uint32_t a, uint32_t b) {
    if (FP4) {
        ig_mma<0>(X, a + 2 * IG_TILE, b);
        ig_mma<0>(Y, a, b);
    } else {
        ig_mma<0>(X, a + 2 * IG_TILE, b + 2 * IG_TILE);
        ig_mma<0>(Y, a, b + IG_TILE);
        ig_mma<1>(Y, a + IG_TILE, b);
    }
}
template <bool FP4>
static __device__ __forceinline__ void ig_after1(int32_t *X, int32_t *Y) {
    ig_shift7(X);
    if (!FP4) ig_shift7(Y);
}
template <bool FP4>
static __device__ __forceinline__ void ig_group2(int32_t *X, int32_t *Y, uint32_t a, uint32_t b) {
    if (FP4) {
        ig_mma<1>(X, a + IG_TILE, b);
    } else {
        ig_mma<1>(X, a + IG_TILE, b + 2 * IG_TILE);
        ig_mma<1>(X, a + 2 * IG_TILE, b + IG_TILE);
        ig_mma<1>(Y, a, b);
    }
}
static __device__ __forceinline__ void ig_group3(int32_t *X, uint32_t a, uint32_t b) {
    ig_mma<1>(X, a, b + 2 * IG_TILE);
    ig_mma<1>(X, a + IG_TILE, b + IG_TILE);
    ig_mma<1>(X, a + 2 * IG_TILE, b);
}

/* f32(S), rounded once: FP8 S = Y + 2^14·X (int64), MXFP4 S = Y + 2^7·X (int32) */
template <bool FP4>
static __device__ __forceinline__ float ig_block_sum(int32_t x, int32_t y) {
    return FP4 ? __int2float_rn(y + 128 * x) : __ll2float_rn((long long)y + (long long)x * 16384);
}

/* acc[32] += the half's block values: f = f32(S) (FP8: S = Y + 2^14·X, Y = lo, X = hi; MXFP4: S = Y + 2^7·X,
 * Y = S0, X = S1 + 2^7·S2), then ·s_x, ·s_w and the add: fma(f·s_x, s_w, acc) in a safe stage, else the
 * literal sequence. (Measured on the H200, session 13: the conversion instruction is not the bound; a
 * conversion-free split of S into two exact f32 halves cost more instructions and ran 6–25 % slower.) */
template <bool FP4, bool FUSED>
static __device__ __forceinline__ void ig_promote_seq(float *acc, const int32_t *X, const int32_t *Y, const ig_stage *st, int kb,
                                                      int col0, int r0) {
    const float sx0 = st->sx[kb][r0], sx1 = st->sx[kb][r0 + 8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float2 sw = *(const float2 *)&st->sw[kb][col0 + 8 * j];
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const int i = 4 * j + h;
            const float x = __fmul_rn(ig_block_sum<FP4>(X[i], Y[i]), h & 2 ? sx1 : sx0), s = h & 1 ? sw.y : sw.x;
            acc[i] = FUSED ? __fmaf_rn(x, s, acc[i]) : __fadd_rn(acc[i], __fmul_rn(x, s));
        }
    }
}
/* one branch per stage (a per-element choice would compute both sequences) */
template <bool FP4>
static __device__ __forceinline__ void ig_promote(float *acc, const int32_t *X, const int32_t *Y, const ig_stage *st, int kb,
                                                  int col0, int r0, int unsafe) {
    if (unsafe) ig_promote_seq<FP4, false>(acc, X, Y, st, kb, col0, r0);
    else ig_promote_seq<FP4, true>(acc, X, Y, st, kb, col0, r0);
}

/* One block and half alone: its groups as a chain (each waits for the previous one and the CUDA-core step
 * between), the sums left in X, Y. a, b: the x and weight plane-0 tiles at the block. */
template <bool FP4>
static __device__ __forceinline__ void ig_chain(int32_t *X, int32_t *Y, uint32_t a, uint32_t b) {
    mma_fence();
    ig_group1<FP4>(X, Y, a, b);
    mma_commit();
    ig_wait0(X, Y);
    ig_after1<FP4>(X, Y);
    mma_fence();
    ig_group2<FP4>(X, Y, a, b);
    mma_commit();
    ig_wait0(X, Y);
    if (!FP4) {
        ig_shift7(X);
        mma_fence();
        ig_group3(X, a, b);
        mma_commit();
        ig_wait0(X, Y);
    }
}

/* y of one half's fragment acc[32] (columns col0 + 8j, col0 + 8j + 1 of the tile; rows r0, r0 + 8) */
static __device__ __forceinline__ void ig_store_half(const ig_params *p, const ig_tile &tl, const float *acc, int r0, int col0) {
    const bool pairs = p->pairs;
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
        if (r0 + 8 * rh >= tl.rows) continue;
        uint16_t *yr = p->y + (int64_t)(tl.r0 + r0 + 8 * rh) * p->N;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int c = tl.n0 + col0 + 8 * j, i = 4 * j + 2 * rh;
            const uint16_t lo = d_to_bf16(acc[i]), hi = d_to_bf16(acc[i + 1]);
            if (pairs && c + 1 < p->N) {
                *(uint32_t *)(yr + c) = (uint32_t)lo | ((uint32_t)hi << 16);
            } else {
                if (c < p->N) yr[c] = lo;
                if (c + 1 < p->N) yr[c + 1] = hi;
            }
        }
    }
}

/* A tile of two x halves: warpgroup cw takes rows 64·cw … of the tile and runs both column halves' chains,
 * one block at a time. A tile of ≤ 64 x rows (every tile of a 64-row launch, and the last of a 128-row one)
 * has one x half: both consumer warpgroups take its rows, warpgroup cw the column half h = cw, so the tile
 * takes one half's chain per block instead of two (uniform per CTA). Measured and dropped (session 15):
 * with 32 sums a warpgroup has room for two blocks' register sets in principle, but the launch's 168
 * registers per thread spilled 200 bytes and the two chains in flight ran 3-5 % slower than one. */
template <bool FP4>
static __device__ void ig_consume(const ig_params *p, const ig_tile &tl, ig_stage *stages) {
    const int cw = (threadIdx.x >> 7) - 1, wtid = threadIdx.x & 127, lane = threadIdx.x & 31;
    const bool one = tl.rows <= 64;
    const int xr = one ? 0 : cw * 64; /* the warpgroup's first x row in the tile */
    const int r0 = xr + (wtid >> 5) * 16 + (lane >> 2), q = lane & 3;
    const int NT = (p->KB + IG_TKB - 1) / IG_TKB;
    float acc[64]; /* half h's fragment at acc[32h …] */
    int32_t X[32], Y[32];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    for (int t = 0; t < NT; t++) {
        ig_stage *st = &stages[t % IG_STAGES];
        mbar_wait(&st->full, (uint32_t)(t / IG_STAGES) & 1u);
        const int4 u = *(const int4 *)st->unsafe;
        const int unsafe = u.x | u.y | u.z | u.w | p->literal, nkb = min(IG_TKB, p->KB - t * IG_TKB);
        const uint32_t xa = smem_u32(st->x[0]) + xr * IG_ROWB, wa = smem_u32(st->w[0]);
        for (int kb = 0; kb < nkb; kb++) {
            const uint32_t a = xa + kb * IG_QB, b = wa + kb * IG_QB;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (one && h != cw) continue;
                ig_chain<FP4>(X, Y, a, b + h * 64 * IG_ROWB); /* the half's 64 weight rows */
                ig_promote<FP4>(acc + 32 * h, X, Y, st, kb, h * 64 + 2 * q, r0, unsafe);
            }
        }
        mbar_arrive(&st->empty);
    }

#pragma unroll
    for (int h = 0; h < 2; h++)
        if (!one || h == cw) ig_store_half(p, tl, acc + 32 * h, r0, h * 64 + 2 * q);
}

template <bool FP4>
static __device__ __forceinline__ void ig_body(const ig_params *p, const ig_tile &tl) {
    extern __shared__ uint8_t smem_raw[];
    /* keep a shared-space derivation (no integer round trip) so the compiler emits LDS/STS */
    ig_stage *stages = (ig_stage *)(smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u));
    uint32_t *tab = (uint32_t *)(stages + IG_STAGES);
    if (threadIdx.x == 0) {
        for (int s = 0; s < IG_STAGES; s++) {
            mbar_init(&stages[s].full, 128);
            mbar_init(&stages[s].empty, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (!FP4)
        for (int c = threadIdx.x; c < 256; c += IG_THREADS) tab[c] = gmm_w8_entry((uint32_t)c);
    __syncthreads();
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(IG_PROD_REGS));
        ig_produce<FP4>(p, tl, stages, tab);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(IG_CONS_REGS));
        ig_consume<FP4>(p, tl, stages);
    }
}

template <bool FP4>
__global__ void __launch_bounds__(IG_THREADS, 1) ig_kernel(const __grid_constant__ ig_params p) {
    const int r0 = blockIdx.y * p.tm;
    const ig_tile tl = {r0, min(p.tm, p.M - r0), (int)blockIdx.x * IG_TN, p.w, p.wsc};
    ig_body<FP4>(&p, tl);
}

/* grid (column tiles, row tiles of the table); p.M = all rows of the launch (the x map's plane height) */
template <bool FP4>
__global__ void __launch_bounds__(IG_THREADS, 1) ig_group_kernel(const __grid_constant__ ig_params p,
                                                                  const __grid_constant__ ig_group g) {
    const uint32_t r0 = g.tile[blockIdx.y][0], ec = g.tile[blockIdx.y][1], e = ec & 0xffffu;
    const ig_tile tl = {(int)r0, (int)(ec >> 16), (int)blockIdx.x * IG_TN, g.w[e], g.ws[e]};
    ig_body<FP4>(&p, tl);
}

/* ---------------- host side ---------------- */
static int g_ig_on = -1;
extern "C" int di_cuda_gemm_igmma_enabled(void) { return di_cuda_env_switch(&g_ig_on, "DI_CUDA_GEMM_IG", "0"); }
extern "C" void di_cuda_gemm_igmma_set_enabled(int on) { g_ig_on = on ? 1 : 0; }

static int g_ig_literal = 0;
extern "C" void di_cuda_gemm_igmma_set_literal(int on) { g_ig_literal = on ? 1 : 0; }

static int g_ig_tm = 0; /* test / bench: 64 or 128 x rows per tile; 0 the rule */
extern "C" void di_cuda_gemm_igmma_set_tile_rows(int tm) { g_ig_tm = tm == 64 || tm == IG_TM ? tm : 0; }

/* x rows per tile of a dense launch. A tile is one CTA over all of K (one per SM: ~200 KiB of shared memory);
 * a 64-row tile takes one column half's chain per block where a 128-row one takes two, and measured on the
 * H200 it runs in ~0.56 of the time (bench/NOTES-gpu.md, session 15: wo_b M 128 0.591 → 0.333 ms, 40 → 80
 * tiles). So 64-row tiles where they all fit in one wave (M 96–256 of the narrower weights), else 128: past
 * one wave the extra tiles cost more than the halved chains save (Engram projection M 128 0.895 → 0.993 ms). */
static int ig_tile_rows(int64_t m, int64_t n) {
    if (g_ig_tm) return g_ig_tm;
    return (m + 63) / 64 * ((n + IG_TN - 1) / IG_TN) <= di_cuda_sm_count() ? 64 : IG_TM;
}

/* H200 (bench/NOTES-gpu.md, sessions 13 and 15): a tile is one CTA walking all of K, so the time goes by
 * waves of 132 tiles; from ~48 tiles on this kernel ties or beats the int8 mma.sync GEMM (1.4x per wave).
 * FP8 at 33–64 rows (one x half per tile) on the widest weights, where the FP64-core GEMM stops at 32 rows:
 * Engram projection k6144 n25600 M 64 0.709 (mma.sync) → 0.498 ms, wq_b k1280 n32768 0.159 → 0.115 ms; the
 * narrower ones stay on the FP64-core GEMM or the split-K mma.sync one (wo_b M 64 0.296 vs 0.329 here). */
extern "C" int di_cuda_gemm_igmma_wants(int fp4, int64_t m, int64_t k, int64_t n) {
    (void)k;
    const int64_t nt = (n + IG_TN - 1) / IG_TN, tm = ig_tile_rows(m, n), rt = (m + tm - 1) / tm;
    if (rt > 65535) return 0;
    if (fp4) return m > 64 && (m + IG_TM - 1) / IG_TM * nt >= 48;
    if (m <= 64) return m > 32 && n >= 16384;
    return rt * nt >= 48;
}

/* Grouped: 128-row tiles pay for themselves where the experts average ~96 rows or more (the int8 mma.sync
 * GEMM's grouped rule picks its 128-row tile there too) */
extern "C" int di_cuda_gemm_igmma_grouped_wants(int64_t rows, int active) { return active > 0 && rows >= 96 * (int64_t)active; }

extern "C" uint64_t di_cuda_gemm_igmma_scratch(int64_t m, int64_t k) { return (uint64_t)m * (uint64_t)k * 3; }

#define IG_MAX_DEVICES 16
#define IG_MAX_ROW_TILES 65535 /* grid.y */
/* Per device and kernel: the shared-memory opt-in, and whether ptxas left the launch the full register pool
 * that the setmaxnreg split needs (an .inc the pool cannot grant would wait forever). Decided once per
 * (kernel, device) under a lock and then only read; a device index past the table is checked on every call. */
static pthread_mutex_t g_ig_lock = PTHREAD_MUTEX_INITIALIZER;
template <typename Kernel>
static int ig_ready(Kernel kern, int (&state)[IG_MAX_DEVICES], di_error *err) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return di_cuda_launched("gemm_igmma (current device)", err);
    const bool cached = dev >= 0 && dev < IG_MAX_DEVICES;
    if (cached && __atomic_load_n(&state[dev], __ATOMIC_ACQUIRE) > 0) return DI_OK;
    pthread_mutex_lock(&g_ig_lock);
    int rc = DI_OK;
    if (cached && state[dev] < 0) {
        rc = di_error_set(err, DI_ERR_INTERNAL, "cuda gemm_igmma: the kernel cannot run on device %d (see the first error)", dev);
    } else if (!cached || state[dev] == 0) {
        cudaFuncAttributes fa;
        cudaError_t e = cudaFuncGetAttributes(&fa, kern);
        if (e != cudaSuccess)
            rc = di_error_set(err, DI_ERR_INTERNAL, "cuda gemm_igmma: kernel attributes: %s", cudaGetErrorString(e));
        else if (fa.numRegs * IG_THREADS < 128 * IG_PROD_REGS + (IG_THREADS - 128) * IG_CONS_REGS)
            rc = di_error_set(err, DI_ERR_INTERNAL, "cuda gemm_igmma: the kernel got %d registers per thread, %d needed",
                              fa.numRegs, (128 * IG_PROD_REGS + (IG_THREADS - 128) * IG_CONS_REGS) / IG_THREADS);
        else if ((e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)IG_SMEM)) != cudaSuccess)
            rc = di_error_set(err, DI_ERR_INTERNAL, "cuda gemm_igmma: shared-memory opt-in of %zu bytes: %s", (size_t)IG_SMEM,
                              cudaGetErrorString(e));
        if (rc) (void)cudaGetLastError();
        if (cached) __atomic_store_n(&state[dev], rc ? -1 : 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_ig_lock);
    return rc;
}

/* The checks, the x pre-pass (unless xq is NULL: xd holds the planes already) and the parameters shared by
 * both entry points; rows = the x rows of the call */
static int ig_prepare(const char *op, const uint8_t *xq, const uint8_t *xs, int64_t rows, int64_t k, int64_t n,
                      uint16_t *y, uint8_t *xd, cudaStream_t st, ig_params *p, di_error *err) {
    if (rows < 1 || n < 1 || k < IG_QB || k % IG_QB || 3 * rows > INT32_MAX || k > INT32_MAX || n > INT32_MAX)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: M %lld, N %lld, K %lld (K a positive multiple of 32; 3·M, K, N < 2^31)",
                            op, (long long)rows, (long long)n, (long long)k);
    if (!xd || (uintptr_t)xd % 16 || (uintptr_t)xq % 4)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: xd (%p) must be 16-byte aligned, xq (%p) 4-byte aligned", op,
                            (const void *)xd, (const void *)xq);
    if (xq) {
        const int64_t words = rows * k / 4;
        ig_xprep<<<di_cuda_blocks(words, 256), 256, 0, st>>>(xq, words, rows * k, xd);
        const int rc = di_cuda_launched(op, err);
        if (rc) return rc;
    }
    memset(p, 0, sizeof *p);
    const int rc = make_map(&p->tx, xd, 3 * rows, k, IG_ROWB, 1, op, err);
    if (rc) return rc;
    p->xs = xs, p->M = (int)rows, p->N = (int)n, p->K = (int)k, p->KB = (int)(k / IG_QB), p->y = y;
    p->pairs = (n & 1) == 0 && (uintptr_t)y % 4 == 0;
    p->literal = g_ig_literal;
    return DI_OK;
}

static int g_ig_ready[2][2][IG_MAX_DEVICES]; /* [grouped][fp4]: 0 unknown, 1 ready, −1 refused */

/* Whether the kernel can run on the current device (the dispatch asks first, so a refusal falls back to the
 * int8 mma.sync GEMM instead of failing the call) */
extern "C" int di_cuda_gemm_igmma_usable(int fp4, int grouped) {
    di_error e = {0};
    int rc;
    if (grouped) rc = fp4 ? ig_ready(ig_group_kernel<true>, g_ig_ready[1][1], &e) : ig_ready(ig_group_kernel<false>, g_ig_ready[1][0], &e);
    else rc = fp4 ? ig_ready(ig_kernel<true>, g_ig_ready[0][1], &e) : ig_ready(ig_kernel<false>, g_ig_ready[0][0], &e);
    return rc == DI_OK;
}

extern "C" int di_cuda_gemm_igmma_run(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                                      const uint8_t *ws, int64_t n, uint16_t *y, uint8_t *xd, void *stream, di_error *err) {
    const char *op = fp4 ? "linear_fp4 (gemm_igmma)" : "linear_fp8 (gemm_igmma)";
    if ((uintptr_t)w % 16 || !xq)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: w (%p) must be 16-byte aligned, xq (%p) given", op, (const void *)w,
                            (const void *)xq);
    const int tm = ig_tile_rows(m, n);
    if (m > (int64_t)IG_MAX_ROW_TILES * tm)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: M %lld needs more than %d row tiles of %d", op, (long long)m,
                            IG_MAX_ROW_TILES, tm);
    int rc = fp4 ? ig_ready(ig_kernel<true>, g_ig_ready[0][1], err) : ig_ready(ig_kernel<false>, g_ig_ready[0][0], err);
    if (rc) return rc;
    cudaStream_t st = (cudaStream_t)stream;
    ig_params p;
    rc = ig_prepare(op, xq, xs, m, k, n, y, xd, st, &p, err);
    if (rc) return rc;
    p.w = w, p.wsc = ws, p.tm = tm;
    const dim3 grid(di_cuda_blocks(n, IG_TN), di_cuda_blocks(m, tm));
    if (fp4) ig_kernel<true><<<grid, IG_THREADS, IG_SMEM, st>>>(p);
    else ig_kernel<false><<<grid, IG_THREADS, IG_SMEM, st>>>(p);
    return di_cuda_launched(op, err);
}

static int g_ig_group_cap = 0; /* test: fewer row tiles per launch than the table holds (0: IG_GROUP_TILES) */
extern "C" void di_cuda_gemm_igmma_set_group_tiles(int n) { g_ig_group_cap = n > 0 && n < IG_GROUP_TILES ? n : 0; }

static int ig_group_launch(int fp4, const ig_params &p, const ig_group &g, int nt, cudaStream_t st, const char *op, di_error *err) {
    const dim3 grid(di_cuda_blocks(p.N, IG_TN), (unsigned)nt);
    if (fp4) ig_group_kernel<true><<<grid, IG_THREADS, IG_SMEM, st>>>(p, g);
    else ig_group_kernel<false><<<grid, IG_THREADS, IG_SMEM, st>>>(p, g);
    return di_cuda_launched(op, err);
}

extern "C" int di_cuda_gemm_igmma_grouped(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t k, int n_exp,
                                          const int64_t *start_h, const uint8_t *const *w, const uint8_t *const *ws, int64_t n,
                                          uint16_t *y, uint8_t *xd, void *stream, di_error *err) {
    const char *op = fp4 ? "linear_fp4 (gemm_igmma, grouped)" : "linear_fp8 (gemm_igmma, grouped)";
    if (n_exp < 1 || n_exp > IG_GROUP_EXPERTS)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: %d experts (1..%d)", op, n_exp, IG_GROUP_EXPERTS);
    const int64_t rows = start_h[n_exp];
    for (int e = 0; e < n_exp; e++) { /* the table is checked before anything is launched */
        if (start_h[e] < 0 || start_h[e + 1] < start_h[e])
            return di_error_set(err, DI_ERR_INVALID, "cuda %s: expert %d's rows [%lld, %lld)", op, e, (long long)start_h[e],
                                (long long)start_h[e + 1]);
        if (start_h[e + 1] > start_h[e] && (!w[e] || !ws[e] || (uintptr_t)w[e] % 16))
            return di_error_set(err, DI_ERR_INVALID, "cuda %s: expert %d has rows but no (16-byte aligned) weight", op, e);
    }
    if (rows == 0) return DI_OK;
    int rc = fp4 ? ig_ready(ig_group_kernel<true>, g_ig_ready[1][1], err) : ig_ready(ig_group_kernel<false>, g_ig_ready[1][0], err);
    if (rc) return rc;
    cudaStream_t st = (cudaStream_t)stream;
    ig_params p;
    rc = ig_prepare(op, xq, xs, rows, k, n, y, xd, st, &p, err);
    if (rc) return rc;
    ig_group g; /* ~26 KiB of kernel parameters, on this thread's stack */
    memcpy(g.w, w, sizeof(*w) * (size_t)n_exp);
    memcpy(g.ws, ws, sizeof(*ws) * (size_t)n_exp);
    const int cap = g_ig_group_cap ? g_ig_group_cap : IG_GROUP_TILES;
    int nt = 0;
    for (int e = 0; e < n_exp && !rc; e++)
        for (int64_t r = start_h[e]; r < start_h[e + 1] && !rc; r += IG_TM) {
            const int64_t cnt = start_h[e + 1] - r < IG_TM ? start_h[e + 1] - r : IG_TM;
            g.tile[nt][0] = (uint32_t)r, g.tile[nt][1] = (uint32_t)e | (uint32_t)cnt << 16;
            if (++nt == cap) rc = ig_group_launch(fp4, p, g, nt, st, op, err), nt = 0; /* a full table */
        }
    if (!rc && nt) rc = ig_group_launch(fp4, p, g, nt, st, op, err);
    return rc;
}
