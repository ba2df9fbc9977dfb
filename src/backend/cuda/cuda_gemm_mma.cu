/* Block-scaled FP8 / MXFP4 GEMM for M > 16 rows (FP8 also 5–16 rows: cuda_gemm.cu qlinear_v) with the exact
 * 32-term block sums on the int8 tensor cores (mma.sync m16n8k32 s8·s8 → s32): the same results as
 * qgemm_kernel (cuda_gemm.cu) and the CPU op, bit for bit by construction (the argument and the lane
 * arithmetic: cuda_gemm_mma.cuh; the host emulation tests/test_gemm_mma_emu.c runs that arithmetic against
 * di_cpu_linear_fp4 / fp8; the GPU test tests/cuda/test_cuda_gemm_mma.c compares with qgemm_kernel and the
 * CPU op: 176/176 rows bit-identical on the H200, 2026-11-30; 671/671 with split-K, 2 CTAs per SM and the
 * M 8 rows, 2026-12-01). The default; DI_CUDA_GEMM=simt keeps qgemm_kernel.
 *
 * Work split. A pre-pass (gmm_xprep) turns the act-quantized x codes into three s8 digit planes in the
 * caller's scratch, once per call, laid out so that a stage of one row is 192 contiguous bytes. A CTA
 * computes a tile of BM x rows × GMM_BN (128) weight rows over all of K; its 8 warps hold 32 x rows ×
 * BM/32 A tiles (16 weight rows) each. K advances in stages of GMM_KS (2) blocks through two shared
 * buffers: while the warps run the MMAs of stage s, the x planes of stage s+1 travel by cp.async into the
 * other buffer and every thread holds its weight loads of stage s+1 in registers, then converts and
 * stores them (one barrier per stage). Weights are converted once per CTA and element: MXFP4 → one s8
 * plane (2w, byte permutes); FP8 → three digit planes through a 256-entry shared table, s_w set to NaN
 * where the block holds a NaN code; s_x is pre-scaled by 2^−10 (2^−18).
 *
 * Per block and warp, for each (A tile, n8 x tile): MXFP4 3 MMAs (one per x digit plane) and
 * S = S0 + 2^7·S1 + 2^14·S2 in int32; FP8 9 MMAs into the five accumulators T0 … T4 and S in int64
 * (gmm_sum_fp8). Then per output register f32(S), ×s_x, ×s_w, + acc — ascending blocks, like the CPU.
 * One bf16 rounding when K is done.
 *
 * Variants, the same bits: split-K for small grids (gmm_plan_of, on by its rule: the stages of a tile over
 * grid z, block values into f32 scratch planes, gmm_reduce adds them in the unsplit order; the argument:
 * cuda_gemm_mma.cuh); 2 CTAs per SM (gmm_occ, opt-in: the 32-row tile and MXFP4's 64-row tile under a
 * 128-register cap); grouped launches for the prefill experts (gmm_group_kernel: a row-tile table over
 * the experts' contiguous rows). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_mma.cuh"
#include "backend/cuda/cuda_ops.h"

#define GMM_SMEM_MAX (200 * 1024)

struct gmm_args {
    const uint8_t *xd, *xs; /* x digit planes s8 [M][K/32][3][32] (gmm_xprep), E8M0 [M, K/32] */
    const uint8_t *w, *wsc; /* e4m3 [N, K] + E8M0 [ceil(N/32), K/32], or E2M1 [N, K/2] + E8M0 [N, K/32] */
    int64_t M, N, K;
    uint16_t *y; /* bf16 [M, N] */
    float *part; /* split-K: f32 [planes][M][N] (cuda_gemm_mma.cuh, gmm_split_plane); unused unsplit */
    int64_t zs;  /* split-K: stages per split */
};

/* The pre-pass: e4m3 codes xq [M, K] → the digit planes xd, one 4-code word per thread */
__global__ void gmm_xprep(const uint8_t *xq, int64_t M, int64_t K, uint8_t *xd) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, words = K / 4;
    if (i >= M * words) return;
    const int64_t m = i / words, c = i % words;
    uint32_t dig[3];
    gvm_x_digits(__ldg((const uint32_t *)xq + i), dig);
#pragma unroll
    for (int d = 0; d < 3; d++) *(uint32_t *)(xd + gmm_xd_off(K, m, c / 8, d) + 4 * (c % 8)) = dig[d];
}


