/* The output parser: a byte-level state machine over a pending buffer. Each step looks for the
 * earliest complete marker the current state cares about; text before it is emitted, and when no
 * marker is complete, the longest tail that could still begin one is held back. That hold-back is
 * what makes the output independent of chunking. */
#include "text/stream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_json.h"
#include "util/error.h"

#define THINK_END DI_TOK_THINK_END
#define DSML_OPEN "<" DI_TOK_DSML
#define CALLS_OPEN " calls>"
#define CALLS_CLOSE "</" DI_TOK_DSML " calls>"
#define INVOKE_OPEN "<" DI_TOK_DSML " invoke name=\""
#define INVOKE_CLOSE "</" DI_TOK_DSML " invoke>"
#define PARAM_OPEN "<" DI_TOK_DSML " parameter name=\""
#define PARAM_CLOSE "</" DI_TOK_DSML " parameter>"
#define FENCE_JSON "```json"
#define FENCE "```"
#define DI_STREAM_MAX_TAG 4096 /* bytes a DSML tag header may take before it is called malformed */

typedef enum st { ST_REASONING, ST_CONTENT, ST_TOOLS, ST_DONE } st;
typedef enum tst { T_OPEN, T_BETWEEN, T_PARAMS, T_FLAG, T_VALUE } tst;
typedef enum jst { J_SEEK, J_FENCE, J_BARE, J_DONE } jst;

struct di_stream {
    di_parse_options opt; /* stop strings owned */
    st state;
    tst tstate;
    jst jstate;
    bool at_start;       /* drop leading newlines of the current reasoning/answer */
    size_t nl_held;      /* trailing newlines not yet emitted */
    bool json_skipped;   /* json mode: text was blanked before the JSON */
    bool value_string;   /* T_VALUE: a string="true" parameter */
    int n_params;        /* parameters of the open call */
    bool stopped;        /* a stop string ended the answer */
    di_finish finish;
    di_buf pend;         /* bytes not yet decided */
    size_t pend_off;     /* consumed prefix of pend */
    bool thinking;
    di_buf reasoning, content;
    di_stream_call *calls; /* [n_calls] */
    di_buf *call_args;     /* [n_calls] */
    size_t n_calls;
    int64_t completion_tokens, reasoning_tokens;
    bool oom;
};

/* ---- events ---- */

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
    t = copy;
    ev->ev[ev->n++] = (di_event){.kind = kind, .tool = tool, .text = copy, .len = n};
    if (kind == DI_EV_REASONING) di_buf_append(&s->reasoning, t, n);
    else if (kind == DI_EV_CONTENT) di_buf_append(&s->content, t, n);
    else if (kind == DI_EV_TOOL_ARGS) di_buf_append(&s->call_args[tool], t, n);
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

/* Reasoning/answer text with the newline rules: leading newlines dropped at a start, trailing
 * ones held until text follows (or dropped by the caller at a marker). */
static void emit_text(di_stream *s, di_events *ev, const char *t, size_t n) {
    di_event_kind kind = s->state == ST_REASONING ? DI_EV_REASONING : DI_EV_CONTENT;
    if (s->at_start) {
        while (n && *t == '\n') t++, n--;
        if (!n) return;
        s->at_start = false;
    }
    size_t body = n;
    while (body && t[body - 1] == '\n') body--;
    if (body) {
        for (; s->nl_held; s->nl_held--) emit(s, ev, kind, -1, "\n", 1);
        emit(s, ev, kind, -1, t, body);
    }
    s->nl_held += n - body;
}

static void flush_newlines(di_stream *s, di_events *ev) {
    di_event_kind kind = s->state == ST_REASONING ? DI_EV_REASONING : DI_EV_CONTENT;
    for (; s->nl_held; s->nl_held--) emit(s, ev, kind, -1, "\n", 1);
}

/* ---- marker search ---- */

