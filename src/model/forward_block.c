/* One V4.1 block as a chain of backend ops (spec model.md §4.2–§4.5): Engram, the mHC mixes, the
 * attention sub-layer (window + shared compressed KV, indexer, candidates, sparse attention with sink,
 * grouped low-rank output) and the MoE sub-layer. Stage dump names are "L<i>.<stage>". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"
#include "util/error.h"

#define CK(call)                     \
    do {                             \
        int rc_ = (call);            \
        if (rc_) return rc_;         \
    } while (0)
#define ALLOC(ptr, n, persist)                                               \
    do {                                                                     \
        (ptr) = fwd_alloc(c, sizeof(*(ptr)) * (size_t)(n), (persist));      \
        if (!(ptr)) return c->err ? c->err->code : DI_ERR_NOMEM;             \
    } while (0)

static void dname(char *buf, size_t n, int L, const char *stage) { snprintf(buf, n, "L%d.%s", L, stage); }

#define DUMP(stage, dt, data, nd, a, b, e)                     \
    do {                                                       \
        if (c->opts->dump) {                                   \
            char nm_[96];                                      \
            dname(nm_, sizeof nm_, L, stage);                  \
            fwd_dump(c, nm_, dt, data, nd, a, b, e);           \
        }                                                      \
    } while (0)

/* ---------------- Engram (§4.3) ---------------- */

int fwd_engram(fwd_ctx *c, int L, uint16_t *x) {
    const di_config *cfg = c->cfg;
    int e = cfg->layer[L].engram_index;
    if (e < 0) return DI_OK;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size;
    int hc = cfg->hc_mult, ehd = cfg->engram_head_dim;
    int cols = (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads;
    uint16_t *emb, *kv; /* bf16 [T, cols·ehd], bf16 [T, (hc+1)·D] */
    ALLOC(emb, T * cols * ehd, 0);
    ALLOC(kv, T * (hc + 1) * D, 0);
    CK(be->engram_lookup(be, w->eg_table, w->eg_table_scale, w->eg_rows, ehd, c->eg_ids[e], T, cols, emb, c->err));
    DUMP("engram.rows", DI_BF16, emb, 2, T, (int64_t)cols * ehd, 0);
    CK(be->linear_fp8(be, emb, T, (int64_t)cols * ehd, w->eg_wkv.w, w->eg_wkv.s, (hc + 1) * D, kv, c->err));
    DUMP("engram.kv", DI_BF16, kv, 2, T, (hc + 1) * D, 0);
    CK(be->engram_gate(be, x, kv, T, hc, D, w->eg_q, w->eg_k, (float)cfg->rms_norm_eps, c->err));
    DUMP("engram.out", DI_BF16, x, 3, T, hc, D);
    return DI_OK;
}

/* ---------------- attention sub-layer (§3.4, §4.4) ---------------- */

/* The publication of source layer `src` for a consumer at layer L, checked to exist (a layer that is
 * its own source reads what it has published so far in this block). */
static const struct fwd_pub *source(fwd_ctx *c, int L, int src, const char *what) {
    if (src < 0 || src > L || (src < L && !c->pub[src].done)) {
        di_error_set(c->err, DI_ERR_INTERNAL, "layer %d: %s source layer %d has not run in this pass", L, what, src);
        return NULL;
    }
    return &c->pub[src];
}

/* kv sources: the compressed latent before RoPE (ratio 1: a bf16 projection per token; ratio R > 1:
 * per-channel softmax pooling of R tokens on f32 projections), then the compressor RMSNorm.
 *   u bf16 [T, D];  *lat bf16 [T/R, hd] (pass lifetime) */
static int compressor(fwd_ctx *c, int L, const uint16_t *u, uint16_t **lat_out) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, hd = cfg->head_dim;
    int R = cfg->layer[L].compress_ratio;
    int64_t ncmp = T / R;
    uint16_t *lat;
    ALLOC(lat, ncmp * hd, 1);
    if (R == 1) {
        CK(be->linear_bf16(be, u, T, D, w->cmp_wkv, hd, lat, c->err));
    } else {
        float *a, *g; /* f32 [T, hd] */
        ALLOC(a, T * hd, 0);
        ALLOC(g, T * hd, 0);
        CK(be->linear_f32(be, u, T, D, w->cmp_wkv, hd, a, c->err));
        CK(be->linear_f32(be, u, T, D, w->cmp_wgate, hd, g, c->err));
        CK(be->compress_pool(be, a, g, T, R, hd, lat, c->err));
    }
    CK(be->rmsnorm(be, lat, ncmp, hd, w->cmp_norm, (float)cfg->rms_norm_eps, lat, c->err));
    DUMP("attn.cmp.latent", DI_BF16, lat, 2, ncmp, hd, 0);
    *lat_out = lat;
    return DI_OK;
}

