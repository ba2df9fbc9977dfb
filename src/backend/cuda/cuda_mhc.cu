/* mHC on the GPU (spec §3.3, §4.2): per-token mixes, the Sinkhorn split, collapse and expand of the hc
 * residual streams, plus the compressor's softmax pooling (§4.4). Rounding points as mhc.c /
 * compressor.c; see cuda_common.cuh for the exactness contract. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define HC_MAX 8 /* DI_HC_MAX of cpu_attn.h */

/* One block per (token, mix); each block recomputes the token's Σ xf² (n values, cheap) so that the
 * n_mix dot products run in parallel. Σ xf² and Σ xf·fn are sums of products that are exact in f64
 * (bf16 × bf16, bf16 × f32); mhc.c adds them in 8 strided f64 lanes, the GPU in a block tree, and both
 * round the f64 total once to f32 — equal unless the two f64 sums straddle an f32 rounding boundary. */
__global__ void hc_mixes_kernel(const uint16_t *x, int64_t n, const float *fn, int n_mix, float eps, float *mixes) {
    __shared__ double sh[32]; /* f64 [32] per-warp partial sums */
    const uint16_t *xt = x + blockIdx.x * n;
    const int j = blockIdx.y;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double v = d_bf16(xt[i]);
        ss += v * v;
    }
    ss = d_block_sum_f64(ss, sh);
    float mean = __fdiv_rn(__double2float_rn(ss), (float)n);
    float rho = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    const float *f = fn + (int64_t)j * n;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)d_bf16(xt[i]) * (double)f[i];
    s = d_block_sum_f64(s, sh);
    if (threadIdx.x == 0) mixes[blockIdx.x * n_mix + j] = __fmul_rn(__double2float_rn(s), rho);
}

extern "C" int di_cuda_hc_mixes(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, const float *fn,
                                float eps, float *mixes, di_error *err) {
    if (hc < 1 || hc > HC_MAX || m < 0 || d < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda hc_mixes: hc = %d (1..%d), %lld tokens of %lld", hc, HC_MAX,
                            (long long)m, (long long)d);
    if (m == 0) return DI_OK;
    dim3 grid((unsigned)m, (unsigned)((2 + hc) * hc));
    hc_mixes_kernel<<<grid, 256, 0, di_cuda_state(be)->stream>>>(x, (int64_t)hc * d, fn, (2 + hc) * hc, eps, mixes);
    return di_cuda_launched("hc_mixes", err);
}

static __device__ __forceinline__ float d_sigmoid(float v) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, d_expf(-v))); }

/* One thread per token: the whole split + Sinkhorn of mhc.c (a few hundred flops on an hc×hc matrix). */
__global__ void hc_sinkhorn_kernel(const float *mixes, int64_t m, int hc, const float *scale, const float *base,
                                   int iters, float eps, float *pre, float *post, float *comb) {
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m) return;
    const int n_mix = (2 + hc) * hc;
    const float *mx_ = mixes + t * n_mix;
    float *pr = pre + t * hc, *po = post + t * hc;
    float c[HC_MAX][HC_MAX];
    for (int k = 0; k < hc; k++) {
        pr[k] = __fadd_rn(d_sigmoid(__fadd_rn(__fmul_rn(mx_[k], scale[0]), base[k])), eps);
        po[k] = __fmul_rn(2.0f, d_sigmoid(__fadd_rn(__fmul_rn(mx_[hc + k], scale[1]), base[hc + k])));
    }
    for (int j = 0; j < hc; j++)
        for (int k = 0; k < hc; k++)
            c[j][k] = __fadd_rn(__fmul_rn(mx_[2 * hc + j * hc + k], scale[2]), base[2 * hc + j * hc + k]);
    for (int j = 0; j < hc; j++) { /* iteration 0's row step: softmax + eps */
        float mx = c[j][0];
        for (int k = 1; k < hc; k++) mx = c[j][k] > mx ? c[j][k] : mx;
        float s = 0.0f;
        for (int k = 0; k < hc; k++) {
            c[j][k] = d_expf(__fsub_rn(c[j][k], mx));
            s = __fadd_rn(s, c[j][k]);
        }
        for (int k = 0; k < hc; k++) c[j][k] = __fadd_rn(__fdiv_rn(c[j][k], s), eps);
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {
                float s = 0.0f;
                for (int k = 0; k < hc; k++) s = __fadd_rn(s, c[j][k]);
                s = __fadd_rn(s, eps);
                for (int k = 0; k < hc; k++) c[j][k] = __fdiv_rn(c[j][k], s);
            }
        for (int k = 0; k < hc; k++) {
            float s = 0.0f;
            for (int j = 0; j < hc; j++) s = __fadd_rn(s, c[j][k]);
            s = __fadd_rn(s, eps);
            for (int j = 0; j < hc; j++) c[j][k] = __fdiv_rn(c[j][k], s);
        }
    }
    for (int j = 0; j < hc; j++)
        for (int k = 0; k < hc; k++) comb[(t * hc + j) * hc + k] = c[j][k];
}

