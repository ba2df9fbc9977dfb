/* The prefix cache behind the public engine API and `deepinfer run`, on the mkmodel tiny preset
 * (window 16: a hit must reach deeper than the 24-token replay; 64-token blocks):
 *  - two requests sharing a 200-id prefix, run one after the other with the cache on: the first
 *    reports cache_hit_tokens 0, the second a whole number of blocks, > 0 and ≤ the shared length
 *    (the deepest whole block below it: 192);
 *  - with the cache off, and with the recompute runner (which caches no prefixes), both report 0;
 *  - sync and async engines report the same hits (the count travels back with the step results,
 *    engine/runner.h cache_hit, so the worker's runner state is never read by the host);
 *  - `deepinfer run --prefix-cache-mb 64 --max-seqs 1` on a JSONL with two raw lines sharing a prefix:
 *    the second line's usage.cache_hit_tokens > 0, the first 0; and two chat lines sharing a long
 *    message: the second's body reports the same hit in prompt_tokens_details.cached_tokens and
 *    prompt_cache_hit/miss_tokens (skipped without the CLI or tokenizer);
 *  - a negative budget is rejected at open.
 * The scheduler's side (budget at the reduced size, blocks shared side by side) is in
 * tests/test_prefix_sched.c.
 * di-test: asan */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "deepinfer.h"
#include "model/mkmodel.h"
#include "testutil.h"
#include "util/log.h"

#define TOKENIZER_DIR "data/tokenizer/deepseek-v4"
#define SHARED 200
#define BLOCK 64

static char *g_dir, g_model[1024];
static int g_have_tokenizer;

static int setup(void **state) {
    (void)state;
    struct stat sb;
    g_have_tokenizer = stat(TOKENIZER_DIR "/tokenizer.json", &sb) == 0;
    g_dir = tu_tmpdir("prefix_engine");
    snprintf(g_model, sizeof g_model, "%s/model", g_dir);
    return tu_write_tiny_model(g_model, 3, g_have_tokenizer ? TOKENIZER_DIR : NULL);
}

static int teardown(void **state) {
    (void)state;
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

/* Runs request 0 to completion, then request 1, n_out (≤ 4) greedy tokens each; hits[k] = the last
 * delta's cache_hit_tokens. */
static void run_pair(const char *runner, int64_t cache_bytes, int async, int64_t hits[2], int32_t toks[2][4],
                     int64_t n_out) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.runner = runner;
    o.n_threads = 1;
    o.max_context = 512;
    o.max_seqs = 4;
    o.prefill_chunk = 512; /* whole prompt in one piece: a hit must exceed the replay it costs */
    o.max_step_tokens = 512;
    o.sample_threads = 1;
    o.async = async;
    o.seed = 7;
    o.prefix_cache_bytes = cache_bytes;
    o.prefix_block = BLOCK;
    di_engine *e = NULL;
    di_error err = {0};
    if (di_engine_open(g_model, &o, &e, &err)) fail_msg("%s", err.msg);
    for (int k = 0; k < 2; k++) {
        int32_t p[SHARED + 32];
        int64_t n = make_prompt(k, p);
        di_request_options ro;
        di_request_options_default(&ro);
        ro.sampling.temperature = 0;
        ro.max_tokens = n_out;
        ro.ignore_eos = 1;
        int64_t id = 0;
        if (di_engine_add_tokens(e, p, n, &ro, &id, &err)) fail_msg("%s", err.msg);
        hits[k] = -1;
        int64_t n_tok = 0;
        di_delta d[8];
        for (int guard = 0; di_engine_busy(e); guard++) {
            if (guard > 1000) fail_msg("engine did not finish");
            if (di_engine_step(e, &err)) fail_msg("%s", err.msg);
            int32_t m = di_engine_poll(e, d, 8);
            for (int32_t j = 0; j < m; j++) {
                assert_int_equal(d[j].id, id);
                if (d[j].finish == DI_FINISH_REASON_ERROR) fail_msg("request %lld: %s", (long long)id, d[j].error);
                for (int64_t t = 0; t < d[j].n_tokens && n_tok < n_out; t++) toks[k][n_tok++] = d[j].tokens[t];
                assert_true(d[j].cache_hit_tokens >= hits[k]); /* never shrinks within a request */
                hits[k] = d[j].cache_hit_tokens;
            }
        }
        assert_int_equal(n_tok, n_out);
    }
    di_engine_close(e);
}

static void test_hits_engine(void **state) {
    (void)state;
    int64_t on_async[2], on_sync[2], off[2], rec[2];
    int32_t t_on[2][4], t_sync[2][4], t_off[2][4], t_rec[2][4] = {{0}};
    double t0 = di_now();
    run_pair("cached", 64ll << 20, 1, on_async, t_on, 4);
    double t1 = di_now();
    run_pair("cached", 64ll << 20, 0, on_sync, t_sync, 4);
    run_pair("cached", 0, 1, off, t_off, 4);
    run_pair("recompute", 64ll << 20, 1, rec, t_rec, 1); /* O(T²): one token (the prefill) is enough */
    tu_report("prefix engine: hits async {%lld, %lld}, sync {%lld, %lld}, off {%lld, %lld}, recompute {%lld, %lld}; "
              "cached pair %.2f s",
              (long long)on_async[0], (long long)on_async[1], (long long)on_sync[0], (long long)on_sync[1],
              (long long)off[0], (long long)off[1], (long long)rec[0], (long long)rec[1], t1 - t0);
    assert_int_equal(on_async[0], 0);
    assert_true(on_async[1] > 0);
    assert_int_equal(on_async[1] % BLOCK, 0);
    assert_true(on_async[1] <= SHARED);
    assert_int_equal(on_async[1], SHARED / BLOCK * BLOCK); /* every whole shared block was stored */
    assert_int_equal(on_sync[0], on_async[0]);
    assert_int_equal(on_sync[1], on_async[1]);
    assert_memory_equal(t_sync, t_on, sizeof t_on); /* same numerics in both modes */
    assert_int_equal(off[0], 0);
    assert_int_equal(off[1], 0);
    assert_int_equal(rec[0], 0);
    assert_int_equal(rec[1], 0);
    /* the first request never touches the cache: its tokens are those of the uncached engine */
    assert_memory_equal(t_on[0], t_off[0], sizeof t_on[0]);
}

