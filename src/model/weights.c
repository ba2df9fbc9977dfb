/* Checkpoint → per-layer weight views. See weights.h. */
#include "model/weights.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/formats.h"
#include "model/inventory.h"
#include "util/error.h"

#define QBLK 32

/* The checkpoint being bound and the weights receiving aligned copies. */
typedef struct binder {
    const di_checkpoint *ck;
    di_weights *w;
} binder;

/* A view aligned to its element size, copying it once when the file offset is not. */
static int aligned_view(binder *bd, const di_tensor_info *t, const void **out, di_error *err) {
    size_t esz = di_dtype_size(t->dtype);
    if (esz <= 1 || (uintptr_t)t->data % esz == 0) {
        *out = t->data;
        return DI_OK;
    }
    di_weights *w = bd->w;
    if (w->n_owned == w->cap_owned) {
        int64_t nc = w->cap_owned ? 2 * w->cap_owned : 16;
        void **p = realloc(w->owned, sizeof *p * (size_t)nc);
        if (!p) return di_error_set(err, DI_ERR_NOMEM, "aligned copy of %s", t->name);
        w->owned = p, w->cap_owned = nc;
    }
    size_t bytes = (size_t)(t->end - t->begin);
    void *c = malloc(bytes ? bytes : 1);
    if (!c) return di_error_set(err, DI_ERR_NOMEM, "aligned copy of %s (%zu bytes)", t->name, bytes);
    memcpy(c, t->data, bytes);
    w->owned[w->n_owned++] = c;
    *out = c;
    return DI_OK;
}

/* Remember where a bound tensor's pointer lives (for di_weights_to_backend). */
static int record_slot(di_weights *w, const void **slot, int64_t bytes, bool mapped, di_error *err) {
    if (w->n_slots == w->cap_slots) {
        int64_t nc = w->cap_slots ? 2 * w->cap_slots : 256;
        di_w_slot *p = realloc(w->slots, sizeof *p * (size_t)nc);
        if (!p) return di_error_set(err, DI_ERR_NOMEM, "weight slot list (%lld)", (long long)nc);
        w->slots = p, w->cap_slots = nc;
    }
    w->slots[w->n_slots++] = (di_w_slot){slot, *slot, bytes, mapped};
    return DI_OK;
}

/* Find `name` and check dtype and shape (ndim values from the varargs, int64_t). */
static int find_t(binder *bd, const char *name, di_dtype dt, const void **data, di_error *err, int ndim,
                  ...) {
    const di_checkpoint *ck = bd->ck;
    const di_tensor_info *t = di_ckpt_find(ck, name);
    if (!t) return di_error_set(err, DI_ERR_INVALID, "%s: tensor %s missing", ck->dir, name);
    int64_t shape[DI_MAX_DIMS];
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim; i++) shape[i] = va_arg(ap, int64_t);
    va_end(ap);
    int same = t->dtype == dt && t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char es[96], fs[96];
        di_shape_str(ndim, shape, es, sizeof es);
        di_shape_str(t->ndim, t->shape, fs, sizeof fs);
        return di_error_set(err, DI_ERR_INVALID, "%s: expected %s %s, found %s %s in %s", name, di_dtype_name(dt), es,
                            di_dtype_name(t->dtype), fs, di_ckpt_shard_path(ck, name));
    }
    int rc = aligned_view(bd, t, data, err);
    /* the Engram tables (e4m3 rows + E8M0 scales) stay host-resident on a device backend */
    bool mapped = strstr(name, "engram.embed.") != NULL;
    return rc ? rc : record_slot(bd->w, data, (int64_t)(t->end - t->begin), mapped, err);
}

#define CDIV(a, b) (((a) + (b)-1) / (b))

static int bind_fp8(binder *bd, const char *prefix, int64_t n, int64_t k, di_w_fp8 *o, di_error *err) {
    char nw[160], ns[160];
    snprintf(nw, sizeof nw, "%s.weight", prefix);
    snprintf(ns, sizeof ns, "%s.scale", prefix);
    *o = (di_w_fp8){.n = n, .k = k};
    int rc = find_t(bd, nw, DI_F8_E4M3, (const void **)&o->w, err, 2, n, k);
    if (!rc) rc = find_t(bd, ns, DI_F8_E8M0, (const void **)&o->s, err, 2, (int64_t)CDIV(n, QBLK), (int64_t)CDIV(k, QBLK));
    return rc;
}

