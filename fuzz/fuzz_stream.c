/* libFuzzer harness: the output parser and the SSE renderers on arbitrary text split at arbitrary
 * points. Input: byte 0 = option bits (thinking, tools, json mode, required tool call, stop
 * string, protocol), byte 1 = split seed, rest = model output. The parser must give the same
 * reasoning, answer and tool calls for the whole text and for the split text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/sse.h"
#include "text/stream.h"

typedef struct result {
    char *reasoning, *content, *calls;
    di_finish finish;
} result;

static void run(const di_parse_options *po, di_api api, const char *text, size_t len, uint32_t seed, result *out) {
    di_stream *s;
    di_sse *sse;
    di_error err = {0};
    if (di_stream_new(po, &s, &err)) __builtin_trap();
    di_response_info info = {.api = api, .id = "fz", .model = "m", .include_usage = true, .thinking = true};
    if (di_sse_new(&info, &sse, &err)) __builtin_trap();
    di_usage usage = {.prompt_tokens = 3};
    di_buf frames = {0};
    di_events ev = {0};
    di_sse_begin(sse, &usage, &frames);
    size_t pos = 0;
    while (pos < len) {
        size_t step = len - pos;
        if (seed) { /* xorshift-driven chunk sizes 1..8 */
            seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
            step = 1 + seed % 8;
            if (step > len - pos) step = len - pos;
        }
        if (di_stream_push(s, text + pos, step, 1, &ev, &err)) __builtin_trap();
        di_sse_events(sse, &ev, NULL, 0, &frames);
        di_events_clear(&ev);
        pos += step;
    }
    if (di_stream_finish(s, DI_FINISH_STOP, &ev, &err)) __builtin_trap();
    di_sse_events(sse, &ev, NULL, 0, &frames);
    di_stream_usage(s, &usage);
    di_sse_end(sse, s, &usage, &frames);
    free(di_response_json(&info, s, &usage, NULL, 0));
    const char *r = di_stream_reasoning(s);
    out->reasoning = strdup(r ? r : "(none)");
    out->content = strdup(di_stream_content(s));
    const di_stream_call *calls;
    size_t n = di_stream_calls(s, &calls);
    di_buf cb = {0};
    for (size_t i = 0; i < n; i++) di_buf_printf(&cb, "%s(%s)|", calls[i].name, calls[i].arguments);
    out->calls = cb.data ? di_buf_take(&cb) : strdup("");
    out->finish = di_stream_finish_reason(s);
    di_buf_free(&frames);
    di_events_free(&ev);
    di_sse_free(sse);
    di_stream_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint8_t bits = data[0];
    char *stops[] = {"STOP", "\n\n\n"};
    di_parse_options po = {
        .stage0 = bits & 1 ? DI_STAGE0_REASONING : DI_STAGE0_CONTENT,
        .parse_tool_calls = (bits >> 1) & 1,
        .parse_json_output = (bits >> 2) & 1,
        .starts_in_tool_calls = ((bits >> 1) & 1) && ((bits >> 3) & 1),
        .stop = stops,
        .n_stop = (bits >> 4) & 1 ? 2 : 0,
    };
    di_api api = (di_api)((bits >> 5) % 3);
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    result whole, split;
    run(&po, api, text, len, 0, &whole);
    run(&po, api, text, len, data[1] | 0x100u, &split);
    if (strcmp(whole.reasoning, split.reasoning) || strcmp(whole.content, split.content) ||
        strcmp(whole.calls, split.calls) || whole.finish != split.finish)
        __builtin_trap(); /* chunking changed the result */
    free(whole.reasoning), free(whole.content), free(whole.calls);
    free(split.reasoning), free(split.content), free(split.calls);
    return 0;
}
