/* The output parser: a byte-at-a-time recognizer. Each stage watches an ordered set of patterns
 * (a marker, a marker preceded by any newlines, or a newline at the very start of the stage); the
 * first pattern to complete on a byte wins, the bytes before it take the stage's default action,
 * and the matched bytes take the pattern's action. Bytes that may still begin a pattern, or end
 * inside a UTF-8 character, are held back until decided — so what comes out never depends on how
 * the text was chunked. Stage and pattern semantics are the reference's (deepseek-recipe's stream
 * state machine), checked against it in tests/test_stream.c. */
#include "text/stream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_json.h"
#include "util/error.h"

#define DSML_BEGIN "<" DI_TOK_DSML
#define DSML_END "</" DI_TOK_DSML

/* ---- patterns ---- */

enum {
    P_THINK_END,
    P_DSML_BEGIN,
    P_DSML_END,
    P_CALLS_END_V4,   /* "</｜DSML｜tool_calls>", the V4 spelling, also accepted */
    P_CALLS_END,      /* "</｜DSML｜ calls>" */
    P_INVOKE,         /* "invoke name=\"" */
    P_PARAM,          /* "parameter name=\"" */
    P_QUOTE,
    P_TRUE,           /* "true\">" */
    P_FALSE,          /* "false\">" */
    P_FENCE_JSON,     /* "```json\n" */
    P_FENCE,          /* "```\n" */
    P_FENCE_END,      /* "\n```" */
    P_BRACE,
    P_BRACKET,
    P_STOP0,          /* stop strings follow */
    P_MAX = P_STOP0 + DI_API_MAX_STOP
};

static const char *const PATTERN_TEXT[P_STOP0] = {
    DI_TOK_THINK_END, DSML_BEGIN, DSML_END, DSML_END "tool_calls>", DSML_END " calls>", "invoke name=\"",
    "parameter name=\"", "\"", "true\">", "false\">", "```json\n", "```\n", "\n```", "{", "["};

typedef struct pattern {
    const char *s;
    size_t len;
    size_t *fail; /* [len] KMP failure function: longest proper border of s[0..i] */
} pattern;

typedef enum match_kind {
    M_STRING,          /* the pattern itself */
    M_NEWLINES_STRING, /* the pattern after any run of newlines, which belong to the match */
    M_LEADING_NEWLINE  /* one newline as the stage's first byte */
} match_kind;

/* What happens to a run of bytes. */
typedef enum act {
    A_CONTENT,     /* answer text */
    A_REASONING,   /* reasoning text */
    A_SPACE,       /* json mode: text around the JSON, one space per run */
    A_SKIP,        /* dropped (markup, stray </think>, text after the end) */
    A_STOP,        /* a stop string: the answer ends */
    A_CALL_BEGIN,  /* a tool call opens; its name follows */
    A_NAME,        /* tool name bytes */
    A_NAME_END,    /* the name is complete: the call is announced */
    A_ARGS,        /* fixed argument text (`label`) */
    A_ARGS_RAW,    /* argument bytes as they are (a key, a non-string value) */
    A_ARGS_STRING, /* argument bytes inside a JSON string (escaped) */
    A_LABEL        /* fixed answer text (`label`): the bracket that starts a bare JSON answer */
} act;

typedef enum stage {
    S_ANSWER,         /* ordinary answer text */
    S_JSON,           /* json mode: inside the JSON */
    S_AFTER_JSON,     /* json mode: after the closing fence */
    S_CALLS,          /* inside a tool-call block, between calls */
    S_NAME,           /* the tool name */
    S_ARGS,           /* between parameters */
    S_PARAM_NAME,
    S_PARAM_TYPE,
    S_PARAM_VALUE,
    S_REASONING,
    S_FINISHED        /* a stop string or the end of the block: the rest is dropped */
} stage;

