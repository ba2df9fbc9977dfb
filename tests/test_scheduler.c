/* Engine core on the mock runner: plain-loop equivalence, batch invariance (alone vs random batches,
 * sync and async, tight caches), chunk boundaries, preemption + recompute, cancellation, stop ids /
 * strings across token boundaries, limits, FIFO and budgets, grammar-constraint hook.
 * di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_core.h"
#include "engine/idmap.h"
#include "engine/mock_runner.h"
#include "testutil.h"
#include "util/log.h"

#define EOS 3

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

/* Detokenizer: token t is 1–3 letters of "abcde" — stop strings can span token boundaries. */
static int detok(void *ctx, int32_t t, char *buf, size_t cap) {
    (void)ctx;
    int n = 1 + t % 3;
    if ((size_t)n > cap) return n;
    for (int i = 0, v = t / 3; i < n; i++, v /= 5) buf[i] = "abcde"[v % 5];
    return n;
}

/* The same pieces, plus host work per token (stands in for a real detokenizer + stop checks). */
static int detok_busy(void *ctx, int32_t t, char *buf, size_t cap) {
    double until = di_now() + *(const double *)ctx;
    while (di_now() < until) {
    }
    return detok(NULL, t, buf, cap);
}

/* ---- a job list and its outcome ---- */

typedef struct job {
    int32_t *prompt;
    int64_t n_prompt;
    di_seq_params p;
    di_token_bias bias;
    const char *stop[2];
    int32_t stop_id;
    int64_t add_at;     /* step at which it is added */
    int64_t cancel_at;  /* step at which it is cancelled, −1 never */
} job;

typedef struct outcome {
    int32_t *tok;
    di_token_logprobs *lp;
    int64_t n;
    char *text;
    size_t n_text;
    di_finish_reason fin;
    int32_t preemptions;
    int reported;
} outcome;

static void outcome_free(outcome *o, int n) {
    for (int i = 0; i < n; i++) free(o[i].tok), free(o[i].lp), free(o[i].text);
    memset(o, 0, (size_t)n * sizeof *o);
}

static di_mock_options mock_opts(void) {
    di_mock_options m = {.n_vocab = 512, .max_context = 1024, .block_tokens = 16, .n_blocks = 512, .salt = 7, .sharpness = 12.0f};
    return m;
}

static di_core_options core_opts(int async, int32_t max_seqs, int64_t budget, int32_t chunk) {
    static const int32_t eos[] = {EOS};
    di_core_options o = {.sched = {.max_seqs = max_seqs, .max_step_tokens = budget, .prefill_chunk = chunk},
                         .async = async,
                         .eos_ids = eos,
                         .n_eos = 1,
                         .detok = detok};
    return o;
}

typedef struct run_info {
    di_core_stats stats;
    int64_t fed_back;     /* pieces the mock saw flagged as fed back */
    int64_t decodes;      /* single-token pieces past position 0 */
    int64_t steps;
    di_mock_runner *mock; /* kept for log inspection when asked */
    int32_t pool_free_end, pool_size;
} run_info;

static void run_jobs(const di_mock_options *mo, const di_core_options *co, job *jobs, int n, outcome *out,
                     run_info *info, int keep_mock) {
    di_mock_runner *mock;
    di_model_runner runner;
    di_error err = {0};
    if (di_mock_runner_new(mo, &mock, &runner, &err)) fail_msg("%s", err.msg);
    di_core *c;
    if (di_core_new(&runner, co, &c, &err)) fail_msg("%s", err.msg);
    memset(out, 0, (size_t)n * sizeof *out);
    int added = 0, done = 0;
    int64_t step = 0;
    di_core_delta d[64];
    while (done < n) {
        for (int i = 0; i < n; i++) {
            if (jobs[i].add_at == step) {
                if (di_core_add(c, i, jobs[i].prompt, jobs[i].n_prompt, &jobs[i].p, &err)) fail_msg("job %d: %s", i, err.msg);
                added++;
            }
            if (jobs[i].cancel_at == step && !out[i].reported) di_core_cancel(c, i, NULL);
        }
        if (di_core_step(c, &err)) fail_msg("step %lld: %s", (long long)step, err.msg);
        int32_t k;
        while ((k = di_core_poll(c, d, 64)) > 0) {
            for (int32_t j = 0; j < k; j++) {
                outcome *o = &out[d[j].id];
                assert_false(o->reported);
                o->tok = realloc(o->tok, (size_t)(o->n + d[j].n_tokens + 1) * sizeof *o->tok);
                o->lp = realloc(o->lp, (size_t)(o->n + d[j].n_tokens + 1) * sizeof *o->lp);
                if (d[j].n_tokens) memcpy(o->tok + o->n, d[j].tokens, (size_t)d[j].n_tokens * sizeof *o->tok);
                if (d[j].logprobs && d[j].n_tokens) memcpy(o->lp + o->n, d[j].logprobs, (size_t)d[j].n_tokens * sizeof *o->lp);
                else memset(o->lp + o->n, 0, (size_t)d[j].n_tokens * sizeof *o->lp);
                o->n += d[j].n_tokens;
                o->text = realloc(o->text, o->n_text + d[j].n_text + 1);
                if (d[j].n_text) memcpy(o->text + o->n_text, d[j].text, d[j].n_text);
                o->n_text += d[j].n_text;
                o->text[o->n_text] = 0;
                o->preemptions = d[j].preemptions;
                if (d[j].finish != DI_FINISH_REASON_NONE) {
                    if (d[j].finish == DI_FINISH_REASON_ERROR) fail_msg("job %lld failed: %s", (long long)d[j].id, d[j].error);
                    o->fin = d[j].finish;
                    o->reported = 1;
                    done++;
                }
            }
            if (k < 64) break;
        }
        step++;
        if (step > 200000) fail_msg("no progress after %lld steps (%d added, %d done)", (long long)step, added, done);
    }
    /* drain: a step in flight for finished requests, then their cache comes back */
    while (di_core_busy(c)) di_core_step(c, &err);
    di_core_step(c, &err);
    if (info) {
        info->stats = *di_core_get_stats(c);
        info->steps = step;
        info->pool_free_end = di_core_scheduler(c)->pool.n_free;
        info->pool_size = di_core_scheduler(c)->pool.n_blocks;
        info->mock = NULL;
    }
    di_core_free(c);
    if (info) {
        info->fed_back = mock->n_fed_back;
        info->decodes = 0;
        for (int64_t l = 0; l < mock->n_log; l++) info->decodes += mock->log[l].n_tokens == 1 && mock->log[l].pos0 > 0;
    }
    if (keep_mock && info) info->mock = mock;
    else di_mock_runner_free(mock);
}

