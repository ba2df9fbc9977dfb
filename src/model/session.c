/* Per-sequence forward, rollback and DSpark drafts over the compact cache. See session.h. */
#include "model/session.h"

#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"
#include "util/error.h"

int di_session_create(const di_model *m, const di_backend *be, const di_session_opts *opts, di_session **out,
                      di_error *err) {
    int rc = DI_OK;
    if (!opts || (opts->max_tokens < 1 && !opts->cache))
        rc = di_error_set(err, DI_ERR_INVALID, "session: max_tokens %lld (need ≥ 1)",
                          (long long)(opts ? opts->max_tokens : 0));
    else if (opts->dspark && m->cfg.n_dspark <= 0)
        rc = di_error_set(err, DI_ERR_INVALID, "session: DSpark requested but the model has no draft stages");
    di_session *s = rc ? NULL : calloc(1, sizeof *s);
    if (!rc && !s) rc = di_error_set(err, DI_ERR_NOMEM, "session");
    if (rc) {
        if (opts) di_cache_destroy(opts->cache); /* adopted: ours to release on every path */
        return rc;
    }
    if (opts->cache) {
        s->cache = opts->cache;
    } else {
        di_cache_opts co = {.max_tokens = opts->max_tokens, .be = be,
                            .spec_margin = opts->spec_margin < 0 ? di_cache_default_margin(&m->cfg) : opts->spec_margin};
        if ((rc = di_cache_create(&m->cfg, &co, &s->cache, err))) {
            free(s);
            return rc;
        }
    }
    s->m = m, s->be = be, s->dspark = opts->dspark;
    *out = s;
    return DI_OK;
}

void di_session_destroy(di_session *s) {
    if (!s) return;
    di_cache_destroy(s->cache);
    free(s);
}

void di_session_reset(di_session *s) { s->broken = di_cache_reset(s->cache) != DI_OK; }

/* Undo the di_cache_extend of chunks[0..n) where the margin allows; a session it cannot undo is
 * marked broken, so it fails loudly instead of continuing from positions nobody computed. */
static void unwind(const di_session_chunk *chunks, int n) {
    for (int i = 0; i < n; i++) {
        di_cache *c = chunks[i].s->cache;
        di_error ignored;
        if (chunks[i].n > di_cache_rollback_limit(c) || di_cache_rollback(c, chunks[i].n, &ignored))
            chunks[i].s->broken = true;
    }
}

static int broken_error(const di_session *s, di_error *err) {
    return di_error_set(err, DI_ERR_INVALID,
                        "session: an earlier failed forward left this sequence's cache at %lld positions it could not "
                        "roll back; reset the session",
                        (long long)di_cache_len(s->cache));
}

/* One batched pass over chunks[0..n_chunks) (di_session_forward_batch). */
static int forward_pass(const di_session_chunk *chunks, int n_chunks, const di_fwd_opts *opts, di_error *err) {
    const di_session *s0 = chunks[0].s;
    const di_config *cfg = &s0->m->cfg;
    fwd_chunk *ck = calloc((size_t)n_chunks, sizeof *ck); /* [n_chunks] */
    if (!ck) return di_error_set(err, DI_ERR_NOMEM, "session batch: %d chunks", n_chunks);
    bool dspark = false;
    int rc = DI_OK;
    for (int i = 0; i < n_chunks && !rc; i++) {
        const di_session_chunk *k = &chunks[i];
        if (!k->s || k->s->m != s0->m || k->s->be != s0->be)
            rc = di_error_set(err, DI_ERR_INVALID, "session batch: chunk %d: %s", i,
                              k->s ? "its session runs another model or backend" : "no session");
        else if (!k->ids)
            rc = di_error_set(err, DI_ERR_INVALID, "session batch: chunk %d: no ids", i);
        else if (k->s->broken)
            rc = broken_error(k->s, err);
        ck[i] = (fwd_chunk){.cache = k->s ? k->s->cache : NULL, .s0 = k->s ? di_cache_len(k->s->cache) : 0, .T = k->n,
                            .ids = k->ids, .window_floor = k->window_floor, .prompt_end = k->prompt_end,
                            .dspark = k->s && k->s->dspark, .all_logits = k->all_logits, .logits = k->logits};
        dspark = dspark || ck[i].dspark;
    }
    fwd_ctx c;
    memset(&c, 0, sizeof c);
    if (!rc) rc = fwd_ctx_init(&c, s0->m, s0->be, ck, n_chunks, opts, err); /* checks sizes, ids, distinct caches */
    if (!rc && dspark) {
        c.main_hidden = fwd_alloc(&c, sizeof(uint16_t) * (size_t)(c.T * cfg->n_dspark_target_layer_ids * cfg->hidden_size), 1);
        if (!c.main_hidden) rc = err->code;
    }
    int extended = 0;
    while (!rc && extended < n_chunks) {
        rc = di_cache_extend(ck[extended].cache, ck[extended].T, err);
        if (!rc) extended++;
    }
    if (!rc) rc = fwd_backbone(&c);
    if (!rc && dspark) rc = fwd_dspark_fill(&c);
    if (rc) unwind(chunks, extended); /* leave the sequences as they were */
    fwd_ctx_free(&c);
    free(ck);
    return rc;
}