typedef struct branch {
    int pat;            /* pattern index (unused for M_LEADING_NEWLINE) */
    match_kind kind;
    size_t len;         /* matched prefix of the pattern */
    size_t newlines;    /* M_NEWLINES_STRING: newlines seen before the pattern began */
    bool fresh, hit;    /* M_LEADING_NEWLINE: no byte seen yet / the first byte was a newline */
    stage next;
    act action;
    const char *label;  /* A_ARGS / A_LABEL text */
} branch;

struct di_stream {
    di_parse_options opt; /* stop strings owned */
    pattern pat[P_MAX];
    size_t n_pat;
    stage st;
    bool leading;         /* the stage drops leading newlines */
    bool first_args;      /* S_ARGS / S_PARAM_*: no parameter written yet */
    bool string_value;    /* S_PARAM_VALUE: a string="true" value */
    branch br[P_MAX + 4]; /* [n_br] the stage's patterns, in priority order */
    size_t n_br;
    act unmatched;        /* action for bytes no pattern claims */
    di_buf stash;         /* bytes of the current stage not yet acted on */
    bool in_space;        /* A_SPACE already wrote the space of the current run */
    bool stopped;
    bool thinking;        /* reasoning is reported */
    di_finish finish;
    di_buf reasoning, content, name;
    di_stream_call *calls; /* [n_calls] */
    di_buf *call_args;     /* [n_calls] */
    size_t n_calls;
    int64_t completion_tokens, reasoning_tokens;
    bool oom;
};

static bool pattern_init(pattern *p, const char *s) {
    p->s = s;
    p->len = strlen(s);
    p->fail = malloc((p->len ? p->len : 1) * sizeof *p->fail);
    if (!p->fail) return false;
    if (p->len) p->fail[0] = 0;
    for (size_t i = 1, k = 0; i < p->len; i++) {
        while (k && s[i] != s[k]) k = p->fail[k - 1];
        if (s[i] == s[k]) k++;
        p->fail[i] = k;
    }
    return true;
}

/* Matched prefix after one more byte (standard KMP step). */
static size_t pattern_step(const pattern *p, size_t len, char c) {
    if (len == p->len) len = p->fail[len - 1];
    while (len && p->s[len] != c) len = p->fail[len - 1];
    return p->s[len] == c ? len + 1 : 0;
}

/* ---- stages ---- */

static void add(di_stream *s, int pat, match_kind kind, stage next, act action, const char *label) {
    s->br[s->n_br++] = (branch){.pat = pat, .kind = kind, .fresh = true, .next = next, .action = action, .label = label};
}

static void add_stops(di_stream *s) {
    for (size_t i = 0; i < s->opt.n_stop; i++) add(s, P_STOP0 + (int)i, M_STRING, S_FINISHED, A_STOP, NULL);
}