static void job_free(job *j, int n) {
    for (int i = 0; i < n; i++) free(j[i].prompt);
}

/* Random requests: prompts of 1..max_prompt tokens, random sampling, ~1/4 greedy, some stop ids,
 * EOS made likely for some. */
static void make_jobs(job *j, int n, int64_t max_prompt, int64_t max_out) {
    for (int i = 0; i < n; i++) {
        memset(&j[i], 0, sizeof j[i]);
        j[i].n_prompt = rnd_in(1, max_prompt);
        j[i].prompt = malloc((size_t)j[i].n_prompt * sizeof *j[i].prompt);
        for (int64_t t = 0; t < j[i].n_prompt; t++) j[i].prompt[t] = (int32_t)rnd_in(0, 511);
        di_seq_params *p = &j[i].p;
        p->sampling = di_sampling_params_default();
        p->sampling.seed = rnd();
        p->sampling.temperature = (i % 4 == 0) ? 0.0f : 0.5f + (float)(rnd() % 100) / 100.0f;
        if (i % 3 == 1) p->sampling.top_k = (int32_t)rnd_in(1, 60);
        if (i % 5 == 2) p->sampling.top_p = 0.8f;
        if (i % 7 == 3) p->sampling.min_p = 0.05f;
        if (i % 6 == 5) p->sampling.frequency_penalty = 0.3f, p->sampling.repetition_penalty = 1.2f;
        p->sampling.logprobs = 1;
        p->sampling.n_top_logprobs = (int32_t)rnd_in(0, 4);
        if (i % 5 == 4) {
            j[i].bias = (di_token_bias){EOS, 6.0f};
            p->sampling.logit_bias = &j[i].bias;
            p->sampling.n_logit_bias = 1;
        }
        p->max_tokens = rnd_in(1, max_out);
        p->choice = (uint32_t)(i % 2);
        p->prefill_chunk = (i % 3 == 0) ? (int32_t)rnd_in(3, 40) : 0;
        j[i].cancel_at = -1;
    }
}

static void assert_same_outcome(const outcome *a, const outcome *b, const char *what, int i) {
    if (a->n != b->n) fail_msg("%s: job %d has %lld tokens, alone %lld", what, i, (long long)a->n, (long long)b->n);
    for (int64_t t = 0; t < a->n; t++) {
        if (a->tok[t] != b->tok[t]) fail_msg("%s: job %d token %lld is %d, alone %d", what, i, (long long)t, a->tok[t], b->tok[t]);
        if (memcmp(&a->lp[t], &b->lp[t], sizeof a->lp[t]))
            fail_msg("%s: job %d token %lld logprobs differ (%.9g vs %.9g)", what, i, (long long)t, a->lp[t].logprob,
                     b->lp[t].logprob);
    }
    if (a->fin != b->fin) fail_msg("%s: job %d finish %s, alone %s", what, i, di_finish_reason_name(a->fin), di_finish_reason_name(b->fin));
    if (a->n_text != b->n_text || (a->n_text && memcmp(a->text, b->text, a->n_text))) fail_msg("%s: job %d text differs", what, i);
}

/* ---- a plain loop, no scheduler: the meaning of a request ---- */

static void plain_generate(const di_mock_options *mo, const job *j, outcome *o) {
    di_sampler *s;
    assert_int_equal(di_sampler_new(mo->n_vocab, &s, NULL), DI_OK);
    int64_t cap = j->n_prompt + j->p.max_tokens;
    int32_t *hist = malloc((size_t)cap * sizeof *hist);
    float *logits = malloc((size_t)mo->n_vocab * sizeof *logits);
    memcpy(hist, j->prompt, (size_t)j->n_prompt * sizeof *hist);
    memset(o, 0, sizeof *o);
    o->tok = malloc((size_t)j->p.max_tokens * sizeof *o->tok);
    o->lp = calloc((size_t)j->p.max_tokens, sizeof *o->lp);
    int64_t len = j->n_prompt;
    o->fin = DI_FINISH_REASON_LENGTH;
    while (o->n < j->p.max_tokens && len < mo->max_context) {
        di_mock_logits(mo, hist, len, logits);
        di_sample_row row = {logits, &j->p.sampling, j->prompt, j->n_prompt, hist + j->n_prompt, o->n, NULL, len, j->p.choice};
        di_sample_result r;
        assert_int_equal(di_sampler_sample(s, &row, &r, NULL), DI_OK);
        o->tok[o->n] = r.token;
        o->lp[o->n].logprob = r.logprob;
        o->lp[o->n].n_top = r.n_top;
        memcpy(o->lp[o->n].top_ids, r.top_ids, sizeof r.top_ids);
        memcpy(o->lp[o->n].top_logprobs, r.top_logprobs, sizeof r.top_logprobs);
        o->n++;
        hist[len++] = r.token;
        if (r.token == EOS) {
            o->fin = DI_FINISH_REASON_STOP;
            break;
        }
    }
    free(hist);
    free(logits);
    di_sampler_free(s);
}

static void test_single_matches_plain_loop(void **state) {
    (void)state;
    enum { N = 12 };
    job jobs[N];
    make_jobs(jobs, N, 70, 60);
    di_mock_options mo = mock_opts();
    for (int async = 0; async < 2; async++) {
        di_core_options co = core_opts(async, 8, 64, 16);
        for (int i = 0; i < N; i++) {
            outcome got, want;
            jobs[i].add_at = 0;
            run_jobs(&mo, &co, &jobs[i], 1, &got, NULL, 0);
            plain_generate(&mo, &jobs[i], &want);
            /* the engine's top-logprob entries beyond n_top are zero; so are the plain loop's */
            for (int64_t t = 0; t < want.n && t < got.n; t++) {
                memset(want.lp[t].top_ids + want.lp[t].n_top, 0, sizeof(int32_t) * (size_t)(DI_SAMPLER_MAX_TOP_LOGPROBS - want.lp[t].n_top));
                memset(want.lp[t].top_logprobs + want.lp[t].n_top, 0, sizeof(float) * (size_t)(DI_SAMPLER_MAX_TOP_LOGPROBS - want.lp[t].n_top));
            }
            got.n_text = want.n_text = 0;
            assert_same_outcome(&got, &want, async ? "async vs plain loop" : "sync vs plain loop", i);
            outcome_free(&got, 1);
            outcome_free(&want, 1);
        }
    }
    job_free(jobs, N);
}