/* kv sources: index keys from the (unrotated) latent — wk, k_norm, RoPE at the group's first
 * position n·R, FP4 QDQ with E8M0 scales per 32 (no Hadamard in V4.1).  lat bf16 [T/R, hd] */
static int index_keys(fwd_ctx *c, int L, const uint16_t *lat) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int R = cfg->layer[L].compress_ratio, ihd = cfg->index_head_dim;
    int64_t ncmp = c->T / R, hd = cfg->head_dim;
    uint16_t *k; /* bf16 [ncmp, ihd] */
    ALLOC(k, ncmp * ihd, 1);
    CK(be->linear_bf16(be, lat, ncmp, hd, w->idx_wk, ihd, k, c->err));
    CK(be->rmsnorm(be, k, ncmp, ihd, w->idx_k_norm, (float)cfg->rms_norm_eps, k, c->err));
    CK(be->rope(be, k, ncmp, 1, ihd, cfg->qk_rope_head_dim, c->cmp_pos[R], c->rope_freqs[cfg->layer[L].rope], false,
                c->err));
    CK(be->qdq_fp4_e8m0(be, k, ncmp, ihd, 32, c->err));
    DUMP("attn.index_k", DI_BF16, k, 2, ncmp, ihd, 0);
    c->pub[L].index_k = k;
    return DI_OK;
}

/* Index sources: score the index keys of the layer's key source with this layer's own queries and
 * weights (bf16 arithmetic), mask by the candidate blocks (re-index layers), publish the candidate
 * mask (the candidate source; its own selection is not masked) and the top-k list (+T offset into
 * [window ‖ compressed]).  u bf16 [T, D];  qr bf16 [T, qr] */
