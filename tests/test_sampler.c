/* Sampler: Philox known answers, exact best-first selection, each processing stage by hand, the whole
 * pipeline against a straightforward full-sort reference (bit-identical tokens and logprobs), grammar
 * masks, the drawn distribution, independence from what was sampled before, bad input, speed at the
 * real 129,280-token vocabulary.  di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/philox.h"
#include "engine/sampler.h"
#include "testutil.h"

#define V_REAL 129280

/* ---- small deterministic generator for test data (not the sampler's RNG) ---- */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0)); }

/* Logit rows with the shapes that break samplers: normal-ish spread, heavy ties, a few -inf. */
static void fill_row(float *x, int32_t V, int kind) {
    for (int32_t t = 0; t < V; t++) {
        switch (kind % 4) {
        case 0: x[t] = rnd_f(-12.0f, 12.0f); break;
        case 1: x[t] = (float)(int)(rnd() % 7) - 3.0f; break; /* massive ties */
        case 2: x[t] = (rnd() % 50 == 0) ? -INFINITY : rnd_f(-3.0f, 3.0f); break;
        default: x[t] = rnd_f(-1.0f, 1.0f) + (t % 1000 == 7 ? 9.0f : 0.0f); break; /* a few dominant tokens */
        }
    }
    if (kind % 5 == 4) x[V / 3] = -0.0f, x[V / 3 + 1] = 0.0f;
}

/* ---- Philox ---- */

static void test_philox_known_answers(void **state) {
    (void)state;
    /* Random123 kat_vectors, philox4x32 10 rounds */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        di_philox4x32_10(kat[i], kat[i] + 4, out);
        for (int j = 0; j < 4; j++) assert_int_equal(out[j], kat[i][6 + j]);
    }
}

static void test_uniform_stream(void **state) {
    (void)state;
    double sum = 0.0, lo = 1.0, hi = 0.0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        double u = di_philox_uniform(42, (uint64_t)i, 0, 0);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    assert_true(fabs(sum / n - 0.5) < 0.005);
    assert_true(lo < 1e-3 && hi > 1.0 - 1e-3);
    /* every key component matters */
    double u0 = di_philox_uniform(42, 7, 0, 0);
    assert_true(u0 != di_philox_uniform(43, 7, 0, 0));
    assert_true(u0 != di_philox_uniform(42, 8, 0, 0));
    assert_true(u0 != di_philox_uniform(42, 7, 1, 0));
    assert_true(u0 != di_philox_uniform(42, 7, 0, 1));
    assert_true(u0 != di_philox_uniform(42 + (1ull << 32), 7, 0, 0));
    assert_true(u0 != di_philox_uniform(42, 7 + (1ull << 32), 0, 0));
    assert_true(u0 == di_philox_uniform(42, 7, 0, 0));
}

/* The sampler's own exp: within a few ulp of e^x over the whole range it is used on. */
static void test_sampler_exp(void **state) {
    (void)state;
    double worst = 0.0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f * (float)i / 2000000.0f;
        double want = exp((double)x), got = (double)di_sampler_exp(x);
        double ulp = ldexp(1.0, ilogb(want) - 23);
        double err = fabs(got - want) / ulp;
        if (err > worst) worst = err;
    }
    tu_report("di_sampler_exp max error on [-87, 0]: %.2f ulp", worst);
    assert_true(worst <= 4.0);
    assert_true(di_sampler_exp(0.0f) == 1.0f);
    assert_true(di_sampler_exp(-INFINITY) == 0.0f);
    assert_true(di_sampler_exp(-100.0f) == 0.0f);
    /* monotone where the sampler relies on order (min-p prefix, top-p walk) */
    float prev = 0.0f;
    for (int i = -87000; i <= 0; i++) {
        float e = di_sampler_exp((float)i / 1000.0f);
        assert_true(e >= prev);
        prev = e;
    }
}

/* ---- reference: full sort, every stage spelled out over the whole row ---- */

