/* Dense CPU kernels of the block graph: GEMMs with the reference's quantization, RMSNorm, RoPE,
 * simulated quantization, embedding, MoE helpers and Engram (spec model.md §3.1, §4.1–§4.5, §5).
 * See graph_extra.h for why these live here; numerics are documented per slot in backend.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/graph_extra.h"
#include "io/formats.h"
#include "util/error.h"

#define QBLK 32 /* V4.1 FP8 block / activation group / FP4 weight group */

static inline float bf(uint16_t h) { return di_bf16_to_f32(h); }
static inline uint16_t tobf(float f) { return di_f32_to_bf16(f); }

/* ---------------- GEMMs ---------------- */

/* Activation quantization of one row into f32 code values and f32 power-of-two scales.
 *   x bf16 [k];  qf f32 [k] (e4m3 values);  sx f32 [k/32] */
static void act_quant_row(const uint16_t *x, int64_t k, uint8_t *q8, uint8_t *s8, float *qf, float *sx) {
    di_act_quant_fp8(x, k, QBLK, q8, s8);
    for (int64_t i = 0; i < k; i++) qf[i] = di_e4m3_to_f32(q8[i]);
    for (int64_t b = 0; b < k / QBLK; b++) sx[b] = di_e8m0_to_f32(s8[b]);
}

/* Scratch for one activation row: codes, scale bytes, f32 codes, f32 scales. */
typedef struct act_row {
    uint8_t *q8, *s8; /* [k], [k/32] */
    float *qf, *sx;   /* [k], [k/32] */
} act_row;

static int act_row_alloc(act_row *a, int64_t k, di_error *err) {
    a->q8 = malloc((size_t)k);
    a->s8 = malloc((size_t)(k / QBLK + 1));
    a->qf = malloc(sizeof(float) * (size_t)k);
    a->sx = malloc(sizeof(float) * (size_t)(k / QBLK + 1));
    if (!a->q8 || !a->s8 || !a->qf || !a->sx) return di_error_set(err, DI_ERR_NOMEM, "act_quant scratch (%lld)", (long long)k);
    return DI_OK;
}

static void act_row_free(act_row *a) {
    free(a->q8), free(a->s8), free(a->qf), free(a->sx);
}

int di_gx_linear_fp8(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                     const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    if (k % QBLK) return di_error_set(err, DI_ERR_INVALID, "linear_fp8: k=%lld not a multiple of 32", (long long)k);
    int64_t kb = k / QBLK;
    act_row a;
    float *wf = malloc(sizeof(float) * (size_t)k); /* [k] one weight row as e4m3 values */
    int rc = act_row_alloc(&a, k, err);
    if (rc || !wf) {
        act_row_free(&a), free(wf);
        return rc ? rc : di_error_set(err, DI_ERR_NOMEM, "linear_fp8 scratch");
    }
    float *acc = malloc(sizeof(float) * (size_t)(m * n)); /* [m, n] */
    float *qall = malloc(sizeof(float) * (size_t)(m * k)); /* [m, k] */
    float *sall = malloc(sizeof(float) * (size_t)(m * kb)); /* [m, k/32] */
    if (!acc || !qall || !sall) {
        act_row_free(&a), free(wf), free(acc), free(qall), free(sall);
        return di_error_set(err, DI_ERR_NOMEM, "linear_fp8 scratch");
    }
    for (int64_t i = 0; i < m; i++) {
        act_quant_row(x + i * k, k, a.q8, a.s8, a.qf, a.sx);
        memcpy(qall + i * k, a.qf, sizeof(float) * (size_t)k);
        memcpy(sall + i * kb, a.sx, sizeof(float) * (size_t)kb);
    }
    for (int64_t o = 0; o < n; o++) {
        const uint8_t *wr = w + o * k;
        const uint8_t *sr = ws + (o / QBLK) * kb;
        for (int64_t c = 0; c < k; c++) wf[c] = di_e4m3_to_f32(wr[c]);
        for (int64_t i = 0; i < m; i++) {
            const float *q = qall + i * k;
            float s = 0.0f;
            for (int64_t b = 0; b < kb; b++) {
                float part = 0.0f; /* exact products; the 32-term sum rounds in f32 */
                for (int j = 0; j < QBLK; j++) part += q[b * QBLK + j] * wf[b * QBLK + j];
                s += part * sall[i * kb + b] * di_e8m0_to_f32(sr[b]);
            }
            acc[i * n + o] = s;
        }
    }
    for (int64_t i = 0; i < m * n; i++) y[i] = tobf(acc[i]);
    act_row_free(&a), free(wf), free(acc), free(qall), free(sall);
    return DI_OK;
}

