/* `deepinfer run` on a small JSONL file against a tiny model with the V4 tokenizer: every request
 * shape (OpenAI batch line, bare Chat Completions / Messages bodies, a regex response_format, raw
 * text and raw ids), a malformed line and an invalid request get one output line each with the
 * right status, body and usage; a seeded raw request gives the same ids as the public C API; the
 * --json summary counts them; `bench engine --mock` and `--shared-prefix` documents add up. Runs the built CLI (build/deepinfer, or $DI_CLI); skipped when
 * data/tokenizer is not installed. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "deepinfer.h"
#include "model/mkmodel.h"
#include "testutil.h"

#define TOKENIZER_DIR "data/tokenizer/deepseek-v4"

static const char *cli_path(void) {
    const char *p = getenv("DI_CLI");
    return p ? p : "build/deepinfer";
}

static char *g_dir, g_model[1024];

static int setup(void **state) {
    (void)state;
    struct stat sb;
    if (stat(cli_path(), &sb) != 0) {
        fprintf(stderr, "%s not built (run `make cli`)\n", cli_path());
        return -1;
    }
    if (stat(TOKENIZER_DIR "/tokenizer.json", &sb) != 0) return 0;
    g_dir = tu_tmpdir("run");
    snprintf(g_model, sizeof g_model, "%s/model", g_dir);
    return tu_write_tiny_model(g_model, 1, TOKENIZER_DIR);
}

static int teardown(void **state) {
    (void)state;
    if (g_dir) tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

static const char *INPUT =
    "{\"custom_id\":\"batch\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"DeepSeek-V4.1-"
    "Flash\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,\"seed\":1,\"thinking\":{\"type\":"
    "\"disabled\"}}}\n"
    "{\"custom_id\":\"anthropic\",\"messages\":[{\"role\":\"user\",\"content\":\"Yo\"}],\"max_tokens\":2,"
    "\"stop_sequences\":[\"zz\"],\"thinking\":{\"type\":\"disabled\"}}\n"
    "{\"custom_id\":\"regex\",\"messages\":[{\"role\":\"user\",\"content\":\"ok?\"}],\"response_format\":{\"type\":"
    "\"regex\",\"regex\":\"(yes|no)\"},\"max_tokens\":10,\"thinking\":{\"type\":\"disabled\"}}\n"
    "{\"custom_id\": \"broken\", this is not JSON\n"
    "\n"
    "{\"custom_id\":\"text\",\"prompt\":\"The sky is\",\"max_tokens\":2,\"temperature\":0}\n"
    "{\"custom_id\":\"ids\",\"prompt_ids\":[0,10,20,30],\"max_tokens\":3,\"seed\":5,\"temperature\":0.9}\n"
    "{\"custom_id\":\"badurl\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":\"x\"}}\n";

static json_t *by_id(json_t *lines, const char *id) {
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) {
        json_t *c = json_object_get(l, "custom_id");
        if (json_is_string(c) && !strcmp(json_string_value(c), id)) return l;
    }
    fail_msg("no output line for custom_id %s", id);
    return NULL;
}

static json_int_t status_of(json_t *l) {
    return json_integer_value(json_object_get(json_object_get(l, "response"), "status_code"));
}

static json_t *body_of(json_t *l) { return json_object_get(json_object_get(l, "response"), "body"); }

static void test_run_jsonl(void **state) {
    (void)state;
    if (!g_dir) skip();
    char *in = tu_write_file(g_dir, "in.jsonl", INPUT, strlen(INPUT));
    char out[1200], cmd[4096];
    snprintf(out, sizeof out, "%s/out.jsonl", g_dir);
    snprintf(cmd, sizeof cmd, "%s run --model %s --input %s --output %s --max-context 128 --max-seqs 4 --quiet --json",
             cli_path(), g_model, in, out);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_error_t je;
    json_t *sum = json_loadf(f, 0, &je);
    int st = pclose(f);
    if (!sum) fail_msg("`%s` printed no JSON document (%s)", cmd, je.text);
    assert_int_equal(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
    assert_int_equal(json_integer_value(json_object_get(sum, "requests")), 7);
    assert_int_equal(json_integer_value(json_object_get(sum, "succeeded")), 5);
    assert_int_equal(json_integer_value(json_object_get(sum, "failed")), 2);

    json_t *lines = json_array();
    FILE *o = fopen(out, "r");
    assert_non_null(o);
    char buf[65536];
    while (fgets(buf, sizeof buf, o)) {
        json_t *l = json_loads(buf, 0, &je);
        if (!l) fail_msg("output line is not JSON: %s", je.text);
        json_array_append_new(lines, l);
    }
    fclose(o);
    assert_int_equal(json_array_size(lines), 7);

    json_t *b = by_id(lines, "batch");
    assert_int_equal(status_of(b), 200);
    assert_string_equal(json_string_value(json_object_get(body_of(b), "object")), "chat.completion");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(b, "usage"), "completion_tokens")), 3);
    assert_true(json_integer_value(json_object_get(json_object_get(b, "usage"), "prompt_tokens")) > 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(b, "usage"), "cache_hit_tokens")), 0);
    assert_true(json_is_null(json_object_get(b, "error")));

    json_t *a = by_id(lines, "anthropic");
    assert_int_equal(status_of(a), 200);
    assert_string_equal(json_string_value(json_object_get(body_of(a), "type")), "message");
    assert_string_equal(json_string_value(json_object_get(body_of(a), "stop_reason")), "max_tokens");

    json_t *r = by_id(lines, "regex");
    assert_int_equal(status_of(r), 200);
    json_t *msg = json_object_get(json_array_get(json_object_get(body_of(r), "choices"), 0), "message");
    const char *content = json_string_value(json_object_get(msg, "content"));
    assert_non_null(content);
    assert_true(!strcmp(content, "yes") || !strcmp(content, "no"));

    json_t *t = by_id(lines, "text");
    assert_int_equal(status_of(t), 200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(t, "usage"), "completion_tokens")), 2);

    /* the raw-ids line equals the same request through the public API */
    json_t *ids = by_id(lines, "ids");
    assert_int_equal(status_of(ids), 200);
    json_t *tok = json_object_get(json_array_get(json_object_get(body_of(ids), "choices"), 0), "token_ids");
    assert_int_equal(json_array_size(tok), 3);
    di_engine_options eo;
    di_engine_options_default(&eo);
    eo.max_context = 128, eo.n_threads = 1;
    di_engine *e;
    di_error err = {0};
    if (di_engine_open(g_model, &eo, &e, &err)) fail_msg("%s", err.msg);
    di_request_options ro;
    di_request_options_default(&ro);
    ro.max_tokens = 3, ro.sampling.seed = 5, ro.has_seed = 1, ro.sampling.temperature = 0.9f;
    const int32_t p[4] = {0, 10, 20, 30};
    int64_t id;
    assert_int_equal(di_engine_add_tokens(e, p, 4, &ro, &id, &err), DI_OK);
    int32_t got[3];
    int n = 0;
    di_delta d[4];
    while (di_engine_busy(e)) {
        assert_int_equal(di_engine_step(e, &err), DI_OK);
        for (int32_t k = di_engine_poll(e, d, 4), i = 0; i < k; i++)
            for (int64_t j = 0; j < d[i].n_tokens && n < 3; j++) got[n++] = d[i].tokens[j];
    }
    di_engine_close(e);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(json_integer_value(json_array_get(tok, (size_t)i)), got[i]);

    /* the malformed line: its own error record, line number and no custom_id */
    json_t *bad = NULL;
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) if (json_integer_value(json_object_get(l, "line")) == 4) bad = l;
    assert_non_null(bad);
    assert_true(json_is_null(json_object_get(bad, "custom_id")));
    assert_int_equal(status_of(bad), 400);
    assert_string_equal(json_string_value(json_object_get(json_object_get(bad, "error"), "code")), "format");
    json_t *bu = by_id(lines, "badurl");
    assert_int_equal(status_of(bu), 400);
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(bu, "error"), "message")), "/v1/embeddings"));
    tu_report("run: 8 lines (1 blank) -> 5 responses + 2 line errors; %lld completion tokens in %.2f s",
              (long long)json_integer_value(json_object_get(sum, "completion_tokens")),
              json_real_value(json_object_get(sum, "wall_s")));
    json_decref(lines);
    json_decref(sum);
    free(in);
}

