/* The prefix cache as the scheduler sees it (engine/scheduler.h), through the engine core over the
 * cached session runner on the mkmodel tiny preset (window 16, keep 24, 64-token blocks); request k's
 * prompt is 200 shared ids and a tail of its own (lengths 220 and 224):
 *  - budget at the reduced size: with a warm cache, the step that admits the second request
 *    schedules prompt − r positions (r = the replay start below its 192-token hit: prompt − P + the
 *    replay), not the prompt — and with a step budget (and chunk) of 64 < prompt it is admitted and
 *    prefilled in that one step; its tokens are the same with budget 64 and 512 and equal those of
 *    a session restored from the first prompt's blocks (the runner-side behaviour before the
 *    scheduler knew of hits, bit for bit);
 *  - requests running side by side share blocks: the second request, added once the first has
 *    sampled a token and still decodes, hits the three blocks the first one's prefill stored (sync
 *    and async alike), with the same tokens as when it runs after the first has finished;
 *  - without a cache the same admission schedules the whole prompt (the control);
 *  - preemption: the newer of two requests that outgrow a small pool is preempted, publishes its
 *    prompt blocks on the way out and, readmitted, restores them; the older one's tokens are those
 *    of the run without a cache.
 * di-test: asan */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/api_runner.h"
#include "engine/engine_core.h"
#include "engine/prefix_cache.h"
#include "model/weights.h"
#include "testutil.h"

#define SHARED 200
#define BLOCK 64

static char *g_dir, g_model[1024];
static di_model *g_m; /* opened once for every test */
static di_backend *g_be;

