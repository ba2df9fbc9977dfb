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

#define HC_MAX 8           /* DI_HC_MAX of cpu_attn.h */
#define PRE_THREADS 256    /* the f64 reductions' partition: the unfused kernels' block size */
#define PRE_SPLIT_MAX 4096 /* tokens whose mixes are split over blocks (one arrival counter each) */

/* Arrival counters of the split launch: block (t, j) computes mix j of token t; the last of token t's
 * blocks to finish runs the rest of the chain and resets the counter to 0 for the next launch. Launches
 * on one stream run one after another; two backends' streams must not run hc_pre at the same time. */
__device__ unsigned g_pre_arrivals[PRE_SPLIT_MAX];

static int g_split_max = PRE_SPLIT_MAX; /* test hook: di_cuda_fused_set_split_max */

extern "C" void di_cuda_fused_set_split_max(int n) { g_split_max = n < 0 ? 0 : n > PRE_SPLIT_MAX ? PRE_SPLIT_MAX : n; }

static __device__ __forceinline__ float d_sigmoid(float v) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, d_expf(-v))); }

typedef struct pre_args {
    uint16_t *x;           /* bf16 [m, hc, d] */
    const uint16_t *z;     /* bf16 [m, d] or NULL */
    const float *post_in;  /* f32 [m, hc] */
    const float *comb_in;  /* f32 [m, hc, hc] */
    int64_t d;
    int hc, n_mix, iters;
    const float *fn;       /* f32 [n_mix, hc·d] */
    float norm_eps, hc_eps;
    const float *scale;    /* f32 [3] */
    const float *base;     /* f32 [n_mix] */
    const float *pre_in;   /* f32 [m, hc] or NULL */
    const uint16_t *norm_w; /* bf16 [d] */
    float *mixes, *pre, *post, *comb; /* f32 [m, n_mix], [m, hc], [m, hc], [m, hc, hc] */
    uint16_t *h;           /* bf16 [m, d] */
} pre_args;

/* Element (k, i) of token t's streams as the chain sees them: x, or hc_expand's value when z is given
 * (hc_expand_kernel's arithmetic). */
static __device__ __forceinline__ uint16_t stream_value(const pre_args &a, int64_t t, int k, int64_t i) {
    const uint16_t *xt = a.x + t * a.hc * a.d;
    if (!a.z) return xt[k * a.d + i];
    const float *c = a.comb_in + t * a.hc * a.hc;
    float r = 0.0f;
    for (int j = 0; j < a.hc; j++) r = __fadd_rn(r, __fmul_rn(c[j * a.hc + k], d_bf16(xt[j * a.d + i])));
    return d_to_bf16(__fadd_rn(__fmul_rn(a.post_in[t * a.hc + k], d_bf16(a.z[t * a.d + i])), r));
}

/* Mix j of token t (hc_mixes_kernel: the same two f64 sums over the same partition), written to
 * a.mixes. The two loops of the unfused kernel are one here; each thread's partial sums are unchanged. */
static __device__ void pre_mix(const pre_args &a, int64_t t, int j, double *sh) {
    const int64_t n = (int64_t)a.hc * a.d;
    const float *f = a.fn + (int64_t)j * n;
    double ss = 0.0, s = 0.0;
    int k = 0;            /* element e = k·d + i, tracked without a 64-bit division per element */
    int64_t i = threadIdx.x;
    while (i >= a.d) i -= a.d, k++;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
        double v = d_bf16(stream_value(a, t, k, i));
        ss += v * v;
        s += v * (double)f[e];
        for (i += blockDim.x; i >= a.d && k < a.hc; i -= a.d) k++;
    }
    ss = d_block_sum_f64(ss, sh);
    s = d_block_sum_f64(s, sh);
    float mean = __fdiv_rn(__double2float_rn(ss), (float)n);
    float rho = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.norm_eps)));
    if (threadIdx.x == 0) a.mixes[t * a.n_mix + j] = __fmul_rn(__double2float_rn(s), rho);
}

/* Value of lane `src`'s v (all 32 lanes take part). */
static __device__ __forceinline__ float lane_of(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }

