/* A model runner over the real model that keeps no attention cache: every logits row is the last
 * row of one pass over the request's whole history told its prompt's length (prompt rows as the
 * prompt's prefill, generated rows as their decode steps: di_fwd_opts.prompt_end, model/forward.h),
 * i.e. the cached runner's logits bit for bit. O(T²) per request, so only for small models and short
 * sequences — but exact by construction (independent of chunking, batch and preemption) and available
 * before the incremental cache-based forward is. It lets the engine run the tiny checkpoints end to
 * end (test_engine_tiny) and is the baseline the cached runner must agree with.
 *
 * Cache accounting is nominal: blocks of block_tokens positions against n_blocks, so the scheduler's
 * admission and preemption paths run as they would with a real cache. */
#ifndef DI_ENGINE_RECOMPUTE_RUNNER_H
#define DI_ENGINE_RECOMPUTE_RUNNER_H

#include <stdint.h>

#include "backend/backend.h"
#include "engine/idmap.h"
#include "engine/runner.h"
#include "model/weights.h"

typedef struct di_recompute_runner {
    const di_model *model;
    const di_backend *be;
    di_idmap hist;       /* request id → di_recompute_hist* (tokens seen so far) */
    int64_t n_prefills;  /* forward passes run */
    int64_t n_positions; /* positions computed, Σ T over prefills */
} di_recompute_runner;

/* model and be must outlive the runner. max_context: positions per request (<= the model's). */
int di_recompute_runner_new(const di_model *model, const di_backend *be, int64_t max_context, int32_t block_tokens,
                            int32_t n_blocks, di_recompute_runner **out, di_model_runner *iface, di_error *err);
void di_recompute_runner_free(di_recompute_runner *r);

#endif
