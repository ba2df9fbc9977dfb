/* GEMMs y = x · Wᵀ on the GPU (spec §3.1, §5.1, §5.2), bit-identical to the CPU reference kernels.
 *
 * Block-scaled FP8 / MXFP4 (linear_q.c's contract): x is act-quantized per 32 inputs into the backend
 * workspace (cuda_quant.cu, the exact formats.c quantizer); per 32-wide K block, Σ q_x·q_w is formed in
 * f64, where every product and every partial sum of the 32 terms is exact (e4m3 values are multiples of
 * 2^-9 below 2^9 with 4 significant bits, E2M1 multiples of 2^-1), so the block sum is the exact value
 * in any order; it is rounded once to f32, multiplied by s_x then s_w, and added to an f32 accumulator
 * in ascending block order; one bf16 rounding at the end. That is the CPU's arithmetic sequence, so the
 * results agree bit for bit. Decode-sized M (≤ 16 rows) runs the bandwidth-oriented GEMV of
 * cuda_gemv.cuh (FP8 block sums in f64 through a shared table, MXFP4 block sums in int32 on dp4a);
 * larger M the plain shared-memory tiled loop on the FP64 units. The part-1 one-block-per-column GEMV
 * stays callable (di_cuda_linear_q_part1) as the bench's "before". Hopper's FP8 tensor cores
 * accumulate with fewer bits than f32 (cuda_gemm_wgmma.cu, opt-in).
 *
 * bf16 (linear_bf16.c's contract): 16 interleaved f32 partial sums (lane l takes k ≡ l mod 16 in
 * ascending k), combined (l, l+8), (l, l+4), (l, l+2), (l, l+1), then the K % 16 tail in order; products
 * bf16×bf16 are exact in f32 and are rounded separately from the adds, as on the CPU. cuBLAS would
 * compute the same function but not this summation order, so it would not be bit-identical. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_gemm_dmma.h"
#include "backend/cuda/cuda_gemm_igmma.h"
#include "backend/cuda/cuda_gemv_fp8.h"
#include "backend/cuda/cuda_gemm_mma.cuh"
#include "backend/cuda/cuda_gemv_mma.cuh"
#include "backend/cuda/cuda_ops.h"

#define QB 32  /* quantization block along K */
#define QTM 32 /* rows (tokens) per tile */
#define QTN 64 /* output columns per tile */

/* xq e4m3 [M, K], xs E8M0 [M, K/32] (the act-quantized input); w e4m3 [N, K] + E8M0 [ceil(N/32), K/32]
 * (fp4 = 0) or packed E2M1 [N, K/2] + E8M0 [N, K/32] (fp4 = 1); y bf16 [M, N]. 256 threads: thread t
 * owns column t % 64 and rows 8·(t/64) .. +7 of the tile. */
