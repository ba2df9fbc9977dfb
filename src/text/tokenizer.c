/* Tokenizer: tokenizer.json loading, encode (added tokens -> pre-tokenizer -> BPE), decode, streaming
 * decode. See tokenizer.h for the contract and the HF behaviour reproduced. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/tokenizer_internal.h"
#include "util/error.h"

/* ------------------------------------------------------------------------------------------------ */
/* string -> id maps                                                                                  */

static inline uint32_t str_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a multiplicative finish for the high bits */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 32);
}

static bool strmap_init(di_strmap *m, size_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return false;
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->cap = cap;
    return true;
}

/* The map stores ids; key(id) comes from one of the tokenizer's two blobs. */
typedef struct strkeys {
    const char *blob;
    const uint32_t *off, *len;
} strkeys;

static int32_t strmap_get(const di_strmap *m, strkeys k, const char *s, size_t n) {
    uint32_t mask = m->cap - 1;
    for (uint32_t i = str_hash(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (k.len[id] == n && !memcmp(k.blob + k.off[id], s, n)) return id;
    }
}

/* Inserts id under its own key unless the key is present already (first id wins). */
static void strmap_put(di_strmap *m, strkeys k, int32_t id) {
    const char *s = k.blob + k.off[id];
    size_t n = k.len[id];
    uint32_t mask = m->cap - 1;
    for (uint32_t i = str_hash(s, n) & mask;; i = (i + 1) & mask) {
        int32_t o = m->slot[i];
        if (o < 0) {
            m->slot[i] = id;
            return;
        }
        if (k.len[o] == n && !memcmp(k.blob + k.off[o], s, n)) return;
    }
}

static strkeys spell_keys(const di_tokenizer *t) { return (strkeys){t->spell, t->spell_off, t->spell_len}; }
static strkeys byte_keys(const di_tokenizer *t) { return (strkeys){t->bytes, t->tok_off, t->tok_len}; }

/* ------------------------------------------------------------------------------------------------ */
/* loading                                                                                            */

void di_tok_free(di_tokenizer *t) {
    if (!t) return;
    free(t->bytes);
    free(t->tok_off);
    free(t->tok_len);
    free(t->spell);
    free(t->spell_off);
    free(t->spell_len);
    free(t->flags);
    free(t->by_spell.slot);
    free(t->by_bytes.slot);
    free(t->merges);
    free(t->trie);
    di_bpe_cache_free(t);
    di_pretok_free(&t->pretok);
    free(t);
}

/* HF ByteLevel decoding of one token spelling: if every character is in the GPT-2 map the token is those
 * bytes, otherwise (added tokens such as "<｜User｜>") it is its own UTF-8 text unchanged. Writes at most
 * n bytes to out, returns the length. */
static size_t spelling_to_bytes(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = (uint8_t)s[i];
        uint32_t cp;
        size_t k;
        if (c < 0x80) cp = c, k = 1;
        else if (c >= 0xC0 && c < 0xE0 && i + 1 < n) cp = (uint32_t)(c & 0x1F) << 6 | (s[i + 1] & 0x3F), k = 2;
        else goto raw; /* the map's codepoints are all < U+0800 */
        int b = di_bytelevel_byte(cp);
        if (b < 0) goto raw;
        out[o++] = (char)b;
        i += k;
    }
    return o;
raw:
    memcpy(out, s, n);
    return n;
}

static int trie_insert(di_tokenizer *t, const char *s, size_t n, int32_t id, size_t *cap) {
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != b) c = t->trie[c].sibling;
        if (c < 0) {
            if ((size_t)t->n_trie == *cap) {
                size_t nc = *cap * 2;
                di_trie_node *p = realloc(t->trie, nc * sizeof *p);
                if (!p) return DI_ERR_NOMEM;
                t->trie = p;
                *cap = nc;
            }
            c = t->n_trie++;
            t->trie[c] = (di_trie_node){.child = -1, .sibling = t->trie[node].child, .id = -1, .byte = b};
            t->trie[node].child = c;
        }
        node = c;
    }
    if (t->trie[node].id < 0) t->trie[node].id = id; /* a repeated literal keeps its first id */
    return DI_OK;
}

