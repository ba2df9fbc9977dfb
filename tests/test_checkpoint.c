/* Checkpoint directories: the golden cases open, a re-sharded copy reads back identical bytes, and
 * malformed copies of tests/data/v41-tiny-sel (truncated or corrupted shards, bad or inconsistent
 * index) fail with an error that names the file and the tensor.  di-test: asan */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "testutil.h"

#define SHARD "model.safetensors"
#define INDEX "model.safetensors.index.json"

/* A fresh copy of the tiny checkpoint's index and shard. Returns the malloc'd directory. */
static char *copy_tiny(void) {
    char *dir = tu_tmpdir("ckpt");
    assert_non_null(dir);
    const char *files[] = {SHARD, INDEX, "config.json"};
    for (int i = 0; i < 3; i++) {
        char *dst = di_path_join(dir, files[i]);
        char src[512];
        snprintf(src, sizeof src, "v41-tiny-sel/%s", files[i]);
        assert_int_equal(tu_copy_file(tu_data(src), dst), 0);
        free(dst);
    }
    return dir;
}

static void drop_dir(char *dir) {
    tu_rmtree(dir);
    free(dir);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(*n ? *n : 1);
    assert_int_equal(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

static void write_all(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Rewrite dir/shard with its header JSON passed through edit(); the data section is kept. */
typedef void (*header_edit)(json_t *hdr, void *ctx);
static void edit_shard_header(const char *dir, const char *shard, header_edit edit, void *ctx) {
    char *path = di_path_join(dir, shard);
    size_t n;
    uint8_t *buf = read_all(path, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    json_t *hdr = json_loadb((const char *)buf + 8, (size_t)hlen, 0, NULL);
    assert_non_null(hdr);
    edit(hdr, ctx);
    char *js = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7, m = 8 + padded + (n - 8 - hlen);
    uint8_t *out = malloc(m);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, js, jl);
    memset(out + 8 + jl, ' ', padded - jl);
    memcpy(out + 8 + padded, buf + 8 + hlen, n - 8 - hlen);
    write_all(path, out, m);
    free(js);
    free(out);
    free(buf);
    free(path);
}

typedef void (*index_edit)(json_t *index, void *ctx);
static void edit_index(const char *dir, index_edit edit, void *ctx) {
    char *path = di_path_join(dir, INDEX);
    json_t *ix = json_load_file(path, 0, NULL);
    assert_non_null(ix);
    edit(ix, ctx);
    assert_int_equal(json_dump_file(ix, path, JSON_INDENT(1)), 0);
    json_decref(ix);
    free(path);
}

/* Opening dir must fail with rc and a message containing every needle (file and tensor names). */
static void expect_fail(const char *dir, int rc_want, const char *const *needles) {
    di_checkpoint *ck = (di_checkpoint *)1;
    di_error err = {0};
    int rc = di_ckpt_open(dir, &ck, &err);
    if (rc == DI_OK) fail_msg("malformed checkpoint %s was accepted", dir);
    assert_null(ck);
    if (rc != rc_want) fail_msg("status %s, expected %s: %s", di_status_name(rc), di_status_name(rc_want), err.msg);
    for (int i = 0; needles[i]; i++)
        if (!strstr(err.msg, needles[i])) fail_msg("error '%s' does not mention '%s'", err.msg, needles[i]);
    tu_report("rejected: %s", err.msg + (strstr(err.msg, dir) == err.msg ? strlen(dir) : 0));
}

/* ---- golden cases and a re-sharded checkpoint ---- */

static void check_golden_dir(const char *dir) {
    di_checkpoint *ck;
    di_error err = {0};
    if (di_ckpt_open(dir, &ck, &err) != DI_OK) fail_msg("%s", err.msg);
    char *ipath = di_path_join(dir, INDEX);
    json_t *ix = json_load_file(ipath, 0, NULL);
    assert_non_null(ix);
    assert_int_equal(ck->n_tensors, (int64_t)json_object_size(json_object_get(ix, "weight_map")));
    assert_int_equal(ck->total_bytes, json_integer_value(json_object_get(json_object_get(ix, "metadata"), "total_size")));
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(ix, "weight_map"), name, v) {
        const di_tensor_info *t = di_ckpt_find(ck, name);
        assert_non_null(t);
        assert_string_equal(t->name, name);
        const char *sp = di_ckpt_shard_path(ck, name);
        assert_non_null(strstr(sp, json_string_value(v)));
        assert_int_equal((uintptr_t)t->data % di_dtype_size(t->dtype), 0);
    }
    assert_null(di_ckpt_find(ck, "no.such.tensor"));
    assert_null(di_ckpt_shard_path(ck, "no.such.tensor"));
    tu_report("%s: %lld tensors, %llu bytes, %d shard(s)", dir, (long long)ck->n_tensors,
              (unsigned long long)ck->total_bytes, ck->n_shards);
    json_decref(ix);
    free(ipath);
    di_ckpt_close(ck);
}

static void test_golden_dirs_open(void **state) {
    (void)state;
    check_golden_dir(tu_data("v41-tiny-sel"));
    check_golden_dir(tu_data("v41-tiny-nosel"));
    const char *mid = tu_shared_golden("v41-mid-nosel");
    if (mid) check_golden_dir(mid);
    else tu_report("../shared/golden/v41-mid-nosel not present; skipped");
}

/* Split the tiny checkpoint into 3 shards with the library's writer (specs in reverse name order,
 * so the writer must pad between dtypes) and check that every tensor reads back identical. */
static void test_resharded(void **state) {
    (void)state;
    di_error err = {0};
    di_checkpoint *src;
    assert_int_equal(di_ckpt_open(tu_data("v41-tiny-sel"), &src, &err), DI_OK);
    char *dir = tu_tmpdir("reshard");
    json_t *wm = json_object();
    int64_t n = src->n_tensors;
    di_tensor_spec *specs = calloc((size_t)n, sizeof *specs);
    const void **data = calloc((size_t)n, sizeof *data);
    const char *names[3] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors"};
    for (int s = 0; s < 3; s++) {
        int64_t k = 0;
        for (int64_t i = n - 1; i >= 0; i--) {
            if (i % 3 != s) continue;
            const di_tensor_info *t = src->entries[i].info;
            specs[k] = (di_tensor_spec){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
            memcpy(specs[k].shape, t->shape, sizeof t->shape);
            data[k++] = t->data;
            json_object_set_new(wm, t->name, json_string(names[s]));
        }
        char *p = di_path_join(dir, names[s]);
        if (di_st_write_file(p, specs, data, k, &err) != DI_OK) fail_msg("%s", err.msg);
        free(p);
    }
    json_t *ix = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)src->total_bytes, "weight_map", wm);
    char *ipath = di_path_join(dir, INDEX);
    assert_int_equal(json_dump_file(ix, ipath, JSON_INDENT(1)), 0);
    json_decref(ix);
    di_checkpoint *ck;
    if (di_ckpt_open(dir, &ck, &err) != DI_OK) fail_msg("%s", err.msg);
    assert_int_equal(ck->n_shards, 3);
    assert_int_equal(ck->n_tensors, n);
    assert_int_equal(ck->total_bytes, src->total_bytes);
    long same = 0;
    for (int64_t i = 0; i < n; i++) {
        const di_tensor_info *a = src->entries[i].info, *b = di_ckpt_find(ck, a->name);
        assert_non_null(b);
        assert_int_equal(b->dtype, a->dtype);
        assert_int_equal(b->ndim, a->ndim);
        assert_memory_equal(b->shape, a->shape, sizeof a->shape);
        assert_int_equal(b->end - b->begin, a->end - a->begin);
        assert_int_equal((uintptr_t)b->data % di_dtype_size(b->dtype), 0);
        if (b->end > b->begin) assert_memory_equal(b->data, a->data, b->end - b->begin);
        same++;
    }
    tu_report("re-sharded tensors identical: %ld/%lld", same, (long long)n);
    di_ckpt_close(ck);
    di_ckpt_close(src);
    free(specs);
    free(data);
    free(ipath);
    drop_dir(dir);
}

/* ---- malformed shards ---- */

static void test_truncated_shard(void **state) {
    (void)state;
    char *dir = copy_tiny();
    char *p = di_path_join(dir, SHARD);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size - 100), 0);
    /* the last tensor in the data section is norm.weight */
    expect_fail(dir, DI_ERR_FORMAT, (const char *[]){SHARD, "'norm.weight'", "past the end", NULL});
    assert_int_equal(truncate(p, 5), 0);
    expect_fail(dir, DI_ERR_FORMAT, (const char *[]){SHARD, "too short", NULL});
    assert_int_equal(truncate(p, 0), 0);
    expect_fail(dir, DI_ERR_FORMAT, (const char *[]){SHARD, "too short", NULL});
    free(p);
    drop_dir(dir);
}

