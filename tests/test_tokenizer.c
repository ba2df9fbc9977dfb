/* Tokenizer: ids identical to HF `tokenizers` on the generated corpus (added-token recognition on and
 * off), decode and streaming decode, invalid UTF-8, empty and very long input, lookups, load errors.
 * Expected data: tests/data/tokenizer/corpus.jsonl from scripts/gen_tokenizer_golden.py.  di-test: asan */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "text/tokenizer.h"

#define TOKENIZER_PATH "data/tokenizer/deepseek-v4/tokenizer.json"

typedef struct corpus_line {
    char *text;
    size_t len;
    json_t *on, *off, *dec; /* off / dec NULL when equal to on / text */
} corpus_line;

static di_tokenizer *g_tok;
static corpus_line *g_lines;
static size_t g_n;

static int setup(void **state) {
    (void)state;
    di_error err = {0};
    if (di_tok_load(TOKENIZER_PATH, &g_tok, &err)) {
        fprintf(stderr, "loading %s: %s\n", TOKENIZER_PATH, err.msg);
        return -1;
    }
    FILE *f = fopen(tu_data("tokenizer/corpus.jsonl"), "rb");
    if (!f) return -1;
    size_t cap = 0;
    char *line = NULL;
    ssize_t nr;
    size_t lcap = 0;
    while ((nr = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)nr, JSON_ALLOW_NUL, &je);
        if (!o) {
            fprintf(stderr, "corpus line %zu: %s\n", g_n + 1, je.text);
            return -1;
        }
        if (g_n == cap) g_lines = realloc(g_lines, (cap = cap ? cap * 2 : 1024) * sizeof *g_lines);
        corpus_line *c = &g_lines[g_n++];
        const char *t = json_string_value(json_object_get(o, "t"));
        c->len = json_string_length(json_object_get(o, "t"));
        c->text = malloc(c->len + 1);
        memcpy(c->text, t, c->len + 1);
        c->on = json_incref(json_object_get(o, "on"));
        c->off = json_incref(json_object_get(o, "off"));
        c->dec = json_incref(json_object_get(o, "dec"));
        json_decref(o);
    }
    free(line);
    fclose(f);
    return g_n >= 2000 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < g_n; i++) {
        free(g_lines[i].text);
        json_decref(g_lines[i].on);
        json_decref(g_lines[i].off);
        json_decref(g_lines[i].dec);
    }
    free(g_lines);
    di_tok_free(g_tok);
    return 0;
}

static bool ids_equal(const int32_t *ids, size_t n, json_t *want) {
    if (json_array_size(want) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, i)) != ids[i]) return false;
    return true;
}

static void check_corpus(int special) {
    size_t bad = 0, tokens = 0, bytes = 0;
    for (size_t i = 0; i < g_n; i++) {
        corpus_line *c = &g_lines[i];
        int32_t *ids;
        size_t n;
        di_error err = {0};
        assert_int_equal(di_tok_encode(g_tok, c->text, c->len, special, &ids, &n, &err), DI_OK);
        json_t *want = (!special && c->off) ? c->off : c->on;
        if (!ids_equal(ids, n, want)) {
            if (bad < 5) {
                char *w = json_dumps(want, JSON_COMPACT);
                fprintf(stderr, "# mismatch (special=%d) line %zu: %.200s\n#   want %.300s\n#   got ", special, i + 1,
                        c->text, w);
                for (size_t k = 0; k < n && k < 40; k++) fprintf(stderr, "%d,", ids[k]);
                fprintf(stderr, "\n");
                free(w);
            }
            bad++;
        }
        tokens += n;
        bytes += c->len;
        free(ids);
    }
    tu_report("tokenizer corpus special=%d: %zu strings, %zu bytes, %zu tokens, %zu mismatches", special, g_n, bytes,
              tokens, bad);
    assert_int_equal(bad, 0);
}

static void test_corpus_special_on(void **state) {
    (void)state;
    check_corpus(1);
}