static int setup(void **state) {
    (void)state;
    g_dir = tu_tmpdir("prefix_sched");
    snprintf(g_model, sizeof g_model, "%s/model", g_dir);
    if (tu_write_tiny_model(g_model, 3, NULL)) return -1;
    di_error err = {0};
    if (di_model_open(g_model, &g_m, &err) || di_backend_cpu_create(1, &g_be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (g_be) di_backend_destroy(g_be);
    if (g_m) di_model_close(g_m);
    if (g_dir) tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

/* Request k: SHARED common ids, then a tail of its own (lengths 20 and 24). */
static int64_t make_prompt(int k, int32_t *p) {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int64_t n = 0;
    for (; n < SHARED; n++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p[n] = 100 + (int32_t)((s >> 33) % 5000);
    }
    for (int i = 0; i < 20 + 4 * k; i++, n++) p[n] = 6000 + 37 * k + 11 * i;
    return n;
}

#define N_OUT 4   /* tokens per request */
#define MAX_OUT 16 /* the preemption test's longer outputs */

typedef struct core_rig {
    di_session_runner *sr;
    di_model_runner it;
    di_core *c;
} core_rig;

static void rig_open(core_rig *g, int64_t step_tokens, int async, bool prefix, int32_t n_blocks) {
    memset(g, 0, sizeof *g);
    di_error err = {0};
    if (di_session_runner_new(g_m, g_be, 512, 16, n_blocks, &g->sr, &g->it, &err) ||
        (prefix && di_session_runner_enable_prefix(g->sr, &g->it, BLOCK, 64ll << 20, &err)))
        fail_msg("%s", err.msg);
    di_core_options co = {.sched = {.max_seqs = 4, .max_step_tokens = step_tokens, .prefill_chunk = (int32_t)step_tokens},
                          .async = async, .sample_threads = 1};
    if (di_core_new(&g->it, &co, &g->c, &err)) fail_msg("%s", err.msg);
}

static void rig_close(core_rig *g) {
    di_core_free(g->c);
    di_session_runner_free(g->sr);
}

static void rig_add(core_rig *g, int k, int64_t max_tokens) {
    int32_t p[SHARED + 32];
    int64_t n = make_prompt(k, p);
    di_seq_params sp = {.sampling = di_sampling_params_default(), .max_tokens = max_tokens, .ignore_eos = 1};
    sp.sampling.temperature = 0;
    di_error err = {0};
    if (di_core_add(g->c, k, p, n, &sp, &err)) fail_msg("%s", err.msg);
}

/* One step, then the deltas: tokens into toks[id], hits into hit[id], finished[id] set. */
static void rig_step(core_rig *g, int32_t toks[2][MAX_OUT], int64_t n_tok[2], int64_t hit[2], int finished[2]) {
    di_error err = {0};
    if (di_core_step(g->c, &err)) fail_msg("%s", err.msg);
    di_core_delta d[4];
    for (int32_t k; (k = di_core_poll(g->c, d, 4)) > 0;)
        for (int32_t j = 0; j < k; j++) {
            int64_t id = d[j].id;
            if (d[j].finish == DI_FINISH_REASON_ERROR) fail_msg("request %lld: %s", (long long)id, d[j].error);
            for (int64_t t = 0; t < d[j].n_tokens; t++) toks[id][n_tok[id]++] = d[j].tokens[t];
            hit[id] = d[j].cache_hit_tokens;
            if (d[j].finish != DI_FINISH_REASON_NONE) finished[id] = 1;
        }
}

/* Greedy tokens of request k on a session restored at P from the blocks of request 0's one-shot
 * prefill (what the runner did before the scheduler knew of hits): the reference. */
static void reference_tokens(int k, int64_t P, int32_t out[N_OUT]) {
    di_model *m = g_m;
    di_backend *be = g_be;
    di_error err = {0};
    di_session_opts so = {.max_tokens = 512, .spec_margin = -1};
    di_session *a, *b;
    assert_int_equal(di_session_create(m, be, &so, &a, &err), DI_OK);
    assert_int_equal(di_session_create(m, be, &so, &b, &err), DI_OK);
    int32_t p0[SHARED + 32], pk[SHARED + 32 + N_OUT];
    int64_t n0 = make_prompt(0, p0), nk = make_prompt(k, pk), V = m->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V); /* f32 [V] */
    assert_non_null(logits);
    assert_int_equal(di_session_forward(a, p0, n0, false, NULL, NULL, &err), DI_OK);
    int64_t bytes = di_cache_prefix_span_bytes(a->cache, 0, P);
    uint8_t *span = malloc((size_t)bytes);
    assert_non_null(span);
    assert_int_equal(di_cache_prefix_export(a->cache, 0, P, span, bytes, &err), DI_OK);
    const uint8_t *sp = span;
    assert_int_equal(di_session_prefix_restore(b, pk, -1, &sp, &P, 1, NULL, NULL, &err), DI_OK);
    assert_int_equal(di_session_forward(b, pk + P, nk - P, false, logits, NULL, &err), DI_OK);
    for (int t = 0; t < N_OUT; t++) {
        int32_t am = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[am]) am = (int32_t)v;
        out[t] = am;
        if (t + 1 < N_OUT) assert_int_equal(di_session_forward(b, &out[t], 1, false, logits, NULL, &err), DI_OK);
    }
    free(span);
    free(logits);
    di_session_destroy(a), di_session_destroy(b);
}

/* Request 0 to completion, then request 1: the step that admits request 1 and what it scheduled. */
static void run_sequential(int64_t step_tokens, int64_t *work, int64_t *steps_to_first, int64_t *hit,
                           int32_t toks1[N_OUT]) {
    core_rig g;
    rig_open(&g, step_tokens, 0, true, 128);
    int32_t toks[2][MAX_OUT];
    int64_t n_tok[2] = {0, 0}, hits[2] = {0, 0};
    int fin[2] = {0, 0};
    rig_add(&g, 0, N_OUT);
    for (int guard = 0; !fin[0]; guard++) {
        assert_true(guard < 100);
        rig_step(&g, toks, n_tok, hits, fin);
    }
    rig_add(&g, 1, N_OUT);
    int64_t before = di_core_get_stats(g.c)->scheduled_tokens;
    rig_step(&g, toks, n_tok, hits, fin);
    *work = di_core_get_stats(g.c)->scheduled_tokens - before;
    *steps_to_first = 1;
    for (int guard = 0; n_tok[1] == 0; guard++, (*steps_to_first)++) {
        assert_true(guard < 100);
        rig_step(&g, toks, n_tok, hits, fin);
    }
    while (!fin[1]) rig_step(&g, toks, n_tok, hits, fin);
    *hit = hits[1];
    assert_int_equal(n_tok[1], N_OUT);
    memcpy(toks1, toks[1], sizeof(int32_t) * N_OUT);
    rig_close(&g);
}

static void test_budget_hit(void **state) {
    (void)state;
    int32_t p[SHARED + 32];
    int64_t n1 = make_prompt(1, p);
    core_rig probe;
    rig_open(&probe, 512, 0, true, 128);
    const int64_t keep = di_prefix_cache_keep(probe.it.prefix, NULL), align = di_prefix_cache_align(probe.it.prefix);
    rig_close(&probe);
    const int64_t P = SHARED / BLOCK * BLOCK, r = di_prefix_replay_start(P, keep, (int)align);
    int64_t work_wide, work_narrow, first_wide, first_narrow, hit_wide, hit_narrow;
    int32_t t_wide[N_OUT], t_narrow[N_OUT], t_ref[N_OUT];
    run_sequential(512, &work_wide, &first_wide, &hit_wide, t_wide);
    run_sequential(64, &work_narrow, &first_narrow, &hit_narrow, t_narrow);
    reference_tokens(1, P, t_ref);
    tu_report("budget with a warm cache: prompt %lld, hit %lld, keep %lld (align %lld, replay [%lld, %lld)): the "
              "admitting step scheduled %lld positions (budget 512) and %lld (budget 64, first token after %lld "
              "step) instead of %lld",
              (long long)n1, (long long)hit_wide, (long long)keep, (long long)align, (long long)r, (long long)P,
              (long long)work_wide, (long long)work_narrow, (long long)first_narrow, (long long)n1);
    assert_int_equal(hit_wide, P);
    assert_int_equal(hit_narrow, P);
    assert_true(P - r >= keep && P - r < keep + align);
    assert_int_equal(work_wide, n1 - P + (P - r)); /* prompt − P + the replay, not the prompt */
    assert_int_equal(work_narrow, n1 - r);
    assert_true(n1 - r <= 64 && n1 > 64);      /* it fits the narrow budget only at its reduced size */
    assert_int_equal(first_wide, 1);
    assert_int_equal(first_narrow, 1);          /* admitted and prefilled in one step of 64 */
    assert_memory_equal(t_wide, t_narrow, sizeof t_wide);
    assert_memory_equal(t_wide, t_ref, sizeof t_wide);
}

/* Request 1 is added once request 0 has produced a token (it is decoding): it hits the blocks
 * request 0's prefill stored. */
static void run_side_by_side(int async, int64_t *hit, int32_t toks1[N_OUT], int *overlap) {
    core_rig g;
    rig_open(&g, 512, async, true, 128);
    int32_t toks[2][MAX_OUT];
    int64_t n_tok[2] = {0, 0}, hits[2] = {0, 0};
    int fin[2] = {0, 0};
    rig_add(&g, 0, N_OUT);
    for (int guard = 0; n_tok[0] == 0; guard++) {
        assert_true(guard < 100);
        rig_step(&g, toks, n_tok, hits, fin);
    }
    assert_false(fin[0]);
    rig_add(&g, 1, N_OUT);
    *overlap = 0;
    for (int guard = 0; !fin[0] || !fin[1]; guard++) {
        assert_true(guard < 100);
        rig_step(&g, toks, n_tok, hits, fin);
        if (n_tok[1] > 0 && !fin[0] && n_tok[0] < N_OUT) *overlap = 1; /* request 1 sampled while 0 decodes */
    }
    *hit = hits[1];
    assert_int_equal(hits[0], 0);
    assert_int_equal(n_tok[1], N_OUT);
    memcpy(toks1, toks[1], sizeof(int32_t) * N_OUT);
    rig_close(&g);
}

static void test_side_by_side(void **state) {
    (void)state;
    int64_t hit_sync, hit_async, work, first, hit_seq;
    int32_t t_sync[N_OUT], t_async[N_OUT], t_seq[N_OUT];
    int ov_sync, ov_async;
    run_side_by_side(0, &hit_sync, t_sync, &ov_sync);
    run_side_by_side(1, &hit_async, t_async, &ov_async);
    run_sequential(512, &work, &first, &hit_seq, t_seq);
    tu_report("side by side: request 1 added while request 0 decodes hits %lld (sync) / %lld (async) tokens of its "
              "%d-token shared prefix; tokens equal to the sequential run: %s",
              (long long)hit_sync, (long long)hit_async, SHARED,
              !memcmp(t_sync, t_seq, sizeof t_seq) && !memcmp(t_async, t_seq, sizeof t_seq) ? "yes" : "no");
    assert_true(ov_sync);
    assert_true(ov_async);
    assert_int_equal(hit_sync, SHARED / BLOCK * BLOCK); /* 3 blocks */
    assert_int_equal(hit_async, hit_sync);
    assert_memory_equal(t_sync, t_seq, sizeof t_seq);
    assert_memory_equal(t_async, t_seq, sizeof t_seq);
}

/* Without a prefix cache the core schedules whole prompts (the control for the counts above). */
static void test_no_cache_counts(void **state) {
    (void)state;
    core_rig g;
    rig_open(&g, 512, 0, false, 128);
    int32_t toks[2][MAX_OUT];
    int64_t n_tok[2] = {0, 0}, hits[2] = {0, 0};
    int fin[2] = {0, 0};
    rig_add(&g, 0, N_OUT);
    while (!fin[0]) rig_step(&g, toks, n_tok, hits, fin);
    rig_add(&g, 1, N_OUT);
    int64_t before = di_core_get_stats(g.c)->scheduled_tokens;
    rig_step(&g, toks, n_tok, hits, fin);
    int32_t p[SHARED + 32];
    assert_int_equal(di_core_get_stats(g.c)->scheduled_tokens - before, make_prompt(1, p));
    assert_int_equal(hits[1], 0);
    rig_close(&g);
}

/* A pool too small for both requests' outputs: the newer one is preempted, publishes its prompt
 * blocks on the way out and, readmitted, restores them (its own hit) instead of recomputing; the
 * older one's tokens are those of the same run without a cache. */
static void run_preempt(bool prefix, int32_t toks0[MAX_OUT], int64_t *hit1, int64_t *preemptions) {
    core_rig g;
    rig_open(&g, 512, 0, prefix, 28); /* 28 blocks of 16: the two prompts take 14 each */
    int32_t toks[2][MAX_OUT];
    int64_t n_tok[2] = {0, 0}, hits[2] = {0, 0};
    int fin[2] = {0, 0};
    rig_add(&g, 0, MAX_OUT);
    rig_add(&g, 1, MAX_OUT);
    for (int guard = 0; !fin[0] || !fin[1]; guard++) {
        assert_true(guard < 200);
        rig_step(&g, toks, n_tok, hits, fin);
    }
    assert_int_equal(n_tok[0], MAX_OUT);
    assert_int_equal(n_tok[1], MAX_OUT);
    assert_int_equal(hits[0], 0);
    memcpy(toks0, toks[0], sizeof toks[0]);
    *hit1 = hits[1];
    *preemptions = di_core_get_stats(g.c)->preemptions;
    rig_close(&g);
}

static void test_preempt_readmit(void **state) {
    (void)state;
    int32_t t_on[MAX_OUT], t_off[MAX_OUT];
    int64_t hit_on, hit_off, pre_on, pre_off;
    run_preempt(true, t_on, &hit_on, &pre_on);
    run_preempt(false, t_off, &hit_off, &pre_off);
    tu_report("preemption with the prefix cache: %lld preemptions (%lld without), the readmitted request restored "
              "%lld tokens of its own prompt", (long long)pre_on, (long long)pre_off, (long long)hit_on);
    assert_true(pre_on >= 1);
    assert_true(pre_off >= 1);
    assert_int_equal(hit_off, 0);
    assert_int_equal(hit_on, SHARED / BLOCK * BLOCK);
    assert_memory_equal(t_on, t_off, sizeof t_on);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_hit),
        cmocka_unit_test(test_side_by_side),
        cmocka_unit_test(test_no_cache_counts),
        cmocka_unit_test(test_preempt_readmit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
