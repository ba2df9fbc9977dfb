/* The fused slots of backend.h on the GPU: the mHC chain in front of a sub-layer (hc_pre: the previous
 * sub-layer's expand, mixes, Sinkhorn, collapse and RMSNorm in ONE launch) and the gather of the
 * compressed entries a top-k selected (gather_topk: the ids stay on the device, so the graph needs no
 * download to plan it).
 *
 * Exactness: every value is computed by the same arithmetic as the unfused CUDA kernels
 * (cuda_mhc.cu, cuda_elem.cu, cuda_mem.cu), with the same per-thread partition of every f64 reduction
 * (256 threads, element i to thread i mod 256, d_block_sum_f64): the fused launch gives the unfused
 * sequence's bits, which are the CPU's (cuda_common.cuh; Sinkhorn through f64-rounded exp, as
 * hc_sinkhorn). tests/cuda/test_cuda_fused.c checks both equalities. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fused.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_select.cuh" /* gather_topk's per-item decode */

#define HC_MAX 8           /* DI_HC_MAX of cpu_attn.h */
#define PRE_THREADS 256    /* the f64 reductions' partition: the unfused kernels' block size */
#define PRE_SPLIT_MAX 4096 /* tokens whose mixes are split over blocks (one arrival counter each) */

/* Arrival counters of the split launch: block (t, j) computes mix j of token t; the last of token t's
 * blocks to finish runs the rest of the chain and resets the counter to 0 for the next launch. Launches
 * on one stream run one after another; two backends' streams must not run hc_pre at the same time. */
__device__ unsigned g_pre_arrivals[PRE_SPLIT_MAX];

static int g_split_max = PRE_SPLIT_MAX; /* test hook: di_cuda_fused_set_split_max */
static int g_mix_group = 0;            /* test hook: di_cuda_fused_set_mix_group (0: the rule) */

extern "C" void di_cuda_fused_set_split_max(int n) { g_split_max = n < 0 ? 0 : n > PRE_SPLIT_MAX ? PRE_SPLIT_MAX : n; }
extern "C" void di_cuda_fused_set_mix_group(int n) { g_mix_group = n < 0 ? 0 : n; }

static __device__ __forceinline__ float d_sigmoid(float v) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, d_expf(-v))); }

typedef struct pre_args {
    uint16_t *x;           /* bf16 [m, hc, d] */
    const uint16_t *z;     /* bf16 [m, d] or NULL */
    const float *post_in;  /* f32 [m, hc] */
    const float *comb_in;  /* f32 [m, hc, hc] */
    int64_t d;
    int hc, n_mix, iters;
    int mix_group;         /* split launch: mixes per block (blockIdx.y takes mixes y·mix_group …) */
    const float *fn;       /* f32 [n_mix, hc·d] */
    float norm_eps, hc_eps;
    const float *scale;    /* f32 [3] */
    const float *base;     /* f32 [n_mix] */
    const float *pre_in;   /* f32 [m, hc] or NULL */
    const uint16_t *norm_w; /* bf16 [d] */
    float *mixes, *pre, *post, *comb; /* f32 [m, n_mix], [m, hc], [m, hc], [m, hc, hc] */
    uint16_t *h;           /* bf16 [m, d] */
} pre_args;

/* bf16 c (0..7) of 8 packed in a uint4 */
static __device__ __forceinline__ uint16_t lane8(const uint4 &v, int c) {
    uint32_t w = c < 4 ? (c < 2 ? v.x : v.y) : (c < 6 ? v.z : v.w);
    return (uint16_t)((c & 1) ? w >> 16 : w & 0xffffu);
}

/* Token t's streams, as the chain sees them, into shared memory: x, or hc_expand's value when z is given
 * (hc_expand_kernel's arithmetic, element by element). One pass over x[t], 16-byte loads where aligned;
 * every mix and the finish read the copy.  xs bf16 [hc, d] (shared, 16-byte aligned) */
