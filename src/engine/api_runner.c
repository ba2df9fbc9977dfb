/* Cached model runner over model sessions (see api_runner.h). */
#include "engine/api_runner.h"

#include <stdlib.h>
#include <string.h>

#include "engine/prefix_cache.h"

/* A request's fed tokens, for matching pieces against the prefix cache and storing its blocks at
 * release. */
typedef struct sr_fed {
    int32_t *ids; /* [cap] int32: positions 0 … n−1 */
    int64_t n, cap;
    int64_t hit;  /* deepest prefix hit restored */
    int streak;   /* the last match reached the end of its piece: the next piece may go deeper */
} sr_fed;

static sr_fed *fed_for(di_session_runner *r, int64_t id) {
    sr_fed *f = di_idmap_get(&r->fed, id);
    if (f) return f;
    if (!(f = calloc(1, sizeof *f))) return NULL;
    f->streak = 1;
    if (di_idmap_put(&r->fed, id, f)) {
        free(f);
        return NULL;
    }
    return f;
}

static int fed_append(sr_fed *f, const int32_t *ids, int64_t n) {
    if (f->n + n > f->cap) {
        int64_t cap = f->cap ? f->cap : 256;
        while (cap < f->n + n) cap *= 2;
        int32_t *g = realloc(f->ids, sizeof(int32_t) * (size_t)cap);
        if (!g) return -1;
        f->ids = g, f->cap = cap;
    }
    memcpy(f->ids + f->n, ids, sizeof(int32_t) * (size_t)n);
    f->n += n;
    return 0;
}

/* With the prefix cache on, a piece [pos0, end) whose tokens the cached blocks cover to H > pos0 +
 * keep is served by restoring the session at H (bounded replay of keep tokens; what the session had
 * computed is dropped) and running only [H, end). Tried on a request's first piece and, in a chunked
 * prefill, on each next piece while the previous match reached its piece's end (a match stopped by
 * the tree cannot go deeper later). *done = 1 when it ran the piece. The piece's tokens are already
 * in f. */
static int prefix_piece(di_session_runner *r, di_session *s, const di_step_seq *p, float *row, sr_fed *f, int *done,
                        di_error *err) {
    *done = 0;
    if (!f->streak) return DI_OK;
    int64_t end = p->pos0 + p->n_tokens, keep = di_prefix_cache_keep(r->prefix, s);
    int64_t block = di_prefix_cache_block(r->prefix);
    di_prefix_hit hit;
    int rc = di_prefix_cache_match(r->prefix, f->ids, end, keep, &hit, err);
    if (rc) return rc;
    f->streak = hit.matched == (end - 1) / block * block;
    int64_t H = hit.tokens;
    if (H - p->pos0 <= keep) { /* nothing cached, or less than the replay would cost */
        di_prefix_cache_release(r->prefix, &hit);
        return DI_OK;
    }
    int64_t align = di_cache_prefix_align(s->cache);
    int64_t replayed = H - (H - keep > 0 ? (H - keep) / align * align : 0);
    rc = di_prefix_cache_restore(r->prefix, &hit, s, f->ids, keep, NULL, err);
    di_prefix_cache_release(r->prefix, &hit);
    if (!rc) rc = di_session_forward(s, f->ids + H, end - H, false, row, NULL, err);
    if (rc) {
        di_session_reset(s);
        return rc;
    }
    r->n_hit_tokens += H - p->pos0;
    r->n_replayed += replayed;
    r->n_positions += replayed + end - H;
    f->hit = H;
    *done = 1;
    return DI_OK;
}

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
        if (r->prefix) {
            sr_fed *f = fed_for(r, p->req_id);
            if (!f || fed_append(f, p->tokens, p->n_tokens))
                return di_error_set(err, DI_ERR_NOMEM, "session runner: request %lld tokens", (long long)p->req_id);
            int done = 0;
            if ((rc = prefix_piece(r, s, p, row, f, &done, err)))
                return di_error_wrap(err, "session runner: request %lld prefix hit", (long long)p->req_id);
            if (done) continue;
        }
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
    sr_fed *f = di_idmap_get(&r->fed, id);
    if (f) {
        /* store its blocks; failure only means they are not cached */
        di_error ignored;
        int64_t n = f->n < di_session_len(s) ? f->n : di_session_len(s);
        di_prefix_cache_insert(r->prefix, f->ids, n, s->cache, NULL, &ignored);
        di_idmap_del(&r->fed, id);
        free(f->ids);
        free(f);
    }
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

static int64_t sr_cache_hit(void *ctx, int64_t req_id) {
    int64_t hit = di_session_runner_cache_hit(ctx, req_id);
    return hit > 0 ? hit : 0;
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
    di_idmap_init(&r->fed);
    memset(iface, 0, sizeof *iface);
    iface->ctx = r;
    iface->n_vocab = model->cfg.vocab_size;
    iface->max_context = max_context;
    iface->block_tokens = block_tokens;
    iface->n_blocks = n_blocks;
    iface->forward = sr_forward;
    iface->release = sr_release;
    iface->cache_hit = sr_cache_hit;
    *out = r;
    return DI_OK;
}

void di_session_runner_free(di_session_runner *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->live.cap; i++) di_session_destroy(r->live.vals[i]);
    for (int32_t i = 0; i < r->n_spare; i++) di_session_destroy(r->spare[i]);
    free(r->spare);
    di_idmap_destroy(&r->live);
    for (int64_t i = 0; i < r->fed.cap; i++) {
        sr_fed *f = r->fed.vals[i];
        if (f) free(f->ids), free(f);
    }
    di_idmap_destroy(&r->fed);
    di_prefix_cache_destroy(r->prefix);
    free(r);
}

int di_session_runner_enable_prefix(di_session_runner *r, int32_t block_tokens, int64_t budget_bytes, di_error *err) {
    if (r->prefix) return DI_OK;
    di_prefix_cache_opts o = {.block_tokens = block_tokens > 0 ? block_tokens : DI_PREFIX_BLOCK_DEFAULT,
                              .budget_bytes = budget_bytes};
    return di_prefix_cache_create(&o, &r->prefix, err);
}

int64_t di_session_runner_cache_hit(const di_session_runner *r, int64_t req_id) {
    if (!r->prefix) return -1;
    const sr_fed *f = di_idmap_get(&r->fed, req_id);
    return f ? f->hit : -1;
}
