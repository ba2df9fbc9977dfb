/* mHC kernels: the per-token mixes, their Sinkhorn split, and the collapse / expand of the hc
 * residual streams (spec model.md §3.3, §4.2, §5.1, §5.4). The deferred pre-mix schedule is
 * documented in cpu_attn.h. */
#include <math.h>

#include "backend/cpu/cpu_attn.h"
#include "io/formats.h"
#include "util/error.h"

/* The reference runs this f32 GEMM (K = hc·dim = 20480) through a BLAS sgemm whose summation order
 * is its own. Every product f32(bf16)·f32 is exact in f64, so the sum is accumulated in f64 (8
 * strided lanes, lane = i mod 8, combined pairwise) and rounded once to f32: the estimate closest
 * to any f32 order, and the same for every batch and machine. */
static float dot_bf16_f32(const uint16_t *x, const float *w, int64_t n) {
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)di_bf16_to_f32(x[i + l]) * (double)w[i + l];
    for (; i < n; i++) lane[i & 7] += (double)di_bf16_to_f32(x[i]) * (double)w[i];
    return (float)(((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
}

/* Σ x² the same way (f64 lanes, one rounding to f32); the mean is then the reference's f32 division. */
static float sumsq_bf16(const uint16_t *x, int64_t n) {
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            double v = di_bf16_to_f32(x[i + l]);
            lane[l] += v * v;
        }
    for (; i < n; i++) {
        double v = di_bf16_to_f32(x[i]);
        lane[i & 7] += v * v;
    }
    return (float)(((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
}

static int check_hc(int hc, int64_t n_tok, int64_t dim, const char *op, di_error *err) {
    if (hc < 1 || hc > DI_HC_MAX)
        return di_error_set(err, DI_ERR_INVALID, "%s: hc = %d, expected 1..%d", op, hc, DI_HC_MAX);
    if (n_tok < 0 || dim < 1)
        return di_error_set(err, DI_ERR_INVALID, "%s: n_tok = %lld, dim = %lld, expected n_tok >= 0, dim >= 1",
                            op, (long long)n_tok, (long long)dim);
    return DI_OK;
}

/* One token's mixes. Cloned for AVX2 with a baseline fallback: the compiler vectorizes the explicit
 * lanes, never reassociates, so both versions give the same bits. */
DI_CPU_CLONES static void mixes_token(
    const uint16_t *xt /* bf16 [hc·dim] */, int64_t n, const float *fn /* f32 [n_mix, n] */, int n_mix,
    float norm_eps, float *out /* f32 [n_mix] */) {
    /* ρ = rsqrt(mean(xf²) + eps): one statistic over all hc·dim values of the token */
    float mean = sumsq_bf16(xt, n) / (float)n;
    float rho = 1.0f / sqrtf(mean + norm_eps);
    for (int m = 0; m < n_mix; m++) out[m] = dot_bf16_f32(xt, fn + (int64_t)m * n, n) * rho;
}

int di_cpu_hc_mixes(const uint16_t *x, int64_t n_tok, int hc, int64_t dim, const float *fn, float norm_eps,
                    float *mixes, di_error *err) {
    int rc = check_hc(hc, n_tok, dim, "hc_mixes", err);
    if (rc) return rc;
    const int n_mix = di_hc_n_mix(hc);
    const int64_t n = (int64_t)hc * dim; /* flattened stream-major length */
    for (int64_t t = 0; t < n_tok; t++) mixes_token(x + t * n, n, fn, n_mix, norm_eps, mixes + t * n_mix);
    return DI_OK;
}

static float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

int di_cpu_hc_sinkhorn(const float *mixes, int64_t n_tok, int hc, const float *scale, const float *base, int iters,
                       float eps, float *pre, float *post, float *comb, di_error *err) {
    int rc = check_hc(hc, n_tok, 1, "hc_sinkhorn", err);
    if (rc) return rc;
    if (iters < 1) return di_error_set(err, DI_ERR_INVALID, "hc_sinkhorn: iters = %d, expected >= 1", iters);
    const int n_mix = di_hc_n_mix(hc);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *m = mixes + t * n_mix; /* f32 [n_mix] */
        float *pr = pre + t * hc, *po = post + t * hc;
        float c[DI_HC_MAX][DI_HC_MAX]; /* f32 [hc (from), hc (to)] */
        for (int k = 0; k < hc; k++) {
            pr[k] = sigmoidf(m[k] * scale[0] + base[k]) + eps;
            po[k] = 2.0f * sigmoidf(m[hc + k] * scale[1] + base[hc + k]);
        }
        for (int j = 0; j < hc; j++)
            for (int k = 0; k < hc; k++) c[j][k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
        /* first row step is a softmax (max-subtracted exp, divided by the row sum) plus eps */
        for (int j = 0; j < hc; j++) {
            float mx = c[j][0];
            for (int k = 1; k < hc; k++) mx = c[j][k] > mx ? c[j][k] : mx;
            float s = 0.0f;
            for (int k = 0; k < hc; k++) {
                c[j][k] = expf(c[j][k] - mx);
                s += c[j][k];
            }
            for (int k = 0; k < hc; k++) c[j][k] = c[j][k] / s + eps;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0) /* iteration 0's row step was the softmax above */
                for (int j = 0; j < hc; j++) {
                    float s = 0.0f;
                    for (int k = 0; k < hc; k++) s += c[j][k];
                    s += eps;
                    for (int k = 0; k < hc; k++) c[j][k] /= s;
                }
            for (int k = 0; k < hc; k++) {
                float s = 0.0f;
                for (int j = 0; j < hc; j++) s += c[j][k];
                s += eps;
                for (int j = 0; j < hc; j++) c[j][k] /= s;
            }
        }
        for (int j = 0; j < hc; j++)
            for (int k = 0; k < hc; k++) comb[(t * hc + j) * hc + k] = c[j][k];
    }
    return DI_OK;
}

int di_cpu_hc_collapse(const uint16_t *x, const float *pre, int64_t n_tok, int hc, int64_t dim, uint16_t *out,
                       di_error *err) {
    int rc = check_hc(hc, n_tok, dim, "hc_collapse", err);
    if (rc) return rc;
    for (int64_t t = 0; t < n_tok; t++) {
        const uint16_t *xt = x + t * hc * dim; /* bf16 [hc, dim] */
        const float *p = pre + t * hc;
        for (int64_t i = 0; i < dim; i++) {
            float s = 0.0f;
            for (int k = 0; k < hc; k++) s += p[k] * di_bf16_to_f32(xt[k * dim + i]);
            out[t * dim + i] = di_f32_to_bf16(s);
        }
    }
    return DI_OK;
}

int di_cpu_hc_expand(const uint16_t *z, const uint16_t *x, const float *post, const float *comb, int64_t n_tok,
                     int hc, int64_t dim, uint16_t *out, di_error *err) {
    int rc = check_hc(hc, n_tok, dim, "hc_expand", err);
    if (rc) return rc;
    for (int64_t t = 0; t < n_tok; t++) {
        const uint16_t *xt = x + t * hc * dim; /* bf16 [hc, dim] */
        uint16_t *ot = out + t * hc * dim;
        const float *po = post + t * hc, *c = comb + t * hc * hc; /* c[j·hc + k] */
        for (int64_t i = 0; i < dim; i++) {
            /* all hc inputs of column i are read before any output of it is written: out may alias x */
            float xi[DI_HC_MAX]; /* f32 [hc] column i of every stream */
            for (int j = 0; j < hc; j++) xi[j] = di_bf16_to_f32(xt[j * dim + i]);
            float zi = di_bf16_to_f32(z[t * dim + i]);
            for (int k = 0; k < hc; k++) {
                float r = 0.0f;
                for (int j = 0; j < hc; j++) r += c[j * hc + k] * xi[j];
                ot[k * dim + i] = di_f32_to_bf16(po[k] * zi + r);
            }
        }
    }
    return DI_OK;
}