static int bind_fp4(binder *bd, const char *prefix, int64_t n, int64_t k, di_w_fp4 *o, di_error *err) {
    char nw[160], ns[160];
    snprintf(nw, sizeof nw, "%s.weight", prefix);
    snprintf(ns, sizeof ns, "%s.scale", prefix);
    *o = (di_w_fp4){.n = n, .k = k};
    int rc = find_t(bd, nw, DI_I8, (const void **)&o->w, err, 2, n, k / 2);
    if (!rc) rc = find_t(bd, ns, DI_F8_E8M0, (const void **)&o->s, err, 2, n, k / QBLK);
    return rc;
}

static int bind_vec(binder *bd, const char *name, di_dtype dt, int64_t n, const void **o, di_error *err) {
    return find_t(bd, name, dt, o, err, 1, n);
}

static int bind_mat(binder *bd, const char *name, di_dtype dt, int64_t r, int64_t c, const void **o,
                    di_error *err) {
    return find_t(bd, name, dt, o, err, 2, r, c);
}

/* wo_a: FP8 [G·orr, H·hd/G] → bf16, exactly (e4m3 × 2^k fits bf16 unless it underflows, and then it
 * rounds as the reference's cast does). */
static int dequant_wo_a(const di_w_fp8 *q, uint16_t **out, di_error *err) {
    uint16_t *o = malloc(sizeof(uint16_t) * (size_t)(q->n * q->k));
    float *row = malloc(sizeof(float) * (size_t)q->k);
    if (!o || !row) {
        free(o), free(row);
        return di_error_set(err, DI_ERR_NOMEM, "wo_a dequantization (%lld×%lld)", (long long)q->n, (long long)q->k);
    }
    for (int64_t r = 0; r < q->n; r++) {
        di_dequant_fp8_rows(q->w, q->s, q->n, q->k, QBLK, r, 1, row);
        for (int64_t c = 0; c < q->k; c++) o[r * q->k + c] = di_f32_to_bf16(row[c]);
    }
    free(row);
    *out = o;
    return DI_OK;
}

