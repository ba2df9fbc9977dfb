/* OpenAI Responses request → di_request (POST /v1/responses). Input items map onto the
 * conversation: messages by role (developer counts as system), function_call items become the
 * tool calls of an assistant turn, function_call_output items tool results, and a reasoning item
 * becomes the reasoning of the assistant turn that follows it. */
#include <stdlib.h>
#include <string.h>

#include "text/api_internal.h"

static const char RESP_VARIANTS[] = "`input_text`, `output_text`, `input_image`";
static const char *const TEXT_PARTS[] = {"input_text", "output_text", "text", NULL};

static di_message *open_assistant(di_conversation *conv, char **pending_reasoning) {
    di_message *m = di_conv_add(conv, DI_ROLE_ASSISTANT, "");
    if (m) m->reasoning = *pending_reasoning, *pending_reasoning = NULL;
    return m;
}

static bool call_known(const di_conversation *conv, const char *id) {
    for (size_t i = 0; i < conv->n_msgs; i++)
        for (size_t k = 0; k < conv->msgs[i].n_calls; k++)
            if (!strcmp(conv->msgs[i].calls[k].id, id)) return true;
    return false;
}

static int parse_item(const json_t *it, di_conversation *conv, char **pending, di_error *err) {
    if (!json_is_object(it)) return api_type_error(err, it, "an input item");
    const char *type = json_string_value(json_object_get(it, "type"));
    json_t *role = json_object_get(it, "role");
    int rc;
    if (!type || !strcmp(type, "message")) {
        if (!json_is_string(role)) return role ? api_type_error(err, role, "a string") : api_missing(err, "role");
        const char *rs = json_string_value(role);
        di_role r;
        if (!strcmp(rs, "user")) r = DI_ROLE_USER;
        else if (!strcmp(rs, "assistant")) r = DI_ROLE_ASSISTANT;
        else if (!strcmp(rs, "system") || !strcmp(rs, "developer")) r = DI_ROLE_SYSTEM;
        else return api_unknown_variant(err, rs, "`user`, `assistant`, `system`, `developer`");
        char *text;
        size_t n_images;
        if ((rc = api_content_text(json_object_get(it, "content"), TEXT_PARTS, RESP_VARIANTS, false, &text, &n_images, err))) return rc;
        di_message *m = r == DI_ROLE_ASSISTANT ? open_assistant(conv, pending) : di_conv_add(conv, r, text);
        if (m && r == DI_ROLE_ASSISTANT) free(m->content), m->content = text, text = NULL;
        free(text);
        if (!m) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
        m->n_images = n_images;
        return DI_OK;
    }
    if (!strcmp(type, "function_call")) {
        const char *id, *name, *args;
        if ((rc = api_opt_string(it, "call_id", &id, err)) || (rc = api_opt_string(it, "name", &name, err)) ||
            (rc = api_opt_string(it, "arguments", &args, err)))
            return rc;
        if (!id) return api_missing(err, "call_id");
        if (!name) return api_missing(err, "name");
        if (!args) return api_missing(err, "arguments");
        /* consecutive calls (and calls right after the assistant's text) share one assistant turn */
        di_message *m = conv->n_msgs ? &conv->msgs[conv->n_msgs - 1] : NULL;
        if (!m || m->role != DI_ROLE_ASSISTANT || *pending) m = open_assistant(conv, pending);
        if (!m || di_msg_add_call(m, id, name, args)) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
        return DI_OK;
    }
    if (!strcmp(type, "function_call_output")) {
        const char *id;
        if ((rc = api_opt_string(it, "call_id", &id, err))) return rc;
        if (!id) return api_missing(err, "call_id");
        if (!call_known(conv, id)) return api_fail(err, "No tool call found for tool output with call_id %.200s.", id);
        char *text;
        size_t n_images;
        if ((rc = api_content_text(json_object_get(it, "output"), TEXT_PARTS, RESP_VARIANTS, false, &text, &n_images, err))) return rc;
        di_message *m = di_conv_add(conv, DI_ROLE_TOOL, text);
        free(text);
        if (!m || !(m->tool_call_id = di_strdup(id))) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
        m->n_images = n_images;
        return DI_OK;
    }
    if (!strcmp(type, "reasoning")) {
        di_buf b = {0};
        size_t i;
        json_t *s;
        json_t *parts = json_object_get(it, "content");
        if (!json_array_size(parts)) parts = json_object_get(it, "summary");
        json_array_foreach(parts, i, s) {
            const char *t = json_string_value(json_object_get(s, "text"));
            if (!t) continue;
            if (b.len) di_buf_puts(&b, "\n\n");
            di_buf_puts(&b, t);
        }
        free(*pending);
        *pending = di_buf_take(&b);
        if (!*pending) *pending = di_strdup("");
        return *pending ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    return api_fail(err, "invalid request body: unsupported input item type `%.100s`", type);
}

static int parse_tools(const json_t *tools, di_conversation *conv, di_error *err) {
    if (!tools || json_is_null(tools)) return DI_OK;
    if (!json_is_array(tools)) return api_type_error(err, tools, "a sequence");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type) return api_missing(err, "type");
        if (!strncmp(type, "web_search", 10)) continue; /* server tool: dropped, as the reference does */
        if (strcmp(type, "function")) return api_fail(err, "Unsupported tool type: %.100s", type);
        json_t *params = json_object_get(t, "parameters");
        const char *ptype = json_string_value(json_object_get(params, "type"));
        if (params && (!ptype || strcmp(ptype, "object"))) {
            const char *name = json_string_value(json_object_get(t, "name"));
            char got[128];
            json_t *tv = json_object_get(params, "type");
            char *tj = tv ? di_json_dump(tv, DI_JSON_COMPACT) : NULL;
            snprintf(got, sizeof got, "%s", tj ? tj : "null");
            free(tj);
            return api_fail(err,
                            "Invalid schema for function '%.100s': schema must be a JSON Schema of 'type: \"object\"', "
                            "got 'type: %s'.",
                            name ? name : "", got);
        }
        int rc = api_add_tool(conv, json_object_get(t, "name"), json_object_get(t, "description"),
                              json_object_get(t, "parameters"), json_object_get(t, "strict"), err);
        if (rc) return rc;
    }
    return DI_OK;
}

