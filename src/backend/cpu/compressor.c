/* V4.1 KV compressors (spec model.md §3.5, §4.4): ratio-R softmax pooling in f32 with the decode /
 * chunk carry state, and the ratio-1 passthrough. The RMSNorm, RoPE and FP4 QDQ that follow are
 * separate ops. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_attn.h"
#include "io/formats.h"
#include "util/error.h"

#define MAX_RATIO 128 /* largest pooling ratio of the DeepSeek V4 family (V4 HCA); config.c refuses larger
                         ratios at load (DI_MAX_COMPRESS_RATIO) */

int di_cpu_compress_state_reset(float *kv_state, float *score_state, int ratio, int64_t dim, di_error *err) {
    if (ratio < 2 || ratio > MAX_RATIO || dim < 1)
        return di_error_set(err, DI_ERR_INVALID, "compress_state_reset: ratio %d, dim %lld (expected ratio 2..%d)",
                            ratio, (long long)dim, MAX_RATIO);
    for (int64_t i = 0; i < (int64_t)ratio * dim; i++) {
        kv_state[i] = 0.0f;
        score_state[i] = -INFINITY;
    }
    return DI_OK;
}

/* Pool the R filled slots, per channel: softmax over the slots (max-subtracted exp divided by the
 * sum, like torch's softmax), then Σ_slot w·kv with slots ascending, all f32. */
static void pool_group(const float *kv, const float *score, int ratio, int64_t dim, uint16_t *out) {
    for (int64_t j = 0; j < dim; j++) {
        float mx = score[j];
        for (int s = 1; s < ratio; s++) mx = score[s * dim + j] > mx ? score[s * dim + j] : mx;
        float e[MAX_RATIO], sum = 0.0f;
        for (int s = 0; s < ratio; s++) {
            e[s] = expf(score[s * dim + j] - mx);
            sum += e[s];
        }
        float acc = 0.0f;
        for (int s = 0; s < ratio; s++) acc += kv[s * dim + j] * (e[s] / sum);
        out[j] = di_f32_to_bf16(acc);
    }
}

int di_cpu_compress_pool(const float *a, const float *g, int64_t n_tok, int64_t start_pos, int ratio, int64_t dim,
                         float *kv_state, float *score_state, uint16_t *out, int64_t *n_out, di_error *err) {
    if (ratio < 2 || ratio > MAX_RATIO || dim < 1 || n_tok < 0 || start_pos < 0)
        return di_error_set(err, DI_ERR_INVALID,
                            "compress_pool: ratio %d, dim %lld, n_tok %lld, start_pos %lld "
                            "(expected ratio 2..%d, dim >= 1, n_tok >= 0, start_pos >= 0)",
                            ratio, (long long)dim, (long long)n_tok, (long long)start_pos, MAX_RATIO);
    int64_t emitted = 0;
    for (int64_t i = 0; i < n_tok; i++) {
        int64_t pos = start_pos + i;
        int slot = (int)(pos % ratio);
        memcpy(kv_state + slot * dim, a + i * dim, (size_t)dim * sizeof(float));
        memcpy(score_state + slot * dim, g + i * dim, (size_t)dim * sizeof(float));
        if ((pos + 1) % ratio == 0) pool_group(kv_state, score_state, ratio, dim, out + emitted++ * dim);
    }
    if (n_out) *n_out = emitted;
    return DI_OK;
}

int di_cpu_compress_ratio1(const uint16_t *a, int64_t n_tok, int64_t dim, uint16_t *out, di_error *err) {
    if (n_tok < 0 || dim < 1)
        return di_error_set(err, DI_ERR_INVALID, "compress_ratio1: n_tok %lld, dim %lld", (long long)n_tok,
                            (long long)dim);
    if (out != a) memmove(out, a, (size_t)(n_tok * dim) * sizeof(uint16_t));
    return DI_OK;
}
