/* deepinfer run — the offline batch entry point.
 *
 *   deepinfer run --model DIR --input requests.jsonl --output results.jsonl
 *                 [--max-seqs N] [--max-context N] [--prefill-chunk N] [--threads N] [--seed S]
 *                 [--runner cached|recompute] [--prefix-cache-mb N] [--cache-mb N] [--device cpu|cuda] [--quiet]
 *                 [--json]
 *
 * Input: one JSON object per line (blank lines are skipped), any of
 *   {"custom_id": "a", "url": "/v1/chat/completions", "body": {...}}   OpenAI batch-file line
 *        (url /v1/chat/completions, /v1/responses or /v1/messages; "method" is ignored)
 *   {"custom_id": "b", "api": "chat" | "responses" | "messages", "body": {...}}
 *   {"custom_id": "c", "messages": [...], ...}   a bare request body: "input" → Responses; "messages"
 *        with a top-level "system", "stop_sequences" or "anthropic_version" → Messages; else Chat
 *   {"custom_id": "d", "prompt": "text" | "prompt_ids": [ids], "max_tokens": 16, "temperature": 1,
 *        "top_p", "top_k", "min_p", "seed", "stop": "s" | ["s", ...], "ignore_eos": false}
 *        a raw prompt (no chat template; text prompts start with BOS)
 * Output: one line per input line, in completion order, in the OpenAI batch-output shape:
 *   {"custom_id": ..., "line": N, "response": {"status_code": 200, "body": <response object>},
 *    "usage": {"prompt_tokens", "completion_tokens", "cache_hit_tokens"}, "error": null}
 * where the body is the protocol's complete response object (Chat Completions / Responses /
 * Messages, rendered by src/text/sse.h) or, for raw prompts, a text_completion object with the
 * token ids. A line that cannot run gets status_code 400 (or 500) and the API's error body, and
 * "error": {"code", "message"}; the other lines run regardless. With --prefix-cache-mb N (cached
 * runner) a request's prompt blocks already computed for an earlier request are restored instead of
 * recomputed (SWA bounded replay of keep = W + margin tokens, 140 for V4.1); usage.cache_hit_tokens
 * (and the body's cached-token fields) count them. A block is stored as soon as its request's
 * prefill has computed it, so a line admitted while an earlier one with the same system prompt is
 * still running shares it; lines admitted in the same step do not.
 *
 * Requests enter the engine in input order, at most 4 · max_seqs outstanding, so a file of any
 * length runs in bounded memory. Progress (requests done, tokens/s) goes to stderr. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "model/memplan.h"
#include "engine/api_protocol.h"
#include "engine/idmap.h"
#include "text/sse.h"
#include "text/stream.h"
#include "text/tokenizer.h"
#include "util/log.h"

enum { KIND_RAW = -1 };

typedef struct run_job {
    int64_t line;             /* 1-based input line */
    json_t *custom_id;        /* owned; JSON null when absent */
    int kind;                 /* di_api, or KIND_RAW */
    di_api_job pj;            /* protocol requests */
    di_stream *st;
    di_events ev;
    int32_t *raw_ids;         /* [n_raw] raw prompts */
    int64_t n_raw;
    di_request_options raw_ro;
    char *raw_stop[DI_API_MAX_STOP];
    int32_t *out_ids;         /* [cap_out] generated ids */
    int64_t n_out, cap_out;
    di_token_logprobs *lp;    /* [cap_out] when logprobs were asked */
    char *text;               /* [cap_text] raw prompts: generated text */
    size_t n_text, cap_text;
    int64_t prompt_tokens;
    int64_t cache_hit_tokens; /* prompt positions restored from the prefix cache */
    int cancelled_by_parser;  /* the output parser needed no more text */
} run_job;