template <int HCT>
static __device__ void pre_stage(const pre_args &a, int64_t t, uint16_t *xs) {
    __shared__ float pc[HC_MAX * HC_MAX + HC_MAX]; /* f32 comb_in[t] ‖ post_in[t] */
    const int hc = HCT ? HCT : a.hc;
    const int64_t d = a.d;
    const uint16_t *xt = a.x + t * hc * d, *zt = a.z ? a.z + t * d : NULL;
    const bool vec = d % 8 == 0 && (uintptr_t)xt % 16 == 0 && (!zt || (uintptr_t)zt % 16 == 0);
    if (!zt) {
        if (vec) {
#pragma unroll 4
            for (int64_t q = threadIdx.x; q < hc * d / 8; q += blockDim.x) ((uint4 *)xs)[q] = ((const uint4 *)xt)[q];
        }
        else
            for (int64_t e = threadIdx.x; e < hc * d; e += blockDim.x) xs[e] = xt[e];
        __syncthreads();
        return;
    }
    for (int q = threadIdx.x; q < hc * hc + hc; q += blockDim.x)
        pc[q] = q < hc * hc ? a.comb_in[t * hc * hc + q] : a.post_in[t * hc + q - hc * hc];
    __syncthreads();
    const float *c = pc, *po = pc + hc * hc;
    if (vec) {
        for (int64_t g = threadIdx.x; g < d / 8; g += blockDim.x) {
            uint4 xv[HC_MAX], zv = ((const uint4 *)zt)[g];
#pragma unroll
            for (int j = 0; j < hc; j++) xv[j] = ((const uint4 *)(xt + j * d))[g];
            uint32_t out[HC_MAX][4];
#pragma unroll
            for (int l = 0; l < 8; l++) {
                float zi = d_bf16(lane8(zv, l));
#pragma unroll
                for (int k = 0; k < hc; k++) {
                    float r = 0.0f;
#pragma unroll
                    for (int j = 0; j < hc; j++) r = __fadd_rn(r, __fmul_rn(c[j * hc + k], d_bf16(lane8(xv[j], l))));
                    uint32_t y = d_to_bf16(__fadd_rn(__fmul_rn(po[k], zi), r));
                    out[k][l / 2] = (l & 1) ? (out[k][l / 2] | (y << 16)) : y;
                }
            }
#pragma unroll
            for (int k = 0; k < hc; k++)
                ((uint4 *)(xs + k * d))[g] = make_uint4(out[k][0], out[k][1], out[k][2], out[k][3]);
        }
    } else {
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
            float xi[HC_MAX]; /* f32 [hc] column i of every stream */
            for (int j = 0; j < hc; j++) xi[j] = d_bf16(xt[j * d + i]);
            float zi = d_bf16(zt[i]);
            for (int k = 0; k < hc; k++) {
                float r = 0.0f;
                for (int j = 0; j < hc; j++) r = __fadd_rn(r, __fmul_rn(c[j * hc + k], xi[j]));
                xs[k * d + i] = d_to_bf16(__fadd_rn(__fmul_rn(po[k], zi), r));
            }
        }
    }
    __syncthreads();
}

#define PRE_UNROLL 20 /* fn loads in flight per thread (V4.1: 80 per thread); sums still in element order */

/* d_block_sum_f64 of two values at once (cuda_common.cuh): each value goes through exactly its
 * operations — the warp's butterfly, lane 0's value per warp, the butterfly over the warp values with
 * zeros past the last warp — with one pair of barriers for both. sh: 32 doubles (2 × ≤ 16 warps). */