typedef struct found {
    size_t pos;   /* start of the earliest complete marker, or the emit-safe length if none */
    int which;    /* index into the marker list, -1 = none complete */
} found;

/* The complete marker in p[0..n) that ENDS first (the reference matches markers byte by byte and
 * acts on the first one to complete; on a tie the longer one wins); without one, pos = n minus the
 * longest tail that is a proper prefix of some marker (held back, unless final). */
static found scan(const char *p, size_t n, const char *const *markers, size_t n_markers, bool final) {
    found f = {.pos = n, .which = -1};
    size_t best_end = SIZE_MAX;
    for (size_t m = 0; m < n_markers; m++) {
        size_t ml = strlen(markers[m]);
        const char *hit = memmem(p, n, markers[m], ml);
        if (!hit) continue;
        size_t at = (size_t)(hit - p), end = at + ml;
        if (end < best_end || (end == best_end && at < f.pos)) best_end = end, f.pos = at, f.which = (int)m;
    }
    if (f.which >= 0 || final) return f;
    size_t hold = 0;
    for (size_t m = 0; m < n_markers; m++) {
        size_t ml = strlen(markers[m]);
        for (size_t k = ml - 1 < n ? ml - 1 : n; k > hold; k--)
            if (!memcmp(p + n - k, markers[m], k)) {
                hold = k;
                break;
            }
    }
    f.pos = n - hold;
    /* never end an emitted piece inside a UTF-8 sequence: the rest of it may be in the next push */
    for (size_t back = 1; back <= 3 && back <= f.pos; back++) {
        unsigned char c = (unsigned char)p[f.pos - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: keep looking for the lead */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back) f.pos -= back;
        break;
    }
    return f;
}

/* Does p start with lit? 1 yes, 0 no, -1 undecided (p is a proper prefix of lit). */
static int starts(const char *p, size_t n, const char *lit) {
    size_t l = strlen(lit);
    if (n >= l) return !memcmp(p, lit, l);
    return memcmp(p, lit, n) ? 0 : -1;
}

/* ---- tool-call block ---- */

static void args(di_stream *s, di_events *ev, const char *t, size_t n) {
    emit(s, ev, DI_EV_TOOL_ARGS, (int32_t)s->n_calls - 1, t, n);
}

static void args_escaped(di_stream *s, di_events *ev, const char *t, size_t n) {
    di_buf b = {0};
    di_json_write_string(&b, t, n);
    if (b.oom) s->oom = true;
    if (b.len >= 2) args(s, ev, b.data + 1, b.len - 2); /* without the quotes */
    di_buf_free(&b);
}

static bool start_call(di_stream *s, di_events *ev, const char *name, size_t n) {
    di_stream_call *c = realloc(s->calls, (s->n_calls + 1) * sizeof *c);
    di_buf *a = c ? realloc(s->call_args, (s->n_calls + 1) * sizeof *a) : NULL;
    if (c) s->calls = c;
    if (a) s->call_args = a;
    char *nm = malloc(n + 1);
    if (!c || !a || !nm) {
        free(nm);
        s->oom = true;
        return false;
    }
    memcpy(nm, name, n);
    nm[n] = '\0';
    s->calls[s->n_calls] = (di_stream_call){.name = nm};
    s->call_args[s->n_calls] = (di_buf){0};
    s->n_calls++;
    s->n_params = 0;
    emit(s, ev, DI_EV_TOOL_START, (int32_t)s->n_calls - 1, name, n);
    return true;
}