/* Longest added token starting at s[0..n) whose DI_TOKF_NORMALIZED flag equals `normalized` (-1: any):
 * its id and *len, or -1. */
static int32_t trie_longest(const di_tokenizer *t, const char *s, size_t n, int normalized, size_t *len) {
    int32_t node = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != (uint8_t)s[i]) c = t->trie[c].sibling;
        if (c < 0) break;
        node = c;
        int32_t id = t->trie[node].id;
        if (id >= 0 && (normalized < 0 || !(t->flags[id] & DI_TOKF_NORMALIZED) == !normalized))
            best = id, *len = i + 1;
    }
    return best;
}

static const char *jstr(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }
static bool jtrue(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

/* Rejects tokenizer.json features this implementation does not reproduce, naming the field. */
static int check_supported(json_t *root, const char *path, di_error *err) {
    json_t *model = json_object_get(root, "model");
    const char *type = jstr(model, "type");
    if (!json_is_object(model) || !type || strcmp(type, "BPE"))
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: model.type is %s, expected \"BPE\"", path,
                            type ? type : "missing");
    if (jtrue(model, "byte_fallback") || jtrue(model, "ignore_merges") || jstr(model, "continuing_subword_prefix") ||
        jstr(model, "end_of_word_suffix") || (json_is_number(json_object_get(model, "dropout"))))
        return di_error_set(err, DI_ERR_UNSUPPORTED,
                            "%s: model uses byte_fallback/ignore_merges/subword affixes/dropout, not supported", path);
    const char *dec = jstr(json_object_get(root, "decoder"), "type");
    if (!dec || strcmp(dec, "ByteLevel"))
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: decoder is %s, expected \"ByteLevel\"", path,
                            dec ? dec : "missing");
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        const char *nt = jstr(norm, "type");
        json_t *list = json_object_get(norm, "normalizers");
        if (!nt || strcmp(nt, "Sequence") || json_array_size(list) != 0)
            return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: a normalizer (%s) is not supported", path,
                                nt ? nt : "?");
    }
    return DI_OK;
}

/* pre_tokenizer = Sequence[Split(Regex, Isolated)..., ByteLevel(use_regex=false, add_prefix_space=false)] */
static int load_pretok(di_tokenizer *t, json_t *root, di_error *err) {
    json_t *pt = json_object_get(root, "pre_tokenizer");
    const char *type = jstr(pt, "type");
    json_t *list = json_object_get(pt, "pretokenizers");
    if (!type || strcmp(type, "Sequence") || !json_is_array(list) || json_array_size(list) == 0)
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: pre_tokenizer is %s, expected a Sequence", t->path,
                            type ? type : "missing");
    const char *pats[DI_PRETOK_MAX_STAGES];
    int n = 0;
    size_t cnt = json_array_size(list);
    const char *last = jstr(json_array_get(list, cnt - 1), "type");
    if (!last || strcmp(last, "ByteLevel"))
        return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: pre_tokenizer does not end with ByteLevel (found %s)",
                            t->path, last ? last : "?");
    for (size_t i = 0; i < cnt; i++) {
        json_t *e = json_array_get(list, i);
        const char *et = jstr(e, "type");
        if (i + 1 == cnt) { /* the ByteLevel step: only the byte -> unicode spelling, no regex of its own */
            if (jtrue(e, "use_regex") || jtrue(e, "add_prefix_space"))
                return di_error_set(err, DI_ERR_UNSUPPORTED,
                                    "%s: ByteLevel pre-tokenizer with use_regex/add_prefix_space is not supported",
                                    t->path);
            break;
        }
        const char *re = jstr(json_object_get(e, "pattern"), "Regex");
        const char *beh = jstr(e, "behavior");
        if (!et || strcmp(et, "Split") || !re || !beh || strcmp(beh, "Isolated") || jtrue(e, "invert"))
            return di_error_set(err, DI_ERR_UNSUPPORTED,
                                "%s: pre_tokenizer[%zu] is %s; only Split(Regex, Isolated) then ByteLevel are supported",
                                t->path, i, et ? et : "?");
        if (n == DI_PRETOK_MAX_STAGES)
            return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: more than %d Split stages", t->path, n);
        pats[n++] = re;
    }
    return di_pretok_compile(&t->pretok, pats, n, t->path, err);
}

