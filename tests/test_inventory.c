/* Tensor inventory: published V4.1-Flash totals, golden checkpoints, malformed checkpoints.
 * di-test: asan */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/checkpoint.h"
#include "model/config.h"
#include "model/inventory.h"
#include "testutil.h"

static di_config *load_cfg(const char *dir) {
    di_config *c = malloc(sizeof *c);
    di_error err = {0};
    if (di_config_load(dir, c, &err)) fail_msg("%s: %s", dir, err.msg);
    return c;
}

static const di_inv_entry *find(const di_inv_entry *v, int64_t n, const char *name) {
    for (int64_t i = 0; i < n; i++)
        if (strcmp(v[i].name, name) == 0) return &v[i];
    return NULL;
}

static void expect_entry(const di_inv_entry *v, int64_t n, const char *name, di_dtype dt, int64_t d0, int64_t d1,
                         di_family fam) {
    const di_inv_entry *e = find(v, n, name);
    if (!e) fail_msg("inventory lacks %s", name);
    assert_int_equal(e->dtype, dt);
    assert_int_equal(e->ndim, d1 ? 2 : 1);
    assert_int_equal(e->shape[0], d0);
    if (d1) assert_int_equal(e->shape[1], d1);
    assert_int_equal(e->family, fam);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const di_inv_entry *)a)->name, ((const di_inv_entry *)b)->name);
}

