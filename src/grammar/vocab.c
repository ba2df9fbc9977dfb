/* Token vocabulary as a byte trie (see di_trie_node in grammar_impl.h). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "grammar/grammar_impl.h"
#include "grammar/state_cache.h"

void di_grammar_vocab_free(di_grammar_vocab *v) {
    if (!v) return;
    if (v->bytes)
        for (uint32_t i = 0; i < v->n_vocab; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->eos);
    free(v->class_off);
    free(v->kid2_off);
    free(v->kid2);
    free(v->kid2_byte);
    if (v->class_memo) {
        if (!v->arena) free(v->class_memo->masks);
        pthread_mutex_destroy(&v->class_memo->lock);
        free(v->class_memo);
    }
    if (v->arena) {
        munmap(v->arena, v->arena_len);
    } else {
        free(v->lens);
        free(v->special);
        free(v->nodes);
        free(v->pre_tok);
        free(v->tok_start);
        free(v->by_class);
        free(v->text);
        free(v->class_ent);
        free(v->class_lcp);
        free(v->pre_off);
        free(v->tok_class);
        free(v->blob);
        free(v->blob_off);
        free(v->dup_next);
    }
    free(v);
}

uint32_t di_grammar_vocab_size(const di_grammar_vocab *v) { return v->n_vocab; }

static _Thread_local const di_grammar_vocab *g_sort_vocab; /* read only by cmp_tok */

