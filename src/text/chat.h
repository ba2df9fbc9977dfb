/* Conversation model and the DeepSeek-V4.1 prompt encoding (spec model.md §6.3).
 *
 * A di_conversation is what every request protocol converts into (src/text/api*.c). The renderer
 * turns it into a di_prompt: a list of segments, each either one special token written by the
 * template (BOS, <｜User｜>, </think>, ｜DSML｜ ...) or a run of plain text. Plain runs are
 * tokenized WITHOUT added-token recognition, so a user typing "<｜User｜>" gets ordinary BPE
 * tokens, as the official API counts them (empty user turn, thinking off = 4 ids; "<｜User｜>" as
 * the content = 9). Adjacent plain text is always merged into one run: BPE is not
 * concatenative, and the reference encodes everything between two special tokens in one call.
 *
 * Reference: the deepseek-recipe V4.1 encoder (tests/data/chat/cases.json was produced by it). */
#ifndef DI_TEXT_CHAT_H
#define DI_TEXT_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"
#include "text/tokenizer.h"

typedef enum di_role {
    DI_ROLE_SYSTEM,
    DI_ROLE_USER,
    DI_ROLE_ASSISTANT,
    DI_ROLE_TOOL, /* a tool result; rendered inside the following/preceding user turn */
    DI_ROLE_LATEST_REMINDER
} di_role;

const char *di_role_name(di_role r);

typedef struct di_tool_call {
    char *id;        /* client-visible call id ("call_..."); may be "" */
    char *name;      /* function name */
    char *arguments; /* the arguments as given: JSON text expected to hold an object */
} di_tool_call;

typedef struct di_tool_def {
    char *name;
    char *description; /* NULL when absent (rendered as "") */
    char *parameters;  /* JSON text of the parameters schema, key order kept; NULL = absent ({}) */
    int strict;        /* -1 absent, 0 false, 1 true (passed through to the grammar engine) */
} di_tool_def;

typedef struct di_message {
    di_role role;
    char *content;            /* UTF-8; images appear as the image placeholder literal */
    char *reasoning;          /* assistant reasoning_content; NULL = absent */
    di_tool_call *calls;      /* [n_calls], assistant only */
    size_t n_calls;
    char *tool_call_id;       /* tool results only */
    size_t n_images;          /* image placeholders in content (their sources are not kept here) */
    bool prefix;              /* assistant turn continued by the model (no EOS, no new header) */
} di_message;

typedef enum di_tool_choice { DI_TOOL_CHOICE_AUTO, DI_TOOL_CHOICE_NONE, DI_TOOL_CHOICE_REQUIRED } di_tool_choice;

typedef enum di_response_format {
    DI_FORMAT_TEXT,
    DI_FORMAT_JSON_OBJECT,
    DI_FORMAT_JSON_SCHEMA, /* schema in di_conversation.response_schema */
    DI_FORMAT_REGEX,       /* extension: pattern in response_regex, enforced by the grammar engine */
    DI_FORMAT_EBNF         /* extension: grammar in response_ebnf, enforced by the grammar engine */
} di_response_format;

/* Named reasoning-effort levels as the reference V4.1 encoder maps them onto the 1-100 scale. */
enum {
    DI_EFFORT_DEFAULT = 0, /* "high" */
    DI_EFFORT_LOW = 50,
    DI_EFFORT_HIGH = 75,
    DI_EFFORT_XHIGH = 75,
    DI_EFFORT_MAX = 100
};

typedef struct di_conversation {
    di_message *msgs; /* [n_msgs] */
    size_t n_msgs;
    size_t cap_msgs;  /* allocated slots */
    bool thinking;    /* thinking mode (the prompt ends with <think>) */
    int effort;       /* 1..100, or DI_EFFORT_DEFAULT; rendered only in thinking mode */
    di_tool_def *tools; /* [n_tools] */
    size_t n_tools;
    di_tool_choice tool_choice;
    di_response_format format;
    char *response_schema; /* JSON text (DI_FORMAT_JSON_SCHEMA) */
    char *response_regex;  /* DI_FORMAT_REGEX */
    char *response_ebnf;   /* DI_FORMAT_EBNF */
} di_conversation;

