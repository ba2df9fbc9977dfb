/* `deepinfer generate` under a grammar, end to end on a tiny model with random weights
 * (`mkmodel --preset tiny`, which ships the real 129,280-token tokenizer): with random logits only
 * the mask can make the output valid, so every sample is checked twice — by the grammar engine's own
 * acceptance on a fresh matcher over a one-byte-per-token vocabulary, and by an independent checker
 * (jansson + the schema's constraints by hand, PCRE2 full match, a recursive-descent parser for the
 * GBNF language). The three languages are finite with sentences of at most 30 bytes, so the mask
 * forces EOS before --max-tokens 32 and every sample must finish with "stop". Also: a flexible-
 * whitespace schema cut by --max-tokens ("length") leaves a valid prefix, and malformed grammars fail
 * with exit 1 and a one-line reason naming the option. Runs the built CLI (build/deepinfer, or
 * $DI_CLI). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "grammar_testlib.h"
#include "testutil.h"

static const char *cli_path(void) {
    const char *p = getenv("DI_CLI");
    return p ? p : "build/deepinfer";
}

static char *g_dir;      /* temp dir: the tiny model in g_dir/m, grammar files beside it */
static char g_model[1100];
static int32_t g_eos;    /* config.json eos_token_id */

#define SCHEMA                                                                                                         \
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},"                \
    "\"c\":{\"enum\":[\"red\",\"green\",\"blue\"]}},\"required\":[\"n\",\"c\"],\"additionalProperties\":false}"
#define DATE_RE "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
/* sums / differences of at most two terms; a term is a number 1..99 or a parenthesised product */
#define ARITH                                                                                                          \
    "root ::= expr\n"                                                                                                  \
    "expr ::= term ((\"+\" | \"-\") term)?\n"                                                                          \
    "term ::= num | \"(\" num \"*\" num \")\"\n"                                                                       \
    "num  ::= [1-9] [0-9]?\n"

static int setup(void **s) {
    g_dir = tu_tmpdir("generate_grammar");
    snprintf(g_model, sizeof g_model, "%s/m", g_dir);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s mkmodel --preset tiny --out %s >/dev/null 2>&1", cli_path(), g_model);
    if (system(cmd) != 0) {
        fprintf(stderr, "`%s` failed\n", cmd);
        return -1;
    }
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", g_model);
    json_t *c = json_load_file(cfg, 0, NULL);
    if (!c || !json_is_integer(json_object_get(c, "eos_token_id"))) return -1;
    g_eos = (int32_t)json_integer_value(json_object_get(c, "eos_token_id"));
    json_decref(c);
    free(tu_write_file(g_dir, "schema.json", SCHEMA, strlen(SCHEMA)));
    free(tu_write_file(g_dir, "arith.gbnf", ARITH, strlen(ARITH)));
    return 0;
}

static int teardown(void **s) {
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

/* `deepinfer generate ARGS --json`; the document (or a failure naming the command). */
static json_t *run_generate(const char *args, int *status) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s generate %s --json 2>/dev/null", cli_path(), args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    json_error_t je;
    json_t *doc = json_loadf(f, 0, &je);
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (!doc) fail_msg("`%s` printed no JSON document (%s)", cmd, je.text);
    return doc;
}

/* ---- the grammar engine's own verdict ---- */

/* Feed text to a fresh matcher one byte per token (token b+1 = byte b, 0 = EOS): -1 if a byte is
 * rejected, else 1 when the text is a complete sentence, 0 when it is a proper prefix. */
static int engine_verdict(const di_grammar *g, const char *text, size_t len) {
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
    int r = 0;
    for (size_t i = 0; i < len && r == 0; i++)
        if (di_grammar_matcher_accept_token(m, (int32_t)(uint8_t)text[i] + 1, &err)) r = -1;
    if (r == 0) r = di_grammar_matcher_can_end(m) ? 1 : 0;
    di_grammar_matcher_free(m);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
    return r;
}

/* ---- independent checkers ---- */

/* SCHEMA by hand: an object with exactly n (integer 0..99) and c (one of the enum); compact, so no
 * whitespace anywhere. */
static bool schema_valid(const char *text, size_t len) {
    if (strcspn(text, " \t\r\n") != len) return false;
    json_t *o = json_loadb(text, len, 0, NULL);
    bool ok = json_is_object(o) && json_object_size(o) == 2;
    json_t *n = json_object_get(o, "n"), *c = json_object_get(o, "c");
    ok = ok && json_is_integer(n) && json_integer_value(n) >= 0 && json_integer_value(n) <= 99;
    const char *cs = json_is_string(c) ? json_string_value(c) : "";
    ok = ok && (!strcmp(cs, "red") || !strcmp(cs, "green") || !strcmp(cs, "blue"));
    json_decref(o);
    return ok;
}

/* PCRE2 match of the whole text (anchored at both ends, as the grammar engine anchors regexes). */
static bool regex_full_match(const char *re, const char *text, size_t len) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF,
                                     &ec, &eo, NULL);
    assert_non_null(code);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int rc = pcre2_match(code, (PCRE2_SPTR)text, len, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    return rc >= 0;
}