/* a stage's x digit planes: 12·BM chunks of 16 bytes, straight into stage buffer sb (gmm_x_chunk) */
template <int BM>
static __device__ __forceinline__ void gmm_copy_x(const gmm_args &a, int64_t m0, int64_t kb0, unsigned char *sb) {
    for (int i = threadIdx.x; i < 12 * BM; i += GMM_WARPS * 32) {
        int row, gb;
        uint32_t so;
        gmm_x_chunk(BM, i, &row, &gb, &so);
        const bool live = m0 + row < a.M;
        d_cp_async16_zfill(sb + so, a.xd + (live ? gmm_xd_off(a.K, m0 + row, kb0, 0) + gb : 0), live ? 16 : 0);
    }
    d_cp_commit();
}

/* One thread's global loads of one stage: the x scale byte of (row t/2, block t % 2) for t < 2·BM, the
 * weight bytes and scale byte of (row t/2, block t % 2) (MXFP4: 16 bytes, FP8: 32). Weights through the
 * default cache policy, not evict-first: at prefill sizes the CTAs of the other x-row tiles read the same
 * weight tile again. */
struct gmm_fetch {
    uint4 w[2]; /* w[1]: FP8 only */
    uint32_t xs, ws;
};

template <int FP8, int BM>
static __device__ __forceinline__ void gmm_load(const gmm_args &a, int64_t m0, int64_t n0, int64_t kb0, gmm_fetch &f) {
    const int t = threadIdx.x, KB = (int)(a.K / 32);
    const int64_t mx = m0 + t / 2;
    f.xs = t < 2 * BM && mx < a.M ? __ldg(a.xs + mx * KB + kb0 + t % 2) : 0u;
    const int64_t n = n0 + t / 2, kb = kb0 + t % 2;
    const bool live = n < a.N;
    if (FP8) {
        const uint4 *p = (const uint4 *)(a.w + n * a.K + kb * 32);
        f.w[0] = live ? __ldg(p) : make_uint4(0u, 0u, 0u, 0u);
        f.w[1] = live ? __ldg(p + 1) : make_uint4(0u, 0u, 0u, 0u);
        f.ws = live ? __ldg(a.wsc + (n / 32) * KB + kb) : 0u;
    } else {
        f.w[0] = live ? __ldg((const uint4 *)(a.w + n * (a.K / 2) + kb * 16)) : make_uint4(0u, 0u, 0u, 0u);
        f.ws = live ? __ldg(a.wsc + n * KB + kb) : 0u;
    }
}

/* the conversions of gmm_fetch into stage buffer sb (gmm_stage_thread) */
template <int FP8, int BM>
static __device__ __forceinline__ void gmm_store(const gmm_fetch &f, const uint32_t *tab, unsigned char *sb) {
    gmm_stage_thread(FP8, BM, threadIdx.x, f.xs, (const uint32_t *)f.w, f.ws, tab, sb);
}

