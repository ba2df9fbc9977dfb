#include "golden_case.h"

#include <stdio.h>
#include <string.h>

#include "model/golden.h"
#include "testutil.h"

int open_case(const char *dir, fixture *f) {
    if (!dir) return -1;
    char gp[1100];
    snprintf(gp, sizeof gp, "%s/golden.safetensors", dir);
    di_error err = {0};
    memset(f, 0, sizeof *f);
    int rc = di_model_open(dir, &f->m, &err);
    if (!rc) rc = di_golden_open(gp, &f->m->cfg, &f->g, &err);
    if (!rc) rc = di_backend_cpu_create(1, &f->be, &err);
    if (rc) print_error("%s: %s\n", dir, err.msg);
    return rc;
}

void close_case(fixture *f) {
    di_golden_close(f->g);
    di_model_close(f->m); /* before its backend */
    di_backend_destroy(f->be);
}

/* Full verify of one case; asserts every bound and prints every number. */
void check_case(const char *dir) {
    fixture f;
    assert_int_equal(open_case(dir, &f), DI_OK);
    di_verify_opts o;
    di_verify_opts_default(&o);
    o.kernels_path = tu_data("kernels.safetensors");
    di_verify_report r;
    di_error err = {0};
    assert_int_equal(di_verify_run(f.m, f.be, f.g, &o, &r, &err), DI_OK);
    const char *cn = f.g->case_name;
    assert_true(r.has_ops);
    for (int i = 0; i < r.ops.n; i++) {
        const di_verify_op *op = &r.ops.ops[i];
        tu_report("%s op %s: %s %.4g (bound %g)", cn, op->name, op->metric, op->value, op->bound);
        assert_true(op->ok);
    }
    for (int i = 0; i < r.n_layers; i++) {
        di_verify_layer *l = &r.layers[i];
        tu_report("%s layer %d: teacher-forced rel %.3e (bound 1.5e-2), free-running rel %.3e (3x floor %.3e)", cn, i,
                  l->tf_rel, l->free_rel, 3 * l->floor);
        assert_true(l->tf_rel <= 1.5e-2);
        assert_true(l->free_rel <= 3 * l->floor);
        if (l->has_index) {
            tu_report("%s layer %d top-k on the reference's scores: %lld/%lld identical, %lld tied, %lld bad; own "
                      "scores drift max %.0f mean %.4f bf16 ulps, %lld masked differently",
                      cn, i, (long long)l->topk_identical, (long long)l->topk_rows, (long long)l->topk_tied,
                      (long long)l->topk_bad, l->drift_max_ulps, l->drift_mean_ulps, (long long)l->drift_mask_mismatch);
            assert_int_equal(l->topk_bad, 0);
            /* the CPU backend replays the reference's CPU tie behaviour: every row identical */
            assert_int_equal(l->topk_identical, l->topk_rows);
            assert_int_equal(l->drift_mask_mismatch, 0);
        }
    }
    tu_report("%s prompt logits: rel %.3e (3x floor %.3e), argmax agrees on %lld/%lld", cn, r.logits_rel,
              3 * r.logits_floor, (long long)r.argmax_agree, (long long)r.T);
    assert_true(r.logits_rel <= 3 * r.logits_floor);
    assert_true(r.pass);
    di_verify_report_free(&r);
    close_case(&f);
}

