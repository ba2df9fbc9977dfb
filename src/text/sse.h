/* Protocol rendering of parsed output: Server-Sent-Events chunks while streaming and the complete
 * response object otherwise, for Chat Completions, Responses and Messages (the shapes DeepSeek's
 * API returns, as deepseek-recipe builds them).
 *
 * Streaming: di_sse_begin → di_sse_events for each parser push → di_sse_end. Framing:
 *   chat       "data: {chunk}\n\n" ... "data: [DONE]\n\n"
 *   responses  "event: response.output_text.delta\ndata: {...}\n\n" ... response.completed
 *   messages   "event: content_block_delta\ndata: {...}\n\n" ... message_stop */
#ifndef DI_TEXT_SSE_H
#define DI_TEXT_SSE_H

#include <stdint.h>

#include "text/api.h"
#include "text/chat_json.h"
#include "text/stream.h"

typedef struct di_response_info {
    di_api api;
    const char *id;      /* response id ("chatcmpl-..." / "resp_..." / "msg_...") */
    const char *model;
    int64_t created;     /* unix seconds */
    bool include_usage;  /* chat streaming: usage on the final chunk */
    bool logprobs;       /* chat: report logprobs */
    bool thinking;       /* the request runs in thinking mode (reasoning is reported) */
} di_response_info;

/* One generated token's log probability and its top alternatives. */
typedef struct di_token_logprob {
    const char *token;        /* decoded text of the token */
    float logprob;
    size_t n_top;
    const char *const *top_token; /* [n_top] */
    const float *top_logprob;     /* [n_top] */
} di_token_logprob;

typedef struct di_sse di_sse;

int di_sse_new(const di_response_info *info, di_sse **out, di_error *err);
void di_sse_free(di_sse *s);
/* Opening frames (chat: the role chunk; responses: created + in_progress; messages: message_start).
 * usage carries the prompt counts. */
void di_sse_begin(di_sse *s, const di_usage *usage, di_buf *out);
/* Frames for the events of one push; lp (may be NULL) are the logprobs of the tokens of that push. */
void di_sse_events(di_sse *s, const di_events *ev, const di_token_logprob *lp, size_t n_lp, di_buf *out);
/* Closing frames: open blocks closed, finish reason, usage, terminal frame. */
void di_sse_end(di_sse *s, const di_stream *st, const di_usage *usage, di_buf *out);

/* The complete (non-streamed) response for a finished stream (caller frees). lp/n_lp: every
 * generated token's logprobs, or NULL. */
char *di_response_json(const di_response_info *info, const di_stream *st, const di_usage *usage,
                       const di_token_logprob *lp, size_t n_lp);

/* Tool-call id the responses carry for call `index` of response `id` (deterministic). */
void di_tool_call_id(const char *id, size_t index, char out[40]);

#endif
