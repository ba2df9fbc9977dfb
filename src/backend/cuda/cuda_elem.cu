/* Row-wise and elementwise ops on the GPU: RMSNorm, RoPE, embedding / row gathers, the MoE scatter-add,
 * SwiGLU, the router, and the Engram lookup and gate (spec §3.1, §3.7, §4.3, §4.5). Each kernel keeps
 * the CPU op's rounding points (norm.c, rope.c, moe.c, router.c, engram_ops.c); see cuda_common.cuh for
 * the exactness contract. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

/* ---------------- RMSNorm ---------------- */

/* One block per row. Σ x² of f32 squares in f64 (the CPU sums the same f32 squares in f64 in index
 * order; both round the total once to f32). y may alias x: the statistic is complete (block barrier)
 * before any write, and each thread writes only the elements it read. */
__global__ void rmsnorm_kernel(const uint16_t *x, int64_t D, const uint16_t *w, float eps, uint16_t *y) {
    __shared__ double sh[32]; /* f64 [32] per-warp partial sums */
    const uint16_t *xr = x + blockIdx.x * D;
    uint16_t *yr = y + blockIdx.x * D;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float v = d_bf16(xr[i]);
        ss += (double)__fmul_rn(v, v);
    }
    ss = d_block_sum_f64(ss, sh);
    float var = __fdiv_rn(__double2float_rn(ss), (float)D);
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
        yr[i] = d_to_bf16(__fmul_rn(d_bf16(w[i]), __fmul_rn(d_bf16(xr[i]), r)));
}

extern "C" int di_cuda_rmsnorm(const di_backend *be, const uint16_t *x, int64_t m, int64_t n, const uint16_t *w,
                               float eps, uint16_t *y, di_error *err) {
    if (m < 0 || n < 1) return di_error_set(err, DI_ERR_INVALID, "cuda rmsnorm: %lld rows of %lld", (long long)m, (long long)n);
    if (m == 0) return DI_OK;
    rmsnorm_kernel<<<(unsigned)m, 256, 0, di_cuda_state(be)->stream>>>(x, n, w, eps, y);
    return di_cuda_launched("rmsnorm", err);
}

/* ---------------- RoPE ---------------- */

/* One thread per (row, head, pair). Angle = f32(pos)·ω_i in f32; cos/sin of it through f64 rounded to
 * f32 (what rope.c computes); complex product with separately rounded f32 products. */
__global__ void rope_kernel(uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos, const float *freqs,
                            int inverse) {
    int half = rd / 2;
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * nh * half) return;
    int i = (int)(e % half);
    int64_t row = e / half, t = row / nh; /* row = t·nh + h */
    float ang = __fmul_rn(__ll2float_rn(pos[t]), freqs[i]);
    float cs = __double2float_rn(cos((double)ang)), sn = __double2float_rn(sin((double)ang));
    if (inverse) sn = -sn;
    uint16_t *v = x + row * d + (d - rd) + 2 * i;
    float a = d_bf16(v[0]), b = d_bf16(v[1]);
    float ac = __fmul_rn(a, cs), bd = __fmul_rn(b, sn), ad = __fmul_rn(a, sn), bc = __fmul_rn(b, cs);
    v[0] = d_to_bf16(__fsub_rn(ac, bd));
    v[1] = d_to_bf16(__fadd_rn(ad, bc));
}

extern "C" int di_cuda_rope(const di_backend *be, uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos,
                            const float *freqs, bool inverse, di_error *err) {
    if (rd <= 0 || rd % 2 || rd > d || nh < 1 || m < 0)
        return di_error_set(err, DI_ERR_INVALID, "cuda rope: %d rotated channels of a %d-wide head, %d heads", rd, d, nh);
    if (be->faults.rope_half_split)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda rope: the half-split fault is a CPU-only test switch");
    int64_t n = m * nh * (rd / 2);
    if (n == 0) return DI_OK;
    rope_kernel<<<di_cuda_blocks(n, 256), 256, 0, di_cuda_state(be)->stream>>>(x, m, nh, d, rd, pos, freqs, inverse);
    return di_cuda_launched("rope", err);
}

