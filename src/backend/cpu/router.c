/* MoE router (spec §3.7, §4.5; model.py Gate.forward).
 * σ = sqrt(softplus(ℓ / gate_temp)) in f32, softplus with torch's threshold (x > 20 → x);
 * experts chosen on σ + bias, weights taken from σ, renormalised by (Σ + 1e-20), × route_scale.
 * Selection is an exact top-k with a fixed tie rule (higher biased score, then lower id — the
 * canonical rule of topk.c), so the result never depends on thread count or batch composition. An
 * insertion into the sorted best-k list rather than topk.c's radix select: k ≤ 64 of a few hundred
 * experts, and the output must be in descending score order, which is torch.topk's output order
 * and the order the weight sum runs in.
 *
 * top_k and n_exp are validated by the caller (backend_cpu.c): top_k is clamped here only so that
 * a bad call cannot overrun the stack arrays. */
#include <math.h>

#include "backend/cpu/cpu_ops.h"

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* a beats b: larger score, ties to the lower id; NaN scores never win */
static int beats(float sa, int ia, float sb, int ib) {
    if (isnan(sb)) return !isnan(sa) || ia < ib;
    if (isnan(sa)) return 0;
    return sa > sb || (sa == sb && ia < ib);
}

void di_cpu_router(int64_t M, int n_exp, const float *logits, const float *bias, const float *bias_vl,
                   const uint8_t *image_mask, float gate_temp, int top_k, float route_scale, int32_t *ids,
                   float *weights) {
    if (top_k > DI_ROUTER_MAX_TOPK) top_k = DI_ROUTER_MAX_TOPK;
    if (top_k > n_exp) top_k = n_exp;
    for (int64_t m = 0; m < M; m++) {
        const float *l = logits + m * n_exp;
        const float *b = (bias_vl && image_mask && image_mask[m]) ? bias_vl : bias;
        int32_t *id = ids + m * top_k;
        float *w = weights + m * top_k;
        int chosen[DI_ROUTER_MAX_TOPK];          /* expert ids [top_k], best first */
        float chosen_score[DI_ROUTER_MAX_TOPK];  /* f32 [top_k] their biased scores */
        /* insertion into a sorted list of the best top_k (n_exp·top_k compares, tiny) */
        int n = 0;
        for (int e = 0; e < n_exp; e++) {
            float sc = sqrtf(softplus(l[e] / gate_temp)) + (b ? b[e] : 0.0f);
            if (n == top_k && !beats(sc, e, chosen_score[n - 1], chosen[n - 1])) continue;
            int pos = n < top_k ? n++ : top_k - 1;
            while (pos > 0 && beats(sc, e, chosen_score[pos - 1], chosen[pos - 1])) {
                chosen[pos] = chosen[pos - 1];
                chosen_score[pos] = chosen_score[pos - 1];
                pos--;
            }
            chosen[pos] = e;
            chosen_score[pos] = sc;
        }
        float sum = 0;
        for (int k = 0; k < top_k; k++) {
            id[k] = chosen[k];
            w[k] = sqrtf(softplus(l[chosen[k]] / gate_temp));
            sum = sum + w[k];
        }
        for (int k = 0; k < top_k; k++) {
            if (top_k > 1) w[k] = w[k] / (sum + 1e-20f);
            w[k] = w[k] * route_scale;
        }
    }
}
