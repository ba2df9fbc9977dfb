/* Lightning-indexer scoring (spec model.md §4.4, §5.1, §5.3): the reference computes every step on
 * bf16 tensors, so each intermediate is rounded to bf16 exactly where it rounds. */
#include <math.h>

#include "backend/cpu/cpu_attn.h"
#include "io/formats.h"
#include "util/error.h"

#define MAX_INDEX_HEADS 256

int di_cpu_visible_counts(int64_t start_pos, int64_t n_q, int ratio, int64_t n_keys, int32_t *vis,
                          di_error *err) {
    if (ratio < 1 || start_pos < 0 || n_q < 0 || n_keys < 0)
        return di_error_set(err, DI_ERR_INVALID, "visible_counts: ratio %d, start_pos %lld, n_q %lld, n_keys %lld",
                            ratio, (long long)start_pos, (long long)n_q, (long long)n_keys);
    for (int64_t i = 0; i < n_q; i++) {
        int64_t v = (start_pos + i + 1) / ratio;
        vis[i] = (int32_t)(v < n_keys ? v : n_keys);
    }
    return DI_OK;
}

/* f32 dot product of two bf16 vectors, 8 strided partial sums combined pairwise (fixed order). */
static float dot_bf16(const uint16_t *a, const uint16_t *b, int n) {
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += di_bf16_to_f32(a[i + l]) * di_bf16_to_f32(b[i + l]);
    for (; i < n; i++) lane[i & 7] += di_bf16_to_f32(a[i]) * di_bf16_to_f32(b[i]);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* One query's score row. Cloned for AVX2 with a baseline fallback; the explicit lanes of dot_bf16 are
 * what either version vectorizes, so both give the same bits. */
DI_CPU_CLONES static void score_query(
    const uint16_t *qi /* bf16 [n_heads, head_dim] */, const uint16_t *wi_bf16 /* bf16 [n_heads] */, float w_scale,
    const uint16_t *k /* bf16 [n_keys, head_dim] */, int n_heads, int head_dim, int64_t n_keys, int32_t vis,
    const uint8_t *cand /* uint8 [n_keys] or NULL */, float *si /* f32 [n_keys] */) {
    float wi[MAX_INDEX_HEADS]; /* f32 [n_heads] */
    for (int h = 0; h < n_heads; h++) wi[h] = di_round_bf16(di_bf16_to_f32(wi_bf16[h]) * w_scale);
    for (int64_t n = 0; n < n_keys; n++) {
        if (n >= vis || (cand && !cand[n])) {
            si[n] = -INFINITY;
            continue;
        }
        const uint16_t *kn = k + n * head_dim;
        float acc = 0.0f;
        for (int h = 0; h < n_heads; h++) {
            float d = di_round_bf16(dot_bf16(qi + h * head_dim, kn, head_dim)); /* einsum → bf16 */
            float r = d > 0.0f ? d : 0.0f;                                       /* relu (bf16) */
            acc += di_round_bf16(r * wi[h]);                                     /* × w → bf16 */
        }
        si[n] = di_round_bf16(acc); /* head sum: f32 accumulate, one bf16 rounding */
    }
}

int di_cpu_indexer_scores(const uint16_t *q, const uint16_t *w, float w_scale, const uint16_t *k, int64_t n_q,
                          int n_heads, int head_dim, int64_t n_keys, const int32_t *vis, const uint8_t *cand,
                          float *scores, di_error *err) {
    if (n_q < 0 || n_keys < 0 || n_heads < 1 || n_heads > MAX_INDEX_HEADS || head_dim < 1)
        return di_error_set(err, DI_ERR_INVALID,
                            "indexer_scores: n_q %lld, n_keys %lld, n_heads %d (max %d), head_dim %d",
                            (long long)n_q, (long long)n_keys, n_heads, MAX_INDEX_HEADS, head_dim);
    for (int64_t i = 0; i < n_q; i++)
        if (vis[i] < 0 || vis[i] > n_keys)
            return di_error_set(err, DI_ERR_INVALID, "indexer_scores: query %lld sees %d entries, expected 0..%lld",
                                (long long)i, vis[i], (long long)n_keys);
    for (int64_t i = 0; i < n_q; i++)
        score_query(q + i * n_heads * head_dim, w + i * n_heads, w_scale, k, n_heads, head_dim, n_keys, vis[i],
                    cand ? cand + i * n_keys : NULL, scores + i * n_keys);
    return DI_OK;
}
