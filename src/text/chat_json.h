/* Growable byte buffer and the two JSON spellings the V4.1 text layer needs.
 *
 * The prompt shows tool schemas, response-format schemas and non-string tool arguments the way
 * Python's json.dumps(ensure_ascii=False) writes them (", " and ": " separators, key order kept,
 * non-ASCII raw); the reference encoder reproduces that spelling, so token ids depend on it.
 * Constraint schemas handed to the grammar engine use the compact spelling (no spaces).
 * Reals print as the shortest decimal that reads back to the same double (Python repr). */
#ifndef DI_TEXT_CHAT_JSON_H
#define DI_TEXT_CHAT_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct di_buf {
    char *data; /* [cap] bytes, NUL-terminated at len; NULL until the first append */
    size_t len;
    size_t cap;
    bool oom; /* an allocation failed; appends became no-ops */
} di_buf;

void di_buf_append(di_buf *b, const char *s, size_t n);
void di_buf_puts(di_buf *b, const char *s);
void di_buf_printf(di_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Detach the bytes (caller frees); returns NULL after an allocation failure. */
char *di_buf_take(di_buf *b);
void di_buf_free(di_buf *b);

typedef enum di_json_style {
    DI_JSON_COMPACT, /* {"a":1,"b":[1,2]} */
    DI_JSON_PYTHON   /* {"a": 1, "b": [1, 2]} */
} di_json_style;

/* Append `v` in the given spelling. Strings keep non-ASCII bytes raw; control characters, '"' and
 * '\\' are escaped as JSON requires. */
void di_json_write(di_buf *b, const json_t *v, di_json_style style);
void di_json_write_string(di_buf *b, const char *s, size_t n);
/* Convenience: malloc'd spelling of `v` (NULL on allocation failure). */
char *di_json_dump(const json_t *v, di_json_style style);

#endif
