/* Bandwidth-oriented exact GEMV core for the block-scaled FP8 / MXFP4 linears at decode-sized M
 * (cuda_gemm.cu's small-M path and cuda_moe.cu's grouped expert GEMVs). Same contract as the CPU op
 * (linear_q.c): per 32-wide K block the exact value of Σ q_x·q_w is rounded once to f32, multiplied by
 * s_x then s_w, and the scaled blocks are added to an f32 accumulator in ascending block order.
 *
 * Work split. A tile = NC (4 or 8) output columns × all K for up to MT rows. A weight row is cut into
 * 8-byte chunks (8 e4m3 codes or 16 E2M1 values); a warp takes a slice of 32 consecutive chunks (256
 * contiguous bytes per load instruction), the CTA's warps share the slices of K, and each lane holds
 * its chunk of the MT x rows in registers while it streams the chunk of every column of the tile. A
 * block's partial sums are combined across the lanes holding it (4 lanes for FP8, 2 for FP4) — exact,
 * so the combination order does not matter — and its scaled f32 value P_b goes to shared memory; one
 * thread per (row, column) then adds P_0 … P_{KB−1} in order. CTAs loop over tiles (persistent grid);
 * each warp loads the next slice's weights before working on the current one, so two slices of loads
 * are in flight per warp, also across the ordered sum at a tile's end.
 *
 * Exact block sums without the f64 conversion cost of the part-1 kernel:
 *  - FP8 (e4m3 × e4m3): in f64, as before (each product has ≤ 8 significant bits and a block sum needs
 *    ≤ 41, well inside 53), but the codes become doubles through a 256-entry table of high words (an
 *    e4m3 value has ≤ 4 significant bits, so the low word is 0), replicated once per lane (entry
 *    code·32 + lane: lane l always reads bank l, no conflicts): one shared load per code instead of a
 *    decode plus a float→double conversion, whose unit is a quarter of the FP64 rate.
 *  - MXFP4 (e4m3 activations × E2M1 weights): in 32-bit integers. X = x·2^9 is an integer with
 *    |X| ≤ 448·2^9 < 2^18 and W = 2·w one of 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12, so Σ_32 X·W < 2^27 fits an
 *    int32 exactly; the block value is that sum ·2^-10, rounded to f32 by one int → float conversion.
 *    X is split into three signed 7-bit digits (X = d0 + 2^7·d1 + 2^14·d2) so that every product runs
 *    on dp4a (four int8·int8 products per instruction); the weights become signed bytes through two
 *    byte-permute table lookups per four nibbles. An act-quantized NaN group has scale byte 255 (NaN),
 *    which makes P_b NaN through s_x like the CPU's f64 NaN does (its codes 0x7F count as finite here). */
#ifndef DI_BACKEND_CUDA_CUDA_GEMV_CUH
#define DI_BACKEND_CUDA_CUDA_GEMV_CUH

#include "backend/cuda/cuda_common.cuh"

#define GV_NCOL 8                /* output columns per tile (the NC template argument; 4 in the bench variant) */
#define GV_WARPS 8               /* most warps per CTA */
#define GV_TAB_WORDS (256 * 32)  /* e4m3 → f64 high-word table, one copy per lane (32 KiB) */

/* the act-quantized x rows, the weight and the problem */
typedef struct gv_args {
    const uint8_t *xq, *xs; /* e4m3 [*, K], E8M0 [*, K/32] */
    const uint8_t *w, *wsc; /* e4m3 [N, K] + E8M0 [ceil(N/32), K/32], or E2M1 [N, K/2] + E8M0 [N, K/32] */
    int64_t N, K;
} gv_args;

/* The 256 high words, then each copied to the other 31 lanes' slots (blockDim.x ≥ 32). */
static __device__ void gv_fill_tab(uint32_t *tab) {
    for (int c = threadIdx.x; c < 256; c += blockDim.x) tab[c << 5] = (uint32_t)__double2hiint((double)d_e4m3_decode((uint8_t)c));
    __syncthreads();
    for (int i = threadIdx.x; i < GV_TAB_WORDS; i += blockDim.x)
        if (i & 31) tab[i] = tab[i & ~31];
    __syncthreads();
}