int di_gx_linear_fp4(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint8_t *w,
                     const uint8_t *ws, int64_t n, uint16_t *y, di_error *err) {
    if (k % QBLK) return di_error_set(err, DI_ERR_INVALID, "linear_fp4: k=%lld not a multiple of 32", (long long)k);
    int64_t kb = k / QBLK;
    bool swap = be && be->faults.fp4_nibble_swap;
    act_row a;
    int rc = act_row_alloc(&a, k, err);
    float *wf = malloc(sizeof(float) * (size_t)k);
    float *qall = malloc(sizeof(float) * (size_t)(m * k));
    float *sall = malloc(sizeof(float) * (size_t)(m * kb));
    if (rc || !wf || !qall || !sall) {
        act_row_free(&a), free(wf), free(qall), free(sall);
        return rc ? rc : di_error_set(err, DI_ERR_NOMEM, "linear_fp4 scratch");
    }
    for (int64_t i = 0; i < m; i++) {
        act_quant_row(x + i * k, k, a.q8, a.s8, a.qf, a.sx);
        memcpy(qall + i * k, a.qf, sizeof(float) * (size_t)k);
        memcpy(sall + i * kb, a.sx, sizeof(float) * (size_t)kb);
    }
    for (int64_t o = 0; o < n; o++) {
        const uint8_t *wr = w + o * (k / 2);
        for (int64_t c = 0; c < k / 2; c++) {
            uint8_t lo = wr[c] & 15, hi = wr[c] >> 4;
            if (swap) { uint8_t t = lo; lo = hi; hi = t; }
            wf[2 * c] = di_e2m1_to_f32(lo);
            wf[2 * c + 1] = di_e2m1_to_f32(hi);
        }
        for (int64_t i = 0; i < m; i++) {
            const float *q = qall + i * k;
            float s = 0.0f;
            for (int64_t b = 0; b < kb; b++) {
                float part = 0.0f;
                for (int j = 0; j < QBLK; j++) part += q[b * QBLK + j] * wf[b * QBLK + j];
                s += part * sall[i * kb + b] * di_e8m0_to_f32(ws[o * kb + b]);
            }
            y[i * n + o] = tobf(s);
        }
    }
    act_row_free(&a), free(wf), free(qall), free(sall);
    return DI_OK;
}

/* f32 dot product of an f32 row and a bf16 row in ascending index order. */
static inline float dot_f32_bf16(const float *a, const uint16_t *b, int64_t k) {
    float s = 0.0f;
    for (int64_t i = 0; i < k; i++) s += a[i] * bf(b[i]);
    return s;
}

static float *upcast_rows(const uint16_t *x, int64_t n) {
    float *f = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (f)
        for (int64_t i = 0; i < n; i++) f[i] = bf(x[i]);
    return f;
}

int di_gx_linear_bf16(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                      uint16_t *y, di_error *err) {
    float *xf = upcast_rows(x, m * k); /* [m, k] */
    if (!xf) return di_error_set(err, DI_ERR_NOMEM, "linear_bf16 scratch");
    for (int64_t i = 0; i < m; i++)
        for (int64_t o = 0; o < n; o++) y[i * n + o] = tobf(dot_f32_bf16(xf + i * k, w + o * k, k));
    free(xf);
    return DI_OK;
}

int di_gx_linear_f32(const di_backend *be, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w, int64_t n,
                     float *y, di_error *err) {
    float *xf = upcast_rows(x, m * k); /* [m, k] */
    if (!xf) return di_error_set(err, DI_ERR_NOMEM, "linear_f32 scratch");
    for (int64_t i = 0; i < m; i++)
        for (int64_t o = 0; o < n; o++) y[i * n + o] = dot_f32_bf16(xf + i * k, w + o * k, k);
    free(xf);
    return DI_OK;
}

int di_gx_linear_grouped_bf16(const di_backend *be, const uint16_t *x, int64_t m, int g, int64_t k,
                              const uint16_t *w, int64_t r, uint16_t *y, di_error *err) {
    float *xf = upcast_rows(x, m * g * k); /* [m, g, k] */
    if (!xf) return di_error_set(err, DI_ERR_NOMEM, "linear_grouped scratch");
    for (int64_t i = 0; i < m; i++)
        for (int gi = 0; gi < g; gi++)
            for (int64_t o = 0; o < r; o++)
                y[(i * g + gi) * r + o] = tobf(dot_f32_bf16(xf + (i * g + gi) * k, w + ((int64_t)gi * r + o) * k, k));
    free(xf);
    return DI_OK;
}

/* ---------------- norms, RoPE, QDQ ---------------- */

