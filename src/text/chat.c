/* V4.1 prompt rendering. Layout (one conversation, thinking on, tools declared):
 *
 *   BOS <｜System｜> "Reasoning Effort: N (...)\n\n" system-text "\n\n## Tools ..." "\n\n## Response Format..."
 *   <｜User｜> user-text ["\n\n" <tool_result>...</tool_result> ...]
 *   <｜Assistant｜> <think> reasoning </think> content ["\n\n<｜DSML｜ calls>...</｜DSML｜ calls>"] EOS
 *   ... <｜Assistant｜> <think>                      (the generation header)
 *
 * The rules below are the reference encoder's (deepseek-recipe 0.2.0), checked case by case against
 * tests/data/chat/cases.json. Where it differs from the V4.1 release encoder (SGLang's port) the
 * reference wins, because the golden ids come from it:
 *  - a conversation that ends with a complete assistant turn gets a fresh generation header, and that
 *    generation point counts as the "last user turn" for dropping old reasoning;
 *  - an <｜Assistant｜> header opens every assistant turn (also after a latest_reminder);
 *  - named efforts map low→50, high→75, xhigh→75, max→100 (default high). */
#include "text/chat.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_json.h"
#include "util/error.h"

const char *di_role_name(di_role r) {
    switch (r) {
    case DI_ROLE_SYSTEM: return "system";
    case DI_ROLE_USER: return "user";
    case DI_ROLE_ASSISTANT: return "assistant";
    case DI_ROLE_TOOL: return "tool";
    case DI_ROLE_LATEST_REMINDER: return "latest_reminder";
    }
    return "?";
}

int di_effort_from_name(const char *name) {
    static const struct { const char *name; int value; } levels[] = {
        {"low", DI_EFFORT_LOW}, {"high", DI_EFFORT_HIGH}, {"xhigh", DI_EFFORT_XHIGH}, {"max", DI_EFFORT_MAX}};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (!strcmp(name, levels[i].name)) return levels[i].value;
    return -1;
}

int di_effort_value(int effort) { return effort == DI_EFFORT_DEFAULT ? DI_EFFORT_HIGH : effort; }

/* ---- building ---- */

char *di_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void di_conv_init(di_conversation *c) {
    memset(c, 0, sizeof *c);
    c->thinking = true;
}

void di_conv_free(di_conversation *c) {
    for (size_t i = 0; i < c->n_msgs; i++) {
        di_message *m = &c->msgs[i];
        free(m->content);
        free(m->reasoning);
        free(m->tool_call_id);
        for (size_t k = 0; k < m->n_calls; k++) {
            free(m->calls[k].id);
            free(m->calls[k].name);
            free(m->calls[k].arguments);
        }
        free(m->calls);
    }
    free(c->msgs);
    for (size_t i = 0; i < c->n_tools; i++) {
        free(c->tools[i].name);
        free(c->tools[i].description);
        free(c->tools[i].parameters);
    }
    free(c->tools);
    free(c->response_schema);
    free(c->response_regex);
    free(c->response_ebnf);
    di_conv_init(c);
}

di_message *di_conv_add(di_conversation *c, di_role role, const char *content) {
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? 2 * c->cap_msgs : 8;
        di_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return NULL;
        c->msgs = m, c->cap_msgs = cap;
    }
    di_message *m = &c->msgs[c->n_msgs];
    memset(m, 0, sizeof *m);
    m->role = role;
    m->content = di_strdup(content ? content : "");
    if (!m->content) return NULL;
    c->n_msgs++;
    return m;
}

int di_msg_add_call(di_message *m, const char *id, const char *name, const char *arguments) {
    di_tool_call *tc = realloc(m->calls, (m->n_calls + 1) * sizeof *tc);
    if (!tc) return DI_ERR_NOMEM;
    m->calls = tc;
    tc = &m->calls[m->n_calls];
    tc->id = di_strdup(id ? id : "");
    tc->name = di_strdup(name ? name : "");
    tc->arguments = di_strdup(arguments ? arguments : "{}");
    m->n_calls++;
    return tc->id && tc->name && tc->arguments ? DI_OK : DI_ERR_NOMEM;
}

di_tool_def *di_conv_add_tool(di_conversation *c, const char *name, const char *description,
                              const char *parameters) {
    di_tool_def *t = realloc(c->tools, (c->n_tools + 1) * sizeof *t);
    if (!t) return NULL;
    c->tools = t;
    t = &c->tools[c->n_tools];
    t->name = di_strdup(name);
    t->description = di_strdup(description);
    t->parameters = di_strdup(parameters);
    t->strict = -1;
    c->n_tools++;
    if (!t->name || (description && !t->description) || (parameters && !t->parameters)) return NULL;
    return t;
}

