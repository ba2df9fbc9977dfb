/* Exact bf16 × bf16 GEMMs, f32 accumulation (spec §5.1: wo_a, compressors, router, indexer, LM head):
 * y = x · Wᵀ bit-identical to src/backend/cpu/linear_bf16.c.
 *
 * The CPU's order per output (m, n): 16 f32 lanes, lane l summing x[k]·w[k] for k ≡ l (mod 16) in
 * ascending k, each product rounded to f32 before its add; then the tree (l, l+8), (l, l+4), (l, l+2),
 * (l, l+1); then the K % 16 tail added in order; bf16 outputs rounded once at the end. A lane's sum is
 * sequential, so K cannot be split inside a lane: the parallelism is outputs × 16 lanes. Both kernels
 * give each (output, lane) chain to exactly one thread and combine the 16 chains with the tree above:
 *
 *  - Tiled (prefill; di_bgemm_auto_gemv false): a 256-thread block owns a 64 × 32 output tile. Warp j
 *    holds lanes j and j + 8 of every output of the tile, thread (r, c) of the warp rows 4r … 4r + 3 and
 *    32 + 4r … 32 + 4r + 3 and columns 4c … 4c + 3 and 16 + 4c … 16 + 4c + 3, so it keeps 2 × 64
 *    accumulators. The threads of a warp read the same k: their x rows are 8 distinct 16-byte words on
 *    distinct banks and their w columns 4, one shared-memory wavefront per vector load (a warp whose
 *    threads took different lanes of the same outputs read 16 distinct words per load, four wavefronts:
 *    the shared-memory pipe, not the FFMAs, was the bound). x and w stream through shared memory as f32,
 *    k-major ([k][m] and [k][n]), TKC k per stage, double-buffered with the next stage's global loads
 *    held in registers. At the end each thread adds its two lanes (the tree's (l, l+8) step), and the
 *    rest of the tree crosses warps through shared memory: warps 4–7 hand their sums to warps 0–3
 *    ((l, l+4)), warps 2–3 to 0–1 ((l, l+2)), warp 1 to warp 0 ((l, l+1)), which adds the K % 16 tail
 *    and stores the tile.
 *  - GEMV (decode, M <= DI_BGEMV_MAX_M, and tiled grids smaller than the GPU): a block owns 16 columns; thread t is lane t % 16 of column
 *    t / 16 and keeps one chain per row (≤ 16). K streams through shared memory in 1024-wide chunks
 *    (16-byte loads, the next chunk in registers while this one is summed), so every weight is read
 *    from HBM once per block row-group. Shuffles xor 8, 4, 2, 1 inside each 16-thread half-warp are
 *    the CPU tree; thread l then owns row l for the tail and the store. When the columns alone give
 *    fewer than two blocks per SM, the rows are split over blocks too (weights then re-read from L2).
 *
 * FMA fast path (tiled kernel; DI_CUDA_BF16=nofma turns it off): the CPU computes fl(fl(x·w) + a).
 * For bf16 x and w the exact product has at most 16 significant bits, so fl(x·w) = x·w whenever x·w
 * is zero or a finite normal f32, and then fl(fl(x·w) + a) = fl(x·w + a) = fmaf(x, w, a) for every a
 * (±0, ±inf and NaN accumulators included; inf/NaN operands give the same inf/NaN both ways). That
 * holds when every nonzero finite x and w lies in [2^-63, 2^63): products then lie in [2^-126, 2^126).
 * A pre-pass flags each x row and each w row whose elements all satisfy this (zeros, inf and NaN
 * allowed); a block whose rows and columns are all flagged runs one FFMA per term, any other block the
 * multiply-then-add pair. Real activations and weights are far inside the range; the tests put bf16
 * subnormals, 1e±37 and inf/NaN into some rows to exercise both paths against the CPU.
 *
 * Everything the CPU rounds separately is written __fmul_rn / __fadd_rn (and -fmad=false, cuda.mk).
 *
 * Host emulation: built with -DDI_CUDA_BF16_EMULATE by a C++ compiler, this same source runs on the CPU
 * (cuda_gemm_bf16_emu.h: the block's threads as fibers, a barrier round per __syncthreads / shuffle / vote), driven
 * by tests/emu/test_cuda_gemm_bf16_emu.c against the CPU op. */
#ifdef DI_CUDA_BF16_EMULATE
#include "backend/cuda/cuda_gemm_bf16_emu.h"
#else
#include "backend/cuda/cuda_common.cuh"
#define DI_LAUNCH(kernel, grid, threads, smem, stream, ...) kernel<<<grid, threads, smem, stream>>>(__VA_ARGS__)
#endif
#include "backend/cuda/cuda_gemm_bf16.h"