static __device__ void pre_block_sum2(double *u, double *v, double *sh) {
    double x = d_warp_sum_f64(*u), y = d_warp_sum_f64(*v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = x, sh[16 + w] = y;
    __syncthreads();
    *u = d_warp_sum_f64(lane < nw ? sh[lane] : 0.0);
    *v = d_warp_sum_f64(lane < nw ? sh[16 + lane] : 0.0);
}

/* Mix j's weights (fn row j, n floats) into L2 while the streams are staged (the row comes from HBM
 * once per step; the mix then reads it at L2's latency): one prefetch per 128-byte line, spread over
 * the block. A cache hint: no value changes. */
static __device__ __forceinline__ void pre_prefetch(const float *f, int64_t n) {
    for (int64_t e = (int64_t)threadIdx.x * 32; e < n; e += (int64_t)blockDim.x * 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(f + e));
}

/* Mix j of token t from the staged streams (hc_mixes_kernel: the same two f64 sums over the same
 * partition, element e to thread e mod 256 in ascending e), written to a.mixes. */
template <int HCT>
static __device__ void pre_mix(const pre_args &a, int64_t t, int j, const uint16_t *xs, double *sh) {
    const int64_t n = (int64_t)(HCT ? HCT : a.hc) * a.d, bd = blockDim.x;
    const float *f = a.fn + (int64_t)j * n;
    double ss = 0.0, s = 0.0;
    int64_t e = threadIdx.x;
    for (; e + (PRE_UNROLL - 1) * bd < n; e += PRE_UNROLL * bd) {
        float fv[PRE_UNROLL];
#pragma unroll
        for (int u = 0; u < PRE_UNROLL; u++) fv[u] = f[e + u * bd];
#pragma unroll
        for (int u = 0; u < PRE_UNROLL; u++) {
            double v = d_bf16(xs[e + u * bd]);
            ss += v * v;
            s += v * (double)fv[u];
        }
    }
    for (; e < n; e += bd) {
        double v = d_bf16(xs[e]);
        ss += v * v;
        s += v * (double)f[e];
    }
    pre_block_sum2(&ss, &s, sh);
    float mean = __fdiv_rn(__double2float_rn(ss), (float)n);
    float rho = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.norm_eps)));
    if (threadIdx.x == 0) a.mixes[t * a.n_mix + j] = __fmul_rn(__double2float_rn(s), rho);
}

/* Value of lane `src`'s v (all 32 lanes take part). */
static __device__ __forceinline__ float lane_of(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }

/* The split of token t's mixes into its gates (hc_sinkhorn_kernel's arithmetic), thread l < hc: pre
 * (also to pre_s, shared) and post. mx: the token's mixes (shared). */
template <int HCT>
static __device__ void pre_gates(const pre_args &a, int64_t t, const float *mx, float *pre_s) {
    const int hc = HCT ? HCT : a.hc, l = threadIdx.x;
    if (l >= hc) return;
    float pr = __fadd_rn(d_sigmoid(__fadd_rn(__fmul_rn(mx[l], a.scale[0]), a.base[l])), a.hc_eps);
    a.pre[t * hc + l] = pr, pre_s[l] = pr;
    a.post[t * hc + l] = __fmul_rn(2.0f, d_sigmoid(__fadd_rn(__fmul_rn(mx[hc + l], a.scale[1]), a.base[hc + l])));
}

/* Sinkhorn of token t's comb in warp 0, lane l = j·hc + k holding comb[j][k] (hc_sinkhorn_kernel's
 * operations in its order: every row / column sum is taken sequentially from the lanes that hold it).
 * mx: the token's mixes (shared). Writes comb. */
