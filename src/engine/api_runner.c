/* Cached model runner over model sessions (see api_runner.h). */
#include "engine/api_runner.h"

#include <stdlib.h>
#include <string.h>

static int session_for(di_session_runner *r, int64_t id, di_session **out, di_error *err) {
    *out = di_idmap_get(&r->live, id);
    if (*out) return DI_OK;
    di_session *s = NULL;
    if (r->n_spare) {
        s = r->spare[--r->n_spare];
    } else {
        di_session_opts so = {.max_tokens = r->max_context, .spec_margin = -1, .dspark = false};
        int rc = di_session_create(r->model, r->be, &so, &s, err);
        if (rc) return di_error_wrap(err, "session runner: request %lld", (long long)id);
        r->n_sessions++;
    }
    if (di_idmap_put(&r->live, id, s)) {
        di_session_destroy(s);
        return di_error_set(err, DI_ERR_NOMEM, "session runner: out of memory for request %lld", (long long)id);
    }
    *out = s;
    return DI_OK;
}

static int sr_forward(void *ctx, const di_step_batch *b, float *logits, di_error *err) {
    di_session_runner *r = ctx;
    const size_t V = (size_t)r->model->cfg.vocab_size;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_step_seq *p = &b->seqs[i];
        di_session *s;
        int rc = session_for(r, p->req_id, &s, err);
        if (rc) return rc;
        if (p->pos0 != di_session_len(s))
            return di_error_set(err, DI_ERR_INTERNAL, "session runner: request %lld piece starts at %lld, session holds %lld",
                                (long long)p->req_id, (long long)p->pos0, (long long)di_session_len(s));
        float *row = p->logits_row >= 0 ? logits + (size_t)p->logits_row * V : NULL; /* f32 [V] */
        rc = di_session_forward(s, p->tokens, p->n_tokens, false, row, NULL, err);
        if (rc)
            return di_error_wrap(err, "session runner: request %lld, positions [%lld, %lld)", (long long)p->req_id,
                                 (long long)p->pos0, (long long)(p->pos0 + p->n_tokens));
        r->n_positions += p->n_tokens;
    }
    return DI_OK;
}

static void sr_release(void *ctx, int64_t id) {
    di_session_runner *r = ctx;
    di_session *s = di_idmap_get(&r->live, id);
    if (!s) return;
    di_idmap_del(&r->live, id);
    if (r->n_spare == r->cap_spare) {
        int32_t cap = r->cap_spare ? 2 * r->cap_spare : 8;
        di_session **g = realloc(r->spare, (size_t)cap * sizeof *g);
        if (!g) {
            di_session_destroy(s); /* no room to keep it: the next request allocates anew */
            return;
        }
        r->spare = g;
        r->cap_spare = cap;
    }
    di_session_reset(s);
    r->spare[r->n_spare++] = s;
}

int di_session_runner_new(const di_model *model, const di_backend *be, int64_t max_context, int32_t block_tokens,
                          int32_t n_blocks, di_session_runner **out, di_model_runner *iface, di_error *err) {
    *out = NULL;
    if (max_context < 2 || block_tokens < 1 || n_blocks < 1)
        return di_error_set(err, DI_ERR_INVALID, "session runner: context %lld, %d blocks of %d", (long long)max_context,
                            n_blocks, block_tokens);
    di_session_runner *r = calloc(1, sizeof *r);
    if (!r) return di_error_set(err, DI_ERR_NOMEM, "session runner: out of memory");
    r->model = model;
    r->be = be;
    r->max_context = max_context;
    di_idmap_init(&r->live);
    memset(iface, 0, sizeof *iface);
    iface->ctx = r;
    iface->n_vocab = model->cfg.vocab_size;
    iface->max_context = max_context;
    iface->block_tokens = block_tokens;
    iface->n_blocks = n_blocks;
    iface->forward = sr_forward;
    iface->release = sr_release;
    *out = r;
    return DI_OK;
}

void di_session_runner_free(di_session_runner *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->live.cap; i++) di_session_destroy(r->live.vals[i]);
    for (int32_t i = 0; i < r->n_spare; i++) di_session_destroy(r->spare[i]);
    free(r->spare);
    di_idmap_destroy(&r->live);
    free(r);
}
