/* The sparse attention of one (query, head) — the body of cuda_attn.cu's sparse_attn_kernel, shared
 * with cuda_rows.cu's sparse_attn_seqs_kernel, which only finds the query's key set and index row in a
 * per-sequence descriptor first: one source, so the two kernels' arithmetic cannot drift apart (same
 * expressions in the same order; the design and numerics are described in cuda_attn.cu's header).
 * Include after cuda_common.cuh. */
#ifndef DI_CUDA_SPARSE_ATTN_CUH
#define DI_CUDA_SPARSE_ATTN_CUH

#define SA_BLOCK 64   /* DI_SPARSE_ATTN_BLOCK */
#define SA_MAX_DIM 1024
#define SA_THREADS 512

/* Called by all SA_THREADS threads of a block: row qh = query·heads + h of q / out bf16 [.., d] (head h),
 * keys [kv_win ‖ kv_cmp] bf16 [n_win + n_cmp, d] at the n_idx ids ix (out of range: skipped), sink f32
 * [heads]. */
static __device__ __forceinline__ void d_sparse_attn_query(const uint16_t *q, int64_t qh, int h, int d,
                                                           const uint16_t *kv_win, int64_t n_win,
                                                           const uint16_t *kv_cmp, int64_t n_cmp, const float *sink,
                                                           const int32_t *ix, int64_t n_idx, float scale,
                                                           uint16_t *out) {
    __shared__ float qs[SA_MAX_DIM];         /* f32 [d] */
    __shared__ float sc[SA_BLOCK];           /* scaled scores, then f32 probabilities */
    __shared__ float pb[SA_BLOCK];           /* bf16-rounded probabilities */
    __shared__ const uint16_t *rows[SA_BLOCK]; /* [64] KV row of each slot, NULL = skipped */
    __shared__ float st[2];                  /* running max m, this step's alpha */
    __shared__ float lsum;                   /* running f32 probability sum (thread 0 writes) */
    const int t = threadIdx.x;
    const uint16_t *qv = q + qh * (int64_t)d;
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
    uint16_t *ov = out + qh * (int64_t)d;
    if (t < d) ov[t] = d_to_bf16(__fdiv_rn(o0, l));
    if (t + SA_THREADS < d) ov[t + SA_THREADS] = d_to_bf16(__fdiv_rn(o1, l));
}

#endif