static void test_corpus_special_off(void **state) {
    (void)state;
    check_corpus(0);
    /* the corpus must actually exercise the difference */
    size_t differ = 0;
    for (size_t i = 0; i < g_n; i++) differ += g_lines[i].off != NULL;
    assert_true(differ >= 100);
}

static char *stream_all(const int32_t *ids, size_t n, size_t *out_len);

static int32_t *json_ids(json_t *a, size_t *n) {
    *n = json_array_size(a);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return ids;
}

static void test_decode_roundtrip(void **state) {
    (void)state;
    size_t lossy = 0;
    for (size_t i = 0; i < g_n; i++) {
        corpus_line *c = &g_lines[i];
        size_t n, len;
        int32_t *ids = json_ids(c->on, &n);
        char *text;
        di_error err = {0};
        assert_int_equal(di_tok_decode(g_tok, ids, n, &text, &len, &err), DI_OK);
        const char *want = c->dec ? json_string_value(c->dec) : c->text;
        size_t wlen = c->dec ? json_string_length(c->dec) : c->len;
        lossy += c->dec != NULL;
        if (len != wlen || memcmp(text, want, len)) fail_msg("decode of line %zu: got '%s' want '%s'", i + 1, text, want);
        assert_int_equal(text[len], 0);
        free(text);
        free(ids);
    }
    tu_report("tokenizer decode: %zu strings identical to HF decode (%zu where HF decode != input)", g_n, lossy);
}

/* Random id sequences (special tokens, split and broken UTF-8) decode exactly as HF decode does. */
static void test_decode_golden(void **state) {
    (void)state;
    FILE *f = fopen(tu_data("tokenizer/decode.jsonl"), "rb");
    assert_non_null(f);
    char *line = NULL;
    size_t lcap = 0, cases = 0, replaced = 0;
    ssize_t nr;
    while ((nr = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)nr, JSON_ALLOW_NUL, &je);
        assert_non_null(o);
        size_t n, len, slen;
        int32_t *ids = json_ids(json_object_get(o, "ids"), &n);
        json_t *want = json_object_get(o, "text");
        char *text, *streamed;
        assert_int_equal(di_tok_decode(g_tok, ids, n, &text, &len, NULL), DI_OK);
        if (len != json_string_length(want) || memcmp(text, json_string_value(want), len))
            fail_msg("decode case %zu: got '%s' want '%s'", cases + 1, text, json_string_value(want));
        streamed = stream_all(ids, n, &slen);
        assert_int_equal(slen, len);
        assert_memory_equal(streamed, text, len);
        replaced += strstr(text, "\xEF\xBF\xBD") != NULL;
        cases++;
        free(text);
        free(streamed);
        free(ids);
        json_decref(o);
    }
    free(line);
    fclose(f);
    tu_report("tokenizer decode golden: %zu id sequences identical to HF (%zu with U+FFFD)", cases, replaced);
    assert_true(cases >= 400 && replaced >= 100);
}

/* model.md §6.1 sanity vector (V4 vocabulary). */
static void test_sanity_vector(void **state) {
    (void)state;
    const char *s = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
    const int32_t want[] = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
    int32_t *ids;
    size_t n;
    di_error err = {0};
    assert_int_equal(di_tok_encode(g_tok, s, strlen(s), 1, &ids, &n, &err), DI_OK);
    assert_int_equal(n, 8);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    /* with recognition off the literals are ordinary text: many more tokens, none of them added */
    assert_int_equal(di_tok_encode(g_tok, s, strlen(s), 0, &ids, &n, &err), DI_OK);
    assert_true(n > 20);
    for (size_t i = 0; i < n; i++) assert_false(di_tok_is_added(g_tok, ids[i]));
    free(ids);
}

