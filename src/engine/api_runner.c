/* Cached model runner over model sessions (see api_runner.h). */
#include "engine/api_runner.h"

#include <stdlib.h>
#include <string.h>

#include "engine/prefix_cache.h"
#include "model/cache_pool.h"

/* The CUDA backend's stream (backend/cuda/cuda_ops.h), linked only into CUDA builds (cuda.mk): a weak
 * reference, NULL in a CPU-only binary (as backend_select.c does for the backend itself). */
extern void *di_backend_cuda_stream(const di_backend *be) __attribute__((weak));

/* A live request: its session and the prefix hit it was restored from (0: none). */
typedef struct sr_req {
    di_session *s;
    int64_t hit;
    bool failed; /* a step it was in failed (its session was reset): the engine fails the request */
} sr_req;

/* A fresh session: a private cache for max_context positions, or (di_session_runner_use_pool) a paged
 * cache in the pool's next slot. The session API builds its own cache, so a pooled session is made
 * with a one-position cache that is swapped for the pool's. */
static int new_session(di_session_runner *r, di_session **out, di_error *err) {
    di_session_opts so = {.max_tokens = r->max_context, .spec_margin = -1, .dspark = false};
    if (r->pool) {
        int rc = di_cache_pool_cache(r->pool, &so.cache, err); /* a slot of the paged pool */
        if (rc) return rc;
    }
    return di_session_create(r->model, r->be, &so, out, err);
}

static int req_for(di_session_runner *r, int64_t id, sr_req **out, di_error *err) {
    *out = di_idmap_get(&r->live, id);
    if (*out) return DI_OK;
    sr_req *q = calloc(1, sizeof *q);
    if (!q) return di_error_set(err, DI_ERR_NOMEM, "session runner: out of memory for request %lld", (long long)id);
    if (r->n_spare) {
        q->s = r->spare[--r->n_spare];
    } else {
        int rc = new_session(r, &q->s, err);
        if (rc) {
            free(q);
            return di_error_wrap(err, "session runner: request %lld", (long long)id);
        }
        r->n_sessions++;
    }
    if (di_idmap_put(&r->live, id, q)) {
        di_session_destroy(q->s);
        free(q);
        return di_error_set(err, DI_ERR_NOMEM, "session runner: out of memory for request %lld", (long long)id);
    }
    *out = q;
    return DI_OK;
}

/* The first part of a piece that starts at the replay start of a prefix hit of P tokens: restore
 * [0, P) (bounded replay of [pos0, P)); the step's batched forward then runs [P, end). A hit whose
 * blocks were never filled (a failed fill) is computed instead — exact, just not saved. The replay is
 * a pass of its own (its session appears again in the step's batch, after it). */
static int restore_prefix(di_session_runner *r, sr_req *q, const di_step_seq *p, di_error *err) {
    const di_prefix_hit *hit = p->restore;
    const int64_t P = hit->tokens, end = p->pos0 + p->n_tokens, keep = di_prefix_cache_keep(r->prefix, q->s);
    const int64_t start = di_prefix_replay_start(P, keep, di_cache_prefix_align(q->s->cache));
    if (di_session_len(q->s) != 0 || p->pos0 != start || P >= end)
        return di_error_set(err, DI_ERR_INTERNAL,
                            "session runner: request %lld restores a %lld-token hit with a piece [%lld, %lld) on a "
                            "session of %lld (expected the replay start %lld and a token past the hit)",
                            (long long)p->req_id, (long long)P, (long long)p->pos0, (long long)end,
                            (long long)di_session_len(q->s), (long long)start);
    int rc;
    if (di_prefix_hit_ready(hit)) {
        rc = di_prefix_cache_restore(r->prefix, hit, q->s, p->restore_ids, keep, NULL, err);
        if (!rc) {
            q->hit = P;
            r->n_hit_tokens += P;
            r->n_replayed += P - start;
            r->n_positions += P - start;
        }
    } else {
        /* in passes no longer than the piece the scheduler budgeted, so a long prompt never becomes one
         * pass of P positions (whose index-score buffers grow as P²/R) */
        const int64_t chunk = p->n_tokens > 0 ? p->n_tokens : 1;
        const di_fwd_opts po = {.prompt_end = p->n_prompt}; /* the passes select as the prompt's prefill */
        rc = DI_OK;
        for (int64_t t = 0; !rc && t < P; t += chunk)
            rc = di_session_forward(q->s, p->restore_ids + t, P - t < chunk ? P - t : chunk, false, NULL, &po, err);
        if (!rc) r->n_positions += P;
    }
    if (rc) di_session_reset(q->s);
    return rc;
}

/* The step's pieces as one batched forward (model/session.h di_session_forward_batch): every piece
 * becomes a chunk of its request's session, so the weights are read once per step whatever the mix
 * of decode tokens and prefill chunks. */