/* Spec §2.1/§2.4/§7.1: every published number of the released checkpoint, from its config alone. */
static void test_released_totals(void **state) {
    (void)state;
    di_config *c = load_cfg(tu_data("v41-flash-config"));
    di_inv_entry *v;
    int64_t n;
    di_error err = {0};
    assert_int_equal(di_inventory_build(c, &v, &n, &err), DI_OK);
    di_inv_totals t;
    di_inventory_totals(v, n, &t);
    assert_int_equal(t.n_text_tensors, 95819);
    assert_int_equal(t.n_tensors - t.n_text_tensors, 266);
    assert_int_equal(n, 96085);
    assert_int_equal(t.n_fp4_matrices, 47232);
    assert_int_equal(t.text_bytes, 509315486040LL);
    assert_int_equal(t.engram_bytes, 202758032400LL);
    /* ≈ 551.9 B backbone + 196.6 B Engram + 14.2 B DSpark (762.7 B text) */
    assert_true(t.backbone_params >= 551850000000LL && t.backbone_params < 551950000000LL);
    assert_true(t.engram_params >= 196550000000LL && t.engram_params < 196650000000LL);
    assert_true(t.dspark_params >= 14150000000LL && t.dspark_params < 14250000000LL);
    assert_true(t.backbone_params + t.engram_params + t.dspark_params >= 762650000000LL &&
                t.backbone_params + t.engram_params + t.dspark_params < 762750000000LL);
    tu_report("released: %lld text tensors, %lld FP4, %lld text bytes, params backbone %lld engram %lld dspark %lld",
              (long long)t.n_text_tensors, (long long)t.n_fp4_matrices, (long long)t.text_bytes,
              (long long)t.backbone_params, (long long)t.engram_params, (long long)t.dspark_params);

    /* per-layer tensor counts of §2.4 */
    for (int L = 0; L < 40; L++) {
        int64_t want = 2334;
        if (L == 1) want = 2340;
        if (L == 2 || L == 8) want = 2342;
        if (L == 14) want = 2348;
        if (L == 20) want = 2341;
        if (L == 24 || L == 28 || L == 32 || L == 36) want = 2337;
        assert_int_equal(di_inventory_count_layer(v, n, L), want);
    }
    assert_int_equal(di_inventory_count_layer(v, n, 40), 801);
    assert_int_equal(di_inventory_count_layer(v, n, 41), 798);
    assert_int_equal(di_inventory_count_layer(v, n, 42), 802);
    assert_int_equal(di_inventory_count_layer(v, n, -1), 3);
    assert_int_equal(di_inventory_count_layer(v, n, -2), 266);

    /* spot checks of names, shapes and dtypes (§2.4, §4.8) */
    expect_entry(v, n, "embed.weight", DI_BF16, 129280, 5120, DI_FAM_EMBED);
    expect_entry(v, n, "layers.7.attn.wq_a.scale", DI_F8_E8M0, 40, 160, DI_FAM_ATTN);
    expect_entry(v, n, "layers.7.attn.wq_b.weight", DI_F8_E4M3, 32768, 1280, DI_FAM_ATTN);
    expect_entry(v, n, "layers.7.attn.wq_b.scale", DI_F8_E8M0, 1024, 40, DI_FAM_ATTN);
    expect_entry(v, n, "layers.7.attn.wo_a.weight", DI_F8_E4M3, 8192, 4096, DI_FAM_ATTN);
    expect_entry(v, n, "layers.7.attn.wo_b.scale", DI_F8_E8M0, 160, 256, DI_FAM_ATTN);
    expect_entry(v, n, "layers.7.hc_attn_fn", DI_F32, 24, 20480, DI_FAM_MHC);
    expect_entry(v, n, "layers.7.ffn.experts.383.w2.weight", DI_I8, 5120, 1152, DI_FAM_EXPERTS);
    expect_entry(v, n, "layers.7.ffn.experts.0.w1.scale", DI_F8_E8M0, 2304, 160, DI_FAM_EXPERTS);
    expect_entry(v, n, "layers.7.ffn.shared_experts.w2.scale", DI_F8_E8M0, 160, 72, DI_FAM_SHARED_EXPERT);
    expect_entry(v, n, "layers.7.ffn.gate.bias_vl", DI_F32, 384, 0, DI_FAM_ROUTER);
    expect_entry(v, n, "layers.8.attn.compressor.wgate.weight", DI_BF16, 512, 5120, DI_FAM_COMPRESSOR);
    expect_entry(v, n, "layers.20.attn.indexer.wk.weight", DI_BF16, 128, 512, DI_FAM_INDEXER);
    expect_entry(v, n, "layers.24.attn.indexer.wq_b.scale", DI_F8_E8M0, 128, 40, DI_FAM_INDEXER);
    expect_entry(v, n, "layers.14.engram.embed.weight", DI_F8_E4M3, 384016682, 256, DI_FAM_ENGRAM);
    expect_entry(v, n, "layers.14.engram.embed.scale", DI_F8_E8M0, 384016682, 8, DI_FAM_ENGRAM);
    expect_entry(v, n, "layers.1.engram.wkv.scale", DI_F8_E8M0, 800, 192, DI_FAM_ENGRAM);
    expect_entry(v, n, "layers.1.engram.q_weight", DI_BF16, 4, 5120, DI_FAM_ENGRAM);
    expect_entry(v, n, "mtp.0.main_proj.scale", DI_F8_E8M0, 160, 480, DI_FAM_DSPARK);
    expect_entry(v, n, "mtp.1.ffn.gate.weight", DI_BF16, 128, 5120, DI_FAM_ROUTER);
    expect_entry(v, n, "mtp.2.confidence_head.proj.weight", DI_BF16, 1, 5376, DI_FAM_DSPARK);
    expect_entry(v, n, "mtp.2.markov_head.head.weight", DI_BF16, 129280, 256, DI_FAM_DSPARK);
    expect_entry(v, n, "aligner.w1.weight", DI_BF16, 5120, 9216, DI_FAM_VISION);
    expect_entry(v, n, "vision.blocks.31.mlp.w1.weight", DI_BF16, 5632, 1024, DI_FAM_VISION);
    expect_entry(v, n, "image_newline", DI_BF16, 5120, 0, DI_FAM_VISION);
    assert_null(find(v, n, "layers.21.attn.compressor.wkv.weight"));
    assert_null(find(v, n, "layers.20.attn.compressor.wgate.weight"));
    assert_null(find(v, n, "layers.24.attn.indexer.wk.weight"));
    assert_null(find(v, n, "mtp.1.main_proj.weight"));
    assert_null(find(v, n, "hc_head_fn"));

    /* stable readable order: embed first, backbone, norm/head, mtp, vision; names unique */
    assert_string_equal(v[0].name, "embed.weight");
    assert_string_equal(v[n - 1].name, "image_newline");
    assert_string_equal(v[t.n_text_tensors - 1].name, "mtp.2.confidence_head.proj.weight");
    qsort(v, (size_t)n, sizeof *v, cmp_name);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(v[i - 1].name, v[i].name) == 0) fail_msg("duplicate %s", v[i].name);
    free(v);

    /* without vision_config: no bias_vl (one per block) and no vision tensors */
    c->has_vision = false;
    assert_int_equal(di_inventory_build(c, &v, &n, &err), DI_OK);
    assert_int_equal(n, 95819 - 43);
    assert_null(find(v, n, "layers.0.ffn.gate.bias_vl"));
    free(v);
    free(c);
}