/* Enter a stage: its patterns in priority order and its default action. */
static void enter(di_stream *s, stage st, bool leading) {
    s->st = st;
    s->leading = leading;
    s->n_br = 0;
    s->stash.len = 0;
    s->in_space = false;
    bool tools = s->opt.parse_tool_calls;
    switch (st) {
    case S_ANSWER:
        if (s->opt.parse_json_output) {
            add(s, P_FENCE_JSON, M_STRING, S_JSON, A_SKIP, NULL);
            add(s, P_FENCE, M_STRING, S_JSON, A_SKIP, NULL);
            add(s, P_BRACE, M_STRING, S_JSON, A_LABEL, "{");
            add(s, P_BRACKET, M_STRING, S_JSON, A_LABEL, "[");
        } else {
            add_stops(s);
        }
        if (tools) add(s, P_DSML_BEGIN, M_NEWLINES_STRING, S_CALLS, A_SKIP, NULL);
        if (leading) add(s, -1, M_LEADING_NEWLINE, S_ANSWER, A_SKIP, NULL);
        add(s, P_THINK_END, M_STRING, S_ANSWER, A_SKIP, NULL); /* a stray </think> is dropped */
        s->unmatched = s->opt.parse_json_output ? A_SPACE : A_CONTENT;
        break;
    case S_JSON:
        add_stops(s);
        add(s, P_FENCE_END, M_STRING, S_AFTER_JSON, A_SKIP, NULL);
        s->unmatched = A_CONTENT;
        break;
    case S_AFTER_JSON:
        if (tools) add(s, P_DSML_BEGIN, M_NEWLINES_STRING, S_CALLS, A_SKIP, NULL);
        s->unmatched = A_SPACE;
        break;
    case S_CALLS:
        add(s, P_INVOKE, M_STRING, S_NAME, A_CALL_BEGIN, NULL);
        add(s, P_CALLS_END_V4, M_STRING, S_FINISHED, A_SKIP, NULL);
        add(s, P_CALLS_END, M_STRING, S_FINISHED, A_SKIP, NULL);
        s->unmatched = A_SKIP;
        break;
    case S_NAME:
        add(s, P_QUOTE, M_STRING, S_ARGS, A_NAME_END, NULL);
        s->unmatched = A_NAME;
        break;
    case S_ARGS:
        add(s, P_PARAM, M_STRING, S_PARAM_NAME, A_ARGS, s->first_args ? "{\"" : ", \"");
        add(s, P_DSML_END, M_STRING, S_CALLS, A_ARGS, s->first_args ? "{}" : "}");
        s->unmatched = A_SKIP;
        break;
    case S_PARAM_NAME: /* the key is copied verbatim */
        add(s, P_QUOTE, M_STRING, S_PARAM_TYPE, A_ARGS, "\": ");
        s->unmatched = A_ARGS_RAW;
        break;
    case S_PARAM_TYPE:
        add(s, P_TRUE, M_STRING, S_PARAM_VALUE, A_ARGS, "\"");
        add(s, P_FALSE, M_STRING, S_PARAM_VALUE, A_SKIP, NULL);
        s->unmatched = A_SKIP;
        break;
    case S_PARAM_VALUE:
        add(s, P_DSML_END, M_STRING, S_ARGS, s->string_value ? A_ARGS : A_SKIP, s->string_value ? "\"" : NULL);
        s->unmatched = s->string_value ? A_ARGS_STRING : A_ARGS_RAW;
        break;
    case S_REASONING:
        if (tools) add(s, P_DSML_BEGIN, M_NEWLINES_STRING, S_CALLS, A_SKIP, NULL);
        if (leading) add(s, -1, M_LEADING_NEWLINE, S_REASONING, A_SKIP, NULL);
        add(s, P_THINK_END, M_NEWLINES_STRING, S_ANSWER, A_SKIP, NULL);
        s->unmatched = A_REASONING;
        break;
    case S_FINISHED: s->unmatched = A_SKIP; break;
    }
}

/* Feed one byte to a branch; true when its pattern completes. */
static bool branch_feed(const di_stream *s, branch *b, char c) {
    if (b->kind == M_LEADING_NEWLINE) {
        if (b->fresh) b->hit = c == '\n';
        b->fresh = false;
        return b->hit;
    }
    const pattern *p = &s->pat[b->pat];
    if (b->kind == M_NEWLINES_STRING && b->len == 0 && c == '\n') {
        b->newlines++;
    } else {
        size_t next = pattern_step(p, b->len, c);
        if (b->kind == M_NEWLINES_STRING && next <= b->len) b->newlines = 0; /* the run broke */
        b->len = next;
    }
    return b->len == p->len;
}

/* Bytes at the end of the stash that may still belong to a match. */
static size_t branch_pending(const branch *b) {
    if (b->kind == M_LEADING_NEWLINE) return b->hit;
    return b->len + b->newlines;
}

/* ---- output ---- */

/* Bytes that are not valid UTF-8 (a model can emit any byte sequence) become U+FFFD, so every
 * event is valid text for the JSON renderings. */
