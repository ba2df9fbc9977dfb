/* moe_routed's expert projections as a grouped GEMM on the int8 tensor cores, for steps whose experts take
 * several rows each (decode batches, DSpark verification): the same contract and the same bits as the
 * expert GEMVs of cuda_gemv_mma.cuh (linear_q.c: each 32-value block's exact Σ q_x·q_w rounded once to f32,
 * times s_x, times s_w, the block values added to an f32 accumulator in ascending block order), with each
 * expert's weights read once per pass of up to 16 rows instead of once per 4 rows, and the per-block
 * promotion done in the MMA's accumulator layout instead of through shared memory.
 *
 * Rows. A pre-pass writes the ranked rows' x digit planes (s8 [P][3][K]: X = x·2^9 = d0 + 2^7·d1 + 2^14·d2,
 * gvm_x_digits) and s_x·2^−10 (f32 [K/32][P], gvm_x_scale). A pass is up to 16 consecutive ranks of one
 * expert (the plan's groups cut into passes of MOE_MM_ROWS).
 *
 * Work unit = (pass, matrix part, tile of 128 output columns); CTAs loop over the units (persistent grid),
 * consecutive units being consecutive tiles of one pass, so a pass's x rows stay in L2 while its tiles run.
 * A CTA's 8 warps own 16 output columns each; K goes through shared memory in stages of 4 blocks (cp.async,
 * 4 stages): the 128 weight rows' codes (64 bytes each, chunks swizzled), the 16 rows' three digit planes
 * and their x scales; the weight scale bytes travel 32 blocks at a time (whole sectors) into two buffers of
 * their own. Per block and warp: one ldmatrix.x4 gives a lane its code words (rows g, g+8; quarter
 * q) of two blocks; the codes become signed bytes (gvm_mm_a_frag); per n8 tile of rows, three
 * mma.m16n8k32.s8 (one per digit plane, B = the plane's 8 bytes of the lane's x row) give S_d of 2 columns ×
 * 2 rows per lane, and S = S0 + 2^7·S1 + 2^14·S2 (exact in int32) goes through gvm_block_value into the
 * lane's accumulator of that (row, column): the blocks arrive in ascending order, so the f32 adds are the
 * CPU's. Rows past the pass's count compute on a copy of its first row and are not stored. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_mma.cuh"
#include "backend/cuda/cuda_moe.cuh"

#define MM_WARPS 8
#define MM_COLS (16 * MM_WARPS) /* output columns of a unit */
#define MM_KB 4                 /* K blocks per stage */
#define MM_STAGES 4
#define MM_WROW 64  /* weight row bytes in a stage, its four 16-byte chunks swizzled (mm_wchunk) */
#define MM_XROW 160 /* x plane row stride: 128 bytes + 32 (a half-warp's 64-bit B loads in distinct banks) */
#define MM_W_BYTES (MM_COLS * MM_WROW)
#define MM_X_BYTES (3 * MOE_MM_ROWS * MM_XROW)
#define MM_SX_BYTES (MM_KB * MOE_MM_ROWS * 4)
#define MM_STAGE_BYTES (MM_W_BYTES + MM_X_BYTES + MM_SX_BYTES)
#define MM_SWB 32   /* K blocks whose weight scale bytes travel together: one 32-byte sector per row */
#define MM_SWROW 36 /* their row stride in shared memory (+4: a warp's 8 rows g in distinct banks) */
#define MM_SW_BYTES (MM_COLS * MM_SWROW)
#define MM_SMEM (MM_STAGES * MM_STAGE_BYTES + 2 * MM_SW_BYTES) /* + two scale buffers */

/* Where chunk c (16 bytes) of weight row r lies in a stage: rows of 64 bytes with the chunk index xor-ed by
 * (r / 2) mod 4, so that the 8 rows an ldmatrix phase reads at one logical chunk fall in 8 different
 * 4-bank groups, and the 2 rows × 4 chunks that 8 consecutive threads copy cover all 32 banks. */
static __device__ __forceinline__ int mm_wchunk(int r, int c) { return r * MM_WROW + ((c ^ (r >> 1)) & 3) * 16; }

