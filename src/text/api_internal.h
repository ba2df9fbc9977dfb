/* Shared by the three request parsers (api_chat.c, api_responses.c, api_messages.c). */
#ifndef DI_TEXT_API_INTERNAL_H
#define DI_TEXT_API_INTERNAL_H

#include <jansson.h>

#include "text/api.h"
#include "text/chat_json.h"
#include "util/error.h"

/* Values every protocol has, collected raw and validated once in api_finish(). */
typedef struct api_common {
    json_t *temperature, *top_p, *top_k, *min_p, *max_tokens, *seed, *n;
    json_t *presence_penalty, *frequency_penalty, *repetition_penalty, *logit_bias;
    json_t *logprobs, *top_logprobs, *stop;
    int thinking;             /* -1 not given, 0 off, 1 on */
    int effort;               /* 0 not given, else 1..100 */
    bool effort_disables;     /* effort "none" */
    bool clamp_max_tokens;    /* Messages lowers max_tokens to the bound instead of rejecting */
    json_t *tool_choice_name; /* a named function choice (string), or NULL */
} api_common;

int api_fail(di_error *err, const char *fmt, ...) DI_PRINTF(2, 3);
/* serde-style description of an unexpected JSON value: `string "hi"`, "integer `1`", "map", ... */
const char *api_unexpected(const json_t *v, char *buf, size_t n);
/* "invalid request body: invalid type: <v>, expected <what>" */
int api_type_error(di_error *err, const json_t *v, const char *expected);
int api_missing(di_error *err, const char *field);
int api_unknown_variant(di_error *err, const char *value, const char *expected_list);

/* Optional string field: NULL if absent or null; a type error for anything but a string. */
int api_opt_string(const json_t *obj, const char *key, const char **out, di_error *err);

/* Text of a content field: a string, or an array of parts whose text parts are joined with
 * "\n\n" (images become the image placeholder and are counted). `text_types` lists the part
 * types that carry text ("text", "input_text", ...), NULL-terminated; `variants` is the list the
 * error for any other part type names. */
int api_content_text(const json_t *content, const char *const *text_types, const char *variants, bool allow_null, char **out,
                     size_t *n_images, di_error *err);

int api_check_model(const json_t *model, const di_api_options *o, di_request *r, di_error *err);
/* Reasoning-effort names shared by Chat and Responses. 0 on success (*effort set, or *disable). */
int api_parse_effort(const json_t *v, int *effort, bool *disable, di_error *err);
/* Function-tool declaration: name, description, parameters (schema json), strict. */
int api_add_tool(di_conversation *c, const json_t *name, const json_t *description, const json_t *parameters,
                 const json_t *strict, di_error *err);

/* Validation of the common fields, thinking resolution, tool choice, constraint and parse options. */
int api_finish(di_request *r, api_common *c, const di_api_options *o, di_error *err);

/* Chat/Responses tool-result bookkeeping: checks that tool results answer the preceding calls. */
int api_check_tool_results(const di_conversation *c, di_error *err);

/* response_format-like object (schema read from schema_holder) and the thinking switch. */
int api_parse_format(const json_t *fmt, const json_t *schema_holder, di_conversation *conv, di_error *err);
int api_parse_thinking(const json_t *v, api_common *c, di_error *err);

int api_parse_chat(const json_t *root, const di_api_options *o, di_request *r, di_error *err);
int api_parse_responses(const json_t *root, const di_api_options *o, di_request *r, di_error *err);
int api_parse_messages(const json_t *root, const di_api_options *o, di_request *r, di_error *err);

#endif
