/* The cached model runner behind the public API: one model session (model/session.h) per request,
 * so a decode step costs one position instead of the whole history (the recompute runner's O(T²)).
 *
 * A piece [pos0, pos0 + n) is appended to its request's session with di_session_forward; the
 * scheduler sends a request's pieces in order, so pos0 always equals the session's length (checked).
 * A release returns the session to a free list (reset, memory kept) for the next request. Chunk
 * boundaries are the request's own (scheduler.h) and every session is independent of the others, so
 * a request's logits do not depend on the batch. A chunked prefill and token-by-token decode agree
 * with the one-shot prefill within the reference's own noise (model/forward.h), not bit for bit, so
 * after a preemption (recomputed as chunks) a continuation may drift; the recompute runner stays
 * the exact baseline (di_engine_options.runner = "recompute").
 *
 * Cache accounting toward the scheduler is nominal (blocks of block_tokens positions), as in the
 * recompute runner: each session holds the compact cache for max_context positions. */
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
    di_idmap live;          /* request id → di_session* */
    di_session **spare;     /* [n_spare] released sessions, reset, ready for reuse */
    int32_t n_spare, cap_spare;
    int64_t n_sessions;     /* sessions created */
    int64_t n_positions;    /* positions computed */
} di_session_runner;

/* model and be must outlive the runner. */
int di_session_runner_new(const di_model *model, const di_backend *be, int64_t max_context, int32_t block_tokens,
                          int32_t n_blocks, di_session_runner **out, di_model_runner *iface, di_error *err);
void di_session_runner_free(di_session_runner *r);

#endif