/* Every golden case validates against the inventory of its own config. */
static void validate_dir(const char *dir, int64_t want_tensors) {
    di_config *c = load_cfg(dir);
    di_checkpoint *ck;
    di_error err = {0};
    if (di_ckpt_open(dir, &ck, &err)) fail_msg("%s", err.msg);
    if (di_inventory_validate(c, ck, &err)) fail_msg("%s", err.msg);
    di_inv_entry *v;
    int64_t n;
    assert_int_equal(di_inventory_build(c, &v, &n, &err), DI_OK);
    assert_int_equal(n, ck->n_tensors);
    assert_int_equal(n, want_tensors);
    di_inv_totals t;
    di_inventory_totals(v, n, &t);
    assert_int_equal((uint64_t)t.bytes, ck->total_bytes);
    tu_report("%s: %lld tensors, %lld bytes validated", dir, (long long)n, (long long)t.bytes);
    free(v);
    di_ckpt_close(ck);
    free(c);
}

static void test_golden_validate(void **state) {
    (void)state;
    validate_dir(tu_data("v41-tiny-sel"), 411);
    validate_dir(tu_data("v41-tiny-nosel"), 579);
    const char *mid = tu_shared_golden("v41-mid-nosel");
    if (mid)
        validate_dir(mid, 411);
    else
        tu_report("mid golden case: skipped (../shared/golden/v41-mid-nosel absent)");
}

/* ---- malformed checkpoints: a golden case copied and rewritten ---- */

typedef enum { EDIT_NONE, EDIT_DROP, EDIT_DTYPE, EDIT_SHAPE, EDIT_EXTRA } edit_kind;

/* Copy tiny-sel's configs into a temp dir and write its weights as one model.safetensors, with one
 * tensor dropped / retyped / reshaped, or one extra tensor added. */
static char *make_case(edit_kind kind, const char *target) {
    char *dir = tu_tmpdir("inv");
    char p[1200], q[1200];
    snprintf(p, sizeof p, "%s/inference", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(tu_copy_file(tu_data("v41-tiny-sel/config.json"), p), 0);
    snprintf(p, sizeof p, "%s/inference/config.json", dir);
    assert_int_equal(tu_copy_file(tu_data("v41-tiny-sel/inference/config.json"), p), 0);

    di_safetensors *st;
    di_error err = {0};
    assert_int_equal(di_st_open(tu_data("v41-tiny-sel/model.safetensors"), &st, &err), DI_OK);
    int64_t n = st->n_tensors;
    di_tensor_spec *sp = calloc((size_t)n + 1, sizeof *sp);
    const void **data = calloc((size_t)n + 1, sizeof *data);
    static const uint8_t zeros[64];
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const di_tensor_info *t = &st->tensors[i];
        int hit = strcmp(t->name, target) == 0;
        if (hit && kind == EDIT_DROP) continue;
        sp[k] = (di_tensor_spec){t->name, t->dtype, t->ndim, {0}};
        memcpy(sp[k].shape, t->shape, sizeof t->shape);
        data[k] = t->data;
        if (hit && kind == EDIT_DTYPE) {
            /* F32 [24] rewritten as BF16 [24]: same shape, half the bytes */
            sp[k].dtype = DI_BF16;
        }
        if (hit && kind == EDIT_SHAPE) sp[k].shape[0] -= 1;
        k++;
    }
    if (kind == EDIT_EXTRA) {
        sp[k] = (di_tensor_spec){target, DI_F32, 1, {4}};
        data[k++] = zeros;
    }
    snprintf(q, sizeof q, "%s/model.safetensors", dir);
    if (di_st_write_file(q, sp, data, k, &err)) fail_msg("%s", err.msg);
    free(sp);
    free(data);
    di_st_close(st);
    return dir;
}