typedef struct {
    float v;
    int32_t id;
} vid;
static int cmp_best_first(const void *a, const void *b) {
    const vid *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* All entries > -inf of x, best first. Returns the count. */
static int32_t ref_sorted(const float *x, int32_t V, vid *out) {
    int32_t n = 0;
    for (int32_t t = 0; t < V; t++)
        if (x[t] > -INFINITY) out[n++] = (vid){x[t], t};
    qsort(out, (size_t)n, sizeof *out, cmp_best_first);
    return n;
}

static void ref_logprobs(const float *x, int32_t V, int32_t token, int32_t n_top, vid *tmp, di_sample_result *r) {
    int32_t n = ref_sorted(x, V, tmp);
    float x_max = tmp[0].v;
    double z = 0.0;
    for (int32_t t = 0; t < V; t++)
        if (x[t] > -INFINITY) z += (double)di_sampler_exp(x[t] - x_max);
    double log_z = log(z);
    r->logprob = x[token] > -INFINITY ? (float)((double)(x[token] - x_max) - log_z) : -INFINITY;
    r->n_top = n < n_top ? n : n_top;
    for (int32_t i = 0; i < r->n_top; i++) {
        r->top_ids[i] = tmp[i].id;
        r->top_logprobs[i] = (float)((double)(tmp[i].v - x_max) - log_z);
    }
}

static void ref_sample(const di_sample_row *row, int32_t V, di_sample_result *r) {
    const di_sampling_params *p = row->params;
    memset(r, 0, sizeof *r);
    float *w = malloc((size_t)V * sizeof *w);
    vid *s = malloc((size_t)V * sizeof *s);
    int32_t *cnt = calloc((size_t)V, sizeof *cnt);
    uint8_t *in = calloc((size_t)V, 1);
    memcpy(w, row->logits, (size_t)V * sizeof *w);
    for (int64_t i = 0; i < row->n_prompt; i++) in[row->prompt[i]] = 1;
    for (int64_t i = 0; i < row->n_output; i++) in[row->output[i]] = 1, cnt[row->output[i]]++;
    for (int32_t t = 0; t < V; t++) {
        if (p->repetition_penalty != 0.0f && p->repetition_penalty != 1.0f && in[t])
            w[t] = w[t] > 0.0f ? w[t] / p->repetition_penalty : w[t] * p->repetition_penalty;
        if ((p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) && cnt[t] > 0) {
            w[t] = w[t] - p->frequency_penalty * (float)cnt[t];
            w[t] = w[t] - p->presence_penalty;
        }
    }
    for (int32_t i = 0; i < p->n_logit_bias; i++) w[p->logit_bias[i].token] += p->logit_bias[i].bias;
    if (row->mask)
        for (int32_t t = 0; t < V; t++)
            if (!(row->mask[t / 32] >> (t % 32) & 1u)) w[t] = -INFINITY;
    int32_t n = ref_sorted(w, V, s);
    assert_true(n > 0);
    if (p->temperature < 1e-5f) {
        r->token = s[0].id;
        if (p->logprobs) ref_logprobs(p->logprobs_mode == DI_LOGPROBS_RAW ? row->logits : w, V, r->token, p->n_top_logprobs, s, r);
        goto done;
    }
    if (p->temperature != 1.0f)
        for (int32_t t = 0; t < V; t++) w[t] = w[t] / p->temperature;
    n = ref_sorted(w, V, s);
    float x_max = s[0].v;
    int list = p->top_k > 0 || (p->top_p > 0.0f && p->top_p < 1.0f);
    float min_weight = 0.0f;
    int32_t m = n;
    double z;
    if (list) {
        double z_in = 0.0;
        if (p->top_k > 0) {
            m = p->top_k < n ? p->top_k : n;
            for (int32_t i = 0; i < m; i++) z_in += (double)di_sampler_exp(s[i].v - x_max);
        } else {
            for (int32_t t = 0; t < V; t++)
                if (w[t] > -INFINITY) z_in += (double)di_sampler_exp(w[t] - x_max);
        }
        if (p->top_p > 0.0f && p->top_p < 1.0f) {
            double cum = 0.0, target = (double)p->top_p * z_in;
            int32_t k = 0;
            while (k < m && cum < target) cum += (double)di_sampler_exp(s[k++].v - x_max);
            m = k > 0 ? k : 1;
        }
        if (p->min_p > 0.0f) {
            int32_t k = 1;
            while (k < m && di_sampler_exp(s[k].v - x_max) >= p->min_p) k++;
            m = k;
        }
        z = 0.0;
        for (int32_t i = 0; i < m; i++) z += (double)di_sampler_exp(s[i].v - x_max);
        double u = di_philox_uniform(p->seed, (uint64_t)row->position, row->choice, 0), cum = 0.0;
        r->token = s[m - 1].id;
        for (int32_t i = 0; i < m; i++) {
            cum += (double)di_sampler_exp(s[i].v - x_max);
            if (cum > u * z) {
                r->token = s[i].id;
                break;
            }
        }
    } else {
        min_weight = p->min_p;
        z = 0.0;
        for (int32_t t = 0; t < V; t++)
            if (w[t] > -INFINITY && di_sampler_exp(w[t] - x_max) >= min_weight) z += (double)di_sampler_exp(w[t] - x_max);
        double u = di_philox_uniform(p->seed, (uint64_t)row->position, row->choice, 0), cum = 0.0;
        r->token = -1;
        int32_t last = -1;
        for (int32_t t = 0; t < V && r->token < 0; t++) {
            if (!(w[t] > -INFINITY) || di_sampler_exp(w[t] - x_max) < min_weight) continue;
            last = t;
            cum += (double)di_sampler_exp(w[t] - x_max);
            if (cum > u * z) r->token = t;
        }
        if (r->token < 0) r->token = last;
    }
    if (!p->logprobs) goto done;
    if (p->logprobs_mode == DI_LOGPROBS_RAW) {
        ref_logprobs(row->logits, V, r->token, p->n_top_logprobs, s, r);
        goto done;
    }
    {
        double log_z = log(z);
        r->logprob = (float)((double)(w[r->token] - x_max) - log_z);
        r->n_top = 0;
        for (int32_t i = 0; i < m && r->n_top < p->n_top_logprobs; i++) {
            if (!list && di_sampler_exp(s[i].v - x_max) < min_weight) break;
            r->top_ids[r->n_top] = s[i].id;
            r->top_logprobs[r->n_top++] = (float)((double)(s[i].v - x_max) - log_z);
        }
    }
done:
    free(w);
    free(s);
    free(cnt);
    free(in);
}

static void assert_same_result(const di_sample_result *a, const di_sample_result *b, const char *what) {
    if (a->token != b->token) fail_msg("%s: token %d vs reference %d", what, a->token, b->token);
    if (memcmp(&a->logprob, &b->logprob, 4)) fail_msg("%s: logprob %.9g vs reference %.9g", what, a->logprob, b->logprob);
    if (a->n_top != b->n_top) fail_msg("%s: %d top entries vs reference %d", what, a->n_top, b->n_top);
    for (int i = 0; i < a->n_top; i++) {
        if (a->top_ids[i] != b->top_ids[i]) fail_msg("%s: top[%d] id %d vs reference %d", what, i, a->top_ids[i], b->top_ids[i]);
        if (memcmp(&a->top_logprobs[i], &b->top_logprobs[i], 4))
            fail_msg("%s: top[%d] logprob %.9g vs reference %.9g", what, i, a->top_logprobs[i], b->top_logprobs[i]);
    }
}

/* ---- selection ---- */

static void test_select_top_exact(void **state) {
    (void)state;
    const int32_t Vs[] = {1, 5, 100, 4099, V_REAL};
    float *x = malloc((size_t)V_REAL * sizeof *x);
    int32_t *ids = malloc((size_t)V_REAL * sizeof *ids);
    vid *ref = malloc((size_t)V_REAL * sizeof *ref);
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++) {
        int32_t V = Vs[vi];
        di_sampler *s;
        assert_int_equal(di_sampler_new(V, &s, NULL), DI_OK);
        for (int kind = 0; kind < 5; kind++) {
            fill_row(x, V, kind);
            int32_t n_ref = ref_sorted(x, V, ref);
            const int64_t ms[] = {1, 2, 20, 50, 513, 4096, V, (int64_t)V + 7};
            for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
                int64_t m = ms[mi];
                int64_t n = di_sampler_select_top(s, x, m, ids);
                int64_t want = m < n_ref ? m : n_ref;
                assert_int_equal(n, want);
                for (int64_t i = 0; i < n; i++)
                    if (ids[i] != ref[i].id)
                        fail_msg("V %d kind %d m %lld: rank %lld id %d, expected %d", V, kind, (long long)m,
                                 (long long)i, ids[i], ref[i].id);
            }
        }
        di_sampler_free(s);
    }
    free(x);
    free(ids);
    free(ref);
}