static void test_run_usage_errors(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s run --model /nonexistent --input /nonexistent.jsonl --output /dev/null --json 2>/dev/null",
             cli_path());
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_t *doc = json_loadf(f, 0, NULL);
    int st = pclose(f);
    assert_non_null(doc);
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_true(json_is_false(json_object_get(doc, "ok")));
    assert_non_null(strstr(json_string_value(json_object_get(doc, "error")), "/nonexistent.jsonl"));
    json_decref(doc);
}

/* `bench engine --mock`: the document's counts follow from the options. */
static void test_bench_engine_mock(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s bench engine --mock --requests 6 --prompt-tokens 8 --output-tokens 5 "
             "--mock-step-ms 1 --json 2>/dev/null", cli_path());
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_t *doc = json_loadf(f, 0, NULL);
    int st = pclose(f);
    assert_non_null(doc);
    assert_int_equal(WEXITSTATUS(st), 0);
    json_t *many = json_object_get(doc, "concurrent"), *one = json_object_get(doc, "single");
    assert_int_equal(json_integer_value(json_object_get(many, "generated")), 30);
    assert_int_equal(json_integer_value(json_object_get(one, "generated")), 5);
    json_t *ttft = json_object_get(many, "ttft_s");
    assert_int_equal(json_array_size(ttft), 3);
    assert_true(json_real_value(json_array_get(ttft, 0)) <= json_real_value(json_array_get(ttft, 2)));
    double ratio = json_real_value(json_object_get(doc, "ratio_to_single"));
    tu_report("bench engine --mock: 6 requests vs 1, ratio %.2f", ratio);
    assert_true(ratio > 1.0); /* 6 requests share each 1 ms step */
    json_decref(doc);
}

