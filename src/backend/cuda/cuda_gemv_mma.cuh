/* The MXFP4 decode GEMV on the int8 tensor cores: lane-level arithmetic shared by the kernel
 * (cuda_gemv_mma.cu) and its host emulation (tests/test_gemv_mma_emu.c). This header compiles as C11
 * (host, the emulation) and as CUDA C++ (device, the kernel): every function here is the one both run.
 *
 * Contract (linear_q.c, cuda_gemv.cuh): per 32-wide K block b the exact value of Σ q_x·q_w is rounded
 * once to f32, multiplied by s_x then s_w, and the block values P_b are added in ascending b. Only the
 * exact block sum changes hands here, so the result is the current kernel's bit for bit by construction:
 *
 *   X = x·2^9 ∈ ℤ, |X| ≤ 448·2^9 < 2^18, split into signed base-128 digits X = d0 + 2^7·d1 + 2^14·d2
 *   (|d0|, |d1| ≤ 127, |d2| ≤ 15: each an s8); W = 2·w ∈ {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}.
 *   S = Σ_32 X·W = S0 + 2^7·S1 + 2^14·S2 with S_d = Σ_32 d_d·W, |S_d| ≤ 32·127·12 < 2^16: every partial
 *   sum of every MMA is an exact int32, whatever order the tensor core adds in.
 *
 * One mma.m16n8k32.s8 covers one K block of 16 output columns (A: 16 weight rows × the block's 32
 * values) against 8 B columns; a B column is one digit plane of one x row in one block ("slot": 4
 * columns, digits 0..2 and a zero column), two slots per MMA.
 *
 * Weights to s8 with a byte permute (PTX prmt, generic form): a selector nibble's 3 low bits pick one
 * of 8 table bytes, its msb replicates that byte's sign bit instead of copying it. An E2M1 code is
 * exactly such a nibble (sign in bit 3, magnitude code in bits 0..2), so with the table 0 1 2 3 4 6 8 12
 * (all signs 0) one prmt turns 4 packed codes into 4 bytes |W| where the code is positive and 0 where it
 * is negative ("A⁺"); the same prmt on the codes with their sign bits flipped gives |W| for the negative
 * codes and 0 for the positive ones ("A⁻"). Two MMAs, S = A⁺·X − A⁻·X, replace the sign handling
 * (7 instructions per 4 codes in cuda_gemv.cuh's gv_e2m1x4_s8; here 1 prmt per 4 codes per plane plus a
 * shift and an xor per 8 codes). The ±0 codes give 0 in both planes. */
#ifndef DI_BACKEND_CUDA_CUDA_GEMV_MMA_CUH
#define DI_BACKEND_CUDA_CUDA_GEMV_MMA_CUH

#include <stdint.h>

#ifdef __CUDACC__
#define GVM_FN static __host__ __device__ __forceinline__
#else
#define GVM_FN static inline
#endif

#define GVM_MAG_LO 0x03020100u /* table bytes 0..3: 2·|w| of the magnitude codes 0..3 */
#define GVM_MAG_HI 0x0C080604u /* table bytes 4..7: 2·|w| of the magnitude codes 4..7 */
#define GVM_PAD 32             /* bytes between x digit planes in shared memory (bank spread) */
#define GVM_UP 2               /* K block pairs per warp step: K % (64·GVM_UP) == 0 */

/* prmt.b32 d, a, b, sel (generic form): byte i of d = byte (sel_i & 7) of b:a, or its sign replicated
 * when sel_i & 8, sel_i = bits 4i..4i+3 of sel (bits 16..31 unused) */
GVM_FN uint32_t gvm_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
#else
    uint64_t pool = (uint64_t)b << 32 | a;
    uint32_t d = 0;
    for (int i = 0; i < 4; i++) {
        uint32_t c = (sel >> (4 * i)) & 15u, byte = (uint32_t)(pool >> (8 * (c & 7u))) & 0xffu;
        if (c & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
        d |= byte << (8 * i);
    }
    return d;
#endif
}