/* ---- each stage by hand on a tiny vocabulary ---- */

static int32_t greedy(di_sampler *s, const float *x, di_sampling_params *p, const int32_t *prompt, int64_t np,
                      const int32_t *out, int64_t no, const uint32_t *mask) {
    di_sample_row row = {x, p, prompt, np, out, no, mask, 10, 0};
    di_sample_result r;
    di_error err = {0};
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_OK);
    return r.token;
}

static void test_stages_by_hand(void **state) {
    (void)state;
    di_sampler *s;
    assert_int_equal(di_sampler_new(8, &s, NULL), DI_OK);
    di_sampling_params p;
    memset(&p, 0, sizeof p); /* greedy, nothing on */
    /* ties: lowest id wins */
    const float tie[8] = {0, 3, 1, 3, 3, -1, 2, 0};
    assert_int_equal(greedy(s, tie, &p, NULL, 0, NULL, 0, NULL), 1);
    /* repetition penalty: positive logits divided, negative multiplied; prompt and output both count */
    const float x[8] = {2.0f, 1.9f, -0.5f, -0.4f, 1.01f, 0.0f, 0.0f, 0.0f};
    p.repetition_penalty = 2.0f;
    const int32_t pr0[] = {0};
    assert_int_equal(greedy(s, x, &p, pr0, 1, NULL, 0, NULL), 1);  /* 2/2 = 1 < 1.9 */
    assert_int_equal(greedy(s, x, &p, NULL, 0, pr0, 1, NULL), 1);  /* as an output token too */
    const int32_t pr01[] = {0, 1, 0, 1};
    assert_int_equal(greedy(s, x, &p, pr01, 4, NULL, 0, NULL), 4); /* 1, 0.95 vs 1.01: token 4; applied once each */
    /* negative logit multiplied: -0.4 → -0.8 falls below -0.5 */
    const float y[8] = {-INFINITY, -INFINITY, -0.5f, -0.4f, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const int32_t pr3[] = {3};
    assert_int_equal(greedy(s, y, &p, pr3, 1, NULL, 0, NULL), 2);
    p.repetition_penalty = 1.0f;
    /* frequency: count × f; presence: once. Output [0,0,0,1]: 2 - 3·0.1 = 1.7 < 1.9 - 0.1 = 1.8 */
    const int32_t o[] = {0, 0, 0, 1};
    p.frequency_penalty = 0.1f;
    assert_int_equal(greedy(s, x, &p, NULL, 0, o, 4, NULL), 1);
    /* the prompt does not count for frequency/presence */
    assert_int_equal(greedy(s, x, &p, o, 4, NULL, 0, NULL), 0);
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.05f; /* 2 - 0.05 = 1.95 > 1.9 - 0.05 */
    assert_int_equal(greedy(s, x, &p, NULL, 0, o, 4, NULL), 0);
    p.presence_penalty = 0.15f; /* applies to both 0 and 1 equally: still 0 */
    assert_int_equal(greedy(s, x, &p, NULL, 0, o, 4, NULL), 0);
    p.presence_penalty = 0.0f;
    /* logit bias after penalties */
    di_token_bias b[2] = {{5, 2.5f}, {0, -1.0f}};
    p.logit_bias = b;
    p.n_logit_bias = 2;
    assert_int_equal(greedy(s, x, &p, NULL, 0, NULL, 0, NULL), 5);
    /* mask after bias: forbids 5 (and 0) → 1 */
    uint32_t mask = 0xffu & ~(1u << 5) & ~1u;
    assert_int_equal(greedy(s, x, &p, NULL, 0, NULL, 0, &mask), 1);
    p.n_logit_bias = 0;
    p.logit_bias = NULL;

    /* temperature / top-k / top-p / min-p: the candidate sets by hand, checked via the drawn tokens */
    const float z[8] = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f, -3.0f, -4.0f};
    p = di_sampling_params_default();
    p.seed = 5;
    int seen[8];
    const struct {
        int32_t top_k;
        float top_p, min_p, temp;
        int allowed; /* bitmask of tokens that may come out */
    } cases[] = {
        {1, 1.0f, 0.0f, 1.0f, 0x01},
        {3, 1.0f, 0.0f, 1.0f, 0x07},
        /* probabilities ∝ e^3, e^2, e^1 …: p(0) ≈ 0.6439, p(0)+p(1) ≈ 0.8808 */
        {0, 0.6f, 0.0f, 1.0f, 0x01},
        {0, 0.7f, 0.0f, 1.0f, 0x03},
        {0, 0.9f, 0.0f, 1.0f, 0x07},
        /* min-p: keep e^(x - 3) >= 0.1 → x >= 0.697 → tokens 0,1,2 */
        {0, 1.0f, 0.1f, 1.0f, 0x07},
        /* temperature 0.5 doubles the gaps: min-p 0.1 keeps x/0.5 - 6 >= ln 0.1 → x >= 1.85 → 0,1 */
        {0, 1.0f, 0.1f, 0.5f, 0x03},
        /* top-k then top-p on the renormalised top-2: p(0|top-2) ≈ 0.731 ≥ 0.7 → only 0 */
        {2, 0.7f, 0.0f, 1.0f, 0x01},
        {2, 0.75f, 0.0f, 1.0f, 0x03},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.temperature = cases[c].temp;
        memset(seen, 0, sizeof seen);
        for (int pos = 0; pos < 400; pos++) {
            di_sample_row row = {z, &p, NULL, 0, NULL, 0, NULL, pos, 0};
            di_sample_result r;
            assert_int_equal(di_sampler_sample(s, &row, &r, NULL), DI_OK);
            seen[r.token]++;
        }
        int got = 0;
        for (int t = 0; t < 8; t++) got |= seen[t] ? 1 << t : 0;
        if (got != cases[c].allowed) fail_msg("case %zu: tokens drawn 0x%x, expected exactly 0x%x", c, got, cases[c].allowed);
    }
    di_sampler_free(s);
}

