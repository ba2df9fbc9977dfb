/* Token sampler (contract and numerics: sampler.h). */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/philox.h"

/* Temperatures below this are treated as greedy (dividing by them would overflow the logits). */
#define DI_SAMPLER_GREEDY_EPS 1e-5f
/* First prefix length tried by top-p without top-k; grows ×8 until the mass is covered. */
#define DI_SAMPLER_TOP_P_FIRST 64

struct di_sampler {
    int32_t n_vocab;
    float *work;        /* [n_vocab] f32: the row after each processing stage */
    float *weight;      /* [n_vocab] f32: e(t) of the full-row draw, 0 for removed tokens */
    int32_t *count;     /* [n_vocab] int32: output-token counts, all zero between calls */
    uint8_t *seen;      /* [n_vocab] u8: repetition-penalty marks, all zero between calls */
    int32_t *cand;      /* [n_vocab] int32: candidate ids, best first */
    int32_t *list_a;    /* [n_vocab] int32: radix-select survivors, ping */
    int32_t *list_b;    /* [n_vocab] int32: radix-select survivors, pong */
    uint64_t *pairs;    /* [n_vocab] u64: (~key << 32 | id) sort records */
};

di_sampling_params di_sampling_params_default(void) {
    di_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

int di_sampling_params_check(const di_sampling_params *p, int32_t n_vocab, di_error *err) {
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return di_error_set(err, DI_ERR_INVALID, "sampling: temperature %g, expected a finite value >= 0", (double)p->temperature);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return di_error_set(err, DI_ERR_INVALID, "sampling: top_p %g, expected (0, 1] (0 = unset)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return di_error_set(err, DI_ERR_INVALID, "sampling: min_p %g, expected [0, 1]", (double)p->min_p);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return di_error_set(err, DI_ERR_INVALID, "sampling: presence/frequency penalty %g/%g, expected finite values",
                            (double)p->presence_penalty, (double)p->frequency_penalty);
    if (!(p->repetition_penalty >= 0.0f) || !isfinite(p->repetition_penalty))
        return di_error_set(err, DI_ERR_INVALID, "sampling: repetition_penalty %g, expected > 0 (0 = unset)",
                            (double)p->repetition_penalty);
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > DI_SAMPLER_MAX_TOP_LOGPROBS)
        return di_error_set(err, DI_ERR_INVALID, "sampling: top_logprobs %d, expected 0..%d", p->n_top_logprobs,
                            DI_SAMPLER_MAX_TOP_LOGPROBS);
    if (p->logprobs_mode != DI_LOGPROBS_RAW && p->logprobs_mode != DI_LOGPROBS_PROCESSED)
        return di_error_set(err, DI_ERR_INVALID, "sampling: logprobs mode %d, expected raw (0) or processed (1)",
                            (int)p->logprobs_mode);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return di_error_set(err, DI_ERR_INVALID, "sampling: logit_bias has %d entries but no array", p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= n_vocab)
            return di_error_set(err, DI_ERR_INVALID, "sampling: logit_bias token %d, expected 0..%d",
                                p->logit_bias[i].token, n_vocab - 1);
        if (!isfinite(p->logit_bias[i].bias))
            return di_error_set(err, DI_ERR_INVALID, "sampling: logit_bias for token %d is not finite",
                                p->logit_bias[i].token);
    }
    return DI_OK;
}

int di_sampler_new(int32_t n_vocab, di_sampler **out, di_error *err) {
    *out = NULL;
    if (n_vocab <= 0) return di_error_set(err, DI_ERR_INVALID, "sampler: vocabulary size %d, expected > 0", n_vocab);
    di_sampler *s = calloc(1, sizeof *s);
    if (!s) return di_error_set(err, DI_ERR_NOMEM, "sampler: out of memory");
    size_t n = (size_t)n_vocab;
    s->n_vocab = n_vocab;
    s->work = malloc(n * sizeof *s->work);
    s->weight = malloc(n * sizeof *s->weight);
    s->count = calloc(n, sizeof *s->count);
    s->seen = calloc(n, sizeof *s->seen);
    s->cand = malloc(n * sizeof *s->cand);
    s->list_a = malloc(n * sizeof *s->list_a);
    s->list_b = malloc(n * sizeof *s->list_b);
    s->pairs = malloc(n * sizeof *s->pairs);
    if (!s->work || !s->weight || !s->count || !s->seen || !s->cand || !s->list_a || !s->list_b || !s->pairs) {
        di_sampler_free(s);
        return di_error_set(err, DI_ERR_NOMEM, "sampler: out of memory for a %d-token vocabulary", n_vocab);
    }
    *out = s;
    return DI_OK;
}