/* d = a·b + c: m16n8k32, s8 × s8 → s32, exact (every partial sum here is far below 2^31) */
static __device__ __forceinline__ void gmm_mma(int32_t d[4], const uint32_t a[4], uint2 b, const int32_t c[4]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

/* the A fragment of plane p, A tile starting at weight row n (rows n + g, n + g + 8) */
static __device__ __forceinline__ void gmm_a_frag(const unsigned char *wp, int g, int q, uint32_t a[4]) {
    const uint2 lo = *(const uint2 *)(wp + g * 32 + 8 * q), hi = *(const uint2 *)(wp + (g + 8) * 32 + 8 * q);
    a[0] = lo.x, a[1] = hi.x, a[2] = lo.y, a[3] = hi.y;
}

/* OCC: CTAs per SM the registers are capped for (OCC 2: at most 128 per thread, so two CTAs of 256 threads
 * share the register file). SPLIT: split-K, CTA z of grid z runs its stages only (cuda_gemm_mma.cuh);
 * SPLIT 0 compiles to the unsplit kernel. */
/* One CTA tile: x rows m0 … min(m0 + BM, a.M) − 1 × weight rows n0 … n0 + GMM_BN − 1 (split z = blockIdx.z
 * of the tile's stages when SPLIT) */
template <int FP8, int BM, int SPLIT>
static __device__ __forceinline__ void gmm_tile(const gmm_args &a, int64_t m0, int64_t n0) {
    extern __shared__ uint4 gmm_sm[];
    constexpr int AF = BM / 32;
    const uint32_t SB = gmm_stage_bytes(FP8, BM);
    unsigned char *sm = (unsigned char *)gmm_sm;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t NS = a.K / (32 * GMM_KS);
    int wx0, wn0;
    gmm_warp(BM, warp, &wx0, &wn0);
    /* split-K: stages [s0, s1); a split z ≥ 1 stores each block's P_b (pstore) at pb + plane·M·N + dm·N + dn,
     * (dm, dn) = the register's output relative to this lane's first (x row wx0 + 2q, weight row wn0 + g) */
    const int64_t s0 = SPLIT ? (int64_t)blockIdx.z * a.zs : 0, s1 = SPLIT && s0 + a.zs < NS ? s0 + a.zs : NS;
    const bool pstore = SPLIT && blockIdx.z > 0;
    float *pb = a.part;
    int64_t mleft = 0, nleft = 0;
    if (SPLIT) {
        mleft = a.M - (m0 + wx0 + 2 * q), nleft = a.N - (n0 + wn0 + g);
        pb += (m0 + wx0 + 2 * q) * a.N + n0 + wn0 + g;
    }
    const int32_t zero[4] = {0, 0, 0, 0};
    float acc[AF][4][4];
#pragma unroll
    for (int i = 0; i < AF; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;

    uint32_t *tab = (uint32_t *)(sm + 2 * SB); /* FP8: u32 [256] gmm_w8_entry */
    if (FP8) tab[threadIdx.x] = gmm_w8_entry(threadIdx.x); /* 256 threads */
    gmm_fetch f;
    gmm_copy_x<BM>(a, m0, s0 * GMM_KS, sm);
    gmm_load<FP8, BM>(a, m0, n0, s0 * GMM_KS, f);
    __syncthreads(); /* the table */
    gmm_store<FP8, BM>(f, tab, sm);
    d_cp_wait<0>();
    __syncthreads();
    for (int64_t s = s0; s < s1; s++) {
        const unsigned char *sb = sm + ((s - s0) & 1) * SB;
        if (s + 1 < s1) {
            gmm_copy_x<BM>(a, m0, (s + 1) * GMM_KS, sm + ((s + 1 - s0) & 1) * SB);
            gmm_load<FP8, BM>(a, m0, n0, (s + 1) * GMM_KS, f);
        }
#pragma unroll
        for (int kb = 0; kb < GMM_KS; kb++) {
            uint2 b[4][3]; /* x digit planes of the warp's 4 n8 tiles */
            float2 sx[4];  /* pre-scaled s_x of x rows 2q, 2q+1 of each tile */
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int d = 0; d < 3; d++) b[j][d] = *(const uint2 *)(sb + gmm_off_x(BM, kb, d, wx0 + 8 * j + g) + 8 * q);
                sx[j] = *(const float2 *)(sb + gmm_off_sx(FP8, BM, kb) + 4 * (wx0 + 8 * j + 2 * q));
            }
            const float *sws = (const float *)(sb + gmm_off_sw(FP8, BM, kb));
            /* P_b's plane (pstore only; unused by split 0) */
            float *pp = SPLIT ? pb + gmm_split_plane(s * GMM_KS + kb, a.zs) * a.M * a.N : nullptr;
#pragma unroll
            for (int i = 0; i < AF; i++) {
                const int nr = wn0 + 16 * i;
                uint32_t A[3][4]; /* planes 1, 2: FP8 only */
#pragma unroll
                for (int p = 0; p < (FP8 ? 3 : 1); p++) gmm_a_frag(sb + gmm_off_w(FP8, BM, kb, p, nr), g, q, A[p]);
                const float sw0 = sws[nr + g], sw1 = sws[nr + g + 8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float fs[4];
                    if (FP8) { /* T_s = Σ_{p+d=s} A_p·B_d: the MMAs of one T_s chained on the tensor core */
                        int32_t t0[4], t1[4], t2[4], t3[4], t4[4];
                        gmm_mma(t0, A[0], b[j][0], zero);
                        gmm_mma(t1, A[0], b[j][1], zero);
                        gmm_mma(t1, A[1], b[j][0], t1);
                        gmm_mma(t2, A[0], b[j][2], zero);
                        gmm_mma(t2, A[1], b[j][1], t2);
                        gmm_mma(t2, A[2], b[j][0], t2);
                        gmm_mma(t3, A[1], b[j][2], zero);
                        gmm_mma(t3, A[2], b[j][1], t3);
                        gmm_mma(t4, A[2], b[j][2], zero);
#pragma unroll
                        for (int r = 0; r < 4; r++) fs[r] = gmm_l2f(gmm_sum_fp8(t0[r], t1[r], t2[r], t3[r], t4[r]));
                    } else {
                        int32_t c0[4], c1[4], c2[4];
                        gmm_mma(c0, A[0], b[j][0], zero);
                        gmm_mma(c1, A[0], b[j][1], zero);
                        gmm_mma(c2, A[0], b[j][2], zero);
#pragma unroll
                        for (int r = 0; r < 4; r++) fs[r] = gmm_i2f(gmm_sum_fp4(c0[r], c1[r], c2[r]));
                    }
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const float sxr = r & 1 ? sx[j].y : sx[j].x, swr = r >> 1 ? sw1 : sw0;
                        if (pstore) {
                            const int dm = 8 * j + (r & 1), dn = 16 * i + 8 * (r >> 1);
                            if (dm < mleft && dn < nleft) pp[dm * a.N + dn] = gmm_block_value(fs[r], sxr, swr);
                        } else {
                            acc[i][j][r] = gmm_add_block(acc[i][j][r], fs[r], sxr, swr);
                        }
                    }
                }
            }
        }
        if (s + 1 < s1) gmm_store<FP8, BM>(f, tab, sm + ((s + 1 - s0) & 1) * SB);
        d_cp_wait<0>();
        __syncthreads();
    }
    if (pstore) return;