/* ---- whole pipeline vs the reference ---- */

static void random_params(di_sampling_params *p, di_token_bias *bias, int32_t V, int i) {
    *p = di_sampling_params_default();
    p->seed = rnd();
    p->temperature = (i % 7 == 0) ? 0.0f : rnd_f(0.3f, 1.6f);
    if (i % 3 == 0) p->top_k = (int32_t)(1 + rnd() % (i % 2 ? 40 : 2000));
    if (i % 4 == 1) p->top_p = rnd_f(0.2f, 0.999f);
    if (i % 5 == 2) p->min_p = rnd_f(0.0f, 0.3f);
    if (i % 6 == 3) p->repetition_penalty = rnd_f(0.8f, 1.5f);
    if (i % 4 == 2) p->frequency_penalty = rnd_f(-0.5f, 1.0f);
    if (i % 5 == 0) p->presence_penalty = rnd_f(-0.5f, 1.0f);
    if (i % 3 == 1) {
        p->n_logit_bias = 3;
        for (int j = 0; j < 3; j++) bias[j] = (di_token_bias){(int32_t)(rnd() % (uint64_t)V), rnd_f(-5.0f, 5.0f)};
        bias[1].token = (bias[0].token + 1) % V; /* distinct from bias[0] */
        bias[2].token = (bias[0].token + 2) % V;
        p->logit_bias = bias;
    }
    p->logprobs = i % 9 != 8;
    p->n_top_logprobs = (int32_t)(rnd() % (DI_SAMPLER_MAX_TOP_LOGPROBS + 1));
    p->logprobs_mode = (i % 2) ? DI_LOGPROBS_PROCESSED : DI_LOGPROBS_RAW;
}