/* ---- batch invariance: each request alone, then inside random batches ---- */

/* Prefill pieces (those that do not reach the sequence end) of one request in a mock log. */
static int64_t prefill_pieces(const di_mock_runner *m, int64_t id, int64_t *pos0, int32_t *n, int64_t cap) {
    int64_t k = 0;
    for (int64_t i = 0; i < m->n_log; i++)
        if (m->log[i].req_id == id && m->log[i].n_tokens > 1 && k < cap) {
            pos0[k] = m->log[i].pos0;
            n[k++] = m->log[i].n_tokens;
        }
    return k;
}

static void test_batch_invariance(void **state) {
    (void)state;
    enum { N = 33 };
    job jobs[N];
    make_jobs(jobs, N, 200, 80);
    di_mock_options mo = mock_opts();
    outcome alone[N];
    int64_t (*alone_pos)[64] = calloc(N, sizeof *alone_pos);
    int32_t (*alone_n)[64] = calloc(N, sizeof *alone_n);
    int64_t alone_k[N];
    for (int i = 0; i < N; i++) {
        di_core_options co = core_opts(0, 1, 64, 16);
        run_info info;
        jobs[i].add_at = 0;
        run_jobs(&mo, &co, &jobs[i], 1, &alone[i], &info, 1);
        alone_k[i] = prefill_pieces(info.mock, 0, alone_pos[i], alone_n[i], 64);
        di_mock_runner_free(info.mock);
    }
    int64_t max_batch = 0, preempted = 0;
    for (int run = 0; run < 8; run++) {
        int async = run % 2;
        int32_t max_seqs = (int32_t)rnd_in(2, 33);
        int64_t budget = rnd_in(40, 300);
        if (run == 0) max_seqs = 33, budget = 8000; /* everyone in one batch: each request with 32 others */
        di_core_options co = core_opts(async, max_seqs, budget, 16);
        co.sample_threads = 1 + run % 3; /* rows sampled on 1–3 threads */
        di_mock_options m2 = mo;
        if (run >= 4) m2.n_blocks = (int32_t)rnd_in(20, 40); /* tight: preemption */
        for (int i = 0; i < N; i++) jobs[i].add_at = run == 0 ? 0 : rnd_in(0, 30);
        outcome got[N];
        run_info info;
        run_jobs(&m2, &co, jobs, N, got, &info, 1);
        char what[128];
        snprintf(what, sizeof what, "run %d (%s, max_seqs %d, budget %lld, %d blocks, %d sampling threads)", run,
                 async ? "async" : "sync", max_seqs, (long long)budget, m2.n_blocks, co.sample_threads);
        for (int i = 0; i < N; i++) {
            assert_same_outcome(&got[i], &alone[i], what, i);
            if (got[i].preemptions) continue; /* recompute re-chunks prompt + outputs: checked separately */
            int64_t pos[64];
            int32_t n[64];
            int64_t k = prefill_pieces(info.mock, i, pos, n, 64);
            if (k != alone_k[i]) fail_msg("%s: job %d has %lld prefill chunks, alone %lld", what, i, (long long)k, (long long)alone_k[i]);
            for (int64_t c = 0; c < k; c++)
                if (pos[c] != alone_pos[i][c] || n[c] != alone_n[i][c])
                    fail_msg("%s: job %d chunk %lld is [%lld,+%d), alone [%lld,+%d)", what, i, (long long)c,
                             (long long)pos[c], n[c], (long long)alone_pos[i][c], alone_n[i][c]);
        }
        for (int64_t l = 0; l < info.mock->n_log; l++)
            if (info.mock->log[l].n_in_batch > max_batch) max_batch = info.mock->log[l].n_in_batch;
        preempted += info.stats.preemptions;
        assert_int_equal(info.pool_free_end, info.pool_size);
        di_mock_runner_free(info.mock);
        outcome_free(got, N);
    }
    tu_report("batch invariance: 8 runs x %d requests, largest batch %lld, %lld preemptions, all bit-identical", N,
              (long long)max_batch, (long long)preempted);
    assert_int_equal(max_batch, 33);
    assert_true(preempted > 0);
    outcome_free(alone, N);
    free(alone_pos);
    free(alone_n);
    job_free(jobs, N);
}

/* ---- chunk boundaries are the request's own ---- */

static void test_chunk_boundaries(void **state) {
    (void)state;
    enum { N = 6 };
    job jobs[N];
    make_jobs(jobs, N, 10, 5);
    const int32_t chunks[N] = {7, 16, 16, 32, 5, 64};
    for (int i = 0; i < N; i++) {
        free(jobs[i].prompt);
        jobs[i].n_prompt = 100 + 13 * i;
        jobs[i].prompt = malloc((size_t)jobs[i].n_prompt * sizeof *jobs[i].prompt);
        for (int64_t t = 0; t < jobs[i].n_prompt; t++) jobs[i].prompt[t] = (int32_t)((t * 31 + i) % 500) + 10;
        jobs[i].p.prefill_chunk = chunks[i] == 16 ? 0 : chunks[i];
        jobs[i].add_at = 0; /* prefills compete for the budget from the first step */
    }
    di_mock_options mo = mock_opts();
    di_core_options co = core_opts(1, 4, 70, 16);
    outcome got[N];
    run_info info;
    run_jobs(&mo, &co, jobs, N, got, &info, 1);
    for (int i = 0; i < N; i++) {
        int64_t pos[64];
        int32_t n[64];
        int64_t k = prefill_pieces(info.mock, i, pos, n, 64);
        int64_t expect_pos = 0;
        for (int64_t c = 0; c < k; c++) {
            assert_int_equal(pos[c], expect_pos);
            int64_t want = jobs[i].n_prompt - expect_pos < chunks[i] ? jobs[i].n_prompt - expect_pos : chunks[i];
            assert_int_equal(n[c], want);
            expect_pos += n[c];
        }
        assert_true(expect_pos >= jobs[i].n_prompt - 1);
    }
    /* budget and sequence limit held in every step */
    int64_t tokens_in_step = 0, last_step = -1;
    for (int64_t l = 0; l <= info.mock->n_log; l++) {
        if (l == info.mock->n_log || (int64_t)info.mock->log[l].step != last_step) {
            assert_true(tokens_in_step <= 70);
            if (l == info.mock->n_log) break;
            tokens_in_step = 0;
            last_step = (int64_t)info.mock->log[l].step;
        }
        tokens_in_step += info.mock->log[l].n_tokens;
        assert_true(info.mock->log[l].n_in_batch <= 4);
    }
    di_mock_runner_free(info.mock);
    outcome_free(got, N);
    job_free(jobs, N);
}