void di_sampler_free(di_sampler *s) {
    if (!s) return;
    free(s->work);
    free(s->weight);
    free(s->count);
    free(s->seen);
    free(s->cand);
    free(s->list_a);
    free(s->list_b);
    free(s->pairs);
    free(s);
}

/* ---- exact best-first selection ---- */

/* Order-preserving key: key(a) < key(b) ⇔ a < b for non-NaN floats; −0 maps like +0 so that the
 * two compare equal, as they do as floats (then the lower id wins). */
static inline uint32_t order_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts ids[0..n) best first: ascending (~key, id) is descending value, ascending id. */
static void sort_best_first(di_sampler *s, const float *x, int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        s->pairs[i] = ((uint64_t)~order_key(x[ids[i]]) << 32) | (uint32_t)ids[i];
    qsort(s->pairs, (size_t)n, sizeof *s->pairs, cmp_u64);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(uint32_t)s->pairs[i];
}

/* Small m: one pass with a bounded max-heap of sort records (root = worst kept). Records compare
 * exactly like the best-first order, and the scan goes in id order, so an entry equal to the root
 * (same value, higher id) is correctly rejected. Expected O(V + m log m log(V/m)) on unordered rows,
 * O(V log m) at worst. */
#define DI_SAMPLER_HEAP_MAX 2048

static void heap_sift_down(uint64_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, big = i;
        if (l < n && h[l] > h[big]) big = l;
        if (r < n && h[r] > h[big]) big = r;
        if (big == i) return;
        uint64_t t = h[i];
        h[i] = h[big];
        h[big] = t;
        i = big;
    }
}

static int64_t select_heap(di_sampler *s, const float *x, int64_t m, int32_t *ids) {
    uint64_t *h = s->pairs; /* [m] records ((~key << 32) | id) */
    int64_t n = 0;
    for (int32_t t = 0; t < s->n_vocab; t++) {
        if (!(x[t] > -INFINITY)) continue;
        uint64_t rec = ((uint64_t)~order_key(x[t]) << 32) | (uint32_t)t;
        if (n < m) {
            int64_t i = n++;
            h[i] = rec;
            while (i > 0 && h[(i - 1) / 2] < h[i]) { /* sift up */
                uint64_t tmp = h[i];
                h[i] = h[(i - 1) / 2];
                h[(i - 1) / 2] = tmp;
                i = (i - 1) / 2;
            }
        } else if (rec < h[0]) {
            h[0] = rec;
            heap_sift_down(h, n, 0);
        }
    }
    qsort(h, (size_t)n, sizeof *h, cmp_u64);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(uint32_t)h[i];
    return n;
}

/* Large m: radix select, one 8-bit digit per pass, most significant first. The first pass histograms
 * the whole row and keeps the members of the bucket holding the rank-m key; later passes only touch
 * that shrinking list. The result (threshold key T, how many entries equal to T are taken) is exact. */