static void expect_invalid(edit_kind kind, const char *target, const char *needle) {
    char *dir = make_case(kind, target);
    di_config *c = load_cfg(dir);
    di_checkpoint *ck;
    di_error err = {0};
    if (di_ckpt_open(dir, &ck, &err)) fail_msg("%s", err.msg);
    int rc = di_inventory_validate(c, ck, &err);
    if (kind == EDIT_NONE) {
        if (rc) fail_msg("%s", err.msg);
    } else {
        assert_int_equal(rc, DI_ERR_INVALID);
        if (!strstr(err.msg, needle)) fail_msg("error '%s' does not mention '%s'", err.msg, needle);
        assert_non_null(strstr(err.msg, dir)); /* names the checkpoint */
        assert_non_null(strstr(err.msg, target));
    }
    di_ckpt_close(ck);
    free(c);
    tu_rmtree(dir);
    free(dir);
}

static void test_malformed_checkpoints(void **state) {
    (void)state;
    expect_invalid(EDIT_NONE, "", "");
    expect_invalid(EDIT_DROP, "layers.2.attn.wkv.scale", "1 missing (layers.2.attn.wkv.scale)");
    expect_invalid(EDIT_DTYPE, "layers.0.hc_attn_base",
                   "1 mismatched (layers.0.hc_attn_base expected F32 [24], found BF16 [24] in model.safetensors)");
    expect_invalid(EDIT_SHAPE, "layers.3.attn.indexer.wk.weight",
                   "layers.3.attn.indexer.wk.weight expected BF16 [64,64], found BF16 [63,64] in model.safetensors");
    expect_invalid(EDIT_EXTRA, "layers.0.ffn.gate.bias_vl", "1 unexpected (layers.0.ffn.gate.bias_vl in model.safetensors)");
}

/* A config edit (more experts) leaves every new expert tensor missing: the count is exact and the
 * message lists the first few. */
static void test_config_mismatch(void **state) {
    (void)state;
    char *dir = make_case(EDIT_NONE, "");
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    assert_non_null(root);
    json_object_set_new(json_object_get(root, "text_config"), "n_routed_experts", json_integer(5));
    json_object_set_new(json_object_get(root, "text_config"), "dspark_n_routed_experts", json_integer(5));
    assert_int_equal(json_dump_file(root, p, 0), 0);
    json_decref(root);
    di_config *c = load_cfg(dir);
    di_checkpoint *ck;
    di_error err = {0};
    assert_int_equal(di_ckpt_open(dir, &ck, &err), DI_OK);
    assert_int_equal(di_inventory_validate(c, ck, &err), DI_ERR_INVALID);
    /* 7 blocks × (6 expert tensors) missing; gate weight/bias reshaped in all 7 blocks */
    if (!strstr(err.msg, "42 missing (layers.0.ffn.experts.4.w1.scale, layers.0.ffn.experts.4.w1.weight, "
                         "layers.0.ffn.experts.4.w2.scale, ...)"))
        fail_msg("%s", err.msg);
    if (!strstr(err.msg, "14 mismatched (layers.0.ffn.gate.bias expected F32 [5], found F32 [4]")) fail_msg("%s", err.msg);
    di_ckpt_close(ck);
    free(c);
    tu_rmtree(dir);
    free(dir);
}

/* Write every inventory entry (zero-filled) as one model.safetensors; `retype` (if found) is stored as
 * F32 and `drop` is left out. */
