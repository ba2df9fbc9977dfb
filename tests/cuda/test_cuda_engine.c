/* GPU engine test: the public engine (di_engine_*, the path of `deepinfer run --device cuda`) on the
 * CUDA backend — the cached session runner, paged caches in device memory, continuous batching, and
 * the sampler on the GPU (engine/executor.h: the logits rows stay on the device) — over the tiny golden
 * models (tests/data/v41-tiny-sel, v41-tiny-nosel; 512-token vocabulary, no tokenizer: id prompts).
 *
 * Per model, four target requests that stay fixed — seeded temperature 1 with RAW logprobs, greedy,
 * every sampler stage on (penalties, bias, T 0.8, top-k, top-p, min-p; PROCESSED logprobs), and a
 * two-choice seeded top-p request — each asking for the top-20 logprobs of every token (21 logprobs
 * per step pin the row's top logits and its normaliser bit for bit, as in tests/test_batch_invariance.c):
 *   alone cpu        each target alone on the CPU backend (host sampler): the CPU reference
 *   alone cuda       each target alone on the CUDA backend, device sampler: the GPU reference;
 *                    its tokens must equal the CPU's (seeded draws included); logprob bits are
 *                    reported (equal when the default kernels are bit-exact, which they are meant to be)
 *   alone cuda again the same run once more: bit-identical (determinism between runs)
 *   batch ...        the targets inside crowds of random neighbours (prompts, lengths, seeds,
 *                    temperatures, top-k, logprobs, choices, prefill chunks, arrival steps and order,
 *                    a cancellation), sync and async, max_seqs and step budgets from 2 to 64, cache
 *                    budgets tight enough to preempt: every target bit-identical to alone cuda
 *   host sampler     a crowd run twice, device sampler and DI_CUDA_SAMPLER=off (the CPU sampler on the
 *                    downloaded logits): EVERY request's tokens and logprob bits equal between the two
 *   grammar mask     the same comparison through the engine core with a constraint (a mask that
 *                    changes every step) on every request: the GPU sampler gets the masks
 *   grammars         on a model with a tokenizer: regex / JSON-schema / EBNF requests through the
 *                    public API, device sampler against DI_CUDA_SAMPLER=off, every request equal
 * The host-sampler rows also report the engine's forward + sampling time per step on both paths (the
 * host path's forward includes the download of the logits rows).
 * Device runs set DI_CUDA_SAMPLER=require, so an engine that would not sample on the device fails.
 *
 * One table row per check; last line "N passed, N failed"; exit status 1 if any check fails.
 * Usage: test_cuda_engine [kernels.safetensors (unused)]; models from $DI_ENGINE_MODELS (space-
 * separated, default the two tiny cases; scripts/gpu_tests.sh adds `deepinfer mkmodel --preset tiny`,
 * the real 129,280-token vocabulary with the V4.1 tokenizer). DI_ENGINE_DEVICE=cpu runs the "cuda" rows on the CPU
 * backend (a harness check on a machine without a GPU; the path checks are then vacuous). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "deepinfer.h"
#include "engine/api_runner.h"
#include "engine/engine_core.h"
#include "model/weights.h"

enum { MAX_OUT = 8, MAX_PROMPT = 24, MAX_NEIGHBOURS = 32, N_TARGETS = 4, MAX_JOBS = N_TARGETS + MAX_NEIGHBOURS,
       TARGET_CHUNK = 8, N_TOP = 20 };

typedef struct trace {
    int64_t n;
    int32_t tok[MAX_OUT];
    di_token_logprobs lp[MAX_OUT];
    di_finish_reason finish;
    char error[160];
} trace;

typedef struct job {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    di_request_options ro;
    int add_at, cancel_at; /* engine steps; cancel_at −1 = never */
    int64_t id;
    trace out[2];          /* choices 0 and 1 */
} job;

