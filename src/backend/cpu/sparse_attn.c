/* Sparse single-KV-head attention with the attention sink (spec model.md §3.4, §4.1, §5.3): the
 * reference kernel's online softmax over 64-index blocks, including its two rounding quirks that a
 * textbook softmax would not have — probabilities rounded to bf16 against the RUNNING max before the
 * PV product (while the denominator sums them in f32), and a running max that starts at −1e30. */
#include <math.h>

#include "backend/cpu/cpu_attn.h"
#include "io/formats.h"
#include "util/error.h"

/* f32 dot product q·f32(c), 8 strided partial sums combined pairwise (fixed order). */
static float dot_f32_bf16(const float *q, const uint16_t *c, int n) {
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += q[i + l] * di_bf16_to_f32(c[i + l]);
    for (; i < n; i++) lane[i & 7] += q[i] * di_bf16_to_f32(c[i]);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static float sum_f32(const float *x, int n) {
    float lane[8] = {0};
    for (int i = 0; i < n; i++) lane[i & 7] += x[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* y[d] += a·f32(c[d]); elementwise, so chunking for the vectorizer changes no result. */
static void axpy_bf16(float *restrict y, float a, const uint16_t *restrict c, int n) {
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) y[d + l] += a * di_bf16_to_f32(c[d + l]);
    for (; d < n; d++) y[d] += a * di_bf16_to_f32(c[d]);
}

/* One (query, head): the whole online softmax over the query's index list. Cloned for AVX2 with a
 * baseline fallback; both vectorize the same explicit lanes and give the same bits. */
DI_CPU_CLONES static void attend_one(
    const uint16_t *q_bf16 /* bf16 [dim] */, int dim, const uint16_t *kv_win, int64_t n_win, const uint16_t *kv_cmp,
    float sink, const int32_t *idx /* int32 [n_idx] */, int64_t n_idx, float scale, uint16_t *out /* bf16 [dim] */) {
    float q[DI_SPARSE_ATTN_MAX_DIM];   /* f32 [dim] */
    float o[DI_SPARSE_ATTN_MAX_DIM];   /* f32 [dim] running Σ p·c */
    float pv[DI_SPARSE_ATTN_MAX_DIM];  /* f32 [dim] this block's Σ bf16(p)·c */
    float s[DI_SPARSE_ATTN_BLOCK];     /* f32 scaled scores, then probabilities */
    const uint16_t *row[DI_SPARSE_ATTN_BLOCK]; /* bf16 [dim] KV row per block index, NULL for −1 */
    for (int d = 0; d < dim; d++) {
        q[d] = di_bf16_to_f32(q_bf16[d]);
        o[d] = 0.0f;
    }
    float m = -1e30f; /* finite start: an all-(−1) row ends with exp(sink + 1e30) = inf and o = 0 */
    float l = 0.0f;
    for (int64_t b0 = 0; b0 < n_idx; b0 += DI_SPARSE_ATTN_BLOCK) {
        int nb = (int)(n_idx - b0 < DI_SPARSE_ATTN_BLOCK ? n_idx - b0 : DI_SPARSE_ATTN_BLOCK);
        float bmax = -INFINITY;
        for (int k = 0; k < nb; k++) {
            int32_t id = idx[b0 + k];
            if (id < 0) {
                row[k] = NULL;
                s[k] = -INFINITY;
                continue;
            }
            row[k] = id < n_win ? kv_win + (int64_t)id * dim : kv_cmp + (int64_t)(id - n_win) * dim;
            s[k] = dot_f32_bf16(q, row[k], dim) * scale;
            bmax = s[k] > bmax ? s[k] : bmax;
        }
        float m_new = bmax > m ? bmax : m;
        float alpha = expf(m - m_new);
        for (int k = 0; k < nb; k++) s[k] = expf(s[k] - m_new); /* −inf → 0 */
        l = l * alpha + sum_f32(s, nb);
        for (int d = 0; d < dim; d++) pv[d] = 0.0f;
        for (int k = 0; k < nb; k++) {
            if (!row[k]) continue;
            float p = di_round_bf16(s[k]); /* the reference's bf16 probability matrix */
            axpy_bf16(pv, p, row[k], dim);
        }
        for (int d = 0; d < dim; d++) o[d] = o[d] * alpha + pv[d];
        m = m_new;
    }
    l += expf(sink - m);
    for (int d = 0; d < dim; d++) out[d] = di_f32_to_bf16(o[d] / l);
}

int di_cpu_sparse_attn(const uint16_t *q, int64_t n_q, int n_heads, int dim, const uint16_t *kv_win, int64_t n_win,
                       const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx, int64_t n_idx,
                       float scale, uint16_t *out, di_error *err) {
    if (n_q < 0 || n_heads < 1 || dim < 1 || dim > DI_SPARSE_ATTN_MAX_DIM || n_win < 0 || n_cmp < 0 || n_idx < 0 ||
        (n_cmp > 0 && !kv_cmp))
        return di_error_set(err, DI_ERR_INVALID,
                            "sparse_attn: n_q %lld, n_heads %d, dim %d (max %d), n_win %lld, n_cmp %lld, n_idx %lld",
                            (long long)n_q, n_heads, dim, DI_SPARSE_ATTN_MAX_DIM, (long long)n_win,
                            (long long)n_cmp, (long long)n_idx);
    const int64_t n_kv = n_win + n_cmp;
    for (int64_t i = 0; i < n_q * n_idx; i++)
        if (idx[i] < -1 || idx[i] >= n_kv)
            return di_error_set(err, DI_ERR_INVALID,
                                "sparse_attn: query %lld slot %lld holds index %d, expected -1 or 0..%lld",
                                (long long)(i / n_idx), (long long)(i % n_idx), idx[i], (long long)n_kv - 1);
    for (int64_t i = 0; i < n_q; i++)
        for (int h = 0; h < n_heads; h++) {
            int64_t qo = (i * n_heads + h) * (int64_t)dim;
            attend_one(q + qo, dim, kv_win, n_win, kv_cmp, sink[h], idx + i * n_idx, n_idx, scale, out + qo);
        }
    return DI_OK;
}