#pragma unroll
    for (int i = 0; i < AF; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int xr, nr;
                gmm_c_pos(wx0, wn0, i, j, r, g, q, &xr, &nr);
                const int64_t m = m0 + xr, n = n0 + nr;
                if (m >= a.M || n >= a.N) continue;
                if (SPLIT) a.part[m * a.N + n] = acc[i][j][r]; /* split 0: plane 0, the reduce's start */
                else a.y[m * a.N + n] = d_to_bf16(acc[i][j][r]);
            }
}

template <int FP8, int BM, int OCC, int SPLIT>
__global__ void __launch_bounds__(GMM_WARPS * 32, OCC) gmm_kernel(const gmm_args a) {
    gmm_tile<FP8, BM, SPLIT>(a, (int64_t)blockIdx.y * BM, (int64_t)blockIdx.x * GMM_BN);
}

/* Grouped (the prefill experts): row tile t = blockIdx.y is `cnt` rows from r0 of expert e, whose weight
 * replaces the call's; every expert's rows are contiguous in xd / xs / y (the plan's list order). A row's
 * outputs are computed by the same tile code and K walk as gmm_kernel's, so the result equals one
 * linear_fp4 / linear_fp8 per expert bit for bit. The tables travel by value (kernel parameters, CUDA
 * 12.1+: up to 32 KiB). */
#define GMM_GROUP_TILES 2560
struct gmm_group {
    const uint8_t *w[GMM_GROUP_EXPERTS], *ws[GMM_GROUP_EXPERTS];
    uint32_t tile[GMM_GROUP_TILES][2]; /* (r0, e | cnt << 16) */
};
template <int FP8, int BM>
__global__ void __launch_bounds__(GMM_WARPS * 32, 1) gmm_group_kernel(gmm_args a, const __grid_constant__ gmm_group gr) {
    const uint32_t r0 = gr.tile[blockIdx.y][0], ec = gr.tile[blockIdx.y][1], e = ec & 0xffffu;
    a.w = gr.w[e], a.wsc = gr.ws[e], a.M = (int64_t)r0 + (ec >> 16);
    gmm_tile<FP8, BM, 0>(a, (int64_t)r0, (int64_t)blockIdx.x * GMM_BN);
}

/* split-K's second pass: y bf16 [M·N] from the scratch planes part f32 [planes][M·N] (gmm_reduce_one) */
__global__ void gmm_reduce(const float *part, int64_t mn, int64_t planes, uint16_t *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < mn) y[i] = d_to_bf16(gmm_reduce_one(part, mn, planes, i));
}

/* The SM's shared memory (bytes), for the carveout of two CTAs per SM */
static int gmm_sm_smem(void) {
    static int b = 0;
    if (!b) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess || b < 1)
            b = 228 * 1024;
    }
    return b;
}

/* The call's plan: x-row tile, CTAs per SM, split-K (splits = 1: unsplit) */
struct gmm_plan {
    int bm, occ, splits;
    int64_t zs;          /* stages per split */
    uint64_t part_bytes; /* split-K scratch f32 [planes][M][N] */
};