static int sr_forward(void *ctx, const di_step_batch *b, float *logits, di_error *err) {
    di_session_runner *r = ctx;
    const size_t V = (size_t)r->model->cfg.vocab_size;
    if (b->n_seqs < 1) return DI_OK;
    /* no host logits: the rows stay in r->d_logits for the executor's device sampler (sr_device_logits) */
    const bool on_device = logits == NULL;
    if (on_device && b->n_logits_rows > r->cap_d_rows) {
        float *g = r->be->mem_alloc(r->be, (size_t)b->n_logits_rows * V * sizeof *g, err);
        if (!g) return di_error_wrap(err, "session runner: step %llu, device logits [%d, %zu]",
                                     (unsigned long long)b->step, b->n_logits_rows, V);
        r->be->mem_free(r->be, r->d_logits);
        r->d_logits = g, r->cap_d_rows = b->n_logits_rows;
    }
    if (on_device) logits = r->d_logits;
    if (b->n_seqs > r->cap_chunks) {
        di_session_chunk *g = realloc(r->chunks, (size_t)b->n_seqs * sizeof *g);
        if (!g) return di_error_set(err, DI_ERR_NOMEM, "session runner: step %llu of %d pieces",
                                    (unsigned long long)b->step, b->n_seqs);
        r->chunks = g, r->cap_chunks = b->n_seqs;
    }
    int64_t positions = 0;
    int32_t n_ch = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_step_seq *p = &b->seqs[i];
        sr_req *q;
        int rc = req_for(r, p->req_id, &q, err);
        if (rc) return rc;
        if (q->failed) {
            /* planned (async) before its previous step failed: the engine fails the request with that
             * step's result; its piece is dropped here so the step's other requests still run */
            int zrc = DI_OK;
            if (p->logits_row >= 0 && on_device)
                zrc = r->be->mem_set(r->be, logits + (size_t)p->logits_row * V, 0, V * sizeof *logits, err);
            else if (p->logits_row >= 0)
                memset(logits + (size_t)p->logits_row * V, 0, V * sizeof *logits);
            if (zrc) return zrc;
            continue;
        }
        if (r->pool && (rc = di_cache_set_pages(q->s->cache, p->blocks, p->n_blocks, err)))
            return di_error_wrap(err, "session runner: request %lld block table", (long long)p->req_id);
        int64_t skip = 0; /* leading positions of the piece the prefix restore ran */
        if (p->restore) {
            if (!r->prefix)
                return di_error_set(err, DI_ERR_INTERNAL, "session runner: request %lld restores a prefix hit, the "
                                    "prefix cache is off", (long long)p->req_id);
            if ((rc = restore_prefix(r, q, p, err)))
                return di_error_wrap(err, "session runner: request %lld prefix hit", (long long)p->req_id);
            skip = p->restore->tokens - p->pos0;
        } else if (p->pos0 != di_session_len(q->s)) {
            return di_error_set(err, DI_ERR_INTERNAL, "session runner: request %lld piece starts at %lld, session holds %lld",
                                (long long)p->req_id, (long long)p->pos0, (long long)di_session_len(q->s));
        }
        r->chunks[n_ch++] = (di_session_chunk){.s = q->s, .ids = p->tokens + skip, .n = p->n_tokens - skip,
                                               .logits = p->logits_row >= 0 ? logits + (size_t)p->logits_row * V : NULL,
                                               .prompt_end = p->n_prompt};
        positions += p->n_tokens - skip;
    }
    int rc = DI_OK;
    const di_fwd_opts fo = {.logits_on_device = on_device, .arena = r->arena};
    if (!r->serial && n_ch > 0) {
        rc = di_session_forward_batch(r->chunks, n_ch, &fo, err);
        r->n_forwards++;
    }
    for (int32_t i = 0; r->serial && i < n_ch && !rc; i++) {
        rc = di_session_forward_batch(&r->chunks[i], 1, &fo, err);
        r->n_forwards++;
    }
    if (rc) {
        /* the step fails its requests; no fill may export a half-run piece, and pieces of theirs that
         * the scheduler already planned for the next step are dropped (sr_req.failed) */
        for (int32_t i = 0; i < b->n_seqs; i++) {
            sr_req *q = di_idmap_get(&r->live, b->seqs[i].req_id);
            if (!q) continue;
            di_session_reset(q->s);
            q->failed = true;
        }
        return di_error_wrap(err, "session runner: step %llu, one forward over %d pieces (%lld positions; first request %lld)",
                             (unsigned long long)b->step, b->n_seqs, (long long)positions, (long long)b->seqs[0].req_id);
    }
    r->n_positions += positions;
    return DI_OK;
}

/* Blocks are exact to export once computed: the compressed entries of [t0, t0 + block) never change
 * after their positions ran (only windows roll). A missing session (a failed request) leaves the
 * node unready; the scheduler marks it dead. */
static void sr_prefix_fill(void *ctx, const di_step_fill *fills, int32_t n) {
    di_session_runner *r = ctx;
    for (int32_t i = 0; i < n; i++) {
        const sr_req *q = di_idmap_get(&r->live, fills[i].req_id);
        di_error ignored;
        if (q && di_session_len(q->s) >= fills[i].t0 + di_prefix_cache_block(r->prefix) &&
            !di_prefix_cache_fill(r->prefix, fills[i].node, q->s->cache, fills[i].t0, &ignored))
            r->n_filled++;
    }
}

