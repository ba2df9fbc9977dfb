/* deepinfer verify — fidelity of the block graph against golden data from the official reference.
 *
 *   deepinfer verify --model DIR --golden FILE [--json] [--dump FILE] [--device cpu|cuda] [--threads N]
 *                    [--kernels FILE | --no-ops] [--no-free] [--no-tf] [--dump-stages FILE]
 *                    [--cpu-impl fast|scalar]
 *
 * (0) per op: the reference kernel vectors (kernels.safetensors; default: the one in the directory
 *     above the case, as in ../shared/golden/ and tests/data/) through the backend's op slots, each
 *     within its README bound.
 * (a) free-running prefill from position 0: per-layer output and prompt-logit relative errors
 *     (‖ours − ref‖/‖ref‖) next to the case's noise floor (case.json beside FILE); bound 3× floor.
 * (b) teacher-forced: every block on the reference's input and pre-mix, shared attention state from our
 *     own teacher-forced source blocks; bound 1.5e-2 per block. On index-source layers our top-k runs
 *     on the reference's index scores (rows whose k-th and (k+1)-th scores are within 2 bf16 ulps count
 *     as ties) and our own scores' drift is reported in bf16 ulps.
 * --dump FILE writes prompt_logits, prefill_layer{i}_out and tf_layer{i}_out (golden names/shapes);
 * --dump-stages FILE every named stage tensor of both runs ("free.L3.attn.q", "tf.L5.ffn.out", ...).
 * Exit status 1 when any bound fails (or on error). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli.h"
#include "model/memplan.h"
#include "model/golden.h"

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *report_json(const di_golden *g, const di_verify_report *r, const di_verify_opts *o) {
    json_t *doc = json_object();
    json_object_set_new(doc, "case", json_string(g->case_name));
    json_object_set_new(doc, "T", json_integer(r->T));
    json_object_set_new(doc, "pass", json_boolean(r->pass));
    if (!r->pass) json_object_set_new(doc, "first_failure", json_string(r->first_failure));
    json_object_set_new(doc, "tf_bound", json_real(o->tf_bound));
    json_object_set_new(doc, "floor_multiple", json_real(o->floor_mult));
    if (r->has_ops) {
        json_t *ops = json_array();
        for (int i = 0; i < r->ops.n; i++) {
            const di_verify_op *op = &r->ops.ops[i];
            json_t *j = json_object();
            json_object_set_new(j, "op", json_string(op->name));
            json_object_set_new(j, "metric", json_string(op->metric));
            json_object_set_new(j, "value", num(op->value));
            json_object_set_new(j, "bound", num(op->bound));
            json_object_set_new(j, "ok", json_boolean(op->ok));
            json_array_append_new(ops, j);
        }
        json_object_set_new(doc, "ops", ops);
    } else {
        json_object_set_new(doc, "ops", json_null());
    }
    if (o->free_running) {
        json_t *pl = json_object();
        json_object_set_new(pl, "rel_err", num(r->logits_rel));
        json_object_set_new(pl, "noise_floor", num(r->logits_floor));
        json_object_set_new(pl, "ok", json_boolean(r->logits_ok));
        json_object_set_new(pl, "argmax_agree", json_integer(r->argmax_agree));
        json_object_set_new(doc, "prompt_logits", pl);
    }
    json_t *layers = json_array();
    for (int i = 0; i < r->n_layers; i++) {
        const di_verify_layer *l = &r->layers[i];
        json_t *j = json_object();
        json_object_set_new(j, "layer", json_integer(i));
        if (o->free_running) {
            json_object_set_new(j, "free_rel_err", num(l->free_rel));
            json_object_set_new(j, "free_premix_rel_err", num(l->free_premix_rel));
            json_object_set_new(j, "noise_floor", num(l->floor));
            json_object_set_new(j, "free_ok", json_boolean(l->free_ok));
        }
        if (o->teacher_forced) {
            json_object_set_new(j, "tf_rel_err", num(l->tf_rel));
            json_object_set_new(j, "tf_premix_rel_err", num(l->tf_premix_rel));
            json_object_set_new(j, "tf_ok", json_boolean(l->tf_ok));
            if (l->has_index) {
                json_t *t = json_object();
                json_object_set_new(t, "k", json_integer(l->topk_k));
                json_object_set_new(t, "rows", json_integer(l->topk_rows));
                json_object_set_new(t, "identical", json_integer(l->topk_identical));
                json_object_set_new(t, "tied", json_integer(l->topk_tied));
                json_object_set_new(t, "bad", json_integer(l->topk_bad));
                json_object_set_new(j, "topk_on_ref_scores", t);
                json_t *d = json_object();
                json_object_set_new(d, "compared", json_integer(l->drift_n));
                json_object_set_new(d, "differ", json_integer(l->drift_differ));
                json_object_set_new(d, "mask_mismatch", json_integer(l->drift_mask_mismatch));
                json_object_set_new(d, "max_ulps", json_real(l->drift_max_ulps));
                json_object_set_new(d, "mean_ulps", json_real(l->drift_mean_ulps));
                json_object_set_new(j, "index_score_drift", d);
            }
        }
        json_array_append_new(layers, j);
    }
    json_object_set_new(doc, "layers", layers);
    return doc;
}

static void report_text(const di_golden *g, const di_verify_report *r, const di_verify_opts *o) {
    printf("case %s: T=%lld, %d layers\n", g->case_name, (long long)r->T, r->n_layers);
    if (!r->has_ops) printf("op checks: skipped (no kernels.safetensors; --kernels FILE)\n");
    for (int i = 0; r->has_ops && i < r->ops.n; i++) {
        const di_verify_op *op = &r->ops.ops[i];
        printf("op %-15s %-34s %10.4g (bound %g) %s\n", op->name, op->metric, op->value, op->bound, op->ok ? "ok" : "FAIL");
    }
    printf("%-6s %12s %12s %6s %12s %6s  %s\n", "layer", "free_rel", "3x_floor", "ok", "tf_rel", "ok", "top-k / drift");
    for (int i = 0; i < r->n_layers; i++) {
        const di_verify_layer *l = &r->layers[i];
        printf("%-6d", i);
        if (o->free_running)
            printf(" %12.4e %12.4e %6s", l->free_rel, o->floor_mult * l->floor, l->free_ok ? "ok" : "FAIL");
        else
            printf(" %12s %12s %6s", "-", "-", "");
        if (o->teacher_forced)
            printf(" %12.4e %6s", l->tf_rel, l->tf_ok ? "ok" : "FAIL");
        else
            printf(" %12s %6s", "-", "");
        if (o->teacher_forced && l->has_index)
            printf("  k=%d identical %lld tied %lld bad %lld; drift max %.0f mean %.3f ulps (%lld/%lld differ, %lld "
                   "mask)",
                   l->topk_k, (long long)l->topk_identical, (long long)l->topk_tied, (long long)l->topk_bad,
                   l->drift_max_ulps, l->drift_mean_ulps, (long long)l->drift_differ, (long long)l->drift_n,
                   (long long)l->drift_mask_mismatch);
        printf("\n");
    }
    if (o->free_running)
        printf("prompt logits: rel %.4e (3x floor %.4e) %s; argmax agrees on %lld/%lld positions\n", r->logits_rel,
               o->floor_mult * r->logits_floor, r->logits_ok ? "ok" : "FAIL", (long long)r->argmax_agree,
               (long long)r->T);
    printf("%s%s\n", r->pass ? "PASS" : "FAIL: ", r->pass ? "" : r->first_failure);
}

int cmd_verify(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "verify", .json = cli_flag(&a, "json")};
    const char *model_dir = cli_str(&a, "model", NULL);
    const char *golden = cli_str(&a, "golden", NULL);
    const char *dump = cli_str(&a, "dump", NULL);
    const char *kernels = cli_str(&a, "kernels", NULL);
    const char *stages = cli_str(&a, "dump-stages", NULL);
    const char *impl = cli_str(&a, "cpu-impl", "fast");
    bool no_ops = cli_flag(&a, "no-ops");
    bool no_free = cli_flag(&a, "no-free"), no_tf = cli_flag(&a, "no-tf");
    const char *device = "cpu";
    long long threads = 1;
    bool ok = cli_device(&cli, &a, &device) && cli_int(&cli, &a, "threads", 1, 1, 256, &threads);
    ok = ok && cli_check_unused(&cli, &a);
    cli_args_free(&a);
    if (!ok) return 1;
    if (!model_dir || !golden) return cli_fail(&cli, "need --model DIR and --golden FILE");
    if (strcmp(device, "cpu") && strcmp(impl, "fast"))
        return cli_fail(&cli, "--cpu-impl %s applies to --device cpu only", impl);
    if (no_free && no_tf) return cli_fail(&cli, "--no-free and --no-tf leave nothing to check");
    if (strcmp(impl, "fast") && strcmp(impl, "scalar"))
        return cli_fail(&cli, "--cpu-impl %s: expected fast or scalar", impl);

    di_error err = {0};
    di_model *m = NULL;
    di_golden *g = NULL;
    di_backend *be = NULL;
    di_verify_report rep = {0};
    di_verify_opts o;
    di_verify_opts_default(&o);
    o.free_running = !no_free, o.teacher_forced = !no_tf, o.dump_path = dump, o.stages_path = stages;
    char *kdef = NULL; /* <case dir>/../kernels.safetensors */
    if (!kernels && !no_ops) {
        const char *slash = strrchr(golden, '/');
        size_t n = slash ? (size_t)(slash - golden) : 0;
        kdef = malloc(n + 64);
        if (kdef) {
            snprintf(kdef, n + 64, "%.*s%s../kernels.safetensors", (int)n, golden, n ? "/" : "");
            if (access(kdef, R_OK) == 0) kernels = kdef;
        }
    }
    o.kernels_path = no_ops ? NULL : kernels;
    /* the memory plan first (one sequence of the model's context): a model that cannot fit is refused
     * before any weight is read */
    int rc = di_memplan_preflight(model_dir, strcmp(device, "cuda") ? DI_PLAN_CPU : DI_PLAN_CUDA, 1, 0,
                                  stderr, &err);
    if (!rc) rc = di_model_open(model_dir, &m, &err);
    if (!rc) rc = di_golden_open(golden, &m->cfg, &g, &err);
    if (!rc && !strcmp(device, "cpu"))
        rc = di_backend_cpu_create_variant((int)threads, strcmp(impl, "scalar") ? DI_CPU_FAST : DI_CPU_SCALAR, &be, &err);
    else if (!rc)
        rc = di_backend_create(device, (int)threads, &be, &err);
    if (!rc) rc = di_model_to_backend(m, be, &err);
    if (!rc) rc = di_verify_run(m, be, g, &o, &rep, &err);
    int status;
    if (rc) {
        status = cli_fail_err(&cli, &err);
    } else if (cli.json) {
        json_t *doc = report_json(g, &rep, &o);
        cli_emit(&cli, doc);
        status = rep.pass ? 0 : 1;
    } else {
        report_text(g, &rep, &o);
        status = rep.pass ? 0 : 1;
    }
    di_verify_report_free(&rep);
    free(kdef);
    di_golden_close(g);
    di_model_close(m); /* device weights first: they live in the backend's memory */
    di_backend_destroy(be);
    return status;
}
