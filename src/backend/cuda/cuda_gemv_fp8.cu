/* Exact FP8 decode GEMV for one or two rows, act-quant fused: y = act_quant(x) · Wᵀ with the CPU op's
 * contract (linear_q.c): per 32-wide K block the exact value of Σ q_x·q_w is rounded once to f32,
 * multiplied by s_x then s_w, and the scaled blocks are added to an f32 accumulator in ascending block
 * order. Same bits as the GEMV of cuda_gemv.cuh (and the CPU op); fewer instructions per weight byte.
 *
 * Why a second FP8 GEMV. cuda_gemv.cuh's kernel is bound by instruction issue (Nsight Compute on the
 * H200, bench/NOTES-gpu.md "Session 7"): ~15 lane instructions per weight byte, of which the per-code
 * table index (shift, scale, mask, add), a register move for the f64's zero low word, and two rounds of
 * f64 shuffles per 8-byte chunk are overhead. Here:
 *  - A lane takes 16 consecutive codes of a column's row (one 16-byte load; a warp instruction reads
 *    512 contiguous bytes), so a 32-wide block is held by a lane pair: one f64 shuffle round per block.
 *  - The e4m3 → f64 table holds the high word of each code's double (the low word is 0), one copy per
 *    lane: a code's byte offset code·256 + lane·4 is one byte permute of the weight word and the lane's
 *    offset, so a weight byte costs a permute, a 4-byte shared load, a move that zeroes the low word and
 *    a DFMA; lane l reads bank l whatever the code. (A table of whole doubles saves the move but doubles
 *    the shared-memory traffic; the shared-memory pipe then bounds the kernel: 1.15× slower, H200.)
 *  - The x rows are act-quantized by each CTA into shared memory (d_act_quant32, the codes and scales of
 *    act_quant32_kernel), which saves the act-quant launch and its round trip through global memory.
 * The block sums stay exact in f64: an e4m3 product has ≤ 8 significant bits and lies in [2^-18, 2^17.6],
 * so a 32-term sum needs ≤ 41 bits (any order gives the same f64), rounded once to f32 as the CPU does.
 *
 * Work split: a tile is NC output columns × all of K for the mt ≤ MT rows, and one warp owns a tile at a
 * time, walking K in 512-byte steps with its weights copied ahead into a private shared-memory ring
 * (cp.async, S − 1 steps in flight). After each step, lane m·NC + c adds that step's 16 block values of
 * row m, column c to its running f32 sum in block order, so the ordered sum costs no barrier and no
 * serial tail: after the prologue (table, act-quant, one barrier) warps never wait for each other. A CTA
 * per SM (the table is per CTA), warps sized so that every warp gets the same number of tiles ± 1. The
 * kernel wants many tiles (N / NC against 132 SMs × 16 warps): tiles of 1 to 8 columns by N, and weights
 * under 1024 columns keep cuda_gemv.cuh, whose warps split K. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv_fp8.h"
#include "backend/cuda/cuda_quant.cuh"

#define G8_TAB_BYTES (256 * 256) /* u32 [256 codes][64]: lanes 0..31 hold the high word of the code's double */
#define G8_STEP 512                 /* K bytes per warp step: 32 lanes × 16 codes */
#define G8_MAX_WARPS 16
#define G8_MAX_K 8192 /* shared memory at K = 8192 and 16 warps: 209 KiB (M 1, 8 columns), 186 KiB (M 2) */

/* The f64 value of code B of word v from this lane's copy of the table of high words (an e4m3 value
 * has ≤ 4 significant bits, so the low word of its double is 0): the byte permute puts lane·4 in byte 0
 * and the code in byte 1 of the offset, so entry (code, lane) sits at code·256 + lane·4 (rows of 256
 * bytes, the first 128 used) and lane l reads bank l whatever the code. */
template <int B>
static __device__ __forceinline__ double g8_val(const unsigned char *tab, uint32_t v, uint32_t lane4) {
    const uint32_t off = __byte_perm(v, lane4, 0x5504u | (B << 4));
    return __hiloint2double(*(const int *)(tab + off), 0);
}

/* the 16 codes of a uint4 as f64 */
static __device__ __forceinline__ void g8_vals(const unsigned char *tab, uint4 q, uint32_t lane4, double d[16]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        d[4 * i + 0] = g8_val<0>(tab, w[i], lane4);
        d[4 * i + 1] = g8_val<1>(tab, w[i], lane4);
        d[4 * i + 2] = g8_val<2>(tab, w[i], lane4);
        d[4 * i + 3] = g8_val<3>(tab, w[i], lane4);
    }
}