/* ---------------- gathers, scatter-add, conversions ---------------- */

/* y[i] = src[ids[i]] for bf16 rows of width d; an id outside [0, rows) gives a zero row. */
__global__ void gather_kernel(const uint16_t *src, int64_t rows, int64_t d, const int32_t *ids, int64_t m, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * d) return;
    int64_t i = e / d, j = e % d;
    int32_t id = ids[i];
    y[e] = (id >= 0 && id < rows) ? src[(int64_t)id * d + j] : 0;
}

extern "C" int di_cuda_embed(const di_backend *be, const uint16_t *table, int64_t vocab, int64_t d, const int32_t *ids,
                             int64_t m, uint16_t *y, di_error *err) {
    if (vocab < 1 || d < 1 || m < 0)
        return di_error_set(err, DI_ERR_INVALID, "cuda embed: vocab %lld, width %lld, %lld tokens", (long long)vocab,
                            (long long)d, (long long)m);
    if (m == 0) return DI_OK;
    gather_kernel<<<di_cuda_blocks(m * d, 256), 256, 0, di_cuda_state(be)->stream>>>(table, vocab, d, ids, m, y);
    return di_cuda_launched("embed", err);
}

extern "C" int di_cuda_gather_rows(const di_backend *be, const uint16_t *x, int64_t d, const int32_t *rows, int64_t m,
                                   uint16_t *y, di_error *err) {
    if (d < 1 || m < 0) return di_error_set(err, DI_ERR_INVALID, "cuda gather_rows: width %lld, %lld rows", (long long)d, (long long)m);
    if (m == 0) return DI_OK;
    gather_kernel<<<di_cuda_blocks(m * d, 256), 256, 0, di_cuda_state(be)->stream>>>(x, INT32_MAX, d, rows, m, y);
    return di_cuda_launched("gather_rows", err);
}

/* acc[rows[i]] += f32(y[i]) for i ascending; negative rows are skipped. Each destination row must see
 * its adds in ascending i (a token listed twice gets its two adds in the CPU's order). The per-expert
 * lists of the MoE are strictly increasing token ids, so no row repeats and every (row, column) add is
 * independent: scatter_rows_order finds that on the device (one CTA), and scatter_add_kernel then runs
 * one thread per (row, column) pair; a list that is not strictly increasing (a repeat may hide in it)
 * takes the ordered form, one thread per column walking the rows in order (the only form before:
 * 183 µs per call for 320 rows × 5,120 on the H200, 28 ms of an 8K-token prefill layer). */
#define SCATTER_TPB 256
__global__ void scatter_rows_order(const int32_t *rows, int64_t m, int *increasing) {
    int ok = 1;
    for (int64_t i = 1 + threadIdx.x; i < m; i += blockDim.x) ok &= rows[i - 1] < rows[i];
    ok = __syncthreads_and(ok);
    if (threadIdx.x == 0) *increasing = ok;
}

/* grid (column blocks, row chunks): with *increasing, thread (i, j) adds y[i, j]; otherwise only the
 * first row chunk works, one thread per column over every row in ascending i */
__global__ void scatter_add_kernel(const uint16_t *y, int64_t d, const int32_t *rows, int64_t m, int64_t rpb,
                                   const int *increasing, float *acc) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    int64_t i0 = 0, i1 = m;
    if (*increasing) {
        i0 = (int64_t)blockIdx.y * rpb, i1 = i0 + rpb < m ? i0 + rpb : m;
    } else if (blockIdx.y != 0) {
        return;
    }
    for (int64_t i = i0; i < i1; i++) {
        int32_t r = rows[i];
        if (r < 0) continue;
        float *a = acc + (int64_t)r * d + j;
        *a = __fadd_rn(*a, d_bf16(y[i * d + j]));
    }
}

