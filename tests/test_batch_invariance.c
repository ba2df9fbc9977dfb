/* Batch invariance on the real model (issue 7 item 5), through the public C API only. Three target
 * requests — seeded at temperature 1 (RAW logprobs), greedy (RAW), and one with every sampler stage
 * on (penalties, logit bias, T 0.8, top-k, top-p, min-p; PROCESSED logprobs), each asking for the
 * top-20 logprobs of every step — are run alone, then inside batches of 1–32 other requests that
 * vary everything a target does not own: the neighbours' prompts, lengths, seeds, temperatures,
 * max_tokens, prefill chunks and choice counts, the arrival order and arrival step, cancellation of a
 * neighbour mid-flight, max_seqs, the step token budget, the engine's default prefill chunk, the
 * number of sampling threads, sync and async stepping, and cache budgets tight enough to preempt
 * (one test forces each target to be preempted a few tokens into its decode and recomputed).
 *
 * A target's tokens and the float bits of every logprob — the sampled one and all 20 alternatives —
 * must equal its alone run's exactly (memcmp). The API returns no logits rows; RAW logprobs are the
 * logits minus one log-sum-exp over the whole 129,280-entry row, so 21 of them per step pin the top
 * logits and the row's normaliser bit for bit: a one-ulp shift of every logit of a row fails the
 * test, a one-ulp shift of a single logit outside the top 20 can go unseen.
 *
 * What a target does own stays fixed: its prompt, sampling parameters, seed, its own prefill chunk
 * (8, so its prompts of 21, 17 and 13 ids are prefilled in pieces 8+8+5, 8+8+1, 8+5), and the
 * engine's model thread count and context size.
 *
 * The model is the `tiny` preset written by di_mkmodel_write (the real vocabulary, every V4.1 block
 * role, a 16-position window that the prompts overrun) with no tokenizer: prompts are ids.
 * ~18 s CPU here (~80 s under ASan, so not in the sanitizer subset). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepinfer.h"
#include "model/mkmodel.h"
#include "testutil.h"

enum {
    MAX_OUT = 6,         /* tokens per request at most */
    MAX_PROMPT = 24,
    MAX_NEIGHBOURS = 32,
    N_TARGETS = 3,
    MAX_JOBS = N_TARGETS + MAX_NEIGHBOURS,
    TARGET_CHUNK = 8,
    N_TOP = 20
};

/* What the test compares: one choice's sampled tokens and their logprob records. */
typedef struct trace {
    int64_t n;
    int32_t tok[MAX_OUT];
    di_token_logprobs lp[MAX_OUT];
    di_finish_reason finish;
} trace;

typedef struct job {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    di_request_options ro;
    int add_at;          /* engine step before which the request is added */
    int cancel_at;       /* step before which it is cancelled, -1 = never */
    int64_t id;
    trace out[2];        /* choices 0 and 1 */
} job;

/* One engine configuration and the shape of the crowd around the targets. */
typedef struct config {
    const char *name;
    int async;
    int32_t max_seqs;
    int64_t step_tokens;
    int32_t engine_chunk;
    int64_t cache_tokens;   /* 0 = no budget beyond max_seqs · max_context */
    int32_t sample_threads;
    int n_neighbours;
    int max_arrival;        /* arrival steps drawn from [0, max_arrival] */
    int expect_preemption;
} config;

static char *g_dir, g_model[1024];
static int32_t g_vocab;
static job g_targets[N_TARGETS];
static trace g_alone[N_TARGETS]; /* each target run by itself: the reference every other run must equal */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