/* 8 packed E2M1 codes (nibble i = value i) → the A⁺ / A⁻ bytes of values 0..3 (lo) and 4..7 (hi) */
GVM_FN void gvm_expand8(uint32_t w, uint32_t *pos_lo, uint32_t *pos_hi, uint32_t *neg_lo, uint32_t *neg_hi) {
    const uint32_t wn = w ^ 0x88888888u; /* sign bits flipped */
    *pos_lo = gvm_prmt(GVM_MAG_LO, GVM_MAG_HI, w);
    *pos_hi = gvm_prmt(GVM_MAG_LO, GVM_MAG_HI, w >> 16);
    *neg_lo = gvm_prmt(GVM_MAG_LO, GVM_MAG_HI, wn);
    *neg_hi = gvm_prmt(GVM_MAG_LO, GVM_MAG_HI, wn >> 16);
}

/* A fragments of one block for a lane: w0 / w1 = the lane's 4 weight bytes (values 8q..8q+7 of the block)
 * of rows g and g+8. PTX fragment of mma.m16n8k32 .s8 A: register 0 = row g, k 4q..4q+3; 1 = row g+8,
 * same k; 2 = row g, k 16+4q..; 3 = row g+8, k 16+4q... The lane's values 8q..8q+3 play k 4q..4q+3 and
 * 8q+4..8q+7 play k 16+4q..; B (gvm_b_off) uses the same map, and a block sum does not depend on which
 * k a value plays. */
GVM_FN void gvm_a_frag(uint32_t w0, uint32_t w1, uint32_t apos[4], uint32_t aneg[4]) {
    gvm_expand8(w0, &apos[0], &apos[2], &aneg[0], &aneg[2]);
    gvm_expand8(w1, &apos[1], &apos[3], &aneg[1], &aneg[3]);
}

/* The grouped expert GEMM (cuda_moe_mm.cu) takes the weights as one signed plane instead: 8 packed E2M1
 * codes → the signed bytes W = 2·w of values 0..3 (lo) and 4..7 (hi). Per byte A⁺ and A⁻ are 0..12 and at
 * most one is nonzero, so A⁺ + 128 carries into no other byte and (A⁺ + 128) − A⁻ lies in 116..140,
 * borrowing from none (one three-input add); xor 128 turns that biased byte into the two's complement
 * of A⁺ − A⁻. */
GVM_FN void gvm_s8x8(uint32_t w, uint32_t *lo, uint32_t *hi) {
    uint32_t pl, ph, nl, nh;
    gvm_expand8(w, &pl, &ph, &nl, &nh);
    *lo = (pl + 0x80808080u - nl) ^ 0x80808080u;
    *hi = (ph + 0x80808080u - nh) ^ 0x80808080u;
}

/* The grouped GEMM's A fragment of one block from the lane's code words of rows g and g+8 (quarter q of
 * the block: values 8q..8q+7), the same value → k map as gvm_a_frag: values 8q..8q+3 play k 4q..4q+3,
 * 8q+4..8q+7 play k 16+4q.. */
GVM_FN void gvm_mm_a_frag(uint32_t wg, uint32_t wg8, uint32_t a[4]) {
    gvm_s8x8(wg, &a[0], &a[2]);
    gvm_s8x8(wg8, &a[1], &a[3]);
}

/* S of one block from the three digit-plane sums S_d = Σ d_d·W (|S| < 2^27: exact in int32) */
GVM_FN int32_t gvm_mm_sum(int32_t s0, int32_t s1, int32_t s2) { return s0 + s1 * 128 + s2 * 16384; }

/* e4m3 code → X = x·2^9: (8 + m)·2^(e−1) for e ≥ 1, m for e = 0. The NaN codes 0x7F / 0xFF (only in
 * act-quantized groups whose scale is the NaN byte 255) count as ±15·2^14: finite, the scale makes P_b NaN. */
