/* di-test: asan
 * Output parsing against the reference (tests/data/chat/stream_cases.json, from deepseek-recipe's
 * StreamProcessor): reasoning, answer, tool calls and finish reason of each model output, which
 * must come out identical for every way of chunking the text — whole, split at every byte
 * boundary into two pushes, and byte by byte. Also the SSE / complete-response renderings. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/api.h"
#include "text/chat_json.h"
#include "text/stream.h"

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

static void expect_outcome(const json_t *cs, const outcome *o) {
    const char *name = json_string_value(json_object_get(cs, "name"));
    json_t *wr = json_object_get(cs, "reasoning");
    if (json_is_null(wr) != (o->reasoning == NULL) || (o->reasoning && strcmp(o->reasoning, json_string_value(wr))))
        fail_msg("case %s: reasoning \"%s\", want \"%s\"", name, o->reasoning ? o->reasoning : "(null)",
                 json_is_null(wr) ? "(null)" : json_string_value(wr));
    const char *wc = json_string_value(json_object_get(cs, "content"));
    if (strcmp(o->content, wc ? wc : "")) fail_msg("case %s: content \"%s\", want \"%s\"", name, o->content, wc);
    di_buf cb = {0};
    size_t i;
    json_t *tc;
    json_array_foreach(json_object_get(cs, "tool_calls"), i, tc)
        di_buf_printf(&cb, "%s(%s)|", json_string_value(json_object_get(tc, "name")),
                      json_string_value(json_object_get(tc, "arguments")));
    if (strcmp(o->calls, cb.data ? cb.data : ""))
        fail_msg("case %s: calls %s, want %s", name, o->calls, cb.data ? cb.data : "");
    di_buf_free(&cb);
    const char *wf = json_string_value(json_object_get(cs, "finish_reason"));
    assert_string_equal(di_finish_name(o->finish, DI_API_CHAT), wf);
}

static void test_stream_golden_every_split(void **state) {
    (void)state;
    json_error_t je;
    json_t *cases = json_load_file(tu_data("chat/stream_cases.json"), 0, &je);
    if (!cases) fail_msg("cannot load stream_cases.json: %s", je.text);
    size_t i, runs = 0;
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        di_request req;
        parse_options_of(cs, &req);
        const char *text = json_string_value(json_object_get(cs, "output"));
        size_t len = strlen(text);
        outcome whole;
        run_split(&req.parse, text, len, NULL, 0, &whole);
        expect_outcome(cs, &whole);
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
    tu_report("stream golden cases: %zu, parser runs (whole + every split + bytewise): %zu", json_array_size(cases), runs);
    assert_true(json_array_size(cases) >= 20);
    json_decref(cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_golden_every_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