static void test_bad_options(void **state) {
    (void)state;
    di_engine_options o;
    di_engine_options_default(&o);
    o.prefix_cache_bytes = -1;
    di_engine *e = NULL;
    di_error err = {0};
    assert_int_equal(di_engine_open(g_model, &o, &e, &err), DI_ERR_INVALID);
    assert_null(e);
    assert_non_null(strstr(err.msg, "prefix_cache_bytes"));
}

static const char *cli_path(void) {
    const char *p = getenv("DI_CLI");
    return p ? p : "build/deepinfer";
}

static void test_hits_cli(void **state) {
    (void)state;
    struct stat sb;
    if (stat(cli_path(), &sb) != 0 || !g_have_tokenizer) skip();
    char in_text[16384];
    size_t len = 0;
    for (int k = 0; k < 2; k++) {
        int32_t p[SHARED + 32];
        int64_t n = make_prompt(k, p);
        len += (size_t)snprintf(in_text + len, sizeof in_text - len, "{\"custom_id\":\"r%d\",\"prompt_ids\":[", k);
        for (int64_t i = 0; i < n; i++)
            len += (size_t)snprintf(in_text + len, sizeof in_text - len, "%s%d", i ? "," : "", p[i]);
        len += (size_t)snprintf(in_text + len, sizeof in_text - len, "],\"max_tokens\":2,\"temperature\":0}\n");
        assert_true(len < sizeof in_text);
    }
    /* two Chat Completions lines sharing a long user message: the body's cached-token fields */
    for (int k = 0; k < 2; k++) {
        len += (size_t)snprintf(in_text + len, sizeof in_text - len,
                                "{\"custom_id\":\"c%d\",\"messages\":[{\"role\":\"user\",\"content\":\"", k);
        for (int i = 0; i < 30; i++)
            len += (size_t)snprintf(in_text + len, sizeof in_text - len, "The quick brown fox jumps over the lazy dog. ");
        len += (size_t)snprintf(in_text + len, sizeof in_text - len,
                                "Question %d?\"}],\"max_tokens\":2,\"thinking\":{\"type\":\"disabled\"}}\n", k);
        assert_true(len < sizeof in_text);
    }
    char *in = tu_write_file(g_dir, "in.jsonl", in_text, len);
    char out[1200], cmd[4096];
    snprintf(out, sizeof out, "%s/out.jsonl", g_dir);
    /* one request at a time, so every line but the first finds the blocks of the ones before */
    snprintf(cmd, sizeof cmd,
             "%s run --model %s --input %s --output %s --max-context 512 --max-seqs 1 --threads 1 "
             "--prefix-cache-mb 64 --quiet --json",
             cli_path(), g_model, in, out);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_error_t je;
    json_t *sum = json_loadf(f, 0, &je);
    int st = pclose(f);
    if (!sum) fail_msg("`%s` printed no JSON document (%s)", cmd, je.text);
    assert_int_equal(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
    assert_int_equal(json_integer_value(json_object_get(sum, "succeeded")), 4);
    json_decref(sum);
    FILE *o = fopen(out, "r");
    assert_non_null(o);
    char buf[65536];
    int64_t hit[2] = {-1, -1}, chat_hit = -1, chat_body_cached = -1;
    while (fgets(buf, sizeof buf, o)) {
        json_t *l = json_loads(buf, 0, &je);
        if (!l) fail_msg("output line is not JSON: %s", je.text);
        const char *cid = json_string_value(json_object_get(l, "custom_id"));
        assert_non_null(cid);
        json_t *u = json_object_get(l, "usage");
        int k = cid[1] - '0';
        assert_true(k == 0 || k == 1);
        if (cid[0] == 'r') {
            hit[k] = json_integer_value(json_object_get(u, "cache_hit_tokens"));
            assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), SHARED + 20 + 4 * k);
        } else if (k == 1) {
            chat_hit = json_integer_value(json_object_get(u, "cache_hit_tokens"));
            json_t *bu = json_object_get(json_object_get(json_object_get(l, "response"), "body"), "usage");
            chat_body_cached = json_integer_value(json_object_get(json_object_get(bu, "prompt_tokens_details"), "cached_tokens"));
            assert_int_equal(json_integer_value(json_object_get(bu, "prompt_cache_hit_tokens")), chat_hit);
            assert_int_equal(json_integer_value(json_object_get(bu, "prompt_cache_miss_tokens")),
                             json_integer_value(json_object_get(u, "prompt_tokens")) - chat_hit);
        }
        json_decref(l);
    }
    fclose(o);
    free(in);
    tu_report("run --prefix-cache-mb 64: cache_hit_tokens raw {%lld, %lld}, second chat line %lld",
              (long long)hit[0], (long long)hit[1], (long long)chat_hit);
    assert_int_equal(hit[0], 0);
    assert_true(hit[1] > 0);
    assert_int_equal(hit[1] % BLOCK, 0);
    assert_true(hit[1] <= SHARED);
    assert_true(chat_hit > 0);
    assert_int_equal(chat_hit % BLOCK, 0);
    assert_int_equal(chat_body_cached, chat_hit);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hits_engine),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_hits_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