static char *utf8_clean(const char *t, size_t n, size_t *out_n) {
    char *o = malloc(n * 3 + 1); /* worst case: every byte replaced by 3 */
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)t[i];
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        bool ok = need && i + need <= n && !(need == 2 && c < 0xC2);
        for (size_t j = 1; ok && j < need; j++) ok = ((unsigned char)t[i + j] & 0xC0) == 0x80;
        if (ok && need == 3) {
            unsigned cp = (c & 0x0Fu) << 12 | ((unsigned char)t[i + 1] & 0x3Fu) << 6;
            ok = cp >= 0x800 && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (ok && need == 4) {
            unsigned cp = (c & 0x07u) << 18 | ((unsigned char)t[i + 1] & 0x3Fu) << 12;
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok) {
            memcpy(o + k, t + i, need);
            k += need, i += need;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3, i++;
        }
    }
    o[k] = '\0';
    *out_n = k;
    return o;
}

static void emit(di_stream *s, di_events *ev, di_event_kind kind, int32_t tool, const char *t, size_t n) {
    if (!n && kind != DI_EV_TOOL_START) return;
    if (ev->n == ev->cap) {
        size_t cap = ev->cap ? ev->cap * 2 : 16;
        di_event *p = realloc(ev->ev, cap * sizeof *p);
        if (!p) {
            s->oom = true;
            return;
        }
        ev->ev = p, ev->cap = cap;
    }
    char *copy = utf8_clean(t, n, &n);
    if (!copy) {
        s->oom = true;
        return;
    }
    ev->ev[ev->n++] = (di_event){.kind = kind, .tool = tool, .text = copy, .len = n};
    if (kind == DI_EV_REASONING) di_buf_append(&s->reasoning, copy, n);
    else if (kind == DI_EV_CONTENT) di_buf_append(&s->content, copy, n);
    else if (kind == DI_EV_TOOL_ARGS) di_buf_append(&s->call_args[tool], copy, n);
}

void di_events_clear(di_events *e) {
    for (size_t i = 0; i < e->n; i++) free(e->ev[i].text);
    e->n = 0;
}

void di_events_free(di_events *e) {
    di_events_clear(e);
    free(e->ev);
    memset(e, 0, sizeof *e);
}

static void start_call(di_stream *s, di_events *ev) {
    di_stream_call *c = realloc(s->calls, (s->n_calls + 1) * sizeof *c);
    if (c) s->calls = c;
    di_buf *a = c ? realloc(s->call_args, (s->n_calls + 1) * sizeof *a) : NULL;
    if (a) s->call_args = a;
    size_t n;
    char *name = c && a ? utf8_clean(s->name.data ? s->name.data : "", s->name.len, &n) : NULL;
    if (!name) {
        s->oom = true;
        return;
    }
    s->calls[s->n_calls] = (di_stream_call){.name = name};
    s->call_args[s->n_calls] = (di_buf){0};
    s->n_calls++;
    emit(s, ev, DI_EV_TOOL_START, (int32_t)s->n_calls - 1, name, n);
}

static void args_text(di_stream *s, di_events *ev, const char *t, size_t n, bool escape) {
    if (!s->n_calls) return; /* arguments can only follow an announced call */
    if (!escape) {
        emit(s, ev, DI_EV_TOOL_ARGS, (int32_t)s->n_calls - 1, t, n);
        return;
    }
    di_buf b = {0};
    di_json_write_string(&b, t, n);
    if (b.oom) s->oom = true;
    if (b.len >= 2) emit(s, ev, DI_EV_TOOL_ARGS, (int32_t)s->n_calls - 1, b.data + 1, b.len - 2); /* no quotes */
    di_buf_free(&b);
}

