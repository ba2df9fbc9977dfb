/* Anthropic Messages request → di_request (POST /v1/messages). A user turn's tool_result blocks
 * become tool results (before the turn's text), an assistant turn's tool_use blocks its tool calls
 * (input re-serialized as the arguments JSON) and its thinking block its reasoning. */
#include <stdlib.h>
#include <string.h>

#include "text/api_internal.h"

static const char MSG_VARIANTS[] = "`text`, `image`";
static const char *const TEXT_PARTS[] = {"text", NULL};

static bool previous_has_call(const di_conversation *conv, const char *id) {
    for (size_t i = conv->n_msgs; i-- > 0;) {
        const di_message *m = &conv->msgs[i];
        if (m->role == DI_ROLE_TOOL) continue;
        if (m->role != DI_ROLE_ASSISTANT) return false;
        for (size_t k = 0; k < m->n_calls; k++)
            if (!strcmp(m->calls[k].id, id)) return true;
        return false;
    }
    return false;
}

static int parse_user(const json_t *content, size_t mi, di_conversation *conv, di_error *err) {
    if (!json_is_array(content)) {
        char *text;
        int rc = api_content_text(content, TEXT_PARTS, MSG_VARIANTS, false, &text, NULL, err);
        if (rc) return rc;
        di_message *m = di_conv_add(conv, DI_ROLE_USER, text);
        free(text);
        return m ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    json_t *rest = json_array(); /* the non-tool_result blocks, rendered as the user's text */
    size_t i;
    json_t *b;
    int rc = DI_OK;
    json_array_foreach(content, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type || strcmp(type, "tool_result")) {
            json_array_append(rest, b);
            continue;
        }
        const char *id = json_string_value(json_object_get(b, "tool_use_id"));
        if (!id) {
            rc = api_missing(err, "tool_use_id");
            break;
        }
        if (!previous_has_call(conv, id)) {
            rc = api_fail(err,
                          "unexpected `messages.%zu.content.%zu: tool_use_id` found in `tool_result` blocks: %.200s. "
                          "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                          mi, i, id);
            break;
        }
        char *text;
        size_t n_images;
        json_t *tc = json_object_get(b, "content");
        if ((rc = api_content_text(tc, TEXT_PARTS, MSG_VARIANTS, true, &text, &n_images, err))) break;
        di_message *m = di_conv_add(conv, DI_ROLE_TOOL, text);
        free(text);
        if (!m || !(m->tool_call_id = di_strdup(id))) {
            rc = di_error_set(err, DI_ERR_NOMEM, "out of memory");
            break;
        }
        m->n_images = n_images;
    }
    if (!rc && json_array_size(rest)) {
        char *text;
        size_t n_images;
        if (!(rc = api_content_text(rest, TEXT_PARTS, MSG_VARIANTS, false, &text, &n_images, err))) {
            di_message *m = di_conv_add(conv, DI_ROLE_USER, text);
            free(text);
            if (!m) rc = di_error_set(err, DI_ERR_NOMEM, "out of memory");
            else m->n_images = n_images;
        }
    }
    json_decref(rest);
    return rc;
}

static int parse_assistant(const json_t *content, di_conversation *conv, di_error *err) {
    di_message *m = di_conv_add(conv, DI_ROLE_ASSISTANT, "");
    if (!m) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    if (json_is_string(content)) {
        free(m->content);
        m->content = di_strdup(json_string_value(content));
        return m->content ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    if (!json_is_array(content)) return api_fail(err, "invalid request body: content should be a string or a list");
    di_buf text = {0};
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) return di_buf_free(&text), api_missing(err, "type");
        if (!strcmp(type, "text")) {
            const char *t = json_string_value(json_object_get(b, "text"));
            if (text.len) di_buf_puts(&text, "\n\n");
            di_buf_puts(&text, t ? t : "");
        } else if (!strcmp(type, "thinking")) {
            const char *t = json_string_value(json_object_get(b, "thinking"));
            free(m->reasoning);
            m->reasoning = di_strdup(t ? t : "");
        } else if (!strcmp(type, "tool_use")) {
            const char *id = json_string_value(json_object_get(b, "id"));
            const char *name = json_string_value(json_object_get(b, "name"));
            json_t *input = json_object_get(b, "input");
            if (!id || !name) return di_buf_free(&text), api_missing(err, id ? "name" : "id");
            char *args = input ? di_json_dump(input, DI_JSON_COMPACT) : di_strdup("{}");
            int rc = args ? di_msg_add_call(m, id, name, args) : DI_ERR_NOMEM;
            free(args);
            if (rc) return di_buf_free(&text), di_error_set(err, DI_ERR_NOMEM, "out of memory");
        } else if (strcmp(type, "redacted_thinking")) {
            di_buf_free(&text);
            return api_fail(err, "invalid request body: unsupported assistant content block type `%.100s`", type);
        }
    }
    free(m->content);
    m->content = text.len ? di_buf_take(&text) : di_strdup("");
    di_buf_free(&text);
    return m->content ? DI_OK : di_error_set(err, DI_ERR_NOMEM, "out of memory");
}

