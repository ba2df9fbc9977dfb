/* The block graph on the smallest golden case, cheap enough for the ASan/UBSan subset: full verify of
 * v41-tiny-nosel (ops, teacher-forced, free-running), thread-count invariance, the stage dump and
 * refusal of a golden file of another model. The selection case, the mid case and the mutation tests
 * are in test_verify.c.  di-test: asan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/golden.h"
#include "golden_case.h"
#include "testutil.h"

static void test_tiny_nosel(void **s) { check_case(tu_data("v41-tiny-nosel")); }

/* Results do not depend on the thread count: every output element has one fixed reduction order. */
static void test_threads_invariant(void **s) {
    fixture f;
    assert_int_equal(open_case(tu_data("v41-tiny-nosel"), &f), DI_OK);
    di_backend *be3;
    di_error err = {0};
    assert_int_equal(di_backend_cpu_create(3, &be3, &err), DI_OK);
    di_prefill_out a, b;
    assert_int_equal(di_prefill(f.m, f.be, f.g->prompt_ids, f.g->T, NULL, &a, &err), DI_OK);
    assert_int_equal(di_prefill(f.m, be3, f.g->prompt_ids, f.g->T, NULL, &b, &err), DI_OK);
    const di_config *cfg = &f.m->cfg;
    int64_t n = f.g->T * cfg->hc_mult * cfg->hidden_size;
    for (int i = 0; i < cfg->n_layers; i++) assert_memory_equal(a.layer_out[i], b.layer_out[i], sizeof(uint16_t) * (size_t)n);
    assert_memory_equal(a.logits, b.logits, sizeof(float) * (size_t)(f.g->T * cfg->vocab_size));
    tu_report("v41-tiny-nosel prefill with 1 and 3 threads: bit-identical layer outputs and logits");
    di_prefill_out_free(&a);
    di_prefill_out_free(&b);
    di_backend_destroy(be3);
    close_case(&f);
}

/* A golden file of another model is refused with a message naming the tensor and both shapes. */
static void test_golden_mismatch(void **s) {
    di_model *m;
    di_golden *g = NULL;
    di_error err = {0};
    assert_int_equal(di_model_open(tu_data("v41-tiny-nosel"), &m, &err), DI_OK);
    char gp[1100];
    snprintf(gp, sizeof gp, "%s/golden.safetensors", tu_data("v41-tiny-sel"));
    assert_int_equal(di_golden_open(gp, &m->cfg, &g, &err), DI_ERR_INVALID);
    assert_null(g);
    tu_report("mismatched golden: %s", err.msg);
    assert_non_null(strstr(err.msg, "prefill_layer1_topk"));
    assert_non_null(strstr(err.msg, "[130,8]"));
    assert_int_equal(di_golden_open("tests/data/none.safetensors", &m->cfg, &g, &err), DI_ERR_IO);
    di_model_close(m);
}

/* The stage dump: every block stage under its name, the recorded block outputs and logits equal to the
 * pass's own results, index stages only on index-source layers, Engram stages only on Engram layers. */
static void test_stage_dump(void **s) {
    fixture f;
    assert_int_equal(open_case(tu_data("v41-tiny-nosel"), &f), DI_OK);
    di_stage_recorder rec = {0};
    di_fwd_opts fo = {.dump = di_stage_recorder_fn, .dump_ctx = &rec};
    di_prefill_out out;
    di_error err = {0};
    assert_int_equal(di_prefill(f.m, f.be, f.g->prompt_ids, f.g->T, &fo, &out, &err), DI_OK);
    const di_config *cfg = &f.m->cfg;
    int64_t n_out = f.g->T * cfg->hc_mult * cfg->hidden_size;
    int found_out = 0, found_logits = 0, idx_layers = 0, eg_layers = 0;
    for (int64_t i = 0; i < rec.n; i++) {
        const char *nm = rec.specs[i].name;
        int L;
        char rest[64];
        if (!strcmp(nm, "logits")) {
            assert_memory_equal(rec.data[i], out.logits, sizeof(float) * (size_t)(f.g->T * cfg->vocab_size));
            found_logits++;
        } else if (sscanf(nm, "L%d.%63s", &L, rest) == 2) {
            if (!strcmp(rest, "out")) {
                assert_memory_equal(rec.data[i], out.layer_out[L], sizeof(uint16_t) * (size_t)n_out);
                found_out++;
            }
            if (!strcmp(rest, "attn.index_scores")) {
                assert_true(cfg->layer[L].is_index_source);
                idx_layers++;
            }
            if (!strcmp(rest, "engram.out")) {
                assert_true(cfg->layer[L].engram_index >= 0);
                eg_layers++;
            }
        }
    }
    int want_idx = 0;
    for (int L = 0; L < cfg->n_layers; L++) want_idx += cfg->layer[L].is_index_source;
    tu_report("stage dump of v41-tiny-nosel: %lld named tensors", (long long)rec.n);
    assert_int_equal(found_out, cfg->n_layers);
    assert_int_equal(found_logits, 1);
    assert_int_equal(idx_layers, want_idx);
    assert_int_equal(eg_layers, cfg->n_engram_layers);
    di_stage_recorder_free(&rec);
    di_prefill_out_free(&out);
    close_case(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_nosel),
        cmocka_unit_test(test_threads_invariant),
        cmocka_unit_test(test_golden_mismatch),
        cmocka_unit_test(test_stage_dump),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
