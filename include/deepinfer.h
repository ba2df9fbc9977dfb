/* deepinfer — offline inference engine for DeepSeek-V4.1-Flash.
 *
 * Public C API. Everything here is prefixed di_: the status codes and the error record every library
 * call fills, the version, and the engine (models, requests, sampling, streaming deltas). */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DI_VERSION_STRING "0.1.0"

/* Status codes returned by every fallible library function (0 = success). */
typedef enum di_status {
    DI_OK = 0,
    DI_ERR_IO = -1,          /* file missing, unreadable, short read, mmap failure */
    DI_ERR_FORMAT = -2,      /* malformed file content (bad JSON, bad header, bad offsets) */
    DI_ERR_INVALID = -3,     /* well-formed but wrong: dtype/shape mismatch, missing tensor, bad argument */
    DI_ERR_NOMEM = -4,       /* allocation failed */
    DI_ERR_UNSUPPORTED = -5, /* valid but not handled here (unknown model_type, unsupported config) */
    DI_ERR_INTERNAL = -6,    /* a bug: an invariant did not hold */
    DI_ERR_LIMIT = -7        /* a resource limit was hit (context length, memory budget, time) */
} di_status;

/* Error record: a status and a one-line message naming the file/tensor/request and what was
 * expected versus found. Functions that take a di_error* may be passed NULL. */
typedef struct di_error {
    int code;        /* a di_status */
    char msg[1024];  /* NUL-terminated, single line */
} di_error;

const char *di_status_name(int status);
const char *di_version(void);

/* ======================================================================================== *
 * Engine API: open a model, add requests, step the engine, poll streaming deltas.
 *
 *   di_engine *e;  di_engine_options eo;  di_engine_options_default(&eo);
 *   di_engine_open("model-dir", &eo, &e, &err);
 *   di_request_options ro;  di_request_options_default(&ro);  ro.max_tokens = 64;
 *   int64_t id;  di_engine_add_text(e, "Hello", 5, &ro, &id, &err);
 *   while (di_engine_busy(e)) {
 *       di_engine_step(e, &err);
 *       di_delta d[16];  int32_t k = di_engine_poll(e, d, 16);   ... d[i].text, d[i].finish
 *   }
 *   di_engine_close(e);
 *
 * Threading: one engine is driven from one thread; the model runs on the engine's own worker.
 * Determinism: a request's tokens depend only on its prompt, its parameters and its seed — never on
 * the other requests in the engine (Philox draws keyed by seed, position and choice; batch-invariant
 * model rows). A request without a seed gets one drawn from the engine seed at di_engine_add_*.
 * ======================================================================================== */

#define DI_MAX_TOP_LOGPROBS 20

typedef enum di_logprobs_mode {
    DI_LOGPROBS_RAW = 0,      /* log-softmax of the model's logits (default, OpenAI/vLLM semantics) */
    DI_LOGPROBS_PROCESSED = 1 /* log-softmax of the distribution the token was drawn from */
} di_logprobs_mode;

/* One logit-bias entry (OpenAI logit_bias). Named di_token_bias, not di_logit_bias, because the
 * text layer's request parser still uses that name for its own {id, bias} record. */
typedef struct di_token_bias {
    int32_t token;
    float bias;
} di_token_bias;

/* Per-request sampling parameters, applied in this fixed order: penalties, logit bias, grammar mask,
 * temperature, top-k, top-p, min-p (src/engine/sampler.h states the numerics). Zero-initialised =
 * greedy with no processing; di_sampling_params_default() gives the OpenAI defaults. */
typedef struct di_sampling_params {
    float temperature;        /* >= 0; 0 (anything below 1e-5) = greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* (0, 1]; 1 (or 0 = unset): off */
    float min_p;              /* [0, 1]; 0: off */
    float presence_penalty;   /* logit -= presence · [count_out(t) > 0] */
    float frequency_penalty;  /* logit -= frequency · count_out(t) */
    float repetition_penalty; /* > 0; 1 (or 0 = unset): off. t in prompt or output: logit > 0 ? logit / r : logit · r */
    const di_token_bias *logit_bias; /* [n_logit_bias], copied when the request is added; a token may appear once */
    int32_t n_logit_bias;
    uint64_t seed;
    int32_t logprobs;         /* != 0: report the sampled token's logprob (and n_top_logprobs alternatives) */
    int32_t n_top_logprobs;   /* 0 .. DI_MAX_TOP_LOGPROBS (used when logprobs != 0) */
    di_logprobs_mode logprobs_mode;
} di_sampling_params;

