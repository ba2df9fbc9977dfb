/* DSpark draft head (spec model.md §4.9): three ratio-0 stages (mtp.0..2) that read the main model
 * through one feature per position and draft `block` tokens in one pass, then a Markov head and a
 * confidence head.
 *
 *   main_x_p = RMSNorm(Linear_fp8(main_hidden_p; mtp.0.main_proj); mtp.0.main_norm)
 *   every stage S keeps its own 128-slot window of FP8-QDQ'd KV of main_x at the MAIN positions p
 *   (written for every position the main model processes: prompt chunks and decode steps alike);
 *   draft after main position i: ids [t_{i+1}, N, …, N] at positions i+1 … i+block, each stage a full
 *   §4.2 block whose attention sees the window slots 0 … min(W, i+1)−1 in SLOT order plus all draft
 *   KV (bidirectional inside the block); then head(norm(collapse)) + Markov bias, sequentially
 *   sampled, and a raw confidence logit per slot from [collapse ‖ markov embed of the previous id].
 *
 * The reference writes main position i's stage KV inside forward_spec; writing it with the main
 * forward (fwd_dspark_fill) computes the same rows, and the drafts only read the window. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/formats.h"
#include "model/forward_internal.h"
#include "util/error.h"

#define CK(call)             \
    do {                     \
        int rc_ = (call);    \
        if (rc_) return rc_; \
    } while (0)
#define ALLOC(ptr, n)                                                  \
    do {                                                               \
        (ptr) = fwd_alloc(c, sizeof(*(ptr)) * (size_t)(n), 0);         \
        if (!(ptr)) return c->err->code;                               \
    } while (0)

int fwd_dspark_fill(fwd_ctx *c) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    int64_t T = c->T, D = cfg->hidden_size, hd = cfg->head_dim, F = (int64_t)cfg->n_dspark_target_layer_ids * D;
    float eps = (float)cfg->rms_norm_eps;
    if (cfg->n_dspark <= 0) return DI_OK;
    bool any = false;
    for (int i = 0; i < c->n_seq; i++) any = any || c->seq[i].ck.dspark;
    if (!any) return DI_OK;
    if (!c->main_hidden) return di_error_set(c->err, DI_ERR_INTERNAL, "dspark: no target-layer features recorded");
    /* the projections run over every row of the pass (row-wise: the DSpark rows get their own bits);
     * only the sequences that keep DSpark windows store theirs */
    const di_layer_w *w0 = &c->m->w.layers[cfg->n_layers];
    uint16_t *mx, *kv; /* bf16 [T, D], bf16 [T, hd] */
    ALLOC(mx, T * D);
    ALLOC(kv, T * hd);
    CK(be->linear_fp8(be, c->main_hidden, T, F, w0->main_proj.w, w0->main_proj.s, D, mx, c->err));
    CK(be->rmsnorm(be, mx, T, D, w0->main_norm, eps, mx, c->err));
    for (int S = 0; S < cfg->n_dspark; S++) {
        int L = cfg->n_layers + S;
        const di_layer_w *w = &c->m->w.layers[L];
        CK(be->linear_fp8(be, mx, T, D, w->wkv.w, w->wkv.s, hd, kv, c->err));
        CK(be->rmsnorm(be, kv, T, hd, w->kv_norm, eps, kv, c->err));
        CK(be->rope(be, kv, T, 1, (int)hd, cfg->qk_rope_head_dim, c->pos, c->rope_freqs[cfg->layer[L].rope], false,
                    c->err));
        for (int i = 0; i < c->n_seq; i++) {
            const fwd_seq *q = &c->seq[i];
            if (q->ck.dspark) /* the cache applies the FP8 QDQ */
                CK(di_cache_window_put_rows(q->ck.cache, L, q->ck.s0, q->ck.T, kv + q->r0 * hd, c->err));
        }
    }
    fwd_free_tmp(c);
    return DI_OK;
}

