/* di-test: asan
 * Request conversion beyond the reference cases of test_chat: limits (JSON depth, context length),
 * malformed bodies, extension fields (numeric effort, top_k/min_p/repetition_penalty/logit_bias,
 * regex and EBNF constraints, n) and the API error body. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/api.h"
#include "text/chat.h"
#include "text/chat_json.h"

#define HEAD "{\"model\":\"DeepSeek-V4.1-Flash\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]"

static int parse(di_api api, const char *body, di_request *r, di_error *err) {
    return di_request_parse(api, body, strlen(body), NULL, r, err);
}

/* Extension: integer efforts render as given; the reference's named levels keep its numbers. */
static void test_numeric_effort(void **state) {
    (void)state;
    const char *body = "{\"model\":\"DeepSeek-V4.1-Flash\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                       "\"reasoning_effort\":37}";
    di_request r;
    di_error err = {0};
    assert_int_equal(di_request_parse(DI_API_CHAT, body, strlen(body), NULL, &r, &err), DI_OK);
    di_prompt p;
    assert_int_equal(di_chat_render(&r.conv, &p, &err), DI_OK);
    char *text = di_prompt_text(&p, NULL);
    assert_non_null(strstr(text, DI_TOK_SYSTEM "Reasoning Effort: 37 (range 1-100"));
    free(text);
    di_prompt_free(&p);
    di_request_free(&r);
    const char *bad = "{\"model\":\"DeepSeek-V4.1-Flash\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                      "\"reasoning_effort\":101}";
    assert_int_equal(di_request_parse(DI_API_CHAT, bad, strlen(bad), NULL, &r, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "[1, 100]"));
    assert_int_equal(di_effort_from_name("low"), 50);
    assert_int_equal(di_effort_from_name("max"), 100);
    assert_int_equal(di_effort_from_name("medium"), -1);
}

/* The JSON depth limit: 127 levels pass, 128 fail with the reference's message. */
static void test_depth_limit(void **state) {
    (void)state;
    for (int extra = 125; extra <= 127; extra++) {
        char body[1024];
        int n = snprintf(body, sizeof body, "{\"model\":\"DeepSeek-V4.1-Flash\",\"messages\":[{\"role\":\"user\","
                                            "\"content\":\"q\"}],\"x\":");
        for (int i = 0; i < extra; i++) body[n++] = '[';
        body[n++] = '1';
        for (int i = 0; i < extra; i++) body[n++] = ']';
        body[n++] = '}';
        di_request r;
        di_error err = {0};
        int rc = di_request_parse(DI_API_CHAT, body, (size_t)n, NULL, &r, &err);
        if (extra < 127) {
            assert_int_equal(rc, DI_OK);
            di_request_free(&r);
        } else {
            assert_int_equal(rc, DI_ERR_INVALID);
            assert_string_equal(err.msg, "invalid JSON request: recursion limit exceeded at line 1 column 205");
        }
    }
}

static void test_resolve_max_tokens(void **state) {
    (void)state;
    const char *body = "{\"model\":\"DeepSeek-V4.1-Flash\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                       "\"thinking\":{\"type\":\"disabled\"}}";
    di_request r;
    di_error err = {0};
    assert_int_equal(di_request_parse(DI_API_CHAT, body, strlen(body), NULL, &r, &err), DI_OK);
    int64_t m;
    assert_int_equal(di_request_resolve_max_tokens(&r, 10, 100, &m, &err), DI_OK);
    assert_int_equal(m, 90);
    assert_int_equal(di_request_resolve_max_tokens(&r, 10, 20000, &m, &err), DI_OK);
    assert_int_equal(m, 8192);
    assert_int_equal(di_request_resolve_max_tokens(&r, 100, 100, &m, &err), DI_OK);
    assert_int_equal(m, 1);
    assert_int_equal(di_request_resolve_max_tokens(&r, 100, 50, &m, &err), DI_ERR_LIMIT);
    assert_string_equal(err.msg, "This model's maximum context length is 50 tokens. However, you requested 100 tokens "
                                 "(100 in the messages, 0 in the completion). Please reduce the length of the messages "
                                 "or completion.");
    r.sampling.max_tokens = 50;
    assert_int_equal(di_request_resolve_max_tokens(&r, 60, 100, &m, &err), DI_ERR_LIMIT);
    int status;
    char *doc = di_api_error_body(&err, &status);
    assert_int_equal(status, 400);
    assert_non_null(strstr(doc, "\"type\":\"invalid_request_error\""));
    free(doc);
    r.conv.thinking = true, r.sampling.max_tokens = 0;
    assert_int_equal(di_request_resolve_max_tokens(&r, 10, 1000000, &m, &err), DI_OK);
    assert_int_equal(m, 65536);
    r.conv.effort = DI_EFFORT_MAX;
    assert_int_equal(di_request_resolve_max_tokens(&r, 10, 1000000, &m, &err), DI_OK);
    assert_int_equal(m, 131072);
    di_request_free(&r);
}