/* ARITH by recursive descent. */
static bool arith_num(const char **p) {
    if (**p < '1' || **p > '9') return false;
    (*p)++;
    if (**p >= '0' && **p <= '9') (*p)++;
    return true;
}
static bool arith_term(const char **p) {
    if (**p != '(') return arith_num(p);
    (*p)++;
    if (!arith_num(p) || *(*p)++ != '*' || !arith_num(p)) return false;
    return *(*p)++ == ')';
}
static bool arith_valid(const char *text, size_t len) {
    if (strlen(text) != len) return false;
    const char *p = text;
    if (!arith_term(&p)) return false;
    if (*p == '+' || *p == '-') {
        p++;
        if (!arith_term(&p)) return false;
    }
    return *p == 0;
}

/* ---- the samples ---- */

typedef bool (*checker)(const char *re, const char *text, size_t len);
static bool check_schema(const char *unused, const char *t, size_t n) { return schema_valid(t, n); }
static bool check_regex(const char *re, const char *t, size_t n) { return regex_full_match(re, t, n); }
static bool check_arith(const char *unused, const char *t, size_t n) { return arith_valid(t, n); }

/* One generation with option OPT under grammar g: finishes with EOS ("stop"), the text (output
 * ids minus the EOS) is complete for the engine and valid for the independent checker. Returns the
 * malloc'd text. */
static char *sample_one(const char *opt, double temperature, int seed, const di_grammar *g, checker ok,
                        const char *re) {
    char args[3000];
    snprintf(args, sizeof args, "--model %s --prompt 'Answer:' %s --max-tokens 32 --temperature %g --seed %d --threads 2",
             g_model, opt, temperature, seed);
    int st;
    json_t *doc = run_generate(args, &st);
    assert_int_equal(st, 0);
    json_t *ids = json_object_get(doc, "output_ids");
    const char *text = json_string_value(json_object_get(doc, "output_text"));
    size_t len = json_string_length(json_object_get(doc, "output_text"));
    const char *finish = json_string_value(json_object_get(doc, "finish_reason"));
    if (!text || !finish) fail_msg("generate %s: no output_text / finish_reason", args);
    size_t n = json_array_size(ids);
    char *shown = json_dumps(json_object_get(doc, "output_text"), JSON_ENCODE_ANY);
    tu_report("%s T=%g seed %d: %zu tokens, finish %s, mask %.0f us: %s", opt, temperature, seed, n, finish,
              json_real_value(json_object_get(doc, "grammar_mask_us_mean")), shown);
    free(shown);
    /* finite language of ≤ 30-byte sentences: EOS must come before the 32-token cap */
    assert_string_equal(finish, "stop");
    assert_true(json_is_true(json_object_get(doc, "grammar_complete")));
    assert_in_range(n, 2, 32);
    assert_int_equal(json_integer_value(json_array_get(ids, n - 1)), g_eos);
    for (size_t i = 0; i + 1 < n; i++) assert_int_not_equal(json_integer_value(json_array_get(ids, i)), g_eos);
    if (engine_verdict(g, text, len) != 1) fail_msg("%s: output \"%s\" is not a complete sentence for the grammar", opt, text);
    if (!ok(re, text, len)) fail_msg("%s: output \"%s\" fails the independent check", opt, text);
    char *r = strdup(text);
    json_decref(doc);
    return r;
}

/* Seeds 1..n_seeds (2 or 3) at temperature 1, then greedy; the seeded samples must not all agree
 * (the mask leaves a choice, and the sampler takes it). */
static void sample_all(const char *opt, int n_seeds, const di_grammar *g, checker ok, const char *re) {
    char *t[4];
    for (int i = 0; i < n_seeds; i++) t[i] = sample_one(opt, 1.0, i + 1, g, ok, re);
    t[n_seeds] = sample_one(opt, 0.0, 0, g, ok, re);
    assert_true(strcmp(t[0], t[1]) || (n_seeds == 3 && strcmp(t[0], t[2])));
    for (int i = 0; i <= n_seeds; i++) free(t[i]);
}

static void test_json_schema(void **s) {
    di_grammar *g = NULL;
    di_error err = {0};
    di_json_schema_opts jo = {.whitespace = DI_JSON_WS_COMPACT};
    assert_int_equal(di_grammar_from_json_schema(SCHEMA, strlen(SCHEMA), &jo, &g, &err), DI_OK);
    char opt[1300];
    snprintf(opt, sizeof opt, "--json-schema %s/schema.json --json-whitespace compact", g_dir);
    sample_all(opt, 3, g, check_schema, NULL);
    di_grammar_free(g);
}

static void test_regex(void **s) {
    di_grammar *g = NULL;
    di_error err = {0};
    assert_int_equal(di_grammar_from_regex(DATE_RE, strlen(DATE_RE), &g, &err), DI_OK);
    sample_all("--regex '" DATE_RE "'", 2, g, check_regex, DATE_RE);
    di_grammar_free(g);
}

