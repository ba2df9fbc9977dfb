/* Chat Completions / Responses / Messages renderings of the parsed output (see sse.h). */
#include "text/sse.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef enum blk { BLK_NONE, BLK_REASONING, BLK_CONTENT, BLK_TOOL } blk;

struct di_sse {
    di_response_info info; /* id and model owned */
    int64_t seq;           /* responses: sequence_number */
    blk cur;               /* the open output item / content block */
    int32_t cur_tool;
    di_buf tool_name;      /* name of the open tool call */
    int64_t item;          /* responses output_index / messages block index of the open item */
    int64_t next_item;
    di_buf item_text;      /* text of the open item, for the *.done events */
};

/* ---- JSON helpers ---- */

static void frame(di_buf *out, const char *event, json_t *doc) {
    char *s = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (event) di_buf_printf(out, "event: %s\n", event);
    di_buf_printf(out, "data: %s\n\n", s ? s : "{}");
    free(s);
    json_decref(doc);
}

static json_t *str(const char *s) { return s ? json_string(s) : json_null(); }

void di_tool_call_id(const char *id, size_t index, char out[40]) {
    /* FNV-1a of the response id and index spread over 24 alphanumerics: stable across renders */
    static const char AL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t h = 1469598103934665603ull;
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ index) * 1099511628211ull;
    int n = snprintf(out, 40, "call_%02zu_", index % 100);
    for (int i = 0; i < 24; i++) {
        h ^= h >> 29, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 32;
        out[n + i] = AL[h % (sizeof AL - 1)];
    }
    out[n + 24] = '\0';
}

static json_t *usage_json(di_api api, const di_usage *u) {
    int64_t miss = u->prompt_tokens - u->cache_hit_tokens;
    if (api == DI_API_CHAT) {
        json_t *j = json_pack("{s:I,s:I,s:I,s:{s:I},s:I,s:I}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                              "completion_tokens", (json_int_t)u->completion_tokens, "total_tokens",
                              (json_int_t)(u->prompt_tokens + u->completion_tokens), "prompt_tokens_details",
                              "cached_tokens", (json_int_t)u->cache_hit_tokens, "prompt_cache_hit_tokens",
                              (json_int_t)u->cache_hit_tokens, "prompt_cache_miss_tokens", (json_int_t)miss);
        if (u->reasoning_tokens)
            json_object_set_new(j, "completion_tokens_details",
                                json_pack("{s:I}", "reasoning_tokens", (json_int_t)u->reasoning_tokens));
        return j;
    }
    if (api == DI_API_RESPONSES)
        return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)u->prompt_tokens,
                         "input_tokens_details", "cached_tokens", (json_int_t)u->cache_hit_tokens, "output_tokens",
                         (json_int_t)u->completion_tokens, "output_tokens_details", "reasoning_tokens",
                         (json_int_t)u->reasoning_tokens, "total_tokens",
                         (json_int_t)(u->prompt_tokens + u->completion_tokens));
    return json_pack("{s:I,s:i,s:I,s:I,s:s}", "input_tokens", (json_int_t)miss, "cache_creation_input_tokens", 0,
                     "cache_read_input_tokens", (json_int_t)u->cache_hit_tokens, "output_tokens",
                     (json_int_t)u->completion_tokens, "service_tier", "standard");
}

static json_t *logprob_entries(const di_token_logprob *lp, size_t n) {
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *top = json_array();
        for (size_t k = 0; k < lp[i].n_top; k++)
            json_array_append_new(top, json_pack("{s:s,s:f}", "token", lp[i].top_token[k], "logprob",
                                                 (double)lp[i].top_logprob[k]));
        json_array_append_new(arr, json_pack("{s:s,s:f,s:o}", "token", lp[i].token, "logprob", (double)lp[i].logprob,
                                             "top_logprobs", top));
    }
    return arr;
}

/* ---- complete responses ---- */