template <int FP8, int BM, int OCC, int SPLIT>
static void gmm_raise(size_t smem) {
    static bool raised = false; /* the dynamic shared-memory limit, raised once per instantiation */
    if (raised) return;
    cudaFuncSetAttribute(gmm_kernel<FP8, BM, OCC, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, GMM_SMEM_MAX);
    /* OCC CTAs need OCC·(smem + the 1 KB the system reserves per CTA) of the SM's shared memory: a carveout
     * hint (percent of the maximum, rounded up by the driver) that leaves the rest to L1 */
    if (OCC > 1)
        cudaFuncSetAttribute(gmm_kernel<FP8, BM, OCC, SPLIT>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             (int)((100 * (size_t)OCC * (smem + 1024) + gmm_sm_smem() - 1) / gmm_sm_smem()));
    raised = true;
}

template <int FP8, int BM, int OCC>
static int gmm_launch_t(const gmm_args &a, const gmm_plan &p, cudaStream_t st, di_error *err) {
    const char *op = FP8 ? "linear_fp8 (mma gemm)" : "linear_fp4 (mma gemm)";
    const size_t smem = 2 * (size_t)gmm_stage_bytes(FP8, BM) + (FP8 ? 1024 : 0);
    dim3 grid((unsigned)((a.N + GMM_BN - 1) / GMM_BN), (unsigned)((a.M + BM - 1) / BM), (unsigned)p.splits);
    if (p.splits == 1) {
        gmm_raise<FP8, BM, OCC, 0>(smem);
        gmm_kernel<FP8, BM, OCC, 0><<<grid, GMM_WARPS * 32, smem, st>>>(a);
        return di_cuda_launched(op, err);
    }
    gmm_raise<FP8, BM, OCC, 1>(smem);
    gmm_kernel<FP8, BM, OCC, 1><<<grid, GMM_WARPS * 32, smem, st>>>(a);
    int rc = di_cuda_launched(op, err);
    if (rc) return rc;
    const int64_t mn = a.M * a.N;
    gmm_reduce<<<(unsigned)((mn + 255) / 256), 256, 0, st>>>(a.part, mn, gmm_split_plane(a.K / 32, a.zs), a.y);
    return di_cuda_launched(FP8 ? "linear_fp8 (mma gemm split-K reduce)" : "linear_fp4 (mma gemm split-K reduce)",
                            err);
}

template <int FP8, int BM>
static int gmm_group_launch_t(const gmm_args &a, const gmm_group &gr, int ntiles, cudaStream_t st, di_error *err) {
    const size_t smem = 2 * (size_t)gmm_stage_bytes(FP8, BM) + (FP8 ? 1024 : 0);
    static bool raised = false;
    if (!raised) {
        cudaFuncSetAttribute(gmm_group_kernel<FP8, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, GMM_SMEM_MAX);
        raised = true;
    }
    const dim3 grid((unsigned)((a.N + GMM_BN - 1) / GMM_BN), (unsigned)ntiles);
    gmm_group_kernel<FP8, BM><<<grid, GMM_WARPS * 32, smem, st>>>(a, gr);
    return di_cuda_launched(FP8 ? "linear_fp8 (mma gemm, grouped)" : "linear_fp4 (mma gemm, grouped)", err);
}

static int gmm_group_launch(int fp4, int bm, const gmm_args &a, const gmm_group &gr, int nt, cudaStream_t st,
                            di_error *err) {
    switch ((fp4 ? 1000 : 0) + bm) {
    case 32: return gmm_group_launch_t<1, 32>(a, gr, nt, st, err);
    case 64: return gmm_group_launch_t<1, 64>(a, gr, nt, st, err);
    case 1032: return gmm_group_launch_t<0, 32>(a, gr, nt, st, err);
    case 1064: return gmm_group_launch_t<0, 64>(a, gr, nt, st, err);
    default: return gmm_group_launch_t<0, 128>(a, gr, nt, st, err);
    }
}

/* x-row tile: the smallest of 32 / 64 / 128 holding M, at most 64 for FP8 (its 128-row tile spills: 9
 * MMAs' operands per A tile), halved while the grid would leave SMs idle (an expert with ~128 prefill rows
 * on 2304 weight rows: 18 CTAs at 128, 72 at 32). A guess until the device bench times the tiles
 * (di_cuda_gemm_mma_set_tile). */
static int g_gmm_bm = 0;
extern "C" void di_cuda_gemm_mma_set_tile(int bm) { g_gmm_bm = bm == 32 || bm == 64 || bm == 128 ? bm : 0; }
static int gmm_tile(int fp4, int64_t m, int64_t n) {
    int bm = g_gmm_bm ? g_gmm_bm : m <= 32 ? 32 : m <= 64 ? 64 : 128;
    if (!fp4 && bm > 64) bm = 64;
    const int64_t nt = (n + GMM_BN - 1) / GMM_BN;
    while (!g_gmm_bm && bm > 32 && nt * ((m + bm - 1) / bm) < di_cuda_sm_count()) bm /= 2;
    return bm;
}

