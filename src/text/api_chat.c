/* OpenAI Chat Completions request → di_request (POST /v1/chat/completions). */
#include <stdlib.h>
#include <string.h>

#include "text/api_internal.h"

static const char CHAT_VARIANTS[] = "`text`, `image_url`, `file`";
static const char *const TEXT_PARTS[] = {"text", NULL};
static const char ROLES[] = "`system`, `user`, `assistant`, `tool`, `latest_reminder`";

static int parse_role(const json_t *v, di_role *role, di_error *err) {
    if (!v) return api_missing(err, "role");
    if (!json_is_string(v)) return api_type_error(err, v, "a string");
    static const struct { const char *name; di_role role; } roles[] = {
        {"system", DI_ROLE_SYSTEM}, {"user", DI_ROLE_USER}, {"assistant", DI_ROLE_ASSISTANT},
        {"tool", DI_ROLE_TOOL},     {"latest_reminder", DI_ROLE_LATEST_REMINDER}};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(json_string_value(v), roles[i].name)) {
            *role = roles[i].role;
            return DI_OK;
        }
    return api_unknown_variant(err, json_string_value(v), ROLES);
}

static int parse_tool_calls(const json_t *calls, di_message *m, di_error *err) {
    if (!json_is_array(calls)) return api_type_error(err, calls, "a sequence");
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        if (!json_is_object(tc)) return api_type_error(err, tc, "struct ToolCall");
        json_t *fn = json_object_get(tc, "function");
        if (!fn) return api_missing(err, "function");
        if (!json_is_object(fn)) return api_type_error(err, fn, "struct Function");
        const char *id, *name, *args;
        int rc;
        if ((rc = api_opt_string(tc, "id", &id, err)) || (rc = api_opt_string(fn, "name", &name, err)) ||
            (rc = api_opt_string(fn, "arguments", &args, err)))
            return rc;
        if (!name) return api_missing(err, "name");
        if (!args) return api_missing(err, "arguments");
        if (di_msg_add_call(m, id, name, args)) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    return DI_OK;
}

static int parse_message(const json_t *mj, di_conversation *conv, di_error *err) {
    if (!json_is_object(mj)) return api_type_error(err, mj, "internally tagged enum ChatMessage");
    di_role role = DI_ROLE_USER;
    int rc = parse_role(json_object_get(mj, "role"), &role, err);
    if (rc) return rc;
    json_t *content = json_object_get(mj, "content");
    json_t *calls = json_object_get(mj, "tool_calls");
    bool has_calls = calls && !json_is_null(calls) && json_array_size(calls) > 0;
    if (role == DI_ROLE_ASSISTANT && (!content || json_is_null(content)) && !has_calls)
        return api_fail(err, "Invalid assistant message: content or tool_calls must be set");
    char *text;
    size_t n_images;
    if ((rc = api_content_text(content, TEXT_PARTS, CHAT_VARIANTS, role == DI_ROLE_ASSISTANT, &text, &n_images, err))) return rc;
    di_message *m = di_conv_add(conv, role, text);
    free(text);
    if (!m) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    m->n_images = n_images;
    if (role == DI_ROLE_ASSISTANT) {
        const char *reasoning;
        if ((rc = api_opt_string(mj, "reasoning_content", &reasoning, err))) return rc;
        m->reasoning = di_strdup(reasoning);
        if (has_calls && (rc = parse_tool_calls(calls, m, err))) return rc;
        json_t *prefix = json_object_get(mj, "prefix");
        m->prefix = json_is_true(prefix);
    } else if (role == DI_ROLE_TOOL) {
        const char *id;
        if ((rc = api_opt_string(mj, "tool_call_id", &id, err))) return rc;
        if (!id) return api_missing(err, "tool_call_id");
        m->tool_call_id = di_strdup(id);
    }
    return DI_OK;
}

static int parse_tools(const json_t *tools, di_conversation *conv, di_error *err) {
    if (!tools || json_is_null(tools)) return DI_OK;
    if (!json_is_array(tools)) return api_type_error(err, tools, "a sequence");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type) return api_missing(err, "type");
        if (strcmp(type, "function")) return api_unknown_variant(err, type, "`function`");
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) return fn ? api_type_error(err, fn, "struct FunctionDefinition") : api_missing(err, "function");
        int rc = api_add_tool(conv, json_object_get(fn, "name"), json_object_get(fn, "description"),
                              json_object_get(fn, "parameters"), json_object_get(fn, "strict"), err);
        if (rc) return rc;
    }
    return DI_OK;
}

static int parse_tool_choice(const json_t *v, di_conversation *conv, api_common *c, di_error *err) {
    if (!v || json_is_null(v)) return DI_OK;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "auto")) conv->tool_choice = DI_TOOL_CHOICE_AUTO;
        else if (!strcmp(s, "none")) conv->tool_choice = DI_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "required")) conv->tool_choice = DI_TOOL_CHOICE_REQUIRED;
        else return api_unknown_variant(err, s, "`none`, `auto`, `required`");
        return DI_OK;
    }
    json_t *fn = json_object_get(v, "function");
    json_t *name = json_object_get(fn, "name");
    if (!json_is_object(v) || !json_is_string(name)) return api_type_error(err, v, "a tool choice");
    c->tool_choice_name = name;
    return DI_OK;
}