GVM_FN int32_t gvm_e4m3_int(uint32_t code) {
    uint32_t e = (code >> 3) & 15u, m = code & 7u;
    int32_t mag = e ? (int32_t)((8u | m) << (e - 1)) : (int32_t)m;
    return (code & 0x80u) ? -mag : mag;
}

/* 4 e4m3 codes (byte i = value i) → their signed base-128 digits, one packed s8 word per digit */
GVM_FN void gvm_x_digits(uint32_t codes, uint32_t dig[3]) {
    uint32_t p0 = 0, p1 = 0, p2 = 0;
    for (int j = 0; j < 4; j++) {
        int32_t v = gvm_e4m3_int(codes >> (8 * j));
        uint32_t a = (uint32_t)(v < 0 ? -v : v);
        uint32_t b0 = a & 127u, b1 = (a >> 7) & 127u, b2 = a >> 14;
        if (v < 0) b0 = (0u - b0) & 0xffu, b1 = (0u - b1) & 0xffu, b2 = (0u - b2) & 0xffu;
        p0 |= b0 << (8 * j), p1 |= b1 << (8 * j), p2 |= b2 << (8 * j);
    }
    dig[0] = p0, dig[1] = p1, dig[2] = p2;
}

/* The digits of one e4m3 code, d0 | d1 << 8 | d2 << 16: the table entry gvm_x_digits_tab reads */
GVM_FN uint32_t gvm_x_digits_entry(uint32_t code) {
    uint32_t dig[3];
    gvm_x_digits(code & 0xffu, dig);
    return (dig[0] & 0xffu) | (dig[1] & 0xffu) << 8 | (dig[2] & 0xffu) << 16;
}

/* gvm_x_digits of 4 codes through the table of entries (each byte's digits depend on that byte alone):
 * four lookups, then byte permutes gather digit d of each code into word d */
GVM_FN void gvm_x_digits_tab(const uint32_t *tab, uint32_t codes, uint32_t dig[3]) {
    const uint32_t t0 = tab[codes & 0xffu], t1 = tab[(codes >> 8) & 0xffu], t2 = tab[(codes >> 16) & 0xffu],
                   t3 = tab[codes >> 24];
    const uint32_t a01 = gvm_prmt(t0, t1, 0x5140u), b01 = gvm_prmt(t0, t1, 0x0062u); /* t0.0 t1.0 t0.1 t1.1 | t0.2 t1.2 */
    const uint32_t a23 = gvm_prmt(t2, t3, 0x5140u), b23 = gvm_prmt(t2, t3, 0x0062u);
    dig[0] = gvm_prmt(a01, a23, 0x5410u);
    dig[1] = gvm_prmt(a01, a23, 0x7632u);
    dig[2] = gvm_prmt(b01, b23, 0x5410u);
}

/* Slot s = j·MT + m of a block pair (MT = 1, 2, 4 rows per launch; two slots per n8 MMA tile): block j
 * (0, 1) of the pair, x row m. One row: the pair's two blocks share the tile; 2 or 4 rows: a tile holds
 * two rows of one block. */
GVM_FN void gvm_slot(int mt_rows, int s, int *j, int *m) { *j = s / mt_rows, *m = s % mt_rows; }

/* The C fragment (rows g, g+8 × columns 2q, 2q+1) of a lane → its block sum S. Columns 4h..4h+3 hold
 * slot h's S0, S1, S2, 0: an even lane has S0, S1 of both rows, the odd lane next to it S2 of both. The
 * even lane keeps row g, the odd one row g+8; each sends the other what it lacks (one shuffle): */
GVM_FN int32_t gvm_send(int odd, const int32_t c[4]) { return odd ? c[0] : c[2] + c[3] * 128; }
GVM_FN int32_t gvm_block_sum(int odd, const int32_t c[4], int32_t recv) {
    return odd ? recv + c[2] * 16384 : c[0] + c[1] * 128 + recv * 16384;
}

/* E8M0 byte → f32: 2^(e−127), e = 0 the subnormal 2^−127, e = 255 NaN (di_e8m0_to_f32) */
GVM_FN float gvm_e8m0(uint32_t e) {
    union {
        uint32_t u;
        float f;
    } v;
    v.u = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : e << 23;
    return v.f;
}