#define LANES 16 /* the CPU's partial sums per dot product */

/* ---------------- shared helpers ---------------- */

/* bf16 pair in one 32-bit word: element 2i in the low half (little-endian memory order) */
static __device__ __forceinline__ float lo_bf16(uint32_t u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float hi_bf16(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

/* Eight bf16 from p[0..7] as 16 bytes: one vector load when vec (16-byte aligned), else scalar loads. */
static __device__ __forceinline__ uint4 load8(const uint16_t *p, bool vec) {
    if (vec) return *(const uint4 *)p;
    uint4 r;
    r.x = (uint32_t)p[0] | (uint32_t)p[1] << 16;
    r.y = (uint32_t)p[2] | (uint32_t)p[3] << 16;
    r.z = (uint32_t)p[4] | (uint32_t)p[5] << 16;
    r.w = (uint32_t)p[6] | (uint32_t)p[7] << 16;
    return r;
}

/* The CPU's tail: the K % 16 terms after the tree, in order, multiply then add. */
static __device__ __forceinline__ float tail_terms(float s, const uint16_t *xr, const uint16_t *wr, int64_t k16,
                                                   int64_t k) {
    for (int64_t i = k16; i < k; i++) s = __fadd_rn(s, __fmul_rn(d_bf16(xr[i]), d_bf16(wr[i])));
    return s;
}

/* ---------------- FMA range pre-pass ---------------- */

/* flag[r·groups + z] = 1 when row r of group z (p + r·ld + z·gz, k elements) is d_bf16_fma_safe throughout.
 * One warp per (row, group). */
__global__ void __launch_bounds__(256) range_flags_kernel(const uint16_t *p, int64_t rows, int groups, int64_t ld,
                                                          int64_t gz, int64_t k, int vec, uint8_t *flag) {
    const int64_t idx = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const bool live = idx < rows * groups; /* warps past the end vote on nothing (no early exit before a vote) */
    const uint16_t *row = p + (live ? (idx / groups) * ld + (idx % groups) * gz : 0);
    bool ok = true;
    const int64_t k8 = !live ? 0 : vec ? k - k % 8 : 0, kend = live ? k : 0;
    for (int64_t i = (int64_t)lane * 8; i < k8; i += 256) {
        uint4 v = *(const uint4 *)(row + i);
        ok &= d_bf16_fma_safe(v.x) & d_bf16_fma_safe(v.x >> 16) & d_bf16_fma_safe(v.y) &
              d_bf16_fma_safe(v.y >> 16) & d_bf16_fma_safe(v.z) & d_bf16_fma_safe(v.z >> 16) &
              d_bf16_fma_safe(v.w) & d_bf16_fma_safe(v.w >> 16);
    }
    for (int64_t i = k8 + lane; i < kend; i += 32) ok &= d_bf16_fma_safe(row[i]);
    ok = __all_sync(0xffffffffu, ok);
    if (live && lane == 0) flag[idx] = ok;
}

/* ---------------- tiled kernel (prefill) ---------------- */
#define TBM 64        /* rows (tokens) per block */
#define TBN 32        /* columns per block */
/* k per shared stage: eight 16-wide lane chunks. The next stage's global loads fly while this one is
 * summed; 64 k per stage left them exposed (H200, 2026-12-02, wo_a M 8192: 22.9 ms at 64, 20.6 at 128) */
#define TKC 128
#define TXP (TBM + 4) /* padded pitch of the k-major x tile (16-byte aligned rows) */
#define TWP (TBN + 4)
#define TTHREADS 256
#define XVEC (TBM * TKC / 8 / TTHREADS) /* 16-byte x vectors per thread and stage (4) */
#define WVEC (TBN * TKC / 8 / TTHREADS) /* 16-byte w vectors per thread and stage (2) */
#define XKSTEP (TTHREADS / TBM * 8)     /* k between a thread's x vectors */
#define WKSTEP (TTHREADS / TBN * 8)
static_assert(XVEC >= 1 && WVEC >= 1 && XVEC * TTHREADS * 8 == TBM * TKC && WVEC * TTHREADS * 8 == TBN * TKC,
              "the staging gives every thread whole x and w vectors");
#define TSMEM_STAGES (sizeof(float) * 2 * TKC * (TXP + TWP)) /* both tiles, double-buffered */
#define TSMEM_TREE (sizeof(float) * 4 * TBM * TWP)             /* the tree's hand-over: 4 warps' sums */
#define TSMEM (TSMEM_STAGES > TSMEM_TREE ? TSMEM_STAGES : TSMEM_TREE) /* dynamic shared memory */
#ifdef DI_CUDA_BF16_EMULATE
alignas(16) float tsm[TSMEM / sizeof(float)]; /* the emulation's shared memory (one block at a time) */
#endif

/* One stage's products for this thread: lanes j (h = 0) and j + 8 (h = 1) of its 8 × 8 outputs (rows
 * xm … xm + 3 and xm + 32 …, columns wn … wn + 3 and wn + 16 …), the stage's 16-chunks in ascending k.
 * FMA: one fused op per term (see the file comment for when it is exact); otherwise the CPU's multiply
 * then add. */
/* the tile row of this thread's output row i (0 … 7) and the tile column of its column c */
static __device__ __forceinline__ int tile_row(int xm, int i) { return xm + (i & 3) + (i >> 2) * (TBM / 2); }
static __device__ __forceinline__ int tile_col(int wn, int c) { return wn + (c & 3) + (c >> 2) * (TBN / 2); }

template <bool FMA>
static __device__ __forceinline__ void tile_stage(const float (*xs)[TXP], const float (*ws)[TWP], int chunks, int j,
                                                  int xm, int wn, float (&acc)[2][8][8]) {
#pragma unroll
    for (int c = 0; c < TKC / LANES; c++) {
        if (c >= chunks) break;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int k = c * LANES + j + 8 * h;
            const float4 xa = *(const float4 *)&xs[k][xm], xb = *(const float4 *)&xs[k][xm + TBM / 2];
            const float4 wa = *(const float4 *)&ws[k][wn], wb = *(const float4 *)&ws[k][wn + TBN / 2];
            const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            const float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int q = 0; q < 8; q++)
                    acc[h][i][q] = FMA ? __fmaf_rn(xv[i], wv[q], acc[h][i][q])
                                       : __fadd_rn(acc[h][i][q], __fmul_rn(xv[i], wv[q]));
        }
    }
}