static __device__ __forceinline__ double gv_e4m3_f64(const uint32_t *tab, uint32_t code, int lane) {
    return __hiloint2double((int)tab[((code & 0xffu) << 5) | (uint32_t)lane], 0);
}

/* 4 E2M1 codes (bits 4i..4i+3 = value i) → 4 signed bytes 2·value (byte i = value i) */
static __device__ __forceinline__ int gv_e2m1x4_s8(uint32_t nib16) {
    uint32_t mag = nib16 & 0x7777u;
    uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, mag); /* 0 1 2 3 4 6 8 12 */
    uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, mag); /* the same, negated */
    uint32_t sgn = __byte_perm(0x0000FF00u, 0u, (nib16 >> 3) & 0x1111u); /* 0xFF where the sign bit is set */
    return (int)((pos & ~sgn) | (neg & sgn));
}

/* e4m3 code → x·2^9 as an integer: (8 + m)·2^(e−1) for e ≥ 1, m for the subnormals */
static __device__ __forceinline__ int gv_e4m3_int(uint32_t code) {
    uint32_t e = (code >> 3) & 15u, m = code & 7u;
    int mag = e ? (int)((8u | m) << (e - 1)) : (int)m;
    return (code & 0x80u) ? -mag : mag;
}

/* 4 e4m3 codes (byte i = value i) → their signed base-128 digits, packed byte i = value i */
static __device__ __forceinline__ void gv_x_digits(uint32_t codes, int *d0, int *d1, int *d2) {
    uint32_t p0 = 0, p1 = 0, p2 = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int v = gv_e4m3_int(codes >> (8 * j));
        uint32_t a = (uint32_t)(v < 0 ? -v : v);
        uint32_t b0 = a & 127u, b1 = (a >> 7) & 127u, b2 = a >> 14;
        if (v < 0) b0 = (0u - b0) & 0xffu, b1 = (0u - b1) & 0xffu, b2 = (0u - b2) & 0xffu;
        p0 |= b0 << (8 * j), p1 |= b1 << (8 * j), p2 |= b2 << (8 * j);
    }
    *d0 = (int)p0, *d1 = (int)p1, *d2 = (int)p2;
}

/* Every global load of one (tile, slice) of a lane, issued together so that a slice costs one memory
 * latency: the weight chunks, their scales and (FP8) the x chunk and scale of each row. */
template <int MT, int NC>
struct gv_slice {
    uint2 w[NC];           /* chunk of each column's weight row */
    uint32_t sw[NC];       /* scale byte of each column (FP8: one per 32 rows, so all equal) */
    uint2 xq[MT];          /* FP8: x codes of the chunk */
    uint32_t xs[MT];       /* FP8: x scale byte */
};

template <int FP4, int MT, int NC>
static __device__ __forceinline__ void gv_load(const gv_args &a, const int64_t *xr, int mt, int64_t tile, int64_t ntiles,
                                               int64_t sl, int lane, gv_slice<MT, NC> &f) {
    const int64_t KB = a.K / 32, rowb = FP4 ? a.K / 2 : a.K, nch = rowb / 8, c = sl * 32 + lane, n0 = tile * NC;
    const bool ok = tile < ntiles && c < nch;
    const int64_t k0 = FP4 ? c * 16 : c * 8, kb = k0 / 32;
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const bool col = ok && n0 + cc < a.N;
        f.w[cc] = col ? __ldcs((const uint2 *)(a.w + (n0 + cc) * rowb + c * 8)) : make_uint2(0u, 0u);
        if (FP4) f.sw[cc] = col ? __ldg(a.wsc + (n0 + cc) * KB + kb) : 0u;
    }
    if (!FP4) {
        const uint32_t sw = ok ? __ldg(a.wsc + (n0 / 32) * KB + kb) : 0u; /* n0 % 8 == 0: one 32-row group */
#pragma unroll
        for (int cc = 0; cc < NC; cc++) f.sw[cc] = sw;
    }
#pragma unroll
    for (int m = 0; m < MT; m++) { /* FP8 only: the MXFP4 path reads x from shared memory */
        const bool row = !FP4 && ok && m < mt;
        f.xq[m] = row ? __ldg((const uint2 *)(a.xq + xr[m] * a.K + k0)) : make_uint2(0u, 0u);
        f.xs[m] = row ? __ldg(a.xs + xr[m] * KB + kb) : 0u;
    }
}