/* Apply an action to bytes t[0..n) (n may be 0 for markers whose action has no text). */
static void act_on(di_stream *s, di_events *ev, act a, const char *label, const char *t, size_t n) {
    switch (a) {
    case A_CONTENT: emit(s, ev, DI_EV_CONTENT, -1, t, n); break;
    case A_REASONING: emit(s, ev, DI_EV_REASONING, -1, t, n); break;
    case A_SPACE:
        if (n && !s->in_space) emit(s, ev, DI_EV_CONTENT, -1, " ", 1);
        s->in_space |= n > 0;
        break;
    case A_SKIP: break;
    case A_STOP: s->stopped = true; break;
    case A_CALL_BEGIN: s->name.len = 0; break;
    case A_NAME: di_buf_append(&s->name, t, n); break;
    case A_NAME_END: start_call(s, ev); break;
    case A_ARGS: args_text(s, ev, label, strlen(label), false); break;
    case A_ARGS_RAW: args_text(s, ev, t, n, false); break;
    case A_ARGS_STRING: args_text(s, ev, t, n, true); break;
    case A_LABEL: emit(s, ev, DI_EV_CONTENT, -1, label, strlen(label)); break;
    }
}

/* Stage transitions that carry state beyond the stage itself. */
static void transition(di_stream *s, const branch *b) {
    stage next = b->next;
    if (s->st == S_NAME) s->first_args = true; /* a new call's argument object */
    if (s->st == S_PARAM_TYPE) s->string_value = b->pat == P_TRUE;
    if (s->st == S_PARAM_VALUE) s->first_args = false;
    /* leading newlines are dropped at the start of the answer after </think>, and keep being
     * dropped while they last; a stray </think> inside the answer does not restart that */
    bool leading = next == S_ANSWER ? s->st == S_REASONING || b->kind == M_LEADING_NEWLINE : next == S_REASONING;
    enter(s, next, leading);
}

/* Length of an incomplete UTF-8 sequence at the end of t[0..n) (held until its rest arrives). */
static size_t utf8_tail(const char *t, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)t[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

static void feed(di_stream *s, di_events *ev, const char *text, size_t len) {
    for (size_t i = 0; i < len && !s->oom; i++) {
        di_buf_append(&s->stash, &text[i], 1);
        if (s->stash.oom) {
            s->oom = true;
            return;
        }
        branch *hit = NULL;
        for (size_t k = 0; k < s->n_br && !hit; k++)
            if (branch_feed(s, &s->br[k], text[i])) hit = &s->br[k];
        if (!hit) continue;
        size_t m = branch_pending(hit);
        act_on(s, ev, s->unmatched, NULL, s->stash.data, s->stash.len - m);
        branch done = *hit; /* enter() rebuilds the branch table */
        act_on(s, ev, done.action, done.label, s->stash.data + s->stash.len - m, m);
        transition(s, &done);
    }
    /* act on what can no longer be part of a match; keep the rest */
    size_t keep = 0;
    for (size_t k = 0; k < s->n_br; k++) {
        size_t p = branch_pending(&s->br[k]);
        if (p > keep) keep = p;
    }
    size_t out = s->stash.len - keep;
    out -= utf8_tail(s->stash.data, out);
    if (!out) return;
    act_on(s, ev, s->unmatched, NULL, s->stash.data, out);
    memmove(s->stash.data, s->stash.data + out, s->stash.len - out);
    s->stash.len -= out;
}

int di_stream_new(const di_parse_options *opts, di_stream **out, di_error *err) {
    di_stream *s = calloc(1, sizeof *s);
    if (!s) return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    s->opt = *opts;
    s->opt.n_stop = 0;
    s->opt.stop = calloc(DI_API_MAX_STOP, sizeof *s->opt.stop);
    bool ok = s->opt.stop != NULL;
    for (int p = 0; ok && p < P_STOP0; p++) ok = pattern_init(&s->pat[p], PATTERN_TEXT[p]);
    s->n_pat = P_STOP0;
    for (size_t i = 0; ok && i < opts->n_stop && s->opt.n_stop < DI_API_MAX_STOP; i++) {
        if (!opts->stop[i] || !opts->stop[i][0]) continue; /* an empty stop string would match everywhere */
        char *copy = di_strdup(opts->stop[i]);
        ok = copy && pattern_init(&s->pat[s->n_pat], copy);
        if (copy) s->opt.stop[s->opt.n_stop++] = copy;
        s->n_pat += ok;
    }
    if (!ok) {
        di_stream_free(s);
        return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    }
    s->thinking = opts->stage0 == DI_STAGE0_REASONING || opts->stage0 == DI_STAGE0_REASONING_CONTINUATION;
    if (opts->starts_in_tool_calls)
        enter(s, S_CALLS, false); /* the prompt already opened the block */
    else if (s->thinking)
        enter(s, S_REASONING, opts->stage0 == DI_STAGE0_REASONING);
    else
        enter(s, S_ANSWER, opts->stage0 == DI_STAGE0_CONTENT);
    *out = s;
    return DI_OK;
}

void di_stream_free(di_stream *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_pat; i++) free(s->pat[i].fail);
    for (size_t i = 0; s->opt.stop && i < s->opt.n_stop; i++) free(s->opt.stop[i]);
    free(s->opt.stop);
    di_buf_free(&s->stash);
    di_buf_free(&s->reasoning);
    di_buf_free(&s->content);
    di_buf_free(&s->name);
    for (size_t i = 0; i < s->n_calls; i++) {
        free(s->calls[i].name);
        di_buf_free(&s->call_args[i]);
    }
    free(s->calls);
    free(s->call_args);
    free(s);
}

