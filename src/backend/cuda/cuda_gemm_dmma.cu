/* Exact FP8 linear for 3 to 64 rows on the FP64 tensor cores (mma.sync m16n8k16 .f64, sm_90), with the CPU
 * op's contract (linear_q.c): per 32-wide K block the exact value of Σ q_x·q_w is rounded once to f32,
 * multiplied by s_x then s_w, and the scaled blocks are added to an f32 accumulator in ascending block
 * order. Same bits as the GEMV (cuda_gemv.cuh, cuda_gemv_fp8.cu), the int8 MMA GEMM (cuda_gemm_mma.cuh)
 * and the CPU op.
 *
 * Why the FP64 tensor cores. Decode batches of 3-64 rows sit between the GEMV, which reads the weights
 * once per group of ≤ 4 rows, and the int8 MMA GEMM, whose digit planes and int64 combination cost ~13
 * instructions per MMA and whose smallest row tile is 32; both are bound by issuing instructions
 * (bench/NOTES-gpu.md, "Session 7"). A block sum is exact in f64 whatever the order of its terms: an e4m3
 * product has ≤ 8 significant bits and lies in [2^-18, 2^17.6], so every partial sum of a 32-term block
 * is a multiple of 2^-18 below 2^23 (≤ 41 bits) and no f64 addition rounds. A DMMA therefore gives the
 * block sum bit for bit, 2048 products per warp instruction. NaN codes make NaN as in the f64 GEMV; ±0
 * cannot differ (the sums start at +0).
 *
 * Layout. The weights are A (16 output columns × 16 k), x is B (16 k × 8 rows): 8 rows fill an
 * instruction, and a 32-wide block is two instructions per group of 8 rows. Lane l = 4g + t holds A's
 * columns g and g + 8 and B's row g at k-slots t, t + 4, t + 8, t + 12 (CuTe's SM90_16x8x16_F64F64F64F64_TN
 * layouts). The k order inside a block is free (the sum is exact), so slot t + 4q of instruction h is
 * k = 8t + 4h + q: per block a lane reads 8 consecutive codes of each of its rows (8-byte loads; a warp
 * reads full 32-byte sectors). C's lane holds columns g and g + 8 of rows 2t and 2t + 1: two x scales,
 * one weight scale (16 output columns never straddle a group of 32 weight rows of one scale). Codes become f64 through the
 * per-lane table of cuda_gemv_fp8.cu (one byte permute, one shared load, the low word 0).
 *
 * Two forms. "tile": a warp owns a 16-column tile for all of K and adds its blocks in its own registers,
 * weights loaded U blocks ahead; it needs many tiles (N ≥ 16384). "split": the S warps of a CTA share a
 * tile and take its blocks in rounds, the adds done in order by the CTA after each round (below); it
 * fills the GPU on narrow weights. Measured on the H200 (bench/NOTES-gpu.md, "Session 12"): exact on every
 * output of tests/cuda/test_cuda_gemm_dmma.c; the FP64 tensor cores gave 18-27 f64 TFLOP/s here, so at
 * 64 rows the int8 MMA GEMM stays faster on the widest weights. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_dmma.h"

/* u32 [256 codes][64]: lanes 0..31 hold the high word of the code's double. The other 32 words of a row are
 * unused (32 KiB): the price of an offset made by one byte permute (code·256 + lane·4). */
#define DM_TAB_BYTES (256 * 256)
#define DM_MAX_WARPS 16

/* The f64 value of code B of word v from this lane's copy of the table (cuda_gemv_fp8.cu, g8_val). */
template <int B>
static __device__ __forceinline__ double dm_val(const unsigned char *tab, uint32_t v, uint32_t lane4) {
    const uint32_t off = __byte_perm(v, lane4, 0x5504u | (B << 4));
    return __hiloint2double(*(const int *)(tab + off), 0);
}

static __device__ __forceinline__ void dm_table(unsigned char *tab) {
    for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x)
        ((int *)tab)[(i >> 5) * 64 + (i & 31)] = __double2hiint((double)d_e4m3_decode((uint8_t)(i >> 5)));
}