__global__ void __launch_bounds__(256) qgemm_kernel(const uint8_t *xq, const uint8_t *xs, const uint8_t *w,
                                                    const uint8_t *wsc, int fp4, int64_t M, int64_t N, int64_t K,
                                                    uint16_t *y) {
    __shared__ float xv[QTM][QB + 1]; /* e4m3 values of the x tile, unscaled */
    __shared__ float sxv[QTM];        /* f32 [32] x scales of this K block */
    __shared__ float wv[QTN][QB + 1]; /* weight values of the tile, unscaled */
    __shared__ float swv[QTN];        /* f32 [64] weight scales of this K block */
    const int t = threadIdx.x;
    const int64_t m0 = (int64_t)blockIdx.y * QTM, n0 = (int64_t)blockIdx.x * QTN;
    const int64_t KB = K / QB;
    const int nl = t % QTN, mg = (t / QTN) * 8;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.0f;

    for (int64_t kb = 0; kb < KB; kb++) {
        { /* x tile: 32 rows × 32 codes, 4 codes per thread */
            int r = t / 8, c = (t % 8) * 4;
            int64_t m = m0 + r;
            uint32_t v = m < M ? *(const uint32_t *)(xq + m * K + kb * QB + c) : 0u;
#pragma unroll
            for (int j = 0; j < 4; j++) xv[r][c + j] = d_e4m3_decode((uint8_t)(v >> (8 * j)));
            if (t < QTM) sxv[t] = m0 + t < M ? d_e8m0(xs[(m0 + t) * KB + kb]) : 0.0f;
        }
        { /* weight tile: 64 rows × 32 values, 8 per thread */
            int r = t / 4, c = (t % 4) * 8;
            int64_t n = n0 + r;
            if (fp4) {
                uint32_t v = n < N ? *(const uint32_t *)(w + n * (K / 2) + kb * (QB / 2) + c / 2) : 0u;
#pragma unroll
                for (int j = 0; j < 8; j++) wv[r][c + j] = d_e2m1_decode(v >> (4 * j));
            } else {
                uint2 v = n < N ? *(const uint2 *)(w + n * K + kb * QB + c) : make_uint2(0u, 0u);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    wv[r][c + j] = d_e4m3_decode((uint8_t)(v.x >> (8 * j)));
                    wv[r][c + 4 + j] = d_e4m3_decode((uint8_t)(v.y >> (8 * j)));
                }
            }
            if (t < QTN) {
                int64_t nn = n0 + t;
                swv[t] = nn < N ? d_e8m0(fp4 ? wsc[nn * KB + kb] : wsc[(nn / QB) * KB + kb]) : 0.0f;
            }
        }
        __syncthreads();
        const float sw = swv[nl];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (m0 + mg + i >= M) break; /* rows past M (decode: all but one) do no work */
            double s = 0.0; /* exact: see the file comment */
#pragma unroll
            for (int kk = 0; kk < QB; kk++) s = fma((double)xv[mg + i][kk], (double)wv[nl][kk], s);
            float p = __fmul_rn(__double2float_rn(s), sxv[mg + i]);
            p = __fmul_rn(p, sw);
            acc[i] = __fadd_rn(acc[i], p);
        }
        __syncthreads();
    }
    int64_t n = n0 + nl;
    if (n >= N) return;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (m0 + mg + i < M) y[(m0 + mg + i) * N + n] = d_to_bf16(acc[i]);
}

/* Part-1 small-M path (kept for comparison, di_cuda_linear_q_part1): one block per output column n, the K blocks spread over the
 * threads. Eight lanes share a 32-block (4 codes each); their f64 partial sums are combined by shuffles
 * (every partial sum is exact, so this order gives the same block sum), lane 0 of the eight scales it
 * into pb[m][kb]; then one thread per row adds pb[m][0..KB) in ascending order in f32 — the same
 * sequence of f32 operations as the tiled kernel and the CPU. Shared: f32 [M, KB].
 * 128 threads; the weight row is read once, 512 contiguous bytes per step. */
#define GEMV_MAX_M 8
#define GEMV_THREADS 128
__global__ void __launch_bounds__(GEMV_THREADS) qgemv_kernel(const uint8_t *xq, const uint8_t *xs, const uint8_t *w,
                                                             const uint8_t *wsc, int fp4, int M, int64_t N, int64_t K,
                                                             uint16_t *y) {
    extern __shared__ float pb[]; /* f32 [M, KB] scaled block sums */
    const int64_t n = blockIdx.x, KB = K / QB;
    const int sub = threadIdx.x & 7;
    /* the loop bound is warp-uniform: all 32 lanes reach the shuffles, lanes past KB with zeros */
    for (int64_t kb0 = 0; kb0 < KB; kb0 += GEMV_THREADS / 8) {
        const int64_t kb = kb0 + (threadIdx.x >> 3);
        const bool live = kb < KB;
        float wv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float sw = 0.0f;
        if (live) {
            if (fp4) {
                uint32_t v = *(const uint16_t *)(w + n * (K / 2) + kb * (QB / 2) + 2 * sub);
#pragma unroll
                for (int j = 0; j < 4; j++) wv[j] = d_e2m1_decode(v >> (4 * j));
            } else {
                uint32_t v = *(const uint32_t *)(w + n * K + kb * QB + 4 * sub);
#pragma unroll
                for (int j = 0; j < 4; j++) wv[j] = d_e4m3_decode((uint8_t)(v >> (8 * j)));
            }
            sw = d_e8m0(fp4 ? wsc[n * KB + kb] : wsc[(n / QB) * KB + kb]);
        }
        for (int m = 0; m < M; m++) {
            double s = 0.0;
            if (live) {
                uint32_t xv = *(const uint32_t *)(xq + (int64_t)m * K + kb * QB + 4 * sub);
#pragma unroll
                for (int j = 0; j < 4; j++) s = fma((double)d_e4m3_decode((uint8_t)(xv >> (8 * j))), (double)wv[j], s);
            }
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            if (live && sub == 0)
                pb[(int64_t)m * KB + kb] = __fmul_rn(__fmul_rn(__double2float_rn(s), d_e8m0(xs[(int64_t)m * KB + kb])), sw);
        }
    }
    __syncthreads();
    if (threadIdx.x < M) {
        const float *p = pb + (int64_t)threadIdx.x * KB;
        float acc = 0.0f;
        for (int64_t kb = 0; kb < KB; kb++) acc = __fadd_rn(acc, p[kb]);
        y[(int64_t)threadIdx.x * N + n] = d_to_bf16(acc);
    }
}

