/* di-test: asan
 * Output parsing against the reference (tests/data/chat/stream_cases.json, from deepseek-recipe's
 * StreamProcessor): reasoning, answer, tool calls and finish reason of each model output, which
 * must come out identical for every way of chunking the text — whole, split at every byte
 * boundary into two pushes, and byte by byte. Also the SSE / complete-response renderings. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "text/api.h"
#include "text/chat_json.h"
#include "text/sse.h"
#include "text/stream.h"
#include "text/tokenizer.h"

typedef struct outcome {
    char *reasoning; /* NULL when thinking is off */
    char *content;
    char *calls;     /* "name(args)|name(args)|" */
    char *events_concat; /* per-kind concatenation of the deltas, to cross-check the accumulators */
    di_finish finish;
} outcome;

static void outcome_free(outcome *o) {
    free(o->reasoning);
    free(o->content);
    free(o->calls);
    free(o->events_concat);
}

/* Run the parser on `text` split at the given cut points (sorted, in (0, len)). */
static void run_split(const di_parse_options *po, const char *text, size_t len, const size_t *cuts, size_t n_cuts,
                      outcome *o) {
    di_stream *s;
    di_error err = {0};
    assert_int_equal(di_stream_new(po, &s, &err), DI_OK);
    di_events ev = {0};
    di_buf r = {0}, c = {0}, a = {0};
    size_t prev = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        assert_int_equal(di_stream_push(s, text + prev, end - prev, 1, &ev, &err), DI_OK);
        prev = end;
    }
    assert_int_equal(di_stream_finish(s, DI_FINISH_STOP, &ev, &err), DI_OK);
    for (size_t i = 0; i < ev.n; i++) {
        di_buf *b = ev.ev[i].kind == DI_EV_REASONING ? &r : ev.ev[i].kind == DI_EV_CONTENT ? &c : &a;
        if (ev.ev[i].kind == DI_EV_TOOL_START) di_buf_printf(b, "|%d:", ev.ev[i].tool);
        di_buf_append(b, ev.ev[i].text, ev.ev[i].len);
    }
    di_events_free(&ev);
    const char *rs = di_stream_reasoning(s);
    o->reasoning = rs ? strdup(rs) : NULL;
    o->content = strdup(di_stream_content(s));
    const di_stream_call *calls;
    size_t n = di_stream_calls(s, &calls);
    di_buf cb = {0};
    for (size_t i = 0; i < n; i++) di_buf_printf(&cb, "%s(%s)|", calls[i].name, calls[i].arguments);
    o->calls = cb.data ? di_buf_take(&cb) : strdup("");
    o->finish = di_stream_finish_reason(s);
    /* the deltas must add up to the accumulated values */
    assert_string_equal(c.data ? c.data : "", o->content);
    if (o->reasoning) assert_string_equal(r.data ? r.data : "", o->reasoning);
    di_buf_printf(&r, "#%s#%s", c.data ? c.data : "", a.data ? a.data : "");
    o->events_concat = di_buf_take(&r);
    di_buf_free(&c);
    di_buf_free(&a);
    di_stream_free(s);
}

static void parse_options_of(const json_t *cs, di_request *req) {
    char *body = json_dumps(json_object_get(cs, "request"), JSON_COMPACT | JSON_PRESERVE_ORDER);
    di_error err = {0};
    assert_int_equal(di_request_parse(DI_API_CHAT, body, strlen(body), NULL, req, &err), DI_OK);
    free(body);
}

/* Compare with the reference's result; prints the difference and returns false on mismatch. */
static bool expect_outcome(const json_t *cs, const outcome *o) {
    const char *name = json_string_value(json_object_get(cs, "name"));
    json_t *wr = json_object_get(cs, "reasoning");
    const char *wc = json_string_value(json_object_get(cs, "content"));
    const char *wf = json_string_value(json_object_get(cs, "finish_reason"));
    di_buf cb = {0};
    size_t i;
    json_t *tc;
    json_array_foreach(json_object_get(cs, "tool_calls"), i, tc)
        di_buf_printf(&cb, "%s(%s)|", json_string_value(json_object_get(tc, "name")),
                      json_string_value(json_object_get(tc, "arguments")));
    bool ok = json_is_null(wr) == (o->reasoning == NULL) && (!o->reasoning || !strcmp(o->reasoning, json_string_value(wr))) &&
              !strcmp(o->content, wc ? wc : "") && !strcmp(o->calls, cb.data ? cb.data : "") &&
              !strcmp(di_finish_name(o->finish, DI_API_CHAT), wf);
    if (!ok)
        printf("# case %s (output \"%s\"):\n#   ours: reasoning=%s content=%s calls=%s finish=%s\n"
               "#   want: reasoning=%s content=%s calls=%s finish=%s\n",
               name, json_string_value(json_object_get(cs, "output")), o->reasoning ? o->reasoning : "(null)",
               o->content, o->calls, di_finish_name(o->finish, DI_API_CHAT),
               json_is_null(wr) ? "(null)" : json_string_value(wr), wc ? wc : "", cb.data ? cb.data : "", wf);
    di_buf_free(&cb);
    return ok;
}

