/* The engine end to end on the tiny V4.1 checkpoint (tests/data/v41-tiny-nosel) through the
 * cache-free recompute runner: its tokens and logprobs equal a plain loop of prefill + decode steps
 * and the sampler, in sync and async mode, alone and batched, with and without preemption.  di-test: asan */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "engine/recompute_runner.h"
#include "model/forward.h"
#include "model/session.h"
#include "testutil.h"

enum { N_REQ = 3, N_OUT = 5 };

typedef struct {
    int32_t prompt[12];
    int64_t n_prompt;
    di_seq_params p;
    int32_t tok[N_OUT];
    float lp[N_OUT];
    int64_t n;
} req;

static void make_reqs(req *r, int32_t V) {
    uint64_t s = 77;
    for (int i = 0; i < N_REQ; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].n_prompt = 6 + 2 * i;
        for (int64_t t = 0; t < r[i].n_prompt; t++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            r[i].prompt[t] = 3 + (int32_t)(s % (uint64_t)(V - 3));
        }
        r[i].p.sampling = di_sampling_params_default();
        r[i].p.sampling.temperature = i == 0 ? 0.0f : 0.8f;
        r[i].p.sampling.top_k = i == 2 ? 20 : 0;
        r[i].p.sampling.seed = 1000 + (uint64_t)i;
        r[i].p.sampling.logprobs = 1;
        r[i].p.max_tokens = N_OUT;
        r[i].p.prefill_chunk = 4;
    }
}

/* The meaning of a request: one-shot prefill of the prompt, sample, then one decode step per sampled
 * token (a session over the real cache, model/session.h), sample, repeat. */
static void plain_loop(const di_model *m, const di_backend *be, req *r) {
    const int32_t V = m->cfg.vocab_size, eos = m->cfg.eos_token_id;
    di_sampler *s;
    assert_int_equal(di_sampler_new(V, &s, NULL), DI_OK);
    di_session_opts so = {.max_tokens = r->n_prompt + N_OUT, .spec_margin = -1};
    di_session *ss;
    di_error err = {0};
    if (di_session_create(m, be, &so, &ss, &err)) fail_msg("%s", err.msg);
    float *logits = malloc(sizeof(float) * (size_t)V); /* f32 [V]: the last row of each pass */
    assert_non_null(logits);
    int32_t hist[32];
    memcpy(hist, r->prompt, (size_t)r->n_prompt * sizeof *hist);
    int64_t len = r->n_prompt;
    r->n = 0;
    const di_fwd_opts opts = {.prompt_end = r->n_prompt};
    if (di_session_forward(ss, hist, len, false, logits, &opts, &err)) fail_msg("%s", err.msg);
    while (r->n < N_OUT) {
        di_sample_row row = {logits, &r->p.sampling, r->prompt, r->n_prompt, hist + r->n_prompt, r->n, NULL, len, 0};
        di_sample_result res;
        assert_int_equal(di_sampler_sample(s, &row, &res, NULL), DI_OK);
        r->tok[r->n] = res.token;
        r->lp[r->n++] = res.logprob;
        hist[len++] = res.token;
        if (res.token == eos || r->n == N_OUT) break;
        if (di_session_forward(ss, hist + len - 1, 1, false, logits, &opts, &err)) fail_msg("%s", err.msg);
    }
    free(logits);
    di_session_destroy(ss);
    di_sampler_free(s);
}

static void run_engine(const di_model *m, const di_backend *be, req *r, int n, int async, int32_t n_blocks,
                       int64_t *preemptions) {
    di_recompute_runner *rr;
    di_model_runner runner;
    di_error err = {0};
    assert_int_equal(di_recompute_runner_new(m, be, 64, 4, n_blocks, &rr, &runner, &err), DI_OK);
    const int32_t eos = m->cfg.eos_token_id;
    di_core_options co = {.sched = {.max_seqs = 4, .max_step_tokens = 16, .prefill_chunk = 4},
                          .async = async, .eos_ids = &eos, .n_eos = 1};
    di_core *c;
    assert_int_equal(di_core_new(&runner, &co, &c, &err), DI_OK);
    for (int i = 0; i < n; i++) {
        r[i].n = 0;
        assert_int_equal(di_core_add(c, i, r[i].prompt, r[i].n_prompt, &r[i].p, &err), DI_OK);
    }
    int done = 0;
    di_core_delta d[8];
    while (done < n) {
        if (di_core_step(c, &err)) fail_msg("%s", err.msg);
        int32_t k = di_core_poll(c, d, 8);
        for (int32_t j = 0; j < k; j++) {
            req *q = &r[d[j].id];
            for (int64_t t = 0; t < d[j].n_tokens; t++) {
                q->tok[q->n] = d[j].tokens[t];
                q->lp[q->n++] = d[j].logprobs[t].logprob;
            }
            if (d[j].finish == DI_FINISH_REASON_ERROR) fail_msg("%s", d[j].error);
            if (d[j].finish) done++;
        }
    }
    *preemptions = di_core_get_stats(c)->preemptions;
    di_core_free(c);
    di_recompute_runner_free(rr);
}

static void test_tiny_end_to_end(void **state) {
    (void)state;
    di_model *m;
    di_backend *be;
    di_error err = {0};
    if (di_model_open(tu_data("v41-tiny-nosel"), &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(di_backend_cpu_create(1, &be, &err), DI_OK);
    req want[N_REQ], got[N_REQ];
    make_reqs(want, m->cfg.vocab_size);
    for (int i = 0; i < N_REQ; i++) plain_loop(m, be, &want[i]);
    const struct {
        int async, batched;
        int32_t n_blocks;
    } cfg[] = {{0, 0, 64}, {0, 1, 64}, {1, 1, 64}, {0, 1, 7}, {1, 1, 7}};
    int64_t preempted = 0;
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        memcpy(got, want, sizeof got);
        int64_t pre = 0;
        if (cfg[c].batched) {
            run_engine(m, be, got, N_REQ, cfg[c].async, cfg[c].n_blocks, &pre);
        } else {
            for (int i = 0; i < N_REQ; i++) run_engine(m, be, &got[i], 1, cfg[c].async, cfg[c].n_blocks, &pre);
        }
        preempted += pre;
        for (int i = 0; i < N_REQ; i++) {
            if (got[i].n != want[i].n) fail_msg("config %zu request %d: %lld tokens, plain loop %lld", c, i,
                                                (long long)got[i].n, (long long)want[i].n);
            for (int64_t t = 0; t < got[i].n; t++) {
                if (got[i].tok[t] != want[i].tok[t] || memcmp(&got[i].lp[t], &want[i].lp[t], sizeof(float)))
                    fail_msg("config %zu request %d token %lld: %d (%.9g), plain loop %d (%.9g)", c, i, (long long)t,
                             got[i].tok[t], got[i].lp[t], want[i].tok[t], want[i].lp[t]);
            }
        }
    }
    tu_report("tiny checkpoint through the engine: %d requests x %d tokens identical to prefill + decode steps + sampler in 5 "
              "configurations (sync/async, alone/batched), %lld preemptions", N_REQ, N_OUT, (long long)preempted);
    assert_true(preempted > 0);
    di_backend_destroy(be);
    di_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_end_to_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
