/* EBNF (GBNF/Lark-lite) and JSON Schema front-ends: acceptance of valid and invalid texts,
 * masks against brute force, clear errors, hostile inputs.  di-test: asan */
#include <time.h>

#include "grammar/earley.h"
#include "grammar/grammar_impl.h"
#include "grammar_testlib.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: bounds must not depend on machine load */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1: complete match, 0: rejected or incomplete. Uses the single-byte tokens (id = byte + 1). */
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

typedef struct tcase {
    const char *text;
    int valid;
} tcase;

static void check_cases(const di_grammar *g, const di_grammar_vocab *v, const tcase *cs, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        int got = full_match(g, v, cs[i].text);
        if (got != cs[i].valid) fail_msg("%s: '%s' expected %s", what, cs[i].text, cs[i].valid ? "accepted" : "rejected");
    }
}

static di_grammar *ebnf_or_fail(const char *src) {
    di_grammar *g = NULL;
    di_error err = {0};
    if (di_grammar_from_ebnf(src, strlen(src), NULL, &g, &err)) fail_msg("ebnf: %s", err.msg);
    return g;
}

static di_grammar *schema_or_fail(const char *src, di_json_ws ws) {
    di_grammar *g = NULL;
    di_error err = {0};
    di_json_schema_opts o = {.whitespace = ws};
    if (di_grammar_from_json_schema(src, strlen(src), &o, &g, &err)) fail_msg("schema %s: %s", src, err.msg);
    return g;
}

static const char *k_arith =
    "# arithmetic, GBNF\n"
    "root ::= expr\n"
    "expr ::= term ((\"+\" | \"-\") term)*\n"
    "term ::= factor (\"*\" factor)*\n"
    "factor ::= num | \"(\" expr \")\" | \"-\" factor\n"
    "num ::= [0-9]+ (\".\" [0-9]+)?\n";

static const char *k_json_gbnf =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n  \"{\" ws (\n    string \":\" ws value\n    (\",\" ws string \":\" ws value)*\n  )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *k_lark =
    "// Lark-style\n"
    "start: greeting name+ \"!\"?\n"
    "greeting: \"hello\" | 'hi'\n"
    "name: / [A-Z][a-z]*/\n"
    "?unused: \"x\" ~ 2..3\n";

