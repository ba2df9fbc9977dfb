/* A model runner without a model, for scheduler / engine tests and `bench engine` dry runs.
 *
 * It behaves like a paged-cache model as far as the engine can tell: forward writes each input
 * token into the cache slot its block table names, and a logits row is computed from the tokens
 * READ BACK through the block table for every position 0..p — so a wrong table, a block reused
 * while still owned, or a preempted request that skipped its recompute gives an error instead of
 * plausible logits. The logits are a hash of (salt, token history): deterministic, independent of
 * the batch, the block ids and the chunking, so any difference between two runs is the engine's.
 * A release invalidates the request's slots (each id has a life counter, stamped into the slots it
 * writes; a release starts a new life, so reads of older slots fail). Optional sleep per step stands in for device time. */
#ifndef DI_ENGINE_MOCK_RUNNER_H
#define DI_ENGINE_MOCK_RUNNER_H

#include <stdint.h>

#include "engine/idmap.h"
#include "engine/runner.h"

typedef struct di_mock_options {
    int32_t n_vocab;
    int64_t max_context;
    int32_t block_tokens;
    int32_t n_blocks;
    uint64_t salt;         /* changes every logit */
    float sharpness;       /* logit = sharpness · u³ − 2, u uniform in [0,1): larger = peakier rows */
    double step_sleep_s;   /* per forward, to imitate device time */
    int64_t fail_forward;  /* > 0: the forward call with this number (1-based) fails, for error paths */
} di_mock_options;

/* One record per piece the runner saw. */
typedef struct di_mock_piece {
    uint64_t step;
    int64_t req_id;
    int64_t pos0;
    int32_t n_tokens;
    int32_t n_in_batch;    /* pieces in that step */
} di_mock_piece;

typedef struct di_mock_runner {
    di_mock_options opt;
    int64_t *slot_req;     /* [n_blocks · block_tokens] owner request, −1 = invalid */
    int64_t *slot_pos;     /* [n_blocks · block_tokens] position written */
    int32_t *slot_tok;     /* [n_blocks · block_tokens] token written */
    int64_t *slot_life;    /* [n_blocks · block_tokens] writer's life when written */
    di_idmap lives;        /* request id → (life + 1) as an integer in a pointer */
    di_mock_piece *log;    /* [cap_log] */
    int64_t n_log, cap_log;
    int64_t n_forward, n_release;
    int64_t n_fed_back;    /* pieces flagged as starting with the previous step's sampled token */
    int32_t max_batch_seen;
} di_mock_runner;

int di_mock_runner_new(const di_mock_options *opt, di_mock_runner **out, di_model_runner *iface, di_error *err);
void di_mock_runner_free(di_mock_runner *m);

/* The logits row the mock gives after `tokens` (what forward returns for that history). */
void di_mock_logits(const di_mock_options *opt, const int32_t *tokens, int64_t n, float *logits);

#endif