static int indexer(fwd_ctx *c, int L, const uint16_t *u, const uint16_t *qr) {
    const di_config *cfg = c->cfg;
    const di_layer_cfg *lc = &cfg->layer[L];
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, qrk = cfg->q_lora_rank;
    int R = lc->compress_ratio, ih = cfg->index_n_heads, ihd = cfg->index_head_dim;
    int64_t ncmp = T / R;
    int ksel = (int)(ncmp < cfg->index_topk ? ncmp : cfg->index_topk);
    c->out->topk_k[L] = ksel;
    c->out->n_keys[L] = ncmp;
    c->pub[L].topk_k = ksel;
    if (ksel == 0) return DI_OK; /* nothing visible yet: empty compressed lists */
    const struct fwd_pub *ks = source(c, L, lc->index_key_source, "index-key");
    if (!ks) return c->err->code;

    uint16_t *qi, *iw; /* bf16 [T, ih, ihd], bf16 [T, ih] */
    int32_t *vis;      /* int32 [T] visible compressed entries per query */
    ALLOC(qi, T * ih * ihd, 0);
    ALLOC(iw, T * ih, 0);
    ALLOC(vis, T, 0);
    /* owned by c->out (golden names prefill_layer{L}_index_scores / _topk) */
    float *scores = c->out->index_scores[L] = calloc((size_t)(T * ncmp), sizeof(float)); /* f32 [T, ncmp] */
    int32_t *top = c->out->topk[L] = calloc((size_t)(T * ksel), sizeof(int32_t));        /* int32 [T, ksel] */
    if (!scores || !top)
        return di_error_set(c->err, DI_ERR_NOMEM, "layer %d: index scores [%lld, %lld]", L, (long long)T,
                            (long long)ncmp);
    CK(be->linear_fp8(be, qr, T, qrk, w->idx_wq_b.w, w->idx_wq_b.s, (int64_t)ih * ihd, qi, c->err));
    CK(be->rope(be, qi, T, ih, ihd, cfg->qk_rope_head_dim, c->pos, c->rope_freqs[lc->rope], false, c->err));
    CK(be->qdq_fp4_e8m0(be, qi, T * ih, ihd, 32, c->err));
    DUMP("attn.index_q", DI_BF16, qi, 3, T, ih, ihd);
    CK(be->linear_bf16(be, u, T, D, w->idx_weights_proj, ih, iw, c->err));
    DUMP("attn.index_w", DI_BF16, iw, 2, T, ih, 0);
    for (int64_t t = 0; t < T; t++) vis[t] = (int32_t)((t + 1) / R);

    const uint8_t *cand = NULL;
    if (lc->candidate_source >= 0 && !c->opts->faults.ignore_candidates) {
        const struct fwd_pub *cs = source(c, L, lc->candidate_source, "candidate");
        if (!cs) return c->err->code;
        if (cs->n_cand != ncmp)
            return di_error_set(c->err, DI_ERR_INTERNAL, "layer %d: candidate mask over %lld entries, scores over %lld",
                                L, (long long)cs->n_cand, (long long)ncmp);
        cand = cs->cand;
    }
    /* the reference scales the weights by index_head_dim^-0.5 · n_heads^-0.5 (a Python double) */
    float w_scale = (float)(pow(ihd, -0.5) * pow(ih, -0.5));
    CK(be->indexer_scores(be, qi, iw, w_scale, ks->index_k, T, ih, ihd, ncmp, vis, cand, scores, c->err));
    DUMP("attn.index_scores", DI_F32, scores, 2, T, ncmp, 0);

    if (lc->is_candidate_source) {
        int blk = cfg->candidate_block_size;
        uint8_t *mask; /* uint8 [T, ncmp] */
        float *ws;     /* f32 [ceil(ncmp / blk)] */
        ALLOC(mask, T * ncmp, 1);
        ALLOC(ws, (ncmp + blk - 1) / blk + 1, 0);
        CK(be->candidate_mask(be, scores, T, ncmp, vis, blk, cfg->candidate_topk_blocks, mask, ws, c->err));
        DUMP("attn.candidates", DI_I8, mask, 2, T, ncmp, 0);
        c->pub[L].cand = mask;
        c->pub[L].n_cand = ncmp;
    }
    CK(be->topk(be, scores, T, ncmp, vis, ksel, (int32_t)T, top, c->err));
    DUMP("attn.topk", DI_I32, top, 2, T, ksel, 0);
    c->pub[L].topk = top;
    return DI_OK;
}

/* kv sources: the shared compressed KV — the latent rotated at n·R, then FP4 with E4M3 scales over
 * groups of 16 (all 512 channels).  lat bf16 [T/R, hd], rotated and quantized in place */
static int compressed_kv(fwd_ctx *c, int L, uint16_t *lat) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    int R = cfg->layer[L].compress_ratio;
    int64_t ncmp = c->T / R, hd = cfg->head_dim;
    CK(be->rope(be, lat, ncmp, 1, (int)hd, cfg->qk_rope_head_dim, c->cmp_pos[R], c->rope_freqs[cfg->layer[L].rope],
                false, c->err));
    CK(be->qdq_fp4_e4m3(be, lat, ncmp, hd, 16, c->err));
    DUMP("attn.cmp_kv", DI_BF16, lat, 2, ncmp, hd, 0);
    c->pub[L].cmp_kv = lat;
    c->pub[L].n_cmp = ncmp;
    return DI_OK;
}

/* The compressed half of attention (compress ratio > 0), in the reference's order: the kv source's
 * latent feeds its index keys BEFORE it is rotated into the compressed KV, and the indexer runs in
 * between. Afterwards *kvp / *topp are what this layer attends: the compressed KV of its kv source
 * and the top-k list of its index source (itself, or the latest one for reuse layers).
 *   u bf16 [T, D];  qr bf16 [T, qr] */
