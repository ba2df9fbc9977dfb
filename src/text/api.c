/* Request conversion: JSON loading with the depth limit, validation shared by the three protocols,
 * and the context-length check. Protocol-specific parsing is in api_chat.c, api_responses.c and
 * api_messages.c. */
#include "text/api.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/api_internal.h"

static const char *const DEFAULT_MODELS[] = {"DeepSeek-V4.1-Flash", NULL};

int di_api_from_name(const char *name) {
    if (!strcmp(name, "chat")) return DI_API_CHAT;
    if (!strcmp(name, "responses")) return DI_API_RESPONSES;
    if (!strcmp(name, "messages")) return DI_API_MESSAGES;
    return -1;
}

const char *di_api_name(di_api api) {
    return api == DI_API_CHAT ? "chat" : api == DI_API_RESPONSES ? "responses" : "messages";
}

const char *di_constraint_kind_name(di_constraint_kind k) {
    static const char *const names[] = {"none", "json", "regex", "ebnf", "tool_call", "tool_call_required"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

void di_api_options_default(di_api_options *o) {
    *o = (di_api_options){.default_thinking = true,
                          .model_names = DEFAULT_MODELS,
                          .max_tokens_upper_bound = 393216,
                          .max_n = 1};
}

/* ---- error helpers ---- */

int api_fail(di_error *err, const char *fmt, ...) {
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return di_error_set(err, DI_ERR_INVALID, "%s", msg);
}

const char *api_unexpected(const json_t *v, char *buf, size_t n) {
    switch (json_typeof(v)) {
    case JSON_STRING: snprintf(buf, n, "string \"%.200s\"", json_string_value(v)); break;
    case JSON_INTEGER: snprintf(buf, n, "integer `%lld`", (long long)json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, n, "floating point `%g`", json_real_value(v)); break;
    case JSON_TRUE: snprintf(buf, n, "boolean `true`"); break;
    case JSON_FALSE: snprintf(buf, n, "boolean `false`"); break;
    case JSON_NULL: snprintf(buf, n, "null"); break;
    case JSON_ARRAY: snprintf(buf, n, "sequence"); break;
    case JSON_OBJECT: snprintf(buf, n, "map"); break;
    }
    return buf;
}

int api_type_error(di_error *err, const json_t *v, const char *expected) {
    char b[256];
    return api_fail(err, "invalid request body: invalid type: %s, expected %s", api_unexpected(v, b, sizeof b),
                    expected);
}

int api_missing(di_error *err, const char *field) {
    return api_fail(err, "invalid request body: missing field `%s`", field);
}

int api_unknown_variant(di_error *err, const char *value, const char *expected_list) {
    return api_fail(err, "invalid request body: unknown variant `%.200s`, expected one of %s", value, expected_list);
}

int api_opt_string(const json_t *obj, const char *key, const char **out, di_error *err) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return DI_OK;
    if (!json_is_string(v)) return api_type_error(err, v, "a string");
    *out = json_string_value(v);
    return DI_OK;
}

/* ---- content ---- */

int api_content_text(const json_t *content, const char *const *text_types, const char *variants, bool allow_null, char **out,
                     size_t *n_images, di_error *err) {
    *out = NULL;
    if (n_images) *n_images = 0;
    if (!content || json_is_null(content)) {
        if (!allow_null) return api_fail(err, "invalid request body: content should be a string or a list");
        *out = di_strdup("");
        return *out ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    if (json_is_string(content)) {
        *out = di_strdup(json_string_value(content));
        return *out ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    if (!json_is_array(content)) return api_fail(err, "invalid request body: content should be a string or a list");
    di_buf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type) {
            di_buf_free(&b);
            return api_fail(err, "invalid request body: content part %zu: expected an object with a \"type\"", i);
        }
        bool is_text = false;
        for (const char *const *t = text_types; *t; t++) is_text |= !strcmp(type, *t);
        if (i) di_buf_puts(&b, "\n\n");
        if (is_text) {
            json_t *text = json_object_get(part, "text");
            if (!json_is_string(text)) {
                di_buf_free(&b);
                return text ? api_type_error(err, text, "a string") : api_missing(err, "text");
            }
            di_buf_append(&b, json_string_value(text), json_string_length(text));
        } else if (!strcmp(type, "image_url") || !strcmp(type, "input_image") || !strcmp(type, "image")) {
            di_buf_puts(&b, DI_TOK_IMAGE);
            if (n_images) (*n_images)++;
        } else {
            di_buf_free(&b);
            return api_unknown_variant(err, type, variants);
        }
    }
    *out = di_buf_take(&b);
    return *out ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
}

/* ---- shared fields ---- */

int api_check_model(const json_t *model, const di_api_options *o, di_request *r, di_error *err) {
    if (!model) return api_missing(err, "model");
    if (!json_is_string(model)) return api_type_error(err, model, "a string");
    const char *name = json_string_value(model);
    const char *const *names = o->model_names ? o->model_names : DEFAULT_MODELS;
    for (const char *const *n = names; *n; n++)
        if (!strcmp(*n, name)) {
            r->model = di_strdup(name);
            return r->model ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
        }
    di_buf list = {0};
    for (const char *const *n = names; *n; n++) {
        if (n != names) di_buf_puts(&list, ", ");
        di_buf_puts(&list, *n);
    }
    int rc = api_fail(err, "The supported API model names are %s, but you passed %.200s.", list.data ? list.data : "",
                      name);
    di_buf_free(&list);
    return rc;
}

int api_parse_effort(const json_t *v, int *effort, bool *disable, di_error *err) {
    static const char LEVELS[] = "`none`, `minimal`, `low`, `medium`, `high`, `xhigh`, `ultra`, `max`";
    *disable = false;
    if (!v || json_is_null(v)) return DI_OK;
    if (json_is_integer(v)) { /* extension: the model's native 1..100 scale */
        json_int_t e = json_integer_value(v);
        if (e < 1 || e > 100) return api_fail(err, "Invalid reasoning_effort value, the valid range of reasoning_effort is [1, 100]");
        *effort = (int)e;
        return DI_OK;
    }
    if (!json_is_string(v)) return api_type_error(err, v, "string or integer");
    const char *s = json_string_value(v);
    /* the API's levels fold onto the encoder's four */
    static const struct { const char *name; int effort; } map[] = {
        {"minimal", DI_EFFORT_LOW}, {"low", DI_EFFORT_LOW},     {"medium", DI_EFFORT_HIGH}, {"high", DI_EFFORT_HIGH},
        {"xhigh", DI_EFFORT_XHIGH}, {"ultra", DI_EFFORT_MAX}, {"max", DI_EFFORT_MAX}};
    if (!strcmp(s, "none")) {
        *disable = true;
        return DI_OK;
    }
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(s, map[i].name)) {
            *effort = map[i].effort;
            return DI_OK;
        }
    return api_unknown_variant(err, s, LEVELS);
}