/* ---- the segment writer ---- */

typedef struct seg_writer {
    di_prompt *p;
    di_buf plain; /* the open plain run */
    bool oom;
} seg_writer;

static const char *const SPECIALS[] = {DI_TOK_BOS,       DI_TOK_EOS,   DI_TOK_SYSTEM,   DI_TOK_USER,
                                       DI_TOK_ASSISTANT, DI_TOK_THINK, DI_TOK_THINK_END, DI_TOK_REMINDER,
                                       DI_TOK_DSML,      DI_TOK_IMAGE};

static void push_seg(seg_writer *w, const char *s, size_t n, bool special) {
    di_prompt *p = w->p;
    if (p->n_segs == p->cap_segs) {
        size_t cap = p->cap_segs ? 2 * p->cap_segs : 32;
        di_segment *segs = realloc(p->segs, cap * sizeof *segs);
        if (!segs) {
            w->oom = true;
            return;
        }
        p->segs = segs, p->cap_segs = cap;
    }
    char *t = malloc(n + 1);
    if (!t) {
        w->oom = true;
        return;
    }
    memcpy(t, s, n);
    t[n] = '\0';
    p->segs[p->n_segs++] = (di_segment){.text = t, .len = n, .special = special};
}

static void flush_plain(seg_writer *w) {
    if (w->plain.oom) w->oom = true;
    if (w->plain.len) push_seg(w, w->plain.data, w->plain.len, false);
    w->plain.len = 0;
}

/* Message content: always plain, whatever it spells. */
static void put_plain(seg_writer *w, const char *s, size_t n) { di_buf_append(&w->plain, s, n); }
static void put_plain_str(seg_writer *w, const char *s) { put_plain(w, s, strlen(s)); }

static void put_special(seg_writer *w, const char *tok) {
    flush_plain(w);
    push_seg(w, tok, strlen(tok), true);
}

/* Template text: the special-token literals inside it (｜DSML｜, <think>, ...) are real tokens. */
static void put_template(seg_writer *w, const char *s) {
    while (*s) {
        const char *best = NULL, *tok = NULL;
        for (size_t i = 0; i < sizeof SPECIALS / sizeof SPECIALS[0]; i++) {
            const char *f = strstr(s, SPECIALS[i]);
            if (f && (!best || f < best)) best = f, tok = SPECIALS[i];
        }
        if (!best) {
            put_plain_str(w, s);
            return;
        }
        put_plain(w, s, (size_t)(best - s));
        put_special(w, tok);
        s = best + strlen(tok);
    }
}

/* Content that may carry image placeholders: the first n_images occurrences of the placeholder
 * literal are the images; any later occurrence is text the user typed. */
static size_t put_content(seg_writer *w, const char *s, size_t n_images) {
    size_t done = 0;
    while (done < n_images) {
        const char *f = strstr(s, DI_TOK_IMAGE);
        if (!f) break;
        put_plain(w, s, (size_t)(f - s));
        put_special(w, DI_TOK_IMAGE);
        s = f + strlen(DI_TOK_IMAGE);
        done++;
    }
    put_plain_str(w, s);
    return done;
}

/* ---- template pieces ---- */