static int64_t select_radix(di_sampler *s, const float *x, int64_t m, int32_t *ids) {
    const int64_t n_vocab = s->n_vocab;
    int64_t n_sel = 0;
    for (int64_t i = 0; i < n_vocab; i++) n_sel += x[i] > -INFINITY;
    if (n_sel <= m) {
        int64_t n = 0;
        for (int64_t i = 0; i < n_vocab; i++)
            if (x[i] > -INFINITY) ids[n++] = (int32_t)i;
        sort_best_first(s, x, ids, n);
        return n;
    }
    int64_t need = m; /* rank of the threshold among the entries still matching the prefix */
    uint32_t prefix = 0;
    int32_t *list = NULL, *next = s->list_a;
    int64_t n_list = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t hist[256] = {0};
        if (!list) {
            for (int64_t i = 0; i < n_vocab; i++)
                if (x[i] > -INFINITY) hist[order_key(x[i]) >> 24]++;
        } else {
            for (int64_t j = 0; j < n_list; j++) hist[(order_key(x[list[j]]) >> shift) & 255u]++;
        }
        int b = 255;
        for (; b > 0; b--) {
            if (hist[b] >= need) break;
            need -= hist[b];
        }
        prefix |= (uint32_t)b << shift;
        if (shift == 0) break;
        const uint32_t mask = ~0u << shift;
        int64_t n_next = 0;
        if (!list) {
            for (int64_t i = 0; i < n_vocab; i++)
                if (x[i] > -INFINITY && (order_key(x[i]) & mask) == prefix) next[n_next++] = (int32_t)i;
        } else {
            for (int64_t j = 0; j < n_list; j++)
                if ((order_key(x[list[j]]) & mask) == prefix) next[n_next++] = list[j];
        }
        list = next;
        n_list = n_next;
        next = (next == s->list_a) ? s->list_b : s->list_a;
    }
    /* prefix is now the rank-m key T; `need` entries equal to T are taken, lowest ids first. */
    int64_t n = 0, ties = need;
    for (int64_t i = 0; i < n_vocab; i++) {
        if (!(x[i] > -INFINITY)) continue;
        uint32_t k = order_key(x[i]);
        if (k > prefix || (k == prefix && ties-- > 0)) ids[n++] = (int32_t)i;
    }
    sort_best_first(s, x, ids, n);
    return n;
}

int64_t di_sampler_select_top(di_sampler *s, const float *x, int64_t m, int32_t *ids) {
    if (m <= 0) return 0;
    return m <= DI_SAMPLER_HEAP_MAX ? select_heap(s, x, m, ids) : select_radix(s, x, m, ids);
}

/* ---- processing stages ---- */

static int apply_penalties(di_sampler *s, const di_sample_row *row, float *w, di_error *err) {
    const di_sampling_params *p = row->params;
    const int32_t V = s->n_vocab;
    for (int64_t i = 0; i < row->n_prompt; i++)
        if (row->prompt[i] < 0 || row->prompt[i] >= V)
            return di_error_set(err, DI_ERR_INVALID, "sampler: prompt token %lld is id %d, expected 0..%d",
                                (long long)i, row->prompt[i], V - 1);
    for (int64_t i = 0; i < row->n_output; i++)
        if (row->output[i] < 0 || row->output[i] >= V)
            return di_error_set(err, DI_ERR_INVALID, "sampler: output token %lld is id %d, expected 0..%d",
                                (long long)i, row->output[i], V - 1);
    const float r = p->repetition_penalty;
    if (r != 0.0f && r != 1.0f) {
        /* once per distinct token of prompt ∪ output; marks are cleared again below */
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *t = pass ? row->output : row->prompt;
            int64_t n = pass ? row->n_output : row->n_prompt;
            for (int64_t i = 0; i < n; i++) {
                if (s->seen[t[i]]) continue;
                s->seen[t[i]] = 1;
                float l = w[t[i]];
                w[t[i]] = l > 0.0f ? l / r : l * r;
            }
        }
        for (int64_t i = 0; i < row->n_prompt; i++) s->seen[row->prompt[i]] = 0;
        for (int64_t i = 0; i < row->n_output; i++) s->seen[row->output[i]] = 0;
    }
    const float f = p->frequency_penalty, pr = p->presence_penalty;
    if (f != 0.0f || pr != 0.0f) {
        for (int64_t i = 0; i < row->n_output; i++) s->count[row->output[i]]++;
        for (int64_t i = 0; i < row->n_output; i++) {
            int32_t t = row->output[i], c = s->count[t];
            if (!c) continue; /* already applied: counts reset as they are consumed */
            s->count[t] = 0;
            w[t] = w[t] - f * (float)c;
            w[t] = w[t] - pr;
        }
    }
    return DI_OK;
}

static void apply_mask(const uint32_t *mask, float *w, int32_t V) {
    const int32_t words = (V + 31) / 32;
    for (int32_t i = 0; i < words; i++) {
        uint32_t m = mask[i];
        if (m == 0xffffffffu) continue;
        for (int b = 0; b < 32; b++) {
            int32_t t = i * 32 + b;
            if (t < V && !(m >> b & 1u)) w[t] = -INFINITY;
        }
    }
}

