/* Engram compressed token map: see engram_map.h for the algorithm and the reference it reproduces.
 * Unicode work is done with utf8proc; the reference uses HF `tokenizers` normalizers (Rust
 * unicode-normalization), checked against it in tests/test_engram_map.c over the whole table. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/safetensors.h"
#include "text/engram_map.h"
#include "util/error.h"

#define SENTINEL 0xE000 /* private-use stand-in that lets a token that is exactly " " survive Strip */

/* Unicode White_Space (PropList.txt): what Rust's char::is_whitespace, and so HF's Strip, removes. */
static bool is_white_space(utf8proc_int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool is_mark(utf8proc_int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

int di_engram_normalize(const char *text, size_t len, char **out, size_t *out_len, di_error *err) {
    *out = NULL;
    *out_len = 0;
    /* NFKC, then NFD of that into codepoints (NFD(NFKC(x)) != NFKD(x) in general, so keep both steps) */
    utf8proc_uint8_t *nfkc = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfkc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (n < 0)
        return di_error_set(err, DI_ERR_INVALID, "engram normalize: NFKC failed: %s", utf8proc_errmsg(n));
    utf8proc_ssize_t cap = utf8proc_decompose(nfkc, n, NULL, 0, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    utf8proc_int32_t *cp = cap >= 0 ? malloc(((size_t)cap + 1) * sizeof *cp) : NULL;
    if (!cp) {
        free(nfkc);
        return di_error_set(err, cap < 0 ? DI_ERR_INVALID : DI_ERR_NOMEM, "engram normalize: NFD failed");
    }
    utf8proc_ssize_t m = utf8proc_decompose(nfkc, n, cp, cap, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    free(nfkc);
    /* strip accents, lowercase, collapse [ \t\r\n]+ to one space, in one pass */
    size_t k = 0;
    for (utf8proc_ssize_t i = 0; i < m; i++) {
        utf8proc_int32_t c = cp[i];
        if (is_mark(c)) continue;
        /* simple lowercase mapping: the one full mapping that differs (U+0130) cannot occur here, NFD
         * already split it into 'I' + U+0307 and the mark was dropped */
        c = utf8proc_tolower(c);
        bool ws = c == ' ' || c == '\t' || c == '\r' || c == '\n';
        if (ws && k > 0 && cp[k - 1] == ' ') continue;
        cp[k++] = ws ? ' ' : c;
    }
    /* "^ $" -> sentinel: after the collapse no '\n' is left, so the anchors only match the whole string */
    if (k == 1 && cp[0] == ' ') cp[0] = SENTINEL;
    size_t b = 0, e = k;
    while (b < e && is_white_space(cp[b])) b++;
    while (e > b && is_white_space(cp[e - 1])) e--;
    char *s = malloc(4 * (e - b) + 1);
    if (!s) {
        free(cp);
        return di_error_set(err, DI_ERR_NOMEM, "engram normalize: out of memory");
    }
    size_t o = 0;
    for (size_t i = b; i < e; i++)
        o += (size_t)utf8proc_encode_char(cp[i] == SENTINEL ? ' ' : cp[i], (utf8proc_uint8_t *)s + o);
    s[o] = 0;
    free(cp);
    *out = s;
    *out_len = o;
    return DI_OK;
}

/* Key -> class map: open addressing over malloc'd key copies. */
typedef struct key_map {
    char **key;
    size_t *len;
    int32_t *cls;
    uint32_t cap;
} key_map;

static uint32_t key_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 32);
}

/* Class of key (taking ownership of it), a new class if unseen. Returns -1 on allocation failure. */
static int32_t key_class(key_map *m, char *key, size_t n, int32_t *n_classes) {
    uint32_t mask = m->cap - 1;
    for (uint32_t i = key_hash(key, n) & mask;; i = (i + 1) & mask) {
        if (!m->key[i]) {
            m->key[i] = key;
            m->len[i] = n;
            return m->cls[i] = (*n_classes)++;
        }
        if (m->len[i] == n && !memcmp(m->key[i], key, n)) {
            free(key);
            return m->cls[i];
        }
    }
}

int di_engram_map_build(const di_tokenizer *tok, int32_t **token_map, int32_t *n_classes, di_error *err) {
    *token_map = NULL;
    *n_classes = 0;
    int32_t v = di_tok_vocab_size(tok);
    key_map m = {0};
    m.cap = 1;
    while (m.cap < 2u * (uint32_t)v) m.cap *= 2;
    m.key = calloc(m.cap, sizeof *m.key);
    m.len = calloc(m.cap, sizeof *m.len);
    m.cls = calloc(m.cap, sizeof *m.cls);
    int32_t *map = malloc((size_t)v * sizeof *map);
    int st = DI_OK;
    if (!m.key || !m.len || !m.cls || !map) {
        st = di_error_set(err, DI_ERR_NOMEM, "engram map: out of memory for %d tokens", v);
        goto done;
    }
    for (int32_t id = 0; id < v; id++) {
        char *text = NULL, *key = NULL;
        size_t tlen = 0, klen = 0;
        /* a hole in the id space decodes to "" in HF; keep the same key */
        if (di_tok_token_bytes(tok, id, NULL) && (st = di_tok_decode(tok, &id, 1, &text, &tlen, err))) goto done;
        if (!text && !(text = calloc(1, 1))) goto nomem;
        if (memmem(text, tlen, "\xEF\xBF\xBD", 3)) {
            /* a partial UTF-8 byte token: keyed by its byte-level spelling (HF id_to_token) */
            size_t sl;
            const char *sp = di_tok_token_string(tok, id, &sl);
            free(text);
            if (!(key = malloc(sl + 1))) goto nomem;
            memcpy(key, sp, sl);
            key[sl] = 0;
            klen = sl;
        } else {
            if ((st = di_engram_normalize(text, tlen, &key, &klen, err))) {
                free(text);
                goto done;
            }
            if (klen == 0) {
                free(key);
                key = text, klen = tlen;
            } else {
                free(text);
            }
        }
        int32_t c = key_class(&m, key, klen, n_classes);
        map[id] = c;
    }
    *token_map = map;
    map = NULL;
    goto done;
nomem:
    st = di_error_set(err, DI_ERR_NOMEM, "engram map: out of memory");
done:
    for (uint32_t i = 0; m.key && i < m.cap; i++) free(m.key[i]);
    free(m.key);
    free(m.len);
    free(m.cls);
    free(map);
    if (st) *n_classes = 0;
    return st;
}

int di_engram_map_write(const char *path, const int32_t *token_map, int32_t vocab, const di_engram_hash_params *p,
                        di_error *err) {
    if (vocab <= 0 || p->n_layers <= 0 || p->max_ngram < 2 || p->n_heads <= 0)
        return di_error_set(err, DI_ERR_INVALID,
                            "%s: engram map needs vocab, n_layers, n_heads > 0 and max_ngram >= 2 (got %d, %d, %d, %d)",
                            path, vocab, p->n_layers, p->n_heads, p->max_ngram);
    int64_t L = p->n_layers, G = p->max_ngram - 1, H = p->n_heads;
    /* tensors in name order, as the reference's file lists them */
    di_tensor_spec specs[5] = {
        {"multipliers", DI_I64, 2, {L, p->max_ngram}},
        {"offsets", DI_I64, 2, {L, G * H}},
        {"pad_compressed_id", DI_I64, 1, {1}},
        {"primes", DI_I64, 3, {L, G, H}},
        {"token_map", DI_I32, 1, {vocab}},
    };
    const void *data[5] = {p->multipliers, p->offsets, &p->pad_compressed_id, p->primes, token_map};
    return di_st_write_file(path, specs, data, 5, err);
}