static const char TOOLS_HEAD[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<" DI_TOK_DSML " calls>\" block like the following:\n\n"
    "<" DI_TOK_DSML " calls>\n"
    "<" DI_TOK_DSML " invoke name=\"$TOOL_NAME\">\n"
    "<" DI_TOK_DSML " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DI_TOK_DSML
    " parameter>\n"
    "...\n"
    "</" DI_TOK_DSML " invoke>\n"
    "<" DI_TOK_DSML " invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DI_TOK_DSML " invoke>\n"
    "</" DI_TOK_DSML " calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " DI_TOK_THINK "), you MUST output your complete reasoning "
    "inside " DI_TOK_THINK "..." DI_TOK_THINK_END " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " DI_TOK_THINK_END " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
static const char FORMAT_HEAD[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* One tool's schema line: {"name": ..., "description": ..., "parameters": ...} in Python spelling. */
static void put_tool_schema(seg_writer *w, const di_tool_def *t) {
    di_buf b = {0};
    di_buf_puts(&b, "{\"name\": ");
    di_json_write_string(&b, t->name, strlen(t->name));
    di_buf_puts(&b, ", \"description\": ");
    const char *d = t->description ? t->description : "";
    di_json_write_string(&b, d, strlen(d));
    di_buf_puts(&b, ", \"parameters\": ");
    json_t *params = t->parameters ? json_loads(t->parameters, JSON_DECODE_ANY, NULL) : NULL;
    if (params)
        di_json_write(&b, params, DI_JSON_PYTHON);
    else
        di_buf_puts(&b, "{}");
    json_decref(params);
    di_buf_puts(&b, "}");
    if (b.oom) w->oom = true;
    /* schema text is caller data: plain, never special */
    if (b.data) put_plain(w, b.data, b.len);
    di_buf_free(&b);
}

static void put_dsml_param(seg_writer *w, const char *name, const char *value, size_t vlen, bool is_string) {
    put_template(w, "<" DI_TOK_DSML " parameter name=\"");
    put_plain_str(w, name);
    put_template(w, is_string ? "\" string=\"true\">" : "\" string=\"false\">");
    put_plain(w, value, vlen);
    put_template(w, "</" DI_TOK_DSML " parameter>");
}

/* The DSML block for an assistant turn's tool calls. Arguments that are a JSON object become one
 * parameter per key (strings raw, other values in Python JSON spelling); anything else is passed
 * through as a single string parameter named "arguments", as the reference does. */
static void put_tool_calls(seg_writer *w, const di_message *m) {
    put_template(w, "\n\n<" DI_TOK_DSML " calls>\n");
    for (size_t i = 0; i < m->n_calls; i++) {
        const di_tool_call *tc = &m->calls[i];
        if (i) put_plain_str(w, "\n");
        put_template(w, "<" DI_TOK_DSML " invoke name=\"");
        put_plain_str(w, tc->name);
        put_template(w, "\">\n");
        json_t *args = json_loads(tc->arguments, JSON_DECODE_ANY, NULL);
        if (json_is_object(args)) {
            const char *key;
            json_t *v;
            bool first = true;
            json_object_foreach(args, key, v) {
                if (!first) put_plain_str(w, "\n");
                first = false;
                if (json_is_string(v)) {
                    put_dsml_param(w, key, json_string_value(v), json_string_length(v), true);
                } else {
                    di_buf b = {0};
                    di_json_write(&b, v, DI_JSON_PYTHON);
                    if (b.oom) w->oom = true;
                    put_dsml_param(w, key, b.data ? b.data : "", b.len, false);
                    di_buf_free(&b);
                }
            }
        } else {
            put_dsml_param(w, "arguments", tc->arguments, strlen(tc->arguments), true);
        }
        json_decref(args);
        put_template(w, "\n</" DI_TOK_DSML " invoke>");
    }
    put_template(w, "\n</" DI_TOK_DSML " calls>");
}

/* ---- turn structure ---- */

/* A rendered turn: a run of consecutive user/tool messages forms one user turn. */
typedef struct turn {
    di_role role;       /* SYSTEM, USER (incl. tool results), ASSISTANT, LATEST_REMINDER */
    size_t first, last; /* message index range [first, last] */
} turn;

static bool tools_active(const di_conversation *c) { return c->n_tools > 0 && c->tool_choice != DI_TOOL_CHOICE_NONE; }

static bool has_schema_section(const di_conversation *c) {
    return c->format == DI_FORMAT_JSON_OBJECT || c->format == DI_FORMAT_JSON_SCHEMA;
}

/* The system head: BOS-adjacent <｜System｜>, effort line, first system text, tools, format. */
static void put_head(seg_writer *w, const di_conversation *c, const di_message *sys) {
    bool synth = !sys && (tools_active(c) || has_schema_section(c));
    if (!(c->thinking || sys || synth)) return;
    put_special(w, DI_TOK_SYSTEM);
    if (c->thinking) {
        char line[160];
        snprintf(line, sizeof line,
                 "Reasoning Effort: %d (range 1-100, the higher the value, the more thorough the reasoning)\n\n",
                 di_effort_value(c->effort));
        put_plain_str(w, line);
    }
    if (sys) put_content(w, sys->content, sys->n_images);
    if (tools_active(c)) {
        put_plain_str(w, "\n\n");
        put_template(w, TOOLS_HEAD);
        for (size_t i = 0; i < c->n_tools; i++) {
            if (i) put_plain_str(w, "\n");
            put_tool_schema(w, &c->tools[i]);
        }
        put_template(w, TOOLS_TAIL);
    }
    if (has_schema_section(c)) {
        put_plain_str(w, "\n\n");
        put_template(w, FORMAT_HEAD);
        if (c->format == DI_FORMAT_JSON_OBJECT) {
            put_plain_str(w, "{\"type\": \"json_object\"}");
        } else {
            json_t *s = c->response_schema ? json_loads(c->response_schema, JSON_DECODE_ANY, NULL) : NULL;
            di_buf b = {0};
            if (s) di_json_write(&b, s, DI_JSON_PYTHON);
            if (b.oom) w->oom = true;
            if (b.data) put_plain(w, b.data, b.len);
            di_buf_free(&b);
            json_decref(s);
        }
    }
}

static int cmp_call(const void *a, const void *b) {
    const di_call_entry *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

int di_call_index_build(const di_message *caller, di_call_index *ix) {
    ix->n = caller ? caller->n_calls : 0;
    ix->e = malloc((ix->n ? ix->n : 1) * sizeof *ix->e);
    if (!ix->e) return DI_ERR_NOMEM;
    for (size_t k = 0; k < ix->n; k++) ix->e[k] = (di_call_entry){caller->calls[k].id, k};
    qsort(ix->e, ix->n, sizeof *ix->e, cmp_call);
    return DI_OK;
}

long di_call_index_find(const di_call_index *ix, const char *id) {
    size_t lo = 0, hi = ix->n; /* first entry with e.id > id */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ix->e[mid].id, id) <= 0) lo = mid + 1;
        else hi = mid;
    }
    return lo && !strcmp(ix->e[lo - 1].id, id) ? (long)ix->e[lo - 1].pos : -1;
}