/* f32 product rounded once (the CPU's p = (float)s * sx; p = p * sw, never fused) */
GVM_FN float gvm_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* s_x·2^−10 of an x scale byte: exact (a power of two ≥ 2^−137, above the smallest f32 subnormal 2^−149;
 * NaN stays NaN), computed once per (row, block) */
GVM_FN float gvm_x_scale(uint32_t e) { return gvm_mul(gvm_e8m0(e), 0x1p-10f); }

/* P_b = ((f32(S)·2^−10)·s_x)·s_w, the CPU's roundings (linear_q.c: the exact block sum S·2^−10 rounded
 * once to f32, times s_x, then times s_w). f32(S)·2^−10 is exact (|S| < 2^27, a nonzero |f32(S)| ≥ 1), so
 * (f32(S)·2^−10)·s_x and f32(S)·(s_x·2^−10) are the same real number rounded once: one multiply fewer
 * per output, the same bits (sx10 = gvm_x_scale) */
GVM_FN float gvm_block_value(int32_t s, float sx10, uint32_t sw_byte) {
#ifdef __CUDA_ARCH__
    const float p = __int2float_rn(s);
#else
    const float p = (float)s;
#endif
    return gvm_mul(gvm_mul(p, sx10), gvm_e8m0(sw_byte));
}

/* Shared memory of the kernel: x digit planes s8 [MT][3][K + GVM_PAD], s_x·2^−10 f32 [MT][K/32], the block
 * values f32 [MT][NC][K/32 + 2] (the 2 spare words put a warp's 16 rows × 2 blocks of P_b stores in 32
 * different banks), the e4m3 code → digits table u32 [256] */
GVM_FN uint64_t gvm_smem(int mt, int nc, int64_t K) {
    uint64_t planes = ((uint64_t)mt * 3 * (uint64_t)(K + GVM_PAD) + 15) & ~(uint64_t)15;
    return planes + 4 * (uint64_t)mt * (uint64_t)(K / 32) + 4 * (uint64_t)mt * (uint64_t)nc * (uint64_t)(K / 32 + 2) +
           4 * 256;
}

/* ---- the device core (CUDA only): also called by cuda_moe.cu's grouped expert GEMVs ---- */
#ifdef __CUDACC__
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"

#define GVM_WARPS 8 /* most warps per CTA */

/* launch shape for K inputs: warps share the K units evenly, at most GVM_WARPS */
static inline int gvm_threads(int64_t K) {
    const int64_t nu = K / (64 * GVM_UP), per = (nu + GVM_WARPS - 1) / GVM_WARPS;
    return (int)((nu + per - 1) / per) * 32;
}

/* d += a·b: m16n8k32, s8 × s8 → s32, exact (every partial sum here is far below 2^31) */
static __device__ __forceinline__ void gvm_mma(int32_t d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* one lane's loads of one unit: weight words [pair][block j][row g / g+8], scale bytes of the pair */
struct gvm_unit {
    uint32_t w[GVM_UP][2][2];
    uint32_t sw[GVM_UP]; /* byte j = s_w of block j of the pair, row g + 8·(q & 1) */
};

template <int NC>
static __device__ __forceinline__ void gvm_load(const gv_args &a, int64_t tile, int64_t ntiles, int64_t u, int g, int q,
                                                gvm_unit &f) {
    const int64_t KB = a.K / 32, rowb = a.K / 2, n0 = tile * NC;
    const bool ok = tile < ntiles;
#pragma unroll
    for (int i = 0; i < GVM_UP; i++) {
        const int64_t kb0 = 2 * (u * GVM_UP + i);
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int64_t row = n0 + g + 8 * r;
                const bool live = ok && (NC == 16 || r == 0) && row < a.N;
                f.w[i][j][r] = live ? __ldg((const uint32_t *)(a.w + row * rowb + (kb0 + j) * 16 + 4 * q)) : 0u;
            }
        const int64_t orow = n0 + g + 8 * (q & 1);
        const bool live = ok && (NC == 16 || (q & 1) == 0) && orow < a.N;
        f.sw[i] = live ? (uint32_t)__ldg((const uint16_t *)(a.wsc + orow * KB + kb0)) : 0u;
    }
}