/* `{}` and other non-requests are rejected by every protocol with a 400 error body. */
static void test_rejects_malformed(void **state) {
    (void)state;
    static const struct { di_api api; const char *body, *msg; } cases[] = {
        {DI_API_CHAT, "{}", "invalid request body: missing field `messages`"},
        {DI_API_RESPONSES, "{}", "invalid request body: missing field `model`"},
        {DI_API_MESSAGES, "{}", "invalid request body: missing field `model`"},
        {DI_API_CHAT, "[1]", "invalid request body: invalid type: sequence, expected struct ChatCompletionRequest"},
        {DI_API_CHAT, "", "invalid JSON request: EOF while parsing a value at line 1 column 0"},
        {DI_API_CHAT, HEAD ",\"x\":\"\xff\"}", NULL}, /* invalid UTF-8 */
        {DI_API_CHAT, HEAD ",\"temperature\":\"hot\"}", "invalid request body: invalid type: string \"hot\", expected f32"},
        {DI_API_CHAT, "{\"model\":\"DeepSeek-V4.1-Flash\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}," 
                      "{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"r\"}]}",
         "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        di_request r;
        di_error err = {0};
        assert_int_equal(parse(cases[i].api, cases[i].body, &r, &err), DI_ERR_INVALID);
        if (cases[i].msg) assert_string_equal(err.msg, cases[i].msg);
        else assert_non_null(strstr(err.msg, "invalid JSON request"));
        int status;
        char *doc = di_api_error_body(&err, &status);
        json_t *j = json_loads(doc, 0, NULL);
        assert_int_equal(status, 400);
        assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                            "invalid_request_error");
        assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "message")), err.msg);
        json_decref(j);
        free(doc);
    }
}

/* Extension fields are carried to the sampler and the grammar engine. */
static void test_extension_fields(void **state) {
    (void)state;
    di_request r;
    di_error err = {0};
    assert_int_equal(parse(DI_API_CHAT,
                           HEAD ",\"thinking\":{\"type\":\"disabled\"},\"top_k\":40,\"min_p\":0.05,"
                                "\"repetition_penalty\":1.1,\"logit_bias\":{\"15\":2.5,\"128803\":-100},\"seed\":42,"
                                "\"response_format\":{\"type\":\"regex\",\"regex\":\"[a-z]+\"}}",
                           &r, &err),
                     DI_OK);
    assert_int_equal(r.sampling.top_k, 40);
    assert_float_equal(r.sampling.min_p, 0.05f, 1e-7);
    assert_float_equal(r.sampling.repetition_penalty, 1.1f, 1e-7);
    assert_int_equal(r.sampling.n_logit_bias, 2);
    assert_int_equal(r.sampling.logit_bias[1].id, 128803);
    assert_float_equal(r.sampling.logit_bias[1].bias, -100.0f, 0);
    assert_true(r.sampling.has_seed);
    assert_int_equal(r.sampling.seed, 42);
    assert_int_equal(r.constraint, DI_CONSTRAINT_REGEX);
    assert_string_equal(r.constraint_spec, "[a-z]+");
    di_request_free(&r);

    assert_int_equal(parse(DI_API_CHAT, HEAD ",\"response_format\":{\"type\":\"ebnf\",\"ebnf\":\"root ::= \\\"yes\\\"\"}}",
                           &r, &err),
                     DI_OK);
    assert_int_equal(r.constraint, DI_CONSTRAINT_EBNF);
    assert_string_equal(r.constraint_spec, "root ::= \"yes\"");
    di_request_free(&r);

    assert_int_equal(parse(DI_API_CHAT, HEAD ",\"logit_bias\":{\"x\":1}}", &r, &err), DI_ERR_INVALID);
    assert_non_null(strstr(err.msg, "logit_bias"));
    assert_int_equal(parse(DI_API_CHAT, HEAD ",\"repetition_penalty\":0}", &r, &err), DI_ERR_INVALID);
    assert_string_equal(err.msg, "Invalid repetition_penalty value, the valid range of repetition_penalty is (0, 2]");

    /* n > 1 only where the server allows it */
    di_api_options o;
    di_api_options_default(&o);
    const char *body = HEAD ",\"n\":3}";
    assert_int_equal(di_request_parse(DI_API_CHAT, body, strlen(body), &o, &r, &err), DI_ERR_INVALID);
    assert_string_equal(err.msg, "Invalid n value (currently only n = 1 is supported)");
    o.max_n = 4;
    assert_int_equal(di_request_parse(DI_API_CHAT, body, strlen(body), &o, &r, &err), DI_OK);
    assert_int_equal(r.sampling.n, 3);
    di_request_free(&r);
}

/* A huge but shallow request parses; the parser copies what it keeps. */
static void test_large_request(void **state) {
    (void)state;
    size_t n_msgs = 2000;
    di_buf b = {0};
    di_buf_puts(&b, "{\"model\":\"DeepSeek-V4.1-Flash\",\"thinking\":{\"type\":\"disabled\"},\"messages\":[");
    for (size_t i = 0; i < n_msgs; i++)
        di_buf_printf(&b, "%s{\"role\":\"%s\",\"content\":\"turn %zu\"}", i ? "," : "", i % 2 ? "assistant" : "user", i);
    di_buf_puts(&b, ",{\"role\":\"user\",\"content\":\"last\"}]}");
    di_request r;
    di_error err = {0};
    assert_int_equal(di_request_parse(DI_API_CHAT, b.data, b.len, NULL, &r, &err), DI_OK);
    assert_int_equal(r.conv.n_msgs, n_msgs + 1);
    di_prompt p;
    assert_int_equal(di_chat_render(&r.conv, &p, &err), DI_OK);
    /* BOS + per user turn <｜User｜> + per assistant turn <｜Assistant｜></think> ... EOS + final header */
    size_t n_special = 0;
    for (size_t i = 0; i < p.n_segs; i++) n_special += p.segs[i].special;
    assert_int_equal(n_special, 1 + (n_msgs / 2 + 1) * 1 + (n_msgs / 2) * 3 + 2);
    tu_report("large request: %zu bytes, %zu messages, %zu segments", b.len, r.conv.n_msgs, p.n_segs);
    di_prompt_free(&p);
    di_request_free(&r);
    di_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numeric_effort),     cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_resolve_max_tokens), cmocka_unit_test(test_rejects_malformed),
        cmocka_unit_test(test_extension_fields),   cmocka_unit_test(test_large_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
