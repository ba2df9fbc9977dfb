/* deepinfer plan — the memory plan of a run, from the config alone (no weights are opened).
 *
 *   deepinfer plan --model DIR | --config FILE [--device cpu|cuda] [--device-memory SIZE]
 *                  [--host-memory SIZE] [--max-seqs N] [--max-tokens T] [--spec-margin M]
 *                  [--prefill-chunk C] [--experts-on-host] [--engram-on-device] [--vision] [--json]
 *
 * Prints weights by family (device / host), caches, workspace, expert staging, runtime reserve,
 * totals against the capacities, the verdict and the largest fit (model/memplan.h has the formulas).
 * SIZE: 139GiB, 149.25GB, 512MiB, bytes. Defaults: 139 GiB for cuda, MemAvailable for cpu and for
 * the host side of cuda; one sequence of max_position_embeddings tokens.
 * Exit status 1 when the run does not fit (the table is still printed; the reason goes to stderr;
 * with --json the document carries the whole plan, "ok": false and the reason as "error").
 * `deepinfer inspect --plan ...` forwards here, so --plan is accepted and ignored. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/config.h"
#include "model/memplan.h"

int cmd_plan(int argc, char **argv);

static bool size_opt(const di_cli *cli, di_args *a, const char *name, int64_t *out) {
    const char *s = cli_str(a, name, NULL);
    *out = 0;
    if (!s) {
        for (int i = 1; i < a->argc; i++)
            if (a->used[i] && !strncmp(a->argv[i], "--", 2) && !strcmp(a->argv[i] + 2, name)) {
                cli_fail(cli, "--%s expects a size (e.g. 139GiB)", name);
                return false;
            }
        return true;
    }
    di_error err = {0};
    if (di_memplan_parse_bytes(s, out, &err)) {
        cli_fail(cli, "--%s: %s", name, err.msg);
        return false;
    }
    if (*out <= 0) {
        cli_fail(cli, "--%s: %s is not a positive size", name, s);
        return false;
    }
    return true;
}

static json_t *plan_json(const char *target, const di_memplan *p) {
    const di_memplan_opts *o = &p->opts;
    json_t *doc = json_object(), *w = json_object(), *wd = json_object(), *wh = json_object();
    json_object_set_new(doc, "config", json_string(target));
    json_object_set_new(doc, "device", json_string(di_plan_device_name(o->device)));
    json_object_set_new(doc, "device_capacity", json_integer(p->device_capacity));
    json_object_set_new(doc, "host_capacity", json_integer(p->host_capacity));
    json_object_set_new(doc, "max_seqs", json_integer(o->max_seqs));
    json_object_set_new(doc, "max_tokens", json_integer(o->max_tokens));
    json_object_set_new(doc, "spec_margin", json_integer(o->spec_margin));
    json_object_set_new(doc, "prefill_chunk", json_integer(o->prefill_chunk));
    json_object_set_new(doc, "engram_on_host", json_boolean(o->engram_on_host));
    json_object_set_new(doc, "experts_on_host", json_boolean(o->experts_on_host));
    json_object_set_new(doc, "vision", json_boolean(o->vision));
    for (int g = 0; g < DI_PLAN_WGROUPS; g++) {
        if (p->weight_dev[g]) json_object_set_new(wd, di_plan_wgroup_name(g), json_integer(p->weight_dev[g]));
        if (p->weight_host[g]) json_object_set_new(wh, di_plan_wgroup_name(g), json_integer(p->weight_host[g]));
    }
    json_object_set_new(w, "device", wd);
    json_object_set_new(w, "host", wh);
    json_object_set_new(w, "device_total", json_integer(p->weights_dev));
    json_object_set_new(w, "host_total", json_integer(p->weights_host));
    json_object_set_new(w, "stored", json_integer(p->weights_stored));
    json_object_set_new(w, "stored_without_engram_tables", json_integer(p->weights_stored_no_engram));
    json_object_set_new(w, "wo_a_bf16_extra", json_integer(p->wo_a_extra));
    json_object_set_new(w, "largest_expert", json_integer(p->expert_bytes));
    json_object_set_new(doc, "weights", w);
    json_object_set_new(doc, "caches",
                        json_pack("{s:I, s:f, s:I, s:I}", "per_sequence", (json_int_t)p->cache.total_bytes,
                                  "per_token_bytes", p->cache.per_token_bytes, "fixed_per_sequence",
                                  (json_int_t)p->cache.fixed_bytes, "total", (json_int_t)p->caches_dev));
    json_object_set_new(doc, "workspace",
                        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "tokens", (json_int_t)p->ws.tokens,
                                  "residual", (json_int_t)p->ws.residual, "mhc", (json_int_t)p->ws.mhc, "attention",
                                  (json_int_t)p->ws.attention, "moe", (json_int_t)p->ws.moe, "engram",
                                  (json_int_t)p->ws.engram, "logits", (json_int_t)p->ws.logits, "total",
                                  (json_int_t)p->ws.total));
    json_object_set_new(doc, "expert_staging", json_integer(p->staging_dev));
    json_object_set_new(doc, "runtime_reserve", json_integer(p->reserve_dev));
    json_object_set_new(doc, "device_total", json_integer(p->device_total));
    json_object_set_new(doc, "host_total", json_integer(p->host_total));
    json_object_set_new(doc, "fits", json_boolean(p->fits));
    json_object_set_new(doc, "max_seqs_fit", json_integer(p->max_seqs_fit));
    json_object_set_new(doc, "max_tokens_fit", json_integer(p->max_tokens_fit));
    return doc;
}

int cmd_plan(int argc, char **argv) {
    di_cli cli = {.cmd = argc > 0 ? argv[0] : "plan"};
    di_args a;
    cli_args_init(&a, argc, argv);
    cli.json = cli_flag(&a, "json");
    int rc = 1;
    const char *model = cli_str(&a, "model", NULL), *config = cli_str(&a, "config", NULL), *device = NULL;
    long long seqs, tokens, margin, chunk;
    di_memplan_opts o;
    (void)cli_flag(&a, "plan");
    if (!cli_device(&cli, &a, &device)) goto out;
    di_memplan_opts_default(&o, strcmp(device, "cuda") == 0 ? DI_PLAN_CUDA : DI_PLAN_CPU);
    if (!size_opt(&cli, &a, "device-memory", &o.device_bytes) || !size_opt(&cli, &a, "host-memory", &o.host_bytes) ||
        !cli_int(&cli, &a, "max-seqs", 1, 1, DI_MEMPLAN_MAX_SEQS, &seqs) ||
        !cli_int(&cli, &a, "max-tokens", 0, 1, INT32_MAX, &tokens) ||
        !cli_int(&cli, &a, "spec-margin", -1, -1, 1024, &margin) ||
        !cli_int(&cli, &a, "prefill-chunk", DI_MEMPLAN_CHUNK_DEFAULT, 1, DI_MEMPLAN_MAX_CHUNK, &chunk))
        goto out;
    o.max_seqs = seqs;
    o.max_tokens = tokens;
    o.spec_margin = (int)margin;
    o.prefill_chunk = chunk;
    o.experts_on_host = cli_flag(&a, "experts-on-host");
    o.engram_on_host = !cli_flag(&a, "engram-on-device");
    o.vision = cli_flag(&a, "vision");
    if (!cli_check_unused(&cli, &a)) goto out;
    if (!model == !config) {
        cli_fail(&cli, "give exactly one of --model DIR or --config FILE");
        goto out;
    }
    const char *target = model ? model : config;

    di_config *cfg = malloc(sizeof *cfg); /* ~100 KB: off the stack */
    di_error err = {0};
    di_memplan plan;
    if (!cfg) {
        cli_fail(&cli, "out of memory");
        goto out;
    }
    if (di_config_load(target, cfg, &err) || di_memplan_compute(cfg, &o, &plan, &err)) {
        rc = cli_fail_err(&cli, &err);
        free(cfg);
        goto out;
    }
    free(cfg);
    if (!cli.json) {
        printf("config       %s\n", target);
        di_memplan_print(&plan, stdout);
        fflush(stdout);
    }
    if (di_memplan_check(&plan, &err) != DI_OK) {
        fprintf(stderr, "deepinfer %s: error: %s\n", cli.cmd, err.msg);
        if (cli.json) {
            json_t *doc = plan_json(target, &plan);
            json_object_set_new(doc, "ok", json_false());
            json_object_set_new(doc, "command", json_string(cli.cmd));
            json_object_set_new(doc, "error", json_string(err.msg));
            json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            fputc('\n', stdout);
            json_decref(doc);
        }
        rc = 1;
        goto out;
    }
    rc = cli.json ? cli_emit(&cli, plan_json(target, &plan)) : 0;
out:
    cli_args_free(&a);
    return rc;
}