/* The window layout is one per chunk (forward.c window_lists): prompt rows take the one-shot
 * prefill's, min(W, prompt) entries, rows past the prompt the decode step's, W entries. They differ
 * while the prompt is shorter than W, so a chunk that crosses such a prompt's end runs as two passes —
 * the prompt part with the batch, the rest after it — and every row keeps its own layout. Rare (the
 * engine's recompute pieces end at the prompt's end, scheduler.c); the weights are read twice then. */
static int64_t prompt_part(const di_session_chunk *k) {
    if (!k->s || k->s->broken) return 0;
    int64_t len = di_cache_len(k->s->cache), pe = k->prompt_end;
    return pe > len && pe < len + k->n && pe < k->s->m->cfg.sliding_window ? pe - len : 0;
}

int di_session_forward_batch(const di_session_chunk *chunks, int n_chunks, const di_fwd_opts *opts, di_error *err) {
    di_error local_err; /* the pass reports through err->code: never NULL inside */
    if (!err) err = &local_err;
    if (n_chunks < 1 || !chunks) return di_error_set(err, DI_ERR_INVALID, "session batch: %d chunks", n_chunks);
    if (n_chunks > 1 && opts && (opts->window_floor || opts->prompt_end))
        return di_error_set(err, DI_ERR_INVALID, "session batch: window_floor and prompt_end are per chunk (%d chunks)",
                            n_chunks);
    int n_split = 0;
    for (int i = 0; i < n_chunks; i++) n_split += prompt_part(&chunks[i]) > 0;
    if (!n_split) return forward_pass(chunks, n_chunks, opts, err);

    di_session_chunk *head = malloc(sizeof *head * (size_t)n_chunks), *tail = malloc(sizeof *tail * (size_t)n_split);
    int rc = head && tail ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "session batch: %d chunks", n_chunks);
    int n_tail = 0;
    for (int i = 0; !rc && i < n_chunks; i++) {
        const di_session_chunk *k = &chunks[i];
        int64_t h = prompt_part(k);
        head[i] = *k;
        if (!h) continue;
        const size_t V = (size_t)k->s->m->cfg.vocab_size;
        head[i].n = h, head[i].logits = k->all_logits ? k->logits : NULL;
        tail[n_tail++] = (di_session_chunk){.s = k->s, .ids = k->ids + h, .n = k->n - h, .all_logits = k->all_logits,
                                            .logits = k->logits && k->all_logits ? k->logits + (size_t)h * V : k->logits,
                                            .window_floor = k->window_floor, .prompt_end = k->prompt_end};
    }
    if (!rc) rc = forward_pass(head, n_chunks, opts, err);
    if (!rc && (rc = forward_pass(tail, n_tail, opts, err)))
        unwind(head, n_chunks); /* the tails are unwound: the first pass goes too, as for one pass */
    free(head), free(tail);
    return rc;
}