static void golden_every_split(const char *file) {
    json_error_t je;
    json_t *cases = json_load_file(tu_data(file), 0, &je);
    size_t n_bad = 0;
    if (!cases) fail_msg("cannot load stream_cases.json: %s", je.text);
    size_t i, runs = 0;
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        if (strcmp(json_string_value(json_object_get(cs, "api")), "chat")) continue; /* see test_protocol_renderings */
        di_request req;
        parse_options_of(cs, &req);
        const char *text = json_string_value(json_object_get(cs, "output"));
        size_t len = strlen(text);
        outcome whole;
        run_split(&req.parse, text, len, NULL, 0, &whole);
        n_bad += !expect_outcome(cs, &whole);
        runs++;
        for (size_t cut = 1; cut < len; cut++) {
            outcome o;
            run_split(&req.parse, text, len, &cut, 1, &o);
            if (strcmp(o.events_concat, whole.events_concat) || strcmp(o.calls, whole.calls) || o.finish != whole.finish)
                fail_msg("case %s: split at byte %zu gives %s / %s, whole gives %s / %s",
                         json_string_value(json_object_get(cs, "name")), cut, o.events_concat, o.calls,
                         whole.events_concat, whole.calls);
            outcome_free(&o);
            runs++;
        }
        size_t *cuts = malloc((len ? len : 1) * sizeof *cuts); /* [len-1] every boundary */
        for (size_t k = 1; k < len; k++) cuts[k - 1] = k;
        outcome bytes;
        run_split(&req.parse, text, len, cuts, len ? len - 1 : 0, &bytes);
        assert_string_equal(bytes.events_concat, whole.events_concat);
        assert_string_equal(bytes.calls, whole.calls);
        runs++;
        free(cuts);
        outcome_free(&bytes);
        outcome_free(&whole);
        di_request_free(&req);
    }
    tu_report("%s: %zu outputs, %zu differ from the reference; parser runs (whole + every split + bytewise): %zu",
              file, json_array_size(cases), n_bad, runs);
    assert_int_equal(n_bad, 0);
    assert_true(json_array_size(cases) >= 20);
    json_decref(cases);
}

static void test_stream_golden_every_split(void **state) {
    (void)state;
    golden_every_split("chat/stream_cases.json");
}

/* Outputs assembled at random from markers, newlines and text, parsed by the reference. */
static void test_stream_random_every_split(void **state) {
    (void)state;
    golden_every_split("chat/stream_random.json");
}

/* ---- protocol renderings ---- */

static const char *kind_of(const json_t *o) { return json_string_value(json_object_get(o, "type")); }