/* ---- decode-sized M: the bandwidth-oriented GEMV of cuda_gemv.cuh ---- */
#define GV_MAX_M 16 /* up to here the GEMV beats the tiled kernel; row groups of MT share one launch each */

struct gv_rows_linear {
    int64_t r0;
    __device__ int64_t operator()(int m) const { return r0 + m; }
};
struct gv_out_linear {
    uint16_t *y;
    int64_t N, r0;
    __device__ void operator()(int m, int64_t n, float v) const { y[(r0 + m) * N + n] = d_to_bf16(v); }
};

/* rows r0 … r0 + mt − 1 of y; a persistent grid over the column tiles of NC columns */
template <int FP4, int MT, int NC>
__global__ void __launch_bounds__(GV_WARPS * 32) qgemv_fast_kernel(const gv_args a, int64_t r0, int mt, uint16_t *y) {
    extern __shared__ uint4 gv_sm[]; /* [e4m3 table (FP8)] [gv_smem: x digits and scales (FP4), pb] */
    uint32_t *tab = (uint32_t *)gv_sm;
    float *sm = (float *)gv_sm + (FP4 ? 0 : GV_TAB_WORDS);
    if (!FP4) gv_fill_tab(tab);
    gv_run<FP4, MT, NC>(a, gv_rows_linear{r0}, mt, gv_out_linear{y, a.N, r0}, blockIdx.x, gridDim.x, tab, sm);
}

template <int FP4, int MT, int NC>
static int gv_launch_t(const gv_args &a, int64_t r0, int mt, uint16_t *y, cudaStream_t st, const char *op,
                       di_error *err) {
    const int threads = gv_threads(FP4, a.K);
    const size_t smem = gv_smem(FP4, MT, a.K, NC);
    static bool raised = false; /* the dynamic shared-memory limit, raised once per instantiation */
    if (!raised) {
        cudaFuncSetAttribute(qgemv_fast_kernel<FP4, MT, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        raised = true;
    }
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, qgemv_fast_kernel<FP4, MT, NC>, threads, smem) !=
            cudaSuccess ||
        occ < 1)
        occ = 1;
    const int64_t ntiles = (a.N + NC - 1) / NC;
    const int64_t grid = ntiles < (int64_t)occ * di_cuda_sm_count() ? ntiles : (int64_t)occ * di_cuda_sm_count();
    qgemv_fast_kernel<FP4, MT, NC><<<(unsigned)grid, threads, smem, st>>>(a, r0, mt, y);
    return di_cuda_launched(op, err);
}

/* Column tile of the GEMV. Both tiles give the same bits (the arithmetic per output is the same); the
 * choice is by speed, measured on the H200 at the V4.1 shapes (bench/NOTES-gpu.md, "tile rule"): 4
 * columns (more CTAs, fewer registers) win for FP8 with one row on N ≤ 8192 and with two rows, and for
 * MXFP4 with 2–4 rows; 8 columns elsewhere. di_cuda_gemv_set_variant: 0 = this rule, 1 = always 4,
 * 2 = always 8 (bench). */