static void run_against_reference(int32_t V, int n_rows) {
    di_sampler *s;
    assert_int_equal(di_sampler_new(V, &s, NULL), DI_OK);
    float *x = malloc((size_t)V * sizeof *x);
    uint32_t *mask = malloc((size_t)(V + 31) / 32 * sizeof *mask);
    int32_t prompt[64], out[64];
    di_token_bias bias[3];
    for (int i = 0; i < n_rows; i++) {
        fill_row(x, V, i);
        di_sampling_params p;
        random_params(&p, bias, V, i);
        int64_t np = (int64_t)(rnd() % 64), no = (int64_t)(rnd() % 64);
        for (int j = 0; j < 64; j++) prompt[j] = (int32_t)(rnd() % (uint64_t)V), out[j] = (int32_t)(rnd() % (uint64_t)(V < 50 ? V : 50));
        int use_mask = i % 4 == 3;
        if (use_mask) {
            for (int32_t w = 0; w < (V + 31) / 32; w++) mask[w] = (uint32_t)rnd() & (uint32_t)rnd();
            mask[0] |= 1u << 3; /* at least one allowed token */
            x[3] = 0.0f;
        }
        di_sample_row row = {x, &p, prompt, np, out, no, use_mask ? mask : NULL, (int64_t)(rnd() % 100000), (uint32_t)(i % 3)};
        di_sample_result got, want;
        di_error err = {0};
        if (di_sampler_sample(s, &row, &got, &err) != DI_OK) fail_msg("row %d: %s", i, err.msg);
        ref_sample(&row, V, &want);
        char what[96];
        snprintf(what, sizeof what, "V %d row %d (T %.2f k %d p %.3f minp %.2f)", V, i, (double)p.temperature, p.top_k,
                 (double)p.top_p, (double)p.min_p);
        assert_same_result(&got, &want, what);
        if (use_mask) assert_true(mask[got.token / 32] >> (got.token % 32) & 1u);
    }
    free(x);
    free(mask);
    di_sampler_free(s);
}