template <int HCT>
static __device__ void pre_sinkhorn(const pre_args &a, int64_t t, const float *mx) {
    const int hc = HCT ? HCT : a.hc, lane = threadIdx.x & 31;
    const bool live = lane < hc * hc;
    const int j = live ? lane / hc : 0, k = live ? lane % hc : 0;
    float c = __fadd_rn(__fmul_rn(mx[2 * hc + j * hc + k], a.scale[2]), a.base[2 * hc + j * hc + k]);
    /* iteration 0's row step: softmax + eps */
    float m = lane_of(c, j * hc);
    for (int q = 1; q < hc; q++) {
        float v = lane_of(c, j * hc + q);
        m = v > m ? v : m;
    }
    c = d_expf(__fsub_rn(c, m));
    float s = 0.0f;
    for (int q = 0; q < hc; q++) s = __fadd_rn(s, lane_of(c, j * hc + q));
    c = __fadd_rn(__fdiv_rn(c, s), a.hc_eps);
    for (int it = 0; it < a.iters; it++) {
        if (it > 0) {
            s = 0.0f;
            for (int q = 0; q < hc; q++) s = __fadd_rn(s, lane_of(c, j * hc + q));
            c = __fdiv_rn(c, __fadd_rn(s, a.hc_eps));
        }
        s = 0.0f;
        for (int q = 0; q < hc; q++) s = __fadd_rn(s, lane_of(c, q * hc + k));
        c = __fdiv_rn(c, __fadd_rn(s, a.hc_eps));
    }
    if (live) a.comb[(t * hc + j) * hc + k] = c;
}

/* The rest of token t's chain after its mixes: the gates, then Sinkhorn in warp 0 while warps 1 … do
 * the rest — per column i the staged streams written back (when z), the collapse with pre_in or the
 * new pre, and RMSNorm over the d collapsed values. Sinkhorn's comb feeds none of that (the next
 * sub-layer's expand reads it), so the two run side by side and warp 0 leaves when comb is written.
 * The norm's f64 sum keeps rmsnorm_kernel's partition exactly: value i belongs to "virtual" thread
 * i mod 256 (PRE_THREADS), whose partial is its values' sequential sum; warps 1 … compute the 256
 * partials (thread p of them takes virtual threads p and p + 224), then each virtual warp's butterfly
 * and the butterfly over the 8 warp sums, d_block_sum_f64's operations on the same values.
 * xs bf16 [hc, d], hs bf16 [d] (shared); blockDim.x == PRE_THREADS. */
#define PRE_REST (PRE_THREADS - 32) /* threads of warps 1 … */
static __device__ __forceinline__ void pre_rest_sync() { asm volatile("bar.sync 1, %0;" ::"n"(PRE_REST) : "memory"); }