/* CTAs per SM: 2 takes the instantiation capped at 128 registers (__launch_bounds__(256, 2)), built for
 * the 32-row tile and MXFP4's 64-row tile (ptxas, CUDA 13: FP8 BM 32 128 registers with 64 bytes of
 * spills, MXFP4 BM 32 125 / none, MXFP4 BM 64 128 / 44 bytes, all loop invariants reloaded once per stage
 * outside the MMAs; FP8 BM 64 spills inside them, so it has none). Shared memory: ~64 KB per CTA at most
 * (FP8 BM 32). Default 1: on the H200 (2026-12-01) 2 made the 32-row tile 1.15-1.2x faster for FP8 where
 * the grid is large, but the tile rule's 64-row tile stays faster there (K 6144 N 25600 M 8192 65 ms vs
 * 72 ms at 32 rows, 2 per SM), and MXFP4 gained nothing (0.8-1.09x); bench gpu moved within its noise. */
static int g_gmm_occ = -1; /* −1: DI_CUDA_GMM_OCC not read yet; 0: the default rule */
extern "C" void di_cuda_gemm_mma_set_occ(int occ) { g_gmm_occ = occ < 0 ? -1 : occ == 1 || occ == 2 ? occ : 0; }
static int gmm_occ(int fp4, int bm) {
    if (g_gmm_occ < 0) {
        const char *v = getenv("DI_CUDA_GMM_OCC");
        g_gmm_occ = v && (atoi(v) == 1 || atoi(v) == 2) ? atoi(v) : 0;
    }
    const int occ = g_gmm_occ ? g_gmm_occ : 1;
    return occ == 2 && (bm == 32 || (fp4 && bm == 64)) ? 2 : 1;
}

/* Split-K (cuda_gemm_mma.cuh): for grids far smaller than the GPU — decode shapes with narrow N, e.g. FP8
 * K 5120 N 512 at M 64: 8 CTAs of 80 stages each, one serial chain (H200: 0.19 ms at any M ≤ 256). The
 * rule: M ≤ 256 and fewer tiles than SMs / 2 → S = SMs / tiles, at most NS / GMM_SPLIT_MIN_STAGES (each
 * split pays its prologue; 4 is a guess). The scratch (M·N·4 bytes per plane, one plane per block after
 * split 0's plus one) is capped at GMM_SPLIT_MAX_BYTES: S shrinks until it fits, else no split. On by
 * default (H200, 2026-12-01, test_cuda_gemm_mma's bench: FP8 K 5120 N 512 M 64 0.205 → 0.034 ms with
 * S 16, N 1280 M 64 0.205 → 0.072 ms (S 6), N 2304 M 64 0.205 → 0.121 ms (S 3), M 17 shapes 1.9-7x; the
 * same bits, 229 of 229 rows); DI_CUDA_GMM_SPLIT=1 turns it off. */
#define GMM_SPLIT_MIN_STAGES 4
#define GMM_SPLIT_MAX_BYTES ((uint64_t)64 << 20)
#define GMM_SPLIT_DEFAULT 0
static int g_gmm_split = -1; /* −1: DI_CUDA_GMM_SPLIT not read yet; 0: the rule; 1: never; S ≥ 2: S */
extern "C" void di_cuda_gemm_mma_set_split(int s) { g_gmm_split = s >= 0 ? s : -1; }
static int gmm_split_setting(void) {
    if (g_gmm_split < 0) {
        const char *v = getenv("DI_CUDA_GMM_SPLIT");
        g_gmm_split = v && *v && atoi(v) >= 0 ? atoi(v) : GMM_SPLIT_DEFAULT;
    }
    return g_gmm_split;
}