static void test_pipeline_matches_reference(void **state) {
    (void)state;
    run_against_reference(37, 400);
    run_against_reference(1000, 300);
    run_against_reference(V_REAL, 40);
}

/* ---- grammar masks ---- */

static void test_mask_respected(void **state) {
    (void)state;
    const int32_t V = 3000;
    di_sampler *s;
    assert_int_equal(di_sampler_new(V, &s, NULL), DI_OK);
    float *x = malloc((size_t)V * sizeof *x);
    uint32_t mask[(3000 + 31) / 32];
    di_sampling_params p = di_sampling_params_default();
    p.seed = 99;
    p.logprobs = 1;
    p.n_top_logprobs = 5;
    p.logprobs_mode = DI_LOGPROBS_PROCESSED;
    for (int i = 0; i < 300; i++) {
        fill_row(x, V, i);
        memset(mask, 0, sizeof mask);
        int n_allowed = 1 + (int)(rnd() % 5);
        for (int j = 0; j < n_allowed; j++) {
            int32_t t = (int32_t)(rnd() % (uint64_t)V);
            x[t] = rnd_f(-30.0f, -20.0f); /* allowed tokens are the least likely ones */
            mask[t / 32] |= 1u << (t % 32);
        }
        p.top_k = i % 2 ? 3 : 0;
        p.temperature = i % 3 ? 1.0f : 0.0f;
        di_sample_row row = {x, &p, NULL, 0, NULL, 0, mask, i, 0};
        di_sample_result r;
        assert_int_equal(di_sampler_sample(s, &row, &r, NULL), DI_OK);
        assert_true(mask[r.token / 32] >> (r.token % 32) & 1u);
        assert_true(r.n_top <= n_allowed);
        for (int j = 0; j < r.n_top; j++) assert_true(mask[r.top_ids[j] / 32] >> (r.top_ids[j] % 32) & 1u);
    }
    /* nothing allowed: a clear error, not a token */
    memset(mask, 0, sizeof mask);
    di_sample_row row = {x, &p, NULL, 0, NULL, 0, mask, 5, 0};
    di_sample_result r;
    di_error err = {0};
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no token is allowed"));
    free(x);
    di_sampler_free(s);
}

/* ---- the draw follows the distribution ---- */

static void test_draw_distribution(void **state) {
    (void)state;
    const float x[6] = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
    di_sampler *s;
    assert_int_equal(di_sampler_new(6, &s, NULL), DI_OK);
    di_sampling_params p = di_sampling_params_default();
    p.temperature = 0.7f;
    p.seed = 1234;
    const int n = 40000;
    int hits[6] = {0};
    for (int pos = 0; pos < n; pos++) {
        di_sample_row row = {x, &p, NULL, 0, NULL, 0, NULL, pos, 0};
        di_sample_result r;
        assert_int_equal(di_sampler_sample(s, &row, &r, NULL), DI_OK);
        hits[r.token]++;
    }
    double z = 0.0, worst = 0.0;
    for (int t = 0; t < 6; t++) z += exp(x[t] / 0.7);
    for (int t = 0; t < 6; t++) {
        double pt = exp(x[t] / 0.7) / z, sd = sqrt(pt * (1 - pt) / n), dev = fabs(hits[t] / (double)n - pt) / sd;
        worst = dev > worst ? dev : worst;
    }
    tu_report("sampler draw worst deviation (sigmas, 40k draws): %.2f", worst);
    assert_true(worst < 5.0);
    di_sampler_free(s);
}