/* The parts of a complete response that carry results, in one comparable string. */
static char *summarize(const char *api, const json_t *r) {
    di_buf b = {0};
    size_t i;
    json_t *x;
    if (!strcmp(api, "chat")) {
        json_t *ch = json_array_get(json_object_get(r, "choices"), 0), *m = json_object_get(ch, "message");
        json_t *rc = json_object_get(m, "reasoning_content");
        di_buf_printf(&b, "role=%s|content=%s|reasoning=%s|finish=%s|", json_string_value(json_object_get(m, "role")),
                      json_string_value(json_object_get(m, "content")), rc ? json_string_value(rc) : "(none)",
                      json_string_value(json_object_get(ch, "finish_reason")));
        json_array_foreach(json_object_get(m, "tool_calls"), i, x) {
            json_t *f = json_object_get(x, "function");
            di_buf_printf(&b, "call %zu %s(%s)|", (size_t)json_integer_value(json_object_get(x, "index")),
                          json_string_value(json_object_get(f, "name")), json_string_value(json_object_get(f, "arguments")));
        }
    } else if (!strcmp(api, "responses")) {
        di_buf_printf(&b, "status=%s|", json_string_value(json_object_get(r, "status")));
        json_array_foreach(json_object_get(r, "output"), i, x) {
            json_t *c0 = json_array_get(json_object_get(x, "content"), 0);
            di_buf_printf(&b, "%s:%s:%s(%s)|", kind_of(x), c0 ? json_string_value(json_object_get(c0, "text")) : "",
                          json_string_value(json_object_get(x, "name")) ? json_string_value(json_object_get(x, "name")) : "",
                          json_string_value(json_object_get(x, "arguments")) ? json_string_value(json_object_get(x, "arguments")) : "");
        }
    } else {
        di_buf_printf(&b, "stop=%s|", json_string_value(json_object_get(r, "stop_reason")));
        json_array_foreach(json_object_get(r, "content"), i, x) {
            char *input = json_object_get(x, "input") ? json_dumps(json_object_get(x, "input"), JSON_COMPACT | JSON_SORT_KEYS) : NULL;
            json_t *t = json_object_get(x, "text") ? json_object_get(x, "text") : json_object_get(x, "thinking");
            di_buf_printf(&b, "%s:%s:%s|", kind_of(x), t ? json_string_value(t) : json_string_value(json_object_get(x, "name")),
                          input ? input : "");
            free(input);
        }
    }
    json_t *u = json_deep_copy(json_object_get(r, "usage"));
    json_object_del(u, "completion_tokens_details"); /* the reference counts these only for token-id input */
    json_t *od = json_object_get(u, "output_tokens_details");
    if (od) json_object_set_new(od, "reasoning_tokens", json_integer(0));
    char *us = json_dumps(u, JSON_COMPACT | JSON_SORT_KEYS);
    di_buf_printf(&b, "usage=%s", us);
    free(us);
    json_decref(u);
    return di_buf_take(&b);
}

typedef struct rendered {
    char *complete; /* di_response_json */
    char *sse;      /* every SSE frame, text pushed byte by byte */
} rendered;

static void render_case(const json_t *cs, rendered *out) {
    const char *api_name = json_string_value(json_object_get(cs, "api"));
    di_api api = (di_api)di_api_from_name(api_name);
    char *body = json_dumps(json_object_get(cs, "request"), JSON_COMPACT | JSON_PRESERVE_ORDER);
    di_request req;
    di_error err = {0};
    assert_int_equal(di_request_parse(api, body, strlen(body), NULL, &req, &err), DI_OK);
    free(body);
    const char *text = json_string_value(json_object_get(cs, "output"));
    size_t len = strlen(text);
    di_response_info info = {.api = api, .id = "id", .model = "DeepSeek-V4.1-Flash", .created = 0,
                             .include_usage = true, .thinking = req.conv.thinking};
    di_usage usage = {.prompt_tokens = 10, .cache_hit_tokens = 4};
    di_stream *st;
    di_sse *sse;
    assert_int_equal(di_stream_new(&req.parse, &st, &err), DI_OK);
    assert_int_equal(di_sse_new(&info, &sse, &err), DI_OK);
    di_buf frames = {0};
    di_events ev = {0};
    di_sse_begin(sse, &usage, &frames);
    for (size_t i = 0; i < len; i++) {
        /* the reference was told 7 tokens for the whole text */
        assert_int_equal(di_stream_push(st, text + i, 1, i == 0 ? 7 : 0, &ev, &err), DI_OK);
        di_sse_events(sse, &ev, NULL, 0, &frames);
        di_events_clear(&ev);
    }
    if (!len) di_stream_push(st, "", 0, 7, &ev, &err);
    assert_int_equal(di_stream_finish(st, DI_FINISH_STOP, &ev, &err), DI_OK);
    di_sse_events(sse, &ev, NULL, 0, &frames);
    di_events_free(&ev);
    di_usage u;
    di_stream_usage(st, &u);
    usage.completion_tokens = u.completion_tokens;
    usage.reasoning_tokens = u.reasoning_tokens;
    di_sse_end(sse, st, &usage, &frames);
    out->complete = di_response_json(&info, st, &usage, NULL, 0);
    out->sse = di_buf_take(&frames);
    di_sse_free(sse);
    di_stream_free(st);
    di_request_free(&req);
}