/* k-major f32 store of 8 consecutive k of one row (element e at tile[k0 + e][r]) */
template <int P>
static __device__ __forceinline__ void store8_kmajor(float (*tile)[P], int k0, int r, uint4 v) {
    tile[k0 + 0][r] = lo_bf16(v.x), tile[k0 + 1][r] = hi_bf16(v.x);
    tile[k0 + 2][r] = lo_bf16(v.y), tile[k0 + 3][r] = hi_bf16(v.y);
    tile[k0 + 4][r] = lo_bf16(v.z), tile[k0 + 5][r] = hi_bf16(v.z);
    tile[k0 + 6][r] = lo_bf16(v.w), tile[k0 + 7][r] = hi_bf16(v.w);
}

/* A stage's global loads into registers: x row xrow_p (vectors at k0 + xk + i·XKSTEP) and w row wrow_p
 * (k0 + wk + i·WKSTEP); rows past M / N and vectors at or past K16 (never summed) are zero. */
static __device__ __forceinline__ void tile_load(uint4 (&xv)[XVEC], uint4 (&wv)[WVEC], const uint16_t *xrow_p,
                                                 const uint16_t *wrow_p, bool xin, bool win, int xk, int wk,
                                                 int64_t k0, int64_t K16, int vec) {
    const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < XVEC; i++) {
        const int64_t k = k0 + xk + i * XKSTEP;
        xv[i] = xin && k < K16 ? load8(xrow_p + k, vec) : zero4;
    }
#pragma unroll
    for (int i = 0; i < WVEC; i++) {
        const int64_t k = k0 + wk + i * WKSTEP;
        wv[i] = win && k < K16 ? load8(wrow_p + k, vec) : zero4;
    }
}

static __device__ __forceinline__ void tile_store(float (*xs)[TXP], float (*ws)[TWP], const uint4 (&xv)[XVEC],
                                                  const uint4 (&wv)[WVEC], int xr, int wr, int xk, int wk) {
#pragma unroll
    for (int i = 0; i < XVEC; i++) store8_kmajor<TXP>(xs, xk + i * XKSTEP, xr, xv[i]);
#pragma unroll
    for (int i = 0; i < WVEC; i++) store8_kmajor<TWP>(ws, wk + i * WKSTEP, wr, wv[i]);
}

/* x bf16 [M, ldx], w bf16 [N, ldw] (+ z·gx, z·gw for group z = blockIdx.z); y16 bf16 / y32 f32 [M, ldy]
 * (+ z·gy). xok u8 [M·groups], wok u8 [N·groups]: the FMA pre-pass flags, or NULL (multiply-then-add).
 * vec: x, w, ldx, ldw, gx, gw allow 16-byte loads. */