/* x digit planes and scales of the ranked rows: rank r reads x row order[r] / k (order NULL: row r) */
__global__ void moe_mm_prep_kernel(const uint8_t *xq, const uint8_t *xs, const int32_t *order, int k, int P, int64_t K,
                                   uint8_t *planes, float *sxT) {
    const int64_t KB = K / 32, nw = K / 4, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)P * nw; i += stride) {
        const int64_t r = i / nw, c = i % nw, row = order ? order[r] / k : r;
        uint32_t dig[3];
        gvm_x_digits(__ldg((const uint32_t *)(xq + row * K) + c), dig);
#pragma unroll
        for (int d = 0; d < 3; d++) *(uint32_t *)(planes + (r * 3 + d) * K + 4 * c) = dig[d];
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)P * KB; i += stride) {
        const int64_t b = i / P, r = i % P, row = order ? order[r] / k : r;
        sxT[b * P + r] = gvm_x_scale(__ldg(xs + row * KB + b));
    }
}

struct mm_args {
    const uint8_t *planes; /* s8 [P][3][K] */
    const float *sxT;      /* f32 [K/32][P] */
    int P, wi;             /* wi: table index of the first part's codes (0: w1, then w3 at 2; 4: w2) */
    int64_t K, N;
    uint16_t *y[2]; /* bf16 [P, N] by rank, one per part */
};

/* A thread's share of a stage's copies, its source pointers computed once per unit (a stage adds its
 * block offset): weight rows n0 … n0+127 (clamped to N − 1: read, never stored) — 64 bytes of codes each
 * (threads 2 × 16 bytes) —, the rows' digit planes (128 bytes of each plane of each row; rows 8–15 only when
 * the pass has them) and their x scales (threads 0–63). The weight scale bytes of 32 blocks go together,
 * a row's whole 32-byte sector at once, 4 bytes per thread (fetching only a stage's 4 bytes per row used 1/8
 * of every sector): those of blocks 0–31 with stage 0, those of blocks 32(u+1) … with stage 8u + 4, into
 * the buffer of parity u + 1, which the warps last read in stages 8u − 8 … 8u − 1. */
struct mm_copies {
    const uint8_t *w[2], *x[2], *ws;
    const float *sx;
    int wdst[2], xdst[2];
    int64_t n0;
    bool has_x[2], has_sx;

    __device__ __forceinline__ void init(const mm_args &a, const uint8_t *wt, const uint8_t *wst, int64_t n0, int64_t r0,
                                         int rows) {
        const int tid = threadIdx.x;
        const int64_t rowb = a.K / 2;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = tid + h * MM_WARPS * 32, r = i >> 2, c = i & 3;
            w[h] = wt + min(n0 + r, a.N - 1) * rowb + c * 16, wdst[h] = mm_wchunk(r, c);
            const int cx = i & 7, rr = (i >> 3) % MOE_MM_ROWS, d = (i >> 3) / MOE_MM_ROWS;
            has_x[h] = i < 3 * MOE_MM_ROWS * 8 && (rows > 8 || rr < 8);
            x[h] = a.planes + ((r0 + (rr < rows ? rr : 0)) * 3 + d) * a.K + cx * 16;
            xdst[h] = MM_W_BYTES + (d * MOE_MM_ROWS + rr) * MM_XROW + cx * 16;
        }
        ws = wst, this->n0 = n0;
        const int j = tid / MOE_MM_ROWS, rr = tid % MOE_MM_ROWS;
        has_sx = tid < MM_KB * MOE_MM_ROWS, sx = a.sxT + j * a.P + r0 + (rr < rows ? rr : 0);
    }
    /* the copies of stage s (blocks 4s … 4s+3) */
    __device__ __forceinline__ void issue(const mm_args &a, int64_t s, unsigned char *sm) const {
        unsigned char *st = sm + (s % MM_STAGES) * MM_STAGE_BYTES;
        const int64_t kb0 = s * MM_KB, KB = a.K / 32, per = MM_SWB / MM_KB;
#pragma unroll
        for (int h = 0; h < 2; h++) d_cp_async16(st + wdst[h], w[h] + kb0 * 16);
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (has_x[h]) d_cp_async16(st + xdst[h], x[h] + kb0 * 32);
        if (has_sx) d_cp_async4(st + MM_W_BYTES + MM_X_BYTES + 4 * threadIdx.x, sx + kb0 * a.P);
        if (s == 0 || s % per == per / 2) { /* the weight scales of 32 blocks: those of u = 0, or of u = s / 8 + 1 */
            const int64_t u = s == 0 ? 0 : s / per + 1, b = u * MM_SWB + 4 * (threadIdx.x & 7);
            unsigned char *sb = sm + MM_STAGES * MM_STAGE_BYTES + (u & 1) * MM_SW_BYTES;
            if (b < KB)
#pragma unroll
                for (int h = 0; h < MM_COLS / 32; h++) {
                    const int r = (int)(threadIdx.x >> 3) + 32 * h;
                    d_cp_async4(sb + r * MM_SWROW + 4 * (threadIdx.x & 7), ws + min(n0 + r, a.N - 1) * KB + b);
                }
        }
    }
};