static int cmp_tok(const void *a, const void *b) {
    /* qsort has no context argument in C11: a thread-local pointer keeps concurrent vocab
     * constructions on different threads independent. */
    const di_grammar_vocab *v = g_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->lens[x], ly = v->lens[y], l = lx < ly ? lx : ly;
    int c = memcmp(v->bytes[x], v->bytes[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* UTF-8 decoder states for the DI_TRIE_UTF8 flag: what the next byte must be. */
enum { U8_START, U8_CONT1, U8_CONT2, U8_E0, U8_ED, U8_CONT3, U8_F0, U8_F4, U8_STATES };

/* Next decoder state after byte b in state st, or -1 if b is not valid there. */
static int u8_next(int st, uint8_t b) {
    switch (st) {
    case U8_START:
        if (b < 0x80) return U8_START;
        if (b >= 0xC2 && b <= 0xDF) return U8_CONT1;
        if (b == 0xE0) return U8_E0;
        if (b == 0xED) return U8_ED;
        if (b >= 0xE1 && b <= 0xEF) return U8_CONT2;
        if (b == 0xF0) return U8_F0;
        if (b >= 0xF1 && b <= 0xF3) return U8_CONT3;
        if (b == 0xF4) return U8_F4;
        return -1;
    case U8_CONT1: return b >= 0x80 && b <= 0xBF ? U8_START : -1;
    case U8_CONT2: return b >= 0x80 && b <= 0xBF ? U8_CONT1 : -1;
    case U8_E0: return b >= 0xA0 && b <= 0xBF ? U8_CONT1 : -1;
    case U8_ED: return b >= 0x80 && b <= 0x9F ? U8_CONT1 : -1;
    case U8_CONT3: return b >= 0x80 && b <= 0xBF ? U8_CONT2 : -1;
    case U8_F0: return b >= 0x90 && b <= 0xBF ? U8_CONT2 : -1;
    case U8_F4: return b >= 0x80 && b <= 0x8F ? U8_CONT2 : -1;
    }
    return -1;
}

/* Classes of each text token (see di_grammar_vocab.by_class), as bitsets and as lists. */
static uint32_t token_class_bits(const di_grammar_vocab *v, int32_t t) {
    uint32_t bits = 0, chars = 0;
    int st = U8_START;
    for (uint32_t k = 0; k < v->lens[t]; k++) {
        uint8_t b = v->bytes[t][k];
        chars += (b & 0xC0) != 0x80;
        if (b < 0x80) bits |= 1u << di_ascii_bucket(b);
        else bits |= 1u << DI_CLASS_HIGH;
        if (st >= 0) st = u8_next(st, b);
    }
    if (st < 0) bits |= 1u << DI_CLASS_BAD_UTF8;
    if (chars > DI_CHAIN_CHARS) bits |= 1u << DI_CLASS_LONG;
    return bits;
}

static int token_classes(di_grammar_vocab *v) {
    size_t words = di_grammar_mask_words(v->n_vocab);
    v->by_class = calloc((size_t)DI_N_CLASSES * words, sizeof *v->by_class);
    v->text = calloc(words, sizeof *v->text);
    v->class_off = calloc(DI_N_CLASSES + 1, sizeof *v->class_off);
    if (!v->by_class || !v->text || !v->class_off) return DI_ERR_NOMEM;
    v->tok_class = calloc(v->n_vocab, sizeof *v->tok_class);
    v->blob_off = malloc(((size_t)v->n_vocab + 1) * sizeof *v->blob_off);
    v->pre_off = malloc(((size_t)v->n_pre + 1) * sizeof *v->pre_off);
    if (!v->tok_class || !v->blob_off || !v->pre_off) return DI_ERR_NOMEM;
    size_t total = 0, nb = 0;
    for (uint32_t x = 0; x < v->n_pre; x++) { /* text tokens in trie preorder, as the class lists */
        int32_t t = v->pre_tok[x];
        v->blob_off[t] = v->pre_off[x] = (uint32_t)nb;
        nb += v->lens[t];
    }
    v->pre_off[v->n_pre] = (uint32_t)nb;
    for (uint32_t t = 0; t < v->n_vocab; t++)
        if (v->special[t] || !v->lens[t]) {
            v->blob_off[t] = (uint32_t)nb;
            nb += v->lens[t];
        }
    v->blob_off[v->n_vocab] = (uint32_t)nb;
    if (nb > UINT32_MAX || !(v->blob = malloc(nb + 1))) return DI_ERR_NOMEM;
    for (uint32_t t = 0; t < v->n_vocab; t++)
        if (v->lens[t]) memcpy(v->blob + v->blob_off[t], v->bytes[t], v->lens[t]);
    for (uint32_t t = 0; t < v->n_vocab; t++) {
        if (v->special[t] || !v->lens[t]) continue;
        v->text[t >> 5] |= 1u << (t & 31);
        uint32_t bits = token_class_bits(v, (int32_t)t);
        v->tok_class[t] = bits;
        for (int k = 0; k < DI_N_CLASSES; k++)
            if ((bits >> k) & 1) {
                v->by_class[(size_t)k * words + (t >> 5)] |= 1u << (t & 31);
                v->class_off[k + 1]++;
                total++;
            }
    }
    for (int k = 0; k < DI_N_CLASSES; k++) v->class_off[k + 1] += v->class_off[k];
    v->class_ent = calloc(total + 1, sizeof *v->class_ent);
    uint32_t *fill = malloc(DI_N_CLASSES * sizeof *fill);
    if (!v->class_ent || !fill) {
        free(fill);
        return DI_ERR_NOMEM;
    }
    memcpy(fill, v->class_off, DI_N_CLASSES * sizeof *fill);
    /* in trie preorder: a block mask walks a class's tokens one after the other and keeps the
     * parse states of the prefix a token shares with the previous one, so tokens with a common
     * prefix (".com", ".org", ...) follow each other and replay nothing */
    for (uint32_t x = 0; x < v->n_pre; x++) {
        uint32_t bits = v->tok_class[v->pre_tok[x]];
        di_class_ent ent = {.tok = v->pre_tok[x], .off = v->pre_off[x], .len = v->pre_off[x + 1] - v->pre_off[x],
                            .bits = bits};
        for (int k = 0; k < DI_N_CLASSES; k++)
            if ((bits >> k) & 1) v->class_ent[fill[k]++] = ent;
    }
    free(fill);
    /* common prefix of each listed token with the one before it in its list (see class_lcp) */
    if (!(v->class_lcp = malloc((total + 1) * sizeof *v->class_lcp))) return DI_ERR_NOMEM;
    for (int k = 0; k < DI_N_CLASSES; k++)
        for (uint32_t x = v->class_off[k]; x < v->class_off[k + 1]; x++) {
            uint32_t l = 0;
            if (x > v->class_off[k]) {
                const di_class_ent *a = &v->class_ent[x - 1], *b = &v->class_ent[x];
                uint32_t la = a->len, lb = b->len;
                const uint8_t *pa = v->blob + a->off, *pb = v->blob + b->off;
                while (l < la && l < lb && l < DI_LCP_MAX && pa[l] == pb[l]) l++;
            }
            v->class_lcp[x] = (uint16_t)l;
        }
    return DI_OK;
}

/* Per-subtree summaries (DI_TRIE_UTF8 / DI_TRIE_HIGH flags, ASCII byte sets) and the tokens in
 * preorder. Children follow their parent in preorder, so one backward pass sees every child
 * before its parent. */
static int summarize(di_grammar_vocab *v, uint32_t n_text) {
    uint32_t n = v->n_nodes;
    v->tok_start = malloc(((size_t)n + 1) * sizeof *v->tok_start);
    v->pre_tok = malloc(((size_t)n_text + 1) * sizeof *v->pre_tok);
    uint8_t *ok = malloc(n); /* bit st: the subtree is valid UTF-8 when entered in decoder state st */
    if (!v->tok_start || !v->pre_tok || !ok) {
        free(ok);
        return DI_ERR_NOMEM;
    }
    uint32_t np = 0;
    for (uint32_t i = 0; i < n; i++) {
        v->tok_start[i] = np;
        for (int32_t t = v->nodes[i].tok; t >= 0; t = v->dup_next[t]) v->pre_tok[np++] = t;
    }
    v->tok_start[n] = np;
    v->n_pre = np;
    uint32_t *chars = malloc(((size_t)v->max_len + 1) * sizeof *chars); /* characters along the path */
    if (!chars) {
        free(ok);
        return DI_ERR_NOMEM;
    }
    chars[0] = 0;
    for (uint32_t i = 1; i < n; i++) { /* tokens with more than DI_CHAIN_CHARS characters */
        di_trie_node *nd = &v->nodes[i];
        chars[nd->depth] = chars[nd->depth - 1] + ((nd->byte & 0xC0) != 0x80);
        if (nd->tok >= 0 && chars[nd->depth] > DI_CHAIN_CHARS) nd->flags |= DI_TRIE_LONG;
    }
    free(chars);
    for (uint32_t i = n; i-- > 1;) {
        di_trie_node *nd = &v->nodes[i];
        uint32_t asc = nd->byte < 0x80 ? 1u << di_ascii_bucket(nd->byte) : 0;
        bool high = nd->byte >= 0x80;
        uint8_t child_ok = 0xFF; /* states in which every child subtree is valid */
        for (uint32_t c = i + 1; c < nd->end; c = v->nodes[c].end) {
            asc |= v->nodes[c].ascii;
            high |= (v->nodes[c].flags & DI_TRIE_HIGH) != 0;
            nd->flags |= v->nodes[c].flags & DI_TRIE_LONG;
            child_ok &= ok[c];
        }
        uint8_t mine = 0;
        for (int st = 0; st < U8_STATES; st++) {
            int nx = u8_next(st, nd->byte);
            if (nx >= 0 && ((child_ok >> nx) & 1)) mine |= (uint8_t)(1u << st);
        }
        ok[i] = mine;
        nd->ascii = asc;
        if (high) nd->flags |= DI_TRIE_HIGH;
        if (mine & 1) nd->flags |= DI_TRIE_UTF8;
    }
    free(ok);
    return token_classes(v);
}

/* mask = from & ~(union of the token classes in `classes`), 16 bytes at a time in chunks that
 * stay in L1 (a block mask clears ~20 classes of 16 KiB each: this loop was 10% of the
 * instructions of schema_small's cold request word by word), four classes per pass over the
 * chunk (one load and store of the mask for four rows: regex_email's first mask clears 26
 * classes, 30% of its instructions one class per pass). from may be mask. */
static void minus_classes(uint32_t *mask, const uint32_t *from, const uint32_t *by_class, size_t words,
                          uint32_t classes) {
    enum { CHUNK = 512 }; /* words */
    int cls[DI_N_CLASSES], nc = 0;
    for (uint32_t c = classes; c; c &= c - 1) cls[nc++] = __builtin_ctz(c);
    for (size_t w0 = 0; w0 < words; w0 += CHUNK) {
        size_t n = words - w0 < CHUNK ? words - w0 : CHUNK, n4 = n & ~(size_t)3;
        uint32_t *mk = mask + w0;
        if (from != mask) memcpy(mk, from + w0, n * sizeof *mk);
        int k = 0;
        for (; k + 4 <= nc; k += 4) {
            const uint32_t *c0 = by_class + (size_t)cls[k] * words + w0, *c1 = by_class + (size_t)cls[k + 1] * words + w0,
                           *c2 = by_class + (size_t)cls[k + 2] * words + w0, *c3 = by_class + (size_t)cls[k + 3] * words + w0;
            for (size_t w = 0; w < n4; w += 4) {
                u32x4 a, b0, b1, b2, b3;
                memcpy(&a, mk + w, sizeof a);
                memcpy(&b0, c0 + w, sizeof b0);
                memcpy(&b1, c1 + w, sizeof b1);
                memcpy(&b2, c2 + w, sizeof b2);
                memcpy(&b3, c3 + w, sizeof b3);
                a &= ~(b0 | b1 | b2 | b3);
                memcpy(mk + w, &a, sizeof a);
            }
            for (size_t w = n4; w < n; w++) mk[w] &= ~(c0[w] | c1[w] | c2[w] | c3[w]);
        }
        for (; k < nc; k++) {
            const uint32_t *cb = by_class + (size_t)cls[k] * words + w0;
            for (size_t w = 0; w < n4; w += 4) {
                u32x4 a, b;
                memcpy(&a, mk + w, sizeof a);
                memcpy(&b, cb + w, sizeof b);
                a &= ~b;
                memcpy(mk + w, &a, sizeof a);
            }
            for (size_t w = n4; w < n; w++) mk[w] &= ~cb[w];
        }
    }
}

/* The class sets of block masks recur: every string of a JSON Schema has the same one, so do the
 * counts of a maxLength string, and so do strings of other grammars on this vocabulary. Each set
 * streams its ~8-26 class rows of 16 KiB (fourteenth round: 12-45 us per block mask, ~14 us even
 * when the rows are in cache), a copy of a kept result ~1 us. A new set starts from the largest
 * kept subset of it (an e-mail's domain, whose set contains its local part's) and clears only the
 * classes that subset lacks: the rows are colder once most masks copy, so a new set that streamed
 * all of them was slower than before the memo. Slots are replaced least recently used; copies
 * are made under the lock (matchers on other threads may be filling the same set). */
void di_vocab_text_minus(const di_grammar_vocab *v, uint32_t classes, uint32_t *mask) {
    struct di_class_memo *cm = v->class_memo;
    size_t words = di_grammar_mask_words(v->n_vocab);
    if (!cm) {
        minus_classes(mask, v->text, v->by_class, words, classes);
        return;
    }
    int best = -1;
    pthread_mutex_lock(&cm->lock);
    for (int i = 0; i < DI_CLASS_MEMO; i++) {
        uint32_t k = cm->slot[i].classes;
        if (!cm->slot[i].used || (k & ~classes)) continue;
        if (best < 0 || __builtin_popcount(k) > __builtin_popcount(cm->slot[best].classes)) best = i;
    }
    if (best >= 0) {
        memcpy(mask, cm->masks + (size_t)best * words, words * sizeof *mask);
        cm->slot[best].used = ++cm->clock;
    }
    uint32_t have = best >= 0 ? cm->slot[best].classes : 0;
    pthread_mutex_unlock(&cm->lock);
    if (have == classes) return;
    minus_classes(mask, best >= 0 ? mask : v->text, v->by_class, words, classes & ~have);
    pthread_mutex_lock(&cm->lock);
    int old = 0;
    bool present = false;
    for (int i = 0; i < DI_CLASS_MEMO; i++) {
        present |= cm->slot[i].used && cm->slot[i].classes == classes; /* a racing matcher kept it */
        if (cm->slot[i].used < cm->slot[old].used) old = i;
    }
    if (!present) {
        memcpy(cm->masks + (size_t)old * words, mask, words * sizeof *mask);
        cm->slot[old].classes = classes;
        cm->slot[old].used = ++cm->clock;
    }
    pthread_mutex_unlock(&cm->lock);
}

/* Huge pages for the arrays masks read. A cold mask touches the vocabulary all over: the ~250
 * children of the trie's root lie across its ~6 MB of nodes, a block mask reads class lists,
 * preorder offsets and token bytes, ~13 MB in all, ~3,300 pages of 4 KiB. Each page not in the
 * TLB costs a page walk (two-dimensional under a hypervisor), which the first masks of a request
 * pay hundreds of times: a process that had run one request before ran the next one's first mask
 * (~200 K instructions) in 62 instead of ~180 us of CPU (schema_recursive, twelfth round). So
 * once the arrays are built they are copied into one mapping aligned to 2 MiB and advised
 * MADV_HUGEPAGE before it is touched: ~7 TLB entries where the kernel grants huge pages (THP
 * "madvise" or "always"), the same 4 KiB pages as before otherwise. Returns false (arrays left
 * as they are) if the mapping fails. */
#define VOCAB_HUGE (2u << 20)

static size_t pack_round(size_t n) { return (n + 63) & ~(size_t)63; }

static bool vocab_pack(di_grammar_vocab *v) {
    size_t words = di_grammar_mask_words(v->n_vocab), n_listed = v->class_off[DI_N_CLASSES];
    struct {
        void **p;
        size_t n; /* bytes */
    } arr[] = {
        {(void **)&v->nodes, (size_t)v->n_nodes * sizeof *v->nodes},
        {(void **)&v->tok_start, ((size_t)v->n_nodes + 1) * sizeof *v->tok_start},
        {(void **)&v->pre_tok, ((size_t)v->n_pre + 1) * sizeof *v->pre_tok},
        {(void **)&v->dup_next, (size_t)v->n_vocab * sizeof *v->dup_next},
        {(void **)&v->by_class, (size_t)DI_N_CLASSES * words * sizeof *v->by_class},
        {(void **)&v->text, words * sizeof *v->text},
        {(void **)&v->class_ent, (n_listed + 1) * sizeof *v->class_ent},
        {(void **)&v->class_lcp, (n_listed + 1) * sizeof *v->class_lcp},
        {(void **)&v->pre_off, ((size_t)v->n_pre + 1) * sizeof *v->pre_off},
        {(void **)&v->blob, (size_t)v->blob_off[v->n_vocab] + 1},
        {(void **)&v->blob_off, ((size_t)v->n_vocab + 1) * sizeof *v->blob_off},
        {(void **)&v->tok_class, (size_t)v->n_vocab * sizeof *v->tok_class},
        {(void **)&v->lens, (size_t)v->n_vocab * sizeof *v->lens},
        {(void **)&v->special, (size_t)v->n_vocab},
        {v->class_memo ? (void **)&v->class_memo->masks : NULL, v->class_memo ? (size_t)DI_CLASS_MEMO * words * sizeof(uint32_t) : 0},
    };
    enum { N_ARR = sizeof arr / sizeof arr[0] };
    size_t total = 0;
    for (int i = 0; i < N_ARR; i++) total += arr[i].p ? pack_round(arr[i].n) : 0;
    size_t len = (total + VOCAB_HUGE - 1) / VOCAB_HUGE * VOCAB_HUGE;
    /* a 2 MiB boundary inside an oversized mapping; the slack on both sides is unmapped */
    uint8_t *raw = mmap(NULL, len + VOCAB_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return false;
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + VOCAB_HUGE - 1) & ~(uintptr_t)(VOCAB_HUGE - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    if (base + len < raw + len + VOCAB_HUGE) munmap(base + len, (size_t)(raw + len + VOCAB_HUGE - (base + len)));
#ifdef MADV_HUGEPAGE
    madvise(base, len, MADV_HUGEPAGE); /* advice only: without huge pages the copy still works */
#endif
    size_t off = 0;
    for (int i = 0; i < N_ARR; i++) {
        if (!arr[i].p) continue;
        memcpy(base + off, *arr[i].p, arr[i].n);
        free(*arr[i].p);
        *arr[i].p = base + off;
        off += pack_round(arr[i].n);
    }
    v->arena = base;
    v->arena_len = len;
    return true;
}

int di_grammar_vocab_new(uint32_t n_vocab, const uint8_t *const *bytes, const uint32_t *lens, const uint8_t *special,
                         const int32_t *eos, size_t n_eos, di_grammar_vocab **out, di_error *err) {
    *out = NULL;
    if (n_vocab == 0) return di_error_set(err, DI_ERR_INVALID, "grammar vocab: empty vocabulary");
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] < 0 || (uint32_t)eos[i] >= n_vocab)
            return di_error_set(err, DI_ERR_INVALID, "grammar vocab: EOS id %d outside [0, %u)", eos[i], n_vocab);
    di_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return di_error_set(err, DI_ERR_NOMEM, "grammar vocab: out of memory");
    v->n_vocab = n_vocab;
    v->bytes = calloc(n_vocab, sizeof *v->bytes);
    v->lens = calloc(n_vocab, sizeof *v->lens);
    v->special = calloc(n_vocab, 1);
    v->dup_next = malloc(n_vocab * sizeof *v->dup_next);
    v->eos = malloc((n_eos ? n_eos : 1) * sizeof *v->eos);
    int32_t *order = malloc(n_vocab * sizeof *order);
    if (!v->bytes || !v->lens || !v->special || !v->dup_next || !v->eos || !order) goto oom;
    memcpy(v->eos, eos, n_eos * sizeof *eos);
    v->n_eos = n_eos;
    for (size_t i = 0; i < n_eos; i++) v->special[eos[i]] = 1;
    uint32_t n_text = 0;
    size_t total = 0;
    for (uint32_t t = 0; t < n_vocab; t++) {
        v->dup_next[t] = -1;
        if (special && special[t]) v->special[t] = 1;
        if (lens[t] > UINT16_MAX) {
            free(order);
            di_grammar_vocab_free(v);
            return di_error_set(err, DI_ERR_INVALID, "grammar vocab: token %u is %u bytes (limit %u)", t, lens[t],
                                UINT16_MAX);
        }
        v->lens[t] = lens[t];
        if (lens[t]) {
            v->bytes[t] = malloc(lens[t]);
            if (!v->bytes[t]) goto oom;
            memcpy(v->bytes[t], bytes[t], lens[t]);
        }
        if (lens[t] > v->max_len) v->max_len = lens[t];
        if (!v->special[t] && lens[t]) order[n_text++] = (int32_t)t, total += lens[t];
    }
    g_sort_vocab = v;
    qsort(order, n_text, sizeof *order, cmp_tok);
    g_sort_vocab = NULL;
    /* Preorder construction: walking tokens in byte order, the current path is the previous
     * token's bytes; a new token shares its longest common prefix and adds one node per byte.
     * Nodes leave the path (their subtree is complete) when a later token diverges above them. */
    v->nodes = malloc((total + 1) * sizeof *v->nodes);
    uint32_t *path = malloc((v->max_len + 1) * sizeof *path);
    if (!v->nodes || !path) {
        free(path);
        goto oom;
    }
    uint32_t nn = 1, depth = 0;
    v->nodes[0] = (di_trie_node){.end = 0, .tok = -1, .depth = 0, .byte = 0, .flags = 0, .ascii = 0};
    path[0] = 0;
    int32_t prev = -1;
    for (uint32_t i = 0; i < n_text; i++) {
        int32_t t = order[i];
        uint32_t l = 0;
        if (prev >= 0) {
            uint32_t lim = v->lens[t] < v->lens[prev] ? v->lens[t] : v->lens[prev];
            while (l < lim && v->bytes[t][l] == v->bytes[prev][l]) l++;
        }
        while (depth > l) v->nodes[path[depth--]].end = nn;
        for (uint32_t k = l; k < v->lens[t]; k++) {
            v->nodes[nn] = (di_trie_node){.end = 0, .tok = -1, .depth = (uint16_t)(k + 1), .byte = v->bytes[t][k], .flags = 0, .ascii = 0};
            path[++depth] = nn++;
        }
        di_trie_node *leaf = &v->nodes[path[depth]];
        if (leaf->tok < 0) {
            leaf->tok = t;
        } else { /* identical bytes: chain after the first */
            int32_t x = leaf->tok;
            while (v->dup_next[x] >= 0) x = v->dup_next[x];
            v->dup_next[x] = t;
            leaf->flags |= DI_TRIE_DUP;
        }
        prev = t;
    }
    while (depth > 0) v->nodes[path[depth--]].end = nn;
    v->nodes[0].end = nn;
    v->n_nodes = nn;
    for (uint32_t i = 1; i < nn; i = v->nodes[i].end) {
        v->root_byte[v->n_root_kids] = v->nodes[i].byte;
        v->root_kid[v->n_root_kids++] = i;
    }
    v->root_kid[v->n_root_kids] = nn;
    uint32_t n2 = 0;
    for (uint32_t i = 1; i < nn; i++) n2 += v->nodes[i].depth == 2;
    v->kid2_off = malloc(((size_t)v->n_root_kids + 1) * sizeof *v->kid2_off);
    v->kid2 = malloc(((size_t)n2 + 1) * sizeof *v->kid2);
    v->kid2_byte = malloc((size_t)n2 + 1);
    if (v->kid2_off && v->kid2 && v->kid2_byte) {
        n2 = 0;
        for (uint32_t k = 0; k < v->n_root_kids; k++) {
            v->kid2_off[k] = n2;
            for (uint32_t i = v->root_kid[k] + 1; i < v->root_kid[k + 1]; i = v->nodes[i].end) {
                v->kid2_byte[n2] = v->nodes[i].byte;
                v->kid2[n2++] = i;
            }
        }
        v->kid2_off[v->n_root_kids] = n2;
    } else { /* optional: walks then visit every child of a root child */
        free(v->kid2_off);
        free(v->kid2);
        free(v->kid2_byte);
        v->kid2_off = v->kid2 = NULL;
        v->kid2_byte = NULL;
    }
    if (summarize(v, n_text)) goto oom;
    /* FNV-1a over lengths, bytes and flags of every token, then the EOS ids */
    uint64_t fp = 0xCBF29CE484222325ull;
    for (uint32_t t = 0; t < n_vocab; t++) {
        fp = (fp ^ (v->lens[t] << 1 | v->special[t])) * 0x100000001B3ull;
        for (uint32_t k = 0; k < v->lens[t]; k++) fp = (fp ^ v->bytes[t][k]) * 0x100000001B3ull;
    }
    for (size_t i = 0; i < n_eos; i++) fp = (fp ^ (uint32_t)eos[i]) * 0x100000001B3ull;
    v->fingerprint = fp;
    v->class_memo = calloc(1, sizeof *v->class_memo); /* without it, block masks compute every union */
    if (v->class_memo)
        v->class_memo->masks = calloc((size_t)DI_CLASS_MEMO * di_grammar_mask_words(n_vocab), sizeof(uint32_t));
    if (v->class_memo && (!v->class_memo->masks || pthread_mutex_init(&v->class_memo->lock, NULL))) {
        free(v->class_memo->masks);
        free(v->class_memo);
        v->class_memo = NULL;
    }
    vocab_pack(v);
    di_gcache_pool_seed(); /* the first grammar's table, committed here rather than on its masks */
    free(path);
    free(order);
    *out = v;
    return DI_OK;
oom:
    free(order);
    di_grammar_vocab_free(v);
    return di_error_set(err, DI_ERR_NOMEM, "grammar vocab: out of memory for %u tokens", n_vocab);
}

/* di_trie_union (grammar_impl.h) */
static inline void scatter(const di_grammar_vocab *v, di_trie_range r, uint32_t *mask) {
    for (uint32_t k = r.lo; k < r.hi; k++) {
        int32_t t = v->pre_tok[k];
        mask[t >> 5] |= 1u << (t & 31);
    }
}

void di_trie_union_scatter(const di_grammar_vocab *v, di_trie_range r, uint32_t *mask) { scatter(v, r, mask); }

static void clear_range(const di_grammar_vocab *v, di_trie_range r, uint32_t *bits) {
    for (uint32_t k = r.lo; k < r.hi; k++) {
        int32_t t = v->pre_tok[k];
        bits[t >> 5] &= ~(1u << (t & 31));
    }
}

bool di_trie_union_grow(di_trie_union *u) {
    uint32_t cap = u->cap ? 2 * u->cap : 1024;
    di_trie_range *r = realloc(u->r, (size_t)cap * sizeof *r);
    if (!r) return false;
    u->r = r, u->cap = cap;
    return true;
}

static void or_words(uint32_t *dst, const uint32_t *src, size_t words) {
    size_t w = 0;
    for (; w + 4 <= words; w += 4) {
        u32x4 a, b;
        memcpy(&a, dst + w, sizeof a);
        memcpy(&b, src + w, sizeof b);
        a |= b;
        memcpy(dst + w, &a, sizeof a);
    }
    for (; w < words; w++) dst[w] |= src[w];
}

/* -1, 0, 1: the order of two ranges of one walk or of two walks (a range of one list may contain
 * ranges of the other, so equal starts do not mean equal ranges) */
static inline int range_cmp(di_trie_range a, di_trie_range b) {
    if (a.lo != b.lo) return a.lo < b.lo ? -1 : 1;
    return a.hi == b.hi ? 0 : a.hi < b.hi ? -1 : 1;
}

/* Tokens in the ranges of exactly one of the ascending lists a and b; stops once past limit. */
static uint32_t diff_toks(const di_trie_range *a, uint32_t na, const di_trie_range *b, uint32_t nb, uint32_t limit) {
    uint32_t i = 0, j = 0, d = 0;
    while ((i < na || j < nb) && d <= limit) {
        int c = i == na ? 1 : j == nb ? -1 : range_cmp(a[i], b[j]);
        if (c < 0) d += a[i].hi - a[i].lo, i++;
        else if (c > 0) d += b[j].hi - b[j].lo, j++;
        else i++, j++;
    }
    return d;
}

/* bits holds the union of list a; make it the union of list b. The ranges of one list are disjoint
 * (a walk does not enter a subtree it accepted whole), so the union of b is a's union less the
 * tokens in a's ranges that b lacks, plus those in b's ranges that a lacks (the second after the
 * first: a range of b may contain one of a's, or lie inside it). */
static void union_shift(const di_grammar_vocab *v, uint32_t *bits, const di_trie_range *a, uint32_t na,
                        const di_trie_range *b, uint32_t nb) {
    for (int add = 0; add < 2; add++)
        for (uint32_t i = 0, j = 0; i < na || j < nb;) {
            int c = i == na ? 1 : j == nb ? -1 : range_cmp(a[i], b[j]);
            if (c < 0) {
                if (!add) clear_range(v, a[i], bits);
                i++;
            } else if (c > 0) {
                if (add) scatter(v, b[j], bits);
                j++;
            } else {
                i++, j++;
            }
        }
}

int di_trie_union_apply(di_trie_union *u, const di_grammar_vocab *v, uint32_t *mask) {
    size_t words = di_grammar_mask_words(v->n_vocab);
    uint32_t n = u->n, n_toks = u->n_toks;
    u->n = 0, u->n_toks = 0;
    /* one bit store per token against a few passes over the words (clear or copy, fill, OR,
     * compare the list): the memo pays from about half a token per word */
    if ((size_t)n_toks * 2 < words) {
        for (uint32_t i = 0; i < n; i++) scatter(v, u->r[i], mask);
        return DI_UNION_NONE;
    }
    /* an equal list, or as bases to shift from the UNION_TRIES lists nearest in tokens */
    enum { UNION_TRIES = 4 };
    int hit = -1, near[UNION_TRIES];
    uint32_t gap[UNION_TRIES];
    for (int k = 0; k < UNION_TRIES; k++) near[k] = -1, gap[k] = n_toks / 4; /* a quarter differing is not worth the merges */
    for (int s = 0; s < DI_TRIE_UNION_SLOTS && hit < 0; s++) {
        if (!u->slot[s].r) continue;
        if (u->slot[s].n == n && u->slot[s].n_toks == n_toks && !memcmp(u->slot[s].r, u->r, (size_t)n * sizeof *u->r))
            hit = s;
        uint32_t g = u->slot[s].n_toks > n_toks ? u->slot[s].n_toks - n_toks : n_toks - u->slot[s].n_toks;
        for (int k = 0, c = s; k < UNION_TRIES; k++) /* insertion into the sorted candidates */
            if (g < gap[k]) {
                uint32_t tg = gap[k];
                int tc = near[k];
                gap[k] = g, near[k] = c, g = tg, c = tc;
            }
    }
    if (hit >= 0) {
        u->slot[hit].used = ++u->clock;
        or_words(mask, u->slot[hit].bits, words);
        return DI_UNION_REUSED;
    }
    int base = -1;
    uint32_t best = n_toks / 4;
    for (int k = 0; k < UNION_TRIES; k++) {
        int b = near[k];
        if (b < 0) continue;
        uint32_t d = diff_toks(u->slot[b].r, u->slot[b].n, u->r, n, best);
        if (d < best) best = d, base = b;
    }
    int s = base == 0 ? 1 : 0; /* the least recently used slot other than the base */
    for (int t = 0; t < DI_TRIE_UNION_SLOTS; t++)
        if (t != base && u->slot[t].used < u->slot[s].used) s = t;
    uint32_t *bits = u->slot[s].bits ? u->slot[s].bits : malloc(words * sizeof *bits);
    u->slot[s].bits = bits;
    di_trie_range *r = bits ? realloc(u->slot[s].r, (size_t)n * sizeof *r) : NULL; /* n > 0: n_toks > 0 */
    if (!r) { /* out of memory: this walk goes without the memo */
        free(u->slot[s].r);
        u->slot[s].r = NULL;
        for (uint32_t i = 0; i < n; i++) scatter(v, u->r[i], mask);
        return DI_UNION_NONE;
    }
    if (base >= 0) {
        memcpy(bits, u->slot[base].bits, words * sizeof *bits);
        union_shift(v, bits, u->slot[base].r, u->slot[base].n, u->r, n);
        u->slot[base].used = ++u->clock;
    } else {
        memset(bits, 0, words * sizeof *bits);
        for (uint32_t i = 0; i < n; i++) scatter(v, u->r[i], bits);
    }
    memcpy(r, u->r, (size_t)n * sizeof *r);
    u->slot[s].r = r, u->slot[s].n = n, u->slot[s].n_toks = n_toks;
    u->slot[s].used = ++u->clock;
    or_words(mask, bits, words);
    return base >= 0 ? DI_UNION_SHIFTED : DI_UNION_NEW;
}

void di_trie_union_free(di_trie_union *u) {
    free(u->r);
    for (int s = 0; s < DI_TRIE_UNION_SLOTS; s++) free(u->slot[s].r), free(u->slot[s].bits);
}
