/* One sequence: a generation request as the engine sees it — its tokens, its place in the cache,
 * and its stop conditions.
 *
 * Lifecycle: WAITING (queued, holds no cache) → RUNNING (admitted: prefill chunks, then one decode
 * token per step) → FINISHED. Preemption sends a RUNNING request back to WAITING with its cache
 * freed (recompute policy, scheduler.h). Cancellation finishes it from any state.
 *
 * Token accounting. The sequence is prompt ++ out ++ pending, of length L (di_seq_len):
 *   out      sampled tokens the host has seen (stop checks done on them)
 *   pending  sampled tokens still with the worker (async mode: at most one, seen a step later)
 *   n_cached positions already sent through the model (their cache entries exist or are being
 *            written by the step in flight); the next piece covers [n_cached, …)
 * A piece that reaches L samples the token at position L.
 *
 * Two views of the output, so the host and the worker never share a mutable array:
 *   out / text   host side: appended when results are processed; stop checks, streaming
 *   dev_out      worker side: appended at sampling time; the next step's input token and the
 *                penalty history come from here (sampled ids stay with the runner)
 * dev_out[0..n_out) always equals out[0..n_out). */
#ifndef DI_ENGINE_SEQUENCE_H
#define DI_ENGINE_SEQUENCE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/prefix_cache.h"
#include "engine/sampler.h"

typedef enum di_req_state { DI_REQ_WAITING = 0, DI_REQ_RUNNING = 1, DI_REQ_FINISHED = 2 } di_req_state;

/* di_finish_reason and di_token_logprobs are public (include/deepinfer.h). */

/* Structured-output hook (the grammar matcher, src/grammar/grammar.h, plugs in here). Called on the
 * worker thread only, once per sampled token, in sampling order. */
typedef struct di_constraint {
    void *ctx;
    /* mask: [ceil(n_vocab/32)] uint32, fully overwritten; bit t set = token t allowed */
    int (*fill_mask)(void *ctx, uint32_t *mask, di_error *err);
    int (*accept)(void *ctx, int32_t token, di_error *err);
    /* The engine is done with ctx: called once, on the host thread, when a request that was added
     * successfully is forgotten (polled finished and out of flight, or the core is freed). May be
     * NULL. If di_core_add fails, the caller still owns ctx. */
    void (*release)(void *ctx);
} di_constraint;

/* Detokenizer: the raw bytes of one token (byte-level BPE: may be part of a UTF-8 character).
 * Returns the byte count (may exceed cap: then call again with a bigger buffer), or < 0 on error. */
typedef int (*di_detok_fn)(void *ctx, int32_t token, char *buf, size_t cap);

#define DI_REQUEST_MAX_STOP 16
#define DI_REQUEST_MAX_STOP_LEN 256

typedef struct di_seq_params {
    di_sampling_params sampling; /* logit_bias is copied */
    int64_t max_tokens;          /* >= 1 */
    const int32_t *stop_ids;     /* [n_stop_ids], copied */
    int32_t n_stop_ids;
    const char *const *stop;     /* [n_stop] NUL-terminated stop strings (1..256 bytes), copied */
    int32_t n_stop;
    int32_t ignore_eos;          /* EOS ids do not stop (benchmarks) */
    int32_t prefill_chunk;       /* tokens per prefill chunk; 0 = the engine's default */
    uint32_t choice;             /* index among parallel samples (RNG counter word) */
    di_constraint *constraint;   /* NULL: unconstrained; borrowed, must outlive the request */
} di_seq_params;

typedef struct di_seq {
    int64_t id;
    uint64_t arrival;            /* admission order, for FIFO fairness */
    di_req_state state;
    di_finish_reason finish;
    di_seq_params params;    /* owned copies of the arrays */
    char **stop_copy;            /* [n_stop] owned stop strings */
    size_t max_stop_len;
    int32_t chunk;               /* resolved prefill chunk */

    int32_t *prompt;             /* [n_prompt] int32 */
    int64_t n_prompt;

    /* host view */
    int32_t *out;                /* [cap_out] int32; [0, n_out) valid */
    di_token_logprobs *out_lp;   /* [cap_out] when params.sampling.logprobs, else NULL */
    int64_t n_out, cap_out;
    int64_t n_pending;           /* sampled, not yet seen by the host */
    int64_t n_cached;            /* positions sent through the model */
    int32_t *blocks;             /* [cap_blocks] int32 block table; [0, n_blocks) held */
    int32_t n_blocks, cap_blocks;
    int32_t inflight;            /* steps in flight that contain this request */
    int32_t cancel_requested;
    int32_t preemptions;
    int64_t cache_hit;           /* deepest prefix-cache hit the runner reported (copied from step results) */
    /* prefix cache (scheduler.c; all zero without one) */
    di_prefix_hit prefix_hit;    /* matched at admission, pinned until the step that restores it is done */
    di_prefix_node *prefix_tail; /* deepest tree node of this request's sequence (pinned; NULL = root) */
    int64_t prefix_blocks;       /* blocks of the sequence on that path: [0, prefix_blocks · block) */
    char *text;                  /* [cap_text] detokenized output, cut at a stop string */
    size_t n_text, cap_text;
    int64_t n_out_emitted;       /* streaming cursors */
    size_t n_text_emitted;
    int32_t finish_reported;
    int32_t dirty;               /* on the engine's list of requests with news for the next poll */
    int32_t stop_token;          /* the EOS / stop id that finished it, else -1 */
    di_error error;              /* for DI_FINISH_REASON_ERROR */

    /* worker view */
    int32_t *dev_out;            /* [cap_dev_out] int32 */
    int64_t n_dev_out, cap_dev_out;
} di_seq;

/* Validates and copies. n_prompt >= 1. */
int di_seq_new(int64_t id, const int32_t *prompt, int64_t n_prompt, const di_seq_params *params,
                   int32_t n_vocab, di_seq **out, di_error *err);
void di_seq_free(di_seq *r);

static inline int64_t di_seq_len(const di_seq *r) { return r->n_prompt + r->n_out + r->n_pending; }

/* Host side: one sampled token arrives. Appends it (and its logprobs), detokenizes, and applies the
 * stop conditions in this order: EOS (unless ignore_eos) or a stop id → STOP (the token is kept in
 * `out`, adds no text); a stop string in the text → STOP, text cut where the match begins; max_tokens
 * or the context limit → LENGTH. Sets r->finish; returns a status (detokenizer / memory errors). */
int di_seq_on_token(di_seq *r, int32_t token, const di_sample_result *res, const int32_t *eos_ids,
                        int32_t n_eos, int64_t max_context, di_detok_fn detok, void *detok_ctx, di_error *err);

/* Bytes of text that may be streamed now: while unfinished, hold back any tail that could still grow
 * into a stop string and an incomplete UTF-8 sequence at the end. */
size_t di_seq_text_ready(const di_seq *r);

/* Worker side: append a sampled id to dev_out. */
int di_seq_dev_push(di_seq *r, int32_t token);

/* Grows the block table to hold n ids. */
int di_seq_reserve_blocks(di_seq *r, int32_t n);

#endif
