/* deepinfer inspect — validate a checkpoint against its config and summarise it.
 *
 *   deepinfer inspect --model DIR [--json]    config + every shard header validated against the
 *                                             expected inventory, Engram constants checked
 *   deepinfer inspect --config FILE [--json]  a config.json alone (no weights): the inventory the
 *                                             config implies (e.g. the released V4.1-Flash config)
 *
 * Summary: model shape, per-layer roles (ratio, kv/index/key/candidate sources, RoPE table, Engram,
 * DSpark target, experts, tensors, bytes), tensors and bytes by dtype, bytes and parameters by family,
 * logical parameters split backbone / Engram tables / DSpark / vision, and the per-sequence cache
 * footprint per layer type in the compact exact form of spec §4.7/§7.2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/engram_consts.h"
#include "model/inventory.h"

/* Per-stage sums over the inventory. */
typedef struct stage_sum {
    int64_t tensors, bytes, params;
} stage_sum;

/* One row of the cache table: layers sharing the same cache shape. */
typedef struct cache_type {
    char name[48];
    int n_layers;
    int64_t fixed_bytes;      /* per layer */
    double per_token_bytes;   /* per layer */
    int64_t entry_bytes;      /* compressed entry + index key, per layer */
    int ratio;
} cache_type;

typedef struct report {
    const char *target;       /* DIR or FILE */
    int checked;              /* weights validated */
    const di_config *cfg;
    di_inv_entry *inv;
    int64_t n_inv;
    di_inv_totals tot;
    stage_sum stage[DI_MAX_STAGES];
    stage_sum globals;        /* embed, norm, head */
    cache_type cache[DI_MAX_STAGES]; /* at most one new type per stage: never full */
    int n_cache;
    const char *engram_source; /* NULL = not checked / no Engram */
    int64_t ckpt_bytes;
} report;

static void add_cache(report *r, const char *name, const di_cache_footprint *f, int ratio) {
    for (int i = 0; i < r->n_cache; i++) {
        if (strcmp(r->cache[i].name, name) == 0) {
            r->cache[i].n_layers++;
            return;
        }
    }
    cache_type *c = &r->cache[r->n_cache++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->n_layers = 1;
    c->fixed_bytes = f->window_bytes + f->compressor_state_bytes;
    c->per_token_bytes = f->per_token_bytes;
    c->entry_bytes = f->compressed_entry_bytes + f->index_key_bytes;
    c->ratio = ratio;
}

static void summarise(report *r) {
    const di_config *c = r->cfg;
    di_inventory_totals(r->inv, r->n_inv, &r->tot);
    for (int64_t i = 0; i < r->n_inv; i++) {
        const di_inv_entry *e = &r->inv[i];
        stage_sum *s = e->layer >= 0 ? &r->stage[e->layer] : e->family == DI_FAM_VISION ? NULL : &r->globals;
        if (!s) continue;
        s->tensors++;
        s->bytes += di_inv_entry_bytes(e);
        s->params += e->params;
    }
    /* every stage keeps its window; kv sources add compressed KV + index keys per R tokens */
    for (int L = 0; L < c->n_stages; L++) {
        di_cache_footprint f;
        di_cache_footprint_of(c, L, &f);
        const di_layer_cfg *l = &c->layer[L];
        char name[48];
        if (l->is_kv_source)
            snprintf(name, sizeof name, "kv source, ratio %d", l->compress_ratio);
        else if (l->is_dspark)
            snprintf(name, sizeof name, "DSpark stage window");
        else
            snprintf(name, sizeof name, "window only");
        add_cache(r, name, &f, l->compress_ratio);
    }
}

static void fmt_bytes(int64_t b, char *buf, size_t n) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)b;
    int k = 0;
    while (v >= 1000 && k < 4) v /= 1000, k++;
    if (k == 0)
        snprintf(buf, n, "%lld B", (long long)b);
    else
        snprintf(buf, n, "%.2f %s", v, u[k]);
}