static int attn_compressed(fwd_ctx *c, int L, const uint16_t *u, const uint16_t *qr, const struct fwd_pub **kvp,
                           const struct fwd_pub **topp) {
    const di_layer_cfg *lc = &c->cfg->layer[L];
    uint16_t *lat = NULL; /* bf16 [T/R, hd] */
    bool have_lat = lc->is_kv_source && c->T / lc->compress_ratio > 0;
    if (have_lat) CK(compressor(c, L, u, &lat));
    if (have_lat && lc->has_index_wk) CK(index_keys(c, L, lat));
    if (lc->is_index_source) CK(indexer(c, L, u, qr));
    if (have_lat) CK(compressed_kv(c, L, lat));
    c->pub[L].done = true;
    if (!(*kvp = source(c, L, lc->kv_source, "kv")) || !(*topp = source(c, L, lc->index_source, "top-k")))
        return c->err->code;
    return DI_OK;
}

/* Attention sub-layer: u bf16 [T, D] (normed collapse) → y bf16 [T, D]. */
static int attention(fwd_ctx *c, int L, const uint16_t *u, uint16_t *y) {
    const di_config *cfg = c->cfg;
    const di_layer_cfg *lc = &cfg->layer[L];
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, hd = cfg->head_dim, qrk = cfg->q_lora_rank;
    int H = cfg->num_attention_heads, rd = cfg->qk_rope_head_dim, kind = lc->rope;
    int G = cfg->o_groups;
    int64_t orr = cfg->o_lora_rank;
    float eps = (float)cfg->rms_norm_eps;

    /* query: wq_a → q_norm → wq_b → RoPE (no per-head norm in V4.1) */
    uint16_t *qa, *q; /* bf16 [T, qr], bf16 [T, H, hd] */
    ALLOC(qa, T * qrk, 0);
    ALLOC(q, T * H * hd, 0);
    CK(be->linear_fp8(be, u, T, D, w->wq_a.w, w->wq_a.s, qrk, qa, c->err));
    CK(be->rmsnorm(be, qa, T, qrk, w->q_norm, eps, qa, c->err));
    DUMP("attn.qr", DI_BF16, qa, 2, T, qrk, 0);
    CK(be->linear_fp8(be, qa, T, qrk, w->wq_b.w, w->wq_b.s, H * hd, q, c->err));
    CK(be->rope(be, q, T, H, (int)hd, rd, c->pos, c->rope_freqs[kind], false, c->err));
    DUMP("attn.q", DI_BF16, q, 3, T, H, hd);

    /* window KV: wkv → kv_norm → RoPE → FP8 QDQ of all hd channels (groups of 32) */
    uint16_t *kv; /* bf16 [T, hd] */
    ALLOC(kv, T * hd, 0);
    CK(be->linear_fp8(be, u, T, D, w->wkv.w, w->wkv.s, hd, kv, c->err));
    CK(be->rmsnorm(be, kv, T, hd, w->kv_norm, eps, kv, c->err));
    CK(be->rope(be, kv, T, 1, (int)hd, rd, c->pos, c->rope_freqs[kind], false, c->err));
    CK(be->qdq_fp8(be, kv, T, hd, 32, c->err));
    DUMP("attn.kv", DI_BF16, kv, 2, T, hd, 0);

    /* index lists: [window ‖ compressed top-k (+T)], the reference's order */
    const uint16_t *cmp = NULL; /* bf16 [n_cmp, hd] */
    const int32_t *topk = NULL; /* int32 [T, kc] */
    int64_t n_cmp = 0, kc = 0;
    if (lc->compress_ratio > 0) {
        const struct fwd_pub *kvp, *topp;
        CK(attn_compressed(c, L, u, qa, &kvp, &topp));
        cmp = kvp->cmp_kv, n_cmp = kvp->n_cmp;
        topk = topp->topk, kc = topp->topk ? topp->topk_k : 0;
    }
    int64_t n_idx = c->n_win + kc;
    int32_t *idx; /* int32 [T, n_idx] */
    ALLOC(idx, T * n_idx, 0);
    for (int64_t t = 0; t < T; t++) {
        memcpy(idx + t * n_idx, c->win_idx + t * c->n_win, sizeof(int32_t) * (size_t)c->n_win);
        if (kc) memcpy(idx + t * n_idx + c->n_win, topk + t * kc, sizeof(int32_t) * (size_t)kc);
    }

    float *sink; /* f32 [H] */
    ALLOC(sink, H, 0);
    for (int h = 0; h < H; h++) sink[h] = c->opts->faults.no_sink ? -INFINITY : w->attn_sink[h];
    uint16_t *o; /* bf16 [T, H, hd] */
    ALLOC(o, T * H * hd, 0);
    CK(be->sparse_attn(be, q, T, H, (int)hd, kv, T, cmp, n_cmp, sink, idx, n_idx, (float)pow((double)hd, -0.5), o,
                       c->err));
    CK(be->rope(be, o, T, H, (int)hd, rd, c->pos, c->rope_freqs[kind], true, c->err));
    DUMP("attn.o", DI_BF16, o, 3, T, H, hd);

    /* grouped low-rank output: wo_a per group of H/G heads (bf16), then wo_b (FP8) */
    uint16_t *og; /* bf16 [T, G, orr] */
    ALLOC(og, T * G * orr, 0);
    CK(be->linear_grouped_bf16(be, o, T, G, H * hd / G, w->wo_a, orr, og, c->err));
    CK(be->linear_fp8(be, og, T, G * orr, w->wo_b.w, w->wo_b.s, D, y, c->err));
    DUMP("attn.out", DI_BF16, y, 2, T, D, 0);
    return DI_OK;
}