static void test_gbnf(void **s) {
    di_grammar *g = NULL;
    di_error err = {0};
    assert_int_equal(di_grammar_from_ebnf(ARITH, strlen(ARITH), NULL, &g, &err), DI_OK);
    char opt[1300];
    snprintf(opt, sizeof opt, "--grammar %s/arith.gbnf", g_dir);
    sample_all(opt, 2, g, check_arith, NULL);
    di_grammar_free(g);
}

/* Flexible whitespace and an unbounded integer: 6 tokens cannot be relied on to complete, so the
 * output stops at the cap with "length" and no EOS; its text must still be a valid prefix, and
 * "grammar_complete" must be the engine's verdict on it. */
static void test_length_prefix(void **s) {
    static const char schema[] = "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},\"required\":[\"k\"]}";
    free(tu_write_file(g_dir, "open.json", schema, strlen(schema)));
    di_grammar *g = NULL;
    di_error err = {0};
    assert_int_equal(di_grammar_from_json_schema(schema, strlen(schema), NULL, &g, &err), DI_OK);
    char args[3000];
    snprintf(args, sizeof args, "--model %s --prompt 'x' --json-schema %s/open.json --max-tokens 6 --temperature 1 --seed 7 --threads 2",
             g_model, g_dir);
    int st;
    json_t *doc = run_generate(args, &st);
    assert_int_equal(st, 0);
    const char *text = json_string_value(json_object_get(doc, "output_text"));
    assert_non_null(text);
    size_t len = json_string_length(json_object_get(doc, "output_text"));
    json_t *ids = json_object_get(doc, "output_ids");
    bool complete = json_is_true(json_object_get(doc, "grammar_complete"));
    char *shown = json_dumps(json_object_get(doc, "output_text"), JSON_ENCODE_ANY);
    tu_report("length cap: 6 tokens, complete %d, text %s", complete, shown);
    free(shown);
    assert_string_equal(json_string_value(json_object_get(doc, "finish_reason")), "length");
    assert_int_equal(json_array_size(ids), 6);
    for (size_t i = 0; i < 6; i++) assert_int_not_equal(json_integer_value(json_array_get(ids, i)), g_eos);
    int v = engine_verdict(g, text, len);
    assert_int_not_equal(v, -1);
    assert_int_equal(v, complete ? 1 : 0);
    /* independent: an incomplete prefix is not yet a JSON document */
    json_t *parsed = json_loadb(text, len, 0, NULL);
    if (!complete) assert_null(parsed);
    json_decref(parsed);
    json_decref(doc);
    di_grammar_free(g);
}

/* Bad grammars: exit 1, {"ok": false} with a one-line error naming the option and the cause. */
static void expect_error(const char *args, const char *want1, const char *want2) {
    int st;
    json_t *doc = run_generate(args, &st);
    assert_int_equal(st, 1);
    assert_true(json_is_false(json_object_get(doc, "ok")));
    const char *e = json_string_value(json_object_get(doc, "error"));
    assert_non_null(e);
    tu_report("error: %s", e);
    assert_null(strchr(e, '\n'));
    if (!strstr(e, want1) || !strstr(e, want2)) fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", e, want1, want2);
    json_decref(doc);
}

static void test_errors(void **s) {
    static const char bad_schema[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"frob\"}}}";
    static const char bad_gbnf[] = "root ::= \"a\" undefined_rule\n";
    free(tu_write_file(g_dir, "bad.json", bad_schema, strlen(bad_schema)));
    free(tu_write_file(g_dir, "bad.gbnf", bad_gbnf, strlen(bad_gbnf)));
    char a[3000];
    snprintf(a, sizeof a, "--model %s --prompt x --regex '(ab'", g_model);
    expect_error(a, "--regex \"(ab\"", "regex");
    snprintf(a, sizeof a, "--model %s --prompt x --json-schema %s/bad.json", g_model, g_dir);
    expect_error(a, "--json-schema", "frob");
    snprintf(a, sizeof a, "--model %s --prompt x --json-schema %s/arith.gbnf", g_model, g_dir);
    expect_error(a, "--json-schema", "not JSON");
    snprintf(a, sizeof a, "--model %s --prompt x --grammar %s/bad.gbnf", g_model, g_dir);
    expect_error(a, "--grammar", "undefined_rule");
    snprintf(a, sizeof a, "--model %s --prompt x --grammar %s/missing.gbnf", g_model, g_dir);
    expect_error(a, "--grammar", "cannot open");
    snprintf(a, sizeof a, "--model %s --prompt x --regex a --grammar %s/arith.gbnf", g_model, g_dir);
    expect_error(a, "mutually exclusive", "--regex");
    snprintf(a, sizeof a, "--model %s --prompt x --regex a --force-output-ids 5", g_model);
    expect_error(a, "--regex", "--force-output-ids");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_schema), cmocka_unit_test(test_regex), cmocka_unit_test(test_gbnf),
        cmocka_unit_test(test_length_prefix), cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