static void test_header_length_past_eof(void **state) {
    (void)state;
    char *dir = copy_tiny();
    char *p = di_path_join(dir, SHARD);
    size_t n;
    uint8_t *buf = read_all(p, &n);
    const uint64_t lens[3] = {n - 7, UINT64_MAX, 1};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(lens[k] >> (8 * i));
        write_all(p, buf, n);
        expect_fail(dir, DI_ERR_FORMAT, (const char *[]){SHARD, "header length", NULL});
    }
    /* header length shorter than the JSON: the header is cut mid-object */
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)1000 >> (8 * i));
    write_all(p, buf, n);
    expect_fail(dir, DI_ERR_FORMAT, (const char *[]){SHARD, "not valid JSON", NULL});
    free(buf);
    free(p);
    drop_dir(dir);
}

/* Point the second tensor of the data section at bytes that overlap the first. */
static void make_overlap(json_t *hdr, void *ctx) {
    (void)ctx;
    json_t *head = json_object_get(hdr, "head.weight"); /* BF16 [.., ..] at 262144, same size as embed */
    json_t *off = json_object_get(head, "data_offsets");
    json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
    json_array_set_new(off, 0, json_integer(b - 64));
    json_array_set_new(off, 1, json_integer(e - 64));
}

static void test_overlapping_tensors(void **state) {
    (void)state;
    char *dir = copy_tiny();
    edit_shard_header(dir, SHARD, make_overlap, NULL);
    expect_fail(dir, DI_ERR_FORMAT, (const char *[]){SHARD, "'embed.weight'", "'head.weight'", "overlap", NULL});
    drop_dir(dir);
}