static void write_from_inventory(const char *dir, const di_inv_entry *v, int64_t n, const char *retype,
                                 const char *drop) {
    di_tensor_spec *sp = calloc((size_t)n, sizeof *sp);
    const void **data = calloc((size_t)n, sizeof *data);
    int64_t k = 0, biggest = 0;
    for (int64_t i = 0; i < n; i++)
        if (di_inv_entry_bytes(&v[i]) * 2 > biggest) biggest = di_inv_entry_bytes(&v[i]) * 2;
    void *zeros = calloc(1, (size_t)biggest);
    for (int64_t i = 0; i < n; i++) {
        if (drop && strcmp(v[i].name, drop) == 0) continue;
        sp[k] = (di_tensor_spec){v[i].name, v[i].dtype, v[i].ndim, {0}};
        memcpy(sp[k].shape, v[i].shape, sizeof v[i].shape);
        if (retype && strcmp(v[i].name, retype) == 0) sp[k].dtype = DI_F32;
        data[k++] = zeros;
    }
    char p[1200];
    di_error err = {0};
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (di_st_write_file(p, sp, data, k, &err)) fail_msg("%s", err.msg);
    free(zeros);
    free(sp);
    free(data);
}

static int validate_in(const char *dir, const di_config *c, di_error *err) {
    di_checkpoint *ck;
    if (di_ckpt_open(dir, &ck, err)) fail_msg("%s", err->msg);
    int rc = di_inventory_validate(c, ck, err);
    di_ckpt_close(ck);
    return rc;
}

/* With a vision_config: bias_vl in every block and the ViT/aligner/span tensors become required. */
static void test_vision_checkpoint(void **state) {
    (void)state;
    char *dir = tu_tmpdir("invvl");
    char p[1200];
    json_error_t je;
    json_t *root = json_load_file(tu_data("v41-tiny-sel/config.json"), 0, &je);
    assert_non_null(root);
    json_object_set_new(root, "vision_config",
                        json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}", "num_hidden_layers", 1, "hidden_size", 32,
                                  "num_attention_heads", 2, "intermediate_size", 32, "patch_size", 2,
                                  "downsample_ratio", 2));
    json_object_set_new(root, "image_token_id", json_integer(500));
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(json_dump_file(root, p, 0), 0);
    json_decref(root);
    di_config *c = load_cfg(dir);
    assert_true(c->has_vision);
    di_inv_entry *v;
    int64_t n;
    di_error err = {0};
    assert_int_equal(di_inventory_build(c, &v, &n, &err), DI_OK);
    assert_int_equal(di_inventory_count_layer(v, n, -2), 2 + 8 + 1 + 4 + 3);
    assert_int_equal(n, 411 + 7 + 18); /* + bias_vl in 6 layers and 1 DSpark stage */
    expect_entry(v, n, "aligner.w1.weight", DI_BF16, 256, 32 * 2 * 2, DI_FAM_VISION);
    expect_entry(v, n, "vision.patch_embed.proj.weight", DI_BF16, 32, 3 * 2 * 2, DI_FAM_VISION);
    expect_entry(v, n, "mtp.0.ffn.gate.bias_vl", DI_F32, 4, 0, DI_FAM_ROUTER);

    write_from_inventory(dir, v, n, NULL, NULL);
    if (validate_in(dir, c, &err)) fail_msg("%s", err.msg);
    /* vision dtypes are not pinned by official headers: F32 storage is accepted there ... */
    write_from_inventory(dir, v, n, "vision.norm.weight", NULL);
    if (validate_in(dir, c, &err)) fail_msg("%s", err.msg);
    /* ... but not in the text model */
    write_from_inventory(dir, v, n, "layers.0.attn_norm.weight", NULL);
    assert_int_equal(validate_in(dir, c, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "layers.0.attn_norm.weight expected BF16 [256], found F32 [256]"));
    write_from_inventory(dir, v, n, NULL, "layers.3.ffn.gate.bias_vl");
    assert_int_equal(validate_in(dir, c, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "1 missing (layers.3.ffn.gate.bias_vl)"));
    write_from_inventory(dir, v, n, NULL, "image_end");
    assert_int_equal(validate_in(dir, c, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "1 missing (image_end)"));
    free(v);
    free(c);
    tu_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_released_totals),
        cmocka_unit_test(test_golden_validate),
        cmocka_unit_test(test_malformed_checkpoints),
        cmocka_unit_test(test_config_mismatch),
        cmocka_unit_test(test_vision_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