typedef struct config {
    const char *name;
    bool cpu;               /* the CPU backend (else CUDA) */
    bool host_sampler;      /* DI_CUDA_SAMPLER=off */
    int async;
    int32_t max_seqs;
    int64_t step_tokens;
    int32_t engine_chunk;
    int64_t cache_tokens;
    int32_t sample_threads;
    int n_neighbours, max_arrival;
    bool expect_preemption;
} config;

static int n_pass, n_fail;
static const char *g_model;
static int32_t g_vocab;
static bool g_gpu = true; /* DI_ENGINE_DEVICE != cpu */
static uint64_t g_rng;

static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static int rnd_in(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void row(const char *model, const char *check, const char *detail, bool ok) {
    printf("%-14s %-46s %-66s %s\n", model, check, detail, ok ? "PASS" : "FAIL");
    fflush(stdout);
    ok ? n_pass++ : n_fail++;
}

static void fill_prompt(job *j, int n) {
    j->n_prompt = n;
    for (int i = 0; i < n; i++) j->prompt[i] = 3 + (int32_t)(rnd() % (uint64_t)(g_vocab - 3));
}

static const di_token_bias k_bias[] = {{5, 3.0f}, {100, -2.0f}, {300, 4.5f}};

static void make_targets(job *t) {
    g_rng = 0xD1B54A32D192ED03ull;
    for (int k = 0; k < N_TARGETS; k++) {
        memset(&t[k], 0, sizeof t[k]);
        fill_prompt(&t[k], 21 - 4 * k); /* 21, 17, 13, 9 positions: pieces of 8 */
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
    t[0].ro.sampling.temperature = 1.0f;
    t[1].ro.sampling.temperature = 0.0f;
    di_sampling_params *sp = &t[2].ro.sampling;
    sp->temperature = 0.8f, sp->top_k = 40, sp->top_p = 0.9f, sp->min_p = 0.01f;
    sp->presence_penalty = 0.5f, sp->frequency_penalty = 0.25f, sp->repetition_penalty = 1.2f;
    sp->logit_bias = k_bias;
    sp->n_logit_bias = (int32_t)(sizeof k_bias / sizeof k_bias[0]);
    sp->logprobs_mode = DI_LOGPROBS_PROCESSED;
    t[3].ro.sampling.temperature = 0.7f, t[3].ro.sampling.top_p = 0.8f;
    t[3].ro.n = 2;
}

static void make_neighbour(job *j, const config *c) {
    memset(j, 0, sizeof *j);
    fill_prompt(j, rnd_in(1, MAX_PROMPT));
    di_request_options_default(&j->ro);
    j->ro.sampling.temperature = (float)rnd_in(0, 12) / 8.0f;
    j->ro.sampling.top_k = rnd_in(0, 1) ? rnd_in(1, 50) : 0;
    j->ro.sampling.top_p = rnd_in(0, 2) ? 0.0f : 0.5f + 0.1f * (float)rnd_in(0, 4);
    j->ro.sampling.seed = rnd();
    j->ro.has_seed = rnd_in(0, 3) != 0; /* else the engine's seed sequence (fixed: options.seed) */
    j->ro.sampling.logprobs = rnd_in(0, 1);
    j->ro.sampling.n_top_logprobs = rnd_in(0, N_TOP);
    j->ro.sampling.logprobs_mode = rnd_in(0, 1) ? DI_LOGPROBS_RAW : DI_LOGPROBS_PROCESSED;
    j->ro.max_tokens = rnd_in(1, 5);
    j->ro.ignore_eos = 1;
    j->ro.n = rnd_in(0, 5) == 0 ? 2 : 1;
    j->ro.prefill_chunk = rnd_in(0, 2) ? 0 : rnd_in(1, c->step_tokens < 12 ? (int)c->step_tokens : 12);
    j->add_at = rnd_in(0, c->max_arrival);
    j->cancel_at = rnd_in(0, 9) == 0 ? j->add_at + rnd_in(0, 4) : -1;
}

static void record(trace *t, const int32_t *tokens, const di_token_logprobs *lps, int64_t n, di_finish_reason finish,
                   const char *error) {
    for (int64_t k = 0; k < n && t->n < MAX_OUT; k++, t->n++) {
        t->tok[t->n] = tokens[k];
        di_token_logprobs *lp = &t->lp[t->n];
        memset(lp, 0, sizeof *lp); /* unused top slots compare equal */
        if (!lps) continue;
        lp->logprob = lps[k].logprob;
        lp->n_top = lps[k].n_top;
        memcpy(lp->top_ids, lps[k].top_ids, sizeof(int32_t) * (size_t)lp->n_top);
        memcpy(lp->top_logprobs, lps[k].top_logprobs, sizeof(float) * (size_t)lp->n_top);
    }
    if (finish) t->finish = finish;
    if (error) snprintf(t->error, sizeof t->error, "%s", error);
}

/* Runs jobs[0..n) on a fresh engine; returns 0, or −1 with msg set. */
static int run(const config *c, job *jobs, int n, di_engine_stats *st, char *msg, size_t cap) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.device = c->cpu || !g_gpu ? "cpu" : "cuda";
    o.n_threads = 4;
    o.max_context = 64;
    o.max_seqs = c->max_seqs;
    o.max_step_tokens = c->step_tokens;
    o.prefill_chunk = c->engine_chunk;
    o.cache_tokens = c->cache_tokens;
    o.async = c->async;
    o.sample_threads = c->sample_threads;
    o.seed = 99;
    setenv("DI_CUDA_SAMPLER", c->cpu || !g_gpu ? "auto" : c->host_sampler ? "off" : "require", 1);
    di_engine *e = NULL;
    di_error err = {0};
    if (di_engine_open(g_model, &o, &e, &err)) {
        snprintf(msg, cap, "open: %.200s", err.msg);
        return -1;
    }
    for (int i = 0; i < n; i++) memset(jobs[i].out, 0, sizeof jobs[i].out), jobs[i].id = 0;
    int added = 0, rc = 0;
    di_delta d[32];
    for (int step = 0; !rc && (added < n || di_engine_busy(e)); step++) {
        if (step > 5000) {
            snprintf(msg, cap, "engine did not finish");
            rc = -1;
        }
        for (int i = 0; !rc && i < n; i++) {
            if (jobs[i].add_at == step) {
                if (di_engine_add_tokens(e, jobs[i].prompt, jobs[i].n_prompt, &jobs[i].ro, &jobs[i].id, &err)) {
                    snprintf(msg, cap, "add job %d: %.200s", i, err.msg);
                    rc = -1;
                }
                added++;
            }
            if (jobs[i].cancel_at == step && jobs[i].id) di_engine_cancel(e, jobs[i].id, &err); /* may be done */
        }
        if (!rc && di_engine_step(e, &err)) {
            snprintf(msg, cap, "step %d: %.200s", step, err.msg);
            rc = -1;
        }
        for (int32_t k; !rc && (k = di_engine_poll(e, d, 32)) > 0;)
            for (int32_t q = 0; q < k; q++) {
                int i = 0;
                while (i < n && jobs[i].id != d[q].id) i++;
                if (i == n || d[q].choice < 0 || d[q].choice > 1) continue;
                record(&jobs[i].out[d[q].choice], d[q].tokens, d[q].logprobs, d[q].n_tokens, d[q].finish, d[q].error);
            }
    }
    di_engine_get_stats(e, st);
    di_engine_close(e);
    return rc;
}

/* First difference between two traces ("" when identical); tokens_only ignores the logprobs. */
static bool trace_diff(const trace *a, const trace *b, bool tokens_only, char *msg, size_t cap) {
    msg[0] = 0;
    if (a->error[0] || b->error[0]) return snprintf(msg, cap, "error: %.90s%.90s", a->error, b->error), true;
    if (a->n != b->n || a->finish != b->finish)
        return snprintf(msg, cap, "%lld tokens (finish %d) vs %lld (%d)", (long long)a->n, a->finish, (long long)b->n,
                        b->finish), true;
    for (int64_t t = 0; t < a->n; t++) {
        if (a->tok[t] != b->tok[t]) return snprintf(msg, cap, "token %lld: %d vs %d", (long long)t, a->tok[t], b->tok[t]), true;
        if (tokens_only) continue;
        if (memcmp(&a->lp[t], &b->lp[t], sizeof a->lp[t]))
            return snprintf(msg, cap, "token %lld: logprob %.9g vs %.9g (or its top list)", (long long)t,
                            a->lp[t].logprob, b->lp[t].logprob), true;
    }
    return false;
}

static job g_targets[N_TARGETS];
static trace g_ref_cpu[N_TARGETS][2], g_ref_gpu[N_TARGETS][2];

/* Each target alone (sync, one sequence per step) into ref. */
static int run_alone(bool cpu, trace ref[N_TARGETS][2], char *msg, size_t cap) {
    const config solo = {.cpu = cpu, .max_seqs = 2, .step_tokens = TARGET_CHUNK, .engine_chunk = TARGET_CHUNK,
                         .sample_threads = 1};
    for (int k = 0; k < N_TARGETS; k++) {
        job j = g_targets[k];
        di_engine_stats st;
        if (run(&solo, &j, 1, &st, msg, cap)) return -1;
        memcpy(ref[k], j.out, sizeof j.out);
        for (int c = 0; c < j.ro.n; c++)
            if (j.out[c].n != MAX_OUT || j.out[c].error[0])
                return snprintf(msg, cap, "target %d choice %d: %lld tokens %s", k, c, (long long)j.out[c].n,
                                j.out[c].error), -1;
    }
    return 0;
}

static bool compare_targets(trace ref[N_TARGETS][2], trace got[N_TARGETS][2], bool tokens_only, int *n_lp_equal,
                            char *msg, size_t cap) {
    char d[200];
    int eq = 0;
    bool bad = false;
    for (int k = 0; k < N_TARGETS && !bad; k++)
        for (int c = 0; c < g_targets[k].ro.n && !bad; c++) {
            bad = trace_diff(&got[k][c], &ref[k][c], tokens_only, d, sizeof d);
            if (bad) snprintf(msg, cap, "target %d choice %d: %s", k, c, d);
            for (int64_t t = 0; t < ref[k][c].n; t++) eq += !memcmp(&got[k][c].lp[t], &ref[k][c].lp[t], sizeof(di_token_logprobs));
        }
    if (n_lp_equal) *n_lp_equal = eq;
    return !bad;
}

/* The targets at random places of a crowd; run with config c. */
static int build_crowd(const config *c, job *jobs, int slot[N_TARGETS]) {
    int n = c->n_neighbours + N_TARGETS, order[MAX_JOBS];
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
            jobs[i].add_at = rnd_in(0, c->max_arrival);
        } else {
            make_neighbour(&jobs[i], c);
        }
    }
    return n;
}