int di_gx_rmsnorm(const di_backend *be, const uint16_t *x, int64_t m, int64_t n, const uint16_t *w, float eps,
                  uint16_t *y, di_error *err) {
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *xr = x + i * n;
        float ss = 0.0f;
        for (int64_t j = 0; j < n; j++) ss += bf(xr[j]) * bf(xr[j]);
        float r = 1.0f / sqrtf(ss / (float)n + eps);
        uint16_t *yr = y + i * n;
        for (int64_t j = 0; j < n; j++) yr[j] = tobf(bf(w[j]) * (bf(xr[j]) * r));
    }
    return DI_OK;
}

int di_gx_rope(const di_backend *be, uint16_t *x, int64_t m, int nh, int d, int rd, const int64_t *pos,
               const float *freqs, bool inverse, di_error *err) {
    if (rd > d || rd % 2) return di_error_set(err, DI_ERR_INVALID, "rope: rd=%d with head dim %d", rd, d);
    int half = rd / 2;
    bool split = be && be->faults.rope_half_split;
    for (int64_t i = 0; i < m; i++) {
        for (int p = 0; p < half; p++) {
            float ang = (float)pos[i] * freqs[p];
            float cs = cosf(ang), sn = inverse ? -sinf(ang) : sinf(ang);
            for (int h = 0; h < nh; h++) {
                uint16_t *v = x + (i * nh + h) * (int64_t)d + (d - rd);
                int ia = split ? p : 2 * p, ib = split ? p + half : 2 * p + 1;
                float a = bf(v[ia]), b = bf(v[ib]);
                v[ia] = tobf(a * cs - b * sn);
                v[ib] = tobf(a * sn + b * cs);
            }
        }
    }
    return DI_OK;
}

int di_gx_qdq_fp8(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    if (group <= 0 || n % group) return di_error_set(err, DI_ERR_INVALID, "qdq_fp8: n=%lld group %d", (long long)n, group);
    for (int64_t i = 0; i < m; i++) di_act_qdq_fp8(x + i * n, n, group, x + i * n);
    return DI_OK;
}

int di_gx_qdq_fp4_e8m0(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    if (group <= 0 || n % group) return di_error_set(err, DI_ERR_INVALID, "qdq_fp4: n=%lld group %d", (long long)n, group);
    for (int64_t i = 0; i < m; i++) di_fp4_qdq_e8m0(x + i * n, n, group, x + i * n);
    return DI_OK;
}

int di_gx_qdq_fp4_e4m3(const di_backend *be, uint16_t *x, int64_t m, int64_t n, int group, di_error *err) {
    if (group <= 0 || n % group) return di_error_set(err, DI_ERR_INVALID, "qdq_fp4: n=%lld group %d", (long long)n, group);
    for (int64_t i = 0; i < m; i++) di_fp4_qdq_e4m3(x + i * n, n, group, x + i * n);
    return DI_OK;
}

int di_gx_embed(const di_backend *be, const uint16_t *table, int64_t vocab, int64_t d, const int32_t *ids,
                int64_t m, uint16_t *y, di_error *err) {
    for (int64_t i = 0; i < m; i++) {
        if (ids[i] < 0 || ids[i] >= vocab)
            return di_error_set(err, DI_ERR_INVALID, "embed: token id %d at position %lld outside [0, %lld)", ids[i],
                                (long long)i, (long long)vocab);
        memcpy(y + i * d, table + (int64_t)ids[i] * d, sizeof(uint16_t) * (size_t)d);
    }
    return DI_OK;
}

/* ---------------- MoE ---------------- */

int di_gx_router(const di_backend *be, const float *logits, int64_t m, int n_exp, const float *bias, float temp,
                 int k, bool normalize, float scale, int32_t *ids, float *weights, di_error *err) {
    if (k <= 0 || k > n_exp || n_exp > 4096)
        return di_error_set(err, DI_ERR_INVALID, "router: top-%d of %d experts", k, n_exp);
    float sc[4096], ch[4096]; /* scores σ and choice keys σ + bias */
    for (int64_t i = 0; i < m; i++) {
        for (int e = 0; e < n_exp; e++) {
            float l = logits[i * n_exp + e] / temp;
            float sp = l > 20.0f ? l : log1pf(expf(l)); /* torch softplus, threshold 20 */
            sc[e] = sqrtf(sp);
            ch[e] = sc[e] + bias[e];
        }
        /* top-k by choice key, descending, first index on ties */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_exp; e++) {
                bool taken = false;
                for (int t = 0; t < j; t++) taken |= ids[i * k + t] == e;
                if (taken) continue;
                if (best < 0 || ch[e] > ch[best]) best = e;
            }
            ids[i * k + j] = best;
            weights[i * k + j] = sc[best];
        }
        if (normalize && k > 1) {
            float sum = 0.0f;
            for (int j = 0; j < k; j++) sum += weights[i * k + j];
            for (int j = 0; j < k; j++) weights[i * k + j] /= sum + 1e-20f;
        }
        for (int j = 0; j < k; j++) weights[i * k + j] *= scale;
    }
    return DI_OK;
}