static json_t *response_obj(const di_response_info *info, const di_stream *st, const di_usage *u, json_t *logprobs) {
    const char *reasoning = di_stream_reasoning(st), *content = di_stream_content(st);
    const di_stream_call *calls;
    size_t n = di_stream_calls(st, &calls);
    di_finish fin = di_stream_finish_reason(st);
    char cid[40];
    if (info->api == DI_API_CHAT) {
        json_t *msg = json_pack("{s:s,s:s}", "role", "assistant", "content", content);
        if (reasoning) json_object_set_new(msg, "reasoning_content", json_string(reasoning));
        if (n) {
            json_t *tc = json_array();
            for (size_t i = 0; i < n; i++) {
                di_tool_call_id(info->id, i, cid);
                json_array_append_new(tc, json_pack("{s:I,s:s,s:s,s:{s:s,s:s}}", "index", (json_int_t)i, "id", cid,
                                                    "type", "function", "function", "name", calls[i].name,
                                                    "arguments", calls[i].arguments));
            }
            json_object_set_new(msg, "tool_calls", tc);
        }
        json_t *lp = logprobs ? json_pack("{s:o}", "content", logprobs) : json_null();
        return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o,s:o}],s:o,s:n}", "id", info->id, "object",
                         "chat.completion", "created", (json_int_t)info->created, "model", info->model, "choices",
                         "index", 0, "message", msg, "logprobs", lp, "finish_reason",
                         str(di_finish_name(fin, DI_API_CHAT)), "usage", usage_json(DI_API_CHAT, u),
                         "system_fingerprint");
    }
    if (info->api == DI_API_RESPONSES) {
        json_t *out = json_array();
        size_t k = 0;
        char iid[160];
        if (reasoning && reasoning[0]) { /* as streamed: an item only for reasoning that was written */
            snprintf(iid, sizeof iid, "rs_%s_%zu", info->id, k++);
            json_array_append_new(out, json_pack("{s:s,s:s,s:s,s:[{s:s,s:s}],s:[]}", "type", "reasoning", "id", iid,
                                                 "status", "completed", "content", "type", "reasoning_text", "text",
                                                 reasoning, "summary"));
        }
        if (content[0] || !n) {
            snprintf(iid, sizeof iid, "msg_%s_%zu", info->id, k++);
            json_array_append_new(out, json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:[],s:s}]}", "type", "message", "id", iid,
                                                 "status", "completed", "role", "assistant", "content", "type",
                                                 "output_text", "annotations", "text", content));
        }
        for (size_t i = 0; i < n; i++) {
            snprintf(iid, sizeof iid, "fc_%s_%zu", info->id, k++);
            di_tool_call_id(info->id, i, cid);
            json_array_append_new(out, json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", iid,
                                                 "status", "completed", "call_id", cid, "name", calls[i].name,
                                                 "arguments", calls[i].arguments));
        }
        bool incomplete = fin == DI_FINISH_LENGTH || fin == DI_FINISH_CONTENT_FILTER;
        json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o}", "id", info->id, "object", "response", "created_at",
                              (json_int_t)info->created, "status", incomplete ? "incomplete" : "completed", "model",
                              info->model, "output", out, "usage", usage_json(DI_API_RESPONSES, u));
        json_object_set_new(r, "incomplete_details",
                            incomplete ? json_pack("{s:s}", "reason", fin == DI_FINISH_LENGTH ? "max_output_tokens"
                                                                                              : "content_filter")
                                       : json_null());
        json_decref(logprobs);
        return r;
    }
    json_t *blocks = json_array();
    if (reasoning && reasoning[0])
        json_array_append_new(blocks, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", reasoning, "signature",
                                                info->id));
    if (content[0]) json_array_append_new(blocks, json_pack("{s:s,s:s}", "type", "text", "text", content));
    for (size_t i = 0; i < n; i++) {
        json_t *input = json_loads(calls[i].arguments, 0, NULL);
        if (!json_is_object(input)) json_decref(input), input = json_object(); /* an unfinished call */
        di_tool_call_id(info->id, i, cid);
        json_array_append_new(blocks, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", cid, "name",
                                                calls[i].name, "input", input));
    }
    json_decref(logprobs);
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:n,s:o}", "id", info->id, "type", "message", "role", "assistant",
                     "model", info->model, "content", blocks, "stop_reason",
                     str(di_finish_name(fin, DI_API_MESSAGES)), "stop_sequence", "usage",
                     usage_json(DI_API_MESSAGES, u));
}

char *di_response_json(const di_response_info *info, const di_stream *st, const di_usage *usage,
                       const di_token_logprob *lp, size_t n_lp) {
    json_t *doc = response_obj(info, st, usage, lp && info->logprobs ? logprob_entries(lp, n_lp) : NULL);
    char *s = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    return s;
}

