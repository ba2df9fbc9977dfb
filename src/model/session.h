/* One sequence of the V4.1 model on one backend: its compact cache (model/cache.h) and the forward
 * over any chunk at the current position (spec model.md §3.0b, §3.11) — a one-chunk prefill, a
 * chunked prefill of any chunk sizes and token-by-token decode are the same causal function and
 * agree within the reference's own noise — exact rollback, and the DSpark draft step (§4.9).
 *
 *   di_session_forward(s, ids, n)   appends positions [len, len+n): every layer reads the window /
 *                                   compressed KV / Engram history of the earlier positions from the
 *                                   cache and writes the chunk's; logits of the last (or every) position
 *   di_session_forward_batch(...)   the same for several sessions in one pass (continuous batching):
 *                                   the weights are read once for all of them, each session's logits
 *                                   bit-identical to its forward alone
 *   di_session_rollback(s, k)       drops the newest k ≤ spec_margin positions; the cache is then
 *                                   byte-identical to never having appended them, so continuing gives
 *                                   identical logits
 *   di_session_draft(s, token)      with DSpark on: drafts block tokens after the newest position, whose
 *                                   main-model output is `token`; the prompt prefill (like every
 *                                   forward) fills the stage windows
 *
 * A failed forward rolls its chunk back when the margin allows (else the session needs a reset).
 * Thread safety: none; distinct sessions are independent (they may share the model and backend only
 * if the backend is used from one thread at a time). */
#ifndef DI_MODEL_SESSION_H
#define DI_MODEL_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "model/cache.h"
#include "model/forward.h"

typedef struct di_session_opts {
    int64_t max_tokens; /* context capacity (positions 0 … max_tokens−1) */
    int spec_margin;    /* deepest exact rollback (cache.h); < 0 = di_cache_default_margin (cache.h) */
    bool dspark;        /* keep the DSpark stage windows (required for di_session_draft) */
    di_cache *cache;    /* a cache to adopt (e.g. from a paged pool, model/cache_pool.h), destroyed with the
                           session even when creation fails; NULL = its own for max_tokens */
} di_session_opts;

typedef struct di_session {
    const di_model *m;
    const di_backend *be;
    di_cache *cache;
    bool dspark;
    /* A failed forward could not undo its cache extension (a chunk longer than the rollback margin,
     * or a failed rollback on the device): the cache holds positions the caller never got logits
     * for. Every forward / draft / rollback then fails until di_session_reset. */
    bool broken;
} di_session;

int di_session_create(const di_model *m, const di_backend *be, const di_session_opts *opts, di_session **out,
                      di_error *err);
void di_session_destroy(di_session *s);
/* A new sequence in the same memory. */
void di_session_reset(di_session *s);
static inline int64_t di_session_len(const di_session *s) { return di_cache_len(s->cache); }

/* Append ids[0..n) at positions len … len+n−1. logits: f32 [n, V] when all_logits, else f32 [1, V]
 * (the last position); may be NULL. opts: dumps / faults (NULL = none). */
int di_session_forward(di_session *s, const int32_t *ids, int64_t n, bool all_logits, float *logits,
                       const di_fwd_opts *opts, di_error *err);

/* One sequence's part of a batched forward: n ids appended at s's current length; logits as in
 * di_session_forward (f32 [n, V] when all_logits, else f32 [1, V]; NULL = none). window_floor: the
 * chunk's SWA bounded-replay floor (di_fwd_opts.window_floor; 0 = none). prompt_end: see
 * di_fwd_opts.prompt_end — set it to the prompt's length on every chunk of a request (prefill chunks,
 * verify blocks, recomputes). A chunk that crosses the prompt's end while the prompt is shorter than
 * the window runs as two passes (its prompt part with the batch, the rest after it): one window
 * layout per pass. */
typedef struct di_session_chunk {
    di_session *s;
    const int32_t *ids; /* int32 [n] */
    int64_t n;
    bool all_logits;
    float *logits;
    int64_t window_floor;
    int64_t prompt_end; /* the request's prompt length (di_fwd_opts.prompt_end; 0 = the chunk's end) */
} di_session_chunk;

