/* Grammar core and regex front-end: acceptance against PCRE2, masks against brute force on a
 * synthetic vocabulary, rollback, thinking, stop strings, hostile patterns.  di-test: asan */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include "grammar/cfg.h"
#include "grammar/earley.h"
#include "grammar/grammar_impl.h"
#include "grammar/state_cache.h"
#include "grammar_testlib.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: bounds must not depend on machine load */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static di_grammar *regex_or_fail(const char *re) {
    di_grammar *g = NULL;
    di_error err = {0};
    if (di_grammar_from_regex(re, strlen(re), &g, &err)) fail_msg("regex /%s/: %s", re, err.msg);
    return g;
}

/* Full-text match through the public API: feed the bytes and ask can_end. */
static bool gram_match(const di_grammar *g, const di_grammar_vocab *v, const char *s, size_t n) {
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
    bool ok = di_grammar_matcher_try_bytes(m, (const uint8_t *)s, n);
    if (ok) {
        /* accept byte by byte through the single-byte tokens (id = byte + 1) */
        for (size_t i = 0; i < n; i++)
            if (di_grammar_matcher_accept_token(m, (uint8_t)s[i] + 1, &err)) fail_msg("accept: %s", err.msg);
        ok = di_grammar_matcher_can_end(m);
    }
    di_grammar_matcher_free(m);
    return ok;
}

/* Accept s token by token (single-byte tokens): 1 = complete match, 0 = rejected or incomplete,
 * <0 = the matcher's error code (e.g. DI_ERR_LIMIT). */
static int feed_all(const di_grammar *g, const di_grammar_vocab *v, const char *s, size_t n) {
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    int r = di_grammar_matcher_new(g, v, NULL, &m, &err);
    if (r == DI_ERR_LIMIT && strstr(err.msg, "ambiguous")) return r;
    if (r) fail_msg("matcher: %s", err.msg);
    r = 1;
    for (size_t i = 0; i < n && r == 1; i++) {
        int rc = di_grammar_matcher_accept_token(m, (uint8_t)s[i] + 1, &err);
        if (rc == DI_ERR_INVALID) r = 0;
        else if (rc) r = rc;
    }
    if (r == 1 && !di_grammar_matcher_can_end(m)) r = 0;
    if (r == DI_ERR_LIMIT && !strstr(err.msg, "ambiguous")) fail_msg("limit error without a reason: %s", err.msg);
    di_grammar_matcher_free(m);
    return r;
}

static bool pcre_match(pcre2_code *re, const char *s, size_t n) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

/* Every pattern: random strings over an alphabet that exercises it must get the same verdict
 * from our grammar and from PCRE2 (anchored, full match, UTF mode). */
static void test_regex_vs_pcre2(void **state) {
    (void)state;
    static const struct {
        const char *re, *alpha;
    } cases[] = {
        {"abc", "abc"},
        {"a|b|cd", "abcd"},
        {"(ab)*c", "abc"},
        {"a+b?c{2,3}", "abc"},
        {"[a-c]{0,4}x", "abcdx"},
        {"[^a-c]+", "abcd\xc3\xa9"},
        {"\\d{1,3}(\\.\\d{1,3}){3}", "0123.9a"},
        {"(a*)*b", "ab"},
        {"(a|aa)+$", "ab"},
        {"^-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?$", "0123-.eE+"},
        {"\\w+@\\w+\\.com", "ab@.com_"},
        {"(?:x|y){2}z?", "xyz"},
        {"\\s*\\S+", " \tab"},
        {"[\\u00e9\\u4e2d-\\u4e2f]+", "\xc3\xa9\xe4\xb8\xad" "a"},
        {"..?", "a\xc3\xa9\n"},
        {"(a|b)*abb", "ab"},
        {"[a\\-z]+", "a-zb"},
        {"a{3}", "a"},
        {"(?<name>ab)+", "ab"},
        {"x*?y+?", "xy"},
        {"\\x41\\u0042", "AB"},
        {"[\\d\\s]+", "1 a"},
        {"[^\\d]", "1a\xe4\xb8\xad"},
        {"", "a"},
        /* separated lists X(SX)* (regex.c: separated_list builds them as one right recursion) */
        {"a(,a)*", "a,"},
        {"[ab]+(\\.[ab]+)*", "ab."},
        {"x[a-c](-?[a-c])?(\\.[a-c](-?[a-c])?)*", "abc.-x"},
        {"(ab)(c(ab))*", "abc"},
        {"\\d(?:,\\d)*?", "1,a"},
        {"[a]([a])*", "ab"},
        {"[a](b|,[a])*", "ab,"},
        {"[a](,[a])+", "a,"},
        {"[a-b]{1,2}(-[a-b]{1,2})*-", "ab-"},
    };
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    uint64_t seed = 12345;
    int compared = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        di_grammar *g = regex_or_fail(cases[c].re);
        int ec;
        PCRE2_SIZE eo;
        char anch[512];
        snprintf(anch, sizeof anch, "(?:%s)\\z", cases[c].re);
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)anch, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ALT_BSUX, &ec, &eo, NULL);
        if (!re) fail_msg("PCRE2 rejects /%s/ (error %d at %zu)", anch, ec, (size_t)eo);
        /* alphabet as UTF-8 code point strings */
        const char *al = cases[c].alpha;
        const char *units[32];
        size_t ulen[32], nu = 0;
        for (const char *p = al; *p && nu < 32;) {
            size_t k = 1;
            while (((unsigned char)p[k] & 0xC0) == 0x80) k++;
            units[nu] = p, ulen[nu++] = k, p += k;
        }
        for (int trial = 0; trial < 300; trial++) {
            char s[64];
            size_t n = 0;
            int len = (int)(gt_rng(&seed) % 9);
            for (int k = 0; k < len && nu; k++) {
                size_t u = gt_rng(&seed) % nu;
                memcpy(s + n, units[u], ulen[u]);
                n += ulen[u];
            }
            bool want = pcre_match(re, s, n), got = gram_match(g, v, s, n);
            if (want != got) fail_msg("/%s/ on \"%.*s\": grammar %d, PCRE2 %d", cases[c].re, (int)n, s, got, want);
            compared++;
        }
        pcre2_code_free(re);
        di_grammar_free(g);
    }
    tu_report("regex strings compared with PCRE2: %d", compared);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static void expect_regex_error(const char *re, const char *needle) {
    di_grammar *g = NULL;
    di_error err = {0};
    int rc = di_grammar_from_regex(re, strlen(re), &g, &err);
    if (rc == DI_OK) fail_msg("regex /%s/ compiled but should fail", re);
    assert_null(g);
    if (!strstr(err.msg, needle)) fail_msg("regex /%s/: error '%s' lacks '%s'", re, err.msg, needle);
}

static void test_regex_errors(void **state) {
    (void)state;
    expect_regex_error("a(?=b)", "look-ahead");
    expect_regex_error("a(?!b)", "look-ahead");
    expect_regex_error("(?<=a)b", "look-behind");
    expect_regex_error("(a)\\1", "back-reference");
    expect_regex_error("\\bfoo", "word boundary");
    expect_regex_error("(ab", "missing ')'");
    expect_regex_error("ab)", "unbalanced");
    expect_regex_error("[ab", "unterminated");
    expect_regex_error("a{5,2}", "m < n");
    expect_regex_error("*a", "without an operand");
    expect_regex_error("a^b", "anchors");
    expect_regex_error("a++", "possessive");
    expect_regex_error("(?i)a", "inline flags");
    expect_regex_error("[z-a]", "out of order");
    expect_regex_error("a{1000000}", "too large");
    expect_regex_error("\xff", "UTF-8");
    char deep[1200];
    memset(deep, '(', 600);
    memset(deep + 600, ')', 600);
    deep[1199] = 0;
    expect_regex_error(deep, "nested too deeply");
}

/* Masks equal brute force along random walks (with rollbacks) for each pattern. */
static void test_regex_masks(void **state) {
    (void)state;
    static const char *pats[] = {
        "\\{\"a\":(true|false|null|-?\\d+(\\.\\d+)?)\\}",
        "[a-c]+(,[a-c]+)*",
        "(\\\\n|[^\\\\\"])*\"",
        "é+中?😀{0,2}x",
        "(a|ab)(c|bcd)(d*)",
        "(ue|al|se|f|ll|true|null)+END",
    };
    gt_bytes tb = gt_vocab_bytes(400);
    di_grammar_vocab *v = gt_vocab(&tb);
    int checked = 0;
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++) {
        di_grammar *g = regex_or_fail(pats[i]);
        for (uint64_t s = 1; s <= 6; s++) checked += gt_walk(g, v, &tb, NULL, s * 7919, 30, pats[i]);
        di_grammar_free(g);
    }
    tu_report("regex masks checked against brute force: %d", checked);
    assert_true(checked > 100);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* The fast mask paths against brute force on a vocabulary with large token subtrees (4,000
 * multi-byte tokens of JSON pieces, UTF-8 and partial UTF-8): masks of character-loop states by
 * token classes (block masks, and their context-free part cached and reused in another
 * context), trie subtrees accepted whole (blocks), and context-free states shared across contexts (strings in different properties, nesting levels and requests, with
 * length bounds that make each count a state), each of which must have run. */
static void test_fast_paths(void **state) {
    (void)state;
    static const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"array\","
        "\"items\":{\"type\":\"string\"}},\"c\":{\"type\":\"object\",\"properties\":{\"d\":{\"type\":"
        "\"string\"},\"e\":{\"type\":\"string\",\"maxLength\":5}}}}}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}}}},\"$ref\":\"#/$defs/n\"}",
    };
    gt_bytes tb = gt_vocab_bytes(4000);
    for (uint32_t i = 257; i < tb.n; i += 97) /* a few partial UTF-8 tokens: "中" cut after 2 bytes */
        if (tb.l[i] >= 3) memcpy(tb.b[i] + tb.l[i] - 2, "\xe4\xb8", 2);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    int checked = 0;
    memset(&gt_stats, 0, sizeof gt_stats);
    for (size_t i = 0; i < 2 * sizeof schemas / sizeof schemas[0]; i++) {
        const char *sc = schemas[i % 2];
        di_grammar *g = NULL;
        if (di_grammar_from_json_schema(sc, strlen(sc), NULL, &g, &err)) fail_msg("%s", err.msg);
        if (i >= 2) di_gcache_set_max_states(g->cache, 8); /* full tables: uninterned states on every path */
        for (uint64_t s = 1; s <= 4; s++) checked += gt_walk(g, v, &tb, NULL, s * 104729 + i, 40, sc);
        di_grammar_free(g);
    }
    /* a bounded character loop as a regex (each count its own state) and a plain loop */
    static const char *pats[] = {"[a-z0-9._%+-]{1,12}@[a-z]{2,6}", "\"([^\"\\\\]|\\\\.)*\"[,}]"};
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++) {
        di_grammar *g = regex_or_fail(pats[i]);
        for (uint64_t s = 1; s <= 4; s++) checked += gt_walk(g, v, &tb, NULL, s * 7727, 30, pats[i]);
        di_grammar_free(g);
    }
    tu_report("fast-path masks checked against brute force: %d (walks %llu of which %llu cached, block masks %llu of "
              "which %llu cached, blocks %llu, context edges %llu, cached %llu)",
              checked, (unsigned long long)gt_stats.walks, (unsigned long long)gt_stats.walk_hits,
              (unsigned long long)gt_stats.block_masks, (unsigned long long)gt_stats.block_hits,
              (unsigned long long)gt_stats.blocks, (unsigned long long)gt_stats.ctx_edges,
              (unsigned long long)gt_stats.cached);
    assert_true(checked > 200);
    assert_true(gt_stats.block_masks > 0);
    assert_true(gt_stats.block_hits > 0); /* a block cached in one context served another */
    assert_true(gt_stats.walk_hits > 0);  /* and so did a trie walk */
    assert_true(gt_stats.blocks > 0);
    assert_true(gt_stats.ctx_edges > 0);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A repetition that has just completed stays inside the walk boundary: inside the email format's
 * local part (`[...]+` right after the opening quote) every character completes the `+` again,
 * and with its origin outside the boundary each character was a context edge and the state no
 * block. The mask after `"ada` must be a block mask and equal brute force. */