static void set_shape0(json_t *hdr, void *ctx) {
    json_t *t = json_object_get(hdr, (const char *)ctx);
    json_array_set_new(json_object_get(t, "shape"), 0, json_integer(3));
}

static void test_size_mismatch(void **state) {
    (void)state;
    char *dir = copy_tiny();
    edit_shard_header(dir, SHARD, set_shape0, "layers.0.attn.wkv.weight");
    expect_fail(dir, DI_ERR_FORMAT, (const char *[]){SHARD, "'layers.0.attn.wkv.weight'", "F8_E4M3", NULL});
    drop_dir(dir);
}

static void rename_tensor(json_t *hdr, void *ctx) {
    const char *const *names = ctx;
    json_t *t = json_incref(json_object_get(hdr, names[0]));
    json_object_del(hdr, names[0]);
    json_object_set_new(hdr, names[1], t);
}

static void test_index_tensor_missing_from_shard(void **state) {
    (void)state;
    char *dir = copy_tiny();
    const char *names[2] = {"layers.0.attn.q_norm.weight", "layers.0.attn.q_norm.weigth"};
    edit_shard_header(dir, SHARD, rename_tensor, names);
    expect_fail(dir, DI_ERR_INVALID, (const char *[]){SHARD, "'layers.0.attn.q_norm.weight'", INDEX, "missing", NULL});
    drop_dir(dir);
}

static void drop_from_index(json_t *ix, void *ctx) {
    json_object_del(json_object_get(ix, "weight_map"), (const char *)ctx);
}