/* One step inside the block. Returns the bytes consumed, 0 when more text is needed. */
static size_t tools_step(di_stream *s, di_events *ev, const char *p, size_t n, bool final) {
    size_t ws = 0;
    if (s->tstate == T_BETWEEN || s->tstate == T_PARAMS) {
        while (ws < n && (p[ws] == '\n' || p[ws] == ' ' || p[ws] == '\t' || p[ws] == '\r')) ws++;
        if (ws) return ws;
    }
    int r;
    switch (s->tstate) {
    case T_OPEN:
        r = starts(p, n, CALLS_OPEN);
        if (r < 0) break;
        if (!r) goto invalid;
        s->tstate = T_BETWEEN;
        return strlen(CALLS_OPEN);
    case T_BETWEEN: {
        if ((r = starts(p, n, CALLS_CLOSE)) > 0) {
            s->state = ST_DONE;
            return strlen(CALLS_CLOSE);
        }
        int r2 = starts(p, n, INVOKE_OPEN);
        if (r < 0 || r2 < 0) break;
        if (!r2) goto invalid;
        /* the name runs to the first quote, which must close the tag */
        const char *name = p + strlen(INVOKE_OPEN);
        const char *end = memchr(name, '"', n - strlen(INVOKE_OPEN));
        /* runaway markup is malformed rather than buffered (decided the same way for any split) */
        if (end ? end - p > DI_STREAM_MAX_TAG : n > DI_STREAM_MAX_TAG) goto invalid;
        if (!end) break;
        int r3 = starts(end, n - (size_t)(end - p), "\">");
        if (r3 < 0) break;
        if (!r3) goto invalid;
        if (!start_call(s, ev, name, (size_t)(end - name))) return n;
        s->tstate = T_PARAMS;
        return (size_t)(end + 2 - p);
    }
    case T_PARAMS: {
        if ((r = starts(p, n, INVOKE_CLOSE)) > 0) {
            args(s, ev, s->n_params ? "}" : "{}", s->n_params ? 1 : 2);
            s->tstate = T_BETWEEN;
            return strlen(INVOKE_CLOSE);
        }
        int r2 = starts(p, n, PARAM_OPEN);
        if (r < 0 || r2 < 0) break;
        if (!r2) goto invalid;
        const char *key = p + strlen(PARAM_OPEN);
        size_t rest = n - strlen(PARAM_OPEN);
        const char *kend = memchr(key, '"', rest); /* the key runs to the first quote */
        if (kend ? kend - p > DI_STREAM_MAX_TAG : n > DI_STREAM_MAX_TAG) goto invalid;
        if (!kend) break;
        int r3 = starts(kend, n - (size_t)(kend - p), "\" string=\"");
        if (r3 < 0) break;
        if (!r3) goto invalid;
        /* The key goes out as soon as it is known, verbatim between quotes (the reference does
         * not escape it); the type flag is checked after. */
        args(s, ev, s->n_params ? ", \"" : "{\"", s->n_params ? 3 : 2);
        args(s, ev, key, (size_t)(kend - key));
        args(s, ev, "\": ", 3);
        s->tstate = T_FLAG;
        return (size_t)(kend + 10 - p);
    }
    case T_FLAG: {
        int is_true = starts(p, n, "true\">"), is_false = starts(p, n, "false\">");
        if (is_true < 0 || is_false < 0) break;
        if (!is_true && !is_false) goto invalid;
        s->value_string = is_true > 0;
        if (s->value_string) args(s, ev, "\"", 1);
        s->tstate = T_VALUE;
        return is_true > 0 ? 6 : 7;
    }
    case T_VALUE: {
        static const char *const close[] = {PARAM_CLOSE};
        found f = scan(p, n, close, 1, final);
        if (s->value_string)
            args_escaped(s, ev, p, f.pos);
        else
            args(s, ev, p, f.pos);
        if (f.which < 0) return f.pos;
        if (s->value_string) args(s, ev, "\"", 1);
        s->n_params++;
        s->tstate = T_PARAMS;
        return f.pos + strlen(PARAM_CLOSE);
    }
    }
    if (!final) return 0;
invalid:
    s->state = ST_DONE; /* malformed markup: the rest of the output is not shown */
    return n;
}

/* ---- json_object answers ---- */