static void batch_checks(const char *mname) {
    const config configs[] = {
        {.name = "32 neighbours, one batch, sync", .max_seqs = 64, .step_tokens = 2048, .engine_chunk = 512,
         .sample_threads = 1, .n_neighbours = 32},
        {.name = "32 neighbours, staggered, 5 seqs x 24, async", .async = 1, .max_seqs = 5, .step_tokens = 24,
         .engine_chunk = 12, .sample_threads = 3, .n_neighbours = 32, .max_arrival = 12},
        {.name = "7 neighbours, 3 seqs x 9, sync", .max_seqs = 3, .step_tokens = 9, .engine_chunk = 8,
         .sample_threads = 2, .n_neighbours = 7, .max_arrival = 6},
        {.name = "12 neighbours, 6 blocks, async, preempts", .async = 1, .max_seqs = 16, .step_tokens = 64,
         .engine_chunk = 16, .cache_tokens = 6 * 16, .sample_threads = 2, .n_neighbours = 12, .max_arrival = 3,
         .expect_preemption = true},
        {.name = "20 neighbours, 5 blocks, sync, preempts", .max_seqs = 33, .step_tokens = 40, .engine_chunk = 8,
         .cache_tokens = 5 * 16, .sample_threads = 1, .n_neighbours = 20, .max_arrival = 4, .expect_preemption = true},
        {.name = "random crowd, async", .async = 1},
    };
    g_rng = 0x9E3779B97F4A7C15ull;
    for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
        config c = configs[ci];
        if (c.max_seqs == 0) {
            c.n_neighbours = rnd_in(1, MAX_NEIGHBOURS);
            c.max_seqs = rnd_in(2, 34);
            c.step_tokens = rnd_in(c.max_seqs > TARGET_CHUNK ? c.max_seqs : TARGET_CHUNK, 200);
            c.engine_chunk = rnd_in(1, (int)(c.step_tokens < 64 ? c.step_tokens : 64));
            c.sample_threads = rnd_in(1, 4);
            c.max_arrival = rnd_in(0, 10);
        }
        job jobs[MAX_JOBS];
        int slot[N_TARGETS], n = build_crowd(&c, jobs, slot);
        di_engine_stats st;
        char msg[256] = "", name[96];
        snprintf(name, sizeof name, "batch: %s", c.name);
        double t0 = now_s();
        if (run(&c, jobs, n, &st, msg, sizeof msg)) {
            row(mname, name, msg, false);
            continue;
        }
        trace got[N_TARGETS][2];
        for (int k = 0; k < N_TARGETS; k++) memcpy(got[k], jobs[slot[k]].out, sizeof got[k]);
        bool ok = compare_targets(g_ref_gpu, got, false, NULL, msg, sizeof msg);
        if (ok && c.expect_preemption && st.preemptions == 0) ok = false, snprintf(msg, sizeof msg, "no preemption");
        if (ok)
            snprintf(msg, sizeof msg, "%d reqs, %lld steps, %lld preempt: bit-identical (%.2f s)", n,
                     (long long)st.steps, (long long)st.preemptions, now_s() - t0);
        row(mname, name, msg, ok);
    }
}