/* Fills ids, spellings, bytes and flags from model.vocab and added_tokens. */
static int load_tokens(di_tokenizer *t, json_t *vocab, json_t *added, di_error *err) {
    int32_t max_id = -1;
    size_t spell_total = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= DI_TOK_MAX_VOCAB)
            return di_error_set(err, DI_ERR_FORMAT, "%s: vocab entry \"%.64s\" has id %s, expected an integer >= 0",
                                t->path, key, json_is_integer(val) ? "out of range" : "that is not an integer");
        if (id > max_id) max_id = (int32_t)id;
        spell_total += strlen(key);
    }
    size_t n_added = json_array_size(added);
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        json_t *jid = json_object_get(a, "id");
        const char *content = jstr(a, "content");
        if (!json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= DI_TOK_MAX_VOCAB ||
            !content || !*content)
            return di_error_set(err, DI_ERR_FORMAT, "%s: added_tokens[%zu] needs an integer id >= 0 and a content",
                                t->path, i);
        if (jtrue(a, "lstrip") || jtrue(a, "rstrip") || jtrue(a, "single_word"))
            return di_error_set(err, DI_ERR_UNSUPPORTED, "%s: added token \"%s\" uses lstrip/rstrip/single_word",
                                t->path, content);
        if (json_integer_value(jid) > max_id) max_id = (int32_t)json_integer_value(jid);
        spell_total += strlen(content);
    }
    if (max_id < 0) return di_error_set(err, DI_ERR_FORMAT, "%s: the vocabulary is empty", t->path);
    if (max_id >= DI_TOK_MAX_VOCAB)
        return di_error_set(err, DI_ERR_FORMAT, "%s: token id %d is beyond the %d ids a vocabulary may have", t->path,
                            max_id, DI_TOK_MAX_VOCAB);
    if (spell_total >= UINT32_MAX / 2) return di_error_set(err, DI_ERR_FORMAT, "%s: vocabulary too large", t->path);

    int32_t n = t->n_vocab = max_id + 1;
    t->tok_off = calloc((size_t)n, sizeof *t->tok_off);
    t->tok_len = malloc((size_t)n * sizeof *t->tok_len);
    t->spell_off = calloc((size_t)n, sizeof *t->spell_off);
    t->spell_len = malloc((size_t)n * sizeof *t->spell_len);
    t->flags = calloc((size_t)n, 1);
    t->spell = malloc(spell_total + 1);
    t->bytes = malloc(spell_total + 1); /* a token's bytes are never longer than its spelling */
    if (!t->tok_off || !t->tok_len || !t->spell_off || !t->spell_len || !t->flags || !t->spell || !t->bytes)
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for %d tokens", t->path, n);
    for (int32_t i = 0; i < n; i++) t->tok_len[i] = t->spell_len[i] = DI_TOK_NO_TOKEN;

    size_t so = 0;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (t->spell_len[id] != DI_TOK_NO_TOKEN)
            return di_error_set(err, DI_ERR_FORMAT, "%s: vocab id %d appears twice", t->path, id);
        size_t kl = strlen(key);
        memcpy(t->spell + so, key, kl);
        t->spell_off[id] = (uint32_t)so;
        t->spell_len[id] = (uint32_t)kl;
        so += kl;
    }
    /* HF's id_to_token prefers the added vocabulary; an added id that is also a vocab id (0..2 here) keeps
     * the vocab spelling as its key for merges, and decodes to its content (identical in DeepSeek's file). */
    const char **content_of = calloc((size_t)n, sizeof *content_of);
    if (!content_of) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", t->path);
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        const char *content = jstr(a, "content");
        content_of[id] = content;
        t->flags[id] = DI_TOKF_ADDED | (jtrue(a, "special") ? DI_TOKF_SPECIAL : 0) |
                       (jtrue(a, "normalized") ? DI_TOKF_NORMALIZED : 0);
        if (t->spell_len[id] == DI_TOK_NO_TOKEN) {
            size_t cl = strlen(content);
            memcpy(t->spell + so, content, cl);
            t->spell_off[id] = (uint32_t)so;
            t->spell_len[id] = (uint32_t)cl;
            so += cl;
        }
    }
    size_t bo = 0;
    for (int32_t id = 0; id < n; id++) {
        const char *s = content_of[id] ? content_of[id] : t->spell + t->spell_off[id];
        size_t sl = content_of[id] ? strlen(content_of[id]) : t->spell_len[id];
        if (t->spell_len[id] == DI_TOK_NO_TOKEN) continue;
        t->tok_off[id] = (uint32_t)bo;
        t->tok_len[id] = (uint32_t)spelling_to_bytes(s, sl, t->bytes + bo);
        bo += t->tok_len[id];
    }
    free(content_of);
    return DI_OK;
}