static void test_shard_tensor_not_in_index(void **state) {
    (void)state;
    char *dir = copy_tiny();
    edit_index(dir, drop_from_index, "layers.0.attn.wo_b.scale");
    expect_fail(dir, DI_ERR_INVALID, (const char *[]){SHARD, "'layers.0.attn.wo_b.scale'", "not listed", INDEX, NULL});
    drop_dir(dir);
}

/* The same tensor in two shards, the index naming only one of them. */
static void move_to_shard2(json_t *ix, void *ctx) {
    json_object_set_new(json_object_get(ix, "weight_map"), (const char *)ctx, json_string("model-2.safetensors"));
}

static void test_tensor_in_two_shards(void **state) {
    (void)state;
    char *dir = copy_tiny();
    char *a = di_path_join(dir, SHARD), *b = di_path_join(dir, "model-2.safetensors");
    assert_int_equal(tu_copy_file(a, b), 0);
    edit_index(dir, move_to_shard2, "embed.weight");
    /* model-2 holds every tensor but is listed for embed.weight only; model.safetensors holds
     * embed.weight but is not listed for it: either is reported, each naming file and tensor */
    di_checkpoint *ck = NULL;
    di_error err = {0};
    assert_int_equal(di_ckpt_open(dir, &ck, &err), DI_ERR_INVALID);
    assert_null(ck);
    assert_non_null(strstr(err.msg, ".safetensors: holds tensor '"));
    assert_non_null(strstr(err.msg, INDEX));
    tu_report("rejected: %s", err.msg + strlen(dir));
    free(a);
    free(b);
    drop_dir(dir);
}

/* ---- malformed index ---- */

static void test_index_bad_json(void **state) {
    (void)state;
    char *dir = copy_tiny();
    char *p = di_path_join(dir, INDEX);
    const char *bad[] = {"{\"weight_map\": {\"embed.weight\": \"model.safetensors\",}}", "", "[1,2,3]",
                         "{\"weight_map\": 7}", "{\"weight_map\": {}}",
                         "{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}"};
    const int rc[] = {DI_ERR_FORMAT, DI_ERR_FORMAT, DI_ERR_FORMAT, DI_ERR_FORMAT, DI_ERR_FORMAT, DI_ERR_FORMAT};
    for (int i = 0; i < 6; i++) {
        write_all(p, bad[i], strlen(bad[i]));
        expect_fail(dir, rc[i], (const char *[]){INDEX, NULL});
    }
    free(p);
    drop_dir(dir);
}

static void set_shard_of(json_t *ix, void *ctx) {
    const char *const *kv = ctx;
    json_object_set_new(json_object_get(ix, "weight_map"), kv[0], json_string(kv[1]));
}

static void test_index_missing_shard(void **state) {
    (void)state;
    char *dir = copy_tiny();
    const char *kv[2] = {"layers.0.ffn.gate.weight", "model-00002-of-00002.safetensors"};
    edit_index(dir, set_shard_of, kv);
    expect_fail(dir, DI_ERR_IO, (const char *[]){INDEX, "'layers.0.ffn.gate.weight'", kv[1], "does not exist", NULL});
    drop_dir(dir);
}

static void test_index_outside_dir(void **state) {
    (void)state;
    const char *shards[] = {"../model.safetensors", "/etc/passwd", "sub/model.safetensors", "..", ".", ""};
    for (int i = 0; i < 6; i++) {
        char *dir = copy_tiny();
        const char *kv[2] = {"embed.weight", shards[i]};
        edit_index(dir, set_shard_of, kv);
        expect_fail(dir, DI_ERR_FORMAT, (const char *[]){INDEX, "'embed.weight'", "inside the checkpoint", NULL});
        drop_dir(dir);
    }
    /* a weight_map value that is not a string */
    char *dir = copy_tiny();
    char *p = di_path_join(dir, INDEX);
    const char *js = "{\"weight_map\": {\"embed.weight\": 3}}";
    write_all(p, js, strlen(js));
    expect_fail(dir, DI_ERR_FORMAT, (const char *[]){INDEX, "'embed.weight'", NULL});
    free(p);
    drop_dir(dir);
}