static char *stream_all(const int32_t *ids, size_t n, size_t *out_len) {
    di_detok *d = di_detok_new(g_tok);
    assert_non_null(d);
    size_t cap = 64, len = 0;
    char *acc = malloc(cap);
    for (size_t i = 0; i <= n; i++) {
        char *t;
        size_t l;
        di_error err = {0};
        if (i < n) assert_int_equal(di_detok_push(d, ids[i], &t, &l, &err), DI_OK);
        else assert_int_equal(di_detok_flush(d, &t, &l), DI_OK);
        assert_int_equal(t[l], 0);
        while (len + l + 1 > cap) acc = realloc(acc, cap *= 2);
        memcpy(acc + len, t, l);
        len += l;
        free(t);
    }
    acc[len] = 0;
    di_detok_free(d);
    *out_len = len;
    return acc;
}

static void test_stream_decode(void **state) {
    (void)state;
    /* over the whole corpus, push-by-push output concatenates to the one-shot decode */
    for (size_t i = 0; i < g_n; i++) {
        size_t n, len, slen;
        int32_t *ids = json_ids(g_lines[i].on, &n);
        char *one, *streamed;
        assert_int_equal(di_tok_decode(g_tok, ids, n, &one, &len, NULL), DI_OK);
        streamed = stream_all(ids, n, &slen);
        assert_int_equal(slen, len);
        assert_memory_equal(streamed, one, len);
        free(one);
        free(streamed);
        free(ids);
    }
    /* "🎉" (F0 9F 8E 89) as single-byte tokens: nothing comes out until the fourth byte */
    const uint8_t party[4] = {0xF0, 0x9F, 0x8E, 0x89};
    di_detok *d = di_detok_new(g_tok);
    for (int k = 0; k < 4; k++) {
        int32_t id = di_tok_lookup_bytes(g_tok, (const char *)party + k, 1);
        assert_true(id >= 0);
        char *t;
        size_t l;
        assert_int_equal(di_detok_push(d, id, &t, &l, NULL), DI_OK);
        if (k < 3) assert_int_equal(l, 0);
        else assert_string_equal(t, "🎉");
        free(t);
    }
    /* an unfinished character at flush becomes one U+FFFD; a stray continuation byte becomes one at once */
    char *t;
    size_t l;
    assert_int_equal(di_detok_push(d, di_tok_lookup_bytes(g_tok, "\xE4", 1), &t, &l, NULL), DI_OK);
    assert_int_equal(l, 0);
    free(t);
    assert_int_equal(di_detok_push(d, di_tok_lookup_bytes(g_tok, "\xBD", 1), &t, &l, NULL), DI_OK);
    assert_int_equal(l, 0); /* E4 BD is still a valid prefix of 你 (E4 BD A0) */
    free(t);
    assert_int_equal(di_detok_flush(d, &t, &l), DI_OK);
    assert_string_equal(t, "\xEF\xBF\xBD");
    free(t);
    assert_int_equal(di_detok_push(d, di_tok_lookup_bytes(g_tok, "\x80", 1), &t, &l, NULL), DI_OK);
    assert_string_equal(t, "\xEF\xBF\xBD");
    free(t);
    /* a lead byte followed by a non-continuation: the lead alone is replaced, the ASCII survives */
    assert_int_equal(di_detok_push(d, di_tok_lookup_bytes(g_tok, "\xE4", 1), &t, &l, NULL), DI_OK);
    free(t);
    assert_int_equal(di_detok_push(d, di_tok_lookup_bytes(g_tok, "a", 1), &t, &l, NULL), DI_OK);
    assert_string_equal(t, "\xEF\xBF\xBD" "a");
    free(t);
    di_error err = {0};
    assert_int_equal(di_detok_push(d, 129280, &t, &l, &err), DI_ERR_INVALID);
    assert_null(t);
    assert_non_null(strstr(err.msg, "129280"));
    di_detok_free(d);
}

static void expect_invalid(const char *s, size_t n, size_t offset) {
    int32_t *ids = (int32_t *)1;
    size_t cnt = 7;
    di_error err = {0};
    for (int special = 0; special <= 1; special++) {
        assert_int_equal(di_tok_encode(g_tok, s, n, special, &ids, &cnt, &err), DI_ERR_INVALID);
        assert_null(ids);
        assert_int_equal(cnt, 0);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu ", offset);
        if (!strstr(err.msg, want)) fail_msg("error '%s' does not say '%s'", err.msg, want);
    }
}