extern "C" int di_cuda_hc_sinkhorn(const di_backend *be, const float *mixes, int64_t m, int hc, const float *scale,
                                   const float *base, int iters, float eps, float *pre, float *post, float *comb,
                                   di_error *err) {
    if (hc < 1 || hc > HC_MAX || m < 0 || iters < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda hc_sinkhorn: hc = %d (1..%d), %lld tokens, %d iterations", hc,
                            HC_MAX, (long long)m, iters);
    if (m == 0) return DI_OK;
    hc_sinkhorn_kernel<<<di_cuda_blocks(m, 128), 128, 0, di_cuda_state(be)->stream>>>(mixes, m, hc, scale, base, iters,
                                                                                      eps, pre, post, comb);
    return di_cuda_launched("hc_sinkhorn", err);
}

/* y[t, i] = bf16(Σ_k pre[t,k]·x[t,k,i]), k ascending, f32 (one thread per output). */
__global__ void hc_collapse_kernel(const uint16_t *x, const float *pre, int64_t m, int hc, int64_t d, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * d) return;
    int64_t t = e / d, i = e % d;
    const uint16_t *xt = x + t * hc * d;
    float s = 0.0f;
    for (int k = 0; k < hc; k++) s = __fadd_rn(s, __fmul_rn(pre[t * hc + k], d_bf16(xt[k * d + i])));
    y[e] = d_to_bf16(s);
}

extern "C" int di_cuda_hc_collapse(const di_backend *be, const uint16_t *x, const float *pre, int64_t m, int hc,
                                   int64_t d, uint16_t *y, di_error *err) {
    if (hc < 1 || hc > HC_MAX || m < 0 || d < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda hc_collapse: hc = %d, %lld tokens of %lld", hc, (long long)m, (long long)d);
    if (m == 0) return DI_OK;
    hc_collapse_kernel<<<di_cuda_blocks(m * d, 256), 256, 0, di_cuda_state(be)->stream>>>(x, pre, m, hc, d, y);
    return di_cuda_launched("hc_collapse", err);
}

/* y[t,k,i] = bf16(post[t,k]·z[t,i] + Σ_j comb[t,j,k]·x[t,j,i]); one thread per (t, i) reads all hc inputs
 * of its column before writing, so y may alias x. */
__global__ void hc_expand_kernel(const uint16_t *z, const uint16_t *x, const float *post, const float *comb, int64_t m,
                                 int hc, int64_t d, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * d) return;
    int64_t t = e / d, i = e % d;
    const float *po = post + t * hc, *c = comb + t * hc * hc;
    float xi[HC_MAX];
    for (int j = 0; j < hc; j++) xi[j] = d_bf16(x[(t * hc + j) * d + i]);
    float zi = d_bf16(z[t * d + i]);
    for (int k = 0; k < hc; k++) {
        float r = 0.0f;
        for (int j = 0; j < hc; j++) r = __fadd_rn(r, __fmul_rn(c[j * hc + k], xi[j]));
        y[(t * hc + k) * d + i] = d_to_bf16(__fadd_rn(__fmul_rn(po[k], zi), r));
    }
}

extern "C" int di_cuda_hc_expand(const di_backend *be, const uint16_t *z, const uint16_t *x, const float *post,
                                 const float *comb, int64_t m, int hc, int64_t d, uint16_t *y, di_error *err) {
    if (hc < 1 || hc > HC_MAX || m < 0 || d < 1)
        return di_error_set(err, DI_ERR_INVALID, "cuda hc_expand: hc = %d, %lld tokens of %lld", hc, (long long)m, (long long)d);
    if (m == 0) return DI_OK;
    hc_expand_kernel<<<di_cuda_blocks(m * d, 256), 256, 0, di_cuda_state(be)->stream>>>(z, x, post, comb, m, hc, d, y);
    return di_cuda_launched("hc_expand", err);
}

/* ---------------- compressor pooling ---------------- */

/* Entry g, channel j of a prefill from position 0: softmax over the R slots (max-subtracted exp over the
 * sum, slots ascending) and Σ a·(e/sum) in f32, as compressor.c's pool_group. The exps are evaluated
 * twice (sum, then weights) instead of stored: same function, same bits. */
__global__ void compress_pool_kernel(const float *a, const float *g, int64_t n_groups, int ratio, int64_t d, uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_groups * d) return;
    int64_t grp = e / d, j = e % d;
    const float *ag = a + grp * ratio * d + j, *gg = g + grp * ratio * d + j;
    float mx = gg[0];
    for (int s = 1; s < ratio; s++) mx = gg[s * d] > mx ? gg[s * d] : mx;
    float sum = 0.0f;
    for (int s = 0; s < ratio; s++) sum = __fadd_rn(sum, d_expf(__fsub_rn(gg[s * d], mx)));
    float acc = 0.0f;
    for (int s = 0; s < ratio; s++)
        acc = __fadd_rn(acc, __fmul_rn(ag[s * d], __fdiv_rn(d_expf(__fsub_rn(gg[s * d], mx)), sum)));
    y[e] = d_to_bf16(acc);
}