/* Σ di_sampler_exp(x[t] − x_max) over x[t] > -inf (and >= cut where cut applies), in id order. */
static double mass_id_order(const float *x, int32_t V, float x_max, float min_weight) {
    double z = 0.0;
    for (int32_t t = 0; t < V; t++) {
        if (!(x[t] > -INFINITY)) continue;
        float e = di_sampler_exp(x[t] - x_max);
        if (e >= min_weight) z += (double)e;
    }
    return z;
}

/* mass_id_order that also keeps each e(t) (0 where removed) for the draw's walk. The exps are one
 * branch-free loop (vectorizable: di_sampler_exp is 0 for -inf), the sum a separate in-order loop. */
static double mass_id_order_keep(const float *x, int32_t V, float x_max, float min_weight, float *e_out) {
    for (int32_t t = 0; t < V; t++) {
        float e = di_sampler_exp(x[t] - x_max);
        e_out[t] = e < min_weight ? 0.0f : e;
    }
    double z = 0.0;
    for (int32_t t = 0; t < V; t++) z += (double)e_out[t];
    return z;
}

static double mass_list(const float *x, const int32_t *ids, int64_t n, float x_max) {
    double z = 0.0;
    for (int64_t i = 0; i < n; i++) z += (double)di_sampler_exp(x[ids[i]] - x_max);
    return z;
}

/* Best entry of x, lowest id on ties; -1 when every entry is -inf. */
static int32_t argmax_lowest(const float *x, int32_t V) {
    int32_t best = -1;
    float bv = -INFINITY;
    for (int32_t t = 0; t < V; t++)
        if (x[t] > bv) {
            bv = x[t];
            best = t;
        }
    return best;
}

/* Log-softmax over a full row (entries > -inf), for raw logprobs and processed greedy logprobs. */
static void logprobs_full(di_sampler *s, const float *x, int32_t token, int32_t n_top, di_sample_result *out) {
    const int32_t V = s->n_vocab;
    int32_t best = argmax_lowest(x, V);
    float x_max = x[best];
    double log_z = log(mass_id_order(x, V, x_max, 0.0f));
    out->logprob = x[token] > -INFINITY ? (float)((double)(x[token] - x_max) - log_z) : -INFINITY;
    out->n_top = (int32_t)di_sampler_select_top(s, x, n_top, out->top_ids);
    for (int32_t i = 0; i < out->n_top; i++)
        out->top_logprobs[i] = (float)((double)(x[out->top_ids[i]] - x_max) - log_z);
}