static void fmt_count(int64_t p, char *buf, size_t n) {
    if (p >= 1000000000LL)
        snprintf(buf, n, "%.2f B", p / 1e9);
    else if (p >= 1000000)
        snprintf(buf, n, "%.2f M", p / 1e6);
    else if (p >= 1000)
        snprintf(buf, n, "%.1f K", p / 1e3);
    else
        snprintf(buf, n, "%lld", (long long)p);
}

static void src_str(int id, char *buf, size_t n) {
    if (id < 0)
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%d", id);
}

static double cache_total_per_token(const report *r) {
    double t = 0;
    for (int i = 0; i < r->n_cache; i++) t += r->cache[i].n_layers * r->cache[i].per_token_bytes;
    return t;
}

static int64_t cache_total_fixed(const report *r) {
    int64_t t = 0;
    for (int i = 0; i < r->n_cache; i++) t += r->cache[i].n_layers * r->cache[i].fixed_bytes;
    return t;
}

static void print_table(const report *r) {
    const di_config *c = r->cfg;
    char a[32], b[32], d[32], e[32];
    fmt_bytes(r->tot.bytes, a, sizeof a);
    printf("%-10s %s (%s)\n", r->checked ? "model" : "config", r->target, c->model_type);
    if (r->checked)
        printf("%-10s OK: all %lld tensors (%s) match the config\n", "validated", (long long)r->tot.n_tensors, a);
    else
        printf("%-10s not checked (config only): %lld tensors, %s expected\n", "weights", (long long)r->tot.n_tensors,
               a);
    printf("%-10s D=%d, %d layers + DSpark stages: %d; %d heads x %d (rope %d), q_lora %d, o_lora %d x %d groups, "
           "window %d, vocab %d\n",
           "shape", c->hidden_size, c->n_layers, c->n_dspark, c->num_attention_heads, c->head_dim,
           c->qk_rope_head_dim, c->q_lora_rank, c->o_lora_rank, c->o_groups, c->sliding_window, c->vocab_size);
    printf("%-10s %d routed top-%d + %d shared (width %d)", "experts", c->n_routed_experts, c->num_experts_per_tok,
           c->n_shared_experts, c->moe_intermediate_size);
    if (c->n_dspark) printf("; DSpark stages %d top-%d", c->dspark_n_routed_experts, c->dspark_num_experts_per_tok);
    printf("\n%-10s %d heads x %d, top-k %d; candidates %d blocks x %d from layer %d\n", "indexer", c->index_n_heads,
           c->index_head_dim, c->index_topk, c->candidate_topk_blocks, c->candidate_block_size,
           c->candidate_source_layer_id);
    printf("%-10s", "engram");
    if (c->n_engram_layers == 0) printf(" none");
    for (int i = 0; i < c->n_engram_layers; i++)
        printf("%s layer %d (%lld rows x %d)", i ? "," : "", c->engram_layer_ids[i],
               (long long)c->engram_num_embeddings[i], c->engram_head_dim);
    if (r->engram_source) printf("; hash constants: %s", r->engram_source);
    printf("\n%-10s %s\n\n", "vision", c->has_vision ? "ViT present (bias_vl + vision tensors expected)" : "none");

    printf("%-6s %-17s %5s %4s %4s %4s %4s %-12s %6s %6s %7s %8s %12s\n", "layer", "role", "ratio", "kv", "idx", "keys",
           "cand", "rope", "engram", "target", "experts", "tensors", "bytes");
    for (int L = 0; L < c->n_stages; L++) {
        const di_layer_cfg *l = &c->layer[L];
        char kv[16], ix[16], ks[16], cs[16], rope[32], nm[16], by[32];
        src_str(l->kv_source, kv, sizeof kv);
        src_str(l->index_source, ix, sizeof ix);
        src_str(l->index_key_source, ks, sizeof ks);
        src_str(l->candidate_source, cs, sizeof cs);
        snprintf(rope, sizeof rope, "%s %g", l->rope_yarn ? "yarn" : "plain", l->rope_base);
        if (l->is_dspark)
            snprintf(nm, sizeof nm, "mtp.%d", l->dspark_stage);
        else
            snprintf(nm, sizeof nm, "%d", L);
        fmt_bytes(r->stage[L].bytes, by, sizeof by);
        char ex[16];
        snprintf(ex, sizeof ex, "%d/%d", l->n_experts, l->n_active_experts);
        printf("%-6s %-17s %5d %4s %4s %4s %4s %-12s %6s %6s %7s %8lld %12s\n", nm, di_layer_role_name(l->role),
               l->compress_ratio, kv, ix, ks, cs, rope, l->engram_index >= 0 ? "yes" : "-",
               l->dspark_target ? "yes" : "-", ex, (long long)r->stage[L].tensors, by);
    }

    printf("\n%-10s %8s %16s\n", "dtype", "tensors", "bytes");
    for (int t = 0; t < DI_DTYPE_COUNT; t++) {
        if (!r->tot.dtype_count[t]) continue;
        fmt_bytes(r->tot.dtype_bytes[t], a, sizeof a);
        printf("%-10s %8lld %16s\n", di_dtype_name((di_dtype)t), (long long)r->tot.dtype_count[t], a);
    }
    printf("\n%-14s %8s %14s %12s\n", "family", "tensors", "bytes", "params");
    for (int f = 0; f < DI_FAM_COUNT; f++) {
        if (!r->tot.family_count[f]) continue;
        fmt_bytes(r->tot.family_bytes[f], a, sizeof a);
        fmt_count(r->tot.family_params[f], b, sizeof b);
        printf("%-14s %8lld %14s %12s\n", di_family_name((di_family)f), (long long)r->tot.family_count[f], a, b);
    }
    fmt_count(r->tot.backbone_params, a, sizeof a);
    fmt_count(r->tot.engram_params, b, sizeof b);
    fmt_count(r->tot.dspark_params, d, sizeof d);
    fmt_count(r->tot.params, e, sizeof e);
    printf("\n%-10s %s backbone + %s Engram tables + %s DSpark", "params", a, b, d);
    if (r->tot.vision_params) {
        fmt_count(r->tot.vision_params, a, sizeof a);
        printf(" + %s vision", a);
    }
    printf(" = %s logical (FP4 counts 2 per byte, scales 0); %lld FP4 matrices\n", e, (long long)r->tot.n_fp4_matrices);

    printf("\ncache per sequence (compact exact form: e4m3 window + E8M0, FP4 + E4M3 compressed KV, FP4 + E8M0 "
           "index keys)\n");
    printf("%-22s %6s %14s %16s %14s\n", "layer type", "layers", "fixed B/layer", "entry B / ratio", "B/token/layer");
    for (int i = 0; i < r->n_cache; i++) {
        const cache_type *t = &r->cache[i];
        char ent[32];
        if (t->entry_bytes)
            snprintf(ent, sizeof ent, "%lld / %d", (long long)t->entry_bytes, t->ratio);
        else
            snprintf(ent, sizeof ent, "-");
        printf("%-22s %6d %14lld %16s %14.1f\n", t->name, t->n_layers, (long long)t->fixed_bytes, ent,
               t->per_token_bytes);
    }
    fmt_bytes(cache_total_fixed(r), a, sizeof a);
    printf("%-22s %.1f B/token + %s fixed\n", "total", cache_total_per_token(r), a);
}

