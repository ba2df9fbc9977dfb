/* Expected tensor inventory from a config, and checkpoint validation against it. See inventory.h. */
#include "model/inventory.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

const char *di_family_name(di_family f) {
    static const char *names[DI_FAM_COUNT] = {"embed",   "head",    "norm",          "mhc",    "attn",
                                              "compressor", "indexer", "router",     "experts", "shared_expert",
                                              "engram",  "dspark",  "vision"};
    return (unsigned)f < DI_FAM_COUNT ? names[f] : "?";
}

int64_t di_inv_entry_bytes(const di_inv_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n * (int64_t)di_dtype_size(e->dtype);
}

int di_inv_is_engram_table(const di_inv_entry *e) {
    const char *p = strstr(e->name, ".engram.embed.");
    return e->family == DI_FAM_ENGRAM && p != NULL;
}

void di_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t k = 0;
    if (n == 0) return;
    buf[0] = 0;
    k += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* ------------------------------------------------------------------------------------------------ */

typedef struct builder {
    di_inv_entry *v;
    int64_t n, cap;
    int failed;       /* out of memory or a name too long */
    const di_config *cfg;
    char prefix[48];  /* "layers.7." / "mtp.0." / "" */
    int layer;
    di_family fam;
} builder;

static void add(builder *b, di_dtype dt, int64_t params, int ndim, const int64_t *shape, const char *fmt, ...)
    DI_PRINTF(6, 7);
static void add(builder *b, di_dtype dt, int64_t params, int ndim, const int64_t *shape, const char *fmt, ...) {
    if (b->failed) return;
    if (b->n == b->cap) {
        int64_t cap = b->cap ? b->cap * 2 : 1024;
        di_inv_entry *nv = realloc(b->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            b->failed = DI_ERR_NOMEM;
            return;
        }
        b->v = nv;
        b->cap = cap;
    }
    di_inv_entry *e = &b->v[b->n];
    memset(e, 0, sizeof *e);
    int k = snprintf(e->name, sizeof e->name, "%s", b->prefix);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(e->name + k, sizeof e->name - (size_t)k, fmt, ap);
    va_end(ap);
    if (k + m >= (int)sizeof e->name) {
        b->failed = DI_ERR_INTERNAL;
        return;
    }
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->layer = b->layer;
    e->family = b->fam;
    e->params = params;
    b->n++;
}

