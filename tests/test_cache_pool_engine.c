/* The paged cache pool behind the engine (model/cache_pool.h, engine/api_runner.h
 * di_session_runner_use_pool) on the tiny V4.1 checkpoint: the scheduler's blocks are the pool's
 * pages, so a pool too small for every request at once preempts (recompute), and each preempted
 * request's tokens and logprobs are bit-identical to the same request run alone in a roomy pool
 * (its cache was rebuilt in other pages), and batched runs over paged and private contiguous caches
 * give the same tokens; a request that could never fit the budget gets a clear
 * error while the others run to the end; the pool's pages all come back.  di-test: asan */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "deepinfer.h"
#include "engine/api_runner.h"
#include "engine/engine_core.h"
#include "model/cache_pool.h"
#include "testutil.h"

enum { N_REQ = 3, N_OUT = 6, CTX = 64, BLOCK = 4 };

typedef struct {
    int32_t prompt[16];
    int64_t n_prompt;
    di_seq_params p;
    int32_t tok[N_OUT];
    float lp[N_OUT];
    int64_t n;
    int finish;
} req;

static void make_reqs(req *r, int32_t V) {
    uint64_t s = 91;
    for (int i = 0; i < N_REQ; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].n_prompt = 7 + 3 * i;
        for (int64_t t = 0; t < r[i].n_prompt; t++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            r[i].prompt[t] = 3 + (int32_t)(s % (uint64_t)(V - 3));
        }
        r[i].p.sampling = di_sampling_params_default();
        r[i].p.sampling.temperature = i == 0 ? 0.0f : 0.9f;
        r[i].p.sampling.seed = 500 + (uint64_t)i;
        r[i].p.sampling.logprobs = 1;
        r[i].p.max_tokens = N_OUT;
        r[i].p.ignore_eos = 1;
        /* one position per piece: the prefill, a decode step and a recompute after preemption then
         * run every position the same way, so the rebuilt cache is the original bit for bit (with
         * longer chunks it agrees only within the reference's noise: api_runner.h) */
        r[i].p.prefill_chunk = 1;
    }
}

/* Runs r[0..n) through a core over a session runner whose sessions live in a pool of n_blocks
 * pages; want_err[i] != 0: request i must be refused at add with that code. */
static void run_pool(const di_model *m, const di_backend *be, req *r, int n, int32_t n_blocks, int async,
                     const int *want_err, int64_t *preemptions, int paged) {
    di_session_runner *sr;
    di_model_runner it;
    di_error err = {0};
    const int32_t max_seqs = 3;
    assert_int_equal(di_session_runner_new(m, be, CTX, BLOCK, n_blocks, &sr, &it, &err), DI_OK);
    if (paged && di_session_runner_use_pool(sr, &it, max_seqs, &err)) fail_msg("%s", err.msg);
    const int32_t eos = m->cfg.eos_token_id;
    di_core_options co = {.sched = {.max_seqs = max_seqs, .max_step_tokens = 8, .prefill_chunk = 1},
                          .async = async, .eos_ids = &eos, .n_eos = 1};
    di_core *c;
    assert_int_equal(di_core_new(&it, &co, &c, &err), DI_OK);
    int live = 0;
    for (int i = 0; i < n; i++) {
        r[i].n = 0;
        r[i].finish = 0;
        int rc = di_core_add(c, i, r[i].prompt, r[i].n_prompt, &r[i].p, &err);
        if (want_err && want_err[i]) {
            assert_int_equal(rc, want_err[i]);
            tu_report("refused: %s", err.msg);
            assert_non_null(strstr(err.msg, "cache blocks"));
            continue;
        }
        if (rc) fail_msg("add %d: %s", i, err.msg);
        live++;
    }
    di_core_delta d[8];
    for (int done = 0; done < live;) {
        if (di_core_step(c, &err)) fail_msg("%s", err.msg);
        int32_t k = di_core_poll(c, d, 8);
        for (int32_t j = 0; j < k; j++) {
            req *q = &r[d[j].id];
            for (int64_t t = 0; t < d[j].n_tokens; t++) {
                q->tok[q->n] = d[j].tokens[t];
                q->lp[q->n++] = d[j].logprobs[t].logprob;
            }
            if (d[j].finish == DI_FINISH_REASON_ERROR) fail_msg("request %lld: %s", (long long)d[j].id, d[j].error);
            if (d[j].finish) done++, q->finish = 1;
        }
    }
    *preemptions = di_core_get_stats(c)->preemptions;
    di_core_free(c);
    /* every session is back in the runner (spare or live-but-released): no slot leaked beyond max_seqs */
    if (paged) assert_true(sr->pool->n_free_slots >= 0 && sr->pool->n_slots == max_seqs);
    di_session_runner_free(sr);
}