/* ---------------- MoE sub-layer (§3.7, §4.5) ---------------- */

/* v bf16 [T, D] (normed collapse) → y bf16 [T, D]. Routed experts are applied in ascending id and
 * accumulated in f32 per token, the shared expert last (reference MoE.forward). */
static int moe(fwd_ctx *c, int L, const uint16_t *v, uint16_t *y) {
    const di_config *cfg = c->cfg;
    const di_layer_cfg *lc = &cfg->layer[L];
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, I = cfg->moe_intermediate_size;
    int E = lc->n_experts, K = lc->n_active_experts;
    float lim = (float)cfg->swiglu_limit;

    float *logits, *rw, *acc; /* f32 [T, E], f32 [T, K], f32 [T, D] */
    int32_t *ids, *rows;      /* int32 [T, K], int32 [T] */
    float *roww;              /* f32 [T] routing weight of each gathered row */
    uint16_t *xg, *g, *u, *a, *ye; /* bf16 [T, D], [T, I], [T, I], [T, I], [T, D] */
    ALLOC(logits, T * E, 0);
    ALLOC(rw, T * K, 0);
    ALLOC(acc, T * D, 0);
    ALLOC(ids, T * K, 0);
    ALLOC(rows, T, 0);
    ALLOC(roww, T, 0);
    ALLOC(xg, T * D, 0);
    ALLOC(g, T * I, 0);
    ALLOC(u, T * I, 0);
    ALLOC(a, T * I, 0);
    ALLOC(ye, T * D, 0);
    CK(be->linear_f32(be, v, T, D, w->gate_w, E, logits, c->err));
    CK(be->router(be, logits, T, E, w->gate_bias, (float)cfg->gate_temp, K, cfg->norm_topk_prob,
                  (float)cfg->routed_scaling_factor, ids, rw, c->err));
    DUMP("ffn.route_ids", DI_I32, ids, 2, T, K, 0);
    DUMP("ffn.route_w", DI_F32, rw, 2, T, K, 0);
    CK(be->fill_f32(be, acc, T * D, 0.0f, c->err));
    for (int e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (ids[t * K + j] == e) rows[n] = (int32_t)t, roww[n] = rw[t * K + j], n++;
        if (!n) continue;
        const di_expert_w *ex = &w->experts[e];
        CK(be->gather_rows(be, v, D, rows, n, xg, c->err));
        CK(be->linear_fp4(be, xg, n, D, ex->w1.w, ex->w1.s, I, g, c->err));
        CK(be->linear_fp4(be, xg, n, D, ex->w3.w, ex->w3.s, I, u, c->err));
        CK(be->swiglu(be, g, u, n, I, roww, lim, a, c->err));
        CK(be->linear_fp4(be, a, n, I, ex->w2.w, ex->w2.s, D, ye, c->err));
        CK(be->scatter_add_rows(be, ye, D, rows, n, acc, c->err));
    }
    for (int64_t t = 0; t < T; t++) rows[t] = (int32_t)t;
    CK(be->linear_fp8(be, v, T, D, w->sh_w1.w, w->sh_w1.s, I, g, c->err));
    CK(be->linear_fp8(be, v, T, D, w->sh_w3.w, w->sh_w3.s, I, u, c->err));
    CK(be->swiglu(be, g, u, T, I, NULL, lim, a, c->err));
    CK(be->linear_fp8(be, a, T, I, w->sh_w2.w, w->sh_w2.s, D, ye, c->err));
    DUMP("ffn.shared", DI_BF16, ye, 2, T, D, 0);
    CK(be->scatter_add_rows(be, ye, D, rows, T, acc, c->err));
    CK(be->f32_to_bf16(be, acc, T * D, y, c->err));
    DUMP("ffn.out", DI_BF16, y, 2, T, D, 0);
    return DI_OK;
}

