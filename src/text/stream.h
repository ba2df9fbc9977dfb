/* Incremental output parser: generated text → reasoning deltas, answer deltas and DSML tool calls
 * with streamed JSON-argument deltas, plus the finish reason and usage.
 *
 * Results never depend on how the text is chunked: a marker split across pushes (</think>,
 * "<｜DSML｜", a stop string), the newlines that run into </think> or a tool-call block (they
 * belong to the marker), and a UTF-8 character cut in two are held back until decided. The
 * concatenation of each kind of delta is therefore identical for any split (tests/test_stream.c
 * splits at every byte). One deliberate difference from the reference: in json_object mode it
 * writes one space per chunk of blanked text, we write one per blanked run between markers, which
 * is what the reference gives for unsplit text.
 *
 * Rules (the reference's, tests/data/chat/stream_cases.json): reasoning runs until </think>
 * and is reported only when the output starts inside it; leading newlines of a new reasoning or
 * answer are dropped (a continued turn keeps them); a stray </think> in the answer is skipped;
 * stop strings apply to the answer, the first one to complete wins; with tools, "<｜DSML｜"
 * (after optional newlines, in the answer or straight from the reasoning) opens the block
 *   <｜DSML｜ calls> <｜DSML｜ invoke name="f"> <｜DSML｜ parameter name="k" string="true|false">v</｜DSML｜ parameter>
 *   </｜DSML｜ invoke> </｜DSML｜ calls>
 * whose parameters stream out as the JSON object {"k": "v", "n": 3} (string="false" values are
 * JSON already; keys are copied verbatim). The block is read leniently, as the reference does:
 * text between the markers is skipped, and text after the block is dropped. In json_object mode
 * only the JSON survives: a ```json or ``` fence line or the first { or [ starts it, "\n```"
 * ends it, and text before it or after the closing fence becomes one space. */
#ifndef DI_TEXT_STREAM_H
#define DI_TEXT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/api.h"

typedef enum di_event_kind {
    DI_EV_REASONING,  /* text */
    DI_EV_CONTENT,    /* text */
    DI_EV_TOOL_START, /* tool: index, name in text */
    DI_EV_TOOL_ARGS   /* tool: index, JSON-argument delta in text */
} di_event_kind;

typedef struct di_event {
    di_event_kind kind;
    int32_t tool;  /* tool-call index (TOOL_*), else -1 */
    char *text;    /* owned, NUL-terminated */
    size_t len;
} di_event;

typedef struct di_events {
    di_event *ev; /* [n] */
    size_t n, cap;
} di_events;

void di_events_clear(di_events *e); /* frees the texts, keeps capacity */
void di_events_free(di_events *e);

typedef enum di_finish {
    DI_FINISH_NONE,       /* still running */
    DI_FINISH_STOP,       /* EOS or a stop string */
    DI_FINISH_LENGTH,     /* max_tokens reached */
    DI_FINISH_CONTENT_FILTER,
    DI_FINISH_TOOL_CALLS  /* at least one tool call was parsed */
} di_finish;

const char *di_finish_name(di_finish f, di_api api); /* protocol spelling: "stop" / "end_turn" / ... */

typedef struct di_stream_call {
    char *name;
    char *arguments; /* the concatenated argument deltas (a JSON object once complete) */
} di_stream_call;

typedef struct di_usage {
    int64_t prompt_tokens;
    int64_t cache_hit_tokens; /* prompt tokens served from the prefix cache */
    int64_t completion_tokens;
    int64_t reasoning_tokens; /* completion tokens generated while in reasoning */
} di_usage;

typedef struct di_stream di_stream;

/* opts is copied. */
int di_stream_new(const di_parse_options *opts, di_stream **out, di_error *err);
void di_stream_free(di_stream *s);

/* Feed generated text that accounts for n_tokens tokens; appends events to *ev. After the parser
 * finished (a stop string, or the tool-call block closed) further text is ignored. */
int di_stream_push(di_stream *s, const char *text, size_t len, int64_t n_tokens, di_events *ev, di_error *err);
/* End of generation with the backend's reason (STOP or LENGTH or CONTENT_FILTER): flushes what was
 * held back and settles the final reason. */
int di_stream_finish(di_stream *s, di_finish backend_reason, di_events *ev, di_error *err);
/* Token-id input (the engine's path): ids are detokenized incrementally by `d` (a di_detok from
 * src/text/tokenizer.h over the model's tokenizer); each id counts as one completion token, and an
 * id that cannot be decoded is counted and ignored. The generation's EOS id is not pushed. */
struct di_detok;
int di_stream_push_ids(di_stream *s, struct di_detok *d, const int32_t *ids, size_t n, di_events *ev, di_error *err);
/* End of id input: flushes the detokenizer (an unfinished character becomes U+FFFD), then finishes. */
int di_stream_finish_ids(di_stream *s, struct di_detok *d, di_finish backend_reason, di_events *ev, di_error *err);
/* True once the parser needs no more text (stop string or closed tool block): stop generating. */
bool di_stream_done(const di_stream *s);

/* Accumulated results (valid until di_stream_free). reasoning is NULL when thinking was off. */
const char *di_stream_reasoning(const di_stream *s);
const char *di_stream_content(const di_stream *s);
size_t di_stream_calls(const di_stream *s, const di_stream_call **calls);
di_finish di_stream_finish_reason(const di_stream *s);
void di_stream_usage(const di_stream *s, di_usage *u); /* completion/reasoning counts */

#endif