static json_t *json_doc(const report *r) {
    const di_config *c = r->cfg;
    json_t *doc = json_object();
    json_object_set_new(doc, r->checked ? "model" : "config", json_string(r->target));
    json_object_set_new(doc, "validated", json_boolean(r->checked));
    json_t *cj = json_object();
    json_object_set_new(cj, "model_type", json_string(c->model_type));
    json_object_set_new(cj, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(cj, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(cj, "dspark_stages", json_integer(c->n_dspark));
    json_object_set_new(cj, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(cj, "head_dim", json_integer(c->head_dim));
    json_object_set_new(cj, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(cj, "n_routed_experts", json_integer(c->n_routed_experts));
    json_object_set_new(cj, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
    json_object_set_new(cj, "dspark_n_routed_experts", json_integer(c->dspark_n_routed_experts));
    json_object_set_new(cj, "dspark_num_experts_per_tok", json_integer(c->dspark_num_experts_per_tok));
    json_object_set_new(cj, "has_vision", json_boolean(c->has_vision));
    json_t *eng = json_array();
    for (int i = 0; i < c->n_engram_layers; i++) json_array_append_new(eng, json_integer(c->engram_layer_ids[i]));
    json_object_set_new(cj, "engram_layer_ids", eng);
    json_object_set_new(doc, "config_summary", cj);
    if (r->engram_source) json_object_set_new(doc, "engram_constants", json_string(r->engram_source));

    json_t *layers = json_array();
    for (int L = 0; L < c->n_stages; L++) {
        const di_layer_cfg *l = &c->layer[L];
        char nm[24];
        di_stage_prefix(c, L, nm, sizeof nm);
        nm[strlen(nm) - 1] = 0; /* "layers.7" */
        json_t *o = json_object();
        json_object_set_new(o, "stage", json_integer(L));
        json_object_set_new(o, "name", json_string(nm));
        json_object_set_new(o, "role", json_string(di_layer_role_name(l->role)));
        json_object_set_new(o, "compress_ratio", json_integer(l->compress_ratio));
        json_object_set_new(o, "kv_source", json_integer(l->kv_source));
        json_object_set_new(o, "index_source", json_integer(l->index_source));
        json_object_set_new(o, "index_key_source", json_integer(l->index_key_source));
        json_object_set_new(o, "candidate_source", json_integer(l->candidate_source));
        json_object_set_new(o, "has_compressor", json_boolean(l->has_compressor));
        json_object_set_new(o, "has_indexer", json_boolean(l->has_indexer));
        json_object_set_new(o, "has_index_wk", json_boolean(l->has_index_wk));
        json_object_set_new(o, "engram_index", json_integer(l->engram_index));
        json_object_set_new(o, "rope", json_string(l->rope == DI_ROPE_PLAIN ? "plain" : "compress"));
        json_object_set_new(o, "rope_base", json_real(l->rope_base));
        json_object_set_new(o, "rope_yarn", json_boolean(l->rope_yarn));
        json_object_set_new(o, "dspark_target", json_boolean(l->dspark_target));
        json_object_set_new(o, "n_experts", json_integer(l->n_experts));
        json_object_set_new(o, "n_active_experts", json_integer(l->n_active_experts));
        json_object_set_new(o, "tensors", json_integer(r->stage[L].tensors));
        json_object_set_new(o, "bytes", json_integer(r->stage[L].bytes));
        json_object_set_new(o, "params", json_integer(r->stage[L].params));
        json_array_append_new(layers, o);
    }
    json_object_set_new(doc, "layers", layers);

    json_t *dt = json_object();
    for (int t = 0; t < DI_DTYPE_COUNT; t++) {
        if (!r->tot.dtype_count[t]) continue;
        json_object_set_new(dt, di_dtype_name((di_dtype)t),
                            json_pack("{s:I, s:I}", "tensors", (json_int_t)r->tot.dtype_count[t], "bytes",
                                      (json_int_t)r->tot.dtype_bytes[t]));
    }
    json_object_set_new(doc, "dtypes", dt);
    json_t *fam = json_object();
    for (int f = 0; f < DI_FAM_COUNT; f++) {
        if (!r->tot.family_count[f]) continue;
        json_object_set_new(fam, di_family_name((di_family)f),
                            json_pack("{s:I, s:I, s:I}", "tensors", (json_int_t)r->tot.family_count[f], "bytes",
                                      (json_int_t)r->tot.family_bytes[f], "params", (json_int_t)r->tot.family_params[f]));
    }
    json_object_set_new(doc, "families", fam);
    json_object_set_new(doc, "tensors",
                        json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)r->tot.n_tensors, "text",
                                  (json_int_t)r->tot.n_text_tensors, "vision",
                                  (json_int_t)(r->tot.n_tensors - r->tot.n_text_tensors), "fp4_matrices",
                                  (json_int_t)r->tot.n_fp4_matrices));
    json_object_set_new(doc, "bytes",
                        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "total", (json_int_t)r->tot.bytes, "text",
                                  (json_int_t)r->tot.text_bytes, "backbone", (json_int_t)r->tot.backbone_bytes,
                                  "engram_tables", (json_int_t)r->tot.engram_bytes, "dspark",
                                  (json_int_t)r->tot.dspark_bytes, "vision", (json_int_t)r->tot.vision_bytes));
    json_object_set_new(doc, "params",
                        json_pack("{s:I, s:I, s:I, s:I, s:I}", "total", (json_int_t)r->tot.params, "backbone",
                                  (json_int_t)r->tot.backbone_params, "engram_tables", (json_int_t)r->tot.engram_params,
                                  "dspark", (json_int_t)r->tot.dspark_params, "vision",
                                  (json_int_t)r->tot.vision_params));
    json_t *ct = json_array();
    for (int i = 0; i < r->n_cache; i++) {
        const cache_type *t = &r->cache[i];
        json_array_append_new(ct, json_pack("{s:s, s:i, s:I, s:I, s:i, s:f}", "type", t->name, "layers", t->n_layers,
                                            "fixed_bytes_per_layer", (json_int_t)t->fixed_bytes, "entry_bytes",
                                            (json_int_t)t->entry_bytes, "compress_ratio", t->ratio,
                                            "bytes_per_token_per_layer", t->per_token_bytes));
    }
    json_object_set_new(doc, "cache",
                        json_pack("{s:o, s:f, s:I}", "layer_types", ct, "bytes_per_token", cache_total_per_token(r),
                                  "fixed_bytes", (json_int_t)cache_total_fixed(r)));
    return doc;
}

int cmd_inspect(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "inspect", .json = cli_flag(&a, "json")};
    const char *model = cli_str(&a, "model", NULL);
    const char *config = cli_str(&a, "config", NULL);
    int bad_args = !cli_check_unused(&cli, &a);
    cli_args_free(&a);
    if (bad_args) return 1;
    if (!!model == !!config) return cli_fail(&cli, "give exactly one of --model DIR or --config FILE");

    di_error err = {0};
    di_config *cfg = calloc(1, sizeof *cfg);
    report *r = calloc(1, sizeof *r);
    di_checkpoint *ck = NULL;
    di_engram_consts ec = {0};
    int rc = 1;
    if (!cfg || !r) {
        cli_fail(&cli, "out of memory");
        goto out;
    }
    r->target = model ? model : config;
    r->cfg = cfg;
    if (di_config_load(r->target, cfg, &err) != DI_OK) {
        cli_fail_err(&cli, &err);
        goto out;
    }
    if (di_inventory_build(cfg, &r->inv, &r->n_inv, &err) != DI_OK) {
        cli_fail_err(&cli, &err);
        goto out;
    }
    if (model) {
        if (di_ckpt_open(model, &ck, &err) != DI_OK || di_inventory_validate(cfg, ck, &err) != DI_OK) {
            cli_fail_err(&cli, &err);
            goto out;
        }
        if (di_engram_consts_load(cfg, model, &ec, &err) != DI_OK) {
            cli_fail_err(&cli, &err);
            goto out;
        }
        r->checked = 1;
        r->engram_source = cfg->n_engram_layers ? ec.source : NULL;
    } else if (cfg->n_engram_layers && di_engram_is_released_layout(cfg)) {
        r->engram_source = "published V4.1-Flash constants";
    }
    summarise(r);
    if (cli.json)
        rc = cli_emit(&cli, json_doc(r));
    else {
        print_table(r);
        rc = 0;
    }
out:
    di_engram_consts_free(&ec);
    if (ck) di_ckpt_close(ck);
    if (r) free(r->inv);
    free(r);
    free(cfg);
    return rc;
}