static __device__ __forceinline__ void dm_mma(double (&c)[4], const double (&a)[8], const double (&b)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7, %8, %9, %10, "
                 "%11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};\n"
                 : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
                 : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]), "d"(b[0]),
                   "d"(b[1]), "d"(b[2]), "d"(b[3]));
}

/* codes 4h .. 4h + 3 of an 8-code word as f64 */
template <int H>
static __device__ __forceinline__ void dm_codes(const unsigned char *tab, uint2 q, uint32_t lane4, double (&d)[4]) {
    const uint32_t v = H ? q.y : q.x;
    d[0] = dm_val<0>(tab, v, lane4), d[1] = dm_val<1>(tab, v, lane4);
    d[2] = dm_val<2>(tab, v, lane4), d[3] = dm_val<3>(tab, v, lane4);
}

/* One 32-wide block of a tile: two DMMAs per row group into fresh sums, then each lane's four outputs of
 * each group take their scaled block value. */
template <int NB>
static __device__ __forceinline__ void dm_block(const unsigned char *tab, uint32_t lane4, uint2 w0, uint2 w1,
                                                uint8_t swb, const uint2 (&xqv)[NB], const uint8_t (&sxb)[NB][2],
                                                float (&acc)[NB][4]) {
    double c[NB][4]; /* f64 [group][C fragment]: the block sums, exact */
#pragma unroll
    for (int r = 0; r < NB; r++) c[r][0] = c[r][1] = c[r][2] = c[r][3] = 0.0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        double lo[4], hi[4], a[8];
        if (h == 0) dm_codes<0>(tab, w0, lane4, lo), dm_codes<0>(tab, w1, lane4, hi);
        else dm_codes<1>(tab, w0, lane4, lo), dm_codes<1>(tab, w1, lane4, hi);
#pragma unroll
        for (int q = 0; q < 4; q++) a[2 * q] = lo[q], a[2 * q + 1] = hi[q];
#pragma unroll
        for (int r = 0; r < NB; r++) {
            double b[4];
            if (h == 0) dm_codes<0>(tab, xqv[r], lane4, b);
            else dm_codes<1>(tab, xqv[r], lane4, b);
            dm_mma(c[r], a, b);
        }
    }
    const float sw = d_e8m0(swb);
#pragma unroll
    for (int r = 0; r < NB; r++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[r][i] = __fadd_rn(acc[r][i], __fmul_rn(__fmul_rn(__double2float_rn(c[r][i]), d_e8m0(sxb[r][i & 1])), sw));
}

/* The tile form. xq e4m3 [m, K], xs E8M0 [m, K/32] (act_quant32), w e4m3 [N, K], ws E8M0 [ceil(N/32), K/32];
 * y bf16 [m, N]. Warps take 16-column tiles in turn (tile, tile + all warps, ...); rows past m re-read
 * the last row and are never stored. */
/* A lane's x rows of the NB groups of 8: B's row g (codes from byte 8t on) and C's rows 2t, 2t + 1 (scales);
 * rows past m read the last row (their outputs are not stored) */
template <int NB>
static __device__ __forceinline__ void dm_x_rows(const uint8_t *xq, const uint8_t *xs, int m, int64_t K, int g, int t,
                                                 const uint8_t *(&xr)[NB], const uint8_t *(&xsr)[NB][2]) {
    const int64_t KB = K / 32;
#pragma unroll
    for (int r = 0; r < NB; r++) {
        xr[r] = xq + min(r * 8 + g, m - 1) * K + t * 8;
        xsr[r][0] = xs + min(r * 8 + 2 * t, m - 1) * KB, xsr[r][1] = xs + min(r * 8 + 2 * t + 1, m - 1) * KB;
    }
}