static int g_gv_variant = 0;
extern "C" void di_cuda_gemv_set_variant(int v) { g_gv_variant = v; }
static int gv_nc4(int fp4, int mt, int64_t n) {
    if (g_gv_variant) return g_gv_variant == 1;
    return fp4 ? mt >= 2 : (mt == 2 || (mt == 1 && n <= 8192));
}

/* M ≤ GV_MAX_M rows in groups of at most 4 */
static int gv_linear(int fp4, const gv_args &a, int64_t m, uint16_t *y, cudaStream_t st, const char *op,
                     di_error *err) {
    for (int64_t r0 = 0; r0 < m;) {
        int64_t left = m - r0;
        /* the smallest MT holding the rows left, at most 4 (registers: a lane holds two slices' loads
         * and its x rows); idle rows of a tile cost registers only */
        int mt = left == 1 ? 1 : left == 2 ? 2 : 4;
        int used = (int)(left < mt ? left : mt), rc;
        switch (gv_nc4(fp4, mt, a.N) * 100 + fp4 * 16 + mt) {
        case 1: rc = gv_launch_t<0, 1, 8>(a, r0, used, y, st, op, err); break;
        case 2: rc = gv_launch_t<0, 2, 8>(a, r0, used, y, st, op, err); break;
        case 4: rc = gv_launch_t<0, 4, 8>(a, r0, used, y, st, op, err); break;
        case 17: rc = gv_launch_t<1, 1, 8>(a, r0, used, y, st, op, err); break;
        case 18: rc = gv_launch_t<1, 2, 8>(a, r0, used, y, st, op, err); break;
        case 20: rc = gv_launch_t<1, 4, 8>(a, r0, used, y, st, op, err); break;
        case 101: rc = gv_launch_t<0, 1, 4>(a, r0, used, y, st, op, err); break;
        case 102: rc = gv_launch_t<0, 2, 4>(a, r0, used, y, st, op, err); break;
        case 104: rc = gv_launch_t<0, 4, 4>(a, r0, used, y, st, op, err); break;
        case 117: rc = gv_launch_t<1, 1, 4>(a, r0, used, y, st, op, err); break;
        case 118: rc = gv_launch_t<1, 2, 4>(a, r0, used, y, st, op, err); break;
        default: rc = gv_launch_t<1, 4, 4>(a, r0, used, y, st, op, err); break;
        }
        if (rc) return rc;
        r0 += used;
    }
    return DI_OK;
}

/* variant 0: the default dispatch (the GEMV up to GV_MAX_M rows, then the tiled kernel); 1: the part-1
 * kernels (one-block-per-column GEMV up to GEMV_MAX_M rows, then tiled), kept for comparison */