extern "C" int di_cuda_scatter_add_rows(const di_backend *be, const uint16_t *y, int64_t d, const int32_t *rows,
                                        int64_t m, float *acc, di_error *err) {
    if (d < 1 || m < 0) return di_error_set(err, DI_ERR_INVALID, "cuda scatter_add_rows: width %lld, %lld rows", (long long)d, (long long)m);
    if (m == 0) return DI_OK;
    void *flag; /* int [1]: the list is strictly increasing */
    int rc = di_cuda_workspace(be, sizeof(int), &flag, err);
    if (rc) return rc;
    cudaStream_t st = di_cuda_state(be)->stream;
    scatter_rows_order<<<1, 1024, 0, st>>>(rows, m, (int *)flag);
    if ((rc = di_cuda_launched("scatter_add_rows order", err))) return rc;
    /* 4 rows per thread when increasing: enough CTAs to fill the GPU for a few hundred rows */
    const int64_t rpb = 4, chunks = (m + rpb - 1) / rpb;
    dim3 grid(di_cuda_blocks(d, SCATTER_TPB), (unsigned)(chunks < 65535 ? chunks : 65535));
    const int64_t rpb_eff = (m + grid.y - 1) / grid.y;
    scatter_add_kernel<<<grid, SCATTER_TPB, 0, st>>>(y, d, rows, m, rpb_eff, (const int *)flag, acc);
    return di_cuda_launched("scatter_add_rows", err);
}

__global__ void f32_to_bf16_kernel(const float *x, int64_t n, uint16_t *y) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = d_to_bf16(x[i]);
}

__global__ void fill_f32_kernel(float *x, int64_t n, float v) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

extern "C" int di_cuda_f32_to_bf16(const di_backend *be, const float *x, int64_t n, uint16_t *y, di_error *err) {
    if (n <= 0) return n < 0 ? di_error_set(err, DI_ERR_INVALID, "cuda f32_to_bf16: %lld values", (long long)n) : DI_OK;
    f32_to_bf16_kernel<<<di_cuda_blocks(n, 256), 256, 0, di_cuda_state(be)->stream>>>(x, n, y);
    return di_cuda_launched("f32_to_bf16", err);
}

extern "C" int di_cuda_fill_f32(const di_backend *be, float *x, int64_t n, float v, di_error *err) {
    if (n <= 0) return n < 0 ? di_error_set(err, DI_ERR_INVALID, "cuda fill_f32: %lld values", (long long)n) : DI_OK;
    fill_f32_kernel<<<di_cuda_blocks(n, 256), 256, 0, di_cuda_state(be)->stream>>>(x, n, v);
    return di_cuda_launched("fill_f32", err);
}

/* ---------------- SwiGLU ---------------- */

/* a = bf16(w_row · silu(min(g, lim)) · clamp(u, ±lim)); silu(g) = g / (1 + exp(−g)) in f32 (torch). */
__global__ void swiglu_kernel(const uint16_t *g, const uint16_t *u, int64_t m, int64_t n, const float *row_w, float lim,
                              uint16_t *a) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * n) return;
    float gv = d_bf16(g[e]), uv = d_bf16(u[e]);
    if (lim > 0) {
        uv = uv < -lim ? -lim : (uv > lim ? lim : uv);
        gv = gv > lim ? lim : gv;
    }
    float v = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, d_expf(-gv))), uv);
    if (row_w) v = __fmul_rn(row_w[e / n], v);
    a[e] = d_to_bf16(v);
}

extern "C" int di_cuda_swiglu(const di_backend *be, const uint16_t *g, const uint16_t *u, int64_t m, int64_t n,
                              const float *row_w, float lim, uint16_t *a, di_error *err) {
    if (m < 0 || n < 1) return di_error_set(err, DI_ERR_INVALID, "cuda swiglu: %lld rows of %lld", (long long)m, (long long)n);
    if (m == 0) return DI_OK;
    swiglu_kernel<<<di_cuda_blocks(m * n, 256), 256, 0, di_cuda_state(be)->stream>>>(g, u, m, n, row_w, lim, a);
    return di_cuda_launched("swiglu", err);
}