/* jobs[0..n) through the device sampler and through the host sampler (DI_CUDA_SAMPLER=off): every
 * request's trace equal. */
static void device_vs_host(const char *mname, const char *check, config c, const job *jobs, int n) {
    static job a[MAX_JOBS], b[MAX_JOBS];
    memcpy(a, jobs, sizeof *a * (size_t)n);
    memcpy(b, jobs, sizeof *b * (size_t)n);
    di_engine_stats sa = {0}, sb = {0};
    char msg[256] = "", d[200];
    c.host_sampler = false;
    bool ok = !run(&c, a, n, &sa, msg, sizeof msg);
    c.host_sampler = true;
    if (ok) ok = !run(&c, b, n, &sb, msg, sizeof msg);
    int64_t toks = 0;
    for (int i = 0; ok && i < n; i++)
        for (int ch = 0; ch < a[i].ro.n && ok; ch++) {
            if (trace_diff(&a[i].out[ch], &b[i].out[ch], false, d, sizeof d))
                ok = false, snprintf(msg, sizeof msg, "request %d choice %d: %s", i, ch, d);
            toks += a[i].out[ch].n;
        }
    if (ok)
        snprintf(msg, sizeof msg, "%d reqs, %lld tokens equal; fwd+sample ms/step dev %.2f+%.2f host %.2f+%.2f", n,
                 (long long)toks, 1e3 * sa.forward_s / (double)(sa.steps ? sa.steps : 1),
                 1e3 * sa.sample_s / (double)(sa.steps ? sa.steps : 1), 1e3 * sb.forward_s / (double)(sb.steps ? sb.steps : 1),
                 1e3 * sb.sample_s / (double)(sb.steps ? sb.steps : 1));
    row(mname, check, msg, ok);
}