template <int HCT>
static __device__ void pre_finish(const pre_args &a, int64_t t, const uint16_t *xs, uint16_t *hs) {
    __shared__ float mx[(2 + HC_MAX) * HC_MAX]; /* f32 [n_mix] the token's mixes */
    __shared__ float pre_s[HC_MAX];             /* f32 [hc] */
    __shared__ double part[PRE_THREADS];        /* f64 [256] the virtual threads' partial sums */
    __shared__ double wsum[PRE_THREADS / 32];   /* f64 [8] the virtual warps' sums */
    for (int q = threadIdx.x; q < a.n_mix; q += blockDim.x) mx[q] = __ldcg(a.mixes + t * a.n_mix + q);
    __syncthreads();
    pre_gates<HCT>(a, t, mx, pre_s);
    __syncthreads();
    if (threadIdx.x < 32) { /* no block-wide barrier past this point */
        pre_sinkhorn<HCT>(a, t, mx);
        return;
    }
    const int hc = HCT ? HCT : a.hc, p0 = threadIdx.x - 32, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float p[HC_MAX]; /* f32 [hc] the collapse weights */
#pragma unroll
    for (int k = 0; k < hc; k++) p[k] = a.pre_in ? a.pre_in[t * hc + k] : pre_s[k];
    if (a.z) { /* every block of token t has staged x[t] (they arrived before this one) */
        uint16_t *xt = a.x + t * hc * a.d;
        if (a.d % 8 == 0 && (uintptr_t)xt % 16 == 0)
            for (int64_t q = p0; q < hc * a.d / 8; q += PRE_REST) ((uint4 *)xt)[q] = ((const uint4 *)xs)[q];
        else
            for (int64_t e = p0; e < hc * a.d; e += PRE_REST) xt[e] = xs[e];
    }
    for (int v = p0; v < PRE_THREADS; v += PRE_REST) { /* virtual thread v: values v, v + 256, … */
        double ss = 0.0;
        for (int64_t i = v; i < a.d; i += PRE_THREADS) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < hc; k++) s = __fadd_rn(s, __fmul_rn(p[k], d_bf16(xs[k * a.d + i])));
            uint16_t hv = d_to_bf16(s);
            hs[i] = hv;
            float f = d_bf16(hv);
            ss += (double)__fmul_rn(f, f);
        }
        part[v] = ss;
    }
    pre_rest_sync();
    for (int vw = w - 1; vw < PRE_THREADS / 32; vw += PRE_REST / 32) { /* warp w: virtual warp w − 1 (and 7) */
        double x = d_warp_sum_f64(part[vw * 32 + lane]);
        if (lane == 0) wsum[vw] = x;
    }
    pre_rest_sync();
    double ss = d_warp_sum_f64(lane < PRE_THREADS / 32 ? wsum[lane] : 0.0);
    float var = __fdiv_rn(__double2float_rn(ss), (float)a.d);
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.norm_eps)));
    uint16_t *ht = a.h + t * a.d;
    if (a.d % 8 == 0 && (uintptr_t)ht % 16 == 0 && (uintptr_t)a.norm_w % 16 == 0) {
        for (int64_t g = p0; g < a.d / 8; g += PRE_REST) {
            uint4 wv = ((const uint4 *)a.norm_w)[g], hv = ((const uint4 *)hs)[g];
            uint32_t o[4];
            for (int l = 0; l < 8; l++) {
                uint32_t y = d_to_bf16(__fmul_rn(d_bf16(lane8(wv, l)), __fmul_rn(d_bf16(lane8(hv, l)), r)));
                o[l / 2] = (l & 1) ? (o[l / 2] | (y << 16)) : y;
            }
            ((uint4 *)ht)[g] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    } else {
        for (int64_t i = p0; i < a.d; i += PRE_REST)
            ht[i] = d_to_bf16(__fmul_rn(d_bf16(a.norm_w[i]), __fmul_rn(d_bf16(hs[i]), r)));
    }
}

/* Dynamic shared memory of both launches: the staged streams bf16 [hc, d] and the collapse bf16 [d]. */
static size_t pre_smem(int hc, int64_t d) { return sizeof(uint16_t) * (size_t)((hc + 1) * d); }

/* Split launch: grid (m, ⌈n_mix / mix_group⌉), block (t, g) computes token t's mixes g·mix_group … (each
 * mix exactly as alone: pre_mix); the last block of each token finishes its chain. */
