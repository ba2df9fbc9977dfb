/* Step executor: resolves a plan's input tokens, runs the model's forward and samples — on a worker
 * thread in async mode, inline in sync mode. Everything the next step needs from this one (the
 * sampled ids, the grammar state) stays on the executor's side: the host learns of the tokens only
 * when it collects the result, one step later in async mode.
 *
 * Sampling is per row with the request's own parameters and history (sequence.h: dev_out), so a row's
 * token depends on nothing else in the step. A constraint (grammar) fills its mask right before its
 * row is sampled — after the previous step's token was accepted — and accepts the sampled token.
 * The mask is built here, not on the host while the previous step runs (as issue 7 sketches it),
 * because in async mode the host does not know that step's token yet; on this side it is known as
 * soon as the step starts, so with a sampling pool the masks are filled on the pool's other threads
 * while one of them runs the forward.
 *
 * On the GPU: when the runner keeps its logits in device memory (runner.h device_logits: the session
 * runner on the CUDA backend) and the binary links the CUDA sampler (cuda.mk builds), every step's rows
 * are sampled by one di_cuda_sampler_sample call on the runner's stream — the same tokens and logprob
 * bits as di_sampler_sample (backend/cuda/cuda_sample.h), with every feature: penalties, bias, grammar
 * masks (filled on the host as above, uploaded with the row), raw and processed logprobs — and the
 * [rows, n_vocab] f32 logits never cross to the host. The host sampler remains for host runners (the CPU
 * backend, the recompute runner, mock runners) and with DI_CUDA_SAMPLER=off; DI_CUDA_SAMPLER=require
 * makes di_executor_new fail unless the device path is taken (tests). Speculative decoding's acceptance
 * (DSpark, `deepinfer generate --dspark`) is outside the engine and samples host logits. */
#ifndef DI_ENGINE_EXECUTOR_H
#define DI_ENGINE_EXECUTOR_H

#include <stdint.h>

#include "engine/runner.h"
#include "engine/scheduler.h"

typedef struct di_step_sample {
    di_seq *req;
    int32_t status;          /* DI_OK or the sampling error for this row only */
    di_sample_result res;
    di_error err;            /* message when status != DI_OK */
} di_step_sample;

typedef struct di_step_result {
    uint64_t step;
    int32_t status;          /* forward failure: every piece of the step failed */
    di_error err;            /* message of the step failure */
    const di_step_plan *plan;
    int32_t n_samples;
    di_step_sample *samples; /* [max_seqs] in plan order */
    int64_t *cache_hit;      /* [max_seqs] int64 per plan item: the runner's prefix-cache hit for its request
                              * after this step (runner.h cache_hit; 0 when dropped or without one) */
    double forward_s;        /* wall time of the forward, and of the sampling */
    double sample_s;
} di_step_result;

typedef struct di_executor di_executor;

/* sample_threads > 1: rows are sampled in parallel on a pool of that many threads (each with its
 * own scratch; a row's result does not depend on which thread ran it). */
int di_executor_new(const di_model_runner *runner, int32_t max_seqs, int async, int sample_threads, di_executor **out,
                    di_error *err);
/* Joins the worker (waits for a step in flight first). */
void di_executor_free(di_executor *e);

/* Starts a step. The plan must stay unchanged until the matching di_executor_wait. Only one step
 * runs at a time: a submit while one is in flight waits for it first (its result is kept). */
void di_executor_submit(di_executor *e, const di_step_plan *plan);
/* Result of the last submitted step; valid until the second submit after it. NULL if none. */
const di_step_result *di_executor_wait(di_executor *e);
int di_executor_in_flight(const di_executor *e);
/* Delivers releases outside a step (engine shutdown). Not while a step is in flight. */
void di_executor_release(di_executor *e, const int64_t *ids, int32_t n);

#endif