/* ---- streaming ---- */

int di_sse_new(const di_response_info *info, di_sse **out, di_error *err) {
    di_sse *s = calloc(1, sizeof *s);
    if (!s) return di_error_set(err, DI_ERR_NOMEM, "sse: out of memory");
    s->info = *info;
    s->info.id = di_strdup(info->id ? info->id : "");
    s->info.model = di_strdup(info->model ? info->model : "");
    if (!s->info.id || !s->info.model) {
        di_sse_free(s);
        return di_error_set(err, DI_ERR_NOMEM, "sse: out of memory");
    }
    *out = s;
    return DI_OK;
}

void di_sse_free(di_sse *s) {
    if (!s) return;
    free((char *)s->info.id);
    free((char *)s->info.model);
    di_buf_free(&s->item_text);
    di_buf_free(&s->tool_name);
    free(s);
}

static json_t *chat_chunk(const di_sse *s, json_t *delta, json_t *logprobs, const char *finish, json_t *usage) {
    return json_pack("{s:s,s:s,s:I,s:s,s:n,s:[{s:i,s:o,s:o,s:o}],s:o}", "id", s->info.id, "object",
                     "chat.completion.chunk", "created", (json_int_t)s->info.created, "model", s->info.model,
                     "system_fingerprint", "choices", "index", 0, "delta", delta, "logprobs",
                     logprobs ? json_pack("{s:o}", "content", logprobs) : json_null(), "finish_reason", str(finish),
                     "usage", usage ? usage : json_null());
}

/* Responses: an event with the running sequence number. */
static void resp_event(di_sse *s, di_buf *out, const char *type, json_t *doc) {
    json_object_set_new(doc, "type", json_string(type));
    json_object_set_new(doc, "sequence_number", json_integer(s->seq++));
    frame(out, type, doc);
}

static void item_id(const di_sse *s, char *buf, size_t n) {
    const char *pre = s->cur == BLK_REASONING ? "rs" : s->cur == BLK_CONTENT ? "msg" : "fc";
    snprintf(buf, n, "%s_%s_%" PRId64, pre, s->info.id, s->item);
}

/* Responses: the open output item, in progress (as announced) or completed with its text. */
static json_t *resp_item(const di_sse *s, bool done, const char *text) {
    char iid[160], cid[40];
    item_id(s, iid, sizeof iid);
    const char *status = done ? "completed" : "in_progress";
    if (s->cur == BLK_TOOL) {
        di_tool_call_id(s->info.id, (size_t)s->cur_tool, cid);
        return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", iid, "status", status, "call_id",
                         cid, "name", s->tool_name.data ? s->tool_name.data : "", "arguments", done ? text : "");
    }
    json_t *content = json_array();
    if (done && s->cur == BLK_REASONING)
        json_array_append_new(content, json_pack("{s:s,s:s}", "type", "reasoning_text", "text", text));
    if (done && s->cur == BLK_CONTENT)
        json_array_append_new(content, json_pack("{s:s,s:[],s:s}", "type", "output_text", "annotations", "text", text));
    if (s->cur == BLK_REASONING)
        return json_pack("{s:s,s:s,s:s,s:o,s:[]}", "type", "reasoning", "id", iid, "status", status, "content", content,
                         "summary");
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", iid, "status", status, "role", "assistant",
                     "content", content);
}

