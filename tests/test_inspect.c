/* `deepinfer inspect`: the JSON document's values for the released config and a golden checkpoint,
 * and the failure document. Runs the built CLI (build/deepinfer, or $DI_CLI). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "testutil.h"

static const char *cli_path(void) {
    const char *p = getenv("DI_CLI");
    return p ? p : "build/deepinfer";
}

/* Run `deepinfer inspect ARGS --json`; returns the parsed stdout document and the exit status. */
static json_t *run_inspect(const char *args, int *status) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s inspect %s --json 2>/dev/null", cli_path(), args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_error_t je;
    json_t *doc = json_loadf(f, 0, &je);
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (!doc) fail_msg("`%s` printed no JSON document (%s)", cmd, je.text);
    return doc;
}

static json_int_t geti(json_t *doc, const char *path) {
    json_t *v = doc;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, ".")) v = json_object_get(v, tok);
    if (!json_is_integer(v)) fail_msg("no integer at %s", path);
    return json_integer_value(v);
}

static int setup(void **state) {
    (void)state;
    struct stat sb;
    if (stat(cli_path(), &sb) != 0) {
        fprintf(stderr, "%s not built (run `make cli`)\n", cli_path());
        return -1; /* fails the group: a missing CLI must not pass silently */
    }
    return 0;
}

static void test_released_config(void **state) {
    (void)state;
    int st;
    json_t *d = run_inspect("--config tests/data/v41-flash-config/config.json", &st);
    assert_int_equal(st, 0);
    assert_true(json_is_true(json_object_get(d, "ok")));
    assert_true(json_is_false(json_object_get(d, "validated")));
    assert_int_equal(geti(d, "tensors.text"), 95819);
    assert_int_equal(geti(d, "tensors.vision"), 266);
    assert_int_equal(geti(d, "tensors.fp4_matrices"), 47232);
    assert_int_equal(geti(d, "bytes.text"), 509315486040LL);
    assert_int_equal(geti(d, "bytes.engram_tables"), 202758032400LL);
    assert_int_equal(geti(d, "params.engram_tables"), 196613849600LL);
    assert_int_equal(geti(d, "dtypes.I8.tensors"), 47232);
    assert_int_equal(geti(d, "families.experts.tensors"), 94464); /* (40·384 + 3·128)·6 */
    json_t *layers = json_object_get(d, "layers");
    assert_int_equal(json_array_size(layers), 43);
    json_t *l20 = json_array_get(layers, 20);
    assert_string_equal(json_string_value(json_object_get(l20, "role")), "candidate-source");
    assert_int_equal(json_integer_value(json_object_get(l20, "tensors")), 2341);
    json_t *l42 = json_array_get(layers, 42);
    assert_string_equal(json_string_value(json_object_get(l42, "name")), "mtp.2");
    assert_int_equal(json_integer_value(json_object_get(l42, "n_experts")), 128);
    json_t *cache = json_object_get(d, "cache");
    assert_true(json_real_value(json_object_get(cache, "bytes_per_token")) == 890.0); /* spec §7.2 */
    assert_string_equal(json_string_value(json_object_get(d, "engram_constants")), "published V4.1-Flash constants");
    tu_report("inspect released: %lld text tensors, %.1f cache B/token", (long long)geti(d, "tensors.text"),
              json_real_value(json_object_get(cache, "bytes_per_token")));
    json_decref(d);
}

static void test_golden_model(void **state) {
    (void)state;
    int st;
    json_t *d = run_inspect("--model tests/data/v41-tiny-sel", &st);
    assert_int_equal(st, 0);
    assert_true(json_is_true(json_object_get(d, "validated")));
    assert_int_equal(geti(d, "tensors.total"), 411);
    assert_int_equal(geti(d, "bytes.total"), 5685324);
    assert_string_equal(json_string_value(json_object_get(d, "engram_constants")), "engram_token_map.safetensors");
    const char *roles[7] = {"swa", "source", "reuse", "candidate-source", "reuse", "reindex", "dspark"};
    json_t *layers = json_object_get(d, "layers");
    for (int i = 0; i < 7; i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(layers, i), "role")), roles[i]);
    /* ratio-2 source: (head_dim/2 + head_dim/16 + idx/2 + idx/32) / 2 = (32+4+32+2)/2 */
    json_t *types = json_object_get(json_object_get(d, "cache"), "layer_types");
    int seen = 0;
    for (size_t i = 0; i < json_array_size(types); i++) {
        json_t *t = json_array_get(types, i);
        if (strcmp(json_string_value(json_object_get(t, "type")), "kv source, ratio 2") == 0) {
            assert_true(json_real_value(json_object_get(t, "bytes_per_token_per_layer")) == 35.0);
            seen = 1;
        }
    }
    assert_true(seen);
    json_decref(d);
}

static void test_failures(void **state) {
    (void)state;
    int st;
    json_t *d = run_inspect("--model /nonexistent-model-dir", &st);
    assert_int_equal(st, 1);
    assert_true(json_is_false(json_object_get(d, "ok")));
    assert_non_null(strstr(json_string_value(json_object_get(d, "error")), "/nonexistent-model-dir"));
    json_decref(d);
    d = run_inspect("--model a --config b", &st);
    assert_int_equal(st, 1);
    assert_non_null(strstr(json_string_value(json_object_get(d, "error")), "exactly one"));
    json_decref(d);
    /* a path that is not UTF-8 still gets a JSON failure document (the byte shown as '?') */
    d = run_inspect("--model /nonexistent-\xff-dir", &st);
    assert_int_equal(st, 1);
    assert_non_null(strstr(json_string_value(json_object_get(d, "error")), "/nonexistent-?-dir"));
    json_decref(d);
    /* "--config --json": the option's value is missing; --json is not taken as the value */
    d = run_inspect("--config", &st);
    assert_int_equal(st, 1);
    assert_non_null(strstr(json_string_value(json_object_get(d, "error")), "option '--config' needs a value"));
    json_decref(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_released_config),
        cmocka_unit_test(test_golden_model),
        cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