static void test_invalid_utf8(void **state) {
    (void)state;
    expect_invalid("abc\xFF", 4, 3);             /* never-valid byte */
    expect_invalid("\x80x", 2, 0);               /* stray continuation */
    expect_invalid("ok \xE4\xBD", 5, 3);         /* truncated 3-byte character at the end */
    expect_invalid("\xC0\xAF", 2, 0);            /* overlong encoding of '/' */
    expect_invalid("a\xED\xA0\x80z", 5, 1);      /* UTF-16 surrogate D800 */
    expect_invalid("\xF4\x90\x80\x80", 4, 0);    /* above U+10FFFF */
    expect_invalid("你好\xE4x", 8, 6);            /* lead byte followed by ASCII */
    expect_invalid("<｜User｜>\xFE", 13, 12);     /* after an added-token literal too */
    /* NUL is valid UTF-8 and encodes as the byte token */
    int32_t *ids;
    size_t n;
    assert_int_equal(di_tok_encode(g_tok, "a\0b", 3, 1, &ids, &n, NULL), DI_OK);
    assert_true(n >= 2);
    free(ids);
}

static void test_empty(void **state) {
    (void)state;
    int32_t *ids = (int32_t *)1;
    size_t n = 5;
    assert_int_equal(di_tok_encode(g_tok, "", 0, 1, &ids, &n, NULL), DI_OK);
    assert_int_equal(n, 0);
    assert_null(ids);
    assert_int_equal(di_tok_encode(g_tok, NULL, 0, 0, &ids, &n, NULL), DI_OK);
    assert_int_equal(n, 0);
    char *text;
    size_t len = 9;
    assert_int_equal(di_tok_decode(g_tok, NULL, 0, &text, &len, NULL), DI_OK);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
}