/* Batched forward (continuous batching): every chunk appended to its own session in ONE pass. The
 * token-parallel work (embedding, Engram, mHC, norms, every projection GEMM, router and the experts
 * grouped over all rows, the head) runs once over the concatenated rows of all chunks, so each weight
 * is read once per step; cache reads and writes, compressor pooling and the sparse attention run once
 * for all sequences (batched slots where the backend has them); window lists per sequence; indexer,
 * candidate mask, top-k and gathers in one call per layer where the backend has the batched slots.
 * Every backend op is row-wise batch invariant, so each chunk's logits (and cache) are bit-identical to its di_session_forward alone, whatever the other
 * chunks (tests/test_forward_batch.c). Chunks may mix decode steps, prefill chunks and DSpark verify
 * blocks (a session with DSpark on gets its stage windows written). The sessions must be distinct and
 * share the model and backend. opts: dumps / faults (NULL = none); opts->window_floor must be 0 (the
 * floor is per chunk). On failure every chunk is rolled back where the margin allows; a session whose
 * chunk cannot be rolled back is marked broken (see di_session.broken). */
int di_session_forward_batch(const di_session_chunk *chunks, int n_chunks, const di_fwd_opts *opts, di_error *err);

/* Drop the newest k positions exactly (k ≤ di_cache_rollback_limit). */
int di_session_rollback(di_session *s, int64_t k, di_error *err);

/* DSpark draft after the newest position i = len−1 (len ≥ 1, DSpark on): token = the main model's
 * output at i (it feeds draft slot 0). ids int32 [block+1] (ids[0] = token, then the drafts for
 * positions i+2 …), conf f32 [block] raw confidence logits, logits f32 [block, V] with the Markov bias
 * (may be NULL). sample NULL = greedy. opts: dumps / faults (NULL = none). */
int di_session_draft(di_session *s, int32_t token, di_sample_fn sample, void *sample_ctx, int32_t *ids, float *conf,
                     float *logits, const di_fwd_opts *opts, di_error *err);

/* ---- prefix reuse with SWA bounded replay (deepinfer-features §11; engine/prefix_cache.h) ----
 * The replay length: keep = W + spec_margin. The W + m ring slots of every window are then all
 * rebuilt, so a sequence resumed at the boundary keeps its full rollback depth m (a replay of only
 * W tokens would serve the next query but not a rollback). With the default margin the released
 * config gives 128 + 12 = 140, DeepInfer's documented default (cache.h di_cache_default_margin). */
static inline int64_t di_session_replay_keep(const di_session *s) {
    return (int64_t)s->cache->window + s->cache->spec_margin;
}

/* Resume this session (its old sequence is dropped) at the prefix boundary B = span_end[n_spans−1]
 * of ids[0..B): the compressed KV / index keys of [0, B) come from the spans (di_cache_prefix_export
 * blobs of [span_end[i−1], span_end[i]), span_end[−1] = 0), the Engram history from the ids, and the
 * window rings from a replay of ids[r, B) with r = B − keep rounded down to the cache's alignment
 * (≥ 0). The replayed queries see no window position below r (the forward's window_floor at the
 * cache's floor) and their compressed entries are not rewritten, so the result
 * differs from a full prefill only through the truncated windows of the first replayed positions
 * (inexact by design; with r = 0 it is a plain prefill of [0, B) with the entries already present).
 * keep ≥ W (< 0: di_session_replay_keep). logits (may be NULL): f32 [1, V] of position B−1 from the
 * replay. Afterwards the session is at length B; continue with di_session_forward. On failure the
 * session is left empty (reset). */
int di_session_prefix_restore(di_session *s, const int32_t *ids, int64_t keep, const uint8_t *const *spans,
                              const int64_t *span_end, int n_spans, float *logits, const di_fwd_opts *opts,
                              di_error *err);

#endif