static gmm_plan gmm_plan_of(int fp4, int64_t m, int64_t k, int64_t n) {
    gmm_plan p;
    p.bm = gmm_tile(fp4, m, n), p.occ = gmm_occ(fp4, p.bm);
    const int64_t ns = k / (32 * GMM_KS), tiles = ((n + GMM_BN - 1) / GMM_BN) * ((m + p.bm - 1) / p.bm);
    const int set = gmm_split_setting();
    int64_t s = 1;
    if (set >= 2) s = set;
    else if (set == 0 && m <= 256 && tiles > 0 && tiles < di_cuda_sm_count() / 2) s = di_cuda_sm_count() / tiles;
    if (set == 0 && s > ns / GMM_SPLIT_MIN_STAGES) s = ns / GMM_SPLIT_MIN_STAGES;
    if (s > ns) s = ns;
    if (s > 65535) s = 65535; /* grid z */
    p.splits = 1, p.zs = ns, p.part_bytes = 0;
    for (; s >= 2; s--) {
        const int64_t zs = gmm_split_stages(ns, s), sc = gmm_split_count(ns, zs);
        const uint64_t bytes = (uint64_t)gmm_split_plane(k / 32, zs) * (uint64_t)(m * n) * 4;
        if (sc >= 2 && bytes <= GMM_SPLIT_MAX_BYTES) {
            p.splits = (int)sc, p.zs = zs, p.part_bytes = bytes;
            break;
        }
    }
    return p;
}
extern "C" int di_cuda_gemm_mma_splits(int fp4, int64_t m, int64_t k, int64_t n) { return gmm_plan_of(fp4, m, k, n).splits; }

extern "C" int di_cuda_gemm_mma_fits(int64_t m, int64_t k, const void *w) {
    return m >= 1 && (m + 31) / 32 <= 65535 && k > 0 && k % (32 * GMM_KS) == 0 && (uintptr_t)w % 16 == 0;
}

static int g_gmm_on = -1; /* −1: not read yet */
extern "C" int di_cuda_gemm_mma_enabled(void) { return di_cuda_env_switch(&g_gmm_on, "DI_CUDA_GEMM", "simt"); }
extern "C" void di_cuda_gemm_mma_set_enabled(int on) { g_gmm_on = on ? 1 : 0; }

static uint64_t gmm_xd_scratch(int64_t m, int64_t k) { return (gmm_xd_bytes(m, k) + 15) & ~(uint64_t)15; }
extern "C" uint64_t di_cuda_gemm_mma_group_scratch(int64_t rows, int64_t k) { return gmm_xd_scratch(rows, k); }
extern "C" uint64_t di_cuda_gemm_mma_scratch(int fp4, int64_t m, int64_t k, int64_t n) {
    return gmm_xd_scratch(m, k) + ((gmm_plan_of(fp4, m, k, n).part_bytes + 15) & ~(uint64_t)15);
}

extern "C" int di_cuda_gemm_mma_run(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k,
                                    const uint8_t *w, const uint8_t *ws, int64_t n, uint16_t *y, uint8_t *xd,
                                    void *stream, di_error *err) {
    if (!di_cuda_gemm_mma_fits(m, k, w) || n < 1 || (n + GMM_BN - 1) / GMM_BN > 0x7fffffff)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda mma gemm: M %lld (>= 1), K %lld (a multiple of %d), N %lld, weight pointer "
                            "16-byte aligned",
                            (long long)m, (long long)k, 32 * GMM_KS, (long long)n);
    if ((uintptr_t)xd % 16)
        return di_error_set(err, DI_ERR_INVALID, "cuda mma gemm: x digit scratch not 16-byte aligned");
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t words = m * (k / 4);
    gmm_xprep<<<(unsigned)((words + 255) / 256), 256, 0, st>>>(xq, m, k, xd);
    int rc = di_cuda_launched("linear_fp8/fp4 (mma gemm x digits)", err);
    if (rc) return rc;
    const gmm_plan p = gmm_plan_of(fp4, m, k, n);
    const gmm_args a = {xd, xs, w, ws, m, n, k, y, (float *)(xd + gmm_xd_scratch(m, k)), p.zs};
    switch ((fp4 ? 1000 : 0) + 10 * p.bm + p.occ) {
    case 321: return gmm_launch_t<1, 32, 1>(a, p, st, err);
    case 322: return gmm_launch_t<1, 32, 2>(a, p, st, err);
    case 641: return gmm_launch_t<1, 64, 1>(a, p, st, err);
    case 1321: return gmm_launch_t<0, 32, 1>(a, p, st, err);
    case 1322: return gmm_launch_t<0, 32, 2>(a, p, st, err);
    case 1641: return gmm_launch_t<0, 64, 1>(a, p, st, err);
    case 1642: return gmm_launch_t<0, 64, 2>(a, p, st, err);
    default: return gmm_launch_t<0, 128, 1>(a, p, st, err);
    }
}