/* ---------------- the block (§4.2: deferred pre-mix) ---------------- */

int fwd_block(fwd_ctx *c, int L, uint16_t *x, const float *pre_in, float *pre_out) {
    const di_config *cfg = c->cfg;
    const di_layer_w *w = &c->m->w.layers[L];
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size;
    int hc = cfg->hc_mult, nmix = (2 + hc) * hc;
    int iters = c->opts->faults.sinkhorn_iters > 0 ? c->opts->faults.sinkhorn_iters : cfg->hc_sinkhorn_iters;
    float eps = (float)cfg->rms_norm_eps, hc_eps = (float)cfg->hc_eps;
    bool deferred = !c->opts->faults.premix_not_deferred;

    float *mix, *pre_a, *post, *comb; /* f32 [T, nmix], [T, hc], [T, hc], [T, hc, hc] */
    uint16_t *h, *z;                  /* bf16 [T, D] sub-layer input and output */
    ALLOC(mix, T * nmix, 0);
    ALLOC(pre_a, T * hc, 0);
    ALLOC(post, T * hc, 0);
    ALLOC(comb, T * hc * hc, 0);
    ALLOC(h, T * D, 0);
    ALLOC(z, T * D, 0);

    /* attention: mixes from the block input; collapse with the PREVIOUS sub-layer's pre-mix */
    CK(be->hc_mixes(be, x, T, hc, D, w->hc_attn_fn, eps, mix, c->err));
    CK(be->hc_sinkhorn(be, mix, T, hc, w->hc_attn_scale, w->hc_attn_base, iters, hc_eps, pre_a, post, comb, c->err));
    DUMP("attn.pre", DI_F32, pre_a, 2, T, hc, 0);
    DUMP("attn.comb", DI_F32, comb, 3, T, hc, hc);
    CK(be->hc_collapse(be, x, deferred ? pre_in : pre_a, T, hc, D, h, c->err));
    CK(be->rmsnorm(be, h, T, D, w->attn_norm, eps, h, c->err));
    DUMP("attn.in", DI_BF16, h, 2, T, D, 0);
    CK(attention(c, L, h, z));
    CK(be->hc_expand(be, z, x, post, comb, T, hc, D, x, c->err));
    DUMP("attn.streams", DI_BF16, x, 3, T, hc, D);

    /* FFN: mixes from the post-attention streams; collapse with the attention's pre-mix */
    CK(be->hc_mixes(be, x, T, hc, D, w->hc_ffn_fn, eps, mix, c->err));
    CK(be->hc_sinkhorn(be, mix, T, hc, w->hc_ffn_scale, w->hc_ffn_base, iters, hc_eps, pre_out, post, comb, c->err));
    DUMP("ffn.pre", DI_F32, pre_out, 2, T, hc, 0);
    CK(be->hc_collapse(be, x, deferred ? pre_a : pre_out, T, hc, D, h, c->err));
    CK(be->rmsnorm(be, h, T, D, w->ffn_norm, eps, h, c->err));
    DUMP("ffn.in", DI_BF16, h, 2, T, D, 0);
    CK(moe(c, L, h, z));
    CK(be->hc_expand(be, z, x, post, comb, T, hc, D, x, c->err));
    DUMP("out", DI_BF16, x, 3, T, hc, D);
    return DI_OK;
}