template <int NB, int U>
__global__ void __launch_bounds__(DM_MAX_WARPS * 32, 1) dm_tile_kernel(const uint8_t *xq, const uint8_t *xs, int m,
                                                                   int64_t K, const uint8_t *w, const uint8_t *ws,
                                                                   int64_t N, uint16_t *y) {
    extern __shared__ uint4 dm_sm[];
    unsigned char *tab = (unsigned char *)dm_sm;
    dm_table(tab);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t lane4 = (uint32_t)lane * 4u;
    const int64_t KB = K / 32, ntiles = (N + 15) / 16, stride = (int64_t)gridDim.x * (blockDim.x >> 5);
    const uint8_t *xr[NB], *xsr[NB][2];
    dm_x_rows<NB>(xq, xs, m, K, g, t, xr, xsr);
    for (int64_t tile = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp; tile < ntiles; tile += stride) {
        const int64_t n0 = tile * 16;
        const uint8_t *wr0 = w + min(n0 + g, N - 1) * K + t * 8, *wr1 = w + min(n0 + g + 8, N - 1) * K + t * 8;
        const uint8_t *wsr = ws + (n0 / 32) * KB;
        float acc[NB][4]; /* f32 [group][C fragment]: the outputs' sums, blocks so far */
#pragma unroll
        for (int r = 0; r < NB; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
        uint2 cur[U][2], nxt[U][2]; /* e4m3 [block][row g, g + 8]: 8 codes each, this group of U blocks, the next */
#pragma unroll
        for (int u = 0; u < U; u++) {
            cur[u][0] = u < KB ? __ldg((const uint2 *)(wr0 + u * 32)) : make_uint2(0, 0);
            cur[u][1] = u < KB ? __ldg((const uint2 *)(wr1 + u * 32)) : make_uint2(0, 0);
        }
        for (int64_t kb0 = 0; kb0 < KB; kb0 += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const bool in = kb0 + U + u < KB;
                nxt[u][0] = in ? __ldg((const uint2 *)(wr0 + (kb0 + U + u) * 32)) : make_uint2(0, 0);
                nxt[u][1] = in ? __ldg((const uint2 *)(wr1 + (kb0 + U + u) * 32)) : make_uint2(0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t kb = kb0 + u;
                if (kb < KB) {
                    uint2 xqv[NB];
                    uint8_t sxb[NB][2];
#pragma unroll
                    for (int r = 0; r < NB; r++) {
                        xqv[r] = __ldg((const uint2 *)(xr[r] + kb * 32));
                        sxb[r][0] = __ldg(xsr[r][0] + kb), sxb[r][1] = __ldg(xsr[r][1] + kb);
                    }
                    dm_block<NB>(tab, lane4, cur[u][0], cur[u][1], __ldg(wsr + kb), xqv, sxb, acc);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) cur[u][0] = nxt[u][0], cur[u][1] = nxt[u][1];
        }
#pragma unroll
        for (int r = 0; r < NB; r++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t n = n0 + g + 8 * (i >> 1), row = r * 8 + 2 * t + (i & 1);
                if (row < m && n < N) y[row * N + n] = d_to_bf16(acc[r][i]);
            }
    }
}

/* The split form: the S warps of a CTA share one 16-column tile and take its blocks in rounds, warp s
 * block r·S + s of round r. Each warp puts its block's scaled values (dm_block's, not yet added) in a
 * shared slot; after one barrier, the thread owning output o (threads take outputs o, o + 32·S, …) adds
 * the round's slots 0, 1, … (all S but in the last round) to its f32 sum, that is blocks r·S, r·S + 1, …
 * in ascending order, so every output sees the CPU's sequence of adds. Two sets of slots alternate, so one barrier per round suffices: a set is written again two
 * rounds later, after the barrier its readers have passed. */
template <int NB>
static __device__ __forceinline__ void dm_split_vals(const unsigned char *tab, uint32_t lane4, uint2 w0, uint2 w1,
                                                     uint8_t swb, const uint2 (&xqv)[NB],
                                                     const uint8_t (&sxb)[NB][2], float4 (&v)[NB]) {
    float acc[NB][4];
#pragma unroll
    for (int r = 0; r < NB; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = -0.0f; /* -0 + x == x, bit for bit */
    dm_block<NB>(tab, lane4, w0, w1, swb, xqv, sxb, acc);
#pragma unroll
    for (int r = 0; r < NB; r++) v[r] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
}

template <int NB, int S, int U>
__global__ void __launch_bounds__(S * 32, 1) dm_split_kernel(const uint8_t *xq, const uint8_t *xs, int m, int64_t K,
                                                             const uint8_t *w, const uint8_t *ws, int64_t N,
                                                             uint16_t *y) {
    constexpr int OUT = 128 * NB;                      /* outputs of a tile: 16 columns × 8·NB rows */
    constexpr int OPT = (OUT + S * 32 - 1) / (S * 32); /* outputs per thread */
    extern __shared__ uint4 dm_sm[];
    unsigned char *tab = (unsigned char *)dm_sm;
    float4 *slots = (float4 *)((unsigned char *)dm_sm + DM_TAB_BYTES); /* [2][S][NB][32] */
    dm_table(tab);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t lane4 = (uint32_t)lane * 4u;
    const int64_t KB = K / 32, ntiles = (N + 15) / 16, rounds = (KB + S - 1) / S;
    const uint8_t *xr[NB], *xsr[NB][2];
    dm_x_rows<NB>(xq, xs, m, K, g, t, xr, xsr);
    int par = 0; /* the slot set of this round */
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const int64_t n0 = tile * 16;
        const uint8_t *wr0 = w + min(n0 + g, N - 1) * K + t * 8, *wr1 = w + min(n0 + g + 8, N - 1) * K + t * 8;
        const uint8_t *wsr = ws + (n0 / 32) * KB;
        float acc[OPT];
#pragma unroll
        for (int j = 0; j < OPT; j++) acc[j] = 0.0f;
        uint2 pre[U][2]; /* this warp's blocks of the next U rounds */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t kb = (int64_t)u * S + warp;
            pre[u][0] = kb < KB ? __ldg((const uint2 *)(wr0 + kb * 32)) : make_uint2(0, 0);
            pre[u][1] = kb < KB ? __ldg((const uint2 *)(wr1 + kb * 32)) : make_uint2(0, 0);
        }
        for (int64_t r = 0; r < rounds; r++) {
            const int64_t kb = r * S + warp;
            const uint2 w0 = pre[0][0], w1 = pre[0][1];
#pragma unroll
            for (int u = 0; u + 1 < U; u++) pre[u][0] = pre[u + 1][0], pre[u][1] = pre[u + 1][1];
            const int64_t kn = (r + U) * S + warp;
            pre[U - 1][0] = kn < KB ? __ldg((const uint2 *)(wr0 + kn * 32)) : make_uint2(0, 0);
            pre[U - 1][1] = kn < KB ? __ldg((const uint2 *)(wr1 + kn * 32)) : make_uint2(0, 0);
            float4 *mine = slots + ((size_t)(par * S + warp) * NB) * 32 + lane;
            if (kb < KB) {
                uint2 xqv[NB];
                uint8_t sxb[NB][2];
#pragma unroll
                for (int q = 0; q < NB; q++) {
                    xqv[q] = __ldg((const uint2 *)(xr[q] + kb * 32));
                    sxb[q][0] = __ldg(xsr[q][0] + kb), sxb[q][1] = __ldg(xsr[q][1] + kb);
                }
                float4 v[NB];
                dm_split_vals<NB>(tab, lane4, w0, w1, __ldg(wsr + kb), xqv, sxb, v);
#pragma unroll
                for (int q = 0; q < NB; q++) mine[q * 32] = v[q];
            }
            __syncthreads();
            const float *set = (const float *)(slots + (size_t)par * S * NB * 32);
            const int live = (int)min((int64_t)S, KB - r * S); /* blocks of this round */
#pragma unroll
            for (int j = 0; j < OPT; j++) {
                const int o = threadIdx.x + j * S * 32;
                if (o < OUT)
                    for (int q = 0; q < live; q++) acc[j] = __fadd_rn(acc[j], set[q * OUT + o]);
            }
            par ^= 1;
        }
        /* output o: group q = o / 128, lane l = (o / 4) % 32, value i = o % 4 of dm_block */
#pragma unroll
        for (int j = 0; j < OPT; j++) {
            const int o = threadIdx.x + j * S * 32;
            const int q = o / 128, l = (o / 4) % 32, i = o % 4;
            const int64_t n = n0 + (l >> 2) + 8 * (i >> 1), row = q * 8 + 2 * (l & 3) + (i & 1);
            if (o < OUT && row < m && n < N) y[row * N + n] = d_to_bf16(acc[j]);
        }
    }
}

static int g_dm_on = -1;
extern "C" int di_cuda_gemm_dmma_enabled(void) { return di_cuda_env_switch(&g_dm_on, "DI_CUDA_GEMM_DMMA", "0"); }
extern "C" void di_cuda_gemm_dmma_set_enabled(int on) { g_dm_on = on ? 1 : 0; }

extern "C" int di_cuda_gemm_dmma_fits(int64_t m, int64_t k, const void *w) {
    return m >= 1 && m <= DI_DMMA_MAX_M && k >= 32 && k % 32 == 0 && (uintptr_t)w % 8 == 0;
}

static int g_dm_form = 0, g_dm_u = 0; /* 0: the rule below; else forced (tests, bench) */
extern "C" void di_cuda_gemm_dmma_set_form(int form, int depth) {
    g_dm_form = form >= 1 && form <= 3 ? form : 0;
    g_dm_u = depth == 2 || depth == 4 ? depth : 0;
}

/* Where linear_fp8 takes this kernel instead of the GEMV (≤ 2 rows; 4-row launches that each read the
 * weights again) or the int8 MMA GEMM, as measured on the H200 at the V4.1 shapes (tests/cuda/
 * test_cuda_gemm_dmma.c bench, session 12): 3-32 rows of every FP8 weight of the model but N 512 past 16
 * rows, and 33-64 rows of N 4096-16383 (wo_b, k2304 n5120, k1280 n4096). */
extern "C" int di_cuda_gemm_dmma_wants(int64_t m, int64_t k, int64_t n, const void *w) {
    const int64_t hi = n >= 16384 ? 32 : n >= 4096 ? 64 : n >= 1024 ? 32 : 16;
    return m >= 3 && m <= hi && di_cuda_gemm_dmma_fits(m, k, w);
}

/* The form and depth: tile (1) where there are ≥ 1024 tiles of 16 columns, else split over 8 warps (2) for
 * N ≥ 5120 at ≤ 8 rows and over 16 (3) otherwise; depth 4 for the tile form up to 16 rows, 2 elsewhere.
 * H200, M 8 (µs, before → after): Engram projection k6144 n25600 470 → 140, wo_b k8192 n5120 163 → 50,
 * wq_b k1280 n32768 111 → 36, k5120 n2304 58 → 24, k2304 n5120 53 → 18, k5120 n1280 42 → 17, k5120 n512
 * 32 → 16, k1280 n4096 30 → 10. */
static void dm_pick(int64_t m, int64_t n, int *form, int *u) {
    *form = g_dm_form ? g_dm_form : n >= 16384 ? 1 : n >= 5120 && m <= 8 ? 2 : 3;
    *u = g_dm_u ? g_dm_u : *form == 1 && m <= 16 ? 4 : 2;
}

/* The > 48 KiB shared-memory opt-in of one instantiation, once per device (the attribute is per device; a
 * failed opt-in is reported, not remembered), and, for the split form, its CTAs per SM there. */
#define DM_MAX_DEVICES 64
template <class Kernel>
static int dm_optin(Kernel kern, size_t smem, bool (&done)[DM_MAX_DEVICES], int *occ, int threads, di_error *err) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    const bool known = dev >= 0 && dev < DM_MAX_DEVICES; /* else opted in on every call, occupancy in slot 0 */
    const int slot = known ? dev : 0;
    if (known && done[dev]) return DI_OK;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return di_error_set(err, DI_ERR_INTERNAL, "cuda gemm_dmma: shared-memory opt-in of %zu bytes: %s", smem,
                            cudaGetErrorString(e));
    if (occ && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ[slot], kern, threads, smem) != cudaSuccess) occ[slot] = 1;
    if (known) done[dev] = true;
    return DI_OK;
}