/* Split + Sinkhorn of token t in warp 0, lane l = j·hc + k holding comb[j][k] (hc_sinkhorn_kernel's
 * operations in its order: every row / column sum is taken sequentially from the lanes that hold it).
 * mx: the token's mixes (shared). Writes pre, post, comb; pre also to pre_s (shared). */
static __device__ void pre_sinkhorn(const pre_args &a, int64_t t, const float *mx, float *pre_s) {
    const int hc = a.hc, lane = threadIdx.x & 31;
    const bool live = lane < hc * hc;
    const int j = live ? lane / hc : 0, k = live ? lane % hc : 0;
    if (lane < hc) {
        float pr = __fadd_rn(d_sigmoid(__fadd_rn(__fmul_rn(mx[lane], a.scale[0]), a.base[lane])), a.hc_eps);
        a.pre[t * hc + lane] = pr, pre_s[lane] = pr;
        a.post[t * hc + lane] =
            __fmul_rn(2.0f, d_sigmoid(__fadd_rn(__fmul_rn(mx[hc + lane], a.scale[1]), a.base[hc + lane])));
    }
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

/* The rest of token t's chain after its mixes: Sinkhorn, then per column i the streams (expanded and
 * written back when z), the collapse with pre_in or the new pre, and RMSNorm over the d collapsed
 * values (rmsnorm_kernel's partition: thread i mod 256). */
static __device__ void pre_finish(const pre_args &a, int64_t t, double *sh) {
    __shared__ float mx[(2 + HC_MAX) * HC_MAX]; /* f32 [n_mix] the token's mixes */
    __shared__ float pre_s[HC_MAX];             /* f32 [hc] */
    for (int q = threadIdx.x; q < a.n_mix; q += blockDim.x) mx[q] = __ldcg(a.mixes + t * a.n_mix + q);
    __syncthreads();
    if (threadIdx.x < 32) pre_sinkhorn(a, t, mx, pre_s);
    __syncthreads();
    const int hc = a.hc;
    const float *p = a.pre_in ? a.pre_in + t * hc : pre_s;
    uint16_t *ht = a.h + t * a.d, *xt = a.x + t * hc * a.d;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < a.d; i += blockDim.x) {
        uint16_t v[HC_MAX]; /* bf16 [hc] column i of every stream */
        for (int k = 0; k < hc; k++) v[k] = stream_value(a, t, k, i);
        if (a.z) /* every block of token t has read x[t] (they arrived before this one) */
            for (int k = 0; k < hc; k++) xt[k * a.d + i] = v[k];
        float s = 0.0f;
        for (int k = 0; k < hc; k++) s = __fadd_rn(s, __fmul_rn(p[k], d_bf16(v[k])));
        uint16_t hv = d_to_bf16(s);
        ht[i] = hv;
        float f = d_bf16(hv);
        ss += (double)__fmul_rn(f, f);
    }
    ss = d_block_sum_f64(ss, sh);
    float var = __fdiv_rn(__double2float_rn(ss), (float)a.d);
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.norm_eps)));
    for (int64_t i = threadIdx.x; i < a.d; i += blockDim.x)
        ht[i] = d_to_bf16(__fmul_rn(d_bf16(a.norm_w[i]), __fmul_rn(d_bf16(ht[i]), r)));
}