void di_call_index_free(di_call_index *ix) {
    free(ix->e);
    ix->e = NULL, ix->n = 0;
}

/* One user turn: its user texts and tool results joined by blank lines. Tool results keep the
 * slots they occupy but are reordered among themselves into the order of the calls they answer
 * (a stable counting sort by call position; unknown ids count as position 0, like the reference). */
static void put_user_turn(seg_writer *w, const di_conversation *c, const turn *t, const di_message *caller) {
    put_special(w, DI_TOK_USER);
    size_t n = t->last - t->first + 1, n_calls = caller ? caller->n_calls : 0;
    size_t *order = malloc(n * sizeof *order);            /* [n] message indices in output order */
    size_t *rank = malloc(n * sizeof *rank);              /* [n] call position of each tool result */
    size_t *count = calloc(n_calls + 2, sizeof *count);   /* [n_calls + 2] counting-sort buckets */
    size_t *sorted = malloc(n * sizeof *sorted);          /* [n_tool] tool results by call position */
    di_call_index ix = {0};
    if (!order || !rank || !count || !sorted || di_call_index_build(caller, &ix)) {
        w->oom = true;
        goto out;
    }
    size_t n_tool = 0;
    for (size_t i = 0; i < n; i++) {
        const di_message *m = &c->msgs[t->first + i];
        order[i] = t->first + i;
        if (m->role != DI_ROLE_TOOL) continue;
        long pos = m->tool_call_id ? di_call_index_find(&ix, m->tool_call_id) : -1;
        rank[n_tool] = pos < 0 ? 0 : (size_t)pos;
        count[rank[n_tool] + 1]++;
        sorted[n_tool++] = t->first + i;
    }
    for (size_t k = 1; k <= n_calls; k++) count[k] += count[k - 1]; /* bucket starts */
    size_t *placed = malloc((n_tool ? n_tool : 1) * sizeof *placed);
    if (!placed) {
        w->oom = true;
        goto out;
    }
    for (size_t i = 0; i < n_tool; i++) placed[count[rank[i]]++] = sorted[i];
    for (size_t i = 0, k = 0; i < n; i++)
        if (c->msgs[order[i]].role == DI_ROLE_TOOL) order[i] = placed[k++];
    free(placed);
    for (size_t i = 0; i < n; i++) {
        const di_message *m = &c->msgs[order[i]];
        if (i) put_plain_str(w, "\n\n");
        if (m->role == DI_ROLE_TOOL) {
            put_plain_str(w, "<tool_result>");
            put_content(w, m->content, m->n_images);
            put_plain_str(w, "</tool_result>");
        } else {
            put_content(w, m->content, m->n_images);
        }
    }
out:
    di_call_index_free(&ix);
    free(order);
    free(rank);
    free(count);
    free(sorted);
}