int di_session_forward(di_session *s, const int32_t *ids, int64_t n, bool all_logits, float *logits,
                       const di_fwd_opts *opts, di_error *err) {
    di_session_chunk k = {.s = s, .ids = ids, .n = n, .all_logits = all_logits, .logits = logits,
                          .window_floor = opts ? opts->window_floor : 0, .prompt_end = opts ? opts->prompt_end : 0};
    return di_session_forward_batch(&k, 1, opts, err);
}

int di_session_rollback(di_session *s, int64_t k, di_error *err) {
    if (s->broken) return broken_error(s, err);
    int rc = di_cache_rollback(s->cache, k, err);
    if (rc && rc != DI_ERR_INVALID && rc != DI_ERR_LIMIT) s->broken = true; /* a device failure midway */
    return rc;
}

int di_session_draft(di_session *s, int32_t token, di_sample_fn sample, void *sample_ctx, int32_t *ids, float *conf,
                     float *logits, const di_fwd_opts *opts, di_error *err) {
    di_error local_err;
    if (!err) err = &local_err;
    if (!s->dspark) return di_error_set(err, DI_ERR_INVALID, "session: DSpark is off for this sequence");
    if (s->broken) return broken_error(s, err);
    int64_t len = di_cache_len(s->cache);
    if (len < 1) return di_error_set(err, DI_ERR_INVALID, "session: draft before any token");
    fwd_ctx c;
    int rc = fwd_ctx_init1(&c, s->m, s->be, s->cache, len, NULL, s->m->cfg.dspark_block_size, opts, err);
    if (!rc) rc = fwd_dspark_draft(&c, token, sample, sample_ctx, ids, conf, logits);
    fwd_ctx_free(&c);
    return rc;
}

int di_session_prefix_restore(di_session *s, const int32_t *ids, int64_t keep, const uint8_t *const *spans,
                              const int64_t *span_end, int n_spans, float *logits, const di_fwd_opts *opts,
                              di_error *err) {
    di_error local_err;
    if (!err) err = &local_err;
    di_cache *c = s->cache;
    if (keep < 0) keep = di_session_replay_keep(s);
    if (n_spans < 1 || span_end[n_spans - 1] < 1 || keep < c->window)
        return di_error_set(err, DI_ERR_INVALID,
                            "session prefix restore: %d spans, keep %lld (need >= 1 non-empty span, keep >= %d)", n_spans,
                            (long long)keep, c->window);
    int64_t B = span_end[n_spans - 1], align = di_cache_prefix_align(c);
    int64_t r = B - keep > 0 ? (B - keep) / align * align : 0;
    int rc = di_cache_prefix_begin(c, B, r, err);
    for (int i = 0; !rc && i < n_spans; i++) {
        int64_t t0 = i ? span_end[i - 1] : 0;
        rc = di_cache_prefix_import(c, t0, span_end[i], spans[i], di_cache_prefix_span_bytes(c, t0, span_end[i]), err);
    }
    /* the Engram n-gram history is a function of the token ids: exact without any stored state */
    const di_engram_consts *eg = &s->m->eg;
    for (int64_t p = r - c->engram_hist > 0 ? r - c->engram_hist : 0; !rc && c->engram_slots && p < r; p++) {
        if (!eg->token_map || ids[p] < 0 || ids[p] >= eg->token_map_len)
            rc = di_error_set(err, DI_ERR_INVALID, "session prefix restore: token %d at position %lld (vocabulary of %lld)",
                              ids[p], (long long)p, (long long)eg->token_map_len);
        else
            rc = di_cache_engram_put(c, p, eg->token_map[ids[p]], err);
    }
    if (rc) {
        di_cache_reset(c);
        return rc;
    }
    di_fwd_opts ro = opts ? *opts : (di_fwd_opts){0};
    ro.window_floor = r; /* the replay chunk starts at the floor: no window below r */
    rc = di_session_forward(s, ids + r, B - r, false, logits, &ro, err);
    if (rc) di_cache_reset(c);
    return rc;
}
