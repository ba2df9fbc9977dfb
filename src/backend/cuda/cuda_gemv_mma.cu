/* MXFP4 decode GEMV (M ≤ 16 rows, in groups of ≤ 4 per launch) with the exact 32-term block sums on the
 * int8 tensor cores (mma.sync m16n8k32 s8·s8 → s32). Opt-in: DI_CUDA_GEMV=mma routes linear_fp4's
 * small-M path here (cuda_gemm.cu); the default stays cuda_gemv.cuh. NOT YET RUN ON A GPU: exactness is
 * argued in cuda_gemv_mma.cuh and checked by the host emulation tests/test_gemv_mma_emu.c (the same
 * lane functions, the PTX fragment layouts emulated); tests/cuda/test_cuda_gemv_mma.c is the device check.
 *
 * Work split. A CTA takes a tile of NC (8 or 16) output columns × all K for MT (1, 2, 4) x rows; its
 * warps share K in units of GVM_UP block pairs (unit u: blocks 4u … 4u + 3), unit u to warp u mod W.
 * For a block pair a lane loads 4 weight bytes per (row g / g+8, block) — the 8 codes the A fragment
 * wants from it (gvm_a_frag) — and the pair's two scale bytes of the row whose output it writes; the
 * next unit's loads are issued before the current one is computed. Per pair and n8 tile: 2 MMAs per
 * block that the tile holds (A⁺ and A⁻ against the same B), C⁺ − C⁻, one shuffle to assemble S of one
 * (row, block) per lane, P_b = ((S·2^−10)·s_x)·s_w into shared memory. After the tile's last unit one
 * thread per (x row, column) adds P_0 … P_{KB−1} in order and rounds to bf16 — cuda_gemv.cuh's code.
 *
 * The x rows: their digit planes (s8 [MT][3][K + pad], built once per CTA from the e4m3 codes) give the
 * B fragments by one 8-byte shared load per lane, block and tile. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_gemv_mma.cuh"
#include "backend/cuda/cuda_ops.h"

#define GVM_WARPS 8   /* most warps per CTA */
#define GVM_MAX_M 16  /* rows of one call (groups of ≤ 4 per launch) */
#define GVM_SMEM_MAX (200 * 1024)

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
    constexpr int MTP = MT == 1 ? 1 : MT; /* slots per block: rows (one row: the pair's blocks share a tile) */
    constexpr int NT = MTP;               /* n8 tiles per block pair: 2·MTP slots, two per tile */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3, odd = q & 1;
    const int64_t K = a.K, KB = K / 32, NU = KB / (2 * GVM_UP), ps = K + GVM_PAD;
    const int64_t ntiles = (a.N + NC - 1) / NC;
    uint8_t *xd = sm;                                           /* s8 [MT][3][ps] digit planes */
    float *sxs = (float *)(sm + ((MT * 3 * ps + 15) & ~(int64_t)15)); /* f32 [MT][KB] */
    float *pb = sxs + MT * KB;                                  /* f32 [MT][NC][KB] */
    for (int64_t i = threadIdx.x; i < (int64_t)mt * (K / 4); i += blockDim.x) {
        const int m = (int)(i / (K / 4));
        const int64_t c = i % (K / 4);
        uint32_t dig[3];
        gvm_x_digits(__ldg((const uint32_t *)(a.xq + xrow(m) * K) + c), dig);
#pragma unroll
        for (int d = 0; d < 3; d++) *(uint32_t *)(xd + (m * 3 + d) * ps + 4 * c) = dig[d];
    }
    for (int64_t i = threadIdx.x; i < (int64_t)mt * KB; i += blockDim.x)
        sxs[i] = gvm_e8m0(__ldg(a.xs + xrow((int)(i / KB)) * KB + i % KB));
    __syncthreads();

    const int bh = g >> 2, bd = g & 3; /* this lane's B column: slot half, digit (3: the zero column) */
    gvm_unit nx;
    gvm_load<NC>(a, tile0, ntiles, warp, g, q, nx);
    for (int64_t tile = tile0; tile < ntiles; tile += step) {
        const int64_t n0 = tile * NC;
        for (int64_t u = warp; u < NU; u += nw) { /* warp-uniform: all lanes reach the MMAs and shuffles */
            const gvm_unit f = nx;
            if (u + nw < NU) gvm_load<NC>(a, tile, ntiles, u + nw, g, q, nx);
            else gvm_load<NC>(a, tile + step, ntiles, warp, g, q, nx);
#pragma unroll
            for (int i = 0; i < GVM_UP; i++) {
                const int64_t kb0 = 2 * (u * GVM_UP + i);
                uint32_t apos[2][4], aneg[2][4];
#pragma unroll
                for (int j = 0; j < 2; j++) gvm_a_frag(f.w[i][j][0], f.w[i][j][1], apos[j], aneg[j]);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    int32_t cp[4] = {0, 0, 0, 0}, cn[4] = {0, 0, 0, 0};
                    int bj, bm;
                    gvm_slot(MTP, 2 * t + bh, &bj, &bm);
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        if (MT != 1 && j != (2 * t) / MTP) continue; /* this tile holds block j of the pair only */
                        uint2 b = make_uint2(0u, 0u);
                        if (bj == j && bd < 3 && bm < mt)
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
                    gvm_slot(MTP, 2 * t + (q >> 1), &oj, &om);
                    const int orow = g + 8 * odd;
                    if (om < mt && orow < NC && n0 + orow < a.N)
                        pb[((int64_t)om * NC + orow) * KB + kb0 + oj] =
                            gvm_block_value(s, sxs[om * KB + kb0 + oj], (f.sw[i] >> (8 * oj)) & 0xffu);
                }
            }
        }
        __syncthreads();
        const int ncol = (int)min((int64_t)NC, a.N - n0);
        for (int o = threadIdx.x; o < mt * ncol; o += blockDim.x) { /* the CPU's f32 adds, blocks ascending */
            const int m = o / ncol, cc = o % ncol;
            const float *p = pb + ((int64_t)m * NC + cc) * KB;
            float acc = 0.0f;
#pragma unroll 4
            for (int64_t kb = 0; kb < KB; kb += 4) { /* KB % 4 == 0 (K % 128 == 0) */
                const float4 v = *(const float4 *)(p + kb);
                acc = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, v.x), v.y), v.z), v.w);
            }
            out(m, n0 + cc, acc);
        }
        __syncthreads();
    }
}