int di_chat_render(const di_conversation *c, di_prompt *out, di_error *err) {
    memset(out, 0, sizeof *out);
    if (c->effort < 0 || c->effort > 100)
        return di_error_set(err, DI_ERR_INVALID, "reasoning effort %d: expected 1..100", c->effort);
    /* group messages into turns */
    turn *turns = malloc((c->n_msgs + 1) * sizeof *turns); /* [<= n_msgs] */
    if (!turns) return di_error_set(err, DI_ERR_NOMEM, "chat render: out of memory");
    size_t nt = 0;
    for (size_t i = 0; i < c->n_msgs; i++) {
        di_role r = c->msgs[i].role == DI_ROLE_TOOL ? DI_ROLE_USER : c->msgs[i].role;
        if (r == DI_ROLE_USER && nt && turns[nt - 1].role == DI_ROLE_USER)
            turns[nt - 1].last = i;
        else
            turns[nt++] = (turn){.role = r, .first = i, .last = i};
    }
    const di_message *lastm = c->n_msgs ? &c->msgs[c->n_msgs - 1] : NULL;
    bool open_prefix = lastm && lastm->role == DI_ROLE_ASSISTANT && lastm->prefix;
    /* The last user-like turn; a final complete assistant turn means a new turn is generated, and
     * that generation point plays the part of the last user turn. */
    size_t last_user = 0;
    bool have_user = false;
    if (lastm && lastm->role == DI_ROLE_ASSISTANT && !lastm->prefix) {
        last_user = nt, have_user = true;
    } else {
        for (size_t i = nt; i-- > 0;)
            if (turns[i].role == DI_ROLE_USER || (turns[i].role == DI_ROLE_SYSTEM && i > 0)) {
                last_user = i, have_user = true;
                break;
            }
    }
    bool drop = c->thinking && !tools_active(c);

    seg_writer w = {.p = out};
    put_special(&w, DI_TOK_BOS);
    size_t start = 0;
    const di_message *head_sys = NULL;
    if (nt && turns[0].role == DI_ROLE_SYSTEM) head_sys = &c->msgs[turns[0].first], start = 1;
    put_head(&w, c, head_sys);
    const di_message *caller = NULL; /* latest assistant turn with tool calls */
    for (size_t i = start; i < nt; i++) {
        const turn *t = &turns[i];
        const di_message *m = &c->msgs[t->first];
        switch (t->role) {
        case DI_ROLE_SYSTEM:
            put_special(&w, DI_TOK_SYSTEM);
            put_content(&w, m->content, m->n_images);
            break;
        case DI_ROLE_LATEST_REMINDER:
            put_special(&w, DI_TOK_REMINDER);
            put_plain_str(&w, m->content);
            break;
        case DI_ROLE_USER: put_user_turn(&w, c, t, caller); break;
        case DI_ROLE_ASSISTANT: {
            bool keep = c->thinking && (!drop || !have_user || i > last_user);
            bool is_prefix = m->prefix && t->first == c->n_msgs - 1;
            put_special(&w, DI_TOK_ASSISTANT);
            put_special(&w, keep ? DI_TOK_THINK : DI_TOK_THINK_END);
            if (keep) {
                put_plain_str(&w, m->reasoning ? m->reasoning : "");
                /* a continued turn with no answer text yet is still inside its reasoning */
                if (!(is_prefix && !m->content[0] && !m->n_calls)) put_special(&w, DI_TOK_THINK_END);
            }
            put_content(&w, m->content, m->n_images);
            if (m->n_calls) put_tool_calls(&w, m), caller = m;
            if (!is_prefix) put_special(&w, DI_TOK_EOS);
            break;
        }
        case DI_ROLE_TOOL: break; /* merged into user turns above */
        }
    }
    if (!open_prefix) {
        put_special(&w, DI_TOK_ASSISTANT);
        put_special(&w, c->thinking ? DI_TOK_THINK : DI_TOK_THINK_END);
        if (c->tool_choice == DI_TOOL_CHOICE_REQUIRED && tools_active(c))
            put_template(&w, "\n\n<" DI_TOK_DSML " calls>\n");
    }
    flush_plain(&w);
    di_buf_free(&w.plain);
    free(turns);
    if (w.oom) {
        di_prompt_free(out);
        return di_error_set(err, DI_ERR_NOMEM, "chat render: out of memory");
    }
    for (size_t i = 0; i < out->n_segs; i++)
        if (out->segs[i].special && !strcmp(out->segs[i].text, DI_TOK_IMAGE)) out->n_images++;
    return DI_OK;
}

void di_prompt_free(di_prompt *p) {
    for (size_t i = 0; i < p->n_segs; i++) free(p->segs[i].text);
    free(p->segs);
    memset(p, 0, sizeof *p);
}

char *di_prompt_text(const di_prompt *p, size_t *len) {
    di_buf b = {0};
    for (size_t i = 0; i < p->n_segs; i++) di_buf_append(&b, p->segs[i].text, p->segs[i].len);
    if (len) *len = b.len;
    return di_buf_take(&b);
}