static int load_merges(di_tokenizer *t, json_t *merges, di_error *err) {
    size_t n = json_array_size(merges);
    t->merge_cap = 16;
    while (t->merge_cap < 2 * n) t->merge_cap *= 2;
    t->merges = malloc(t->merge_cap * sizeof *t->merges);
    if (!t->merges) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for %zu merges", t->path, n);
    for (uint32_t i = 0; i < t->merge_cap; i++) t->merges[i].key = UINT64_MAX;
    char buf[1024];
    strkeys sk = spell_keys(t);
    for (size_t r = 0; r < n; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) { /* "left right": spellings never contain a space (it is spelled 'Ġ') */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return di_error_set(err, DI_ERR_FORMAT, "%s: merges[%zu] \"%.64s\" is not two space-separated tokens",
                                    t->path, r, a);
            la = (size_t)(sp - a), b = sp + 1, lb = strlen(b);
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)), la = strlen(a);
            b = json_string_value(json_array_get(m, 1)), lb = strlen(b);
        } else {
            return di_error_set(err, DI_ERR_FORMAT, "%s: merges[%zu] is neither \"a b\" nor [a, b]", t->path, r);
        }
        if (la + lb > sizeof buf)
            return di_error_set(err, DI_ERR_FORMAT, "%s: merges[%zu] is longer than %zu bytes", t->path, r, sizeof buf);
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t ia = strmap_get(&t->by_spell, sk, a, la), ib = strmap_get(&t->by_spell, sk, b, lb);
        int32_t im = strmap_get(&t->by_spell, sk, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0)
            return di_error_set(err, DI_ERR_FORMAT, "%s: merges[%zu] \"%.*s %.*s\" names a token missing from vocab",
                                t->path, r, (int)(la > 64 ? 64 : la), a, (int)(lb > 64 ? 64 : lb), b);
        di_merges_put(t, ia, ib, (int32_t)r, im);
    }
    return DI_OK;
}

