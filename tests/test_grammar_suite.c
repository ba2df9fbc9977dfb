/* JSON Schema front-end against the official JSON-Schema-Test-Suite (Debian package
 * json-schema-test-suite, draft 7): how many schemas compile, how many valid instances are accepted
 * and invalid ones rejected. The hard requirement is soundness: a compiled schema must never accept
 * an invalid instance (a wrong mask). Accepting only a subset of the valid instances is allowed
 * (one member order, compact spelling), and is reported.  di-test: asan */
#include <dirent.h>
#include <jansson.h>

#include "grammar_testlib.h"

#define SUITE_DIR "/usr/share/json-schema-test-suite/tests/draft7"

static int full_match(const di_grammar *g, const di_grammar_vocab *v, const char *s) {
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
    int r = 1;
    for (const char *p = s; *p && r; p++) {
        int rc = di_grammar_matcher_accept_token(m, (uint8_t)*p + 1, &err);
        if (rc == DI_ERR_INVALID) r = 0;
        else if (rc) fail_msg("accept: %s", err.msg);
    }
    if (r && !di_grammar_matcher_can_end(m)) r = 0;
    di_grammar_matcher_free(m);
    return r;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_official_suite(void **state) {
    (void)state;
    DIR *d = opendir(SUITE_DIR);
    if (!d) {
        tu_report("JSON-Schema-Test-Suite not installed (%s): apt-get install json-schema-test-suite", SUITE_DIR);
        skip();
    }
    char *files[128];
    size_t nf = 0;
    for (struct dirent *e; (e = readdir(d)) && nf < 128;)
        if (strstr(e->d_name, ".json") && strcmp(e->d_name, "refRemote.json")) files[nf++] = strdup(e->d_name);
    closedir(d);
    qsort(files, nf, sizeof *files, cmp_str);
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    int schemas = 0, compiled = 0, valid = 0, valid_ok = 0, invalid = 0, invalid_ok = 0, unsound = 0;
    int unsupported = 0, other_err = 0;
    for (size_t f = 0; f < nf; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", SUITE_DIR, files[f]);
        json_error_t je;
        json_t *groups = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!groups) { /* e.g. integers beyond int64 that jansson refuses */
            tu_report("suite file %s skipped: %s", files[f], je.text);
            continue;
        }
        for (size_t gi = 0; gi < json_array_size(groups); gi++) {
            json_t *grp = json_array_get(groups, gi);
            char *schema = json_dumps(json_object_get(grp, "schema"), JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
            schemas++;
            di_grammar *g = NULL;
            di_error err = {0};
            di_json_schema_opts o = {.whitespace = DI_JSON_WS_COMPACT};
            int rc = di_grammar_from_json_schema(schema, strlen(schema), &o, &g, &err);
            free(schema);
            if (rc) {
                if (rc == DI_ERR_UNSUPPORTED) unsupported++;
                else {
                    other_err++;
                    print_message("error %s / %s: %s\n", files[f], json_string_value(json_object_get(grp, "description")), err.msg);
                }
                continue;
            }
            compiled++;
            json_t *tests = json_object_get(grp, "tests");
            for (size_t ti = 0; ti < json_array_size(tests); ti++) {
                json_t *t = json_array_get(tests, ti);
                char *data = json_dumps(json_object_get(t, "data"), JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
                int want = json_is_true(json_object_get(t, "valid"));
                int got = full_match(g, v, data);
                if (want) valid++, valid_ok += got;
                else invalid++, invalid_ok += !got;
                if (got && !want) {
                    unsound++;
                    print_message("UNSOUND %s / %s / %s: accepted %s\n", files[f],
                                  json_string_value(json_object_get(grp, "description")),
                                  json_string_value(json_object_get(t, "description")), data);
                }
                free(data);
            }
            di_grammar_free(g);
        }
        json_decref(groups);
        free(files[f]);
    }
    tu_report("suite draft7: %d/%d schemas compiled (%d unsupported, %d other errors)", compiled, schemas, unsupported,
              other_err);
    tu_report("suite draft7: valid accepted %d/%d, invalid rejected %d/%d, invalid accepted %d", valid_ok, valid,
              invalid_ok, invalid, unsound);
    assert_true(compiled > schemas / 3);
    assert_int_equal(unsound, 0);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_official_suite)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