static void test_ebnf_accept(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = ebnf_or_fail(k_arith);
    const tcase arith[] = {{"1+2*3", 1}, {"(1+2)*-3.5", 1}, {"((2))", 1}, {"1+", 0}, {"(1", 0}, {"1..2", 0}, {"", 0}, {"1*(2+3)-4", 1}};
    check_cases(g, v, arith, sizeof arith / sizeof arith[0], "arith");
    di_grammar_free(g);
    g = ebnf_or_fail(k_json_gbnf);
    const tcase json[] = {{"{}", 1}, {"{\"a\": [1, 2.5, true, null]}", 1}, {"{\"a\":{\"b\":\"\\u00e9\"}}", 1},
                          {"{\"a\" 1}", 0}, {"[1]", 0}, {"{\"a\":01}", 0}, {"{\"a\":tru}", 0}};
    check_cases(g, v, json, sizeof json / sizeof json[0], "json.gbnf");
    di_grammar_free(g);
    di_grammar *lg = NULL;
    di_error err = {0};
    if (di_grammar_from_ebnf(k_lark, strlen(k_lark), "start", &lg, &err)) fail_msg("lark: %s", err.msg);
    const tcase lark[] = {{"hello Ann Bo!", 1}, {"hi Zed", 1}, {"hello", 0}, {"hello ann", 0}, {"hey Ann", 0}};
    check_cases(lg, v, lark, sizeof lark / sizeof lark[0], "lark");
    di_grammar_free(lg);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static void expect_ebnf_error(const char *src, const char *needle) {
    di_grammar *g = NULL;
    di_error err = {0};
    if (di_grammar_from_ebnf(src, strlen(src), NULL, &g, &err) == DI_OK) fail_msg("grammar compiled: %s", src);
    assert_null(g);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

static void test_ebnf_errors(void **state) {
    (void)state;
    expect_ebnf_error("root ::= foo", "'foo' is used but not defined");
    expect_ebnf_error("start ::= \"a\"", "no 'root' rule");
    expect_ebnf_error("root ::= \"abc", "unterminated string");
    expect_ebnf_error("root ::= [a-", "unterminated character class");
    expect_ebnf_error("root ::= (\"a\"", "missing ')'");
    expect_ebnf_error("root ::= \"a\" )", "line 1 col 14");
    expect_ebnf_error("root ::= \"a\"\nroot ::= \"b\"", "line 2");
    expect_ebnf_error("root ::= /a(?=b)/", "look-ahead");
    expect_ebnf_error("root ::= x\nx ::= x", "unproductive");
    expect_ebnf_error("", "empty grammar");
    expect_ebnf_error("%import common.WS\nroot ::= \"a\"", "expected a rule definition");
    expect_ebnf_error("root ::= \"a\"{3,1}", "n < m");
    char *deep = malloc(4000);
    strcpy(deep, "root ::= ");
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    expect_ebnf_error(deep, "nested too deeply");
    free(deep);
}

static void test_ebnf_masks(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(400);
    di_grammar_vocab *v = gt_vocab(&tb);
    const char *gs[] = {k_arith, k_json_gbnf};
    int checked = 0;
    for (size_t i = 0; i < 2; i++) {
        di_grammar *g = ebnf_or_fail(gs[i]);
        for (uint64_t s = 1; s <= 5; s++) checked += gt_walk(g, v, &tb, NULL, s * 104729, 40, gs[i]);
        di_grammar_free(g);
    }
    tu_report("EBNF masks checked against brute force: %d", checked);
    assert_true(checked > 100);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Right recursion (`f ::= "-" f`): every "-" adds a set whose only item waiting on f ends its
 * rule, so all depths have one future and must share one state key (matcher.c: leo_effect);
 * before, each depth was a new state, and a vocabulary with runs of 80 dashes learned 80 states
 * per mask. After the second dash every mask must come from the mask cache, equal brute force,
 * and survive a rollback; nesting by parentheses must still give different states (the number
 * of ")" differs), and a chain that ends inside parentheses must still close them. */
static void test_right_recursion(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(1000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = ebnf_or_fail("root ::= f\nf ::= \"-\" f | \"x\" | \"(\" f \")\" | \"(\" f \"+\" f \")\"\n");
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    const char *text = "(--(----x+--x)+--";
    uint64_t hits_at_dash[32] = {0};
    for (size_t i = 0; text[i]; i++) {
        if (di_grammar_matcher_accept_token(m, (uint8_t)text[i] + 1, &err)) fail_msg("accept: %s", err.msg);
        uint64_t h0, h1, miss;
        di_grammar_matcher_cache_stats(m, &h0, &miss);
        if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("mask: %s", err.msg);
        di_grammar_matcher_cache_stats(m, &h1, &miss);
        gt_check_mask(m, v, mask, (const uint8_t *const *)tb.b, tb.l, "right recursion");
        hits_at_dash[i] = h1 - h0;
    }
    /* "(--(----": positions 2 (second dash after "(") and 5..7 (dashes 2-4 after the inner "(")
     * repeat a state; position 3 (the inner "(") and 4 (its first dash) are new */
    assert_int_equal(hits_at_dash[2], 1);
    assert_int_equal(hits_at_dash[5], 1);
    assert_int_equal(hits_at_dash[6], 1);
    assert_int_equal(hits_at_dash[7], 1);
    assert_int_equal(hits_at_dash[3], 0);
    /* after "+" (inner and outer construct) the second dash repeats its own state */
    assert_int_equal(hits_at_dash[11], 1);
    assert_int_equal(hits_at_dash[16], 1);
    if (di_grammar_matcher_rollback(m, 6, &err)) fail_msg("rollback: %s", err.msg);
    if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("mask: %s", err.msg);
    gt_check_mask(m, v, mask, (const uint8_t *const *)tb.b, tb.l, "right recursion after rollback");
    for (const char *p = "x))"; *p; p++)
        if (di_grammar_matcher_accept_token(m, (uint8_t)*p + 1, &err)) fail_msg("accept %c: %s", *p, err.msg);
    assert_true(di_grammar_matcher_can_end(m));
    if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("mask: %s", err.msg);
    gt_check_mask(m, v, mask, (const uint8_t *const *)tb.b, tb.l, "right recursion closed");
    int checked = 0;
    for (uint64_t s = 1; s <= 4; s++) checked += gt_walk(g, v, &tb, NULL, s * 7919, 40, "right recursion walk");
    tu_report("right recursion: %d random-walk masks checked", checked);
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A value after "[" and after "[ " (optional space) completes the same waiters, so its states
 * must share context-free keys (matcher.c: leff): the walk after "[[ " then follows the
 * transitions the walk after "[[" learned for "true", "false", "[" instead of pushing them again.
 * Before, the root set's items waiting on the space kept the two apart. */
static void test_pruned_effects(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(1000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = ebnf_or_fail("root ::= \"[\" ws value \"]\"\nws ::= \" \"?\n"
                                 "value ::= \"true\" | \"false\" | \"null\" | \"[\" ws value \"]\"\n");
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    uint64_t pushes[3] = {0};
    const char *text = "[[ ";
    for (int i = 0; i < 3; i++) {
        if (di_grammar_matcher_accept_token(m, (uint8_t)text[i] + 1, &err)) fail_msg("accept: %s", err.msg);
        di_grammar_walk_stats a, b;
        di_grammar_matcher_walk_stats(m, &a);
        if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("mask: %s", err.msg);
        di_grammar_matcher_walk_stats(m, &b);
        gt_check_mask(m, v, mask, (const uint8_t *const *)tb.b, tb.l, "pruned effects");
        pushes[i] = b.pushes - a.pushes;
    }
    tu_report("pruned effects: pushes after \"[\" %llu, \"[[\" %llu, \"[[ \" %llu", (unsigned long long)pushes[0],
              (unsigned long long)pushes[1], (unsigned long long)pushes[2]);
    assert_true(pushes[2] * 2 < pushes[1]); /* 6 of 24; 17 when the whole root set is hashed */
    /* full keys too (the mask cache's): "[t" and "[ t" are one state, the second mask a hit */
    for (int k = 0; k < 2; k++) {
        di_grammar_matcher *m2 = NULL;
        if (di_grammar_matcher_new(g, v, NULL, &m2, &err)) fail_msg("matcher: %s", err.msg);
        for (const char *p = k ? "[ t" : "[t"; *p; p++)
            if (di_grammar_matcher_accept_token(m2, (uint8_t)*p + 1, &err)) fail_msg("accept: %s", err.msg);
        if (di_grammar_matcher_fill_mask(m2, mask, &err)) fail_msg("mask: %s", err.msg);
        gt_check_mask(m2, v, mask, (const uint8_t *const *)tb.b, tb.l, "pruned effects, full keys");
        uint64_t hits, misses;
        di_grammar_matcher_cache_stats(m2, &hits, &misses);
        assert_int_equal(hits, (uint64_t)k);
        di_grammar_matcher_free(m2);
    }
    int checked = 0;
    for (uint64_t s = 1; s <= 12; s++) checked += gt_walk(g, v, &tb, NULL, s * 7907, 40, "pruned effects walk");
    tu_report("pruned effects: %d random-walk masks checked", checked);
    assert_true(checked >= 36); /* each walk checks at least its first "[", a value and the closing "]" */
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Empty arrays and objects are written open ws_pair close (json_schema.c: bracketed), the same
 * language as open ws ws close (up to 32 whitespace bytes with the default run of 16) without
 * letting each byte split between the two runs; the Earley sets along the run must stay small. */
static void test_empty_brackets(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    static const char *schemas[] = {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}",
                                    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}",
                                    "{\"type\":\"array\",\"items\":{}}"};
    static const char open[] = "[{[", close[] = "]}]";
    char buf[128];
    size_t largest = 0;
    for (size_t i = 0; i < 3; i++) {
        di_grammar *g = schema_or_fail(schemas[i], DI_JSON_WS_FLEXIBLE);
        for (int n = 0; n <= 33; n++) { /* open, n spaces / newlines / tabs, close */
            int k = 0;
            buf[k++] = open[i];
            for (int j = 0; j < n; j++) buf[k++] = " \n\t\r"[j % 4];
            buf[k++] = close[i];
            buf[k] = 0;
            assert_int_equal(full_match(g, v, buf), n <= 32);
        }
        const char *ok[] = {"[ 1 ,2 ]", "{ \"a\" : 1 }", "[ [ ] , { } ,[1] ]"}, *bad[] = {"[ , ]", "{ , }", "[ [ ] , ]"};
        assert_int_equal(full_match(g, v, ok[i]), 1);
        assert_int_equal(full_match(g, v, bad[i]), 0);
        di_earley e;
        di_error err = {0};
        if (di_earley_init(&e, g->cfg, &err)) fail_msg("%s", err.msg);
        assert_int_equal(di_earley_push(&e, (uint8_t)open[i], &err), 1);
        for (int j = 0; j < 32; j++) {
            assert_int_equal(di_earley_push(&e, ' ', &err), 1);
            size_t items = e.set_off[e.n_sets] - e.set_off[e.n_sets - 1];
            if (items > largest) largest = items;
        }
        tu_report("empty brackets: %s: largest Earley set along 32 whitespace bytes so far: %zu items", schemas[i], largest);
        di_earley_free(&e);
        di_grammar_free(g);
    }
    assert_true(largest <= 60); /* 24, 24, 46 here; 118, 118, 134 with open ws ws close */
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static const char *k_person =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",1,null]},\"maxItems\":3},"
    "\"kind\":{\"const\":\"x\"},"
    "\"email\":{\"type\":\"string\",\"format\":\"email\"}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

static void test_schema_accept(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = schema_or_fail(k_person, DI_JSON_WS_COMPACT);
    const tcase person[] = {
        {"{\"name\":\"a\",\"age\":3}", 1},
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"a\",1,null]}", 1},
        {"{\"name\":\"a\",\"age\":3,\"tags\":[\"a\",1,null,\"b\"]}", 0},  /* maxItems */
        {"{\"name\":\"\",\"age\":3}", 0},                              /* minLength */
        {"{\"name\":\"abcdefghi\",\"age\":3}", 0},                     /* maxLength */
        {"{\"name\":\"a\",\"age\":-3}", 0},                            /* minimum 0 */
        {"{\"name\":\"a\"}", 0},                                       /* required */
        {"{\"name\":\"a\",\"age\":3,\"kind\":\"x\"}", 1},
        {"{\"name\":\"a\",\"age\":3,\"kind\":\"y\"}", 0},
        {"{\"name\":\"a\",\"age\":3,\"zzz\":1}", 0},                   /* additionalProperties */
        {"{\"name\":\"a\",\"age\":3,\"email\":\"x.y@ex.com\"}", 1},
        {"{\"name\":\"a\",\"age\":3,\"email\":\"nope\"}", 0},
        {"{\"name\":\"\\u00e9\\n\",\"age\":0}", 1},
        {"{ \"name\":\"a\",\"age\":3}", 0},                            /* compact: no whitespace */
    };
    check_cases(g, v, person, sizeof person / sizeof person[0], "person");
    di_grammar_free(g);

    g = schema_or_fail(k_person, DI_JSON_WS_FLEXIBLE);
    const tcase flex[] = {{"{ \"name\" : \"a\",\n  \"age\": 3 }", 1}, {" {\"name\":\"a\",\"age\":3}\n", 1}, {"{\"name\":\"a\" \"age\":3}", 0}};
    check_cases(g, v, flex, sizeof flex / sizeof flex[0], "person/flexible");
    di_grammar_free(g);

    /* recursion through $ref, anyOf, prefixItems, pattern, additionalProperties schema */
    const char *tree =
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
        "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    g = schema_or_fail(tree, DI_JSON_WS_COMPACT);
    const tcase tr[] = {{"{\"v\":1}", 1}, {"{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}", 1}, {"{\"v\":1,\"kids\":[{}]}", 0}, {"{\"kids\":[]}", 0}};
    check_cases(g, v, tr, sizeof tr / sizeof tr[0], "tree");
    di_grammar_free(g);

    const char *misc =
        "{\"type\":\"object\",\"properties\":{"
        "\"p\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"},{\"type\":\"null\"}],\"items\":false},"
        "\"u\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"string\",\"pattern\":\"^[a-c]+$\"}]},"
        "\"s\":{\"type\":\"string\",\"pattern\":\"ab\"},"
        "\"q\":{\"type\":[\"string\",\"null\"]}},"
        "\"additionalProperties\":{\"type\":\"integer\"}}";
    g = schema_or_fail(misc, DI_JSON_WS_COMPACT);
    const tcase mc[] = {{"{}", 1},
                        {"{\"p\":[true,null]}", 1},
                        {"{\"p\":[true]}", 1},
                        {"{\"p\":[true,null,1]}", 0},
                        {"{\"p\":[null]}", 0},
                        {"{\"u\":-1.5e3}", 1},
                        {"{\"u\":\"abc\"}", 1},
                        {"{\"u\":\"abd\"}", 0},
                        {"{\"s\":\"xxabyy\"}", 1},
                        {"{\"s\":\"xxbayy\"}", 0},
                        {"{\"q\":null,\"zz\":5}", 1},
                        {"{\"zz\":\"no\"}", 0}};
    check_cases(g, v, mc, sizeof mc / sizeof mc[0], "misc");
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Keywords added for issue 6 (JSON Schema coverage): each compiles to a subset of the valid
 * instances and rejects every invalid one listed. */
static void test_schema_coverage(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    struct {
        const char *schema;
        tcase cases[8];
    } k[] = {
        /* patternProperties with additionalProperties false: keys must match a pattern */
        {"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"patternProperties\":{\"^x-\":{\"type\":\"string\"}},"
         "\"additionalProperties\":false}",
         {{"{\"id\":1,\"x-a\":\"s\"}", 1}, {"{\"x-a\":\"s\",\"x-b\":\"t\"}", 1}, {"{\"x-a\":1}", 0}, {"{\"y\":\"s\"}", 0},
          {"{\"id\":\"s\"}", 0}, {"{}", 1}}},
        /* patternProperties with a non-trivial schema and open additionalProperties: only pattern keys extra */
        {"{\"type\":\"object\",\"patternProperties\":{\"^[0-9]+$\":{\"type\":\"boolean\"}}}",
         {{"{\"12\":true}", 1}, {"{\"12\":1}", 0}, {"{\"1a\":true}", 0 /* valid, but free keys are left out beside a non-trivial pattern: a subset */}, {"{}", 1}}},
        /* trivial patterns beside an additionalProperties schema */
        {"{\"type\":\"object\",\"patternProperties\":{\"^x-\":{}},\"additionalProperties\":{\"type\":\"integer\"}}",
         {{"{\"x-a\":\"s\"}", 1}, {"{\"b\":2}", 1}, {"{\"b\":\"s\"}", 0}}},
        /* required name governed by a pattern */
        {"{\"type\":\"object\",\"patternProperties\":{\"^n\":{\"type\":\"null\"}},\"required\":[\"name\"],"
         "\"additionalProperties\":false}",
         {{"{\"name\":null}", 1}, {"{\"name\":1}", 0}, {"{}", 0}}},
        /* minProperties 1 without required names; maxProperties implied by a closed list */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},\"minProperties\":1,"
         "\"maxProperties\":2,\"additionalProperties\":false}",
         {{"{}", 0}, {"{\"a\":1}", 1}, {"{\"b\":1}", 1}, {"{\"a\":1,\"b\":2}", 1}, {"{\"c\":1}", 0}}},
        {"{\"type\":\"object\",\"minProperties\":1}", {{"{}", 0}, {"{\"z\":[]}", 1}}},
        /* oneOf: disjoint by a const discriminator, by enum vs pattern, by type through $ref */
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"k\"]},"
         "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"k\"]}]}",
         {{"{\"k\":\"a\",\"x\":1}", 1}, {"{\"k\":\"b\",\"y\":\"s\"}", 1}, {"{\"k\":\"a\",\"x\":\"s\"}", 0}, {"{\"k\":\"c\"}", 0}}},
        {"{\"oneOf\":[{\"type\":\"string\",\"enum\":[\"auto\",\"none\"]},{\"type\":\"string\",\"pattern\":\"^[0-9]+px$\"}]}",
         {{"\"auto\"", 1}, {"\"12px\"", 1}, {"\"px\"", 0}, {"\"autox\"", 0}}},
        {"{\"$defs\":{\"n\":{\"type\":\"integer\"}},\"oneOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":\"null\"}]}",
         {{"3", 1}, {"null", 1}, {"\"3\"", 0}}},
        /* oneOf of required lists: each branch forbids a name another requires (exactly one) */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
         "\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}",
         {{"{\"a\":1}", 1}, {"{\"b\":1}", 1}, {"{\"a\":1,\"b\":2}", 0}, {"{}", 0}, {"{\"a\":\"s\"}", 0}}},
        /* allOf parts constraining one property: the property takes allOf of both */
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},"
         "{\"properties\":{\"a\":{\"minimum\":3}},\"required\":[\"a\"]}]}",
         {{"{\"a\":3}", 1}, {"{\"a\":2}", 0}, {"{\"a\":3.5}", 0}, {"{}", 0}}},
        /* $ref with constraining siblings: both hold */
        {"{\"$defs\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},\"$ref\":\"#/$defs/a\",\"maxItems\":2,"
         "\"x-annotation\":1}",
         {{"[1,2]", 1}, {"[1,2,3]", 0}, {"[\"a\"]", 0}}},
        /* dependentRequired / dependencies (names become required: a subset) */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
         "\"dependentRequired\":{\"a\":[\"b\"]}}",
         {{"{\"a\":1,\"b\":2}", 1}, {"{\"a\":1}", 0}, {"{\"b\":2}", 1}}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],"
         "\"dependencies\":{\"a\":{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}}}",
         {{"{\"a\":1,\"b\":\"s\"}", 1}, {"{\"a\":1}", 0}, {"{\"a\":1,\"b\":2}", 0}}},
        /* not: type, required, enum beside enum */
        {"{\"not\":{\"type\":[\"string\",\"object\",\"array\",\"null\"]}}",
         {{"1", 1}, {"1.5", 1}, {"true", 1}, {"\"s\"", 0}, {"null", 0}, {"{}", 0}}},
        {"{\"type\":\"object\",\"not\":{\"required\":[\"secret\"]}}", {{"{\"a\":1}", 1}, {"{\"secret\":1}", 0}}},
        {"{\"enum\":[\"a\",\"b\",\"c\"],\"not\":{\"enum\":[\"b\"]}}", {{"\"a\"", 1}, {"\"c\"", 1}, {"\"b\"", 0}}},
        /* length bounds beside patterns: implied minimum, single-atom counts */
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]{3}\",\"minLength\":2}", {{"\"abc\"", 1}, {"\"abcd9\"", 1}, {"\"ab\"", 0}}},
        {"{\"type\":\"string\",\"pattern\":\"^[a-z0-9]+$\",\"maxLength\":3}",
         {{"\"a1\"", 1}, {"\"abc\"", 1}, {"\"abcd\"", 0}, {"\"\"", 0}, {"\"A\"", 0}}},
        {"{\"type\":\"string\",\"format\":\"uuid\",\"minLength\":36}",
         {{"\"123e4567-e89b-12d3-a456-426614174000\"", 1}, {"\"123e4567\"", 0}}},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        di_grammar *g = schema_or_fail(k[i].schema, DI_JSON_WS_COMPACT);
        size_t n = 0;
        while (n < 8 && k[i].cases[n].text) n++;
        check_cases(g, v, k[i].cases, n, k[i].schema);
        di_grammar_free(g);
    }
    tu_report("coverage schemas checked: %zu", sizeof k / sizeof k[0]);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Integer bounds compile to digit grammars: every integer in a window is accepted iff in range. */