typedef struct run_state {
    di_engine *e;
    FILE *out;
    di_idmap jobs;            /* engine id → run_job* */
    int64_t n_lines, n_done, n_ok, n_failed;
    int64_t prompt_tokens, completion_tokens;
    double t0, last_progress;
    int progress;             /* 0 quiet, 1 tty bar, 2 plain lines */
} run_state;

static void job_free(run_job *j) {
    if (!j) return;
    json_decref(j->custom_id);
    di_api_job_free(&j->pj);
    di_stream_free(j->st);
    di_events_free(&j->ev);
    free(j->raw_ids);
    for (int i = 0; i < DI_API_MAX_STOP; i++) free(j->raw_stop[i]);
    free(j->out_ids);
    free(j->lp);
    free(j->text);
    free(j);
}

static void write_line(run_state *s, json_t *doc) {
    char *t = json_dumps(doc, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (t) fprintf(s->out, "%s\n", t);
    free(t);
    json_decref(doc);
}

/* The failure record of one line. err->msg is the API's message for protocol rejections. */
static void write_error(run_state *s, int64_t line, json_t *custom_id, const di_error *err) {
    int status = 400;
    char *body = di_api_error_body(err, &status);
    json_t *b = body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    if (!b) b = json_pack("{s:{s:s}}", "error", "message", err->msg);
    json_t *doc = json_pack("{s:O,s:I,s:{s:i,s:o},s:n,s:{s:s,s:s}}", "custom_id", custom_id ? custom_id : json_null(),
                            "line", (json_int_t)line, "response", "status_code", status, "body", b, "usage", "error",
                            "code", di_status_name(err->code), "message", err->msg);
    write_line(s, doc);
    s->n_failed++;
    s->n_done++;
}

static int api_from_url(const char *url) {
    static const struct { const char *suffix; di_api api; } m[] = {
        {"/chat/completions", DI_API_CHAT}, {"/responses", DI_API_RESPONSES}, {"/messages", DI_API_MESSAGES}};
    size_t n = strlen(url);
    for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
        size_t k = strlen(m[i].suffix);
        if (n >= k && !strcmp(url + n - k, m[i].suffix)) return (int)m[i].api;
    }
    return -1;
}

