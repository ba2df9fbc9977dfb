/* Sparse single-KV-head attention with the attention sink on the GPU (spec §3.4, §4.1, §5.3): decode and
 * prefill alike (one query row per token), over [kv_win ‖ kv_cmp] at each query's index list, with the
 * reference kernel's online softmax in blocks of 64 indices, bf16-rounded probabilities before PV and a
 * running max that starts at −1e30 (sparse_attn.c).
 *
 * One thread block per (query, head), 512 threads. Per 64-index step:
 *  - scores: 8 threads per index, thread l accumulating channels ≡ l (mod 8) in ascending order, then
 *    ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) through shuffles — the CPU's dot_f32_bf16 order exactly;
 *  - max, exps and the probability sum (8 strided lanes, sum_f32's order) on a few threads;
 *  - PV: one thread per channel adds p_k·c_k[d] over k ascending, as axpy_bf16 does per channel.
 * Part 1 keeps this plain structure; sharing KV reads across the 64 heads is part 2's work. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define SA_BLOCK 64   /* DI_SPARSE_ATTN_BLOCK */
#define SA_MAX_DIM 1024
#define SA_THREADS 512

__global__ void __launch_bounds__(SA_THREADS) sparse_attn_kernel(const uint16_t *q, int nh, int d,
                                                                 const uint16_t *kv_win, int64_t n_win,
                                                                 const uint16_t *kv_cmp, int64_t n_cmp,
                                                                 const float *sink, const int32_t *idx, int64_t n_idx,
                                                                 float scale, uint16_t *out) {
    __shared__ float qs[SA_MAX_DIM];         /* f32 [d] */
    __shared__ float sc[SA_BLOCK];           /* scaled scores, then f32 probabilities */
    __shared__ float pb[SA_BLOCK];           /* bf16-rounded probabilities */
    __shared__ const uint16_t *rows[SA_BLOCK]; /* [64] KV row of each slot, NULL = skipped */
    __shared__ float st[2];                  /* running max m, this step's alpha */
    __shared__ float lsum;                   /* running f32 probability sum (thread 0 writes) */
    const int64_t qi = blockIdx.x / nh;
    const int h = blockIdx.x % nh, t = threadIdx.x;
    const uint16_t *qv = q + (qi * nh + h) * (int64_t)d;
    const int32_t *ix = idx + qi * n_idx;
    for (int j = t; j < d; j += SA_THREADS) qs[j] = d_bf16(qv[j]);
    float o0 = 0.0f, o1 = 0.0f; /* running Σ p·c of channels t and t + 512 */
    if (t == 0) st[0] = -1e30f, lsum = 0.0f;
    __syncthreads();
    for (int64_t b0 = 0; b0 < n_idx; b0 += SA_BLOCK) {
        const int nb = (int)(n_idx - b0 < SA_BLOCK ? n_idx - b0 : SA_BLOCK);
        { /* scores: slot t/8, lane t%8 */
            const int slot = t >> 3, l = t & 7;
            const uint16_t *row = NULL;
            if (slot < nb) {
                int32_t id = ix[b0 + slot];
                if (id >= 0 && id < n_win) row = kv_win + (int64_t)id * d;
                else if (id >= n_win && id < n_win + n_cmp) row = kv_cmp + (int64_t)(id - n_win) * d;
            }
            float acc = 0.0f;
            if (row)
                for (int j = l; j < d; j += 8) acc = __fadd_rn(acc, __fmul_rn(qs[j], d_bf16(row[j])));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
            acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
            if (l == 0 && slot < SA_BLOCK) {
                rows[slot] = row;
                sc[slot] = row ? __fmul_rn(acc, scale) : -INFINITY;
            }
        }
        __syncthreads();
        if (t == 0) { /* block max in slot order, then the new running max and alpha */
            float bmax = -INFINITY;
            for (int k = 0; k < nb; k++) bmax = sc[k] > bmax ? sc[k] : bmax;
            float m = st[0], m_new = bmax > m ? bmax : m;
            st[1] = d_expf(__fsub_rn(m, m_new));
            st[0] = m_new;
        }
        __syncthreads();
        const float m_new = st[0], alpha = st[1];
        if (t < nb) {
            float p = d_expf(__fsub_rn(sc[t], m_new)); /* −inf → 0 */
            sc[t] = p;
            pb[t] = d_round_bf16(p);
        }
        __syncthreads();
        if (t == 0) { /* l = l·alpha + sum_f32(p): 8 strided lanes combined pairwise */
            float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int k = 0; k < nb; k++) {
                switch (k & 7) {
                case 0: lane[0] = __fadd_rn(lane[0], sc[k]); break;
                case 1: lane[1] = __fadd_rn(lane[1], sc[k]); break;
                case 2: lane[2] = __fadd_rn(lane[2], sc[k]); break;
                case 3: lane[3] = __fadd_rn(lane[3], sc[k]); break;
                case 4: lane[4] = __fadd_rn(lane[4], sc[k]); break;
                case 5: lane[5] = __fadd_rn(lane[5], sc[k]); break;
                case 6: lane[6] = __fadd_rn(lane[6], sc[k]); break;
                default: lane[7] = __fadd_rn(lane[7], sc[k]); break;
                }
            }
            float s = __fadd_rn(__fadd_rn(__fadd_rn(lane[0], lane[1]), __fadd_rn(lane[2], lane[3])),
                                __fadd_rn(__fadd_rn(lane[4], lane[5]), __fadd_rn(lane[6], lane[7])));
            lsum = __fadd_rn(__fmul_rn(lsum, alpha), s);
        }
        /* PV for channels t and t + 512 */
        float pv0 = 0.0f, pv1 = 0.0f;
        for (int k = 0; k < nb; k++) {
            const uint16_t *row = rows[k];
            if (!row) continue;
            float p = pb[k];
            if (t < d) pv0 = __fadd_rn(pv0, __fmul_rn(p, d_bf16(row[t])));
            if (t + SA_THREADS < d) pv1 = __fadd_rn(pv1, __fmul_rn(p, d_bf16(row[t + SA_THREADS])));
        }
        o0 = __fadd_rn(__fmul_rn(o0, alpha), pv0);
        o1 = __fadd_rn(__fmul_rn(o1, alpha), pv1);
        __syncthreads(); /* sc, pb, rows and st are rewritten by the next step */
    }
    const float l = __fadd_rn(lsum, d_expf(__fsub_rn(sink[h], st[0])));
    uint16_t *ov = out + (qi * nh + h) * (int64_t)d;
    if (t < d) ov[t] = d_to_bf16(__fdiv_rn(o0, l));
    if (t + SA_THREADS < d) ov[t + SA_THREADS] = d_to_bf16(__fdiv_rn(o1, l));
}

extern "C" int di_cuda_sparse_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d,
                                   const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp,
                                   const float *sink, const int32_t *idx, int64_t n_idx, float scale, uint16_t *out,
                                   di_error *err) {
    if (m < 0 || nh < 1 || d < 1 || d > SA_MAX_DIM || n_win < 0 || n_cmp < 0 || n_idx < 0 || (n_cmp > 0 && !kv_cmp))
        return di_error_set(err, DI_ERR_INVALID,
                            "cuda sparse_attn: n_q %lld, n_heads %d, dim %d (max %d), n_win %lld, n_cmp %lld, n_idx %lld",
                            (long long)m, nh, d, SA_MAX_DIM, (long long)n_win, (long long)n_cmp, (long long)n_idx);
    if (m == 0) return DI_OK;
    sparse_attn_kernel<<<(unsigned)(m * nh), SA_THREADS, 0, di_cuda_state(be)->stream>>>(
        q, nh, d, kv_win, n_win, kv_cmp, n_cmp, sink, idx, n_idx, scale, out);
    return di_cuda_launched("sparse_attn", err);
}