int di_sampler_sample(di_sampler *s, const di_sample_row *row, di_sample_result *out, di_error *err) {
    const di_sampling_params *p = row->params;
    const int32_t V = s->n_vocab;
    memset(out, 0, sizeof *out);
    int rc = di_sampling_params_check(p, V, err);
    if (rc) return rc;
    float *w = s->work; /* [V] f32 */
    for (int32_t t = 0; t < V; t++) {
        float l = row->logits[t];
        if (isnan(l) || l == INFINITY)
            return di_error_set(err, DI_ERR_INVALID, "sampler: logit of token %d is %g, expected finite or -inf", t,
                                (double)l);
        w[t] = l;
    }
    /* 1–3: penalties, bias, mask */
    rc = apply_penalties(s, row, w, err);
    if (rc) return rc;
    for (int32_t i = 0; i < p->n_logit_bias; i++) w[p->logit_bias[i].token] += p->logit_bias[i].bias;
    if (row->mask) apply_mask(row->mask, w, V);
    int32_t best = argmax_lowest(w, V);
    if (best < 0)
        return di_error_set(err, DI_ERR_INVALID, "sampler: no token is allowed at position %lld (mask, bias or logits "
                            "leave every logit at -inf)", (long long)row->position);

    /* 4: greedy */
    if (p->temperature < DI_SAMPLER_GREEDY_EPS) {
        out->token = best;
        if (!p->logprobs) return DI_OK;
        if (p->logprobs_mode == DI_LOGPROBS_PROCESSED) logprobs_full(s, w, best, p->n_top_logprobs, out);
        else logprobs_full(s, row->logits, best, p->n_top_logprobs, out);
        return DI_OK;
    }
    if (p->temperature != 1.0f)
        for (int32_t t = 0; t < V; t++) w[t] = w[t] / p->temperature;

    /* 5–7: truncation. List form (best-first ids) when top-k or top-p is on, else the whole row. */
    const int list_form = p->top_k > 0 || (p->top_p > 0.0f && p->top_p < 1.0f);
    int32_t *cand = s->cand; /* [V] int32 */
    int64_t n_cand = 0;
    float x_max = w[best]; /* temperature keeps the argmax */
    float min_weight = 0.0f;
    if (list_form) {
        double z_in;
        if (p->top_k > 0) {
            n_cand = di_sampler_select_top(s, w, p->top_k, cand);
            z_in = mass_list(w, cand, n_cand, x_max);
        } else {
            n_cand = di_sampler_select_top(s, w, DI_SAMPLER_TOP_P_FIRST, cand);
            z_in = mass_id_order(w, V, x_max, 0.0f);
        }
        if (p->top_p > 0.0f && p->top_p < 1.0f) {
            const double target = (double)p->top_p * z_in;
            int64_t m = 0;
            double cum = 0.0;
            for (;;) {
                for (; m < n_cand && cum < target; m++) cum += (double)di_sampler_exp(w[cand[m]] - x_max);
                if (cum >= target || p->top_k > 0) break;
                int64_t grow = n_cand * 8;
                int64_t got = di_sampler_select_top(s, w, grow, cand);
                if (got == n_cand) break; /* every survivor is in the list: rounding left the target uncovered */
                n_cand = got;
            }
            n_cand = m > 0 ? m : 1;
        }
        if (p->min_p > 0.0f) {
            int64_t m = 1;
            while (m < n_cand && di_sampler_exp(w[cand[m]] - x_max) >= p->min_p) m++;
            n_cand = m;
        }
    } else if (p->min_p > 0.0f) {
        min_weight = p->min_p;
    }

    /* draw */
    const double u = di_philox_uniform(p->seed, (uint64_t)row->position, row->choice, DI_RNG_SAMPLE);
    double z;
    int32_t token = -1;
    if (list_form) {
        z = mass_list(w, cand, n_cand, x_max);
        const double target = u * z;
        double cum = 0.0;
        for (int64_t i = 0; i < n_cand && token < 0; i++) {
            cum += (double)di_sampler_exp(w[cand[i]] - x_max);
            if (cum > target) token = cand[i];
        }
        if (token < 0) token = cand[n_cand - 1];
    } else {
        /* z >= 1 (the best token has e = 1) and the walk re-adds the same terms in the same order,
         * so it reaches z > u·z: the fallback is for safety only */
        const float *e = s->weight;
        z = mass_id_order_keep(w, V, x_max, min_weight, s->weight);
        const double target = u * z;
        double cum = 0.0;
        for (int32_t t = 0; t < V && token < 0; t++) {
            if (e[t] == 0.0f) continue;
            cum += (double)e[t];
            if (cum > target) token = t;
        }
        if (token < 0) token = best;
    }
    out->token = token;

    /* logprobs */
    if (!p->logprobs) return DI_OK;
    if (p->logprobs_mode == DI_LOGPROBS_RAW) {
        logprobs_full(s, row->logits, token, p->n_top_logprobs, out);
        return DI_OK;
    }
    const double log_z = log(z);
    out->logprob = (float)((double)(w[token] - x_max) - log_z);
    if (list_form) {
        out->n_top = (int32_t)(n_cand < p->n_top_logprobs ? n_cand : p->n_top_logprobs);
        for (int32_t i = 0; i < out->n_top; i++) out->top_ids[i] = cand[i];
    } else {
        /* min-p removes a worst-first tail, so the kept top-n are a prefix of the row's top-n */
        int64_t n = di_sampler_select_top(s, w, p->n_top_logprobs, out->top_ids);
        out->n_top = 0;
        for (int64_t i = 0; i < n; i++)
            if (di_sampler_exp(w[out->top_ids[i]] - x_max) >= min_weight) out->top_ids[out->n_top++] = out->top_ids[i];
    }
    for (int32_t i = 0; i < out->n_top; i++)
        out->top_logprobs[i] = (float)((double)(w[out->top_ids[i]] - x_max) - log_z);
    return DI_OK;
}