/* x-row tile of a grouped call, by the mean rows of the experts that have rows (an expert's last tile is
 * partial: smaller tiles waste less on few rows, larger ones re-read each weight tile less often); the
 * single-call measurements (bench/NOTES-gpu.md) favour 128 from ~100 rows (MXFP4); FP8 stops at 64 */
static int gmm_group_tile(int fp4, int64_t rows, int active) {
    if (g_gmm_bm) return !fp4 && g_gmm_bm > 64 ? 64 : g_gmm_bm;
    const int64_t mean = active ? rows / active : 0;
    const int bm = mean >= 96 ? 128 : mean >= 48 ? 64 : 32;
    return !fp4 && bm > 64 ? 64 : bm;
}

static int g_group_cap = 0; /* test: fewer row tiles per launch than the table holds (0: GMM_GROUP_TILES) */
extern "C" void di_cuda_gemm_mma_set_group_tiles(int n) { g_group_cap = n > 0 && n < GMM_GROUP_TILES ? n : 0; }

extern "C" int di_cuda_gemm_mma_grouped(int fp4, const uint8_t *xq, const uint8_t *xs, int64_t k, int n_exp,
                                        const int64_t *start_h, const uint8_t *const *w, const uint8_t *const *ws,
                                        int64_t n, uint16_t *y, uint8_t *xd, void *stream, di_error *err) {
    const int64_t rows = n_exp > 0 ? start_h[n_exp] : 0;
    if (n_exp < 1 || n_exp > GMM_GROUP_EXPERTS || k <= 0 || k % (32 * GMM_KS) || n < 1 || rows < 0 ||
        rows > INT32_MAX || (n + GMM_BN - 1) / GMM_BN > 0x7fffffff || (uintptr_t)xd % 16)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda mma gemm (grouped): %d experts (1..%d), K %lld (a multiple of %d), N %lld, %lld rows, "
                            "16-byte aligned digit scratch",
                            n_exp, GMM_GROUP_EXPERTS, (long long)k, 32 * GMM_KS, (long long)n, (long long)rows);
    if (rows == 0) return DI_OK;
    int active = 0; /* the table is checked before anything is launched */
    for (int e = 0; e < n_exp; e++) {
        if (start_h[e + 1] < start_h[e] || start_h[e] < 0)
            return di_error_set(err, DI_ERR_INVALID, "cuda mma gemm (grouped): expert %d's rows [%lld, %lld)", e,
                                (long long)start_h[e], (long long)start_h[e + 1]);
        if (start_h[e + 1] > start_h[e]) {
            if (!w[e] || !ws[e] || (uintptr_t)w[e] % 16)
                return di_error_set(err, DI_ERR_INVALID, "cuda mma gemm (grouped): expert %d has rows but no (16-byte "
                                    "aligned) weight", e);
            active++;
        }
    }
    cudaStream_t st = (cudaStream_t)stream;
    int rc = DI_OK;
    if (xq) { /* NULL: xd holds these rows' digit planes already (a second weight over the same rows) */
        const int64_t words = rows * (k / 4);
        gmm_xprep<<<(unsigned)((words + 255) / 256), 256, 0, st>>>(xq, rows, k, xd);
        rc = di_cuda_launched("linear_fp8/fp4 (mma gemm x digits, grouped)", err);
        if (rc) return rc;
    }
    const int bm = gmm_group_tile(fp4, rows, active);
    gmm_group gr; /* 26 KiB of kernel parameters */
    memcpy(gr.w, w, sizeof(*w) * (size_t)n_exp);
    memcpy(gr.ws, ws, sizeof(*ws) * (size_t)n_exp);
    gmm_args a;
    memset(&a, 0, sizeof a);
    a.xd = xd, a.xs = xs, a.M = rows, a.N = n, a.K = k, a.y = y;
    const int cap = g_group_cap ? g_group_cap : GMM_GROUP_TILES;
    int nt = 0;
    for (int e = 0; e < n_exp && !rc; e++)
        for (int64_t r = start_h[e]; r < start_h[e + 1] && !rc; r += bm) {
            const int64_t cnt = start_h[e + 1] - r < bm ? start_h[e + 1] - r : bm;
            gr.tile[nt][0] = (uint32_t)r, gr.tile[nt][1] = (uint32_t)e | (uint32_t)cnt << 16;
            if (++nt == cap) rc = gmm_group_launch(fp4, bm, a, gr, nt, st, err), nt = 0; /* a full table */
        }
    if (!rc && nt) rc = gmm_group_launch(fp4, bm, a, gr, nt, st, err);
    return rc;
}
