/* The engine's view of the model: one forward over a step batch, and cache bookkeeping hooks.
 *
 * Nothing below this interface knows about requests, sampling or stop conditions; nothing above it
 * knows about layers or kernels. A step batch is a list of sequence pieces — a prefill chunk or a
 * single decode token — each with the positions it covers and the block table its cache lives in.
 * The forward writes the pieces' cache entries and returns one logits row for every piece that asks
 * for one (its last position).
 *
 * Threading: forward and release are called from one thread at a time (the engine's worker thread
 * in async mode), always in step order; a release is delivered before the forward of the step that
 * follows it, so a runner never sees a block id reused while an older step still writes it.
 *
 * Batch invariance contract (issue 7 item 5): a piece's logits row must be a function of the
 * request's tokens and of its own chunk boundaries only — never of the other pieces in the batch,
 * their number, or its row index. The scheduler keeps chunk boundaries a function of the request
 * alone (scheduler.h); the runner's kernels keep every reduction per row. */
#ifndef DI_ENGINE_RUNNER_H
#define DI_ENGINE_RUNNER_H

#include <stdint.h>

#include "util/error.h"

struct di_prefix_cache; /* engine/prefix_cache.h */
struct di_prefix_node;
struct di_prefix_hit;

typedef struct di_step_seq {
    int64_t req_id;
    int64_t pos0;          /* position of tokens[0] in the request's sequence */
    int32_t n_tokens;      /* >= 1 */
    const int32_t *tokens; /* [n_tokens] int32 input ids */
    int64_t n_prompt;      /* the request's prompt length: a prefill piece's selections span the whole
                            * prompt, so the budget's chunking changes no bit (di_session_chunk.prompt_end);
                            * 0 = unknown (the piece's own end) */
    const int32_t *blocks; /* [n_blocks] int32 block table; covers positions [0, pos0 + n_tokens) */
    int32_t n_blocks;
    int32_t logits_row;    /* row of `logits` for position pos0 + n_tokens − 1, or −1: no logits */
    int32_t fed_back;      /* tokens[0] is the token sampled for this request by the previous step.
                            * The executor fills it in from its own copy; a runner that samples on the
                            * device may read its device copy instead and skip the host round trip */
    /* Prefix-cache hit (NULL: none). The request resumes at P = restore->tokens from these pinned
     * blocks: the runner replays [pos0, P) (pos0 is the replay start, di_prefix_replay_start) to
     * rebuild the windows, then runs [P, pos0 + n_tokens) as usual. restore_ids: the request's ids
     * [0, P) (the replay's Engram history reaches below pos0). The piece's cost is its n_tokens. */
    const struct di_prefix_hit *restore;
    const int32_t *restore_ids;
} di_step_seq;

/* A prefix-cache block to write from a request's computed cache: positions [t0, t0 + block). */
typedef struct di_step_fill {
    int64_t req_id;
    int64_t t0;
    struct di_prefix_node *node; /* pending, pinned until the step's result is processed */
} di_step_fill;

typedef struct di_step_batch {
    uint64_t step;         /* engine step number, for logs */
    int32_t n_seqs;
    const di_step_seq *seqs; /* [n_seqs] */
    int64_t n_tokens;      /* Σ n_tokens */
    int32_t n_logits_rows;
} di_step_batch;

typedef struct di_model_runner {
    void *ctx;
    int32_t n_vocab;
    int64_t max_context;   /* positions a sequence may occupy */
    int32_t block_tokens;  /* positions per cache block */
    int32_t n_blocks;      /* cache capacity in blocks (the budget the scheduler admits against) */
    /* Blocks a sequence of n_tokens positions holds. NULL: ceil(n_tokens / block_tokens). A runner
     * whose caches do not grow linearly (sliding-window KV) says so here. */
    int32_t (*blocks_for_tokens)(void *ctx, int64_t n_tokens);
    /* logits: [batch->n_logits_rows, n_vocab] f32, row r for the piece whose logits_row is r. NULL
     * (only when device_logits is set): leave the rows in device memory instead. */
    int (*forward)(void *ctx, const di_step_batch *batch, float *logits, di_error *err);
    /* The logits rows of the last forward called with logits == NULL: [n_logits_rows, n_vocab] f32 in
     * device memory, valid until the next forward; *stream is the cudaStream_t they are ordered on.
     * NULL: the runner's model is on the host, forward always fills host logits. Set by a runner on
     * the CUDA backend, so the executor samples on the GPU (executor.h) and the rows never cross to
     * the host. */
    const float *(*device_logits)(void *ctx, void **stream);
    /* The request's cache contents are dead (finished, cancelled or preempted). May be NULL. */
    void (*release)(void *ctx, int64_t req_id);
    /* Positions of the live request served from a prefix cache instead of computed (its deepest hit
     * so far). Called on the forward's thread right after a successful forward, for each request of
     * the batch, so the answer travels back with the step's results and the host never reads the
     * runner's state. NULL: the runner caches no prefixes (always 0). */
    int64_t (*cache_hit)(void *ctx, int64_t req_id);
    /* Prefix cache (NULL: none). The tree belongs to the scheduler's (host) thread; the runner only
     * writes the spans of the blocks it is asked to fill and reads those of the hits it restores
     * (engine/prefix_cache.h). The cache's keep, align and block size are the runner's. */
    struct di_prefix_cache *prefix;
    /* Writes fills[0..n) from the live requests' caches, on the forward's thread, before the
     * step's releases and forward (so a block is filled before any piece restores from it and
     * before its request's cache is dropped). A fill that fails leaves its node unready. */
    void (*prefix_fill)(void *ctx, const di_step_fill *fills, int32_t n);
} di_model_runner;

#endif