/* The tile form: about one CTA per SM (the table is per CTA; the grid is at most the SM count), warps sized
 * so that every warp gets the same number of tiles ± 1 (as cuda_gemv_fp8.cu's launch). */
template <int NB, int U>
static int dm_tile_launch(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                          const uint8_t *ws, int64_t n, uint16_t *y, cudaStream_t st, di_error *err) {
    const int64_t ntiles = (n + 15) / 16, sms = di_cuda_sm_count(), slots = sms * DM_MAX_WARPS;
    const int64_t rounds = (ntiles + slots - 1) / slots, warps = (ntiles + rounds - 1) / rounds;
    const int64_t ctas = warps < sms ? warps : sms, nw = (warps + ctas - 1) / ctas;
    static bool done[DM_MAX_DEVICES]; /* per instantiation */
    const int rc = dm_optin(dm_tile_kernel<NB, U>, DM_TAB_BYTES, done, NULL, 0, err);
    if (rc) return rc;
    dm_tile_kernel<NB, U><<<(unsigned)ctas, (unsigned)(nw * 32), DM_TAB_BYTES, st>>>(xq, xs, (int)m, k, w, ws, n, y);
    return di_cuda_launched("linear_fp8 (gemm_dmma tile)", err);
}

/* The split form: as many CTAs as fit (one tile each at a time), S warps each. */
template <int NB, int S, int U>
static int dm_split_launch(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                           const uint8_t *ws, int64_t n, uint16_t *y, cudaStream_t st, di_error *err) {
    const size_t smem = DM_TAB_BYTES + (size_t)2 * S * NB * 32 * sizeof(float4); /* ≤ 192 KiB (NB 8, S 16) */
    static bool done[DM_MAX_DEVICES]; /* per instantiation */
    static int occ[DM_MAX_DEVICES];
    const int rc = dm_optin(dm_split_kernel<NB, S, U>, smem, done, occ, S * 32, err);
    if (rc) return rc;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DM_MAX_DEVICES) dev = 0;
    const int64_t ntiles = (n + 15) / 16, slots = (int64_t)di_cuda_sm_count() * (occ[dev] > 0 ? occ[dev] : 1);
    const int64_t ctas = ntiles < slots ? ntiles : slots;
    dm_split_kernel<NB, S, U><<<(unsigned)ctas, S * 32, smem, st>>>(xq, xs, (int)m, k, w, ws, n, y);
    return di_cuda_launched("linear_fp8 (gemm_dmma split)", err);
}