/* ---------------- router ---------------- */
#define ROUTER_MAX_TOPK 64 /* DI_ROUTER_MAX_TOPK of cpu_ops.h */
#define ROUTER_MAX_EXPERTS 8192
/* router_kernel's dynamic shared memory: σ and σ + bias f32, a taken flag u8, per expert */
#define ROUTER_SMEM(n_exp) ((size_t)(n_exp) * (2 * sizeof(float) + 1))

static __device__ __forceinline__ float router_sigma(float l, float temp) {
    float x = __fdiv_rn(l, temp);
    float sp = x > 20.0f ? x : d_log1pf(d_expf(x)); /* torch softplus, threshold 20 */
    return __fsqrt_rn(sp);
}

/* a beats b: larger score, ties to the lower id; NaN never wins (router.c) */
static __device__ __forceinline__ bool router_beats(float sa, int ia, float sb, int ib) {
    if (isnan(sb)) return !isnan(sa) || ia < ib;
    if (isnan(sa)) return false;
    return sa > sb || (sa == sb && ia < ib);
}

/* The better of (s, i) and (os, oi) under router_beats; id −1 = none yet */
static __device__ __forceinline__ void router_take(float &s, int &i, float os, int oi) {
    if (oi >= 0 && (i < 0 || router_beats(os, oi, s, i))) s = os, i = oi;
}

/* the best (s, i) of the warp's lanes, on every lane */
static __device__ __forceinline__ void router_warp_best(float &s, int &i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float os = __shfl_xor_sync(0xffffffffu, s, off);
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        router_take(s, i, os, oi);
    }
}

/* One block per token: σ and σ + bias of every expert in parallel into shared memory; then k rounds of a
 * block-wide argmax under router_beats over the experts not yet chosen. router_beats is a strict total
 * order (score descending, ids breaking ties, NaN after every number and among themselves by id), so
 * each round's maximum is unique whatever the reduction order, and the k maxima in round order are the
 * CPU's sorted best-k list (its insertion keeps exactly the k greatest in this order). Before, each
 * expert counted the experts that beat it (n_exp compares per thread): the warps holding a chosen
 * expert ran all 384 compares, 30 µs per decode token on the H200 (2026-12-01); the rounds take a few
 * µs. Thread 0 then sums the weights in selection order.
 * Shared: f32 [2, n_exp] + u8 [n_exp] (taken) + the per-warp partial maxima + int [ROUTER_MAX_TOPK]. */
__global__ void router_kernel(const float *logits, int n_exp, const float *bias, float temp, int k, float scale,
                              int32_t *ids, float *weights) {
    extern __shared__ float rsh[]; /* f32 [2, n_exp]: σ, then σ + bias; then u8 [n_exp]: chosen already */
    __shared__ int chosen[ROUTER_MAX_TOPK];
    __shared__ float part_s[32];
    __shared__ int part_i[32];
    float *sig = rsh, *sc = rsh + n_exp;
    uint8_t *taken = (uint8_t *)(rsh + 2 * n_exp);
    const float *l = logits + (int64_t)blockIdx.x * n_exp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    for (int e = threadIdx.x; e < n_exp; e += blockDim.x) {
        sig[e] = router_sigma(l[e], temp);
        sc[e] = __fadd_rn(sig[e], bias ? bias[e] : 0.0f);
        taken[e] = 0;
    }
    __syncthreads();
    for (int j = 0; j < k; j++) {
        float bs = 0.0f;
        int bi = -1;
        for (int e = threadIdx.x; e < n_exp; e += blockDim.x)
            if (!taken[e]) router_take(bs, bi, sc[e], e);
        router_warp_best(bs, bi);
        if (lane == 0) part_s[warp] = bs, part_i[warp] = bi;
        __syncthreads();
        if (warp == 0) {
            bs = 0.0f, bi = -1;
            if (lane < nwarps) bs = part_s[lane], bi = part_i[lane];
            router_warp_best(bs, bi);
            if (lane == 0) chosen[j] = bi, taken[bi] = 1; /* k ≤ n_exp: some expert is always left */
        }
        __syncthreads();
    }
    if (threadIdx.x) return;
    int32_t *id = ids + (int64_t)blockIdx.x * k;
    float *w = weights + (int64_t)blockIdx.x * k;
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        id[j] = chosen[j];
        w[j] = sig[chosen[j]];
        sum = __fadd_rn(sum, w[j]);
    }
    for (int j = 0; j < k; j++) {
        float v = w[j];
        if (k > 1) v = __fdiv_rn(v, __fadd_rn(sum, 1e-20f));
        w[j] = __fmul_rn(v, scale);
    }
}