/* Split launch: grid (m, n_mix); the last block of each token finishes its chain. */
__global__ void __launch_bounds__(PRE_THREADS) hc_pre_split_kernel(pre_args a) {
    __shared__ double sh[32]; /* f64 [32] per-warp partial sums */
    __shared__ bool last;
    const int64_t t = blockIdx.x;
    pre_mix(a, t, blockIdx.y, sh);
    __threadfence(); /* this block's mix (thread 0's store) before its arrival */
    if (threadIdx.x == 0) {
        last = atomicAdd(&g_pre_arrivals[t], 1u) == (unsigned)a.n_mix - 1;
        if (last) g_pre_arrivals[t] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    pre_finish(a, t, sh);
}

/* Token launch: one block per token computes its n_mix mixes one after another, then the rest. */
__global__ void __launch_bounds__(PRE_THREADS) hc_pre_token_kernel(pre_args a) {
    __shared__ double sh[32]; /* f64 [32] per-warp partial sums */
    const int64_t t = blockIdx.x;
    for (int j = 0; j < a.n_mix; j++) pre_mix(a, t, j, sh);
    __syncthreads();
    pre_finish(a, t, sh);
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
    if (hc * hc > 32) { /* Sinkhorn does not fit one warp: the unfused kernels */
        int rc = z ? di_cuda_hc_expand(be, z, x, post_in, comb_in, m, hc, d, x, err) : DI_OK;
        if (!rc) rc = di_cuda_hc_mixes(be, x, m, hc, d, fn, norm_eps, mixes, err);
        if (!rc) rc = di_cuda_hc_sinkhorn(be, mixes, m, hc, scale, base, iters, hc_eps, pre, post, comb, err);
        if (!rc) rc = di_cuda_hc_collapse(be, x, pre_in ? pre_in : pre, m, hc, d, h, err);
        if (!rc) rc = di_cuda_rmsnorm(be, h, m, d, norm_w, norm_eps, h, err);
        return rc;
    }
    pre_args a = {x, z, post_in, comb_in, d, hc, (2 + hc) * hc, iters, fn, norm_eps, hc_eps, scale, base, pre_in,
                  norm_w, mixes, pre, post, comb, h};
    cudaStream_t st = di_cuda_state(be)->stream;
    if (m <= g_split_max)
        hc_pre_split_kernel<<<dim3((unsigned)m, (unsigned)a.n_mix), PRE_THREADS, 0, st>>>(a);
    else
        hc_pre_token_kernel<<<(unsigned)m, PRE_THREADS, 0, st>>>(a);
    return di_cuda_launched("hc_pre", err);
}

/* ---------------- gather_topk ---------------- */

/* One thread per output value: row_decode_kernel's decode of the entry's page row, or 0; the first
 * thread of each (t, j) writes its idx entry. */
__global__ void gather_topk_kernel(int codec, const uint8_t *base, int64_t n_entries, const int32_t *pages,
                                   int64_t page_entries, int64_t page_rows, int64_t row_off, const int32_t *top,
                                   int64_t m, int k, int64_t d, int64_t rb, int32_t row0, uint16_t *rows, int32_t *idx,
                                   int64_t ldi) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * k * d) return;
    int64_t i = e / d, col = e % d; /* i = t·k + j */
    int64_t ent = top[i];
    bool valid = ent >= 0 && ent < n_entries;
    if (col == 0) idx[(i / k) * ldi + i % k] = valid ? row0 + (int32_t)i : -1;
    if (!valid) {
        rows[e] = 0;
        return;
    }
    int64_t r = pages ? (int64_t)pages[ent / page_entries] * page_rows + row_off + ent % page_entries : ent;
    const uint8_t *row = base + r * rb;
    float v;
    if (codec == DI_CODEC_FP8_E8M0) {
        v = __fmul_rn(d_e4m3_decode(row[col]), d_e8m0(row[d + col / 32]));
    } else {
        uint8_t b = row[col / 2];
        uint32_t code = (col & 1) ? (b >> 4) : (b & 15);
        int group = codec == DI_CODEC_FP4_E4M3 ? 16 : 32;
        uint8_t sc = row[d / 2 + col / group];
        float s = codec == DI_CODEC_FP4_E4M3 ? d_e4m3_decode(sc) : d_e8m0(sc);
        v = __fmul_rn(d_e2m1_decode(code), s);
    }
    rows[e] = d_to_bf16(v);
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
    int64_t n = m * k * d;
    if (n == 0) return DI_OK;
    gather_topk_kernel<<<di_cuda_blocks(n, 256), 256, 0, di_cuda_state(be)->stream>>>(
        (int)codec, base, n_entries, pages, page_entries, page_rows, row_off, top, m, k, d,
        di_row_codec_bytes(codec, d), row0, rows, idx, ldi);
    return di_cuda_launched("gather_topk", err);
}