/* ---- independence from history: scratch reuse, other instances, other rows in between ---- */

static void test_row_independent(void **state) {
    (void)state;
    const int32_t V = 5000;
    di_sampler *a, *b;
    assert_int_equal(di_sampler_new(V, &a, NULL), DI_OK);
    assert_int_equal(di_sampler_new(V, &b, NULL), DI_OK);
    float *x = malloc((size_t)V * sizeof *x), *y = malloc((size_t)V * sizeof *y);
    fill_row(x, V, 0);
    di_token_bias bias[3];
    di_sampling_params p;
    random_params(&p, bias, V, 1);
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.4f;
    p.logprobs = 1;
    p.n_top_logprobs = 7;
    const int32_t hist[] = {5, 9, 9, 17, 4000};
    di_sample_row row = {x, &p, hist, 2, hist + 2, 3, NULL, 777, 0};
    di_sample_result alone, again;
    assert_int_equal(di_sampler_sample(a, &row, &alone, NULL), DI_OK);
    for (int i = 0; i < 50; i++) {
        fill_row(y, V, i);
        di_sampling_params q;
        di_token_bias qb[3];
        random_params(&q, qb, V, i + 3);
        const int32_t h2[] = {1, 2, 3, 9, 9, 4000, 4000};
        di_sample_row other = {y, &q, h2, 3, h2 + 3, 4, NULL, i, 1};
        di_sample_result r;
        assert_int_equal(di_sampler_sample(a, &other, &r, NULL), DI_OK);
        assert_int_equal(di_sampler_sample(a, &row, &again, NULL), DI_OK);
        assert_memory_equal(&alone, &again, sizeof alone);
    }
    assert_int_equal(di_sampler_sample(b, &row, &again, NULL), DI_OK);
    assert_memory_equal(&alone, &again, sizeof alone);
    /* the caller's logits are untouched */
    float *x2 = malloc((size_t)V * sizeof *x2);
    memcpy(x2, x, (size_t)V * sizeof *x2);
    assert_int_equal(di_sampler_sample(b, &row, &again, NULL), DI_OK);
    assert_memory_equal(x, x2, (size_t)V * sizeof *x2);
    free(x2);
    free(x);
    free(y);
    di_sampler_free(a);
    di_sampler_free(b);
}

/* ---- the seed, position and choice all steer the draw; repeating them repeats it ---- */

static void test_seed_position_choice(void **state) {
    (void)state;
    const int32_t V = 1000;
    di_sampler *s;
    assert_int_equal(di_sampler_new(V, &s, NULL), DI_OK);
    float *x = malloc((size_t)V * sizeof *x);
    for (int32_t t = 0; t < V; t++) x[t] = rnd_f(-1.0f, 1.0f); /* flat: every draw matters */
    di_sampling_params a = di_sampling_params_default(), b = a;
    a.seed = 11;
    b.seed = 12;
    int diff_seed = 0, diff_choice = 0, same_repeat = 0;
    int32_t prev = -1, diff_pos = 0;
    for (int pos = 0; pos < 200; pos++) {
        di_sample_row ra = {x, &a, NULL, 0, NULL, 0, NULL, pos, 0}, rb = ra, rc = ra;
        rb.params = &b;
        rc.choice = 1;
        di_sample_result r1, r2, r3, r4;
        assert_int_equal(di_sampler_sample(s, &ra, &r1, NULL), DI_OK);
        assert_int_equal(di_sampler_sample(s, &rb, &r2, NULL), DI_OK);
        assert_int_equal(di_sampler_sample(s, &rc, &r3, NULL), DI_OK);
        assert_int_equal(di_sampler_sample(s, &ra, &r4, NULL), DI_OK);
        diff_seed += r1.token != r2.token;
        diff_choice += r1.token != r3.token;
        same_repeat += r1.token == r4.token;
        diff_pos += r1.token != prev;
        prev = r1.token;
    }
    assert_int_equal(same_repeat, 200);
    assert_true(diff_seed > 190 && diff_choice > 190 && diff_pos > 190);
    free(x);
    di_sampler_free(s);
}

/* ---- bad input ---- */

