/* safetensors reader/writer: round trip, zero-copy views, and malformed files.  di-test: asan */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    assert_int_equal(t->begin, 16); /* 12 bytes of bf16, then padding to the 8-byte element size */
    assert_int_equal((uintptr_t)t->data % 8, 0);
    assert_memory_equal(t->data, b, sizeof b);
    t = di_st_find(st, "z.fp8");
    assert_int_equal(t->begin, 32);
    assert_memory_equal(t->data, c, sizeof c);
    assert_null(st->data_copy); /* everything aligned: zero-copy */
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
    /* header length and file size */
    expect_error("{}", 0, 1, "header length");
    expect_error("{}", 0, (uint64_t)DI_ST_MAX_HEADER + 1, "header length");
    expect_error("{}", 0, UINT64_MAX, "header length");
    /* entries */
    expect_error("{\"t\":[1]}", 0, 0, "not an object");
    expect_error("{\"t\":7}", 0, 0, "not an object");
    expect_error("{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "dtype");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, 0, "shape");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0, "shape[0]");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, 0, "shape[0]");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, 0,
                 "at most 8");
    /* dims whose product overflows, also when a zero dim makes numel 0 */
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
                 0, "2^53");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775807,4],\"data_offsets\":[0,0]}}",
                 0, 0, "2^53");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,0]}}", 0,
                 0, "JSON");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, 0, "data_offsets");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, 0, "data_offsets");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, 0, "data_offsets");
    expect_error("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8, 0, "data_offsets");
    /* duplicate names, NUL inside strings, metadata */
    expect_error("{\"t\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"t\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                 2, 0, "duplicate");
    expect_error("{\"t\":{\"dtype\":\"F32\\u0000x\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "JSON");
    expect_error("{\"__metadata__\":[],\"t\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 0,
                 "__metadata__");
    expect_error("{\"__metadata__\":{\"k\":1}}", 0, 0, "'k'");
    expect_error("{\"t\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}\xff", 1, 0, "JSON");
}

/* Tensors whose bytes are misaligned in the file (odd header length, odd offsets: both occur in
 * files written by other tools) are handed out aligned, with the same bytes. */
static void test_misaligned_copied(void **state) {
    (void)state;
    char *dir = tu_tmpdir("stalign");
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[3,11]},"
                      "\"c\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[11,11]},"
                      "\"d\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[11,12]}}";
    size_t hl = strlen(hdr), n = 8 + hl + 12;
    uint8_t *buf = calloc(1, n);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    const float bv[2] = {1.5f, -2.25f};
    memcpy(buf + 8 + hl, "xyz", 3);
    memcpy(buf + 8 + hl + 3, bv, 8);
    buf[8 + hl + 11] = 0x5a;
    char *p = tu_write_file(dir, "odd.safetensors", buf, n);
    di_safetensors *st;
    di_error err = {0};
    if (di_st_open(p, &st, &err) != DI_OK) fail_msg("%s", err.msg);
    const di_tensor_info *b = di_st_find(st, "b");
    assert_int_equal((uintptr_t)b->data % 4, 0);
    assert_memory_equal(b->data, bv, 8);
    assert_memory_equal(di_st_find(st, "a")->data, "xyz", 3);
    assert_int_equal(*(const uint8_t *)di_st_find(st, "d")->data, 0x5a);
    assert_int_equal(di_tensor_numel(di_st_find(st, "c")), 0);
    assert_string_equal(di_st_meta(st, "format"), "pt");
    assert_null(di_st_meta(st, "other"));
    assert_int_equal(st->n_meta, 1);
    di_st_close(st);
    /* the committed reference vectors hold F32 tensors at offsets that are not multiples of 4 */
    assert_int_equal(di_st_open(tu_data("kernels.safetensors"), &st, &err), DI_OK);
    long copied = 0;
    for (int64_t i = 0; i < st->n_tensors; i++) {
        const di_tensor_info *t = &st->tensors[i];
        assert_int_equal((uintptr_t)t->data % di_dtype_size(t->dtype), 0);
        const uint8_t *in_file = (const uint8_t *)st->map + 8 + st->header_len + t->begin;
        assert_memory_equal(t->data, in_file, t->end - t->begin);
        copied += t->data != in_file;
    }
    tu_report("kernels.safetensors tensors copied for alignment: %ld of %lld", copied, (long long)st->n_tensors);
    assert_true(copied > 0);
    di_st_close(st);
    free(buf);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_not_regular(void **state) {
    (void)state;
    char *dir = tu_tmpdir("stfifo");
    di_safetensors *st = NULL;
    di_error err = {0};
    assert_int_equal(di_st_open(dir, &st, &err), DI_ERR_IO);
    assert_non_null(strstr(err.msg, "not a regular file"));
    char fifo[1100];
    snprintf(fifo, sizeof fifo, "%s/pipe.safetensors", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(di_st_open(fifo, &st, &err), DI_ERR_IO); /* must not block */
    assert_non_null(strstr(err.msg, "pipe.safetensors"));
    assert_int_equal(di_st_open("/nonexistent/x.safetensors", &st, &err), DI_ERR_IO);
    assert_null(st);
    tu_rmtree(dir);
    free(dir);
}

static void test_writer_validation(void **state) {
    (void)state;
    char *dir = tu_tmpdir("stw");
    char path[1100];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    di_error err = {0};
    di_st_writer *w = NULL;
    const di_tensor_spec dup[2] = {{"a", DI_F32, 1, {2}}, {"a", DI_F32, 1, {2}}};
    assert_int_equal(di_st_writer_open(path, dup, 2, NULL, 0, &w, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "duplicate"));
    assert_null(w);
    const di_tensor_spec bad[5] = {{"__metadata__", DI_F32, 1, {2}}, {"", DI_F32, 1, {2}},
                                   {"x", DI_DTYPE_COUNT, 1, {2}}, {"x", DI_F32, 1, {-1}},
                                   {"\xff\xfe", DI_F32, 1, {2}}};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(di_st_writer_open(path, &bad[i], 1, NULL, 0, &w, &err), DI_ERR_INVALID);
        assert_non_null(strstr(err.msg, "w.safetensors"));
    }
    const char *meta[2] = {"k", NULL};
    assert_int_equal(di_st_writer_open(path, dup, 1, meta, 1, &w, &err), DI_ERR_INVALID);

    /* streaming in odd-sized pieces across tensor boundaries and alignment padding */
    const di_tensor_spec specs[4] = {{"u8", DI_I8, 1, {5}}, {"empty", DI_F32, 2, {0, 7}}, {"f", DI_F32, 1, {3}},
                                     {"i", DI_I64, 0, {0}}};
    const char *kv[2] = {"who", "test"};
    assert_int_equal(di_st_writer_open(path, specs, 4, kv, 1, &w, &err), DI_OK);
    uint8_t payload[5 + 12 + 8];
    for (int i = 0; i < (int)sizeof payload; i++) payload[i] = (uint8_t)(i * 11 + 1);
    assert_int_equal(di_st_writer_remaining(w), sizeof payload);
    for (size_t off = 0; off < sizeof payload; off += 3) {
        size_t k = sizeof payload - off < 3 ? sizeof payload - off : 3;
        assert_int_equal(di_st_writer_write(w, payload + off, k, &err), DI_OK);
    }
    assert_int_equal(di_st_writer_write(w, payload, 1, &err), DI_ERR_INVALID); /* one byte too many */
    assert_int_equal(di_st_writer_close(w, &err), DI_OK);
    di_safetensors *st;
    assert_int_equal(di_st_open(path, &st, &err), DI_OK);
    assert_string_equal(di_st_meta(st, "who"), "test");
    assert_memory_equal(di_st_find(st, "u8")->data, payload, 5);
    assert_int_equal(di_st_find(st, "f")->begin, 8);
    assert_memory_equal(di_st_find(st, "f")->data, payload + 5, 12);
    assert_int_equal(di_st_find(st, "i")->begin, 24);
    assert_int_equal(di_st_find(st, "i")->ndim, 0);
    assert_memory_equal(di_st_find(st, "i")->data, payload + 17, 8);
    assert_null(st->data_copy);
    di_st_close(st);

    /* closing early is an error and leaves no half-written file behind */
    assert_int_equal(di_st_writer_open(path, specs, 4, NULL, 0, &w, &err), DI_OK);
    assert_int_equal(di_st_writer_write(w, payload, 7, &err), DI_OK);
    assert_int_equal(di_st_writer_close(w, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "18 data bytes still missing"));
    assert_int_equal(access(path, F_OK), -1);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_misaligned_copied),
        cmocka_unit_test(test_not_regular),
        cmocka_unit_test(test_writer_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