/* response_format: text | json_object | json_schema {json_schema:{schema}} | regex {regex}
 * | ebnf {ebnf} (extension; also accepted: "grammar"). */
int api_parse_format(const json_t *fmt, const json_t *schema_holder, di_conversation *conv, di_error *err) {
    if (!fmt || json_is_null(fmt)) return DI_OK;
    json_t *type = json_object_get(fmt, "type");
    if (!json_is_object(fmt) || !type) return api_missing(err, "type");
    if (!json_is_string(type)) return api_type_error(err, type, "a string");
    const char *t = json_string_value(type);
    if (!strcmp(t, "text")) {
        conv->format = DI_FORMAT_TEXT;
    } else if (!strcmp(t, "json_object")) {
        conv->format = DI_FORMAT_JSON_OBJECT;
    } else if (!strcmp(t, "json_schema")) {
        json_t *schema = json_object_get(schema_holder, "schema");
        conv->format = DI_FORMAT_JSON_SCHEMA;
        conv->response_schema = schema ? di_json_dump(schema, DI_JSON_COMPACT) : di_strdup("{}");
        if (!conv->response_schema) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    } else if (!strcmp(t, "regex")) {
        const char *re = json_string_value(json_object_get(fmt, "regex"));
        if (!re) re = json_string_value(json_object_get(fmt, "pattern"));
        if (!re) return api_missing(err, "regex");
        conv->format = DI_FORMAT_REGEX;
        conv->response_regex = di_strdup(re);
    } else if (!strcmp(t, "ebnf") || !strcmp(t, "grammar")) {
        const char *g = json_string_value(json_object_get(fmt, t));
        if (!g) return api_missing(err, t);
        conv->format = DI_FORMAT_EBNF;
        conv->response_ebnf = di_strdup(g);
    } else {
        return api_unknown_variant(err, t, "`json_object`, `json_schema`, `regex`, `text`");
    }
    return DI_OK;
}

int api_parse_thinking(const json_t *v, api_common *c, di_error *err) {
    if (!v || json_is_null(v)) return DI_OK;
    json_t *type = json_object_get(v, "type");
    if (!json_is_object(v)) return api_type_error(err, v, "struct Thinking");
    if (!type) return api_missing(err, "type");
    const char *t = json_string_value(type);
    if (!t) return api_type_error(err, type, "a string");
    if (!strcmp(t, "enabled") || !strcmp(t, "adaptive")) c->thinking = 1;
    else if (!strcmp(t, "disabled")) c->thinking = 0;
    else return api_unknown_variant(err, t, "`adaptive`, `enabled`, `disabled`");
    return DI_OK;
}

int api_parse_chat(const json_t *root, const di_api_options *o, di_request *r, di_error *err) {
    json_t *messages = json_object_get(root, "messages");
    if (!messages) return api_missing(err, "messages");
    json_t *model = json_object_get(root, "model");
    if (!model) return api_missing(err, "model");
    if (!json_is_array(messages)) return api_type_error(err, messages, "a sequence");
    int rc;
    size_t i;
    json_t *mj;
    json_array_foreach(messages, i, mj) {
        if ((rc = parse_message(mj, &r->conv, err))) return rc;
        bool prefix = json_is_true(json_object_get(mj, "prefix"));
        if (prefix && (i + 1 != json_array_size(messages) || r->conv.msgs[r->conv.n_msgs - 1].role != DI_ROLE_ASSISTANT))
            return api_fail(err, "Invalid completion message: prefix set true with message which is not final message "
                                 "or message role is not assistant");
    }
    if ((rc = api_check_model(model, o, r, err))) return rc;
    if ((rc = api_check_tool_results(&r->conv, err))) return rc;
    if ((rc = parse_tools(json_object_get(root, "tools"), &r->conv, err))) return rc;

    api_common c = {.thinking = -1};
    if ((rc = parse_tool_choice(json_object_get(root, "tool_choice"), &r->conv, &c, err))) return rc;
    json_t *fmt = json_object_get(root, "response_format");
    if ((rc = api_parse_format(fmt, json_object_get(fmt, "json_schema"), &r->conv, err))) return rc;
    if ((rc = api_parse_thinking(json_object_get(root, "thinking"), &c, err))) return rc;
    if ((rc = api_parse_effort(json_object_get(root, "reasoning_effort"), &c.effort, &c.effort_disables, err)))
        return rc;
    c.temperature = json_object_get(root, "temperature");
    c.top_p = json_object_get(root, "top_p");
    c.top_k = json_object_get(root, "top_k");
    c.min_p = json_object_get(root, "min_p");
    c.max_tokens = json_object_get(root, "max_tokens");
    c.seed = json_object_get(root, "seed");
    c.n = json_object_get(root, "n");
    c.presence_penalty = json_object_get(root, "presence_penalty");
    c.frequency_penalty = json_object_get(root, "frequency_penalty");
    c.repetition_penalty = json_object_get(root, "repetition_penalty");
    c.logit_bias = json_object_get(root, "logit_bias");
    c.logprobs = json_object_get(root, "logprobs");
    c.top_logprobs = json_object_get(root, "top_logprobs");
    c.stop = json_object_get(root, "stop");
    r->stream = json_is_true(json_object_get(root, "stream"));
    r->include_usage = json_is_true(json_object_get(json_object_get(root, "stream_options"), "include_usage"));
    return api_finish(r, &c, o, err);
}