static int build_maps(di_tokenizer *t, json_t *vocab, di_error *err) {
    if (!strmap_init(&t->by_spell, json_object_size(vocab)) || !strmap_init(&t->by_bytes, (size_t)t->n_vocab))
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", t->path);
    strkeys sk = spell_keys(t), bk = byte_keys(t);
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) strmap_put(&t->by_spell, sk, (int32_t)json_integer_value(val));
    for (int32_t id = 0; id < t->n_vocab; id++) /* BPE tokens first, so they win over added literals */
        if (t->tok_len[id] != DI_TOK_NO_TOKEN && !(t->flags[id] & DI_TOKF_ADDED)) strmap_put(&t->by_bytes, bk, id);
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->flags[id] & DI_TOKF_ADDED) strmap_put(&t->by_bytes, bk, id);
    for (int b = 0; b < 256; b++) {
        char sp[2];
        uint32_t cp = di_bytelevel_cp((uint8_t)b);
        size_t n = cp < 0x80 ? (sp[0] = (char)cp, 1) : (sp[0] = (char)(0xC0 | cp >> 6), sp[1] = (char)(0x80 | (cp & 0x3F)), 2);
        t->byte_id[b] = strmap_get(&t->by_spell, sk, sp, n);
        if (t->byte_id[b] < 0)
            return di_error_set(err, DI_ERR_FORMAT, "%s: vocab has no token for byte 0x%02X (spelled U+%04X)", t->path,
                                b, (unsigned)cp);
    }
    return DI_OK;
}

static int build_trie(di_tokenizer *t, json_t *added, di_error *err) {
    size_t cap = 1024;
    t->trie = malloc(cap * sizeof *t->trie);
    if (!t->trie) return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", t->path);
    t->trie[0] = (di_trie_node){.child = -1, .sibling = -1, .id = -1};
    t->n_trie = 1;
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        const char *c = jstr(a, "content");
        if (trie_insert(t, c, strlen(c), (int32_t)json_integer_value(json_object_get(a, "id")), &cap))
            return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", t->path);
        t->trie_first[(uint8_t)c[0]] = true;
    }
    return DI_OK;
}

int di_tok_load(const char *path, di_tokenizer **out, di_error *err) {
    *out = NULL;
    struct stat sb;
    char file[sizeof ((di_tokenizer *)0)->path];
    if (snprintf(file, sizeof file, "%s", path) >= (int)sizeof file)
        return di_error_set(err, DI_ERR_INVALID, "tokenizer path too long: %.100s...", path);
    if (stat(path, &sb) != 0)
        return di_error_set(err, DI_ERR_IO, "%s: cannot open tokenizer: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        if (snprintf(file, sizeof file, "%s/tokenizer.json", path) >= (int)sizeof file)
            return di_error_set(err, DI_ERR_INVALID, "tokenizer path too long: %.100s...", path);
        if (stat(file, &sb) != 0)
            return di_error_set(err, DI_ERR_IO, "%s: cannot open tokenizer: %s", file, strerror(errno));
    }
    /* read the file in one go: json_load_file reads it a character at a time, 2x slower on 6 MB */
    FILE *f = fopen(file, "rb");
    if (!f) return di_error_set(err, DI_ERR_IO, "%s: cannot open tokenizer: %s", file, strerror(errno));
    size_t size = (size_t)sb.st_size;
    char *buf = malloc(size ? size : 1);
    size_t got = buf ? fread(buf, 1, size, f) : 0;
    fclose(f);
    if (!buf || got != size) {
        free(buf);
        return di_error_set(err, buf ? DI_ERR_IO : DI_ERR_NOMEM, "%s: cannot read %zu bytes", file, size);
    }
    json_error_t je;
    json_t *root = json_loadb(buf, size, 0, &je);
    free(buf);
    if (!root)
        return di_error_set(err, DI_ERR_FORMAT, "%s: not valid JSON (line %d: %s)", file, je.line, je.text);
    di_tokenizer *t = calloc(1, sizeof *t);
    int st = DI_OK;
    if (!t) {
        json_decref(root);
        return di_error_set(err, DI_ERR_NOMEM, "%s: out of memory", file);
    }
    snprintf(t->path, sizeof t->path, "%s", file);
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if ((st = check_supported(root, file, err))) goto done;
    if (!json_is_object(vocab) || !json_is_array(merges) || (added && !json_is_array(added))) {
        st = di_error_set(err, DI_ERR_FORMAT, "%s: expected model.vocab (object), model.merges (array), added_tokens (array)",
                          file);
        goto done;
    }
    if ((st = load_tokens(t, vocab, added, err))) goto done;
    if ((st = build_maps(t, vocab, err))) goto done;
    if ((st = load_merges(t, merges, err))) goto done;
    if ((st = build_trie(t, added, err))) goto done;
    if ((st = load_pretok(t, root, err))) goto done;
    if (di_bpe_cache_new(t)) st = di_error_set(err, DI_ERR_NOMEM, "%s: out of memory for the word cache", file);
done:
    json_decref(root);
    if (st) {
        di_tok_free(t);
        return st;
    }
    *out = t;
    return DI_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* queries                                                                                            */

int32_t di_tok_vocab_size(const di_tokenizer *t) { return t->n_vocab; }

const char *di_tok_token_bytes(const di_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || t->tok_len[id] == DI_TOK_NO_TOKEN) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->tok_len[id];
    return t->bytes + t->tok_off[id];
}