static void host_sampler_check(const char *mname) {
    config c = {.name = "host", .async = 1, .max_seqs = 9, .step_tokens = 48, .engine_chunk = 8, .sample_threads = 3,
                .n_neighbours = 24, .max_arrival = 8};
    g_rng = 0x2545F4914F6CDD1Dull;
    job jobs[MAX_JOBS];
    int slot[N_TARGETS], n = build_crowd(&c, jobs, slot);
    device_vs_host(mname, "device sampler == host sampler (crowd)", c, jobs, n);
}

/* Real grammars through the public API (the model must have a tokenizer): the masks come from the
 * grammar matchers on the executor's side, the tokens from the GPU sampler. */
static void real_grammar_check(const char *mname) {
    static const char *const k_regex = "[a-z]{1,6}( [a-z]{1,6}){0,4}";
    static const char *const k_schema = "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}, "
                                        "\"s\": {\"type\": \"string\"}}, \"required\": [\"n\"]}";
    static const char *const k_ebnf = "root ::= (\"yes\" | \"no\") \" \" [0-9]+";
    config c = {.name = "grammar", .async = 1, .max_seqs = 8, .step_tokens = 64, .engine_chunk = 8, .sample_threads = 3,
                .max_arrival = 4};
    g_rng = 0x6A09E667F3BCC909ull;
    enum { N = 12 };
    job jobs[N];
    for (int i = 0; i < N; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        fill_prompt(j, rnd_in(2, 16));
        di_request_options_default(&j->ro);
        j->ro.grammar_kind = i % 3 == 0 ? DI_GRAMMAR_REGEX : i % 3 == 1 ? DI_GRAMMAR_JSON_SCHEMA : DI_GRAMMAR_EBNF;
        j->ro.grammar = i % 3 == 0 ? k_regex : i % 3 == 1 ? k_schema : k_ebnf;
        j->ro.sampling.temperature = i % 4 == 0 ? 0.0f : 0.6f + 0.2f * (float)(i % 3);
        j->ro.sampling.top_k = i % 5 == 1 ? 30 : 0;
        j->ro.sampling.top_p = i % 5 == 2 ? 0.9f : 0.0f;
        j->ro.sampling.seed = 77 + (uint64_t)i;
        j->ro.has_seed = 1;
        j->ro.sampling.logprobs = i % 2;
        j->ro.sampling.n_top_logprobs = i % 2 ? 4 : 0;
        j->ro.sampling.logprobs_mode = i % 4 == 3 ? DI_LOGPROBS_PROCESSED : DI_LOGPROBS_RAW;
        j->ro.max_tokens = MAX_OUT;
        j->ro.n = i % 4 == 2 ? 2 : 1;
        j->add_at = rnd_in(0, c.max_arrival);
        j->cancel_at = -1;
    }
    device_vs_host(mname, "grammars (regex/schema/EBNF): device == host", c, jobs, N);
}