struct gvm_rows_linear {
    int64_t r0;
    __device__ int64_t operator()(int m) const { return r0 + m; }
};
struct gvm_out_linear {
    uint16_t *y;
    int64_t N, r0;
    __device__ void operator()(int m, int64_t n, float v) const { y[(r0 + m) * N + n] = d_to_bf16(v); }
};

template <int MT, int NC>
__global__ void __launch_bounds__(GVM_WARPS * 32) gvm_linear_kernel(const gv_args a, int64_t r0, int mt, uint16_t *y) {
    extern __shared__ uint4 gvm_sm[];
    gvm_run<MT, NC>(a, gvm_rows_linear{r0}, mt, gvm_out_linear{y, a.N, r0}, blockIdx.x, gridDim.x,
                    (unsigned char *)gvm_sm);
}

static int gvm_n_sms(void) {
    static int n = 0;
    if (!n) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) n = 132;
    }
    return n;
}

/* warps share the K units evenly, at most GVM_WARPS */
static int gvm_threads(int64_t K) {
    const int64_t nu = K / (64 * GVM_UP), per = (nu + GVM_WARPS - 1) / GVM_WARPS;
    return (int)((nu + per - 1) / per) * 32;
}

template <int MT, int NC>
static int gvm_launch_t(const gv_args &a, int64_t r0, int mt, uint16_t *y, cudaStream_t st, di_error *err) {
    const int threads = gvm_threads(a.K);
    const size_t smem = (size_t)gvm_smem(MT, NC, a.K);
    static bool raised = false; /* the dynamic shared-memory limit, raised once per instantiation */
    if (!raised) {
        cudaFuncSetAttribute(gvm_linear_kernel<MT, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, GVM_SMEM_MAX);
        raised = true;
    }
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gvm_linear_kernel<MT, NC>, threads, smem) != cudaSuccess ||
        occ < 1)
        occ = 1;
    const int64_t ntiles = (a.N + NC - 1) / NC;
    const int64_t grid = ntiles < (int64_t)occ * gvm_n_sms() ? ntiles : (int64_t)occ * gvm_n_sms();
    gvm_linear_kernel<MT, NC><<<(unsigned)grid, threads, smem, st>>>(a, r0, mt, y);
    return di_cuda_launched("linear_fp4 (mma gemv)", err);
}