static size_t json_step(di_stream *s, di_events *ev, const char *p, size_t n, bool final) {
    switch (s->jstate) {
    case J_SEEK: {
        static const char *const open[] = {FENCE_JSON, "{", "["};
        found f = scan(p, n, open, 3, final);
        if (f.pos) s->json_skipped = true;
        if (f.which < 0) return f.pos;
        if (s->json_skipped) emit(s, ev, DI_EV_CONTENT, -1, " ", 1);
        s->json_skipped = false; /* reused by J_DONE for the text after the fence */
        if (f.which == 0) {
            s->jstate = J_FENCE;
            s->at_start = true; /* the fence's own newline is not part of the JSON */
            return f.pos + strlen(FENCE_JSON);
        }
        s->jstate = J_BARE;
        return f.pos; /* the bracket is the JSON's first byte */
    }
    case J_FENCE: {
        static const char *const close[] = {FENCE};
        found f = scan(p, n, close, 1, final);
        emit_text(s, ev, p, f.pos);
        if (f.which < 0) return f.pos;
        s->nl_held = 0; /* the newline before the closing fence belongs to the fence */
        s->jstate = J_DONE;
        return f.pos + strlen(FENCE);
    }
    case J_BARE: emit_text(s, ev, p, n); return n;
    case J_DONE: /* text after the closing fence is blanked to one space */
        if (n && !s->json_skipped) emit(s, ev, DI_EV_CONTENT, -1, " ", 1);
        s->json_skipped = true;
        return n;
    }
    return n;
}

/* ---- the main loop ---- */

static void run(di_stream *s, di_events *ev, bool final) {
    const char *markers[3 + DI_API_MAX_STOP]; /* [THINK_END, DSML_OPEN?, stop...] */
    while (s->pend_off < s->pend.len && s->state != ST_DONE && !s->oom) {
        const char *p = s->pend.data + s->pend_off;
        size_t n = s->pend.len - s->pend_off, used = 0;
        if (s->state == ST_REASONING) {
            /* a tool-call block may also start straight from the reasoning */
            markers[0] = THINK_END, markers[1] = DSML_OPEN;
            found f = scan(p, n, markers, s->opt.parse_tool_calls ? 2 : 1, final);
            emit_text(s, ev, p, f.pos);
            used = f.pos;
            if (f.which >= 0) s->nl_held = 0; /* newlines before either marker belong to it */
            if (f.which == 0) {
                s->state = ST_CONTENT;
                s->at_start = true;
                used += strlen(THINK_END);
            } else if (f.which == 1) {
                s->state = ST_TOOLS;
                s->tstate = T_OPEN;
                used += strlen(DSML_OPEN);
            }
        } else if (s->state == ST_CONTENT && s->opt.parse_json_output && s->jstate != J_BARE) {
            used = json_step(s, ev, p, n, final);
        } else if (s->state == ST_CONTENT) {
            size_t nm = 0;
            markers[nm++] = THINK_END;
            size_t first_stop = nm + (s->opt.parse_tool_calls ? 1 : 0);
            if (s->opt.parse_tool_calls) markers[nm++] = DSML_OPEN;
            for (size_t i = 0; i < s->opt.n_stop && i < DI_API_MAX_STOP; i++) markers[nm++] = s->opt.stop[i];
            found f = scan(p, n, markers, nm, final);
            emit_text(s, ev, p, f.pos);
            used = f.pos;
            if (f.which == 0) {
                used += strlen(THINK_END); /* a stray </think> in the answer is dropped */
            } else if (f.which >= (int)first_stop) {
                flush_newlines(s, ev);
                s->stopped = true;
                s->state = ST_DONE;
                used = n;
            } else if (f.which > 0) {
                s->nl_held = 0; /* newlines before the block belong to the markup */
                s->state = ST_TOOLS;
                s->tstate = T_OPEN;
                used += strlen(DSML_OPEN);
            }
        } else if (s->state == ST_TOOLS) {
            used = tools_step(s, ev, p, n, final);
        }
        if (!used) break;
        s->pend_off += used;
    }
    /* compact the pending buffer */
    if (s->pend_off == s->pend.len || s->state == ST_DONE) {
        s->pend.len = 0, s->pend_off = 0;
        if (s->pend.data) s->pend.data[0] = '\0';
    } else if (s->pend_off > 4096) {
        memmove(s->pend.data, s->pend.data + s->pend_off, s->pend.len - s->pend_off);
        s->pend.len -= s->pend_off, s->pend_off = 0;
    }
}