__global__ void __launch_bounds__(TTHREADS, 1)
    bgemm_tiled_kernel(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw, int64_t M, int64_t N, int64_t K,
                       uint16_t *y16, float *y32, int64_t ldy, int64_t gx, int64_t gw, int64_t gy, const uint8_t *xok,
                       const uint8_t *wok, int vec) {
    extern __shared__ __align__(16) float tsm[];
    float(*xs)[TKC][TXP] = (float(*)[TKC][TXP])tsm;                 /* f32 [2 buffers][TKC k][64 rows (+4)] */
    float(*ws)[TKC][TWP] = (float(*)[TKC][TWP])(tsm + 2 * TKC * TXP); /* f32 [2 buffers][TKC k][32 cols (+4)] */
    const int z = blockIdx.z, G = gridDim.z, t = threadIdx.x;
    x += z * gx, w += z * gw;
    if (y16) y16 += z * gy;
    else y32 += z * gy;
    const int64_t m0 = (int64_t)blockIdx.y * TBM, n0 = (int64_t)blockIdx.x * TBN;
    const int64_t K16 = K - K % LANES;

    /* lanes j and j + 8 of this warp; this thread's rows xm + {0..3, 32..35}, columns wn + {0..3, 16..19} */
    const int j = t / 32, xm = (t % 32) / 4 * 4, wn = t % 4 * 4;

    /* the block takes the FMA path only if all its x rows and w rows passed the range pre-pass */
    int ok = xok != NULL;
    if (xok) {
        if (t < TBM && m0 + t < M) ok = xok[(m0 + t) * G + z];
        else if (t >= TBM && t < TBM + TBN && n0 + (t - TBM) < N) ok = wok[(n0 + (t - TBM)) * G + z];
    }
    const bool fast = __syncthreads_and(ok);

    /* global → register → shared staging: thread t loads x row t % 64 (k offsets xk + 32i) and w row
     * t % 32 (k offset wk); the 32 threads of a warp take 32 consecutive rows at one k offset, so the
     * transposed (k-major) stores hit 32 distinct banks */
    const int xr = t % TBM, xk = (t / TBM) * 8, wr = t % TBN, wk = (t / TBN) * 8;
    const bool xin = m0 + xr < M, win = n0 + wr < N;
    const uint16_t *xrow_p = x + (m0 + xr) * ldx, *wrow_p = w + (n0 + wr) * ldw; /* dereferenced only if in */
    uint4 xv[XVEC], wv[WVEC];
    if (K16 > 0) {
        tile_load(xv, wv, xrow_p, wrow_p, xin, win, xk, wk, 0, K16, vec);
        tile_store(xs[0], ws[0], xv, wv, xr, wr, xk, wk);
    }
    __syncthreads();

    float acc[2][8][8]; /* f32 [lane j, lane j+8][8 rows][8 cols] */
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int c = 0; c < 8; c++) acc[h][i][c] = 0.0f;

    int buf = 0;
    for (int64_t k0 = 0; k0 < K16; k0 += TKC) {
        const int64_t kn = k0 + TKC;
        /* the next stage's loads fly while this stage is summed */
        if (kn < K16) tile_load(xv, wv, xrow_p, wrow_p, xin, win, xk, wk, kn, K16, vec);
        const int chunks = K16 - k0 >= TKC ? TKC / LANES : (int)((K16 - k0) / LANES);
        if (fast) tile_stage<true>(xs[buf], ws[buf], chunks, j, xm, wn, acc);
        else tile_stage<false>(xs[buf], ws[buf], chunks, j, xm, wn, acc);
        if (kn < K16) tile_store(xs[buf ^ 1], ws[buf ^ 1], xv, wv, xr, wr, xk, wk);
        __syncthreads(); /* buf ^ 1 is complete, and nobody reads buf any more */
        buf ^= 1;
    }

    /* the tree. (l, l+8): this thread's two lanes. Then through shared memory (f32 [4][TBM][TWP]: output
     * (r, c) of slot s at [s][r][c]; the pitch puts a warp's 16-byte words on 4 wavefronts): warps 4–7
     * hand their sums to warps 0–3 ((l, l+4)), warps 2–3 to 0–1 ((l, l+2)), warp 1 to warp 0 ((l, l+1)).
     * fadd is commutative, so b_l + b_{l+4} is the CPU's value whichever warp adds. */
    float(*tree)[TBM][TWP] = (float(*)[TBM][TWP])tsm; /* the stages' buffers, free after the last barrier */
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int c = 0; c < 8; c++) acc[0][i][c] = __fadd_rn(acc[0][i][c], acc[1][i][c]);
    for (int half = 4; half >= 1; half /= 2) {
        if (j >= half && j < 2 * half)
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int hq = 0; hq < 2; hq++)
                    *(float4 *)&tree[j - half][tile_row(xm, i)][tile_col(wn, 4 * hq)] =
                        make_float4(acc[0][i][4 * hq], acc[0][i][4 * hq + 1], acc[0][i][4 * hq + 2],
                                    acc[0][i][4 * hq + 3]);
        __syncthreads();
        if (half == 1) break; /* slot 0 holds warp 1's sums; warp 0 keeps its own in registers */
        if (j < half)
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int hq = 0; hq < 2; hq++) {
                    const float4 v = *(const float4 *)&tree[j][tile_row(xm, i)][tile_col(wn, 4 * hq)];
                    acc[0][i][4 * hq] = __fadd_rn(acc[0][i][4 * hq], v.x);
                    acc[0][i][4 * hq + 1] = __fadd_rn(acc[0][i][4 * hq + 1], v.y);
                    acc[0][i][4 * hq + 2] = __fadd_rn(acc[0][i][4 * hq + 2], v.z);
                    acc[0][i][4 * hq + 3] = __fadd_rn(acc[0][i][4 * hq + 3], v.w);
                }
        __syncthreads();
    }
    /* (l, l+1) in warp 0, which holds d_0 (slot 0 has d_1), then the K % 16 tail and the store: the 32
     * threads of warp 0 cover the tile's 2,048 outputs, 64 each */
    if (j != 0) return;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int64_t m = m0 + tile_row(xm, i);
        if (m >= M) continue;
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const int tc = tile_col(wn, c);
            const int64_t n = n0 + tc;
            if (n >= N) continue;
            const float s = tail_terms(__fadd_rn(acc[0][i][c], tree[0][tile_row(xm, i)][tc]),
                                       x + m * ldx, w + n * ldw, K16, K);
            if (y16) y16[m * ldy + n] = d_to_bf16(s);
            else y32[m * ldy + n] = s;
        }
    }
}