int api_add_tool(di_conversation *c, const json_t *name, const json_t *description, const json_t *parameters,
                 const json_t *strict, di_error *err) {
    if (!name) return api_missing(err, "name");
    if (!json_is_string(name)) return api_type_error(err, name, "a string");
    if (description && !json_is_null(description) && !json_is_string(description))
        return api_type_error(err, description, "a string");
    char *params = parameters && !json_is_null(parameters) ? di_json_dump(parameters, DI_JSON_COMPACT) : NULL;
    di_tool_def *t = di_conv_add_tool(c, json_string_value(name), json_string_value(description), params);
    free(params);
    if (!t) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    if (strict && json_is_boolean(strict)) t->strict = json_is_true(strict);
    return DI_OK;
}

int api_check_tool_results(const di_conversation *c, di_error *err) {
    for (size_t i = 0; i < c->n_msgs; i++) {
        const di_message *m = &c->msgs[i];
        if (m->role == DI_ROLE_TOOL)
            return api_fail(err, "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'");
        if (m->role != DI_ROLE_ASSISTANT || !m->n_calls) continue;
        /* the tool results that follow must answer these calls, every one of them */
        size_t j = i + 1;
        di_buf unknown = {0};
        di_call_index ix;
        if (di_call_index_build(m, &ix)) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
        for (; j < c->n_msgs && c->msgs[j].role == DI_ROLE_TOOL; j++) {
            const char *id = c->msgs[j].tool_call_id ? c->msgs[j].tool_call_id : "";
            if (di_call_index_find(&ix, id) < 0) {
                if (unknown.len) di_buf_puts(&unknown, ", ");
                di_buf_puts(&unknown, id);
            }
        }
        di_call_index_free(&ix);
        if (unknown.len) {
            int rc = api_fail(err,
                              "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                              "each 'tool_call_id', The following tool_call_ids did not have response messages: %.300s",
                              unknown.data);
            di_buf_free(&unknown);
            return rc;
        }
        di_buf_free(&unknown);
        if (j - i - 1 < m->n_calls && j < c->n_msgs)
            return api_fail(err, "An assistant message with 'tool_calls' must be followed by tool messages responding "
                                 "to each 'tool_call_id'. (insufficient tool messages following tool_calls message)");
        i = j - 1;
    }
    return DI_OK;
}