static void close_block(di_sse *s, di_buf *out) {
    if (s->cur == BLK_NONE) return;
    const char *text = s->item_text.data ? s->item_text.data : "";
    char iid[160];
    item_id(s, iid, sizeof iid);
    if (s->info.api == DI_API_RESPONSES) {
        if (s->cur == BLK_TOOL) {
            char cid[40];
            di_tool_call_id(s->info.id, (size_t)s->cur_tool, cid);
            resp_event(s, out, "response.function_call_arguments.done",
                       json_pack("{s:s,s:s,s:I}", "arguments", text, "item_id", iid, "output_index", (json_int_t)s->item));
        } else {
            bool r = s->cur == BLK_REASONING;
            resp_event(s, out, r ? "response.reasoning_text.done" : "response.output_text.done",
                       json_pack("{s:i,s:s,s:I,s:s}", "content_index", 0, "item_id", iid, "output_index",
                                 (json_int_t)s->item, "text", text));
            resp_event(s, out, "response.content_part.done",
                       json_pack("{s:i,s:s,s:I,s:{s:s,s:s}}", "content_index", 0, "item_id", iid, "output_index",
                                 (json_int_t)s->item, "part", "type", r ? "reasoning_text" : "output_text", "text", text));
        }
        resp_event(s, out, "response.output_item.done",
                   json_pack("{s:o,s:I}", "item", resp_item(s, true, text), "output_index", (json_int_t)s->item));
    } else if (s->info.api == DI_API_MESSAGES) {
        if (s->cur == BLK_REASONING)
            frame(out, "content_block_delta",
                  json_pack("{s:s,s:I,s:{s:s,s:s}}", "type", "content_block_delta", "index", (json_int_t)s->item,
                            "delta", "type", "signature_delta", "signature", s->info.id));
        frame(out, "content_block_stop",
              json_pack("{s:s,s:I}", "type", "content_block_stop", "index", (json_int_t)s->item));
    }
    s->cur = BLK_NONE;
    s->item_text.len = 0;
}

static void open_block(di_sse *s, blk kind, int32_t tool, const char *name, di_buf *out) {
    close_block(s, out);
    s->cur = kind, s->cur_tool = tool, s->item = s->next_item++;
    char iid[160], cid[40];
    item_id(s, iid, sizeof iid);
    if (kind == BLK_TOOL) di_tool_call_id(s->info.id, (size_t)tool, cid);
    s->tool_name.len = 0;
    if (kind == BLK_TOOL) di_buf_puts(&s->tool_name, name);
    if (s->info.api == DI_API_RESPONSES) {
        resp_event(s, out, "response.output_item.added",
                   json_pack("{s:o,s:I}", "item", resp_item(s, false, ""), "output_index", (json_int_t)s->item));
        if (kind != BLK_TOOL)
            resp_event(s, out, "response.content_part.added",
                       json_pack("{s:i,s:s,s:I,s:{s:s,s:s}}", "content_index", 0, "item_id", iid, "output_index",
                                 (json_int_t)s->item, "part", "type",
                                 kind == BLK_REASONING ? "reasoning_text" : "output_text", "text", ""));
    } else if (s->info.api == DI_API_MESSAGES) {
        json_t *cb = kind == BLK_REASONING ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                     : kind == BLK_CONTENT ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                                           : json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", cid, "name",
                                                       name, "input");
        frame(out, "content_block_start",
              json_pack("{s:s,s:I,s:o}", "type", "content_block_start", "index", (json_int_t)s->item, "content_block", cb));
        if (s->item == 0) frame(out, "ping", json_pack("{s:s}", "type", "ping")); /* keep-alive, as the API sends */
    }
}

void di_sse_begin(di_sse *s, const di_usage *usage, di_buf *out) {
    if (s->info.api == DI_API_CHAT) {
        json_t *delta = s->info.thinking
                            ? json_pack("{s:s,s:n,s:s}", "role", "assistant", "content", "reasoning_content", "")
                            : json_pack("{s:s,s:s}", "role", "assistant", "content", "");
        frame(out, NULL, chat_chunk(s, delta, NULL, NULL, NULL));
    } else if (s->info.api == DI_API_RESPONSES) {
        const char *types[] = {"response.created", "response.in_progress"};
        for (int i = 0; i < 2; i++)
            resp_event(s, out, types[i],
                       json_pack("{s:{s:s,s:s,s:I,s:s,s:s,s:[]}}", "response", "id", s->info.id, "object", "response",
                                 "created_at", (json_int_t)s->info.created, "status", "in_progress", "model",
                                 s->info.model, "output"));
    } else {
        frame(out, "message_start",
              json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}}", "type", "message_start", "message", "id",
                        s->info.id, "type", "message", "role", "assistant", "model", s->info.model, "content",
                        "stop_reason", "stop_sequence", "usage", usage_json(DI_API_MESSAGES, usage)));
    }
}

