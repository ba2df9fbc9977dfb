/* mkmodel: generated checkpoints load, validate against the inventory, are deterministic per seed,
 * and carry consistent quantization and Engram constants. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "io/checkpoint.h"
#include "io/formats.h"
#include "model/config.h"
#include "model/engram_consts.h"
#include "model/inventory.h"
#include "model/mkmodel.h"
#include "testutil.h"

static char *g_dir; /* tiny preset, seed 7, written once for the group */

static int setup(void **state) {
    (void)state;
    g_dir = tu_tmpdir("mk");
    di_mkmodel_opts o = {.preset = "tiny", .seed = 7, .out_dir = g_dir, .threads = 4};
    di_mkmodel_stats st;
    di_error err = {0};
    if (di_mkmodel_write(&o, &st, &err) != DI_OK) {
        fprintf(stderr, "mkmodel failed: %s\n", err.msg);
        return -1;
    }
    tu_report("tiny preset: %lld tensors, %d shards, %.1f MB in %.2f s (%d threads)", (long long)st.n_tensors,
              st.n_shards, (double)st.tensor_bytes / 1e6, st.seconds, st.threads);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    tu_report("peak RSS after writing: %.1f MB", ru.ru_maxrss / 1024.0);
    /* Streaming: peak memory stays far below the checkpoint size. */
    if ((double)ru.ru_maxrss * 1024.0 > 0.5 * (double)st.tensor_bytes) {
        fprintf(stderr, "peak RSS %ld KB is not small against %llu bytes written\n", ru.ru_maxrss,
                (unsigned long long)st.tensor_bytes);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    return 0;
}

static void test_loads_and_validates(void **state) {
    (void)state;
    di_error err = {0};
    di_config cfg;
    assert_int_equal(di_config_load(g_dir, &cfg, &err), DI_OK);
    di_checkpoint *ck;
    assert_int_equal(di_ckpt_open(g_dir, &ck, &err), DI_OK);
    if (di_inventory_validate(&cfg, ck, &err) != DI_OK) fail_msg("%s", err.msg);
    assert_true(ck->n_shards >= 3); /* backbone + one shard per Engram table */
    const di_tensor_info *e = di_ckpt_find(ck, "embed.weight");
    assert_non_null(e);
    assert_int_equal(e->shape[0], 129280);
    di_engram_consts ec;
    if (di_engram_consts_load(&cfg, g_dir, &ec, &err) != DI_OK) fail_msg("%s", err.msg);
    di_engram_consts_free(&ec);
    di_ckpt_close(ck);
    di_config_free(&cfg);
}

/* FP8 weights: each 32×32 block's scale is the smallest power of two that fits its amax into
 * e4m3, so some code of every non-zero block exceeds 224 in magnitude. */
static void test_fp8_blocks(void **state) {
    (void)state;
    di_error err = {0};
    di_checkpoint *ck;
    assert_int_equal(di_ckpt_open(g_dir, &ck, &err), DI_OK);
    const di_tensor_info *w = di_ckpt_find(ck, "layers.2.attn.wq_b.weight");
    const di_tensor_info *s = di_ckpt_find(ck, "layers.2.attn.wq_b.scale");
    assert_non_null(w);
    assert_non_null(s);
    assert_int_equal(w->dtype, DI_F8_E4M3);
    int64_t R = w->shape[0], C = w->shape[1], SC = s->shape[1];
    const uint8_t *codes = w->data;
    int64_t full = 0;
    for (int64_t rb = 0; rb < s->shape[0]; rb++)
        for (int64_t cb = 0; cb < SC; cb++) {
            float amax = 0;
            for (int64_t r = rb * 32; r < R && r < rb * 32 + 32; r++)
                for (int64_t c = cb * 32; c < C && c < cb * 32 + 32; c++)
                    amax = fmaxf(amax, fabsf(di_e4m3_to_f32(codes[r * C + c])));
            assert_true(amax <= 448.0f);
            full += amax > 224.0f;
        }
    assert_int_equal(full, s->shape[0] * SC);
    /* dequantized values are ~N(0, 1.5/sqrt(K)) */
    float *row = malloc((size_t)C * sizeof *row);
    double ss = 0;
    for (int64_t r = 0; r < R; r++) {
        di_dequant_fp8_rows(codes, s->data, R, C, 32, r, 1, row);
        for (int64_t c = 0; c < C; c++) ss += (double)row[c] * row[c];
    }
    double std = sqrt(ss / (double)(R * C)), want = 1.5 / sqrt((double)C);
    tu_report("wq_b dequantized std %.4f (target %.4f)", std, want);
    assert_true(fabs(std - want) < 0.1 * want);
    free(row);
    di_ckpt_close(ck);
}

/* Same seed, other thread count: the same bytes (each generation unit has its own stream; the
 * 66 MB embed.weight spans 16 units, so the unit split is exercised too). Other seed: different. */
static void test_deterministic(void **state) {
    (void)state;
    char *dir2 = tu_tmpdir("mk2");
    char *dir3 = tu_tmpdir("mk3");
    di_mkmodel_opts o = {.preset = "tiny", .seed = 7, .out_dir = dir2, .threads = 1};
    di_mkmodel_stats st;
    di_error err = {0};
    assert_int_equal(di_mkmodel_write(&o, &st, &err), DI_OK);
    assert_int_equal(st.threads, 1);
    o.seed = 8;
    o.out_dir = dir3;
    o.threads = 3;
    assert_int_equal(di_mkmodel_write(&o, &st, &err), DI_OK);
    assert_int_equal(st.threads, 3);
    di_checkpoint *a, *b, *c;
    assert_int_equal(di_ckpt_open(g_dir, &a, &err), DI_OK);
    assert_int_equal(di_ckpt_open(dir2, &b, &err), DI_OK);
    assert_int_equal(di_ckpt_open(dir3, &c, &err), DI_OK);
    assert_int_equal(a->n_tensors, b->n_tensors);
    int64_t same_seed_diff = 0, other_seed_same = 0;
    for (int64_t i = 0; i < a->n_tensors; i++) {
        const di_tensor_info *x = a->entries[i].info, *y = di_ckpt_find(b, x->name), *z = di_ckpt_find(c, x->name);
        assert_non_null(y);
        assert_non_null(z);
        size_t nb = x->end - x->begin;
        same_seed_diff += memcmp(x->data, y->data, nb) != 0;
        /* FP8 block scales follow from the weights' spread and can coincide across seeds */
        other_seed_same += nb > 64 && x->dtype != DI_F8_E8M0 && memcmp(x->data, z->data, nb) == 0;
    }
    assert_int_equal(same_seed_diff, 0);
    assert_int_equal(other_seed_same, 0);
    di_ckpt_close(a);
    di_ckpt_close(b);
    di_ckpt_close(c);
    tu_rmtree(dir2);
    tu_rmtree(dir3);
    free(dir2);
    free(dir3);
}

/* Every preset's config parses and implies the inventory it should; full-layer (written only on the
 * GPU machine) stays under the 40 GB the layer benchmarks allow and keeps the real dimensions. */
static void test_preset_configs(void **state) {
    (void)state;
    for (int i = 0; di_mkmodel_presets[i]; i++) {
        char *hf, *inf;
        di_error err = {0};
        assert_int_equal(di_mkmodel_preset_configs(di_mkmodel_presets[i], 64640, &hf, &inf, &err), DI_OK);
        di_config cfg;
        if (di_config_parse(hf, strlen(hf), inf, strlen(inf), di_mkmodel_presets[i], &cfg, &err) != DI_OK)
            fail_msg("%s: %s", di_mkmodel_presets[i], err.msg);
        di_inv_entry *inv;
        int64_t n;
        assert_int_equal(di_inventory_build(&cfg, &inv, &n, &err), DI_OK);
        uint64_t bytes = 0;
        for (int64_t j = 0; j < n; j++) bytes += di_inv_entry_bytes(&inv[j]);
        tu_report("preset %s: %lld tensors, %.2f GB", di_mkmodel_presets[i], (long long)n, (double)bytes / 1e9);
        if (!strcmp(di_mkmodel_presets[i], "full-layer")) {
            assert_true(bytes < UINT64_C(40000000000));
            assert_int_equal(cfg.hidden_size, 5120);
            assert_int_equal(cfg.n_routed_experts, 384);
        }
        free(inv);
        di_config_free(&cfg);
        free(hf);
        free(inf);
    }
    /* the compressed vocabulary divides the multiplier bound: 0 is refused, not a division by zero */
    char *hf = NULL, *inf = NULL;
    di_error err = {0};
    assert_int_equal(di_mkmodel_preset_configs("tiny", 0, &hf, &inf, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "engram_classes 0"));
    assert_null(hf);
}

static void test_bad_preset(void **state) {
    (void)state;
    di_mkmodel_opts o = {.preset = "huge", .seed = 1, .out_dir = "/nonexistent/x"};
    di_mkmodel_stats st;
    di_error err = {0};
    assert_int_not_equal(di_mkmodel_write(&o, &st, &err), DI_OK);
    assert_non_null(strstr(err.msg, "huge"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads_and_validates),
        cmocka_unit_test(test_fp8_blocks),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_preset_configs),
        cmocka_unit_test(test_bad_preset),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