static void test_schema_int_ranges(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    static const struct {
        const char *schema;
        long long lo, hi; /* inclusive; +-1e18 = unbounded */
    } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":-15,\"maximum\":123}", -15, 123},
        {"{\"type\":\"integer\",\"minimum\":7}", 7, (long long)1e18},
        {"{\"type\":\"integer\",\"maximum\":-3}", (long long)-1e18, -3},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1000}", 1, 999},
        {"{\"type\":\"integer\",\"minimum\":0.5,\"maximum\":99.5}", 1, 99},
        {"{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true}", 6, (long long)1e18},
        {"{\"type\":\"integer\",\"minimum\":-250,\"maximum\":-40}", -250, -40},
        {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":10}", 10, 10},
    };
    int checked = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        di_grammar *g = schema_or_fail(cases[k].schema, DI_JSON_WS_COMPACT);
        for (long long x = -1100; x <= 1100; x++) {
            char buf[32];
            snprintf(buf, sizeof buf, "%lld", x);
            int want = x >= cases[k].lo && x <= cases[k].hi;
            if (full_match(g, v, buf) != want) fail_msg("%s: %lld expected %s", cases[k].schema, x, want ? "accepted" : "rejected");
            checked++;
        }
        assert_int_equal(full_match(g, v, "-0"), 0); /* never generated: only canonical spellings */
        assert_int_equal(full_match(g, v, "007"), 0);
        di_grammar_free(g);
    }
    tu_report("integer-range strings checked: %d", checked);

    /* numbers with integral bounds: never accept a value outside them; accept most inside */
    static const struct {
        const char *schema;
        double lo, hi;
        int ex_lo, ex_hi;
    } nums[] = {
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", 0, 1, 0, 0},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":2}", -3, 2, 1, 1},
        {"{\"type\":\"number\",\"minimum\":-5}", -5, 1e300, 0, 0},
        {"{\"type\":\"number\",\"maximum\":-2}", -1e300, -2, 0, 0},
        {"{\"type\":\"number\",\"maximum\":0,\"exclusiveMaximum\":true}", -1e300, 0, 0, 1},
    };
    int inside = 0, inside_ok = 0;
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
        di_grammar *g = schema_or_fail(nums[k].schema, DI_JSON_WS_COMPACT);
        static const char *fr[] = {"", ".0", ".5", ".25", ".75", ".000"};
        for (int ip = 0; ip <= 12; ip++)
            for (int sign = 0; sign < 2; sign++)
                for (size_t f = 0; f < 6; f++) {
                    char buf[32];
                    snprintf(buf, sizeof buf, "%s%d%s", sign ? "-" : "", ip, fr[f]);
                    double x = strtod(buf, NULL);
                    bool want = (nums[k].ex_lo ? x > nums[k].lo : x >= nums[k].lo) &&
                                (nums[k].ex_hi ? x < nums[k].hi : x <= nums[k].hi);
                    int got = full_match(g, v, buf);
                    if (got && !want) fail_msg("%s accepts %s", nums[k].schema, buf);
                    inside += want, inside_ok += got;
                }
        di_grammar_free(g);
    }
    tu_report("bounded numbers: %d of %d in-range spellings accepted, none out of range", inside_ok, inside);
    assert_true(inside_ok * 2 > inside);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static void expect_schema_error(const char *src, const char *needle) {
    di_grammar *g = NULL;
    di_error err = {0};
    if (di_grammar_from_json_schema(src, strlen(src), NULL, &g, &err) == DI_OK) fail_msg("schema compiled: %s", src);
    assert_null(g);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

static void test_schema_errors(void **state) {
    (void)state;
    expect_schema_error("{\"type\":", "not JSON");
    expect_schema_error("{\"not\":{}}", "matches no string"); /* not {} = false */
    expect_schema_error("{\"not\":{\"minimum\":3}}", "keyword 'not' other than");
    expect_schema_error("{\"type\":\"number\",\"not\":{\"type\":\"integer\"}}", "not' {type: integer}");
    expect_schema_error("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}", "not provably disjoint");
    expect_schema_error("{\"type\":\"object\",\"patternProperties\":{\"^a\":{\"type\":\"string\"},\"b$\":{\"type\":\"integer\"}}}",
                        "several different non-trivial");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"null\"}},\"patternProperties\":{\"^a\":{\"type\":\"string\"}}}",
                        "matches declared property 'ab'");
    expect_schema_error("{\"type\":\"object\",\"minProperties\":5000}", "minProperties");
    expect_schema_error("{\"type\":\"object\",\"maxProperties\":100000}", "maxProperties");
    expect_schema_error("{\"type\":\"object\",\"dependentSchemas\":[1]}", "is not an object");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"^a+b$\",\"maxLength\":4}", "minLength/maxLength");
    expect_schema_error("{\"properties\":{\"a\":{\"$ref\":\"#/nope\"}}}", "does not resolve");
    expect_schema_error("{\"properties\":{\"a\":{\"$ref\":\"http://x/y\"}}}", "not local");
    expect_schema_error("{\"type\":\"strin\"}", "unknown type");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "look-ahead");
    expect_schema_error("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
    expect_schema_error("{\"type\":\"integer\",\"multipleOf\":1234567}", "residue states");
    expect_schema_error("false", "matches no string");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}", "matches no string");
    expect_schema_error("{\"$ref\":\"#\"}", "matches no string"); /* only infinite recursion */
}