/* ---- grammar masks through the engine core ---- */

/* A constraint whose mask changes every step: token t allowed iff (t · 7 + 3 · accepted) % 5 != 0,
 * and the last accepted token's successor forbidden; accept checks the token was allowed. */
typedef struct toy_grammar {
    di_constraint hook;
    int32_t vocab, accepted, last;
    int violations;
} toy_grammar;

static bool toy_allowed(const toy_grammar *g, int32_t t) {
    return (t * 7 + 3 * g->accepted) % 5 != 0 && t != g->last + 1;
}
static int toy_fill(void *ctx, uint32_t *mask, di_error *err) {
    (void)err;
    toy_grammar *g = ctx;
    memset(mask, 0, sizeof(uint32_t) * (size_t)((g->vocab + 31) / 32));
    for (int32_t t = 0; t < g->vocab; t++)
        if (toy_allowed(g, t)) mask[t / 32] |= 1u << (t % 32);
    return DI_OK;
}
static int toy_accept(void *ctx, int32_t token, di_error *err) {
    (void)err;
    toy_grammar *g = ctx;
    g->violations += !toy_allowed(g, token);
    g->accepted++;
    g->last = token;
    return DI_OK;
}

enum { N_GRAMMAR = 12 };

/* Runs N_GRAMMAR constrained requests through a core on a runner of the given backend (device
 * sampling unless host_sampler). out: traces; returns violations, or −1 with msg. */