template <int HCT>
__global__ void __launch_bounds__(PRE_THREADS) hc_pre_split_kernel(pre_args a) {
    extern __shared__ __align__(16) uint16_t pre_sm[];
    __shared__ double sh[32]; /* f64 [32] per-warp partial sums */
    __shared__ bool last;
    const int64_t t = blockIdx.x;
    uint16_t *xs = pre_sm, *hs = pre_sm + a.hc * a.d;
    const int64_t n = (int64_t)(HCT ? HCT : a.hc) * a.d;
    const int j0 = (int)blockIdx.y * a.mix_group, j1 = min(a.n_mix, j0 + a.mix_group);
    pre_prefetch(a.fn + (int64_t)j0 * n, (int64_t)(j1 - j0) * n);
    pre_stage<HCT>(a, t, xs);
    for (int j = j0; j < j1; j++) pre_mix<HCT>(a, t, j, xs, sh);
    __threadfence(); /* this block's mixes (thread 0's stores) before its arrival */
    if (threadIdx.x == 0) {
        last = atomicAdd(&g_pre_arrivals[t], 1u) == gridDim.y - 1;
        if (last) g_pre_arrivals[t] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    pre_finish<HCT>(a, t, xs, hs);
}

/* Token launch: one block per token computes its n_mix mixes one after another, then the rest. */
template <int HCT>
__global__ void __launch_bounds__(PRE_THREADS) hc_pre_token_kernel(pre_args a) {
    extern __shared__ __align__(16) uint16_t pre_sm[];
    __shared__ double sh[32]; /* f64 [32] per-warp partial sums */
    const int64_t t = blockIdx.x;
    uint16_t *xs = pre_sm, *hs = pre_sm + a.hc * a.d;
    pre_stage<HCT>(a, t, xs);
    for (int j = 0; j < a.n_mix; j++) pre_mix<HCT>(a, t, j, xs, sh);
    __syncthreads();
    pre_finish<HCT>(a, t, xs, hs);
}

/* Opt both kernels into `bytes` of dynamic shared memory (above the default 48 KB); false if the device
 * cannot give that much. */
static bool pre_smem_ok(size_t bytes) {
    static size_t granted = 48 * 1024;
    if (bytes <= granted) return true;
    int dev = 0, max = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        bytes + 2048 > (size_t)max)
        return false;
    const void *k[] = {(const void *)hc_pre_split_kernel<0>, (const void *)hc_pre_token_kernel<0>,
                       (const void *)hc_pre_split_kernel<4>, (const void *)hc_pre_token_kernel<4>};
    for (int i = 0; i < 4; i++)
        if (cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) != cudaSuccess)
            return false;
    granted = bytes;
    return true;
}

/* Mixes per block of the split launch: one (the most blocks, each token's mixes side by side) while every
 * block of the launch is resident at once, else the fewest per block that keep it so — a block then
 * stages its token once for several mixes instead of a second wave of blocks staging it again (B = 64
 * on the H200: 1,536 blocks of one mix = 2.9 waves of 3 per SM). */
static int pre_mix_group(int64_t m, int n_mix, int hc, size_t smem) {
    static int per_sm[2] = {0, 0}; /* resident blocks per SM: hc = 4's kernel, the generic one */
    int &r = per_sm[hc == 4 ? 0 : 1];
    if (!r) {
        const void *k = hc == 4 ? (const void *)hc_pre_split_kernel<4> : (const void *)hc_pre_split_kernel<0>;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, k, PRE_THREADS, smem) != cudaSuccess || r < 1) r = 1;
    }
    const int64_t slots = (int64_t)r * di_cuda_sm_count();
    for (int g = 1; g < n_mix; g++)
        if (m * ((n_mix + g - 1) / g) <= slots) return g;
    return n_mix;
}