/* ---- validation of the common fields ---- */

static int number_in(const json_t *v, const char *name, double lo, double hi, bool lo_open, const char *range,
                     double *out, di_error *err) {
    if (!json_is_number(v)) return api_type_error(err, v, "f32");
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return api_fail(err, "Invalid %s value, the valid range of %s is %s", name, name, range);
    *out = x;
    return DI_OK;
}

static bool mentions_json(const di_conversation *c) {
    for (size_t i = 0; i < c->n_msgs; i++)
        for (const char *s = c->msgs[i].content; *s; s++)
            if (strncasecmp(s, "json", 4) == 0) return true;
    return false;
}

static int set_constraint_tools(di_request *r, di_error *err) {
    di_buf b = {0};
    di_buf_puts(&b, "[");
    for (size_t i = 0; i < r->conv.n_tools; i++) {
        const di_tool_def *t = &r->conv.tools[i];
        if (i) di_buf_puts(&b, ",");
        di_buf_puts(&b, "{\"type\":\"function\",\"function\":{\"name\":");
        di_json_write_string(&b, t->name, strlen(t->name));
        di_buf_puts(&b, ",\"description\":");
        if (t->description)
            di_json_write_string(&b, t->description, strlen(t->description));
        else
            di_buf_puts(&b, "null");
        di_buf_puts(&b, ",\"parameters\":");
        di_buf_puts(&b, t->parameters ? t->parameters : "{}");
        di_buf_puts(&b, t->strict < 0 ? ",\"strict\":null}}" : t->strict ? ",\"strict\":true}}" : ",\"strict\":false}}");
    }
    di_buf_puts(&b, "]");
    r->constraint_spec = di_buf_take(&b);
    return r->constraint_spec ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
}

static int take_stop(di_request *r, const json_t *stop, di_error *err) {
    if (!stop || json_is_null(stop)) return DI_OK;
    size_t n = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
    if (!json_is_string(stop) && !json_is_array(stop)) return api_type_error(err, stop, "a string or a sequence");
    if (n > DI_API_MAX_STOP) return api_fail(err, "Stop string array too long: %zu", n);
    r->parse.stop = calloc(n ? n : 1, sizeof *r->parse.stop);
    if (!r->parse.stop) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
        if (!json_is_string(s)) return api_type_error(err, s, "a string");
        if (!json_string_length(s))
            return api_fail(err,
                            "Invalid 'stop[%zu]': empty string. Expected a string with minimum length 1, but got an "
                            "empty string instead.",
                            i);
        r->parse.stop[i] = di_strdup(json_string_value(s));
        r->parse.n_stop++;
        if (!r->parse.stop[i]) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    return DI_OK;
}