static int rnd_in(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

static void fill_prompt(job *j, int n, int32_t V) {
    j->n_prompt = n;
    for (int i = 0; i < n; i++) j->prompt[i] = 3 + (int32_t)(rnd() % (uint64_t)(V - 3));
}

/* The targets: prompts and parameters identical in every run. */
static const di_token_bias k_bias[] = {{5, 3.0f}, {1000, -2.0f}, {70000, 4.5f}};

static void make_targets(job *t, int32_t V) {
    uint64_t saved = g_rng;
    g_rng = 0xD1B54A32D192ED03ull; /* the targets' prompts do not depend on how many neighbours came before */
    for (int k = 0; k < N_TARGETS; k++) {
        memset(&t[k], 0, sizeof t[k]);
        fill_prompt(&t[k], 21 - 4 * k, V); /* 21, 17, 13 positions: pieces 8+8+5, 8+8+1, 8+5 */
        di_request_options_default(&t[k].ro);
        di_sampling_params *sp = &t[k].ro.sampling;
        sp->seed = 0xC0FFEEull + (uint64_t)k;
        t[k].ro.has_seed = 1;
        sp->logprobs = 1;
        sp->n_top_logprobs = N_TOP;
        t[k].ro.max_tokens = MAX_OUT;
        t[k].ro.ignore_eos = 1;
        t[k].ro.prefill_chunk = TARGET_CHUNK;
        t[k].cancel_at = -1;
    }
    g_rng = saved;
    t[0].ro.sampling.temperature = 1.0f; /* seeded draw from the raw distribution */
    t[1].ro.sampling.temperature = 0.0f; /* greedy */
    /* every sampler stage on, logprobs of the processed distribution */
    di_sampling_params *sp = &t[2].ro.sampling;
    sp->temperature = 0.8f;
    sp->top_k = 40;
    sp->top_p = 0.9f;
    sp->min_p = 0.01f;
    sp->presence_penalty = 0.5f;
    sp->frequency_penalty = 0.25f;
    sp->repetition_penalty = 1.2f;
    sp->logit_bias = k_bias;
    sp->n_logit_bias = (int32_t)(sizeof k_bias / sizeof k_bias[0]);
    sp->logprobs_mode = DI_LOGPROBS_PROCESSED;
}

static void make_neighbour(job *j, const config *c, int32_t V) {
    memset(j, 0, sizeof *j);
    fill_prompt(j, rnd_in(1, MAX_PROMPT), V);
    di_request_options_default(&j->ro);
    j->ro.sampling.temperature = (float)rnd_in(0, 12) / 8.0f; /* greedy … 1.5 */
    j->ro.sampling.top_k = rnd_in(0, 1) ? rnd_in(1, 50) : 0;
    j->ro.sampling.seed = rnd();
    j->ro.has_seed = rnd_in(0, 3) != 0;
    j->ro.sampling.logprobs = rnd_in(0, 1);
    j->ro.sampling.n_top_logprobs = rnd_in(0, N_TOP);
    j->ro.max_tokens = rnd_in(1, 4);
    j->ro.n = rnd_in(0, 5) == 0 ? 2 : 1;
    j->ro.prefill_chunk = rnd_in(0, 2) ? 0 : rnd_in(1, c->step_tokens < 12 ? (int)c->step_tokens : 12);
    j->add_at = rnd_in(0, c->max_arrival);
    j->cancel_at = rnd_in(0, 9) == 0 ? j->add_at + rnd_in(0, 4) : -1;
}

static void record(job *j, const di_delta *d) {
    assert_true(d->choice >= 0 && d->choice < 2);
    trace *t = &j->out[d->choice];
    for (int64_t k = 0; k < d->n_tokens; k++) {
        assert_true(t->n < MAX_OUT);
        t->tok[t->n] = d->tokens[k];
        di_token_logprobs *lp = &t->lp[t->n];
        memset(lp, 0, sizeof *lp); /* unused top slots compare equal */
        if (d->logprobs) {
            lp->logprob = d->logprobs[k].logprob;
            lp->n_top = d->logprobs[k].n_top;
            assert_true(lp->n_top >= 0 && lp->n_top <= DI_MAX_TOP_LOGPROBS);
            memcpy(lp->top_ids, d->logprobs[k].top_ids, (size_t)lp->n_top * sizeof *lp->top_ids);
            memcpy(lp->top_logprobs, d->logprobs[k].top_logprobs, (size_t)lp->n_top * sizeof *lp->top_logprobs);
        }
        t->n++;
    }
    if (d->finish == DI_FINISH_REASON_ERROR) fail_msg("request %lld: %s", (long long)d->id, d->error);
    if (d->finish) t->finish = d->finish;
}

/* Runs jobs[0..n) on a fresh engine with config c (adds at their steps, in array order within a
 * step; cancels at theirs) until all are finished. */
static void run(const config *c, job *jobs, int n, di_engine_stats *st) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.n_threads = 1;
    o.max_context = 64;
    o.max_seqs = c->max_seqs;
    o.max_step_tokens = c->step_tokens;
    o.prefill_chunk = c->engine_chunk;
    o.cache_tokens = c->cache_tokens;
    o.async = c->async;
    o.sample_threads = c->sample_threads;
    o.seed = 99;
    di_engine *e = NULL;
    di_error err = {0};
    if (di_engine_open(g_model, &o, &e, &err)) fail_msg("%s: %s", c->name, err.msg);
    for (int i = 0; i < n; i++) memset(jobs[i].out, 0, sizeof jobs[i].out), jobs[i].id = 0;
    int added = 0;
    di_delta d[32];
    for (int step = 0; added < n || di_engine_busy(e); step++) {
        if (step > 5000) fail_msg("%s: engine did not finish", c->name);
        for (int i = 0; i < n; i++) {
            if (jobs[i].add_at == step) {
                if (di_engine_add_tokens(e, jobs[i].prompt, jobs[i].n_prompt, &jobs[i].ro, &jobs[i].id, &err))
                    fail_msg("%s: job %d: %s", c->name, i, err.msg);
                added++;
            }
            /* a request that already finished and was polled is unknown to the engine: INVALID */
            if (jobs[i].cancel_at == step && jobs[i].id && di_engine_cancel(e, jobs[i].id, &err) &&
                !jobs[i].out[0].finish)
                fail_msg("%s: cancel job %d: %s", c->name, i, err.msg);
        }
        if (di_engine_step(e, &err)) fail_msg("%s: step %d: %s", c->name, step, err.msg);
        for (int32_t k; (k = di_engine_poll(e, d, 32)) > 0;)
            for (int32_t q = 0; q < k; q++) {
                int i = 0;
                while (i < n && jobs[i].id != d[q].id) i++;
                assert_true(i < n);
                record(&jobs[i], &d[q]);
            }
    }
    di_engine_get_stats(e, st);
    di_engine_close(e);
}