/* The tiles tile0, tile0 + step, … of y = x·Wᵀ for the mt ≤ MT rows whose x rows are xrow(m); out(m, n, v)
 * receives the f32 result. sm: gvm_smem(MT, NC, K) bytes of shared memory. Every thread of the CTA calls
 * this (it synchronises). Same functor interface as gv_run, so cuda_moe.cu can call it too. */
template <int MT, int NC, class XRow, class Out>
static __device__ void gvm_run(const gv_args a, const XRow xrow, int mt, const Out out, int64_t tile0, int64_t step,
                               unsigned char *sm) {
    constexpr int NT = MT; /* n8 MMA tiles per block pair: 2·MT slots, two per tile */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3, odd = q & 1;
    const int64_t K = a.K, KB = K / 32, KBP = KB + 2, NU = KB / (2 * GVM_UP), ps = K + GVM_PAD;
    const int64_t ntiles = (a.N + NC - 1) / NC;
    uint8_t *xd = sm;                                           /* s8 [MT][3][ps] digit planes */
    float *sxs = (float *)(sm + ((MT * 3 * ps + 15) & ~(int64_t)15)); /* f32 [MT][KB] */
    float *pb = sxs + MT * KB;                                  /* f32 [MT][NC][KBP] */
    uint32_t *tab = (uint32_t *)(pb + MT * NC * KBP); /* e4m3 code → its digits d0 | d1 << 8 | d2 << 16 */
    for (int c = threadIdx.x; c < 256; c += blockDim.x) tab[c] = gvm_x_digits_entry((uint32_t)c);
    __syncthreads();
    for (int m = 0; m < mt; m++) { /* x row m: its digit planes and scales */
        const int64_t xr = xrow(m);
        const uint32_t *src = (const uint32_t *)(a.xq + xr * K);
        uint8_t *dst = xd + m * 3 * ps;
#pragma unroll 4
        for (int c = threadIdx.x; c < (int)(K / 4); c += blockDim.x) {
            uint32_t dig[3];
            gvm_x_digits_tab(tab, __ldg(src + c), dig);
#pragma unroll
            for (int d = 0; d < 3; d++) *(uint32_t *)(dst + d * ps + 4 * c) = dig[d];
        }
        for (int b = threadIdx.x; b < (int)KB; b += blockDim.x) sxs[m * KB + b] = gvm_x_scale(__ldg(a.xs + xr * KB + b));
    }
    __syncthreads();

    const int bh = g >> 2, bd = g & 3; /* this lane's B column: slot half, digit (3: the zero column) */
    gvm_unit nx;
    gvm_load<NC>(a, tile0, ntiles, warp, g, q, nx);
    for (int64_t tile = tile0; tile < ntiles; tile += step) {
        const int64_t n0 = tile * NC;
        for (int64_t u = warp; u < NU; u += nw) { /* warp-uniform: all lanes reach the MMAs and shuffles */
            const gvm_unit f = nx;
            const bool same = u + nw < NU; /* the next unit of this tile, else the first of the next tile */
            gvm_load<NC>(a, same ? tile : tile + step, ntiles, same ? u + nw : warp, g, q, nx);
#pragma unroll
            for (int i = 0; i < GVM_UP; i++) {
                const int64_t kb0 = 2 * (u * GVM_UP + i);
                uint32_t apos[2][4], aneg[2][4];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    gvm_a_frag(f.w[i][j][0], f.w[i][j][1], apos[j], aneg[j]);
                    if (NC == 8) /* rows g+8 lie outside the tile: constant zeros, their prmts dead code */
                        apos[j][1] = apos[j][3] = aneg[j][1] = aneg[j][3] = 0u;
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int32_t cp[4] = {0, 0, 0, 0}, cn[4] = {0, 0, 0, 0};
                    int bj, bm;
                    gvm_slot(MT, 2 * t + bh, &bj, &bm);
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        if (MT != 1 && j != (2 * t) / MT) continue; /* this tile holds block j of the pair only */
                        uint2 b = make_uint2(0u, 0u);
                        if (bj == j && bd < 3 && (MT == 1 || bm < mt)) /* mt ≥ 1 */
                            b = *(const uint2 *)(xd + (bm * 3 + bd) * ps + (kb0 + j) * 32 + 8 * q);
                        gvm_mma(cp, apos[j], b.x, b.y);
                        gvm_mma(cn, aneg[j], b.x, b.y);
                    }
                    int32_t c[4];
#pragma unroll
                    for (int r = 0; r < 4; r++) c[r] = cp[r] - cn[r];
                    const int32_t recv = __shfl_xor_sync(0xffffffffu, gvm_send(odd, c), 1);
                    const int32_t s = gvm_block_sum(odd, c, recv);
                    int oj, om;
                    gvm_slot(MT, 2 * t + (q >> 1), &oj, &om);
                    const int orow = g + 8 * odd;
                    if ((MT == 1 || om < mt) && orow < NC && n0 + orow < a.N)
                        pb[((int64_t)om * NC + orow) * KBP + kb0 + oj] =
                            gvm_block_value(s, sxs[om * KB + kb0 + oj], (f.sw[i] >> (8 * oj)) & 0xffu);
                }
            }
        }
        __syncthreads();
        const int ncol = (int)min((int64_t)NC, a.N - n0);
        for (int o = threadIdx.x; o < mt * ncol; o += blockDim.x) { /* the CPU's f32 adds, blocks ascending */
            const int m = o / ncol, cc = o % ncol;
            const float *p = pb + ((int64_t)m * NC + cc) * KBP;
            float acc = 0.0f;
#pragma unroll 4
            for (int64_t kb = 0; kb < KB; kb += 2) { /* KB, KBP even: 8-byte loads */
                const float2 v = *(const float2 *)(p + kb);
                acc = __fadd_rn(__fadd_rn(acc, v.x), v.y);
            }
            out(m, n0 + cc, acc);
        }
        __syncthreads();
    }
}
#endif /* __CUDACC__ */