extern "C" int di_cuda_router(const di_backend *be, const float *logits, int64_t m, int n_exp, const float *bias,
                              float temp, int k, bool normalize, float scale, int32_t *ids, float *weights,
                              di_error *err) {
    if (k <= 0 || k > n_exp || k > ROUTER_MAX_TOPK || n_exp > ROUTER_MAX_EXPERTS || m < 0)
        return di_error_set(err, DI_ERR_INVALID, "cuda router: top-%d of %d experts", k, n_exp);
    if (!normalize) return di_error_set(err, DI_ERR_UNSUPPORTED, "cuda router: norm_topk_prob = false");
    if (m == 0) return DI_OK;
    const size_t smem = ROUTER_SMEM(n_exp);
    static bool raised = false; /* past 48 KiB (more than 5,461 experts) the kernel needs the opt-in */
    if (smem > 48 * 1024 && !raised) {
        cudaFuncSetAttribute(router_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ROUTER_SMEM(ROUTER_MAX_EXPERTS));
        raised = true;
    }
    router_kernel<<<(unsigned)m, 384, smem, di_cuda_state(be)->stream>>>(logits, n_exp, bias, temp, k, scale, ids, weights);
    return di_cuda_launched("router", err);
}

/* ---------------- Engram ---------------- */

/* y[i, j] = bf16(e4m3(table[id, j]) · 2^(scale[id, j/32] − 127)); an id outside [0, rows) gives zeros.
 * The table may be host-mapped memory (cudaHostRegister / cudaHostAlloc mapped): each row is read once. */
__global__ void engram_lookup_kernel(const uint8_t *table, const uint8_t *scale, int64_t rows, int hd,
                                     const int64_t *ids, int64_t n_rows_out, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_rows_out * hd) return;
    int64_t i = e / hd;
    int j = (int)(e % hd);
    int64_t id = ids[i];
    if (id < 0 || id >= rows) {
        y[e] = 0;
        return;
    }
    y[e] = d_to_bf16(__fmul_rn(d_e4m3_decode(table[id * hd + j]), d_e8m0(scale[id * (hd / 32) + j / 32])));
}

extern "C" int di_cuda_engram_lookup(const di_backend *be, const uint8_t *table, const uint8_t *scale, int64_t rows,
                                     int hd, const int64_t *ids, int64_t m, int n_cols, uint16_t *y, di_error *err) {
    if (hd <= 0 || hd % 32 || m < 0 || n_cols < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda engram_lookup: row width %d (multiple of 32), %lld tokens × %d", hd,
                            (long long)m, n_cols);
    int64_t n = m * n_cols * hd;
    if (n == 0) return DI_OK;
    engram_lookup_kernel<<<di_cuda_blocks(n, 256), 256, 0, di_cuda_state(be)->stream>>>(table, scale, rows, hd, ids,
                                                                                        m * n_cols, y);
    return di_cuda_launched("engram_lookup", err);
}

#define GATE_U 10 /* elements per thread whose loads are issued together (V4.1: D 5120 = 2 × 10 × 256) */

/* One block per (token, stream): the three statistics Σx², Σkey², Σ(x·wq)·key of f32 terms in f64,
 * then the gate in f32 as engram_ops.c, then x ← bf16(x + gate·value). In-place safe: each thread
 * rewrites only the elements it read, after the block-wide sums. A thread's elements are j, j + 256, …
 * added in that order; their loads go out GATE_U at a time (at one token the 4 blocks would otherwise
 * wait for one load round trip per element). */