static void t1(builder *b, di_dtype dt, int64_t d0, const char *name) {
    int64_t s[1] = {d0};
    add(b, dt, d0, 1, s, "%s", name);
}
static void t2(builder *b, di_dtype dt, int64_t d0, int64_t d1, const char *name) {
    int64_t s[2] = {d0, d1};
    add(b, dt, d0 * d1, 2, s, "%s", name);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* A linear layer `name` of logical shape [out, in] stored in format f. */
static void linear(builder *b, di_weight_fmt f, int64_t out, int64_t in, const char *name) {
    int B = b->cfg->weight_block_size;
    if (f == DI_WFMT_BF16) {
        int64_t s[2] = {out, in};
        add(b, DI_BF16, out * in, 2, s, "%s.weight", name);
    } else if (f == DI_WFMT_FP8) {
        int64_t s[2] = {out, in}, sc[2] = {cdiv(out, B), cdiv(in, B)};
        add(b, DI_F8_E4M3, out * in, 2, s, "%s.weight", name);
        add(b, DI_F8_E8M0, 0, 2, sc, "%s.scale", name);
    } else { /* FP4: two codes per byte along K, one E8M0 scale per 32 along K */
        int64_t s[2] = {out, in / 2}, sc[2] = {out, in / 32};
        add(b, DI_I8, out * in, 2, s, "%s.weight", name);
        add(b, DI_F8_E8M0, 0, 2, sc, "%s.scale", name);
    }
}

static void block(builder *b, int stage) {
    const di_config *c = b->cfg;
    const di_layer_cfg *l = &c->layer[stage];
    int64_t D = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim;
    int64_t hc = c->hc_mult, mix = (2 + hc) * hc;
    di_weight_fmt wf = c->weight_fmt;
    char name[96];
    b->layer = stage;
    di_stage_prefix(c, stage, b->prefix, sizeof b->prefix);

    if (l->engram_index >= 0) { /* applied to the residual streams before the block (§4.3) */
        int64_t rows = c->engram_num_embeddings[l->engram_index], ehd = c->engram_head_dim;
        int64_t cols = (int64_t)(c->engram_max_ngram_size - 1) * c->engram_n_heads * ehd;
        b->fam = DI_FAM_ENGRAM;
        t2(b, DI_F8_E4M3, rows, ehd, "engram.embed.weight");
        int64_t sc[2] = {rows, ehd / c->weight_block_size};
        add(b, DI_F8_E8M0, 0, 2, sc, "engram.embed.scale");
        linear(b, wf, D * (hc + 1), cols, "engram.wkv");
        t2(b, DI_BF16, hc, D, "engram.q_weight");
        t2(b, DI_BF16, hc, D, "engram.k_weight");
    }

    b->fam = DI_FAM_MHC;
    t2(b, DI_F32, mix, hc * D, "hc_attn_fn");
    t1(b, DI_F32, mix, "hc_attn_base");
    t1(b, DI_F32, 3, "hc_attn_scale");
    t2(b, DI_F32, mix, hc * D, "hc_ffn_fn");
    t1(b, DI_F32, mix, "hc_ffn_base");
    t1(b, DI_F32, 3, "hc_ffn_scale");
    b->fam = DI_FAM_NORM;
    t1(b, DI_BF16, D, "attn_norm.weight");
    t1(b, DI_BF16, D, "ffn_norm.weight");

    b->fam = DI_FAM_ATTN;
    t1(b, DI_F32, H, "attn.attn_sink");
    linear(b, wf, c->q_lora_rank, D, "attn.wq_a");
    t1(b, DI_BF16, c->q_lora_rank, "attn.q_norm.weight");
    linear(b, wf, H * hd, c->q_lora_rank, "attn.wq_b");
    linear(b, wf, hd, D, "attn.wkv");
    t1(b, DI_BF16, hd, "attn.kv_norm.weight");
    /* grouped output projection: each of o_groups groups maps its H/o_groups heads to o_lora_rank;
     * stored FP8 although the reference dequantizes it to BF16 at load (§2.2) */
    linear(b, wf, (int64_t)c->o_groups * c->o_lora_rank, H * hd / c->o_groups, "attn.wo_a");
    linear(b, wf, D, (int64_t)c->o_groups * c->o_lora_rank, "attn.wo_b");

    if (l->has_compressor) {
        b->fam = DI_FAM_COMPRESSOR;
        t2(b, DI_BF16, hd, D, "attn.compressor.wkv.weight");
        if (l->has_compressor_gate) t2(b, DI_BF16, hd, D, "attn.compressor.wgate.weight");
        t1(b, DI_BF16, hd, "attn.compressor.norm.weight");
    }
    if (l->has_indexer) {
        int64_t ih = c->index_n_heads, ihd = c->index_head_dim;
        b->fam = DI_FAM_INDEXER;
        linear(b, wf, ih * ihd, c->q_lora_rank, "attn.indexer.wq_b");
        t2(b, DI_BF16, ih, D, "attn.indexer.weights_proj.weight");
        if (l->has_index_wk) {
            t2(b, DI_BF16, ihd, hd, "attn.indexer.wk.weight");
            t1(b, DI_BF16, ihd, "attn.indexer.k_norm.weight");
        }
    }

    int64_t E = l->n_experts, I = c->moe_intermediate_size;
    b->fam = DI_FAM_ROUTER;
    t2(b, DI_BF16, E, D, "ffn.gate.weight");
    t1(b, DI_F32, E, "ffn.gate.bias");
    if (c->has_vision) t1(b, DI_F32, E, "ffn.gate.bias_vl"); /* routing bias for image-span tokens */
    b->fam = DI_FAM_EXPERTS;
    for (int64_t e = 0; e < E; e++) {
        snprintf(name, sizeof name, "ffn.experts.%lld.w1", (long long)e);
        linear(b, c->expert_fmt, I, D, name);
        snprintf(name, sizeof name, "ffn.experts.%lld.w2", (long long)e);
        linear(b, c->expert_fmt, D, I, name);
        snprintf(name, sizeof name, "ffn.experts.%lld.w3", (long long)e);
        linear(b, c->expert_fmt, I, D, name);
    }
    b->fam = DI_FAM_SHARED_EXPERT;
    linear(b, wf, I, D, "ffn.shared_experts.w1");
    linear(b, wf, D, I, "ffn.shared_experts.w2");
    linear(b, wf, I, D, "ffn.shared_experts.w3");

    if (l->has_main_proj) { /* stage 0 maps the concatenated target-layer features to D */
        b->fam = DI_FAM_DSPARK;
        linear(b, wf, D, D * c->n_dspark_target_layer_ids, "main_proj");
        t1(b, DI_BF16, D, "main_norm.weight");
    }
    if (l->has_draft_head) {
        int64_t V = c->vocab_size, R = c->dspark_markov_rank;
        b->fam = DI_FAM_DSPARK;
        t1(b, DI_BF16, D, "norm.weight");
        t2(b, DI_BF16, V, R, "markov_head.embed.weight");
        t2(b, DI_BF16, V, R, "markov_head.head.weight");
        t2(b, DI_BF16, 1, D + R, "confidence_head.proj.weight");
    }
}

/* ViT + aligner + span embeddings (vision.py / model.py Transformer: 2 + 8 per block + 1 + 4 + 3 = 266
 * tensors for the released 32-layer tower). Dtypes are BF16 throughout as third-party header listings
 * give them (the official headers were not read), so validation accepts any float dtype here. */
static void vision(builder *b) {
    const di_config *c = b->cfg;
    const di_vision_cfg *v = &c->vision;
    int64_t vd = v->hidden_size, p = v->patch_size, D = c->hidden_size;
    int64_t r = v->downsample_ratio;
    b->layer = -1;
    b->fam = DI_FAM_VISION;
    b->prefix[0] = 0;
    t2(b, DI_BF16, vd, 3 * p * p, "vision.patch_embed.proj.weight");
    t1(b, DI_BF16, vd, "vision.patch_embed.proj.bias");
    for (int i = 0; i < v->num_hidden_layers; i++) {
        snprintf(b->prefix, sizeof b->prefix, "vision.blocks.%d.", i);
        t1(b, DI_BF16, vd, "norm1.weight");
        t2(b, DI_BF16, 3 * vd, vd, "attn.wqkv.weight");
        t1(b, DI_BF16, 3 * vd, "attn.wqkv.bias");
        t2(b, DI_BF16, vd, vd, "attn.wo.weight");
        t1(b, DI_BF16, vd, "attn.wo.bias");
        t1(b, DI_BF16, vd, "norm2.weight");
        t2(b, DI_BF16, 2 * (int64_t)v->intermediate_size, vd, "mlp.w1.weight"); /* gate ‖ up */
        t2(b, DI_BF16, vd, v->intermediate_size, "mlp.w2.weight");
    }
    b->prefix[0] = 0;
    t1(b, DI_BF16, vd, "vision.norm.weight");
    t2(b, DI_BF16, D, vd * r * r, "aligner.w1.weight");
    t1(b, DI_BF16, D, "aligner.w1.bias");
    t2(b, DI_BF16, D, D, "aligner.w2.weight");
    t1(b, DI_BF16, D, "aligner.w2.bias");
    t1(b, DI_BF16, D, "image_start");
    t1(b, DI_BF16, D, "image_end");
    t1(b, DI_BF16, D, "image_newline");
}

int di_inventory_build(const di_config *cfg, di_inv_entry **out, int64_t *n, di_error *err) {
    if (!cfg || !out || !n) return di_error_set(err, DI_ERR_INVALID, "di_inventory_build: NULL argument");
    *out = NULL;
    *n = 0;
    builder b = {.cfg = cfg, .layer = -1};
    int64_t V = cfg->vocab_size, D = cfg->hidden_size;
    b.fam = DI_FAM_EMBED;
    t2(&b, DI_BF16, V, D, "embed.weight");
    for (int L = 0; L < cfg->n_layers; L++) block(&b, L);
    b.layer = -1;
    b.prefix[0] = 0;
    b.fam = DI_FAM_NORM;
    t1(&b, DI_BF16, D, "norm.weight");
    b.fam = DI_FAM_HEAD;
    t2(&b, DI_BF16, V, D, "head.weight");
    for (int s = 0; s < cfg->n_dspark; s++) block(&b, cfg->n_layers + s);
    if (cfg->has_vision) vision(&b);
    if (b.failed) {
        free(b.v);
        return di_error_set(err, b.failed, "building the tensor inventory: %s",
                            b.failed == DI_ERR_NOMEM ? "out of memory" : "tensor name too long");
    }
    *out = b.v;
    *n = b.n;
    return DI_OK;
}

void di_inventory_totals(const di_inv_entry *e, int64_t n, di_inv_totals *t) {
    memset(t, 0, sizeof *t);
    for (int64_t i = 0; i < n; i++) {
        int64_t by = di_inv_entry_bytes(&e[i]);
        t->n_tensors++;
        t->bytes += by;
        t->params += e[i].params;
        t->dtype_count[e[i].dtype]++;
        t->dtype_bytes[e[i].dtype] += by;
        t->family_count[e[i].family]++;
        t->family_bytes[e[i].family] += by;
        t->family_params[e[i].family] += e[i].params;
        if (e[i].dtype == DI_I8) t->n_fp4_matrices++;
        if (e[i].family == DI_FAM_VISION) {
            t->vision_params += e[i].params;
            t->vision_bytes += by;
            continue;
        }
        t->n_text_tensors++;
        t->text_bytes += by;
        if (di_inv_is_engram_table(&e[i])) {
            t->engram_params += e[i].params;
            t->engram_bytes += by;
        } else if (e[i].layer >= 0 && strncmp(e[i].name, "mtp.", 4) == 0) {
            t->dspark_params += e[i].params;
            t->dspark_bytes += by;
        } else {
            t->backbone_params += e[i].params;
            t->backbone_bytes += by;
        }
    }
}

int64_t di_inventory_count_layer(const di_inv_entry *e, int64_t n, int layer) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (layer == -2 ? e[i].family == DI_FAM_VISION : (e[i].layer == layer && e[i].family != DI_FAM_VISION)) k++;
    }
    return k;
}