/* ---------------- GEMV (decode) ---------------- */
#define GCOLS 16           /* columns per block */
#define GKCH 1024          /* k per shared chunk (64 terms of each lane) */
#define GWP (GKCH + 16)    /* bf16 pitch of the weight chunk: column c + 1's 16 lanes sit 8 banks past c's */
#define GXP (GKCH + 4)     /* f32 pitch of the x chunk (16-byte aligned rows; reads are broadcasts) */
#define GTHREADS (GCOLS * LANES)

static size_t gemv_smem(int rb) { return sizeof(uint16_t) * GCOLS * GWP + sizeof(float) * (size_t)rb * GXP; }
#ifdef DI_CUDA_BF16_EMULATE
alignas(16) uint16_t gsh[GCOLS * GWP + 2 * DI_BGEMV_MAX_M * GXP];
#endif

/* Chunk k0 of the GEMV's staging into registers: 16 weight rows and the block's x rows (< mb), rows
 * vr + 2i; vectors at or past K16 are not loaded (never summed). */
template <int RB>
static __device__ __forceinline__ void gv_load(uint4 (&wv)[8], uint4 (&xv)[(RB + 1) / 2], const uint16_t *x,
                                               int64_t ldx, const uint16_t *w, int64_t ldw, int64_t m0, int64_t n0,
                                               int mb, int64_t N, int64_t k0, int64_t K16, int vr, int vk, int vec) {
    const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
    const bool in = k0 + vk < K16;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = vr + 2 * i;
        wv[i] = in && n0 + r < N ? load8(w + (n0 + r) * ldw + k0 + vk, vec) : zero4;
    }
#pragma unroll
    for (int i = 0; i < (RB + 1) / 2; i++) {
        const int r = vr + 2 * i;
        xv[i] = in && r < mb ? load8(x + (m0 + r) * ldx + k0 + vk, vec) : zero4;
    }
}

/* Same operands as the tiled kernel; this block's rows m0 = blockIdx.y·RB .. + mb (mb ≤ RB ≤ 16).
 * Dynamic shared memory (gemv_smem(RB)): the weight chunk bf16 [16 cols][GWP], then the x chunk
 * f32 [RB rows][GXP]. */