/* `bench engine --shared-prefix 0.9`: the prefill work follows from the hits — the second of two
 * 256-token prompts sharing ⌊q·256⌋ ids is scheduled from its replay start, so the work with the
 * cache is the work without it less the hit plus the replay; at q = 0.9 the hit is the three whole
 * 64-token blocks of the 230 shared ids. */
static void test_bench_shared_prefix(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s bench engine --shared-prefix 0.9 --preset tiny --requests 2 --prompt-tokens 256 "
             "--threads 1 --json 2>/dev/null", cli_path());
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_t *doc = json_loadf(f, 0, NULL);
    int st = pclose(f);
    assert_non_null(doc);
    assert_int_equal(WEXITSTATUS(st), 0);
    json_t *rows = json_object_get(doc, "ratios");
    assert_int_equal(json_array_size(rows), 3);
    for (size_t k = 0; k < 3; k++) {
        json_t *r = json_array_get(rows, k);
        json_int_t off = json_integer_value(json_object_get(r, "off_work")), on = json_integer_value(json_object_get(r, "on_work"));
        json_int_t hit = json_integer_value(json_object_get(r, "hit_tokens")), rep = json_integer_value(json_object_get(r, "replayed"));
        double q = json_real_value(json_object_get(r, "ratio"));
        tu_report("bench engine --shared-prefix: ratio %.2f, prefill work %lld -> %lld (%.1f%% saved), hit %lld, replayed %lld",
                  q, (long long)off, (long long)on, 100.0 * (double)(off - on) / (double)off, (long long)hit, (long long)rep);
        assert_int_equal(off, 2 * 256);
        assert_int_equal(on, off - hit + rep);
        assert_int_equal(json_integer_value(json_object_get(r, "on_positions")), on); /* the runner agrees */
        if (k == 0) assert_int_equal(hit, 0);
        else assert_true(rep > 0 && rep < hit);
        if (k == 2) assert_int_equal(hit, (int64_t)(0.9 * 256) / 64 * 64);
    }
    json_decref(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_jsonl),
        cmocka_unit_test(test_bench_engine_mock),
        cmocka_unit_test(test_bench_shared_prefix),
        cmocka_unit_test(test_run_usage_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