/* one unit: rows r0 … r0+rows−1 (rank order) × output columns n0 … n0+127 of weight w / ws → y */
static __device__ __forceinline__ void mm_unit(const mm_args &a, const uint8_t *w, const uint8_t *ws, int64_t n0,
                                               int64_t r0, int rows, uint16_t *y, unsigned char *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t NS = a.K / 32 / MM_KB;
    const int nt = (rows + 7) / 8; /* n8 tiles holding rows (warp-uniform) */
    float acc[2][4];
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[t][e] = 0.0f;
    mm_copies cp;
    cp.init(a, w, ws, n0, r0, rows);
#pragma unroll
    for (int s = 0; s < MM_STAGES - 1; s++) {
        if (s < NS) cp.issue(a, s, sm);
        d_cp_commit();
    }
    /* this lane's ldmatrix row: matrix lane / 8 = (rows 0–7 | 8–15) × (block j | j + 1) of the warp's 16 */
    const int lrow = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), lblk = lane >> 4;
    for (int64_t s = 0; s < NS; s++) {
        d_cp_wait<MM_STAGES - 2>();
        __syncthreads(); /* stage s landed for every thread; stage s − 1's buffer is free */
        if (s + MM_STAGES - 1 < NS) cp.issue(a, s + MM_STAGES - 1, sm);
        d_cp_commit();
        const unsigned char *st = sm + (s % MM_STAGES) * MM_STAGE_BYTES, *xsm = st + MM_W_BYTES;
        const float *sx = (const float *)(xsm + MM_X_BYTES);
        /* the stage's 4 scale bytes of rows g and g+8: word s mod 8 of the buffer of s / 8 */
        const unsigned char *sb = sm + MM_STAGES * MM_STAGE_BYTES + ((s / (MM_SWB / MM_KB)) & 1) * MM_SW_BYTES +
                                  4 * (s % (MM_SWB / MM_KB));
        const uint32_t swg = *(const uint32_t *)(sb + (16 * warp + g) * MM_SWROW),
                       sw8 = *(const uint32_t *)(sb + (16 * warp + g + 8) * MM_SWROW);
#pragma unroll
        for (int jp = 0; jp < MM_KB; jp += 2) {
            uint32_t r[4]; /* rows g, g+8 of block jp; rows g, g+8 of block jp + 1 */
            d_ldsm_x4(r, st + mm_wchunk(lrow, jp + lblk));
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const int j = jp + jj;
                uint32_t af[4];
                gvm_mm_a_frag(r[2 * jj], r[2 * jj + 1], af);
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    if (t >= nt) continue;
                    int32_t c[3][4];
#pragma unroll
                    for (int d = 0; d < 3; d++) {
                        const uint2 b = *(const uint2 *)(xsm + (d * MOE_MM_ROWS + 8 * t + g) * MM_XROW + j * 32 + 8 * q);
                        c[d][0] = c[d][1] = c[d][2] = c[d][3] = 0;
                        gvm_mma(c[d], af, b.x, b.y);
                    }
                    const float2 sxr = *(const float2 *)(sx + j * MOE_MM_ROWS + 8 * t + 2 * q); /* rows 2q, 2q+1 */
#pragma unroll
                    for (int e = 0; e < 4; e++) { /* C: (column g | g+8) × (row 2q | 2q+1) */
                        const int32_t S = gvm_mm_sum(c[0][e], c[1][e], c[2][e]);
                        const uint32_t swb = ((e >> 1 ? sw8 : swg) >> (8 * j)) & 0xffu;
                        acc[t][e] = __fadd_rn(acc[t][e], gvm_block_value(S, e & 1 ? sxr.y : sxr.x, swb));
                    }
                }
            }
        }
    }
    d_cp_wait<0>();
    __syncthreads(); /* every warp is done with the buffers before the next unit's first copies */
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int xr = 8 * t + 2 * q + (e & 1);
            const int64_t n = n0 + 16 * warp + g + 8 * (e >> 1);
            if (t < nt && xr < rows && n < a.N) y[(r0 + xr) * a.N + n] = d_to_bf16(acc[t][e]);
        }
}

