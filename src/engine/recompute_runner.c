/* Cache-free model runner over di_prefill (see recompute_runner.h). */
#include "engine/recompute_runner.h"

#include <stdlib.h>
#include <string.h>

#include "model/session.h"

typedef struct di_recompute_hist {
    int32_t *tokens; /* [cap] int32 the request's positions 0..n−1 as fed so far */
    int64_t n, cap;
} di_recompute_hist;

static di_recompute_hist *hist_of(di_recompute_runner *r, int64_t id) {
    di_recompute_hist *h = di_idmap_get(&r->hist, id);
    if (h) return h;
    h = calloc(1, sizeof *h);
    if (h && di_idmap_put(&r->hist, id, h)) {
        free(h);
        h = NULL;
    }
    return h;
}

static int rc_forward(void *ctx, const di_step_batch *b, float *logits, di_error *err) {
    di_recompute_runner *r = ctx;
    const int64_t V = r->model->cfg.vocab_size;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_step_seq *s = &b->seqs[i];
        di_recompute_hist *h = hist_of(r, s->req_id);
        if (!h) return di_error_set(err, DI_ERR_NOMEM, "recompute runner: out of memory for request %lld", (long long)s->req_id);
        /* a piece continues the history exactly where the last one ended (a release starts over) */
        if (s->pos0 != h->n)
            return di_error_set(err, DI_ERR_INTERNAL, "recompute runner: request %lld piece starts at %lld, history has %lld",
                                (long long)s->req_id, (long long)s->pos0, (long long)h->n);
        if (h->n + s->n_tokens > h->cap) {
            int64_t cap = h->cap ? h->cap : 64;
            while (cap < h->n + s->n_tokens) cap *= 2;
            int32_t *t = realloc(h->tokens, (size_t)cap * sizeof *t);
            if (!t) return di_error_set(err, DI_ERR_NOMEM, "recompute runner: out of memory for request %lld", (long long)s->req_id);
            h->tokens = t;
            h->cap = cap;
        }
        memcpy(h->tokens + h->n, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
        h->n += s->n_tokens;
        if (s->logits_row < 0) continue;
        /* one prefill of the whole history whose prompt rows select and list their windows as the
         * prompt's prefill and whose generated rows as their decode steps (model/forward_internal.h):
         * the logits the cached runner's decode steps give, bit for bit. A session over a cache of
         * the history's size, dropped after the pass (it splits a pass that crosses a short prompt's
         * end, model/session.c). */
        di_session *ps = NULL;
        di_session_opts so = {.max_tokens = h->n, .spec_margin = 0};
        const di_fwd_opts opts = {.prompt_end = s->n_prompt};
        int rc = di_session_create(r->model, r->be, &so, &ps, err);
        if (!rc) rc = di_session_forward(ps, h->tokens, h->n, false, logits + (size_t)s->logits_row * (size_t)V, &opts, err);
        di_session_destroy(ps);
        if (rc) return di_error_wrap(err, "recompute runner: request %lld, %lld positions", (long long)s->req_id, (long long)h->n);
        r->n_prefills++;
        r->n_positions += h->n;
    }
    return DI_OK;
}

static void rc_release(void *ctx, int64_t id) {
    di_recompute_runner *r = ctx;
    di_recompute_hist *h = di_idmap_get(&r->hist, id);
    if (!h) return;
    di_idmap_del(&r->hist, id);
    free(h->tokens);
    free(h);
}

int di_recompute_runner_new(const di_model *model, const di_backend *be, int64_t max_context, int32_t block_tokens,
                            int32_t n_blocks, di_recompute_runner **out, di_model_runner *iface, di_error *err) {
    *out = NULL;
    if (max_context < 2 || block_tokens < 1 || n_blocks < 1)
        return di_error_set(err, DI_ERR_INVALID, "recompute runner: context %lld, %d blocks of %d", (long long)max_context,
                            n_blocks, block_tokens);
    di_recompute_runner *r = calloc(1, sizeof *r);
    if (!r) return di_error_set(err, DI_ERR_NOMEM, "recompute runner: out of memory");
    r->model = model;
    r->be = be;
    di_idmap_init(&r->hist);
    memset(iface, 0, sizeof *iface);
    iface->ctx = r;
    iface->n_vocab = model->cfg.vocab_size;
    iface->max_context = max_context;
    iface->block_tokens = block_tokens;
    iface->n_blocks = n_blocks;
    iface->forward = rc_forward;
    iface->release = rc_release;
    *out = r;
    return DI_OK;
}

void di_recompute_runner_free(di_recompute_runner *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->hist.cap; i++) {
        di_recompute_hist *h = r->hist.vals[i];
        if (h) free(h->tokens), free(h);
    }
    di_idmap_destroy(&r->hist);
    free(r);
}