/* Shared memory of one CTA of nw warps: the table, x codes e4m3 [MT][Kp], x scales f32 [MT][KBp], then
 * per warp its block values P f32 [MT][NC][16] and its ring of S steps of weight codes [S][NC][512]. */
static __host__ __device__ size_t g8_x_bytes(int mt, int64_t k) {
    const size_t kp = (size_t)((k + G8_STEP - 1) / G8_STEP) * G8_STEP;
    return (size_t)mt * kp + sizeof(float) * (size_t)mt * (kp / 32);
}
static __host__ __device__ size_t g8_warp_bytes(int mt, int nc, int stages) {
    return sizeof(float) * (size_t)(mt * nc * 16) + (size_t)(stages * nc * G8_STEP);
}


/* a warp's place: step s (512 K bytes) of tile t; after the last step, step 0 of tile t + stride */
struct g8_pos {
    int64_t tile, s;
};

/* Copies the step's 16-byte chunk of each column into the lane's slot of a ring stage (each lane reads
 * back only what it copied: no barrier) and returns the step's weight-scale byte (NC divides 32: the
 * tile's columns share one row of 32-row scale groups). Past the last tile or past K nothing is copied
 * (the stage keeps stale codes, whose results are never used); columns past N re-read the last one.
 * Always commits one group, so the wait counts steps. */
template <int NC>
static __device__ __forceinline__ uint32_t g8_issue(const uint8_t *w, const uint8_t *wsc, int64_t N, int64_t K,
                                                    g8_pos p, int64_t ntiles, int lane, uint32_t dst) {
    const int64_t k0 = p.s * G8_STEP + lane * 16, n0 = p.tile * NC;
    uint32_t sw = 0;
    if (p.tile < ntiles && k0 < K) {
        sw = __ldg(wsc + (n0 / 32) * (K / 32) + k0 / 32);
        const int last = (int)min((int64_t)NC, N - n0) - 1;
        const uint8_t *src = w + n0 * K + k0;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            d_cp_async16(dst + c * G8_STEP, src);
            src += c < last ? K : 0;
        }
    }
    d_cp_commit();
    return sw;
}

/* Each warp owns a tile (NC columns, all of K) at a time and walks K in 512-byte steps: lanes compute
 * the step's 16 block values P_b, and lane m·NC + c adds row m / column c's values to its running f32
 * sum in block order (the CPU's sequence of adds, carried across steps), so warps never wait for each
 * other after the prologue. S ring stages keep S − 1 steps of weights in flight per warp. */