static int32_t argmax_first(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

int fwd_dspark_draft(fwd_ctx *c, int32_t token, di_sample_fn sample, void *sample_ctx, int32_t *ids, float *conf,
                     float *logits_out) {
    const di_config *cfg = c->cfg;
    const di_backend *be = c->be;
    int64_t B = c->T, D = cfg->hidden_size, hd = cfg->head_dim, V = cfg->vocab_size, Rm = cfg->dspark_markov_rank;
    int hc = cfg->hc_mult;
    if (c->n_seq != 1) return di_error_set(c->err, DI_ERR_INTERNAL, "dspark: a draft pass over %d sequences", c->n_seq);
    di_cache *cache = c->seq[0].ck.cache;
    int64_t i = c->seq[0].ck.s0 - 1; /* the main position the drafts continue */
    if (cfg->n_dspark <= 0 || B != cfg->dspark_block_size)
        return di_error_set(c->err, DI_ERR_INVALID, "dspark: the model has no draft stages (block %d)", cfg->dspark_block_size);
    if (token < 0 || token >= V)
        return di_error_set(c->err, DI_ERR_INVALID, "dspark: token %d outside the vocabulary (%lld)", token, (long long)V);
    const di_layer_w *wl = &c->m->w.layers[cfg->n_layers + cfg->n_dspark - 1];

    /* pass-lifetime buffers (fwd_block frees the block scratch): backend memory unless marked host */
    int32_t *din = fwd_halloc(c, sizeof(int32_t) * (size_t)B, 1);              /* int32 [B] draft inputs (host) */
    uint16_t *x = fwd_alloc(c, sizeof(uint16_t) * (size_t)(B * hc * D), 1);     /* bf16 [B, hc, D] */
    float *pre = fwd_alloc(c, sizeof(float) * (size_t)(B * hc), 1);             /* f32 [B, hc] */
    float *pre_next = fwd_alloc(c, sizeof(float) * (size_t)(B * hc), 1);        /* f32 [B, hc] */
    uint16_t *win = fwd_alloc(c, sizeof(uint16_t) * (size_t)(cfg->sliding_window * hd), 1); /* bf16 [≤W, hd] */
    float *lg = fwd_alloc(c, sizeof(float) * (size_t)(B * V), 1);              /* f32 [B, V] */
    float *lg_h = fwd_halloc(c, sizeof(float) * (size_t)(B * V), 1);           /* f32 [B, V] (host) */
    float *bias = fwd_alloc(c, sizeof(float) * (size_t)V, 1);                  /* f32 [V] */
    float *bias_h = fwd_halloc(c, sizeof(float) * (size_t)V, 1);               /* f32 [V] (host) */
    int32_t *prev = fwd_alloc(c, sizeof(int32_t), 1);                          /* int32 [1] previous id */
    float *conf_d = fwd_alloc(c, sizeof(float) * (size_t)B, 1);                /* f32 [B] */
    uint16_t *h = fwd_alloc(c, sizeof(uint16_t) * (size_t)(B * D), 1);          /* bf16 [B, D] collapse */
    uint16_t *hn = fwd_alloc(c, sizeof(uint16_t) * (size_t)(B * D), 1);         /* bf16 [B, D] normed */
    uint16_t *cat = fwd_alloc(c, sizeof(uint16_t) * (size_t)(B * (D + Rm)), 1); /* bf16 [B, D + Rm] */
    if (!din || !x || !pre || !pre_next || !win || !lg || !lg_h || !bias || !bias_h || !prev || !conf_d || !h || !hn ||
        !cat)
        return c->err->code;

    din[0] = token;
    for (int64_t j = 1; j < B; j++) din[j] = cfg->dspark_noise_token_id;
    CK(fwd_embed_streams(c, din, x, pre));
    for (int S = 0; S < cfg->n_dspark; S++) {
        int L = cfg->n_layers + S;
        CK(di_cache_dspark_gather(cache, L, i, win, &c->n_draft_win, c->err));
        c->draft_win = win;
        CK(fwd_block(c, L, x, pre, pre_next));
        fwd_free_tmp(c);
        CK(be->mem_copy(be, pre, pre_next, sizeof(float) * (size_t)(B * hc), c->err));
    }
    /* head on every draft slot, then the Markov bias of the previous id, sampled in order on the host
     * (each draft feeds the next slot's bias: one download per slot) */
    CK(be->hc_collapse(be, x, pre, B, hc, D, h, c->err));
    CK(be->rmsnorm(be, h, B, D, wl->head_norm, (float)cfg->rms_norm_eps, hn, c->err));
    CK(be->linear_f32(be, hn, B, D, c->m->w.head, V, lg, c->err));
    CK(fwd_download(c, lg_h, lg, sizeof(float) * (size_t)(B * V)));
    ids[0] = token;
    for (int64_t j = 0; j < B; j++) {
        uint16_t *me = cat + j * (D + Rm) + D; /* bf16 [Rm] markov embed of prev_j */
        CK(be->mem_copy(be, cat + j * (D + Rm), h + j * D, sizeof(uint16_t) * (size_t)D, c->err));
        CK(be->mem_upload(be, prev, &ids[j], sizeof(int32_t), c->err));
        CK(be->embed(be, wl->markov_embed, V, Rm, prev, 1, me, c->err));
        CK(be->linear_f32(be, me, 1, Rm, wl->markov_head, V, bias, c->err));
        CK(fwd_download(c, bias_h, bias, sizeof(float) * (size_t)V));
        float *row = lg_h + j * V;
        for (int64_t v = 0; v < V; v++) row[v] += bias_h[v];
        ids[j + 1] = sample ? sample(sample_ctx, row, V) : argmax_first(row, V);
        if (ids[j + 1] < 0 || ids[j + 1] >= V)
            return di_error_set(c->err, DI_ERR_INTERNAL, "dspark: sampler returned id %d", ids[j + 1]);
    }
    fwd_dump_host(c, "dspark.logits", DI_F32, lg_h, 2, B, V, 0);
    /* confidence: f32 linear over [collapse ‖ markov embed] (no norm, no bias, no sigmoid) */
    CK(be->linear_f32(be, cat, B, D + Rm, wl->conf_proj, 1, conf_d, c->err));
    CK(fwd_download(c, conf, conf_d, sizeof(float) * (size_t)B));
    if (logits_out) memcpy(logits_out, lg_h, sizeof(float) * (size_t)(B * V));
    return DI_OK;
}