int di_stream_new(const di_parse_options *opts, di_stream **out, di_error *err) {
    di_stream *s = calloc(1, sizeof *s);
    if (!s) return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    s->opt = *opts;
    s->opt.stop = calloc(opts->n_stop ? opts->n_stop : 1, sizeof *s->opt.stop);
    s->opt.n_stop = 0;
    for (size_t i = 0; s->opt.stop && i < opts->n_stop && i < DI_API_MAX_STOP; i++) {
        if (!opts->stop[i] || !opts->stop[i][0]) continue; /* an empty stop string would match everywhere */
        s->opt.stop[s->opt.n_stop++] = di_strdup(opts->stop[i]);
    }
    /* reasoning is reported when the output starts inside it */
    s->thinking = opts->stage0 == DI_STAGE0_REASONING || opts->stage0 == DI_STAGE0_REASONING_CONTINUATION;
    if (opts->starts_in_tool_calls) {
        s->state = ST_TOOLS, s->tstate = T_BETWEEN; /* the prompt already opened the block */
    } else if (opts->stage0 == DI_STAGE0_REASONING || opts->stage0 == DI_STAGE0_REASONING_CONTINUATION) {
        s->state = ST_REASONING;
    } else {
        s->state = ST_CONTENT;
    }
    s->at_start = opts->stage0 == DI_STAGE0_REASONING || opts->stage0 == DI_STAGE0_CONTENT;
    if (!s->opt.stop) {
        free(s);
        return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    }
    *out = s;
    return DI_OK;
}

void di_stream_free(di_stream *s) {
    if (!s) return;
    for (size_t i = 0; i < s->opt.n_stop; i++) free(s->opt.stop[i]);
    free(s->opt.stop);
    di_buf_free(&s->pend);
    di_buf_free(&s->reasoning);
    di_buf_free(&s->content);
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
    if (s->finish != DI_FINISH_NONE || s->state == ST_DONE) return DI_OK;
    di_buf_append(&s->pend, text, len);
    run(s, ev, false);
    /* tokens that leave the parser inside the reasoning are reasoning tokens (exact when the
     * engine pushes token by token) */
    if (s->state == ST_REASONING) s->reasoning_tokens += n_tokens;
    if (s->oom || s->pend.oom) return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    return DI_OK;
}

int di_stream_finish(di_stream *s, di_finish backend_reason, di_events *ev, di_error *err) {
    if (s->finish != DI_FINISH_NONE) return DI_OK;
    run(s, ev, true);
    if (s->state == ST_REASONING || s->state == ST_CONTENT) flush_newlines(s, ev);
    /* json mode and no JSON at all: the blanked answer is one space */
    if (s->state == ST_CONTENT && s->opt.parse_json_output && s->jstate == J_SEEK && s->json_skipped)
        emit(s, ev, DI_EV_CONTENT, -1, " ", 1);
    if (s->oom) return di_error_set(err, DI_ERR_NOMEM, "stream: out of memory");
    s->finish = s->stopped ? DI_FINISH_STOP : s->n_calls ? DI_FINISH_TOOL_CALLS : backend_reason;
    if (s->finish == DI_FINISH_NONE) s->finish = DI_FINISH_STOP;
    return DI_OK;
}

bool di_stream_done(const di_stream *s) { return s->state == ST_DONE; }

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