template <int MT, int NC, int S>
__global__ void __launch_bounds__(G8_MAX_WARPS * 32, 1) g8_kernel(const uint16_t *x, int mt, int64_t K,
                                                                  const uint8_t *w, const uint8_t *wsc, int64_t N,
                                                                  uint16_t *y) {
    extern __shared__ uint4 g8_sm[];
    unsigned char *tab = (unsigned char *)g8_sm;
    const int64_t KB = K / 32, nsteps = (K + G8_STEP - 1) / G8_STEP, Kp = nsteps * G8_STEP, KBp = Kp / 32;
    uint8_t *xq = (uint8_t *)g8_sm + G8_TAB_BYTES; /* e4m3 [MT][Kp] */
    float *xs = (float *)(xq + MT * Kp);            /* f32 [MT][KBp]: the decoded E8M0 scales */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const uint32_t lane4 = (uint32_t)lane * 4u;
    unsigned char *mine = (unsigned char *)g8_sm + G8_TAB_BYTES + g8_x_bytes(MT, K) + (size_t)warp * g8_warp_bytes(MT, NC, S);
    float *pv = (float *)mine;                             /* f32 [MT][NC][16]: this step's P_b */
    unsigned char *ring = mine + sizeof(float) * MT * NC * 16; /* e4m3 [S][NC][512] */
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring) + (uint32_t)lane * 16u;
    const int64_t ntiles = (N + NC - 1) / NC, stride = (int64_t)gridDim.x * nw;

    /* the first steps' weights are on their way while the table and the x codes are built */
    g8_pos ip = {(int64_t)blockIdx.x * nw + warp, 0}; /* the next step to issue */
    uint32_t sw_ring[S - 1];                          /* the scale bytes of the steps in flight, oldest first */
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        sw_ring[i] = g8_issue<NC>(w, wsc, N, K, ip, ntiles, lane, ring_s + (uint32_t)(i * NC * G8_STEP));
        if (++ip.s == nsteps) ip.s = 0, ip.tile += stride;
    }
    for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x)
        ((int *)tab)[(i >> 5) * 64 + (i & 31)] = __double2hiint((double)d_e4m3_decode((uint8_t)(i >> 5)));
    for (int64_t g = threadIdx.x; g < (int64_t)mt * KB; g += blockDim.x) { /* act-quant, one thread per group */
        const int64_t m = g / KB, b = g % KB;
        uint4 v[4]; /* bf16 [32] */
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = __ldg((const uint4 *)(x + m * K + b * 32) + i);
        uint32_t c[8]; /* e4m3 [32] */
        xs[m * KBp + b] = d_e8m0(d_act_quant32((const uint32_t *)v, c));
        uint4 *q = (uint4 *)(xq + m * Kp + b * 32);
        q[0] = make_uint4(c[0], c[1], c[2], c[3]), q[1] = make_uint4(c[4], c[5], c[6], c[7]);
    }
    __syncthreads();

    g8_pos p = {(int64_t)blockIdx.x * nw + warp, 0}; /* the step to compute */
    float acc = 0.0f; /* lane m·NC + c: row m, column c of the tile, blocks so far */
    for (int stage = 0; p.tile < ntiles; stage = stage + 1 == S ? 0 : stage + 1) { /* warp-uniform */
        const int issue_stage = stage == 0 ? S - 1 : stage - 1; /* the stage computed last time */
        const uint32_t swb = sw_ring[0];
#pragma unroll
        for (int i = 0; i + 1 < S - 1; i++) sw_ring[i] = sw_ring[i + 1];
        sw_ring[S - 2] = g8_issue<NC>(w, wsc, N, K, ip, ntiles, lane, ring_s + (uint32_t)(issue_stage * NC * G8_STEP));
        if (++ip.s == nsteps) ip.s = 0, ip.tile += stride;
        d_cp_wait<S - 1>(); /* this step's group has landed */

        const int64_t n0 = p.tile * NC, k0 = p.s * G8_STEP + lane * 16, kb = k0 / 32;
        const bool lead = (lane & 1) == 0;
        const float sw = d_e8m0((uint8_t)swb);
        double xd[MT][16]; /* this lane's 16 x values of each row */
        float sx[MT];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            g8_vals(tab, *(const uint4 *)(xq + m * Kp + k0), lane4, xd[m]); /* k0 < Kp: padding past K is */
            sx[m] = xs[m * KBp + kb];                                        /* read, never used */
        }
        const unsigned char *st = ring + (size_t)stage * NC * G8_STEP + lane * 16;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            double wd[16];
            g8_vals(tab, *(const uint4 *)(st + c * G8_STEP), lane4, wd);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                double a = 0.0, b = 0.0; /* two chains; exact, so the split changes nothing */
#pragma unroll
                for (int j = 0; j < 8; j++) a = fma(xd[m][j], wd[j], a), b = fma(xd[m][8 + j], wd[8 + j], b);
                a += b;
                a += __shfl_xor_sync(0xffffffffu, a, 1);
                if (lead) pv[(m * NC + c) * 16 + (lane >> 1)] = __fmul_rn(__fmul_rn(__double2float_rn(a), sx[m]), sw);
            }
        }
        __syncwarp();
        if (lane < MT * NC) { /* the CPU's f32 adds, blocks ascending; blocks past K are not added */
            const int nb = (int)min((int64_t)16, KB - p.s * 16);
            const float4 *q = (const float4 *)(pv + lane * 16);
            float v[16];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float4 t = q[i];
                v[4 * i] = t.x, v[4 * i + 1] = t.y, v[4 * i + 2] = t.z, v[4 * i + 3] = t.w;
            }
            if (nb == 16) {
#pragma unroll
                for (int i = 0; i < 16; i++) acc = __fadd_rn(acc, v[i]);
            } else {
#pragma unroll
                for (int i = 0; i < 16; i++)
                    if (i < nb) acc = __fadd_rn(acc, v[i]);
            }
        }
        __syncwarp(); /* pv is written again next step */
        if (++p.s == nsteps) { /* the tile is done */
            const int m = lane / NC, c = lane % NC;
            if (lane < MT * NC && m < mt && n0 + c < N) y[(int64_t)m * N + n0 + c] = d_to_bf16(acc);
            acc = 0.0f;
            p.s = 0, p.tile += stride;
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory"); /* the empty groups issued past the end */
}

static int g_g8_on = -1;
extern "C" int di_cuda_gemv_fp8_enabled(void) { return di_cuda_env_switch(&g_g8_on, "DI_CUDA_GEMV_FP8", "0"); }
extern "C" void di_cuda_gemv_fp8_set_enabled(int on) { g_g8_on = on ? 1 : 0; }

