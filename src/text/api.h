/* Request conversion: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages request
 * bodies → one di_conversation plus the sampling, parsing and constraint options the engine needs.
 *
 * Validation follows the deepseek-recipe converter (the reference for DeepSeek's own API): the same
 * accepted values, defaults and error messages, so a client sees the errors the official API
 * gives. A rejected request yields DI_ERR_INVALID and a di_error whose msg is exactly the message
 * the API returns; di_api_error_body() wraps it as
 *   {"error":{"message":...,"type":"invalid_request_error","param":null,"code":"invalid_request_error"}}
 * (HTTP 400). Extensions beyond the reference are marked "extension" below. */
#ifndef DI_TEXT_API_H
#define DI_TEXT_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/chat.h"

typedef enum di_api { DI_API_CHAT, DI_API_RESPONSES, DI_API_MESSAGES } di_api;

/* "chat" | "responses" | "messages"; returns -1 for anything else. */
int di_api_from_name(const char *name);
const char *di_api_name(di_api api);

/* Deepest nesting of arrays/objects accepted in a request body (the reference's JSON limit). */
#define DI_API_MAX_DEPTH 127
#define DI_API_MAX_STOP 16
#define DI_API_MAX_TOP_LOGPROBS 20

typedef struct di_logit_bias {
    int32_t id;
    float bias;
} di_logit_bias;

/* Sampling as the backend should apply it (reference rules already applied: in thinking mode the
 * temperature is 1.0 and top_p at least 0.95; outside it top_p is 1.0). Unset values are
 * marked by the has_* flags or 0. */
typedef struct di_sampling {
    float temperature;
    float top_p;
    int32_t top_k;         /* extension: 0 = off */
    float min_p;           /* extension: 0 = off */
    int64_t max_tokens;    /* 0 = not requested (see di_request_resolve_max_tokens) */
    bool has_seed;
    uint64_t seed;         /* [0, 2^63) */
    int32_t n;             /* completions per request (1 unless options allow more) */
    float presence_penalty;   /* [-2, 2] */
    float frequency_penalty;  /* [-2, 2] */
    float repetition_penalty; /* extension: 1 = off, (0, 2] */
    di_logit_bias *logit_bias; /* [n_logit_bias], extension: ids checked against the vocab later */
    size_t n_logit_bias;
    bool logprobs;
    int32_t top_logprobs;  /* [0, 20] */
} di_sampling;

/* Where output parsing starts (src/text/stream.h). */
typedef enum di_stage0 {
    DI_STAGE0_CONTENT,               /* thinking off */
    DI_STAGE0_REASONING,             /* new turn: reasoning first, leading newlines dropped */
    DI_STAGE0_REASONING_CONTINUATION, /* continued turn, still in reasoning */
    DI_STAGE0_CONTENT_CONTINUATION    /* continued turn, reasoning done */
} di_stage0;

typedef struct di_parse_options {
    bool parse_tool_calls;     /* tools are active: parse DSML blocks */
    bool starts_in_tool_calls; /* the prompt pre-opened the DSML block (tool_choice required) */
    bool parse_json_output;    /* json_object: keep only the JSON text */
    di_stage0 stage0;
    char **stop;               /* [n_stop] stop strings */
    size_t n_stop;
} di_parse_options;

/* What constrained decoding would enforce (the grammar engine's input). */
typedef enum di_constraint_kind {
    DI_CONSTRAINT_NONE,
    DI_CONSTRAINT_JSON,               /* spec = compact JSON Schema, or "" for any JSON value */
    DI_CONSTRAINT_REGEX,              /* spec = pattern */
    DI_CONSTRAINT_EBNF,               /* extension: spec = grammar text */
    DI_CONSTRAINT_TOOL_CALL,          /* spec = compact JSON array of the function tools */
    DI_CONSTRAINT_TOOL_CALL_REQUIRED
} di_constraint_kind;

const char *di_constraint_kind_name(di_constraint_kind k);

typedef struct di_request {
    di_api api;
    char *model;
    bool stream;
    bool include_usage; /* chat: stream_options.include_usage */
    di_conversation conv;
    di_sampling sampling;
    di_parse_options parse;
    di_constraint_kind constraint;
    char *constraint_spec;
} di_request;

typedef struct di_api_options {
    bool default_thinking;            /* thinking mode when the request does not say (true) */
    const char *const *model_names;   /* accepted "model" values, NULL-terminated; NULL = default */
    int64_t max_tokens_upper_bound;   /* 393216 */
    int32_t max_n;                    /* largest accepted n (1, as the reference) */
} di_api_options;

void di_api_options_default(di_api_options *o);

/* Parse and validate a request body (need not be NUL-terminated). opts may be NULL (defaults).
 * On failure *out is left empty and err->msg holds the API error message. */
int di_request_parse(di_api api, const char *body, size_t len, const di_api_options *opts, di_request *out,
                     di_error *err);
void di_request_free(di_request *r);

/* The max_tokens to run with, given the encoded prompt length and the model context. A requested
 * value is kept; otherwise 8192 (thinking off), 131072 (thinking, effort max) or 65536 (thinking).
 * The result is lowered to the room left after the prompt and is at least 1. Fails (DI_ERR_LIMIT,
 * the API's context-length message) when prompt + requested max_tokens exceed the context, or,
 * without a request, when the prompt alone does. */
int di_request_resolve_max_tokens(const di_request *r, int64_t prompt_tokens, int64_t context_limit,
                                  int64_t *out, di_error *err);

/* {"error":{...}} body for a failed request (caller frees); status is 400 for invalid requests and
 * context overflow, 500 otherwise. */
char *di_api_error_body(const di_error *err, int *http_status);

#endif