static void test_bad_input(void **state) {
    (void)state;
    di_sampler *s;
    di_error err = {0};
    assert_int_equal(di_sampler_new(0, &s, &err), DI_ERR_INVALID);
    assert_int_equal(di_sampler_new(16, &s, &err), DI_OK);
    float x[16] = {0};
    di_sampling_params p = di_sampling_params_default();
    di_sample_row row = {x, &p, NULL, 0, NULL, 0, NULL, 0, 0};
    di_sample_result r;
    x[4] = NAN;
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 4"));
    x[4] = INFINITY;
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
    x[4] = 0.0f;
    const int32_t badp[] = {3, 16};
    row.prompt = badp;
    row.n_prompt = 2;
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "prompt token 1 is id 16"));
    row.prompt = NULL;
    row.n_prompt = 0;
    const int32_t bado[] = {-1};
    row.output = bado;
    row.n_output = 1;
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
    row.output = NULL;
    row.n_output = 0;
    struct {
        float *f;
        float v;
        const char *needle;
    } bad[] = {{&p.temperature, -1.0f, "temperature"}, {&p.top_p, 1.5f, "top_p"}, {&p.min_p, -0.1f, "min_p"},
               {&p.repetition_penalty, NAN, "repetition_penalty"}, {&p.presence_penalty, INFINITY, "penalty"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        float keep = *bad[i].f;
        *bad[i].f = bad[i].v;
        assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
        assert_non_null(strstr(err.msg, bad[i].needle));
        *bad[i].f = keep;
    }
    p.n_top_logprobs = 21;
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
    p.n_top_logprobs = 0;
    di_token_bias lb = {16, 1.0f};
    p.logit_bias = &lb;
    p.n_logit_bias = 1;
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "logit_bias token 16"));
    p.n_logit_bias = 0;
    assert_int_equal(di_sampler_sample(s, &row, &r, &err), DI_OK);
    di_sampler_free(s);
}

/* ---- speed at the real vocabulary ---- */

/* CPU time of this thread: the build machine is shared, wall time would measure the neighbours. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_speed_real_vocab(void **state) {
    (void)state;
    di_sampler *s;
    assert_int_equal(di_sampler_new(V_REAL, &s, NULL), DI_OK);
    float *x = malloc((size_t)V_REAL * sizeof *x);
    /* LM-like row: a broad bulk and a short head (top-p 0.9 keeps a few hundred tokens) */
    for (int32_t t = 0; t < V_REAL; t++) x[t] = rnd_f(-6.0f, 2.0f);
    for (int i = 0; i < 300; i++) x[rnd() % V_REAL] = rnd_f(8.0f, 14.0f);
    const struct {
        const char *name;
        float temp, top_p;
        int32_t top_k, logprobs;
    } cfg[] = {{"greedy", 0.0f, 1.0f, 0, 0},          {"full-vocab T=1", 1.0f, 1.0f, 0, 0},
               {"top-k 50", 0.8f, 1.0f, 50, 0},       {"top-p 0.9", 0.8f, 0.9f, 0, 0},
               {"top-k 50 + logprobs 5", 0.8f, 1.0f, 50, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        di_sampling_params p = di_sampling_params_default();
        p.temperature = cfg[c].temp;
        p.top_p = cfg[c].top_p;
        p.top_k = cfg[c].top_k;
        p.logprobs = cfg[c].logprobs;
        p.n_top_logprobs = cfg[c].logprobs ? 5 : 0;
        const int n = 30;
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            di_sample_row row = {x, &p, NULL, 0, NULL, 0, NULL, i, 0};
            di_sample_result r;
            assert_int_equal(di_sampler_sample(s, &row, &r, NULL), DI_OK);
        }
        tu_report("sampler %s, V=129280: %.3f ms/row (thread CPU time)", cfg[c].name, 1e3 * (now_s() - t0) / n);
    }
    free(x);
    di_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_uniform_stream),
        cmocka_unit_test(test_sampler_exp),
        cmocka_unit_test(test_select_top_exact),
        cmocka_unit_test(test_stages_by_hand),
        cmocka_unit_test(test_pipeline_matches_reference),
        cmocka_unit_test(test_mask_respected),
        cmocka_unit_test(test_draw_distribution),
        cmocka_unit_test(test_row_independent),
        cmocka_unit_test(test_seed_position_choice),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_speed_real_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