template <int RB>
__global__ void __launch_bounds__(GTHREADS)
    bgemv_kernel(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw, int64_t M, int64_t N, int64_t K,
                 uint16_t *y16, float *y32, int64_t ldy, int64_t gx, int64_t gw, int64_t gy, int vec) {
    extern __shared__ __align__(16) uint16_t gsh[];
    uint16_t(*wsh)[GWP] = (uint16_t(*)[GWP])gsh;              /* bf16 [16 cols][1024 (+16)] */
    float(*xsh)[GXP] = (float(*)[GXP])(gsh + GCOLS * GWP);     /* f32 [RB rows][1024 (+4)] */
    const int z = blockIdx.z, t = threadIdx.x, l = t % LANES, col = t / LANES;
    x += z * gx, w += z * gw;
    if (y16) y16 += z * gy;
    else y32 += z * gy;
    const int64_t n0 = (int64_t)blockIdx.x * GCOLS, m0 = (int64_t)blockIdx.y * RB;
    const int mb = (int)(M - m0 < RB ? M - m0 : RB);
    const int64_t K16 = K - K % LANES;

    /* staging: vector v = t + 256·i of a chunk row block (2 rows × 128 vectors); consecutive threads read
     * consecutive 16 bytes of a row */
    const int vk = (t % (GKCH / 8)) * 8, vr = t / (GKCH / 8); /* vr 0..1, rows vr + 2i */
    uint4 wv[8], xv[(RB + 1) / 2]; /* the next chunk's weight and x vectors */
    if (K16 > 0) gv_load<RB>(wv, xv, x, ldx, w, ldw, m0, n0, mb, N, 0, K16, vr, vk, vec);

    float acc[RB]; /* f32 [row]: this thread's lane-l chain of each row */
#pragma unroll
    for (int r = 0; r < RB; r++) acc[r] = 0.0f;

    for (int64_t k0 = 0; k0 < K16; k0 += GKCH) {
        __syncthreads(); /* the previous chunk's readers are done */
#pragma unroll
        for (int i = 0; i < 8; i++) *(uint4 *)&wsh[vr + 2 * i][vk] = wv[i];
#pragma unroll
        for (int i = 0; i < (RB + 1) / 2; i++) {
            const int r = vr + 2 * i;
            if (r < mb) {
                const uint4 v = xv[i];
                *(float4 *)&xsh[r][vk] = make_float4(lo_bf16(v.x), hi_bf16(v.x), lo_bf16(v.y), hi_bf16(v.y));
                *(float4 *)&xsh[r][vk + 4] = make_float4(lo_bf16(v.z), hi_bf16(v.z), lo_bf16(v.w), hi_bf16(v.w));
            }
        }
        __syncthreads();
        const int64_t kn = k0 + GKCH;
        if (kn < K16) gv_load<RB>(wv, xv, x, ldx, w, ldw, m0, n0, mb, N, kn, K16, vr, vk, vec);
        /* lane l's terms of this chunk, ascending k; every lane runs the same count (K16 - k0 is a
         * multiple of 16), and nothing past K16 is summed */
        const int steps = (int)((K16 - k0 < GKCH ? K16 - k0 : GKCH) / LANES);
#pragma unroll 4
        for (int s = 0; s < steps; s++) {
            const int k = s * LANES + l;
            const float wf = d_bf16(wsh[col][k]);
#pragma unroll
            for (int r = 0; r < RB; r++)
                if (r < mb) acc[r] = __fadd_rn(acc[r], __fmul_rn(xsh[r][k], wf));
        }
    }

    /* the CPU tree across the 16 lane threads of the column (xor 8, 4, 2, 1 stay inside the half-warp) */
#pragma unroll
    for (int r = 0; r < RB; r++) {
        float s = acc[r];
        s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 8));
        s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 4));
        s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
        s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
        acc[r] = s;
    }
    /* lane l stores row l (a select, not a run-time register index) */
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < RB; r++)
        if (r == l) v = acc[r];
    const int64_t n = n0 + col, m = m0 + l;
    if (l >= mb || n >= N) return;
    v = tail_terms(v, x + m * ldx, w + n * ldw, K16, K);
    if (y16) y16[m * ldy + n] = d_to_bf16(v);
    else y32[m * ldy + n] = v;
}

/* One GEMV instantiation: the > 48 KiB shared-memory opt-in once per device (repeating it is harmless),
 * then the launch. */
template <int RB>
static int gemv_launch(const di_backend *be, const char *op, dim3 grid, const uint16_t *x, int64_t ldx,
                       const uint16_t *w, int64_t ldw, int64_t m, int64_t n, int64_t k, uint16_t *y16, float *y32,
                       int64_t ldy, int64_t gx, int64_t gw, int64_t gy, int vec, di_error *err) {
    static bool attr_set[64];
    const int dev = di_cuda_state(be)->device;
    if (dev < 0 || dev >= 64 || !attr_set[dev]) {
        cudaError_t e = cudaFuncSetAttribute(bgemv_kernel<RB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gemv_smem(RB));
        if (e != cudaSuccess)
            return di_error_set(err, DI_ERR_INTERNAL, "cuda %s: shared memory opt-in: %s", op, cudaGetErrorString(e));
        if (dev >= 0 && dev < 64) attr_set[dev] = true;
    }
    DI_LAUNCH(bgemv_kernel<RB>, grid, GTHREADS, gemv_smem(RB), di_cuda_state(be)->stream, x, ldx, w, ldw, m, n, k, y16,
              y32, ldy, gx, gw, gy, vec);
    return di_cuda_launched(op, err);
}