__global__ void engram_gate_kernel(uint16_t *x, const uint16_t *kv, int hc, int64_t D, const uint16_t *qw,
                                   const uint16_t *kw, float eps, float inv_sqrt_d) {
    __shared__ double sh[32]; /* f64 [32] per-warp partial sums */
    int64_t t = blockIdx.x / hc;
    int s = blockIdx.x % hc;
    uint16_t *h = x + (t * hc + s) * D;
    const uint16_t *key = kv + t * (hc + 1) * D + s * D, *value = kv + t * (hc + 1) * D + hc * D;
    const int64_t bd = blockDim.x;
    double hh = 0, kk = 0, dot = 0;
    for (int64_t j0 = threadIdx.x; j0 < D; j0 += GATE_U * bd) {
        uint16_t hb[GATE_U], kb[GATE_U], qb[GATE_U], wb[GATE_U];
#pragma unroll
        for (int u = 0; u < GATE_U; u++) {
            const int64_t j = j0 + u * bd;
            if (j < D) hb[u] = h[j], kb[u] = key[j], qb[u] = qw[s * D + j], wb[u] = kw[s * D + j];
        }
#pragma unroll
        for (int u = 0; u < GATE_U; u++) {
            if (j0 + u * bd >= D) break;
            float hv = d_bf16(hb[u]), kvv = d_bf16(kb[u]);
            float w = __fmul_rn(d_bf16(qb[u]), d_bf16(wb[u]));
            hh += (double)__fmul_rn(hv, hv);
            kk += (double)__fmul_rn(kvv, kvv);
            dot += (double)__fmul_rn(__fmul_rn(hv, w), kvv);
        }
    }
    hh = d_block_sum_f64(hh, sh);
    kk = d_block_sum_f64(kk, sh);
    dot = d_block_sum_f64(dot, sh);
    float rh = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(__double2float_rn(hh), (float)D), eps)));
    float rk = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(__double2float_rn(kk), (float)D), eps)));
    float dd = __fmul_rn(__fmul_rn(__double2float_rn(dot), __fmul_rn(rh, rk)), inv_sqrt_d);
    float mag = fabsf(dd) > 1e-6f ? fabsf(dd) : 1e-6f;
    float z = copysignf(__fsqrt_rn(mag), dd);
    float gate = __fdiv_rn(1.0f, __fadd_rn(1.0f, d_expf(-z)));
    for (int64_t j0 = threadIdx.x; j0 < D; j0 += GATE_U * bd) {
        uint16_t hb[GATE_U], vb[GATE_U];
#pragma unroll
        for (int u = 0; u < GATE_U; u++) {
            const int64_t j = j0 + u * bd;
            if (j < D) hb[u] = h[j], vb[u] = value[j];
        }
#pragma unroll
        for (int u = 0; u < GATE_U; u++) {
            const int64_t j = j0 + u * bd;
            if (j < D) h[j] = d_to_bf16(__fadd_rn(d_bf16(hb[u]), __fmul_rn(gate, d_bf16(vb[u]))));
        }
    }
}

extern "C" int di_cuda_engram_gate(const di_backend *be, uint16_t *x, const uint16_t *kv, int64_t m, int hc, int64_t d,
                                   const uint16_t *qw, const uint16_t *kw, float eps, di_error *err) {
    if (m < 0 || hc < 1 || d < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda engram_gate: %lld tokens, %d streams of %lld", (long long)m, hc,
                            (long long)d);
    if (m == 0) return DI_OK;
    float inv_sqrt_d = (float)(1.0 / sqrt((double)d)); /* torch casts the Python float dim**-0.5 to f32 */
    engram_gate_kernel<<<(unsigned)(m * hc), 256, 0, di_cuda_state(be)->stream>>>(x, kv, hc, d, qw, kw, eps, inv_sqrt_d);
    return di_cuda_launched("engram_gate", err);
}