/* ---- preemption and recompute ---- */

static void test_preemption_resume(void **state) {
    (void)state;
    enum { N = 10 };
    job jobs[N];
    make_jobs(jobs, N, 60, 120);
    for (int i = 0; i < N; i++) {
        jobs[i].p.max_tokens = 100 + i;
        jobs[i].p.sampling.n_logit_bias = 0; /* long outputs */
        jobs[i].p.ignore_eos = 1;
        jobs[i].add_at = 0;
    }
    di_mock_options mo = mock_opts();
    outcome ref[N], got[N];
    run_info info;
    for (int async = 0; async < 2; async++) {
        di_core_options co = core_opts(async, 10, 256, 16);
        run_jobs(&mo, &co, jobs, N, ref, &info, 0);
        assert_int_equal(info.stats.preemptions, 0);
        int64_t roomy_prefill = info.stats.prefill_tokens;
        di_mock_options tight = mo;
        tight.n_blocks = 24; /* 10 requests of up to ~14 blocks each */
        run_jobs(&tight, &co, jobs, N, got, &info, 0);
        tu_report("preemption (%s, 24 blocks): %lld preemptions (%lld forced syncs), %lld prefill tokens incl. "
                  "recompute vs %lld with room",
                  async ? "async" : "sync", (long long)info.stats.preemptions, (long long)info.stats.forced_syncs,
                  (long long)info.stats.prefill_tokens, (long long)roomy_prefill);
        assert_true(info.stats.preemptions > 0);
        if (async) assert_true(info.stats.forced_syncs > 0); /* the wait-for-the-victim path ran */
        else assert_int_equal(info.stats.forced_syncs, 0);
        int any = 0;
        for (int i = 0; i < N; i++) {
            assert_same_outcome(&got[i], &ref[i], "preempted vs roomy", i);
            any |= got[i].preemptions > 0;
            assert_int_equal(got[i].n, jobs[i].p.max_tokens);
        }
        assert_true(any);
        assert_int_equal(info.pool_free_end, info.pool_size);
        outcome_free(ref, N);
        outcome_free(got, N);
    }
    job_free(jobs, N);
}

/* ---- cancellation ---- */

static void test_cancellation(void **state) {
    (void)state;
    enum { N = 8 };
    job jobs[N];
    make_jobs(jobs, N, 100, 60);
    for (int i = 0; i < N; i++) {
        jobs[i].p.max_tokens = 60;
        jobs[i].p.ignore_eos = 1;
        jobs[i].p.sampling.n_logit_bias = 0;
        jobs[i].add_at = i;
    }
    free(jobs[1].prompt);
    jobs[1].n_prompt = 300; /* still prefilling when cancelled */
    jobs[1].prompt = calloc(300, sizeof *jobs[1].prompt);
    di_mock_options mo = mock_opts();
    for (int async = 0; async < 2; async++) {
        di_core_options co = core_opts(async, 3, 40, 16);
        outcome ref[N], got[N];
        run_jobs(&mo, &co, jobs, N, ref, NULL, 0);
        jobs[1].cancel_at = 4;  /* mid prefill */
        jobs[2].cancel_at = 30; /* mid decode */
        jobs[7].cancel_at = 7;  /* still waiting (max_seqs 3) */
        jobs[0].cancel_at = 500; /* after it finished: ignored */
        run_info info;
        run_jobs(&mo, &co, jobs, N, got, &info, 0);
        assert_int_equal(got[1].fin, DI_FINISH_REASON_CANCELLED);
        assert_int_equal(got[1].n, 0);
        assert_int_equal(got[2].fin, DI_FINISH_REASON_CANCELLED);
        assert_true(got[2].n > 0 && got[2].n < ref[2].n);
        assert_memory_equal(got[2].tok, ref[2].tok, (size_t)got[2].n * sizeof *got[2].tok); /* a prefix */
        assert_int_equal(got[7].fin, DI_FINISH_REASON_CANCELLED);
        assert_int_equal(got[7].n, 0);
        for (int i = 0; i < N; i++)
            if (i != 1 && i != 2 && i != 7) assert_same_outcome(&got[i], &ref[i], "with cancellations", i);
        assert_int_equal(info.pool_free_end, info.pool_size);
        for (int i = 0; i < N; i++) jobs[i].cancel_at = -1;
        outcome_free(ref, N);
        outcome_free(got, N);
    }
    job_free(jobs, N);
}

/* ---- stop ids and stop strings ---- */

static void test_stop_conditions(void **state) {
    (void)state;
    enum { N = 6 };
    job jobs[N];
    make_jobs(jobs, N, 30, 10);
    di_mock_options mo = mock_opts();
    di_core_options co = core_opts(1, 4, 64, 16);
    for (int i = 0; i < N; i++) {
        jobs[i].p.max_tokens = 50;
        jobs[i].p.ignore_eos = 1;
        jobs[i].p.sampling.n_logit_bias = 0;
        jobs[i].add_at = 0;
    }
    outcome ref[N];
    run_jobs(&mo, &co, jobs, N, ref, NULL, 0);
    int spanning = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(ref[i].fin, DI_FINISH_REASON_LENGTH);
        assert_int_equal(ref[i].n, 50);
        /* token boundaries in the text */
        size_t bound[51];
        bound[0] = 0;
        for (int t = 0; t < 50; t++) bound[t + 1] = bound[t] + (size_t)(1 + ref[i].tok[t] % 3);
        assert_int_equal(bound[50], ref[i].n_text);
        /* a 4-byte stop string starting 1 byte before the end of token 20's text: spans two or more tokens */
        size_t at = bound[21] - 1;
        char stop[5];
        memcpy(stop, ref[i].text + at, 4);
        stop[4] = 0;
        const char *first = strstr(ref[i].text, stop);
        size_t cut = (size_t)(first - ref[i].text);
        int last_tok = 0; /* the token whose text completes the first match */
        while (bound[last_tok + 1] < cut + 4) last_tok++;
        spanning += bound[last_tok] > cut;
        job j = jobs[i];
        j.stop[0] = stop;
        j.stop[1] = "zzzz"; /* never produced: the detokenizer only emits a–e */
        j.p.stop = j.stop;
        j.p.n_stop = 2;
        outcome got;
        run_jobs(&mo, &co, &j, 1, &got, NULL, 0);
        assert_int_equal(got.fin, DI_FINISH_REASON_STOP);
        assert_int_equal(got.n_text, cut);
        assert_memory_equal(got.text, ref[i].text, cut);
        assert_int_equal(got.n, last_tok + 1);
        assert_memory_equal(got.tok, ref[i].tok, (size_t)got.n * sizeof *got.tok);
        outcome_free(&got, 1);
        /* stop id: the 10th token's id stops at its first occurrence, kept in the tokens, no text */
        j = jobs[i];
        j.stop_id = ref[i].tok[9];
        j.p.stop_ids = &j.stop_id;
        j.p.n_stop_ids = 1;
        run_jobs(&mo, &co, &j, 1, &got, NULL, 0);
        int64_t firsti = 0;
        while (ref[i].tok[firsti] != j.stop_id) firsti++;
        assert_int_equal(got.fin, DI_FINISH_REASON_STOP);
        assert_int_equal(got.n, firsti + 1);
        assert_int_equal(got.n_text, bound[firsti]);
        outcome_free(&got, 1);
    }
    tu_report("stop strings spanning a token boundary: %d of %d cases", spanning, N);
    assert_true(spanning >= N / 2);
    outcome_free(ref, N);
    job_free(jobs, N);
}

