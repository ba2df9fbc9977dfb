/* Attention-side CPU kernels of the block graph: mHC mixes/Sinkhorn/collapse/expand, softmax pooling of
 * the ratio-2 compressor, indexer scores and sparse attention with the sink (selections: graph_extra_topk.c)
 * (spec model.md §3.3–§3.6, §4.2, §4.4, §5.3, §5.6). Numerics per slot in backend.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/graph_extra.h"
#include "io/formats.h"
#include "util/error.h"

static inline float bf(uint16_t h) { return di_bf16_to_f32(h); }
static inline uint16_t tobf(float f) { return di_f32_to_bf16(f); }

#define HC_MAX 8

/* ---------------- mHC ---------------- */

int di_gx_hc_mixes(const di_backend *be, const uint16_t *x, int64_t m, int hc, int64_t d, const float *fn,
                   float eps, float *mixes, di_error *err) {
    int64_t n = hc * d;
    int n_mix = (2 + hc) * hc;
    float *xf = malloc(sizeof(float) * (size_t)n); /* [hc·d] one token's flattened streams */
    if (!xf) return di_error_set(err, DI_ERR_NOMEM, "hc_mixes scratch");
    for (int64_t i = 0; i < m; i++) {
        float ss = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            xf[j] = bf(x[i * n + j]);
            ss += xf[j] * xf[j];
        }
        float r = 1.0f / sqrtf(ss / (float)n + eps);
        for (int c = 0; c < n_mix; c++) {
            const float *w = fn + (int64_t)c * n;
            float s = 0.0f;
            for (int64_t j = 0; j < n; j++) s += xf[j] * w[j];
            mixes[i * n_mix + c] = s * r;
        }
    }
    free(xf);
    return DI_OK;
}

static inline float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

int di_gx_hc_sinkhorn(const di_backend *be, const float *mixes, int64_t m, int hc, const float *scale,
                      const float *base, int iters, float eps, float *pre, float *post, float *comb, di_error *err) {
    if (hc > HC_MAX || iters < 1) return di_error_set(err, DI_ERR_INVALID, "hc_sinkhorn: hc=%d iters=%d", hc, iters);
    int n_mix = (2 + hc) * hc;
    for (int64_t i = 0; i < m; i++) {
        const float *mx = mixes + i * n_mix;
        for (int k = 0; k < hc; k++) {
            pre[i * hc + k] = sigmoidf(mx[k] * scale[0] + base[k]) + eps;
            post[i * hc + k] = 2.0f * sigmoidf(mx[hc + k] * scale[1] + base[hc + k]);
        }
        float c[HC_MAX][HC_MAX];
        for (int j = 0; j < hc; j++)
            for (int k = 0; k < hc; k++) c[j][k] = mx[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
        /* row softmax + eps, then column normalization */
        for (int j = 0; j < hc; j++) {
            float mxv = c[j][0];
            for (int k = 1; k < hc; k++) mxv = fmaxf(mxv, c[j][k]);
            float s = 0.0f;
            for (int k = 0; k < hc; k++) s += (c[j][k] = expf(c[j][k] - mxv));
            for (int k = 0; k < hc; k++) c[j][k] = c[j][k] / s + eps;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0)
                for (int j = 0; j < hc; j++) {
                    float s = 0.0f;
                    for (int k = 0; k < hc; k++) s += c[j][k];
                    for (int k = 0; k < hc; k++) c[j][k] = c[j][k] / (s + eps);
                }
            for (int k = 0; k < hc; k++) {
                float s = 0.0f;
                for (int j = 0; j < hc; j++) s += c[j][k];
                for (int j = 0; j < hc; j++) c[j][k] = c[j][k] / (s + eps);
            }
        }
        for (int j = 0; j < hc; j++)
            for (int k = 0; k < hc; k++) comb[(i * hc + j) * hc + k] = c[j][k];
    }
    return DI_OK;
}

int di_gx_hc_collapse(const di_backend *be, const uint16_t *x, const float *pre, int64_t m, int hc, int64_t d,
                      uint16_t *y, di_error *err) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < d; j++) {
            float s = 0.0f;
            for (int k = 0; k < hc; k++) s += pre[i * hc + k] * bf(x[(i * hc + k) * d + j]);
            y[i * d + j] = tobf(s);
        }
    return DI_OK;
}

int di_gx_hc_expand(const di_backend *be, const uint16_t *z, const uint16_t *x, const float *post,
                    const float *comb, int64_t m, int hc, int64_t d, uint16_t *y, di_error *err) {
    if (hc > HC_MAX) return di_error_set(err, DI_ERR_INVALID, "hc_expand: hc=%d", hc);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < d; j++) {
            float xs[HC_MAX], out[HC_MAX];
            for (int s = 0; s < hc; s++) xs[s] = bf(x[(i * hc + s) * d + j]);
            float zf = bf(z[i * d + j]);
            for (int k = 0; k < hc; k++) {
                float r = 0.0f;
                for (int s = 0; s < hc; s++) r += comb[(i * hc + s) * hc + k] * xs[s];
                out[k] = post[i * hc + k] * zf + r;
            }
            for (int k = 0; k < hc; k++) y[(i * hc + k) * d + j] = tobf(out[k]);
        }
    return DI_OK;
}

/* ---------------- compressor pooling ---------------- */