/* ---------------- host side ---------------- */

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

extern "C" int di_cuda_bgemm(const di_backend *be, const char *op, const uint16_t *x, int64_t ldx, const uint16_t *w,
                             int64_t ldw, int64_t m, int64_t n, int64_t k, uint16_t *y16, float *y32, int64_t ldy,
                             int groups, int64_t gx, int64_t gw, int64_t gy, di_bgemm_path path, di_error *err) {
    if (m < 0 || n < 0 || k < 0 || groups < 1 || groups > 65535 || (y16 == NULL) == (y32 == NULL))
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: M %lld, N %lld, K %lld, %d groups, %s output", op,
                            (long long)m, (long long)n, (long long)k, groups, y16 && y32 ? "two" : y16 || y32 ? "one" : "no");
    if (m == 0 || n == 0) return DI_OK;
    cudaStream_t st = di_cuda_state(be)->stream;
    const int vec = aligned16(x) && aligned16(w) && ldx % 8 == 0 && ldw % 8 == 0 && gx % 8 == 0 && gw % 8 == 0;
    const bool gemv = path == DI_BGEMM_GEMV || ((path == DI_BGEMM_AUTO || path == DI_BGEMM_AUTO_NOFMA) &&
                                                di_bgemm_auto_gemv(m, n, groups, di_cuda_sm_count()));

    if (gemv) {
        /* rows per block: all of them when the columns alone fill the GPU (weights then leave HBM once),
         * else split so that about two blocks per SM run (132 SMs on the H200) and the weights of the
         * small matrix are re-read from L2; rounded up to an instantiated row count */
        const int64_t cblocks = (int64_t)di_cuda_blocks(n, GCOLS) * groups;
        int64_t rb = (m * cblocks + 263) / 264;
        rb = rb < 1 ? 1 : rb > m ? m : rb;
        const int RB = rb <= 1 ? 1 : rb <= 2 ? 2 : rb <= 4 ? 4 : rb <= 8 ? 8 : 16;
        dim3 grid(di_cuda_blocks(n, GCOLS), (unsigned)((m + RB - 1) / RB), (unsigned)groups);
        if ((m + RB - 1) / RB > 65535)
            return di_error_set(err, DI_ERR_INVALID, "cuda %s: M %lld too large for the GEMV path", op, (long long)m);
        switch (RB) {
        case 1: return gemv_launch<1>(be, op, grid, x, ldx, w, ldw, m, n, k, y16, y32, ldy, gx, gw, gy, vec, err);
        case 2: return gemv_launch<2>(be, op, grid, x, ldx, w, ldw, m, n, k, y16, y32, ldy, gx, gw, gy, vec, err);
        case 4: return gemv_launch<4>(be, op, grid, x, ldx, w, ldw, m, n, k, y16, y32, ldy, gx, gw, gy, vec, err);
        case 8: return gemv_launch<8>(be, op, grid, x, ldx, w, ldw, m, n, k, y16, y32, ldy, gx, gw, gy, vec, err);
        default: return gemv_launch<16>(be, op, grid, x, ldx, w, ldw, m, n, k, y16, y32, ldy, gx, gw, gy, vec, err);
        }
    }

    dim3 grid(di_cuda_blocks(n, TBN), di_cuda_blocks(m, TBM), (unsigned)groups);
    if (grid.y > 65535)
        return di_error_set(err, DI_ERR_INVALID, "cuda %s: M %lld exceeds the tiled kernel's %d rows", op, (long long)m,
                            65535 * TBM);
    const uint8_t *xok = NULL, *wok = NULL;
    if (path == DI_BGEMM_AUTO || path == DI_BGEMM_TILED) {
        /* the FMA pre-pass: flags u8 [m·groups] for x rows, then u8 [n·groups] for w rows */
        void *wsp = NULL;
        const int64_t xrows = m * groups, wrows = n * groups;
        int rc = di_cuda_workspace(be, (size_t)(xrows + wrows), &wsp, err);
        if (rc) return rc;
        uint8_t *flags = (uint8_t *)wsp;
        DI_LAUNCH(range_flags_kernel, di_cuda_blocks(xrows, 8), 256, 0, st, x, m, groups, ldx, gx, k, vec, flags);
        DI_LAUNCH(range_flags_kernel, di_cuda_blocks(wrows, 8), 256, 0, st, w, n, groups, ldw, gw, k, vec, flags + xrows);
        if ((rc = di_cuda_launched(op, err))) return rc;
        xok = flags, wok = flags + xrows;
    }
    static bool attr_set[64]; /* the > 48 KiB shared-memory opt-in, once per device */
    const int dev = di_cuda_state(be)->device;
    if (dev < 0 || dev >= 64 || !attr_set[dev]) {
        cudaError_t e = cudaFuncSetAttribute(bgemm_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TSMEM);
        if (e != cudaSuccess)
            return di_error_set(err, DI_ERR_INTERNAL, "cuda %s: shared memory opt-in: %s", op, cudaGetErrorString(e));
        if (dev >= 0 && dev < 64) attr_set[dev] = true;
    }
    DI_LAUNCH(bgemm_tiled_kernel, grid, TTHREADS, TSMEM, st, x, ldx, w, ldw, m, n, k, y16, y32, ldy, gx, gw, gy, xok, wok,
              vec);
    return di_cuda_launched(op, err);
}