int di_stream_push(di_stream *s, const char *text, size_t len, int64_t n_tokens, di_events *ev, di_error *err) {
    s->completion_tokens += n_tokens;
    if (s->finish != DI_FINISH_NONE) return DI_OK;
    feed(s, ev, text, len);
    if (s->oom) return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    /* tokens that leave the parser inside the reasoning are reasoning tokens (exact when the
     * engine pushes token by token) */
    if (s->st == S_REASONING) s->reasoning_tokens += n_tokens;
    return DI_OK;
}

int di_stream_finish(di_stream *s, di_finish backend_reason, di_events *ev, di_error *err) {
    if (s->finish != DI_FINISH_NONE) return DI_OK;
    act_on(s, ev, s->unmatched, NULL, s->stash.data, s->stash.len); /* what was held back */
    s->stash.len = 0;
    if (s->oom) return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    s->finish = s->stopped ? DI_FINISH_STOP : s->n_calls ? DI_FINISH_TOOL_CALLS : backend_reason;
    if (s->finish == DI_FINISH_NONE) s->finish = DI_FINISH_STOP;
    return DI_OK;
}

bool di_stream_done(const di_stream *s) { return s->st == S_FINISHED; }

const char *di_stream_reasoning(const di_stream *s) {
    return s->thinking ? (s->reasoning.data ? s->reasoning.data : "") : NULL;
}
const char *di_stream_content(const di_stream *s) { return s->content.data ? s->content.data : ""; }

size_t di_stream_calls(const di_stream *s, const di_stream_call **calls) {
    for (size_t i = 0; i < s->n_calls; i++) s->calls[i].arguments = s->call_args[i].data ? s->call_args[i].data : "";
    *calls = s->calls;
    return s->n_calls;
}

di_finish di_stream_finish_reason(const di_stream *s) { return s->finish; }

void di_stream_usage(const di_stream *s, di_usage *u) {
    u->completion_tokens = s->completion_tokens;
    u->reasoning_tokens = s->reasoning_tokens;
}

const char *di_finish_name(di_finish f, di_api api) {
    switch (f) {
    case DI_FINISH_NONE: return NULL;
    case DI_FINISH_STOP: return api == DI_API_MESSAGES ? "end_turn" : api == DI_API_RESPONSES ? "completed" : "stop";
    case DI_FINISH_LENGTH: return api == DI_API_MESSAGES ? "max_tokens" : api == DI_API_RESPONSES ? "incomplete" : "length";
    case DI_FINISH_CONTENT_FILTER: return api == DI_API_MESSAGES ? "refusal" : "content_filter";
    case DI_FINISH_TOOL_CALLS: return api == DI_API_MESSAGES ? "tool_use" : api == DI_API_RESPONSES ? "completed" : "tool_calls";
    }
    return NULL;
}
