/* The cached model runner behind the public API: one model session (model/session.h) per request,
 * so a decode step costs one position instead of the whole history (the recompute runner's O(T²)).
 *
 * A step is ONE batched forward (di_session_forward_batch): each piece [pos0, pos0 + n) — a decode
 * token or a prefill chunk — is a chunk appended to its request's session, and the token-parallel
 * work of all pieces (every GEMM, the experts, the head) runs once over their concatenated rows, so
 * the weights are read once per step instead of once per request. The scheduler sends a request's
 * pieces in order, so pos0 equals the session's length (checked) — except for a piece that restores a
 * prefix hit, which starts at its replay start on an empty session (below). A release returns the
 * session to a free list (reset, memory kept) for the next request. Chunk boundaries are the request's
 * own (scheduler.h) and every op of the pass is row-wise batch invariant, so a request's logits are
 * bit-identical whatever else shares its step (tests/test_batch_invariance.c). A chunked prefill and token-by-token decode agree
 * with the one-shot prefill within the reference's own noise (model/forward.h), not bit for bit, so
 * after a preemption (recomputed as chunks) a continuation may drift; the recompute runner stays
 * the exact baseline (di_engine_options.runner = "recompute").
 *
 * Cache accounting: with di_session_runner_use_pool (what di_engine_open sets up) the scheduler's
 * blocks are the pages of one paged pool and each session's compressed KV lives in the pages its
 * request holds, so the block budget is the real memory; without it the accounting is nominal, as
 * in the recompute runner, and each session holds a private compact cache for max_context positions.
 *
 * Prefix cache (off unless di_session_runner_enable_prefix): the tree is the scheduler's
 * (scheduler.h, engine/prefix_cache.h); the runner does the two things that need a session. A piece
 * that carries a hit of P tokens (di_step_seq.restore) starts at the replay start r: the session is
 * restored at P from the hit's blocks with an SWA bounded replay of [r, P), and [P, end) runs as
 * usual — P − r + end − P = end − r positions, the piece's own size, which is what the scheduler
 * budgeted. The restore and its replay run before the step's batched forward, which then carries
 * [P, end) with the other pieces. A fill (di_step_fill) exports a computed block of a live request's cache into its tree
 * node. A continuation after a hit is inexact by the replay's bounded error (prefix_cache.h;
 * tests/test_prefix_cache.c), and the blocks it stores carry that error on. The interface's
 * cache_hit hook reports a request's hit (0 without one); the executor calls it on the forward's
 * thread (tests/test_prefix_engine.c).
 *
 * Device logits: on a device backend (CUDA) the runner announces runner.h's device_logits hook. A
 * forward called without host logits then has the head copy each piece's row into one device buffer
 * [rows, V] f32 (di_fwd_opts.logits_on_device), which the executor's GPU sampler reads in place: the
 * rows (0.5 MB each at V = 129,280) never cross to the host. */
#ifndef DI_ENGINE_API_RUNNER_H
#define DI_ENGINE_API_RUNNER_H

#include <stdint.h>

#include "backend/backend.h"
#include "engine/idmap.h"
#include "engine/runner.h"
#include "model/session.h"

typedef struct di_session_runner {
    const di_model *model;
    const di_backend *be;
    int64_t max_context;
    di_idmap live;          /* request id → its session and hit (api_runner.c sr_req) */
    di_session **spare;     /* [n_spare] released sessions, reset, ready for reuse */
    int32_t n_spare, cap_spare;
    int64_t n_sessions;     /* sessions created */
    int64_t n_positions;    /* positions computed (replayed ones included) */
    int64_t n_forwards;     /* forwards run: one per step with pieces (one per piece when serial) */
    /* Run each piece as its own forward, one after another — the behaviour before batching, kept as
     * the baseline of `deepinfer bench engine --runner serial`. Same logits bit for bit. */
    bool serial;
    di_session_chunk *chunks; /* [cap_chunks] the step's chunks (scratch, reused) */
    int32_t cap_chunks;
    /* prefix cache (NULL = off) */
    struct di_prefix_cache *prefix;
    int64_t n_hit_tokens;   /* positions restored from the prefix cache instead of computed */
    int64_t n_replayed;     /* positions re-run by bounded replays (part of n_positions) */
    int64_t n_filled;       /* blocks written into the prefix cache */
    struct di_cache_pool *pool; /* paged caches (NULL: a private cache per session) */
    float *d_logits;        /* [cap_d_rows, V] f32 backend memory: a device step's logits rows */
    struct di_fwd_arena *arena; /* device backends: the passes' persistent scratch (CUDA graphs with DI_CUDA_GRAPHS=1) */
    int32_t cap_d_rows;
} di_session_runner;

/* model and be must outlive the runner. */
int di_session_runner_new(const di_model *model, const di_backend *be, int64_t max_context, int32_t block_tokens,
                          int32_t n_blocks, di_session_runner **out, di_model_runner *iface, di_error *err);
void di_session_runner_free(di_session_runner *r);
/* Turn the prefix cache on (block_tokens ≤ 0 = 64, budget in bytes of stored spans) and announce it in
 * iface (the one di_session_runner_new filled), before a scheduler is built on it. Its keep is the
 * sessions' di_session_replay_keep: W + the config's default margin (di_prefix_default_keep). */
int di_session_runner_enable_prefix(di_session_runner *r, di_model_runner *iface, int32_t block_tokens,
                                    int64_t budget_bytes, di_error *err);
/* Paged caches (model/cache_pool.h): every session takes a fixed slot of one pool of iface->n_blocks
 * pages of iface->block_tokens positions (a multiple of the compress ratios), and the block ids the
 * scheduler hands out (engine/block_pool.h, sent with every piece) are the pages its compressed KV
 * and index keys live in — so the scheduler's block budget is the real memory. n_slots: sessions
 * alive at once (max_seqs, + 1 with the prefix cache). Call before enable_prefix and any forward. */
int di_session_runner_use_pool(di_session_runner *r, const di_model_runner *iface, int32_t n_slots, di_error *err);
/* Tokens of a live request restored from the prefix cache (0: none, −1: unknown request or cache off). */
int64_t di_session_runner_cache_hit(const di_session_runner *r, int64_t req_id);

#endif