static void test_long_input(void **state) {
    (void)state;
    /* "x" + " hello" * N splits into pieces "x", " hello", " hello", ... so the ids are exactly
     * enc("x") followed by N copies of enc(" hello") */
    const size_t reps = 200000;
    size_t len = 1 + 6 * reps;
    char *s = malloc(len + 1);
    s[0] = 'x';
    for (size_t i = 0; i < reps; i++) memcpy(s + 1 + 6 * i, " hello", 6);
    s[len] = 0;
    int32_t *x, *h, *ids;
    size_t nx, nh, n;
    assert_int_equal(di_tok_encode(g_tok, "x", 1, 1, &x, &nx, NULL), DI_OK);
    assert_int_equal(di_tok_encode(g_tok, " hello", 6, 1, &h, &nh, NULL), DI_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(di_tok_encode(g_tok, s, len, 1, &ids, &n, NULL), DI_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    tu_report("tokenizer long input: %zu bytes -> %zu tokens in %.3f s", len, n, sec);
    assert_int_equal(n, nx + reps * nh);
    assert_memory_equal(ids, x, nx * sizeof *x);
    for (size_t i = 0; i < reps; i++) assert_memory_equal(ids + nx + i * nh, h, nh * sizeof *h);
    char *back;
    size_t blen;
    assert_int_equal(di_tok_decode(g_tok, ids, n, &back, &blen, NULL), DI_OK);
    assert_int_equal(blen, len);
    assert_memory_equal(back, s, len);
    free(back);
    free(ids);
    /* one 100,000-letter word without spaces: a single pre-token through the merge heap */
    memset(s, 'a', 100000);
    assert_int_equal(di_tok_encode(g_tok, s, 100000, 0, &ids, &n, NULL), DI_OK);
    assert_int_equal(di_tok_decode(g_tok, ids, n, &back, &blen, NULL), DI_OK);
    assert_int_equal(blen, 100000);
    assert_memory_equal(back, s, 100000);
    assert_true(n < 100000 / 4); /* merged, not left as bytes */
    free(back);
    free(ids);
    free(x);
    free(h);
    free(s);
}

static void test_lookups(void **state) {
    (void)state;
    assert_int_equal(di_tok_vocab_size(g_tok), 129280);
    assert_int_equal(di_tok_find(g_tok, "<｜User｜>"), 128803);
    assert_int_equal(di_tok_find(g_tok, "<｜Assistant｜>"), 128804);
    assert_int_equal(di_tok_find(g_tok, "<｜end▁of▁sentence｜>"), 1);
    assert_int_equal(di_tok_find(g_tok, "</think>"), 128822);
    assert_int_equal(di_tok_find(g_tok, "<｜User"), -1);  /* a prefix is not a token */
    assert_int_equal(di_tok_find(g_tok, "hello"), -1);     /* BPE tokens are not added tokens */
    assert_int_equal(di_tok_find(g_tok, ""), -1);
    assert_true(di_tok_is_special(g_tok, 0));
    assert_true(di_tok_is_special(g_tok, 1));
    assert_true(di_tok_is_added(g_tok, 128803));
    assert_false(di_tok_is_added(g_tok, 100));
    assert_false(di_tok_is_special(g_tok, -1));
    assert_false(di_tok_is_special(g_tok, 129280));
    size_t len;
    const char *b = di_tok_token_bytes(g_tok, 128803, &len);
    assert_int_equal(len, strlen("<｜User｜>"));
    assert_memory_equal(b, "<｜User｜>", len);
    /* byte-level spelling vs raw bytes: " the" is spelled "Ġthe" */
    int32_t the = di_tok_lookup_bytes(g_tok, " the", 4);
    assert_true(the >= 0);
    b = di_tok_token_string(g_tok, the, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(b, "\xC4\xA0the", 5);
    b = di_tok_token_bytes(g_tok, the, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(b, " the", 4);
    assert_null(di_tok_token_bytes(g_tok, -1, &len));
    assert_int_equal(len, 0);
    assert_null(di_tok_token_bytes(g_tok, 129280, &len));
    /* every id has bytes, and every single byte has a token */
    for (int32_t id = 0; id < 129280; id++) assert_non_null(di_tok_token_bytes(g_tok, id, &len));
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        assert_true(di_tok_lookup_bytes(g_tok, &ch, 1) >= 0);
    }
    /* decode rejects ids outside the vocabulary, naming the position */
    int32_t bad[3] = {100, 129280, 5};
    char *text;
    di_error err = {0};
    assert_int_equal(di_tok_decode(g_tok, bad, 3, &text, &len, &err), DI_ERR_INVALID);
    assert_null(text);
    assert_non_null(strstr(err.msg, "position 1"));
}

/* Overlapping added tokens on a synthetic tokenizer (tests/data/tokenizer/tiny_tokenizer.json): HF cuts
 * normalized=false literals first and normalized=true ones in the gaps, so "<AB>C" is "<A" + "B>C" even
 * though "<AB>" starts further left. The real vocabulary has no such overlaps; another file might. */
static void test_added_token_passes(void **state) {
    (void)state;
    di_tokenizer *t;
    di_error err = {0};
    assert_int_equal(di_tok_load(tu_data("tokenizer/tiny_tokenizer.json"), &t, &err), DI_OK);
    FILE *f = fopen(tu_data("tokenizer/tiny.jsonl"), "rb");
    assert_non_null(f);
    char *line = NULL;
    size_t lcap = 0, cases = 0;
    ssize_t nr;
    while ((nr = getline(&line, &lcap, f)) > 0) {
        json_t *o = json_loadb(line, (size_t)nr, 0, NULL);
        assert_non_null(o);
        json_t *txt = json_object_get(o, "t");
        int32_t *ids;
        size_t n;
        assert_int_equal(di_tok_encode(t, json_string_value(txt), json_string_length(txt), 1, &ids, &n, &err), DI_OK);
        if (!ids_equal(ids, n, json_object_get(o, "on"))) fail_msg("tiny tokenizer: '%s'", json_string_value(txt));
        free(ids);
        json_decref(o);
        cases++;
    }
    free(line);
    fclose(f);
    assert_int_equal(cases, 13);
    assert_int_equal(di_tok_find(t, "B>C"), 264);
    di_tok_free(t);
}

static void expect_load_error(const char *path, int code, const char *needle) {
    di_tokenizer *t = (di_tokenizer *)1;
    di_error err = {0};
    assert_int_equal(di_tok_load(path, &t, &err), code);
    assert_null(t);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' does not mention '%s'", err.msg, needle);
}

static void test_load_errors(void **state) {
    (void)state;
    char *dir = tu_tmpdir("tok");
    expect_load_error("/nonexistent/tokenizer.json", DI_ERR_IO, "/nonexistent/tokenizer.json");
    expect_load_error(dir, DI_ERR_IO, "tokenizer.json"); /* a directory without the file */
    char *p = tu_write_file(dir, "bad.json", "{\"model\": ", 10);
    expect_load_error(p, DI_ERR_FORMAT, "bad.json");
    free(p);
    const char *wp = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}";
    p = tu_write_file(dir, "wp.json", wp, strlen(wp));
    expect_load_error(p, DI_ERR_UNSUPPORTED, "WordPiece");
    free(p);
    const char *nomerge = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]},"
                          "\"decoder\":{\"type\":\"ByteLevel\"},"
                          "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"}]}}";
    p = tu_write_file(dir, "nm.json", nomerge, strlen(nomerge));
    expect_load_error(p, DI_ERR_FORMAT, "nm.json"); /* byte tokens missing / merge names a missing token */
    free(p);
    const char *nodec = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":null}";
    p = tu_write_file(dir, "nodec.json", nodec, strlen(nodec));
    expect_load_error(p, DI_ERR_UNSUPPORTED, "decoder");
    free(p);
    const char *huge = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":2000000000},\"merges\":[]},"
                       "\"decoder\":{\"type\":\"ByteLevel\"}}";
    p = tu_write_file(dir, "huge.json", huge, strlen(huge));
    expect_load_error(p, DI_ERR_FORMAT, "huge.json"); /* a corrupt id must not allocate gigabytes */
    free(p);
    /* loading the directory that holds tokenizer.json works */
    di_tokenizer *t;
    assert_int_equal(di_tok_load("data/tokenizer/deepseek-v4", &t, NULL), DI_OK);
    assert_int_equal(di_tok_vocab_size(t), 129280);
    di_tok_free(t);
    tu_rmtree(dir);
    free(dir);
}


