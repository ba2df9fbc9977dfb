/* Masks on the real 129,280-token DeepSeek vocabulary against brute force: each bench instance is
 * tokenized and replayed; every few tokens the mask is compared with trying every token's bytes on
 * the matcher (added tokens never allowed, EOS only when complete). Not in the ASan subset: the
 * brute force over 129,280 tokens is slow under the sanitizers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "testutil.h"
#include "text/tokenizer.h"

#define TOKENIZER "data/tokenizer/deepseek-v4/tokenizer.json"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    char *b = malloc((size_t)sz + 1);
    if (fread(b, 1, (size_t)sz, f) != (size_t)sz) fail_msg("short read %s", path);
    fclose(f);
    b[sz] = 0;
    *n = (size_t)sz;
    return b;
}

static void test_real_vocab_masks(void **state) {
    (void)state;
    di_error err = {0};
    di_tokenizer *tok = NULL;
    if (di_tok_load(TOKENIZER, &tok, &err)) {
        tu_report("tokenizer not available (%s): %s", TOKENIZER, err.msg);
        skip();
    }
    uint32_t V = (uint32_t)di_tok_vocab_size(tok);
    const uint8_t **b = calloc(V, sizeof *b);
    uint32_t *l = calloc(V, sizeof *l);
    uint8_t *sp = calloc(V, 1);
    for (uint32_t t = 0; t < V; t++) {
        size_t len = 0;
        b[t] = (const uint8_t *)di_tok_token_bytes(tok, (int32_t)t, &len);
        l[t] = b[t] ? (uint32_t)len : 0;
        sp[t] = (uint8_t)di_tok_is_added(tok, (int32_t)t);
    }
    int32_t eos = di_tok_find(tok, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    assert_true(eos >= 0);
    di_grammar_vocab *v = NULL;
    assert_int_equal(di_grammar_vocab_new(V, b, l, sp, &eos, 1, &v, &err), DI_OK);
    static const char *inputs[] = {"schema_small.json", "regex_email.regex", "ebnf_arith.gbnf"};
    uint32_t *mask = malloc(di_grammar_mask_words(V) * sizeof *mask);
    int checked = 0;
    for (size_t k = 0; k < sizeof inputs / sizeof inputs[0]; k++) {
        char path[256], inst[256];
        snprintf(path, sizeof path, "%s", tu_data("grammar/bench"));
        snprintf(path + strlen(path), sizeof path - strlen(path), "/%s", inputs[k]);
        snprintf(inst, sizeof inst, "%.*s.instance", (int)(strrchr(path, '.') - path), path);
        size_t n, m;
        char *src = slurp(path, &n), *text = slurp(inst, &m);
        di_grammar *g = NULL;
        int rc = strstr(path, ".json")    ? di_grammar_from_json_schema(src, n, NULL, &g, &err)
                 : strstr(path, ".regex") ? di_grammar_from_regex(src, n, &g, &err)
                                          : di_grammar_from_ebnf(src, n, NULL, &g, &err);
        if (rc) fail_msg("%s: %s", path, err.msg);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(di_tok_encode(tok, text, m, 0, &ids, &n_ids, &err), DI_OK);
        di_grammar_matcher *mt = NULL;
        assert_int_equal(di_grammar_matcher_new(g, v, NULL, &mt, &err), DI_OK);
        for (size_t i = 0; i <= n_ids; i++) {
            assert_int_equal(di_grammar_matcher_fill_mask(mt, mask, &err), DI_OK);
            if (i % 4 == 0 || i == n_ids) {
                for (uint32_t t = 0; t < V; t++) {
                    bool want = (int32_t)t == eos ? di_grammar_matcher_can_end(mt)
                                : sp[t] || !l[t]  ? false
                                                  : di_grammar_matcher_try_bytes(mt, b[t], l[t]);
                    if (want != (bool)((mask[t >> 5] >> (t & 31)) & 1u))
                        fail_msg("%s: token %u (%.*s) mask %d brute %d at step %zu", inputs[k], t, (int)l[t],
                                 (const char *)b[t], !want, want, i);
                }
                checked++;
            }
            if (i == n_ids) break;
            assert_true((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1u);
            assert_int_equal(di_grammar_matcher_accept_token(mt, ids[i], &err), DI_OK);
        }
        assert_true(di_grammar_matcher_can_end(mt));
        assert_int_equal(di_grammar_matcher_accept_token(mt, eos, &err), DI_OK);
        di_grammar_matcher_free(mt);
        di_grammar_free(g);
        free(ids);
        free(src);
        free(text);
    }
    tu_report("real-vocabulary masks (V=%u) equal to brute force: %d", V, checked);
    assert_true(checked >= 10);
    free(mask);
    di_grammar_vocab_free(v);
    free(b);
    free(l);
    free(sp);
    di_tok_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_real_vocab_masks)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