/* ---- entry points (cuda_gemv_mma.cu) ---- */
#include "backend/backend.h"
#include "util/error.h"
#ifdef __cplusplus
extern "C" {
#endif
/* On unless DI_CUDA_GEMV=simt is in the environment (read once): linear_fp4's M ≤ 16 path and moe_routed's
 * expert GEMVs take this kernel. di_cuda_gemv_mma_set_enabled overrides the environment (tests, bench). */
int di_cuda_gemv_mma_enabled(void);
void di_cuda_gemv_mma_set_enabled(int on);
/* Whether this kernel takes the call: 1 ≤ m ≤ 16, k % 128 == 0, w 16- and ws 2-byte aligned */
int di_cuda_gemv_mma_fits(int64_t m, int64_t k, const void *w, const void *ws);
/* y bf16 [m, n] = the MXFP4 linear of act-quantized rows xq e4m3 [m, k], xs E8M0 [m, k/32] with w packed
 * E2M1 [n, k/2], ws E8M0 [n, k/32] (device pointers), on stream (a cudaStream_t) */
int di_cuda_gemv_mma_run(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                         const uint8_t *ws, int64_t n, uint16_t *y, void *stream, di_error *err);
/* the same on the backend's stream (the bench's and the GPU test's entry) */
int di_cuda_gemv_mma_codes(const di_backend *be, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k,
                           const uint8_t *w, const uint8_t *ws, int64_t n, uint16_t *y, di_error *err);
/* Bench: the column tile, 8 or 16; 0 = the default rule */
void di_cuda_gemv_mma_set_tile(int nc);
#ifdef __cplusplus
}
#endif

#endif