const char *di_tok_token_string(const di_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || t->spell_len[id] == DI_TOK_NO_TOKEN) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->spell_len[id];
    return t->spell + t->spell_off[id];
}

int32_t di_tok_find(const di_tokenizer *t, const char *literal) {
    size_t n = strlen(literal), len = 0;
    int32_t id = trie_longest(t, literal, n, -1, &len);
    return id >= 0 && len == n ? id : -1;
}

int di_tok_is_special(const di_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & DI_TOKF_SPECIAL);
}

int di_tok_is_added(const di_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & DI_TOKF_ADDED);
}

int32_t di_tok_lookup_bytes(const di_tokenizer *t, const char *bytes, size_t len) {
    return strmap_get(&t->by_bytes, byte_keys(t), bytes, len);
}

/* ------------------------------------------------------------------------------------------------ */
/* encode                                                                                             */

typedef struct encode_ctx {
    const di_tokenizer *t;
    pcre2_match_data *md; /* 1 pair: the regexes need no capture groups */
    di_bpe_scratch sc;
    di_idvec out;
    di_error *err;
} encode_ctx;

static bool emit_piece(void *p, const char *s, size_t n) {
    encode_ctx *c = p;
    return di_bpe_encode_piece(c->t, (const uint8_t *)s, n, &c->sc, &c->out);
}

/* Pass 0 cuts normalized=false added tokens out of the text, pass 1 normalized=true ones out of what is
 * left (leftmost-longest each, as HF's AddedVocabulary), pass 2 pre-tokenizes and BPE-encodes the rest. */
static int encode_pass(encode_ctx *c, const char *s, size_t n, int pass) {
    if (pass == 2) return di_pretok_split(&c->t->pretok, c->md, s, n, emit_piece, c, c->err);
    const di_tokenizer *t = c->t;
    size_t seg = 0; /* start of the text not yet handed to the next pass */
    for (size_t i = 0; i < n;) {
        size_t ml = 0;
        int32_t id = t->trie_first[(uint8_t)s[i]] ? trie_longest(t, s + i, n - i, pass, &ml) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        int st = encode_pass(c, s + seg, i - seg, pass + 1);
        if (st) return st;
        if (!di_idvec_push(&c->out, id)) return di_error_set(c->err, DI_ERR_NOMEM, "tokenizer encode: out of memory");
        i += ml;
        seg = i;
    }
    return encode_pass(c, s + seg, n - seg, pass + 1);
}