/* Re-assemble a complete response from our SSE frames (the way a client does). */
static json_t *assemble(const char *api, const char *sse, json_t *complete) {
    json_t *r = json_deep_copy(complete);
    di_buf content = {0}, reasoning = {0}, items = {0};
    di_buf args[8] = {{0}};
    const char *p = sse;
    const char *last_event = NULL;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        if (!strncmp(p, "[DONE]", 6)) {
            last_event = "[DONE]";
            p = e;
            continue;
        }
        json_error_t je;
        json_t *d = json_loadb(p, (size_t)(e - p), 0, &je);
        if (!d) fail_msg("bad SSE data: %s", je.text);
        if (!strcmp(api, "chat")) {
            json_t *delta = json_object_get(json_array_get(json_object_get(d, "choices"), 0), "delta");
            const char *c = json_string_value(json_object_get(delta, "content"));
            const char *rc = json_string_value(json_object_get(delta, "reasoning_content"));
            if (c) di_buf_puts(&content, c);
            if (rc) di_buf_puts(&reasoning, rc);
            size_t i;
            json_t *tc;
            json_array_foreach(json_object_get(delta, "tool_calls"), i, tc) {
                int k = (int)json_integer_value(json_object_get(tc, "index"));
                const char *a = json_string_value(json_object_get(json_object_get(tc, "function"), "arguments"));
                if (k >= 0 && k < 8 && a) di_buf_puts(&args[k], a);
            }
            last_event = "chunk";
        } else {
            const char *t = kind_of(d);
            json_t *delta = json_object_get(d, "delta");
            if (!strcmp(api, "responses")) {
                if (!strcmp(t, "response.output_item.done")) { /* the finished items, in output order */
                    json_t *it = json_object_get(d, "item");
                    json_t *c0 = json_array_get(json_object_get(it, "content"), 0);
                    di_buf_printf(&items, "%s:%s:%s(%s)|", kind_of(it),
                                  c0 ? json_string_value(json_object_get(c0, "text")) : "",
                                  json_string_value(json_object_get(it, "name")) ? json_string_value(json_object_get(it, "name")) : "",
                                  json_string_value(json_object_get(it, "arguments")) ? json_string_value(json_object_get(it, "arguments")) : "");
                }
                if (!strcmp(t, "response.output_text.delta")) di_buf_puts(&content, json_string_value(delta));
                if (!strcmp(t, "response.reasoning_text.delta")) di_buf_puts(&reasoning, json_string_value(delta));
                if (!strcmp(t, "response.function_call_arguments.delta"))
                    di_buf_puts(&args[0], json_string_value(delta));
            } else if (!strcmp(t, "content_block_delta")) {
                const char *dt = kind_of(delta);
                if (!strcmp(dt, "text_delta")) di_buf_puts(&content, json_string_value(json_object_get(delta, "text")));
                if (!strcmp(dt, "thinking_delta"))
                    di_buf_puts(&reasoning, json_string_value(json_object_get(delta, "thinking")));
                if (!strcmp(dt, "input_json_delta"))
                    di_buf_puts(&args[0], json_string_value(json_object_get(delta, "partial_json")));
            }
            static char kind[64];
            snprintf(kind, sizeof kind, "%s", t);
            last_event = kind;
        }
        json_decref(d);
        p = e;
    }
    /* what the frames carried must be what the complete response says */
    if (!strcmp(api, "chat")) {
        assert_string_equal(last_event, "[DONE]");
        json_t *m = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
        assert_string_equal(content.data ? content.data : "", json_string_value(json_object_get(m, "content")));
        json_t *rc = json_object_get(m, "reasoning_content");
        if (rc) assert_string_equal(reasoning.data ? reasoning.data : "", json_string_value(rc));
        size_t i;
        json_t *tc;
        json_array_foreach(json_object_get(m, "tool_calls"), i, tc)
            assert_string_equal(args[i].data ? args[i].data : "",
                                json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")));
    } else if (!strcmp(api, "responses")) {
        assert_string_equal(last_event, "response.completed");
        di_buf want = {0};
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(r, "output"), i, x) {
            json_t *c0 = json_array_get(json_object_get(x, "content"), 0);
            di_buf_printf(&want, "%s:%s:%s(%s)|", kind_of(x), c0 ? json_string_value(json_object_get(c0, "text")) : "",
                          json_string_value(json_object_get(x, "name")) ? json_string_value(json_object_get(x, "name")) : "",
                          json_string_value(json_object_get(x, "arguments")) ? json_string_value(json_object_get(x, "arguments")) : "");
        }
        assert_string_equal(items.data ? items.data : "", want.data ? want.data : "");
        di_buf_free(&want);
    } else {
        assert_string_equal(last_event, "message_stop");
    }
    di_buf_free(&content);
    di_buf_free(&reasoning);
    di_buf_free(&items);
    for (int i = 0; i < 8; i++) di_buf_free(&args[i]);
    return r;
}