static int g_g8_nc = 0; /* 0: the rule in g8_cols; 1 / 2 / 4 / 8 forced (tests, bench) */
extern "C" void di_cuda_gemv_fp8_set_tile(int nc) { g_g8_nc = nc == 1 || nc == 2 || nc == 4 || nc == 8 ? nc : 0; }

extern "C" int di_cuda_gemv_fp8_fits(int64_t m, int64_t k, const void *x, const void *w) {
    return m >= 1 && m <= 2 && k >= 32 && k % 32 == 0 && k <= G8_MAX_K && (uintptr_t)x % 16 == 0 &&
           (uintptr_t)w % 16 == 0;
}

/* Where the slot takes this kernel: a warp owns NC columns, and narrow weights give too few warps even
 * at one column per tile. H200, 2026-12-01 (tests/cuda/test_cuda_gemv_fp8.c bench, against act_quant +
 * cuda_gemv.cuh): 1.3-1.5× at N 1280, 1.4-1.6× at N 2304, 1.6-2.2× from N 4096; 0.9-1.0× at N 512. */
extern "C" int di_cuda_gemv_fp8_wants(int64_t m, int64_t k, int64_t n, const void *x, const void *w) {
    return n >= 1024 && di_cuda_gemv_fp8_fits(m, k, x, w);
}

/* Columns per tile: all give the same bits; more columns share each x decode, fewer make more tiles.
 * Measured on the H200 (same bench): 8 at N 25600 / 32768 (one row; two rows take 4: registers), 4 at N
 * 5120, 2 at N 2304 / 4096, 1 at N 1280. */
static int g8_cols(int64_t m, int64_t n) {
    if (g_g8_nc) return m == 2 && g_g8_nc == 8 ? 4 : g_g8_nc;
    return n >= 16384 ? (m == 1 ? 8 : 4) : n > 4096 ? 4 : n >= 2048 ? 2 : 1;
}

/* One CTA per SM at most (the table is per CTA), each with as many warps as keep the tiles even: with W
 * warp slots in all, every warp takes ceil(tiles / W) tiles or one fewer. */
template <int MT, int NC, int S>
static int g8_launch(const uint16_t *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n,
                     uint16_t *y, cudaStream_t st, di_error *err) {
    const int64_t ntiles = (n + NC - 1) / NC, sms = di_cuda_sm_count(), slots = sms * G8_MAX_WARPS;
    const int64_t rounds = (ntiles + slots - 1) / slots, warps = (ntiles + rounds - 1) / rounds;
    const int64_t ctas = warps < sms ? warps : sms, nw = (warps + ctas - 1) / ctas;
    const size_t smem = G8_TAB_BYTES + g8_x_bytes(MT, k) + (size_t)nw * g8_warp_bytes(MT, NC, S);
    static bool raised = false; /* the dynamic shared-memory limit, once per instantiation */
    if (!raised) {
        cudaFuncSetAttribute(g8_kernel<MT, NC, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
        raised = true;
    }
    g8_kernel<MT, NC, S><<<(unsigned)ctas, (unsigned)(nw * 32), smem, st>>>(x, (int)m, k, w, ws, n, y);
    return di_cuda_launched("linear_fp8 (gemv_fp8)", err);
}

extern "C" int di_cuda_gemv_fp8_run(const uint16_t *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws,
                                    int64_t n, uint16_t *y, void *stream, di_error *err) {
    if (!di_cuda_gemv_fp8_fits(m, k, x, w) || n < 1)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda gemv_fp8: M %lld (1..2), K %lld (a multiple of 32 up to %d), N %lld, x / w 16-byte "
                            "aligned",
                            (long long)m, (long long)k, G8_MAX_K, (long long)n);
    cudaStream_t st = (cudaStream_t)stream;
    const int nc = g8_cols(m, n);
    /* fewer columns per tile: more warps for narrow weights, a deeper ring for the smaller steps */
    switch (m * 10 + nc) {
    case 11: return g8_launch<1, 1, 5>(x, m, k, w, ws, n, y, st, err);
    case 12: return g8_launch<1, 2, 4>(x, m, k, w, ws, n, y, st, err);
    case 18: return g8_launch<1, 8, 2>(x, m, k, w, ws, n, y, st, err);
    case 21: return g8_launch<2, 1, 5>(x, m, k, w, ws, n, y, st, err);
    case 22: return g8_launch<2, 2, 4>(x, m, k, w, ws, n, y, st, err);
    case 24: return g8_launch<2, 4, 3>(x, m, k, w, ws, n, y, st, err);
    default: return g8_launch<1, 4, 3>(x, m, k, w, ws, n, y, st, err);
    }
}
