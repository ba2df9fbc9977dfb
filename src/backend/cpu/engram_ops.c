/* Engram n-gram hashing, table lookup and stream gate (spec §4.3 steps 2–6; engram.py
 * NgramHashState.forward, ParallelEngramEmbedding, Engram.forward). */
#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "io/formats.h"
#include "util/error.h"

void di_cpu_engram_ngrams(int64_t n, int G, const int64_t *hist, int64_t pad_id, int64_t *tokens) {
    for (int64_t t = 0; t < n; t++) {
        /* lookback i reads hist[t + G − 1 − i]; once blocked, every further lookback is padding */
        int blocked = 0;
        for (int i = 0; i < G; i++) {
            int64_t v = hist[t + G - 1 - i];
            if (v < 0) blocked = 1;
            tokens[t * G + i] = blocked ? pad_id : v;
        }
    }
}

/* Python's floor modulo (torch's % on int64): the result takes the divisor's sign. */
static int64_t floor_mod(int64_t a, int64_t p) {
    int64_t r = a % p;
    return (r != 0 && ((r < 0) != (p < 0))) ? r + p : r;
}

void di_cpu_engram_hash(int64_t n, int G, int n_heads, const int64_t *tokens, const int64_t *mult,
                        const int64_t *primes, const int64_t *offsets, int64_t *ids) {
    int cols = (G - 1) * n_heads;
    for (int64_t t = 0; t < n; t++) {
        const int64_t *tok = tokens + t * G;
        /* int64 products wrap in two's complement like torch; done in uint64 to keep C defined */
        uint64_t rolling = (uint64_t)tok[0] * (uint64_t)mult[0];
        for (int i = 1; i < G; i++) {
            rolling ^= (uint64_t)tok[i] * (uint64_t)mult[i];
            for (int h = 0; h < n_heads; h++) {
                int c = (i - 1) * n_heads + h;
                int64_t p = primes[c];
                ids[t * cols + c] = (p ? floor_mod((int64_t)rolling, p) : 0) + offsets[c];
            }
        }
    }
}

int di_cpu_engram_gather(int64_t n, int n_cols, const int64_t *ids, const uint8_t *table, const uint8_t *scale,
                         int64_t rows, int dim, uint16_t *out, di_error *err) {
    if (dim <= 0 || dim % DI_QBLOCK)
        return di_error_set(err, DI_ERR_INVALID, "engram gather: row width %d is not a multiple of %d", dim,
                            DI_QBLOCK);
    for (int64_t i = 0; i < n * n_cols; i++)
        if (ids[i] < 0 || ids[i] >= rows)
            return di_error_set(err, DI_ERR_INVALID,
                                "engram gather: token %lld column %lld has row id %lld, table has %lld rows",
                                (long long)(i / n_cols), (long long)(i % n_cols), (long long)ids[i], (long long)rows);
    int sb = dim / DI_QBLOCK;
    for (int64_t i = 0; i < n * n_cols; i++) {
        const uint8_t *row = table + ids[i] * dim; /* [dim] e4m3 */
        const uint8_t *s = scale + ids[i] * sb;    /* [dim/32] E8M0 */
        uint16_t *o = out + i * dim;               /* [dim] bf16 */
        for (int b = 0; b < sb; b++) {
            float sc = di_e8m0_to_f32(s[b]);
            for (int j = b * DI_QBLOCK; j < (b + 1) * DI_QBLOCK; j++)
                o[j] = di_f32_to_bf16(di_e4m3_to_f32(row[j]) * sc);
        }
    }
    return DI_OK;
}

void di_cpu_engram_gate_weight(int64_t n, const uint16_t *q, const uint16_t *k, float *wq) {
    for (int64_t i = 0; i < n; i++) wq[i] = di_bf16_to_f32(q[i]) * di_bf16_to_f32(k[i]);
}

void di_cpu_engram_gate(int64_t n, int hc, int64_t D, uint16_t *X, const uint16_t *kv, const float *wq, float eps,
                        const uint8_t *token_mask) {
    /* torch multiplies an f32 tensor by the Python float dim**-0.5 after casting it to f32 */
    float inv_sqrt_d = (float)(1.0 / sqrt((double)D));
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *value = kv + t * (hc + 1) * D + hc * D;
        for (int s = 0; s < hc; s++) {
            uint16_t *h = X + (t * hc + s) * D;
            const uint16_t *key = kv + t * (hc + 1) * D + s * D;
            const float *w = wq + s * D;
            double hh = 0, kk = 0, dot = 0;
            for (int64_t j = 0; j < D; j++) {
                float hv = di_bf16_to_f32(h[j]), kvv = di_bf16_to_f32(key[j]);
                float h2 = hv * hv, k2 = kvv * kvv; /* f32 squares, as h.square() */
                hh += h2;
                kk += k2;
                dot += (double)((hv * w[j]) * kvv); /* (h·weight)·key rounded in f32, as the reference */
            }
            float rstd = (1.0f / sqrtf((float)hh / (float)D + eps)) * (1.0f / sqrtf((float)kk / (float)D + eps));
            float d = (float)dot * rstd * inv_sqrt_d;
            float mag = fabsf(d) > 1e-6f ? fabsf(d) : 1e-6f;
            float z = copysignf(sqrtf(mag), d);
            float gate = 1.0f / (1.0f + expf(-z));
            if (token_mask && !token_mask[t]) gate = 0.0f;
            for (int64_t j = 0; j < D; j++)
                h[j] = di_f32_to_bf16(di_bf16_to_f32(h[j]) + gate * di_bf16_to_f32(value[j]));
        }
    }
}