static void test_protocol_renderings(void **state) {
    (void)state;
    json_error_t je;
    json_t *cases = json_load_file(tu_data("chat/stream_cases.json"), 0, &je);
    assert_non_null(cases);
    size_t i, n_bad = 0, n_api[3] = {0};
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        const char *api = json_string_value(json_object_get(cs, "api"));
        rendered rd;
        render_case(cs, &rd);
        json_t *ours = json_loads(rd.complete, 0, &je);
        assert_non_null(ours);
        char *a = summarize(api, ours), *b = summarize(api, json_object_get(cs, "response"));
        if (strcmp(a, b)) {
            printf("# case %s (%s):\n#   ours: %s\n#   want: %s\n", json_string_value(json_object_get(cs, "name")), api, a, b);
            n_bad++;
        }
        json_t *back = assemble(api, rd.sse, ours);
        json_decref(back);
        /* the frame sequence has the reference's shape (runs of one event type collapsed) */
        di_buf names = {0}, want = {0};
        char prev[96] = "";
        for (const char *f = rd.sse; *f && strncmp(f, "data: [DONE]", 12); f = strstr(f, "\n\n") + 2) {
            char name[96] = "chunk";
            if (!strncmp(f, "event: ", 7)) sscanf(f + 7, "%95[^\n]", name);
            if (strcmp(prev, name)) di_buf_printf(&names, "%s ", name);
            memcpy(prev, name, sizeof prev);
        }
        size_t k;
        json_t *nm;
        json_array_foreach(json_object_get(cs, "events"), k, nm) di_buf_printf(&want, "%s ", json_string_value(nm));
        if (strcmp(names.data, want.data)) {
            printf("# case %s events:\n#   ours: %s\n#   want: %s\n", json_string_value(json_object_get(cs, "name")),
                   names.data, want.data);
            n_bad++;
        }
        di_buf_free(&names);
        di_buf_free(&want);
        n_api[di_api_from_name(api)]++;
        free(a);
        free(b);
        json_decref(ours);
        free(rd.complete);
        free(rd.sse);
    }
    tu_report("protocol renderings vs reference: chat %zu, responses %zu, messages %zu; %zu differ", n_api[0], n_api[1],
              n_api[2], n_bad);
    assert_int_equal(n_bad, 0);
    assert_true(n_api[1] >= 2 && n_api[2] >= 2);
    json_decref(cases);
}

/* Split multi-byte characters are held until complete; invalid bytes become U+FFFD. */
static void test_utf8_boundaries(void **state) {
    (void)state;
    di_parse_options po = {.stage0 = DI_STAGE0_CONTENT};
    di_stream *s;
    di_error err = {0};
    di_events ev = {0};
    assert_int_equal(di_stream_new(&po, &s, &err), DI_OK);
    const char *pieces[] = {"a\xF0\x9F", "\x9A", "\x80" "b\xC3", "A\xFF", "\xE6\x97"};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(di_stream_push(s, pieces[i], strlen(pieces[i]), 1, &ev, &err), DI_OK);
        for (size_t k = 0; k < ev.n; k++) { /* every delta on its own is valid UTF-8 */
            json_t *j = json_stringn(ev.ev[k].text, ev.ev[k].len);
            assert_non_null(j);
            json_decref(j);
        }
        di_events_clear(&ev);
    }
    assert_int_equal(di_stream_finish(s, DI_FINISH_LENGTH, &ev, &err), DI_OK);
    assert_string_equal(di_stream_content(s), "a\xF0\x9F\x9A\x80" "b\xEF\xBF\xBD" "A\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    assert_int_equal(di_stream_finish_reason(s), DI_FINISH_LENGTH);
    di_usage u;
    di_stream_usage(s, &u);
    assert_int_equal(u.completion_tokens, 5);
    di_events_free(&ev);
    di_stream_free(s);
}