static void assert_same_tokens(const req *got, const req *want, const char *what, int i) {
    if (got->n != want->n) fail_msg("%s request %d: %lld tokens, alone %lld", what, i, (long long)got->n, (long long)want->n);
    for (int64_t t = 0; t < got->n; t++)
        if (got->tok[t] != want->tok[t] || memcmp(&got->lp[t], &want->lp[t], sizeof(float)))
            fail_msg("%s request %d token %lld: %d (%.9g), alone %d (%.9g)", what, i, (long long)t, got->tok[t],
                     got->lp[t], want->tok[t], want->lp[t]);
}

static void test_preemption_exact(void **state) {
    (void)state;
    di_model *m;
    di_backend *be;
    di_error err = {0};
    if (di_model_open(tu_data("v41-tiny-nosel"), &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    req want[N_REQ], got[N_REQ];
    make_reqs(want, m->cfg.vocab_size);
    int64_t pre = 0, total = 0;
    for (int i = 0; i < N_REQ; i++) run_pool(m, be, &want[i], 1, 64, 0, NULL, &pre, 1); /* alone, roomy */
    assert_int_equal(pre, 0);
    /* paging changes nothing: the same requests batched over private contiguous caches */
    memcpy(got, want, sizeof got);
    run_pool(m, be, got, N_REQ, 64, 0, NULL, &pre, 0);
    for (int i = 0; i < N_REQ; i++) assert_same_tokens(&got[i], &want[i], "private caches", i);
    /* longest request: 13 + 6 = 19 positions = 5 pages; 3 requests want 13 pages: 8 preempt */
    for (int async = 0; async < 2; async++) {
        memcpy(got, want, sizeof got);
        run_pool(m, be, got, N_REQ, 8, async, NULL, &pre, 1);
        for (int i = 0; i < N_REQ; i++) assert_same_tokens(&got[i], &want[i], async ? "async" : "sync", i);
        total += pre;
        tu_report("pool of 8 pages x %d positions (%s): %lld preemptions, tokens identical to solo runs", BLOCK,
                  async ? "async" : "sync", (long long)pre);
    }
    assert_true(total > 0);
    di_model_close(m);
    di_backend_destroy(be);
}

static void test_budget_too_small(void **state) {
    (void)state;
    di_model *m;
    di_backend *be;
    di_error err = {0};
    if (di_model_open(tu_data("v41-tiny-nosel"), &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    req want[N_REQ], got[N_REQ];
    make_reqs(want, m->cfg.vocab_size);
    int64_t pre;
    run_pool(m, be, &want[0], 1, 64, 0, NULL, &pre, 1);
    run_pool(m, be, &want[1], 1, 64, 0, NULL, &pre, 1);
    memcpy(got, want, sizeof got);
    /* 4 pages = 16 positions: request 2 (13 + 6) can never fit; 0 (7 + 6) and 1 (10 + 6) can */
    const int want_err[N_REQ] = {0, 0, DI_ERR_LIMIT};
    run_pool(m, be, got, N_REQ, 4, 0, want_err, &pre, 1);
    assert_true(got[0].finish && got[1].finish);
    assert_int_equal(got[2].n, 0);
    assert_same_tokens(&got[0], &want[0], "small pool", 0);
    assert_same_tokens(&got[1], &want[1], "small pool", 1);
    tu_report("pool of 4 pages: the too-long request refused, the other two complete (%lld preemptions)",
              (long long)pre);
    di_model_close(m);
    di_backend_destroy(be);
}

/* The public option: cache_bytes sizes the pool at open; a budget below the fixed slots and one page
 * is refused at open with both sizes named, nothing leaked. */
static void test_engine_cache_bytes(void **state) {
    (void)state;
    di_engine_options eo;
    di_engine_options_default(&eo);
    eo.max_seqs = 2;
    eo.max_context = 64;
    eo.cache_bytes = 1024;
    di_engine *e = NULL;
    di_error err = {0};
    assert_int_equal(di_engine_open(tu_data("v41-tiny-nosel"), &eo, &e, &err), DI_ERR_LIMIT);
    tu_report("cache_bytes 1024: %s", err.msg);
    assert_non_null(strstr(err.msg, "budget of 1024 bytes"));
    assert_null(e);
    eo.cache_bytes = 8 << 20;
    if (di_engine_open(tu_data("v41-tiny-nosel"), &eo, &e, &err)) fail_msg("%s", err.msg);
    di_engine_close(e);
    eo.cache_bytes = -1;
    assert_int_equal(di_engine_open(tu_data("v41-tiny-nosel"), &eo, &e, &err), DI_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preemption_exact),
        cmocka_unit_test(test_budget_too_small),
        cmocka_unit_test(test_engine_cache_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
