/* UTF-8 validation and lossy conversion for the tokenizer, plus its small growable buffers.
 *
 * Replacement policy = Unicode "maximal subpart" (Unicode 15 §3.9, Table 3-8), which is what Rust's
 * String::from_utf8_lossy (and so HF's decode) implements: a lead byte followed by k valid continuation
 * bytes that cannot complete becomes ONE U+FFFD; a byte that cannot start any sequence becomes one U+FFFD. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

bool di_strbuf_put(di_strbuf *b, const void *src, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool di_idvec_push(di_idvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return false;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return true;
}

/* For lead byte c: sequence length (0 = never valid) and the allowed range of the SECOND byte; later
 * continuation bytes are always 80..BF. */
static int utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c == 0xE0) *lo = 0xA0;
    else if (c == 0xED) *hi = 0x9F; /* no surrogates */
    if (c < 0xF0) return 3;
    if (c == 0xF0) *lo = 0x90;
    else if (c == 0xF4) *hi = 0x8F; /* <= U+10FFFF */
    if (c < 0xF5) return 4;
    return 0;
}

/* Length of the valid prefix of the sequence starting at s[0] (up to n bytes): returns len when complete,
 * else the number of bytes forming a valid but unfinished or broken prefix (>= 1 if the lead is valid,
 * 0 if s[0] cannot start a sequence). *complete tells which. */
static size_t utf8_scan(const uint8_t *s, size_t n, bool *complete) {
    uint8_t lo, hi;
    int len = utf8_lead(s[0], &lo, &hi);
    *complete = false;
    if (len == 0) return 0;
    size_t k = 1;
    for (; k < (size_t)len; k++) {
        if (k >= n) return k;
        uint8_t c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return k;
    }
    *complete = true;
    return k;
}

size_t di_utf8_first_invalid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        bool ok;
        size_t k = utf8_scan(s + i, n - i, &ok);
        if (!ok) return i;
        i += k;
    }
    return n;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

size_t di_utf8_lossy(const uint8_t *s, size_t n, bool final, di_strbuf *out) {
    size_t i = 0, run = 0; /* run: start of pending valid bytes not yet copied */
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        bool ok;
        size_t k = utf8_scan(s + i, n - i, &ok);
        if (ok) {
            i += k;
            continue;
        }
        if (!di_strbuf_put(out, s + run, i - run)) return (size_t)-1;
        if (!final && k > 0 && i + k == n) return i; /* an unfinished character at the end: hold it back */
        if (!di_strbuf_put(out, REPLACEMENT, 3)) return (size_t)-1;
        i += k ? k : 1;
        run = i;
    }
    if (!di_strbuf_put(out, s + run, n - run)) return (size_t)-1;
    return n;
}

char *di_utf8_lossy_dup(const char *s, size_t n, size_t *out_len) {
    di_strbuf b = {0};
    if (!di_strbuf_put(&b, "", 0) || di_utf8_lossy((const uint8_t *)s, n, true, &b) == (size_t)-1) {
        free(b.p);
        return NULL;
    }
    if (out_len) *out_len = b.n;
    return b.p;
}