int di_gx_compress_pool(const di_backend *be, const float *a, const float *gate, int64_t m, int64_t start_pos,
                        int ratio, int64_t d, float *kv_state, float *score_state, uint16_t *y, int64_t *n_out,
                        di_error *err) {
    if (ratio < 2 || ratio > 64) return di_error_set(err, DI_ERR_INVALID, "compress_pool: ratio %d", ratio);
    if (m > 0 && start_pos / ratio != (start_pos + m - 1) / ratio)
        return di_error_set(err, DI_ERR_INVALID, "compress_pool: positions %lld..%lld span more than one group",
                            (long long)start_pos, (long long)(start_pos + m - 1));
    int64_t emitted = 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t pos = start_pos + i, slot = pos % ratio;
        memcpy(kv_state + slot * d, a + i * d, sizeof(float) * (size_t)d);
        memcpy(score_state + slot * d, gate + i * d, sizeof(float) * (size_t)d);
        if ((pos + 1) % ratio) continue;
        for (int64_t j = 0; j < d; j++) {
            float mx = -INFINITY, e[64], s = 0.0f;
            for (int t = 0; t < ratio; t++) mx = fmaxf(mx, score_state[t * d + j]);
            for (int t = 0; t < ratio; t++) s += (e[t] = expf(score_state[t * d + j] - mx));
            float acc = 0.0f;
            for (int t = 0; t < ratio; t++) acc += kv_state[t * d + j] * (e[t] / s);
            y[j] = tobf(acc);
        }
        emitted++;
    }
    if (n_out) *n_out = emitted;
    return DI_OK;
}

/* ---------------- indexer ---------------- */

int di_gx_indexer_scores(const di_backend *be, const uint16_t *q, const uint16_t *w, float w_scale, const uint16_t *k, int64_t m,
                         int nh, int hd, int64_t nk, const int32_t *vis, const uint8_t *cand, float *scores,
                         di_error *err) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t n = 0; n < nk; n++) {
            float *o = scores + i * nk + n;
            if (n >= vis[i] || (cand && !cand[i * nk + n])) {
                *o = -INFINITY;
                continue;
            }
            float sum = 0.0f;
            for (int h = 0; h < nh; h++) {
                const uint16_t *qh = q + (i * nh + h) * hd, *kn = k + n * hd;
                float dd = 0.0f;
                for (int c = 0; c < hd; c++) dd += bf(qh[c]) * bf(kn[c]);
                float r = di_round_bf16(dd);
                if (r < 0) r = 0;
                sum += di_round_bf16(r * di_round_bf16(bf(w[i * nh + h]) * w_scale));
            }
            *o = di_round_bf16(sum);
        }
    return DI_OK;
}

/* ---------------- sparse attention ---------------- */

#define ATTN_BLOCK 64

int di_gx_sparse_attn(const di_backend *be, const uint16_t *q, int64_t m, int nh, int d, const uint16_t *kv_win,
                      int64_t n_win, const uint16_t *kv_cmp, int64_t n_cmp, const float *sink, const int32_t *idx,
                      int64_t n_idx, float scale, uint16_t *out, di_error *err) {
    float *qf = malloc(sizeof(float) * (size_t)d);       /* [d] */
    float *acc = malloc(sizeof(float) * (size_t)d);      /* [d] */
    float *kvf = malloc(sizeof(float) * (size_t)ATTN_BLOCK * d); /* [64, d] gathered block */
    if (!qf || !acc || !kvf) {
        free(qf), free(acc), free(kvf);
        return di_error_set(err, DI_ERR_NOMEM, "sparse_attn scratch");
    }
    for (int64_t i = 0; i < m; i++) {
        const int32_t *ix = idx + i * n_idx;
        for (int64_t t = 0; t < n_idx; t++)
            if (ix[t] < -1 || ix[t] >= n_win + n_cmp) {
                free(qf), free(acc), free(kvf);
                return di_error_set(err, DI_ERR_INVALID, "sparse_attn: row %lld index %d outside [-1, %lld)",
                                    (long long)i, ix[t], (long long)(n_win + n_cmp));
            }
        for (int h = 0; h < nh; h++) {
            const uint16_t *qh = q + (i * nh + h) * (int64_t)d;
            for (int c = 0; c < d; c++) qf[c] = bf(qh[c]), acc[c] = 0.0f;
            float mx = -1e30f, l = 0.0f;
            for (int64_t t0 = 0; t0 < n_idx; t0 += ATTN_BLOCK) {
                int64_t nb = n_idx - t0 < ATTN_BLOCK ? n_idx - t0 : ATTN_BLOCK;
                float s[ATTN_BLOCK];
                float bmx = -INFINITY;
                for (int64_t b = 0; b < nb; b++) {
                    int32_t id = ix[t0 + b];
                    if (id < 0) {
                        s[b] = -INFINITY;
                        continue;
                    }
                    const uint16_t *c = id < n_win ? kv_win + (int64_t)id * d : kv_cmp + (int64_t)(id - n_win) * d;
                    float *kb = kvf + b * d;
                    float dot = 0.0f;
                    for (int e = 0; e < d; e++) {
                        kb[e] = bf(c[e]);
                        dot += qf[e] * kb[e];
                    }
                    s[b] = dot * scale;
                    bmx = fmaxf(bmx, s[b]);
                }
                float nmx = fmaxf(mx, bmx);
                float rescale = expf(mx - nmx);
                float psum = 0.0f;
                for (int c = 0; c < d; c++) acc[c] *= rescale;
                for (int64_t b = 0; b < nb; b++) {
                    if (s[b] == -INFINITY) continue;
                    float p = expf(s[b] - nmx);
                    psum += p;
                    float pb = di_round_bf16(p); /* probabilities go to bf16 before PV */
                    const float *kb = kvf + b * d;
                    for (int c = 0; c < d; c++) acc[c] += pb * kb[c];
                }
                l = l * rescale + psum;
                mx = nmx;
            }
            l += expf(sink[h] - mx);
            uint16_t *o = out + (i * nh + h) * (int64_t)d;
            for (int c = 0; c < d; c++) o[c] = tobf(acc[c] / l);
        }
    }
    free(qf), free(acc), free(kvf);
    return DI_OK;
}