extern "C" int di_cuda_hc_pre(const di_backend *be, uint16_t *x, const uint16_t *z, const float *post_in,
                              const float *comb_in, int64_t m, int hc, int64_t d, const float *fn, float norm_eps,
                              const float *scale, const float *base, int iters, float hc_eps, const float *pre_in,
                              const uint16_t *norm_w, float *mixes, float *pre, float *post, float *comb, uint16_t *h,
                              di_error *err) {
    if (hc < 1 || hc > HC_MAX || m < 0 || d < 1 || iters < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda hc_pre: hc = %d (1..%d), %lld tokens of %lld, %d iterations", hc,
                            HC_MAX, (long long)m, (long long)d, iters);
    if (m == 0) return DI_OK;
    size_t smem = pre_smem(hc, d);
    if (hc * hc > 32 || !pre_smem_ok(smem)) { /* Sinkhorn beyond one warp, or a token beyond shared memory */
        cudaGetLastError();
        int rc = z ? di_cuda_hc_expand(be, z, x, post_in, comb_in, m, hc, d, x, err) : DI_OK;
        if (!rc) rc = di_cuda_hc_mixes(be, x, m, hc, d, fn, norm_eps, mixes, err);
        if (!rc) rc = di_cuda_hc_sinkhorn(be, mixes, m, hc, scale, base, iters, hc_eps, pre, post, comb, err);
        if (!rc) rc = di_cuda_hc_collapse(be, x, pre_in ? pre_in : pre, m, hc, d, h, err);
        if (!rc) rc = di_cuda_rmsnorm(be, h, m, d, norm_w, norm_eps, h, err);
        return rc;
    }
    pre_args a = {x, z, post_in, comb_in, d, hc, (2 + hc) * hc, iters, 1, fn, norm_eps, hc_eps, scale, base, pre_in,
                  norm_w, mixes, pre, post, comb, h};
    cudaStream_t st = di_cuda_state(be)->stream;
    a.mix_group = g_mix_group ? min(g_mix_group, a.n_mix) : pre_mix_group(m, a.n_mix, hc, smem);
    /* hc = 4 (V4.1) compiled with the stream count known: the per-column arrays stay in registers */
    dim3 split((unsigned)m, (unsigned)((a.n_mix + a.mix_group - 1) / a.mix_group));
    if (m <= g_split_max && hc == 4)
        hc_pre_split_kernel<4><<<split, PRE_THREADS, smem, st>>>(a);
    else if (m <= g_split_max)
        hc_pre_split_kernel<0><<<split, PRE_THREADS, smem, st>>>(a);
    else if (hc == 4)
        hc_pre_token_kernel<4><<<(unsigned)m, PRE_THREADS, smem, st>>>(a);
    else
        hc_pre_token_kernel<0><<<(unsigned)m, PRE_THREADS, smem, st>>>(a);
    return di_cuda_launched("hc_pre", err);
}

/* ---------------- gather_topk ---------------- */

/* One thread per 8 consecutive values of an output row (d_gather_topk_item, cuda_select.cuh). */
__global__ void gather_topk_kernel(int codec, const uint8_t *base, int64_t n_entries, const int32_t *pages,
                                   int64_t page_entries, int64_t page_rows, int64_t row_off, const int32_t *top,
                                   int64_t m, int k, int64_t d, int64_t rb, int32_t row0, uint16_t *rows, int32_t *idx,
                                   int64_t ldi, int vec) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * k * (d / 8)) return;
    d_gather_topk_item(codec, base, n_entries, pages, page_entries, page_rows, row_off, top, k, d, rb, row0, rows, idx,
                       ldi, vec, e);
}

extern "C" int di_cuda_gather_topk(const di_backend *be, di_row_codec codec, const uint8_t *base, int64_t n_entries,
                                   const int32_t *pages, int64_t page_entries, int64_t page_rows, int64_t row_off,
                                   const int32_t *top, int64_t m, int k, int64_t d, int32_t row0, uint16_t *rows,
                                   int32_t *idx, int64_t ldi, di_error *err) {
    if (codec < DI_CODEC_FP8_E8M0 || codec > DI_CODEC_FP4_E8M0 || m < 0 || k < 0 || d < 1 ||
        d % di_row_codec_group(codec) || ldi < k || (pages && page_entries < 1))
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda gather_topk: codec %d, %lld rows of %d ids, width %lld, idx stride %lld, %lld entries "
                            "per page",
                            (int)codec, (long long)m, k, (long long)d, (long long)ldi, (long long)page_entries);
    int64_t n = m * k * (d / 8); /* d is a multiple of the codec group (16 or 32) */
    if (n == 0) return DI_OK;
    gather_topk_kernel<<<di_cuda_blocks(n, 256), 256, 0, di_cuda_state(be)->stream>>>(
        (int)codec, base, n_entries, pages, page_entries, page_rows, row_off, top, m, k, d,
        di_row_codec_bytes(codec, d), row0, rows, idx, ldi, (uintptr_t)rows % 16 == 0);
    return di_cuda_launched("gather_topk", err);
}