static int run_grammar(bool host_sampler, trace *out, char *msg, size_t cap) {
    di_error err = {0};
    di_model *m = NULL;
    di_backend *be = NULL;
    di_session_runner *sr = NULL;
    di_model_runner iface;
    di_core *core = NULL;
    int rc = di_model_open(g_model, &m, &err);
    if (!rc) rc = di_backend_create(g_gpu ? "cuda" : "cpu", 4, &be, &err);
    if (!rc) rc = di_model_to_backend(m, be, &err);
    if (!rc) rc = di_session_runner_new(m, be, 64, 16, 64, &sr, &iface, &err);
    if (!rc) rc = di_session_runner_use_pool(sr, &iface, 9, &err);
    setenv("DI_CUDA_SAMPLER", !g_gpu ? "auto" : host_sampler ? "off" : "require", 1);
    di_core_options co = {.sched = {.max_seqs = 8, .max_step_tokens = 40, .prefill_chunk = 8}, .async = 1,
                          .sample_threads = 3};
    if (!rc) rc = di_core_new(&iface, &co, &core, &err);
    toy_grammar g[N_GRAMMAR];
    int32_t prompt[16];
    g_rng = 0x5851F42D4C957F2Dull;
    for (int i = 0; !rc && i < N_GRAMMAR; i++) {
        g[i] = (toy_grammar){.hook = {.ctx = &g[i], .fill_mask = toy_fill, .accept = toy_accept}, .vocab = g_vocab,
                             .last = -2};
        int np = rnd_in(3, 16);
        for (int t = 0; t < np; t++) prompt[t] = rnd_in(3, g_vocab - 1);
        di_seq_params sp = {.sampling = di_sampling_params_default(), .max_tokens = MAX_OUT, .ignore_eos = 1,
                            .constraint = &g[i].hook};
        sp.sampling.temperature = i % 3 == 0 ? 0.0f : 0.9f;
        sp.sampling.top_k = i % 4 == 1 ? 20 : 0;
        sp.sampling.seed = 1000 + (uint64_t)i;
        sp.sampling.logprobs = i % 2;
        sp.sampling.n_top_logprobs = i % 2 ? 5 : 0;
        sp.sampling.logprobs_mode = i % 4 == 3 ? DI_LOGPROBS_PROCESSED : DI_LOGPROBS_RAW;
        memset(&out[i], 0, sizeof out[i]);
        rc = di_core_add(core, i, prompt, np, &sp, &err);
    }
    di_core_delta d[32];
    for (int step = 0; !rc && di_core_busy(core) && step < 2000; step++) {
        rc = di_core_step(core, &err);
        for (int32_t k; !rc && (k = di_core_poll(core, d, 32)) > 0;)
            for (int32_t q = 0; q < k; q++)
                if (d[q].id >= 0 && d[q].id < N_GRAMMAR)
                    record(&out[d[q].id], d[q].tokens, d[q].logprobs, d[q].n_tokens, d[q].finish, d[q].error);
    }
    if (rc) snprintf(msg, cap, "%.200s", err.msg);
    int violations = 0;
    for (int i = 0; i < N_GRAMMAR; i++) violations += g[i].violations;
    di_core_free(core);
    di_session_runner_free(sr);
    if (m) di_model_close(m);
    if (be) di_backend_destroy(be);
    return rc ? -1 : violations;
}