int api_parse_responses(const json_t *root, const di_api_options *o, di_request *r, di_error *err) {
    json_t *model = json_object_get(root, "model");
    if (!model) return api_missing(err, "model");
    json_t *input = json_object_get(root, "input");
    if (!input) return api_missing(err, "input");
    int rc;
    const char *instructions;
    if ((rc = api_opt_string(root, "instructions", &instructions, err))) return rc;
    if (instructions && !di_conv_add(&r->conv, DI_ROLE_SYSTEM, instructions))
        return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    char *pending = NULL; /* reasoning waiting for its assistant turn */
    if (json_is_string(input)) {
        if (!di_conv_add(&r->conv, DI_ROLE_USER, json_string_value(input)))
            return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    } else if (json_is_array(input)) {
        size_t i;
        json_t *it;
        json_array_foreach(input, i, it) if ((rc = parse_item(it, &r->conv, &pending, err))) {
            free(pending);
            return rc;
        }
    } else {
        return api_type_error(err, input, "a string or a sequence");
    }
    free(pending);
    if ((rc = api_check_model(model, o, r, err))) return rc;
    if ((rc = parse_tools(json_object_get(root, "tools"), &r->conv, err))) return rc;

    api_common c = {.thinking = -1};
    json_t *choice = json_object_get(root, "tool_choice");
    if (json_is_string(choice)) {
        const char *s = json_string_value(choice);
        if (!strcmp(s, "none")) r->conv.tool_choice = DI_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "required")) r->conv.tool_choice = DI_TOOL_CHOICE_REQUIRED;
        else if (strcmp(s, "auto")) return api_unknown_variant(err, s, "`none`, `auto`, `required`");
    } else if (json_is_object(choice)) {
        json_t *name = json_object_get(choice, "name");
        if (!json_is_string(name)) return api_missing(err, "name");
        c.tool_choice_name = name;
    }
    json_t *fmt = json_object_get(json_object_get(root, "text"), "format");
    if ((rc = api_parse_format(fmt, fmt, &r->conv, err))) return rc;
    json_t *reasoning = json_object_get(root, "reasoning");
    if ((rc = api_parse_effort(json_object_get(reasoning, "effort"), &c.effort, &c.effort_disables, err))) return rc;
    c.temperature = json_object_get(root, "temperature");
    c.top_p = json_object_get(root, "top_p");
    c.top_k = json_object_get(root, "top_k");
    c.min_p = json_object_get(root, "min_p");
    c.max_tokens = json_object_get(root, "max_output_tokens");
    c.seed = json_object_get(root, "seed");
    c.repetition_penalty = json_object_get(root, "repetition_penalty");
    c.top_logprobs = json_object_get(root, "top_logprobs");
    if (c.top_logprobs && json_integer_value(c.top_logprobs) > 0) c.logprobs = json_true();
    r->stream = json_is_true(json_object_get(root, "stream"));
    rc = api_finish(r, &c, o, err);
    json_decref(c.logprobs);
    return rc;
}