/* Column tile: 16 (one MMA's rows) when that still gives two tiles per SM, else 8 (half the A rows are
 * zero; more CTAs for the narrow weights). A guess to be replaced by the device measurement. */
static int g_gvm_nc = 0;
extern "C" void di_cuda_gemv_mma_set_tile(int nc) { g_gvm_nc = nc == 8 || nc == 16 ? nc : 0; }

extern "C" int di_cuda_gemv_mma_fits(int64_t m, int64_t k, const void *w, const void *ws) {
    return m >= 1 && m <= GVM_MAX_M && k > 0 && k % (64 * GVM_UP) == 0 && (uintptr_t)w % 16 == 0 &&
           (uintptr_t)ws % 2 == 0 && gvm_smem(4, 16, k) <= GVM_SMEM_MAX;
}

extern "C" int di_cuda_gemv_mma_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("DI_CUDA_GEMV");
        on = v && strcmp(v, "mma") == 0;
    }
    return on;
}

extern "C" int di_cuda_gemv_mma_run(const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k, const uint8_t *w,
                                    const uint8_t *ws, int64_t n, uint16_t *y, void *stream, di_error *err) {
    if (!di_cuda_gemv_mma_fits(m, k, w, ws) || n < 1)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda mma gemv: M %lld (1..%d), K %lld (a multiple of %d), N %lld, weight / scale "
                            "pointers 16- / 2-byte aligned",
                            (long long)m, GVM_MAX_M, (long long)k, 64 * GVM_UP, (long long)n);
    const gv_args a = {xq, xs, w, ws, n, k};
    cudaStream_t st = (cudaStream_t)stream;
    const int nc = g_gvm_nc ? g_gvm_nc : ((n + 15) / 16 >= 2 * (int64_t)gvm_n_sms() ? 16 : 8);
    for (int64_t r0 = 0; r0 < m;) {
        const int64_t left = m - r0;
        const int mt = left == 1 ? 1 : left == 2 ? 2 : 4, used = (int)(left < mt ? left : mt);
        int rc;
        switch (mt * 100 + nc) {
        case 108: rc = gvm_launch_t<1, 8>(a, r0, used, y, st, err); break;
        case 116: rc = gvm_launch_t<1, 16>(a, r0, used, y, st, err); break;
        case 208: rc = gvm_launch_t<2, 8>(a, r0, used, y, st, err); break;
        case 216: rc = gvm_launch_t<2, 16>(a, r0, used, y, st, err); break;
        case 408: rc = gvm_launch_t<4, 8>(a, r0, used, y, st, err); break;
        default: rc = gvm_launch_t<4, 16>(a, r0, used, y, st, err); break;
        }
        if (rc) return rc;
        r0 += used;
    }
    return DI_OK;
}

extern "C" int di_cuda_gemv_mma_codes(const di_backend *be, const uint8_t *xq, const uint8_t *xs, int64_t m, int64_t k,
                                      const uint8_t *w, const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    return di_cuda_gemv_mma_run(xq, xs, m, k, w, ws, n, y, di_backend_cuda_stream(be), err);
}