static void test_index_shard_is_directory(void **state) {
    (void)state;
    char *dir = copy_tiny();
    char *sub = di_path_join(dir, "shard-dir.safetensors");
    assert_int_equal(mkdir(sub, 0700), 0);
    const char *kv[2] = {"embed.weight", "shard-dir.safetensors"};
    edit_index(dir, set_shard_of, kv);
    expect_fail(dir, DI_ERR_IO, (const char *[]){"shard-dir.safetensors", "not a regular file", NULL});
    free(sub);
    drop_dir(dir);
}

static void set_total_size(json_t *ix, void *ctx) {
    json_object_set(json_object_get(ix, "metadata"), "total_size", (json_t *)ctx);
}

static void test_index_total_size(void **state) {
    (void)state;
    char *dir = copy_tiny();
    json_t *v = json_integer(5685324 + 1);
    edit_index(dir, set_total_size, v);
    json_decref(v);
    expect_fail(dir, DI_ERR_INVALID, (const char *[]){INDEX, "total_size is 5685325", "5685324", NULL});
    const char *bad[4] = {"x", NULL, NULL, NULL};
    json_t *bads[4] = {json_string(bad[0]), json_integer(-4), json_real(5685324.5), json_real(1e30)};
    for (int i = 0; i < 4; i++) {
        edit_index(dir, set_total_size, bads[i]);
        json_decref(bads[i]);
        expect_fail(dir, DI_ERR_FORMAT, (const char *[]){INDEX, "total_size", NULL});
    }
    /* a whole number written as a float is accepted */
    v = json_real(5685324.0);
    edit_index(dir, set_total_size, v);
    json_decref(v);
    di_checkpoint *ck;
    di_error err = {0};
    if (di_ckpt_open(dir, &ck, &err) != DI_OK) fail_msg("%s", err.msg);
    di_ckpt_close(ck);
    drop_dir(dir);
}

static void test_not_a_checkpoint(void **state) {
    (void)state;
    char *dir = tu_tmpdir("empty");
    expect_fail(dir, DI_ERR_IO, (const char *[]){"neither", NULL});
    drop_dir(dir);
    expect_fail("/nonexistent/deepinfer-ckpt", DI_ERR_IO, (const char *[]){"/nonexistent/deepinfer-ckpt", NULL});
    expect_fail(tu_data("kernels.safetensors"), DI_ERR_IO, (const char *[]){"not a checkpoint directory", NULL});
}

/* Without an index a lone model.safetensors is the checkpoint. */
static void test_single_file(void **state) {
    (void)state;
    char *dir = copy_tiny();
    char *p = di_path_join(dir, INDEX);
    assert_int_equal(unlink(p), 0);
    di_checkpoint *ck;
    di_error err = {0};
    if (di_ckpt_open(dir, &ck, &err) != DI_OK) fail_msg("%s", err.msg);
    assert_int_equal(ck->n_tensors, 411);
    assert_int_equal(ck->total_bytes, 5685324);
    assert_non_null(di_ckpt_find(ck, "norm.weight"));
    di_ckpt_close(ck);
    free(p);
    drop_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_dirs_open),
        cmocka_unit_test(test_resharded),
        cmocka_unit_test(test_single_file),
        cmocka_unit_test(test_truncated_shard),
        cmocka_unit_test(test_header_length_past_eof),
        cmocka_unit_test(test_overlapping_tensors),
        cmocka_unit_test(test_size_mismatch),
        cmocka_unit_test(test_index_tensor_missing_from_shard),
        cmocka_unit_test(test_shard_tensor_not_in_index),
        cmocka_unit_test(test_tensor_in_two_shards),
        cmocka_unit_test(test_index_bad_json),
        cmocka_unit_test(test_index_missing_shard),
        cmocka_unit_test(test_index_outside_dir),
        cmocka_unit_test(test_index_shard_is_directory),
        cmocka_unit_test(test_index_total_size),
        cmocka_unit_test(test_not_a_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