/* The tiles tile0, tile0 + step, … of y = x·Wᵀ for the mt ≤ MT rows whose x rows are xrow(m);
 * out(m, n, v) receives the f32 result of row m, column n. tab: the e4m3 table (FP8); sm: shared
 * memory of gv_smem bytes past the table. Every thread of the CTA calls this (it synchronises). */
template <int FP4, int MT, int NC, class XRow, class Out>
static __device__ void gv_run(const gv_args a, const XRow xrow, int mt, const Out out, int64_t tile0, int64_t step,
                              const uint32_t *tab, float *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t KB = a.K / 32, rowb = FP4 ? a.K / 2 : a.K, nch = rowb / 8, nsl = (nch + 31) / 32;
    const int64_t ntiles = (a.N + NC - 1) / NC;
    int64_t xr[MT]; /* x row of each tile row */
#pragma unroll
    for (int m = 0; m < MT; m++) xr[m] = m < mt ? xrow(m) : 0;
    /* MXFP4: the rows' digits (int32 [MT][3][K/4], 4 values each) and scales (f32 [MT][KB]) once per call,
     * so a slice reads them with three 16-byte shared loads per row; then pb */
    int *xds = (int *)sm;
    float *sxs = sm + (FP4 ? 3 * MT * (a.K / 4) : 0), *pb = sxs + (FP4 ? MT * KB : 0);
    if (FP4) {
        for (int64_t i = threadIdx.x; i < (int64_t)mt * (a.K / 4); i += blockDim.x) {
            const int64_t m = i / (a.K / 4), g = i % (a.K / 4);
            int d0, d1, d2;
            gv_x_digits(__ldg((const uint32_t *)(a.xq + xrow((int)m) * a.K) + g), &d0, &d1, &d2);
            xds[(m * 3 + 0) * (a.K / 4) + g] = d0, xds[(m * 3 + 1) * (a.K / 4) + g] = d1;
            xds[(m * 3 + 2) * (a.K / 4) + g] = d2;
        }
        for (int64_t i = threadIdx.x; i < (int64_t)mt * KB; i += blockDim.x)
            sxs[i] = d_e8m0(__ldg(a.xs + xrow((int)(i / KB)) * KB + i % KB));
        __syncthreads();
    }
    gv_slice<MT, NC> nx; /* the loads of this warp's next (tile, slice) */
    gv_load<FP4, MT, NC>(a, xr, mt, tile0, ntiles, warp, lane, nx);
    for (int64_t tile = tile0; tile < ntiles; tile += step) {
        const int64_t n0 = tile * NC;
        const int ncol = (int)min((int64_t)NC, a.N - n0);
        for (int64_t sl = warp; sl < nsl; sl += nw) { /* warp-uniform: every lane reaches the shuffles */
            const gv_slice<MT, NC> f = nx;
            if (sl + nw < nsl) gv_load<FP4, MT, NC>(a, xr, mt, tile, ntiles, sl + nw, lane, nx);
            else gv_load<FP4, MT, NC>(a, xr, mt, tile + step, ntiles, warp, lane, nx);

            const int64_t c = sl * 32 + lane;
            const bool live = c < nch;
            const int64_t kb = (FP4 ? c * 16 : c * 8) / 32;
            const bool lead = live && (FP4 ? (lane & 1) == 0 : (lane & 3) == 0);
            if (FP4) {
                int xd[MT][3][4]; /* signed digits of X, 4 values per int */
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int d = 0; d < 3; d++) {
                        const int4 v = live && m < mt ? ((const int4 *)(xds + (m * 3 + d) * (a.K / 4)))[c]
                                                      : make_int4(0, 0, 0, 0);
                        xd[m][d][0] = v.x, xd[m][d][1] = v.y, xd[m][d][2] = v.z, xd[m][d][3] = v.w;
                    }
#pragma unroll
                for (int cc = 0; cc < NC; cc++) { /* columns past ncol hold zeros and are not stored */
                    const int wq[4] = {gv_e2m1x4_s8(f.w[cc].x & 0xffffu), gv_e2m1x4_s8(f.w[cc].x >> 16),
                                       gv_e2m1x4_s8(f.w[cc].y & 0xffffu), gv_e2m1x4_s8(f.w[cc].y >> 16)};
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        int s0 = 0, s1 = 0, s2 = 0;
#pragma unroll
                        for (int g = 0; g < 4; g++) {
                            s0 = __dp4a(wq[g], xd[m][0][g], s0);
                            s1 = __dp4a(wq[g], xd[m][1][g], s1);
                            s2 = __dp4a(wq[g], xd[m][2][g], s2);
                        }
                        int s = s0 + s1 * 128 + s2 * 16384; /* this lane's 16 values, exact */
                        s += __shfl_xor_sync(0xffffffffu, s, 1);
                        if (lead && m < mt && cc < ncol) {
                            float p = __fmul_rn(__int2float_rn(s), 0x1p-10f); /* exact: power-of-two scaling */
                            pb[((int64_t)m * NC + cc) * KB + kb] =
                                __fmul_rn(__fmul_rn(p, sxs[m * KB + kb]), d_e8m0((uint8_t)f.sw[cc]));
                        }
                    }
                }
            } else {
                double xv[MT][8]; /* e4m3 values of this chunk of the rows */
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        xv[m][j] = gv_e4m3_f64(tab, f.xq[m].x >> (8 * j), lane);
                        xv[m][4 + j] = gv_e4m3_f64(tab, f.xq[m].y >> (8 * j), lane);
                    }
                const float sw = d_e8m0((uint8_t)f.sw[0]);
#pragma unroll
                for (int cc = 0; cc < NC; cc++) {
                    double wd[8];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        wd[j] = gv_e4m3_f64(tab, f.w[cc].x >> (8 * j), lane);
                        wd[4 + j] = gv_e4m3_f64(tab, f.w[cc].y >> (8 * j), lane);
                    }
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        double s = 0.0; /* exact: see the file comment */
#pragma unroll
                        for (int j = 0; j < 8; j++) s = fma(xv[m][j], wd[j], s);
                        s += __shfl_xor_sync(0xffffffffu, s, 1);
                        s += __shfl_xor_sync(0xffffffffu, s, 2);
                        if (lead && m < mt && cc < ncol)
                            pb[((int64_t)m * NC + cc) * KB + kb] =
                                __fmul_rn(__fmul_rn(__double2float_rn(s), d_e8m0((uint8_t)f.xs[m])), sw);
                    }
                }
            }
        }
        __syncthreads();
        for (int o = threadIdx.x; o < mt * ncol; o += blockDim.x) { /* the CPU's f32 adds, blocks ascending */
            const int m = o / ncol, cc = o % ncol;
            const float *p = pb + ((int64_t)m * NC + cc) * KB;
            float acc = 0.0f;
            int64_t kb = 0;
            if (KB % 4 == 0) { /* 16-byte loads issued ahead of the dependent adds */
#pragma unroll 4
                for (; kb < KB; kb += 4) {
                    const float4 v = *(const float4 *)(p + kb);
                    acc = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, v.x), v.y), v.z), v.w);
                }
            }
            for (; kb < KB; kb++) acc = __fadd_rn(acc, p[kb]);
            out(m, n0 + cc, acc);
        }
        __syncthreads();
    }
}

/* Launch shape for a weight with K inputs: warps share the slices evenly (at most GV_WARPS). */
static inline int gv_threads(int fp4, int64_t K) {
    int64_t nch = (fp4 ? K / 2 : K) / 8, nsl = (nch + 31) / 32;
    int64_t per = (nsl + GV_WARPS - 1) / GV_WARPS;
    return (int)((nsl + per - 1) / per) * 32;
}
static inline size_t gv_smem(int fp4, int mt, int64_t K, int nc = GV_NCOL) {
    size_t pb = sizeof(float) * (size_t)mt * (size_t)nc * (size_t)(K / 32);
    if (fp4) return 3 * (size_t)mt * (size_t)K + sizeof(float) * (size_t)mt * (size_t)(K / 32) + pb;
    return sizeof(uint32_t) * GV_TAB_WORDS + pb;
}

#endif