template <int NB>
static int dm_variant(int form, int u, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                      const uint8_t *ws, int64_t n, uint16_t *y, cudaStream_t st, di_error *err) {
    switch (form * 10 + u) {
    case 12: return dm_tile_launch<NB, 2>(xq, xs, m, k, w, ws, n, y, st, err);
    case 14: return dm_tile_launch<NB, 4>(xq, xs, m, k, w, ws, n, y, st, err);
    case 22: return dm_split_launch<NB, 8, 2>(xq, xs, m, k, w, ws, n, y, st, err);
    case 24: return dm_split_launch<NB, 8, 4>(xq, xs, m, k, w, ws, n, y, st, err);
    case 34: return dm_split_launch<NB, 16, 4>(xq, xs, m, k, w, ws, n, y, st, err);
    default: return dm_split_launch<NB, 16, 2>(xq, xs, m, k, w, ws, n, y, st, err);
    }
}

extern "C" int di_cuda_gemm_dmma_run(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                                     const uint8_t *ws, int64_t n, uint16_t *y, void *stream, di_error *err) {
    if (!di_cuda_gemm_dmma_fits(m, k, w) || n < 1 || (uintptr_t)xq % 8)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda gemm_dmma: M %lld (expected 1..%d), K %lld (a positive multiple of 32), N %lld (≥ 1), "
                            "w and xq at %llu / %llu mod 8 (expected 0)",
                            (long long)m, DI_DMMA_MAX_M, (long long)k, (long long)n,
                            (unsigned long long)((uintptr_t)w % 8), (unsigned long long)((uintptr_t)xq % 8));
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t groups = (m + 7) / 8;
    int form, u;
    dm_pick(m, n, &form, &u);
    if (groups == 1) return dm_variant<1>(form, u, xq, xs, m, k, w, ws, n, y, st, err);
    if (groups == 2) return dm_variant<2>(form, u, xq, xs, m, k, w, ws, n, y, st, err);
    if (groups <= 4) return dm_variant<4>(form, u, xq, xs, m, k, w, ws, n, y, st, err);
    return dm_variant<8>(form, u, xq, xs, m, k, w, ws, n, y, st, err);
}