static void test_repetition_boundary(void **state) {
    (void)state;
    static const char sc[] = "{\"type\":\"string\",\"format\":\"email\"}";
    gt_bytes tb = gt_vocab_bytes(2000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    di_grammar *g = NULL;
    di_grammar_matcher *m = NULL;
    if (di_grammar_from_json_schema(sc, strlen(sc), NULL, &g, &err)) fail_msg("%s", err.msg);
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    gt_accept_text(m, "\"ada");
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    di_grammar_walk_stats w = gt_fill_checked(m, v, &tb, mask, sc);
    tu_report("email local part: %llu block mask(s), %llu context edges", (unsigned long long)w.block_masks,
              (unsigned long long)w.ctx_edges);
    assert_int_equal(w.block_masks, 1);
    assert_true(gt_bit(mask, 'b' + 1) && gt_bit(mask, '@' + 1) && !gt_bit(mask, ' ' + 1));
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A counted state (`[a-z]{1,40}`) takes a block of characters only when the summaries of all
 * DI_CHAIN_CHARS + 1 states of its chain exist; each mask must complete the chain it needs, so
 * that every mask after the first character is a block mask (equal to brute force). */
static void test_counted_chain(void **state) {
    (void)state;
    static const char re[] = "[a-z]{1,40}!";
    gt_bytes tb = gt_vocab_bytes(2000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    di_grammar *g = regex_or_fail(re);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    int blocks = 0;
    for (int k = 1; k <= 24; k++) {
        if (di_grammar_matcher_accept_token(m, 'q' + 1, &err)) fail_msg("%s", err.msg); /* token b + 1 = byte b */
        di_grammar_walk_stats w = gt_fill_checked(m, v, &tb, mask, re);
        if (k > 1) assert_int_equal(w.block_masks, 1);
        blocks += (int)w.block_masks;
        assert_true(gt_bit(mask, 'z' + 1) && gt_bit(mask, '!' + 1) && !gt_bit(mask, 'A' + 1));
    }
    tu_report("counted chain: %d of 24 masks were block masks", blocks);
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Bounded repetitions are right-recursive (T_k -> eps | s T_{k-1}), so every byte completes
 * each link of the chain written so far; the recogniser jumps to the chain's last finished item
 * (earley.c: leo_top). Two runs side by side (`\s{0,16}\s{0,16}`, the whitespace of an empty
 * JSON array) made sets grow quadratically with the run. Acceptance must be unchanged: every
 * length up to the bound, nothing beyond, and the text after it. */
/* A separated list `X(SX)*` is one nonterminal for both X (regex.c: separated_list), and a waiter
 * that ends its rule enters a completion effect without its position (matcher.c: waiter_pos): a
 * later element of the list is then the same state as the first at the same point, so the mask
 * after "@x.ab" (second label) serves "@ab" (first label) from the cache. Without either change
 * the two labels' states have different keys (schema_small's e-mail domain labels relearned every
 * count of `{0,61}`: 237 Earley pushes for the mask after ".org", 25 with them). */
static void test_separated_list(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(1000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = regex_or_fail("@[a-z]([a-z-]{0,20}[a-z])?(\\.[a-z]([a-z-]{0,20}[a-z])?)*");
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    di_error err = {0};
    static const char *texts[] = {"@x.ab", "@ab", "@xy.z.ab"};
    uint64_t hits[3];
    for (int k = 0; k < 3; k++) {
        di_grammar_matcher *m = NULL;
        if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("matcher: %s", err.msg);
        gt_accept_text(m, texts[k]);
        gt_fill_checked(m, v, &tb, mask, "separated list");
        uint64_t misses;
        di_grammar_matcher_cache_stats(m, &hits[k], &misses);
        di_grammar_matcher_free(m);
    }
    tu_report("separated list: cache hits of \"@x.ab\", \"@ab\", \"@xy.z.ab\": %llu %llu %llu",
              (unsigned long long)hits[0], (unsigned long long)hits[1], (unsigned long long)hits[2]);
    assert_int_equal(hits[0], 0);
    assert_int_equal(hits[1], 1); /* first label, 2 characters: the state of the second label */
    assert_int_equal(hits[2], 1); /* third label */
    int checked = 0;
    for (uint64_t s = 1; s <= 12; s++) checked += gt_walk(g, v, &tb, NULL, s * 7919, 30, "separated list walk");
    tu_report("separated list: %d random-walk masks checked", checked);
    assert_true(checked >= 24);
    free(mask);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A statement that starts with an identifier or a keyword spelled like one (`if`, `return`):
 * the identifier `ident -> [a-z] [a-z0-9]*` can end after every character, and each end
 * completes it at the statement's first set. With that set outside the walk boundary every
 * letter of every token was a context edge (ebnf_stmt: 40,408 of 42,058 edges of the masks after
 * `if`, `return`, `    y`); matcher.c: walk_boundary takes the set inside (ends_open). The masks
 * must equal brute force and be walked with few context edges. */
static void test_open_construct_boundary(void **state) {
    (void)state;
    static const char gbnf[] = "root ::= stmt+\n"
                               "stmt ::= ident \" = \" ident \";\\n\" | \"if \" ident \" {\\n\" stmt* \"}\\n\"\n"
                               "ident ::= [a-z_] [a-z0-9_]*\n";
    gt_bytes tb = gt_vocab_bytes(3000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(gbnf, strlen(gbnf), "root", &g, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    static const char *texts[] = {"x = y;\nif", "x = y;\nif a {\nzz", "x = y;\nab_c"};
    uint64_t ctx = 0, edges = 0;
    for (int k = 0; k < 3; k++) {
        di_grammar_matcher *m = NULL;
        if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
        gt_accept_text(m, texts[k]);
        di_grammar_walk_stats w = gt_fill_checked(m, v, &tb, mask, texts[k]);
        assert_true(gt_bit(mask, 'q' + 1) && gt_bit(mask, ' ' + 1) && !gt_bit(mask, '{' + 1));
        ctx += w.ctx_edges;
        edges += w.edges;
        di_grammar_matcher_free(m);
    }
    tu_report("identifier after a statement start: %llu context edges of %llu walk edges",
              (unsigned long long)ctx, (unsigned long long)edges);
    assert_true(edges > 300);
    assert_true(ctx * 20 < edges);
    int checked = 0;
    for (uint64_t s = 1; s <= 6; s++) checked += gt_walk(g, v, &tb, NULL, s * 6151, 40, "statements walk");
    assert_true(checked >= 60);
    free(mask);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A state whose ASCII bytes fall into small classes that the scan items tell apart (the first
 * character of a JSON value: `"`, `{`, `[`, `-`, digits, `t`, `f`, `n`, whitespace) leads each
 * class to its own state, so its loop summary can never make a block; matcher.c: loop_summary
 * returns before its one push per class. ebnf_json's masks at a value spent ~40 of ~100
 * pushes on such summaries. The mask must equal brute force with fewer pushes than summaries
 * would take. */
static void test_summary_precheck(void **state) {
    (void)state;
    static const char gbnf[] =
        "root ::= object\n"
        "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
        "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
        "string ::= \"\\\"\" [a-z ]* \"\\\"\" ws\n"
        "number ::= \"-\"? [0-9]+ ws\n"
        "ws ::= [ \\n]?\n";
    gt_bytes tb = gt_vocab_bytes(6000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(gbnf, strlen(gbnf), "root", &g, &err)) fail_msg("%s", err.msg);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    gt_accept_text(m, "{\"ab\": ");
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    di_grammar_walk_stats w = gt_fill_checked(m, v, &tb, mask, "value start");
    tu_report("value start: %llu pushes, %llu summaries", (unsigned long long)w.pushes, (unsigned long long)w.summaries);
    assert_true(w.summaries >= 5);
    assert_true(w.pushes < 85); /* 79 with the test, 91 without (deterministic) */
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* The Earley recogniser tells sets apart by a stamp (the Leo memo is keyed by set index and the
 * set's stamp). Growing the dedup hash table used to restart the stamp at 1, so a set rebuilt at
 * the same index after a large set could carry the stamp of an older set there and inherit its
 * memoized chain: after "a z" (Z completes root -> "a" A through A -> Z), a large set after "b",
 * then "c z", completing Z at set 1 took the chain of the "a" set and finished the root without
 * the "!" that C -> Z "!" requires. */
static void test_stamp_after_growth(void **state) {
    (void)state;
    char src[8192];
    size_t n = (size_t)snprintf(src, sizeof src, "root ::= \"a\" A | \"c\" C | \"b\" big\nA ::= Z\nC ::= Z \"!\"\n"
                                                 "Z ::= \"z\"\nbig ::= \"q0\"");
    for (int k = 1; k < 140; k++) n += (size_t)snprintf(src + n, sizeof src - n, " | \"q%d\"", k);
    n += (size_t)snprintf(src + n, sizeof src - n, "\n");
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(src, n, "root", &g, &err)) fail_msg("%s", err.msg);
    di_earley e;
    if (di_earley_init(&e, g->cfg, &err)) fail_msg("%s", err.msg);
    assert_int_equal(di_earley_push_bytes(&e, (const uint8_t *)"az", 2, &err), 1);
    assert_true(di_earley_accepting(&e)); /* memoizes the chain of Z at set 1 */
    di_earley_pop_to(&e, 1);
    assert_int_equal(di_earley_push(&e, 'b', &err), 1); /* a set of ~280 items: the hash table grows */
    size_t big = e.set_off[2] - e.set_off[1];
    di_earley_pop_to(&e, 1);
    assert_int_equal(di_earley_push_bytes(&e, (const uint8_t *)"cz", 2, &err), 1);
    bool early = di_earley_accepting(&e);
    int bang = di_earley_push(&e, '!', &err);
    tu_report("stamp after growth: big set %zu items; after \"cz\" accepting %d, '!' %d", big, early, bang);
    assert_true(big > 128);
    assert_false(early);
    assert_int_equal(bang, 1);
    assert_true(di_earley_accepting(&e));
    di_earley_free(&e);
    di_grammar_free(g);
}

typedef struct recog_case {
    const char *s;
    bool ok; /* a sentence of the grammar */
} recog_case;

/* Push each case's text on a fresh recogniser of c: recognised exactly when ok, and no Earley set
 * holds an item twice. Returns the largest set's size. */
static size_t recognise_cases(const di_cfg *c, const recog_case *cases, size_t n) {
    size_t largest = 0;
    di_error err = {0};
    for (size_t k = 0; k < n; k++) {
        di_earley e;
        if (di_earley_init(&e, c, &err)) fail_msg("%s", err.msg);
        size_t len = strlen(cases[k].s);
        int rc = len ? di_earley_push_bytes(&e, (const uint8_t *)cases[k].s, len, &err) : 1;
        assert_true(rc >= 0);
        bool ok = rc == 1 && di_earley_accepting(&e);
        if (ok != cases[k].ok) fail_msg("\"%s\": recognised %d, expected %d", cases[k].s, ok, cases[k].ok);
        for (size_t i = 0; i < e.n_sets; i++) {
            if (e.set_off[i + 1] - e.set_off[i] > largest) largest = e.set_off[i + 1] - e.set_off[i];
            for (size_t x = e.set_off[i]; x < e.set_off[i + 1]; x++)
                for (size_t y = x + 1; y < e.set_off[i + 1]; y++)
                    if (e.items[x].pos == e.items[y].pos && e.items[x].origin == e.items[y].origin)
                        fail_msg("\"%s\": set %zu holds item (%u, %u) twice", cases[k].s, i, e.items[x].pos,
                                 e.items[x].origin);
        }
        di_earley_free(&e);
    }
    return largest;
}

/* Items that start in the set under construction are appended without a duplicate check
 * (earley.c, add_new_items): a nonterminal's rules enter a set once (pred_stamp), however many of
 * its items wait on it. A grammar where A and the nullable N are predicted by several items of
 * one set, and nullable symbols move dots inside predicted rules: no set holds an item twice
 * (fails without the stamp), and the sentences are recognised (fails when a prediction is lost). */
static void test_predicted_once(void **state) {
    (void)state;
    static const char gbnf[] = "root ::= A \"x\" | A \"y\" | N A \"z\" | N N \"w\" | N B\n"
                               "A ::= \"a\" A \"a\" | \"b\" | N \"c\" | N N\n"
                               "B ::= N A N | A \"q\"\n"
                               "N ::= \"n\"?\n";
    static const recog_case cases[] = {
        {"x", true},  {"bx", true},  {"aby", false}, {"abay", true}, {"abax", true},   {"nbz", true},
        {"cz", true}, {"ncz", true}, {"nncz", true}, {"w", true},    {"nnw", true},    {"nnnw", false},
        {"", true},   {"bq", true},  {"nbn", true},  {"aacaan", true}, {"q", true},    {"naq", false}};
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(gbnf, strlen(gbnf), "root", &g, &err)) fail_msg("%s", err.msg);
    size_t largest = recognise_cases(g->cfg, cases, sizeof cases / sizeof cases[0]);
    tu_report("predicted once: largest set %zu items", largest);
    assert_true(largest > 24); /* over add_item's small-set size: the hash table is in use */
    di_grammar_free(g);
}

/* EBNF one-byte literals and classes of one-byte characters are their terminals, not a
 * nonterminal with one rule around it (ebnf.c: di_cfg_byte, DI_CPSET_BARE): no nonterminal of the
 * compiled grammar has a single rule that is a single terminal (fails with the wrappers), so an
 * Earley set that predicts `"{"` or `[0-9]` holds one item less. A rule's alternatives and
 * sequences are its own rules (parse_seq into the rule's nonterminal): `item` has four rules
 * and `root` one of three symbols, not a unit rule to a nonterminal made for the body; `" "?`
 * is the repetition's tail T -> eps | " " itself (cfg.c, di_cfg_repeat). The language is the
 * same. */
static void test_bare_terminals(void **state) {
    (void)state;
    static const char gbnf[] = "root ::= \"{\" ws item (\",\" ws item)* \"}\"\n"
                               "item ::= [a-c]+ | \"-\" [0-9] | \"null\" | [\\x00-\\x7F\\u00e9]\n"
                               "ws ::= \" \"?\n";
    static const recog_case cases[] = {{"{a}", true},     {"{ab, -1}", true}, {"{null,c}", true}, {"{-12}", false},
                                       {"{}", false},      {"{\xc3\xa9}", true}, {"{~}", true},      {"{a,}", false},
                                       {"{ -1}", true},    {"{d}", true}};
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(gbnf, strlen(gbnf), "root", &g, &err)) fail_msg("%s", err.msg);
    const di_cfg *c = g->cfg;
    recognise_cases(c, cases, sizeof cases / sizeof cases[0]);
    int wrappers = 0, utf8_classes = 0;
    uint32_t item_rules = 0, root_len = 0, opt_rules = 0;
    for (uint32_t a = 0; a < c->n_nt; a++) {
        uint32_t r = c->nt_rule_off[a], nr = c->nt_rule_off[a + 1] - r, p = nr ? c->nt_rules[r] : 0;
        const char *name = c->nt_name[a] ? c->nt_name[a] : "";
        if (nr == 1 && c->psym[p] < 0 && c->psym[p] != DI_CFG_END && c->psym[p + 1] == DI_CFG_END) wrappers++;
        if (nr > 2) utf8_classes++; /* [\x00-\x7F\u00e9] keeps its rules */
        if (!strcmp(name, "item")) item_rules = nr;
        if (!strcmp(name, "ws") && c->psym[p] >= 0) /* ws -> T, T -> eps | " " (di_cfg_repeat {0,1}) */
            opt_rules = c->nt_rule_off[c->psym[p] + 1] - c->nt_rule_off[c->psym[p]];
        for (uint32_t q = p; !strcmp(name, "root") && nr == 1 && c->psym[q] != DI_CFG_END; q++) root_len++;
    }
    tu_report("bare terminals: %d wrapper rules, %d rule sets of 3+; item %u rules, root %u symbols, ws's option %u rules",
              wrappers, utf8_classes, item_rules, root_len, opt_rules);
    assert_int_equal(opt_rules, 2);
    assert_int_equal(wrappers, 0);
    assert_true(utf8_classes >= 1);
    assert_int_equal(item_rules, 4);
    assert_int_equal(root_len, 3); /* "{" D "}": the separated list of `ws item` is one symbol */
    di_grammar_free(g);
}

/* A replay takes back a set that walk_pop popped when the byte that made it acts like the path's
 * byte (matcher.c: replay, mpath): a walk through whitespace runs of tabs, spaces and newlines
 * after the previous path popped the same counts re-pushed them (schema_small: 251 replays per
 * cold request, 57 with the reuse). Random walks over a JSON schema with whitespace-heavy tokens
 * and rollbacks (which move the walk's base without a push): every mask equals brute force and
 * sets were taken back. */
static void test_replay_reuse(void **state) {
    (void)state;
    static const char sc[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
                             "\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6}},\"c\":{\"type\":\"boolean\"}},"
                             "\"required\":[\"a\",\"b\"]}";
    gt_bytes tb = gt_vocab_bytes(3000);
    uint64_t s = 0x5EED;
    for (uint32_t i = 300; i < tb.n; i += 7) { /* whitespace runs: the counted [ \t\n\r]{0,16} between tokens */
        static const char ws[] = " \t\n\r";
        uint32_t len = 2 + (uint32_t)(gt_rng(&s) % 9);
        uint8_t *b = realloc(tb.b[i], len);
        if (!b) fail_msg("out of memory");
        for (uint32_t k = 0; k < len; k++) b[k] = (uint8_t)ws[gt_rng(&s) % 4];
        tb.b[i] = b, tb.l[i] = len;
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_json_schema(sc, strlen(sc), NULL, &g, &err)) fail_msg("%s", err.msg);
    memset(&gt_stats, 0, sizeof gt_stats);
    int checked = 0;
    for (uint64_t k = 1; k <= 6; k++) checked += gt_walk(g, v, &tb, NULL, k * 7001, 40, "replay reuse");
    tu_report("replay reuse: %d masks checked, %llu pushes, %llu replays, %llu sets taken back", checked,
              (unsigned long long)gt_stats.pushes, (unsigned long long)gt_stats.replays,
              (unsigned long long)gt_stats.reuses);
    assert_true(checked >= 60);
    assert_true(gt_stats.reuses > 0);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A long token ending in a run of one character walks on past its end for a few more characters
 * when it pushed new states (matcher.c: learn_ahead): inside a maxLength string each count is a
 * state, and the next masks, a few characters on, reach a few lower counts with the same token,
 * which they replayed from the root to learn (schema_medium: 60 pushes per mask for 20 em dashes).
 * Masks of a string walked 4 characters at a time equal brute force, and the masks after the first
 * block mask push little: the runs' lower counts were learned ahead. */
static void test_learn_ahead(void **state) {
    (void)state;
    static const char sc[] = "{\"type\":\"string\",\"maxLength\":64}";
    static const char *runs[] = {"\xc3\xa9", "\\\\", "\xe2\x80\x94", "\xf0\x9f\x98\x80"}; /* é, \\, —, 😀 */
    static const int reps[] = {20, 14, 12, 9};
    gt_bytes tb = gt_vocab_bytes(300);
    for (uint32_t r = 0; r < 8; r++) { /* each run alone and followed by a newline (dead in a string) */
        uint8_t buf[96];
        uint32_t len = 0;
        for (int k = 0; k < reps[r % 4]; k++)
            for (const char *c = runs[r % 4]; *c; c++) buf[len++] = (uint8_t)*c;
        if (r >= 4) buf[len++] = '\n';
        uint8_t *b = realloc(tb.b[tb.n - 1 - r], len);
        if (!b) fail_msg("out of memory");
        memcpy(b, buf, len);
        tb.b[tb.n - 1 - r] = b, tb.l[tb.n - 1 - r] = len;
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_json_schema(sc, strlen(sc), NULL, &g, &err)) fail_msg("%s", err.msg);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    gt_accept_text(m, "\"");
    uint64_t first = 0, later = 0, blocks = 0;
    for (int i = 0; i < 12; i++) {
        di_grammar_walk_stats w = gt_fill_checked(m, v, &tb, mask, "learn ahead");
        blocks += w.block_masks;
        if (i == 0) first = w.pushes;
        else later += w.pushes;
        gt_accept_text(m, "abcd");
    }
    tu_report("learn ahead: %llu pushes in the first mask, %llu in the next 11 (%llu block masks)",
              (unsigned long long)first, (unsigned long long)later, (unsigned long long)blocks);
    assert_int_equal(blocks, 12);
    assert_true(later < 1100); /* 889 with learn_ahead, 1452 without (deterministic) */
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A summary's chain takes back the set its widest class pushed (take_back in matcher.c) instead of
 * pushing the count's character again: an e-mail's counted local part and domain label, walked
 * through checked masks; and a count whose widest class leads elsewhere than its other classes
 * ([A-V] waits for a 'y', [a-m] and [n-z] go on to the next count), where the set kept is not
 * the successor's. */
static void test_summary_take_back(void **state) {
    (void)state;
    static const char *res[] = {"[a-z0-9._%+-]{1,32}@[a-z0-9-]{1,20}(\\.[a-z]{2,6}){1,2}",
                                "root ::= g{1,30} \"!\"\ng ::= c | [A-V] \"y\"\nc ::= [a-m] | [a-z]\n"};
    static const char *text[] = {"linus.torvalds@kernel.org", "abkzAyqVycnopqrstuvwxyz!"};
    gt_bytes tb = gt_vocab_bytes(300);
    di_grammar_vocab *v = gt_vocab(&tb);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    uint64_t pushes[2] = {0}, reuses[2] = {0}, summaries[2] = {0};
    for (int r = 0; r < 2; r++) {
        di_grammar *g = NULL;
        di_error err = {0};
        if (r == 0) g = regex_or_fail(res[r]);
        else if (di_grammar_from_ebnf(res[r], strlen(res[r]), "root", &g, &err)) fail_msg("%s", err.msg);
        di_grammar_matcher *m = NULL;
        if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
        for (const char *p = text[r]; *p; p++) {
            di_grammar_walk_stats w = gt_fill_checked(m, v, &tb, mask, res[r]);
            pushes[r] += w.pushes, reuses[r] += w.reuses, summaries[r] += w.summaries;
            char one[2] = {*p, 0};
            gt_accept_text(m, one);
        }
        di_grammar_matcher_free(m);
        for (uint64_t s = 1; s <= 4; s++) gt_walk(g, v, &tb, NULL, s * 6151 + (uint64_t)r, 30, res[r]);
        di_grammar_free(g);
    }
    tu_report("take back: e-mail %llu pushes, %llu taken back, %llu summaries; mixed classes %llu / %llu / %llu",
              (unsigned long long)pushes[0], (unsigned long long)reuses[0], (unsigned long long)summaries[0],
              (unsigned long long)pushes[1], (unsigned long long)reuses[1], (unsigned long long)summaries[1]);
    /* deterministic: 542 pushes with take_back, 602 without; the summaries are those computed
     * without it (a set taken back for the wrong byte or from other sets below changes them) */
    assert_true(pushes[0] < 570);
    assert_int_equal(summaries[0], 57);
    assert_int_equal(summaries[1], 32);
    free(mask);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static void test_leo_chains(void **state) {
    (void)state;
    static const char *res[] = {"x{0,60}y", "x{0,16}x{0,16}y"};
    static const size_t bound[] = {60, 32};
    static const size_t max_items[] = {12, 100}; /* largest set: 6 and 86 (64 and more without the jump) */
    for (size_t r = 0; r < 2; r++) {
        di_grammar *g = regex_or_fail(res[r]);
        size_t largest = 0;
        for (size_t n = 0; n <= 70; n++) {
            di_earley e;
            di_error err = {0};
            if (di_earley_init(&e, g->cfg, &err)) fail_msg("%s", err.msg);
            size_t k = 0;
            for (; k < n; k++) {
                int rc = di_earley_push(&e, 'x', &err);
                if (rc < 0) fail_msg("%s: %s", res[r], err.msg);
                if (rc == 0) break;
                size_t items = e.set_off[e.n_sets] - e.set_off[e.n_sets - 1];
                if (items > largest) largest = items;
            }
            bool all_x = k == n;
            assert_int_equal(all_x, n <= bound[r]);
            if (all_x) {
                int rc = di_earley_push(&e, 'y', &err);
                assert_true(rc == 1 && di_earley_accepting(&e));
            }
            di_earley_free(&e);
        }
        tu_report("leo chains: %s: largest set %zu items", res[r], largest);
        assert_true(largest <= max_items[r]);
        di_grammar_free(g);
    }
}

/* The bytes a state scans are recorded when its sets are first at hand (matcher.c: note_scan),
 * so a later walk that reaches it through known transitions rejects other bytes without
 * replaying the path to it. Masks before and after, and after a rollback into an earlier list
 * element, must equal brute force; every recorded scan set must agree with the transitions
 * learned by pushes (a live transition only on a scanned byte, a dead one only off it). */
static void test_scan_marks(void **state) {
    (void)state;
    static const char re[] = "\\[(a|bc|\"[a-f]{0,6}\")(, ?(a|bc|\"[a-f]{0,6}\"))*\\]";
    gt_bytes tb = gt_vocab_bytes(2000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_error err = {0};
    di_grammar *g = regex_or_fail(re);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    static const char text[] = "[\"ab\", a, \"cafe\",bc, \"d\"]";
    uint64_t replays_first = 0, replays_later = 0;
    for (size_t i = 0; text[i]; i++) {
        di_grammar_walk_stats before, after;
        di_grammar_matcher_walk_stats(m, &before);
        if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("%s", err.msg);
        di_grammar_matcher_walk_stats(m, &after);
        gt_check_mask(m, v, mask, (const uint8_t *const *)tb.b, tb.l, re);
        if (i < 8) replays_first += after.replays - before.replays;
        else replays_later += after.replays - before.replays;
        if (di_grammar_matcher_accept_token(m, (uint8_t)text[i] + 1, &err)) fail_msg("%s", err.msg); /* token b + 1 = byte b */
        if (i == 20) { /* back into the second element, then on again */
            if (di_grammar_matcher_rollback(m, 9, &err)) fail_msg("%s", err.msg);
            if (di_grammar_matcher_fill_mask(m, mask, &err)) fail_msg("%s", err.msg);
            gt_check_mask(m, v, mask, (const uint8_t *const *)tb.b, tb.l, re);
            for (size_t k = 12; k <= 20; k++)
                if (di_grammar_matcher_accept_token(m, (uint8_t)text[k] + 1, &err)) fail_msg("%s", err.msg);
        }
    }
    assert_true(di_grammar_matcher_can_end(m));
    /* this grammar's states scan at most 10 bytes ([a-f] , space quote bracket; none after the end) */
    const di_gcache_table *t = g->cache->cur;
    int32_t marked = 0;
    for (int32_t id = 1; id <= t->n; id++) {
        const di_cfg_class *sc = di_gcache_scan_get(t, id);
        if (!sc) continue;
        marked++;
        int n_scan = 0;
        for (int b = 0; b < 256; b++) {
            int32_t next = di_gcache_next(t, id, (uint8_t)b);
            bool scanned = di_cfg_class_has(sc, (uint8_t)b);
            n_scan += scanned;
            if (next == DI_ST_DEAD) assert_false(scanned);
            else if (next != DI_ST_UNKNOWN) assert_true(scanned);
        }
        assert_in_range(n_scan, 0, 10);
    }
    assert_true(marked * 2 >= t->n);
    tu_report("scan marks: %d of %d states marked", (int)marked, (int)t->n);
    tu_report("scan marks: %llu replays in the first 8 masks, %llu in the other %zu",
              (unsigned long long)replays_first, (unsigned long long)replays_later, strlen(text) - 8);
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Transitions are stored per byte class of the grammar (state_cache.h: bcls): bytes that no
 * terminal tells apart share one entry, so a row of `[a-z]+x[0-9]` has 4 entries (x, the other
 * letters, digits, all else) instead of 256. Masks stay equal to brute force, a transition learned
 * through one letter is the transition of every other one, the rows take 4 entries per state,
 * and the mask cache holds a slot only once it stored a mask (no 4 MiB up front). */
static void test_byte_class_rows(void **state) {
    (void)state;
    static const char re[] = "[a-z]+x[0-9]";
    gt_bytes tb = gt_vocab_bytes(2000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = regex_or_fail(re);
    assert_int_equal(g->cache->n_bcls, 4);
    assert_int_equal(g->cache->bcls['a'], g->cache->bcls['w']);
    assert_int_not_equal(g->cache->bcls['a'], g->cache->bcls['x']);
    assert_int_equal(g->cache->bcls['0'], g->cache->bcls['9']);
    assert_int_equal(g->cache->bcls['A'], g->cache->bcls[0xC3]);
    assert_null(g->cache->masks[0]);
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    static const char text[] = "abxqx7";
    for (size_t i = 0; text[i]; i++) {
        gt_fill_checked(m, v, &tb, mask, re);
        if (di_grammar_matcher_accept_token(m, (uint8_t)text[i] + 1, &err)) fail_msg("%s", err.msg);
    }
    const di_gcache_table *t = g->cache->cur;
    assert_int_equal(t->n_bcls, 4);
    /* one representative per class, its lowest byte: set_next_all stores a class's successor
     * through it alone, so a missing one would leave that class unknown in every row */
    bool seen[256] = {false};
    for (int b = 0; b < 256; b++) {
        assert_int_equal(di_cfg_class_has(&t->brep, (uint8_t)b), !seen[t->bcls[b]]);
        seen[t->bcls[b]] = true;
    }
    /* rows are 4 entries apart; the mapping has room for 256 classes (state_cache.c: table_keep) */
    assert_true(t->rows_bytes >= ((size_t)t->cap + 1) * 4 * sizeof(int16_t));
    int32_t live = 0;
    for (int32_t id = 1; id <= t->n; id++)
        for (int b = 'a'; b <= 'z'; b++) {
            if (b == 'x') continue;
            assert_int_equal(di_gcache_next(t, id, (uint8_t)b), di_gcache_next(t, id, 'a'));
            live += di_gcache_next(t, id, (uint8_t)b) > 0;
        }
    assert_true(live > 0);
    int slots = 0;
    for (int i = 0; i < DI_GCACHE_MASKS; i++) slots += g->cache->masks[i] != NULL;
    assert_in_range(slots, 1, (int)strlen(text));
    tu_report("byte classes: %u of %u bytes' rows, %d states, %d cached masks", (unsigned)t->n_bcls, 256u,
              (int)t->n, slots);
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* "(a|b|...|9" + tail into re[256]: a regex whose 62 letters and digits are 62 byte classes. */
static void alnum_alternatives(char *re, const char *tail) {
    strcpy(re, "(");
    for (const char *p = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"; *p; p++) {
        size_t l = strlen(re);
        re[l] = *p, re[l + 1] = '|', re[l + 2] = 0;
    }
    strcpy(re + strlen(re) - 1, tail);
}

/* A kept table commits its first rows and per-state arrays once (state_cache.c: POOL_TOUCH_ROWS),
 * so a later grammar whose states outgrow what the earlier ones used takes no page fault per 4 KiB
 * of new rows (~2.5 us each on the dev VM; schema_medium took ~55 on its cold masks, one on most).
 * 1,500 states of a grammar with 60+ byte classes (~180 KiB of rows) interned into the kept table
 * of a small grammar: far fewer faults than pages of rows (the key hash's growth may take a few). */
static void test_table_pool_committed(void **state) {
    (void)state;
    di_grammar *hold[2]; /* drain the pool, so that the small grammar's table is the one kept */
    for (int i = 0; i < 2; i++) {
        hold[i] = regex_or_fail("[0-9]+");
        di_gcache_release(hold[i]->cache, di_gcache_acquire(hold[i]->cache));
    }
    di_grammar *a = regex_or_fail("[0-9]+x");
    di_gcache_table *ta = di_gcache_acquire(a->cache);
    uintptr_t kept = (uintptr_t)ta;
    uint64_t s = 99;
    for (int i = 0; i < 10; i++) di_gcache_intern(a->cache, ta, (di_sig128){gt_rng(&s), gt_rng(&s)});
    di_gcache_release(a->cache, ta);
    di_grammar_free(a);
    char re[256];
    alnum_alternatives(re, ")+");
    di_grammar *b = regex_or_fail(re);
    di_gcache_table *t = di_gcache_acquire(b->cache);
    assert_true((uintptr_t)t == kept);
    assert_true(t->n_bcls >= 60);
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    for (int i = 0; i < 1500; i++) assert_true(di_gcache_intern(b->cache, t, (di_sig128){gt_rng(&s), gt_rng(&s)}) > 0);
    getrusage(RUSAGE_THREAD, &r1);
    long faults = r1.ru_minflt - r0.ru_minflt;
    size_t pages = (size_t)1501 * t->n_bcls * sizeof *t->rows / 4096;
    tu_report("1,500 states of %u byte classes (%zu pages of rows) into a kept table: %ld page faults", t->n_bcls,
              pages, faults);
    /* the commit itself, whatever the kernel backs the rows with (transparent huge pages fault less) */
    assert_true(t->touched >= (size_t)1501 * t->n_bcls * sizeof *t->rows);
    assert_true(faults < 16); /* ~55 without the committed pages */
    di_gcache_release(b->cache, t);
    di_grammar_free(b);
    for (int i = 0; i < 2; i++) di_grammar_free(hold[i]);
}

/* A new vocabulary puts a committed table into an empty pool (state_cache.c: di_gcache_pool_seed),
 * so the first grammar of a process neither maps a fresh table on its first mask nor takes a page
 * fault per 4 KiB of new rows (schema_medium alone took 56 over its cold masks). With the pool
 * drained, the vocabulary's table is the one the next grammar acquires: its masks equal brute
 * force, and 1,500 states of 60+ byte classes (~45 pages of rows) take far fewer faults than pages. */
static void test_table_pool_seeded(void **state) {
    (void)state;
    di_grammar *hold[2]; /* drain the pool */
    for (int i = 0; i < 2; i++) {
        hold[i] = regex_or_fail("[0-9]+");
        di_gcache_release(hold[i]->cache, di_gcache_acquire(hold[i]->cache));
    }
    gt_bytes tb = gt_vocab_bytes(3000);
    di_grammar_vocab *v = gt_vocab(&tb); /* seeds the empty pool */
    char re[256];
    alnum_alternatives(re, ")+;");
    di_grammar *b = regex_or_fail(re);
    assert_true(gt_walk(b, v, &tb, NULL, 7, 12, re) >= 12);
    di_gcache_table *t = di_gcache_acquire(b->cache);
    assert_true(t->n_bcls >= 60);
    assert_true(t->n >= 2);
    uint64_t s = 7;
    struct rusage r0, r1; /* around the interning only: the masks' own allocations fault too */
    getrusage(RUSAGE_THREAD, &r0);
    for (int i = 0; i < 1500; i++) assert_true(di_gcache_intern(b->cache, t, (di_sig128){gt_rng(&s), gt_rng(&s)}) > 0);
    getrusage(RUSAGE_THREAD, &r1);
    long faults = r1.ru_minflt - r0.ru_minflt;
    size_t pages = ((size_t)t->n + 1) * t->n_bcls * sizeof *t->rows / 4096;
    tu_report("first grammar after a new vocabulary: %d states of %u byte classes (%zu pages of rows), %ld page "
              "faults", (int)t->n, t->n_bcls, pages, faults);
    assert_true(t->touched >= ((size_t)t->n + 1) * t->n_bcls * sizeof *t->rows); /* committed, as above */
    assert_true(faults < 16); /* ~50 from a fresh table */
    di_gcache_release(b->cache, t);
    di_grammar_free(b);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
    for (int i = 0; i < 2; i++) di_grammar_free(hold[i]);
}

/* A freed grammar's table serves the next grammar's first walk (state_cache.c: table_keep), with
 * another partition of the bytes into classes, so the rows it kept must read as unknown: masks
 * of the second grammar equal brute force, and the first grammar's transitions are gone. The
 * pool is drained first (two grammars hold its tables), so the kept table is the one reused. */
static void test_table_pool(void **state) {
    (void)state;
    static const char re_a[] = "([a-f]+[0-9]|[g-m]x[.,;:]|[n-z]{2,5}@)+!", re_b[] = "[a-z]+x[0-9]";
    gt_bytes tb = gt_vocab_bytes(3000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *hold[2];
    for (int i = 0; i < 2; i++) {
        hold[i] = regex_or_fail("[0-9]+");
        di_gcache_release(hold[i]->cache, di_gcache_acquire(hold[i]->cache));
    }
    di_grammar *a = regex_or_fail(re_a);
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    if (di_grammar_matcher_new(a, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    static const char text_a[] = "abc7hx;pqrs@z";
    for (size_t i = 0; text_a[i]; i++) {
        gt_fill_checked(m, v, &tb, mask, re_a);
        if (di_grammar_matcher_accept_token(m, (uint8_t)text_a[i] + 1, &err)) fail_msg("%s", err.msg);
    }
    di_grammar_matcher_free(m);
    const di_gcache_table *ta = a->cache->cur;
    uintptr_t kept = (uintptr_t)ta;
    int32_t n_a = ta->n, nb_a = (int32_t)ta->n_bcls;
    assert_true(n_a >= 8);
    di_grammar_free(a);

    di_grammar *b = regex_or_fail(re_b);
    di_gcache_table *tb_ = di_gcache_acquire(b->cache);
    assert_true((uintptr_t)tb_ == kept);
    assert_int_equal(tb_->n, 0);
    assert_int_equal(tb_->n_bcls, 4);
    assert_int_not_equal(nb_a, 4);
    for (int32_t id = 1; id <= n_a; id++) {
        for (int c = 0; c < 256; c++) assert_int_equal(di_gcache_next(tb_, id, (uint8_t)c), DI_ST_UNKNOWN);
        assert_null(di_gcache_scan_get(tb_, id));
        di_gcache_loop ls;
        assert_false(di_gcache_loop_get(tb_, id, &ls));
    }
    di_gcache_release(b->cache, tb_);
    if (di_grammar_matcher_new(b, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    static const char text_b[] = "abxqx7";
    for (size_t i = 0; text_b[i]; i++) {
        gt_fill_checked(m, v, &tb, mask, re_b);
        if (di_grammar_matcher_accept_token(m, (uint8_t)text_b[i] + 1, &err)) fail_msg("%s", err.msg);
    }
    tu_report("table pool: %d states of %d classes cleared, reused for %d states of 4", (int)n_a, (int)nb_a,
              (int)b->cache->cur->n);
    di_grammar_matcher_free(m);
    free(mask);
    di_grammar_free(b);
    for (int i = 0; i < 2; i++) di_grammar_free(hold[i]);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A walk keyed relative to a boundary (context-free keys) reads the full signatures of the sets
 * it pushes only where a state falls back to full keys (after a context edge whose construct has
 * no boundary), so they are computed on demand (matcher.c: set_sig_of). From the second string
 * of a list on, the cold masks push 144 sets and compute 105 full signatures (159 when every
 * push computed one). Masks equal brute force before and after a rollback (the versions of
 * popped and re-pushed sets decide which signatures are current). */
static void test_lazy_full_sigs(void **state) {
    (void)state;
    static const char re[] = "root ::= \"[\" ws str (\",\" ws str)* \"]\"\n"
                             "str ::= \"\\\"\" [a-z ]{0,12} \"\\\"\"\nws ::= \" \"?\n";
    gt_bytes tb = gt_vocab_bytes(2000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = NULL;
    di_error err = {0};
    if (di_grammar_from_ebnf(re, strlen(re), "root", &g, &err)) fail_msg("%s", err.msg);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    static const char text[] = "[\"ab\", \"cd e\", \"x\"]";
    uint64_t pushes = 0, sigs = 0;
    for (size_t i = 0; text[i]; i++) {
        di_grammar_walk_stats w = gt_fill_checked(m, v, &tb, mask, re);
        if (i >= 7) pushes += w.pushes, sigs += w.full_sigs; /* inside the second string and after */
        if (di_grammar_matcher_accept_token(m, (uint8_t)text[i] + 1, &err)) fail_msg("%s", err.msg);
        if (i == 12) {
            if (di_grammar_matcher_rollback(m, 4, &err)) fail_msg("%s", err.msg);
            gt_fill_checked(m, v, &tb, mask, re);
            gt_accept_text(m, "d e\"");
        }
    }
    gt_fill_checked(m, v, &tb, mask, re);
    assert_true(di_grammar_matcher_can_end(m));
    tu_report("lazy full signatures: %llu pushes, %llu full signatures", (unsigned long long)pushes,
              (unsigned long long)sigs);
    assert_true(pushes >= 20);
    assert_true(sigs * 5 <= pushes * 4); /* 105 of 144; computed at every push: 159 */
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A loop summary checks that every UTF-8 character leads where a plain character does: 8 byte
 * shapes, ~26 pushes per summary, one summary per count of a length-bounded string. Where the
 * shape's bytes are scanned only by byte rules predicted in the state (`c -> [\xE1-\xEC]
 * [\x80-\xBF] [\x80-\xBF]`) that complete the same nonterminals as the plain character's rule,
 * the successor is the same without pushing (shape_completes). Masks stay equal to brute force. */
static void test_utf8_shapes_static(void **state) {
    (void)state;
    static const char re[] = "\"[^\"\\\\]{0,40}\"";
    gt_bytes tb = gt_vocab_bytes(4000);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = regex_or_fail(re);
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    static const char text[] = "\"ab c\xC3\xA9" "def\xE2\x82\xAC" "gh";
    di_grammar_walk_stats w = {0};
    for (size_t i = 0;; i++) {
        di_grammar_walk_stats d = gt_fill_checked(m, v, &tb, mask, re);
        w.pushes += d.pushes, w.summaries += d.summaries, w.shapes_static += d.shapes_static;
        if (!text[i]) break;
        if (di_grammar_matcher_accept_token(m, (uint8_t)text[i] + 1, &err)) fail_msg("%s", err.msg);
    }
    tu_report("counted string: %llu pushes, %llu summaries, %llu shapes decided without pushing",
              (unsigned long long)w.pushes, (unsigned long long)w.summaries, (unsigned long long)w.shapes_static);
    assert_true(w.summaries >= 17);
    assert_true(w.shapes_static >= 8 * 16); /* every shape of every count's summary */
    assert_true(w.pushes < 1000); /* 681 with the test, 1409 without (deterministic) */
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Block masks start from the text tokens outside their block's classes (di_vocab_text_minus),
 * kept per vocabulary for recent class sets and built from the largest kept subset of a new set.
 * Every result equals the tokens whose class bits miss the set, over a sequence of sets that
 * hits kept ones, extends them by a class or two (the subset path), and cycles through more sets
 * than the memo holds (replacement); each path is taken at least once. */
static void test_class_memo(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(4257);
    di_grammar_vocab *v = gt_vocab(&tb);
    size_t words = di_grammar_mask_words(v->n_vocab);
    uint32_t *mask = malloc(words * sizeof *mask); /* [ceil(V/32)] u32 */
    assert_non_null(v->class_memo);
    uint64_t seed = 0x5EEDC1A55ull;
    uint32_t prev[4] = {0x2200006fu, 0x2200006fu, 0x2200006fu, 0x2200006fu};
    int hits = 0, subsets = 0, fresh = 0, calls = 0;
    for (int round = 0; round < 120; round++) {
        uint32_t r = (uint32_t)gt_rng(&seed), cls;
        switch (r % 4) {
        case 0: cls = prev[(r >> 8) % 4]; break;                                   /* a kept set, likely */
        case 1: cls = prev[(r >> 8) % 4] | 1u << ((r >> 12) % DI_N_CLASSES); break; /* one class more */
        case 2: cls = prev[(r >> 8) % 4] | 3u << ((r >> 12) % (DI_N_CLASSES - 1)); break;
        default: cls = (uint32_t)gt_rng(&seed) & (uint32_t)gt_rng(&seed); break;   /* unrelated */
        }
        /* what the memo holds before the call decides the path */
        struct di_class_memo *cm = v->class_memo;
        bool exact = false, sub = false;
        for (int i = 0; i < DI_CLASS_MEMO; i++)
            if (cm->slot[i].used) {
                exact |= cm->slot[i].classes == cls;
                sub |= cm->slot[i].classes != cls && !(cm->slot[i].classes & ~cls);
            }
        hits += exact, subsets += !exact && sub, fresh += !exact && !sub;
        memset(mask, 0xA5, words * sizeof *mask);
        di_vocab_text_minus(v, cls, mask);
        calls++;
        for (uint32_t t = 0; t < v->n_vocab; t++) {
            bool want = ((v->text[t >> 5] >> (t & 31)) & 1) && !(v->tok_class[t] & cls);
            if (((mask[t >> 5] >> (t & 31)) & 1) != want)
                fail_msg("classes %08x: token %u is %d, expected %d (call %d)", cls, t, !want, want, calls);
        }
        prev[round % 4] = cls;
    }
    tu_report("class memo: %d calls, %d kept sets, %d from a kept subset, %d computed", calls, hits, subsets, fresh);
    assert_true(hits >= 10 && subsets >= 10 && fresh >= DI_CLASS_MEMO + 2);
    free(mask);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Block masks take the prefix a walked token shares with the previous one from class_lcp (a
 * running minimum over the class list) instead of comparing bytes: that is exact only because the
 * tokens sharing a prefix are contiguous in trie preorder. Checked on every pair of entries of
 * every class list within 64 of each other (the minimum against the bytes), with long tokens that
 * share 20-40 bytes, then block masks over that vocabulary against brute force. */
static void test_class_prefix(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(3000);
    for (uint32_t i = 300; i < tb.n; i += 37) { /* "aaaa...\"x": long shared prefixes, then a quote */
        uint32_t n = 20 + i % 21;
        free(tb.b[i]);
        tb.b[i] = malloc(n + 2);
        memset(tb.b[i], 'a', n);
        tb.b[i][n] = '"';
        tb.b[i][n + 1] = (uint8_t)('a' + i % 26);
        tb.l[i] = n + 2;
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    size_t pairs = 0, long_shared = 0, listed = 0;
    /* each list holds exactly the text tokens of its class, once each, in trie preorder, and each
     * record holds its token's bytes and class bits (what loop_mask reads instead of the token) */
    for (int k = 0; k < DI_N_CLASSES; k++) {
        uint32_t in_class = 0;
        for (uint32_t t = 0; t < v->n_vocab; t++) in_class += (v->tok_class[t] >> k) & 1;
        assert_int_equal(v->class_off[k + 1] - v->class_off[k], in_class);
        uint32_t last_pre = 0;
        for (uint32_t x = v->class_off[k]; x < v->class_off[k + 1]; x++) {
            const di_class_ent *ce = &v->class_ent[x];
            assert_true(ce->tok >= 0 && (uint32_t)ce->tok < v->n_vocab);
            assert_int_equal(ce->bits, v->tok_class[ce->tok]);
            assert_true((ce->bits >> k) & 1);
            assert_int_equal(ce->len, tb.l[ce->tok]);
            assert_memory_equal(v->blob + ce->off, tb.b[ce->tok], ce->len);
            uint32_t pre = 0; /* the record's preorder position: where its bytes sit in the blob */
            while (pre < v->n_pre && v->pre_off[pre] < ce->off) pre++;
            assert_true(pre < v->n_pre && v->pre_off[pre] == ce->off);
            if (x > v->class_off[k]) assert_true(pre > last_pre);
            last_pre = pre;
            listed++;
        }
    }
    tu_report("class list records checked: %zu", listed);
    for (int k = 0; k < DI_N_CLASSES; k++)
        for (uint32_t x = v->class_off[k]; x < v->class_off[k + 1]; x++) {
            if (x == v->class_off[k]) assert_int_equal(v->class_lcp[x], 0);
            uint32_t run = UINT32_MAX;
            for (uint32_t y = x + 1; y < v->class_off[k + 1] && y < x + 64; y++) {
                if (v->class_lcp[y] < run) run = v->class_lcp[y];
                const di_class_ent *a = &v->class_ent[x], *b = &v->class_ent[y];
                uint32_t l = 0;
                while (l < a->len && l < b->len && v->blob[a->off + l] == v->blob[b->off + l]) l++;
                assert_int_equal(run, l);
                pairs++;
                long_shared += l >= 20;
            }
        }
    tu_report("class list pairs checked: %zu (%zu sharing >= 20 bytes)", pairs, long_shared);
    assert_true(long_shared > 100);
    di_grammar *g = regex_or_fail("\"([^\"\\\\]|\\\\.)*\"[a-z]");
    int checked = 0;
    memset(&gt_stats, 0, sizeof gt_stats);
    for (uint64_t s = 1; s <= 4; s++) checked += gt_walk(g, v, &tb, NULL, s * 7919, 30, "class prefix");
    assert_true(gt_stats.block_masks > 0);
    assert_true(checked > 20);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* The per-walk memo of context edges is keyed by the parent's boundary as well as its state: in
 * `term ::= "(" expr " "` every closing space completes into the context, and the state after one
 * closing space (keyed relative to its own boundary) is the state after two, with another context
 * below it. Keyed by state and byte only, the walk of "        " after "(((((9" took the sixth
 * space from the memo and allowed 8 spaces with 5 parentheses open (found by fuzz_ebnf). */
/* The arrays masks read live in one 2 MiB-aligned mapping advised for transparent huge pages
 * (vocab.c: vocab_pack; twelfth round: the first masks of a request paid hundreds of TLB misses
 * on 4 KiB pages). Checks the placement, that the copies hold the tokens, that the kernel
 * took the advice where THP is not off, and masks against brute force on such a vocabulary. */
static bool in_arena(const di_grammar_vocab *v, const void *p, size_t n) {
    const uint8_t *a = v->arena, *q = p;
    return q >= a && q + n <= a + v->arena_len;
}

static void test_vocab_huge_pages(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(3000);
    di_grammar_vocab *v = gt_vocab(&tb);
    assert_non_null(v->arena);
    assert_int_equal((uintptr_t)v->arena % (2u << 20), 0);
    assert_int_equal(v->arena_len % (2u << 20), 0);
    size_t words = di_grammar_mask_words(v->n_vocab);
    assert_true(in_arena(v, v->nodes, (size_t)v->n_nodes * sizeof *v->nodes));
    assert_true(in_arena(v, v->tok_start, ((size_t)v->n_nodes + 1) * sizeof *v->tok_start));
    assert_true(in_arena(v, v->pre_tok, ((size_t)v->n_pre + 1) * sizeof *v->pre_tok));
    assert_true(in_arena(v, v->by_class, (size_t)DI_N_CLASSES * words * sizeof *v->by_class));
    assert_true(in_arena(v, v->class_ent, ((size_t)v->class_off[DI_N_CLASSES] + 1) * sizeof *v->class_ent));
    assert_true(in_arena(v, v->class_lcp, ((size_t)v->class_off[DI_N_CLASSES] + 1) * sizeof *v->class_lcp));
    assert_true(in_arena(v, v->blob, (size_t)v->blob_off[v->n_vocab] + 1));
    const void *small[] = {v->text, v->pre_off, v->blob_off, v->tok_class, v->lens, v->special, v->dup_next};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) assert_true(in_arena(v, small[i], 1));
    for (uint32_t t = 0; t < tb.n; t++) { /* the copies hold the tokens */
        assert_int_equal(v->lens[t], tb.l[t]);
        if (tb.l[t]) assert_memory_equal(v->blob + v->blob_off[t], tb.b[t], tb.l[t]);
    }
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = 0;
        mode[strcspn(mode, "\n")] = 0;
        fclose(f);
    }
    if (mode[0] && !strstr(mode, "[never]")) { /* the kernel honours MADV_HUGEPAGE: the mapping is eligible */
        FILE *sm = fopen("/proc/self/smaps", "r");
        char line[256], head[32];
        snprintf(head, sizeof head, "%lx-", (unsigned long)(uintptr_t)v->arena);
        int found = 0, eligible = -1;
        while (sm && fgets(line, sizeof line, sm)) {
            bool range = isxdigit((unsigned char)line[0]) && strchr(line, '-') && strchr(line, ' ');
            if (range) found = !strncmp(line, head, strlen(head)); /* a mapping's first line */
            else if (found && !strncmp(line, "THPeligible:", 12)) eligible = atoi(line + 12), found = 0;
        }
        if (sm) fclose(sm);
        tu_report("THP mode %.40s arena %zu KiB, THPeligible %d", mode, v->arena_len >> 10, eligible);
        if (eligible >= 0) assert_int_equal(eligible, 1);
    }
    di_grammar *g = regex_or_fail("\\{\"[a-z]{1,12}\": (true|[0-9]{1,4})\\}");
    memset(&gt_stats, 0, sizeof gt_stats);
    int checked = 0;
    for (uint64_t s = 1; s <= 3; s++) checked += gt_walk(g, v, &tb, NULL, s * 104729, 20, "huge pages");
    assert_true(checked > 10);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static void test_ctx_memo_boundary(void **state) {
    (void)state;
    static const char *multi[] = {"  ", "    ", "        ", "(("};
    gt_bytes tb = gt_single_bytes(4);
    for (uint32_t i = 0; i < 4; i++) {
        tb.l[257 + i] = (uint32_t)strlen(multi[i]);
        tb.b[257 + i] = malloc(tb.l[257 + i]);
        memcpy(tb.b[257 + i], multi[i], tb.l[257 + i]);
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    static const char *src = "root ::= expr\nexpr ::= term ((\"-\"\"+ \" |) term)*\n"
                             "term ::= [0-9]+ | \"(\" expr \" \"\n";
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(src, strlen(src), NULL, &g, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask);
    uint64_t ctx = 0;
    for (int open = 1; open <= 9; open++) {
        di_grammar_matcher *m = NULL;
        if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
        for (int k = 0; k < open; k++) {
            gt_fill_checked(m, v, &tb, mask, "open");
            gt_accept_text(m, "(");
        }
        gt_accept_text(m, "9");
        for (int k = 0; k <= open; k++) { /* after the number and after each closing space */
            ctx += gt_fill_checked(m, v, &tb, mask, "close").ctx_edges;
            if (k < open) gt_accept_text(m, " ");
        }
        di_grammar_matcher_free(m);
    }
    tu_report("nesting closed by spaces: %llu context edges", (unsigned long long)ctx);
    assert_true(ctx > 0);
    free(mask);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Walks from different states that accept the same token subtrees whole take their union from
 * the first such walk, and walks that accept nearly the same subtrees shift an earlier union by
 * the difference (di_trie_union). After each `;` of `(k=[a-z_]+;){1,9}` the state is new (the
 * count left differs), the root takes only `k`, and under `k=` every subtree of letters and `_`
 * is accepted whole by the state that loops on them: the same 3,000 tokens in every walk. In
 * `(k=[a-z_]+;k=[a-z]+;){1,5}` every other walk's loop lacks `_`: the subtree `k=q` holding them
 * is entered (its children without `_` accepted whole instead). Masks stay equal
 * to brute force. */
static void test_whole_subtree_union(void **state) {
    (void)state;
    gt_bytes tb = gt_single_bytes(3000);
    uint64_t s = 12345;
    for (uint32_t i = 257; i < tb.n; i++) { /* "k=" and 1-5 letters (`_` after a `q`), a few with a ';' after them */
        char buf[16] = "k=";
        int k = 1 + (int)(gt_rng(&s) % 5);
        for (int j = 0; j < k; j++) buf[2 + j] = j && buf[2] == 'q' && gt_rng(&s) % 3 == 0 ? '_' : (char)('a' + gt_rng(&s) % 26);
        if (i % 10 == 0) buf[2 + k] = ';';
        tb.l[i] = (uint32_t)strlen(buf);
        tb.b[i] = malloc(tb.l[i]);
        memcpy(tb.b[i], buf, tb.l[i]);
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    static const char *pats[] = {"(k=[a-z_]+;){1,9}", "(k=[a-z_]+;k=[a-z]+;){1,5}"};
    di_grammar_walk_stats w[2] = {{0}};
    for (int p = 0; p < 2; p++) {
        di_grammar *g = regex_or_fail(pats[p]);
        di_grammar_matcher *m = NULL;
        di_error err = {0};
        if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
        uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
        for (int count = 0; count < 8; count++) {
            di_grammar_walk_stats d = gt_fill_checked(m, v, &tb, mask, pats[p]); /* after ";" (or at the start) */
            w[p].walks += d.walks, w[p].blocks += d.blocks;
            w[p].union_hits += d.union_hits, w[p].union_shifts += d.union_shifts, w[p].walk_hits += d.walk_hits;
            gt_accept_text(m, count % 2 ? "k=ab;" : "k=xy;");
        }
        tu_report("%s: %llu walks, %llu subtrees accepted whole, unions %llu reused, %llu shifted", pats[p],
                  (unsigned long long)w[p].walks, (unsigned long long)w[p].blocks, (unsigned long long)w[p].union_hits,
                  (unsigned long long)w[p].union_shifts);
        free(mask);
        di_grammar_matcher_free(m);
        di_grammar_free(g);
    }
    assert_int_equal(w[0].walks, 8); /* every count is a new state */
    assert_true(w[0].blocks >= 8 * 20);
    assert_int_equal(w[0].union_hits, 7); /* all but the first walk */
    assert_int_equal(w[0].union_shifts, 0);
    assert_int_equal(w[1].walks, 8);
    assert_true(w[1].union_shifts >= 1); /* the first walk without `_`, from the first walk's union (2) */
    /* the rest: the same lists again (5), or the whole walk from the one of the previous pair (walk_trie) */
    assert_int_equal(w[1].union_hits + w[1].union_shifts + w[1].walk_hits, 7);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* A trie walk from a context-free root is cached without the subtrees where it first reaches the
 * context (walk_trie). In `y(x[a-e]*( [a-e]+){0,6}\.){1,2}` the states inside a word of the first and
 * the second sentence have one context-free key, and `.` completes the sentence into the context:
 * `.x...` continues the first sentence's text but not the second's. The second sentence's masks come
 * from the first's walks (cached walks) with the `.` subtree walked again, and stay equal to brute
 * force: they fail if the cached copy keeps the first context's `.x` tokens, or if the listed subtree
 * is not walked again (`.` itself would be missing). */
static void test_walk_cache(void **state) {
    (void)state;
    gt_bytes tb = gt_single_bytes(4000);
    uint64_t s = 777;
    for (uint32_t i = 257; i < tb.n; i++) { /* letters and spaces, some after or before a '.' */
        char buf[16] = {0};
        int k = 2 + (int)(gt_rng(&s) % 6), j = 0;
        if (i % 50 == 0) buf[j++] = '.', buf[j++] = i % 100 ? 'x' : ' ';
        for (; j < k; j++) buf[j] = gt_rng(&s) % 4 == 0 ? ' ' : (char)('a' + gt_rng(&s) % 6); /* 'f' ends a walk */
        if (i % 40 == 0) buf[j++] = '.';
        tb.l[i] = (uint32_t)strlen(buf);
        tb.b[i] = malloc(tb.l[i]);
        memcpy(tb.b[i], buf, tb.l[i]);
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = regex_or_fail("y(x[a-e]*( [a-e]+){0,6}\\.){1,2}");
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    static const char *words[] = {"xab", " cd", " ea"};
    di_grammar_walk_stats w[2] = {{0}};
    gt_accept_text(m, "y"); /* the repetition's states are keyed in full at the top level */
    for (int sentence = 0; sentence < 2; sentence++) {
        for (int k = 0; k < 3; k++) {
            gt_accept_text(m, words[k]);
            di_grammar_walk_stats d = gt_fill_checked(m, v, &tb, mask, words[k]);
            w[sentence].walks += d.walks, w[sentence].walk_hits += d.walk_hits, w[sentence].edges += d.edges;
        }
        gt_accept_text(m, ".");
    }
    tu_report("sentence 1: %llu walks (%llu edges), sentence 2: %llu walks, %llu from the cache (%llu edges)",
              (unsigned long long)w[0].walks, (unsigned long long)w[0].edges, (unsigned long long)w[1].walks,
              (unsigned long long)w[1].walk_hits, (unsigned long long)w[1].edges);
    assert_int_equal(w[0].walk_hits, 0);
    assert_int_equal(w[1].walks, 3);     /* new states for the mask cache (the sentence count differs) */
    assert_int_equal(w[1].walk_hits, 3); /* one context-free root each */
    assert_true(w[1].edges * 4 < w[0].edges);
    free(mask);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Walks skip the children of the first two trie levels whose byte their parent's state does not
 * scan (walk_root, walk_kids). The layout they read: the root's children and each one's children
 * in ascending byte order, contiguous in preorder. After `{` of a JSON-like pattern the states
 * scan ` `, `"` and `}`: the other root children and the other children of the wide node " " are
 * not visited. A state that scans enough bytes for a block keeps all its children visited, so a
 * big dead child still asks for its summary (" " + [A-Z]..., 64 or more nodes, before the small
 * subtrees " a".." z" of ` [a-z]*`, which then are accepted whole). Masks match brute force. */
static void test_kid_skips(void **state) {
    (void)state;
    gt_bytes tb = gt_single_bytes(3000);
    uint64_t s = 4242;
    uint32_t i = 257;
    char buf[8];
    for (; i < 257 + 200; i++) { /* " A" + 1-4 capitals: one big subtree */
        int k = 3 + (int)(gt_rng(&s) % 4);
        buf[0] = ' ', buf[1] = 'A';
        for (int j = 2; j < k; j++) buf[j] = (char)('A' + gt_rng(&s) % 26);
        tb.l[i] = (uint32_t)k;
        tb.b[i] = malloc((size_t)k);
        memcpy(tb.b[i], buf, (size_t)k);
    }
    for (int x = 0; x < 26; x++) /* " x", " xa" .. " xd": 26 subtrees of 5 nodes */
        for (int y = 0; y < 5; y++, i++) {
            buf[0] = ' ', buf[1] = (char)('a' + x), buf[2] = (char)('a' + y - 1);
            tb.l[i] = y ? 3 : 2;
            tb.b[i] = malloc(3);
            memcpy(tb.b[i], buf, 3);
        }
    for (int c = 0x21; c <= 0x40; c++, i++) { /* " !" .. " @": " " has 59 children */
        tb.l[i] = 2;
        tb.b[i] = malloc(2);
        tb.b[i][0] = ' ', tb.b[i][1] = (uint8_t)c;
    }
    for (; i < tb.n; i++) { /* other tokens: letters after a first byte other than ` `, `{`, `}`, `"` */
        int k = 2 + (int)(gt_rng(&s) % 3);
        do buf[0] = (char)(0x21 + gt_rng(&s) % 94);
        while (buf[0] == '{' || buf[0] == '}' || buf[0] == '"');
        for (int j = 1; j < k; j++) buf[j] = (char)('a' + gt_rng(&s) % 26);
        tb.l[i] = (uint32_t)k;
        tb.b[i] = malloc((size_t)k);
        memcpy(tb.b[i], buf, (size_t)k);
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    assert_int_equal(v->n_root_kids, 256);
    assert_non_null(v->kid2_off);
    uint32_t sp = 0;
    for (uint32_t k = 0; k < v->n_root_kids; k++) {
        const di_trie_node *nd = &v->nodes[v->root_kid[k]];
        assert_int_equal(nd->depth, 1);
        assert_int_equal(nd->byte, v->root_byte[k]);
        assert_int_equal(nd->end, v->root_kid[k + 1]);
        if (k) assert_true(v->root_byte[k - 1] < v->root_byte[k]);
        if (nd->byte == ' ') sp = k;
        for (uint32_t x = v->kid2_off[k]; x < v->kid2_off[k + 1]; x++) {
            const di_trie_node *c = &v->nodes[v->kid2[x]];
            assert_int_equal(c->depth, 2);
            assert_int_equal(c->byte, v->kid2_byte[x]);
            assert_int_equal(v->kid2[x], x == v->kid2_off[k] ? v->root_kid[k] + 1 : v->nodes[v->kid2[x - 1]].end);
            if (x > v->kid2_off[k]) assert_true(v->kid2_byte[x - 1] < v->kid2_byte[x]);
        }
        if (v->kid2_off[k + 1] > v->kid2_off[k])
            assert_int_equal(v->nodes[v->kid2[v->kid2_off[k + 1] - 1]].end, v->root_kid[k + 1]);
    }
    assert_int_equal(v->root_kid[v->n_root_kids], v->n_nodes);
    uint32_t under_sp = v->kid2_off[sp + 1] - v->kid2_off[sp];
    assert_int_equal(under_sp, 59);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    di_error err = {0};
    di_grammar *g = regex_or_fail("\\{( *\"[a-z]+\": *[0-9]+,)* *\\}");
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    di_grammar_walk_stats d = gt_fill_checked(m, v, &tb, mask, "start");
    assert_int_equal(d.kid_skips, 255); /* only `{` visited, which has no children */
    gt_accept_text(m, "{");
    d = gt_fill_checked(m, v, &tb, mask, "after {");
    tu_report("after `{`: %llu children skipped (256 at the root, %u under a space)", (unsigned long long)d.kid_skips,
              under_sp);
    assert_int_equal(d.kid_skips, 253 + under_sp - 1); /* ` `, `"`, `}` and " \"" visited */
    gt_accept_text(m, " \"ab\": 12,");
    (void)gt_fill_checked(m, v, &tb, mask, "after ,");
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    g = regex_or_fail("x [a-z]*");
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    gt_accept_text(m, "x");
    d = gt_fill_checked(m, v, &tb, mask, "after x");
    tu_report("after `x`: %llu skipped, %llu summaries, %llu subtrees whole", (unsigned long long)d.kid_skips,
              (unsigned long long)d.summaries, (unsigned long long)d.blocks);
    assert_int_equal(d.kid_skips, 255); /* " " scans [a-z]: all its children visited */
    assert_true(d.blocks >= 26);        /* " a".." z", by the summary " A" asked for */
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    free(mask);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* The single bytes and `extra` tokens of 2..max_len bytes drawn from alpha. */
static gt_bytes alpha_vocab(uint32_t extra, uint64_t seed, const char *alpha, int max_len) {
    gt_bytes tb = gt_single_bytes(extra);
    size_t na = strlen(alpha);
    for (uint32_t i = 257; i < tb.n; i++) {
        tb.l[i] = 2 + (uint32_t)(gt_rng(&seed) % (uint64_t)(max_len - 1));
        tb.b[i] = malloc(tb.l[i]);
        for (uint32_t j = 0; j < tb.l[i]; j++) tb.b[i][j] = (uint8_t)alpha[gt_rng(&seed) % na];
    }
    return tb;
}

/* Boundary 1 (the top level's first set as context) where the construct that started there can
 * start elsewhere too: a statement of the top level and one inside a block share context-free
 * keys, so the nested statement's mask after `=` is the top-level walk taken from the cache. A
 * pattern's top-level sequence starts nowhere else: keyed in full, so the tokens that end the
 * text are no context edges. Every mask is compared with brute force. */
static void test_top_level_boundary(void **state) {
    (void)state;
    gt_bytes tb = alpha_vocab(3000, 4242, "abcdeabcde =;{}.@", 6);
    di_grammar_vocab *v = gt_vocab(&tb);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    di_error err = {0};
    static const char gbnf[] = "root ::= stmt+\n"
                               "stmt ::= [a-e]+ \" = \" [a-e]+ (\" \" [a-e]+)* \";\" | \"{\" stmt+ \"}\"\n";
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(gbnf, strlen(gbnf), "root", &g, &err)) fail_msg("%s", err.msg);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    gt_accept_text(m, "ab = ");
    di_grammar_walk_stats top = gt_fill_checked(m, v, &tb, mask, "top-level statement after =");
    gt_accept_text(m, "c;{d = ");
    di_grammar_walk_stats inner = gt_fill_checked(m, v, &tb, mask, "nested statement after =");
    tu_report("after =: top level %llu edges, nested %llu edges (%llu from the cache)", (unsigned long long)top.edges,
              (unsigned long long)inner.edges, (unsigned long long)inner.walk_hits);
    assert_int_equal(top.walks, 1);
    assert_int_equal(inner.walks, 1);
    assert_int_equal(inner.walk_hits, 1);
    assert_true(inner.edges * 4 < top.edges);
    di_grammar_matcher_free(m);
    di_grammar_free(g);

    g = regex_or_fail("[a-e]{1,6}@[a-e]{1,6}(\\.[a-e]{2,3}){1,2}");
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    gt_accept_text(m, "ab@cd");
    di_grammar_walk_stats end = gt_fill_checked(m, v, &tb, mask, "pattern before its last part");
    tu_report("pattern: %llu edges, %llu context edges", (unsigned long long)end.edges, (unsigned long long)end.ctx_edges);
    assert_int_equal(end.ctx_edges, 0);
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    free(mask);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Accept texts[0..n) in turn on gbnf (rule root) over vocabulary tb, filling the mask after each
 * (compared with brute force) into st[k]; then end, which must complete the text. */
static void ebnf_walk_texts(const char *gbnf, gt_bytes *tb, const char *const *texts, size_t n, const char *end,
                            di_grammar_walk_stats *st) {
    di_grammar_vocab *v = gt_vocab(tb);
    uint32_t *mask = malloc(di_grammar_mask_words(tb->n) * sizeof *mask); /* [ceil(V/32)] u32 */
    di_error err = {0};
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(gbnf, strlen(gbnf), "root", &g, &err)) fail_msg("%s", err.msg);
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
    for (size_t k = 0; k < n; k++) {
        gt_accept_text(m, texts[k]);
        st[k] = gt_fill_checked(m, v, tb, mask, texts[k]);
    }
    gt_accept_text(m, end);
    assert_true(di_grammar_matcher_can_end(m));
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    free(mask);
    di_grammar_vocab_free(v);
}

/* EBNF `X (S X)*` is built as one separated list (ebnf.c, separated_list), and the effect of
 * completing a list that an optional group waits on in the same set enters keys as "completes
 * the group", as the later elements' chain does (matcher.c, effect_closure). Together the
 * states inside the first and the second argument are one key: the second argument's mask is a
 * mask-cache hit. Either part alone leaves them apart. Masks are compared with brute force. */
static void test_separated_list_keys(void **state) {
    (void)state;
    gt_bytes tb = alpha_vocab(600, 99, "abcde(),+ ", 5);
    static const char gbnf[] = "root ::= name \"(\" (expr (\",\" \" \"? expr)*)? \")\"\n"
                               "expr ::= name (\" + \" name)*\n"
                               "name ::= [a-e]+\n";
    /* the first argument, the second, its second term (two letters, as "cd": a `+` loop's first
     * letter is a state of its own) */
    static const char *const texts[] = {"e(ab", ", cd", " + de"};
    di_grammar_walk_stats st[3];
    ebnf_walk_texts(gbnf, &tb, texts, 3, ")", st);
    tu_report("first argument: %llu walks; second: %llu cached; its second term: %llu cached",
              (unsigned long long)st[0].walks, (unsigned long long)st[1].cached, (unsigned long long)st[2].cached);
    assert_int_equal(st[0].walks, 1);
    assert_int_equal(st[1].cached, 1);
    assert_int_equal(st[2].cached, 1); /* `name (" + " name)*`: the same for a term of an expression */
    gt_bytes_free(&tb);
}

/* Masks of at most DI_GCACHE_LIST_MAX tokens are kept in the mask cache as their token list
 * (state_cache.h, mlist): a second matcher of the grammar at the same state gets the mask back from
 * the list. The vocabulary holds tokens with equal bytes (DI_TRIE_DUP: the list must hold every one
 * of them) and a few-token state next to one whose walk accepts letter subtrees whole (that mask
 * must stay a full copy: its list misses those subtrees). Each mask, first walked and then from the
 * cache, is compared with brute force. */
static void test_mask_lists(void **state) {
    (void)state;
    gt_bytes tb = alpha_vocab(1200, 2027, "abcde", 4);
    for (uint32_t i = 300; i < 955; i++) { /* ":a" to ":e" three times each, then "=aaaa" to "=eeee" */
        uint32_t x = i - 300;
        free(tb.b[i]);
        tb.l[i] = x < 30 ? 2 : 5;
        tb.b[i] = malloc(tb.l[i]);
        if (x < 30) {
            tb.b[i][0] = ':', tb.b[i][1] = (uint8_t)('a' + x % 5);
        } else {
            x -= 30;
            tb.b[i][0] = '=';
            for (int j = 4, y = (int)x; j >= 1; j--, y /= 5) tb.b[i][j] = (uint8_t)('a' + y % 5);
        }
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    uint32_t *mask = malloc(di_grammar_mask_words(tb.n) * sizeof *mask); /* [ceil(V/32)] u32 */
    di_error err = {0};
    static const char gbnf[] = "root ::= ( [a-e] \":\" [a-e]* \";\" | \"=\" [a-z]* \";\" )+\n";
    di_grammar *g = NULL;
    if (di_grammar_from_ebnf(gbnf, strlen(gbnf), "root", &g, &err)) fail_msg("%s", err.msg);
    /* after a letter: the `:` tokens only; after `=`: a block mask (the run's summary); after `;`:
     * a walk that accepts the `=` + letters subtrees whole */
    static const char *const texts[] = {"b", ":a;=", "a;"};
    di_grammar_walk_stats first[3], again[3];
    uint64_t lists[3];
    for (int r = 0; r < 2; r++) {
        di_grammar_matcher *m = NULL;
        if (di_grammar_matcher_new(g, v, NULL, &m, &err)) fail_msg("%s", err.msg);
        for (int k = 0; k < 3; k++) {
            gt_accept_text(m, texts[k]);
            (r ? again : first)[k] = gt_fill_checked(m, v, &tb, mask, texts[k]);
            if (!r) lists[k] = g->cache->n_list_puts;
        }
        di_grammar_matcher_free(m);
    }
    tu_report("after a letter: %llu list(s) stored, then %llu cached; after `;`: %llu subtrees whole, %llu lists "
              "stored, then %llu cached",
              (unsigned long long)lists[0], (unsigned long long)again[0].cached, (unsigned long long)first[2].blocks,
              (unsigned long long)(lists[2] - lists[1]), (unsigned long long)again[2].cached);
    assert_int_equal(first[0].walks, 1);
    assert_int_equal(lists[0], 1);        /* the 31 `:` tokens: a list */
    assert_int_equal(again[0].cached, 1); /* and from it, equal to brute force */
    assert_true(first[2].blocks > 0);     /* `=` + letters subtrees accepted whole */
    assert_int_equal(lists[2], lists[1]); /* so the mask is copied whole */
    for (int k = 0; k < 3; k++) assert_int_equal(again[k].cached, 1);
    di_grammar_free(g);
    free(mask);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* The longest repeated element wins: in `str ":" ws value ("," ws str ":" ws value)*` the list
 * is (str ":" ws value) separated by ("," ws), not value separated by ("," ws str ":" ws), so the
 * second member's key and value are the first member's places: its mask after `:` is a
 * mask-cache hit of the first's (with the shortest element, value alone, it is another walk).
 * Masks are compared with brute force. */
static void test_separated_list_longest(void **state) {
    (void)state;
    gt_bytes tb = alpha_vocab(1500, 31337, "ab1{}\":, ", 5);
    static const char gbnf[] = "root ::= \"{\" ws ( str \":\" ws value (\",\" ws str \":\" ws value)* )? \"}\"\n"
                               "value ::= str | [1]+ ws\n"
                               "str ::= \"\\\"\" [ab]* \"\\\"\" ws\n"
                               "ws ::= \" \"?\n";
    static const char *const texts[] = {"{\"a\":", " 11, \"b\":"}; /* after the first and the second member's `:` */
    di_grammar_walk_stats st[2];
    ebnf_walk_texts(gbnf, &tb, texts, 2, "\"ab\"}", st);
    tu_report("first member: %llu walks; second: %llu cached", (unsigned long long)st[0].walks,
              (unsigned long long)st[1].cached);
    assert_int_equal(st[0].walks, 1);
    assert_int_equal(st[1].cached, 1);
    gt_bytes_free(&tb);
}

/* The separated-list rewrite keeps the language: the bench's statement and JSON grammars, whose
 * `X (S X)*` are rewritten, against the same grammars with the repetition moved into a rule of
 * its own (not rewritten), on one random walk each: equal masks at every step, and the token
 * accepted next is drawn from them. Brute force cannot tell (it reads the rewritten grammar). */
static void test_separated_list_language(void **state) {
    (void)state;
    gt_bytes tb = gt_single_bytes(1500);
    uint64_t s = 4711;
    static const char *pieces[] = {"x", "y", "f", "if", "return", " ", "=", "+", "-", "*", "<", "==", "&&", "(", ")",
                                   ",", ";", "\n", "    ", "{", "}", "1", "0", "[", "]", "\"", ":", "true", "a",
                                   "\\n", "e", ".", "null"};
    for (uint32_t i = 257; i < tb.n; i++) {
        char buf[64] = "";
        int k = 1 + (int)(gt_rng(&s) % 3);
        for (int j = 0; j < k; j++) strncat(buf, pieces[gt_rng(&s) % 33], sizeof buf - strlen(buf) - 1);
        tb.l[i] = (uint32_t)strlen(buf);
        tb.b[i] = malloc(tb.l[i]);
        memcpy(tb.b[i], buf, tb.l[i]);
    }
    di_grammar_vocab *v = gt_vocab(&tb);
    static const char *pairs[][2] = {
        {"root ::= stmt+\n"
         "stmt ::= ident ws \"=\" ws expr \";\" nl | \"if\" ws \"(\" expr \")\" ws \"{\" nl stmt* \"}\" nl | \"return\" ws expr \";\" nl\n"
         "expr ::= operand (ws op ws operand)*\n"
         "operand ::= ident | [0-9]+ | ident \"(\" (expr (\",\" ws expr)*)? \")\"\n"
         "op ::= \"+\" | \"-\" | \"*\" | \"<\" | \"==\" | \"&&\"\n"
         "ident ::= [a-zA-Z_] [a-zA-Z0-9_]*\n"
         "ws ::= \" \"?\n"
         "nl ::= \"\\n\" \"    \"*\n",
         "root ::= stmt+\n"
         "stmt ::= ident ws \"=\" ws expr \";\" nl | \"if\" ws \"(\" expr \")\" ws \"{\" nl stmt* \"}\" nl | \"return\" ws expr \";\" nl\n"
         "expr ::= operand ops\n"
         "ops ::= (ws op ws operand)*\n"
         "operand ::= ident | [0-9]+ | ident \"(\" (expr args)? \")\"\n"
         "args ::= (\",\" ws expr)*\n"
         "op ::= \"+\" | \"-\" | \"*\" | \"<\" | \"==\" | \"&&\"\n"
         "ident ::= [a-zA-Z_] [a-zA-Z0-9_]*\n"
         "ws ::= \" \"?\n"
         "nl ::= \"\\n\" \"    \"*\n"},
        {"root ::= object\n"
         "value ::= object | array | \"\\\"\" [a-z]* \"\\\"\" ws | [0-9]+ ws | (\"true\" | \"null\") ws\n"
         "object ::= \"{\" ws ( str \":\" ws value (\",\" ws str \":\" ws value)* )? \"}\" ws\n"
         "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
         "str ::= \"\\\"\" [a-z]* \"\\\"\" ws\n"
         "ws ::= (\" \" | \"\\n\")?\n",
         "root ::= object\n"
         "value ::= object | array | \"\\\"\" [a-z]* \"\\\"\" ws | [0-9]+ ws | (\"true\" | \"null\") ws\n"
         "object ::= \"{\" ws ( str \":\" ws value members )? \"}\" ws\n"
         "members ::= (\",\" ws str \":\" ws value)*\n"
         "array ::= \"[\" ws ( value elements )? \"]\" ws\n"
         "elements ::= (\",\" ws value)*\n"
         "str ::= \"\\\"\" [a-z]* \"\\\"\" ws\n"
         "ws ::= (\" \" | \"\\n\")?\n"},
    };
    size_t words = di_grammar_mask_words(tb.n);
    uint32_t *ma = malloc(words * sizeof *ma), *mb = malloc(words * sizeof *mb); /* [words] u32 each */
    int steps = 0;
    for (int k = 0; k < 2; k++) {
        di_grammar *ga = NULL, *gb = NULL;
        di_error err = {0};
        if (di_grammar_from_ebnf(pairs[k][0], strlen(pairs[k][0]), "root", &ga, &err)) fail_msg("%s", err.msg);
        if (di_grammar_from_ebnf(pairs[k][1], strlen(pairs[k][1]), "root", &gb, &err)) fail_msg("%s", err.msg);
        di_grammar_matcher *a = NULL, *b = NULL;
        if (di_grammar_matcher_new(ga, v, NULL, &a, &err) || di_grammar_matcher_new(gb, v, NULL, &b, &err))
            fail_msg("%s", err.msg);
        for (int step = 0; step < 150; step++, steps++) {
            if (di_grammar_matcher_fill_mask(a, ma, &err) || di_grammar_matcher_fill_mask(b, mb, &err)) fail_msg("%s", err.msg);
            assert_memory_equal(ma, mb, words * sizeof *ma);
            int32_t pick[64];
            int np = 0;
            for (uint32_t t = 1; t < tb.n && np < 64; t++) { /* longer tokens, few that close: lists get long */
                bool closes = memchr(tb.b[t], '}', tb.l[t]) || memchr(tb.b[t], ']', tb.l[t]);
                if ((ma[t >> 5] >> (t & 31)) & 1 && (tb.l[t] > 1 || gt_rng(&s) % 8 == 0) && (!closes || gt_rng(&s) % 8 == 0))
                    pick[np++] = (int32_t)t;
            }
            if (!np) break;
            int32_t t = pick[gt_rng(&s) % (uint64_t)np];
            if (di_grammar_matcher_accept_token(a, t, &err) || di_grammar_matcher_accept_token(b, t, &err))
                fail_msg("%s", err.msg);
        }
        di_grammar_matcher_free(a);
        di_grammar_matcher_free(b);
        di_grammar_free(ga);
        di_grammar_free(gb);
    }
    tu_report("separated lists: %d masks equal to the grammars written without them", steps);
    assert_true(steps >= 200);
    free(ma);
    free(mb);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static void test_rollback_and_eos(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = regex_or_fail("ab+");
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    assert_int_equal(di_grammar_matcher_new(g, v, NULL, &m, &err), DI_OK);
    assert_false(di_grammar_matcher_can_end(m));
    assert_int_equal(di_grammar_matcher_accept_token(m, 'b' + 1, &err), DI_ERR_INVALID);
    assert_int_equal(di_grammar_matcher_accept_token(m, GT_EOS, &err), DI_ERR_INVALID);
    assert_int_equal(di_grammar_matcher_accept_token(m, 'a' + 1, &err), DI_OK);
    assert_int_equal(di_grammar_matcher_accept_token(m, 'b' + 1, &err), DI_OK);
    assert_int_equal(di_grammar_matcher_accept_token(m, 'b' + 1, &err), DI_OK);
    assert_true(di_grammar_matcher_can_end(m));
    assert_int_equal(di_grammar_matcher_rollback(m, 2, &err), DI_OK);
    assert_false(di_grammar_matcher_can_end(m));
    assert_int_equal(di_grammar_matcher_n_accepted(m), 1);
    assert_int_equal(di_grammar_matcher_rollback(m, 5, &err), DI_ERR_INVALID);
    assert_int_equal(di_grammar_matcher_accept_token(m, 'b' + 1, &err), DI_OK);
    assert_int_equal(di_grammar_matcher_accept_token(m, GT_EOS, &err), DI_OK);
    assert_true(di_grammar_matcher_finished(m));
    uint32_t mask[9];
    assert_int_equal(di_grammar_matcher_fill_mask(m, mask, &err), DI_OK);
    assert_int_equal(mask[0], 1u); /* only EOS */
    for (int i = 1; i < 9; i++) assert_int_equal(mask[i], 0);
    /* rollback past EOS reopens the request */
    assert_int_equal(di_grammar_matcher_rollback(m, 1, &err), DI_OK);
    assert_false(di_grammar_matcher_finished(m));
    assert_int_equal(di_grammar_matcher_accept_token(m, 'b' + 1, &err), DI_OK);
    assert_int_equal(di_grammar_matcher_accept_token(m, 1000, &err), DI_ERR_INVALID);
    /* the mask applied to logits: exactly the disallowed entries become -inf */
    float logits[257];
    for (int t = 0; t < 257; t++) logits[t] = (float)t;
    assert_int_equal(di_grammar_matcher_fill_mask(m, mask, &err), DI_OK);
    di_grammar_mask_apply(mask, logits, 257);
    for (int t = 0; t < 257; t++) {
        bool allowed = t == GT_EOS || t == 'b' + 1;
        if (allowed) assert_true(logits[t] == (float)t);
        else assert_true(isinf(logits[t]) && logits[t] < 0);
    }
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

static void test_thinking_and_stop(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(400);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = regex_or_fail("\\{(a|b|c)*\\}(x|END)*");
    di_grammar_matcher_opts o = {.thinking = true};
    int checked = 0;
    for (uint64_t s = 1; s <= 4; s++) checked += gt_walk(g, v, &tb, &o, s * 31, 25, "thinking");
    const char *stops[] = {"END"};
    di_grammar_matcher_opts so = {.stop = stops, .n_stop = 1};
    for (uint64_t s = 1; s <= 4; s++) checked += gt_walk(g, v, &tb, &so, s * 131, 25, "stop");
    tu_report("thinking/stop masks checked against brute force: %d", checked);

    /* explicit: free text, then "</think>{" (token 257) switches to the grammar mid-token */
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    assert_int_equal(di_grammar_matcher_new(g, v, &o, &m, &err), DI_OK);
    assert_int_equal(di_grammar_matcher_accept_token(m, 'z' + 1, &err), DI_OK);
    assert_int_equal(di_grammar_matcher_accept_token(m, GT_EOS, &err), DI_ERR_INVALID);
    assert_int_equal(di_grammar_matcher_accept_token(m, 257, &err), DI_OK);
    assert_int_equal(di_grammar_matcher_accept_token(m, 'z' + 1, &err), DI_ERR_INVALID);
    assert_int_equal(di_grammar_matcher_accept_token(m, '}' + 1, &err), DI_OK);
    assert_true(di_grammar_matcher_can_end(m));
    di_grammar_matcher_free(m);
    /* stop string: after "END" only EOS */
    assert_int_equal(di_grammar_matcher_new(g, v, &so, &m, &err), DI_OK);
    const char *txt = "{a}xEN";
    for (const char *p = txt; *p; p++) assert_int_equal(di_grammar_matcher_accept_token(m, (uint8_t)*p + 1, &err), DI_OK);
    assert_false(di_grammar_matcher_finished(m));
    assert_int_equal(di_grammar_matcher_accept_token(m, 'D' + 1, &err), DI_OK);
    assert_true(di_grammar_matcher_finished(m));
    assert_int_equal(di_grammar_matcher_accept_token(m, 'x' + 1, &err), DI_ERR_INVALID);
    assert_int_equal(di_grammar_matcher_rollback(m, 1, &err), DI_OK);
    assert_false(di_grammar_matcher_finished(m));
    di_grammar_matcher_free(m);
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Exponential-backtracking patterns are linear-time here (Earley has no backtracking); huge
 * nested counts stay within the grammar size bound or fail with a clear error. */
static void test_hostile_regex(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(0);
    di_grammar_vocab *v = gt_vocab(&tb);
    static const char *pats[] = {"(a*)*b", "(a|a)*b", "(a+)+b", "((a*)*)*b", "(a|aa|aaa)*b", "(a*a*)*b"};
    char s[1001];
    memset(s, 'a', 1000);
    s[1000] = 0;
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++) {
        di_grammar *g = regex_or_fail(pats[i]);
        double t0 = now_s();
        s[999] = 'b';
        int r = feed_all(g, v, s, 1000);
        s[999] = 'a';
        double dt = now_s() - t0;
        tu_report("hostile /%s/ on 1000 bytes: %.1f ms (%s)", pats[i], dt * 1e3, r == 1 ? "matched" : "limit error");
        /* either the right answer or the ambiguity limit, and never slow */
        assert_true(r == 1 || r == DI_ERR_LIMIT);
        assert_true(dt < 5.0);
        di_grammar_free(g);
    }
    /* nested counts share symbols, so ((a{100}){100}){100} is three short rules */
    di_grammar *g = regex_or_fail("((a{100}){100}){100}");
    assert_false(gram_match(g, v, s, 100));
    di_grammar_free(g);
    /* nested bounded counts stay additive in size (the inner symbol is shared), so compiling is
     * fast; matching is bounded by the ambiguity limit */
    double t0 = now_s();
    di_grammar *h = regex_or_fail("(a{0,100000}){0,100000}");
    int r = feed_all(h, v, s, 300);
    tu_report("(a{0,100000}){0,100000}: compile+300 bytes %.1f ms (%s)", (now_s() - t0) * 1e3,
              r == 1 ? "matched" : "limit error");
    assert_true(r == 1 || r == DI_ERR_LIMIT);
    assert_true(now_s() - t0 < 5.0);
    di_grammar_free(h);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Matchers share only immutable data (grammar, vocab), so masks computed on several threads at
 * once must equal the masks computed on one thread. */
typedef struct thr_job {
    const di_grammar *g;
    const di_grammar_vocab *v;
    const int32_t *toks; /* [n] token sequence to replay */
    size_t n, words;
    const uint32_t *want; /* [n][words] masks from the single-threaded run */
    int mismatches;
} thr_job;

static void *thr_run(void *arg) {
    thr_job *j = arg;
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_new(j->g, j->v, NULL, &m, NULL)) {
        j->mismatches = -1;
        return NULL;
    }
    uint32_t *mask = malloc(j->words * 4);
    for (int rep = 0; rep < 3; rep++) {
        for (size_t i = 0; i < j->n; i++) {
            if (di_grammar_matcher_fill_mask(m, mask, NULL) || memcmp(mask, j->want + i * j->words, j->words * 4))
                j->mismatches++;
            if (di_grammar_matcher_accept_token(m, j->toks[i], NULL)) j->mismatches++;
        }
        di_grammar_matcher_rollback(m, j->n, NULL);
    }
    free(mask);
    di_grammar_matcher_free(m);
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    gt_bytes tb = gt_vocab_bytes(400);
    di_grammar_vocab *v = gt_vocab(&tb);
    di_grammar *g = regex_or_fail("\\{(\"[a-c]+\":(true|null|-?\\d+),)*\"x\":\"[^\"]*\"\\}");
    const char *text = "{\"ab\":12,\"c\":null,\"x\":\"hello world\"}";
    size_t n = strlen(text), words = di_grammar_mask_words(tb.n);
    int32_t *toks = malloc(n * sizeof *toks);
    uint32_t *want = malloc(n * words * 4);
    di_grammar_matcher *m = NULL;
    di_error err = {0};
    assert_int_equal(di_grammar_matcher_new(g, v, NULL, &m, &err), DI_OK);
    for (size_t i = 0; i < n; i++) {
        toks[i] = (uint8_t)text[i] + 1;
        assert_int_equal(di_grammar_matcher_fill_mask(m, want + i * words, &err), DI_OK);
        assert_int_equal(di_grammar_matcher_accept_token(m, toks[i], &err), DI_OK);
    }
    assert_true(di_grammar_matcher_can_end(m));
    di_grammar_matcher_free(m);
    /* the threads get a second compilation, so they start with an empty shared cache instead of
     * the masks the single-threaded run left in g */
    di_grammar *g2 = regex_or_fail("\\{(\"[a-c]+\":(true|null|-?\\d+),)*\"x\":\"[^\"]*\"\\}");
    enum { NT = 4 };
    pthread_t th[NT];
    thr_job jobs[NT];
    for (int t = 0; t < NT; t++) {
        jobs[t] = (thr_job){.g = g2, .v = v, .toks = toks, .n = n, .words = words, .want = want};
        assert_int_equal(pthread_create(&th[t], NULL, thr_run, &jobs[t]), 0);
    }
    for (int t = 0; t < NT; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(jobs[t].mismatches, 0);
    }
    tu_report("threads: %d matchers x 3 replays of %zu masks agree with the single-threaded masks", NT, n);
    free(toks);
    free(want);
    di_grammar_free(g);
    di_grammar_free(g2);
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

/* Two matchers of one cold compiled grammar fill masks at the same time from two threads, so the
 * grammar's shared state automaton and mask cache are built by both at once; every mask must equal
 * brute force (each token's bytes tried on the thread's own matcher). The threads walk random
 * paths (one shared seed, so they race on the same states, and one own seed each), with the
 * default table capacity and with a tiny one, so that tables fill up and are replaced while the
 * other thread may still be walking the old one. */
typedef struct race_job {
    const di_grammar *g;
    const di_grammar_vocab *v;
    const gt_bytes *tb;
    pthread_barrier_t *start;
    uint64_t seed;
    int checked, wrong, errors;
} race_job;

static void *race_run(void *arg) {
    race_job *j = arg;
    di_grammar_matcher *m = NULL;
    size_t words = di_grammar_mask_words(j->tb->n);
    uint32_t *mask = malloc(words * 4), *allowed = malloc(j->tb->n * sizeof *allowed);
    pthread_barrier_wait(j->start);
    if (!mask || !allowed || di_grammar_matcher_new(j->g, j->v, NULL, &m, NULL)) {
        j->errors++;
        goto out;
    }
    uint64_t s = j->seed;
    for (int step = 0; step < 40; step++) {
        if (di_grammar_matcher_fill_mask(m, mask, NULL)) {
            j->errors++;
            break;
        }
        uint32_t n_allowed = 0;
        for (uint32_t t = 0; t < j->tb->n; t++) {
            bool want = t == GT_EOS ? di_grammar_matcher_can_end(m)
                                    : di_grammar_matcher_try_bytes(m, j->tb->b[t], j->tb->l[t]);
            if (gt_bit(mask, t) != want) j->wrong++;
            if (t != GT_EOS && gt_bit(mask, t)) allowed[n_allowed++] = t;
        }
        j->checked++;
        if (!n_allowed) break;
        if (di_grammar_matcher_accept_token(m, (int32_t)allowed[gt_rng(&s) % n_allowed], NULL)) j->errors++;
        if (step % 9 == 8 && di_grammar_matcher_rollback(m, 2, NULL)) j->errors++;
    }
out:
    di_grammar_matcher_free(m);
    free(mask);
    free(allowed);
    return NULL;
}

static void test_shared_cache_race(void **state) {
    (void)state;
    static const char *pats[] = {
        "\\{(\"[a-c]+\":(true|null|-?\\d+(\\.\\d+)?),)*\"x\":\"[^\"]*\"\\}",
        "(\\[([a-z]+|\"[^\"]{0,8}\")(,[a-z0-9]+)*\\] ?)+",
        "é+中?😀{0,2}x|(ue|al|se|f|ll|true|null)+END",
    };
    gt_bytes tb = gt_vocab_bytes(400);
    di_grammar_vocab *v = gt_vocab(&tb);
    int checked = 0;
    uint64_t n_tables_default = 0;
    for (size_t p = 0; p < sizeof pats / sizeof pats[0]; p++) {
        for (uint64_t round = 0; round < 4; round++) {
            di_grammar *g = regex_or_fail(pats[p]); /* fresh grammar: its cache starts empty */
            bool tiny = round >= 2;
            if (tiny) di_gcache_set_max_states(g->cache, 8);
            pthread_barrier_t start;
            pthread_barrier_init(&start, NULL, 2);
            race_job jobs[2];
            pthread_t th[2];
            for (int t = 0; t < 2; t++) {
                /* even rounds: same seed (same states, racing inserts); odd rounds: own seeds */
                uint64_t seed = 0x1234567ull * (round + 1) + (round & 1 ? (uint64_t)t * 7777 : 0);
                jobs[t] = (race_job){.g = g, .v = v, .tb = &tb, .start = &start, .seed = seed};
                assert_int_equal(pthread_create(&th[t], NULL, race_run, &jobs[t]), 0);
            }
            for (int t = 0; t < 2; t++) {
                pthread_join(th[t], NULL);
                assert_int_equal(jobs[t].errors, 0);
                if (jobs[t].wrong) fail_msg("%s: %d mask bits differ from brute force (thread %d, round %d)", pats[p],
                                            jobs[t].wrong, t, (int)round);
                assert_true(jobs[t].checked > 0);
                checked += jobs[t].checked;
            }
            pthread_barrier_destroy(&start);
            if (tiny) assert_true(g->cache->n_tables > 1); /* the replacement path ran */
            else n_tables_default += g->cache->n_tables;
            di_grammar_free(g);
        }
    }
    tu_report("shared cache: %d masks filled concurrently by 2 matchers of one grammar equal brute force", checked);
    assert_true(checked >= 100);
    assert_int_equal(n_tables_default, 2 * sizeof pats / sizeof pats[0]); /* one table each, never full */
    di_grammar_vocab_free(v);
    gt_bytes_free(&tb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex_vs_pcre2),   cmocka_unit_test(test_regex_errors),
        cmocka_unit_test(test_regex_masks),      cmocka_unit_test(test_fast_paths), cmocka_unit_test(test_repetition_boundary),
        cmocka_unit_test(test_counted_chain), cmocka_unit_test(test_leo_chains), cmocka_unit_test(test_separated_list),    cmocka_unit_test(test_scan_marks),
        cmocka_unit_test(test_open_construct_boundary),
        cmocka_unit_test(test_summary_precheck), cmocka_unit_test(test_stamp_after_growth),
        cmocka_unit_test(test_replay_reuse),     cmocka_unit_test(test_learn_ahead), cmocka_unit_test(test_summary_take_back),     cmocka_unit_test(test_byte_class_rows), cmocka_unit_test(test_table_pool),
        cmocka_unit_test(test_table_pool_committed),
        cmocka_unit_test(test_table_pool_seeded),
        cmocka_unit_test(test_lazy_full_sigs),   cmocka_unit_test(test_utf8_shapes_static),
        cmocka_unit_test(test_whole_subtree_union),
        cmocka_unit_test(test_walk_cache),       cmocka_unit_test(test_top_level_boundary),
        cmocka_unit_test(test_kid_skips),
        cmocka_unit_test(test_separated_list_keys), cmocka_unit_test(test_separated_list_language),
        cmocka_unit_test(test_separated_list_longest), cmocka_unit_test(test_predicted_once),
        cmocka_unit_test(test_mask_lists),
        cmocka_unit_test(test_bare_terminals),
        cmocka_unit_test(test_class_prefix), cmocka_unit_test(test_class_memo),
        cmocka_unit_test(test_ctx_memo_boundary), cmocka_unit_test(test_vocab_huge_pages),
        cmocka_unit_test(test_rollback_and_eos),
        cmocka_unit_test(test_thinking_and_stop), cmocka_unit_test(test_hostile_regex),
        cmocka_unit_test(test_threads),          cmocka_unit_test(test_shared_cache_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