template <int PARTS>
__global__ void __launch_bounds__(MM_WARPS * 32) moe_mm_kernel(const __grid_constant__ moe_table tab, moe_plan pl,
                                                                 mm_args a) {
    extern __shared__ uint4 mm_sm[];
    const int ng = *pl.n_groups;
    const int64_t ntiles = (a.N + MM_COLS - 1) / MM_COLS, U = (int64_t)pl.g_pass2[ng] * PARTS * ntiles;
    for (int64_t u = blockIdx.x; u < U; u += gridDim.x) {
        const int64_t tile = u % ntiles;
        const int part = (int)(u / ntiles % PARTS), pass = (int)(u / (ntiles * PARTS));
        int lo = 0, hi = ng - 1; /* the last group with g_pass2[g] ≤ pass: one with passes, pass < g_pass2[g + 1] */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (pl.g_pass2[mid] <= pass) lo = mid;
            else hi = mid - 1;
        }
        const int e = pl.g_expert[lo], c0 = (pass - pl.g_pass2[lo]) * MOE_MM_ROWS;
        const int rows = min(MOE_MM_ROWS, pl.g_count[lo] - c0);
        mm_unit(a, tab.p[e][a.wi + 2 * part], tab.p[e][a.wi + 2 * part + 1], tile * MM_COLS, pl.g_start[lo] + c0, rows,
                part ? a.y[1] : a.y[0], (unsigned char *)mm_sm);
    }
}

size_t moe_mm_planes_bytes(int P, int64_t K) { return 3 * (size_t)P * (size_t)K; }
size_t moe_mm_scales_bytes(int P, int64_t K) { return 4 * (size_t)P * (size_t)(K / 32); }

/* CTAs per SM the kernel reaches (shared memory: 3), asked once per instantiation */
template <int PARTS>
static int mm_grid(int64_t units) {
    static int occ = 0;
    if (!occ) {
        cudaFuncSetAttribute(moe_mm_kernel<PARTS>, cudaFuncAttributeMaxDynamicSharedMemorySize, MM_SMEM);
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_mm_kernel<PARTS>, MM_WARPS * 32, MM_SMEM) !=
                cudaSuccess ||
            occ < 1)
            occ = 1;
    }
    const int64_t v = (int64_t)occ * di_cuda_sm_count();
    return (int)(units < v ? units : v);
}

int moe_mm_run(const moe_table &tab, const moe_plan &pl, int P, int k, int down, const uint8_t *xq, const uint8_t *xs,
               int64_t d, int64_t inter, uint8_t *planes, float *sxT, uint16_t *y0, uint16_t *y1, cudaStream_t st,
               di_error *err) {
    const int64_t K = down ? inter : d, N = down ? d : inter;
    const int64_t work = (int64_t)P * (K / 4), most_ctas = (int64_t)di_cuda_sm_count() * 64;
    moe_mm_prep_kernel<<<(unsigned)(work < most_ctas * 256 ? di_cuda_blocks(work, 256) : most_ctas), 256, 0, st>>>(
        xq, xs, down ? NULL : pl.order, k, P, K, planes, sxT);
    int rc = di_cuda_launched("moe_routed mm prep", err);
    if (rc) return rc;
    const mm_args a = {planes, sxT, P, down ? 4 : 0, K, N, {y0, y1}};
    const int64_t ntiles = (N + MM_COLS - 1) / MM_COLS, most = (int64_t)P * ntiles; /* passes ≤ P */
    if (down) moe_mm_kernel<1><<<mm_grid<1>(most), MM_WARPS * 32, MM_SMEM, st>>>(tab, pl, a);
    else moe_mm_kernel<2><<<mm_grid<2>(2 * most), MM_WARPS * 32, MM_SMEM, st>>>(tab, pl, a);
    return di_cuda_launched(down ? "moe_routed mm down" : "moe_routed mm up", err);
}