extern "C" int di_cuda_compress_pool(const di_backend *be, const float *a, const float *gate, int64_t m, int ratio,
                                     int64_t d, uint16_t *y, di_error *err) {
    if (ratio < 2 || ratio > 128 || d < 1 || m < 0)
        return di_error_set(err, DI_ERR_INVALID, "cuda compress_pool: ratio %d (2..128), width %lld, %lld tokens", ratio,
                            (long long)d, (long long)m);
    int64_t ng = m / ratio;
    if (ng == 0) return DI_OK;
    compress_pool_kernel<<<di_cuda_blocks(ng * d, 256), 256, 0, di_cuda_state(be)->stream>>>(a, gate, ng, ratio, d, y);
    return di_cuda_launched("compress_pool", err);
}

/* ---------------- streaming compressor (prefill, chunk or decode step) ---------------- */

/* Emitted entry e (group start_pos/R + e), channel j: slot s of the group comes from the carry state when
 * its position precedes this call, else from the call's own row; then pool_group's arithmetic. */
__global__ void compress_stream_pool_kernel(const float *a, const float *g, int64_t start_pos, int ratio, int64_t d,
                                            const float *kv_state, const float *score_state, int64_t n_out,
                                            uint16_t *y) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_out * d) return;
    int64_t ent = e / d, j = e % d;
    int64_t p0 = (start_pos / ratio + ent) * ratio; /* first position of the group */
#define SRC_SCORE(s) (p0 + (s) < start_pos ? score_state[(int64_t)(s) * d + j] : g[(p0 + (s) - start_pos) * d + j])
#define SRC_KV(s) (p0 + (s) < start_pos ? kv_state[(int64_t)(s) * d + j] : a[(p0 + (s) - start_pos) * d + j])
    float mx = SRC_SCORE(0);
    for (int s = 1; s < ratio; s++) mx = SRC_SCORE(s) > mx ? SRC_SCORE(s) : mx;
    float sum = 0.0f;
    for (int s = 0; s < ratio; s++) sum = __fadd_rn(sum, d_expf(__fsub_rn(SRC_SCORE(s), mx)));
    float acc = 0.0f;
    for (int s = 0; s < ratio; s++)
        acc = __fadd_rn(acc, __fmul_rn(SRC_KV(s), __fdiv_rn(d_expf(__fsub_rn(SRC_SCORE(s), mx)), sum)));
#undef SRC_SCORE
#undef SRC_KV
    y[e] = d_to_bf16(acc);
}

/* Slot s keeps the call's last token at a position ≡ s (mod R), or its old contents. Runs after the
 * pooling kernel on the same stream, which read the old state. */
__global__ void compress_stream_state_kernel(const float *a, const float *g, int64_t m, int64_t start_pos, int ratio,
                                             int64_t d, float *kv_state, float *score_state) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)ratio * d) return;
    int64_t s = e / d, j = e % d;
    int64_t off = ((s - start_pos % ratio) % ratio + ratio) % ratio; /* first call row with that slot */
    if (off >= m) return;
    int64_t t = off + (m - 1 - off) / ratio * ratio; /* the last one */
    kv_state[e] = a[t * d + j];
    score_state[e] = g[t * d + j];
}

extern "C" int di_cuda_compress_pool_stream(const di_backend *be, const float *a, const float *gate, int64_t m,
                                            int64_t start_pos, int ratio, int64_t d, float *kv_state,
                                            float *score_state, uint16_t *y, int64_t *n_out, di_error *err) {
    if (ratio < 2 || ratio > 128 || d < 1 || m < 0 || start_pos < 0)
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda compress_pool_stream: ratio %d (2..128), width %lld, %lld tokens from %lld", ratio,
                            (long long)d, (long long)m, (long long)start_pos);
    int64_t emitted = (start_pos + m) / ratio - start_pos / ratio;
    if (n_out) *n_out = emitted;
    if (m == 0) return DI_OK;
    cudaStream_t st = di_cuda_state(be)->stream;
    if (emitted > 0) {
        compress_stream_pool_kernel<<<di_cuda_blocks(emitted * d, 256), 256, 0, st>>>(a, gate, start_pos, ratio, d,
                                                                                     kv_state, score_state, emitted, y);
        int rc = di_cuda_launched("compress_pool_stream", err);
        if (rc) return rc;
    }
    compress_stream_state_kernel<<<di_cuda_blocks((int64_t)ratio * d, 256), 256, 0, st>>>(a, gate, m, start_pos, ratio,
                                                                                          d, kv_state, score_state);
    return di_cuda_launched("compress_pool_stream", err);
}
