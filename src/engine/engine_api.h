/* PROPOSED public engine API (issue 7 item 6) — for the lead to promote into include/deepinfer.h.
 * Nothing implements it yet; it is written against the pieces that exist (engine_core.h, sampler.h,
 * request.h) so the mapping is mechanical:
 *
 *   di_engine_open     checkpoint dir → model runner (model helpers) + tokenizer (text helpers) +
 *                      di_core with options; EOS ids and the detokenizer come from the tokenizer
 *   di_engine_add      tokenizes if given text, compiles the grammar (grammar helpers) into a
 *                      di_constraint, draws a seed when none is given, then di_core_add once per
 *                      choice (n parallel samples = n core requests with choice 0..n−1)
 *   di_engine_step     di_core_step
 *   di_engine_poll     di_core_poll, deltas regrouped by user request and choice
 *   di_engine_cancel   di_core_cancel for every choice
 *
 * When promoted, di_sampling_params / di_logit_bias / di_logprobs_mode move from
 * src/engine/sampler.h into deepinfer.h unchanged (sampler.h then includes deepinfer.h), and
 * di_finish_reason moves from request.h. Shown here by inclusion so this file compiles today. */
#ifndef DI_ENGINE_ENGINE_API_H
#define DI_ENGINE_ENGINE_API_H

#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"
#include "engine/sequence.h" /* di_finish_reason, di_token_logprobs (to move) */
#include "engine/sampler.h" /* di_sampling_params, di_logit_bias, di_logprobs_mode (to move) */

typedef struct di_engine di_engine;

typedef struct di_engine_options {
    const char *device;        /* "cpu" (default) or "cuda:N" */
    int32_t n_threads;         /* CPU threads for the model; 0 = one per core */
    int64_t max_context;       /* 0 = the model's; smaller to save cache */
    int64_t cache_bytes;       /* paged cache budget; 0 = a fraction of free memory */
    int32_t max_seqs;          /* requests per step (default 64) */
    int64_t max_step_tokens;   /* token budget per step (default 2048) */
    int32_t prefill_chunk;     /* default prefill chunk (default 512) */
    int32_t async;             /* overlap host scheduling with the model (default 1) */
    int32_t batch_invariant;   /* kernels in batch-invariant mode (default 1 on CUDA) */
    int32_t sample_threads;    /* threads sampling the rows of a step (default 4) */
    uint64_t seed;             /* seeds requests that bring none (0 = from the clock) */
} di_engine_options;

void di_engine_options_default(di_engine_options *o);

int di_engine_open(const char *checkpoint_dir, const di_engine_options *opt, di_engine **out, di_error *err);
void di_engine_close(di_engine *e);

typedef enum di_grammar_kind {
    DI_GRAMMAR_NONE = 0,
    DI_GRAMMAR_REGEX = 1,
    DI_GRAMMAR_JSON_SCHEMA = 2,
    DI_GRAMMAR_EBNF = 3        /* GBNF dialect */
} di_grammar_kind;

typedef struct di_request_options {
    di_sampling_params sampling; /* seed used when has_seed, else drawn from the engine seed */
    int32_t has_seed;
    int64_t max_tokens;          /* 0 = up to the context limit */
    int32_t n;                   /* parallel samples (OpenAI n), >= 1; choice i uses RNG counter word i */
    const char *const *stop;     /* stop strings (not included in the text) */
    int32_t n_stop;
    const int32_t *stop_token_ids;
    int32_t n_stop_token_ids;
    int32_t ignore_eos;
    int32_t prefill_chunk;       /* 0 = engine default */
    di_grammar_kind grammar_kind;
    const char *grammar;         /* regex / JSON Schema text / EBNF source */
    size_t grammar_len;
    int32_t thinking;            /* grammar applies after the think-end marker */
} di_request_options;

void di_request_options_default(di_request_options *o); /* temperature 1, n 1, max_tokens 0 */

/* Add a request from token ids or from raw text (tokenized with the model's tokenizer, no chat
 * template — chat requests go through the text layer first). *id identifies it in deltas. */
int di_engine_add_tokens(di_engine *e, const int32_t *prompt, int64_t n_prompt, const di_request_options *o,
                         int64_t *id, di_error *err);
int di_engine_add_text(di_engine *e, const char *prompt, size_t len, const di_request_options *o, int64_t *id,
                       di_error *err);
int di_engine_cancel(di_engine *e, int64_t id, di_error *err);

/* One engine iteration: at most one model forward. */
int di_engine_step(di_engine *e, di_error *err);
/* Requests queued, running or in flight. */
int di_engine_busy(const di_engine *e);

/* What a request gained since the last poll; pointers valid until the next step or poll. */
typedef struct di_delta {
    int64_t id;
    int32_t choice;
    const int32_t *tokens;               /* [n_tokens] */
    const di_token_logprobs *logprobs;   /* [n_tokens] or NULL */
    int64_t n_tokens;
    const char *text;                    /* [n_text] UTF-8, never a partial character or stop string */
    size_t n_text;
    di_finish_reason finish;             /* DI_FINISH_NONE until the last delta of this choice */
    const char *error;                   /* when finish is DI_FINISH_ERROR */
    int64_t prompt_tokens, completion_tokens; /* usage so far */
} di_delta;

int32_t di_engine_poll(di_engine *e, di_delta *out, int32_t max);

typedef struct di_engine_stats {
    int64_t steps, prompt_tokens, generated_tokens, preemptions;
    double wall_s, forward_s, sample_s;
} di_engine_stats;

void di_engine_get_stats(const di_engine *e, di_engine_stats *out);

#endif