/* ------------------------------------------------------------------------------------------------
 * Validation */

static int cmp_entry_ptr(const void *a, const void *b) {
    return strcmp((*(const di_inv_entry *const *)a)->name, (*(const di_inv_entry *const *)b)->name);
}

#define SHOW_NAMES 3

/* One category of problems: a count and the first few descriptions. */
typedef struct problems {
    int64_t count;
    char first[SHOW_NAMES][360];
} problems;

static void note(problems *p, const char *fmt, ...) DI_PRINTF(2, 3);
static void note(problems *p, const char *fmt, ...) {
    if (p->count < SHOW_NAMES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->first[p->count], sizeof p->first[0], fmt, ap);
        va_end(ap);
    }
    p->count++;
}

static size_t append_problems(char *buf, size_t k, size_t n, const char *label, const problems *p) {
    if (p->count == 0 || k >= n) return k;
    k += (size_t)snprintf(buf + k, n - k, "%s%lld %s (", k ? "; " : "", (long long)p->count, label);
    for (int i = 0; i < SHOW_NAMES && i < p->count && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", p->first[i]);
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "%s)", p->count > SHOW_NAMES ? ", ..." : "");
    return k;
}

static const char *base_name(const char *path) {
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : (path ? path : "?");
}

int di_inventory_validate(const di_config *cfg, const di_checkpoint *ck, di_error *err) {
    if (!cfg || !ck) return di_error_set(err, DI_ERR_INVALID, "di_inventory_validate: NULL argument");
    di_inv_entry *inv;
    int64_t n;
    int rc = di_inventory_build(cfg, &inv, &n, err);
    if (rc) return rc;
    const di_inv_entry **sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    problems *miss = calloc(3, sizeof *miss), *bad = miss + 1, *extra = miss + 2;
    if (!sorted || !miss) {
        free(sorted);
        free(miss);
        free(inv);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) sorted[i] = &inv[i];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_entry_ptr);

    /* Walk the inventory in checkpoint (sorted) order to report problems alphabetically. */
    char es[96], fs[96];
    for (int64_t i = 0; i < n; i++) {
        const di_inv_entry *e = sorted[i];
        const di_tensor_info *t = di_ckpt_find(ck, e->name);
        if (!t) {
            note(miss, "%s", e->name);
            continue;
        }
        /* Vision dtypes come from third-party header listings, not the official headers: accept any
         * float storage there (the text path never reads these tensors). */
        int float_ok = e->family == DI_FAM_VISION &&
                       (t->dtype == DI_BF16 || t->dtype == DI_F16 || t->dtype == DI_F32);
        int same = (t->dtype == e->dtype || float_ok) && t->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++) same = t->shape[d] == e->shape[d];
        if (!same) {
            di_shape_str(e->ndim, e->shape, es, sizeof es);
            di_shape_str(t->ndim, t->shape, fs, sizeof fs);
            note(bad, "%s expected %s %s, found %s %s in %s", e->name, di_dtype_name(e->dtype), es,
                 di_dtype_name(t->dtype), fs, base_name(di_ckpt_shard_path(ck, e->name)));
        }
    }
    /* Both lists are sorted by name: a merge finds the checkpoint tensors the inventory lacks. */
    int64_t j = 0;
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        const char *name = ck->entries[i].info->name;
        while (j < n && strcmp(sorted[j]->name, name) < 0) j++;
        if (j < n && strcmp(sorted[j]->name, name) == 0) continue;
        note(extra, "%s in %s", name, base_name(di_ckpt_shard_path(ck, name)));
    }

    if (miss->count || bad->count || extra->count) {
        char msg[900];
        size_t k = 0;
        msg[0] = 0;
        k = append_problems(msg, k, sizeof msg, "missing", miss);
        k = append_problems(msg, k, sizeof msg, "mismatched", bad);
        append_problems(msg, k, sizeof msg, "unexpected", extra);
        rc = di_error_set(err, DI_ERR_INVALID, "%s: checkpoint does not match its config (%lld tensors expected): %s",
                          ck->dir, (long long)n, msg);
    }
    free(sorted);
    free(miss);
    free(inv);
    return rc;
}