/* Streaming never shows part of a stop string, and never splits a UTF-8 character. */
static void test_text_ready(void **state) {
    (void)state;
    di_seq_params p = {.sampling = di_sampling_params_default(), .max_tokens = 100};
    const char *stops[] = {"STOP", "xy"};
    p.stop = stops;
    p.n_stop = 2;
    const int32_t prompt[] = {1};
    di_seq *r;
    assert_int_equal(di_seq_new(1, prompt, 1, &p, 100, &r, NULL), DI_OK);
    const char *pieces[] = {"ab", "ST", "O", "\xC3", "\xA9", "x", "Q"};
    size_t expect_ready[] = {2, 2, 2, 5, 7, 7, 9};
    for (int i = 0; i < 7; i++) {
        r->text = realloc(r->text, r->n_text + 3);
        memcpy(r->text + r->n_text, pieces[i], strlen(pieces[i]));
        r->n_text += strlen(pieces[i]);
        r->text[r->n_text] = 0;
        assert_int_equal(di_seq_text_ready(r), expect_ready[i]);
    }
    di_seq_free(r);
}

/* ---- limits and bad input ---- */

static void test_limits(void **state) {
    (void)state;
    di_mock_options mo = mock_opts();
    mo.max_context = 100;
    mo.n_blocks = 8; /* 128 positions */
    di_mock_runner *mock;
    di_model_runner runner;
    di_error err = {0};
    assert_int_equal(di_mock_runner_new(&mo, &mock, &runner, &err), DI_OK);
    di_core_options co = core_opts(0, 4, 64, 16);
    di_core *c;
    assert_int_equal(di_core_new(&runner, &co, &c, &err), DI_OK);
    int32_t prompt[120] = {0};
    di_seq_params p = {.sampling = di_sampling_params_default(), .max_tokens = 1000, .ignore_eos = 1};
    assert_int_equal(di_core_add(c, 1, prompt, 100, &p, &err), DI_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "request 1"));
    assert_int_equal(di_core_add(c, 2, prompt, 0, &p, &err), DI_ERR_INVALID);
    prompt[3] = 512;
    assert_int_equal(di_core_add(c, 3, prompt, 10, &p, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "prompt token 3"));
    prompt[3] = 0;
    p.max_tokens = 0;
    assert_int_equal(di_core_add(c, 4, prompt, 10, &p, &err), DI_ERR_INVALID);
    p.max_tokens = 1000;
    p.prefill_chunk = 65;
    assert_int_equal(di_core_add(c, 5, prompt, 10, &p, &err), DI_ERR_INVALID);
    p.prefill_chunk = 0;
    di_token_bias dup[2] = {{7, 1.0f}, {7, -1.0f}};
    p.sampling.logit_bias = dup;
    p.sampling.n_logit_bias = 2;
    assert_int_equal(di_core_add(c, 8, prompt, 10, &p, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 7 twice"));
    p.sampling.n_logit_bias = 0;
    const char *long_stop[1] = {""};
    p.stop = long_stop;
    p.n_stop = 1;
    assert_int_equal(di_core_add(c, 9, prompt, 10, &p, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "stop string 0"));
    p.n_stop = 0;
    /* context limit: 90-token prompt in a 100 context → exactly 10 tokens, LENGTH */
    assert_int_equal(di_core_add(c, 6, prompt, 90, &p, &err), DI_OK);
    assert_int_equal(di_core_add(c, 6, prompt, 90, &p, &err), DI_ERR_INVALID); /* duplicate id */
    assert_int_equal(di_core_cancel(c, 77, &err), DI_ERR_INVALID);
    di_core_delta d[4];
    int64_t n = 0;
    di_finish_reason fin = DI_FINISH_REASON_NONE;
    while (fin == DI_FINISH_REASON_NONE) {
        assert_int_equal(di_core_step(c, &err), DI_OK);
        int32_t k = di_core_poll(c, d, 4);
        for (int32_t i = 0; i < k; i++) n += d[i].n_tokens, fin = d[i].finish ? d[i].finish : fin;
    }
    assert_int_equal(fin, DI_FINISH_REASON_LENGTH);
    assert_int_equal(n, 10);
    di_core_free(c);
    di_mock_runner_free(mock);
    /* scheduler config checks */
    di_core_options bad = core_opts(0, 4, 8, 16);
    assert_int_equal(di_core_new(&runner, &bad, &c, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "prefill_chunk"));
}

/* ---- FIFO admission ---- */

static void test_fifo_admission(void **state) {
    (void)state;
    enum { N = 12 };
    job jobs[N];
    make_jobs(jobs, N, 120, 20);
    for (int i = 0; i < N; i++) jobs[i].add_at = 0;
    di_mock_options mo = mock_opts();
    di_core_options co = core_opts(1, 3, 48, 16);
    outcome got[N];
    run_info info;
    run_jobs(&mo, &co, jobs, N, got, &info, 1);
    uint64_t first_step[N];
    for (int i = 0; i < N; i++) first_step[i] = UINT64_MAX;
    for (int64_t l = 0; l < info.mock->n_log; l++) {
        int64_t id = info.mock->log[l].req_id;
        if (first_step[id] == UINT64_MAX) first_step[id] = info.mock->log[l].step;
    }
    for (int i = 1; i < N; i++) assert_true(first_step[i] >= first_step[i - 1]);
    di_mock_runner_free(info.mock);
    outcome_free(got, N);
    job_free(jobs, N);
}

/* Admission by pages (scheduler.h): a waiting request whose first chunk would fit but whose whole
 * prompt would not is held back instead of admitted into a pool it would then drain (preempting
 * itself chunk after chunk); it runs once the older request's blocks are back, without preemption. */
static void test_admission_by_pages(void **state) {
    (void)state;
    job jobs[2];
    make_jobs(jobs, 2, 1, 1);
    const int64_t n_prompt[2] = {100, 80}, max_tokens[2] = {40, 8}, add_at[2] = {0, 7};
    for (int i = 0; i < 2; i++) {
        free(jobs[i].prompt);
        jobs[i].n_prompt = n_prompt[i];
        jobs[i].prompt = malloc((size_t)n_prompt[i] * sizeof *jobs[i].prompt);
        for (int64_t t = 0; t < n_prompt[i]; t++) jobs[i].prompt[t] = (int32_t)(5 + (t * 7 + i) % 500);
        jobs[i].p.max_tokens = max_tokens[i];
        jobs[i].p.ignore_eos = 1;
        jobs[i].p.prefill_chunk = 16;
        jobs[i].add_at = add_at[i];
    }
    /* 10 blocks of 16: A (100 + 40 = 9 blocks) holds 7 once its prompt is in; B's prompt needs 5 */
    di_mock_options mo = mock_opts();
    mo.n_blocks = 10;
    di_core_options co = core_opts(0, 4, 48, 16);
    outcome got[2];
    run_info info;
    run_jobs(&mo, &co, jobs, 2, got, &info, 1);
    uint64_t a_last = 0, b_first = UINT64_MAX;
    for (int64_t l = 0; l < info.mock->n_log; l++) {
        const int64_t id = info.mock->log[l].req_id;
        if (id == 0 && info.mock->log[l].step > a_last) a_last = info.mock->log[l].step;
        if (id == 1 && info.mock->log[l].step < b_first) b_first = info.mock->log[l].step;
    }
    tu_report("admission by pages: A's last piece at step %llu, B's first at %llu, %lld preemptions",
              (unsigned long long)a_last, (unsigned long long)b_first, (long long)info.stats.preemptions);
    assert_int_equal(info.stats.preemptions, 0);
    assert_true(b_first > a_last);
    assert_int_equal(got[0].n, 40);
    assert_int_equal(got[1].n, 8);
    assert_int_equal(info.pool_free_end, 10);
    di_mock_runner_free(info.mock);
    outcome_free(got, 2);
    job_free(jobs, 2);
}

/* ---- async vs sync ---- */

static void test_async_matches_sync(void **state) {
    (void)state;
    enum { N = 40 };
    job jobs[N];
    make_jobs(jobs, N, 150, 100);
    for (int i = 0; i < N; i++) jobs[i].add_at = rnd_in(0, 20);
    di_mock_options mo = mock_opts();
    mo.step_sleep_s = 0.0005;
    outcome s[N], a[N];
    run_info is, ia;
    di_core_options cs = core_opts(0, 16, 256, 32), ca = core_opts(1, 16, 256, 32);
    ca.sample_threads = 2;
    double t0 = di_now(), t1, t2;
    run_jobs(&mo, &cs, jobs, N, s, &is, 0);
    t1 = di_now();
    run_jobs(&mo, &ca, jobs, N, a, &ia, 0);
    t2 = di_now();
    for (int i = 0; i < N; i++) assert_same_outcome(&a[i], &s[i], "async vs sync", i);
    tu_report("async vs sync: %lld vs %lld steps, %.1f vs %.1f ms wall, %lld tokens sampled after a finish (async lag)",
              (long long)ia.stats.steps, (long long)is.stats.steps, 1e3 * (t2 - t1), 1e3 * (t1 - t0),
              (long long)ia.stats.wasted_samples);
    assert_int_equal(is.stats.wasted_samples, 0);
    assert_int_equal(ia.stats.sampled, is.stats.sampled);
    /* every decode piece is flagged as fed back (a 1-token prompt's prefill is not) */
    assert_true(is.fed_back > 0 && is.fed_back <= is.decodes);
    assert_true(ia.fed_back > 0 && ia.fed_back <= ia.decodes);
    assert_int_equal(ia.fed_back - is.fed_back, ia.stats.wasted_samples);
    outcome_free(s, N);
    outcome_free(a, N);
    /* with host work per token (100 µs) and device time per step (2 ms) the overlap shows */
    static const double busy = 100e-6;
    mo.step_sleep_s = 0.002;
    cs.detok = ca.detok = detok_busy;
    cs.detok_ctx = ca.detok_ctx = (void *)&busy;
    ca.sample_threads = 0;
    t0 = di_now();
    run_jobs(&mo, &cs, jobs, N, s, &is, 0);
    t1 = di_now();
    run_jobs(&mo, &ca, jobs, N, a, &ia, 0);
    t2 = di_now();
    for (int i = 0; i < N; i++) assert_same_outcome(&a[i], &s[i], "async vs sync, busy host", i);
    tu_report("async vs sync with 100 us host work per token, 2 ms per step: %.1f vs %.1f ms wall (%.2fx)",
              1e3 * (t2 - t1), 1e3 * (t1 - t0), (t1 - t0) / (t2 - t1));
    outcome_free(s, N);
    outcome_free(a, N);
    job_free(jobs, N);
}

/* ---- grammar hook ---- */

typedef struct {
    int32_t modulus;
    int64_t accepted;
    int32_t last;
    int bad;
} mod_constraint;

static int mod_fill(void *ctx, uint32_t *mask, di_error *err) {
    mod_constraint *m = ctx;
    for (int32_t w = 0; w < 512 / 32; w++) {
        mask[w] = 0;
        for (int b = 0; b < 32; b++)
            if ((w * 32 + b) % m->modulus == (m->last + 1) % m->modulus) mask[w] |= 1u << b;
    }
    return DI_OK;
}
static int mod_accept(void *ctx, int32_t t, di_error *err) {
    mod_constraint *m = ctx;
    if (t % m->modulus != (m->last + 1) % m->modulus) m->bad++;
    m->last = t;
    m->accepted++;
    return DI_OK;
}

static void test_constraint_hook(void **state) {
    (void)state;
    enum { N = 4 };
    job jobs[N];
    make_jobs(jobs, N, 40, 30);
    mod_constraint mc[N];
    di_constraint con[N];
    for (int i = 0; i < N; i++) {
        mc[i] = (mod_constraint){.modulus = 5 + i, .last = -1};
        con[i] = (di_constraint){&mc[i], mod_fill, mod_accept, NULL};
        jobs[i].p.constraint = &con[i];
        jobs[i].p.ignore_eos = 1;
        jobs[i].p.max_tokens = 30;
        jobs[i].add_at = i;
    }
    di_mock_options mo = mock_opts();
    outcome first[N];
    /* sync; async; async with masks filled on a pool while the forward runs */
    for (int mode = 0; mode < 3; mode++) {
        di_core_options co = core_opts(mode > 0, 4, 64, 16);
        co.sample_threads = mode == 2 ? 3 : 0;
        for (int i = 0; i < N; i++) mc[i].accepted = 0, mc[i].last = -1, mc[i].bad = 0;
        outcome got[N];
        run_jobs(&mo, &co, jobs, N, got, NULL, 0);
        for (int i = 0; i < N; i++) {
            assert_int_equal(mc[i].bad, 0);
            assert_int_equal(got[i].n, 30);
            assert_int_equal(mc[i].accepted, 30); /* max_tokens is known ahead: no lagging token */
            for (int64_t t = 0; t < got[i].n; t++) assert_int_equal(got[i].tok[t] % mc[i].modulus, t % mc[i].modulus);
            if (mode) assert_same_outcome(&got[i], &first[i], "constrained, async vs sync", i);
        }
        if (mode) outcome_free(got, N);
        else memcpy(first, got, sizeof first);
    }
    outcome_free(first, N);
    job_free(jobs, N);
}

/* ---- errors: a failed forward fails its requests only; a row with no allowed token fails alone ---- */

static int none_after_5(void *ctx, uint32_t *mask, di_error *err) {
    int64_t *n = ctx;
    memset(mask, *n >= 5 ? 0x00 : 0xff, 512 / 8);
    return DI_OK;
}
static int count_accept(void *ctx, int32_t t, di_error *err) {
    (*(int64_t *)ctx)++;
    return DI_OK;
}

static void poll_all(di_core *c, di_finish_reason *fin, int64_t *ntok, char (*msg)[128], int n) {
    di_core_delta d[16];
    int32_t k = di_core_poll(c, d, 16);
    for (int32_t i = 0; i < k; i++) {
        if (d[i].id >= n) continue;
        ntok[d[i].id] += d[i].n_tokens;
        if (d[i].finish) {
            fin[d[i].id] = d[i].finish;
            if (d[i].error) snprintf(msg[d[i].id], 128, "%s", d[i].error);
        }
    }
}

static void test_errors_are_per_request(void **state) {
    (void)state;
    for (int async = 0; async < 2; async++) {
        di_mock_options mo = mock_opts();
        mo.fail_forward = 6;
        di_mock_runner *mock;
        di_model_runner runner;
        di_error err = {0};
        assert_int_equal(di_mock_runner_new(&mo, &mock, &runner, &err), DI_OK);
        di_core_options co = core_opts(async, 4, 64, 16);
        co.sample_threads = async ? 2 : 0; /* async: the mask error comes from the overlapped fill */
        di_core *c;
        assert_int_equal(di_core_new(&runner, &co, &c, &err), DI_OK);
        int32_t prompt[8] = {5, 6, 7, 8, 9, 10, 11, 12};
        di_seq_params p = {.sampling = di_sampling_params_default(), .max_tokens = 20, .ignore_eos = 1};
        p.sampling.seed = 1;
        assert_int_equal(di_core_add(c, 0, prompt, 8, &p, &err), DI_OK); /* in the failing forward */
        int64_t accepted = 0;
        di_constraint con = {&accepted, none_after_5, count_accept, NULL};
        di_seq_params pc = p;
        pc.constraint = &con;
        di_finish_reason fin[3] = {0};
        int64_t ntok[3] = {0};
        char msg[3][128] = {{0}};
        for (int s = 0; s < 10; s++) {
            if (s == 7) {
                assert_int_equal(di_core_add(c, 1, prompt, 8, &pc, &err), DI_OK); /* its 6th row has no token */
                assert_int_equal(di_core_add(c, 2, prompt, 4, &p, &err), DI_OK);  /* unaffected */
            }
            assert_int_equal(di_core_step(c, &err), DI_OK);
            poll_all(c, fin, ntok, msg, 3);
        }
        while (di_core_busy(c)) {
            assert_int_equal(di_core_step(c, &err), DI_OK);
            poll_all(c, fin, ntok, msg, 3);
        }
        poll_all(c, fin, ntok, msg, 3);
        assert_int_equal(fin[0], DI_FINISH_REASON_ERROR);
        assert_non_null(strstr(msg[0], "injected failure"));
        assert_int_equal(fin[1], DI_FINISH_REASON_ERROR);
        assert_non_null(strstr(msg[1], "no token is allowed"));
        assert_int_equal(ntok[1], 5);
        assert_int_equal(fin[2], DI_FINISH_REASON_LENGTH);
        assert_int_equal(ntok[2], 20);
        assert_int_equal(di_core_scheduler(c)->pool.n_free, di_core_scheduler(c)->pool.n_blocks);
        di_core_free(c);
        di_mock_runner_free(mock);
    }
}

/* ---- scale: an offline batch of 20,000 short requests (catches quadratic queue handling) ---- */

static void test_many_requests(void **state) {
    (void)state;
    enum { N = 20000 };
    di_mock_options mo = mock_opts();
    mo.n_vocab = 64;
    mo.n_blocks = 4096;
    di_mock_runner *mock;
    di_model_runner runner;
    di_error err = {0};
    assert_int_equal(di_mock_runner_new(&mo, &mock, &runner, &err), DI_OK);
    di_core_options co = core_opts(1, 256, 1024, 16);
    di_core *c;
    assert_int_equal(di_core_new(&runner, &co, &c, &err), DI_OK);
    di_seq_params p = {.sampling = di_sampling_params_default(), .max_tokens = 3};
    double t0 = di_now();
    for (int i = 0; i < N; i++) {
        int32_t prompt[4] = {i % 64, (i / 64) % 64, 7, 9};
        p.sampling.seed = (uint64_t)i;
        assert_int_equal(di_core_add(c, 1000000 + i, prompt, 1 + i % 4, &p, &err), DI_OK);
    }
    int64_t finished = 0, tokens = 0;
    di_core_delta d[512];
    while (finished < N) {
        assert_int_equal(di_core_step(c, &err), DI_OK);
        int32_t k;
        while ((k = di_core_poll(c, d, 512)) > 0) {
            for (int32_t j = 0; j < k; j++) {
                tokens += d[j].n_tokens;
                if (d[j].finish) {
                    assert_true(d[j].finish == DI_FINISH_REASON_LENGTH || d[j].finish == DI_FINISH_REASON_STOP);
                    finished++;
                }
            }
        }
    }
    double dt = di_now() - t0;
    tu_report("20,000 requests through the mock: %.2f s, %.0f requests/s, %lld tokens, %lld steps", dt, N / dt,
              (long long)tokens, (long long)di_core_get_stats(c)->steps);
    assert_true(tokens >= N && tokens <= 3 * N);
    di_core_free(c);
    di_mock_runner_free(mock);
}

/* ---- random operations: adds, cancels, steps and polls under tiny pools; invariants every step ---- */

static void check_invariants(const di_core *c, int32_t max_seqs) {
    const di_scheduler *s = di_core_scheduler(c);
    int64_t held = 0;
    for (int32_t i = 0; i < s->n_running; i++) {
        const di_seq *r = s->running[i];
        assert_int_equal(r->state, DI_REQ_RUNNING);
        assert_true(r->n_blocks >= di_sched_blocks_for(s, r->n_cached));
        assert_true(r->n_cached <= di_seq_len(r));
        assert_true(r->n_pending <= 1 && r->inflight <= 1);
        if (i) assert_true(s->running[i - 1]->arrival < r->arrival);
        held += r->n_blocks;
    }
    assert_true(s->n_running <= max_seqs);
    for (int32_t i = 0; i < s->n_waiting; i++) {
        const di_seq *r = s->waiting[(s->waiting_head + i) % s->cap_waiting];
        assert_int_equal(r->state, DI_REQ_WAITING);
        assert_int_equal(r->n_blocks, 0);
        assert_int_equal(r->n_cached, 0);
        assert_int_equal(r->n_pending, 0);
    }
    assert_int_equal(held + s->pool.n_free, s->pool.n_blocks);
}

static void test_random_operations(void **state) {
    (void)state;
    for (int iter = 0; iter < 24; iter++) {
        di_mock_options mo = mock_opts();
        mo.n_vocab = 64;
        mo.max_context = 160;
        mo.block_tokens = (int32_t)rnd_in(1, 16);
        mo.n_blocks = (int32_t)((160 + mo.block_tokens - 1) / mo.block_tokens + rnd_in(0, 40));
        di_mock_runner *mock;
        di_model_runner runner;
        di_error err = {0};
        assert_int_equal(di_mock_runner_new(&mo, &mock, &runner, &err), DI_OK);
        int32_t max_seqs = (int32_t)rnd_in(1, 12), chunk = (int32_t)rnd_in(1, 32);
        di_core_options co = core_opts(iter % 2, max_seqs, rnd_in(chunk > max_seqs ? chunk : max_seqs, 80), chunk);
        co.sample_threads = (int32_t)rnd_in(0, 2);
        di_core *c;
        assert_int_equal(di_core_new(&runner, &co, &c, &err), DI_OK);
        int64_t next_id = 0, finished = 0;
        di_core_delta d[16];
        for (int op = 0; op < 400 || di_core_busy(c); op++) {
            assert_true(op < 20000);
            uint64_t what = rnd() % 10;
            if (op < 400 && what < 3) {
                int32_t prompt[100];
                int64_t n = rnd_in(1, 100);
                for (int64_t t = 0; t < n; t++) prompt[t] = (int32_t)rnd_in(0, 63);
                di_seq_params p = {.sampling = di_sampling_params_default(), .max_tokens = rnd_in(1, 60)};
                p.sampling.seed = rnd();
                p.prefill_chunk = rnd() % 2 ? (int32_t)rnd_in(1, chunk) : 0;
                assert_int_equal(di_core_add(c, next_id++, prompt, n, &p, &err), DI_OK);
            } else if (op < 400 && what == 3 && next_id > 0) {
                di_core_cancel(c, rnd_in(0, next_id - 1), NULL); /* may be unknown or finished: refused */
            } else {
                assert_int_equal(di_core_step(c, &err), DI_OK);
            }
            check_invariants(c, max_seqs);
            int32_t k = di_core_poll(c, d, 16);
            for (int32_t j = 0; j < k; j++) {
                if (d[j].finish == DI_FINISH_REASON_ERROR) fail_msg("iter %d: %s", iter, d[j].error);
                finished += d[j].finish != DI_FINISH_REASON_NONE;
            }
        }
        while (finished < next_id) {
            int32_t k = di_core_poll(c, d, 16);
            if (!k) break;
            for (int32_t j = 0; j < k; j++) finished += d[j].finish != DI_FINISH_REASON_NONE;
        }
        assert_int_equal(finished, next_id);
        di_core_step(c, &err);
        check_invariants(c, max_seqs);
        assert_int_equal(di_core_scheduler(c)->pool.n_free, mo.n_blocks);
        di_core_free(c);
        di_mock_runner_free(mock);
    }
}

/* ---- id map: random puts and deletes against a plain array ---- */

static void test_idmap(void **state) {
    (void)state;
    enum { K = 3000 };
    static char present[K];
    static int vals[K];
    memset(present, 0, sizeof present);
    di_idmap m;
    di_idmap_init(&m);
    assert_null(di_idmap_get(&m, 5));
    di_idmap_del(&m, 5);
    int64_t n = 0;
    for (int step = 0; step < 200000; step++) {
        int64_t k = rnd_in(0, K - 1);
        int64_t key = k * 1024 - 77; /* clustered keys, some negative */
        if (rnd() % 3) {
            assert_int_equal(di_idmap_put(&m, key, &vals[k]), 0);
            n += !present[k];
            present[k] = 1;
        } else {
            di_idmap_del(&m, key);
            n -= present[k];
            present[k] = 0;
        }
        if (step % 20000 == 0 || step == 199999) {
            assert_int_equal(m.n, n);
            for (int64_t j = 0; j < K; j++) assert_ptr_equal(di_idmap_get(&m, j * 1024 - 77), present[j] ? &vals[j] : NULL);
        }
    }
    di_idmap_destroy(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_matches_plain_loop),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_chunk_boundaries),
        cmocka_unit_test(test_preemption_resume),
        cmocka_unit_test(test_cancellation),
        cmocka_unit_test(test_stop_conditions),
        cmocka_unit_test(test_text_ready),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_fifo_admission),
        cmocka_unit_test(test_admission_by_pages),
        cmocka_unit_test(test_async_matches_sync),
        cmocka_unit_test(test_constraint_hook),
        cmocka_unit_test(test_errors_are_per_request),
        cmocka_unit_test(test_idmap),
        cmocka_unit_test(test_many_requests),
        cmocka_unit_test(test_random_operations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
