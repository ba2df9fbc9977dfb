/* Engine core: the step loop that ties scheduler, executor and requests together.
 *
 * One di_core_step:
 *   sync   schedule step n → run it → collect its tokens → stop checks
 *   async  schedule step n+1 (host; decodes whose input is step n's still-unknown token are
 *          planned with the token left to the worker) → wait for step n → start step n+1 on the
 *          worker → collect step n's tokens and run the stop checks while step n+1 computes.
 * Stop checks therefore lag one step in async mode: a request that hit EOS in step n has already
 * been scheduled into step n+1, whose token is dropped (counted in stats.wasted_samples). Limits
 * known in advance (max_tokens, context) are never overrun — they are counted at scheduling time.
 * Because every token is a function of (request, position) only — chunk boundaries fixed per
 * request, rows sampled independently, Philox keyed by position — sync and async runs give the same
 * outputs (test_scheduler: test_async_matches_sync).
 *
 * Threading: the di_core_* calls come from one host thread; only the model (and the sampler) run on
 * the worker. Streaming: di_core_poll returns what each request gained since the last poll. */
#ifndef DI_ENGINE_ENGINE_CORE_H
#define DI_ENGINE_ENGINE_CORE_H

#include <stdint.h>

#include "engine/executor.h"
#include "engine/sequence.h"
#include "engine/runner.h"
#include "engine/scheduler.h"

typedef struct di_core_options {
    di_sched_config sched;
    int32_t async;          /* 1: model on a worker thread, host prepares the next step meanwhile */
    int32_t sample_threads; /* > 1: sample the step's rows in parallel (0/1: on the worker itself) */
    const int32_t *eos_ids; /* [n_eos], copied */
    int32_t n_eos;
    di_detok_fn detok;      /* NULL: no text, stop strings never match */
    void *detok_ctx;
} di_core_options;

typedef struct di_core_stats {
    int64_t steps;
    int64_t prefill_tokens;  /* positions computed that did not sample (incl. recompute) */
    int64_t scheduled_tokens; /* positions of every piece run (Σ piece sizes: a prefix hit's replay
                               * counts, its restored prefix does not) */
    int64_t sampled;         /* tokens delivered to requests */
    int64_t wasted_samples;  /* sampled after the request had finished (async lag, cancellation) */
    int64_t preemptions;
    int64_t forced_syncs;    /* async: steps that waited for the step in flight before scheduling (preemption) */
    double forward_s, sample_s;
} di_core_stats;

/* A streaming delta; pointers stay valid until the next di_core_step or di_core_poll. */
typedef struct di_core_delta {
    int64_t id;
    const int32_t *tokens;            /* [n_tokens] new ids (EOS / stop id included when it ended the request) */
    const di_token_logprobs *logprobs; /* [n_tokens] or NULL when logprobs were not asked */
    int64_t n_tokens;
    const char *text;                 /* [n_text] new text bytes, never a partial stop string or UTF-8 char */
    size_t n_text;
    di_finish_reason finish;          /* NONE while running; reported once */
    const char *error;                /* message when finish is ERROR */
    int32_t preemptions;
    int64_t cache_hit_tokens;         /* positions served from the runner's prefix cache so far */
} di_core_delta;

typedef struct di_core di_core;

/* runner must outlive the core. */
int di_core_new(const di_model_runner *runner, const di_core_options *opt, di_core **out, di_error *err);
void di_core_free(di_core *c);

/* id: caller-chosen, unique among requests not yet fully polled. */
int di_core_add(di_core *c, int64_t id, const int32_t *prompt, int64_t n_prompt, const di_seq_params *params,
                di_error *err);
/* Finishes a request as CANCELLED; its cache is freed once no step in flight uses it. DI_ERR_INVALID
 * for an unknown or already finished id. */
int di_core_cancel(di_core *c, int64_t id, di_error *err);

/* One iteration (see the top of this file). */
int di_core_step(di_core *c, di_error *err);
/* Anything queued, running or in flight. */
int di_core_busy(const di_core *c);
/* Up to max deltas (requests with news, in the order they got it); returns the count. A finished
 * request is reported once with its finish reason and then forgotten (its id may be reused). */
int32_t di_core_poll(di_core *c, di_core_delta *out, int32_t max);

const di_core_stats *di_core_get_stats(const di_core *c);
const di_scheduler *di_core_scheduler(const di_core *c);

#endif