/* A stop string ends the answer at once; the parser reports it is done so generation can stop. */
static void test_stop_string_done(void **state) {
    (void)state;
    char *stops[] = {"STOP"};
    di_parse_options po = {.stage0 = DI_STAGE0_CONTENT, .stop = stops, .n_stop = 1};
    di_stream *s;
    di_error err = {0};
    di_events ev = {0};
    assert_int_equal(di_stream_new(&po, &s, &err), DI_OK);
    assert_int_equal(di_stream_push(s, "abc ST", 6, 2, &ev, &err), DI_OK);
    assert_false(di_stream_done(s));
    assert_int_equal(di_stream_push(s, "OP tail", 7, 2, &ev, &err), DI_OK);
    assert_true(di_stream_done(s));
    assert_int_equal(di_stream_finish(s, DI_FINISH_LENGTH, &ev, &err), DI_OK);
    assert_string_equal(di_stream_content(s), "abc ");
    assert_int_equal(di_stream_finish_reason(s), DI_FINISH_STOP);
    di_events_free(&ev);
    di_stream_free(s);
}

/* Chat logprobs ride on the chunk of the push that produced them and fill the complete response. */
static void test_logprobs(void **state) {
    (void)state;
    di_parse_options po = {.stage0 = DI_STAGE0_CONTENT};
    di_response_info info = {.api = DI_API_CHAT, .id = "c1", .model = "m", .logprobs = true};
    di_stream *st;
    di_sse *sse;
    di_error err = {0};
    assert_int_equal(di_stream_new(&po, &st, &err), DI_OK);
    assert_int_equal(di_sse_new(&info, &sse, &err), DI_OK);
    const char *top_tok[] = {"Hi", "Hello"};
    const float top_lp[] = {-0.25f, -1.5f};
    di_token_logprob lp[2] = {{"Hi", -0.25f, 2, top_tok, top_lp}, {"!", -0.125f, 0, NULL, NULL}};
    di_events ev = {0};
    di_buf frames = {0};
    di_usage usage = {.prompt_tokens = 5};
    di_sse_begin(sse, &usage, &frames);
    assert_int_equal(di_stream_push(st, "Hi", 2, 1, &ev, &err), DI_OK);
    di_sse_events(sse, &ev, &lp[0], 1, &frames);
    di_events_clear(&ev);
    assert_int_equal(di_stream_push(st, "!", 1, 1, &ev, &err), DI_OK);
    di_sse_events(sse, &ev, &lp[1], 1, &frames);
    assert_int_equal(di_stream_finish(st, DI_FINISH_STOP, &ev, &err), DI_OK);
    di_stream_usage(st, &usage);
    di_sse_end(sse, st, &usage, &frames);
    /* second frame = the "Hi" chunk, with its logprob entry */
    const char *f = strstr(frames.data, "\n\ndata: ") + 8;
    json_t *chunk = json_loadb(f, (size_t)(strstr(f, "\n\n") - f), 0, NULL);
    json_t *c0 = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "logprobs"), "content"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "token")), "Hi");
    assert_float_equal(json_real_value(json_object_get(c0, "logprob")), -0.25, 1e-9);
    assert_int_equal(json_array_size(json_object_get(c0, "top_logprobs")), 2);
    json_decref(chunk);
    char *full = di_response_json(&info, st, &usage, lp, 2);
    json_t *j = json_loads(full, 0, NULL);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    assert_int_equal(json_array_size(content), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 1), "token")), "!");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 2);
    json_decref(j);
    free(full);
    di_buf_free(&frames);
    di_events_free(&ev);
    di_sse_free(sse);
    di_stream_free(st);
}

