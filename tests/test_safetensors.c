/* safetensors reader/writer: round trip, zero-copy views, and malformed files.  di-test: asan */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "testutil.h"

static void test_roundtrip(void **state) {
    (void)state;
    char *dir = tu_tmpdir("st");
    char path[1100];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    uint16_t a[6] = {1, 2, 3, 4, 5, 6};
    int64_t b[2] = {-7, 1LL << 40};
    uint8_t c[3] = {0x7f, 0x80, 0xff};
    di_tensor_spec specs[3] = {
        {"x.bf16", DI_BF16, 2, {2, 3}}, {"y.i64", DI_I64, 1, {2}}, {"z.fp8", DI_F8_E4M3, 1, {3}}};
    const void *data[3] = {a, b, c};
    di_error err = {0};
    assert_int_equal(di_st_write_file(path, specs, data, 3, &err), DI_OK);
    di_safetensors *st;
    assert_int_equal(di_st_open(path, &st, &err), DI_OK);
    assert_int_equal(st->n_tensors, 3);
    const di_tensor_info *t = di_st_find(st, "x.bf16");
    assert_non_null(t);
    assert_int_equal(t->dtype, DI_BF16);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 3);
    assert_memory_equal(t->data, a, sizeof a);
    t = di_st_find(st, "y.i64");
    assert_memory_equal(t->data, b, sizeof b);
    assert_null(di_st_find(st, "nope"));
    di_st_close(st);
    tu_rmtree(dir);
    free(dir);
}

/* Build a file from a raw header string and n data bytes. */
static char *raw_file(const char *dir, const char *hdr, size_t ndata, uint64_t claimed_len) {
    size_t hl = strlen(hdr), n = 8 + hl + ndata;
    uint8_t *buf = calloc(1, n);
    uint64_t L = claimed_len ? claimed_len : hl;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(L >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    char *p = tu_write_file(dir, "bad.safetensors", buf, n);
    free(buf);
    return p;
}

static void expect_error(const char *hdr, size_t ndata, uint64_t claimed, const char *needle) {
    char *dir = tu_tmpdir("stbad");
    char *p = raw_file(dir, hdr, ndata, claimed);
    di_safetensors *st = NULL;
    di_error err = {0};
    int rc = di_st_open(p, &st, &err);
    if (rc == DI_OK) fail_msg("accepted malformed header %s", hdr);
    assert_null(st);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' does not mention '%s'", err.msg, needle);
    assert_non_null(strstr(err.msg, "bad.safetensors")); /* names the file */
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_malformed(void **state) {
    (void)state;
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, 0, "past the end");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 1u << 20, "header length");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 12, 0, "overlap");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0, "'t'");
    expect_error("{\"t\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "dtype");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],", 8, 0, "JSON");
    expect_error("[1,2]", 0, 0, "object");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