/* di_utf8_lossy_dup: valid text unchanged (embedded NUL kept), each maximal invalid subpart one U+FFFD,
 * an unfinished final character one U+FFFD, the result always valid UTF-8. */
static void test_lossy_dup(void **state) {
    (void)state;
    static const struct { const char *in; size_t n; const char *want; size_t wn; } cases[] = {
        {"abc", 3, "abc", 3},
        {"a\0b", 3, "a\0b", 3},
        {"\xe4\xb8\x8d", 3, "\xe4\xb8\x8d", 3},
        {"x\xe4\xb8", 3, "x\xef\xbf\xbd", 4},                  /* unfinished at the end */
        {"\xff!", 2, "\xef\xbf\xbd!", 4},                       /* never a lead byte */
        {"\xe4\xb8z\x80", 4, "\xef\xbf\xbdz\xef\xbf\xbd", 7}, /* truncated, then a lone continuation */
        {"", 0, "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 99;
        char *out = di_utf8_lossy_dup(cases[i].in, cases[i].n, &n);
        assert_non_null(out);
        assert_int_equal(n, cases[i].wn);
        assert_memory_equal(out, cases[i].want, n);
        assert_int_equal(out[n], 0);
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_special_on), cmocka_unit_test(test_corpus_special_off),
        cmocka_unit_test(test_decode_roundtrip),  cmocka_unit_test(test_decode_golden),
        cmocka_unit_test(test_sanity_vector),
        cmocka_unit_test(test_stream_decode),     cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_empty),             cmocka_unit_test(test_long_input),
        cmocka_unit_test(test_lookups),           cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_added_token_passes),
        cmocka_unit_test(test_lossy_dup),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