static int qlinear_v(const di_backend *be, int fp4, int variant, const uint16_t *x, int64_t m, int64_t k,
                     const uint8_t *w, const uint8_t *wsc, int64_t n, uint16_t *y, di_error *err) {
    const char *op = fp4 ? "linear_fp4" : "linear_fp8";
    if (m < 0 || n < 0 || k <= 0 || k % QB)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: K = %lld must be a positive multiple of %d (M %lld, N %lld)",
                            op, (long long)k, QB, (long long)m, (long long)n);
    if ((uintptr_t)w % 16)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: weight pointer not 16-byte aligned", op);
    if (m == 0 || n == 0) return DI_OK;
    /* one or two FP8 rows of a weight with N ≥ 1024: the GEMV with the act-quant fused in (cuda_gemv_fp8.cu;
     * DI_CUDA_GEMV_FP8=0 takes act-quant + the GEMV below), the same bits, one launch, no workspace */
    if (variant == 0 && !fp4 && di_cuda_gemv_fp8_enabled() && di_cuda_gemv_fp8_wants(m, k, n, x, w))
        return di_cuda_gemv_fp8_run(x, m, k, w, wsc, n, y, di_cuda_state(be)->stream, err);
    void *wsp;
    /* M > 16 rows with the block sums on the int8 tensor cores (unless DI_CUDA_GEMM=simt), the same results
     * as qgemm_kernel below (cuda_gemm_mma.cuh; checked on the H200); it needs x's digit planes as scratch
     * (and, where it splits K, f32 partial planes: up to 64 MB).
     * Also FP8 at 5–16 rows, which the GEMV runs as launches of 4 rows that each read the weights again:
     * for wide weights (H200, 2026-11-30: k6144 n25600 M 8 1.0 ms as a GEMV, 0.47 ms here at M 17; k1280
     * n32768 0.24 vs 0.11 ms) and for narrow ones, where this GEMM splits K and runs in one launch (H200,
     * 2026-12-01: K 5120 N 2304 2 × 62 µs at M 8 against 54 µs at M 17 split 7 ways; K 8192 N 5120 270 vs
     * 171 µs; K 5120 N 512 46 vs 29 µs). Both are exact, so the choice changes no bit. */
    const int gmm_rows = m > GV_MAX_M ||
                         (!fp4 && m > 4 &&
                          (n >= 16384 || (di_cuda_gemm_mma_enabled() && di_cuda_gemm_mma_splits(0, m, k, n) > 1)));
    /* 3-64 FP8 rows on the FP64 tensor cores (cuda_gemm_dmma.cu; DI_CUDA_GEMM_DMMA=0 takes the kernels
     * below): the same bits, the weights read once */
    const int dmma = variant == 0 && !fp4 && di_cuda_gemm_dmma_enabled() && di_cuda_gemm_dmma_wants(m, k, n, w);
    /* the larger calls on the int8 wgmma (cuda_gemm_igmma.cu; DI_CUDA_GEMM_IG=0, or DI_CUDA_GEMM=simt, takes the
     * kernels below): the int8 MMA GEMM's bits, its digit planes fed to the tensor cores from shared memory */
    const int igmma = !dmma && variant == 0 && di_cuda_gemm_mma_enabled() && di_cuda_gemm_igmma_enabled() &&
                      di_cuda_gemm_igmma_wants(fp4, m, k, n) && di_cuda_gemm_igmma_usable(fp4, 0);
    const int gmm = !dmma && !igmma && variant == 0 && gmm_rows && di_cuda_gemm_mma_enabled() && di_cuda_gemm_mma_fits(m, k, w);
    size_t codes = ((size_t)(m * k) + 15) & ~(size_t)15, scales = (size_t)(m * (k / QB));
    if (gmm || igmma) scales = (scales + 15) & ~(size_t)15;
    size_t digits = igmma ? (size_t)di_cuda_gemm_igmma_scratch(m, k) : gmm ? (size_t)di_cuda_gemm_mma_scratch(fp4, m, k, n) : 0;
    int rc = di_cuda_workspace(be, codes + scales + digits, &wsp, err);
    if (rc) return rc;
    uint8_t *xq = (uint8_t *)wsp, *xs = xq + codes; /* e4m3 [m, k], E8M0 [m, k/32] */
    uint8_t *xd = xs + scales;                      /* mma: s8 x digit planes (cuda_gemm_mma.cuh), split-K planes */
    cudaStream_t st = di_cuda_state(be)->stream;
    rc = di_cuda_act_quant_fp8(x, m * k, QB, xq, xs, st, err);
    if (rc) return rc;
    if (dmma) return di_cuda_gemm_dmma_run(xq, xs, m, k, w, wsc, n, y, st, err);
    if (igmma) return di_cuda_gemm_igmma_run(fp4, xq, xs, m, k, w, wsc, n, y, xd, st, err);
    /* the MXFP4 GEMV with its block sums on the int8 tensor cores, the same results as the CUDA-core
     * GEMV below (cuda_gemv_mma.cuh; DI_CUDA_GEMV=simt takes that one) */
    if (variant == 0 && fp4 && di_cuda_gemv_mma_enabled() && di_cuda_gemv_mma_fits(m, k, w, wsc))
        return di_cuda_gemv_mma_run(xq, xs, m, k, w, wsc, n, y, st, err);
    if (variant == 0 && !gmm && m <= GV_MAX_M && gv_smem(fp4, 4, k) <= 200 * 1024) {
        gv_args a = {xq, xs, w, wsc, n, k};
        return gv_linear(fp4, a, m, y, st, op, err);
    }
    if (gmm) return di_cuda_gemm_mma_run(fp4, xq, xs, m, k, w, wsc, n, y, xd, st, err);
    size_t pb_bytes = sizeof(float) * (size_t)(m * (k / QB));
    if (variant == 1 && m <= GEMV_MAX_M && pb_bytes <= 48 * 1024) {
        qgemv_kernel<<<(unsigned)n, GEMV_THREADS, pb_bytes, st>>>(xq, xs, w, wsc, fp4, (int)m, n, k, y);
        return di_cuda_launched(op, err);
    }
    dim3 grid(di_cuda_blocks(n, QTN), di_cuda_blocks(m, QTM));
    qgemm_kernel<<<grid, 256, 0, st>>>(xq, xs, w, wsc, fp4, m, n, k, y);
    return di_cuda_launched(op, err);
}