int di_gx_swiglu(const di_backend *be, const uint16_t *g, const uint16_t *u, int64_t m, int64_t n,
                 const float *row_w, float lim, uint16_t *a, di_error *err) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float gv = bf(g[i * n + j]), uv = bf(u[i * n + j]);
            if (lim > 0) {
                uv = fminf(fmaxf(uv, -lim), lim);
                gv = fminf(gv, lim);
            }
            float v = gv / (1.0f + expf(-gv)) * uv;
            if (row_w) v = row_w[i] * v;
            a[i * n + j] = tobf(v);
        }
    return DI_OK;
}

int di_gx_gather_rows(const di_backend *be, const uint16_t *x, int64_t d, const int32_t *rows, int64_t m,
                      uint16_t *y, di_error *err) {
    for (int64_t i = 0; i < m; i++) memcpy(y + i * d, x + (int64_t)rows[i] * d, sizeof(uint16_t) * (size_t)d);
    return DI_OK;
}

int di_gx_scatter_add_rows(const di_backend *be, const uint16_t *y, int64_t d, const int32_t *rows, int64_t m,
                           float *acc, di_error *err) {
    for (int64_t i = 0; i < m; i++) {
        float *ar = acc + (int64_t)rows[i] * d;
        for (int64_t j = 0; j < d; j++) ar[j] += bf(y[i * d + j]);
    }
    return DI_OK;
}

int di_gx_f32_to_bf16(const di_backend *be, const float *x, int64_t n, uint16_t *y, di_error *err) {
    for (int64_t i = 0; i < n; i++) y[i] = tobf(x[i]);
    return DI_OK;
}

int di_gx_fill_f32(const di_backend *be, float *x, int64_t n, float v, di_error *err) {
    for (int64_t i = 0; i < n; i++) x[i] = v;
    return DI_OK;
}

/* ---------------- Engram ---------------- */

int di_gx_engram_lookup(const di_backend *be, const uint8_t *table, const uint8_t *scale, int64_t rows, int hd,
                        const int64_t *ids, int64_t m, int n_cols, uint16_t *y, di_error *err) {
    if (hd % QBLK) return di_error_set(err, DI_ERR_INVALID, "engram_lookup: head dim %d not a multiple of 32", hd);
    for (int64_t i = 0; i < m * n_cols; i++) {
        int64_t r = ids[i];
        if (r < 0 || r >= rows)
            return di_error_set(err, DI_ERR_INVALID, "engram_lookup: row %lld outside the table (%lld rows)",
                                (long long)r, (long long)rows);
        const uint8_t *wr = table + r * hd, *sr = scale + r * (hd / QBLK);
        uint16_t *o = y + i * hd;
        for (int c = 0; c < hd; c++) o[c] = tobf(di_e4m3_to_f32(wr[c]) * di_e8m0_to_f32(sr[c / QBLK]));
    }
    return DI_OK;
}

int di_gx_engram_gate(const di_backend *be, uint16_t *x, const uint16_t *kv, int64_t m, int hc, int64_t d,
                      const uint16_t *qw, const uint16_t *kw, float eps, di_error *err) {
    float inv_sqrt_d = (float)pow((double)d, -0.5);
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *key = kv + i * (hc + 1) * d;   /* [hc, d] */
        const uint16_t *val = key + (int64_t)hc * d;   /* [d] */
        for (int s = 0; s < hc; s++) {
            uint16_t *xs = x + (i * hc + s) * d;
            const uint16_t *ks = key + (int64_t)s * d;
            float sx = 0, sk = 0, dot = 0;
            for (int64_t j = 0; j < d; j++) {
                float h = bf(xs[j]), kk = bf(ks[j]);
                float wq = bf(qw[s * d + j]) * bf(kw[s * d + j]);
                sx += h * h;
                sk += kk * kk;
                dot += h * wq * kk;
            }
            float rstd = (1.0f / sqrtf(sx / (float)d + eps)) * (1.0f / sqrtf(sk / (float)d + eps));
            dot = dot * rstd * inv_sqrt_d;
            float mag = sqrtf(fmaxf(fabsf(dot), 1e-6f));
            float gate = 1.0f / (1.0f + expf(-copysignf(mag, dot)));
            for (int64_t j = 0; j < d; j++) xs[j] = tobf(bf(xs[j]) + gate * bf(val[j]));
        }
    }
    return DI_OK;
}