static int bind_layer(const di_config *cfg, binder *bd, int L, di_layer_w *lw, di_error *err) {
    const di_layer_cfg *lc = &cfg->layer[L];
    int64_t D = cfg->hidden_size, hc = cfg->hc_mult, nmix = (2 + hc) * hc;
    int64_t H = cfg->num_attention_heads, hd = cfg->head_dim, qr = cfg->q_lora_rank;
    int64_t G = cfg->o_groups, orr = cfg->o_lora_rank;
    int64_t ih = cfg->index_n_heads, ihd = cfg->index_head_dim;
    int64_t E = lc->n_experts, I = cfg->moe_intermediate_size;
    char p[160], n[200];
    di_stage_prefix(cfg, L, p, sizeof p);
    size_t pl = strlen(p);
    if (pl && p[pl - 1] == '.') p[pl - 1] = 0; /* "layers.7." → "layers.7" */
    int rc = 0;
#define NM(fmt, ...) (snprintf(n, sizeof n, "%s." fmt, p, ##__VA_ARGS__), n)
#define TRY(x)                  \
    do {                        \
        if ((rc = (x))) return rc; \
    } while (0)
    TRY(bind_mat(bd, NM("hc_attn_fn"), DI_F32, nmix, hc * D, (const void **)&lw->hc_attn_fn, err));
    TRY(bind_mat(bd, NM("hc_ffn_fn"), DI_F32, nmix, hc * D, (const void **)&lw->hc_ffn_fn, err));
    TRY(bind_vec(bd, NM("hc_attn_base"), DI_F32, nmix, (const void **)&lw->hc_attn_base, err));
    TRY(bind_vec(bd, NM("hc_ffn_base"), DI_F32, nmix, (const void **)&lw->hc_ffn_base, err));
    TRY(bind_vec(bd, NM("hc_attn_scale"), DI_F32, 3, (const void **)&lw->hc_attn_scale, err));
    TRY(bind_vec(bd, NM("hc_ffn_scale"), DI_F32, 3, (const void **)&lw->hc_ffn_scale, err));
    TRY(bind_vec(bd, NM("attn_norm.weight"), DI_BF16, D, (const void **)&lw->attn_norm, err));
    TRY(bind_vec(bd, NM("ffn_norm.weight"), DI_BF16, D, (const void **)&lw->ffn_norm, err));

    TRY(bind_vec(bd, NM("attn.attn_sink"), DI_F32, H, (const void **)&lw->attn_sink, err));
    TRY(bind_fp8(bd, NM("attn.wq_a"), qr, D, &lw->wq_a, err));
    TRY(bind_vec(bd, NM("attn.q_norm.weight"), DI_BF16, qr, (const void **)&lw->q_norm, err));
    TRY(bind_fp8(bd, NM("attn.wq_b"), H * hd, qr, &lw->wq_b, err));
    TRY(bind_fp8(bd, NM("attn.wkv"), hd, D, &lw->wkv, err));
    TRY(bind_vec(bd, NM("attn.kv_norm.weight"), DI_BF16, hd, (const void **)&lw->kv_norm, err));
    di_w_fp8 woa; /* read once for the dequantization below: not a slot of the graph */
    int64_t n_slots_before = bd->w->n_slots;
    TRY(bind_fp8(bd, NM("attn.wo_a"), G * orr, H * hd / G, &woa, err));
    bd->w->n_slots = n_slots_before;
    TRY(bind_fp8(bd, NM("attn.wo_b"), D, G * orr, &lw->wo_b, err));

    if (lc->has_compressor) {
        TRY(bind_mat(bd, NM("attn.compressor.wkv.weight"), DI_BF16, hd, D, (const void **)&lw->cmp_wkv, err));
        TRY(bind_vec(bd, NM("attn.compressor.norm.weight"), DI_BF16, hd, (const void **)&lw->cmp_norm, err));
        if (lc->has_compressor_gate)
            TRY(bind_mat(bd, NM("attn.compressor.wgate.weight"), DI_BF16, hd, D, (const void **)&lw->cmp_wgate, err));
    }
    if (lc->has_indexer) {
        TRY(bind_fp8(bd, NM("attn.indexer.wq_b"), ih * ihd, qr, &lw->idx_wq_b, err));
        TRY(bind_mat(bd, NM("attn.indexer.weights_proj.weight"), DI_BF16, ih, D, (const void **)&lw->idx_weights_proj,
                     err));
        if (lc->has_index_wk) {
            TRY(bind_mat(bd, NM("attn.indexer.wk.weight"), DI_BF16, ihd, hd, (const void **)&lw->idx_wk, err));
            TRY(bind_vec(bd, NM("attn.indexer.k_norm.weight"), DI_BF16, ihd, (const void **)&lw->idx_k_norm, err));
        }
    }

    TRY(bind_mat(bd, NM("ffn.gate.weight"), DI_BF16, E, D, (const void **)&lw->gate_w, err));
    TRY(bind_vec(bd, NM("ffn.gate.bias"), DI_F32, E, (const void **)&lw->gate_bias, err));
    lw->experts = calloc((size_t)E, sizeof(di_expert_w));
    if (!lw->experts) return di_error_set(err, DI_ERR_NOMEM, "layer %d: %lld expert views", L, (long long)E);
    for (int64_t e = 0; e < E; e++) {
        TRY(bind_fp4(bd, NM("ffn.experts.%lld.w1", (long long)e), I, D, &lw->experts[e].w1, err));
        TRY(bind_fp4(bd, NM("ffn.experts.%lld.w3", (long long)e), I, D, &lw->experts[e].w3, err));
        TRY(bind_fp4(bd, NM("ffn.experts.%lld.w2", (long long)e), D, I, &lw->experts[e].w2, err));
    }
    TRY(bind_fp8(bd, NM("ffn.shared_experts.w1"), I, D, &lw->sh_w1, err));
    TRY(bind_fp8(bd, NM("ffn.shared_experts.w3"), I, D, &lw->sh_w3, err));
    TRY(bind_fp8(bd, NM("ffn.shared_experts.w2"), D, I, &lw->sh_w2, err));

    if (lc->engram_index >= 0) {
        int64_t ehd = cfg->engram_head_dim, rows = cfg->engram_num_embeddings[lc->engram_index];
        int64_t cols = (int64_t)(cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads * ehd;
        TRY(bind_mat(bd, NM("engram.embed.weight"), DI_F8_E4M3, rows, ehd, (const void **)&lw->eg_table, err));
        TRY(bind_mat(bd, NM("engram.embed.scale"), DI_F8_E8M0, rows, ehd / QBLK, (const void **)&lw->eg_table_scale,
                     err));
        lw->eg_rows = rows;
        TRY(bind_fp8(bd, NM("engram.wkv"), (hc + 1) * D, cols, &lw->eg_wkv, err));
        TRY(bind_mat(bd, NM("engram.q_weight"), DI_BF16, hc, D, (const void **)&lw->eg_q, err));
        TRY(bind_mat(bd, NM("engram.k_weight"), DI_BF16, hc, D, (const void **)&lw->eg_k, err));
    }
    if (lc->has_main_proj) {
        TRY(bind_fp8(bd, NM("main_proj"), D, D * cfg->n_dspark_target_layer_ids, &lw->main_proj, err));
        TRY(bind_vec(bd, NM("main_norm.weight"), DI_BF16, D, (const void **)&lw->main_norm, err));
    }
    if (lc->has_draft_head) {
        int64_t V = cfg->vocab_size, Rm = cfg->dspark_markov_rank;
        TRY(bind_vec(bd, NM("norm.weight"), DI_BF16, D, (const void **)&lw->head_norm, err));
        TRY(bind_mat(bd, NM("markov_head.embed.weight"), DI_BF16, V, Rm, (const void **)&lw->markov_embed, err));
        TRY(bind_mat(bd, NM("markov_head.head.weight"), DI_BF16, V, Rm, (const void **)&lw->markov_head, err));
        TRY(bind_mat(bd, NM("confidence_head.proj.weight"), DI_BF16, 1, D + Rm, (const void **)&lw->conf_proj, err));
    }
    /* last: the only allocation that is not a view */
    TRY(dequant_wo_a(&woa, &lw->wo_a, err));
    TRY(record_slot(bd->w, (const void **)&lw->wo_a, (int64_t)sizeof(uint16_t) * woa.n * woa.k, false, err));
#undef NM
#undef TRY
    return DI_OK;
}

int di_weights_bind(const di_config *cfg, const di_checkpoint *ck, di_weights *out, di_error *err) {
    memset(out, 0, sizeof *out);
    binder b = {ck, out}, *bd = &b;
    int64_t V = cfg->vocab_size, D = cfg->hidden_size;
    int rc = bind_mat(bd, "embed.weight", DI_BF16, V, D, (const void **)&out->embed, err);
    if (!rc) rc = bind_mat(bd, "head.weight", DI_BF16, V, D, (const void **)&out->head, err);
    if (!rc) rc = bind_vec(bd, "norm.weight", DI_BF16, D, (const void **)&out->norm, err);
    int n_stages = cfg->n_layers + cfg->n_dspark;
    if (!rc && !(out->layers = calloc((size_t)n_stages, sizeof(di_layer_w))))
        rc = di_error_set(err, DI_ERR_NOMEM, "%d stage weight structs", n_stages);
    if (rc) {
        di_weights_free(out);
        return rc;
    }
    out->n_layers = cfg->n_layers;
    out->n_stages = n_stages;
    for (int L = 0; L < n_stages; L++) {
        rc = bind_layer(cfg, bd, L, &out->layers[L], err);
        if (rc) break;
    }
    if (rc) di_weights_free(out);
    return rc;
}

static void advise_willneed(const void *p, int64_t bytes) {
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p / (uintptr_t)pg * (uintptr_t)pg, e = (uintptr_t)p + (uintptr_t)bytes;
    if (bytes > 0) (void)madvise((void *)a, e - a, MADV_WILLNEED); /* advisory: failure changes nothing */
}

int di_weights_to_backend(di_weights *w, const di_backend *be, di_error *err) {
    if (w->be && w->be != be)
        return di_error_set(err, DI_ERR_INVALID,
                            "weights: already moved to the memory of another backend (%s); open the model again",
                            w->be->name);
    if (!be || be->host_memory || w->be) return DI_OK;
    int64_t total = 0;
    for (int64_t i = 0; i < w->n_slots; i++)
        if (!w->slots[i].mapped) total += (w->slots[i].bytes + 255) / 256 * 256;
    uint8_t *dev = be->mem_alloc(be, (size_t)total, err);
    if (!dev) return err ? err->code : DI_ERR_NOMEM;
    w->be = be, w->dev = dev;
    int64_t off = 0, advised = 0, ahead = 0;
    for (int64_t i = 0; i < w->n_slots; i++) {
        di_w_slot *s = &w->slots[i];
        int rc;
        /* Read-ahead of the next ~1 GiB of uploads: a checkpoint on a cold disk pages in at a fraction of
         * the copy bandwidth otherwise (one fault-sized read at a time). A window, not the whole file,
         * so a checkpoint larger than RAM is not read ahead only to be evicted before its upload. */
        if (!s->mapped) ahead -= s->bytes;
        for (; advised < w->n_slots && ahead < ((int64_t)1 << 30); advised++) {
            if (w->slots[advised].mapped || advised < i) continue;
            advise_willneed(w->slots[advised].host, w->slots[advised].bytes);
            ahead += w->slots[advised].bytes;
        }
        if (s->mapped) {
            const void *view = NULL;
            rc = be->mem_map_host(be, s->host, (size_t)s->bytes, &view, err);
            if (!rc) *s->slot = view;
        } else {
            rc = be->mem_upload(be, dev + off, s->host, (size_t)s->bytes, err);
            if (!rc) *s->slot = dev + off;
            off += (s->bytes + 255) / 256 * 256;
        }
        if (rc) { /* back to host views: nothing half-moved survives */
            for (int64_t j = 0; j < i; j++) {
                if (w->slots[j].mapped) be->mem_unmap_host(be, w->slots[j].host, *w->slots[j].slot);
                *w->slots[j].slot = w->slots[j].host;
            }
            be->mem_free(be, dev);
            w->be = NULL, w->dev = NULL;
            return rc;
        }
    }
    return DI_OK;
}

int di_model_to_backend(di_model *m, const di_backend *be, di_error *err) { return di_weights_to_backend(&m->w, be, err); }

void di_weights_free(di_weights *w) {
    if (!w) return;
    if (w->be) {
        for (int64_t i = 0; i < w->n_slots; i++) {
            if (w->slots[i].mapped) w->be->mem_unmap_host(w->be, w->slots[i].host, *w->slots[i].slot);
            *w->slots[i].slot = w->slots[i].host;
        }
        w->be->mem_free(w->be, w->dev);
    }
    free(w->slots);
    for (int L = 0; w->layers && L < w->n_stages; L++) {
        free(w->layers[L].experts);
        free(w->layers[L].wo_a);
    }
    for (int64_t i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->owned);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

int di_model_open(const char *dir, di_model **out, di_error *err) {
    di_model *m = calloc(1, sizeof *m);
    if (!m) return di_error_set(err, DI_ERR_NOMEM, "model struct");
    int rc = di_config_load(dir, &m->cfg, err);
    if (!rc) rc = di_ckpt_open(dir, &m->ck, err);
    if (!rc) rc = di_inventory_validate(&m->cfg, m->ck, err);
    if (!rc) rc = di_weights_bind(&m->cfg, m->ck, &m->w, err);
    if (!rc) rc = di_engram_consts_load(&m->cfg, dir, &m->eg, err);
    if (rc) {
        di_model_close(m);
        return rc;
    }
    *out = m;
    return DI_OK;
}

void di_model_close(di_model *m) {
    if (!m) return;
    di_engram_consts_free(&m->eg);
    di_weights_free(&m->w);
    di_ckpt_close(m->ck);
    di_config_free(&m->cfg);
    free(m);
}