/* Raw-prompt fields → request options. */
static int raw_options(run_job *j, json_t *o, di_error *err) {
    di_request_options *ro = &j->raw_ro;
    di_request_options_default(ro);
    ro->max_tokens = 16; /* the OpenAI Completions default */
    json_t *v;
    if ((v = json_object_get(o, "max_tokens"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            return di_error_set(err, DI_ERR_INVALID, "max_tokens: expected an integer >= 1");
        ro->max_tokens = json_integer_value(v);
    }
    struct { const char *name; float *dst; double lo, hi; } fl[] = {
        {"temperature", &ro->sampling.temperature, 0, 2},
        {"top_p", &ro->sampling.top_p, 0, 1},
        {"min_p", &ro->sampling.min_p, 0, 1},
        {"presence_penalty", &ro->sampling.presence_penalty, -2, 2},
        {"frequency_penalty", &ro->sampling.frequency_penalty, -2, 2},
        {"repetition_penalty", &ro->sampling.repetition_penalty, 0, 2}};
    for (size_t i = 0; i < sizeof fl / sizeof *fl; i++) {
        if (!(v = json_object_get(o, fl[i].name))) continue;
        if (!json_is_number(v) || json_number_value(v) < fl[i].lo || json_number_value(v) > fl[i].hi)
            return di_error_set(err, DI_ERR_INVALID, "%s: expected a number in [%g, %g]", fl[i].name, fl[i].lo, fl[i].hi);
        *fl[i].dst = (float)json_number_value(v);
    }
    if ((v = json_object_get(o, "top_k"))) {
        if (!json_is_integer(v)) return di_error_set(err, DI_ERR_INVALID, "top_k: expected an integer");
        ro->sampling.top_k = (int32_t)json_integer_value(v);
    }
    if ((v = json_object_get(o, "seed"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return di_error_set(err, DI_ERR_INVALID, "seed: expected an integer >= 0");
        ro->sampling.seed = (uint64_t)json_integer_value(v);
        ro->has_seed = 1;
    }
    if ((v = json_object_get(o, "ignore_eos"))) ro->ignore_eos = json_is_true(v);
    if ((v = json_object_get(o, "logprobs"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > DI_MAX_TOP_LOGPROBS)
            return di_error_set(err, DI_ERR_INVALID, "logprobs: expected an integer in [0, %d]", DI_MAX_TOP_LOGPROBS);
        ro->sampling.logprobs = 1;
        ro->sampling.n_top_logprobs = (int32_t)json_integer_value(v);
    }
    if ((v = json_object_get(o, "stop"))) {
        json_t *one = json_is_string(v) ? v : NULL;
        size_t n = one ? 1 : json_is_array(v) ? json_array_size(v) : (size_t)-1;
        if (n > DI_API_MAX_STOP)
            return di_error_set(err, DI_ERR_INVALID, "stop: expected a string or an array of at most %d strings",
                                DI_API_MAX_STOP);
        for (size_t i = 0; i < n; i++) {
            json_t *s = one ? one : json_array_get(v, i);
            if (!json_is_string(s) || !json_string_length(s))
                return di_error_set(err, DI_ERR_INVALID, "stop[%zu]: expected a non-empty string", i);
            j->raw_stop[i] = strdup(json_string_value(s));
            if (!j->raw_stop[i]) return di_error_set(err, DI_ERR_NOMEM, "out of memory");
        }
        ro->stop = (const char *const *)j->raw_stop;
        ro->n_stop = (int32_t)n;
    }
    return DI_OK;
}

/* Parse one input line into a job and add it to the engine. Returns DI_OK, or an error for the line. */
static int start_job(run_state *s, run_job *j, const char *line, size_t len, di_error *err) {
    json_error_t je;
    json_t *o = json_loadb(line, len, 0, &je);
    if (!o) return di_error_set(err, DI_ERR_FORMAT, "line %lld: not JSON: %s (column %d)", (long long)j->line, je.text,
                                je.column);
    if (!json_is_object(o)) {
        json_decref(o);
        return di_error_set(err, DI_ERR_FORMAT, "line %lld: expected a JSON object", (long long)j->line);
    }
    json_t *cid = json_object_get(o, "custom_id");
    j->custom_id = json_incref(cid ? cid : json_null());
    json_t *body = json_object_get(o, "body"), *url = json_object_get(o, "url"), *api = json_object_get(o, "api");
    int rc = DI_OK;
    int64_t id = 0;
    if (json_object_get(o, "prompt") || json_object_get(o, "prompt_ids")) {
        j->kind = KIND_RAW;
        rc = raw_options(j, o, err);
        json_t *p = json_object_get(o, "prompt"), *pid = json_object_get(o, "prompt_ids");
        if (!rc && pid) {
            size_t n = json_is_array(pid) ? json_array_size(pid) : 0;
            j->raw_ids = malloc((n ? n : 1) * sizeof *j->raw_ids);
            if (!n || !j->raw_ids) rc = di_error_set(err, DI_ERR_INVALID, "prompt_ids: expected a non-empty array of ids");
            for (size_t i = 0; !rc && i < n; i++) {
                json_t *t = json_array_get(pid, i);
                if (!json_is_integer(t)) rc = di_error_set(err, DI_ERR_INVALID, "prompt_ids[%zu]: expected an integer", i);
                else j->raw_ids[i] = (int32_t)json_integer_value(t);
            }
            j->n_raw = (int64_t)n;
            if (!rc) rc = di_engine_add_tokens(s->e, j->raw_ids, j->n_raw, &j->raw_ro, &id, err);
        } else if (!rc) {
            if (!json_is_string(p)) rc = di_error_set(err, DI_ERR_INVALID, "prompt: expected a string");
            else rc = di_engine_add_text(s->e, json_string_value(p), json_string_length(p), &j->raw_ro, &id, err);
        }
        if (!rc && j->raw_ro.sampling.logprobs) j->lp = malloc(sizeof *j->lp); /* marks "keep logprobs" */
    } else {
        int kind = -1;
        if (json_is_string(url)) {
            kind = api_from_url(json_string_value(url));
            if (kind < 0) rc = di_error_set(err, DI_ERR_INVALID, "url \"%s\": expected /v1/chat/completions, "
                                            "/v1/responses or /v1/messages", json_string_value(url));
        } else if (json_is_string(api)) {
            kind = di_api_from_name(json_string_value(api));
            if (kind < 0) rc = di_error_set(err, DI_ERR_INVALID, "api \"%s\": expected chat, responses or messages",
                                            json_string_value(api));
        }
        json_t *req = body;
        if (!rc && !req) {
            /* a bare request: the line itself, without the batch fields */
            req = json_deep_copy(o);
            json_object_del(req, "custom_id");
            json_object_del(req, "api");
            json_object_del(req, "url");
            json_object_del(req, "method");
        } else {
            json_incref(req);
        }
        if (!rc && kind < 0) {
            if (json_object_get(req, "input")) kind = DI_API_RESPONSES;
            else if (json_object_get(req, "system") || json_object_get(req, "stop_sequences") ||
                     json_object_get(req, "anthropic_version"))
                kind = DI_API_MESSAGES;
            else if (json_object_get(req, "messages")) kind = DI_API_CHAT;
            else rc = di_error_set(err, DI_ERR_INVALID, "line %lld: not a request: expected \"messages\", \"input\", "
                                   "\"prompt\" or \"prompt_ids\"", (long long)j->line);
        }
        char *text = !rc && json_is_object(req) ? json_dumps(req, JSON_COMPACT) : NULL;
        if (!rc && !text) rc = di_error_set(err, DI_ERR_INVALID, "body: expected a JSON object");
        json_decref(req);
        if (!rc) {
            j->kind = kind;
            rc = di_api_job_prepare(s->e, (di_api)kind, text, strlen(text), &j->pj, err);
        }
        free(text);
        if (!rc) rc = di_stream_new(&j->pj.req.parse, &j->st, err);
        if (!rc) {
            rc = di_engine_add_tokens(s->e, j->pj.ids, (int64_t)j->pj.n_ids, &j->pj.ro, &id, err);
        }
        if (!rc && j->pj.ro.sampling.logprobs) j->lp = malloc(sizeof *j->lp);
    }
    json_decref(o);
    if (rc) return rc;
    if (di_idmap_put(&s->jobs, id, j)) {
        di_engine_cancel(s->e, id, NULL);
        return di_error_set(err, DI_ERR_NOMEM, "out of memory");
    }
    return DI_OK;
}

static int job_append(run_job *j, const di_delta *d) {
    if (j->n_out + d->n_tokens > j->cap_out) {
        int64_t cap = j->cap_out ? j->cap_out : 64;
        while (cap < j->n_out + d->n_tokens) cap *= 2;
        int32_t *t = realloc(j->out_ids, (size_t)cap * sizeof *t);
        if (!t) return -1;
        j->out_ids = t;
        if (j->lp) {
            di_token_logprobs *l = realloc(j->lp, (size_t)cap * sizeof *l);
            if (!l) return -1;
            j->lp = l;
        }
        j->cap_out = cap;
    }
    memcpy(j->out_ids + j->n_out, d->tokens, (size_t)d->n_tokens * sizeof *d->tokens);
    if (j->lp && d->logprobs) memcpy(j->lp + j->n_out, d->logprobs, (size_t)d->n_tokens * sizeof *d->logprobs);
    j->n_out += d->n_tokens;
    if (j->kind == KIND_RAW && d->n_text) {
        if (j->n_text + d->n_text + 1 > j->cap_text) {
            size_t cap = j->cap_text ? j->cap_text : 256;
            while (cap < j->n_text + d->n_text + 1) cap *= 2;
            char *t = realloc(j->text, cap);
            if (!t) return -1;
            j->text = t, j->cap_text = cap;
        }
        memcpy(j->text + j->n_text, d->text, d->n_text);
        j->n_text += d->n_text;
        j->text[j->n_text] = 0;
    }
    return 0;
}

/* The decoded text of one token for logprob reports (lossy for a token that splits a character). */
static char *token_text(const di_tokenizer *tok, int32_t id) {
    char *t = NULL;
    size_t n = 0;
    if (!tok || di_tok_decode(tok, &id, 1, &t, &n, NULL)) return strdup("");
    return t;
}

static json_t *protocol_body(run_state *s, run_job *j, di_finish_reason why, di_usage *u) {
    di_finish f = why == DI_FINISH_REASON_LENGTH ? DI_FINISH_LENGTH : DI_FINISH_STOP;
    di_stream_finish(j->st, f, &j->ev, NULL);
    di_events_clear(&j->ev);
    di_stream_usage(j->st, u);
    u->prompt_tokens = j->prompt_tokens;
    u->cache_hit_tokens = j->cache_hit_tokens;
    u->completion_tokens = j->n_out;
    char id[64];
    static const char *const prefix[] = {"chatcmpl-", "resp_", "msg_"};
    snprintf(id, sizeof id, "%srun-%lld", prefix[j->kind], (long long)j->line);
    di_response_info info = {.api = (di_api)j->kind,
                             .id = id,
                             .model = j->pj.req.model,
                             .created = (int64_t)time(NULL),
                             .logprobs = j->pj.req.sampling.logprobs,
                             .thinking = j->pj.req.conv.thinking};
    /* logprobs in the response's shape: token texts from the tokenizer */
    const di_tokenizer *tok = di_engine_tokenizer(s->e);
    size_t n_lp = j->lp ? (size_t)j->n_out : 0;
    di_token_logprob *lp = n_lp ? calloc(n_lp, sizeof *lp) : NULL;
    char **texts = n_lp ? calloc(n_lp * (DI_MAX_TOP_LOGPROBS + 1), sizeof *texts) : NULL;
    if (!lp || !texts) n_lp = 0;
    for (size_t i = 0; i < n_lp; i++) {
        char **row = texts + i * (DI_MAX_TOP_LOGPROBS + 1);
        row[0] = token_text(tok, j->out_ids[i]);
        for (int32_t k = 0; k < j->lp[i].n_top; k++) row[1 + k] = token_text(tok, j->lp[i].top_ids[k]);
        lp[i] = (di_token_logprob){.token = row[0],
                                   .logprob = j->lp[i].logprob,
                                   .n_top = (size_t)j->lp[i].n_top,
                                   .top_token = (const char *const *)(row + 1),
                                   .top_logprob = j->lp[i].top_logprobs};
    }
    char *resp = di_response_json(&info, j->st, u, n_lp ? lp : NULL, n_lp);
    for (size_t i = 0; texts && i < n_lp * (DI_MAX_TOP_LOGPROBS + 1); i++) free(texts[i]);
    free(texts);
    free(lp);
    json_t *b = resp ? json_loads(resp, 0, NULL) : NULL;
    free(resp);
    return b;
}

static json_t *raw_body(run_job *j, di_finish_reason why) {
    json_t *ids = json_array();
    for (int64_t i = 0; i < j->n_out; i++) json_array_append_new(ids, json_integer(j->out_ids[i]));
    /* the engine's text is the tokens' raw bytes: a random or truncated generation may end inside a
     * character or hold bytes that never form one; JSON needs valid UTF-8 (U+FFFD, as HF's decode) */
    size_t n_text = 0;
    char *text = di_utf8_lossy_dup(j->text ? j->text : "", j->text ? j->n_text : 0, &n_text);
    json_t *choice = text ? json_pack("{s:i,s:s%,s:o,s:s}", "index", 0, "text", text, n_text, "token_ids", ids,
                                      "finish_reason", why == DI_FINISH_REASON_LENGTH ? "length" : "stop")
                          : NULL;
    free(text);
    if (!choice) return NULL;
    if (j->lp) {
        json_t *l = json_array();
        for (int64_t i = 0; i < j->n_out; i++) json_array_append_new(l, json_real(j->lp[i].logprob));
        json_object_set_new(choice, "logprobs", json_pack("{s:o}", "token_logprobs", l));
    }
    char id[64];
    snprintf(id, sizeof id, "cmpl-run-%lld", (long long)j->line);
    return json_pack("{s:s,s:s,s:I,s:[o]}", "id", id, "object", "text_completion", "created", (json_int_t)time(NULL),
                     "choices", choice);
}

static void finish_job(run_state *s, run_job *j, const di_delta *d) {
    if (d->finish == DI_FINISH_REASON_ERROR) {
        di_error e = {.code = DI_ERR_INTERNAL};
        snprintf(e.msg, sizeof e.msg, "%s", d->error ? d->error : "engine error");
        write_error(s, j->line, j->custom_id, &e);
        return;
    }
    di_finish_reason why = j->cancelled_by_parser ? DI_FINISH_REASON_STOP : d->finish;
    di_usage u = {.prompt_tokens = j->prompt_tokens, .completion_tokens = j->n_out, .cache_hit_tokens = j->cache_hit_tokens};
    json_t *body = j->kind == KIND_RAW ? raw_body(j, why) : protocol_body(s, j, why, &u);
    if (!body) {
        di_error e = {.code = DI_ERR_NOMEM, .msg = "rendering the response failed"};
        write_error(s, j->line, j->custom_id, &e);
        return;
    }
    json_t *doc = json_pack("{s:O,s:I,s:{s:i,s:o},s:{s:I,s:I,s:I},s:n}", "custom_id", j->custom_id, "line",
                            (json_int_t)j->line, "response", "status_code", 200, "body", body, "usage",
                            "prompt_tokens", (json_int_t)j->prompt_tokens, "completion_tokens", (json_int_t)j->n_out,
                            "cache_hit_tokens", (json_int_t)j->cache_hit_tokens, "error");
    write_line(s, doc);
    s->n_ok++;
    s->n_done++;
    s->prompt_tokens += j->prompt_tokens;
    s->completion_tokens += j->n_out;
}

static void on_delta(run_state *s, const di_delta *d) {
    run_job *j = di_idmap_get(&s->jobs, d->id);
    if (!j) return;
    j->prompt_tokens = d->prompt_tokens;
    /* a recompute after preemption may restore generated positions too; usage counts prompt ones */
    j->cache_hit_tokens = d->cache_hit_tokens < d->prompt_tokens ? d->cache_hit_tokens : d->prompt_tokens;
    if (job_append(j, d)) {
        di_engine_cancel(s->e, d->id, NULL); /* out of memory: end it; reported when the cancel lands */
    } else if (j->st && d->n_text) {
        di_stream_push(j->st, d->text, d->n_text, d->n_tokens, &j->ev, NULL);
        di_events_clear(&j->ev);
        if (!d->finish && di_stream_done(j->st) && !j->cancelled_by_parser) {
            j->cancelled_by_parser = 1;
            di_engine_cancel(s->e, d->id, NULL);
        }
    } else if (j->st && d->n_tokens) {
        di_stream_push(j->st, "", 0, d->n_tokens, &j->ev, NULL); /* tokens without text still count */
        di_events_clear(&j->ev);
    }
    if (d->finish) {
        finish_job(s, j, d);
        di_idmap_del(&s->jobs, d->id);
        job_free(j);
    }
}

static void progress(run_state *s, int final) {
    if (!s->progress) return;
    double now = di_now();
    if (!final && now - s->last_progress < (s->progress == 1 ? 0.2 : 5.0)) return;
    s->last_progress = now;
    double el = now - s->t0;
    di_engine_stats st;
    di_engine_get_stats(s->e, &st);
    double tps = el > 0 ? (double)st.generated_tokens / el : 0;
    if (s->progress == 1) {
        int width = 30, fill = s->n_lines ? (int)(width * s->n_done / s->n_lines) : width;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[width] = 0;
        fprintf(stderr, "\r[%s] %lld/%lld requests  %.1f tok/s  %.1f s%s", bar, (long long)s->n_done,
                (long long)s->n_lines, tps, el, final ? "\n" : "");
    } else {
        fprintf(stderr, "run: %lld/%lld requests, %.1f tok/s, %.1f s\n", (long long)s->n_done, (long long)s->n_lines,
                tps, el);
    }
    fflush(stderr);
}

/* Input lines, kept as offsets into the file's text. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (size_t k; b && (k = fread(b + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (cap - n - 1 == 0) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    fclose(f);
    if (b) b[n] = 0;
    *len = n;
    return b;
}

int cmd_run(int argc, char **argv) {
    di_args a;
    cli_args_init(&a, argc, argv);
    di_cli cli = {.cmd = "run", .json = cli_flag(&a, "json")};
    const char *model = cli_str(&a, "model", NULL), *in = cli_str(&a, "input", NULL), *outp = cli_str(&a, "output", NULL);
    const char *device = "cpu", *runner = cli_str(&a, "runner", "cached");
    long long max_seqs = 16, max_ctx = 0, chunk = 512, threads = 0, seed = 0, prefix_mb = 0, cache_mb = 0;
    bool quiet = cli_flag(&a, "quiet");
    bool ok = cli_device(&cli, &a, &device) && cli_int(&cli, &a, "max-seqs", 16, 1, 4096, &max_seqs) &&
              cli_int(&cli, &a, "max-context", 0, 0, 1 << 24, &max_ctx) &&
              cli_int(&cli, &a, "prefill-chunk", 512, 1, 1 << 20, &chunk) &&
              cli_int(&cli, &a, "threads", 0, 0, 1024, &threads) &&
              cli_int(&cli, &a, "prefix-cache-mb", 0, 0, 1 << 24, &prefix_mb) &&
              cli_int(&cli, &a, "cache-mb", 0, 0, 1 << 24, &cache_mb) && cli_int(&cli, &a, "seed", 0, 0, INT64_MAX, &seed) &&
              cli_check_unused(&cli, &a);
    cli_args_free(&a);
    if (!ok) return 1;
    if (!model || !in || !outp) return cli_fail(&cli, "usage: deepinfer run --model DIR --input FILE.jsonl --output FILE.jsonl");
    size_t len = 0;
    char *text = read_all(in, &len);
    if (!text) return cli_fail(&cli, "cannot read %s", in);
    di_engine_options eo;
    di_engine_options_default(&eo);
    eo.device = device;
    eo.runner = runner;
    eo.max_seqs = (int32_t)max_seqs;
    eo.max_context = max_ctx;
    eo.prefill_chunk = (int32_t)chunk;
    eo.max_step_tokens = chunk > 2048 ? chunk : 2048;
    eo.n_threads = (int32_t)threads;
    eo.seed = (uint64_t)seed;
    eo.prefix_cache_bytes = (int64_t)prefix_mb << 20;
    eo.cache_bytes = (int64_t)cache_mb << 20;
    di_error err = {0};
    run_state s = {.progress = quiet ? 0 : isatty(2) ? 1 : 2};
    /* the memory plan before any weight is read: one sequence of the context limit (or one prefill
     * chunk) must fit beside the weights; the engine's cache pool sizes the rest (--cache-mb) */
    if (di_memplan_preflight(model, strcmp(device, "cuda") ? DI_PLAN_CPU : DI_PLAN_CUDA, 1, max_ctx ? max_ctx : chunk,
                             stderr, &err) ||
        di_engine_open(model, &eo, &s.e, &err)) {
        free(text);
        return cli_fail_err(&cli, &err);
    }
    s.out = fopen(outp, "w");
    if (!s.out) {
        di_engine_close(s.e);
        free(text);
        return cli_fail(&cli, "cannot write %s", outp);
    }
    di_idmap_init(&s.jobs);
    /* lines with content, for the progress total */
    for (size_t i = 0, blank_line = 1; i < len; i++) {
        if (text[i] == '\n') {
            blank_line = 1;
        } else if (blank_line && text[i] != ' ' && text[i] != '\t' && text[i] != '\r') {
            s.n_lines++;
            blank_line = 0;
        }
    }
    s.t0 = di_now();
    const int64_t window = 4 * max_seqs;
    size_t pos = 0;
    int64_t line_no = 0;
    di_delta d[64];
    int rc = DI_OK;
    while (!rc) {
        while (pos < len && s.jobs.n < window) {
            char *nl = memchr(text + pos, '\n', len - pos);
            size_t end = nl ? (size_t)(nl - text) : len;
            line_no++;
            size_t b = pos, e = end;
            while (b < e && (text[b] == ' ' || text[b] == '\t' || text[b] == '\r')) b++;
            while (e > b && (text[e - 1] == ' ' || text[e - 1] == '\t' || text[e - 1] == '\r')) e--;
            pos = end + 1;
            if (b == e) continue;
            run_job *j = calloc(1, sizeof *j);
            if (!j) {
                rc = di_error_set(&err, DI_ERR_NOMEM, "out of memory");
                break;
            }
            j->line = line_no;
            di_error le = {0};
            if (start_job(&s, j, text + b, e - b, &le)) {
                write_error(&s, line_no, j->custom_id, &le);
                job_free(j);
            }
        }
        if (rc || (!di_engine_busy(s.e) && pos >= len)) break;
        rc = di_engine_step(s.e, &err);
        for (int32_t k; !rc && (k = di_engine_poll(s.e, d, 64)) > 0;)
            for (int32_t i = 0; i < k; i++) on_delta(&s, &d[i]);
        progress(&s, 0);
    }
    progress(&s, 1);
    di_engine_stats st;
    di_engine_get_stats(s.e, &st);
    double wall = di_now() - s.t0;
    for (int64_t i = 0; i < s.jobs.cap; i++) job_free(s.jobs.vals[i]);
    di_idmap_destroy(&s.jobs);
    di_engine_close(s.e);
    free(text);
    int wrc = fclose(s.out);
    if (rc) return cli_fail_err(&cli, &err);
    if (wrc) return cli_fail(&cli, "writing %s failed", outp);
    if (cli.json) {
        return cli_emit(&cli, json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "command", "run", "output", outp,
                                        "requests", (json_int_t)s.n_done, "succeeded", (json_int_t)s.n_ok, "failed",
                                        (json_int_t)s.n_failed, "prompt_tokens", (json_int_t)s.prompt_tokens,
                                        "completion_tokens", (json_int_t)s.completion_tokens, "steps",
                                        (json_int_t)st.steps, "wall_s", wall, "output_tok_per_s",
                                        wall > 0 ? (double)s.completion_tokens / wall : 0.0));
    }
    fprintf(stderr, "run: %lld requests (%lld ok, %lld failed), %lld prompt + %lld completion tokens, %.2f s -> %s\n",
            (long long)s.n_done, (long long)s.n_ok, (long long)s.n_failed, (long long)s.prompt_tokens,
            (long long)s.completion_tokens, wall, outp);
    return 0;
}
