/* The V4.1-layout tokenizer derived for generated models: exactly two added tokens change, everything
 * else encodes as the official V4 file does.  di-test: asan */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/tokenizer_v41.h"
#include "testutil.h"

static void test_layout(void **state) {
    (void)state;
    char *dir = tu_tmpdir("tokv41");
    char dst[1100];
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    di_error err = {0};
    if (di_tok_write_v41_layout(DI_TOKENIZER_DEFAULT_PATH, dst, &err) != DI_OK) fail_msg("%s", err.msg);
    di_tokenizer *v4, *v41;
    assert_int_equal(di_tok_load(DI_TOKENIZER_DEFAULT_PATH, &v4, &err), DI_OK);
    assert_int_equal(di_tok_load(dst, &v41, &err), DI_OK);
    assert_int_equal(di_tok_vocab_size(v41), di_tok_vocab_size(v4));
    assert_int_equal(di_tok_find(v41, "<｜System｜>"), 128799);
    assert_int_equal(di_tok_find(v41, "<｜deepseek_image｜>"), 129264);
    assert_int_equal(di_tok_find(v4, "<｜System｜>"), -1);
    /* every other added token and all plain text encode identically */
    const char *text = "<｜begin▁of▁sentence｜><｜User｜>Hello, 世界 42!<｜Assistant｜><think>x</think>";
    int32_t *a, *b;
    size_t na, nb;
    assert_int_equal(di_tok_encode(v4, text, strlen(text), 1, &a, &na, &err), DI_OK);
    assert_int_equal(di_tok_encode(v41, text, strlen(text), 1, &b, &nb, &err), DI_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    free(a);
    free(b);
    const char *sys = "<｜System｜>hi";
    assert_int_equal(di_tok_encode(v41, sys, strlen(sys), 1, &b, &nb, &err), DI_OK);
    assert_int_equal(b[0], 128799);
    free(b);
    di_tok_free(v4);
    di_tok_free(v41);
    tu_rmtree(dir);
    free(dir);
}

static void test_refuses_other_files(void **state) {
    (void)state;
    char *dir = tu_tmpdir("tokv41bad");
    char dst[1100];
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    di_error err = {0};
    assert_int_not_equal(di_tok_write_v41_layout(tu_data("tokenizer/tiny_tokenizer.json"), dst, &err), DI_OK);
    assert_non_null(strstr(err.msg, "tiny_tokenizer.json"));
    assert_int_not_equal(di_tok_write_v41_layout("/nonexistent/tokenizer.json", dst, &err), DI_OK);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_refuses_other_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