int di_tok_encode(const di_tokenizer *t, const char *text, size_t len, int special, int32_t **ids, size_t *n_ids,
                  di_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (len == 0) return DI_OK;
    if (!text) return di_error_set(err, DI_ERR_INVALID, "tokenizer encode: text is NULL with length %zu", len);
    size_t bad = di_utf8_first_invalid((const uint8_t *)text, len);
    if (bad < len)
        return di_error_set(err, DI_ERR_INVALID, "tokenizer encode: invalid UTF-8 at byte offset %zu (byte 0x%02X)",
                            bad, (uint8_t)text[bad]);
    encode_ctx c = {.t = t, .err = err, .md = pcre2_match_data_create(1, NULL)};
    if (!c.md) return di_error_set(err, DI_ERR_NOMEM, "tokenizer encode: out of memory");
    int st = encode_pass(&c, text, len, special ? 0 : 2);
    pcre2_match_data_free(c.md);
    di_bpe_scratch_free(&c.sc);
    if (st) {
        free(c.out.p);
        return st;
    }
    *ids = c.out.p;
    *n_ids = c.out.n;
    return DI_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* decode                                                                                             */

static int check_id(const di_tokenizer *t, int32_t id, size_t pos, di_error *err) {
    if (id < 0 || id >= t->n_vocab || t->tok_len[id] == DI_TOK_NO_TOKEN)
        return di_error_set(err, DI_ERR_INVALID, "tokenizer decode: token id %d at position %zu is not in [0, %d)", id,
                            pos, t->n_vocab);
    return DI_OK;
}

int di_tok_decode(const di_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len, di_error *err) {
    *text = NULL;
    *len = 0;
    di_strbuf raw = {0}, out = {0};
    int st = DI_OK;
    for (size_t i = 0; i < n; i++) {
        if ((st = check_id(t, ids[i], i, err))) goto done;
        if (!di_strbuf_put(&raw, t->bytes + t->tok_off[ids[i]], t->tok_len[ids[i]])) goto nomem;
    }
    if (!di_strbuf_put(&out, "", 0) || di_utf8_lossy((const uint8_t *)raw.p, raw.n, true, &out) == (size_t)-1)
        goto nomem;
    *text = out.p;
    *len = out.n;
    out.p = NULL;
    goto done;
nomem:
    st = di_error_set(err, DI_ERR_NOMEM, "tokenizer decode: out of memory");
done:
    free(raw.p);
    free(out.p);
    return st;
}

struct di_detok {
    const di_tokenizer *t;
    uint8_t held[4]; /* [n_held] start of a character still waiting for its continuation bytes */
    size_t n_held;
    size_t pos; /* ids pushed, for messages */
};

di_detok *di_detok_new(const di_tokenizer *t) {
    di_detok *d = calloc(1, sizeof *d);
    if (d) d->t = t;
    return d;
}

void di_detok_free(di_detok *d) { free(d); }

int di_detok_push(di_detok *d, int32_t id, char **text, size_t *len, di_error *err) {
    *text = NULL;
    *len = 0;
    int st = check_id(d->t, id, d->pos, err);
    if (st) return st;
    d->pos++;
    di_strbuf in = {0}, out = {0};
    if (!di_strbuf_put(&in, d->held, d->n_held) ||
        !di_strbuf_put(&in, d->t->bytes + d->t->tok_off[id], d->t->tok_len[id]) || !di_strbuf_put(&out, "", 0))
        goto nomem;
    size_t used = di_utf8_lossy((const uint8_t *)in.p, in.n, false, &out);
    if (used == (size_t)-1) goto nomem;
    d->n_held = in.n - used; /* < 4: only an unfinished but valid prefix is held */
    memcpy(d->held, in.p + used, d->n_held);
    free(in.p);
    *text = out.p;
    *len = out.n;
    return DI_OK;
nomem:
    free(in.p);
    free(out.p);
    return di_error_set(err, DI_ERR_NOMEM, "tokenizer stream decode: out of memory");
}

int di_detok_flush(di_detok *d, char **text, size_t *len) {
    di_strbuf out = {0};
    *text = NULL;
    *len = 0;
    if (!di_strbuf_put(&out, "", 0) || di_utf8_lossy(d->held, d->n_held, true, &out) == (size_t)-1) {
        free(out.p);
        return DI_ERR_NOMEM;
    }
    d->n_held = 0;
    d->pos = 0;
    *text = out.p;
    *len = out.n;
    return DI_OK;
}
