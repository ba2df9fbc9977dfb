/* Engram compressed token map (model.md §4.3 step 1): class count, the whole table against the Python
 * reference algorithm (tests/data/tokenizer/engram_map.json from scripts/gen_tokenizer_golden.py), the
 * normalizer chain on hand-picked strings, and the engram_token_map.safetensors writer.  di-test: asan */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "testutil.h"
#include "text/engram_map.h"

#define TOKENIZER_PATH "data/tokenizer/deepseek-v4/tokenizer.json"

static di_tokenizer *g_tok;
static int32_t *g_map;
static int32_t g_classes;

static int setup(void **state) {
    (void)state;
    di_error err = {0};
    if (di_tok_load(TOKENIZER_PATH, &g_tok, &err) || di_engram_map_build(g_tok, &g_map, &g_classes, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(g_map);
    di_tok_free(g_tok);
    return 0;
}

static uint64_t fnv1a64(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void test_table_matches_reference(void **state) {
    (void)state;
    json_error_t je;
    json_t *g = json_load_file(tu_data("tokenizer/engram_map.json"), 0, &je);
    assert_non_null(g);
    tu_report("engram map: %d classes over %d ids (V4.1 config expects %d)", g_classes, di_tok_vocab_size(g_tok),
              DI_ENGRAM_V41_CLASSES);
    assert_int_equal(json_integer_value(json_object_get(g, "vocab_size")), di_tok_vocab_size(g_tok));
    assert_int_equal(json_integer_value(json_object_get(g, "n_classes")), g_classes);
    assert_int_equal(g_classes, DI_ENGRAM_V41_CLASSES);
    /* sampled ids first: a mismatch there names the token */
    json_t *sample = json_object_get(g, "sample");
    assert_true(json_array_size(sample) > 3000);
    for (size_t i = 0; i < json_array_size(sample); i++) {
        json_t *pair = json_array_get(sample, i);
        int32_t id = (int32_t)json_integer_value(json_array_get(pair, 0));
        int32_t want = (int32_t)json_integer_value(json_array_get(pair, 1));
        if (g_map[id] != want) {
            size_t len;
            const char *s = di_tok_token_string(g_tok, id, &len);
            fail_msg("token %d '%.*s': class %d, reference %d", id, (int)len, s, g_map[id], want);
        }
    }
    /* then the whole table (little-endian int32, as the generator hashes it) */
    char want_hash[32];
    snprintf(want_hash, sizeof want_hash, "%016llx",
             (unsigned long long)fnv1a64(g_map, (size_t)di_tok_vocab_size(g_tok) * sizeof *g_map));
    assert_string_equal(want_hash, json_string_value(json_object_get(g, "table_fnv1a64")));
    json_decref(g);
}

static void expect_norm(const char *in, const char *want) {
    char *out;
    size_t n;
    assert_int_equal(di_engram_normalize(in, strlen(in), &out, &n, NULL), DI_OK);
    if (strcmp(out, want)) fail_msg("normalize('%s') = '%s', want '%s'", in, out, want);
    assert_int_equal(n, strlen(want));
    free(out);
}

static void test_normalize(void **state) {
    (void)state;
    expect_norm(" The", "the");
    expect_norm("THE", "the");
    expect_norm("Café", "cafe");    /* NFD + strip accents */
    expect_norm("ﬁ", "fi");         /* NFKC compatibility ligature */
    expect_norm("Ｈｅｌｌｏ", "hello"); /* fullwidth -> ASCII */
    expect_norm(" ", " ");          /* a lone space survives Strip through the sentinel */
    expect_norm("\n", " ");
    expect_norm("\t\r\n ", " ");
    expect_norm("  ", " ");
    expect_norm(" x ", "x");
    expect_norm("a \t b", "a b");
    expect_norm("\u3000", " ");     /* NFKC turns it into ' ' before the lone-space rule */
    expect_norm("\u00a0x\u2003", "x"); /* Strip removes all White_Space, not only ASCII */
    expect_norm("ΣΑΣ", "σασ");      /* char-wise lowercase: no final-sigma rule */
    expect_norm("e\u0301", "e");
    expect_norm("İ", "i");
    expect_norm("", "");
}

static void test_same_class(void **state) {
    (void)state;
    /* " The", "the", "THE" collapse together when all three are single tokens */
    int32_t a = di_tok_lookup_bytes(g_tok, " The", 4), b = di_tok_lookup_bytes(g_tok, "the", 3);
    int32_t c = di_tok_lookup_bytes(g_tok, "THE", 3), d = di_tok_lookup_bytes(g_tok, " dog", 4);
    assert_true(a >= 0 && b >= 0 && c >= 0 && d >= 0);
    assert_int_equal(g_map[a], g_map[b]);
    assert_int_equal(g_map[b], g_map[c]);
    assert_int_not_equal(g_map[a], g_map[d]);
    /* the first ids open the first classes, in order */
    assert_int_equal(g_map[0], 0);
    assert_int_equal(g_map[1], 1);
    for (int32_t i = 0; i < di_tok_vocab_size(g_tok); i++) assert_true(g_map[i] >= 0 && g_map[i] < g_classes);
}

static void test_write_file(void **state) {
    (void)state;
    /* the released V4.1 constants (model.md §4.3 step 3), checked against kernels.safetensors */
    static const int64_t mult[2][4] = {{76632096046245, 4839876093313, 35959672319349, 73987337458391},
                                       {67716810739261, 51510806800915, 30921347202721, 82619226485591}};
    di_safetensors *k;
    di_error err = {0};
    assert_int_equal(di_st_open(tu_data("kernels.safetensors"), &k, &err), DI_OK);
    const di_tensor_info *kp = di_st_find(k, "engram.primes"), *km = di_st_find(k, "engram.multipliers");
    assert_non_null(kp);
    assert_non_null(km);
    assert_memory_equal(km->data, mult, sizeof mult);
    int64_t offsets[2][24];
    const int64_t *primes = kp->data;
    for (int l = 0; l < 2; l++) {
        int64_t acc = 0;
        for (int j = 0; j < 24; j++) offsets[l][j] = acc, acc += primes[l * 24 + j];
    }
    di_engram_hash_params p = {.n_layers = 2, .max_ngram = 4, .n_heads = 8, .primes = primes,
                               .offsets = &offsets[0][0], .multipliers = &mult[0][0],
                               .pad_compressed_id = g_map[2]};
    char *dir = tu_tmpdir("engram");
    char path[1100];
    snprintf(path, sizeof path, "%s/engram_token_map.safetensors", dir);
    assert_int_equal(di_engram_map_write(path, g_map, di_tok_vocab_size(g_tok), &p, &err), DI_OK);
    di_safetensors *st;
    assert_int_equal(di_st_open(path, &st, &err), DI_OK);
    const di_tensor_info *tm = di_st_find(st, "token_map");
    assert_non_null(tm);
    assert_int_equal(tm->dtype, DI_I32);
    assert_int_equal(tm->shape[0], 129280);
    assert_memory_equal(tm->data, g_map, 129280 * sizeof *g_map);
    const di_tensor_info *pr = di_st_find(st, "primes"), *of = di_st_find(st, "offsets");
    assert_int_equal(pr->ndim, 3);
    assert_int_equal(pr->shape[2], 8);
    assert_memory_equal(pr->data, primes, 48 * sizeof *primes);
    assert_int_equal(of->shape[1], 24);
    assert_int_equal(((const int64_t *)of->data)[24 + 23], offsets[1][23]);
    assert_int_equal(*(const int64_t *)di_st_find(st, "pad_compressed_id")->data, g_map[2]);
    assert_int_equal(di_st_find(st, "multipliers")->shape[1], 4);
    /* same names, dtypes and ranks as the reference's file for the tiny golden models */
    di_safetensors *ref;
    assert_int_equal(di_st_open(tu_data("v41-tiny-sel/engram_token_map.safetensors"), &ref, &err), DI_OK);
    assert_int_equal(ref->n_tensors, st->n_tensors);
    for (int64_t i = 0; i < ref->n_tensors; i++) {
        assert_string_equal(ref->tensors[i].name, st->tensors[i].name);
        assert_int_equal(ref->tensors[i].dtype, st->tensors[i].dtype);
        assert_int_equal(ref->tensors[i].ndim, st->tensors[i].ndim);
    }
    di_st_close(ref);
    di_st_close(st);
    di_st_close(k);
    p.max_ngram = 1;
    assert_int_equal(di_engram_map_write(path, g_map, 129280, &p, &err), DI_ERR_INVALID);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_matches_reference),
        cmocka_unit_test(test_normalize),
        cmocka_unit_test(test_same_class),
        cmocka_unit_test(test_write_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