extern "C" int di_cuda_bf16_fma_flags(const di_backend *be, const uint16_t *p, int64_t rows, int64_t ld, int64_t k,
                                      uint8_t *flag, di_error *err) {
    if (rows <= 0) return DI_OK;
    const int vec = aligned16(p) && ld % 8 == 0;
    DI_LAUNCH(range_flags_kernel, di_cuda_blocks(rows, 8), 256, 0, di_cuda_state(be)->stream, p, rows, 1, ld, 0, k, vec,
              flag);
    return di_cuda_launched("bf16 fma flags", err);
}

/* ---------------- the backend slots ---------------- */

static int lin_bf16(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                    uint16_t *y, di_bgemm_path p, di_error *err) {
    return di_cuda_bgemm(be, "linear_bf16", x, k, w, k, m, n, k, y, NULL, n, 1, 0, 0, 0, p, err);
}
static int lin_f32(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                   float *y, di_bgemm_path p, di_error *err) {
    return di_cuda_bgemm(be, "linear_f32", x, k, w, k, m, n, k, NULL, y, n, 1, 0, 0, 0, p, err);
}
/* einsum("bsgd,grd->bsgr"): group g reads its own slice of x and its own rows of w (groups on gridDim.z) */
static int lin_grouped(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k, const uint16_t *w,
                       int64_t r, uint16_t *y, di_bgemm_path p, di_error *err) {
    return di_cuda_bgemm(be, "linear_grouped_bf16", x, (int64_t)g * k, w, k, m, r, k, y, NULL, (int64_t)g * r, g, k,
                         r * k, r, p, err);
}

extern "C" int di_cuda_linear_bf16_v2(const di_backend *be, const uint16_t *x, int64_t m, int64_t k,
                                      const uint16_t *w, int64_t n, uint16_t *y, di_error *err) {
    return lin_bf16(be, x, m, k, w, n, y, DI_BGEMM_AUTO, err);
}
extern "C" int di_cuda_linear_f32_v2(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                                     int64_t n, float *y, di_error *err) {
    return lin_f32(be, x, m, k, w, n, y, DI_BGEMM_AUTO, err);
}
extern "C" int di_cuda_linear_grouped_bf16_v2(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                                              const uint16_t *w, int64_t r, uint16_t *y, di_error *err) {
    return lin_grouped(be, x, m, g, k, w, r, y, DI_BGEMM_AUTO, err);
}
extern "C" int di_cuda_linear_bf16_v2_nofma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k,
                                            const uint16_t *w, int64_t n, uint16_t *y, di_error *err) {
    return lin_bf16(be, x, m, k, w, n, y, DI_BGEMM_AUTO_NOFMA, err);
}
extern "C" int di_cuda_linear_f32_v2_nofma(const di_backend *be, const uint16_t *x, int64_t m, int64_t k,
                                           const uint16_t *w, int64_t n, float *y, di_error *err) {
    return lin_f32(be, x, m, k, w, n, y, DI_BGEMM_AUTO_NOFMA, err);
}
extern "C" int di_cuda_linear_grouped_bf16_v2_nofma(const di_backend *be, const uint16_t *x, int64_t m, int g,
                                                    int64_t k, const uint16_t *w, int64_t r, uint16_t *y,
                                                    di_error *err) {
    return lin_grouped(be, x, m, g, k, w, r, y, DI_BGEMM_AUTO_NOFMA, err);
}