extern "C" int di_cuda_linear_fp8(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                                  const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    return qlinear_v(be, 0, 0, x, m, k, w, ws, n, y, err);
}

extern "C" int di_cuda_linear_fp4(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                                  const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    return qlinear_v(be, 1, 0, x, m, k, w, ws, n, y, err);
}

extern "C" int di_cuda_linear_q_part1(const di_backend *be, int fp4, const uint16_t *x, int64_t m, int64_t k,
                                      const uint8_t *w, const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    return qlinear_v(be, fp4 ? 1 : 0, 1, x, m, k, w, ws, n, y, err);
}


/* The decode GEMV alone on act-quantized rows (xq e4m3 [m, k], xs E8M0 [m, k/32], device; m ≤ 16):
 * the bench separates it from the act-quant launch with this. */
extern "C" int di_cuda_gemv_codes(const di_backend *be, int fp4, const uint8_t *xq, const uint8_t *xs, int64_t m,
                                  int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    if (m < 1 || m > GV_MAX_M || n < 1 || k <= 0 || k % QB)
        return di_error_set(err, DI_ERR_INVALID, "cuda gemv_codes: M %lld (1..%d), N %lld, K %lld", (long long)m, GV_MAX_M,
                            (long long)n, (long long)k);
    gv_args a = {xq, xs, w, ws, n, k};
    return gv_linear(fp4, a, m, y, di_cuda_state(be)->stream, "gemv_codes", err);
}

/* ---- bench references: the SM clock and a plain streaming read ---- */
__global__ void clock_probe_kernel(long long cycles, long long *out) {
    long long t0 = clock64(), t;
    do t = clock64(); while (t - t0 < cycles);
    if (threadIdx.x == 0) *out = t - t0;
}

/* SM clock in MHz: one CTA spins `cycles` SM cycles, timed with events. */
extern "C" double di_cuda_sm_clock_mhz(void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    long long *d;
    cudaEvent_t a, b;
    if (cudaMalloc(&d, sizeof *d) != cudaSuccess) return 0;
    cudaEventCreate(&a), cudaEventCreate(&b);
    float ms = 0;
    const long long cyc = 20000000;
    cudaEventRecord(a, st);
    clock_probe_kernel<<<1, 32, 0, st>>>(cyc, d);
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    cudaFree(d), cudaEventDestroy(a), cudaEventDestroy(b);
    return ms > 0 ? cyc / (ms * 1e3) : 0;
}

__global__ void stream_read_kernel(const uint4 *p, int64_t n, unsigned *sink) {
    uint32_t acc = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* keeps the loads */
}

/* Reads `bytes` (a multiple of 16) once with 16-byte loads, 132 × 8 CTAs of 256 threads. */
extern "C" void di_cuda_stream_read(const void *p, int64_t bytes, unsigned *sink, void *stream) {
    stream_read_kernel<<<132 * 8, 256, 0, (cudaStream_t)stream>>>((const uint4 *)p, bytes / 16, sink);
}

/* ---------------- bf16 ---------------- */
#define BL 16 /* partial-sum lanes = K chunk */
#define BTN 32
#define BTM 8

/* x bf16 [M, ldx], w bf16 [N, ldw]; y16 bf16 or y32 f32 [M, ldy] (exactly one non-NULL). 256 threads:
 * thread t owns column t % 32 and row t / 32 of the tile and keeps that output's 16 lanes in
 * registers. */