int api_finish(di_request *r, api_common *c, const di_api_options *o, di_error *err) {
    di_sampling *s = &r->sampling;
    di_conversation *conv = &r->conv;
    int rc;
    if (!conv->n_msgs) return api_fail(err, "Empty input messages");

    /* thinking: an explicit switch wins, then effort "none", then the server default */
    conv->thinking = c->thinking >= 0 ? c->thinking : o->default_thinking;
    if (c->effort_disables) conv->thinking = false;
    conv->effort = c->effort;

    double x;
    float temperature = 1.0f, top_p = 1.0f;
    bool has_top_p = false;
    if (c->temperature && !json_is_null(c->temperature)) {
        if ((rc = number_in(c->temperature, "temperature", 0, 2, false, "[0, 2]", &x, err))) return rc;
        temperature = (float)x;
    }
    if (c->top_p && !json_is_null(c->top_p)) {
        if ((rc = number_in(c->top_p, "top_p", 0, 1, true, "(0, 1.0]", &x, err))) return rc;
        top_p = (float)x, has_top_p = true;
    }
    /* The V4.1 API samples thinking mode at temperature 1 and top_p >= 0.95, and answers at top_p 1. */
    if (conv->thinking) {
        s->temperature = 1.0f;
        s->top_p = has_top_p ? fmaxf(top_p, 0.95f) : 1.0f;
    } else {
        s->temperature = temperature;
        s->top_p = 1.0f;
    }
    if (c->presence_penalty && !json_is_null(c->presence_penalty)) {
        if ((rc = number_in(c->presence_penalty, "presence_penalty", -2, 2, false, "[-2, 2]", &x, err))) return rc;
        s->presence_penalty = (float)x;
    }
    if (c->frequency_penalty && !json_is_null(c->frequency_penalty)) {
        if ((rc = number_in(c->frequency_penalty, "frequency_penalty", -2, 2, false, "[-2, 2]", &x, err))) return rc;
        s->frequency_penalty = (float)x;
    }
    s->repetition_penalty = 1.0f;
    if (c->repetition_penalty && !json_is_null(c->repetition_penalty)) {
        if ((rc = number_in(c->repetition_penalty, "repetition_penalty", 0, 2, true, "(0, 2]", &x, err))) return rc;
        s->repetition_penalty = (float)x;
    }
    if (c->min_p && !json_is_null(c->min_p)) {
        if ((rc = number_in(c->min_p, "min_p", 0, 1, false, "[0, 1]", &x, err))) return rc;
        s->min_p = (float)x;
    }
    if (c->top_k && !json_is_null(c->top_k)) {
        if (!json_is_integer(c->top_k)) return api_type_error(err, c->top_k, "u32");
        json_int_t k = json_integer_value(c->top_k);
        if (k < 0 || k > 1 << 20) return api_fail(err, "Invalid top_k value, the valid range of top_k is [0, 1048576]");
        s->top_k = (int32_t)k;
    }
    if (c->max_tokens && !json_is_null(c->max_tokens)) {
        if (!json_is_integer(c->max_tokens)) return api_type_error(err, c->max_tokens, "u32");
        json_int_t m = json_integer_value(c->max_tokens);
        if (c->clamp_max_tokens && m > o->max_tokens_upper_bound) m = o->max_tokens_upper_bound;
        if (m < 1 || m > o->max_tokens_upper_bound)
            return api_fail(err, "Invalid max_tokens value, the valid range of max_tokens is [1, %lld]",
                            (long long)o->max_tokens_upper_bound);
        s->max_tokens = m;
    }
    if (c->seed && !json_is_null(c->seed)) {
        if (!json_is_integer(c->seed) || json_integer_value(c->seed) < 0) return api_type_error(err, c->seed, "u64");
        s->has_seed = true, s->seed = (uint64_t)json_integer_value(c->seed);
    }
    s->n = 1;
    if (c->n && !json_is_null(c->n)) {
        if (!json_is_integer(c->n)) return api_type_error(err, c->n, "u32");
        json_int_t n = json_integer_value(c->n);
        if (n < 1 || n > o->max_n) {
            if (o->max_n == 1) return api_fail(err, "Invalid n value (currently only n = 1 is supported)");
            return api_fail(err, "Invalid n value, the valid range of n is [1, %d]", o->max_n);
        }
        s->n = (int32_t)n;
    }
    if (c->logprobs && !json_is_null(c->logprobs)) {
        if (!json_is_boolean(c->logprobs)) return api_type_error(err, c->logprobs, "a boolean");
        s->logprobs = json_is_true(c->logprobs);
    }
    if (c->top_logprobs && !json_is_null(c->top_logprobs)) {
        if (!json_is_integer(c->top_logprobs)) return api_type_error(err, c->top_logprobs, "u32");
        json_int_t k = json_integer_value(c->top_logprobs);
        if (k < 0 || k > DI_API_MAX_TOP_LOGPROBS)
            return api_fail(err, "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].");
        if (!s->logprobs)
            return api_fail(err, "Invalid top_logprobs and logprobs value, logprobs must be set to true if "
                                 "top_logprobs is used.");
        s->top_logprobs = (int32_t)k;
    }
    if (c->logit_bias && !json_is_null(c->logit_bias)) {
        if (!json_is_object(c->logit_bias)) return api_type_error(err, c->logit_bias, "a map");
        size_t n = json_object_size(c->logit_bias);
        s->logit_bias = calloc(n ? n : 1, sizeof *s->logit_bias);
        if (!s->logit_bias) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
        const char *key;
        json_t *v;
        json_object_foreach(c->logit_bias, key, v) {
            char *end;
            long id = strtol(key, &end, 10);
            if (!*key || *end || id < 0 || id > INT32_MAX || !json_is_number(v) || fabs(json_number_value(v)) > 100)
                return api_fail(err, "Invalid logit_bias entry \"%.40s\": expected a token id mapped to a bias in "
                                     "[-100, 100]",
                                key);
            s->logit_bias[s->n_logit_bias++] = (di_logit_bias){(int32_t)id, (float)json_number_value(v)};
        }
    }
    if ((rc = take_stop(r, c->stop, err))) return rc;

    /* tool choice */
    if (c->tool_choice_name) {
        const char *want = json_string_value(c->tool_choice_name);
        size_t k = 0;
        for (; k < conv->n_tools && strcmp(conv->tools[k].name, want); k++) {}
        if (k == conv->n_tools)
            return api_fail(err,
                            "Invalid value for 'tool_call': no function named '%.200s' was specified in the 'tools' "
                            "parameter.",
                            want);
        /* keep only the named function; the model must call it */
        di_tool_def keep = conv->tools[k];
        for (size_t i = 0; i < conv->n_tools; i++)
            if (i != k) free(conv->tools[i].name), free(conv->tools[i].description), free(conv->tools[i].parameters);
        conv->tools[0] = keep;
        conv->n_tools = 1;
        conv->tool_choice = DI_TOOL_CHOICE_REQUIRED;
    }
    bool tools_on = conv->n_tools && conv->tool_choice != DI_TOOL_CHOICE_NONE;
    if (conv->thinking && conv->tool_choice == DI_TOOL_CHOICE_REQUIRED && tools_on)
        return api_fail(err, "Thinking mode does not support this tool_choice");
    if (conv->format == DI_FORMAT_JSON_OBJECT && !mentions_json(conv))
        return api_fail(err, "Prompt must contain the word 'json' in some form to use 'response_format' of type "
                             "'json_object'.");

    /* what constrained decoding would enforce: tool calls win over an answer format */
    if (tools_on) {
        r->constraint = conv->tool_choice == DI_TOOL_CHOICE_REQUIRED ? DI_CONSTRAINT_TOOL_CALL_REQUIRED
                                                                     : DI_CONSTRAINT_TOOL_CALL;
        if ((rc = set_constraint_tools(r, err))) return rc;
    } else if (conv->format == DI_FORMAT_JSON_OBJECT || conv->format == DI_FORMAT_JSON_SCHEMA) {
        r->constraint = DI_CONSTRAINT_JSON;
        r->constraint_spec = di_strdup(conv->format == DI_FORMAT_JSON_SCHEMA && conv->response_schema
                                           ? conv->response_schema : "");
    } else if (conv->format == DI_FORMAT_REGEX) {
        r->constraint = DI_CONSTRAINT_REGEX;
        r->constraint_spec = di_strdup(conv->response_regex);
    } else if (conv->format == DI_FORMAT_EBNF) {
        r->constraint = DI_CONSTRAINT_EBNF;
        r->constraint_spec = di_strdup(conv->response_ebnf);
    }
    if (r->constraint != DI_CONSTRAINT_NONE && !r->constraint_spec)
        return di_error_set(err, DI_ERR_NOMEM, "out of memory");

    /* how to parse the output */
    di_parse_options *p = &r->parse;
    p->parse_tool_calls = tools_on;
    p->starts_in_tool_calls = tools_on && conv->tool_choice == DI_TOOL_CHOICE_REQUIRED;
    p->parse_json_output = conv->format == DI_FORMAT_JSON_OBJECT;
    const di_message *last = &conv->msgs[conv->n_msgs - 1];
    if (!conv->thinking)
        p->stage0 = DI_STAGE0_CONTENT;
    else if (last->role == DI_ROLE_ASSISTANT && last->prefix)
        p->stage0 = last->content[0] || last->n_calls ? DI_STAGE0_CONTENT_CONTINUATION : DI_STAGE0_REASONING_CONTINUATION;
    else
        p->stage0 = DI_STAGE0_REASONING;
    return DI_OK;
}