static void sr_release(void *ctx, int64_t id) {
    di_session_runner *r = ctx;
    sr_req *q = di_idmap_get(&r->live, id);
    if (!q) return;
    di_idmap_del(&r->live, id);
    di_session *s = q->s;
    free(q);
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

static const float *sr_device_logits(void *ctx, void **stream) {
    const di_session_runner *r = ctx;
    *stream = di_backend_cuda_stream(r->be);
    return r->d_logits;
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
    memset(iface, 0, sizeof *iface);
    iface->ctx = r;
    iface->n_vocab = model->cfg.vocab_size;
    iface->max_context = max_context;
    iface->block_tokens = block_tokens;
    iface->n_blocks = n_blocks;
    iface->forward = sr_forward;
    iface->release = sr_release;
    iface->cache_hit = sr_cache_hit;
    /* a CUDA backend (the only device backend) keeps the logits on the GPU for the executor's sampler */
    if (!be->host_memory && di_backend_cuda_stream && !strcmp(be->name, "cuda")) iface->device_logits = sr_device_logits;
    /* device backends: one persistent scratch arena for every pass (no per-block allocations; decode
     * passes captured as CUDA graphs when DI_CUDA_GRAPHS=1); the CPU passes allocate per block */
    if (!be->host_memory) {
        int rc = di_fwd_arena_create(be, false, &r->arena, err);
        if (rc) {
            di_idmap_destroy(&r->live);
            free(r);
            return rc;
        }
    }
    *out = r;
    return DI_OK;
}

void di_session_runner_free(di_session_runner *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->live.cap; i++) {
        sr_req *q = r->live.vals[i];
        if (q) di_session_destroy(q->s), free(q);
    }
    for (int32_t i = 0; i < r->n_spare; i++) di_session_destroy(r->spare[i]);
    free(r->spare);
    free(r->chunks);
    di_idmap_destroy(&r->live);
    di_prefix_cache_destroy(r->prefix);
    di_cache_pool_destroy(r->pool); /* after the sessions: their caches live in it */
    if (r->d_logits) r->be->mem_free(r->be, r->d_logits);
    di_fwd_arena_destroy(r->arena);
    free(r);
}

int di_session_runner_enable_prefix(di_session_runner *r, di_model_runner *iface, int32_t block_tokens,
                                    int64_t budget_bytes, di_error *err) {
    if (r->prefix) return DI_OK;
    /* keep, alignment and block bytes are properties of a session's cache: read them off a spare */
    di_session *s;
    int rc = new_session(r, &s, err);
    if (rc) return di_error_wrap(err, "session runner: prefix cache");
    r->n_sessions++;
    const int block = block_tokens > 0 ? block_tokens : DI_PREFIX_BLOCK_DEFAULT, align = di_cache_prefix_align(s->cache);
    di_prefix_cache_opts o = {.block_tokens = block,
                              .budget_bytes = budget_bytes,
                              .keep = di_session_replay_keep(s),
                              .align = align,
                              .block_bytes = di_cache_prefix_span_bytes(s->cache, 0, block)};
    if (block % align)
        rc = di_error_set(err, DI_ERR_INVALID, "session runner: prefix block of %d tokens is not a multiple of the "
                          "compress ratios' lcm %d", block, align);
    if (!rc) rc = di_prefix_cache_create(&o, &r->prefix, err);
    if (!rc && r->n_spare == r->cap_spare) {
        di_session **g = realloc(r->spare, (size_t)(r->cap_spare + 8) * sizeof *g);
        if (g) r->spare = g, r->cap_spare += 8;
    }
    if (r->n_spare < r->cap_spare) r->spare[r->n_spare++] = s;
    else di_session_destroy(s);
    if (rc) return rc;
    iface->prefix = r->prefix;
    iface->prefix_fill = sr_prefix_fill;
    return DI_OK;
}

int64_t di_session_runner_cache_hit(const di_session_runner *r, int64_t req_id) {
    if (!r->prefix) return -1;
    const sr_req *q = di_idmap_get(&r->live, req_id);
    return q ? q->hit : -1;
}

int di_session_runner_use_pool(di_session_runner *r, const di_model_runner *iface, int32_t n_slots, di_error *err) {
    if (r->pool || r->n_sessions)
        return di_error_set(err, DI_ERR_INVALID, "session runner: the cache pool must be set up before any session");
    di_cache_pool_opts po = {.be = r->be, .max_tokens = r->max_context, .spec_margin = -1,
                             .page_tokens = iface->block_tokens, .n_pages = iface->n_blocks, .n_slots = n_slots,
                             .external_pages = 1};
    int rc = di_cache_pool_create(&r->model->cfg, &po, &r->pool, err);
    return rc ? di_error_wrap(err, "session runner: cache pool") : DI_OK;
}