/* Throughput of the parser when fed a few bytes at a time, as an engine does per token. */
static void test_parser_throughput(void **state) {
    (void)state;
    di_buf text = {0};
    for (int i = 0; text.len < (1u << 20); i++)
        di_buf_printf(&text, "step %d: the answer is %d.\n\n", i, i * 7);
    di_buf_puts(&text, "</think>done\n\n<" DI_TOK_DSML " calls>\n<" DI_TOK_DSML " invoke name=\"f\">\n<" DI_TOK_DSML
                       " parameter name=\"k\" string=\"true\">v</" DI_TOK_DSML " parameter>\n</" DI_TOK_DSML
                       " invoke>\n</" DI_TOK_DSML " calls>");
    di_parse_options po = {.stage0 = DI_STAGE0_REASONING, .parse_tool_calls = true};
    di_stream *s;
    di_error err = {0};
    di_events ev = {0};
    assert_int_equal(di_stream_new(&po, &s, &err), DI_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < text.len; i += 4) {
        size_t n = text.len - i < 4 ? text.len - i : 4; /* ~one token */
        assert_int_equal(di_stream_push(s, text.data + i, n, 1, &ev, &err), DI_OK);
        di_events_clear(&ev);
    }
    assert_int_equal(di_stream_finish(s, DI_FINISH_STOP, &ev, &err), DI_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    const di_stream_call *calls;
    assert_int_equal(di_stream_calls(s, &calls), 1);
    assert_string_equal(calls[0].arguments, "{\"k\": \"v\"}");
    assert_string_equal(di_stream_content(s), "done");
    tu_report("stream parser: %.1f MB/s, %.2f us per 4-byte push", (double)text.len / secs / 1e6,
              secs * 1e6 / (double)(text.len / 4));
    di_events_free(&ev);
    di_stream_free(s);
    di_buf_free(&text);
}

/* Engine path: the reference outputs tokenized (added tokens recognized, as the model emits them)
 * and pushed one id at a time through the detokenizer give the reference's results. */
static void test_stream_token_ids(void **state) {
    (void)state;
    const char *path = "data/tokenizer/deepseek-v4/tokenizer.json";
    if (access(path, R_OK) != 0) {
        printf("# skipped: %s not present\n", path);
        skip();
    }
    di_tokenizer *tok;
    di_error err = {0};
    assert_int_equal(di_tok_load(path, &tok, &err), DI_OK);
    json_error_t je;
    json_t *cases = json_load_file(tu_data("chat/stream_random.json"), 0, &je);
    assert_non_null(cases);
    size_t i, n_bad = 0, n_ids_total = 0;
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        di_request req;
        parse_options_of(cs, &req);
        const char *text = json_string_value(json_object_get(cs, "output"));
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(di_tok_encode(tok, text, strlen(text), 1, &ids, &n_ids, &err), DI_OK);
        di_stream *s;
        di_detok *d = di_detok_new(tok);
        di_events ev = {0};
        assert_int_equal(di_stream_new(&req.parse, &s, &err), DI_OK);
        for (size_t k = 0; k < n_ids; k++) {
            assert_int_equal(di_stream_push_ids(s, d, &ids[k], 1, &ev, &err), DI_OK);
            di_events_clear(&ev);
        }
        assert_int_equal(di_stream_finish_ids(s, d, DI_FINISH_STOP, &ev, &err), DI_OK);
        outcome o = {0};
        const char *rs = di_stream_reasoning(s);
        o.reasoning = rs ? strdup(rs) : NULL;
        o.content = strdup(di_stream_content(s));
        const di_stream_call *calls;
        size_t nc = di_stream_calls(s, &calls);
        di_buf cb = {0};
        for (size_t k = 0; k < nc; k++) di_buf_printf(&cb, "%s(%s)|", calls[k].name, calls[k].arguments);
        o.calls = cb.data ? di_buf_take(&cb) : strdup("");
        o.finish = di_stream_finish_reason(s);
        n_bad += !expect_outcome(cs, &o);
        di_usage u;
        di_stream_usage(s, &u);
        assert_int_equal(u.completion_tokens, (int64_t)n_ids);
        n_ids_total += n_ids;
        outcome_free(&o);
        di_events_free(&ev);
        di_stream_free(s);
        di_detok_free(d);
        free(ids);
        di_request_free(&req);
    }
    tu_report("stream from token ids: %zu outputs (%zu ids) pushed id by id, %zu differ", json_array_size(cases),
              n_ids_total, n_bad);
    assert_int_equal(n_bad, 0);
    json_decref(cases);
    di_tok_free(tok);
}


int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_golden_every_split),
        cmocka_unit_test(test_stream_random_every_split),
        cmocka_unit_test(test_protocol_renderings),
        cmocka_unit_test(test_utf8_boundaries),
        cmocka_unit_test(test_stop_string_done),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_parser_throughput),
        cmocka_unit_test(test_stream_token_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