static void grammar_check(const char *mname) {
    trace a[N_GRAMMAR], b[N_GRAMMAR];
    char msg[256] = "", d[200];
    int va = run_grammar(false, a, msg, sizeof msg);
    int vb = va < 0 ? -1 : run_grammar(true, b, msg, sizeof msg);
    bool ok = va == 0 && vb == 0;
    if (va > 0 || vb > 0) snprintf(msg, sizeof msg, "%d / %d tokens outside the mask", va, vb);
    int64_t toks = 0;
    for (int i = 0; ok && i < N_GRAMMAR; i++) {
        if (a[i].n != MAX_OUT) ok = false, snprintf(msg, sizeof msg, "request %d: %lld tokens %s", i, (long long)a[i].n, a[i].error);
        else if (trace_diff(&a[i], &b[i], false, d, sizeof d)) ok = false, snprintf(msg, sizeof msg, "request %d: %s", i, d);
        toks += a[i].n;
    }
    if (ok) snprintf(msg, sizeof msg, "%d reqs, %lld masked tokens: equal, all allowed", N_GRAMMAR, (long long)toks);
    row(mname, "grammar masks: device == host sampler", msg, ok);
}

static void model_checks(const char *dir) {
    const char *mname = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    g_model = dir;
    di_engine *probe = NULL;
    di_error err = {0};
    if (di_engine_open(dir, NULL, &probe, &err)) {
        row(mname, "open", err.msg, false);
        return;
    }
    g_vocab = di_engine_vocab_size(probe);
    const bool has_tok = di_engine_has_tokenizer(probe);
    di_engine_close(probe);
    make_targets(g_targets);
    char msg[256] = "";
    bool cpu_ok = !run_alone(true, g_ref_cpu, msg, sizeof msg);
    row(mname, "alone cpu (reference)", cpu_ok ? "4 targets, 5 choices x 8 tokens" : msg, cpu_ok);
    bool gpu_ok = !run_alone(false, g_ref_gpu, msg, sizeof msg);
    if (!gpu_ok) {
        row(mname, "alone cuda", msg, false);
        return;
    }
    int eq = 0;
    bool ok = cpu_ok && compare_targets(g_ref_cpu, g_ref_gpu, true, &eq, msg, sizeof msg);
    if (ok) snprintf(msg, sizeof msg, "tokens equal to cpu; logprob records bit-equal %d/%d", eq, 5 * MAX_OUT);
    row(mname, "alone cuda: tokens == cpu (seeded)", msg, ok);
    trace again[N_TARGETS][2];
    ok = !run_alone(false, again, msg, sizeof msg) && compare_targets(g_ref_gpu, again, false, NULL, msg, sizeof msg);
    row(mname, "alone cuda twice: bit-identical", ok ? "tokens + logprob bits" : msg, ok);
    batch_checks(mname);
    host_sampler_check(mname);
    grammar_check(mname);
    if (has_tok) real_grammar_check(mname);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    const char *dev = getenv("DI_ENGINE_DEVICE");
    g_gpu = !(dev && !strcmp(dev, "cpu"));
    if (g_gpu && !di_backend_cuda_available()) {
        printf("this binary has no CUDA backend\n0 passed, 1 failed\n");
        return 1;
    }
    const char *env = getenv("DI_ENGINE_MODELS");
    char models[2048];
    snprintf(models, sizeof models, "%s", env ? env : "tests/data/v41-tiny-sel tests/data/v41-tiny-nosel");
    printf("%-14s %-46s %-66s %s\n", "model", "check", "detail", "result");
    for (char *save = NULL, *m = strtok_r(models, " ", &save); m; m = strtok_r(NULL, " ", &save)) model_checks(m);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