/* ---- entry points ---- */

/* The reference parser refuses nesting deeper than DI_API_MAX_DEPTH; jansson's own limit is far
 * larger, so scan first (strings skipped) and report the position like a JSON syntax error. */
static int check_depth(const char *s, size_t n, di_error *err) {
    int depth = 0;
    size_t line = 1, col = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        col++;
        if (ch == '\n') line++, col = 0;
        if (in_str) {
            if (esc) esc = false;
            else if (ch == '\\') esc = true;
            else if (ch == '"') in_str = false;
            continue;
        }
        if (ch == '"') in_str = true;
        else if (ch == '[' || ch == '{') {
            if (++depth > DI_API_MAX_DEPTH)
                return api_fail(err, "invalid JSON request: recursion limit exceeded at line %zu column %zu", line, col);
        } else if (ch == ']' || ch == '}')
            depth--;
    }
    return DI_OK;
}

void di_request_free(di_request *r) {
    free(r->model);
    di_conv_free(&r->conv);
    free(r->sampling.logit_bias);
    for (size_t i = 0; i < r->parse.n_stop; i++) free(r->parse.stop[i]);
    free(r->parse.stop);
    free(r->constraint_spec);
    memset(r, 0, sizeof *r);
    di_conv_init(&r->conv);
}