static void test_schema_masks(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(400);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = schema_or_fail(k_person, DI_JSON_WS_FLEXIBLE);
    int checked = 0;
    for (uint64_t s = 1; s <= 6; s++) checked += gt_walk(g, v, &tb, NULL, s * 7727, 40, "person schema");
    di_grammar_free(g);
    g = schema_or_fail("{\"type\":\"object\",\"additionalProperties\":{\"type\":[\"string\",\"number\",\"boolean\"]}}",
                       DI_JSON_WS_COMPACT);
    for (uint64_t s = 1; s <= 6; s++) checked += gt_walk(g, v, &tb, NULL, s * 3119, 40, "map schema");
    di_grammar_free(g);
    tu_report("JSON Schema masks checked against brute force: %d (%llu from the mask cache)", checked,
              (unsigned long long)gt_cache_hits);
    assert_true(gt_cache_hits > 0); /* cached masks were exercised, and each matched brute force */
    assert_true(checked > 100);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Huge enum, deep nesting, a 4 MB schema: bounded time with a result or a clear error. */
static void test_schema_hostile(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    /* 20,000-value enum compiles into a trie: matching stays cheap */
    size_t cap = 20000 * 16 + 64, n = 0;
    char *s = malloc(cap);
    n += (size_t)sprintf(s + n, "{\"enum\":[");
    for (int i = 0; i < 20000; i++) n += (size_t)sprintf(s + n, "%s\"v%d\"", i ? "," : "", i * 7);
    n += (size_t)sprintf(s + n, "]}");
    double t0 = now_s();
    di_grammar *g = schema_or_fail(s, DI_JSON_WS_COMPACT);
    double tc = now_s() - t0;
    assert_int_equal(full_match(g, v, "\"v13993\""), 1);
    assert_int_equal(full_match(g, v, "\"v13994\""), 0);
    tu_report("20000-value enum: compile %.1f ms", tc * 1e3);
    assert_true(tc < 5.0);
    di_grammar_free(g);
    free(s);

    /* nesting past the limit is refused */
    cap = 300 * 40 + 64, n = 0;
    s = malloc(cap);
    for (int i = 0; i < 300; i++) n += (size_t)sprintf(s + n, "{\"type\":\"array\",\"items\":");
    n += (size_t)sprintf(s + n, "true");
    for (int i = 0; i < 300; i++) s[n++] = '}';
    s[n] = 0;
    expect_schema_error(s, "nested more than 128 levels");
    free(s);

    /* ~4 MB schema: 60,000 properties */
    cap = 5u << 20, n = 0;
    s = malloc(cap);
    n += (size_t)sprintf(s + n, "{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{");
    for (int i = 0; n < (4u << 20) - 200; i++)
        n += (size_t)sprintf(s + n, "%s\"property_number_%d\":{\"type\":\"string\",\"maxLength\":4}", i ? "," : "", i);
    n += (size_t)sprintf(s + n, "}}");
    t0 = now_s();
    di_grammar *big = NULL;
    di_error err = {0};
    int rc = di_grammar_from_json_schema(s, n, NULL, &big, &err);
    tc = now_s() - t0;
    tu_report("4 MB schema (%zu bytes): %s in %.2f s", n, rc ? err.msg : "compiled", tc);
    assert_true(rc == DI_OK || rc == DI_ERR_LIMIT);
    assert_true(tc < 10.0);
    if (!rc) {
        di_grammar_matcher *m = NULL;
        rc = di_grammar_matcher_new(big, v, NULL, &m, &err);
        assert_true(rc == DI_OK || rc == DI_ERR_LIMIT);
        di_grammar_matcher_free(m);
    }
    di_grammar_free(big);
    free(s);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ebnf_accept),   cmocka_unit_test(test_ebnf_errors),   cmocka_unit_test(test_ebnf_masks), cmocka_unit_test(test_right_recursion), cmocka_unit_test(test_pruned_effects), cmocka_unit_test(test_empty_brackets),
        cmocka_unit_test(test_schema_accept), cmocka_unit_test(test_schema_errors), cmocka_unit_test(test_schema_masks),
        cmocka_unit_test(test_schema_hostile), cmocka_unit_test(test_schema_int_ranges),
        cmocka_unit_test(test_schema_coverage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
