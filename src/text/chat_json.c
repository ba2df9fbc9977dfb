#include "text/chat_json.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool buf_reserve(di_buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void di_buf_append(di_buf *b, const char *s, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void di_buf_puts(di_buf *b, const char *s) { di_buf_append(b, s, strlen(s)); }

void di_buf_printf(di_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !buf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *di_buf_take(di_buf *b) {
    if (b->oom) {
        di_buf_free(b);
        return NULL;
    }
    if (!b->data && buf_reserve(b, 0)) b->data[0] = '\0';
    char *p = b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void di_buf_free(di_buf *b) {
    free(b->data);
    *b = (di_buf){0};
}

void di_json_write_string(di_buf *b, const char *s, size_t n) {
    di_buf_append(b, "\"", 1);
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            di_buf_append(b, s + run, i - run);
            di_buf_puts(b, esc);
            run = i + 1;
        }
    }
    di_buf_append(b, s + run, n - run);
    di_buf_append(b, "\"", 1);
}

/* Shortest round-trip spelling, as Python's float repr: digits via %.{p}g for the smallest p that
 * reads back exactly, then Python's layout (exponent when exp < -4 or >= 16, "1e+20" form, and a
 * ".0" on integral values). */
static void write_real(di_buf *b, double v) {
    char s[40];
    if (v != v || v == 1.0 / 0.0 || v == -1.0 / 0.0) { /* not JSON; Python writes these names */
        di_buf_puts(b, v != v ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
        return;
    }
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(s, sizeof s, "%.*e", p - 1, v);
        if (strtod(s, NULL) == v) break;
    }
    /* s = "[-]d.ddde[+-]XX" with p significant digits */
    char digits[24];
    int nd = 0, neg = s[0] == '-';
    const char *q = s + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[48];
    int o = 0;
    if (neg) out[o++] = '-';
    if (exp < -4 || exp >= 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
        for (int i = 0; i < nd; i++) out[o++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > exp + 1)
            for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
        else
            out[o++] = '0';
    }
    di_buf_append(b, out, (size_t)o);
}

void di_json_write(di_buf *b, const json_t *v, di_json_style style) {
    const char *comma = style == DI_JSON_PYTHON ? ", " : ",";
    const char *colon = style == DI_JSON_PYTHON ? ": " : ":";
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        di_buf_append(b, "{", 1);
        const char *key;
        json_t *val;
        bool first = true;
        json_object_foreach((json_t *)v, key, val) {
            if (!first) di_buf_puts(b, comma);
            first = false;
            di_json_write_string(b, key, strlen(key));
            di_buf_puts(b, colon);
            di_json_write(b, val, style);
        }
        di_buf_append(b, "}", 1);
        break;
    }
    case JSON_ARRAY: {
        di_buf_append(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) di_buf_puts(b, comma);
            di_json_write(b, json_array_get(v, i), style);
        }
        di_buf_append(b, "]", 1);
        break;
    }
    case JSON_STRING: di_json_write_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: di_buf_printf(b, "%" PRId64, (int64_t)json_integer_value(v)); break;
    case JSON_REAL: write_real(b, json_real_value(v)); break;
    case JSON_TRUE: di_buf_puts(b, "true"); break;
    case JSON_FALSE: di_buf_puts(b, "false"); break;
    case JSON_NULL: di_buf_puts(b, "null"); break;
    }
}

char *di_json_dump(const json_t *v, di_json_style style) {
    di_buf b = {0};
    di_json_write(&b, v, style);
    return di_buf_take(&b);
}