int di_request_parse(di_api api, const char *body, size_t len, const di_api_options *opts, di_request *out,
                     di_error *err) {
    di_api_options defaults;
    if (!opts) di_api_options_default(&defaults), opts = &defaults;
    memset(out, 0, sizeof *out);
    di_conv_init(&out->conv);
    out->api = api;
    int rc = check_depth(body, len, err);
    if (rc) return rc;
    size_t ws = 0;
    while (ws < len && (body[ws] == ' ' || body[ws] == '\n' || body[ws] == '\r' || body[ws] == '\t')) ws++;
    if (ws == len) return api_fail(err, "invalid JSON request: EOF while parsing a value at line 1 column %zu", len);
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, &jerr);
    if (!root)
        return api_fail(err, "invalid JSON request: %s at line %d column %d", jerr.text, jerr.line, jerr.column);
    static const char *const STRUCT[] = {"struct ChatCompletionRequest", "struct ResponsesRequest",
                                         "struct MessagesRequest"};
    if (!json_is_object(root))
        rc = api_type_error(err, root, STRUCT[api]);
    else if (api == DI_API_CHAT)
        rc = api_parse_chat(root, opts, out, err);
    else if (api == DI_API_RESPONSES)
        rc = api_parse_responses(root, opts, out, err);
    else
        rc = api_parse_messages(root, opts, out, err);
    json_decref(root);
    if (rc) di_request_free(out);
    return rc;
}

int di_request_resolve_max_tokens(const di_request *r, int64_t prompt_tokens, int64_t context_limit, int64_t *out,
                                  di_error *err) {
    int64_t want = r->sampling.max_tokens;
    if (prompt_tokens + want > context_limit)
        return di_error_set(err, DI_ERR_LIMIT,
                            "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                            "(%lld in the messages, %lld in the completion). Please reduce the length of the messages "
                            "or completion.",
                            (long long)context_limit, (long long)(prompt_tokens + want), (long long)prompt_tokens,
                            (long long)want);
    if (!want)
        want = !r->conv.thinking ? 8192 : di_effort_value(r->conv.effort) == DI_EFFORT_MAX ? 131072 : 65536;
    int64_t room = context_limit - prompt_tokens;
    if (want > room) want = room;
    *out = want < 1 ? 1 : want;
    return DI_OK;
}

char *di_api_error_body(const di_error *err, int *http_status) {
    bool client = err->code == DI_ERR_INVALID || err->code == DI_ERR_LIMIT || err->code == DI_ERR_FORMAT;
    if (http_status) *http_status = client ? 400 : 500;
    const char *type = client ? "invalid_request_error" : "internal_error";
    json_t *doc = json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", err->msg, "type", type, "param", "code", type);
    char *s = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    return s;
}