int api_parse_messages(const json_t *root, const di_api_options *o, di_request *r, di_error *err) {
    json_t *model = json_object_get(root, "model");
    if (!model) return api_missing(err, "model");
    json_t *messages = json_object_get(root, "messages");
    if (!messages) return api_missing(err, "messages");
    if (!json_is_array(messages)) return api_type_error(err, messages, "a sequence");
    int rc;
    json_t *system = json_object_get(root, "system");
    if (system && !json_is_null(system)) {
        char *text;
        if ((rc = api_content_text(system, TEXT_PARTS, MSG_VARIANTS, false, &text, NULL, err))) return rc;
        di_message *m = di_conv_add(&r->conv, DI_ROLE_SYSTEM, text);
        free(text);
        if (!m) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    size_t i;
    json_t *mj;
    json_array_foreach(messages, i, mj) {
        const char *role = json_string_value(json_object_get(mj, "role"));
        if (!role) return api_missing(err, "role");
        json_t *content = json_object_get(mj, "content");
        if (!strcmp(role, "user")) rc = parse_user(content, i, &r->conv, err);
        else if (!strcmp(role, "assistant")) rc = parse_assistant(content, &r->conv, err);
        else if (!strcmp(role, "system")) {
            char *text;
            if (!(rc = api_content_text(content, TEXT_PARTS, MSG_VARIANTS, false, &text, NULL, err))) {
                if (!di_conv_add(&r->conv, DI_ROLE_SYSTEM, text)) rc = di_error_set(err, DI_ERR_NOMEM, "out of memory");
                free(text);
            }
        }
        else rc = api_unknown_variant(err, role, "`user`, `assistant`");
        if (rc) return rc;
    }
    if ((rc = api_check_model(model, o, r, err))) return rc;

    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_array(tools)) return api_type_error(err, tools, "a sequence");
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && !strncmp(type, "web_search", 10))
            return api_fail(err, "Server tool web_search is not supported");
        if ((rc = api_add_tool(&r->conv, json_object_get(t, "name"), json_object_get(t, "description"),
                               json_object_get(t, "input_schema"), json_object_get(t, "strict"), err)))
            return rc;
    }
    api_common c = {.thinking = -1, .clamp_max_tokens = true};
    json_t *choice = json_object_get(root, "tool_choice");
    if (choice && !json_is_null(choice)) {
        const char *type = json_string_value(json_object_get(choice, "type"));
        if (!type) return api_missing(err, "type");
        /* "any" leaves the choice to the model, as the reference converts it */
        if (!strcmp(type, "none")) r->conv.tool_choice = DI_TOOL_CHOICE_NONE;
        else if (!strcmp(type, "tool")) {
            json_t *name = json_object_get(choice, "name");
            if (!json_is_string(name)) return api_missing(err, "name");
            c.tool_choice_name = name;
        } else if (strcmp(type, "auto") && strcmp(type, "any"))
            return api_unknown_variant(err, type, "`auto`, `any`, `tool`, `none`");
    }
    if ((rc = api_parse_thinking(json_object_get(root, "thinking"), &c, err))) return rc;
    json_t *oc = json_object_get(root, "output_config");
    if ((rc = api_parse_effort(json_object_get(oc, "effort"), &c.effort, &c.effort_disables, err))) return rc;
    c.temperature = json_object_get(root, "temperature");
    c.top_p = json_object_get(root, "top_p");
    c.top_k = json_object_get(root, "top_k");
    c.min_p = json_object_get(root, "min_p");
    c.max_tokens = json_object_get(root, "max_tokens");
    c.seed = json_object_get(root, "seed");
    c.repetition_penalty = json_object_get(root, "repetition_penalty");
    c.stop = json_object_get(root, "stop_sequences");
    r->stream = json_is_true(json_object_get(root, "stream"));
    return api_finish(r, &c, o, err);
}