__global__ void __launch_bounds__(256) bgemm_kernel(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw,
                                                    int64_t M, int64_t N, int64_t K, uint16_t *y16, float *y32,
                                                    int64_t ldy, int64_t gx, int64_t gw, int64_t gy) {
    /* blockIdx.z = group of a grouped GEMM: its x, w and y start gx, gw, gy elements further */
    x += blockIdx.z * gx, w += blockIdx.z * gw;
    if (y16) y16 += blockIdx.z * gy;
    else y32 += blockIdx.z * gy;
    __shared__ float xs[BTM][BL];      /* f32 [8, 16] x chunk */
    __shared__ float wsm[BTN][BL + 1]; /* f32 [32, 16 (+1 pad)] weight chunk */
    const int t = threadIdx.x, nl = t % BTN, ml = t / BTN;
    const int64_t m0 = (int64_t)blockIdx.y * BTM, n0 = (int64_t)blockIdx.x * BTN;
    const int64_t m = m0 + ml, n = n0 + nl, K16 = K - K % BL;
    float a[BL];
#pragma unroll
    for (int l = 0; l < BL; l++) a[l] = 0.0f;
    for (int64_t k0 = 0; k0 < K16; k0 += BL) {
        if (t < BTM * BL) {
            int r = t / BL, c = t % BL;
            xs[r][c] = m0 + r < M ? d_bf16(x[(m0 + r) * ldx + k0 + c]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int idx = t + 256 * j, r = idx / BL, c = idx % BL;
            wsm[r][c] = n0 + r < N ? d_bf16(w[(n0 + r) * ldw + k0 + c]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int l = 0; l < BL; l++) a[l] = __fadd_rn(a[l], __fmul_rn(xs[ml][l], wsm[nl][l]));
        __syncthreads();
    }
    if (m >= M || n >= N) return;
#pragma unroll
    for (int half = BL / 2; half >= 1; half /= 2)
#pragma unroll
        for (int l = 0; l < half; l++) a[l] = __fadd_rn(a[l], a[l + half]);
    float s = a[0];
    for (int64_t k = K16; k < K; k++) s = __fadd_rn(s, __fmul_rn(d_bf16(x[m * ldx + k]), d_bf16(w[n * ldw + k])));
    if (y16)
        y16[m * ldy + n] = d_to_bf16(s);
    else
        y32[m * ldy + n] = s;
}

static int bgemm(const di_backend *be, const char *op, const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw,
                 int64_t m, int64_t n, int64_t k, uint16_t *y16, float *y32, int64_t ldy, int groups, int64_t gx,
                 int64_t gw, int64_t gy, di_error *err) {
    if (m < 0 || n < 0 || k < 0 || groups < 1 || groups > 65535)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: M %lld, N %lld, K %lld, %d groups", op, (long long)m,
                            (long long)n, (long long)k, groups);
    if (m == 0 || n == 0) return DI_OK;
    dim3 grid(di_cuda_blocks(n, BTN), di_cuda_blocks(m, BTM), (unsigned)groups);
    bgemm_kernel<<<grid, 256, 0, di_cuda_state(be)->stream>>>(x, ldx, w, ldw, m, n, k, y16, y32, ldy, gx, gw, gy);
    return di_cuda_launched(op, err);
}

extern "C" int di_cuda_linear_bf16(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                                   int64_t n, uint16_t *y, di_error *err) {
    return bgemm(be, "linear_bf16", x, k, w, k, m, n, k, y, NULL, n, 1, 0, 0, 0, err);
}

extern "C" int di_cuda_linear_f32(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                                  int64_t n, float *y, di_error *err) {
    return bgemm(be, "linear_f32", x, k, w, k, m, n, k, NULL, y, n, 1, 0, 0, 0, err);
}

/* einsum("bsgd,grd->bsgr"): group g reads its own slice of x and its own rows of w (one launch, the
 * groups on gridDim.z). */
extern "C" int di_cuda_linear_grouped_bf16(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                                           const uint16_t *w, int64_t r, uint16_t *y, di_error *err) {
    return bgemm(be, "linear_grouped_bf16", x, (int64_t)g * k, w, k, m, r, k, y, NULL, (int64_t)g * r, g, k, r * k, r,
                 err);
}