/* temperature 1, every other stage off, seed 0, no logprobs. */
di_sampling_params di_sampling_params_default(void);

/* Why a request (one choice of it) ended. The DI_FINISH_REASON_ spelling keeps these apart from the
 * text layer's protocol-level finish reasons (src/text/stream.h). */
typedef enum di_finish_reason {
    DI_FINISH_REASON_NONE = 0,
    DI_FINISH_REASON_STOP = 1,      /* EOS, a stop token id or a stop string */
    DI_FINISH_REASON_LENGTH = 2,    /* max_tokens or the context limit */
    DI_FINISH_REASON_CANCELLED = 3,
    DI_FINISH_REASON_ERROR = 4      /* sampling or model error; message in the delta */
} di_finish_reason;

/* "none", "stop", "length", "cancelled", "error". */
const char *di_finish_reason_name(di_finish_reason r);

/* Log probability of one sampled token and the best alternatives (best first). */
typedef struct di_token_logprobs {
    float logprob;
    int32_t n_top;
    int32_t top_ids[DI_MAX_TOP_LOGPROBS];
    float top_logprobs[DI_MAX_TOP_LOGPROBS];
} di_token_logprobs;

typedef struct di_engine di_engine;

typedef struct di_engine_options {
    const char *device;        /* "cpu" (default) or "cuda" (a build with the CUDA backend: deepinfer-cuda) */
    const char *runner;        /* "cached" (default): per-request compact caches, one position per decode
                                * step; "recompute": re-runs the one-shot prefill over the whole history
                                * for every token — O(T²), the exact baseline the cached runner is
                                * checked against */
    int32_t n_threads;         /* CPU threads for the model; 0 = one per core */
    int64_t max_context;       /* positions per request; 0 = min(the model's, 4096) */
    int64_t cache_tokens;      /* cache budget in positions over all requests; 0 = max_seqs · max_context */
    int32_t max_seqs;          /* requests per step (default 64) */
    int64_t max_step_tokens;   /* token budget per step (default 2048; >= prefill_chunk) */
    int32_t prefill_chunk;     /* default prefill chunk (default 512) */
    int32_t async;             /* overlap host scheduling with the model (default 1) */
    int32_t sample_threads;    /* threads sampling the rows of a step (default 4) */
    uint64_t seed;             /* seeds requests that bring none (0 = from the clock) */
    int64_t prefix_cache_bytes; /* prefix cache budget (cached runner only); 0 = off (default) */
    int32_t prefix_block;      /* tokens per prefix-cache block; 0 = 64 */
} di_engine_options;

void di_engine_options_default(di_engine_options *o);

/* sizeof of a public struct by its name ("di_engine_options", "di_request_options", "di_delta",
 * "di_sampling_params", "di_token_logprobs", "di_token_bias", "di_error"), 0 if unknown. Bindings that
 * mirror these structs (python/deepinfer_c) check their layout against it at load. */
size_t di_abi_struct_size(const char *name);

/* checkpoint_dir: a V4.1 checkpoint (config.json + safetensors); its tokenizer.json, when present,
 * enables text prompts, text deltas, stop strings and grammars. opt may be NULL (defaults). */
int di_engine_open(const char *checkpoint_dir, const di_engine_options *opt, di_engine **out, di_error *err);
void di_engine_close(di_engine *e);

int32_t di_engine_vocab_size(const di_engine *e);
int64_t di_engine_max_context(const di_engine *e);
int32_t di_engine_eos_id(const di_engine *e);
int di_engine_has_tokenizer(const di_engine *e);