void di_sse_events(di_sse *s, const di_events *ev, const di_token_logprob *lp, size_t n_lp, di_buf *out) {
    json_t *lps = lp && n_lp && s->info.logprobs ? logprob_entries(lp, n_lp) : NULL;
    for (size_t i = 0; i < ev->n; i++) {
        const di_event *e = &ev->ev[i];
        blk want = e->kind == DI_EV_REASONING ? BLK_REASONING : e->kind == DI_EV_CONTENT ? BLK_CONTENT : BLK_TOOL;
        char cid[40], iid[160];
        if (s->info.api == DI_API_CHAT) {
            json_t *delta;
            if (e->kind == DI_EV_REASONING) {
                delta = json_pack("{s:n,s:s%}", "content", "reasoning_content", e->text, e->len);
            } else if (e->kind == DI_EV_CONTENT) {
                delta = json_pack("{s:s%,s:n}", "content", e->text, e->len, "reasoning_content");
            } else if (e->kind == DI_EV_TOOL_START) {
                di_tool_call_id(s->info.id, (size_t)e->tool, cid);
                delta = json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index", e->tool, "id", cid, "type",
                                  "function", "function", "name", e->text, "arguments", "");
            } else {
                delta = json_pack("{s:[{s:i,s:{s:s%}}]}", "tool_calls", "index", e->tool, "function", "arguments",
                                  e->text, e->len);
            }
            frame(out, NULL, chat_chunk(s, delta, lps, NULL, NULL));
            lps = NULL; /* the push's logprobs ride on its first chunk */
            continue;
        }
        if (e->kind == DI_EV_TOOL_START || s->cur != want) open_block(s, want, e->tool, e->text, out);
        if (e->kind == DI_EV_TOOL_START) continue;
        di_buf_append(&s->item_text, e->text, e->len);
        item_id(s, iid, sizeof iid);
        if (s->info.api == DI_API_RESPONSES) {
            if (e->kind == DI_EV_TOOL_ARGS)
                resp_event(s, out, "response.function_call_arguments.delta",
                           json_pack("{s:s%,s:s,s:I}", "delta", e->text, e->len, "item_id", iid, "output_index",
                                     (json_int_t)s->item));
            else
                resp_event(s, out, e->kind == DI_EV_REASONING ? "response.reasoning_text.delta" : "response.output_text.delta",
                           json_pack("{s:i,s:s%,s:s,s:I}", "content_index", 0, "delta", e->text, e->len, "item_id", iid,
                                     "output_index", (json_int_t)s->item));
        } else {
            json_t *d = e->kind == DI_EV_REASONING ? json_pack("{s:s,s:s%}", "type", "thinking_delta", "thinking", e->text, e->len)
                        : e->kind == DI_EV_CONTENT ? json_pack("{s:s,s:s%}", "type", "text_delta", "text", e->text, e->len)
                                                   : json_pack("{s:s,s:s%}", "type", "input_json_delta", "partial_json",
                                                               e->text, e->len);
            frame(out, "content_block_delta",
                  json_pack("{s:s,s:I,s:o}", "type", "content_block_delta", "index", (json_int_t)s->item, "delta", d));
        }
    }
    if (lps && s->info.api == DI_API_CHAT) /* tokens that produced no visible text yet */
        frame(out, NULL, chat_chunk(s, json_object(), lps, NULL, NULL));
    else
        json_decref(lps);
}

void di_sse_end(di_sse *s, const di_stream *st, const di_usage *usage, di_buf *out) {
    di_finish fin = di_stream_finish_reason(st);
    if (s->info.api == DI_API_CHAT) {
        frame(out, NULL,
              chat_chunk(s, json_pack("{s:s,s:n}", "content", "", "reasoning_content"), NULL,
                         di_finish_name(fin, DI_API_CHAT), s->info.include_usage ? usage_json(DI_API_CHAT, usage) : NULL));
        di_buf_puts(out, "data: [DONE]\n\n");
        return;
    }
    close_block(s, out);
    if (s->info.api == DI_API_RESPONSES) {
        bool incomplete = fin == DI_FINISH_LENGTH || fin == DI_FINISH_CONTENT_FILTER;
        resp_event(s, out, incomplete ? "response.incomplete" : "response.completed",
                   json_pack("{s:o}", "response", response_obj(&s->info, st, usage, NULL)));
        return;
    }
    frame(out, "message_delta",
          json_pack("{s:s,s:{s:s,s:n},s:o}", "type", "message_delta", "delta", "stop_reason",
                    di_finish_name(fin, DI_API_MESSAGES), "stop_sequence", "usage", usage_json(DI_API_MESSAGES, usage)));
    frame(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}
