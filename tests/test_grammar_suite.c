/* JSON Schema front-end against the official JSON-Schema-Test-Suite (Debian package
 * json-schema-test-suite, draft 7) and MaskBench (JSONSchemaBench's schemas with valid and invalid
 * instances; directory $DI_MASKBENCH_DIR, default /tmp/msb/maskbench/data, skipped when absent):
 * how many schemas compile, how many valid instances are accepted and invalid ones rejected, and
 * which refusals block the most schemas. The hard requirement is soundness: a compiled schema must never accept
 * an invalid instance (a wrong mask). Accepting only a subset of the valid instances is allowed
 * (one member order, compact spelling), and is reported.  di-test: asan */
#include <ctype.h>
#include <dirent.h>
#include <jansson.h>

#include "grammar_testlib.h"

/* MaskBench schemas that must compile (issue 6: 7,105 of 8,841 before, 7,930 after the first
 * round, 8,124 after numbers / if-then-else / not / allOf / property counts / closed oneOf branches /
 * propertyNames) */
#define MASKBENCH_FLOOR 8124
/* Under ASan/UBSan the replay is ~5x slower: check every 8th file for soundness only (no floor). */
#if defined(__SANITIZE_ADDRESS__)
#define MASKBENCH_STRIDE 8
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MASKBENCH_STRIDE 8
#endif
#endif
#ifndef MASKBENCH_STRIDE
#define MASKBENCH_STRIDE 1
#endif
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
    /* floor: 60 of 117 compiled before issue 6 (patternProperties, not, oneOf discriminators, ...), 73 after
     * the first round, 86 after the second (numbers, if/then/else, not, allOf, property counts) */
    assert_true(compiled >= 86);
    assert_int_equal(unsound, 0);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A refusal's reason without its location or names: "keyword 'not' is not supported",
 * "allOf: property '*' constrained twice". Keyword names stay, other quoted text becomes '*'. */
static void reason_of(const char *msg, char *out, size_t cap) {
    const char *p = strstr(msg, "': ");
    p = p ? p + 3 : msg;
    bool kw = !strncmp(p, "keyword '", 9) || !strncmp(p, "format '", 8) || !strncmp(p, "allOf: keyword '", 16);
    size_t n = 0;
    for (bool in_q = false; *p && n + 2 < cap; p++) {
        if (*p == '\'') {
            if (!in_q && !kw) out[n++] = '*';
            in_q = !in_q;
            out[n++] = '\'';
            kw = kw && in_q; /* only the first quoted word is the keyword */
            continue;
        }
        if (in_q && !kw) continue;
        if (isdigit((unsigned char)*p) && n && out[n - 1] == '#') continue;
        out[n++] = *p;
    }
    out[n] = 0;
    if (n > 90) out[90] = 0;
}

typedef struct reason_count {
    char reason[96];
    int n;
} reason_count;

static int cmp_reason(const void *a, const void *b) {
    const reason_count *x = a, *y = b;
    return x->n != y->n ? y->n - x->n : strcmp(x->reason, y->reason);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every MaskBench file: compile the schema (flexible whitespace, as served), replay its instances
 * compactly. Prints the refusal histogram (top 25) and asserts soundness plus the coverage floor. */
static void test_maskbench(void **state) {
    (void)state;
    const char *dir = getenv("DI_MASKBENCH_DIR");
    if (!dir) dir = "/tmp/msb/maskbench/data";
    DIR *d = opendir(dir);
    if (!d) {
        tu_report("MaskBench data not found (%s): set DI_MASKBENCH_DIR", dir);
        skip();
    }
    size_t nf = 0, capf = 0;
    char **files = NULL;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strstr(e->d_name, ".json")) continue;
        if (nf == capf) {
            capf = capf ? capf * 2 : 1024;
            files = realloc(files, capf * sizeof *files);
            assert_non_null(files);
        }
        files[nf++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(files, nf, sizeof *files, cmp_name);
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    int schemas = 0, compiled = 0, valid = 0, valid_ok = 0, invalid = 0, invalid_ok = 0, unsound = 0;
    reason_count *rc_tab = calloc(4096, sizeof *rc_tab);
    size_t nr = 0;
    assert_non_null(rc_tab);
    for (size_t f = 0; f < nf; f++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        free(files[f]);
        if (f % MASKBENCH_STRIDE) continue;
        json_error_t je;
        json_t *doc = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        json_t *sch = doc ? json_object_get(doc, "schema") : NULL;
        if (!sch) {
            json_decref(doc);
            continue;
        }
        schemas++;
        char *text = json_dumps(sch, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT);
        di_grammar *g = NULL;
        di_error err = {0};
        int rc = di_grammar_from_json_schema(text, strlen(text), NULL, &g, &err);
        free(text);
        if (rc) {
            char why[96];
            reason_of(err.msg, why, sizeof why);
            size_t i = 0;
            while (i < nr && strcmp(rc_tab[i].reason, why)) i++;
            if (i == nr && nr < 4096) snprintf(rc_tab[nr++].reason, sizeof rc_tab->reason, "%s", why);
            if (i < nr) rc_tab[i].n++;
            json_decref(doc);
            continue;
        }
        compiled++;
        json_t *tests = json_object_get(doc, "tests");
        for (size_t k = 0; k < json_array_size(tests); k++) {
            json_t *t = json_array_get(tests, k);
            char *data = json_dumps(json_object_get(t, "data"), JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT);
            int want = json_is_true(json_object_get(t, "valid"));
            int got = full_match(g, v, data);
            if (want) valid++, valid_ok += got;
            else invalid++, invalid_ok += !got;
            if (got && !want) {
                unsound++;
                print_message("UNSOUND %s: accepted %.300s\n", path, data);
            }
            free(data);
        }
        di_grammar_free(g);
        json_decref(doc);
    }
    free(files);
    qsort(rc_tab, nr, sizeof *rc_tab, cmp_reason);
    for (size_t i = 0; i < nr && i < 25; i++) tu_report("maskbench refusal %5d  %s", rc_tab[i].n, rc_tab[i].reason);
    tu_report("maskbench: %d/%d schemas compiled", compiled, schemas);
    tu_report("maskbench: valid accepted %d/%d, invalid rejected %d/%d, invalid accepted %d", valid_ok, valid, invalid_ok,
              invalid, unsound);
    free(rc_tab);
    assert_int_equal(unsound, 0);
    if (MASKBENCH_STRIDE == 1) assert_true(compiled >= MASKBENCH_FLOOR);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_official_suite), cmocka_unit_test(test_maskbench)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