typedef enum di_grammar_kind {
    DI_GRAMMAR_NONE = 0,
    DI_GRAMMAR_REGEX = 1,       /* the whole output matches (anchored at both ends) */
    DI_GRAMMAR_JSON_SCHEMA = 2, /* JSON Schema text; "" or "{}" = any JSON value */
    DI_GRAMMAR_EBNF = 3         /* llama.cpp GBNF dialect, start rule "root" */
} di_grammar_kind;

typedef struct di_request_options {
    di_sampling_params sampling; /* sampling.seed is used when has_seed, else drawn from the engine seed */
    int32_t has_seed;
    int64_t max_tokens;          /* 0 = up to the context limit */
    int32_t n;                   /* parallel samples (OpenAI n), 1..64; choice i uses RNG counter word i */
    const char *const *stop;     /* [n_stop] stop strings (not included in the text), copied */
    int32_t n_stop;
    const int32_t *stop_token_ids; /* [n_stop_token_ids], copied */
    int32_t n_stop_token_ids;
    int32_t ignore_eos;
    int32_t prefill_chunk;       /* 0 = engine default */
    di_grammar_kind grammar_kind;
    const char *grammar;         /* regex / JSON Schema text / EBNF source (needs the tokenizer) */
    size_t grammar_len;
    int32_t thinking;            /* the grammar applies after the think-end marker */
} di_request_options;

/* di_sampling_params_default(), n 1, max_tokens 0, no stops, no grammar. */
void di_request_options_default(di_request_options *o);

/* Add a request from token ids or from raw text (tokenized with the model's tokenizer, no chat
 * template — chat requests go through di_engine_encode_chat or the text layer first). *id (>= 1)
 * identifies it in deltas. Errors (bad parameters, bad grammar, prompt too long) reject the request
 * and leave the engine unchanged. */
int di_engine_add_tokens(di_engine *e, const int32_t *prompt, int64_t n_prompt, const di_request_options *o,
                         int64_t *id, di_error *err);
int di_engine_add_text(di_engine *e, const char *prompt, size_t len, const di_request_options *o, int64_t *id,
                       di_error *err);
/* Finishes every unfinished choice of a request as CANCELLED (reported by the next poll). */
int di_engine_cancel(di_engine *e, int64_t id, di_error *err);

/* Prompt ids of a Chat Completions request body ({"model":..., "messages": [...], ...}) in the V4.1
 * chat format, ready for di_engine_add_tokens. *ids is malloc'd: release with di_free. */
int di_engine_encode_chat(di_engine *e, const char *body, size_t len, int32_t **ids, int64_t *n_ids, di_error *err);
void di_free(void *p);

/* One engine iteration: at most one model forward. */
int di_engine_step(di_engine *e, di_error *err);
/* Requests queued, running or in flight, or finished but not yet polled. */
int di_engine_busy(const di_engine *e);

/* What one choice of a request gained since the last poll; pointers valid until the next step or
 * poll. The last delta of a choice has finish != NONE. */
typedef struct di_delta {
    int64_t id;
    int32_t choice;
    const int32_t *tokens;               /* [n_tokens] (an EOS / stop id that ended the request included) */
    const di_token_logprobs *logprobs;   /* [n_tokens] or NULL */
    int64_t n_tokens;
    const char *text;                    /* [n_text] UTF-8, never a partial character or stop string */
    size_t n_text;
    di_finish_reason finish;             /* NONE until the last delta of this choice */
    const char *error;                   /* when finish is ERROR */
    int64_t prompt_tokens, completion_tokens; /* usage so far, this choice */
    int64_t cache_hit_tokens;            /* positions served from the prefix cache (a multiple of
                                          * prefix_block; 0 with the cache off or the recompute runner) */
} di_delta;

int32_t di_engine_poll(di_engine *e, di_delta *out, int32_t max);

typedef struct di_engine_stats {
    int64_t steps, prompt_tokens, generated_tokens, preemptions;
    double wall_s, forward_s, sample_s;
} di_engine_stats;

void di_engine_get_stats(const di_engine *e, di_engine_stats *out);

#ifdef __cplusplus
}
#endif
#endif