/* Resolve a named level ("low", "high", "xhigh", "max") to 1..100; -1 if unknown. */
int di_effort_from_name(const char *name);
/* The number the prompt shows for `effort` (DI_EFFORT_DEFAULT resolves to "high"). */
int di_effort_value(int effort);

/* Building and freeing. All strings are owned (malloc'd) by the conversation. Append functions
 * return DI_OK or DI_ERR_NOMEM. */
void di_conv_init(di_conversation *c);
void di_conv_free(di_conversation *c);
di_message *di_conv_add(di_conversation *c, di_role role, const char *content);
int di_msg_add_call(di_message *m, const char *id, const char *name, const char *arguments);
di_tool_def *di_conv_add_tool(di_conversation *c, const char *name, const char *description,
                              const char *parameters);
char *di_strdup(const char *s); /* NULL-safe */

/* Sorted view of one assistant turn's call ids, to match tool results to calls in O(log n). */
typedef struct di_call_entry {
    const char *id; /* borrowed from the message */
    size_t pos;     /* index in the turn's call list */
} di_call_entry;

typedef struct di_call_index {
    di_call_entry *e; /* [n] sorted by (id, pos) */
    size_t n;
} di_call_index;

int di_call_index_build(const di_message *caller, di_call_index *ix); /* DI_OK or DI_ERR_NOMEM */
/* Position of the call with this id (the last one when an id repeats, as the reference's
 * id→position map keeps), or -1. */
long di_call_index_find(const di_call_index *ix, const char *id);
void di_call_index_free(di_call_index *ix);

/* ---- rendering ---- */

typedef struct di_segment {
    char *text;   /* UTF-8 bytes, NUL-terminated */
    size_t len;
    bool special; /* one special token written by the template (tokenize with added tokens) */
} di_segment;

typedef struct di_prompt {
    di_segment *segs; /* [n_segs]; plain runs are maximal (never two plain segments in a row) */
    size_t n_segs;
    size_t cap_segs;  /* allocated slots */
    size_t n_images;  /* image placeholders in the prompt */
} di_prompt;

/* Render `c` in the V4.1 format. Fails (DI_ERR_INVALID, message names the message index) on a
 * structurally impossible conversation, e.g. a tool result with no call to answer. */
int di_chat_render(const di_conversation *c, di_prompt *out, di_error *err);
void di_prompt_free(di_prompt *p);
/* The whole prompt as one string (caller frees). */
char *di_prompt_text(const di_prompt *p, size_t *len);

/* Where the official V4.1 tokenizer lives in a checkout (set up by scripts/install-deps.sh). */
#define DI_DEFAULT_TOKENIZER DI_TOKENIZER_DEFAULT_PATH

struct di_tokenizer;
/* Token ids of the prompt: special segments are looked up as added tokens, plain runs encoded
 * without added-token recognition. *ids is malloc'd ([n_ids] int32). */
int di_prompt_encode(const di_prompt *p, const struct di_tokenizer *tok, int32_t **ids, size_t *n_ids,
                     di_error *err);

/* Special-token spellings the template writes (U+FF5C fullwidth bar, U+2581 lower block). */
#define DI_TOK_BOS "<｜begin▁of▁sentence｜>"
#define DI_TOK_EOS "<｜end▁of▁sentence｜>"
#define DI_TOK_SYSTEM "<｜System｜>"
#define DI_TOK_USER "<｜User｜>"
#define DI_TOK_ASSISTANT "<｜Assistant｜>"
#define DI_TOK_THINK "<think>"
#define DI_TOK_THINK_END "</think>"
#define DI_TOK_REMINDER "<｜latest_reminder｜>"
#define DI_TOK_DSML "｜DSML｜"
#define DI_TOK_IMAGE "<｜image｜>"

#endif