static void assert_same_trace(const trace *got, const trace *want, const char *cfg, int target) {
    if (got->n != want->n || got->finish != want->finish)
        fail_msg("%s: target %d: %lld tokens (finish %s), alone %lld (%s)", cfg, target, (long long)got->n,
                 di_finish_reason_name(got->finish), (long long)want->n, di_finish_reason_name(want->finish));
    for (int64_t t = 0; t < got->n; t++) {
        if (got->tok[t] != want->tok[t])
            fail_msg("%s: target %d step %lld: token %d, alone %d", cfg, target, (long long)t, got->tok[t], want->tok[t]);
        const di_token_logprobs *a = &got->lp[t], *b = &want->lp[t];
        if (memcmp(&a->logprob, &b->logprob, sizeof a->logprob))
            fail_msg("%s: target %d step %lld: logprob %.9g, alone %.9g", cfg, target, (long long)t, a->logprob,
                     b->logprob);
        if (a->n_top != b->n_top)
            fail_msg("%s: target %d step %lld: %d alternatives, alone %d", cfg, target, (long long)t, a->n_top, b->n_top);
        for (int32_t r = 0; r < a->n_top; r++)
            if (a->top_ids[r] != b->top_ids[r] || memcmp(&a->top_logprobs[r], &b->top_logprobs[r], sizeof(float)))
                fail_msg("%s: target %d step %lld rank %d: id %d logprob %.9g, alone id %d logprob %.9g", cfg, target,
                         (long long)t, r, a->top_ids[r], a->top_logprobs[r], b->top_ids[r], b->top_logprobs[r]);
    }
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tmpdir("batch_invariance");
    snprintf(g_model, sizeof g_model, "%s/model", g_dir);
    /* tokenizer_in_place with none written: a checkpoint without tokenizer (token-id prompts only) */
    di_mkmodel_opts o = {.preset = "tiny", .seed = 7, .out_dir = g_model, .tokenizer_in_place = 1};
    di_mkmodel_stats st;
    di_error err = {0};
    if (di_mkmodel_write(&o, &st, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return -1;
    }
    di_engine *probe = NULL;
    if (di_engine_open(g_model, NULL, &probe, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return -1;
    }
    g_vocab = di_engine_vocab_size(probe);
    int has_tok = di_engine_has_tokenizer(probe);
    di_engine_close(probe);
    if (has_tok) return -1; /* the model must be the id-only one written above */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (g_dir) tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

/* The targets and their alone traces, computed on first use: each target by itself on a
 * synchronous engine that runs one sequence per step. */
static void need_alone(void) {
    static int done;
    if (done) return;
    make_targets(g_targets, g_vocab);
    const config solo = {.name = "alone", .async = 0, .max_seqs = 1, .step_tokens = TARGET_CHUNK,
                         .engine_chunk = TARGET_CHUNK, .sample_threads = 1};
    for (int k = 0; k < N_TARGETS; k++) {
        job j = g_targets[k];
        di_engine_stats st;
        run(&solo, &j, 1, &st);
        g_alone[k] = j.out[0];
        assert_int_equal(g_alone[k].n, MAX_OUT);
        assert_int_equal(g_alone[k].finish, DI_FINISH_REASON_LENGTH);
        for (int t = 0; t < MAX_OUT; t++) assert_int_equal(g_alone[k].lp[t].n_top, N_TOP);
    }
    /* the greedy target's tokens are its top-1 alternatives */
    for (int t = 0; t < MAX_OUT; t++) assert_int_equal(g_alone[1].tok[t], g_alone[1].lp[t].top_ids[0]);
    done = 1;
}

static void test_target_alone_equals_target_in_any_batch(void **state) {
    (void)state;
    need_alone();
    const int32_t V = g_vocab;
    const config configs[] = {
        {.name = "32 neighbours, one batch, sync", .max_seqs = 64, .step_tokens = 2048, .engine_chunk = 512,
         .sample_threads = 1, .n_neighbours = 32},
        {.name = "32 neighbours, staggered, 5 seqs x 24 tokens, async", .async = 1, .max_seqs = 5, .step_tokens = 24,
         .engine_chunk = 12, .sample_threads = 3, .n_neighbours = 32, .max_arrival = 12},
        {.name = "1 neighbour, sync", .max_seqs = 2, .step_tokens = 16, .engine_chunk = 8, .sample_threads = 1,
         .n_neighbours = 1, .max_arrival = 2},
        {.name = "7 neighbours, 3 seqs x 9 tokens, sync", .max_seqs = 3, .step_tokens = 9, .engine_chunk = 8,
         .sample_threads = 2, .n_neighbours = 7, .max_arrival = 6},
        {.name = "12 neighbours, 6 blocks of cache, async", .async = 1, .max_seqs = 16, .step_tokens = 64,
         .engine_chunk = 16, .cache_tokens = 6 * 16, .sample_threads = 2, .n_neighbours = 12, .max_arrival = 3,
         .expect_preemption = 1},
        {.name = "20 neighbours, 5 blocks of cache, sync", .max_seqs = 33, .step_tokens = 40, .engine_chunk = 8,
         .cache_tokens = 5 * 16, .sample_threads = 1, .n_neighbours = 20, .max_arrival = 4, .expect_preemption = 1},
        {.name = "random crowd, async", .async = 1}, /* the rest drawn below */
    };
    const int n_configs = (int)(sizeof configs / sizeof configs[0]);
    int64_t preemptions = 0, steps = 0, positions = 0;
    for (int ci = 0; ci < n_configs; ci++) {
        config c = configs[ci];
        if (c.max_seqs == 0) { /* anything from a lone neighbour to a full crowd */
            c.n_neighbours = rnd_in(1, MAX_NEIGHBOURS);
            c.max_seqs = rnd_in(2, 34);
            c.step_tokens = rnd_in(c.max_seqs > TARGET_CHUNK ? c.max_seqs : TARGET_CHUNK, 200);
            c.engine_chunk = rnd_in(1, (int)(c.step_tokens < 64 ? c.step_tokens : 64));
            c.sample_threads = rnd_in(1, 4);
            c.max_arrival = rnd_in(0, 10);
        }
        job jobs[MAX_JOBS];
        int n = c.n_neighbours + N_TARGETS;
        /* the targets sit at random places in the add order (a partial shuffle) and arrive at random steps */
        int order[MAX_JOBS], slot[N_TARGETS];
        for (int i = 0; i < n; i++) order[i] = i;
        for (int k = 0; k < N_TARGETS; k++) {
            int r = rnd_in(k, n - 1), tmp = order[k];
            order[k] = order[r], order[r] = tmp;
            slot[k] = order[k];
        }
        for (int i = 0; i < n; i++) {
            int k = 0;
            while (k < N_TARGETS && slot[k] != i) k++;
            if (k < N_TARGETS) {
                jobs[i] = g_targets[k];
                jobs[i].add_at = rnd_in(0, c.max_arrival);
            } else {
                make_neighbour(&jobs[i], &c, V);
            }
        }
        di_engine_stats st;
        run(&c, jobs, n, &st);
        char what[160];
        snprintf(what, sizeof what, "config %d (%s; targets at %d, %d, %d of %d)", ci, c.name, slot[0], slot[1],
                 slot[2], n);
        for (int k = 0; k < N_TARGETS; k++) assert_same_trace(&jobs[slot[k]].out[0], &g_alone[k], what, k);
        if (c.expect_preemption && st.preemptions == 0) fail_msg("%s: the cache budget forced no preemption", what);
        tu_report("batch invariance %s: %d requests, %lld steps, %lld preemptions: targets bit-identical", what, n,
                  (long long)st.steps, (long long)st.preemptions);
        preemptions += st.preemptions;
        steps += st.steps;
        positions += st.prompt_tokens + st.generated_tokens;
    }
    tu_report("batch invariance: %d configurations, %lld steps, %lld positions, %lld preemptions; %d targets x %d "
              "tokens x (1 + %d) logprobs bit-identical to alone",
              n_configs, (long long)steps, (long long)positions, (long long)preemptions, N_TARGETS, MAX_OUT, N_TOP);
}

/* Preemption by recompute, forced: an older request A (12-token prompt) and the three targets fill
 * a 6-block pool (16 positions a block) once the targets' prefills pass position 16; when A's and
 * target 2's decodes reach position 16 they need one more block each and the newest running request
 * — the target added last — is preempted three tokens into its decode, then re-prefills its prompt
 * and those tokens (in pieces that now straddle the prompt's end) once A is done. Each pass makes a
 * different target the newest. */
static void test_preempted_target(void **state) {
    (void)state;
    need_alone();
    for (int pass = 0; pass < N_TARGETS; pass++) {
        const config c = {.name = pass == 1 ? "forced preemption, async" : "forced preemption, sync",
                          .async = pass == 1, .max_seqs = 8, .step_tokens = 64, .engine_chunk = 16,
                          .cache_tokens = 6 * 16, .sample_threads = 2};
        job jobs[1 + N_TARGETS];
        memset(&jobs[0], 0, sizeof jobs[0]);
        fill_prompt(&jobs[0], 12, g_vocab);
        di_request_options_default(&jobs[0].ro);
        jobs[0].ro.sampling.temperature = 0.0f;
        jobs[0].ro.max_tokens = MAX_OUT;
        jobs[0].ro.ignore_eos = 1;
        jobs[0].cancel_at = -1;
        int which[N_TARGETS]; /* jobs[1 + i] is target which[i]; the last one added is target `pass` */
        for (int i = 0; i < N_TARGETS; i++) which[i] = (pass + 1 + i) % N_TARGETS;
        for (int i = 0; i < N_TARGETS; i++) jobs[1 + i] = g_targets[which[i]];
        di_engine_stats st;
        run(&c, jobs, 1 + N_TARGETS, &st);
        char what[96];
        snprintf(what, sizeof what, "%s (target %d newest)", c.name, pass);
        for (int i = 0; i < N_TARGETS; i++)
            assert_same_trace(&jobs[1 + i].out[0], &g_alone[which[i]], what, which[i]);
        tu_report("batch invariance %s: %lld steps, %lld preemptions: targets bit-identical", what, (long long)st.steps,
                  (long long)st.preemptions);
        assert_true(st.preemptions >= 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preempted_target),
        cmocka_unit_test(test_target_alone_equals_target_in_any_batch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
